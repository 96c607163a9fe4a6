"""The PoL certificate and evidence objects (specs/pol.md sections 3, 4 and 7.2).

Round trips through the ledger codec, strict rejection of everything that
is not a canonical, well-formed object, the hash domains, and the test
vectors of specs/pol.md Appendix A read from the spec itself (if a vector
test fails, the spec and the code disagree: fix one of them).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, strategies as st

from ledger import crypto
from ledger.codec import decode, encode, from_json, to_json
from ledger.errors import DecodeError, EncodeError
from proof_of_learning import certificate as pol
from proof_of_learning.certificate import (
    EXACT, GRADIENT_MISMATCH, INF_BITS, MAX_DIGESTS, NAN_BITS, NONE_BITS, OUTPUT_MISMATCH, PASS,
    THRESHOLD, TOLERANCE, UNAVAILABLE, Digest, Distance, Evidence, UnitCert, bits_float, cert_hash,
    check_cert, check_evidence, decode_cert, decode_evidence, digests, distance, evidence_hash,
    float32_bits, passes, rel_max_err,
)
from proof_of_learning.errors import MalformedCertificate, MalformedEvidence, PolError

SPEC = (Path(__file__).resolve().parents[2] / "specs" / "pol.md").read_text()
APPENDIX = SPEC[SPEC.index("## Appendix A"):]

b32 = st.binary(min_size=32, max_size=32)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40)
named_digests = st.dictionaries(names, b32, max_size=6).map(digests)
certs = st.builds(UnitCert, b32, b32, u64, u32, b32, b32, named_digests, named_digests, b32, u32,
                  u32, names)
distances = st.dictionaries(names, u32, max_size=6).map(
    lambda d: tuple(Distance(n, d[n]) for n in sorted(d)))
evidences = st.builds(Evidence, b32, b32, st.integers(0, 255), st.integers(0, 255), u32,
                      named_digests, distances)


DEVICE = "cpu/x86_64/AVX512/torch-2.13.0+cpu/threads-2"  # Appendix A's compute class


def a_cert(**changes) -> UnitCert:
    """The middle backward unit of Appendix A (well-formed)."""
    cert = UnitCert(b"\x11" * 32, b"\x22" * 32, 7, 3, b"\x33" * 32, bytes(32),
                    digests({"h": b"\x55" * 32, "g": b"\x44" * 32}), digests({"y": b"\x66" * 32}),
                    b"\x77" * 32, NONE_BITS, float32_bits(1.5), DEVICE)
    return replace(cert, **changes)


def an_evidence(**changes) -> Evidence:
    """The failing evidence of Appendix A (well-formed)."""
    ev = Evidence(b"\x88" * 32, cert_hash(a_cert()), GRADIENT_MISMATCH, TOLERANCE,
                  float32_bits(THRESHOLD), digests({"grads": b"\x99" * 32, "y": b"\x66" * 32}),
                  (Distance("layers.4.mlp.w_down.weight", float32_bits(0.0123)),
                   Distance("y", 0)))
    return replace(ev, **changes)


def spec_hex(label: str) -> bytes:
    """The hex after ``label`` in the appendix, up to the next 'name =' line or fence."""
    match = re.search(re.escape(label) + r"\s*=\s*([0-9a-f\s]+?)\s*(?:\n\w+ =|```)", APPENDIX)
    assert match, f"no {label} in specs/pol.md Appendix A"
    return bytes.fromhex("".join(match.group(1).split()))


# -- round trips ---------------------------------------------------------------------


@given(certs)
def test_certificates_round_trip(cert):
    data = encode(cert)
    assert decode(data, UnitCert) == cert
    assert from_json(to_json(cert), UnitCert) == cert


@given(evidences)
def test_evidence_round_trips(ev):
    data = encode(ev)
    assert decode(data, Evidence) == ev
    assert from_json(to_json(ev), Evidence) == ev


@given(certs, st.data())
def test_any_change_to_a_certificate_changes_its_hash(cert, data):
    other = data.draw(certs)
    assert (cert_hash(cert) == cert_hash(other)) == (cert == other)


def test_well_formed_objects_pass_their_checks():
    check_cert(a_cert())
    check_evidence(an_evidence())
    assert decode_cert(encode(a_cert())) == a_cert()
    assert decode_evidence(encode(an_evidence())) == an_evidence()


# -- the codec refuses ------------------------------------------------------------------


def _plain(obj) -> list:
    return list(msgpack.unpackb(encode(obj), use_list=True))


@pytest.mark.parametrize("obj", [a_cert(), an_evidence(), Digest("h", bytes(32)), Distance("y", 0)],
                         ids=lambda o: type(o).__name__)
def test_wrong_versions_tags_and_arity_are_refused(obj):
    plain = _plain(obj)
    for bad in ([plain[0], plain[1] + 1, *plain[2:]],  # the next version does not exist
                [plain[0], True, *plain[2:]],        # a bool is not a version
                [plain[0], *plain[1:], 0],           # an extra field
                plain[:-1]):                         # a missing one
        with pytest.raises(DecodeError):
            decode(msgpack.packb(bad, use_bin_type=True), type(obj))
    with pytest.raises(DecodeError):  # another PoL type where this one is expected
        decode(encode(Digest("h", bytes(32)) if type(obj) is not Digest else Distance("y", 0)),
               type(obj))
    with pytest.raises(DecodeError):  # an unknown tag
        decode(msgpack.packb([200, *plain[1:]], use_bin_type=True))
    with pytest.raises(DecodeError):  # trailing bytes
        decode(encode(obj) + b"\x00", type(obj))


def test_the_pol_tags_are_33_to_36():
    assert [(c.TAG, c.VERSION) for c in (Digest, UnitCert, Distance, Evidence)] == \
        [(33, 1), (34, 2), (35, 1), (36, 1)]  # UnitCert version 2: its device


def test_oversized_fields_are_refused():
    many = tuple(Digest(f"n{i:05d}", bytes(32)) for i in range(MAX_DIGESTS + 1))
    with pytest.raises(EncodeError):
        encode(a_cert(inputs=many))
    plain = _plain(a_cert())
    plain[8] = [[33, 1, d.name, d.digest] for d in many]  # inputs
    with pytest.raises(DecodeError, match="exceed"):
        decode(msgpack.packb(plain, use_bin_type=True), UnitCert)
    with pytest.raises(EncodeError):
        encode(Digest("x" * (pol.MAX_NAME + 1), bytes(32)))
    too_many = tuple(Distance(f"n{i:05d}", 0) for i in range(pol.MAX_DISTANCES + 1))
    with pytest.raises(EncodeError):
        encode(an_evidence(distances=too_many))
    for field, value in (("job_id", bytes(31)), ("step", 2**64), ("index", 2**32),
                         ("loss_bits", 2**32)):
        with pytest.raises(EncodeError):
            encode(a_cert(**{field: value}))


def test_decode_cert_wraps_codec_errors_in_pol_errors():
    with pytest.raises(MalformedCertificate, match="not a UnitCert"):
        decode_cert(b"\x00junk")
    with pytest.raises(MalformedCertificate):
        decode_cert(encode(an_evidence()))
    with pytest.raises(MalformedEvidence, match="not Evidence"):
        decode_evidence(encode(a_cert()))
    assert issubclass(MalformedCertificate, PolError) and issubclass(MalformedEvidence, PolError)


@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_pol_errors(data):
    for decoder in (decode_cert, decode_evidence):
        try:
            decoder(data)
        except PolError:
            pass


# -- well-formedness (sections 3.4 and 4.3) -------------------------------------------


@pytest.mark.parametrize("changes, why", [
    ({"inputs": (Digest("h", bytes(32)), Digest("g", bytes(32)))}, "ascend"),
    ({"inputs": (Digest("g", bytes(32)), Digest("g", bytes(32)))}, "ascend"),
    ({"inputs": (Digest("g", bytes(32)),)}, "no 'h'"),
    ({"inputs": (Digest("h", bytes(32)), Digest("\u0443", bytes(32)))}, "ASCII"),
    ({"inputs": (Digest("", bytes(32)), Digest("h", bytes(32)))}, "ASCII"),
    ({"outputs": ()}, "none"),
    ({"loss_bits": float32_bits(2.5)}, "loss"),
    ({"outputs": digests({"y": bytes(32), "g": bytes(32)})}, "loss"),
    ({"loss_bits": 0x7FC0_0001, "outputs": digests({"g": bytes(32)})}, "NaN"),
    ({"grad_norm_bits": 0xFF80_0001}, "NaN"),
    ({"grad_norm_bits": NONE_BITS}, "grads_hash"),
    ({"grads_hash": bytes(32)}, "grads_hash"),
    ({"grad_norm_bits": float32_bits(-1.0)}, "negative"),
])
def test_malformed_certificates_are_refused(changes, why):
    cert = a_cert(**changes)
    with pytest.raises(MalformedCertificate, match=why):
        check_cert(cert)
    with pytest.raises(MalformedCertificate, match=why):
        decode_cert(encode(cert))


def test_the_last_forward_commits_its_loss_with_dl_dy():
    last = a_cert(outputs=digests({"y": bytes(32), "g": b"\x01" * 32}), loss_bits=NAN_BITS)
    check_cert(last)
    check_cert(replace(last, loss_bits=float32_bits(3.25)))
    check_cert(a_cert(grads_hash=bytes(32), grad_norm_bits=NONE_BITS))  # a forward: no grads


@pytest.mark.parametrize("changes, why", [
    ({"reason": 7}, "reason"),
    ({"mode": 2}, "mode"),
    ({"mode": EXACT}, "exact mode"),
    ({"mode": EXACT, "distances": ()}, "exact mode"),
    ({"reason": UNAVAILABLE}, "digests"),
    ({"threshold_bits": 0}, "threshold"),
    ({"threshold_bits": INF_BITS}, "threshold"),
    ({"threshold_bits": NAN_BITS}, "threshold"),
    ({"threshold_bits": NONE_BITS}, "threshold"),
    ({"distances": ()}, "at least one"),
    ({"distances": (Distance("y", 0), Distance("a", 0))}, "ascend"),
    ({"distances": (Distance("y", NAN_BITS),)}, "float32"),
    ({"distances": (Distance("y", float32_bits(-0.5)),)}, "float32"),
    ({"reason": PASS}, "contradicts"),
    ({"distances": (Distance("y", float32_bits(1e-5)),)}, "contradicts"),
    ({"recomputed": (Digest("y", bytes(32)), Digest("grads", bytes(32)))}, "ascend"),
])
def test_malformed_evidence_is_refused(changes, why):
    ev = an_evidence(**changes)
    with pytest.raises(MalformedEvidence, match=why):
        check_evidence(ev)
    with pytest.raises(MalformedEvidence, match=why):
        decode_evidence(encode(ev))


def test_evidence_of_each_kind_is_accepted():
    check_evidence(an_evidence(reason=PASS, distances=(Distance("y", float32_bits(1.1e-6)),)))
    check_evidence(an_evidence(reason=OUTPUT_MISMATCH, distances=(Distance("y", INF_BITS),)))
    for reason in range(len(pol.REASONS)):
        check_evidence(an_evidence(reason=reason, mode=EXACT, threshold_bits=0, distances=()))
    assert pol.FAILING == {1, 2, 3, 4, 6}


# -- hashes -------------------------------------------------------------------------------


def test_hash_domains_keep_kinds_apart():
    data = encode(a_cert())
    assert cert_hash(a_cert()) == crypto.domain_hash(crypto.H_CERT, data)
    assert crypto.domain_hash(crypto.H_EVIDENCE, data) != cert_hash(a_cert())
    assert evidence_hash(an_evidence()) == crypto.domain_hash(crypto.H_EVIDENCE,
                                                              encode(an_evidence()))
    assert evidence_hash(an_evidence()) != crypto.domain_hash(crypto.H_CERT,
                                                              encode(an_evidence()))
    domains = [crypto.H_CERT, crypto.H_EVIDENCE, crypto.H_AUDIT, crypto.H_TX, crypto.H_TIEBREAK,
               crypto.H_UNIT, crypto.H_HEADER, crypto.H_STATE, crypto.H_GENESIS, crypto.H_POL_STATE]
    assert len(set(domains)) == len(domains)
    assert not any(a != b and b.startswith(a) for a in domains for b in domains)  # prefix-free


# -- the spec's vectors ---------------------------------------------------------------------


def test_the_spec_vectors_are_the_codes():
    assert encode(a_cert()) == spec_hex("enc(cert)")
    assert cert_hash(a_cert()) == spec_hex("cert_hash")
    assert encode(an_evidence()) == spec_hex("enc(evidence)")
    assert evidence_hash(an_evidence()) == spec_hex("evidence_hash")
    other = crypto.domain_hash(crypto.H_EVIDENCE, encode(a_cert())).hex()
    assert other in APPENDIX


def test_the_spec_constants_are_the_codes():
    assert float32_bits(THRESHOLD) == 0x38D1B717 and "0x38D1B717" in SPEC
    for name, code in (("PASS", 0), ("OUTPUT_MISMATCH", 1), ("GRADIENT_MISMATCH", 2),
                       ("UNCHAINED_INPUT", 3), ("WRONG_DATA", 4), ("UNAVAILABLE", 5),
                       ("MALFORMED", 6)):
        assert getattr(pol, name) == code
        assert f"| {code} | `{name}` |" in SPEC
    assert (crypto.H_EVIDENCE, crypto.H_AUDIT) == (b"pnode:evidence:", b"pnode:audit:")


def test_the_reason_codes_have_one_definition():
    """The package's reason codes are the ledger's objects, not a copy kept equal."""
    from ledger import types

    assert pol.REASONS is types.VERDICT_REASONS
    assert pol.FAILING is types.FAILING_REASONS
    for name in ("PASS", "OUTPUT_MISMATCH", "GRADIENT_MISMATCH", "UNCHAINED_INPUT", "WRONG_DATA",
                 "UNAVAILABLE", "MALFORMED"):
        assert getattr(pol, name) == getattr(types, name), name
    source = (Path(pol.__file__)).read_text()
    assert "range(7)" not in source and '"output mismatch"' not in source


# -- float bits and distances (section 7.2) ----------------------------------------------------


@given(st.floats(width=32, allow_nan=False))
def test_float32_bits_round_trip(x):
    assert bits_float(float32_bits(x)) == x


def test_float32_bits_special_values():
    assert float32_bits(None) == NONE_BITS and bits_float(NONE_BITS) is None
    assert float32_bits(float("nan")) == NAN_BITS
    assert float32_bits(1e39) == INF_BITS  # beyond float32: an infinity, not an error
    assert float32_bits(1.5) == 0x3FC0_0000
    with pytest.raises(ValueError):
        bits_float(2**32)


def test_rel_max_err_is_relative_to_the_verifiers_tensor():
    r = np.array([[1.0, -2.0], [4.0, 0.5]], dtype=np.float32)
    assert rel_max_err(r, r) == 0.0
    c = r.copy()
    c[1, 0] += 4e-3
    assert rel_max_err(c, r) == pytest.approx(1e-3, rel=1e-3)
    assert rel_max_err(c * 1000, r) > 1  # inflating the committed tensor does not help
    assert rel_max_err(r.reshape(4), r) == float("inf")  # shapes differ
    assert rel_max_err(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_max_err(np.ones(3), np.zeros(3)) == float("inf")
    assert rel_max_err(np.array([np.nan]), np.array([1.0])) == float("inf")
    assert rel_max_err(np.array(2.0), np.array(2.0 + 2e-4)) < 1e-4  # a 0-d loss


def test_passes_is_strictly_under_the_threshold():
    r = np.linspace(-1, 1, 101)
    assert passes([distance("y", r + 1.1e-6, r), distance("g", r, r)])
    assert not passes([distance("y", r + 1.3e-3, r)])  # fp16 compute's noise
    assert not passes([Distance("y", float32_bits(THRESHOLD))])  # equal is not under
    assert not passes([Distance("y", NONE_BITS)]) and not passes([Distance("y", NAN_BITS)])
    assert passes([])
