"""The session of level ``debug``: one ``{dump_path}/{rank_dir}/debug.json`` (spec 1.2).

Same state machine and event log as :class:`msprobe.core.session.Session`, but every
export writes the rank's ``debug.json`` (entries of the whole run, no ``step{N}``
directory) instead of the step layout. ``start`` is called once, at construction.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

from msprobe.core.config import Config
from msprobe.core.session import Session
from store.export import TensorFileWriter, export_debug


class DebugSession(Session):
    """A :class:`Session` exporting ``debug.json``.

    Args:
        config: the validated configuration (level ``debug``).
        exclude_dirs: framework directories dropped from stacks.
        dump_data_dir: as for :class:`Session` (tensor directory for task tensor).
        write_tensor: as for :class:`Session`: the ``.npy`` writer for task tensor
            (tensor files in ``{dump_path}/{rank_dir}/dump_tensor_data``).
    """

    def __init__(self, config: Config, *, exclude_dirs: tuple[str, ...] = (),
                 dump_data_dir: Optional[Callable[[Path], Optional[str]]] = None,
                 write_tensor: Optional[TensorFileWriter] = None) -> None:
        super().__init__(config, framework="mindspore", exclude_dirs=exclude_dirs, dump_data_dir=dump_data_dir,
                         write_tensor=write_tensor, tensor_ext="npy")

    def step_dir(self, step: Optional[int] = None) -> Path:
        """The rank directory ``{dump_path}/{rank_dir}`` (debug level has no step directories)."""
        return Path(self.config.dump_path) / self.rank_dir

    def _export(self) -> None:
        if self._writer is None or self.failed:
            return
        table = self._guard(self._writer.take_step, self.step)
        if table is None:
            return
        self._step_export.add(table)
        if self._payloads is not None:
            self._guard(self._payloads.flush)
        self._guard(functools.partial(export_debug, payloads=self._payload_reader, write_tensor=self._write_tensor,
                                      done=self._tensors_done),
                    self._step_export.rows(), self.meta(), self.step_dir())
