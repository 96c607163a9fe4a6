"""A job's config as text: the canonical JSON a job commits to, and job files.

Owns `config_json` (the canonical form: what a `Job`'s ``spec`` holds and
``hyper_hash`` hashes, specs/consensus.md 5.1) and `config_from_json` (a job
file, whole or in part), for the node (proof_of_learning/units.py) and a wallet
that reads an exported model's config alike.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from typing import Any

from compute.data import JobConfig

__all__ = ["config_from_json", "config_json"]


def config_json(config: JobConfig) -> str:
    """The canonical JSON of a job config (sorted keys, no spaces).

    A data file pinned by its sha256 is named by that alone: where a node
    keeps its copy (``data.path``) is not part of the job. ``classes`` is
    left out when empty.
    """
    raw = asdict(config)
    if raw["data"]["source"] == "file" and raw["data"]["sha256"]:
        raw["data"]["path"] = ""
    if not raw["classes"]:  # unnamed: any class, and the jobs made before the field keep their hash
        del raw["classes"]
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def config_from_json(text: str) -> JobConfig:
    """A `JobConfig` from a job file: `config_json`'s form, or any part of it.

    A field left out takes the default job's value (``model`` and ``data``
    field by field too), so ``{"steps": 50}`` is the default job, 50 steps.

    Raises:
        ValueError: not JSON, not an object, a field a job config does not
            have, or a value of the wrong type.
        ConfigError, DataError: values out of range (compute's checks).
    """
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("a job file holds one JSON object")
    default = JobConfig()
    model = _fields(raw.pop("model", {}), default.model, "model")
    data = _fields(raw.pop("data", {}), default.data, "data")
    for name in ("betas", "classes"):
        if isinstance(raw.get(name), list):
            raw[name] = tuple(raw[name])
    try:
        return replace(default, model=replace(default.model, **model),
                       data=replace(default.data, **data), **_fields(raw, default, ""))
    except TypeError as exc:
        raise ValueError(f"not a job config: {exc}") from None


def _fields(raw: Any, default: Any, where: str) -> dict[str, Any]:
    """``raw``, checked to be an object of ``default``'s fields only."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where or 'a job file'} must be a JSON object, got {raw!r}")
    unknown = sorted(set(raw) - {f.name for f in fields(default)})
    if unknown:
        prefix = f"{where}." if where else ""
        raise ValueError(f"unknown job field {', '.join(prefix + u for u in unknown)}")
    return raw
