#!/usr/bin/env python
"""MindSpore ops and host synchronisations that msprobe's recording issues per recorded
tensor, counted on the CPU (the MindSpore counterpart of ``benchmarks/device_ops.py``).

``MSPROBE_MS_DEVICE_STATS=1`` sends CPU tensors through the code a GPU/Ascend tensor takes
(:mod:`msprobe.mindspore.device_stats`); the counts are exact and independent of the
machine's load. Method, per mode (one recorded training step of ``examples/ms_char_lm.py``'s
model, level L1 by default, after one unrecorded warm-up step):

* *syncs*: calls of ``Tensor.asnumpy``, ``Tensor.item``, ``Tensor.tolist`` and
  ``Tensor.__float__``/``__int__``/``__bool__`` (each waits for MindSpore's op queue; the
  outermost call only), in the recorded step (``start()`` .. ``close()``) minus those of the
  same step unrecorded;
* *ops*: MindSpore ops that :class:`msprobe.mindspore.device_stats.DeviceStats` issues
  (every call of a ``mindspore.ops``/``mint`` function or ``Tensor.__mul__`` made inside
  ``DeviceStats.add`` and ``DeviceStats._measure``, and the host→device copy of the segment
  ids); *views* (``reshape``, ``narrow``) are counted apart. The host path issues none;
* *flushes*: runs of the session's flush hooks (``stop()``, ``step()``, ``close()``: 3);
* *tensors*: tensor leaves built (every tensor of every recorded call).

Prints one line per mode::

    ms-device-ops MODE ops_per_tensor=X syncs_per_flush=Y tensors=N views_per_tensor=V syncs=S flushes=F

Modes: ``statistics`` (device path forced), ``statistics_host`` (the host path, the CPU
default), ``md5`` and ``tensor`` (host path on every device: the CRC-32 and the ``.npy``
files need each tensor's bytes on the host). Usage::

    PYTHONPATH=. python benchmarks/ms_device_ops.py [--level L1] [--modes statistics md5 ...]
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = ("statistics", "statistics_host", "md5", "tensor")
_SYNCS = ("asnumpy", "item", "tolist", "__float__", "__int__", "__bool__")
_VIEWS = frozenset({"reshape", "narrow"})


def _example():
    spec = importlib.util.spec_from_file_location("ms_char_lm", REPO / "examples" / "ms_char_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Counter:
    """Patches MindSpore's synchronising Tensor methods and ``device_stats``'s op
    namespaces; ``syncs``, ``ops`` (name -> count), ``tensors`` and ``flushes`` count
    while ``active``. :meth:`restore` undoes every patch."""

    def __init__(self) -> None:
        from mindspore import Tensor

        from msprobe.mindspore import device_stats
        from msprobe.mindspore.leaves import LeafBuilder

        self.active = False
        self.syncs = 0
        self.ops: collections.Counter = collections.Counter()
        self.tensors = 0
        self.flushes = 0
        self._local = threading.local()
        self._undo: list = []
        for name in _SYNCS:
            self._patch(Tensor, name, self._sync_wrapper(getattr(Tensor, name)))
        inside = self._inside_wrapper
        self._patch(device_stats.DeviceStats, "add", inside(device_stats.DeviceStats.add))
        self._patch(device_stats.DeviceStats, "_measure", inside(device_stats.DeviceStats._measure))
        self._patch(device_stats, "ops", _Namespace(device_stats.ops, self))
        self._patch(device_stats, "mint", _Namespace(device_stats.mint, self))
        self._patch(device_stats, "Tensor", self._op_wrapper("Tensor(ids)", Tensor))
        self._patch(Tensor, "__mul__", self._op_wrapper("mul", Tensor.__mul__))
        original_leaf = LeafBuilder.tensor_leaf

        def tensor_leaf(builder, *args, **kwargs):
            if self.active:
                self.tensors += 1
            return original_leaf(builder, *args, **kwargs)

        self._patch(LeafBuilder, "tensor_leaf", tensor_leaf)

    def _patch(self, owner, name, value) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def restore(self) -> None:
        while self._undo:
            owner, name, value = self._undo.pop()
            setattr(owner, name, value)

    def _sync_wrapper(self, fn):
        local = self._local

        def wrapped(*args, **kwargs):
            if getattr(local, "in_sync", False):
                return fn(*args, **kwargs)
            local.in_sync = True
            try:
                if self.active:
                    self.syncs += 1
                return fn(*args, **kwargs)
            finally:
                local.in_sync = False

        return wrapped

    def _inside_wrapper(self, fn):
        local = self._local

        def wrapped(*args, **kwargs):
            outer = getattr(local, "inside", False)
            local.inside = True
            try:
                return fn(*args, **kwargs)
            finally:
                local.inside = outer

        return wrapped

    def _op_wrapper(self, name, fn):
        local = self._local

        def wrapped(*args, **kwargs):
            if self.active and getattr(local, "inside", False):
                self.ops[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    def count_flushes(self, session) -> None:
        """Count the runs of ``session``'s flush hooks from now on."""
        original = session._run_flush_hooks

        def run():
            if self.active:
                self.flushes += 1
            return original()

        session._run_flush_hooks = run


