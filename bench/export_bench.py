"""Writing and reading a job's export: .gguf against .safetensors, in one sitting.

The model is SmolLM2-135M (float32, what a SmolLM2 job exports). Each
format is written with `compute.export.save_export` (what `pnode job
export` runs) and read back the way its users read it: a .safetensors
export with `compute.export.load_export` (`pwallet infer --local`), a
.gguf with `compute.gguf.load_gguf` (`pwallet infer`, `pnode start
--model`). The baseline is safetensors' own save and load of the same
tensors. Medians over --repeats runs, alternating.

Usage:  .venv/bin/python bench/export_bench.py [--repeats 3] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchkit  # noqa: E402
from compute.export import load_export, save_export  # noqa: E402
from compute.gguf import load_gguf, open_gguf  # noqa: E402
from compute.jobfile import config_json  # noqa: E402
from compute.pretrained import bundled_sha256, pretrained_config, pretrained_model  # noqa: E402


def timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = benchkit.parse_args(ap, {"repeats": 1})

    from safetensors.torch import load_file, save_file

    from compute.data import DataSpec, JobConfig
    from compute.export import _unshared

    sha = bundled_sha256()
    config = JobConfig(model=pretrained_config(sha, 256), init=sha, data=DataSpec("file",
                                                                                   sha256="0" * 64))
    weights = pretrained_model(sha, config.model).state_dict()
    text = config_json(config)
    times: dict[str, list[float]] = {k: [] for k in (
        "safetensors_save", "export_safetensors", "export_gguf",
        "safetensors_load", "load_export", "load_gguf")}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        base, st, gg = (Path(tmp) / n for n in ("base.safetensors", "m.safetensors", "m.gguf"))
        for _ in range(args.repeats):
            times["safetensors_save"].append(timed(lambda: save_file(_unshared(weights),
                                                                     str(base))))
            times["export_safetensors"].append(timed(lambda: save_export(st, weights, text,
                                                                         "ab" * 32, 1)))
            times["export_gguf"].append(timed(lambda: save_export(gg, weights, text, "ab" * 32,
                                                                  1)))
            times["safetensors_load"].append(timed(lambda: load_file(str(base))))
            times["load_export"].append(timed(lambda: load_export(st)))
            times["load_gguf"].append(timed(lambda: load_gguf(reader=open_gguf(gg))))
        sizes = {p.suffix + (" (base)" if p == base else ""): p.stat().st_size
                 for p in (base, st, gg)}
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [("write: safetensors (baseline)", med["safetensors_save"], "safetensors_save"),
            ("write: export .safetensors", med["export_safetensors"], "safetensors_save"),
            ("write: export .gguf", med["export_gguf"], "safetensors_save"),
            ("read: safetensors (baseline)", med["safetensors_load"], "safetensors_load"),
            ("read: load_export (.safetensors)", med["load_export"], "safetensors_load"),
            ("read: load_gguf (.gguf)", med["load_gguf"], "safetensors_load")]

    def table() -> None:
        print(f"SmolLM2-135M float32, {sum(t.numel() for t in weights.values()):,} parameters; "
              f"median of {args.repeats}")
        print(f"{'':36} {'seconds':>8} {'vs baseline':>12}")
        for name, s, base_key in rows:
            print(f"{name:36} {s:8.2f} {s / med[base_key]:11.2f}x")
        for suffix, n in sizes.items():
            print(f"  file {suffix:20} {n / 2**20:8.1f} MiB")
    benchkit.report(args, {"seconds": med, "bytes": sizes, "repeats": args.repeats}, table,
                    indent=None)


if __name__ == "__main__":
    main()
