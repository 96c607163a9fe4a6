"""Compute benchmark: SmolLM2-135M-Instruct prefill, decode and the 8-bit wire.

Measures, in one process, against baselines measured in the same run:
  1. prefill tokens/s over a --prompt-tokens prompt (default 256): ours is
     one forward over the prompt into a fresh KV cache; the baseline is
     transformers reading the same GGUF in float32, ``model(input_ids,
     use_cache=True)`` under inference mode. Both compute the logits of every
     position (what ``model(input_ids)`` does); a second row computes only
     the last position's (ours ``last_only=True``, transformers
     ``logits_to_keep=1``), which is what generation needs;
  2. decode tokens/s: --decode-tokens (default 64) greedy tokens after a
     short prompt, prompt pass included, timed end to end. Ours is
     ``compute.generate.generate``; the baselines are transformers'
     ``model.generate(do_sample=False, max_new_tokens=n, min_new_tokens=n)``
     and a hand-written greedy loop over transformers' forward with
     ``past_key_values`` (no generate() machinery). All must produce the same
     n tokens (asserted);
  3. the ceiling: llama.cpp (llama-cpp-python, the optional ``bench`` extra)
     decoding the same GGUF file in its own quantization on the same thread
     count; "not installed" when the package is absent;
  4. the wire (compute.wiretensor): bytes per token of a hidden state (dim 576)
     per codec against float32, and the error a codec adds when SmolLM2 runs
     split in three sections (cuts after layers 10 and 20) and the hidden
     state crosses each cut through encode_tensor/decode_tensor: max and mean
     abs logit error over a few prompts against the unsplit run, and how many
     of 32 greedy tokens match before the first divergence;
  5. the peak RSS of the process after loading our model (getrusage), and
     after its first decode (which builds the packed weight copies).

Timed runs alternate between ours and the baselines (order flipped each
repeat) and each figure is the median of --repeats runs: the machine is
shared and noisy, so before each repeat the bench also waits (up to
--max-wait seconds) for other processes to leave the CPUs idle, and logs the
load it found. Ratios are the ratio of the medians and, in brackets, the
median over repeats of the ratio of the two runs of one repeat (adjacent in
time, so under the same load). Everything runs on --threads torch threads
(``torch.set_num_threads``) and llama.cpp gets the same count.

Usage:  .venv/bin/python bench/compute_bench.py [--threads 2] [--prompt-tokens 256]
            [--decode-tokens 64] [--repeats N] [--max-wait S] [--wire-prompts N]
            [--wire-tokens N] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))  # run as a script without an install

import benchkit  # noqa: E402
import compute_wire  # noqa: E402
import llama_cpp_baseline  # noqa: E402
from compute.generate import generate  # noqa: E402
from compute.gguf import field, find_gguf, load_gguf, open_gguf  # noqa: E402
from compute.kvcache import KVCache  # noqa: E402
from compute.model import Transformer  # noqa: E402
from compute.tokenizer import Tokenizer  # noqa: E402

DECODE_PROMPT = "The history of the Roman Empire"
PREFILL_TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city "
    "on the banks of the Tiber to the fall of Constantinople in 1453. Its roads, laws and "
    "language shaped Europe long after the last emperor. Historians still argue about why "
    "the western half collapsed: some blame economic decline and plague, others the "
    "pressure of migrating peoples, the division of the army, or the cost of defending "
    "frontiers that ran from Scotland to the Euphrates. "
)
TARGETS = {"prefill": 1.0, "decode": 1.5}


# ---------------------------------------------------------------- loading


def load_ours() -> tuple[Transformer, Tokenizer, dict[str, float]]:
    """Our model and tokenizer from the bundled GGUF, with load time and RSS."""
    rss_before = benchkit.peak_rss_mib()
    t0 = time.perf_counter()
    reader = open_gguf()
    model = load_gguf(reader=reader)
    tok = Tokenizer.from_gguf(reader=reader)
    load_s = time.perf_counter() - t0
    file_type = int(field(reader, "general.file_type", -1))
    del reader  # its memory map and parsed metadata: about 200 MiB
    gc.collect()
    info = {
        "load_s": load_s,
        "peak_rss_before_load_mib": rss_before,
        "peak_rss_after_load_mib": benchkit.peak_rss_mib(),
        "rss_after_load_mib": benchkit.rss_mib(),
        "weights_mib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
        "file_type": file_type,
    }
    return model, tok, info


def load_transformers() -> Any:
    """transformers' LlamaForCausalLM read from the same GGUF file, float32, offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM  # the reference (dev extra)

    path = find_gguf()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


