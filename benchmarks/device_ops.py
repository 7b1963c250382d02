"""Operations and host synchronisations that msprobe's recording issues per recorded tensor,
counted on the CPU with every tensor forced through the device path.

On a GPU or NPU the recorder's host cost is its kernel launches (~5-8 us of host time each)
and its synchronisations (``.item()``, ``.cpu()``, ``.tolist()`` stall the pipeline). Both
can be counted without an accelerator: ``LeafBuilder.defer_all`` sends CPU tensors through
the code a device tensor takes, and a ``TorchDispatchMode`` sees every ATen operation.

Method, per summary mode (one L1 step of the ``dispatch`` workload of
``benchmarks/workloads.py``, 4 layers by default):

* the same training step is counted twice under the dispatch mode, once not recorded and
  once recorded (``start``/``stop``/``step`` around it); recording never changes the
  training's computation, so the training issues the same operations both times and
  **msprobe's operations are the difference**, operator by operator (an operator the
  recorded step runs fewer times counts as 0, never negative);
* *launches* are the operations that do work (everything but views and other
  metadata-only operators: ``OpOverload.is_view``, ``detach``, ``alias``, ...); *views*
  are counted apart;
* *synchronisations*: ``aten._local_scalar_dense`` (``.item()``, ``float(t)``,
  ``bool(t)``), copies to the CPU from another device, and calls of ``Tensor.cpu``,
  ``Tensor.tolist`` and ``Tensor.numpy`` (on a CPU tensor they cost nothing, on a device
  tensor each waits for the device);
* *flushes*: the session's flush points in the step (``stop()`` and ``step()`` each run
  the flush hooks once);
* *tensors*: the tensor leaves the step records (every tensor of every recorded call).

Prints one line per mode::

    device-ops MODE ops_per_tensor=X syncs_per_flush=Y tensors=N views_per_tensor=V syncs=S flushes=F

Modes: ``statistics``, ``md5``, ``xor``, ``bench_path`` (task tensor, md5, against a
baseline recorded first, nothing differs so nothing is stored), ``tensor`` (task
tensor, every tensor stored). Usage::

    PYTHONPATH=. python benchmarks/device_ops.py [--layers 2] [--modes statistics md5 ...]

Not collected by pytest (no ``test_`` prefix); tests/pytorch/test_device_batched_stats.py,
test_device_checksums.py, test_device_tensor_task.py and test_bench_path_device.py load it by
path.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
MODES = ("statistics", "md5", "xor", "bench_path", "tensor")

#: metadata-only operators that ``OpOverload.is_view`` does not mark (no kernel runs)
_METADATA_ONLY = frozenset({"detach", "alias", "lift_fresh", "_unsafe_view", "set_", "resize_",
                            "_reshape_alias", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
                            "is_same_size", "_has_compatible_shallow_copy_type"})


def _workloads():
    """benchmarks/workloads.py, imported by file path."""
    spec = importlib.util.spec_from_file_location("msprobe_bench_workloads", HERE / "workloads.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class OpCounter(TorchDispatchMode):
    """Counts ATen operations by operator name (``aten.add.Tensor``) and, apart, the
    synchronising ones (:attr:`syncs`). Python-level host reads (``Tensor.cpu``,
    ``tolist``, ``numpy``) are counted while :meth:`patched` is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.ops[name] += 1
        if "_local_scalar_dense" in name:
            self.syncs += 1
        elif name.startswith(("aten._to_copy", "aten.copy_")):
            src = args[-1] if name.startswith("aten.copy_") else args[0]
            dst = kwargs.get("device") if name.startswith("aten._to_copy") else args[0].device
            if (isinstance(src, torch.Tensor) and dst is not None and torch.device(dst).type == "cpu"
                    and src.device.type != "cpu"):
                self.syncs += 1
        return func(*args, **kwargs)

    def patched(self):
        """A context manager counting calls of ``Tensor.cpu``/``tolist``/``numpy`` in
        :attr:`syncs` (each waits for the device when the tensor lives on one)."""
        counter = self

        class _Patch:
            def __enter__(self):
                self.saved = {k: getattr(torch.Tensor, k) for k in ("cpu", "tolist", "numpy")}
                for k, orig in self.saved.items():
                    setattr(torch.Tensor, k, self._counting(orig))
                return counter

            @staticmethod
            def _counting(orig):
                def f(t, *a, **kw):
                    counter.syncs += 1
                    return orig(t, *a, **kw)
                return f

            def __exit__(self, *exc):
                for k, orig in self.saved.items():
                    setattr(torch.Tensor, k, orig)

        return _Patch()


