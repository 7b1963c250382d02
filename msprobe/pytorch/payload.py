"""Tensor bytes for the payload store and ``.pt`` files for the exporter (task ``tensor``).

* :func:`tensor_bytes` takes a snapshot of a tensor's values as C-order bytes (the tensor
  is copied to the host; conjugate and negative bits resolved), with its dtype string and
  shape, ready for :meth:`store.payload_writer.PayloadWriter.put`.
* :class:`PayloadCapture` is the recorder's capture callback: it snapshots a tensor into
  the payload store.
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
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from msprobe.pytorch.ptfile import save_values
from msprobe.pytorch.stats import OPAQUE_DTYPES, materialized, storage_holds
from store.payload_writer import Payload


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


class PayloadCapture:
    """Task ``tensor``: store a tensor's values as a payload; returns its reference.

    Args:
        put: ``put(data, dtype string, shape) -> reference or None``, ``data`` as
            :func:`tensor_bytes` makes it (``bytes``, or a read-only uint8 array) (the session's
            :meth:`msprobe.core.session.Session.put_payload`).

    Calling it with a tensor ``t`` returns ``put(*tensor_bytes(t))``, or None when ``t``'s
    values cannot be read (:meth:`snapshot`: the same with a copy made by the caller).
    Every call copies ``t``'s values, so a later in-place change of ``t`` does not reach
    the payload.
    """

    __slots__ = ("_put",)

    def __init__(self, put: Callable[[Union[bytes, np.ndarray], str, tuple], Optional[str]]) -> None:
        self._put = put

    def __call__(self, t: torch.Tensor) -> Optional[str]:
        snap = tensor_bytes(t)
        return None if snap is None else self._put(*snap)

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
                (``msprobe._native.fused_stats.snapshot_at``: the statistics)."""
        if take is None:
            return self(t), None
        data, extra = take()
        if data is None:
            return None, extra
        return self._put(data, str(t.dtype), tuple(t.shape)), extra


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


def write_pt(path: Path | str, payload: Payload) -> None:
    """Exporter callback: write the tensor of ``payload`` to ``path`` in ``torch.save``'s
    format (:func:`msprobe.pytorch.ptfile.save_values`; loads with
    ``torch.load(path, weights_only=True)``)."""
    save_values(path, torch_dtype(payload.dtype), tuple(payload.shape), payload.data)
