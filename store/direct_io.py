"""Write a file from pieces of bytes around the page cache (``O_DIRECT``), for payload shards.

Why: a buffered ``write`` copies every byte into freshly allocated page-cache pages, and on
the 2-core benchmark VM that costs 1.2-2.5 ns per byte of CPU in the writing thread (plus
the kernel's writeback later), CPU the training step competes for: 146 ms per step of the
encoder benchmark for its 175 MB of shard bytes. With ``O_DIRECT`` the bytes
are copied once into a reusable page-aligned buffer and the device reads them from there:
about 10 ms of CPU per 100 MB (``benchmarks/RESULTS.md``, section "tensor task: shards around the page
cache on their own thread"). Shards are the
durable copy, read back only by ``msprobe export`` and readers of the dump; keeping them out of
the page cache also leaves it to the exported tensor files.

``O_DIRECT`` needs the buffer address, the length of each write and the file offset aligned
to the device's logical block size: :class:`DirectFileWriter` copies the pieces into a
page-aligned ``mmap`` buffer of :data:`CHUNK_BYTES`, writes it whole each time it fills,
pads the last chunk up to :data:`ALIGN` bytes and then truncates the file to its real
length. A piece that starts at a page-aligned address while the file offset is page-aligned
(what the tensor files and shards of :mod:`store.payload_writer` arrange for their large
payloads) is not copied: its whole pages are written from the caller's memory. Where
``O_DIRECT`` does not exist (macOS, Windows) or the file system refuses it (tmpfs and some
network file systems answer ``EINVAL``), it writes the file the ordinary way and
remembers, per file system, not to try again. The file's bytes are the same either way.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
from typing import Iterable, Union

import numpy as np

from store.fileutil import FILE_MODE, PathLike

__all__ = ["ALIGN", "CHUNK_BYTES", "DirectFileWriter", "address_of", "thread_writer", "write_buffered"]

#: alignment of buffer, write lengths and offsets (unit: bytes): the page size, a multiple of
#: every logical block size in use (512 or 4096)
ALIGN = 4096
#: the aligned buffer's size (unit: bytes); on the benchmark VM 16 MiB writes reach
#: ~700 MB/s where 1 MiB writes reach ~430 MB/s
CHUNK_BYTES = 16 << 20
#: files smaller than this are written the ordinary way (unit: bytes): a handful of pages
#: gain nothing from bypassing the cache
MIN_DIRECT_BYTES = 1 << 20
# errors meaning "this file system (or this file) does not do O_DIRECT"
_UNSUPPORTED = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}

Bytes = Union[bytes, bytearray, memoryview]
# mmap flags of the aligned buffer: private (copy-on-write after fork), where mmap has the flag
_PRIVATE = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}


def address_of(data: Bytes) -> int:
    """The memory address of the first byte of the contiguous buffer ``data`` (bytes,
    memoryview, numpy array...; read-only ones too). A piece can go to the device without a
    copy when this is a multiple of :data:`ALIGN` (see :class:`DirectFileWriter`)."""
    return np.frombuffer(data, dtype=np.uint8).__array_interface__["data"][0]


def write_buffered(path: PathLike, pieces: Iterable[Bytes]) -> None:
    """Create or truncate ``path`` (mode ``0o640``) and write ``pieces`` one after another
    through the page cache.

    Raises:
        OSError: the file could not be opened or written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), FILE_MODE)
        for piece in pieces:
            fh.write(piece)


