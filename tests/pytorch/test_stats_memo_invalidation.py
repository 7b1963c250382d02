"""The statistics memo held across API calls (msprobe.pytorch.stats_memo,
msprobe.pytorch.mutation): writes the version counter or the write rules must see, and
memory the memo must not keep alive. Every recorded value is compared with numpy float64 over
a clone of the tensor taken when it was recorded (zlib CRC-32 for summary_mode md5)."""
from __future__ import annotations

import gc
import json
import weakref
import zlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger


def _record(tmp_path, case, level="L1", md5=False, model=None):
    """Run ``case()`` while recording; it returns ``[(call name, io, index, clone)]``; each
    record must match its clone exactly (Max, Min; CRC-32 with md5)."""
    cfg = {"task": "statistics", "level": level, "dump_path": str(tmp_path / "d")}
    if md5:
        cfg["statistics"] = {"summary_mode": "md5"}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"), model=model)
    dbg.start()
    checks = case()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    for name, io, i, t in checks:
        rec = data[name][io][i]
        a = t.detach().to(torch.float64).numpy()
        assert (rec["Max"], rec["Min"]) == (a.max(), a.min()), (name, io, i, rec["Max"], a.max())
        if md5:
            assert rec["md5"] == format(zlib.crc32(t.detach().contiguous().numpy().tobytes()) & 0xFFFFFFFF, "08x")


def _norm_twice(write, make=lambda: torch.randn(16), alias=False):
    """x recorded by torch.norm, written by ``write(x)``, recorded again."""
    def case():
        x = make()
        torch.norm(x.data if alias else x)
        write(x)
        seen = x.detach().clone()
        torch.norm(x.data if alias else x)
        return [("Torch.norm.1.forward", "input_args", 0, seen)]
    return case


# --- writes the memo misses without a fix --------------------------------------------------------

def _batch_norm_functional():
    rm, rv = torch.zeros(4), torch.ones(4)
    x = torch.randn(8, 4) + 3
    c0 = rm.clone()
    F.batch_norm(x, rm, rv, training=True)      # updates rm/rv in place, bumps no version
    c1, v1 = rm.clone(), rv.clone()
    F.batch_norm(x, rm, rv, training=True)
    return [("Functional.batch_norm.0.forward", "input_args", 1, c0),
            ("Functional.batch_norm.1.forward", "input_args", 1, c1),
            ("Functional.batch_norm.1.forward", "input_args", 2, v1)]


def _batch_norm_module():
    m = nn.BatchNorm1d(4)
    x = torch.randn(8, 4) + 3
    m(x)
    c1 = m.running_mean.clone()
    m(x)
    return [("Functional.batch_norm.1.forward", "input_args", 1, c1)]


@pytest.mark.parametrize("md5", [False, True])
@pytest.mark.parametrize("case", [_batch_norm_functional, _batch_norm_module])
def test_batch_norm_running_statistics_are_not_stale(tmp_path, case, md5):
    """F.batch_norm writes running_mean/running_var without bumping their versions."""
    _record(tmp_path, case, md5=md5)


