"""Tensor payloads (task ``tensor``): content-addressed safetensors shards beside the log.

Layout: ``{dump_path}/.msprobe/payload/rank{R}.{pid}.{time_ns}.{shard:05d}.safetensors``.
Each shard is a plain safetensors file (8-byte little-endian header length, JSON header,
data) readable by any safetensors reader. Every tensor is stored under its content key
(:func:`content_key`: ``x`` and 32 hex digits of XXH3-128 over dtype, shape and bytes;
64 hex digits of SHA-256 where the ``xxhash`` package is missing, or in shards of earlier
versions, and 32 of BLAKE2b-128 in older ones); the shard's ``__metadata__`` maps
each key to ``"{dtype}|{shape as JSON}"`` with the framework's own dtype spelling
(``"torch.bfloat16"``, ``"Float16"``), so that dtypes safetensors lacks (complex) still
round-trip: their bytes are stored as ``U8``.

A record references a payload as ``"{shard file name}:{key}"`` (log column ``payload``).
Identical bytes (one op's output is the next op's input; a parameter seen every step) are
stored once and referenced again: :meth:`PayloadWriter.put` returns the earlier reference.

Threads. :meth:`PayloadWriter.put` hashes the bytes in the caller's thread (XXH3-128: about
7 GB/s on one core of the 2-core benchmark machine, SHA-256 1.3 GB/s; with ~0.7 GB of
tensor bytes captured per step of the encoder benchmark, that is ~0.1 s against ~0.5 s;
a 128-bit non-cryptographic hash is enough here: the store dedupes the process's own
tensors, nobody chooses their bytes to collide) and hands them to one background thread through a
bounded queue (back-pressure: a full queue blocks the caller instead of growing memory).
The background thread collects a shard in memory and seals it when it exceeds
``shard_bytes`` or at :meth:`PayloadWriter.flush`; a second thread writes sealed shards
atomically (temporary name, then rename), around the page cache (``O_DIRECT``,
:mod:`store.direct_io`) where the file system allows, so that the device writes one shard
while the next payloads are staged. ``flush(shards=False)`` returns once the staged files
are written (the live export runs meanwhile) and :meth:`PayloadWriter.wait_written` waits
for the shards; the readers of a live session wait for them before reading a shard.
A shard not yet written when the process dies is lost; references to it are reported by
the exporter as missing payloads.

Staged tensor files (live export). Given ``stage=(write_file, ext)``, the background thread
also writes every new payload as a tensor file
``{dump_path}/.msprobe/stage/{writer}/{key}.{ext}`` (``{writer}``: the shard stem, so ranks
and processes sharing a dump path never touch each other's files)
(``write_file`` is the adapter's ``.pt``/``.npy`` writer, the same one the exporter uses)
while the step still runs, from the bytes it already holds. The live exporter then moves
a staged file into place (:meth:`PayloadReader.take_staged`) instead of reading the shard
and writing the file at ``stop()``/``step()``; the file bytes are the same either way, so
``msprobe export`` (which never uses staged files) writes identical files. Staged files
never moved are removed (see below); a failed staging write only
means the exporter writes that file itself. Staged files are offered to the exports that
follow the next two :meth:`PayloadWriter.flush` es (a live step exports at ``stop()`` and
again at ``step()``); the third flush removes those never moved (so they never pile up),
as does :meth:`PayloadWriter.close`.

Nothing here imports a deep-learning framework: callers pass raw C-order bytes, a dtype
string and a shape.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from store import schema as S
from store.direct_io import ALIGN as PAGE, DirectFileWriter, address_of
from store.errors import PayloadDamagedError, StoreError, StoreWriteError
from store.fileutil import FILE_MODE, make_dirs, replace_from

try:  # a declared dependency; without it new keys are SHA-256 (about 5x slower to compute)
    from xxhash import xxh3_128 as _xxh3_128
except ImportError:  # pragma: no cover - exercised by monkeypatching in the tests
    _xxh3_128 = None

_XXH3_PREFIX = "x"  # content keys from XXH3-128: "x" + 32 hex digits (see content_key)

__all__ = ["PAYLOAD_DIR", "Payload", "PayloadReader", "PayloadWriter", "SAFETENSORS_DTYPES", "content_key",
           "key_matches"]

PAYLOAD_DIR = "payload"
STAGE_DIR = "stage"
_STAGE_KEEP = 2  # flushes after which an unmoved staged file is removed
_MOVED_KEEP = 8192  # files moved into place that a reader remembers for later links
SHARD_SUFFIX = ".safetensors"

#: dtype strings (PyTorch and MindSpore spellings) → (safetensors dtype, item size in bytes).
#: Any other dtype (complex, ...) is stored as ``U8`` bytes; its real dtype is in metadata.
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {}
for _names, _code, _size in (
    (("torch.float64", "Float64", "float64"), "F64", 8),
    (("torch.float32", "Float32", "float32"), "F32", 4),
    (("torch.float16", "Float16", "float16"), "F16", 2),
    (("torch.bfloat16", "BFloat16", "bfloat16"), "BF16", 2),
    (("torch.int64", "Int64", "int64"), "I64", 8),
    (("torch.int32", "Int32", "int32"), "I32", 4),
    (("torch.int16", "Int16", "int16"), "I16", 2),
    (("torch.int8", "Int8", "int8"), "I8", 1),
    (("torch.uint8", "UInt8", "uint8"), "U8", 1),
    (("torch.uint16", "UInt16", "uint16"), "U16", 2),
    (("torch.uint32", "UInt32", "uint32"), "U32", 4),
    (("torch.uint64", "UInt64", "uint64"), "U64", 8),
    (("torch.bool", "Bool", "bool"), "BOOL", 1),
):
    for _name in _names:
        SAFETENSORS_DTYPES[_name] = (_code, _size)


def payload_dir(dump_path: Union[str, os.PathLike]) -> Path:
    """``{dump_path}/.msprobe/payload``."""
    return Path(dump_path) / S.STORE_DIR / PAYLOAD_DIR


def stage_dir(dump_path: Union[str, os.PathLike]) -> Path:
    """``{dump_path}/.msprobe/stage`` (staged tensor files of the live export)."""
    return Path(dump_path) / S.STORE_DIR / STAGE_DIR


def _hex(h: Any, data: Union[bytes, bytearray, memoryview], dtype: str, shape: tuple[int, ...]) -> str:
    """Hex digest of the hash object ``h`` (hashlib or xxhash, empty) over
    ``"{dtype}|{shape as list}|"`` and ``data``: what every kind of content key hashes."""
    h.update(f"{dtype}|{list(shape)}|".encode())
    h.update(data)
    return h.hexdigest()


def content_key(data: Union[bytes, bytearray, memoryview], dtype: str, shape: tuple[int, ...]) -> str:
    """The content address of a payload: ``"x"`` and 32 hex digits of XXH3-128 over
    ``"{dtype}|{shape as list}|"`` and the bytes (the ``xxhash`` package); where that
    package is missing, 64 hex digits of SHA-256 over the same (:func:`key_matches` tells
    the kinds apart by length).

    >>> content_key(b"", "torch.float32", (0,)) == content_key(b"", "torch.float32", (0,))
    True
    """
    if _xxh3_128 is None:
        return _hex(hashlib.sha256(), data, dtype, shape)
    return _XXH3_PREFIX + _hex(_xxh3_128(), data, dtype, shape)


def key_matches(key: str, data: Union[bytes, bytearray, memoryview], dtype: str, shape: tuple[int, ...]) -> bool:
    """True if ``key`` is the content key of ``data``: an XXH3-128 key (``x`` and 32 hex
    digits), a SHA-256 key (64 hex digits) or a BLAKE2b-128 key of an older shard (32).

    Raises:
        StoreError: an XXH3-128 key while the ``xxhash`` package is not installed.
    """
    if len(key) == 32:   # a shard written before SHA-256 keys
        return _hex(hashlib.blake2b(digest_size=16), data, dtype, shape) == key
    if len(key) == 33 and key.startswith(_XXH3_PREFIX):
        if _xxh3_128 is None:
            raise StoreError(f"payload key {key!r} is an XXH3-128 hash: checking it needs the xxhash "
                             "package (pip install xxhash)")
        return content_key(data, dtype, shape) == key
    return _hex(hashlib.sha256(), data, dtype, shape) == key   # no xxhash, or a shard written before XXH3


@dataclass(frozen=True, slots=True)
class Payload:
    """One stored tensor: C-order ``data`` bytes (any bytes-like object: ``bytes``,
    ``bytearray``, a byte memoryview of a ``bytes`` object, or the read-only uint8 array of
    :func:`_kept`), ``dtype`` string, ``shape`` tuple.

    :meth:`PayloadReader.read` returns ``data`` as a fresh ``bytearray`` owned by the caller
    (writable: a tensor can wrap it without another copy)."""

    data: Union[bytes, bytearray, memoryview, "np.ndarray"]
    dtype: str
    shape: tuple[int, ...]


def _encode_shard(items: list[tuple[str, str, tuple[int, ...], Any]]) -> tuple[bytes, list[Any]]:
    """Header bytes (length prefix included) and data pieces of a safetensors file.

    Payloads that start on a page in memory come first: those a whole number of pages
    long, then one that is not (its whole pages still follow at a page-aligned offset), and
    the header is padded with spaces (as safetensors allows) to a whole number of pages:
    the shard thread then writes their pages from the payloads' own memory
    (:class:`store.direct_io.DirectFileWriter`). The order of the data inside a shard
    means nothing to a reader (the header holds every payload's offsets)."""
    header: dict = {}
    meta: dict[str, str] = {}
    offset = 0
    pieces = []
    ranks = [_page_rank(item[3]) for item in items]
    tail = next((i for i, r in enumerate(ranks) if r == 1), None)  # one aligned, not whole pages
    order = sorted(range(len(items)), key=lambda i: (0 if ranks[i] == 0 else 1 if i == tail else 2, i))
    items = [items[i] for i in order]
    paged = bool(items) and ranks[order[0]] < 2
    for key, dtype, shape, data in items:
        if key in header:  # put again after the index forgot it: one copy per shard
            continue
        code, size = SAFETENSORS_DTYPES.get(dtype, ("U8", 1))
        numel = 1
        for d in shape:
            numel *= d
        if code == "U8" and dtype not in SAFETENSORS_DTYPES or numel * size != len(data):
            code, st_shape = "U8", [len(data)]
        else:
            st_shape = list(shape)
        header[key] = {"dtype": code, "shape": st_shape, "data_offsets": [offset, offset + len(data)]}
        meta[key] = f"{dtype}|{json.dumps(list(shape), separators=(',', ':'))}"
        offset += len(data)
        pieces.append(data)
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % (PAGE if paged else 8))
    return struct.pack("<Q", len(text)) + text, pieces


