"""Live (incremental) export vs export_log over the same log: byte-identical files."""
import json
import os

import pytest
import torch

from pt_helpers import ModuleOP
from msprobe.pytorch import PrecisionDebugger
from msprobe.cli import main as cli_main
from store.export import export_log


@pytest.mark.parametrize("async_dump,summary", [(False, "statistics"), (True, "statistics"), (False, "md5")])
def test_live_equals_offline(tmp_path, json_files, async_dump, summary):
    dump = tmp_path / "d"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix",
                               "async_dump": async_dump, "statistics": {"summary_mode": summary}}))
    torch.manual_seed(0)
    m = ModuleOP()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    dbg = PrecisionDebugger(config_path=str(cfg))
    for i in range(2):
        dbg.start(model=m)
        for micro in range(2):                       # grad accumulation: parameters_grad merged
            out = m(torch.randn(4, 8))
            if micro == 0:
                out.sum().backward()
        dbg.stop()
        out.sum().backward()                          # backward after stop()
        opt.step(); opt.zero_grad()
        dbg.step()
    dbg.close()
    live = json_files(dump)
    export_log(dump, tmp_path / "re")
    offline = json_files(tmp_path / "re")
    assert sorted(live) == sorted(offline)
    for k in live:
        assert live[k] == offline[k], k


class _TakesAnything(torch.nn.Module):
    def forward(self, x, *args, **kwargs):
        return x * 1


_ODD_TEXT = "é\u2028\x00\x1f\"\\ 中 \U0001F600"


@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_live_equals_offline_with_odd_arguments(tmp_path, json_files, summary):
    """Odd argument values through both exports: byte-identical, valid ASCII JSON, and the
    values as the Python objects were (equal leaves of different types or zero signs that
    the encoder's per-dump text cache must keep apart: 1, 1.0, True, "1", 0.0, -0.0)."""
    dump = tmp_path / "d"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(dump), "level": "mix",
                               "statistics": {"summary_mode": summary}}))
    cyclic: list = []
    cyclic.append(cyclic)
    scalars = [1, 1.0, True, "1", 0.0, -0.0, float("nan"), float("inf"), 1e308, 5e-324, 2 ** 70]
    tensors = [torch.tensor(0.0), torch.tensor(-0.0), torch.tensor(True), torch.tensor(1),
               torch.tensor(1.0, dtype=torch.float64), torch.tensor([1e308, -1e308], dtype=torch.float64),
               torch.tensor([5e-324], dtype=torch.float64), torch.empty(2, 0), torch.tensor([1 + 2j, -3j]),
               torch.tensor([float("nan"), 1.0, float("inf")]), torch.tensor([1.5, 2.5], dtype=torch.bfloat16)]
    net = torch.nn.ModuleDict({"ünï\tcode": _TakesAnything()})
    dbg = PrecisionDebugger(config_path=str(cfg))
    for _ in range(2):
        dbg.start(model=net)
        for order in (1, -1):  # the same leaves again, in the other order
            net["ünï\tcode"](torch.ones(2), scalars[::order], tensors[::order], cyclic, torch.Size([3, 0]),
                              slice(None, 5), ..., None, torch.float16,
                              text=_ODD_TEXT, **{_ODD_TEXT: -0.0, "": 0.0, "device": "cpu"})
        dbg.stop()
        dbg.step()
    dbg.close()
    live = json_files(dump)
    export_log(dump, tmp_path / "re")
    offline = json_files(tmp_path / "re")
    assert sorted(live) == sorted(offline) and len(live) == 6
    for k in live:
        assert live[k] == offline[k], k
    raw = live[os.path.join("step1", "rank", "dump.json")]
    raw.decode("ascii")
    data = json.loads(raw)["data"]
    for n, order in enumerate((1, -1)):
        entry = data[f"Module.ünï\tcode._TakesAnything.forward.{n}"]
        args = entry["input_args"]
        got = [(v["type"], v["value"]) for v in args[1]]
        want = [(type(v).__name__, v) for v in scalars[::order]]
        for (gt, gv), (wt, wv) in zip(got, want, strict=True):
            assert gt == wt and type(gv) is type(wv) and (repr(gv) == repr(wv)), (gt, gv, wt, wv)
        for rec, t in zip(args[2], tensors[::order], strict=True):
            assert rec["dtype"] == str(t.dtype) and rec["shape"] == list(t.shape)
            if t.dtype == torch.bool:
                assert (rec["Max"], rec["Min"], rec["Mean"]) == (True, True, None)
            elif t.numel() == 0:
                assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (None,) * 4
            elif t.dim() == 0:  # the value itself, sign of zero included
                assert repr(rec["Max"]) == repr(rec["Min"]) == repr(float(t.item()))
        assert [(r["Max"], r["Min"]) for r in args[2] if r["shape"] == [2] and r["dtype"] == "torch.float64"] \
            == [(1e308, -1e308)]
        assert args[3] == [[[[[[[[[[{"type": "list", "value": "<nesting deeper than 10 levels>"}]]]]]]]]]]
        assert args[4:] == [{"type": "torch.Size", "value": [3, 0]}, {"type": "slice", "value": [None, 5, None]},
                            {"type": "ellipsis", "value": "..."}, None,
                            {"type": "torch.dtype", "value": "torch.float16"}]
        kwargs = entry["input_kwargs"]
        assert list(kwargs) == ["text", _ODD_TEXT, "", "device"]
        assert kwargs["text"] == {"type": "str", "value": _ODD_TEXT}
        assert repr(kwargs[_ODD_TEXT]["value"]) == "-0.0" and repr(kwargs[""]["value"]) == "0.0"