class DirectFileWriter:
    """Writes whole files with ``O_DIRECT`` through one reusable aligned buffer (see the
    module docstring). Not thread-safe: one per writing thread.

    Args:
        chunk_bytes: size of the aligned buffer (unit: bytes); a positive multiple of
            :data:`ALIGN`.
        min_direct_bytes: files smaller than this are written buffered (unit: bytes; >= 0).

    Raises:
        ValueError: ``chunk_bytes`` is not a positive multiple of :data:`ALIGN`, or
            ``min_direct_bytes`` < 0.

    Attributes:
        direct: False where ``O_DIRECT`` does not exist (or a caller set it False: every
            file is then written buffered), and once a file system refused it. Refusals are
            remembered per file system (the ``st_dev`` of the file's directory): files there
            are written buffered without trying again, files elsewhere still try
            ``O_DIRECT`` (one writer per thread serves every dump path the thread writes to).
        direct_files: files written with ``O_DIRECT`` so far.
        zero_copy_bytes: bytes written straight from the callers' memory so far (unit:
            bytes): the whole pages of a piece that starts at a page-aligned address where
            the file offset is page-aligned too are not copied into the buffer.

    Example::

        w = DirectFileWriter()
        w.write("/data/dump/.msprobe/payload/x.safetensors", [header, tensor_bytes])
    """

    def __init__(self, *, chunk_bytes: int = CHUNK_BYTES, min_direct_bytes: int = MIN_DIRECT_BYTES) -> None:
        if int(chunk_bytes) <= 0 or int(chunk_bytes) % ALIGN:
            raise ValueError(f"chunk_bytes: got {chunk_bytes!r}; allowed: a positive multiple of {ALIGN}")
        if int(min_direct_bytes) < 0:
            raise ValueError(f"min_direct_bytes: got {min_direct_bytes!r}; allowed: an int >= 0")
        self._chunk = int(chunk_bytes)
        self._min = int(min_direct_bytes)
        self._buffer = None  # mmap: page-aligned, made at the first direct write
        self._array = None   # numpy uint8 view of it: copies into it release the GIL
        self._o_direct = hasattr(os, "O_DIRECT")
        self._refused: set[int] = set()  # st_dev of the file systems that refused O_DIRECT
        self.direct_files = 0
        self.zero_copy_bytes = 0

    @property
    def direct(self) -> bool:
        return self._o_direct and not self._refused

    @direct.setter
    def direct(self, value: bool) -> None:
        self._o_direct = bool(value) and hasattr(os, "O_DIRECT")
        if value:
            self._refused.clear()

    def write(self, path: PathLike, pieces: Iterable[Bytes]) -> None:
        """Create or truncate ``path`` (mode ``0o640``) holding the concatenation of
        ``pieces`` (each a bytes-like object of bytes; any iterable, read once).

        Raises:
            OSError: the file could not be opened or written (an ``O_DIRECT`` refusal is
                not an error: the file is then written buffered).
        """
        pieces = list(pieces)  # counted, then written: a generator would be empty by then
        total = sum(memoryview(p).nbytes for p in pieces)
        if self._o_direct and total >= self._min and (not self._refused or _device(path) not in self._refused):
            try:
                self._write_direct(path, pieces, total)
                self.direct_files += 1
                return
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._refused.add(_device(path))  # the file is rewritten below, from the start
        write_buffered(path, pieces)

    def close(self) -> None:
        """Release the aligned buffer (a later :meth:`write` makes a new one)."""
        if self._buffer is not None:
            self._array = None  # the view first: an exported mmap cannot close
            self._buffer.close()
            self._buffer = None

    def _write_direct(self, path: PathLike, pieces: list[Bytes], total: int) -> None:
        if self._buffer is None:
            # anonymous: page-aligned; private: a process forked later (the writer of
            # thread_writer lives on in the forking thread) fills a copy of its own,
            # where the default MAP_SHARED buffer had parent and child write each other's bytes
            self._buffer = mmap.mmap(-1, self._chunk, **_PRIVATE)
            self._array = np.frombuffer(self._buffer, dtype=np.uint8)
        buf = self._array
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
            fill = 0
            for piece in pieces:
                # numpy copies without holding the GIL (a 16 MiB memoryview copy holds it
                # for ~9 ms, stalling the training thread)
                src = np.frombuffer(memoryview(piece).cast("B"), dtype=np.uint8)
                if src.size >= ALIGN and not fill % ALIGN and not src.ctypes.data % ALIGN:
                    # page-aligned memory at a page-aligned file offset: its whole pages go
                    # to the device straight from the caller's memory, without the copy
                    if fill:
                        _write_all(fd, memoryview(buf[:fill]))
                        fill = 0
                    whole = src.size - src.size % ALIGN
                    _write_all(fd, memoryview(src[:whole]))
                    self.zero_copy_bytes += whole
                    src = src[whole:]
                while src.size:
                    n = min(src.size, self._chunk - fill)
                    np.copyto(buf[fill:fill + n], src[:n])
                    fill += n
                    src = src[n:]
                    if fill == self._chunk:
                        _write_all(fd, memoryview(buf))
                        fill = 0
            if fill:
                padded = -(-fill // ALIGN) * ALIGN
                buf[fill:padded] = 0
                _write_all(fd, memoryview(buf[:padded]))
                if padded != fill:
                    os.ftruncate(fd, total)
        finally:
            # an error's traceback keeps this frame: a view of the buffer in it would keep
            # the mmap exported (close() then fails with BufferError) while the error is kept
            del buf
            os.close(fd)


def _device(path: PathLike) -> int:
    """``st_dev`` of the directory of ``path`` (-1 where it cannot be read: all such
    paths count as one file system)."""
    try:
        return os.stat(os.path.dirname(os.path.abspath(os.fspath(path)))).st_dev
    except (OSError, ValueError):
        return -1


def _write_all(fd: int, view: memoryview) -> None:
    """Write all of ``view`` (aligned, a multiple of :data:`ALIGN` long) to ``fd``."""
    try:
        while len(view):
            n = os.write(fd, view)
            if n <= 0:  # pragma: no cover - write(2) returns >= 1 or raises for regular files
                raise OSError(errno.EIO, "write returned 0")
            if n % ALIGN:  # a short direct write that leaves the offset unaligned: give up on it
                raise OSError(errno.EINVAL, f"O_DIRECT write of {len(view)} bytes wrote {n}")
            view = view[n:]
    except BaseException:
        view.release()  # the error's traceback keeps this frame (see _write_direct)
        raise


_THREAD = threading.local()


def thread_writer() -> DirectFileWriter:
    """The calling thread's :class:`DirectFileWriter`, made at its first call (a writer is
    not thread-safe, and the payload writer thread and an exporter may write tensor files
    at the same time). Its aligned buffer is released with the thread.

    Tensor files (``.pt``, ``.npy``) of 1 MiB of data or more go through it: on a machine
    whose page cache is full (the usual state of a training host) every buffered page
    written costs the kernel a reclaim in the writing thread (``benchmarks/RESULTS.md``,
    section "Intel Xeon VM: the page cache and the tensor task": 778 against 557 ms per L1 tensor step of the encoder benchmark)."""
    writer = getattr(_THREAD, "writer", None)
    if writer is None:
        writer = _THREAD.writer = DirectFileWriter()
    return writer
