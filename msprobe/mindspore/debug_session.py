"""The session of level ``debug``: one ``{dump_path}/{rank_dir}/debug.json`` (spec 1.2).

Same state machine, event log and export as :class:`msprobe.core.session.Session` (the
export of level ``debug`` writes the rank's ``debug.json``: store.export.StepFiles), with the
rank directory as the tensor files' directory. ``start`` is called once, at construction.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from msprobe.core.config import Config
from msprobe.core.session import Session
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from store.export import TensorFileWriter


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
