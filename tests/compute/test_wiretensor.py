"""compute.wiretensor: codec error bounds, sizes, the wire header, and refusal of bad input."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compute.errors import ComputeError
from compute.wiretensor import (
    BLOCK,
    CODECS,
    MAX_ELEMENTS,
    TooManyElements,
    WireTensorError,
    bytes_per_element,
    decode_tensor,
    dequantize_blockwise,
    encode_tensor,
    encoded_size,
    quantize_blockwise,
)

HEADER = 8  # magic, version, codec, dtype, ndim
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def header(codec: int, dtype: int, shape: tuple[int, ...], version: int = 1) -> bytes:
    dims = struct.pack(f"<{len(shape)}I", *shape)
    return b"PNWT" + bytes([version, codec, dtype, len(shape)]) + dims


def int8_bound(x: torch.Tensor) -> torch.Tensor:
    """Per element: its block's absmax / 254, plus a few float32 ulps of it."""
    flat = x.reshape(-1).float()
    pad = (-flat.numel()) % BLOCK
    absmax = torch.nn.functional.pad(flat, (0, pad)).view(-1, BLOCK).abs().amax(1)
    per = absmax.repeat_interleave(BLOCK)[: flat.numel()]
    return (per / 254 + per * 2.0**-20).reshape(x.shape)


shapes = st.lists(st.integers(0, 40), max_size=4).filter(lambda s: math.prod(s) <= 20_000)


# --- round trips -----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(shapes, st.floats(-30, 30), st.integers(0, 2**32 - 1))
def test_int8_error_is_within_half_a_step_per_block(shape, log_scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 10.0**log_scale
    # Outliers make blocks of very different scales.
    x = torch.where(torch.rand(shape, generator=g) < 0.02, x * 1000, x)
    y = decode_tensor(encode_tensor(x, "int8"))
    assert y.shape == x.shape and y.dtype == torch.float32
    assert bool(((x - y).abs() <= int8_bound(x)).all())


@settings(max_examples=100, deadline=None)
@given(shapes, st.floats(-4, 3.5), st.integers(0, 2**32 - 1))
def test_half_casts_round_to_nearest(shape, log_scale, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 10.0**log_scale
    for codec, dtype, rel in (("fp16", torch.float16, 2.0**-11), ("bf16", torch.bfloat16, 2.0**-8)):
        y = decode_tensor(encode_tensor(x, codec))
        assert y.dtype == torch.float32 and y.shape == x.shape
        assert torch.equal(y, x.to(dtype).float())
        # fp16 subnormals are absolute steps of 2^-24.
        assert bool(((x - y).abs() <= x.abs() * rel + 2.0**-25).all())


@settings(max_examples=60, deadline=None)
@given(shapes, st.sampled_from(DTYPES), st.integers(0, 2**32 - 1))
def test_raw_is_exact_in_every_dtype(shape, dtype, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    y = decode_tensor(encode_tensor(x, "raw"))
    assert y.dtype == dtype and torch.equal(y, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("codec", CODECS)
def test_sender_dtype_and_shape_come_back(codec, dtype):
    x = torch.randn(3, 5, 7).to(dtype)
    y = decode_tensor(encode_tensor(x, codec))
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.float(), x.float(), atol=0.05, rtol=0.02)


def test_zero_and_constant_blocks():
    zeros = torch.zeros(130)
    assert torch.equal(decode_tensor(encode_tensor(zeros, "int8")), zeros)
    for c in (1.0, -3.5, 1e-30, 7e37):
        x = torch.full((100,), c)
        torch.testing.assert_close(decode_tensor(encode_tensor(x, "int8")), x, rtol=2e-7, atol=0)
    mixed = torch.cat([torch.zeros(64), torch.full((64,), 2.0), torch.arange(64.0)])
    y = decode_tensor(encode_tensor(mixed, "int8"))
    assert torch.equal(y[:64], torch.zeros(64))
    assert bool(((y - mixed).abs() <= int8_bound(mixed)).all())


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,), (63,), (65,), (3, 7), (1, 256, 576)])
@pytest.mark.parametrize("codec", CODECS)
def test_odd_shapes_and_empty_tensors(shape, codec):
    x = torch.randn(shape)
    data = encode_tensor(x, codec)
    assert len(data) == encoded_size(codec, shape)
    y = decode_tensor(data)
    assert y.shape == x.shape
    if codec == "raw":
        assert torch.equal(y, x)


