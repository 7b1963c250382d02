"""Write one tensor as a ``.pt`` file in ``torch.save``'s zip format, faster (task ``tensor``).

``torch.save`` of a CPU tensor costs about twice the bytes it writes: its zip writer
computes the CRC-32 of the data with a slow byte-wise loop and copies the data through
its own buffers. :func:`save_tensor` writes the same archive layout itself: the pickle
``data.pkl`` comes from Python's pickler with the persistent ids ``torch.save`` uses (so
the rebuild function, storage type and metadata are whatever this torch version pickles
for the tensor), CRC-32 of the data from :func:`msprobe.core.checksum.crc32` (ISA-L where
installed, about 4x zlib), and the data goes to the file in one
``write`` from the caller's buffer (no copy); from 1 MiB of data on, around the page
cache (``O_DIRECT``, :func:`store.direct_io.thread_writer`), from the caller's buffer too
where it starts on a page (the data record then starts on a page of the file).

Archive (ZIP, stored, no compression; ZIP64 records when the data or an offset passes
4 GiB): ``archive/data.pkl``, ``archive/.format_version`` (``1``),
``archive/.storage_alignment`` (``64``), ``archive/byteorder``, ``archive/data/0`` (its
first byte at a multiple of 64 in the file, as ``torch.load(mmap=True)`` needs; of 4096
from 1 MiB of data: :func:`_data_alignment`), and
``archive/version`` (``3``). ``torch.load(path, weights_only=True)`` returns the tensor
with its dtype, shape, strides and values (spec 1.1: bf16 stays bf16; section 9: exported
files load with ``weights_only=True``).

Example::

    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    save_tensor("/tmp/a.pt", t)
    assert torch.equal(torch.load("/tmp/a.pt", weights_only=True), t)
"""
from __future__ import annotations

import ctypes
import functools
import io
import math
import os
import pickle
import struct
import sys
import zlib
from pathlib import Path
from typing import Optional, Union

import torch

from msprobe.core.checksum import crc32
from store.direct_io import ALIGN as PAGE, MIN_DIRECT_BYTES, thread_writer

__all__ = ["save_tensor", "save_values"]

_ALIGN = 64
_PREFIX = "archive/"
_FILE_FORMAT_VERSION = b"3\n"  # torch's kProducedFileFormatVersion for this layout
_U32 = 0xFFFFFFFF
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_EOCD64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR = struct.Struct("<IIQI")
_CRC = struct.Struct("<I")
_LOCAL_CRC_AT = 14    # byte offset of the CRC-32 in a local file header (_LOCAL)
_CENTRAL_CRC_AT = 16  # ... in a central directory header (_CENTRAL)


class _Pickler(pickle.Pickler):
    """Pickles a tensor as ``torch.save`` does: its storage becomes persistent id
    ``("storage", storage type, "0", "cpu", numel)``."""

    def persistent_id(self, obj):  # noqa: D401 - pickle protocol hook
        if isinstance(obj, torch.storage.TypedStorage):
            return ("storage", getattr(torch, obj._pickle_storage_type()), "0",
                    "cpu", obj._size())
        if torch.is_storage(obj):
            return ("storage", torch.UntypedStorage, "0", "cpu", obj.nbytes())
        return None


def _pickle(t: torch.Tensor) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(t)
    return out.getvalue()


def _local_header(name: bytes, crc: int, size: int, offset: int, align: int, zip64: bool) -> bytes:
    """Local file header (with padding so that the data starts at a multiple of ``align``
    bytes when ``align`` is not 0)."""
    extra = b""
    if zip64:
        extra = struct.pack("<HHQQ", 0x0001, 16, size, size)
    if align:
        pad = -(offset + _LOCAL.size + len(name) + len(extra) + 4) % align
        extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # "FB": torch's padding field id
    field = _U32 if zip64 else size
    return _LOCAL.pack(0x04034B50, 45 if zip64 else 20, 0, 0, 0, 0, crc, field, field,
                       len(name), len(extra)) + name + extra


def _central_header(name: bytes, crc: int, size: int, offset: int, zip64: bool = False) -> bytes:
    """Central directory header; sizes and offset that do not fit 32 bits (or all sizes,
    with ``zip64``) go to a ZIP64 extra field."""
    extra_fields = []
    size_field = size
    offset_field = offset
    if zip64 or size >= _U32:
        extra_fields += [size, size]
        size_field = _U32
    if offset >= _U32:
        extra_fields.append(offset)
        offset_field = _U32
    extra = b""
    if extra_fields:
        extra = struct.pack(f"<HH{len(extra_fields)}Q", 0x0001, 8 * len(extra_fields), *extra_fields)
    needed = 45 if extra else 20
    return _CENTRAL.pack(0x02014B50, 45, needed, 0, 0, 0, 0, crc, size_field, size_field, len(name),
                         len(extra), 0, 0, 0, 0, offset_field) + name + extra


