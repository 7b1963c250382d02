"""Tensor bytes for the payload store and ``.pt`` files for the exporter (task ``tensor``).

* :func:`tensor_bytes` takes a snapshot of a tensor's values as C-order bytes (the tensor
  is copied to the host; conjugate and negative bits resolved), with its dtype string and
  shape, ready for :meth:`store.payload_writer.PayloadWriter.put`.
* :func:`write_pt` is the exporter's callback: it rebuilds the tensor from those bytes
  and ``torch.save`` s it, so ``torch.load(path, weights_only=True)`` returns a tensor
  equal bit for bit to the recorded one, in its own dtype (bf16 stays bf16; spec 1.1).

Example: ``tensor_bytes(torch.tensor([1.0], dtype=torch.bfloat16))`` →
``(b"\\x80\\x3f", "torch.bfloat16", (1,))``.
"""
from __future__ import annotations

import ctypes

from pathlib import Path
from typing import Any, Optional

import torch

from store.payload_writer import Payload


def readable(t: torch.Tensor) -> bool:
    """True if ``t``'s values can be snapshotted (strided layout, not on the meta device)."""
    return t.layout == torch.strided and t.device.type != "meta"


def tensor_bytes(t: torch.Tensor) -> Optional[tuple[bytes, str, tuple[int, ...]]]:
    """``(bytes, dtype string, shape)`` of ``t``'s values, or None when they cannot be read
    (sparse, meta, quantized tensors).

    The bytes are a copy: later in-place changes of ``t`` do not affect them.
    """
    if not readable(t) or t.is_quantized:
        return None
    with torch.no_grad():
        x = t.detach()
        if x.is_conj():
            x = x.resolve_conj()
        if x.is_neg():
            x = x.resolve_neg()
        x = x.cpu().contiguous()
        if x.numel() == 0:
            data = b""
        else:  # ctypes copy, not Tensor.numpy(): that would pin t's storage (FSDP resizes storages)
            data = ctypes.string_at(x.data_ptr(), x.numel() * x.element_size())
    return data, str(t.dtype), tuple(t.shape)


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
    """The tensor stored in ``payload`` (a fresh CPU tensor)."""
    dtype = torch_dtype(payload.dtype)
    shape = tuple(payload.shape)
    if not payload.data:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(payload.data), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape).clone()


def write_pt(path: Path | str, payload: Payload) -> None:
    """Exporter callback: ``torch.save`` the tensor of ``payload`` to ``path``."""
    torch.save(from_payload(payload), path)

