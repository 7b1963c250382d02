"""Training-framework callbacks that drive a :class:`~msprobe.pytorch.PrecisionDebugger`
around each training step, as ``MsprobeStep`` does for MindSpore's ``Model.train``.

``MsprobeTrainerCallback`` (Hugging Face ``transformers.Trainer``)::

    debugger = PrecisionDebugger(config_path="./config.json")
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[MsprobeTrainerCallback(debugger)])
    trainer.train()

``MsprobeLightningCallback`` (PyTorch Lightning, ``lightning.pytorch`` or
``pytorch_lightning``)::

    trainer = lightning.pytorch.Trainer(max_steps=..., callbacks=[MsprobeLightningCallback(debugger)])
    trainer.fit(lightning_module, dataloader)

Each calls ``debugger.start(model)`` when a training step begins and ``stop()`` then
``step()`` when it ends, so one recorded step is one optimizer step: the forward and
backward passes of every micro-batch it accumulates and the optimizer update. The model
recorded at levels L0/mix is the one the trainer trains (``Trainer.model``; the
``LightningModule``) unless one is given. The debugger stays the caller's: the callbacks
never close it.

The classes are built on first use (module ``__getattr__``), so importing this module
needs neither ``transformers`` nor ``lightning``; using a class whose framework is not
installed raises ImportError naming the package.
"""
from __future__ import annotations

from typing import Any

__all__ = ["MsprobeLightningCallback", "MsprobeTrainerCallback"]

_BUILT: dict[str, type] = {}


def _trainer_callback() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError("MsprobeTrainerCallback needs the 'transformers' package (pip install transformers)") from exc

    class MsprobeTrainerCallback(TrainerCallback):
        """A ``transformers.TrainerCallback``: ``debugger.start(model)`` in
        ``on_step_begin``, ``stop()`` and ``step()`` in ``on_step_end``.

        Args:
            debugger: a :class:`msprobe.pytorch.PrecisionDebugger`.
            model: the module to record at levels L0/mix; None: the model the Trainer
                passes to its callbacks (``Trainer.model``).
        """

        def __init__(self, debugger: Any, model: Any = None) -> None:
            self.debugger = debugger
            self.model = model

        def on_step_begin(self, args, state, control, **kwargs):
            self.debugger.start(self.model if self.model is not None else kwargs.get("model"))

        def on_step_end(self, args, state, control, **kwargs):
            self.debugger.stop()
            self.debugger.step()

    return MsprobeTrainerCallback


def _lightning_callback() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError as exc:
            raise ImportError("MsprobeLightningCallback needs the 'lightning' (or 'pytorch-lightning') "
                              "package (pip install lightning)") from exc

    class MsprobeLightningCallback(Callback):
        """A Lightning ``Callback``: ``debugger.start(model)`` in ``on_train_batch_start``,
        ``stop()`` and ``step()`` in ``on_train_batch_end`` (after the optimizer step of
        automatic optimization).

        Args:
            debugger: a :class:`msprobe.pytorch.PrecisionDebugger`.
            model: the module to record at levels L0/mix; None: the ``LightningModule``.
        """

        def __init__(self, debugger: Any, model: Any = None) -> None:
            self.debugger = debugger
            self.model = model

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.debugger.start(self.model if self.model is not None else pl_module)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.debugger.stop()
            self.debugger.step()

    return MsprobeLightningCallback


_BUILDERS = {"MsprobeTrainerCallback": _trainer_callback, "MsprobeLightningCallback": _lightning_callback}


def __getattr__(name: str) -> type:
    if name in _BUILDERS:
        if name not in _BUILT:
            _BUILT[name] = _BUILDERS[name]()
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
