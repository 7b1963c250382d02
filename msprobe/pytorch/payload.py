"""Tensor bytes for the payload store and ``.pt`` files for the exporter (task ``tensor``).

* :func:`tensor_bytes` takes a snapshot of a tensor's values as C-order bytes (the tensor
  is copied to the host; conjugate and negative bits resolved), with its dtype string and
  shape, ready for :meth:`store.payload_writer.PayloadWriter.put`.
* :class:`PayloadCapture` is the recorder's capture callback: it snapshots a tensor into
  the payload store, and skips the copy and the content hash when the tensor's memory
  still holds the bytes of a snapshot taken moments before (one op's output is the next
  op's input: about 60% of the bytes of a transformer step), proven by comparing the
  memory with those bytes.
* :func:`write_pt` is the exporter's callback: it rebuilds the tensor from those bytes
  and writes it in ``torch.save``'s format, so ``torch.load(path, weights_only=True)`` returns a tensor
  equal bit for bit to the recorded one, in its own dtype (bf16 stays bf16; spec 1.1).

Example: ``tensor_bytes(torch.tensor([1.0], dtype=torch.bfloat16))`` →
``(b"\\x80\\x3f", "torch.bfloat16", (1,))``.
"""
from __future__ import annotations

import ctypes
import functools
import io
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from msprobe.pytorch.ptfile import save_values
from msprobe.pytorch.stats import OPAQUE_DTYPES, is_dense, materialized, storage_holds
from store.direct_io import address_of
from store.payload_writer import Payload


#: dense views whose payload reference :class:`PayloadCapture` remembers (a few per layer)
VIEWS_LIMIT = 256


def readable(t: torch.Tensor) -> bool:
    """True if ``t``'s values can be snapshotted: strided layout, not on the meta device,
    and every element inside its storage (:func:`~msprobe.pytorch.stats.storage_holds`:
    not a view of a storage freed or shrunk with ``resize_``, whose data pointer is not 0;
    reading it would crash the process). A tensor without a storage to ask (a subclass)
    counts as readable."""
    if not (t.layout == torch.strided and t.device.type != "meta"):
        return False
    return not t.numel() or storage_holds(t) is not False


def tensor_bytes(t: torch.Tensor) -> Optional[tuple[Union[bytes, np.ndarray], str, tuple[int, ...]]]:
    """``(data, dtype string, shape)`` of ``t``'s values, or None when they cannot be read
    (sparse, meta, quantized tensors) or not written to a ``.pt`` file (a dtype of
    :data:`~msprobe.pytorch.stats.OPAQUE_DTYPES` that ``torch.save`` rejects, such as
    ``torch.uint4`` in PyTorch 2.13, or one of them in a non-contiguous view: PyTorch has no
    copy kernel for them).

    ``data`` is a copy of the C-order bytes (later in-place changes of ``t`` do not affect
    it): ``bytes``, or for a non-contiguous ``t`` (a transposed view) a read-only 1-D uint8
    numpy array that torch's copy filled in C order directly, one copy where
    ``contiguous()`` and then ``bytes`` were two (~0.3 against 0.5-1.3 ms per MiB here);
    :meth:`store.payload_writer.PayloadWriter.put` keeps such an array without copying it.
    """
    if not readable(t) or t.is_quantized:
        return None
    if t.dtype in OPAQUE_DTYPES and not (t.is_contiguous() and savable(t.dtype)):
        return None
    with torch.no_grad():
        x = t.detach()
        if x.is_conj():
            x = x.resolve_conj()
        if x.is_neg():
            x = x.resolve_neg()
        x = materialized(x.cpu())  # a ZeroTensor has no memory (data_ptr 0): its zeros
        nbytes = x.numel() * x.element_size()
        if nbytes == 0:
            data = b""
        elif x.is_contiguous():  # ctypes copy, not Tensor.numpy(): that would pin t's storage (FSDP resizes storages)
            data = ctypes.string_at(x.data_ptr(), nbytes)
        else:
            data = np.empty(nbytes, dtype=np.uint8)
            torch.from_numpy(data).view(x.dtype).view(x.shape).copy_(x)
            data.flags.writeable = False  # handed over: nobody changes it from here on
    return data, str(t.dtype), tuple(t.shape)