def _page_rank(data: Any) -> int:
    """0: ``data`` starts on a page in memory and is a whole number of pages long; 1: it
    starts on a page and is at least one page long; 2: anything else (``bytes`` objects
    never start on a page: their data follows the object's header)."""
    if type(data) is bytes or len(data) < PAGE:
        return 2
    if address_of(data) % PAGE:
        return 2
    return 1 if len(data) % PAGE else 0


class PayloadWriter:
    """Stores tensor bytes of one rank in content-addressed safetensors shards.

    Args:
        dump_path: the dump directory; shards go to ``{dump_path}/.msprobe/payload/``
            (directories mode 0o750, files 0o640, created at the first shard write).
        rank: rank in the shard file names.
        queue_size: bound of the queue to the background thread (unit: payloads); a full
            queue blocks :meth:`put`. Must be >= 1.
        shard_bytes: a shard is written once its data exceeds this size (unit: bytes).
            Must be >= 1. With ``pending_bytes`` it bounds the writer's memory: at most
            about ``pending_bytes + 3 * shard_bytes`` of payload bytes are held at a time
            (a shard being filled, one waiting for the shard thread, one being written).
        pending_bytes: bound of the bytes queued and not yet taken by the background
            thread (unit: bytes); :meth:`put` blocks while it would be exceeded (one
            payload larger than the bound is still accepted when nothing else is
            pending). Must be >= 1.
        index_size: how many content keys are remembered for deduplication (unit:
            payloads; the oldest are forgotten first, so a payload seen again after that
            is stored again). Must be >= 1.
        stage: ``(write_file, ext)``: also write each new payload as a staged tensor file
            (see the module docstring); ``write_file(path, payload)`` (path: text) is called on the
            background thread.

    Raises:
        ValueError: a bound < 1.

    Example::

        with PayloadWriter("/tmp/dump", rank=0) as w:
            ref = w.put(b"\\x00\\x00\\x80\\x3f", "torch.float32", (1,))
            assert w.put(b"\\x00\\x00\\x80\\x3f", "torch.float32", (1,)) == ref  # stored once
            w.flush()                                   # shard on disk now
        PayloadReader("/tmp/dump").read(ref).data == b"\\x00\\x00\\x80\\x3f"
    """

    def __init__(
        self,
        dump_path: Union[str, os.PathLike],
        rank: int,
        *,
        queue_size: int = 64,
        shard_bytes: int = 32 << 20,
        pending_bytes: int = 64 << 20,
        index_size: int = 1 << 16,
        stage: Optional[tuple[Callable[[str, "Payload"], None], str]] = None,
    ) -> None:
        if int(queue_size) < 1:
            raise ValueError(f"queue_size: got {queue_size!r}; allowed: an int >= 1")
        if int(shard_bytes) < 1:
            raise ValueError(f"shard_bytes: got {shard_bytes!r}; allowed: an int >= 1")
        if int(pending_bytes) < 1:
            raise ValueError(f"pending_bytes: got {pending_bytes!r}; allowed: an int >= 1")
        if int(index_size) < 1:
            raise ValueError(f"index_size: got {index_size!r}; allowed: an int >= 1")
        self._pending_limit = int(pending_bytes)
        self._pending = 0  # bytes queued, not yet taken by the background thread
        self._drained = threading.Condition()
        self._index_size = int(index_size)
        self._dir = payload_dir(dump_path)
        self._stage = stage
        self._staged: list[str] = []             # staged since the last flush (background thread)
        self._staged_old: list[list[str]] = []   # staged before it, newest last (at most _STAGE_KEEP)
        self._pid = os.getpid()  # a forked child has none of the threads (see close)
        self._stem = f"rank{int(rank)}.{self._pid}.{time.time_ns()}"
        self._stage_dir = stage_dir(dump_path) / self._stem
        self._stage_prefix = os.path.join(os.fspath(self._stage_dir), "")  # text: once per payload
        self._stage_made = False
        self._shard_bytes = int(shard_bytes)
        self._queue: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self._lock = threading.Lock()
        self._index: OrderedDict[str, str] = OrderedDict()  # key -> ref, oldest first
        self._shard = 0
        self._shard_fill = 0
        self._error: Optional[BaseException] = None
        self._closed = False
        self.stored_bytes = 0      #: unique payload bytes handed to the writer (unit: bytes)
        self.referenced_bytes = 0  #: bytes of every put, duplicates included (unit: bytes)
        self._files = DirectFileWriter()  # the shard thread's
        # sealed shards go from the writer thread to the shard thread (one waits while
        # another is written): the device writes a shard while the next payloads are staged
        self._shard_queue: queue.Queue = queue.Queue(maxsize=1)
        self._written = threading.Condition()
        self._flushes = 0       # flush() calls so far (caller side)
        self._flushes_done = 0  # of those, how many have their shards on disk (shard thread)
        self._thread = threading.Thread(target=self._run, name="msprobe-payload-writer", daemon=True)
        self._shard_thread = threading.Thread(target=self._run_shards, name="msprobe-payload-shards", daemon=True)
        self._thread.start()
        self._shard_thread.start()

    # --- caller side -----------------------------------------------------------------
    @property
    def staging(self) -> Optional[tuple[Path, str]]:
        """``(directory, extension)`` of this writer's staged tensor files, for
        :class:`PayloadReader` ``stage``; None without ``stage``."""
        return None if self._stage is None else (self._stage_dir, self._stage[1])

    def shard_name(self, index: int) -> str:
        """File name of shard ``index``."""
        return f"{self._stem}.{index:05d}{SHARD_SUFFIX}"

    def put(self, data: Union[bytes, bytearray, memoryview], dtype: str, shape: tuple[int, ...]) -> str:
        """Store one tensor; returns its reference ``"{shard}:{key}"``.

        Args:
            data: the tensor's C-order bytes. The writer keeps ``data`` itself when nobody
                can change it (``bytes``, a byte memoryview of a ``bytes`` object, or a
                read-only 1-D uint8 numpy array that owns its memory: the caller gives such
                an array up, as :func:`msprobe.pytorch.payload.tensor_bytes` does), else
                ``bytes(data)``.
            dtype: the framework's dtype string (``"torch.float16"``).
            shape: the tensor's shape (``()`` for 0-dim).

        Raises:
            StoreWriteError: the background thread failed earlier, or the writer is closed.
        """
        self._raise_if_failed()
        shape = tuple(int(d) for d in shape)
        key = content_key(data, dtype, shape)
        with self._lock:
            self.referenced_bytes += len(data)
            ref = self._index.get(key)
            if ref is not None:
                return ref
            size = len(data)
            with self._drained:  # back-pressure by bytes (the queue bounds the count)
                while self._pending and self._pending + size > self._pending_limit and self._error is None:
                    if not self._drained.wait(0.5) and self._lost():
                        break
                self._pending += size
            ref = f"{self.shard_name(self._shard)}:{key}"
            self._index[key] = ref
            if len(self._index) > self._index_size:
                self._index.popitem(last=False)
            self.stored_bytes += len(data)
            self._shard_fill += len(data) or 1  # an empty payload, too, makes flush() seal the shard
            item = ("put", self._shard, key, dtype, shape, _kept(data))
            seal = self._shard_fill >= self._shard_bytes
            shard = self._shard
            if seal:
                self._shard += 1
                self._shard_fill = 0
            self._queue.put(item)
            if seal:
                self._queue.put(("seal", shard, None))
        return ref

    def flush(self, *, shards: bool = True) -> None:
        """Write the current shard and wait until every payload put so far is on disk.

        Args:
            shards: False: return as soon as the staged tensor files of every payload put
                so far are written (what the live export reads) while the shards are still
                being written on the shard thread; :meth:`wait_written` waits for those.

        Raises:
            StoreWriteError: a shard or the writer failed.
        """
        if self._closed:
            self._raise_if_failed()
            return
        staged, done = threading.Event(), threading.Event()
        with self._lock:
            shard = self._shard
            if self._shard_fill:
                self._shard += 1
                self._shard_fill = 0
            with self._written:
                self._flushes += 1
            self._queue.put(("seal", shard, (staged, done)))
        event = done if shards else staged
        while not event.wait(0.5):
            if self._lost():
                break
        self._raise_if_failed()

    def wait_written(self) -> None:
        """Wait until the shards of every :meth:`flush` so far are on disk (returns at once
        after a :meth:`flush` that waited for them, and after :meth:`close`).

        Raises:
            StoreWriteError: a shard or the writer failed.
        """
        with self._written:
            target = self._flushes
            while self._flushes_done < target and self._error is None:
                if not self._written.wait(0.5) and self._lost():
                    break
        if self._error is not None:  # not "closed": after close() every shard is on disk
            self._raise_if_failed()

    def close(self) -> None:
        """Flush and stop the background thread (idempotent). In a process forked from
        the one that made the writer (the threads are not there) it only marks the writer
        closed: the shards and staged files are the parent's.

        Raises:
            StoreWriteError: the final write failed.
        """
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._closed = True
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._queue.put(("stop", -1, None))
            self._thread.join()  # it stops the shard thread after its last shard
            self._shard_thread.join()
            self._files.close()
            for paths in self._staged_old + [self._staged]:  # staged files the exporter did not move
                _unlink_all(paths)
            self._staged_old, self._staged = [], []
            for directory in (self._stage_dir, self._stage_dir.parent):
                try:
                    os.rmdir(directory)
                except OSError:  # never created, or another writer's files are there
                    pass

    def __enter__(self) -> "PayloadWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lost(self) -> bool:
        """True (and the writer failed) when a background thread has ended while the writer
        is open: an unexpected error killed it, or this is a forked child, which has none.
        Waiters check it instead of waiting for ever."""
        if self._closed or (self._thread.is_alive() and self._shard_thread.is_alive()):
            return False
        if self._error is None:
            self._error = RuntimeError("a payload writer thread stopped unexpectedly")
        return True

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise StoreWriteError(f"payload writer failed: {self._error}") from self._error
        if self._closed:
            raise StoreWriteError("payload writer is closed")

    # --- background thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            self._run_items()
        except BaseException as exc:  # reported to the caller by put/flush/wait_written
            if self._error is None:
                self._error = exc
            self._shard_queue.put(None)  # the shard thread ends too (close() joins it)

    def _run_items(self) -> None:
        shards: dict[int, list] = {}
        while True:
            item = self._queue.get()
            op = item[0]
            if op == "stop":
                self._shard_queue.put(None)
                return
            if op == "put":
                _, shard, key, dtype, shape, data = item
                shards.setdefault(shard, []).append((key, dtype, shape, data))
                try:
                    if self._stage is not None and self._error is None:
                        self._stage_file(key, Payload(data=data, dtype=dtype, shape=shape))
                finally:
                    with self._drained:
                        self._pending -= len(data)
                        self._drained.notify_all()
                continue
            _, shard, flush = item
            if flush is not None:
                # a flush: the caller waits, then exports. Files staged before the last
                # _STAGE_KEEP flushes were offered to the exports that followed them (a
                # step's stop() and step(): backward entries are emitted at step());
                # what is left of them is not needed (a later reference is exported
                # from the shard).
                self._staged_old.append(self._staged)
                self._staged = []
                if len(self._staged_old) > _STAGE_KEEP:
                    _unlink_all(self._staged_old.pop(0))
            for index in sorted(k for k in shards if k <= shard):
                self._shard_queue.put((index, shards.pop(index), None))
            if flush is not None:
                staged, done = flush
                staged.set()  # every payload put before the flush is staged
                self._shard_queue.put((None, None, done))

    def _run_shards(self) -> None:
        """The shard thread: writes sealed shards in order; a flush's marker after them."""
        while True:
            item = self._shard_queue.get()
            if item is None:
                return
            index, items, done = item
            try:
                if items is not None and self._error is None:
                    self._write_shard(index, items)
            except BaseException as exc:  # reported to the caller by put/flush/wait_written
                self._error = exc
            finally:
                if done is not None:
                    with self._written:
                        self._flushes_done += 1
                        self._written.notify_all()
                    done.set()

    def _stage_file(self, key: str, payload: "Payload") -> None:
        """Write the staged tensor file of ``key`` (temporary name, then rename); on any
        failure leave nothing behind (the exporter then writes the file itself)."""
        write_file, ext = self._stage
        # text paths, the directory made once: this runs for every new payload, holding the
        # GIL the training thread waits for
        prefix = self._stage_prefix
        target = f"{prefix}{key}.{ext}"
        tmp = f"{prefix}.{key}.{ext}.tmp"

        def fill(path: str) -> bool:
            write_file(path, payload)
            os.chmod(path, FILE_MODE)
            return True

        try:
            if not self._stage_made:
                make_dirs(self._stage_dir)
                self._stage_made = True
            replace_from(tmp, target, fill)  # removes tmp on failure
            self._staged.append(target)
        except Exception:  # noqa: BLE001 - staging is an optimisation only
            self._stage_made = False  # made again next time (it may have been removed)

    def _write_shard(self, index: int, items: list) -> None:
        make_dirs(self._dir)
        target = self._dir / self.shard_name(index)
        tmp = target.with_name(f".{target.name}.tmp")
        head, pieces = _encode_shard(items)

        def fill(path: Path) -> bool:
            self._files.write(path, [head, *pieces])  # around the page cache where possible
            return True

        replace_from(tmp, target, fill)


