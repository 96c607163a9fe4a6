"""llama.cpp as bench/compute_bench.py's speed ceiling: its model, greedy decode and prefill.

Not a bench of its own. llama-cpp-python is optional (``pip install
'.[bench]'``, a 12-minute build from source on 2 cores); without it
`load_llama_cpp` says why and compute_bench goes on without the baseline.
"""

from __future__ import annotations

from typing import Any

import torch

import benchkit
from compute.gguf import find_gguf
from compute.kvcache import KVCache
from compute.model import Transformer

def load_llama_cpp(threads: int, n_ctx: int) -> tuple[Any, str | None]:
    """A llama_cpp.Llama on the bundled GGUF, or (None, why not)."""
    try:
        import llama_cpp
    except ImportError:
        return None, "not installed"
    llm = llama_cpp.Llama(
        model_path=str(find_gguf()),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        seed=0,
        verbose=False,
    )
    return llm, llama_cpp.__version__


def llama_cpp_greedy(llm: Any, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids (prompt pass included), from a cleared context."""
    llm.reset()  # also stops generate() from reusing the previous run's prompt
    out: list[int] = []
    for t in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(t))
        if len(out) == n:  # the last token is never fed back, as in ours
            break
    return out


def bench_llama_cpp_prefill(
    llm: Any, ours: Transformer, ids: list[int], repeats: int
) -> dict[str, Any]:
    """llama.cpp prefill tokens/s (last position's logits) against ours (last_only)."""
    x = torch.tensor([ids])

    def run_llama() -> None:
        llm.reset()
        llm.eval(ids)

    @torch.inference_mode()
    def run_ours() -> torch.Tensor:
        return ours(x, cache=KVCache(ours.config, len(ids)), last_only=True)

    fns = {"ours": run_ours, "llama_cpp": run_llama}
    for fn in fns.values():
        fn()
    times, _ = benchkit.alternate(fns, repeats)
    rates = {k: benchkit.median_rate(v, len(ids)) for k, v in times.items()}
    return {
        "rates_tok_s": rates,
        "runs_tok_s": {k: [len(ids) / s for s in v] for k, v in times.items()},
        "ratio": rates["ours"] / rates["llama_cpp"],
        "paired_ratio": benchkit.paired_ratio(times["ours"], times["llama_cpp"]),
    }


