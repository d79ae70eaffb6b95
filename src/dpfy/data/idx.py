"""Reader for the IDX file format used by (Fashion-)MNIST, gzipped or not.

Format (LeCun & Cortes, "THE MNIST DATABASE", file-format section):
two zero bytes, one type byte (0x08 unsigned byte, 0x09 signed byte, 0x0B int16, 0x0C int32,
0x0D float32, 0x0E float64), one byte giving the number of dimensions d, then d big-endian
uint32 sizes, then the values in C order, big-endian. A file whose length does not match its
header is truncated or corrupt, and is refused rather than half-read.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["IDX_DTYPES", "read_idx", "encode_idx"]

# type byte -> big-endian numpy dtype (format spec)
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path, fix: str) -> bytes:
    """The file's bytes, decompressed when it is gzipped (magic 1f 8b)."""
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as e:
        raise ValueError(
            f"{path} must be a complete gzip file, got a truncated or corrupt one ({e}). {fix}."
        ) from None


def read_idx(path: str | Path, *, fix: str = "Replace the file with an intact copy") -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a numpy array of native byte order.

    Raises ``ValueError`` naming the file and ``fix`` when the magic number, type byte or
    length is wrong: a truncated download must never become a silently smaller dataset.
    """
    path = Path(path)
    data = _read_bytes(path, fix)
    if len(data) < 4 or data[0:2] != b"\x00\x00" or data[2] not in IDX_DTYPES:
        raise ValueError(
            f"{path} must start with an IDX magic number (00 00 <type> <ndim>), "
            f"got {data[:4].hex(' ') or 'an empty file'}. {fix}."
        )
    dtype, ndim = IDX_DTYPES[data[2]], data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(
            f"{path} must hold {ndim} dimension sizes after its magic number, "
            f"got a {len(data)}-byte file. {fix}."
        )
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(
            f"{path} must be {expected} bytes for shape {tuple(shape)}, got "
            f"{len(data)} bytes (truncated or corrupt). {fix}."
        )
    return (
        np.frombuffer(data, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def encode_idx(array: np.ndarray) -> bytes:
    """The IDX encoding of ``array`` (the inverse of :func:`read_idx`; used to write fixtures)."""
    codes = {v.newbyteorder("="): k for k, v in IDX_DTYPES.items()}
    native = np.dtype(array.dtype).newbyteorder("=")
    if native not in codes:
        raise ValueError(
            f"array.dtype must be one of {sorted(str(d) for d in codes)}, got "
            f"array.dtype = {array.dtype}. Cast the array first."
        )
    head = bytes([0, 0, codes[native], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return head + np.ascontiguousarray(array, dtype=IDX_DTYPES[codes[native]]).tobytes()
