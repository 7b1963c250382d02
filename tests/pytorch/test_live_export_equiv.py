"""Live (incremental) export vs export_log over the same log: byte-identical files."""
import json
import os

import pytest
import torch

from pt_helpers import ModuleOP
from msprobe.pytorch import PrecisionDebugger
from store.export import export_log


def _files(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".json"):
                p = os.path.join(d, f)
                out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


@pytest.mark.parametrize("async_dump,summary", [(False, "statistics"), (True, "statistics"), (False, "md5")])
def test_live_equals_offline(tmp_path, async_dump, summary):
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
    live = _files(dump)
    export_log(dump, tmp_path / "re")
    offline = _files(tmp_path / "re")
    assert sorted(live) == sorted(offline)
    for k in live:
        assert live[k] == offline[k], k


class _TakesAnything(torch.nn.Module):
    def forward(self, x, *args, **kwargs):
        return x * 1


_ODD_TEXT = "é\u2028\x00\x1f\"\\ 中 \U0001F600"


@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_live_equals_offline_with_odd_arguments(tmp_path, summary):
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
    live = _files(dump)
    export_log(dump, tmp_path / "re")
    offline = _files(tmp_path / "re")
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
