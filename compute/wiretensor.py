"""Wire tensors: how hidden states and gradients travel between nodes.

Owns the codecs a request may choose (ARCHITECTURE.md, compute) and the
self-describing byte format that carries them, so a receiver decodes with
no side information:

    codec   payload per element            bytes/element
    raw     the tensor's own dtype         4 (float32), 2 (float16, bfloat16)
    fp16    IEEE half                      2
    bf16    bfloat16                       2
    int8    blockwise absmax 8-bit         1 + 4/64 = 1.0625

int8: the flattened tensor is padded with zeros to a multiple of 64; each
block of 64 stores its absmax as a float32 scale and q = round(x / absmax *
127) in int8, so |x - x'| <= absmax / 254 per block (plus float rounding).
Scales are float32, not float16, because hidden-state outliers and tiny
gradients would overflow or flush a half-precision scale; it costs 2 bytes
per 64 elements.

Format (integers little-endian):

    magic b"PNWT" | version u8 = 1 | codec u8 | dtype u8 | ndim u8
    | ndim x u32 dims | payload

payload is numel elements for raw/fp16/bf16; for int8 it is
ceil(numel / 64) float32 scales, then ceil(numel / 64) * 64 int8 values.
Codec ids are the CODECS indices (raw 0, fp16 1, bf16 2, int8 3); dtype ids
are float32 0, float16 1, bfloat16 2. decode_tensor returns the sender's dtype
and shape (for a float16 or bfloat16 sender, int8 dequantizes in float32 and
then rounds once more to that dtype).

Only finite values travel. encode refuses NaN and infinities, and values
beyond the range of an fp16 / bf16 cast. decode refuses them too, as it
refuses every malformed input (truncated, trailing bytes, bad magic or
version, unknown codec or dtype, more than 8 dims, more than MAX_ELEMENTS
elements, negative or -0.0 scales, int8 value -128, non-zero padding, a
block not in the encoder's form, see below) with
WireTensorError; it checks the length against the header before it
allocates, so memory stays bounded by the input size.

int8 decoding accepts only the encoder's form of a block: scale finite and
>= 0 and not -0.0; a block of scale 0 holds only q = 0; a block of scale > 0
has max |q| = 127 (its absmax, x / x * 127, is exactly +-127, and every other
|x| / absmax <= 1 rounds to at most 127). A dim must fit a u32 on encode.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from compute.codecs import CODECS
from compute.errors import ComputeError

BLOCK = 64
MAX_DIMS = 8
MAX_ELEMENTS = 1 << 28  # 1 GiB of float32: far above any hidden state or gradient we send
MAX_DIM = (1 << 32) - 1  # dims travel as u32
MAGIC = b"PNWT"
VERSION = 1

# dtype code -> (torch dtype, bytes per element, numpy dtype of its bits on the wire, in memory).
# numpy has no bfloat16, so bfloat16 travels and converts as its 16-bit pattern.
_DTYPES = {
    0: (torch.float32, 4, np.dtype("<f4"), np.dtype(np.float32)),
    1: (torch.float16, 2, np.dtype("<f2"), np.dtype(np.float16)),
    2: (torch.bfloat16, 2, np.dtype("<i2"), np.dtype(np.int16)),
}
_DTYPE_CODE = {dt: code for code, (dt, *_) in _DTYPES.items()}
_CAST = {"fp16": torch.float16, "bf16": torch.bfloat16}
_HEAD = struct.Struct("<4sBBBB")
_FLOATS = "float32/float16/bfloat16"


class WireTensorError(ComputeError, ValueError):
    """A tensor cannot be encoded, or bytes are not a valid wire tensor."""


class TooManyElements(WireTensorError):
    """A wire tensor whose header announces more elements than the receiver takes.

    Well formed, perhaps, but past the decoder's ``max_elements`` (a session's
    budget, say): a receiver tells it from garbage by this type.

    Attributes:
        shape: the announced shape; numel: its elements; max_elements: the limit.
    """

    def __init__(self, shape: tuple[int, ...], numel: int, max_elements: int):
        super().__init__(f"shape {shape} has {numel} elements, at most {max_elements} allowed")
        self.shape, self.numel, self.max_elements = shape, numel, max_elements


def _numel(shape: tuple[int, ...]) -> int:
    """Product of the dims (1 for a scalar)."""
    numel = 1
    for d in shape:
        numel *= d
    return numel


def bytes_per_element(codec: str, dtype: torch.dtype = torch.float32) -> float:
    """Payload bytes per element for large tensors (header and padding aside).

    Raises:
        WireTensorError: unknown codec or dtype.
    """
    if codec not in CODECS or dtype not in _DTYPE_CODE:
        raise WireTensorError(f"expected a codec in {CODECS}, a {_FLOATS} dtype: {codec}, {dtype}")
    if codec == "int8":
        return 1 + 4 / BLOCK
    return 2.0 if codec in _CAST else float(_DTYPES[_DTYPE_CODE[dtype]][1])


def _payload_size(codec: int, dtype: int, numel: int) -> int:
    """Exact payload bytes for a tensor of numel elements."""
    if CODECS[codec] == "int8":
        blocks = -(-numel // BLOCK)
        return blocks * 4 + blocks * BLOCK
    if CODECS[codec] == "raw":
        return numel * _DTYPES[dtype][1]
    return numel * 2


def encoded_size(codec: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
    """Bytes of encode_tensor's output for a tensor of this shape and dtype."""
    bytes_per_element(codec, dtype)  # validates codec and dtype
    payload = _payload_size(CODECS.index(codec), _DTYPE_CODE[dtype], _numel(tuple(shape)))
    return _HEAD.size + 4 * len(shape) + payload