def test_quantize_matches_the_formula():
    x = torch.randn(200) * 3
    q, scales = quantize_blockwise(x)
    assert q.shape == (4, BLOCK) and q.dtype == torch.int8 and scales.shape == (4,)
    flat = np.pad(x.numpy(), (0, 56)).reshape(4, BLOCK)
    absmax = np.abs(flat).max(axis=1)
    assert np.array_equal(scales.numpy(), absmax)
    assert np.array_equal(q.numpy(), np.round(flat / absmax[:, None] * 127).astype(np.int8))
    assert int(q.abs().max()) == 127 and not q.view(-1)[200:].any()
    assert dequantize_blockwise(q, scales, (10, 20)).shape == (10, 20)


def test_noncontiguous_and_grad_inputs():
    x = torch.randn(8, 100, requires_grad=True)
    t = x.t()  # not contiguous
    assert torch.equal(decode_tensor(encode_tensor(t, "raw")), t.detach())
    assert decode_tensor(encode_tensor(t, "int8")).shape == (100, 8)


# --- sizes and layout ------------------------------------------------------------------------


@pytest.mark.parametrize("codec, want", [("raw", 4), ("fp16", 2), ("bf16", 2), ("int8", 1.0625)])
def test_bytes_per_element(codec, want):
    x = torch.randn(1, 256, 576)
    assert bytes_per_element(codec) == want
    assert (len(encode_tensor(x, codec)) - HEADER - 12) / x.numel() == want


def test_raw_of_half_dtypes_is_two_bytes():
    assert bytes_per_element("raw", torch.float16) == 2.0
    assert bytes_per_element("raw", torch.bfloat16) == 2.0
    with pytest.raises(WireTensorError):
        bytes_per_element("raw", torch.float64)
    with pytest.raises(WireTensorError):
        encoded_size("int4", (3,))


def test_header_layout():
    x = torch.tensor([[1.0, -2.0]])
    assert encode_tensor(x, "raw") == header(0, 0, (1, 2)) + struct.pack("<2f", 1.0, -2.0)
    half = struct.pack("<2e", 1.0, -2.0)
    assert encode_tensor(x.bfloat16(), "fp16") == header(1, 2, (1, 2)) + half
    assert encode_tensor(x.half(), "bf16") == header(2, 1, (1, 2)) + bytes.fromhex("803f00c0")
    q = struct.pack("<2b", 64, -127) + bytes(62)
    assert encode_tensor(x, "int8") == header(3, 0, (1, 2)) + struct.pack("<f", 2.0) + q


# --- refusals on encode ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused(codec, bad):
    x = torch.ones(100)
    x[70] = bad
    with pytest.raises(WireTensorError):
        encode_tensor(x, codec)


@pytest.mark.parametrize("codec, value", [("fp16", 70000.0), ("bf16", 3.4e38)])
def test_values_beyond_the_cast_range_are_refused(codec, value):
    with pytest.raises(WireTensorError):
        encode_tensor(torch.tensor([1.0, value]), codec)
    decode_tensor(encode_tensor(torch.tensor([1.0, value]), "int8"))  # int8 carries them


@pytest.mark.parametrize("t, codec", [
    (torch.ones(3, dtype=torch.float64), "raw"), (torch.ones(3, dtype=torch.int32), "int8"),
    (torch.ones(3), "int4"), (torch.ones(3), None), ([1.0, 2.0], "raw"),
    (torch.ones([1] * 9), "raw"),
])
def test_bad_encode_inputs_are_refused(t, codec):
    with pytest.raises(WireTensorError):
        encode_tensor(t, codec)