def gguf_quantization() -> str:
    """The tensor types in the bundled GGUF file, e.g. 'Q4_1 x210, F32 x61, Q8_0 x1'."""
    from collections import Counter

    counts = Counter(t.tensor_type.name for t in open_gguf().tensors)
    return ", ".join(f"{k} x{v}" for k, v in counts.most_common())


def prompt_of(tok: Tokenizer, n: int) -> list[int]:
    """Exactly n token ids of English prose."""
    ids: list[int] = []
    while len(ids) < n:
        ids += tok.encode(PREFILL_TEXT)
    return ids[:n]


# ---------------------------------------------------------------- 1. prefill


def bench_prefill(ours: Transformer, ref: Any, ids: list[int], repeats: int) -> dict[str, Any]:
    """Prefill tokens/s, all-position logits and last-position logits."""
    x = torch.tensor([ids])
    t = x.shape[1]

    @torch.inference_mode()
    def ours_fn(last_only: bool) -> torch.Tensor:
        return ours(x, cache=KVCache(ours.config, t), last_only=last_only)

    @torch.inference_mode()
    def ref_fn(last_only: bool) -> torch.Tensor:
        kw = {"logits_to_keep": 1} if last_only else {}
        return ref(x, use_cache=True, **kw).logits

    out: dict[str, Any] = {"prompt_tokens": t}
    for label, last_only in (("all_logits", False), ("last_logit", True)):
        fns = {
            "ours": lambda lo=last_only: ours_fn(lo),
            "transformers": lambda lo=last_only: ref_fn(lo),
        }
        for fn in fns.values():
            fn()  # warm up
        times, last = benchkit.alternate(fns, repeats)
        diff = float((last["ours"] - last["transformers"]).abs().max())
        rates = {k: benchkit.median_rate(v, t) for k, v in times.items()}
        out[label] = {
            "ours_tok_s": rates["ours"],
            "transformers_tok_s": rates["transformers"],
            "ratio": rates["ours"] / rates["transformers"],
            "paired_ratio": benchkit.paired_ratio(times["ours"], times["transformers"]),
            "ours_runs_tok_s": [t / s for s in times["ours"]],
            "transformers_runs_tok_s": [t / s for s in times["transformers"]],
            "max_abs_logit_diff": diff,
        }
    return out


# ---------------------------------------------------------------- 2. decode


