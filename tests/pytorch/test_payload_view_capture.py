"""PayloadCapture's view shortcut and tensors without memory.

* A dense view's reference is tied to the window's snapshot of its block by a memcmp made
  *before* the view is copied, so a write landing during the copy (another thread) is never
  remembered against the snapshot.
* A ZeroTensor (``torch._efficientzerotensor``, data_ptr 0) is stored as zeros and recorded
  twice does not make the window read address 0.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from msprobe.pytorch.payload import PayloadCapture, tensor_bytes

ROOT = Path(__file__).resolve().parents[2]


class Store:
    def __init__(self):
        self.by_ref = {}

    def put(self, data, dtype, shape):
        data = bytes(data)
        ref = hashlib.sha256(data + dtype.encode() + repr(tuple(shape)).encode()).hexdigest()[:16]
        self.by_ref[ref] = (data, dtype, tuple(shape))
        return ref


def _c_order(t):
    return np.ascontiguousarray(t.numpy()).tobytes()


def test_view_copied_while_its_block_changed_is_not_remembered_against_the_snapshot():
    store = Store()
    cap = PayloadCapture(store.put)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cap(x)                      # the window's snapshot of x's block
    v = x.t()

    def take():                 # another thread writes x while the view is being copied
        x.add_(100)
        return tensor_bytes(v)[0], None

    cap.snapshot(v, take)
    x.sub_(100)                 # ... and writes the old values back afterwards
    ref = cap(v)                # the block equals the snapshot again: v holds arange(12).t()
    assert store.by_ref[ref][0] == _c_order(v)


def test_zero_tensor_is_stored_as_zeros():
    z = torch._efficientzerotensor((3, 4))
    snap = tensor_bytes(z)
    assert snap is not None and bytes(snap[0]) == bytes(48) and snap[1:] == ("torch.float32", (3, 4))


def test_zero_tensor_captured_twice_does_not_crash():
    code = ("import torch\n"
            "from msprobe.pytorch.payload import PayloadCapture\n"
            "seen = []\n"
            "cap = PayloadCapture(lambda d, dt, s: seen.append(bytes(d)) or 'r%d' % len(seen))\n"
            "z = torch._efficientzerotensor((3, 4))\n"
            "for t in (z, z, z.t(), z.t()):\n"
            "    cap(t)\n"
            "assert all(d == bytes(48) for d in seen), seen\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])