def _kept(data: Union[bytes, bytearray, memoryview, "np.ndarray"]) -> Union[bytes, memoryview, "np.ndarray"]:
    """``data`` when nobody can change it any more (``bytes``; a contiguous byte-format
    memoryview of a ``bytes`` object, such as the page-aligned snapshots of
    ``msprobe._native.fused_stats.snapshot_at``, kept as a new view of the same bytes,
    not the caller's, which the caller may release; a read-only 1-D uint8 numpy array owning
    its memory, which its maker hands over); else a ``bytes`` copy."""
    if type(data) is bytes:
        return data
    if (type(data) is memoryview and type(data.obj) is bytes and data.format == "B" and data.ndim == 1
            and data.contiguous):
        return memoryview(data)  # a view of our own: the caller may release the one it passed
    if (type(data) is np.ndarray and data.base is None and not data.flags.writeable
            and data.dtype == np.uint8 and data.ndim == 1):
        return data
    return bytes(data)


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:  # moved into place by the exporter
            pass


class PayloadReader:
    """Reads payloads by reference from the shards under ``{dump_path}/.msprobe/payload``.

    Args:
        dump_path: the dump directory.
        verify: check every payload's bytes against its content key (one hash pass over
            the bytes). The live exporter reads shards its own process wrote moments
            before and passes False; ``msprobe export`` and readers of old dumps keep True.
        stage: ``(directory, extension)`` of the live session's staged tensor files
            (:attr:`PayloadWriter.staging`): :meth:`take_staged` looks for them there
            (None: never).
        before_read: called before a shard is opened (the live session passes
            :meth:`PayloadWriter.wait_written`: its last shard may still be being written).

    Attributes:
        unreadable: ``(ref, tensor name, reason)`` of the payloads the exporter could not
            read (the reader itself raises; the exporter records here what it skipped).

    Example: ``PayloadReader(dump).read("rank0.1.2.00000.safetensors:ab…")`` →
    ``Payload(data=b"…", dtype="torch.float32", shape=(2, 3))``.
    """

    def __init__(self, dump_path: Union[str, os.PathLike], *, verify: bool = True,
                 stage: Optional[tuple[Union[str, os.PathLike], str]] = None,
                 before_read: Optional[Callable[[], None]] = None) -> None:
        self._dir = payload_dir(dump_path)
        self._before_read = before_read
        self._verify = bool(verify)
        self._stage_dir = Path(stage[0]) if stage is not None else None
        self._stage_ext = stage[1] if stage is not None else None
        # "{stage directory}/" as text: take_staged runs once per tensor file of a live export
        self._stage_prefix = os.path.join(os.fspath(stage[0]), "") if stage is not None else ""
        self._moved: OrderedDict[str, str] = OrderedDict()  # key -> where take_staged put its file
        self._moved_at: dict[str, str] = {}  # and back: file -> key
        self._headers: dict[str, tuple[int, dict]] = {}
        #: ``(ref, tensor name, reason)`` of every payload a caller could not use (missing,
        #: truncated or corrupted shard), recorded by the exporter for its report
        self.unreadable: list[tuple[str, str, str]] = []

    def _header(self, shard: str) -> tuple[int, dict]:
        cached = self._headers.get(shard)
        if cached is None:
            if self._before_read is not None:
                self._before_read()
            if "/" in shard or "\\" in shard or shard.startswith("."):
                raise StoreError(f"payload shard: got {shard!r}; allowed: a shard file name")
            with open(self._dir / shard, "rb") as fh:
                head = fh.read(8)
                if len(head) != 8:
                    raise PayloadDamagedError(f"payload shard {shard!r} truncated: {len(head)} of 8 header-length bytes")
                (length,) = struct.unpack("<Q", head)
                text = fh.read(min(length, 1 << 30))
            try:
                header = json.loads(text)
                if not isinstance(header, dict):
                    raise ValueError(f"header is a JSON {type(header).__name__}, not an object")
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                raise PayloadDamagedError(f"payload shard {shard!r} has a damaged header: {exc}") from None
            cached = self._headers[shard] = (8 + length, header)
        return cached

    def take_staged(self, ref: str, target: Union[str, os.PathLike]) -> bool:
        """Move the staged tensor file of ``ref`` to ``target`` (atomic rename); False when
        there is none (no ``stage``, never staged, already moved, or the rename failed:
        the caller writes the file itself)."""
        if self._stage_ext is None:
            return False
        _, sep, key = ref.partition(":")
        if not sep or not key or "/" in key or "\\" in key or key.startswith("."):
            return False
        path = os.fspath(target)
        try:
            os.replace(f"{self._stage_prefix}{key}.{self._stage_ext}", path)
        except OSError:
            return False
        self.forget_file(path)  # the file there before (another payload's) is gone
        old = self._moved.pop(key, None)
        if old is not None and self._moved_at.get(old) == key:
            del self._moved_at[old]
        self._moved[key] = path
        self._moved_at[path] = key
        if len(self._moved) > _MOVED_KEEP:
            gone_key, gone_path = self._moved.popitem(last=False)
            if self._moved_at.get(gone_path) == gone_key:
                del self._moved_at[gone_path]
        return True

    def forget_file(self, target: Union[str, os.PathLike]) -> None:
        """Forget that ``target`` holds a payload's file: it is being replaced (a tensor file
        rewritten in its step, whose leaf was recorded again), and :meth:`earlier_file` must
        not offer it for the payload it held before."""
        path = os.fspath(target)
        key = self._moved_at.pop(path, None)
        if key is not None and self._moved.get(key) == path:
            del self._moved[key]

    def earlier_file(self, ref: str) -> Optional[str]:
        """The path of the file a recent :meth:`take_staged` of ``ref`` moved into place
        (the live exporter hard-links a later file of the same payload to it, in this step
        or a later one); None when there is none, and always without ``stage``. The file
        may have been removed since: the caller's link then fails and it falls back to
        the payload (not checked here: one ``stat`` per duplicate file of every step)."""
        if self._stage_ext is None:
            return None
        return self._moved.get(ref.partition(":")[2])

    def read(self, ref: str) -> Payload:
        """The payload of ``ref`` (``"{shard}:{key}"``).

        Raises:
            FileNotFoundError: the shard is missing (never written: the process died first).
            StoreError: a malformed reference.
            PayloadDamagedError: the shard is truncated or corrupted (with ``verify``, the
                bytes are checked against their content key), or the key is not in it.
        """
        shard, sep, key = ref.partition(":")
        if not sep or not key:
            raise StoreError(f"payload reference: got {ref!r}; allowed: 'SHARD:KEY'")
        start, header = self._header(shard)
        info = header.get(key)
        meta = header.get("__metadata__", {}).get(key)
        if info is None or meta is None:
            raise PayloadDamagedError(f"payload {key!r} not found in shard {shard!r}")
        try:
            dtype, _, shape_text = meta.partition("|")
            begin, end = (int(v) for v in info["data_offsets"])
            shape = tuple(int(v) for v in json.loads(shape_text))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise PayloadDamagedError(f"payload {key!r} in shard {shard!r}: damaged header entry ({exc})") from None
        data = bytearray(max(end - begin, 0))
        with open(self._dir / shard, "rb", buffering=0) as fh:
            fh.seek(start + begin)
            got = 0
            view = memoryview(data)
            while got < len(data):
                n = fh.readinto(view[got:])
                if not n:
                    break
                got += n
            view.release()
        if got != end - begin:
            raise PayloadDamagedError(f"payload {key!r} truncated in shard {shard!r}")
        if self._verify and not key_matches(key, data, dtype, shape):  # the key is the hash of the content
            raise PayloadDamagedError(f"payload {key!r} in shard {shard!r} is corrupted: its bytes do not match their key")
        return Payload(data=data, dtype=dtype, shape=shape)
