"""A user's request and the token ids it becomes: one encoding for every model.

Owns `InferRequest`, `Token` (what a generation yields) and `prompt_ids`,
the prompt's encoding that `LocalModel` and `RemoteModel` both feed.
"""

from __future__ import annotations

from dataclasses import dataclass

from compute.generate import Sampling
from compute.tokenizer import ByteTokenizer, Tokenizer

__all__ = ["InferRequest", "Token", "prompt_ids"]


@dataclass(frozen=True, slots=True)
class InferRequest:
    """What the user asked for.

    prompt: the user's text.
    raw: feed the text as is; otherwise render it as one user turn of the
        model's own chat template (what an instruct model was trained on).
    max_tokens: most new tokens to generate.
    sampling: greedy, or temperature / top-p with a seed.
    """

    prompt: str
    raw: bool = False
    max_tokens: int = 64
    sampling: Sampling = Sampling()


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token and the text it completes ('' mid-character)."""

    id: int
    text: str


def prompt_ids(tokenizer: Tokenizer | ByteTokenizer, request: InferRequest) -> list[int]:
    """The token ids a model is fed for ``request``: the text as is (``raw``), else one
    user turn of the model's own chat template."""
    if request.raw:
        return tokenizer.encode(request.prompt)
    return tokenizer.encode_chat([{"role": "user", "content": request.prompt}])
