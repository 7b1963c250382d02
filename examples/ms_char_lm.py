#!/usr/bin/env python
"""A small MindSpore character-level language model, trained with msprobe recording.

The text is Python's own help pages (``pydoc_data.topics.topics``), so nothing is
downloaded. The model predicts the next character from the previous ``CONTEXT``
characters (embedding → Dense → ReLU → LayerNorm → Dense), trained with Adam through
``mindspore.value_and_grad`` in PyNative mode on CPU. The recorder runs at level ``mix``
(task ``statistics``): every MindSpore API, Primitive and Cell forward/backward and every
parameter gradient of each step is recorded with its Max/Min/Mean/Norm::

    python examples/ms_char_lm.py                       # 8 steps, dump in ./dump_path_ms
    python examples/ms_char_lm.py --steps 2 --dump-path /tmp/dump

At the end it prints the step directories written and the ten largest parameter-gradient
norms, found with SQL over the recording (:func:`store.query.query`) — the same query as
the PyTorch example, over a MindSpore dump. Its default dump path, ``./dump_path_ms``,
differs from the PyTorch example's ``./dump_path``, so running both keeps two dumps.

Each run starts from a clean dump: when the dump path already holds a msprobe recording
(a ``.msprobe`` directory inside), the example removes that recording first and prints one
line saying so, so that a rerun never mixes two runs' logs. It never removes anything else:
a dump path holding other files stops it with a message instead.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import numpy as np

SEED = 0
CONTEXT = 8
EMBED = 16
HIDDEN = 64
BATCH_SIZE = 32
LEARNING_RATE = 3e-3

#: The ten largest parameter-gradient norms of the whole run.
TOP_GRAD_NORMS_SQL = (
    "SELECT step, name, io AS param, norm FROM tensors "
    "WHERE direction = 'backward' AND name LIKE '%.parameters_grad' "
    "ORDER BY norm DESC, step, name, param LIMIT 10"
)


def load_text() -> str:
    """The help texts of ``pydoc_data.topics``, joined in sorted topic order."""
    from pydoc_data.topics import topics

    return "\n".join(topics[key] for key in sorted(topics))


def make_batches(text: str, steps: int, *, seed: int = SEED) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """``(vocab_size, batches)``: ``steps`` batches ``(x, y)``, ``x`` int32
    ``(BATCH_SIZE, CONTEXT)`` character indices, ``y`` int32 ``(BATCH_SIZE,)`` the next one,
    at random offsets from ``numpy.random.default_rng(seed)``."""
    vocab = {ch: i for i, ch in enumerate(sorted(set(text)))}
    data = np.array([vocab[ch] for ch in text], dtype=np.int32)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        starts = rng.integers(0, len(data) - CONTEXT - 1, BATCH_SIZE)
        x = np.stack([data[s:s + CONTEXT] for s in starts])
        y = data[starts + CONTEXT]
        batches.append((x, y))
    return len(vocab), batches


def build_model(vocab_size: int, seed: int = SEED):
    """The network (a ``mindspore.nn.Cell``), weights from ``numpy.random.default_rng(seed)``."""
    import mindspore as ms
    from mindspore import nn

    class CharMLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, EMBED)
            self.hidden = nn.Dense(CONTEXT * EMBED, HIDDEN)
            self.act = nn.ReLU()
            self.norm = nn.LayerNorm((HIDDEN,))
            self.head = nn.Dense(HIDDEN, vocab_size)

        def construct(self, x):
            h = self.embed(x).reshape(x.shape[0], -1)
            return self.head(self.norm(self.act(self.hidden(h))))

    net = CharMLP()
    rng = np.random.default_rng(seed)
    for p in net.trainable_params():
        if "norm" not in p.name:
            p.set_data(ms.Tensor((rng.standard_normal(p.shape) * 0.1).astype(np.float32)))
    return net


def train(steps: int = 8, dump_path: str = "./dump_path_ms", record: bool = True, *,
          verbose: bool = False) -> list[np.ndarray]:
    """Train for ``steps`` Adam steps; returns each step's loss (0-dim float32 arrays).

    ``dump_path`` is the msprobe output directory (used when ``record``); an earlier msprobe
    recording there is replaced (:func:`store.recording.clear_recording`, one line printed). The same
    ``steps`` give bit-identical losses with and without ``record``.

    Raises:
        FileExistsError: ``dump_path`` holds something that is not a msprobe recording.
    """
    if record:
        from store.recording import clear_recording

        if clear_recording(dump_path):
            print(f"replaced the previous msprobe recording in {Path(dump_path).resolve()}", flush=True)
    import mindspore as ms
    from mindspore import Tensor, nn

    ms.set_device("CPU")
    vocab_size, batches = make_batches(load_text(), steps)
    net = build_model(vocab_size)
    optimizer = nn.Adam(net.trainable_params(), learning_rate=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    debugger = None
    if record:
        from msprobe.mindspore import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=dump_path, level="mix")
    losses = []
    try:
        for step, (x, y) in enumerate(batches):
            if debugger is not None:
                debugger.start(net)
            loss, grads = grad_fn(Tensor(x), Tensor(y))
            optimizer(grads)
            if debugger is not None:
                debugger.stop()
                debugger.step()
            losses.append(loss.asnumpy())
            if verbose:
                print(f"step {step}: loss {float(losses[-1])!r}", flush=True)
    finally:
        if debugger is not None:
            debugger.close()
    return losses


def top_grad_norms(dump_path: str):
    """The result (a ``pyarrow.Table``) of :data:`TOP_GRAD_NORMS_SQL` over ``dump_path``."""
    from store.query import query

    return query(dump_path, TOP_GRAD_NORMS_SQL)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps (default 8)")
    parser.add_argument("--dump-path", default="./dump_path_ms",
                        help="msprobe output directory (default ./dump_path_ms); a msprobe recording "
                             "already there is replaced, a directory holding anything else is left "
                             "alone and the example stops")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        train(args.steps, args.dump_path, record=True, verbose=True)
    except FileExistsError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    step_dirs = sorted(Path(args.dump_path).glob("step*/*/dump.json"),
                       key=lambda p: int(p.parent.parent.name[len("step"):]))
    print(f"\ndump written to {Path(args.dump_path).resolve()}:")
    for dump_json in step_dirs:
        print(f"  {dump_json.parent}/  (dump.json, stack.json, construct.json)")
    from msprobe.cli import format_table

    table = top_grad_norms(args.dump_path)
    print(f"\nten largest parameter-gradient norms:\n  {TOP_GRAD_NORMS_SQL}\n")
    rows = list(zip(*(table.column(name).to_pylist() for name in table.column_names)))
    print(format_table(table.column_names, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
