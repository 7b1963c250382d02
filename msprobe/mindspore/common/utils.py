"""``MsprobeStep``: drive a ``PrecisionDebugger`` from ``mindspore.train.Model`` (spec 6.2).

Usage (seeds 7.2.1.2)::

    debugger = PrecisionDebugger(config_path="./config.json")
    debugger.start(net)    # L0/mix: register the Cell hooks once before training
    model = Model(net, loss_fn=loss, optimizer=opt)
    model.train(1, dataset, callbacks=[MsprobeStep(debugger)], dataset_sink_mode=False)
"""
from __future__ import annotations

from typing import Any

from mindspore.train import Callback


class MsprobeStep(Callback):
    """A MindSpore Callback: ``debugger.start()`` at each step begin, ``stop()`` then
    ``step()`` at each step end.

    Args:
        debugger: a :class:`msprobe.mindspore.PrecisionDebugger`. ``start()`` without a
            model reuses the model of the debugger's latest ``start(model)``, so levels
            L0/mix work once the net was passed before ``Model.train``.
    """

    def __init__(self, debugger: Any) -> None:
        super().__init__()
        self.debugger = debugger

    def on_train_step_begin(self, run_context: Any) -> None:
        self.debugger.start()

    def on_train_step_end(self, run_context: Any) -> None:
        self.debugger.stop()
        self.debugger.step()