def bench_decode(
    ours: Transformer, ref: Any, tok: Tokenizer, n: int, repeats: int, llm: Any
) -> dict[str, Any]:
    """Decode tokens/s for n greedy tokens after a short prompt."""
    ids = tok.encode(DECODE_PROMPT)
    prompt = torch.tensor([ids])

    def run_ours() -> list[int]:
        return generate(ours, ids, n)

    @torch.inference_mode()
    def run_generate() -> list[int]:
        out = ref.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,  # no early stop: exactly n tokens
            do_sample=False,
            pad_token_id=tok.eos_id,
        )
        return out[0, len(ids) :].tolist()

    @torch.inference_mode()
    def run_loop() -> list[int]:
        out = ref(prompt, use_cache=True, logits_to_keep=1)
        past, new = out.past_key_values, []
        for step in range(n):
            nxt = out.logits[0, -1].argmax()
            new.append(int(nxt.item()))
            if step == n - 1:
                break
            out = ref(nxt.view(1, 1), past_key_values=past, use_cache=True)
            past = out.past_key_values
        return new

    fns: dict[str, Callable[[], list[int]]] = {
        "ours": run_ours,
        "transformers_generate": run_generate,
        "transformers_loop": run_loop,
    }
    if llm is not None:
        fns["llama_cpp"] = lambda: llama_cpp_baseline.llama_cpp_greedy(llm, ids, n)
    for fn in fns.values():
        fn()  # warm up (packs our weights, fills allocator caches)
    times, last = benchkit.alternate(fns, repeats)
    want = last["ours"]
    assert len(want) == n, len(want)
    if tok.stop_ids & set(want):
        # min_new_tokens masks EOS in transformers' generate: it could not agree.
        raise AssertionError(f"greedy output holds a stop token; pick another prompt: {want}")
    for name in ("transformers_generate", "transformers_loop"):
        assert last[name] == want, f"{name} differs from ours:\n{last[name]}\n{want}"
    rates = {k: benchkit.median_rate(v, n) for k, v in times.items()}
    result: dict[str, Any] = {
        "prompt_tokens": len(ids),
        "new_tokens": n,
        "text": tok.decode(want),
        "same_tokens": True,
        "rates_tok_s": rates,
        "runs_tok_s": {k: [n / s for s in v] for k, v in times.items()},
        "ratio_vs_generate": rates["ours"] / rates["transformers_generate"],
        "ratio_vs_loop": rates["ours"] / rates["transformers_loop"],
        "paired_ratio_vs_generate": benchkit.paired_ratio(times["ours"], times["transformers_generate"]),
        "paired_ratio_vs_loop": benchkit.paired_ratio(times["ours"], times["transformers_loop"]),
    }
    if llm is not None:
        result["ratio_vs_llama_cpp"] = rates["ours"] / rates["llama_cpp"]
        result["paired_ratio_vs_llama_cpp"] = benchkit.paired_ratio(times["ours"], times["llama_cpp"])
        result["llama_cpp_matching_prefix"] = compute_wire.matching_prefix(last["llama_cpp"], want)
    return result


def run(
    threads: int = 2,
    prompt_tokens: int = 256,
    decode_tokens: int = 64,
    repeats: int = 7,
    wire: bool = True,
    llama: bool = True,
    max_wait_s: float = 20.0,
    wire_prompts: int = len(compute_wire.WIRE_PROMPTS),
    wire_tokens: int = compute_wire.WIRE_TOKENS,
) -> dict[str, Any]:
    """Run every measurement; returns a JSON-serialisable dict."""
    if min(threads, prompt_tokens, decode_tokens, repeats) < 1:
        raise ValueError("threads, prompt tokens, decode tokens and repeats must be >= 1")
    torch.set_num_threads(threads)
    benchkit.WAIT_IDLE["max_wait_s"] = max_wait_s
    benchkit.BUSY_LOG.clear()
    ours, tok, mem = load_ours()
    generate(ours, tok.encode(DECODE_PROMPT), 2)  # builds the packed decode weights
    mem["peak_rss_after_first_decode_mib"] = benchkit.peak_rss_mib()
    mem["rss_after_first_decode_mib"] = benchkit.rss_mib()

    t0 = time.perf_counter()
    ref = load_transformers()
    ref_load_s = time.perf_counter() - t0
    mem["peak_rss_with_transformers_mib"] = benchkit.peak_rss_mib()

    llm, llama_version = (None, "skipped") if not llama else llama_cpp_baseline.load_llama_cpp(threads, 512)
    if llm is None and llama:
        benchkit.skipped("the llama.cpp ceiling", "llama-cpp-python is not installed: "
                         "pip install -e '.[bench]'")
    ids = prompt_of(tok, prompt_tokens)
    result: dict[str, Any] = {
        "model": find_gguf().name,
        "gguf_tensor_types": gguf_quantization(),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "memory": mem,
        "transformers_load_s": ref_load_s,
        "prefill": bench_prefill(ours, ref, ids, repeats),
        "decode": bench_decode(ours, ref, tok, decode_tokens, repeats, llm),
        "llama_cpp": {"version": llama_version},
    }
    if llm is not None:
        result["llama_cpp"].update(
            n_threads=threads,
            decode_tok_s=result["decode"]["rates_tok_s"]["llama_cpp"],
            prefill=llama_cpp_baseline.bench_llama_cpp_prefill(llm, ours, ids, repeats),
        )
    if wire:
        result["wire"] = compute_wire.bench_wire(ours, tok, wire_prompts, wire_tokens)
    import transformers

    result.update(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        machine=platform.machine(),
        cpus=os.cpu_count(),
        # CPU fraction other processes used just before each timed repeat (after waiting).
        busy_before_repeats=benchkit.BUSY_LOG[:],
        repeats_started_busy=sum(b >= benchkit.WAIT_IDLE["busy_below"] for b in benchkit.BUSY_LOG),
        wait_idle=dict(benchkit.WAIT_IDLE),
        targets=TARGETS,
    )
    return result