@pytest.mark.parametrize("codec", CODECS)
def test_a_dim_beyond_u32_is_refused(codec):
    # Empty, so within MAX_ELEMENTS, but 2^32 does not fit the u32 of the header.
    with pytest.raises(WireTensorError, match="u32"):
        encode_tensor(torch.empty(0, 2**32), codec)
    assert decode_tensor(encode_tensor(torch.empty(0, 2**32 - 1), codec)).shape == (0, 2**32 - 1)


# --- refusals on decode ----------------------------------------------------------------------


GOOD = encode_tensor(torch.randn(2, 70), "int8")
BAD_INPUTS = {
    "empty": b"",
    "short header": GOOD[:7],
    "bad magic": b"PNWX" + GOOD[4:],
    "bad version": GOOD[:4] + b"\x02" + GOOD[5:],
    "unknown codec": GOOD[:5] + b"\x04" + GOOD[6:],
    "unknown dtype": GOOD[:6] + b"\x03" + GOOD[7:],
    "nine dims": header(0, 0, (1,) * 9) + bytes(4),
    "truncated dims": header(0, 0, (2, 3))[:-2],
    "truncated payload": GOOD[:-1],
    "trailing byte": GOOD + b"\x00",
    "absurd shape": header(0, 0, (2**32 - 1,) * 8),
    "over the element limit": header(3, 0, (MAX_ELEMENTS + 1,)),
    "nan in raw": header(0, 0, (2,)) + struct.pack("<2f", 1.0, math.nan),
    "inf in fp16": header(1, 0, (1,)) + struct.pack("<e", math.inf),
    "negative scale": header(3, 0, (1,)) + struct.pack("<f", -1.0) + b"\x01" + bytes(63),
    "nan scale": header(3, 0, (1,)) + struct.pack("<f", math.nan) + b"\x01" + bytes(63),
    "int8 -128": header(3, 0, (1,)) + struct.pack("<f", 1.0) + b"\x80" + bytes(63),
    "nonzero padding": header(3, 0, (1,)) + struct.pack("<f", 1.0) + b"\x01\x01" + bytes(62),
    "float16 overflow": header(3, 1, (1,)) + struct.pack("<f", 1e10) + b"\x7f" + bytes(63),
    # Not the encoder's form: a second encoding of a tensor that has one already.
    "scale -0.0": header(3, 0, (1,)) + struct.pack("<f", -0.0) + bytes(64),
    "scale 0, q not 0": header(3, 0, (1,)) + struct.pack("<f", 0.0) + b"\x01" + bytes(63),
    "max |q| < 127": header(3, 0, (1,)) + struct.pack("<f", 2.0) + b"\x40" + bytes(63),
    "max |q| < 127, last block": GOOD[:HEADER + 8] + struct.pack("<3f", 1.0, 1.0, 1.0)
    + b"\x7f" + bytes(63) + b"\x81" + bytes(63) + b"\x7e" + bytes(63),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_malformed_input_is_refused(name):
    with pytest.raises(WireTensorError) as info:
        decode_tensor(BAD_INPUTS[name])
    assert isinstance(info.value, ComputeError)


def test_int8_decoding_accepts_only_the_canonical_form():
    good = encode_tensor(torch.tensor([127.0]), "int8")
    assert good == header(3, 0, (1,)) + struct.pack("<f", 127.0) + b"\x7f" + bytes(63)
    # Scale 127^2 with q = 1 dequantizes to the same tensor: a second encoding.
    q = torch.tensor([[1] + [0] * 63], dtype=torch.int8)
    assert torch.equal(dequantize_blockwise(q, torch.tensor([127.0**2]), (1,)), decode_tensor(good))
    twice = header(3, 0, (1,)) + struct.pack("<f", 127.0**2) + q.numpy().tobytes()
    with pytest.raises(WireTensorError, match=r"max \|q\| = 127.*block 0 has scale 16129.0"):
        decode_tensor(twice)
    # An all-zero block: scale +0.0 only.
    zero = header(3, 0, (3,)) + bytes(4 + 64)
    assert zero == encode_tensor(torch.zeros(3), "int8") == encode_tensor(-torch.zeros(3), "int8")
    with pytest.raises(WireTensorError, match="-0.0"):
        decode_tensor(header(3, 0, (3,)) + struct.pack("<f", -0.0) + bytes(64))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 700), st.integers(-149, 127), st.integers(0, 2**32 - 1))
