"""The statistics memo and the fast statistics path record each tensor's real values at the
moment it was recorded (compared with numpy float64 and zlib CRC-32)."""
import json
import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.stats import SMALL_NUMEL, tensor_stats
from msprobe.pytorch.stats_memo import StatsMemo


def _stats64(t):
    a = t.detach().to(torch.float64).numpy()
    return float(a.max()), float(a.min()), float(a.mean())


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Tanh()

    def forward(self, x):
        h = self.a(x)
        h.data.mul_(-3)          # no version bump on h; no API hooks at L0 to clear the memo
        return self.b(h)


def test_L0_data_write_between_modules(tmp_path):
    torch.manual_seed(0)
    net, x = Two(), torch.randn(4, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", model=net)
    dbg.start()
    captured = {}
    net.b.register_forward_pre_hook(lambda m, a: captured.setdefault("h", a[0].detach().clone()))
    net(x)
    dbg.stop(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    rec = data["Module.b.Tanh.forward.0"]["input_args"][0]
    mx, mn, mean = _stats64(captured["h"])
    assert (rec["Max"], rec["Min"]) == (mx, mn)


def test_neg_view_shares_key(tmp_path):
    """x.conj().imag is a neg-bit view with the same data_ptr/dtype/shape/stride as x.imag."""
    torch.manual_seed(1)
    z = torch.randn(16, dtype=torch.complex64)
    a, b = z.imag, z.conj().imag
    assert b.is_neg() and a.data_ptr() == b.data_ptr()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    torch.add(a, b)
    dbg.stop(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    rec = data["Torch.add.0.forward"]["input_args"][1]
    mx, mn, mean = _stats64(b)
    assert (rec["Max"], rec["Min"]) == (mx, mn), (rec["Max"], rec["Min"], mx, mn)


def test_conj_view_crc(tmp_path):
    """md5 mode: x and x.conj() share the key; their host bytes (conj resolved) differ."""
    torch.manual_seed(2)
    z = torch.randn(16, dtype=torch.complex64)
    import json
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "level": "L1",
                               "statistics": {"summary_mode": "md5"}}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    dbg.start()
    torch.add(z, z.conj())
    dbg.stop(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    recs = data["Torch.add.0.forward"]["input_args"]
    crc = lambda t: format(zlib.crc32(t.resolve_conj().numpy().tobytes()) & 0xFFFFFFFF, "08x")
    assert [r["md5"] for r in recs] == [crc(z), crc(z.conj())]



def _run(tmp_path, stop_before_backward):
    torch.manual_seed(0)
    x = torch.randn(32, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    y = torch.exp(x)
    seen = {}
    def hook(g):                       # user gradient hook writing through .data (no version bump)
        g.data.mul_(10)
        seen["g"] = g.detach().clone()
    y.register_hook(hook)
    z = torch.tanh(y)
    if stop_before_backward:
        dbg.stop()
    z.sum().backward()
    if not stop_before_backward:
        dbg.stop()
    dbg.step(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    return data, seen["g"]


def test_hook_write_during_backward_after_stop(tmp_path):
    data, g = _run(tmp_path, True)
    assert data["Torch.exp.0.backward"]["input"][0]["Max"] == float(g.max())


def test_hook_write_during_backward_while_recording(tmp_path):
    data, g = _run(tmp_path, False)
    assert data["Torch.exp.0.backward"]["input"][0]["Max"] == float(g.max())



def test_debug_level_save_after_data_write(tmp_path):
    """Level debug installs no API hooks and start/stop/step are no-ops: the memo is never
    cleared, so a tensor saved again after a write that bumps no version (.data, a
    collective, numpy) keeps its first statistics."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="debug")
    buf = torch.ones(16)
    for i in range(3):
        PrecisionDebugger.save(buf, "buf", save_backward=False)
        buf.data.mul_(2)             # stands for dist.all_reduce(buf) / an optimizer's p.data update
    dbg.close()
    data = json.loads((tmp_path / "rank" / "debug.json").read_text())["data"]
    assert [data[f"buf.{k}"]["Max"] for k in range(3)] == [1.0, 2.0, 4.0]



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e-20, 1e-23, 1e-30])
def test_large_tiny_values_norm(dtype, scale):
    """Gradients of 1e-20..1e-30 are ordinary in float32/bf16; their squares underflow float32."""
    torch.manual_seed(0)
    t = (torch.randn(SMALL_NUMEL * 2) * scale).to(dtype)
    a = t.double().numpy()
    assert tensor_stats(t).norm == pytest.approx(math.sqrt(float((a * a).sum())), rel=1e-6, abs=0.0)


def test_freed_storage_gives_null_statistics():
    """FSDP frees a parameter's storage by resizing it to 0 bytes; its values cannot be read."""
    for n in (16, SMALL_NUMEL * 2):
        t = torch.randn(n)
        t.untyped_storage().resize_(0)
        s = tensor_stats(t)
        assert (s.max, s.min, s.mean, s.norm) == (None, None, None, None)


def test_memo_limit_is_validated():
    with pytest.raises(ValueError, match="limit"):
        StatsMemo(enabled=True, limit=0)


@pytest.mark.parametrize("first_0dim", [False, True])
def test_0dim_and_1_element_over_one_address_keep_their_means(tmp_path, first_0dim):
    """A 0-dim tensor reports its value as Mean (-0.0 stays -0.0, spec section 9); a
    1-element 1-d tensor over the same memory reports sum / 1 = +0.0 (what torch.mean and a
    float64 numpy sum from +0.0 give). The memo must not hand one's Mean to the other."""
    x = torch.tensor([-0.0, 2.0])
    one, zero_dim = x[0:1], x[0]
    assert one.data_ptr() == zero_dim.data_ptr() and zero_dim.dim() == 0
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    if first_0dim:
        torch.neg(zero_dim); torch.neg(one)
    else:
        torch.neg(one); torch.neg(zero_dim)
    dbg.stop(); dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    by_shape = {tuple(e["input_args"][0]["shape"]): e["input_args"][0] for e in data.values()}
    expected_one = float(np.add.reduce(np.array([-0.0]), initial=0.0)) / 1  # +0.0
    assert math.copysign(1.0, by_shape[(1,)]["Mean"]) == math.copysign(1.0, expected_one) == 1.0
    assert math.copysign(1.0, by_shape[()]["Mean"]) == -1.0  # its value, -0.0
    assert by_shape[()]["Max"] == by_shape[()]["Min"] == 0.0