def _fmt_rate(x: float) -> str:
    return f"{x:,.1f}"


def _runs(xs: list[float]) -> str:
    return " ".join(f"{x:.0f}" for x in xs)


def _speed_rows(r: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    pre = r["prefill"]
    for label, key in (("all logits", "all_logits"), ("last logit", "last_logit")):
        p = pre[key]
        rows.append((
            f"prefill {pre['prompt_tokens']} tok ({label})",
            _fmt_rate(p["ours_tok_s"]),
            "transformers forward",
            _fmt_rate(p["transformers_tok_s"]),
            f"{p['ratio']:.2f}x ({p['paired_ratio']:.2f}x)",
            f">= {TARGETS['prefill']:.1f}x" if key == "all_logits" else "",
            f"{_runs(p['ours_runs_tok_s'])} / {_runs(p['transformers_runs_tok_s'])}",
        ))
    d = r["decode"]
    rates, runs = d["rates_tok_s"], d["runs_tok_s"]
    label = f"decode {d['new_tokens']} greedy tok"
    for name, base, key, target in (
        ("transformers_generate", "transformers generate()", "vs_generate", True),
        ("transformers_loop", "transformers greedy loop", "vs_loop", False),
    ):
        ratio = f"{d['ratio_' + key]:.2f}x ({d['paired_ratio_' + key]:.2f}x)"
        rows.append((
            label, _fmt_rate(rates["ours"]), base, _fmt_rate(rates[name]), ratio,
            f">= {TARGETS['decode']:.1f}x" if target else "",
            f"{_runs(runs['ours'])} / {_runs(runs[name])}",
        ))
    lc = r["llama_cpp"]
    if "decode_tok_s" in lc:
        rows.append((
            label, _fmt_rate(rates["ours"]), f"llama.cpp {lc['version']} (ceiling)",
            _fmt_rate(lc["decode_tok_s"]),
            f"{d['ratio_vs_llama_cpp']:.2f}x ({d['paired_ratio_vs_llama_cpp']:.2f}x)", "",
            f"{_runs(runs['ours'])} / {_runs(runs['llama_cpp'])}",
        ))
        lp = lc["prefill"]
        rows.append((
            f"prefill {pre['prompt_tokens']} tok (last logit)",
            _fmt_rate(lp["rates_tok_s"]["ours"]), "llama.cpp (ceiling)",
            _fmt_rate(lp["rates_tok_s"]["llama_cpp"]),
            f"{lp['ratio']:.2f}x ({lp['paired_ratio']:.2f}x)", "",
            f"{_runs(lp['runs_tok_s']['ours'])} / {_runs(lp['runs_tok_s']['llama_cpp'])}",
        ))
    else:
        rows.append(
            (label, _fmt_rate(rates["ours"]), f"llama.cpp: {lc['version']}", "-", "-", "", "")
        )
    return rows


SPEED_HEADERS = ("measure", "ours tok/s", "baseline", "baseline tok/s",
                 "ratio of medians (median of paired ratios)", "target",
                 "runs tok/s (ours / baseline)")
def _print_tables(r: dict[str, Any]) -> None:
    """Print the figures with rich if available, else as plain text."""
    m = r["memory"]
    title = (f"SmolLM2-135M-Instruct float32 ({r['model']}), torch {r['torch']}, "
             f"transformers {r['transformers']}, {r['threads']} threads, "
             f"median of {r['repeats']}")
    notes = [
        f"float32 weights {m['weights_mib']:.0f} MiB; "
        f"peak RSS: {m['peak_rss_before_load_mib']:.0f} MiB before load, "
        f"{m['peak_rss_after_load_mib']:.0f} MiB after loading ours ({m['load_s']:.1f} s; "
        f"current {m['rss_after_load_mib']:.0f} MiB), "
        f"{m['peak_rss_after_first_decode_mib']:.0f} MiB after first decode (packed weights; "
        f"current {m['rss_after_first_decode_mib']:.0f} MiB), "
        f"{m['peak_rss_with_transformers_mib']:.0f} MiB with transformers loaded",
        f"GGUF tensor types: {r['gguf_tensor_types']}; "
        f"{r['repeats_started_busy']} of {len(r['busy_before_repeats'])} timed repeats "
        f"started with other processes using >= {r['wait_idle']['busy_below']:.0%} of the CPUs",
        f"decode prompt {r['decode']['prompt_tokens']} tokens, output (same in all): "
        f"{r['decode']['text']!r}",
    ]
    if "llama_cpp_matching_prefix" in r["decode"]:
        notes.append(f"llama.cpp greedy tokens matching ours before divergence: "
                     f"{r['decode']['llama_cpp_matching_prefix']}/{r['decode']['new_tokens']}")
    tables = [(title, SPEED_HEADERS, _speed_rows(r))]
    if "wire" in r:
        w = r["wire"]
        tables.append((
            f"Wire: hidden state (dim {w['dim']}) cut after layers "
            f"{', '.join(map(str, w['cuts_after_layers']))}, {w['prompts']} prompts, "
            f"{w['greedy_tokens']} greedy tokens (logits up to {w['max_abs_logit']:.1f})",
            compute_wire.WIRE_HEADERS, compute_wire.wire_rows(r),
        ))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for t, headers, rows in tables:
            print(t)
            for row in [headers, *rows]:
                print("  " + " | ".join(row))
        print("\n".join(notes))
        return
    console = Console(width=max(Console().width, 180))
    for t, headers, rows in tables:
        table = Table(title=t)
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i in (0, 2) else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for n in notes:
        console.print(n)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--threads", type=int, default=2, help="torch threads (and llama.cpp threads)")
    add("--prompt-tokens", type=int, default=256, help="prefill prompt length")
    add("--decode-tokens", type=int, default=64, help="greedy tokens to decode")
    add("--repeats", type=int, default=7, help="timed runs per figure (median kept)")
    add("--no-wire", action="store_true", help="skip the wire-error measurements")
    add("--no-llama-cpp", action="store_true", help="skip llama.cpp even if installed")
    add("--max-wait", type=float, default=20.0,
        help="seconds to wait before each repeat for other processes to leave the CPUs "
             "idle (0: never wait)")
    add("--wire-prompts", type=int, default=len(compute_wire.WIRE_PROMPTS),
        help="how many of the wire prompts to run")
    add("--wire-tokens", type=int, default=compute_wire.WIRE_TOKENS, help="greedy tokens per wire prompt")
    add("--json", action="store_true", help="print one JSON object instead of tables")
    smoke = {"threads": 1, "prompt_tokens": 8, "decode_tokens": 2, "repeats": 1,
             "max_wait": 0.0, "wire_prompts": 1, "wire_tokens": 2}
    args = benchkit.parse_args(parser, smoke, argv)
    result = run(
        threads=args.threads,
        prompt_tokens=args.prompt_tokens,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
        wire=not args.no_wire,
        llama=not args.no_llama_cpp,
        max_wait_s=args.max_wait,
        wire_prompts=args.wire_prompts,
        wire_tokens=args.wire_tokens,
    )
    benchkit.report(args, result, lambda: _print_tables(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