def quantize_blockwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise absmax 8-bit quantization.

    Args:
        x: a finite float tensor of any shape (read as flat, in float32).
    Returns:
        (q, scales): q int8 of shape (blocks, 64) with values in [-127, 127],
        zero in the padding; scales float32 of shape (blocks,), each block's
        absmax.
    """
    flat = x.detach().reshape(-1).to(torch.float32)
    pad = (-flat.numel()) % BLOCK
    blocks = (torch.nn.functional.pad(flat, (0, pad)) if pad else flat).view(-1, BLOCK)
    scales = blocks.abs().amax(dim=1)
    # An all-zero block keeps scale 0 on the wire; dividing by 1 keeps q = 0.
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = (blocks / safe[:, None]).mul_(127).round_()  # in place: one temporary, not three
    return q.to(torch.int8), scales


def dequantize_blockwise(
    q: torch.Tensor, scales: torch.Tensor, shape: tuple[int, ...]
) -> torch.Tensor:
    """Inverse of quantize_blockwise: float32 of `shape` (the padding dropped)."""
    x = q.to(torch.float32) * (scales.to(torch.float32) / 127)[:, None]
    return x.reshape(-1)[: _numel(shape)].reshape(shape)


def _check_encodable(t: torch.Tensor, codec: str) -> None:
    """Raise WireTensorError unless t can travel with codec."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPE_CODE:
        got = getattr(t, "dtype", type(t))
        raise WireTensorError(f"expected a {_FLOATS} tensor, got {got}")
    if codec not in CODECS:
        raise WireTensorError(f"expected codec in {CODECS}, got {codec!r}")
    if t.dim() > MAX_DIMS or t.numel() > MAX_ELEMENTS:
        raise WireTensorError(
            f"expected <= {MAX_DIMS} dims and <= {MAX_ELEMENTS} elements, got {tuple(t.shape)}"
        )
    # A dim travels as a u32; an empty tensor may have a larger one beside its 0.
    if any(d > MAX_DIM for d in t.shape):
        raise WireTensorError(f"expected every dim <= {MAX_DIM} (a u32), got {tuple(t.shape)}")


def _finite(t: torch.Tensor) -> bool:
    """True when every element is finite (an empty tensor is)."""
    if t.numel() == 0:
        return True
    # min and max carry any NaN or infinity; one pass, about 10x faster than isfinite().all().
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def _bits(t: torch.Tensor) -> bytes:
    """Little-endian bytes of a contiguous CPU float tensor."""
    wire = _DTYPES[_DTYPE_CODE[t.dtype]][2]
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().astype(wire, copy=False).tobytes()


def encode_tensor(t: torch.Tensor, codec: str = "raw") -> bytes:
    """Encode a tensor for the wire.

    Args:
        t: float32, float16 or bfloat16, any device, at most 8 dims and
            MAX_ELEMENTS elements, all values finite.
        codec: one of CODECS.
    Returns:
        header followed by payload (see the module docstring).
    Raises:
        WireTensorError: unsupported dtype or codec, too large (also a dim
            beyond u32), non-finite values, or values beyond the range of the
            "fp16" / "bf16" cast.
    """
    _check_encodable(t, codec)
    header = _HEAD.pack(MAGIC, VERSION, CODECS.index(codec), _DTYPE_CODE[t.dtype], t.dim())
    dims = struct.pack(f"<{t.dim()}I", *t.shape)
    # Quantize or cast where the tensor lives: fewer bytes cross to the CPU.
    x = t.detach()
    if codec == "int8":
        q, scales = (v.cpu() for v in quantize_blockwise(x))
        checked, payload = scales, _bits(scales) + q.numpy().tobytes()  # absmax carries NaN, inf
    else:
        # A NaN or inf survives the cast; a finite value beyond the half range becomes inf.
        checked = (x.to(_CAST[codec]) if codec in _CAST else x).cpu().contiguous()
        payload = _bits(checked)
    if not _finite(checked):
        raise WireTensorError(f"refusing NaN, infinities, or values beyond the {codec} range")
    return header + dims + payload


