"""The optional one-call file writer (msprobe._native.file_io, issue 5) and its use by the
``.pt`` writer: the file holds head + data + tail with the data's CRC-32 (checked against
zlib) patched into both; ``.pt`` files written through it equal those of the Python path
byte for byte and pass zipfile's CRC checks; bad arguments and unwritable paths raise."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import sys
import sysconfig
import zipfile
import zlib

import numpy as np
import pytest
import torch

from msprobe._native import load_file_io
from msprobe.core.checksum import C_CRC32
from msprobe.pytorch import ptfile
from msprobe.pytorch.ptfile import save_values

FILE_IO = load_file_io()
needs_file_io = pytest.mark.skipif(FILE_IO is None or C_CRC32 is None,
                                   reason="msprobe._native.file_io not built (or no isal CRC-32)")


def test_built_wherever_a_c_compiler_exists():
    """A POSIX install with a C compiler has the module (a stale build fails here:
    `pip install -e .` again)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if sys.platform == "win32" or shutil.which(cc) is None:
        pytest.skip("no POSIX C build here")
    assert FILE_IO is not None, "msprobe._native.file_io is not built: rebuild with `pip install -e .`"


@needs_file_io
@pytest.mark.parametrize("size", [0, 1, 3, 4096, 1 << 20, (1 << 20) + 7])
def test_pieces_and_patched_crc(tmp_path, size):
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    data.flags.writeable = False  # read-only buffers are accepted
    head, tail = bytes(range(16)) * 2, b"\xee" * 9
    crc = FILE_IO.write_patched(str(tmp_path / "f"), 0o640, head, data, tail, 5, 3, C_CRC32)
    assert crc == zlib.crc32(data.tobytes())
    want_head = bytearray(head)
    want_head[5:9] = crc.to_bytes(4, "little")
    want_tail = bytearray(tail)
    want_tail[3:7] = crc.to_bytes(4, "little")
    assert (tmp_path / "f").read_bytes() == bytes(want_head) + data.tobytes() + bytes(want_tail)
    assert head == bytes(range(16)) * 2 and tail == b"\xee" * 9  # the caller's pieces untouched


@needs_file_io
def test_truncates_and_takes_paths_and_mode(tmp_path):
    target, new = tmp_path / "g", tmp_path / "new"
    target.write_bytes(b"x" * 1000)
    old = os.umask(0o022)
    try:
        FILE_IO.write_patched(target, 0o640, b"abcd", memoryview(b"payload"), b"wxyz", 0, 0, C_CRC32)
        FILE_IO.write_patched(os.fsencode(new), 0o640, b"abcd", b"", b"wxyz", 0, 0, C_CRC32)
    finally:
        os.umask(old)
    crc = zlib.crc32(b"payload").to_bytes(4, "little")
    assert target.read_bytes() == crc + b"payload" + crc  # an existing longer file is truncated
    assert new.read_bytes() == bytes(8)  # CRC-32 of nothing is 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o640  # a new file: mode (umask 022 keeps it)


@needs_file_io
@pytest.mark.parametrize("head_at,tail_at", [(-1, 0), (1, 0), (0, 5), (0, -2)])
def test_offsets_outside_their_piece_are_refused(tmp_path, head_at, tail_at):
    with pytest.raises(ValueError, match="outside"):
        FILE_IO.write_patched(str(tmp_path / "h"), 0o640, b"abcd", b"", b"12345678", head_at, tail_at, C_CRC32)
    assert not (tmp_path / "h").exists()


@needs_file_io
def test_zero_crc_address_and_unwritable_path(tmp_path):
    with pytest.raises(ValueError, match="crc_fn_address"):
        FILE_IO.write_patched(str(tmp_path / "i"), 0o640, b"abcd", b"", b"abcd", 0, 0, 0)
    missing = tmp_path / "no" / "such" / "dir" / "f.pt"
    with pytest.raises(FileNotFoundError) as info:
        FILE_IO.write_patched(str(missing), 0o640, b"abcd", b"x", b"abcd", 0, 0, C_CRC32)
    assert info.value.errno == errno.ENOENT and info.value.filename == str(missing)


CASES = [(torch.float32, (33, 5)), (torch.bfloat16, (7,)), (torch.float64, ()), (torch.int8, (0, 4)),
         (torch.complex64, (3, 2)), (torch.bool, (11,)), (torch.float16, (2, 3, 4))]


@needs_file_io
@pytest.mark.parametrize("dtype,shape", CASES, ids=[f"{d}-{s}" for d, s in CASES])
def test_pt_files_equal_the_python_path(tmp_path, monkeypatch, dtype, shape):
    t = (torch.randn(shape, dtype=torch.float64) * 50).to(dtype)
    data = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""
    save_values(tmp_path / "native.pt", dtype, shape, data)
    monkeypatch.setattr(ptfile, "_FILE_IO", None)
    save_values(tmp_path / "python.pt", dtype, shape, data)
    assert (tmp_path / "native.pt").read_bytes() == (tmp_path / "python.pt").read_bytes()
    with zipfile.ZipFile(tmp_path / "native.pt") as z:
        assert z.testzip() is None
    got = torch.load(tmp_path / "native.pt", weights_only=True)
    assert got.dtype == dtype and got.shape == shape and torch.equal(got, t)