def test_int8_encoder_output_is_canonical(n, exponent, seed):
    # Every encoder output passes the decoder's canonical check, tiny and huge scales
    # included (subnormal blocks, blocks of zeros among others).
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g) - 0.5) * 2.0 ** torch.randint(-20, 1, (n,), generator=g)
    x = (x.double() * 2.0**exponent).float()
    x[torch.rand(n, generator=g) < 0.3] = 0.0
    x[~torch.isfinite(x)] = 0.0
    q, scales = quantize_blockwise(x)
    peak = q.to(torch.int16).abs().amax(1)
    assert torch.equal(peak, torch.where(scales > 0, 127, 0).to(torch.int16))
    assert not bool(torch.signbit(scales).any())
    decode_tensor(encode_tensor(x, "int8"))


@pytest.mark.parametrize("codec, dtype", [("raw", 0), ("raw", 1), ("raw", 2), ("fp16", 0),
                                          ("bf16", 0)])
def test_negative_zero_is_a_value_of_float_payloads(codec, dtype):
    # -0.0 and 0.0 are different tensors, so both decode, each to itself.
    dt = DTYPES[dtype]
    for z in (0.0, -0.0):
        x = torch.tensor([z, 1.0], dtype=dt)
        y = decode_tensor(encode_tensor(x, codec))
        assert torch.equal(torch.signbit(y), torch.signbit(x))


def test_element_limit_is_adjustable():
    data = encode_tensor(torch.ones(100), "raw")
    with pytest.raises(TooManyElements, match="100 elements, at most 99") as raised:
        decode_tensor(data, max_elements=99)
    assert isinstance(raised.value, WireTensorError)
    assert (raised.value.shape, raised.value.numel, raised.value.max_elements) == ((100,), 100, 99)
    assert decode_tensor(memoryview(data), max_elements=100).shape == (100,)
    assert decode_tensor(bytearray(data)).shape == (100,)


@pytest.mark.parametrize("data", [None, "PNWT", 12, [1, 2]])
def test_non_bytes_are_refused(data):
    with pytest.raises(WireTensorError):
        decode_tensor(data)


def _decode_or_refuse(data: bytes) -> None:
    try:
        out = decode_tensor(data)
    except WireTensorError:
        return
    assert bool(torch.isfinite(out).all()) and out.numel() <= MAX_ELEMENTS


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    _decode_or_refuse(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=0, max_size=80), st.sampled_from(range(4)), st.sampled_from(range(3)),
       st.lists(st.integers(0, 5), max_size=3))
def test_fuzz_bytes_behind_a_valid_header(tail, codec, dtype, shape):
    _decode_or_refuse(header(codec, dtype, tuple(shape)) + tail)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(CODECS), st.integers(0, 200), st.lists(st.tuples(st.integers(0, 10_000),
       st.integers(0, 255)), min_size=1, max_size=4), st.integers(-3, 3))
def test_fuzz_mutated_encodings(codec, n, flips, cut):
    data = bytearray(encode_tensor(torch.linspace(-5, 5, n), codec))
    for pos, value in flips:
        data[pos % len(data)] = value
    data = data[: len(data) + cut] if cut < 0 else data + bytes(cut)
    _decode_or_refuse(bytes(data))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("codec", CODECS)
def test_gpu_tensors_encode_to_the_same_bytes(codec):
    x = torch.randn(3, 200) * 7
    assert encode_tensor(x.cuda(), codec) == encode_tensor(x, codec)