def _records_before(t: torch.Tensor) -> list[tuple[str, bytes]]:
    return [
        ("data.pkl", _pickle(t)),
        (".format_version", b"1"),
        (".storage_alignment", str(_ALIGN).encode()),
        ("byteorder", sys.byteorder.encode()),
    ]


def _holding(t: torch.Tensor, data: Optional[Union[bytes, bytearray, memoryview]]) -> torch.Tensor:
    """``t``, or with ``data`` a new CPU tensor of ``t``'s dtype and shape holding ``data``
    (for ``torch.save``: ``t`` may be a placeholder whose memory is not the values)."""
    if data is None:
        return t
    raw = bytearray(memoryview(data).cast("B"))
    if len(raw) != t.numel() * t.element_size():
        raise ValueError(f"data: got {len(raw)} bytes; allowed: the tensor's {t.numel() * t.element_size()} bytes")
    if not raw:
        return torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu")
    return torch.frombuffer(raw, dtype=torch.uint8).view(t.dtype).reshape(tuple(t.shape))


def save_tensor(path: Union[str, os.PathLike], t: torch.Tensor, data: Optional[Union[bytes, bytearray, memoryview]] = None,
                *, force_zip64: bool = False) -> None:
    """Write ``t`` to ``path`` in ``torch.save``'s format (see the module docstring).

    Args:
        path: the file to create or truncate (mode 0o640 for a new file).
        t: the tensor; the fast writer takes a contiguous CPU tensor with storage offset 0
            whose storage is exactly its values (any other is written with ``torch.save``).
        data: the values' C-order bytes if the caller holds them: then only ``t``'s dtype
            and shape are used (``t`` may be an uninitialised placeholder), also on the
            ``torch.save`` fallback.
        force_zip64: write ZIP64 records even for a small file (tests).

    Raises:
        OSError: the file could not be written.
        ValueError: ``data`` is not ``t``'s size in bytes.
    """
    nbytes = t.numel() * t.element_size()
    if (t.device.type != "cpu" or t.layout != torch.strided or not t.is_contiguous() or t.storage_offset() != 0
            or t.untyped_storage().nbytes() != nbytes or t.is_conj() or t.is_neg() or t.is_quantized
            or sys.byteorder != "little"):
        torch.save(_holding(t, data), path)
        return
    try:
        records = _records_before(t)
    except (pickle.PicklingError, AttributeError, KeyError, TypeError):  # a storage type this writer does not know
        torch.save(_holding(t, data), path)
        return
    if data is None:
        payload = memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B") if nbytes else memoryview(b"")
    else:
        payload = memoryview(data).cast("B")
        if len(payload) != nbytes:
            raise ValueError(f"data: got {len(payload)} bytes; allowed: the tensor's {nbytes} bytes")
    _write_archive(path, _template(records, nbytes, force_zip64), payload)


def save_values(path: Union[str, os.PathLike], dtype: torch.dtype, shape: tuple[int, ...],
                data: Union[bytes, bytearray, memoryview]) -> None:
    """Write the tensor of ``dtype`` and ``shape`` whose C-order bytes are ``data`` to
    ``path`` (what :func:`save_tensor` writes for a new tensor holding ``data``), with the
    pickle and the zip records around the data made once per ``(dtype, shape)``
    (:func:`_values_template`; the pickle alone took about 0.2 ms a file, ~200 files per
    step of the encoder benchmark's tensor task, on the payload writer thread, which holds
    the GIL the training thread waits for while it runs Python).

    Raises:
        OSError: the file could not be written.
        ValueError: ``data`` is not ``numel * element size`` bytes.
    """
    shape = tuple(int(d) for d in shape)
    template = None
    if sys.byteorder == "little":
        try:
            template = _values_template(dtype, shape)
        except _UNPICKLABLE:
            pass  # torch.save's fallback below; not cached: a later file of this dtype and shape tries again
    if template is None:
        save_tensor(path, torch.empty(shape, dtype=dtype, device="cpu"), data)
        return
    payload = memoryview(data).cast("B")
    nbytes = math.prod(shape) * dtype.itemsize
    if len(payload) != nbytes:
        raise ValueError(f"data: got {len(payload)} bytes; allowed: the tensor's {nbytes} bytes")
    _write_archive(path, template, payload)


