"""Tokenizer and chat template, built from a GGUF file's own metadata.

Owns text <-> token ids for a model: a byte-level BPE (`tokenizers` library)
built from `tokenizer.ggml.tokens`, `.merges`, `.token_type` and the special
ids, with the pre-tokenizer that `tokenizer.ggml.pre` names (SmolLM2 says
"smollm": every digit apart, then GPT-2's regex, as llama.cpp does); and the
chat template of `tokenizer.chat_template`, rendered with jinja2 the way
transformers renders it, so prompts look as they did in training.

No file besides the GGUF is read and nothing is downloaded.
"""

from __future__ import annotations

import codecs
import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from compute.errors import TokenizerError

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Template variables apply_chat_template sets itself (add_generation_prompt is its own argument).
_RESERVED_VARIABLES = frozenset({"messages", "bos_token", "eos_token"})
# llama.cpp pre-tokenizer names whose regex is "each digit apart, then GPT-2's".
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva"}


@dataclass(frozen=True)
class TokenizerSpec:
    """What a GGUF file says about its tokenizer."""

    tokens: Sequence[str]
    merges: Sequence[str]
    token_types: Sequence[int]
    bos_id: int | None
    eos_id: int | None
    pre: str = "gpt2"
    add_bos: bool = False
    eot_id: int | None = None
    chat_template: str | None = None


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt2", "default"):
        return byte_level
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama-bpe", "llama3"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated")
        return pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    raise TokenizerError(
        "expected a supported pre-tokenizer "
        f"(gpt2, llama-bpe, {sorted(_DIGITS_THEN_GPT2)}), got {pre!r}"
    )


