"""Bias-free linear projection with a prepacked CPU path for decoding.

Owns how the model multiplies activations with a weight matrix. A module
in training mode (`model.train()`, as `compute.data.make_model` returns it)
always uses plain `F.linear`, with or without autograd: a training forward
run under `no_grad` (as a miner's forward units are) must give the same bits
as the same forward recomputed with autograd, and oneDNN's kernels do not.
In inference (eval mode, as loaders return models, and no autograd) on a
CPU this module multiplies with a lazily built oneDNN copy of the weight, reordered once
("prepacked"): decoding one token at a time is a matrix-vector product bound
by memory bandwidth, and MKL's gemv that `F.linear` reaches runs on one
thread (about 16 GB/s here) while oneDNN streams the packed weight on all
threads (about 40 GB/s); for many rows (prompt prefill) the packed GEMM
measured about 2x faster than `F.linear` too (576x3072 at 256 rows: 2.2 ms
against 5.3 ms, 2 threads). A server, which never trains, may keep only the
packed copy (`release_weight`).

The packed copy is a cache: it is rebuilt when the weight changes in place
(its version counter moves, as with `optimizer.step()` or `load_state_dict`)
or is replaced, is never saved in a state dict, and is dropped by `unpack()`.
It costs one extra copy of the weight in memory while it lives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from compute.errors import ComputeError


def _mkldnn_linear_available() -> bool:
    """True when this torch build has oneDNN and its prepacked linear op."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:  # looking an op up is the probe: a missing one raises
        _ = (torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False
    return True


_PACKING_AVAILABLE = _mkldnn_linear_available()


class Linear(nn.Module):
    """y = x @ W.T with W of shape (out_features, in_features), no bias.

    Args:
        in_features: size of the last input dimension.
        out_features: size of the last output dimension.
        pack_cpu: allow the prepacked CPU path in eval mode (see module docstring).

    The weight starts at zeros so that construction draws no randomness;
    weights come from a loader or from `Transformer.init_weights(generator)`.
    """

    def __init__(self, in_features: int, out_features: int, *, pack_cpu: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.zeros(out_features, in_features))
        self.pack_cpu = pack_cpu and _PACKING_AVAILABLE
        self._packed: torch.Tensor | None = None
        self._packed_key: tuple[int, int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Project the last dimension of x: (..., in) -> (..., out)."""
        if self.packs(x):
            return self._packed_forward(x)
        if self.weight is None:
            raise ComputeError("this layer kept only its packed inference weights "
                               "(release_weight): it cannot train or run off the CPU")
        return F.linear(x, self.weight)

    def packs(self, x: torch.Tensor) -> bool:
        """Whether ``forward(x)`` takes the packed path (CPU float32 inference)."""
        return self.pack_cpu and self._may_pack(x)

    def release_weight(self) -> None:
        """Pack now and drop the plain weight: half the memory, inference only.

        For a server's layers, which never train: afterwards only CPU float32
        inference works (anything else raises `ComputeError`).
        """
        if self.weight is None:
            return
        if not self.pack_cpu or self.weight.device.type != "cpu":
            raise ComputeError("only a CPU float32 layer with oneDNN packing can release "
                               "its plain weight")
        self._pack(self.weight)
        self.weight = None

    def unpack(self) -> None:
        """Drop the packed copy of the weight (it is rebuilt on demand)."""
        if self.weight is None:
            return  # the packed copy is all there is
        self._packed = None
        self._packed_key = None

    def _may_pack(self, x: torch.Tensor) -> bool:
        # Only in eval mode where no gradient flows, on CPU float32 (a released
        # weight is packed).
        w = self.weight
        return (
            not self.training
            and not torch.is_grad_enabled()
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and (w is None or (w.device.type == "cpu" and w.dtype == torch.float32))
        )

    def _pack(self, w: torch.Tensor) -> bool:
        """(Re)build the packed copy of ``w``; False if this build cannot."""
        try:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1)
        except RuntimeError:
            # A build that lists the op but cannot run it: stay on F.linear.
            self.pack_cpu = False
            return False
        self._packed_key = (w._version, w.data_ptr())
        return True

    def _packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w is not None and (w._version, w.data_ptr()) != self._packed_key and not self._pack(w):
            return F.linear(x, w)
        rows = x.numel() // self.in_features
        y = torch.ops.mkldnn._linear_pointwise(
            x.reshape(rows, self.in_features), self._packed, None, "none", [], ""
        )
        return y.view(*x.shape[:-1], self.out_features)

    def __getstate__(self) -> dict:
        # The packed copy is an opaque oneDNN tensor; never pickle or deepcopy it.
        state = self.__dict__.copy()
        state["_packed"] = None
        state["_packed_key"] = None
        return state

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, pack_cpu={self.pack_cpu}"
