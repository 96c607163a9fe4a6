"""Where tensors run, and the process settings that make runs repeatable.

Owns four things:

- `resolve_device`: turns what a user or config says ("cpu", "cuda",
  "cuda:N", an int N, None) into a `torch.device`. A GPU that is asked for
  and not there is an error (`DeviceUnavailableError`) that names what
  torch does see, never a silent fall back to the CPU: a node that was told
  to mine on GPU 1 must not quietly mine on its CPU at a fraction of the speed.
- `deterministic`: the numeric settings of ARCHITECTURE.md, compute (float32,
  fixed thread count, TF32 off), so a verifier's re-execution of a block
  lands within the tolerances the specs state.
- `pinned_threads`: a block run at a job's intra-op thread count, so every
  node splits a unit's reductions alike and re-executes it bit for bit.
- `compute_class`: the name of what a unit ran on (device kind and model,
  instruction set, torch build, thread count). Two runs of one class give
  the same bits; a PoL verifier of the worker's class compares digests
  only (specs/pol.md 7.3).

Deterministic algorithms. `deterministic` turns on
`torch.use_deterministic_algorithms(True, warn_only=...)` with warn_only True
by default. Every CPU path of compute/ (block forward and backward, the
training step, embedding backward) runs with warn_only=False too; the tests
check it. On CUDA some kernels have no deterministic version (e.g. the
backward of fused attention on some GPUs, index_add on older builds); with
warn_only=True they warn and run, with False they raise. Bit-exact equality
across machines is not the goal (CPU vs GPU never agree to the bit); a
bounded distance is, so a warning is the right default and a caller who wants
strictness passes warn_only=False. For cuBLAS to honour the setting,
CUBLAS_WORKSPACE_CONFIG must be set before the first CUDA matmul;
`deterministic` sets it (":4096:8") when it is unset.

The settings are process-wide torch state: `deterministic` returns the
settings it replaced, and `apply_settings` puts them back.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from compute.errors import DeviceError

_CUDA_SPEC = re.compile(r"cuda(?::(\d+))?")
CUBLAS_WORKSPACE = ":4096:8"


class DeviceSpecError(DeviceError, ValueError):
    """A device was named in a form this project does not accept."""


class DeviceUnavailableError(DeviceError):
    """The device asked for is not present on this machine."""


def _cuda_devices() -> list[str]:
    """Names of the CUDA devices torch sees, e.g. ["cuda:0 (NVIDIA H100)"]."""
    if not torch.cuda.is_available():
        return []
    return [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]


def _cuda(index: int, asked: object) -> torch.device:
    """torch.device("cuda:index"), or DeviceUnavailableError naming what exists."""
    seen = _cuda_devices()
    if not seen:
        raise DeviceUnavailableError(
            f"cuda:{index} requested (as {asked!r}) but torch sees no CUDA device; "
            "use 'cpu' or leave the device unset"
        )
    if index >= len(seen):
        raise DeviceUnavailableError(
            f"cuda:{index} requested (as {asked!r}) but torch sees only {', '.join(seen)}"
        )
    return torch.device("cuda", index)


def resolve_device(spec: str | int | torch.device | None = None) -> torch.device:
    """The device that `spec` names, checked to exist.

    Args:
        spec: None or "cpu" for the CPU; "cuda" (GPU 0), "cuda:N", an int
            N >= 0 or a torch.device for GPU N. None never means "a GPU if
            there is one": using a GPU is asked for explicitly.
    Returns:
        torch.device("cpu") or torch.device("cuda", N).
    Raises:
        DeviceSpecError: anything else ("gpu", "cuda:-1", "cuda:x", " cpu",
            "mps", a bool, a negative int).
        DeviceUnavailableError: a GPU that torch does not see.
    """
    if isinstance(spec, torch.device) and spec.type in ("cpu", "cuda"):
        spec = "cpu" if spec.type == "cpu" else (spec.index or 0)
    if spec is None or spec == "cpu":
        return torch.device("cpu")
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 0:
            raise DeviceSpecError(f"expected a GPU index >= 0, got {spec}")
        return _cuda(spec, spec)
    if isinstance(spec, str):
        match = _CUDA_SPEC.fullmatch(spec)
        if match:
            return _cuda(int(match.group(1) or 0), spec)
    raise DeviceSpecError(
        f"expected None, 'cpu', 'cuda', 'cuda:N' or an int N >= 0, got {spec!r}"
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """The torch numeric settings that `deterministic` controls (a snapshot).

    threads: intra-op CPU threads; default_dtype: dtype of new float tensors;
    matmul_tf32 / cudnn_tf32: whether CUDA may round float32 matmuls and
    convolutions to TF32; matmul_precision: torch's float32 matmul precision
    ("highest" is full float32); cudnn_deterministic / cudnn_benchmark:
    cuDNN algorithm choice; deterministic_algorithms / warn_only: the state
    of `torch.use_deterministic_algorithms`.
    """

    threads: int
    default_dtype: torch.dtype
    matmul_tf32: bool
    cudnn_tf32: bool
    matmul_precision: str
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    deterministic_algorithms: bool
    warn_only: bool


def current_settings() -> Settings:
    """The settings in force now."""
    return Settings(
        threads=torch.get_num_threads(),
        default_dtype=torch.get_default_dtype(),
        matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
        cudnn_tf32=torch.backends.cudnn.allow_tf32,
        matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_deterministic=torch.backends.cudnn.deterministic,
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
    )


def apply_settings(settings: Settings) -> Settings:
    """Put `settings` in force; returns the settings they replaced."""
    previous = current_settings()
    torch.set_num_threads(settings.threads)
    torch.set_default_dtype(settings.default_dtype)
    torch.backends.cuda.matmul.allow_tf32 = settings.matmul_tf32
    torch.backends.cudnn.allow_tf32 = settings.cudnn_tf32
    torch.set_float32_matmul_precision(settings.matmul_precision)
    torch.backends.cudnn.deterministic = settings.cudnn_deterministic
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    torch.use_deterministic_algorithms(
        settings.deterministic_algorithms, warn_only=settings.warn_only
    )
    return previous


def deterministic(threads: int, *, warn_only: bool = True) -> Settings:
    """Put the repeatable-run settings in force for this process.

    float32 default dtype, `threads` intra-op threads, TF32 off for matmuls
    and cuDNN, float32 matmul precision "highest", cuDNN deterministic and not
    benchmarking, deterministic algorithms on (see the module docstring for
    warn_only), and CUBLAS_WORKSPACE_CONFIG set if it was unset.

    Args:
        threads: CPU threads for intra-op parallelism (>= 1). Results on the
            CPU can change with the thread count (reductions split
            differently), so a verifier uses the count the job states.
        warn_only: passed to `torch.use_deterministic_algorithms`.
    Returns:
        The settings that were in force before (for `apply_settings`).
    Raises:
        DeviceSpecError: threads < 1.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise DeviceSpecError(f"expected a thread count >= 1, got {threads!r}")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    return apply_settings(
        Settings(
            threads=threads,
            default_dtype=torch.float32,
            matmul_tf32=False,
            cudnn_tf32=False,
            matmul_precision="highest",
            cudnn_deterministic=True,
            cudnn_benchmark=False,
            deterministic_algorithms=True,
            warn_only=warn_only,
        )
    )


