"""Benchmark compute.wiretensor's wire codecs against a raw float32 byte copy.

Measures, for one hidden-state tensor (default shape (1, 256, 576), float32,
standard normal with a few large outliers, as hidden states have):
  1. the baseline: ``tensor.numpy().tobytes()`` to encode and
     ``torch.from_numpy(np.frombuffer(...).copy())`` to decode, in MB/s of
     float32 input (1 MB = 10^6 bytes);
  2. encode_tensor / decode_tensor throughput per codec, in the same unit
     and as a ratio to the baseline measured in the same run;
  3. bytes on the wire: the whole message, and the payload per token for
     the tensor's last dim (576 for SmolLM2-135M), against float32;
  4. the round-trip error: max |x - x'| and relative RMS error.

Usage:  .venv/bin/python bench/wiretensor_bench.py [--tokens T] [--dim C] [--threads N] [--json]
            [--smoke]
A combined benchmark can put bench/ on sys.path and call
``wiretensor_bench.run(tokens, dim)``, which returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # run as a script without an install

import benchkit  # noqa: E402
from compute import wiretensor  # noqa: E402

DEFAULT_TOKENS = 256
DEFAULT_DIM = 576
SEED = 576


def _best_time(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Fastest of ``repeats`` timings of ``calls`` calls of fn, per call, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def hidden_state(tokens: int, dim: int) -> torch.Tensor:
    """A deterministic (1, tokens, dim) float32 tensor shaped like hidden states."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, tokens, dim, generator=g)
    x[..., :: max(1, dim // 4)] *= 20  # a few outlier channels
    return x


def _baseline(x: torch.Tensor, calls: int, repeats: int) -> dict[str, float]:
    """Seconds per raw float32 copy to bytes and back."""
    data = x.numpy().tobytes()
    shape = x.shape
    return {
        "encode_s": _best_time(lambda: x.numpy().tobytes(), calls, repeats),
        "decode_s": _best_time(
            lambda: torch.from_numpy(np.frombuffer(data, np.float32).copy()).reshape(shape),
            calls,
            repeats,
        ),
    }


def _codec(x: torch.Tensor, codec: str, calls: int, repeats: int) -> dict[str, float]:
    """Timings, sizes and error of one codec on x."""
    data = wiretensor.encode_tensor(x, codec)
    y = wiretensor.decode_tensor(data)
    diff = (x - y).double()
    token_payload = (wiretensor.encoded_size(codec, (x.shape[-1],))
                     - wiretensor.encoded_size(codec, (0,)))
    return {
        "encode_s": _best_time(lambda: wiretensor.encode_tensor(x, codec), calls, repeats),
        "decode_s": _best_time(lambda: wiretensor.decode_tensor(data), calls, repeats),
        "message_bytes": len(data),
        "bytes_per_element": wiretensor.bytes_per_element(codec),
        "bytes_per_token": token_payload,
        "max_abs_error": float(diff.abs().max()),
        "rel_rms_error": float(diff.norm() / x.double().norm()),
    }


def run(
    tokens: int = DEFAULT_TOKENS, dim: int = DEFAULT_DIM, calls: int = 20, repeats: int = 5
) -> dict[str, Any]:
    """Run every measurement and return the figures.

    Args:
        tokens, dim: the tensor is (1, tokens, dim) float32.
        calls: calls per timing; repeats: timings per measurement (fastest kept).
    Returns:
        A JSON-serialisable dict.
    Raises:
        ValueError: tokens or dim below 1.
    """
    if tokens < 1 or dim < 1:
        raise ValueError("tokens and dim must be at least 1")
    x = hidden_state(tokens, dim)
    mb = x.numel() * 4 / 1e6
    base = _baseline(x, calls, repeats)
    base.update(encode_mb_s=mb / base["encode_s"], decode_mb_s=mb / base["decode_s"])
    base["bytes_per_token"] = 4 * dim
    codecs = {}
    for codec in wiretensor.CODECS:
        c = _codec(x, codec, calls, repeats)
        c.update(
            encode_mb_s=mb / c["encode_s"],
            decode_mb_s=mb / c["decode_s"],
            encode_vs_copy=base["encode_s"] / c["encode_s"],
            decode_vs_copy=base["decode_s"] / c["decode_s"],
            size_vs_float32=c["bytes_per_token"] / (4 * dim),
        )
        codecs[codec] = c
    return {
        "shape": list(x.shape),
        "input_mb": mb,
        "baseline_float32_copy": base,
        "codecs": codecs,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _rows(r: dict[str, Any]) -> list[tuple[str, ...]]:
    """Format the figures as table rows."""
    base = r["baseline_float32_copy"]
    rows = [(
        "float32 copy", f"{base['encode_mb_s']:,.0f}", f"{base['decode_mb_s']:,.0f}", "1.00 / 1.00",
        f"{base['bytes_per_token']:,}", "1.000", "0", "0",
    )]
    for name, c in r["codecs"].items():
        rows.append((
            name, f"{c['encode_mb_s']:,.0f}", f"{c['decode_mb_s']:,.0f}",
            f"{c['encode_vs_copy']:.2f} / {c['decode_vs_copy']:.2f}", f"{c['bytes_per_token']:,}",
            f"{c['size_vs_float32']:.3f}", f"{c['max_abs_error']:.2e}", f"{c['rel_rms_error']:.2e}",
        ))
    return rows


HEADERS = ("codec", "encode MB/s", "decode MB/s", "vs copy (enc/dec)", "bytes/token", "vs f32",
           "max |err|", "rel RMS err")


def _print_table(r: dict[str, Any]) -> None:
    """Print the figures with rich if available, else as plain text."""
    title = (f"compute.wiretensor on {tuple(r['shape'])} float32 ({r['input_mb']:.3f} MB), "
             f"torch {r['torch']}, {r['torch_threads']} threads")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        for row in [HEADERS, *_rows(r)]:
            print("  " + " ".join(f"{v:>17}" for v in row))
        return
    table = Table(title=title)
    for i, h in enumerate(HEADERS):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in _rows(r):
        table.add_row(*row)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--tokens", type=int, default=DEFAULT_TOKENS, help="tokens T of the (1, T, C) tensor")
    add("--dim", type=int, default=DEFAULT_DIM, help="hidden size C")
    add("--threads", type=int, default=1, help="torch threads (a fixed count, ARCHITECTURE.md)")
    add("--json", action="store_true", help="print a JSON object instead of a table")
    args = benchkit.parse_args(parser, {"tokens": 8}, argv)
    torch.set_num_threads(args.threads)
    result = run(args.tokens, args.dim)
    benchkit.report(args, result, lambda: _print_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