class _Mixed(torch.nn.Module):
    """Takes and returns nested containers of float, integer and bool tensors and plain
    values; has parameters (parameters_grad entries)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, nested, flag=None, **kwargs):
        y = self.lin(x)
        ints = torch.add(nested["ints"], 1)
        bools = torch.logical_not(nested["pair"][1])
        return {"y": y, "parts": [ints, bools, None, torch.Size([2, 3])], "z": y * 0.0 - 0.0}


@pytest.mark.parametrize("task,level", [("statistics", "mix"), ("statistics", "L1"), ("tensor", "L1")])
def test_live_equals_offline_with_stop_start_within_a_step(tmp_path, json_files, task, level):
    """The live export (the log writer's Python columns, no Arrow round trip) against
    `msprobe export` of the same log: several stop()/start() within one step, backward
    entries recorded after stop() and emitted at step(), parameters_grad, NaN/inf/-0.0
    statistics, integer and bool tensors, None leaves, plain values, nested arguments."""
    dump = tmp_path / "d"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": task, "dump_path": str(dump), "level": level,
                               "statistics": {"summary_mode": "statistics"}}))
    torch.manual_seed(0)
    net = _Mixed()
    dbg = PrecisionDebugger(config_path=str(cfg))
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1.0])
    for step in range(2):
        for part in range(3):  # start/stop three times within the step
            dbg.start(model=net)
            x = torch.randn(2, 3, requires_grad=True)
            out = net(x, {"ints": torch.arange(6).reshape(2, 3), "pair": (special * part, torch.tensor([True, False]))},
                      None, scale=2.5, count=3, name="é", size=torch.Size([4]), window=slice(1, None, 2),
                      deep=[[1.0, [None, -0.0]], {"k": (7, "v")}])
            torch.relu(special)
            loss = out["y"].sum() + out["z"].sum()
            dbg.stop()
            loss.backward()  # after stop(): its backward entries are emitted at step()
        dbg.step()
    dbg.close()
    live = json_files(dump)
    assert cli_main(["export", str(dump), "-o", str(tmp_path / "re")]) == 0
    offline = json_files(tmp_path / "re")
    assert sorted(live) == sorted(offline) and len(live) == 6
    for k in live:
        assert live[k] == offline[k], k
    data = json.loads(live[os.path.join("step1", "rank", "dump.json")])["data"]
    names = list(data)
    assert any(n.endswith("parameters_grad") for n in names) or level == "L1"
    assert any(n.endswith(".backward") or ".backward." in n for n in names)
    if level == "L1":
        relu = data["Torch.relu.2.forward"]["input_args"][0]
        assert relu["Max"] != relu["Max"] and relu["Mean"] != relu["Mean"]  # NaN (the input holds one)
        ints = data["Torch.add.2.forward"]["input_args"][0]
        assert (ints["dtype"], ints["Max"], ints["Min"]) == ("torch.int64", 5, 0)
        bools = data["Torch.logical_not.2.forward"]["output"][0]
        assert (bools["Max"], bools["Min"], bools["Mean"]) == (True, False, None)
    if task == "tensor":
        for step in range(2):
            live_dir = dump / f"step{step}" / "rank" / "dump_tensor_data"
            offline_dir = tmp_path / "re" / f"step{step}" / "rank" / "dump_tensor_data"
            got = sorted(p.name for p in live_dir.iterdir())
            assert got and got == sorted(p.name for p in offline_dir.iterdir())
            for name in got:
                assert (live_dir / name).read_bytes() == (offline_dir / name).read_bytes(), name
