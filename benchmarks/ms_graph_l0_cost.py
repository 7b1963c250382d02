"""Per-step cost of level L0 in MindSpore GRAPH_MODE on CPU (msprobe.mindspore.graph_cells).

One process trains two copies of a network of tests/mindspore/graph_nets.py (graph_train.py's
``Net`` or ``BlockNet``) through ``TrainOneStepCell``: a plain one and one whose graph was
compiled after ``start(net)`` (msprobe's pyfunc ops in it). Steps alternate plain/hooked,
``--pairs`` times in each of four phases:

* ``recorded``: steps in the config's ``step`` list (start/train/stop/step timed);
* ``not recorded``: steps outside the list: the pyfunc ops still copy each Cell input,
  output and Parameter to numpy and call back, which returns at once;
* ``after close()``: the graph keeps the ops (a graph compiled with the hooks keeps them);
  ``rebuilt``: a new ``TrainOneStepCell`` around the same network after ``close()`` (a new
  graph, compiled without them; its first call, the compilation, is not timed).

Prints, per phase, the ratio hooked/plain of the median and of the fastest step, in
process CPU time (every thread: the pyfunc callbacks may run on a MindSpore runtime thread)
and in wall time. Not collected by pytest.

    python benchmarks/ms_graph_l0_cost.py [--net dense|block] [--pairs 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "mindspore"))

import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")

from graph_nets import BlockNet, Net  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402


def _train_cell(net_cls, seed: int = 0):
    net = net_cls()
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    return net, nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 1e-3))


def _timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", choices=("dense", "block"), default="dense")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--batch", type=int, default=5)
    args = p.parse_args(argv)
    net_cls = BlockNet if args.net == "block" else Net
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((args.batch, 4)).astype(np.float32))
    y = Tensor(rng.standard_normal((args.batch, 2)).astype(np.float32))
    _plain_net, plain = _train_cell(net_cls)
    hooked_net, hooked = _train_cell(net_cls)
    with tempfile.TemporaryDirectory(prefix="ms_graph_l0_cost_") as tmp:
        dbg = PrecisionDebugger(dump_path=tmp, level="L0", task="statistics", step=list(range(args.pairs + 1)))

        def recorded():
            dbg.start(hooked_net)
            hooked(x, y).asnumpy()
            dbg.stop()
            dbg.step()

        recorded()                      # step 0: compiles the hooked graph
        plain(x, y).asnumpy()           # compiles the plain graph
        rebuilt = []

        def after_rebuild():
            if not rebuilt:   # a new TrainOneStepCell: its graph is compiled without msprobe's ops
                rebuilt.append(nn.TrainOneStepCell(nn.WithLossCell(hooked_net, nn.MSELoss()),
                                                   nn.SGD(hooked_net.trainable_params(), 1e-3)))
                rebuilt[0](x, y).asnumpy()
            rebuilt[0](x, y).asnumpy()

        phases = {"recorded": recorded, "not recorded": recorded,
                  "after close()": lambda: hooked(x, y).asnumpy(), "rebuilt": after_rebuild}
        print(f"net {args.net}, batch {args.batch}, {args.pairs} pairs per phase; ratio hooked/plain")
        for phase, hooked_step in phases.items():
            if phase == "after close()":
                dbg.close()
            base, inst = [], []
            if phase == "rebuilt":
                hooked_step()
            for _ in range(args.pairs):
                base.append(_timed(lambda: plain(x, y).asnumpy()))
                inst.append(_timed(hooked_step))
            for k, clock in enumerate(("cpu", "wall")):
                b = [t[k] for t in base]
                i = [t[k] for t in inst]
                print(f"{phase:>14} {clock:>4}: median {statistics.median(i) / statistics.median(b):6.2f}x "
                      f"fastest {min(i) / min(b):6.2f}x  (plain median {statistics.median(b) * 1e3:.3f} ms, "
                      f"hooked median {statistics.median(i) * 1e3:.3f} ms)")
        dbg.close()


if __name__ == "__main__":
    main()
