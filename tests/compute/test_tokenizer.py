"""The GGUF-built tokenizer: round trips, agreement with transformers'
tokenizer for the same file, chat template, special-token handling."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compute.errors import TokenizerError
from compute.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces and trailing  ",
    "héllo wörld — naïve café",
    "日本語のテキスト",
    "emoji 🤗🚀 and a ZWJ family 👩‍👩‍👧",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|><repo_name>x<file_sep>y",
    "numbers 12345 and 3.14159, 1,000,000",
    "code:\n\tdef f(x):\n\t\treturn x**2  # square\n",
    "tabs\t\tand\n\n\nnewlines\r\n",
    "it's we've they'll I'd",
    "Ω≈ç√∫˜µ≤≥÷ ",
    "a" * 50,
    " ",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_and_agreement_with_transformers(smol_tokenizer, hf_tokenizer, text):
    ids = smol_tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
    assert smol_tokenizer.decode(ids) == text == hf_tokenizer.decode(ids)


def test_special_tokens(smol_tokenizer):
    tk = smol_tokenizer
    assert (tk.bos_id, tk.eos_id, tk.vocab_size) == (1, 2, 49152)
    assert tk.id_to_token(1) == "<|im_start|>" and tk.token_to_id("<|im_end|>") == 2
    assert tk.encode("<|im_start|>hi") == [1, tk.encode("hi")[0]]
    assert tk.stop_ids == {2}
    assert set(range(17)) == tk.special_ids
    # special=False reads control-token strings as text: user input cannot open a turn.
    plain = tk.encode("<|im_start|>", special=False)
    assert not set(plain) & tk.special_ids
    assert tk.decode(plain) == "<|im_start|>"
    assert tk.decode(tk.encode("<|im_end|>ok"), skip_special=True) == "ok"


def test_digits_are_split_like_llama_cpp_smollm(smol_tokenizer):
    # The "smollm" pre-tokenizer puts every digit apart, as in SmolLM2's training.
    ids = smol_tokenizer.encode("2024")
    assert [smol_tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Ça va? 🤗"},
        ],
    ],
)
def test_chat_template_matches_transformers(smol_tokenizer, hf_tokenizer, messages):
    for gen in (True, False):
        want = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert smol_tokenizer.apply_chat_template(messages, add_generation_prompt=gen) == want
    text = smol_tokenizer.apply_chat_template(messages)
    assert text.endswith("<|im_start|>assistant\n")
    assert smol_tokenizer.encode_chat(messages) == hf_tokenizer.encode(
        text, add_special_tokens=False
    )


def test_default_system_prompt(smol_tokenizer):
    text = smol_tokenizer.apply_chat_template([{"role": "user", "content": "x"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_stream_decoder_waits_for_whole_characters(smol_tokenizer):
    text = "emoji 🤗 日本 done"
    ids = smol_tokenizer.encode(text)
    stream = smol_tokenizer.stream_decoder()
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == text
    assert "" in pieces  # a multi-byte character spans tokens: nothing is emitted mid-character


def test_unsupported_metadata_is_a_tokenizer_error(smol_tokenizer):
    spec = smol_tokenizer.spec
    with pytest.raises(TokenizerError, match="pre-tokenizer"):
        Tokenizer(dataclasses.replace(spec, pre="mystery"))
    with pytest.raises(TokenizerError, match="token types"):
        Tokenizer(dataclasses.replace(spec, token_types=spec.token_types[:-1]))
    no_template = Tokenizer(dataclasses.replace(spec, chat_template=None))
    with pytest.raises(TokenizerError, match="no tokenizer.chat_template"):
        no_template.apply_chat_template([{"role": "user", "content": "x"}])
    refusing = Tokenizer(
        dataclasses.replace(spec, chat_template="{{ raise_exception('no system role') }}")
    )
    with pytest.raises(TokenizerError, match="no system role"):
        refusing.apply_chat_template([])


@pytest.mark.parametrize("field", ["bos_id", "eos_id", "eot_id"])
@pytest.mark.parametrize("bad", [49152, 10**9, -1, 1.0, "1", True])
def test_special_ids_outside_the_vocabulary_are_refused_at_build(smol_tokenizer, field, bad):
    spec = dataclasses.replace(smol_tokenizer.spec, **{field: bad})
    with pytest.raises(TokenizerError, match=f"expected {field} None or an id in \\[0, 49152\\)"):
        Tokenizer(spec)


@pytest.mark.parametrize("name", ["messages", "bos_token", "eos_token"])
def test_reserved_template_variables_are_refused(smol_tokenizer, name):
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(TokenizerError, match=f"other than .*got \\['{name}'\\]"):
        smol_tokenizer.apply_chat_template(messages, **{name: "x"})
    # Any other name is an extra variable, as before.
    assert smol_tokenizer.apply_chat_template(messages, tools=None) == (
        smol_tokenizer.apply_chat_template(messages)
    )


@given(st.text())
def test_byte_tokens_stream_back_any_text(text):
    from compute.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    stream = tok.stream_decoder()
    assert "".join(stream.push(i) for i in ids) == text
    assert tok.stream_decoder().push(300) == "" and tok.stop_ids == frozenset()
    assert tok.encode_chat([{"role": "user", "content": text}]) == ids