@contextlib.contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` intra-op CPU threads, then restore the count.

    A training job's units run at the job's count (`JobConfig.threads`) on
    every node: a CPU BLAS may split a matmul's reduction (a weight
    gradient's sum over the batch) by thread, so other counts may give
    other roundings, and only the same count lets a verifier or a replay
    match a worker's digests everywhere (measured on one machine: 1 and 2
    threads differ in every weight gradient of the devnet's job; on an AMD
    Zen 5 with torch 2.13's MKL they round alike, while torch's own long
    float32 sums still differ). The count is the calling thread's (OpenMP's
    is per thread), so call it on the thread that computes.
    """
    before = torch.get_num_threads()
    if before != threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if before != threads:
            torch.set_num_threads(before)


def compute_class(device: torch.device | str, threads: int) -> str:
    """The compute class of a run on ``device`` at ``threads`` intra-op threads.

    Printable ASCII (a certificate name, specs/pol.md 3.2), e.g.
    ``cpu/x86_64/AVX512/torch-2.13.0+cpu/threads-2`` or
    ``cuda/NVIDIA H200/sm90/torch-2.11.0+cu130/cuda-13.0``. The thread
    count is part of a CPU class only (a GPU kernel's reduction order does
    not follow it).
    """
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        parts = ["cuda", torch.cuda.get_device_name(index), f"sm{major}{minor}",
                 f"torch-{torch.__version__}", f"cuda-{torch.version.cuda}"]
    else:
        parts = [device.type, platform.machine(), torch.backends.cpu.get_cpu_capability(),
                 f"torch-{torch.__version__}", f"threads-{threads}"]
    name = "/".join(parts)
    return "".join(c if " " <= c <= "~" else "?" for c in name)[:128]

