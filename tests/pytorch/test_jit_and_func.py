"""TorchScript and torch.func with msprobe's hooks installed (msprobe.pytorch.jit_compat,
msprobe.pytorch.leaves.functorch_value). Before: scripting any function that calls a wrapped
API raised, and so did PyTorch's own first torch.func.jvp (it scripts decompositions);
the first recorded call inside torch.func.grad stopped recording with an internal error."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pt_helpers import assert_record, load_dump
from msprobe.pytorch import PrecisionDebugger

# torch.jit.script and trace are deprecated in PyTorch 2.13 but still used (script by PyTorch itself, too)
pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:`torch.jit.trace.*` is deprecated:DeprecationWarning")]


def _sin_gelu(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + F.gelu(x)  # builtins: torch.sin, torch._C._nn.gelu


def _relu_add(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).add(1.0)  # F.relu is a Python function, compiled from its source


def _grad_of_square(x: torch.Tensor) -> torch.Tensor:
    y = (x * x).sum()
    g = torch.autograd.grad([y], [x])[0]  # torch.autograd.grad: wrapped by the autograd guard
    assert g is not None
    return g


def _scripted_results():
    x = torch.linspace(-2.0, 2.0, 9)
    out = {}
    out["sin_gelu"] = torch.jit.script(_sin_gelu)(x)
    out["relu_add"] = torch.jit.script(_relu_add)(x)
    out["grad"] = torch.jit.script(_grad_of_square)(x.clone().requires_grad_())
    return x, out


@pytest.mark.parametrize("stopped", [False, True], ids=["recording", "hooks-installed-stopped"])
def test_script_functions_calling_wrapped_apis(tmp_path, stopped):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    if stopped:
        dbg.stop()
    x, out = _scripted_results()
    if not stopped:
        dbg.stop()
    dbg.close()
    xs = [float(v) for v in x]
    assert out["sin_gelu"].tolist() == pytest.approx(
        [math.sin(v) + 0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xs], rel=1e-6, abs=1e-6)
    assert out["relu_add"].tolist() == [max(v, 0.0) + 1.0 for v in xs]
    assert out["grad"].tolist() == pytest.approx([2 * v for v in xs])


def test_builtin_table_clean_after_close(tmp_path):
    """The wrappers leave TorchScript's builtin table when they are removed (their ids could
    be reused by other objects), and the originals are builtins again."""
    from torch.jit import _builtins

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    wrapper = torch.sin
    assert wrapper is not torch.sin.__msprobe_original__  # wrapped now
    assert _builtins._find_builtin(wrapper) == "aten::sin"
    dbg.stop()
    dbg.close()
    assert getattr(torch.sin, "__msprobe_original__", None) is None
    assert id(wrapper) not in _builtins._builtin_table
    assert _builtins._find_builtin(torch.sin) == "aten::sin"
    assert torch.jit.script(_sin_gelu)(torch.zeros(2)).tolist() == [0.0, 0.0]


def test_func_grad_records_forward_values(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(6)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    g = torch.func.grad(lambda v: (torch.sin(v) * 2).sum())(x)
    after = torch.cos(x)  # recording goes on after the transform
    dbg.stop()
    dbg.close()
    assert torch.allclose(g, 2 * torch.cos(x))
    data = load_dump(tmp_path / "d")[0]["data"]
    e = data["Torch.sin.0.forward"]
    assert_record(e["input_args"][0], x)
    assert e["input_args"][0]["requires_grad"] is True  # the grad transform's wrapper requires grad
    assert_record(e["output"][0], torch.sin(x))
    assert_record(data["Tensor.__mul__.0.forward"]["output"][0], torch.sin(x) * 2)
    assert_record(data["Torch.cos.0.forward"]["output"][0], after)


def test_func_vmap_and_jvp(tmp_path):
    torch.manual_seed(1)
    batch, x = torch.randn(3, 4), torch.randn(5)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    v = torch.func.vmap(torch.sin)(batch)
    primal, tangent = torch.func.jvp(torch.sin, (x,), (torch.ones(5),))  # raised before
    dbg.stop()
    dbg.close()
    assert torch.equal(v, torch.sin(batch))
    assert torch.allclose(primal, torch.sin(x)) and torch.allclose(tangent, torch.cos(x))
    data = load_dump(tmp_path / "d")[0]["data"]
    inside_vmap = data["Torch.sin.0.forward"]["input_args"][0]
    # one sample's shape, no one tensor of that shape to summarise: null statistics
    assert inside_vmap["shape"] == [4] and inside_vmap["dtype"] == "torch.float32"
    assert [inside_vmap[k] for k in ("Max", "Min", "Mean", "Norm")] == [None] * 4
    assert_record(data["Torch.sin.1.forward"]["input_args"][0], x)
    assert_record(data["Torch.sin.1.forward"]["output"][0], torch.sin(x))


def _config(tmp_path, task, summary_mode="statistics"):
    import json

    cfg = tmp_path / "config.json"
    body = {"task": task, "dump_path": str(tmp_path / "d"), "level": "L1"}
    if task == "statistics":
        body["statistics"] = {"summary_mode": summary_mode}
    cfg.write_text(json.dumps(body))
    return str(cfg)


_X = torch.tensor([[0.5, -1.5, 2.0], [3.0, -0.25, 1.0]])
_INSIDE = {
    # torch.func.functionalize: its wrappers report storage bytes but a null data pointer
    "functionalize": lambda x: torch.func.functionalize(lambda v: torch.sin(v))(x),
    # a transposed view and a plain integer tensor inside grad: statistics, CRC-32 and
    # payload of tensors the transform did not wrap need operations on them
    "grad-transposed": lambda x: torch.func.grad(lambda v: torch.sin(v.t()).sum())(x),
    "grad-plain-int": lambda x: torch.func.grad(lambda v: (v * torch.arange(3)).sum())(x),
    "grad-f16": lambda x: torch.func.grad(lambda v: torch.sin(v.half()).float().sum())(x),
}


@pytest.mark.parametrize("task,mode", [("statistics", "statistics"), ("statistics", "md5"), ("tensor", None)])
@pytest.mark.parametrize("case", sorted(_INSIDE))
def test_func_transforms_keep_recording(tmp_path, case, task, mode):
    """Calls inside torch.func transforms are recorded with the values they see, for every
    task and summary mode, and recording goes on after them (before: an internal error
    stopped it: 'address is 0', 'Cannot access data pointer of Tensor that doesn't have
    storage')."""
    x = _X.clone()
    dbg = PrecisionDebugger(config_path=_config(tmp_path, task, mode or "statistics"))
    dbg.start()
    _INSIDE[case](x)
    after = torch.cos(x)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert_record(data["Torch.cos.0.forward"]["output"][0], after)
    if case == "functionalize":
        assert_record(data["Torch.sin.0.forward"]["input_args"][0], x)
        assert_record(data["Torch.sin.0.forward"]["output"][0], torch.sin(x))
    elif case == "grad-transposed":
        assert_record(data["Tensor.t.0.forward"]["output"][0], x.t())
        assert_record(data["Torch.sin.0.forward"]["output"][0], torch.sin(x.t()))
    elif case == "grad-plain-int":
        assert_record(data["Tensor.__mul__.0.forward"]["input_args"][1], torch.arange(3))
    else:
        assert_record(data["Torch.sin.0.forward"]["input_args"][0], x.half())
    if mode == "md5":  # the CRC-32 of the C-order bytes of each recorded tensor
        import zlib

        def crc(t):
            return format(zlib.crc32(t.contiguous().numpy().tobytes()), "08x")

        assert data["Torch.cos.0.forward"]["output"][0]["md5"] == crc(after)
        if case == "grad-transposed":
            assert data["Tensor.t.0.forward"]["output"][0]["md5"] == crc(x.t())
        elif case == "grad-plain-int":
            assert data["Tensor.__mul__.0.forward"]["input_args"][1]["md5"] == crc(torch.arange(3))
    if task == "tensor":
        entry = "Torch.sin.0.forward" if case != "grad-plain-int" else "Tensor.__mul__.0.forward"
        rec = data[entry]["output"][0]
        t = torch.load(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data" / rec["data_name"], weights_only=True)
        assert list(t.shape) == rec["shape"] and float(t.max()) == rec["Max"]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_jit_trace_while_recording(tmp_path, level):
    """torch.jit.trace runs the model twice and compares the graphs: nothing is recorded
    while it traces (the recorder's own views would change the graph); recording goes on
    for the eager calls. Before: TracingCheckError while recording."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    x = torch.randn(2, 3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level)
    dbg.start(model)
    traced = torch.jit.trace(model, x)
    y = traced(x)  # runs in the TorchScript interpreter: not recorded either
    z = model(x)   # eager: recorded
    dbg.stop()
    dbg.close()
    assert torch.equal(y, z)
    data = load_dump(tmp_path / "d")[0]["data"]
    # the eager call, and the eager run trace's check makes (check_trace runs the Python
    # model once more, untraced): same input, same record
    linear = [k for k in data if k.startswith("Functional.linear.")]
    assert linear == ["Functional.linear.0.forward", "Functional.linear.1.forward"]
    for name in linear:
        assert_record(data[name]["output"][0], model[0](x).detach())