@functools.lru_cache(maxsize=None)
def savable(dtype: torch.dtype) -> bool:
    """Whether ``torch.save`` writes a tensor of ``dtype`` (tried once per dtype on an
    empty tensor; PyTorch 2.13 rejects ``torch.uint1``-``uint7`` and ``int1``-``int7``)."""
    try:
        torch.save(torch.empty(0, dtype=dtype), io.BytesIO())
    except Exception:  # noqa: BLE001 - any refusal means: no file for this dtype
        return False
    return True


def _libc_memcmp(second: type) -> Optional[Callable[..., int]]:
    """The C library's ``memcmp`` (pointer, ``second``, length), or None where it cannot be
    found. ``second``: ``ctypes.c_char_p`` (a ``bytes`` object) or ``ctypes.c_void_p``
    (an address)."""
    try:
        memcmp = ctypes.CDLL(None)["memcmp"]  # a function object of its own: argtypes differ
    except Exception:  # no process-wide C library handle (Windows)
        return None
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = (ctypes.c_void_p, second, ctypes.c_size_t)
    return memcmp


_MEMCMP = _libc_memcmp(ctypes.c_char_p)
_MEMCMP_AT = _libc_memcmp(ctypes.c_void_p)


def _same_bytes(address: int, data: Union[bytes, memoryview]) -> bool:
    """True if the ``len(data)`` bytes of memory at ``address`` equal ``data`` (``bytes``,
    or a byte memoryview such as the page-aligned snapshots of
    ``msprobe._native.fused_stats.snapshot_at``)."""
    if type(data) is bytes:
        if _MEMCMP is not None:
            return _MEMCMP(address, data, len(data)) == 0
    elif _MEMCMP_AT is not None:
        return _MEMCMP_AT(address, address_of(data), len(data)) == 0
    return ctypes.string_at(address, len(data)) == data


