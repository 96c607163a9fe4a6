"""Fixtures shared by every test package."""

from tests.clikit import pnode, pwallet  # noqa: F401  (fixtures)
from tests.modelkit import gguf_reader, hf_smol, hf_tokenizer, smol, smol_tokenizer  # noqa: F401
