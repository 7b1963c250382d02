"""``tensor.bench_path``: keep full tensors only for the calls where a run first departs
from a baseline recording.

With task ``tensor``, ``summary_mode: "md5"`` and ``bench_path``, every forward call's
tensor CRC-32s are compared with those the baseline recorded for the entry of the same
name, step and rank: when the call ends, or, where its CRC-32s are computed on a device,
at the next flush point, the queued calls in the order they were recorded
(:mod:`msprobe.pytorch.recorder`). A call is *selected* when all its tensor inputs
equal the baseline's and at least one of its tensor outputs does not: the call that
introduced the difference. Only selected calls keep their tensors (inputs, parameters,
outputs), at most ``diff_nums`` calls in the whole run (``-1``: no limit); every other
entry is recorded with its statistics and CRC-32 only (docs/pytorch-features.md).

The baseline is read once, when the debugger is built, with the compare loader
(:func:`msprobe.compare.load.load_side`): an msprobe dump path (its Arrow log), or a
directory above upstream ``step{N}/rank{R}/dump.json`` files (``proc{pid}`` of 26.x counts
as rank 0) whose ``md5`` fields hold CRC-32s as 8 hex digits. The entries of one
``(rank, step)`` are indexed when that step first asks for them.

Framework-neutral: it reads :class:`store.records.Leaf` fields only.
"""
from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Optional, Sequence

from msprobe.core.errors import ConfigError

if TYPE_CHECKING:
    from store.records import Leaf

__all__ = ["BenchBaseline", "BenchSelector", "INPUT_IOS"]

logger = logging.getLogger("msprobe")

#: leaf ``io`` values that are inputs of a forward entry (module parameters included)
INPUT_IOS = frozenset({"input_args", "input_kwargs", "parameters"})
_FORWARD_NAME = r"(\.forward|\.forward\.\d+)$"
_CRC32 = re.compile(r"[0-9a-fA-F]{8}")
_FIELD = "tensor.bench_path"
_ALLOWED = "a baseline dump recorded with summary_mode md5 (an msprobe dump path or step{N}/rank{R}/dump.json below it)"

# one entry of a step's index: ({(io, arg): (crc32, shape)} of the tensor inputs,
# {arg: (crc32, shape)} of the tensor outputs)
_Entry = tuple[dict, dict]


class BenchBaseline:
    """The CRC-32s of a baseline recording's forward entries.

    Args:
        path: the baseline's root (``tensor.bench_path``).

    Raises:
        ConfigError: (field ``tensor.bench_path``) the path cannot be read as a dump, holds
            no forward entry with a tensor, or its ``md5`` values are not CRC-32s (a
            statistics dump without md5, or summary_mode xor's ``0x...`` values).
    """

    def __init__(self, path: str) -> None:
        import pyarrow.compute as pc

        from msprobe.compare.errors import CompareInputError
        from msprobe.compare.load import load_side

        try:
            side = load_side(path, "tensor.bench_path")
        except (CompareInputError, OSError, ValueError) as exc:
            raise ConfigError(_FIELD, path, _ALLOWED, str(exc)) from None
        leaves = side.leaves.select(["rank", "step", "name", "io", "arg", "leaf_kind", "crc32", "shape"])
        keep = pc.and_(pc.equal(leaves["leaf_kind"], "tensor"),
                       pc.match_substring_regex(leaves["name"], _FORWARD_NAME))
        leaves = leaves.filter(keep).drop_columns(["leaf_kind"])
        crcs = pc.unique(pc.drop_null(leaves["crc32"])).to_pylist()[:1000]
        if leaves.num_rows == 0:
            raise ConfigError(_FIELD, path, _ALLOWED, "it holds no forward entry with a tensor")
        if not crcs:
            raise ConfigError(_FIELD, path, _ALLOWED, "its tensors have no md5 value (recorded without summary_mode md5)")
        bad = next((c for c in crcs if not _CRC32.fullmatch(c)), None)
        if bad is not None:
            raise ConfigError(_FIELD, path, _ALLOWED,
                              f"md5 value {bad!r} is not a CRC-32 of 8 hex digits (summary_mode xor?)")
        self.path = path
        self._leaves = leaves
        self._key: Optional[tuple[int, int]] = None
        self._index: dict[str, _Entry] = {}

    def entries(self, rank: int, step: int) -> dict[str, _Entry]:
        """``{entry name: (inputs, outputs)}`` of the baseline's forward entries of
        ``rank`` and ``step``: ``inputs`` maps ``(io, arg)`` and ``outputs`` maps ``arg``
        (``"0"``, ``"1.0"``: the leaf path) to ``(crc32 or None, shape list or None)``.
        Empty when the baseline has no such step or rank. The last ``(rank, step)``
        asked for is kept."""
        if self._key == (rank, step):
            return self._index
        import pyarrow.compute as pc

        rows = self._leaves.filter(pc.and_(pc.equal(self._leaves["rank"], rank),
                                           pc.equal(self._leaves["step"], step)))
        index: dict[str, _Entry] = {}
        for name, io, arg, crc, shape in zip(*(rows[c].to_pylist() for c in ("name", "io", "arg", "crc32", "shape"))):
            entry = index.get(name)
            if entry is None:
                entry = index[name] = ({}, {})
            if crc is not None:
                crc = crc.lower()  # ours writes lower-case hex; other tools may not
            if io in INPUT_IOS:
                entry[0][(io, arg)] = (crc, shape)
            elif io == "output":
                entry[1][arg] = (crc, shape)
        self._key, self._index = (rank, step), index
        if not index:
            logger.warning("msprobe: tensor.bench_path %r has no forward entry of rank %d step %d: "
                           "no call of this step keeps its tensors", self.path, rank, step)
        return index