class PayloadCapture:
    """Task ``tensor``: store a tensor's values as a payload; returns its reference.

    Args:
        put: ``put(data, dtype string, shape) -> reference or None``, ``data`` as
            :func:`tensor_bytes` makes it (``bytes``, or a read-only uint8 array) (the session's
            :meth:`msprobe.core.session.Session.put_payload`).
        window_bytes: bytes of recent snapshots kept to recognise a tensor whose memory
            still holds them (unit: bytes; 0 turns the shortcut off). Must be >= 0.

    Calling it with a tensor ``t`` returns ``put(*tensor_bytes(t))``, or None when ``t``'s
    values cannot be read (:meth:`snapshot`: the same with a copy made by the caller). Shortcut: for a contiguous CPU tensor whose address, byte size,
    dtype and shape match a snapshot still in the window, the memory is compared with that
    snapshot's bytes (``memcmp``); when equal, the earlier reference is returned without a
    copy and without hashing: the payload store is content-addressed, so the store itself
    would have returned that reference for these bytes. Any difference (an in-place change,
    freed memory reused) takes the normal path. The same for a dense non-contiguous view
    (``x.transpose(0, 1)``, as ``nn.MultiheadAttention`` makes of a batch-first input and
    then passes as query, key and value) recorded again: its C-order bytes are a fixed
    permutation of its memory block, so when that block still equals the window's
    memory-order snapshot of it (the contiguous tensor recorded before, ``memcmp``) and the
    view's earlier reference was taken while the block held that very snapshot, the
    reference is returned without the transposing copy and the hash. :meth:`clear` empties
    the window (the recorder calls it at every flush point, so references never outlive a
    step's store).

    Raises:
        ValueError: ``window_bytes`` < 0.
    """

    __slots__ = ("_put", "_window", "_recent", "_held", "_lock", "_blocks", "_views", "_serial", "hits",
                 "hit_bytes")

    def __init__(self, put: Callable[[Union[bytes, np.ndarray], str, tuple], Optional[str]], *,
                 window_bytes: int = 32 << 20) -> None:
        if int(window_bytes) < 0:
            raise ValueError(f"window_bytes: got {window_bytes!r}; allowed: an int >= 0")
        self._put = put
        self._window = int(window_bytes)
        # (address, bytes, dtype, shape) of a contiguous snapshot -> (reference, its bytes, serial)
        self._recent: OrderedDict[tuple, tuple[str, bytes, int]] = OrderedDict()
        self._held = 0
        self._blocks: dict[tuple, tuple] = {}  # (address, bytes) -> the newest _recent key over that memory
        # (address, bytes, dtype, shape, strides) of a dense view -> (reference, _recent key of its
        # block's snapshot, that snapshot's serial) (at most VIEWS_LIMIT, oldest dropped first)
        self._views: OrderedDict[tuple, tuple[str, tuple, int]] = OrderedDict()
        self._serial = 0
        self._lock = threading.Lock()  # autograd may record from its own threads
        self.hits = 0       #: snapshots skipped because the memory held known bytes
        self.hit_bytes = 0  #: bytes neither copied nor hashed thanks to that (unit: bytes)

    def clear(self) -> None:
        """Forget every recent snapshot."""
        with self._lock:
            self._recent.clear()
            self._blocks.clear()
            self._views.clear()
            self._held = 0

    def __call__(self, t: torch.Tensor) -> Optional[str]:
        if not readable(t):  # before the window's comparison reads the memory too
            return None
        return self.snapshot(t)[0]

    def snapshot(self, t: torch.Tensor, take: Optional[Callable[[], tuple[bytes, Any]]] = None
                 ) -> tuple[Optional[str], Any]:
        """``(reference or None, extra)``: what calling the capture with ``t`` returns, and
        ``take``'s second result.

        Args:
            t: the tensor to store.
            take: None (the snapshot is :func:`tensor_bytes`' copy; ``extra`` is None), or
                ``take() -> (C-order bytes of t, extra)`` (bytes or :func:`tensor_bytes`'
                read-only array; None: ``t`` cannot be copied) for a CPU tensor whose copy
                comes with something computed in the same pass over its memory
                (``msprobe._native.fused_stats.snapshot_at``: the statistics). ``take`` is
                not called, and ``extra`` is None, when the window shortcut finds ``t``'s
                bytes (no copy is made then)."""
        key = view = None
        if (self._window and t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized
                and not t.is_conj() and not t.is_neg()):
            nbytes = t.numel() * t.element_size()
            if 0 < nbytes <= self._window:
                if t.is_contiguous():
                    # address 0: a ZeroTensor, without memory to compare (nor to remember)
                    key = (t.data_ptr(), nbytes, t.dtype, tuple(t.shape))
                    key = key if key[0] else None
                    known = self._recent.get(key) if key is not None else None
                    if known is not None and _same_bytes(key[0], known[1]):
                        return self._hit(known[0], nbytes), None
                elif self._blocks and is_dense(t):
                    view, ref = self._known_view(t, nbytes)
                    if ref is not None:
                        return self._hit(ref, nbytes), None
        extra = None
        if take is None:
            snap = tensor_bytes(t)
            if snap is None:
                return None, None
        else:
            data, extra = take()
            if data is None:
                return None, extra
            snap = (data, str(t.dtype), tuple(t.shape))
        if view is not None and not self._block_unchanged(view):
            view = None  # the block changed while t was copied (another thread): the copy proves nothing
        ref = self._put(*snap)
        if ref is not None and key is not None:
            self._remember(key, ref, snap[0])
        elif ref is not None and view is not None:
            with self._lock:
                self._views.pop(view[0], None)
                self._views[view[0]] = (ref, view[1], view[2])
                while len(self._views) > VIEWS_LIMIT:
                    self._views.popitem(last=False)
        return ref, extra

    def _hit(self, ref: str, nbytes: int) -> str:
        with self._lock:
            self.hits += 1
            self.hit_bytes += nbytes
        return ref

    def _remember(self, key: tuple, ref: str, data: bytes) -> None:
        """Keep the snapshot ``data`` of the contiguous tensor ``key`` in the window."""
        with self._lock:
            old = self._recent.pop(key, None)
            if old is not None:
                self._held -= len(old[1])
            self._serial += 1
            self._recent[key] = (ref, data, self._serial)
            self._blocks[key[:2]] = key
            self._held += len(data)
            while self._held > self._window and self._recent:
                gone, (_, data, _) = self._recent.popitem(last=False)
                self._held -= len(data)
                if self._blocks.get(gone[:2]) == gone:
                    del self._blocks[gone[:2]]

    def _block_unchanged(self, view: tuple) -> bool:
        """True if the memory block of ``view`` (what :meth:`_known_view` returned) still
        holds the window's snapshot it was compared with before the copy."""
        block = self._recent.get(view[1])
        return block is not None and block[2] == view[2] and _same_bytes(view[0][0], block[1])

    def _known_view(self, t: torch.Tensor, nbytes: int) -> tuple[Optional[tuple], Optional[str]]:
        """For a dense non-contiguous ``t`` of ``nbytes`` bytes: ``(view, reference)``.
        ``reference``: the one taken for the same view while its memory block held the
        window's snapshot of that block, which it still holds (else None). ``view``: what
        :meth:`snapshot` remembers with a new reference for ``t`` (its key, the block
        snapshot's key and serial), when the block holds that snapshot now (else None)."""
        address = t.data_ptr()
        if not address:  # a ZeroTensor: no memory
            return None, None
        block_key = self._blocks.get((address, nbytes))
        block = self._recent.get(block_key) if block_key is not None else None
        if block is None or not _same_bytes(address, block[1]):
            return None, None
        view_key = (address, nbytes, t.dtype, tuple(t.shape), t.stride())
        known = self._views.get(view_key)
        if known is not None and known[1] == block_key and known[2] == block[2]:
            return None, known[0]
        return (view_key, block_key, block[2]), None


