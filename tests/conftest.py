"""Fixtures shared by every test package."""

from hypothesis import settings

from tests.clikit import pnode, pwallet  # noqa: F401  (fixtures)
from tests.modelkit import gguf_reader, hf_smol, hf_tokenizer, smol, smol_tokenizer  # noqa: F401

# No per-example deadline (hypothesis' default is 200 ms) for any property test: an
# example of a few ms, stalled by a loaded machine (another worker, a GC pass), failed
# as "Unreliable test timings" (seen: test_certificate.py::test_certificates_round_trip,
# 313 ms under load, 0.7 ms on the re-run). How long an example takes is no property of
# pnode; pytest-timeout still stops a hang.
settings.register_profile("pnode", deadline=None)
settings.load_profile("pnode")