def _arg(path: Sequence) -> str:
    return ".".join(str(p) for p in path)


def _shape(shape) -> Optional[list]:
    return None if shape is None else list(shape)


class BenchSelector:
    """Decides, call by call, which calls keep their tensors (see the module docstring).

    Args:
        baseline: the baseline's CRC-32s.
        limit: ``diff_nums``: at most this many calls are selected in the run; ``-1``: no
            limit.

    Attributes:
        found: calls selected so far.
    """

    def __init__(self, baseline: BenchBaseline, limit: int) -> None:
        self.baseline = baseline
        self.limit = limit
        self.found = 0

    @property
    def exhausted(self) -> bool:
        """True once ``limit`` calls are selected."""
        return self.limit != -1 and self.found >= self.limit

    def inputs_match(self, rank: int, step: int, name: str, leaves: Sequence[Leaf]) -> bool:
        """True when the tensor inputs among ``leaves`` (:data:`INPUT_IOS`) are exactly the
        baseline entry's: every one has the baseline's shape and CRC-32, and none of the
        baseline's is missing. A baseline entry without ``parameters`` (an upstream dump)
        leaves the parameters out of the comparison. False when the baseline has no entry
        ``name`` or a CRC-32 is missing on either side.

        Args:
            rank, step, name: the forward entry (rank 0 without torch.distributed).
            leaves: the entry's :class:`store.records.Leaf` records, any ``io`` (only
                tensor leaves of :data:`INPUT_IOS` are read: ``io``, ``path``,
                ``crc32``, ``shape``).
        """
        entry = self.baseline.entries(rank, step).get(name)
        if entry is None:
            return False
        expected = entry[0]
        with_params = any(io == "parameters" for io, _ in expected)
        seen = 0
        for leaf in leaves:
            if leaf.leaf_kind != "tensor" or leaf.io not in INPUT_IOS:
                continue
            if leaf.io == "parameters" and not with_params:
                continue
            ref = expected.get((leaf.io, _arg(leaf.path)))
            if ref is None or leaf.crc32 is None or ref[0] is None or ref[0] != leaf.crc32:
                return False
            if ref[1] is not None and leaf.shape is not None and _shape(leaf.shape) != ref[1]:
                return False
            seen += 1
        return seen == len(expected)

    def outputs_differ(self, rank: int, step: int, name: str, leaves: Sequence[Leaf]) -> bool:
        """True when a tensor output among ``leaves`` (``io == "output"``) differs from the
        baseline's output at the same path: another CRC-32 or another shape. Outputs the
        baseline lacks, or without a CRC-32 on either side, are not compared.

        Args:
            rank, step, name: the forward entry (rank 0 without torch.distributed).
            leaves: :class:`store.records.Leaf` records of the entry, any ``io`` (only
                tensor leaves with ``io == "output"`` are read).
        """
        entry = self.baseline.entries(rank, step).get(name)
        if entry is None:
            return False
        outputs = entry[1]
        for leaf in leaves:
            if leaf.leaf_kind != "tensor" or leaf.io != "output":
                continue
            ref = outputs.get(_arg(leaf.path))
            if ref is None or ref[0] is None or leaf.crc32 is None:
                continue
            if ref[0] != leaf.crc32 or (ref[1] is not None and leaf.shape is not None
                                        and _shape(leaf.shape) != ref[1]):
                return True
        return False

    def select(self, name: str) -> None:
        """Count the selected call ``name``; logs once when the limit is reached."""
        self.found += 1
        if self.exhausted:
            logger.info("msprobe: tensor.diff_nums reached with %s (%d call%s keep their tensors); later calls "
                        "are recorded with CRC-32s only", name, self.found, "" if self.found == 1 else "s")
