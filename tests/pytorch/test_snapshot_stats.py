"""Task tensor: the payload's copy and the statistics from one read of the memory
(``fused_stats.snapshot_at``), and payloads after a statistics memo hit (a fresh snapshot, never the memo's).

References are independent: the bytes are compared with ``ctypes.string_at`` of the tensor's
memory (or numpy's C-order bytes of a view), the statistics with numpy float64 and with the
separate passes (``reduce_at``, ``reduce_crc_at``) they must equal bit for bit.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
import torch

from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64
from msprobe.pytorch import stats as stats_mod
from msprobe.pytorch.leaves import LeafBuilder
from msprobe.pytorch.payload import PayloadCapture

NATIVE = stats_mod.NATIVE
pytestmark = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "snapshot_at"),
                                reason="msprobe._native.fused_stats with snapshot_at is not built")
BLOCK = 4096
KINDS = {KIND_F32: torch.float32, KIND_F64: torch.float64, KIND_BF16: torch.bfloat16, KIND_F16: torch.float16}


def _kernels():
    return [False, True] if NATIVE.isa() != "generic" else [False]


def _same_tuple(a: tuple, b: tuple) -> bool:
    """Equal element by element, NaN equal to NaN (bit-identical floats compare equal)."""
    return len(a) == len(b) and all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 21, 70001])
def test_snapshot_bytes_and_reduction(kind, n):
    """The copy is the memory's bytes; the reduction equals reduce_at's bit for bit, and
    with a CRC function reduce_crc_at's (portable and AVX2 kernels)."""
    torch.manual_seed(n)
    t = (torch.randn(n, dtype=torch.float64) * 5).to(KINDS[kind])
    if n > 20:
        t[n // 2] = float("nan") if n % 2 else float("inf")
    nbytes = n * t.element_size()
    for portable in _kernels():
        data, reduced = NATIVE.snapshot_at(t.data_ptr(), n, kind, 0, portable)
        assert type(data) is bytes and data == ctypes.string_at(t.data_ptr(), nbytes)
        assert _same_tuple(reduced, NATIVE.reduce_at(t.data_ptr(), n, kind, portable))
        if stats_mod.FUSED_CRC is not None:
            data2, reduced2 = NATIVE.snapshot_at(t.data_ptr(), n, kind, stats_mod.FUSED_CRC, portable)
            assert data2 == data
            assert _same_tuple(reduced2, NATIVE.reduce_crc_at(t.data_ptr(), n, kind, stats_mod.FUSED_CRC, portable))


def test_snapshot_independent_of_later_writes():
    """The copy is a copy: a later in-place change of the tensor does not reach it."""
    t = torch.arange(10000, dtype=torch.float32)
    data, reduced = NATIVE.snapshot_at(t.data_ptr(), t.numel(), KIND_F32)
    t.add_(1.0)
    assert np.array_equal(np.frombuffer(data, np.float32), np.arange(10000, dtype=np.float32))
    a = np.arange(10000, dtype=np.float64)
    assert reduced[:4] == (a.max(), a.min(), math.fsum(a), math.fsum(a * a))


def test_snapshot_bad_arguments():
    a = torch.zeros(3)
    with pytest.raises(ValueError, match="at least one element"):
        NATIVE.snapshot_at(a.data_ptr(), 0, KIND_F32)
    with pytest.raises(ValueError, match="kind"):
        NATIVE.snapshot_at(a.data_ptr(), 3, 7)
    with pytest.raises(ValueError, match="address"):
        NATIVE.snapshot_at(0, 3, KIND_F32)
    with pytest.raises(ValueError, match="too many bytes"):
        NATIVE.snapshot_at(a.data_ptr(), 2 ** 62, KIND_F64)
    with pytest.raises(TypeError):
        NATIVE.snapshot_at(a.data_ptr(), 3)
    with pytest.raises(TypeError):
        NATIVE.snapshot_at(a.data_ptr(), 3, KIND_F32, 0, False, 4096, 1)
    for align in (-1, 3, 4095, 1 << 21):
        with pytest.raises(ValueError, match="align"):
            NATIVE.snapshot_at(a.data_ptr(), 3, KIND_F32, 0, False, align)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("align", [1, 64, 4096])
@pytest.mark.parametrize("n", [1, BLOCK + 3, (1 << 20) // 2 + 5])
def test_aligned_snapshot(kind, align, n):
    """With align: a read-only byte memoryview of a bytes object, starting at a multiple of
    align in memory, holding the memory's bytes; the reduction is the unaligned call's."""
    torch.manual_seed(n + align)
    t = (torch.randn(n, dtype=torch.float64) * 3).to(KINDS[kind])
    nbytes = n * t.element_size()
    plain, reduced = NATIVE.snapshot_at(t.data_ptr(), n, kind)
    data, reduced2 = NATIVE.snapshot_at(t.data_ptr(), n, kind, 0, False, align)
    if align == 1:
        assert type(data) is bytes
    else:
        assert type(data) is memoryview and type(data.obj) is bytes and data.readonly
        assert data.format == "B" and data.ndim == 1 and data.contiguous
        assert np.frombuffer(data, np.uint8).__array_interface__["data"][0] % align == 0
    assert len(data) == nbytes and bytes(data) == plain == ctypes.string_at(t.data_ptr(), nbytes)
    assert _same_tuple(reduced2, reduced)


def test_large_snapshots_of_leaves_are_page_aligned_and_kept_without_a_copy():
    """A tensor of 1 MiB or more recorded with task tensor: its snapshot starts on a page
    (the tensor file and shard write it without another copy), the payload writer keeps that
    very object, and the values stored are the tensor's."""
    from store.payload_writer import _kept

    kept = []
    store = _Store()

    def put(data, dtype, shape):
        kept.append(_kept(data))
        return store(data, dtype, shape)

    builder = LeafBuilder(md5=False, capture=PayloadCapture(put))
    big, small = torch.randn(1 << 18), torch.randn(1000)
    for t in (big, small):
        builder.tensor_leaf("output", ("0",), t)
    assert type(kept[0]) is memoryview and np.frombuffer(kept[0], np.uint8).__array_interface__["data"][0] % 4096 == 0
    assert type(kept[1]) is bytes
    assert store.puts[0][0] == ctypes.string_at(big.data_ptr(), big.numel() * 4)
    assert store.puts[1][0] == ctypes.string_at(small.data_ptr(), small.numel() * 4)
    big.numpy()[-1] += 1.0  # a write no version counter sees
    builder.memo.clear()
    builder.tensor_leaf("output", ("0",), big)
    assert len(store.puts) == 3 and store.puts[-1][0] == ctypes.string_at(big.data_ptr(), big.numel() * 4)


# ------------------------------------------------------------------ leaves with PayloadCapture

class _Store:
    """A content-addressed stand-in for Session.put_payload: keeps every put."""

    def __init__(self):
        self.puts = []

    def __call__(self, data, dtype, shape):
        self.puts.append((bytes(data), dtype, tuple(shape)))
        return f"shard:{len(self.puts)}"


def _builder():
    store = _Store()
    return LeafBuilder(md5=False, capture=PayloadCapture(store)), store


def _np_stats(a: np.ndarray) -> tuple:
    a = a.astype(np.float64).ravel()
    return float(a.max()), float(a.min()), float(a.mean()), float(np.sqrt((a * a).sum()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_plain_tensor_leaf_payload_and_statistics(dtype):
    """A contiguous tensor: the stored bytes are its bytes, and the statistics are those of
    the statistics-only builder exactly (same pass) and of numpy float64."""
    torch.manual_seed(3)
    x = (torch.randn(70, 130, dtype=torch.float64) * 4).to(dtype)
    builder, store = _builder()
    leaf = builder.tensor_leaf("output", (0,), x)
    assert leaf.payload == "shard:1"
    assert store.puts == [(ctypes.string_at(x.data_ptr(), x.numel() * x.element_size()), str(dtype), (70, 130))]
    plain = LeafBuilder(md5=False).tensor_leaf("output", (0,), x)
    assert (leaf.max, leaf.min, leaf.mean, leaf.norm) == (plain.max, plain.min, plain.mean, plain.norm)
    mx, mn, mean, norm = _np_stats(x.double().numpy())
    assert (leaf.max, leaf.min) == (mx, mn)
    assert leaf.mean == pytest.approx(mean, rel=1e-12, abs=1e-15)
    assert leaf.norm == pytest.approx(norm, rel=1e-12)


def test_memo_hit_puts_each_record_in_its_own_layout():
    """Every record is put with its C-order bytes, dtype and shape: recorded again unchanged
    (the same bytes), as a transposed view of the same memory (a memo hit for the
    statistics; other C-order bytes), with another shape, and after an in-place change
    (the new bytes)."""
    x = torch.randn(20, 20)
    builder, store = _builder()
    first = builder.tensor_leaf("output", (0,), x)
    again = builder.tensor_leaf("input_args", (0,), x.view(20, 20))
    assert (first.payload, again.payload) == ("shard:1", "shard:2") and store.puts[1] == store.puts[0]
    transposed = builder.tensor_leaf("input_args", (1,), x.t())
    assert transposed.payload == "shard:3" and builder.memo.hits == 2
    assert store.puts[2][0] == np.ascontiguousarray(x.numpy().T).tobytes()
    assert (transposed.max, transposed.min) == (first.max, first.min)
    flat = builder.tensor_leaf("input_args", (2,), x.view(400))  # same memory, other shape
    assert flat.payload == "shard:4" and store.puts[3][2] == (400,)
    x.mul_(2.0)
    changed = builder.tensor_leaf("output", (1,), x)
    assert changed.payload == "shard:5" and store.puts[4][0] == x.numpy().tobytes()
    assert changed.max == float(x.max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_view_statistics_from_its_copy(dtype):
    """A non-contiguous view (attention's transposes): its payload is its C-order bytes and
    its statistics are the native pass over that copy (Max/Min exact, Mean/Norm float64)."""
    torch.manual_seed(5)
    base = (torch.randn(8, 128, 64, dtype=torch.float64) * 3).to(dtype)
    view = base.transpose(0, 1)
    builder, store = _builder()
    leaf = builder.tensor_leaf("output", (0,), view)
    c_order = view.contiguous()
    assert store.puts == [(ctypes.string_at(c_order.data_ptr(), c_order.numel() * c_order.element_size()),
                           str(dtype), (128, 8, 64))]
    kind = stats_mod.NATIVE_KIND[dtype]
    reduced = NATIVE.reduce_at(c_order.data_ptr(), c_order.numel(), kind)
    assert (leaf.max, leaf.min) == (reduced[0], reduced[1])
    assert leaf.mean == reduced[2] / c_order.numel() and leaf.norm == math.sqrt(reduced[3])
    mx, mn, mean, norm = _np_stats(view.double().numpy())
    assert (leaf.max, leaf.min) == (mx, mn)
    assert leaf.mean == pytest.approx(mean, rel=1e-12, abs=1e-15) and leaf.norm == pytest.approx(norm, rel=1e-12)


def test_special_values_in_the_fused_path():
    """NaN and infinity in a captured tensor: the flags, Max/Min NaN rule and the finite
    Max/Min are those of the statistics-only builder."""
    x = torch.randn(5000)
    x[10], x[20] = float("nan"), float("inf")
    builder, store = _builder()
    leaf = builder.tensor_leaf("output", (0,), x)
    plain = LeafBuilder(md5=False).tensor_leaf("output", (0,), x)
    assert store.puts[0][0] == x.numpy().tobytes()
    for field in ("has_nan", "has_inf", "max_finite", "min_finite"):
        assert getattr(leaf, field) == getattr(plain, field)
    assert math.isnan(leaf.max) and math.isnan(plain.max) and leaf.max_finite == float(x[torch.isfinite(x)].max())


@pytest.mark.parametrize("numel", [1000, 1 << 18])
def test_memo_hit_after_an_unseen_write_records_the_values_stored(numel):
    """A tensor recorded twice (a statistics memo hit), written in between through
    ``.numpy()`` (no version counter sees it): the second record's payload holds the new
    bytes and its statistics describe them (numpy float64 over the same values), instead
    of the memo's statistics of the old values."""
    store = _Store()
    builder = LeafBuilder(md5=False, capture=PayloadCapture(store))
    t = torch.zeros(numel)
    first = builder.tensor_leaf("output", ("0",), t)
    t.numpy()[5] = 7.0
    t.numpy()[6] = -2.5
    second = builder.tensor_leaf("input_args", ("0",), t)
    assert builder.memo.hits == 1  # the second record was a memo hit
    values = t.numpy().astype(np.float64)
    assert (first.max, first.min) == (0.0, 0.0)
    assert (second.max, second.min) == (values.max(), values.min()) == (7.0, -2.5)
    assert second.mean == values.mean() and second.norm == float(np.sqrt((values * values).sum()))
    assert store.puts[-1][0] == ctypes.string_at(t.data_ptr(), numel * 4)
    # unchanged since: the same statistics and the same bytes stored again
    third = builder.tensor_leaf("output", ("0",), t)
    assert (third.max, third.min, third.mean) == (second.max, second.min, second.mean)
    assert len(store.puts) == 3 and store.puts[2] == store.puts[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("nbytes", [4096, 33 << 20])  # inside and beyond the memo's 4 MiB limit
def test_memo_hit_after_an_unseen_write_dtypes_keep_and_large(dtype, keep, nbytes):
    """The unseen-write check of a memo hit for every native dtype, for a parameter's
    ``.grad`` (``keep``: its memo entry stays held like a parameter's) and for a tensor
    larger than the memo's limit (no memo entry unless kept): unchanged records give the same statistics bit for bit, a write through the
    tensor's memory gives those of the new values, and the payload holds the new bytes."""
    store = _Store()
    builder = LeafBuilder(md5=False, capture=PayloadCapture(store))
    t = torch.zeros(nbytes // torch.empty(0, dtype=dtype).element_size(), dtype=dtype)
    if keep:
        param = torch.nn.Parameter(torch.zeros_like(t))
        param.grad = t
    first = builder.tensor_leaf("output", ("0",), t, keep=keep)
    again = builder.tensor_leaf("input_args", ("0",), t, keep=keep)
    assert builder.memo.hits == 1 or (not keep and nbytes > (4 << 20))  # larger ones: no memo
    assert (again.max, again.min, again.mean, again.norm) == (first.max, first.min, first.mean, first.norm)
    raw = t.view(torch.uint8).numpy()  # written around every version counter
    seven = torch.tensor([7.0], dtype=dtype).view(torch.uint8).numpy()
    raw[5 * t.element_size():6 * t.element_size()] = seven
    second = builder.tensor_leaf("input_args", ("0",), t, keep=keep)
    assert (second.max, second.min) == (7.0, 0.0)
    assert second.mean == 7.0 / t.numel() and second.norm == 7.0
    assert store.puts[-1][0] == ctypes.string_at(t.data_ptr(), nbytes)
    if keep:
        entry = builder.memo.entries[(t.data_ptr(), t.dtype, t.numel(), False, False)]
        assert entry[4] and entry[2][0] is not first and entry[2][0].max == 7.0  # still held, updated


def test_memo_hit_after_an_unseen_write_undone_through_another_shape():
    """A write no version counter sees, recorded through another shape of the same memory
    and then undone: the next record's statistics and payload are those of the bytes now
    there (every record's snapshot comes with fresh statistics)."""
    store = _Store()
    builder = LeafBuilder(md5=False, capture=PayloadCapture(store))
    x = torch.zeros(4, 4)
    builder.tensor_leaf("output", ("0",), x)
    x.numpy()[0, 0] = 9.0
    assert builder.tensor_leaf("output", ("0",), x.view(16)).max == 9.0
    x.numpy()[0, 0] = 0.0
    leaf = builder.tensor_leaf("output", ("0",), x)
    assert store.puts[int(leaf.payload.split(":")[1]) - 1][0] == bytes(64)  # the bytes stored: zeros
    assert leaf.max == 0.0
