"""PayloadCapture (task tensor): every call stores a copy of the tensor's values, so the
stored bytes equal the tensor's values at capture time (an in-place change afterwards does
not reach them), with the tensor's own dtype and shape."""
from __future__ import annotations

import ctypes
import hashlib

import numpy as np
import pytest
import torch

from msprobe.pytorch.payload import PayloadCapture, tensor_bytes
from store.payload_writer import Payload, PayloadReader, PayloadWriter


def _tensor(payload: Payload) -> torch.Tensor:
    """The tensor whose C-order bytes, dtype and shape ``payload`` holds (a copy)."""
    dtype = getattr(torch, payload.dtype[len("torch."):])
    flat = torch.frombuffer(bytearray(bytes(payload.data)), dtype=torch.uint8)
    return flat.view(dtype).reshape(tuple(payload.shape))


class FakeStore:
    """Records every put; the reference is the SHA-256 of the bytes (computed here)."""

    def __init__(self):
        self.puts: list[tuple[bytes, str, tuple]] = []

    def put(self, data, dtype, shape):
        self.puts.append((bytes(data), dtype, tuple(shape)))
        return "ref-" + hashlib.sha256(bytes(data)).hexdigest()[:12]


def test_each_call_puts_the_values_and_returns_the_store_reference():
    store = FakeStore()
    cap = PayloadCapture(store.put)
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    first = cap(t)
    second = cap(t)
    assert first == second == "ref-" + hashlib.sha256(np.arange(12, dtype=np.float32).tobytes()).hexdigest()[:12]
    assert store.puts == [(np.arange(12, dtype=np.float32).tobytes(), "torch.float32", (3, 4))] * 2


def test_inplace_change_is_snapshotted_again_with_the_new_values():
    store = FakeStore()
    cap = PayloadCapture(store.put)
    t = torch.tensor([1.0, -2.0, 3.0])
    before = cap(t)
    t.mul_(10)
    after = cap(t)
    assert before != after
    assert [p[0] for p in store.puts] == [np.array([1, -2, 3], np.float32).tobytes(),
                                          np.array([10, -20, 30], np.float32).tobytes()]


def test_other_dtype_or_shape_over_the_same_memory_is_a_new_payload():
    store = FakeStore()
    cap = PayloadCapture(store.put)
    t = torch.arange(4, dtype=torch.int32)
    cap(t)
    cap(t.view(torch.float32))
    cap(t.view(2, 2))
    assert [(p[1], p[2]) for p in store.puts] == [("torch.int32", (4,)), ("torch.float32", (4,)),
                                                 ("torch.int32", (2, 2))]
    assert all(p[0] == np.arange(4, dtype=np.int32).tobytes() for p in store.puts)


def test_no_reference_from_the_store_is_returned_as_none():
    calls = []
    cap = PayloadCapture(lambda *snap: calls.append(snap))  # a store that stores nothing: None
    t = torch.ones(3)
    assert cap(t) is None and cap(t) is None
    assert len(calls) == 2


def test_with_the_real_store_the_payload_reads_back_bit_exact(tmp_path):
    with PayloadWriter(tmp_path, rank=0) as writer:
        cap = PayloadCapture(writer.put)
        t = torch.randn(5, 7).to(torch.bfloat16)
        refs = [cap(t), cap(t)]
        orig = t.clone()
        t.add_(1)
        refs.append(cap(t))
    assert refs[0] == refs[1] != refs[2]
    reader = PayloadReader(tmp_path)
    got = _tensor(reader.read(refs[2]))
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), t.view(torch.int16))
    old = _tensor(reader.read(refs[0]))
    assert torch.equal(old.view(torch.int16), orig.view(torch.int16))


NON_CONTIGUOUS = {
    "transposed_f32": lambda: torch.randn(8, 16, 4).transpose(0, 1),
    "strided_bf16": lambda: torch.randn(6, 10).to(torch.bfloat16)[:, ::3],
    "expanded_f64": lambda: torch.tensor([[1.5], [-0.0], [float("nan")]], dtype=torch.float64).expand(3, 4),
    "permuted_bool": lambda: (torch.randn(2, 3, 4) > 0).permute(2, 0, 1),
    "transposed_complex": lambda: torch.randn(3, 5, dtype=torch.complex64).t(),
    "neg_view_f16": lambda: torch.randn(4, 6).to(torch.float16).t()._neg_view(),
    "channels_last_i32": lambda: torch.arange(2 * 3 * 4 * 5, dtype=torch.int32).reshape(2, 3, 4, 5)
    .contiguous(memory_format=torch.channels_last),
}


@pytest.mark.parametrize("make", list(NON_CONTIGUOUS.values()), ids=list(NON_CONTIGUOUS))
def test_non_contiguous_snapshot_is_one_copy_in_c_order(make):
    """A non-contiguous tensor's snapshot: torch writes its C-order bytes straight into a
    read-only numpy byte array; the bytes equal those of an independent C-order copy
    (numpy's own ascontiguousarray of the values), and later writes to the tensor do not
    reach them."""
    t = make()
    assert not t.is_contiguous()
    data, dtype, shape = tensor_bytes(t)
    expected = t.resolve_neg().contiguous()
    assert dtype == str(t.dtype) and shape == tuple(t.shape)
    assert isinstance(data, np.ndarray) and data.dtype == np.uint8 and not data.flags.writeable
    assert bytes(data) == ctypes.string_at(expected.data_ptr(), expected.numel() * expected.element_size())
    if t.dtype not in (torch.bfloat16, torch.bool) and not t.is_neg():
        values = np.ascontiguousarray(t.numpy())
        assert bytes(data) == values.tobytes()
    before = bytes(data)
    if t.dtype != torch.bool and not t.is_neg() and t.stride()[-1] != 0 and 0 not in t.stride():
        t.add_(1)
        assert bytes(data) == before


def test_put_keeps_a_handed_over_array_and_copies_anything_else(tmp_path):
    t = torch.randn(64, 32).t()
    data, dtype, shape = tensor_bytes(t)
    with PayloadWriter(tmp_path, rank=0) as w:
        kept = []
        real = w._queue.put
        w._queue.put = lambda item, *a, **k: kept.append(item) or real(item, *a, **k)
        ref = w.put(data, dtype, shape)
        writable = bytearray(b"\x01" * 16)
        w.put(writable, "torch.uint8", (16,))
        mine = np.frombuffer(bytes(range(8)), np.uint8).copy()  # writable array: copied
        w.put(mine, "torch.uint8", (8,))
    items = [i for i in kept if i[0] == "put"]
    assert items[0][5] is data                      # the read-only array itself, no copy
    assert type(items[1][5]) is bytes and type(items[2][5]) is bytes
    back = PayloadReader(tmp_path).read(ref)
    assert back.data == ctypes.string_at(t.contiguous().data_ptr(), 64 * 32 * 4)
    assert torch.equal(_tensor(back), t)


def _c_order(t):
    return np.ascontiguousarray(t.numpy()).tobytes()


@pytest.mark.parametrize("write", ["inplace", "numpy"])
def test_transposed_view_after_its_memory_changed_is_snapshotted_again(write):
    store = FakeStore()
    cap = PayloadCapture(store.put)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cap(x)
    first = cap(x.t())
    if write == "inplace":
        x.add_(1)
    else:  # a write no version counter sees
        x.numpy()[2, 3] = -7.0
    second = cap(x.t())
    assert second != first and store.puts[-1] == (_c_order(x.t()), "torch.float32", (4, 3))
