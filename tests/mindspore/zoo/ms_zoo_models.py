"""Tiny real-architecture MindSpore models for the real-model suite (no downloads).

* ``resnet18``: mindcv 0.3.0's ``resnet18`` (random init, 10 classes, 32x32 images).
* ``gpt2``: a GPT-2-style decoder from ``mindspore.nn`` layers: token and position
  embeddings, pre-LayerNorm blocks with one fused QKV ``Dense``, causal attention by
  ``ops.matmul``/``ops.softmax``, a GELU MLP, final LayerNorm, the LM head tied to the token
  embedding.
* ``llama``: a Llama-style decoder: RMSNorm, rotary position embedding (rotate-half),
  grouped-query attention (4 query heads sharing 2 key/value heads), a SwiGLU MLP, the LM
  head tied to the embedding.

Both transformers have 2 layers, hidden size 32, vocabulary 64, sequence 8, batch 2.
Weights come from a seeded numpy generator, so every build of a case is the same.
:func:`train` runs ``value_and_grad`` + Adam and returns the losses, gradients and
parameters of every step, for bit-for-bit comparison of runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

ms.set_device("CPU")

VOCAB, HIDDEN, SEQ, BATCH, LAYERS = 64, 32, 8, 2, 2


def _seeded(net: nn.Cell, seed: int) -> nn.Cell:
    """Set every parameter from a numpy generator: scales (LayerNorm/BatchNorm gamma,
    RMSNorm weight) 1 + 0.1 N(0, 1), everything else 0.1 N(0, 1); BatchNorm running
    statistics keep their initial values."""
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        if p.name.endswith(("moving_mean", "moving_variance")):
            continue
        scale = p.ndim == 1 and (p.name.endswith("gamma") or "norm" in p.name and p.name.endswith("weight"))
        data = (1.0 if scale else 0.0) + 0.1 * rng.standard_normal(p.shape)
        p.set_data(Tensor(data.astype(np.float32)))
    return net


def _causal_mask(seq: int) -> Tensor:
    return Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1))


# --- GPT-2 style ---------------------------------------------------------------------------

class GPT2Attention(nn.Cell):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.c_attn = nn.Dense(hidden, 3 * hidden)
        self.c_proj = nn.Dense(hidden, hidden)

    def construct(self, x, mask):
        b, s, h = x.shape
        q, k, v = ops.split(self.c_attn(x), h, axis=-1)
        q = q.reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = k.reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        v = v.reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(self.head_dim) + mask
        out = ops.matmul(ops.softmax(scores, axis=-1), v)
        return self.c_proj(out.transpose(0, 2, 1, 3).reshape(b, s, h))


class GPT2Block(nn.Cell):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm((hidden,))
        self.attn = GPT2Attention(hidden, heads)
        self.ln_2 = nn.LayerNorm((hidden,))
        self.c_fc = nn.Dense(hidden, 4 * hidden)
        self.act = nn.GELU(approximate=False)
        self.mlp_proj = nn.Dense(4 * hidden, hidden)

    def construct(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))


class GPT2(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, HIDDEN)
        self.wpe = nn.Embedding(SEQ, HIDDEN)
        self.h = nn.CellList([GPT2Block(HIDDEN, 4) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm((HIDDEN,))
        self.mask = _causal_mask(SEQ)
        self.pos = Tensor(np.arange(SEQ, dtype=np.int32))

    def construct(self, ids):
        x = self.wte(ids) + self.wpe(self.pos)
        for block in self.h:
            x = block(x, self.mask)
        x = self.ln_f(x)
        return ops.matmul(x, self.wte.embedding_table.T)  # tied LM head


# --- Llama style ---------------------------------------------------------------------------

class RMSNorm(nn.Cell):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(hidden, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        var = (x * x).mean(-1, keep_dims=True)
        return self.weight * (x * ops.rsqrt(var + self.eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return ops.cat((-x[..., half:], x[..., :half]), axis=-1)


class Rotary(nn.Cell):
    """cos/sin tables of the rotary position embedding (no parameters)."""

    def __init__(self, head_dim: int, seq: int, base: float = 10000.0) -> None:
        super().__init__()
        inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        freqs = np.outer(np.arange(seq, dtype=np.float64), inv)
        emb = np.concatenate([freqs, freqs], axis=-1)
        self.cos = Tensor(np.cos(emb).astype(np.float32))
        self.sin = Tensor(np.sin(emb).astype(np.float32))

    def construct(self, q, k):
        return q * self.cos + _rotate_half(q) * self.sin, k * self.cos + _rotate_half(k) * self.sin


class LlamaAttention(nn.Cell):
    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Dense(hidden, heads * self.head_dim, has_bias=False)
        self.k_proj = nn.Dense(hidden, kv_heads * self.head_dim, has_bias=False)
        self.v_proj = nn.Dense(hidden, kv_heads * self.head_dim, has_bias=False)
        self.o_proj = nn.Dense(heads * self.head_dim, hidden, has_bias=False)
        self.rotary = Rotary(self.head_dim, SEQ)

    def construct(self, x, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).reshape(b, s, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(b, s, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(b, s, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = self.rotary(q, k)
        rep = self.heads // self.kv_heads  # grouped-query attention: each kv head serves `rep` heads
        k = ops.repeat_interleave(k, rep, 1)
        v = ops.repeat_interleave(v, rep, 1)
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(self.head_dim) + mask
        out = ops.matmul(ops.softmax(scores, axis=-1), v)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, s, -1))


class LlamaMLP(nn.Cell):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Dense(hidden, inter, has_bias=False)
        self.up_proj = nn.Dense(hidden, inter, has_bias=False)
        self.down_proj = nn.Dense(inter, hidden, has_bias=False)

    def construct(self, x):
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = LlamaAttention(HIDDEN, 4, 2)
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = LlamaMLP(HIDDEN, 64)

    def construct(self, x, mask):
        x = x + self.self_attn(self.input_layernorm(x), mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.CellList([LlamaLayer() for _ in range(LAYERS)])
        self.norm = RMSNorm(HIDDEN)
        self.mask = _causal_mask(SEQ)

    def construct(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.mask)
        return ops.matmul(self.norm(x), self.embed_tokens.embedding_table.T)  # tied LM head


# --- cases ---------------------------------------------------------------------------------

def _lm_batch(seed: int) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    return Tensor(ids[:, :-1]), Tensor(ids[:, 1:])


def _lm_loss(logits, labels):
    return ops.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def _image_batch(seed: int) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(seed)
    return (Tensor(rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)),
            Tensor(rng.integers(0, 10, (BATCH,)).astype(np.int32)))


def _resnet18() -> nn.Cell:
    from mindcv.models import resnet18
    return resnet18(pretrained=False, num_classes=10)


@dataclass(frozen=True)
class Case:
    """One zoo model: ``build()`` returns the Cell, ``batch(step)`` ``(inputs, labels)``,
    ``loss(output, labels)`` the scalar loss."""

    build: Callable[[], nn.Cell]
    batch: Callable[[int], tuple[Tensor, Tensor]]
    loss: Callable[[Any, Tensor], Tensor]


CASES = {
    "resnet18": Case(_resnet18, _image_batch, lambda out, y: ops.cross_entropy(out, y)),
    "gpt2": Case(GPT2, _lm_batch, _lm_loss),
    "llama": Case(Llama, _lm_batch, _lm_loss),
}


@dataclass
class Run:
    """Per step: the loss, the gradients (in ``trainable_params()`` order) and the
    parameters after the update, as numpy arrays; ``names``: the parameter names."""

    names: list
    losses: list
    grads: list
    params: list


def train(name: str, steps: int = 2, dbg: Optional[Any] = None, model_arg: bool = True) -> Run:
    """Train zoo case ``name`` for ``steps`` steps (seed 0 weights, batches seeded by the
    step) with ``value_and_grad`` and Adam, recorded by ``dbg`` when given (``start(net)``
    with ``model_arg``, else ``start()``, then ``stop()``/``step()`` each step)."""
    case = CASES[name]
    ms.set_seed(0)
    net = _seeded(case.build(), 0)
    net.set_train(True)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)

    def forward(x, y):
        return case.loss(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    run = Run(names=[p.name for p in net.trainable_params()], losses=[], grads=[], params=[])
    for step in range(steps):
        x, y = case.batch(step)
        if dbg is not None:
            dbg.start(net if model_arg else None)
        loss, grads = grad_fn(x, y)
        opt(grads)
        if dbg is not None:
            dbg.stop()
            dbg.step()
        run.losses.append(loss.asnumpy())
        run.grads.append([g.asnumpy() for g in grads])
        run.params.append([p.asnumpy() for p in net.trainable_params()])
    return run


def differences(a: Run, b: Run) -> list[str]:
    """What differs bit for bit between two runs (empty when they are identical)."""
    out = []
    for step in range(len(a.losses)):
        if a.losses[step].tobytes() != b.losses[step].tobytes():
            out.append(f"step {step} loss {a.losses[step]} != {b.losses[step]}")
        for kind, xs, ys in (("grad", a.grads[step], b.grads[step]), ("param", a.params[step], b.params[step])):
            for n, x, y in zip(a.names, xs, ys):
                if x.tobytes() != y.tobytes():
                    d = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
                    out.append(f"step {step} {kind} {n}: max |diff| {d:.3g}")
    return out


if __name__ == "__main__":  # print what each level changes, per model
    import sys
    import tempfile
    from msprobe.mindspore import PrecisionDebugger

    for name in sys.argv[1:] or list(CASES):
        ref = train(name)
        for level in ("L1", "L0", "mix"):
            with tempfile.TemporaryDirectory() as d:
                dbg = PrecisionDebugger(dump_path=d, level=level)
                diffs = differences(ref, train(name, dbg=dbg))
                dbg.close()
            print(name, level, len(diffs), "differences", diffs[:5])
