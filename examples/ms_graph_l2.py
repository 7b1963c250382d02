"""msprobe in MindSpore GRAPH_MODE: every kernel of a TrainOneStepCell run (level L2), then SQL.

    python examples/ms_graph_l2.py [--steps 2] [--dump-path ./dump_path_graph]

Trains a small MLP on random data in GRAPH_MODE on the CPU. ``PrecisionDebugger`` (level
L2, an empty ``list``: every kernel) configures MindSpore's kernel dump before the graph
is compiled; ``close()`` reads the dump into msprobe's event log. The script ends with a
query: the output Max and Norm of each forward MatMul kernel, step by step.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

ms.set_context(mode=ms.GRAPH_MODE)   # before PrecisionDebugger and before any graph runs
ms.set_device("CPU")

from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from store.query import query  # noqa: E402
from store.recording import clear_recording  # noqa: E402


class MLP(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(32, 4)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dump-path", default="./dump_path_graph")
    args = parser.parse_args()

    if clear_recording(args.dump_path):   # MindSpore would write this run's files beside the last run's
        print(f"replaced the previous msprobe recording in {Path(args.dump_path).resolve()}", flush=True)
    debugger = PrecisionDebugger(dump_path=args.dump_path, level="L2", task="tensor")
    net = MLP()
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.01, 0.9))
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        x = Tensor(rng.standard_normal((8, 16)).astype(np.float32))
        y = Tensor(rng.standard_normal((8, 4)).astype(np.float32))
        print(f"step {step}: loss {float(train(x, y).asnumpy()):.6f}")
        debugger.step()   # the iterations MindSpore has finished go into the log
    debugger.close()   # reads MindSpore's kernel dump into the event log

    table = query(args.dump_path, "SELECT step, name, max, norm FROM tensors WHERE api_type = 'MatMul' "
                                  "AND direction = 'forward' AND io = 'output' ORDER BY step, seq")
    for row in table.to_pylist():
        print(f"{row['step']}  {row['name']}  max={row['max']:.6g}  norm={row['norm']:.6g}")


if __name__ == "__main__":
    main()
