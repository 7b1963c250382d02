"""Checksums on the device (:mod:`msprobe.pytorch.device_checksum`): summary_mode xor's XOR
fold and summary_mode md5's CRC-32 of each tensor's C-order bytes, computed with tensor
operations and gathered at the flush point, equal :func:`msprobe.core.checksum.xor64_hex`
and ``zlib.crc32`` (:func:`msprobe.pytorch.stats.crc32_hex`) of the host bytes, for every
dtype and layout; a recorded step with every tensor forced through the device path writes
the same dump.json checksums as the host path, with no host synchronisation per tensor."""
from __future__ import annotations

import json
import zlib

import pytest
import torch

from msprobe.core.checksum import xor64_hex
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.deferred import DeferredStats, PendingLeaf
from msprobe.pytorch.device_checksum import CrcBatch, XorBatch, crc32_of_zeros, crc_dtype, crc_hex, stageable
from msprobe.pytorch.stats import crc32_hex
from msprobe.pytorch.payload import tensor_bytes
from pt_helpers import device_ops, load_dump
from store import schema
from store.records import Call, Leaf



def device_xor(tensors: list, chunk_words: int = 1 << 10) -> list[str]:
    deferred = DeferredStats()
    deferred.xor_batch = XorBatch(chunk_words)
    for i, t in enumerate(tensors):
        leaf = Leaf(io="input", path=(0,), leaf_kind=schema.LEAF_TENSOR, dtype=str(t.dtype))
        deferred.add(Call(step=0, kind="api", name=f"x.{i}", api_type="Torch"),
                     [PendingLeaf(leaf, deferred.xor_batch.stage(t))])
    return [call.leaves[0].crc32 for call in deferred.resolve()]


def _tensors() -> list:
    g = torch.Generator().manual_seed(3)
    out = []
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128):
        for shape in ((), (7,), (3, 5), (33, 17)):
            x = torch.randn(shape, generator=g) * 1000
            out.append(x > 0 if dtype == torch.bool else x.to(dtype))
        out.append(out[-1].t())  # a transposed view: its C-order bytes
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            out.append(torch.randn(11, generator=g).to(getattr(torch, name)))
    z = torch.randn(4, 3, dtype=torch.complex64, generator=g)
    out += [z.conj(), torch.randn(6, generator=g).neg().t(), torch.randn(4096, generator=g)]  # lazy conj/neg; own matrix
    return out


def test_device_xor_equals_host_xor64():
    tensors = _tensors()
    assert all(stageable(t) for t in tensors)
    got = device_xor(tensors)
    want = [xor64_hex(tensor_bytes(t)[0]) for t in tensors]
    assert got == want
    assert len(set(want)) > len(want) // 2  # distinct data, distinct checksums: the test can fail


def test_chunks_fill_and_fold_as_they_go():
    tensors = [torch.arange(i, i + 9, dtype=torch.int32) for i in range(10)]  # 36 bytes: rows of 8 words
    batch = XorBatch(chunk_words=16)  # two rows per matrix: folded when full
    rows = [batch.stage(t) for t in tensors]
    assert len({id(r.chunk) for r in rows}) == 5
    assert device_xor(tensors, chunk_words=16) == [xor64_hex(tensor_bytes(t)[0]) for t in tensors]


def test_bad_chunk_size_is_refused():
    with pytest.raises(ValueError, match="chunk_words"):
        XorBatch(0)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_not_stageable_tensors():
    q = torch.quantize_per_tensor(torch.ones(3), 0.5, 0, torch.qint8)
    assert not stageable(q) and not stageable(torch.empty(0)) and not stageable(torch.empty(2, device="meta"))


@pytest.mark.parametrize("n", [0, 1, 3, 4, 255, 4096, 100003])
def test_crc32_of_zeros_equals_zlib(n):
    assert crc32_of_zeros(n) == zlib.crc32(bytes(n))


def device_crc(tensors: list, chunk_words: int = 1 << 11) -> list[str]:
    deferred = DeferredStats()
    deferred.crc_batch = CrcBatch(chunk_words)
    for i, t in enumerate(tensors):
        leaf = Leaf(io="input", path=(0,), leaf_kind=schema.LEAF_TENSOR, dtype=str(t.dtype), shape=tuple(t.shape),
                    numel=t.numel())
        deferred.add(Call(step=0, kind="api", name=f"x.{i}", api_type="Torch"),
                     [PendingLeaf(leaf, (torch.zeros(8, dtype=torch.float64),),
                                  deferred.crc_batch.stage(t, crc_dtype(t)))])
    return [call.leaves[0].crc32 for call in deferred.resolve()]