class _Namespace:
    """A module whose callables count as ops (views apart) inside ``DeviceStats``."""

    def __init__(self, module, counter: Counter) -> None:
        self._module = module
        self._counter = counter

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not callable(value):
            return value
        return self._counter._op_wrapper(name, value)


def _step(net, opt, grad_fn, x, y) -> None:
    from mindspore import Tensor

    _loss, grads = grad_fn(Tensor(x), Tensor(y))
    opt(grads)


def count(mode: str, level: str) -> dict:
    """Counts of one recorded step of ``mode`` (one of :data:`MODES`) at ``level``: a dict
    with ``ops_per_tensor``, ``views_per_tensor``, ``syncs``, ``flushes``, ``tensors`` and
    ``by_op`` (op name -> count); see the module docstring."""
    import mindspore as ms
    from mindspore import nn

    from msprobe.mindspore import PrecisionDebugger

    ex = _example()
    ms.set_device("CPU")
    vocab, batches = ex.make_batches(ex.load_text(), 3)
    net = ex.build_model(vocab)
    opt = nn.Adam(net.trainable_params(), learning_rate=ex.LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    before = os.environ.get("MSPROBE_MS_DEVICE_STATS")
    os.environ["MSPROBE_MS_DEVICE_STATS"] = "1" if mode == "statistics" else "0"
    task = "tensor" if mode == "tensor" else "statistics"
    summary = "md5" if mode == "md5" else "statistics"  # task tensor: statistics beside the files
    if mode not in MODES:
        raise ValueError(f"ms_device_ops: mode {mode!r}; allowed: {', '.join(MODES)}")
    counter = Counter()
    try:
        _step(net, opt, grad_fn, *batches[0])  # warm-up
        counter.active = True
        _step(net, opt, grad_fn, *batches[1])
        counter.active = False
        plain = counter.syncs
        counter.syncs = 0
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d) / "config.json"
            cfg.write_text(json.dumps({"task": task, "dump_path": str(Path(d) / "dump"), "level": level,
                                       task: {"summary_mode": summary} if task == "statistics" else {}}))
            dbg = PrecisionDebugger(config_path=str(cfg))
            counter.count_flushes(dbg.session)
            counter.active = True
            dbg.start(net)
            _step(net, opt, grad_fn, *batches[2])
            dbg.stop()
            dbg.step()
            dbg.close()
            counter.active = False
    finally:
        counter.restore()
        if before is None:
            os.environ.pop("MSPROBE_MS_DEVICE_STATS", None)
        else:
            os.environ["MSPROBE_MS_DEVICE_STATS"] = before
    views = sum(n for name, n in counter.ops.items() if name in _VIEWS)
    ops_ = sum(n for name, n in counter.ops.items() if name not in _VIEWS)
    syncs = max(counter.syncs - plain, 0)
    n = max(counter.tensors, 1)
    return {"mode": mode, "ops_per_tensor": ops_ / n, "views_per_tensor": views / n, "syncs": syncs,
            "flushes": counter.flushes, "tensors": counter.tensors, "by_op": dict(counter.ops)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--by-op", action="store_true", help="also print the ops counted, by name")
    args = parser.parse_args()
    for mode in args.modes:
        r = count(mode, args.level)
        print(f"ms-device-ops {mode} ops_per_tensor={r['ops_per_tensor']:.2f} "
              f"syncs_per_flush={r['syncs'] / max(r['flushes'], 1):.2f} tensors={r['tensors']} "
              f"views_per_tensor={r['views_per_tensor']:.2f} syncs={r['syncs']} flushes={r['flushes']}")
        if args.by_op:
            print("   ", r["by_op"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
