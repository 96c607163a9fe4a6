"""Where compute jobs meet the ledger: units, commitments and the `Job` transaction.

compute/ names a block by its `BlockSpec` and a job by its `JobConfig`; the
ledger knows units as `UnitTemplate`s (ids by `ledger.types.unit_id`) and a
job by three hashes. Neither package may import the other
(ARCHITECTURE.md, the layers), so this module maps one onto the other
(specs/consensus.md section 5):

- ``model_hash``: `tensor_digest` of every tensor of the job's initial model,
  in name order (so a node that builds the model from the config proves it
  starts from the committed weights);
- ``data_hash``: SHA-256 of the corpus's token bytes;
- ``hyper_hash``: SHA-256 of the config's canonical JSON (`config_json`),
  which pins everything else: optimizer, batches, seed, steps, partition k
  and the MLP slice count. The JSON itself is the job's ``spec``, so a node
  mines a job from the chain alone (`config_of`).
"""

from __future__ import annotations

import hashlib

import torch

from compute.blocks import model_partition
from compute.data import JobConfig, load_corpus, make_model
from compute.jobfile import config_from_json, config_json
from compute.partition import KIND_CODES, BlockSpec, Partition
from ledger.crypto import SigningKey
from ledger.types import ZERO_SIG, Job, UnitTemplate, sign

TENSOR_DOMAIN = b"pnode:tensor:"


def unit_template(spec: BlockSpec, replica: int = 0) -> UnitTemplate:
    """The ledger unit of one compute block (kind code, layers, slot range) of a replica."""
    return UnitTemplate(KIND_CODES[spec.kind], spec.layer_start, spec.layer_end,
                        spec.head_start, spec.head_end, replica)


def job_units(plan: Partition, replicas: int = 1) -> tuple[UnitTemplate, ...]:
    """The units of every training step of a job trained with ``plan``, in order.

    Replica by replica: replica r's units are ``units[r * 2k : (r + 1) * 2k]``.
    """
    return tuple(unit_template(spec, r) for r in range(replicas) for spec in plan.blocks())


def tensor_digest(t: torch.Tensor) -> bytes:
    """SHA-256 of a tensor as (dtype, shape, little-endian bytes) (specs/consensus.md section 5)."""
    t = t.detach().to("cpu").contiguous()
    head = f"{str(t.dtype).removeprefix('torch.')}:{','.join(map(str, t.shape))}:".encode()
    h = hashlib.sha256(TENSOR_DOMAIN + head)
    if t.numel():  # the tensor's own bytes, not a copy (hashlib reads the buffer)
        h.update(memoryview(t.view(torch.uint8).numpy()))
    return h.digest()


def tensors_digest(named: dict[str, torch.Tensor]) -> bytes:
    """SHA-256 over (name, `tensor_digest`) pairs in name order."""
    return named_digest({name: tensor_digest(t) for name, t in named.items()})


def named_digest(digests: dict[str, bytes]) -> bytes:
    """`tensors_digest` from each tensor's digest, taken earlier (e.g. before an update)."""
    h = hashlib.sha256(TENSOR_DOMAIN + b"named")
    for name in sorted(digests):
        h.update(name.encode() + b"\x00" + digests[name])
    return h.digest()


def commitments(config: JobConfig) -> tuple[bytes, bytes, bytes]:
    """(model_hash, data_hash, hyper_hash) of a job (module docstring)."""
    model = make_model(config)
    model_hash = tensors_digest(dict(model.state_dict()))
    data_hash = bytes.fromhex(load_corpus(config.data).sha256)  # the text's, tokens aside
    return model_hash, data_hash, hyper_hash(config)


def job_tx(config: JobConfig, chain_id: str, creator: SigningKey, nonce: int,
           plan: Partition | None = None, deposit: int = 0) -> Job:
    """The signed `Job` transaction of ``config`` trained with ``plan``.

    Args:
        plan: the job's partition (default: ``config``'s, `job_plan`).
        deposit: base units locked to pay the job's work (0: the chain's job
            authority's job, paid by minting; `ledger.jobrules`).
    """
    plan = plan or job_plan(config)
    model_hash, data_hash, hyper_hash = commitments(config)
    return sign(Job(chain_id, creator.public, model_hash, data_hash, hyper_hash,
                    config_json(config).encode(), config.steps,
                    job_units(plan, config.replicas), deposit, nonce, ZERO_SIG), creator)


def job_plan(config: JobConfig) -> Partition:
    """The partition a job's config asks for: k sections of its model, MLPs cut as it says."""
    return model_partition(make_model(config), config.k, config.mlp_slices)


def config_of(job: Job) -> JobConfig:
    """The job config an on-chain job describes (its ``spec``).

    Raises:
        ValueError, ComputeError: the spec is not a job config this node
            understands (`config_from_json`).
    """
    try:
        text = job.spec.decode()
    except UnicodeDecodeError:
        raise ValueError("the job's spec is not UTF-8 text") from None
    config = config_from_json(text)
    if config_json(config) != text:  # the canonical form is the one committed to
        raise ValueError("the job's spec is not a config in its canonical form")
    return config


def hyper_hash(config: JobConfig) -> bytes:
    """The ``hyper_hash`` a job of ``config`` commits to (module docstring)."""
    return hashlib.sha256(config_json(config).encode()).digest()


def matches(job: Job, config: JobConfig) -> bool:
    """Whether an on-chain job is ``config`` (its hyperparameters' hash; cheap)."""
    return job.hyper_hash == hyper_hash(config)
