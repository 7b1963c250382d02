"""Recording changes nothing (design "Rules every part keeps"): at every
level and task, several training steps of a model with dropout, layer norm and attention
give bit-identical losses, outputs, gradients and parameters, and leave the global RNG in
the same state, with and without msprobe."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger

STEPS = 3


class Block(nn.Module):
    """A tiny transformer block: embedding, attention, layer norm, dropout, MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
        self.norm1 = nn.LayerNorm(8)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8, 16)
        self.out = nn.Linear(16, 11)
        self.norm2 = nn.LayerNorm(16)

    def forward(self, tokens):
        x = self.emb(tokens)
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.norm1(x + self.drop(a))
        q = x.view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        x = x + F.scaled_dot_product_attention(q, q, q, dropout_p=0.2, is_causal=True).transpose(1, 2).reshape(x.shape)
        h = self.norm2(F.gelu(self.fc(x)))
        return self.out(F.dropout(h, 0.1, self.training))


def train(level=None, task=None, dump_path=None, config_path=None, defer_all=False):
    torch.manual_seed(1234)
    model = Block()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dbg = None
    if level is not None:
        dbg = PrecisionDebugger(config_path=config_path, dump_path=str(dump_path), level=level, task=task)
        dbg.recorder.leaves.defer_all = defer_all  # True: the accelerator (sync-free) statistics path
    results = []
    for _ in range(STEPS):
        tokens = torch.randint(0, 11, (2, 5))
        if dbg:
            dbg.start(model)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1))
        opt.zero_grad()
        loss.backward()
        results += [loss.detach().clone(), logits.detach().clone()]
        results += [p.grad.clone() for p in model.parameters()]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    results += [p.detach().clone() for p in model.parameters()]
    results.append(torch.rand(3))  # the global RNG advanced exactly as without msprobe
    return results


@pytest.fixture(scope="module")
def reference():
    return train()


@pytest.mark.parametrize("level, task", [
    ("L0", "statistics"), ("L1", "statistics"), ("mix", "statistics"), ("debug", "statistics"),
    ("mix", "tensor"), ("mix", "structure"), ("L0", "structure"), ("L1", "tensor"),
])
def test_bit_identical_training(tmp_path, reference, level, task):
    got = train(level, task, tmp_path / "d")
    assert len(got) == len(reference)
    for i, (a, b) in enumerate(zip(reference, got)):
        assert a.dtype == b.dtype and torch.equal(a, b), i
    if level != "debug":  # and it did record: every step has entries
        for step in range(STEPS):
            rank_dir = tmp_path / "d" / f"step{step}" / "rank"
            data = json.loads((rank_dir / "dump.json").read_text())["data"]
            if task == "structure":  # no data, only the module tree
                assert data == {} and "Module.attn.MultiheadAttention.forward.0" in json.loads(
                    (rank_dir / "construct.json").read_text())
                continue
            if level in ("L0", "mix"):
                assert "Module.attn.MultiheadAttention.forward.0" in data
            if level in ("L1", "mix"):
                assert "Functional.scaled_dot_product_attention.0.forward" in data


def test_bit_identical_with_md5(tmp_path, reference):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "statistics": {"summary_mode": "md5"}}))
    got = train("mix", None, tmp_path / "d", config_path=str(config))
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    data = json.loads((tmp_path / "d" / "step0" / "rank" / "dump.json").read_text())["data"]
    assert len(data["Functional.linear.0.forward"]["output"][0]["md5"]) == 8


def test_bit_identical_on_the_deferred_statistics_path(tmp_path, reference):
    """The path accelerator tensors take (statistics kept on the device until a flush
    point), forced for CPU tensors."""
    got = train("mix", "statistics", tmp_path / "d", defer_all=True)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    data = json.loads((tmp_path / "d" / "step2" / "rank" / "dump.json").read_text())["data"]
    assert data["Functional.linear.0.forward"]["output"][0]["Max"] is not None


@pytest.mark.parametrize("task, summary_mode", [("statistics", "md5"), ("statistics", "xor"), ("tensor", "statistics")])
def test_bit_identical_on_the_device_checksum_and_copy_paths(tmp_path, reference, task, summary_mode):
    """The device path of summary_mode md5/xor (checksums computed on the device) and of
    task tensor (host copies queued, stored at the flush point), forced for CPU tensors."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": task, task: {"summary_mode": summary_mode}}))
    got = train("mix", None, tmp_path / "d", config_path=str(config), defer_all=True)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    data = json.loads((tmp_path / "d" / "step2" / "rank" / "dump.json").read_text())["data"]
    rec = data["Functional.linear.0.forward"]["output"][0]
    assert rec["Max"] is not None if summary_mode != "xor" else rec["md5"].startswith("0x")