def torch_dtype(name: str) -> torch.dtype:
    """``"torch.bfloat16"`` → ``torch.bfloat16``.

    Raises:
        ValueError: ``name`` is not a torch dtype.
    """
    attr = name[len("torch."):] if name.startswith("torch.") else name
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype: got {name!r}; allowed: a torch dtype such as 'torch.float32'")
    return dtype


def from_payload(payload: Payload) -> torch.Tensor:
    """The tensor stored in ``payload`` (a CPU tensor owning its storage).

    A ``bytearray`` payload (what :meth:`store.payload_writer.PayloadReader.read` returns)
    is wrapped without a copy and belongs to the tensor afterwards; ``bytes`` (or the
    read-only uint8 array of :func:`tensor_bytes`) are copied once."""
    dtype = torch_dtype(payload.dtype)
    shape = tuple(payload.shape)
    if len(payload.data) == 0:  # not ``not data``: an array has no truth value
        return torch.empty(shape, dtype=dtype)
    buffer = payload.data if isinstance(payload.data, bytearray) else bytearray(payload.data)
    flat = torch.frombuffer(buffer, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def write_pt(path: Path | str, payload: Payload) -> None:
    """Exporter callback: write the tensor of ``payload`` to ``path`` in ``torch.save``'s
    format (:func:`msprobe.pytorch.ptfile.save_values`; loads with
    ``torch.load(path, weights_only=True)``)."""
    save_values(path, torch_dtype(payload.dtype), tuple(payload.shape), payload.data)