def is_launch(name: str) -> bool:
    """False for views and metadata-only operators (no kernel runs on a device)."""
    base = name.split(".")[1] if name.startswith("aten.") else name
    if base in _METADATA_ONLY:
        return False
    try:
        overload = eval("torch.ops." + name, {"torch": torch})  # noqa: S307  (an operator name)
        return not overload.is_view
    except Exception:  # noqa: BLE001  (an operator outside torch.ops.aten: counted as a launch)
        return True


def config_for(mode: str, dump_path: str, baseline: str | None = None) -> dict:
    """config.json content (L1, every data mode) for ``mode``."""
    task = "tensor" if mode in ("tensor", "bench_path") else "statistics"
    summary = {"statistics": "statistics", "md5": "md5", "xor": "xor", "bench_path": "md5", "tensor": "statistics"}[mode]
    sub = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary}
    if mode == "bench_path":
        sub.update(bench_path=baseline, diff_nums=-1)
    return {"task": task, "dump_path": dump_path, "rank": [], "step": [], "level": "L1", "async_dump": False,
            task: sub}


def count_mode(mode: str, layers: int = 2, work: str | None = None, size: str = "dispatch") -> dict:
    """Counts of one recorded L1 step of the ``size`` workload in summary/task ``mode``
    (see the module docstring). Returns ``{"mode", "tensors", "launches", "views",
    "syncs", "flushes", "ops_per_tensor", "views_per_tensor", "syncs_per_flush",
    "by_op"}`` (``by_op``: msprobe's launches per operator name)."""
    from msprobe.pytorch import PrecisionDebugger

    work = work or tempfile.mkdtemp(prefix="msprobe_device_ops_")
    os.makedirs(work, exist_ok=True)
    wl = _workloads()
    baseline = None
    if mode == "bench_path":  # the baseline: the same step recorded with task tensor, md5, unforced
        baseline = os.path.join(work, "baseline")
        model, train_step = wl.build_encoder(layers, size=size)
        cfg = config_for("tensor", baseline)
        cfg["tensor"]["summary_mode"] = "md5"
        dbg = _debugger(PrecisionDebugger, cfg, work, "baseline")
        train_step()  # warm-up, as below
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()
        dbg.close()

    model, train_step = wl.build_encoder(layers, size=size)
    dbg = _debugger(PrecisionDebugger, config_for(mode, os.path.join(work, mode), baseline), work, mode)
    dbg.recorder.leaves.defer_all = True
    tensors = [0]
    emit = dbg.session.emit

    def counting_emit(call):
        tensors[0] += sum(1 for leaf in call.leaves if leaf.leaf_kind == "tensor")
        return emit(call)

    dbg.session.emit = counting_emit
    flushes = [0]
    hooks = dbg.session._flush_hooks
    hooks.insert(0, lambda: flushes.__setitem__(0, flushes[0] + 1))

    train_step()  # warm-up (first-step allocations and lazy initialisation), not counted
    plain = OpCounter()
    with plain, plain.patched():
        train_step()
    recorded = OpCounter()
    with recorded, recorded.patched():
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()
    dbg.close()
    diff = {k: v - plain.ops.get(k, 0) for k, v in recorded.ops.items() if v > plain.ops.get(k, 0)}
    launches = {k: v for k, v in diff.items() if is_launch(k)}
    n_launch, n_view = sum(launches.values()), sum(v for k, v in diff.items() if k not in launches)
    syncs = max(0, recorded.syncs - plain.syncs)
    n = max(tensors[0], 1)
    return {"mode": mode, "tensors": tensors[0], "launches": n_launch, "views": n_view, "syncs": syncs,
            "flushes": flushes[0], "ops_per_tensor": n_launch / n, "views_per_tensor": n_view / n,
            "syncs_per_flush": syncs / max(flushes[0], 1),
            "by_op": dict(sorted(launches.items(), key=lambda kv: -kv[1]))}


def _debugger(cls, cfg: dict, work: str, name: str):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return cls(config_path=path, dump_path=cfg["dump_path"])


def line(r: dict) -> str:
    """The printed line of one :func:`count_mode` result."""
    return (f"device-ops {r['mode']} ops_per_tensor={r['ops_per_tensor']:.2f} "
            f"syncs_per_flush={r['syncs_per_flush']:.1f} tensors={r['tensors']} "
            f"views_per_tensor={r['views_per_tensor']:.2f} syncs={r['syncs']} flushes={r['flushes']}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--size", default="dispatch", choices=("dispatch", "encoder"))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--top", type=int, default=0, help="also print the N most frequent operators per mode")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for mode in args.modes:
        r = count_mode(mode, args.layers, size=args.size)
        print(line(r), flush=True)
        for name, count in list(r["by_op"].items())[:args.top]:
            print(f"    {count / max(r['tensors'], 1):6.2f}  {name}")


if __name__ == "__main__":
    sys.exit(main())
