"""One small attention model built twice, in PyTorch and in MindSpore, with the same
weights and inputs: token embedding, LayerNorm, Dense/Linear query/key/value projections,
the attention matmuls and softmax, an output projection, GELU and a Dense/Linear head.
``record_torch``/``record_ms`` run one forward and backward recorded at a level;
``bug`` (MindSpore only) scales the output of the Cell ``attn.out`` by 1.25 inside its
``construct`` (the Cell's own computation is wrong, its inputs are right). The key
projection has no bias (its gradient would be rounding noise: softmax cancels it)."""
from __future__ import annotations

import math

import numpy as np

VOCAB, HIDDEN, SEQ, BATCH = 16, 8, 5, 2


def weights() -> dict:
    """name → float32 array, PyTorch layout (Linear weight ``(out, in)``, as Dense's)."""
    rng = np.random.default_rng(0)
    w = {"embed": rng.standard_normal((VOCAB, HIDDEN)),
         "ln.weight": 1.0 + 0.1 * rng.standard_normal(HIDDEN), "ln.bias": 0.1 * rng.standard_normal(HIDDEN)}
    for name in ("q", "k", "v", "out"):
        w[f"attn.{name}.weight"] = 0.3 * rng.standard_normal((HIDDEN, HIDDEN))
        if name != "k":  # the key bias cancels in softmax: its gradient is rounding noise
            w[f"attn.{name}.bias"] = 0.1 * rng.standard_normal(HIDDEN)
    w["head.weight"] = 0.3 * rng.standard_normal((VOCAB, HIDDEN))
    w["head.bias"] = 0.1 * rng.standard_normal(VOCAB)
    return {k: v.astype(np.float32) for k, v in w.items()}


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """``(token ids int32 (BATCH, SEQ), loss weights float32 (BATCH, SEQ, VOCAB))``."""
    rng = np.random.default_rng(1)
    return (rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32),
            rng.standard_normal((BATCH, SEQ, VOCAB)).astype(np.float32))


def record_torch(path, level: str) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from msprobe.pytorch import PrecisionDebugger

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.v, self.out = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
            self.k = nn.Linear(HIDDEN, HIDDEN, bias=False)

        def forward(self, x):
            scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) / math.sqrt(HIDDEN)
            return self.out(torch.matmul(F.softmax(scores, dim=-1), self.v(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.ln = nn.LayerNorm(HIDDEN)
            self.attn = Attention()
            self.act = nn.GELU()
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, ids):
            return self.head(self.act(self.attn(self.ln(self.embed(ids)))))

    net = Net()
    w = weights()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(w[name.replace("embed.weight", "embed")]))
    ids, c = inputs()
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics")
    dbg.start(model=net)
    (net(torch.from_numpy(ids).long()) * torch.from_numpy(c)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()


def record_ms(path, level: str, bug: bool = False) -> None:
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from msprobe.mindspore import PrecisionDebugger

    ms.set_device("CPU")

    class Dense(nn.Dense):
        """``nn.Dense`` (same class name, so the built-in table maps it to Linear) whose
        result is scaled by 1.25 when ``bug``."""

        def construct(self, x):
            y = super().construct(x)
            return y * 1.25 if bug else y

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.v = nn.Dense(HIDDEN, HIDDEN), nn.Dense(HIDDEN, HIDDEN)
            self.k = nn.Dense(HIDDEN, HIDDEN, has_bias=False)
            self.out = Dense(HIDDEN, HIDDEN)

        def construct(self, x):
            scores = ops.matmul(self.q(x), self.k(x).swapaxes(-1, -2)) / math.sqrt(HIDDEN)
            return self.out(ops.matmul(ops.softmax(scores, axis=-1), self.v(x)))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.ln = nn.LayerNorm((HIDDEN,))
            self.attn = Attention()
            self.act = nn.GELU(approximate=False)
            self.head = nn.Dense(HIDDEN, VOCAB)

        def construct(self, ids):
            return self.head(self.act(self.attn(self.ln(self.embed(ids)))))

    net = Net()
    w = weights()
    names = {"embed.embedding_table": "embed", "ln.gamma": "ln.weight", "ln.beta": "ln.bias"}
    for p in net.trainable_params():
        p.set_data(Tensor(w[names.get(p.name, p.name)]))
    ids, c = inputs()
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task="statistics")
    dbg.start(model=net)
    ms.value_and_grad(lambda i: (net(i) * Tensor(c)).sum(), None, net.trainable_params())(Tensor(ids))
    dbg.stop()
    dbg.step()
    dbg.close()
