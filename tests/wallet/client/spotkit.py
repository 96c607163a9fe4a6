"""Lying servers for spot-check tests and benches (specs/network.md 9.5).

A lying server serves its real layers but shifts outputs it answers (after
the forward, before it signs, so its signature holds the lie): a fault no
honest server makes, so it is made by wrapping that server's `_forward`.
"""

from __future__ import annotations

import random

from compute.wiretensor import decode_tensor, encode_tensor


def lie(server, shift: float = 0.05) -> None:
    """Make ``server`` answer its real outputs plus ``shift`` x each row's largest |value|."""
    inference = server.inference
    honest = inference._forward

    async def forward(s, step, hidden):
        out = decode_tensor(await honest(s, step, hidden))
        out = out + shift * out.abs().amax(dim=-1, keepdim=True)
        return encode_tensor(out, s.codec)
    inference._forward = forward


def lie_on_decode(server, only: set[int] | None = None, shift: float = 0.05,
                  rate: float = 1.0, rng: random.Random | None = None) -> list[int]:
    """Make ``server`` shift its answers to ordinary decode steps (one position, at the end
    of its cache; ``only``: at those positions; each with probability ``rate``, drawn from
    ``rng``) and answer prompts and replays honestly: a liar that knows a check by a
    replay when it sees one. Returns the positions it lied at (appended as it lies)."""
    inference, lied = server.inference, []
    honest = inference._forward
    rng = rng or random.Random(0)

    async def forward(s, step, hidden):
        decode = hidden.shape[1] == 1 and 0 < step.pos == s.cache.length
        out = await honest(s, step, hidden)
        if not decode or (only is not None and step.pos not in only) or (
                rate < 1.0 and rng.random() >= rate):
            return out
        lied.append(step.pos)
        out = decode_tensor(out)
        return encode_tensor(out + shift * out.abs().amax(dim=-1, keepdim=True), s.codec)
    inference._forward = forward
    return lied


async def attract(server) -> None:
    """Have ``server`` announce a huge throughput, so the cheapest route runs through it."""
    server.throughput = 1e6
    await server.announcer.announce_now()
