"""Decode speed: compute.generate() against transformers' generate() on 2 threads.

Both run SmolLM2-135M-Instruct from the bundled GGUF in float32, greedy, 64 new
tokens after a short prompt, alternating in one process so that load on the
machine hits both alike. Not a test (pytest does not collect it); run:

    .venv/bin/python -m tests.compute.bench_decode [--reps 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from compute.generate import generate
from compute.gguf import find_gguf, load_gguf, open_gguf
from compute.tokenizer import Tokenizer

PROMPT = "The capital of France is"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM  # test-only reference

    reader = open_gguf()
    ours, tok = load_gguf(reader=reader), Tokenizer.from_gguf(reader=reader)
    path = find_gguf()
    ref = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    ref.eval()
    ids = tok.encode(PROMPT)
    prompt = torch.tensor([ids])
    n = args.tokens

    def run_ours() -> list[int]:
        return generate(ours, ids, n)

    def run_ref() -> list[int]:
        with torch.inference_mode():
            out = ref.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n,
                min_new_tokens=n,  # no early stop: both make exactly n tokens
                do_sample=False,
                pad_token_id=tok.eos_id,
            )
        return out[0, len(ids) :].tolist()

    run_ours(), run_ref()  # warm up (packs our weights, fills allocator caches)
    times: dict[str, list[float]] = {"compute.generate": [], "transformers": []}
    for _ in range(args.reps):
        for name, fn in (("compute.generate", run_ours), ("transformers", run_ref)):
            t0 = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            assert len(out) == n, (name, len(out))
    print(f"{n} greedy tokens, prompt of {len(ids)} tokens, {torch.get_num_threads()} threads")
    rates = {}
    for name, ts in times.items():
        rates[name] = n / statistics.median(ts)
        print(
            f"  {name:17s} median {rates[name]:6.1f} tok/s  (runs: {[round(n / t, 1) for t in ts]})"
        )
    print(f"  speed-up: {rates['compute.generate'] / rates['transformers']:.2f}x")


if __name__ == "__main__":
    main()
