"""numpy arrays in the payload store and ``.npy`` tensor files (task ``tensor``, MindSpore).

The MindSpore adapter stores each tensor's host copy (``Tensor.asnumpy()``) through
:meth:`msprobe.core.session.Session.put_payload` at record time, and the exporter (live
at ``stop()``/``step()``, and ``msprobe export``) writes the ``.npy`` files from the
payloads with :func:`write_npy`, under short names plus ``mapping.csv`` when a name is
too long (:mod:`store.tensor_names`). Live and offline files are byte-identical.

* :func:`array_bytes` → ``(C-order bytes, dtype string, shape)``. The dtype string is
  numpy's name (``"float32"``, ``"bool"``, ``"complex64"``); ``bfloat16`` (an
  extension dtype of ``asnumpy()``) is kept as its 2-byte values under ``"bfloat16"``;
  any other dtype numpy's ``.npy`` format cannot describe is converted to float32 first.
* :func:`array_from_payload` rebuilds the array that goes to the file: bfloat16 widened
  to float32 (exact: the bf16 bits are the high half of the float32 bits; spec 1.1).
* :func:`write_npy` is the exporter callback (``np.save``, ``allow_pickle=False``).

Example: ``array_bytes(np.array([1.0], np.float32))`` → ``(b"\\x00\\x00\\x80?", "float32", (1,))``.

Imports numpy only (no deep-learning framework), so ``msprobe export`` of a MindSpore
dump works where MindSpore is not installed.
"""
from __future__ import annotations

import io
import os
from typing import Union

import numpy as np
from numpy.lib import format as npformat

from store.direct_io import MIN_DIRECT_BYTES, thread_writer
from store.payload_writer import Payload

__all__ = ["BF16", "array_bytes", "array_from_payload", "write_npy"]

#: payload dtype string of bfloat16 values (2 bytes each).
BF16 = "bfloat16"


def _plain(dtype: np.dtype) -> bool:
    """True for dtypes the ``.npy`` format describes (float, int, uint, bool, complex)."""
    return dtype.kind in "fiubc" or dtype == np.bool_


def array_bytes(a: np.ndarray) -> tuple[bytes, str, tuple[int, ...]]:
    """``(bytes, dtype string, shape)`` of ``a``, a copy (later changes of ``a`` do not
    affect it).

    Args:
        a: any numpy array (from ``Tensor.asnumpy()`` or a numpy argument).
    Returns:
        C-order bytes; numpy's dtype name, ``"bfloat16"`` for bf16, ``"float32"`` for
        other extension dtypes (converted); the shape as ints.
    """
    if a.dtype.name == BF16 and a.dtype.itemsize == 2:
        data = a.view(np.uint16).tobytes(order="C")
        return data, BF16, tuple(int(d) for d in a.shape)
    if not _plain(a.dtype):
        a = a.astype(np.float32)
    # tobytes, not ascontiguousarray: that turns a 0-dim array into shape (1,)
    return a.tobytes(order="C"), a.dtype.name, tuple(int(d) for d in a.shape)


def array_from_payload(payload: Payload) -> np.ndarray:
    """The array written to the ``.npy`` file of ``payload`` (bfloat16 as float32).

    Raises:
        ValueError: the dtype string is not a numpy dtype, or the byte count does not
            match dtype and shape.
    """
    shape = tuple(int(d) for d in payload.shape)
    if payload.dtype == BF16:
        bits = np.frombuffer(payload.data, dtype="<u2").astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).reshape(shape)
    try:
        dtype = np.dtype(payload.dtype)
    except TypeError as exc:
        raise ValueError(f"dtype: got {payload.dtype!r}; allowed: a numpy dtype name such as 'float32'") from exc
    if not _plain(dtype):
        raise ValueError(f"dtype: got {payload.dtype!r}; allowed: float, int, uint, bool, complex or bfloat16")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(payload.data) != count * dtype.itemsize:
        raise ValueError(f"payload: {len(payload.data)} bytes; expected {count * dtype.itemsize} "
                         f"for {payload.dtype} {list(shape)}")
    return np.frombuffer(payload.data, dtype=dtype).reshape(shape)


def write_npy(path: Union[str, os.PathLike], payload: Payload) -> None:
    """Exporter callback: write the array of ``payload`` to exactly ``path`` as ``np.save``
    does (no ``.npy`` suffix added; the exporter writes a temporary name, then renames).
    From :data:`store.direct_io.MIN_DIRECT_BYTES` bytes of data on, the header
    (``numpy.lib.format.write_array_header_1_0``, what ``np.save`` writes for such an
    array) and the data go to the file around the page cache
    (:func:`store.direct_io.thread_writer`); the bytes are ``np.save``'s either way."""
    array = array_from_payload(payload)
    header = _npy_header(array) if array.nbytes >= MIN_DIRECT_BYTES and not array.dtype.hasobject else None
    if header is None:
        with open(path, "wb") as f:
            np.save(f, array, allow_pickle=False)
        return
    thread_writer().write(path, (header, np.ascontiguousarray(array).reshape(-1).view(np.uint8)))


def _npy_header(array: np.ndarray) -> "bytes | None":
    """The ``.npy`` header ``np.save`` writes for ``array`` in format 1.0; None where that
    format cannot hold it (a header too long: a huge shape, for which ``np.save`` picks 2.0)."""
    out = io.BytesIO()
    try:
        npformat.write_array_header_1_0(out, npformat.header_data_from_array_1_0(array))
    except ValueError:
        return None
    return out.getvalue()
