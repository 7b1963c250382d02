#!/usr/bin/env python
"""A small character-level transformer language model, trained with msprobe recording.

The text is Python's own help pages (``pydoc_data.topics.topics``), so nothing is
downloaded. The recorder runs with the shipped default config (task ``statistics``, level
``mix``): every API call, module forward/backward and parameter gradient of each step is
recorded with its Max/Min/Mean/Norm::

    python examples/char_lm.py                       # 8 steps, dump in ./dump_path
    python examples/char_lm.py --steps 2 --dump-path /tmp/dump

At the end it prints the step directories written and the ten largest parameter-gradient
norms, found with SQL over the recording (:func:`store.query.query`).

Each run starts from a clean dump: when the dump path already holds a msprobe recording
(a ``.msprobe`` directory inside), the example removes that recording first and prints one
line saying so, so that a rerun never mixes two runs' logs. It never removes anything else:
a dump path holding other files stops it with a message instead.

The builders (:func:`load_text`, :func:`make_batches`, :func:`build_model`, :func:`train`)
are importable, e.g. by benchmarks and tests.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Optional

import torch
from torch import nn

SEED = 0
D_MODEL = 64
N_HEADS = 4
N_LAYERS = 2
DROPOUT = 0.1
BATCH_SIZE = 16
SEQ_LEN = 64
LEARNING_RATE = 3e-3

#: The ten largest parameter-gradient norms of the whole run.
TOP_GRAD_NORMS_SQL = (
    "SELECT step, name, io AS param, norm FROM tensors "
    "WHERE direction = 'backward' AND name LIKE '%.parameters_grad' "
    "ORDER BY norm DESC, step, name, param LIMIT 10"
)


def load_text() -> str:
    """The help texts of ``pydoc_data.topics`` (about 465k characters of English and
    Python on 3.11), joined in sorted topic order."""
    from pydoc_data.topics import topics

    return "\n".join(topics[key] for key in sorted(topics))


def make_vocab(text: str) -> dict[str, int]:
    """Character → index, over the sorted distinct characters of ``text``."""
    return {ch: i for i, ch in enumerate(sorted(set(text)))}


def make_batches(
    text: str, vocab: dict[str, int], steps: int, *, batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN, seed: int = SEED,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches ``(x, y)`` of int64 shape ``(batch_size, seq_len)``: random windows
    of ``text`` (offsets from ``random.Random(seed)``), ``y`` is ``x`` shifted by one char."""
    data = torch.tensor([vocab[ch] for ch in text], dtype=torch.long)
    rng = random.Random(seed)
    batches = []
    for _ in range(steps):
        starts = [rng.randrange(len(data) - seq_len - 1) for _ in range(batch_size)]
        x = torch.stack([data[s:s + seq_len] for s in starts])
        y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
        batches.append((x, y))
    return batches


class CharLM(nn.Module):
    """Embedding (+ learned positions) → ``N_LAYERS`` causal TransformerEncoderLayers →
    Linear to the vocabulary. Input int64 ``(B, T)``, output float32 logits ``(B, T, V)``."""

    def __init__(self, vocab_size: int, *, max_len: int = SEQ_LEN) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, D_MODEL)
        self.pos = nn.Embedding(max_len, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D_MODEL, N_HEADS, dim_feedforward=4 * D_MODEL,
                                       dropout=DROPOUT, batch_first=True)
            for _ in range(N_LAYERS)
        )
        self.head = nn.Linear(D_MODEL, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.embed(x) + self.pos(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(h)


def build_model(vocab_size: int) -> CharLM:
    """A fresh :class:`CharLM` (parameters from the current torch RNG state)."""
    return CharLM(vocab_size)


def seed_everything(seed: int = SEED) -> None:
    """Seed Python's and torch's random generators."""
    random.seed(seed)
    torch.manual_seed(seed)


def train(steps: int = 8, dump_path: str = "./dump_path", record: bool = True, *,
          verbose: bool = False) -> list[float]:
    """Train :class:`CharLM` for ``steps`` AdamW steps; returns the loss of each step.

    Args:
        steps: number of training steps (one batch each).
        dump_path: msprobe output directory (used when ``record``); an earlier msprobe
            recording there is replaced (:func:`store.recording.clear_recording`, one line printed).
        record: record with ``PrecisionDebugger`` (default config) around every step.
        verbose: print the loss of each step.

    The same ``steps`` give bit-identical losses with and without ``record``.

    Raises:
        FileExistsError: ``dump_path`` holds something that is not a msprobe recording.
    """
    if record:
        from store.recording import clear_recording

        if clear_recording(dump_path):
            print(f"replaced the previous msprobe recording in {Path(dump_path).resolve()}", flush=True)
    seed_everything()
    text = load_text()
    vocab = make_vocab(text)
    batches = make_batches(text, vocab, steps)
    model = build_model(len(vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    debugger = None
    if record:
        from msprobe.pytorch import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=dump_path)
    losses: list[float] = []
    try:
        model.train()
        for step, (x, y) in enumerate(batches):
            if debugger is not None:
                debugger.start(model)
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            optimizer.step()
            if debugger is not None:
                debugger.stop()
                debugger.step()
            losses.append(loss.item())
            if verbose:
                print(f"step {step}: loss {losses[-1]!r}", flush=True)
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
    parser.add_argument("--dump-path", default="./dump_path",
                        help="msprobe output directory (default ./dump_path); a msprobe recording "
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
