"""A rank's step files, written from the rows of its log writer as the step goes on.

:class:`StepFiles` is the one place where the live ``step{N}/{rank_dir}/`` files
(``dump.json``, ``stack.json``, ``construct.json``, ``dump_tensor_data/``; level ``debug``:
``{rank_dir}/debug.json``) are written from what a :class:`store.log_writer.LogWriter`
holds: in the writer process (:mod:`store.writer_process`) for tasks that store no tensors,
in the training process otherwise. The files are those :func:`store.export.export_log`
writes from the log afterwards, byte for byte (the exporter is the same).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional

from store.export import StepExporter, TensorFileWriter, export_debug
from store.log_writer import LogWriter
from store.payload_writer import PayloadReader

__all__ = ["StepFiles"]


class StepFiles:
    """Writes the current step's files from the rows ``writer`` flushed.

    Args:
        writer: the rank's log writer (its retained rows are taken at each export).
        dump_path: the dump directory (level ``debug`` writes ``{dump_path}/{rank_dir}/``).
    """

    def __init__(self, writer: LogWriter, dump_path: os.PathLike | str) -> None:
        self.writer = writer
        self._dump_path = Path(dump_path)
        self._exporter = StepExporter()
        self._tensors_done: set = set()

    def export(self, step: int, meta: Mapping[str, Any], emitted: bool, *,
               payloads: Optional[PayloadReader] = None, write_tensor: Optional[TensorFileWriter] = None) -> None:
        """Flush the log and (re)write step ``step``'s files with every row of the step so far.

        Args:
            step: the step being recorded.
            meta: the session's marker meta (``task``, ``level``, ``framework``,
                ``dump_data_dir``, ``rank_dir``, ...; see ``store.export``).
            emitted: whether a call of the step reached the log (False: only markers
                did, which never change the files: the skeleton files are written).
            payloads, write_tensor: task ``tensor`` (see :meth:`StepExporter.write`).
        Raises:
            StoreWriteError: the log writer failed.
            OSError: a file could not be written.
        """
        if emitted:
            self._exporter.add(self.writer.take_step(step))
        else:
            self.writer.flush()
        rank_dir = meta["rank_dir"]
        if meta["level"] == "debug":  # {dump_path}/{rank_dir}/debug.json (spec 1.2)
            export_debug(self._exporter.rows(), meta, self._dump_path / rank_dir, payloads=payloads,
                         write_tensor=write_tensor, done=self._tensors_done)
            return
        self._exporter.write(self.writer.stacks(), meta, self._dump_path / f"step{step}" / rank_dir,
                             payloads=payloads, write_tensor=write_tensor, done=self._tensors_done)

    def end_step(self, step: int) -> None:
        """Close step ``step`` after its last export: the log is fsynced in the background
        (:meth:`LogWriter.flush`), rows of the step flushed after the export (the
        ``step_end`` marker) are dropped, the log file is ended if it reached its segment
        size (:meth:`LogWriter.end_segment_if_due`), and the next step starts with an empty
        exporter (which reuses the stack.json/construct.json texts of this one).

        Raises:
            StoreWriteError: the log writer failed.
        """
        self.writer.flush(True, background=True)
        self.writer.drop_step_rows(step)
        self.writer.end_segment_if_due()
        self._exporter = StepExporter(self._exporter)
        self._tensors_done = set()