@functools.lru_cache(maxsize=1024)
def _values_template(dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[bytes, bytes, int, int]:
    """:func:`_template` of a new contiguous tensor of ``dtype`` and ``shape`` (its pickle
    depends on nothing else, so it is made once: only the data's CRC-32 differs between two
    such files).

    Raises:
        pickle.PicklingError, AttributeError, KeyError, TypeError (:data:`_UNPICKLABLE`):
            this writer cannot pickle it here (say under a fake-tensor mode);
            :func:`save_values` then takes :func:`save_tensor`'s fallback. A failure is not
            cached (``lru_cache`` keeps results only), so a later call tries again.
    """
    # on the CPU whatever the calling thread's default device (torch.set_default_device)
    records = _records_before(torch.empty(shape, dtype=dtype, device="cpu"))
    return _template(records, math.prod(shape) * dtype.itemsize, False)


#: what making a template may raise where the tensor cannot be pickled here
_UNPICKLABLE = (pickle.PicklingError, AttributeError, KeyError, TypeError)


def _data_alignment(nbytes: int) -> int:
    """Where the data record of ``nbytes`` bytes starts: at a multiple of 64 (torch.save's
    ``.storage_alignment``), and of the page size (:data:`store.direct_io.ALIGN`, itself a
    multiple of 64) for data written around the page cache, so that a page-aligned payload
    goes to the device without a copy (:class:`store.direct_io.DirectFileWriter`). At most
    4 KiB of padding per file of 1 MiB of data or more."""
    return PAGE if nbytes >= MIN_DIRECT_BYTES else _ALIGN


def _template(records, nbytes: int, force_zip64: bool) -> tuple[bytes, bytes, int, int]:
    """The archive of the module docstring around ``nbytes`` of data, with the data's CRC-32
    left 0: ``(head, tail, head_crc_at, tail_crc_at)``; ``head`` holds ``records`` (name,
    bytes) and the data's local header, ``tail`` the ``version`` record, the central
    directory and its end; the data's CRC goes at ``head[head_crc_at:+4]`` (its local
    header) and ``tail[tail_crc_at:+4]`` (its central header), little-endian."""
    head = bytearray()
    central = bytearray()
    for rec, blob in records:
        name = (_PREFIX + rec).encode()
        crc = zlib.crc32(blob)
        central += _central_header(name, crc, len(blob), len(head))
        head += _local_header(name, crc, len(blob), len(head), 0, False)
        head += blob
    name = (_PREFIX + "data/0").encode()
    big = force_zip64 or nbytes >= _U32
    central_crc_at = len(central) + _CENTRAL_CRC_AT
    central += _central_header(name, 0, nbytes, len(head), big)
    head_crc_at = len(head) + _LOCAL_CRC_AT
    head += _local_header(name, 0, nbytes, len(head), _data_alignment(nbytes), big)
    offset = len(head) + nbytes
    tail = bytearray()
    name = (_PREFIX + "version").encode()
    crc = zlib.crc32(_FILE_FORMAT_VERSION)
    central += _central_header(name, crc, len(_FILE_FORMAT_VERSION), offset)
    tail += _local_header(name, crc, len(_FILE_FORMAT_VERSION), offset, 0, False) + _FILE_FORMAT_VERSION
    cd_offset = offset + len(tail)
    tail_crc_at = len(tail) + central_crc_at
    count = len(records) + 2
    tail += central
    if big or cd_offset >= _U32:
        eocd64_offset = cd_offset + len(central)
        tail += _EOCD64.pack(0x06064B50, _EOCD64.size - 12, 45, 45, 0, 0, count, count, len(central), cd_offset)
        tail += _LOCATOR.pack(0x07064B50, 0, eocd64_offset, 1)
        tail += _EOCD.pack(0x06054B50, 0, 0, count, count, len(central), min(cd_offset, _U32), 0)
    else:
        tail += _EOCD.pack(0x06054B50, 0, 0, count, count, len(central), cd_offset, 0)
    return bytes(head), bytes(tail), head_crc_at, tail_crc_at


def _write_archive(path: Union[str, os.PathLike], template: tuple[bytes, bytes, int, int], payload: memoryview) -> None:
    """Write :func:`_template`'s archive with ``payload`` (the storage bytes) as ``data/0``
    and its CRC-32 filled in."""
    head_t, tail_t, head_crc_at, tail_crc_at = template
    crc = crc32(payload)  # ISA-L where installed: the one pass over the data here
    head, tail = bytearray(head_t), bytearray(tail_t)
    _CRC.pack_into(head, head_crc_at, crc)
    _CRC.pack_into(tail, tail_crc_at, crc)
    if len(payload) >= MIN_DIRECT_BYTES:  # around the page cache (see store.direct_io.thread_writer)
        thread_writer().write(path, (head, payload, tail))
        return
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        for piece in (memoryview(head), payload, memoryview(tail)):
            while len(piece):
                piece = piece[os.write(fd, piece):]
    finally:
        os.close(fd)