def _parse_header(data: bytes, max_elements: int) -> tuple[int, int, tuple[int, ...], int]:
    """(codec, dtype code, shape, payload offset) from a validated header."""
    if len(data) < _HEAD.size:
        raise WireTensorError(f"truncated header: {len(data)} bytes, need {_HEAD.size}")
    magic, version, codec, dtype, ndim = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise WireTensorError(f"not a wire tensor v{VERSION}: magic {magic!r}, version {version}")
    if codec >= len(CODECS) or dtype not in _DTYPES:
        raise WireTensorError(f"unknown codec {codec} or dtype {dtype}")
    if ndim > MAX_DIMS:
        raise WireTensorError(f"{ndim} dims, at most {MAX_DIMS} allowed")
    end = _HEAD.size + 4 * ndim
    if len(data) < end:
        raise WireTensorError(f"truncated shape: {len(data)} bytes, need {end}")
    shape = struct.unpack_from(f"<{ndim}I", data, _HEAD.size)
    numel = _numel(shape)
    if numel > max_elements:
        raise TooManyElements(shape, numel, max_elements)
    want = end + _payload_size(codec, dtype, numel)
    if len(data) != want:
        raise WireTensorError(
            f"shape {shape} with codec {CODECS[codec]} needs {want} bytes, got {len(data)}"
        )
    return codec, dtype, shape, end


def _float_payload(data: bytes, offset: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """numel elements of dtype from data at offset, as a new tensor."""
    _, _, wire, native = _DTYPES[_DTYPE_CODE[dtype]]
    values = np.frombuffer(data, wire, numel, offset).astype(native)  # a copy: writable, owned
    values = torch.from_numpy(values)
    return values.view(torch.bfloat16) if dtype == torch.bfloat16 else values


def _int8_payload(data: bytes, offset: int, shape: tuple[int, ...], numel: int) -> torch.Tensor:
    """Dequantized float32 from an int8 payload, checking scales, values and padding."""
    blocks = -(-numel // BLOCK)
    scales = torch.from_numpy(np.frombuffer(data, "<f4", blocks, offset).astype(np.float32))
    q = torch.from_numpy(np.frombuffer(data, np.int8, blocks * BLOCK, offset + 4 * blocks).copy())
    if blocks and not (_finite(scales) and not bool(torch.signbit(scales).any())):
        raise WireTensorError("expected int8 scales finite and >= 0 (not -0.0)")
    if bool(q[numel:].any()):
        raise WireTensorError("expected int8 padding of zeros")
    if blocks:
        lo, hi = torch.aminmax(q.view(blocks, BLOCK), dim=1)
        if int(lo.min()) == -128:
            raise WireTensorError("expected int8 values in [-127, 127], got -128")
        # Canonical form: the encoder maps each block's absmax to +-127, and an all-zero
        # block has scale 0 and q = 0. Anything else (e.g. scale * c with q / c, which
        # dequantizes alike) is not what the encoder writes.
        peak = torch.maximum(hi.to(torch.int16), lo.to(torch.int16).neg())
        want = torch.where(scales > 0, 127, 0).to(torch.int16)
        if not torch.equal(peak, want):
            b = int((peak != want).nonzero()[0])
            raise WireTensorError(
                f"expected max |q| = 127 in a block of scale > 0 and 0 in a block of scale 0; "
                f"block {b} has scale {float(scales[b])!r} and max |q| {int(peak[b])}"
            )
    return dequantize_blockwise(q.view(blocks, BLOCK), scales, shape)


def decode_tensor(
    data: bytes | bytearray | memoryview, max_elements: int = MAX_ELEMENTS
) -> torch.Tensor:
    """Decode encode_tensor's output.

    Args:
        data: the encoded bytes.
        max_elements: refuse tensors with more elements (at most MAX_ELEMENTS
            is sensible; memory use is bounded by len(data) in any case).
    Returns:
        A new CPU tensor of the sender's dtype and shape.
    Raises:
        TooManyElements: the header announces more than ``max_elements``.
        WireTensorError: data is not bytes-like or not a valid wire tensor.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireTensorError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    codec, dtype_code, shape, offset = _parse_header(data, max_elements)
    dtype = _DTYPES[dtype_code][0]
    numel = _numel(shape)
    if CODECS[codec] == "int8":
        out = _int8_payload(data, offset, shape, numel)
    else:
        wire = {"raw": dtype, **_CAST}[CODECS[codec]]
        out = _float_payload(data, offset, wire, numel).reshape(shape)
    out = out.to(dtype)
    if not _finite(out):  # also catches int8 values that overflow a float16 sender dtype
        raise WireTensorError("payload holds NaN or infinite values")
    return out