def test_device_crc32_equals_host_crc32():
    tensors = _tensors()
    assert all(crc_dtype(t) is not None for t in tensors)
    got = device_crc(tensors)
    want = [crc32_hex(t) for t in tensors]
    assert got == want
    assert len(set(want)) > len(want) // 2
    # bfloat16 and float8: the CRC-32 of their float32 values (as the host path)
    b = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    assert device_crc([b]) == ["%08x" % zlib.crc32(b.float().numpy().tobytes())]


def test_crc_matrices_fill_and_reduce_as_they_go():
    tensors = [torch.arange(i, i + 9, dtype=torch.int16) for i in range(7)]  # 18 bytes: rows of 8 words
    batch = CrcBatch(chunk_words=16)
    rows = [batch.stage(t, crc_dtype(t)) for t in tensors]
    assert len({id(r.chunk) for r in rows}) == 4
    assert device_crc(tensors, chunk_words=16) == [crc32_hex(t) for t in tensors]
    with pytest.raises(ValueError, match="chunk_words"):
        CrcBatch(3)
    assert crc_hex(0, 0) == "00000000"


def _xor_fields(dump) -> dict:
    out = {}
    for name, entry in dump[0]["data"].items():
        stack = [(name, entry)]
        while stack:
            path, v = stack.pop()
            if isinstance(v, dict) and v.get("type") == "torch.Tensor":
                out[path] = v.get("md5")
            elif isinstance(v, dict):
                stack.extend((f"{path}.{k}", x) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend((f"{path}.{i}", x) for i, x in enumerate(v))
    return out


@pytest.mark.parametrize("mode", ["xor", "md5"])
def test_recorded_checksums_equal_host_path(tmp_path, mode):
    def run(defer):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.GELU(), torch.nn.Linear(6, 3))
        cfg = tmp_path / f"c{defer}.json"
        cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / f"d{defer}"), "level": "mix",
                                   "statistics": {"summary_mode": mode}}))
        dbg = PrecisionDebugger(config_path=str(cfg))
        dbg.recorder.leaves.defer_all = defer
        dbg.start(model)
        x = torch.randn(5, 8)
        model(x).sum().backward()
        x.t().contiguous().mul_(2)
        dbg.stop()
        dbg.close()
        return _xor_fields(load_dump(tmp_path / f"d{defer}"))

    host, dev = run(False), run(True)
    assert len(host) > 20 and all(v and len(v) == (18 if mode == "xor" else 8) for v in host.values())
    assert dev == host


@pytest.mark.parametrize("mode", ["xor", "md5"])
def test_checksum_syncs_per_flush(tmp_path, mode):
    ops = device_ops()
    small = ops.count_mode(mode, layers=1, work=str(tmp_path / "l1"))
    large = ops.count_mode(mode, layers=3, work=str(tmp_path / "l3"))
    assert large["tensors"] > 2 * small["tensors"] > 0
    # md5: statistics and CRC-32, one copy each per tensor; the reductions are a cost per
    # flush and staging matrix (per padded row length), amortised over the tensors
    budget = {"xor": 2, "md5": 3}[mode]
    assert large["ops_per_tensor"] <= budget, large
    extra = (large["launches"] - small["launches"]) / (large["tensors"] - small["tensors"])
    assert extra <= {"xor": 1.5, "md5": 2.5}[mode], (small, large)
    for r in (small, large):
        assert r["syncs"] <= r["flushes"], r
    assert small["syncs"] == large["syncs"]


def test_large_tensors_keep_the_host_checksums(monkeypatch):
    from msprobe.pytorch import device_checksum

    monkeypatch.setattr(device_checksum, "MAX_BYTES", 64)
    small, large = torch.ones(16), torch.ones(17)  # 64 and 68 bytes
    assert stageable(small) and not stageable(large)
    assert crc_dtype(torch.ones(8)) is not None and crc_dtype(torch.ones(9)) is None
