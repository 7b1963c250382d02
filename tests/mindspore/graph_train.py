"""GRAPH_MODE training script for the level-L2 tests (run as a child process: MindSpore's
mode and its kernel-dump config are per process).

    python graph_train.py CONFIG_JSON [--perturb] [--probe-level LEVEL] [--steps N] [--live-steps]
                                      [--start] [--no-debugger] [--save-state NPZ]

Trains Dense(4→3) → ReLU → Dense(3→2) with MSELoss and SGD through ``TrainOneStepCell``
for ``--steps`` steps (2) on fixed data, recording with ``PrecisionDebugger(CONFIG_JSON)``
(``step()`` after each step; with ``--start``, ``start(net)`` before each step, as level
L0 needs), and prints ``LOSS <float32 bits as hex>`` per step; ``--no-debugger`` trains
without msprobe. ``--live-steps`` prints ``LIVE_STEPS [..]``, the steps in the log before
``close()``. ``--perturb`` adds 1e-3 to ``d2.weight`` before training. ``--probe-level``
first asks for that level and prints ``LEVELERR <message>`` (or ``LEVELOK``).
``--save-state`` writes ``x``, ``y`` and each parameter before step ``s``
(``s{step}.{name}``) to an ``.npz`` file. ``--net block`` trains ``graph_nets.BlockNet``
(a Cell applied twice, a Cell returning a tuple, nested Cells) instead, ``--net tied``
``graph_nets.TiedNet`` (a weight shared by two Cells), ``--net twice`` ``graph_nets.TwiceNet``
(a Cell called twice on the same input), ``--net projection`` ``graph_nets.ProjectionNet``
(a weight also read outside its Cell). ``--pynative`` runs the same in PyNative mode.
``--fault`` makes the recorder fail on each Cell forward it assembles (a fault inside
the running graph's callbacks). ``--compile-first`` trains one step before the first ``start(net)`` (the graph compiles
without msprobe's hooks).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

ms.set_context(mode=ms.PYNATIVE_MODE if "--pynative" in sys.argv else ms.GRAPH_MODE)
ms.set_device("CPU")

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from graph_nets import BlockNet, Net, ProjectionNet, TiedNet, TwiceNet  # noqa: E402

NETS = {"dense": Net, "block": BlockNet, "tied": TiedNet, "twice": TwiceNet, "projection": ProjectionNet}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--perturb", action="store_true")
    parser.add_argument("--probe-level")
    parser.add_argument("--start", action="store_true")
    parser.add_argument("--no-debugger", action="store_true")
    parser.add_argument("--save-state")
    parser.add_argument("--net", choices=tuple(NETS), default="dense")
    parser.add_argument("--compile-first", action="store_true")
    parser.add_argument("--fault", action="store_true")
    parser.add_argument("--pynative", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--live-steps", action="store_true")
    args = parser.parse_args()
    if args.probe_level:
        try:
            PrecisionDebugger(config_path=args.config, level=args.probe_level).close()
            print("LEVELOK", flush=True)
        except ConfigError as exc:
            print("LEVELERR", exc, flush=True)
    debugger = None if args.no_debugger else PrecisionDebugger(config_path=args.config)
    if args.fault and debugger is not None:   # every forward record fails inside the running graph
        def fail(*_a):
            raise RuntimeError("injected fault")
        debugger.recorder._forward = fail
    net = NETS[args.net]()
    rng = np.random.default_rng(0)
    for p in net.get_parameters():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32)))
    if args.perturb:   # --net dense
        net.d2.weight.set_data(Tensor(net.d2.weight.asnumpy() + np.float32(1e-3)))
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
    x = Tensor(rng.standard_normal((5, 4)).astype(np.float32))
    y = Tensor(rng.standard_normal((5, 2)).astype(np.float32))
    state = {"x": x.asnumpy(), "y": y.asnumpy()}
    if args.compile_first:   # the graph compiles before start(net): it runs without msprobe's hooks
        print("LOSS", np.float32(train(x, y).asnumpy()).tobytes().hex(), flush=True)
    for step in range(args.steps):
        state.update({f"s{step}.{p.name}": p.asnumpy().copy() for p in net.trainable_params()})
        if args.start and debugger is not None:
            debugger.start(net)
        loss = train(x, y)
        print("LOSS", np.float32(loss.asnumpy()).tobytes().hex(), flush=True)
        if debugger is not None:
            debugger.step()
    if args.save_state:
        np.savez(args.save_state, **state)
    if debugger is None:
        return
    if args.live_steps:   # what the log holds before close(): the iterations step() read
        from store.query import query
        steps = query(debugger.config.dump_path, "SELECT DISTINCT step FROM calls ORDER BY step").column("step")
        print("LIVE_STEPS", steps.to_pylist(), flush=True)
    debugger.close()


if __name__ == "__main__":
    main()
