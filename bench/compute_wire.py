"""The wire part of bench/compute_bench.py: the model cut into sections, the hidden state
crossing each cut in each codec; bytes per token and the error each codec adds.

Not a bench of its own: compute_bench runs `bench_wire` and prints `wire_rows`
under `WIRE_HEADERS`.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from compute import wiretensor
from compute.generate import generate
from compute.kvcache import KVCache
from compute.model import Transformer
from compute.tokenizer import Tokenizer

WIRE_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "The history of the Roman Empire spans many centuries. " * 4,
    "chat:What is the capital of France?",
    "chat:Explain photosynthesis in two sentences.",
]
WIRE_CUTS = (10, 20)  # three sections: layers 0-9, 10-19, 20-29
WIRE_TOKENS = 32
WIRE_CODECS = ("raw", "fp16", "bf16", "int8")

WIRE_HEADERS = ("codec", "payload B/token", "1-token msg B", "vs f32", "max |logit err|",
                "mean |logit err|", "same greedy tokens",
                "matching prefix per prompt (unquantized top-2 logit gap there)")


def _wire(h: torch.Tensor, codec: str | None) -> tuple[torch.Tensor, int]:
    """h after crossing the wire with codec (None: not at all), and the bytes sent."""
    if codec is None:
        return h, 0
    data = wiretensor.encode_tensor(h, codec)
    return wiretensor.decode_tensor(data), len(data)


class SplitRun:
    """The model run as sections cut at `cuts`, the hidden state crossing each cut."""

    def __init__(self, model: Transformer, cuts: tuple[int, ...], codec: str | None) -> None:
        self.model, self.codec = model, codec
        bounds = (0, *cuts, model.config.n_layers)
        self.sections = list(zip(bounds[:-1], bounds[1:]))
        self.bytes_sent = 0
        self.tokens_sent = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (1, T, V) of ids (1, T), continuing after what cache holds."""
        pos = cache.length if cache is not None else 0
        h = self.model.embed(ids)
        for a, b in self.sections:
            h = self.model.run_layers(h, a, b, pos=pos, cache=cache)
            if b < self.model.config.n_layers:
                h, sent = _wire(h, self.codec)
                self.bytes_sent += sent
                self.tokens_sent += h.shape[1]
        return self.model.head(h)

    def greedy(self, ids: list[int], n: int) -> tuple[list[int], list[float]]:
        """n greedy tokens after ids, one section pass per token, and at each
        step the gap between the two largest logits."""
        cache = KVCache(self.model.config, len(ids) + n)
        logits = self.forward(torch.tensor([ids]), cache)
        out: list[int] = []
        gaps: list[float] = []
        for _ in range(n):
            top = logits[0, -1].topk(2)
            out.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            if len(out) == n:
                break
            logits = self.forward(torch.tensor([[out[-1]]]), cache)
        return out, gaps


def matching_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def bench_wire(ours: Transformer, tok: Tokenizer, n_prompts: int = len(WIRE_PROMPTS),
               n_tokens: int = WIRE_TOKENS) -> dict[str, Any]:
    """Bytes per token and the error each codec adds at the cuts, over the first
    ``n_prompts`` of WIRE_PROMPTS and ``n_tokens`` greedy tokens."""
    dim = ours.config.dim
    f32_token = wiretensor.encoded_size("raw", (dim,)) - wiretensor.encoded_size("raw", (0,))
    sizes = {}
    for codec in WIRE_CODECS:
        payload = wiretensor.encoded_size(codec, (dim,)) - wiretensor.encoded_size(codec, (0,))
        sizes[codec] = {
            "payload_bytes_per_token": payload,
            "one_token_message_bytes": wiretensor.encoded_size(codec, (1, 1, dim)),
            "vs_float32": payload / f32_token,
        }
    prompts = []
    for p in WIRE_PROMPTS[:n_prompts]:
        if p.startswith("chat:"):
            prompts.append((p, tok.encode_chat([{"role": "user", "content": p[5:]}])))
        else:
            prompts.append((p, tok.encode(p)))

    plain = SplitRun(ours, WIRE_CUTS, None)
    reference = {}
    for text, ids in prompts:
        want = generate(ours, ids, n_tokens)
        got, gaps = plain.greedy(ids, n_tokens)
        assert got == want, f"split run without codec differs from generate() on {text!r}"
        with torch.inference_mode():
            reference[text] = (ours(torch.tensor([ids])), want, gaps)

    errors: dict[str, Any] = {}
    for codec in WIRE_CODECS:
        run = SplitRun(ours, WIRE_CUTS, codec)
        per_prompt = []
        for text, ids in prompts:
            base_logits, base_tokens, base_gaps = reference[text]
            diff = (run.forward(torch.tensor([ids])) - base_logits).abs()
            tokens, _ = run.greedy(ids, n_tokens)
            match = matching_prefix(tokens, base_tokens)
            per_prompt.append({
                "prompt": text,
                "prompt_tokens": len(ids),
                "max_abs_logit_err": float(diff.max()),
                "mean_abs_logit_err": float(diff.mean()),
                "matching_prefix": match,
                "identical": tokens == base_tokens,
                # How close the unquantized run was to a tie where the codec's output diverged.
                "base_top2_gap_at_divergence": base_gaps[match] if match < n_tokens else None,
            })
        errors[codec] = {
            "max_abs_logit_err": max(p["max_abs_logit_err"] for p in per_prompt),
            "mean_abs_logit_err": statistics.fmean(p["mean_abs_logit_err"] for p in per_prompt),
            "identical_outputs": sum(p["identical"] for p in per_prompt),
            "bytes_per_token_measured": run.bytes_sent / run.tokens_sent,
            "per_prompt": per_prompt,
        }
    logit_scale = max(float(v[0].abs().max()) for v in reference.values())
    return {
        "dim": dim,
        "cuts_after_layers": [c - 1 for c in WIRE_CUTS],
        "sections": [[a, b - 1] for a, b in SplitRun(ours, WIRE_CUTS, None).sections],
        "greedy_tokens": n_tokens,
        "prompts": len(prompts),
        "max_abs_logit": logit_scale,
        "sizes": sizes,
        "errors": errors,
    }


# ---------------------------------------------------------------- driver


def wire_rows(r: dict[str, Any]) -> list[tuple[str, ...]]:
    w = r["wire"]
    rows = []
    for codec in WIRE_CODECS:
        s, e = w["sizes"][codec], w["errors"][codec]
        prefixes = " ".join(
            str(p["matching_prefix"])
            + ("" if p["identical"] else f" (gap {p['base_top2_gap_at_divergence']:.2f})")
            for p in e["per_prompt"]
        )
        rows.append((
            "float32 (raw)" if codec == "raw" else codec,
            f"{s['payload_bytes_per_token']:,}",
            f"{s['one_token_message_bytes']:,}",
            f"{s['vs_float32']:.3f}",
            f"{e['max_abs_logit_err']:.2e}",
            f"{e['mean_abs_logit_err']:.2e}",
            f"{e['identical_outputs']}/{len(e['per_prompt'])}",
            prefixes,
        ))
    return rows
