"""Task tensor with tensors of about 1 MiB and more (page-aligned snapshots, .pt files and
shards written around the page cache): the exported files hold the exact values, the live
export and ``msprobe export`` write the same bytes, the shards load with safetensors, and
a tensor changed in place behind torch's back between two records is stored twice."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.payload import write_pt
from store.export import export_log

MIB = 1 << 20


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".msprobe" not in p.parts}


def _record(dump: Path, make) -> None:
    dbg = PrecisionDebugger(dump_path=str(dump), level="L1", task="tensor")
    dbg.start()
    make()
    dbg.stop()
    dbg.step()
    dbg.close()


def _inputs(dump: Path, api: str) -> list[torch.Tensor]:
    """The first input of every call of ``api`` (``"Torch.add"``), in call order, loaded
    with weights_only."""
    rank = dump / "step0" / "rank"
    data = json.loads((rank / "dump.json").read_text())["data"]
    names = [name for name in data if name.startswith(api + ".") and name.endswith(".forward")]
    names.sort(key=lambda name: int(name.split(".")[-2]))
    return [torch.load(rank / "dump_tensor_data" / data[name]["input_args"][0]["data_name"], weights_only=True)
            for name in names]


def _live_equals_offline(dump: Path, again: Path) -> None:
    export_log(dump, again, tensor_writers={"pytorch": write_pt})
    live, offline = _files(dump), _files(again)
    assert sorted(live) == sorted(offline) and any(k.endswith(".pt") for k in live)
    assert [k for k in live if live[k] != offline[k]] == []
    for shard in (dump / ".msprobe" / "payload").glob("*.safetensors"):
        load_file(str(shard))  # a page-padded header is still a valid safetensors file


CASES = {
    "f32_1MiB": lambda: torch.randn(MIB // 4),
    "f32_1MiB-1": lambda: torch.randn(MIB // 4 - 1),
    "f32_1MiB+1": lambda: torch.randn(MIB // 4 + 1),
    "bf16_1MiB": lambda: torch.randn(MIB // 2).to(torch.bfloat16),
    "f16_odd": lambda: torch.randn(3, MIB // 2 + 7).to(torch.float16),
    "f64": lambda: torch.randn(MIB // 8 + 3, dtype=torch.float64),
    "i64": lambda: torch.randint(-10 ** 12, 10 ** 12, (MIB // 8 + 1,)),
    "bool": lambda: torch.rand(MIB + 5) > 0.5,
    "c64": lambda: torch.randn(MIB // 8 + 1, dtype=torch.complex64),
    "f32_transposed": lambda: torch.randn(1024, 257).t(),
    "bf16_transposed": lambda: torch.randn(2048, 513).to(torch.bfloat16).t(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_large_tensors_round_trip_and_live_equals_offline(tmp_path, case):
    torch.manual_seed(len(case))
    x = CASES[case]()
    out = []
    _record(tmp_path / "d", lambda: out.append(torch.logical_not(x) if x.dtype == torch.bool else torch.add(x, 0)))
    (got,) = _inputs(tmp_path / "d", "Torch.logical_not" if x.dtype == torch.bool else "Torch.add")
    assert got.dtype == x.dtype and got.shape == x.shape and torch.equal(got, x)
    _live_equals_offline(tmp_path / "d", tmp_path / "again")


def test_a_large_tensor_changed_behind_torchs_back_is_stored_again(tmp_path):
    """The window compares the memory with the page-aligned snapshot (a memoryview): a
    change through ``.numpy()`` between two records (no version counter sees it) is seen,
    for the tensor and for its transposed view."""
    torch.manual_seed(0)
    x = torch.randn(1024, 513)  # 2 MiB
    x0 = x.clone()

    def make():
        torch.add(x, 0)
        torch.add(x.t(), 0)
        torch.add(x.t(), 0)      # unchanged: the window's reference
        x.numpy()[5, 7] = 123.0  # a write no version counter sees
        torch.add(x.t(), 0)
        torch.add(x, 0)

    _record(tmp_path / "d", make)
    ins = _inputs(tmp_path / "d", "Torch.add")
    assert [t.shape for t in ins] == [x.shape, x.t().shape, x.t().shape, x.t().shape, x.shape]
    assert torch.equal(ins[0], x0) and torch.equal(ins[1], x0.t()) and torch.equal(ins[2], x0.t())
    assert torch.equal(ins[3], x.t()) and torch.equal(ins[4], x) and ins[4][5, 7] == 123.0
    _live_equals_offline(tmp_path / "d", tmp_path / "again")