def test_batch_norm_at_mix(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    _record(tmp_path, _batch_norm_module, level="mix", model=net)


def _fused(opt_cls, **kw):
    def case():
        p = nn.Parameter(torch.randn(16))
        opt = opt_cls([p], lr=0.1, **kw)
        (p * torch.randn(16)).sum().backward()    # p recorded (a parameter: kept)
        opt.step()
        seen = p.detach().clone()
        torch.norm(p)
        return [("Torch.norm.0.forward", "input_args", 0, seen)]
    return case


def _foreach_sgd_through_data():
    p = nn.Parameter(torch.randn(16))
    opt = torch.optim.SGD([p], lr=0.1, foreach=True)
    torch.norm(p.data)                            # held: an alias with its own version counter
    (p * 2).sum().backward()
    opt.step()                                    # torch._foreach_add_: bumps p's counter only
    seen = p.detach().clone()
    torch.norm(p.data)
    return [("Torch.norm.1.forward", "input_args", 0, seen)]


def _amp_unscale():
    g = torch.randn(16) * 100
    torch.norm(g.data)
    torch._amp_foreach_non_finite_check_and_unscale_([g], torch.zeros(1), torch.tensor(0.01))
    seen = g.clone()
    torch.norm(g.data)
    return [("Torch.norm.1.forward", "input_args", 0, seen)]


def _clip(foreach):
    def case():
        p = nn.Parameter(torch.randn(16))
        (p * p * 10).sum().backward()
        torch.norm(p.grad.data)
        torch.nn.utils.clip_grad_norm_([p], 0.1, foreach=foreach)
        seen = p.grad.clone()
        torch.norm(p.grad.data)
        return [("Torch.norm.1.forward", "input_args", 0, seen)]
    return case


@pytest.mark.parametrize("case", [
    _fused(torch.optim.Adam, fused=True),
    _fused(torch.optim.AdamW, fused=True),
    _fused(torch.optim.SGD, fused=True, momentum=0.9),
    _foreach_sgd_through_data,
    _amp_unscale,
    _clip(True),
    _norm_twice(lambda x: torch._foreach_mul_([x], 3.0), alias=True),
    _norm_twice(lambda x: x.apply_(lambda v: v + 10)),
    _norm_twice(lambda x: x.data.apply_(lambda v: v + 10)),
    _norm_twice(lambda x: x.data.map_(torch.ones(16), lambda a, b: a + b)),
], ids=["adam-fused", "adamw-fused", "sgd-fused", "sgd-foreach-data", "amp-unscale", "clip-foreach", "foreach-mul",
        "apply", "data-apply", "data-map"])
def test_inplace_apis_outside_the_api_list(tmp_path, case):
    """In-place APIs the API list does not intercept (fused optimizers, torch._foreach_*,
    Tensor.apply_/map_) may write without bumping the version the memo checks."""
    _record(tmp_path, case)


def test_write_through_a_storage_with_another_base_address(tmp_path):
    """torch.from_numpy(x.numpy()[2:]) shares x's memory in a storage of its own whose
    address is inside x's: its in-place call must forget x."""
    _record(tmp_path, _norm_twice(lambda x: torch.from_numpy(x.numpy()[2:]).mul_(5)))


# --- writes already seen (regression tests) -------------------------------------------------------

def _sgd(foreach):
    def case():
        p = nn.Parameter(torch.randn(16))
        opt = torch.optim.SGD([p], lr=0.5, momentum=0.9, foreach=foreach)
        for _ in range(2):
            (p * p).sum().backward()
            opt.step()
            opt.zero_grad()
        seen = p.detach().clone()
        torch.norm(p)
        return [("Torch.norm.0.forward", "input_args", 0, seen)]
    return case


def _adam(foreach):
    def case():
        p = nn.Parameter(torch.randn(16))
        opt = torch.optim.Adam([p], lr=0.5, foreach=foreach)
        torch.norm(p)
        (p * p).sum().backward()
        opt.step()
        seen = p.detach().clone()
        torch.norm(p)
        return [("Torch.norm.1.forward", "input_args", 0, seen)]
    return case


def _setitem_view_of_parameter():
    p = nn.Parameter(torch.randn(4, 4))
    torch.norm(p)
    w = p.data[1]
    w[2] = 77.0
    seen = p.detach().clone()
    torch.norm(p)
    return [("Torch.norm.1.forward", "input_args", 0, seen)]


def _unfold_view():
    x = torch.randn(16)
    u = x.data.unfold(0, 4, 4)
    torch.norm(u)
    x.data[5] = 99.0
    seen = u.clone()
    torch.norm(u)
    return [("Torch.norm.1.forward", "input_args", 0, seen)]


def _grad_hook_inplace():
    p = nn.Parameter(torch.randn(16))
    h = p.register_hook(lambda g: g.data.mul_(100))
    torch.sin(p).sum().backward()
    h.remove()
    seen = p.grad.clone()
    torch.norm(p.grad)
    return [("Torch.norm.0.forward", "input_args", 0, seen)]


def _grad_accumulation():
    p = nn.Parameter(torch.randn(16))
    (p * 3).sum().backward()
    torch.norm(p.grad)
    (p * 5).sum().backward()
    seen = p.grad.clone()
    torch.norm(p.grad)
    return [("Torch.norm.1.forward", "input_args", 0, seen)]


def _no_grad_add():
    with torch.no_grad():
        return _norm_twice(lambda x: x.add_(5))()


def _inference_mode_add():
    def write(x):
        with torch.inference_mode():
            x.add_(5)
    return _norm_twice(write)()


def _embedding_max_norm():
    w = torch.randn(10, 4) * 10
    torch.norm(w)
    F.embedding(torch.tensor([1, 2]), w, max_norm=1.0)   # torch.embedding_renorm_ inside
    seen = w.clone()
    torch.norm(w)
    return [("Torch.norm.1.forward", "input_args", 0, seen)]


def _checkpointed():
    from torch.utils.checkpoint import checkpoint
    x = torch.randn(16, requires_grad=True)
    y = checkpoint(lambda a: torch.sin(a) * 2, x, use_reentrant=False)
    y.sum().backward()
    seen = x.grad.clone()
    torch.norm(x.grad)
    return [("Torch.norm.0.forward", "input_args", 0, seen)]


@pytest.mark.parametrize("case", [
    _norm_twice(lambda x: x.data.mul_(5)),
    _norm_twice(lambda x: x.detach().mul_(5)),
    _norm_twice(lambda x: x.data.as_strided((2,), (5,), 1).fill_(100.0), make=lambda: torch.randn(4, 4)),
    _norm_twice(lambda x: x.data[:, 1].copy_(torch.full((4,), 55.0)), make=lambda: torch.randn(4, 4)),
    _norm_twice(lambda x: x.data.set_(torch.randn(16) * 10)),
    _norm_twice(lambda x: x.data.resize_(4)),
    _norm_twice(lambda x: torch.exp(torch.randn(16), out=x.data)),
    _norm_twice(lambda x: nn.init.uniform_(x, 5, 6), make=lambda: nn.Parameter(torch.randn(16))),
    _norm_twice(lambda x: nn.init.constant_(x.data, 3.0), make=lambda: nn.Parameter(torch.randn(16))),
    _no_grad_add, _inference_mode_add, _setitem_view_of_parameter, _unfold_view,
    _sgd(False), _sgd(True), _adam(False), _adam(True), _clip(False),
    _grad_hook_inplace, _grad_accumulation, _embedding_max_norm, _checkpointed,
])
def test_writes_already_seen(tmp_path, case):
    _record(tmp_path, case)


# --- memory --------------------------------------------------------------------------------------

class _Payload:
    pass


class _Twice(torch.autograd.Function):
    ref = None

    @staticmethod
    def forward(ctx, x):
        ctx.payload = _Payload()                  # lives as long as the autograd graph
        _Twice.ref = weakref.ref(ctx.payload)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.usefixtures("memo_all_sizes")
def test_memo_does_not_keep_the_autograd_graph_alive(tmp_path):
    """A remembered activation must not hold its autograd graph (saved tensors, far more
    than the bytes the memo counts) once the user dropped it."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    u = _Twice.apply(torch.randn(8, requires_grad=True))
    y = torch.sigmoid(u)                          # u and y remembered
    assert len(dbg.recorder.leaves.memo) >= 2
    del u, y
    gc.collect()
    assert _Twice.ref() is None
    dbg.stop()
    dbg.close()


def test_memo_does_not_keep_dropped_parameters_alive(tmp_path):
    """Parameters are remembered until the next clear, but not kept alive by it: models
    built and dropped inside one recording window are freed."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    refs = []
    for _ in range(4):
        lin = nn.Linear(32, 32)
        refs.append(weakref.ref(lin.weight))
        lin(torch.randn(2, 32))
        del lin
    gc.collect()
    assert [r() for r in refs] == [None] * 4
    dbg.stop()
    dbg.close()


# --- write rules and hook installation ------------------------------------------------------------

def test_write_rules_of_dunder_and_functional_calls():
    from msprobe.pytorch.mutation import READS, WRITES_ARGS, WriteRule
    x = torch.randn(3)
    for name in ("__invert__", "__int__", "__index__", "__iter__"):   # read only
        assert WriteRule("Tensor", name, None).check((x,), {}) == READS
    for name in ("__imatmul__", "__ixor__", "__setitem__"):
        assert WriteRule("Tensor", name, None).check((x,), {}) == WRITES_ARGS
    assert WriteRule("Functional", "batch_norm", F.batch_norm).check((x,), {}) == WRITES_ARGS
    assert WriteRule("Torch", "native_batch_norm", None).check((x,), {}) == WRITES_ARGS
    assert WriteRule("Functional", "instance_norm", F.instance_norm).check((x,), {}) == WRITES_ARGS
    assert WriteRule("Functional", "layer_norm", F.layer_norm).check((x,), {}) == READS


def test_unlisted_inplace_wrappers_are_removed(tmp_path):
    # what an earlier debugger of this process left open (never closed) stays as it was
    originals = (torch._foreach_add_, torch._fused_adam_)
    apply_before = vars(torch.Tensor).get("apply_")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    assert torch._foreach_add_ is not originals[0]
    assert vars(torch.Tensor).get("apply_") not in (None, apply_before)
    assert torch._foreach_add_.__msprobe_original__ is originals[0]
    dbg.stop()
    dbg.close()
    assert (torch._foreach_add_, torch._fused_adam_) == originals
    assert vars(torch.Tensor).get("apply_") is apply_before


def _out_given_positionally(write):
    """o remembered as torch.sin's output, written through ``write(o.data)`` by a call
    whose inputs are not recorded, recorded again as the output of o.reshape (same key)."""
    def case():
        o = torch.sin(torch.randn(4, 4))
        write(o.data)
        seen = o.clone()
        o.reshape(4, 4)
        return [("Tensor.reshape.0.forward", "output", 0, seen)]
    return case


@pytest.mark.parametrize("extra", [{"data_mode": ["output"]}, {"list": ["Torch.sin", "Tensor.reshape"]}],
                         ids=["output-only", "list"])
@pytest.mark.parametrize("write", [
    lambda out: torch.norm(torch.randn(4, 4) * 9, 2, 1, False, out[0]),      # norm(input, p, dim, keepdim, out)
    lambda out: F.normalize(torch.randn(4, 4) * 9, 2.0, 0, 1e-12, out),       # normalize(input, p, dim, eps, out)
    lambda out: torch.tensordot(torch.randn(4, 3) * 9, torch.randn(3, 4), 1, out),
], ids=["norm", "normalize", "tensordot"])
def test_out_given_positionally(tmp_path, write, extra):
    """Python-level APIs take ``out`` positionally; the rule must see it (here the writing
    call's inputs are not recorded, so nothing else replaces the stale entry)."""
    cfg = {"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "d"), "statistics": extra}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    dbg.start()
    checks = _out_given_positionally(write)()
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    (name, io, i, seen), = checks
    assert data[name][io][i]["Max"] == seen.max().item()


# --- threads ----------------------------------------------------------------------------------

def _write_in_other_thread(tmp_path, write):
    """The main thread records x while another thread's in-place call on x is under way
    (``write(x, pause)``: ``pause()`` blocks until that record is made, before the call
    writes), then records x again once the write is done: the second record must not reuse
    the first."""
    import threading
    torch.manual_seed(0)
    x = torch.randn(64)
    started, recorded = threading.Event(), threading.Event()

    def pause():
        if not started.is_set():
            started.set()
            assert recorded.wait(10)

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    dbg.start()
    th = threading.Thread(target=write, args=(x, pause))
    th.start()
    assert started.wait(10)
    torch.norm(x)                     # values of before the write (it has not started)
    recorded.set()
    th.join(10)
    seen = x.clone()
    torch.norm(x)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    assert data["Torch.norm.1.forward"]["input_args"][0]["Max"] == seen.max().item()


def test_unlisted_write_in_another_thread(tmp_path):
    def write(x, pause):
        def f(v):
            pause()
            return v + 10
        x.apply_(f)                   # Tensor.apply_: outside the API list, no version bump
    _write_in_other_thread(tmp_path, write)


def test_recorded_write_in_another_thread(tmp_path):
    class Index:                      # the index is read before Tensor.__setitem__ writes
        def __init__(self, pause):
            self.pause = pause

        def __index__(self):
            self.pause()
            return 3

    def write(x, pause):
        x.data[Index(pause)] = 1000.0  # through .data: x's version is not bumped
    _write_in_other_thread(tmp_path, write)


def test_memo_bookkeeping_consistent_under_threads():
    """put/release/clear from several threads (the recorder runs in any thread that calls
    an API): every entry stays indexed by its storage (else a later in-place call would not
    forget it) and the byte count matches the entries counted."""
    import sys
    import threading
    from msprobe.pytorch.stats_memo import StatsMemo
    memo = StatsMemo(enabled=True, limit=4)
    pool = [torch.randn(8) for _ in range(12)] + [nn.Parameter(torch.randn(4)) for _ in range(4)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(3000):
            i, op = torch.randint(len(pool), (2,), generator=g).tolist()
            t = pool[i]
            if op % 8 == 0:
                memo.clear()
            elif op % 2:
                memo.release((t,), {})
            else:
                memo.put(t, i)

    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    for key, e in memo._entries.items():
        assert key in memo._by_storage.get(e[3], ()), key
    assert memo._held == sum(memo._order.values())
    assert set(memo._order) <= set(memo._entries)


def test_put_during_clear_in_another_thread_stays_releasable():
    """Thread B clears the memo while thread A remembers x (forced interleaving: A's put
    runs right after B emptied the entries, before B empties the storage index). The entry
    A made must still be forgotten by an in-place call on x's storage."""
    import threading
    from msprobe.pytorch.stats_memo import StatsMemo
    x = torch.randn(8)
    memo = StatsMemo(enabled=True)
    a_done = threading.Event()

    class Entries(dict):
        def clear(self):
            super().clear()
            if not a_done.is_set():
                th = threading.Thread(target=lambda: (memo.put(x, "x"), a_done.set()))
                th.start()
                th.join(0.5)      # a memo that serializes put and clear makes A wait: go on

    memo._entries = Entries()
    memo.put(torch.randn(4), "y")
    memo.clear()
    assert a_done.wait(10)
    memo.release((x.data,), {})   # an in-place call on x's storage (through .data: no version bump)
    assert memo.get(x) is None
