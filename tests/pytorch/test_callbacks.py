"""msprobe.pytorch.callbacks: a 3-step Hugging Face Trainer run (tiny GPT-2 from a config,
random weights) and a 3-step Lightning fit, each recorded through its callback: every
step's entries are in the recording, and losses and trained weights are bit-identical to
the same run without msprobe."""
from __future__ import annotations

import json
import os

import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from store.query import query

STEPS = 3


def make_debugger(tmp_path, level="mix") -> PrecisionDebugger:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": level}))
    return PrecisionDebugger(config_path=str(config))


def steps_recorded(dump) -> dict:
    """{step: (module forward entries, parameters_grad entries)}."""
    rows = query(dump, "SELECT step, count(*) FILTER (WHERE kind = 'module_forward') AS fwd, "
                       "count(*) FILTER (WHERE kind = 'parameters_grad') AS grads FROM calls GROUP BY step ORDER BY step")
    return {r["step"]: (r["fwd"], r["grads"]) for r in rows.to_pylist()}


def test_import_needs_no_training_framework():
    import msprobe.pytorch.callbacks as callbacks

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        callbacks.Nope  # noqa: B018


# --- Hugging Face Trainer -------------------------------------------------------------------
def hf_run(tmp_path, debugger=None):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from msprobe.pytorch.callbacks import MsprobeTrainerCallback

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    tokens = torch.randint(0, 64, (STEPS * 4, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    losses = []

    class Losses(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=STEPS, per_device_train_batch_size=4,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             seed=0, disable_tqdm=True, dataloader_num_workers=0)
    callbacks = [Losses()] + ([MsprobeTrainerCallback(debugger)] if debugger else [])
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    result = trainer.train()
    return losses, result.training_loss, {k: v.clone() for k, v in model.state_dict().items()}


def test_trainer_callback_records_each_step_bit_identically(tmp_path):
    plain = hf_run(tmp_path / "plain")
    debugger = make_debugger(tmp_path)
    recorded = hf_run(tmp_path / "rec", debugger)
    debugger.close()
    assert len(plain[0]) == STEPS and plain[0] == recorded[0] and plain[1] == recorded[1]
    assert plain[2].keys() == recorded[2].keys()
    for key in plain[2]:
        assert torch.equal(plain[2][key], recorded[2][key]), key
    steps = steps_recorded(tmp_path / "dump")
    assert sorted(steps) == list(range(STEPS))
    # every step: the forward of each GPT-2 block and the gradients of every module with parameters
    forward0, grads0 = steps[0]
    assert all(steps[s] == (forward0, grads0) for s in steps) and forward0 >= 2 and grads0 >= 8
    names = query(tmp_path / "dump", "SELECT DISTINCT name FROM calls WHERE step = 2").column("name").to_pylist()
    assert "Module.transformer.h.1.attn.GPT2Attention.forward.0" in names
    assert "Module.transformer.h.0.mlp.c_fc.Conv1D.parameters_grad" in names


# --- Lightning -------------------------------------------------------------------------------
def lightning_run(tmp_path, debugger=None):
    pl = pytest.importorskip("lightning.pytorch")
    from msprobe.pytorch.callbacks import MsprobeLightningCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.body(x), y)
            self.losses.append(loss.detach().clone())
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    pl.seed_everything(0, verbose=False)
    module = Tiny()
    g = torch.Generator().manual_seed(2)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 8, 6, generator=g), torch.randn(STEPS * 8, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=[MsprobeLightningCallback(debugger)] if debugger else [])
    trainer.fit(module, loader)
    return module.losses, {k: v.clone() for k, v in module.state_dict().items()}


def test_lightning_callback_records_each_step_bit_identically(tmp_path):
    plain = lightning_run(tmp_path / "plain")
    debugger = make_debugger(tmp_path)
    recorded = lightning_run(tmp_path / "rec", debugger)
    debugger.close()
    assert len(plain[0]) == STEPS
    for a, b in zip(plain[0], recorded[0]):
        assert torch.equal(a, b)
    for key in plain[1]:
        assert torch.equal(plain[1][key], recorded[1][key]), key
    steps = steps_recorded(tmp_path / "dump")
    assert steps == {s: (4, 2) for s in range(STEPS)}   # Sequential, Linear, GELU, Linear; two Linear gradients
    names = query(tmp_path / "dump", "SELECT DISTINCT name FROM calls WHERE step = 1").column("name").to_pylist()
    assert {"Module.body.0.Linear.forward.0", "Module.body.2.Linear.parameters_grad"} <= set(names)
