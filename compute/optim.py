"""AdamW over slices of a model's parameters, and the state format of such an optimizer.

Owns `ParamSlice` (a named part of one parameter), `SliceAdamW` (a section's
AdamW over its slices) and the flat dict in which a `SliceAdamW` hands out and
takes back its state (`SliceAdamW.state_dict` / `load_state`). Miners send
that dict to each other to catch up (node/mine/miner.py), so its format is a
wire format:

- ``key``: the slice's current weights, where the key is the parameter's
  name, with ``@n`` for the n-th further slice of the same parameter
  (`slice_keys`; a piece of a layer owns several slices of one tensor);
- ``key#step`` (shape (1,), float32), ``key#exp_avg`` and ``key#exp_avg_sq``
  (the slice's shape): AdamW's step count and moments, all three present or
  all three absent (a slice not stepped yet has none).

AdamW runs with ``foreach=False``: the per-tensor kernels, the same for whole
tensors and slices, so an optimizer over slices steps as one over whole
tensors would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from compute.errors import OptimizerStateError

if TYPE_CHECKING:
    from compute.data import JobConfig
    from compute.model import Transformer

__all__ = ["MOMENTS", "ParamSlice", "SliceAdamW", "adamw", "slice_keys"]

#: Suffixes of a slice's AdamW entries in a state dict (module docstring).
MOMENTS = ("#step", "#exp_avg", "#exp_avg_sq")


@dataclass(frozen=True, slots=True)
class ParamSlice:
    """Part of a parameter: rows [r0, r1), then columns [c0, c1) or elements [e0, e1) of them."""

    name: str
    rows: tuple[int, int]
    cols: tuple[int, int] | None = None
    flat: tuple[int, int] | None = None

    def of(self, t: torch.Tensor) -> torch.Tensor:
        """The view of t this slice names."""
        v = t[self.rows[0] : self.rows[1]]
        if self.cols is not None:
            v = v[:, self.cols[0] : self.cols[1]]
        if self.flat is not None:
            v = v.view(-1)[self.flat[0] : self.flat[1]]
        return v

    def numel(self, t: torch.Tensor) -> int:
        return self.of(t).numel()


def slice_keys(slices: Iterable[ParamSlice]) -> list[str]:
    """A name per slice: its parameter's, with ``@n`` for the n-th further slice of it.

    (A piece of a layer owns several slices of one tensor: q rows, k and v shares.)
    """
    seen: dict[str, int] = {}
    out = []
    for sl in slices:
        n = seen[sl.name] = seen.get(sl.name, -1) + 1
        out.append(sl.name if n == 0 else f"{sl.name}@{n}")
    return out


def adamw(params: Iterable[torch.Tensor], job: JobConfig) -> torch.optim.AdamW:
    """AdamW with the job's lr, betas, eps and weight decay, per-tensor kernels.

    Args:
        params: the tensors it steps.
        job: the training job.

    Returns:
        The optimizer (no state until its first step).
    """
    # foreach=False: the per-tensor kernels, the same for whole tensors and slices.
    return torch.optim.AdamW(
        params, lr=job.lr, betas=job.betas, eps=job.eps, weight_decay=job.weight_decay,
        foreach=False,
    )


class SliceAdamW:
    """A section's AdamW over its slices of a model's parameters.

    Holds its own copy of the slices (as a node holds its section), steps it
    with gradients sliced from a dict by parameter name, and writes the result
    back into the model's tensors.

    Args:
        model: the weights (read once, written after every step).
        slices: what this section owns.
        job: lr, betas, eps, weight_decay.
    """

    def __init__(self, model: Transformer, slices: tuple[ParamSlice, ...], job: JobConfig) -> None:
        named = dict(model.named_parameters())
        self.slices = slices
        self.targets = [named[s.name] for s in slices]
        self.params = [nn.Parameter(s.of(t.detach()).clone()) for s, t in zip(slices, self.targets)]
        self.optimizer = adamw(self.params, job)
        self._keys = slice_keys(slices)

    def step(self, grads: Mapping[str, torch.Tensor]) -> None:
        """One AdamW step with the gradients of `grads` (full-shaped, by name)."""
        for s, p in zip(self.slices, self.params):
            p.grad = s.of(grads[s.name]).clone()
        self.optimizer.step()
        with torch.no_grad():
            for s, p, t in zip(self.slices, self.params, self.targets):
                s.of(t).copy_(p)

    def numel(self) -> int:
        """How many weights the slices hold (each has two AdamW moments as large)."""
        return sum(p.numel() for p in self.params)

    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights by slice key (`slice_keys`): detached views, not copies."""
        return {key: p.detach() for key, p in zip(self._keys, self.params)}

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Take the weights of every slice from `weights` (by slice key), here and in the model.

        The AdamW moments are kept as they are (averaging replicas moves only weights).

        Raises:
            KeyError: a slice's key is missing.
        """
        with torch.no_grad():
            for key, sl, p, target in zip(self._keys, self.slices, self.params, self.targets):
                p.copy_(weights[key])
                sl.of(target).copy_(p)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights and AdamW state of every slice, as copies (module docstring's format)."""
        out = {}
        for key, p in zip(self._keys, self.params):
            out[key] = p.detach().clone()
            state = self.optimizer.state.get(p)
            if state:
                out[key + "#step"] = state["step"].detach().reshape(1).float().clone()
                out[key + "#exp_avg"] = state["exp_avg"].detach().clone()
                out[key + "#exp_avg_sq"] = state["exp_avg_sq"].detach().clone()
        return out

    def check_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Raise unless `state` fits these slices (what `load_state` accepts).

        Raises:
            OptimizerStateError: a slice's weights are missing or of another
                shape or dtype, its AdamW entries are neither all present (a
                one-element float step, moments of the slice's shape and dtype)
                nor all absent, or a name is not one of these slices' entries.
        """
        for key, p in zip(self._keys, self.params):
            w = state.get(key)
            if w is None or w.shape != p.shape or w.dtype != p.dtype:
                got = f"{tuple(w.shape)} {w.dtype}" if w is not None else "nothing"
                raise OptimizerStateError(
                    f"slice {key}: expected weights of shape {tuple(p.shape)} {p.dtype}, "
                    f"got {got}"
                )
            step = state.get(key + "#step")
            moments = [state.get(key + suffix) for suffix in MOMENTS[1:]]
            if step is None and moments == [None, None]:
                continue
            if step is None or step.numel() != 1 or not step.is_floating_point() or any(
                    m is None or m.shape != p.shape or m.dtype != p.dtype for m in moments):
                raise OptimizerStateError(
                    f"slice {key}: expected a one-element float step and two moments of "
                    f"shape {tuple(p.shape)} {p.dtype}, or none of them"
                )
        names = {key + x for key in self._keys for x in ("", *MOMENTS)}
        unknown = sorted(set(state) - names)
        if unknown:
            raise OptimizerStateError(f"expected entries of these slices only, got {unknown[:4]}")

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take weights and AdamW state from a `state_dict` (of this or another replica).

        A slice without AdamW entries starts its moments afresh, as one never
        stepped. The tensors are copied; the moments move to the weights' device.

        Raises:
            OptimizerStateError: as `check_state` (nothing is changed then).
        """
        self.check_state(state)
        self.load_weights(state)
        for key, p in zip(self._keys, self.params):
            if key + "#step" in state:
                self.optimizer.state[p] = {
                    "step": state[key + "#step"].reshape(()).clone(),
                    "exp_avg": state[key + "#exp_avg"].to(p.device, copy=True),
                    "exp_avg_sq": state[key + "#exp_avg_sq"].to(p.device, copy=True)}
            else:
                self.optimizer.state.pop(p, None)
