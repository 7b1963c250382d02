"""gather_by_device with vectors on several devices (mocked: parts that only name a device)
keeps the order of the vectors in DeferredStats.resolve and async_dump's drain, one copy
per device."""
from __future__ import annotations

import torch

from msprobe.pytorch import deferred
from msprobe.pytorch.deferred import DeferredStats, PendingLeaf, gather_by_device
from store import schema
from store.records import Call, Leaf


class _Part:
    """Stands for a statistics part on ``device``; ``tag`` is what the fake gather returns."""

    def __init__(self, device: str, tag: int) -> None:
        self.device = torch.device(device)
        self.tag = tag


def _fake_gather(copies: list):
    def gather(vectors):
        assert len({v[0].device for v in vectors}) == 1  # one device per copy
        copies.append([v[0].tag for v in vectors])
        return [[float(v[0].tag)] * deferred.WIDTH for v in vectors]
    return gather


DEVICES = ["cuda:0", "cuda:1", "cuda:0", "cpu", "cuda:1", "cuda:0", "cuda:2"]


def test_interleaved_devices_keep_the_order(monkeypatch):
    copies: list = []
    monkeypatch.setattr(deferred, "gather", _fake_gather(copies))
    vectors = [(_Part(d, i),) for i, d in enumerate(DEVICES)]
    host, n = gather_by_device(vectors)
    assert [vals[0] for vals in host] == [float(i) for i in range(len(DEVICES))]
    assert n == 4 and copies == [[0, 2, 5], [1, 4], [3], [6]]
    assert gather_by_device([]) == ([], 0)


def test_resolve_fills_each_leaf_from_its_own_device(monkeypatch):
    copies: list = []
    monkeypatch.setattr(deferred, "gather", _fake_gather(copies))
    vectors = [(_Part(d, i),) for i, d in enumerate(DEVICES)]

    def pending(i):
        return PendingLeaf(Leaf(io="input_args", path=(i,), leaf_kind=schema.LEAF_TENSOR,
                                dtype="torch.float32", shape=(2,), numel=2), vectors[i])

    plain = Leaf(io="output", path=(0,), leaf_kind=schema.LEAF_NONE)
    queue = DeferredStats()
    for name, leaves in (("a", [pending(0), plain, pending(1)]), ("b", []),
                         ("c", [pending(2), pending(3), plain, pending(4), pending(5), pending(6)])):
        queue.add(Call(step=0, kind="api_forward", name=name, api_type="Torch", leaves=()), leaves)
    calls = queue.resolve()
    assert [c.name for c in calls] == ["a", "b", "c"]
    got = [[(leaf.path, leaf.max) for leaf in c.leaves] for c in calls]
    assert got == [[((0,), 0.0), ((0,), None), ((1,), 1.0)], [],
                   [((2,), 2.0), ((3,), 3.0), ((0,), None), ((4,), 4.0), ((5,), 5.0), ((6,), 6.0)]]
    assert queue.transfers == 4
