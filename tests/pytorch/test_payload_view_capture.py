"""PayloadCapture of tensors without memory: a ZeroTensor (``torch._efficientzerotensor``,
data_ptr 0) and its views are stored as zeros."""
from __future__ import annotations

import torch

from msprobe.pytorch.payload import PayloadCapture, tensor_bytes


def test_zero_tensor_is_stored_as_zeros():
    z = torch._efficientzerotensor((3, 4))
    snap = tensor_bytes(z)
    assert snap is not None and bytes(snap[0]) == bytes(48) and snap[1:] == ("torch.float32", (3, 4))


def test_zero_tensor_and_its_view_captured_twice_are_stored_as_zeros():
    seen = []
    cap = PayloadCapture(lambda d, dt, s: seen.append((bytes(d), dt, tuple(s))) or "r%d" % len(seen))
    z = torch._efficientzerotensor((3, 4))
    refs = [cap(t) for t in (z, z, z.t(), z.t())]
    assert refs == ["r1", "r2", "r3", "r4"]
    assert seen == [(bytes(48), "torch.float32", (3, 4))] * 2 + [(bytes(48), "torch.float32", (4, 3))] * 2
