"""IDX reader against the format spec (LeCun & Cortes): magic 00 00 <type> <ndim>, big-endian
uint32 sizes, big-endian values. Expected bytes are written out by hand from the spec."""

import gzip

import numpy as np
import pytest

from dpfy.data.idx import encode_idx, read_idx


def test_hand_written_ubyte_vector(tmp_path):
    # spec: 00 00 08 (unsigned byte) 01 (one dim), size 3 as big-endian uint32, then 3 bytes
    raw = bytes([0, 0, 0x08, 1, 0, 0, 0, 3, 7, 8, 255])
    (tmp_path / "v").write_bytes(raw)
    out = read_idx(tmp_path / "v")
    assert out.dtype == np.uint8 and out.tolist() == [7, 8, 255]


def test_hand_written_int32_matrix_is_big_endian(tmp_path):
    # 00 00 0C (int32) 02 dims (1, 2); values 1 and -2 big-endian
    raw = bytes([0, 0, 0x0C, 2, 0, 0, 0, 1, 0, 0, 0, 2]) + (1).to_bytes(4, "big") + \
        (-2).to_bytes(4, "big", signed=True)
    (tmp_path / "m").write_bytes(raw)
    assert read_idx(tmp_path / "m").tolist() == [[1, -2]]


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
def test_roundtrip_every_type_gzipped(tmp_path, dtype):
    a = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    if dtype == "uint8":
        a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a.gz").write_bytes(gzip.compress(encode_idx(a)))
    out = read_idx(tmp_path / "a.gz")
    assert out.dtype == np.dtype(dtype) and np.array_equal(out, a)


def test_truncated_payload_is_refused(tmp_path):
    raw = encode_idx(np.zeros((4, 5), dtype=np.uint8))   # 4 + 2·4 header + 20 values = 32 bytes
    (tmp_path / "t").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match=r"must be 32 bytes .*got 29 bytes .*truncated"):
        read_idx(tmp_path / "t", fix="Reinstall it")


def test_truncated_gzip_is_refused(tmp_path):
    z = gzip.compress(encode_idx(np.zeros((50, 50), dtype=np.uint8)))
    (tmp_path / "t.gz").write_bytes(z[: len(z) // 2])
    with pytest.raises(ValueError, match="complete gzip file.*Reinstall it"):
        read_idx(tmp_path / "t.gz", fix="Reinstall it")


@pytest.mark.parametrize("raw", [b"", b"\x01\x00\x08\x01", b"\x00\x00\x07\x01", b"GIF89a.."])
def test_bad_magic_is_refused(tmp_path, raw):
    (tmp_path / "b").write_bytes(raw)
    with pytest.raises(ValueError, match="IDX magic number"):
        read_idx(tmp_path / "b")