def _build_backend(spec: TokenizerSpec) -> HFTokenizer:
    vocab = {tok: i for i, tok in enumerate(spec.tokens)}
    if len(vocab) != len(spec.tokens):
        raise TokenizerError(f"expected {len(spec.tokens)} distinct tokens, got {len(vocab)}")
    merges = []
    for m in spec.merges:
        left, sep, right = m.partition(" ")
        if not sep:
            raise TokenizerError(f"expected a merge 'left right', got {m!r}")
        merges.append((left, right))
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(spec.pre)
    tk.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|> ...) and user-defined ones match whole, before BPE.
    added = [
        AddedToken(tok, special=(kind == _CONTROL), normalized=False)
        for tok, kind in zip(spec.tokens, spec.token_types)
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    tk.add_tokens(added)
    return tk


class Tokenizer:
    """Byte-level BPE tokenizer with the model's chat template.

    Args:
        spec: vocabulary, merges and special ids (see `from_gguf`).

    Raises:
        TokenizerError: inconsistent or unsupported metadata (a BOS, EOS or
            EOT id outside the vocabulary included).
    """

    def __init__(self, spec: TokenizerSpec) -> None:
        if len(spec.token_types) != len(spec.tokens):
            raise TokenizerError(
                f"expected {len(spec.tokens)} token types, got {len(spec.token_types)}"
            )
        for role, token_id in (("bos", spec.bos_id), ("eos", spec.eos_id), ("eot", spec.eot_id)):
            ok = isinstance(token_id, numbers.Integral) and not isinstance(token_id, bool)
            if token_id is not None and not (ok and 0 <= token_id < len(spec.tokens)):
                raise TokenizerError(
                    f"expected {role}_id None or an id in [0, {len(spec.tokens)}) "
                    f"(the vocabulary), got {token_id!r}"
                )
        self.spec = spec
        self._tk = _build_backend(spec)
        self._plain: HFTokenizer | None = None  # built on first use, see encode(special=False)
        self.special_ids = frozenset(i for i, k in enumerate(spec.token_types) if k == _CONTROL)
        self._template = _compile_template(spec.chat_template) if spec.chat_template else None

    @classmethod
    def from_gguf(cls, path: str | Path | None = None, *, reader: Any = None) -> Tokenizer:
        """The tokenizer stored in a GGUF file (default: the bundled SmolLM2).

        Args:
            path: a .gguf file.
            reader: an open `gguf.GGUFReader`, instead of path.

        Raises:
            ModelFileError: the file is missing or unreadable.
            TokenizerError: it is not a byte-level BPE ("gpt2") tokenizer.
        """
        # Imported here: compute.gguf pulls in torch, which encoding text does not need.
        from compute.gguf import field, open_gguf

        reader = reader if reader is not None else open_gguf(path)
        kind = field(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(f"expected a byte-level BPE tokenizer ('gpt2'), got {kind!r}")
        spec = TokenizerSpec(
            tokens=field(reader, "tokenizer.ggml.tokens"),
            merges=field(reader, "tokenizer.ggml.merges"),
            token_types=field(reader, "tokenizer.ggml.token_type"),
            bos_id=field(reader, "tokenizer.ggml.bos_token_id", None),
            eos_id=field(reader, "tokenizer.ggml.eos_token_id", None),
            eot_id=field(reader, "tokenizer.ggml.eot_token_id", None),
            pre=field(reader, "tokenizer.ggml.pre", "gpt2"),
            add_bos=bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
            chat_template=field(reader, "tokenizer.chat_template", None),
        )
        return cls(spec)

    @property
    def vocab_size(self) -> int:
        return len(self.spec.tokens)

    @property
    def bos_id(self) -> int | None:
        return self.spec.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.spec.eos_id

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a generated turn (end of sequence, end of turn)."""
        ids = {self.spec.eos_id, self.spec.eot_id}
        return frozenset(i for i in ids if i is not None)

    def encode(self, text: str, *, special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of text.

        Args:
            text: any string.
            special: read control-token strings such as "<|im_start|>" as
                those tokens; with False they are plain text (use for
                untrusted input that must not open a turn).
            add_bos: prepend the BOS id; default: as the GGUF file says.
        """
        backend = self._tk if special else self._plain_backend()
        ids = backend.encode(text, add_special_tokens=False).ids
        if (self.spec.add_bos if add_bos is None else add_bos) and self.spec.bos_id is not None:
            ids = [self.spec.bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of token ids (control tokens dropped with skip_special)."""
        return self._tk.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)

    def stream_decoder(self, *, skip_special: bool = False) -> TextStream:
        """A decoder for ids that arrive one by one (UTF-8 split across tokens handled)."""
        return TextStream(self._tk, skip_special)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        /,
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for a conversation, as the model's template renders it.

        Args:
            messages: [{"role": "system"|"user"|"assistant", "content": str}, ...]
                (positional only, so a `messages=` keyword is a refused extra).
            add_generation_prompt: end with the opening of an assistant turn.
            extra: more template variables; not `messages`, `bos_token` or
                `eos_token`, which this method sets.

        Raises:
            TokenizerError: the file has no chat template, an extra variable
                is one of the reserved names, or rendering fails.
        """
        reserved = sorted(_RESERVED_VARIABLES & extra.keys())
        if reserved:
            raise TokenizerError(
                f"expected extra template variables other than {sorted(_RESERVED_VARIABLES)}, "
                f"got {reserved}"
            )
        if self._template is None:
            raise TokenizerError("this model file has no tokenizer.chat_template")
        variables = {
            "bos_token": self._token_or_empty(self.spec.bos_id),
            "eos_token": self._token_or_empty(self.spec.eos_id),
        }
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                **variables,
                **extra,
            )
        except jinja2.TemplateError as e:
            raise TokenizerError(f"chat template failed: {e}") from e

    def encode_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered conversation (control tokens read as such)."""
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt),
            add_bos=False,
        )

    def _plain_backend(self) -> HFTokenizer:
        if self._plain is None:
            plain = HFTokenizer.from_str(self._tk.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def _token_or_empty(self, token_id: int | None) -> str:
        return "" if token_id is None else self.spec.tokens[token_id]


class TextStream:
    """Incremental detokenizer: push ids, get the text they complete."""

    def __init__(self, backend: HFTokenizer, skip_special: bool) -> None:
        self._backend = backend
        self._stream = decoders.DecodeStream(skip_special_tokens=skip_special)

    def push(self, token_id: int) -> str:
        """Text newly completed by this id ('' while a character is still partial)."""
        return self._stream.step(self._backend, token_id) or ""


def _compile_template(source: str) -> jinja2.Template:
    """Compile a chat template with the environment transformers uses."""

    def raise_exception(message: str) -> None:
        raise TokenizerError(f"chat template refused the conversation: {message}")

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise TokenizerError(f"chat template does not compile: {e}") from e


class ByteTokenizer:
    """The tokens of a byte-level job (`compute.data`): token i < 256 is byte i of UTF-8 text.

    No special tokens and no chat template: such a model was trained on plain
    text, so a chat prompt is the user's text as it is. It has the methods
    `wallet.client.LocalModel` uses of a `Tokenizer`.
    """

    stop_ids: frozenset[int] = frozenset()

    def encode(self, text: str, **_: Any) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_chat(self, messages: Sequence[Mapping[str, str]], **_: Any) -> list[int]:
        return self.encode("".join(m["content"] for m in messages))

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", "replace")

    def stream_decoder(self, *, skip_special: bool = False) -> ByteStream:
        return ByteStream()


class ByteStream:
    """Incremental UTF-8 decoding of byte tokens (ids past 255 carry no text)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """Text newly completed by this byte ('' while a character is still partial)."""
        return self._decoder.decode(bytes([token_id]) if 0 <= token_id < 256 else b"")
