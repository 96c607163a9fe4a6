"""Where compute blocks meet the ledger: a partition's blocks as job units.

compute/ names a block by its `BlockSpec`; the ledger knows units as
`UnitTemplate`s and ids them with `ledger.types.unit_id`. Neither package may
import the other (DESIGN.md section 2), so the node maps one onto the other.
"""

from __future__ import annotations

from compute.partition import KIND_CODES, BlockSpec, Partition
from ledger.types import UnitTemplate


def unit_template(spec: BlockSpec) -> UnitTemplate:
    """The ledger unit of one compute block (kind code, layers, slot range)."""
    return UnitTemplate(KIND_CODES[spec.kind], spec.layer_start, spec.layer_end,
                        spec.head_start, spec.head_end)


def job_units(plan: Partition) -> tuple[UnitTemplate, ...]:
    """The units of every training step of a job trained with ``plan``, in order."""
    return tuple(unit_template(spec) for spec in plan.blocks())
