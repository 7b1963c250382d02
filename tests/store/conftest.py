"""Shared fixtures of the store tests: record builders and one hand-made two-step run.

The run (rank 0, level mix, task statistics) is small enough that the expected dump.json,
stack.json and construct.json can be written out by hand in test_export.py.
"""
from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Optional

import pytest

from store.export import export_step
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker, Stack

NAN = math.nan
INF = math.inf

META_MIX = {
    "task": "statistics",
    "level": "mix",
    "framework": "pytorch",
    "dump_data_dir": None,
    "rank_dir": "rank0",
}
FWD_API_KEYS = ("input_args", "input_kwargs", "is_recompute", "output")
FWD_MODULE_KEYS = ("input_args", "input_kwargs", "output", "parameters", "is_recompute")
BWD_KEYS = ("input", "output")
FRAMES_LINEAR = (
    "File /m/linear.py, line 134, in forward, \n return F.linear(input, self.weight, self.bias)",
    "File train.py, line 17, in <module>, \n out = m(x)",
)
FRAMES_MODULE = ("File train.py, line 17, in <module>, \n out = m(x)",)


def tensor(io: str, path: tuple, **stats) -> Leaf:
    """A float32 tensor leaf; ``stats`` override any field."""
    fields = dict(
        type="torch.Tensor", dtype="torch.float32", shape=(2,), numel=2, max=1.0, min=0.0,
        mean=0.5, norm=1.0, requires_grad=False, has_nan=False, has_inf=False,
    )
    fields.update(stats)
    return Leaf(io=io, path=path, leaf_kind="tensor", **fields)


def value(io: str, path: tuple, json_text: str) -> Leaf:
    return Leaf(io=io, path=path, leaf_kind="value", value_json=json_text)


def none(io: str, path: tuple) -> Leaf:
    return Leaf(io=io, path=path, leaf_kind="none")


def scenario(meta: Optional[dict] = None) -> list[list]:
    """Events of a two-step run, one list per step: Marker, Stack or Call objects."""
    meta = dict(META_MIX if meta is None else meta)
    step0 = [
        Marker(step=0, kind="start", meta=meta),
        Stack(stack_id=11, frames=FRAMES_LINEAR),
        Call(
            step=0, kind="api_forward", name="Functional.linear.0.forward", api_type="Functional",
            parent="Module.fc.Linear.forward.0", stack_id=11, is_recompute=False, keys=FWD_API_KEYS,
            leaves=(
                tensor("input_args", (0,), shape=(2, 4), numel=8, max=1.5, min=-2.0, mean=0.25,
                       norm=3.0, requires_grad=True),
                tensor("input_args", (1,), shape=(4, 4), numel=16, max=0.5, min=-0.5, mean=0.0,
                       norm=2.0, requires_grad=True),
                none("input_args", (2,)),
                value("input_kwargs", ("scale",), '{"type":"float","value":0.5}'),
                tensor("output", (0,), shape=(2, 4), numel=8, max=NAN, min=-INF, mean=NAN, norm=NAN,
                       max_finite=1.0, min_finite=-2.0, crc32="8e0be875", has_nan=True,
                       has_inf=True, requires_grad=True),
            ),
        ),
        Call(
            step=0, kind="api_forward", name="Torch.cat.0.forward", api_type="Torch",
            parent="Module.fc.Linear.forward.0", is_recompute=True, keys=FWD_API_KEYS,
            leaves=(
                tensor("input_args", (0, 0), shape=(1,), numel=1, max=1.0, min=1.0, mean=1.0, norm=1.0),
                tensor("input_args", (0, 1), shape=(1,), numel=1, max=2.0, min=2.0, mean=2.0, norm=2.0),
                Leaf(io="input_args", path=(1,), leaf_kind="empty_list"),
                value("input_kwargs", ("dim",), '{"type":"int","value":0}'),
                value("input_kwargs", ("opts", "k"), '{"type":"str","value":"v"}'),
                value("input_kwargs", ("opts", "lst", 0), '{"type":"slice","value":[null,5,null]}'),
                Leaf(io="input_kwargs", path=("extra",), leaf_kind="empty_dict"),
                tensor("output", (0,), dtype="torch.bool", shape=(2,), numel=2, max=1.0, min=0.0,
                       mean=None, norm=None, requires_grad=None),
            ),
        ),
        Stack(stack_id=12, frames=FRAMES_MODULE),
        Call(
            step=0, kind="module_forward", name="Module.fc.Linear.forward.0", api_type="Module",
            parent=None, stack_id=12, is_recompute=False, keys=FWD_MODULE_KEYS,
            leaves=(
                tensor("input_args", (0,), shape=(2, 4), numel=8, max=1.5, min=-2.0, mean=0.25,
                       norm=3.0, requires_grad=True),
                tensor("output", (0,), shape=(2, 4), numel=8, max=3.0, min=-1.0, mean=1.0, norm=4.0),
                tensor("parameters", ("weight",), shape=(4, 4), numel=16, max=0.5, min=-0.5,
                       mean=0.0, norm=2.0, requires_grad=True),
                tensor("parameters", ("bias",), shape=(4,), numel=4, max=0.25, min=-0.25,
                       mean=0.0, norm=0.5, requires_grad=True),
            ),
        ),
        Call(
            step=0, kind="module_forward", name="Module.head.ReLU.forward.0", api_type="Module",
            parent=None, is_recompute=False, keys=FWD_MODULE_KEYS,
            leaves=(tensor("input_args", (0,)), tensor("output", (0,))),
        ),
        Stack(stack_id=11, frames=FRAMES_LINEAR),  # duplicate: written once
        Call(
            step=0, kind="api_backward", name="Functional.linear.0.backward", api_type="Functional",
            parent="Module.fc.Linear.backward.0", stack_id=11, keys=BWD_KEYS,
            leaves=(
                tensor("input", (0,), shape=(2, 4), numel=8, max=0.1, min=-0.1, mean=0.0, norm=0.2),
                none("output", (0,)),
                tensor("output", (1,), shape=(4, 4), numel=16, max=0.3, min=-0.3, mean=0.0, norm=0.6),
            ),
        ),
        Call(
            step=0, kind="parameters_grad", name="Module.fc.Linear.parameters_grad", api_type="Module",
            keys=("weight",),
            leaves=(tensor("weight", (0,), shape=(4, 4), numel=16, max=0.3, min=-0.3, mean=0.0, norm=0.6),),
        ),
        Call(
            step=0, kind="module_backward", name="Module.fc.Linear.backward.0", api_type="Module",
            keys=BWD_KEYS, leaves=(tensor("input", (0,), shape=(2, 4), numel=8, max=0.1, min=-0.1,
                                          mean=0.0, norm=0.2),),
        ),
        Call(
            step=0, kind="parameters_grad", name="Module.fc.Linear.parameters_grad", api_type="Module",
            keys=("bias",),
            leaves=(tensor("bias", (0,), shape=(4,), numel=4, max=0.2, min=-0.2, mean=0.0, norm=0.4,
                           crc32="0000abcd"),),
        ),
        Call(
            step=0, kind="parameters_grad", name="Module.other.Lin.parameters_grad", api_type="Module",
            keys=("w",),
        ),
        Marker(step=0, kind="step_end", meta=meta),
    ]
    step1 = [
        Call(
            step=1, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
            parent="", is_recompute=False, keys=FWD_API_KEYS,
            leaves=(
                tensor("input_args", (0,), shape=(), numel=1, max=-8.5, min=-8.5, mean=-8.5, norm=8.5),
                value("input_args", (1,), '{"type":"int","value":2}'),
                tensor("output", (0,), shape=(), numel=1, max=-6.5, min=-6.5, mean=-6.5, norm=6.5,
                       data_name="Torch.add.0.forward.output.0.pt"),
            ),
        ),
        Marker(step=1, kind="stop", meta=meta),
    ]
    return [step0, step1]


def write_events(writer: LogWriter, events: list) -> None:
    for event in events:
        if isinstance(event, Call):
            writer.append(event)
        elif isinstance(event, Stack):
            writer.append_stack(event)
        else:
            writer.append_marker(event)


def write_scenario(
    dump_path: Path,
    *,
    rank: int = 0,
    meta: Optional[dict] = None,
    live_out: Optional[Path] = None,
    flush_rows: int = 512,
) -> Path:
    """Write :func:`scenario` through a LogWriter; with ``live_out``, export each step live
    (take_step + export_step) into ``live_out/step{N}/{rank_dir}``. Returns the log file."""
    meta = dict(META_MIX if meta is None else meta)
    with LogWriter(dump_path, rank, flush_rows=flush_rows, flush_interval_s=3600) as writer:
        for step, events in enumerate(scenario(meta)):
            write_events(writer, events)
            if live_out is not None:
                rows = writer.take_step(step, fsync=True)
                export_step(rows, writer.stacks(), meta, live_out / f"step{step}" / meta["rank_dir"])
        path = writer.path
    return path


def step0_rows(dump: Path):
    """Write the scenario to ``dump`` and read back its rank-0 step-0 rows in seq order:
    ``(rows, stacks, meta)`` with ``meta`` the mix meta of ``rank0``."""
    import pyarrow.compute as pc

    from store import schema as S
    from store.log_reader import read_log

    write_scenario(dump)
    contents = read_log(dump)
    table = contents.table
    rows = table.filter(pc.and_(pc.equal(table[S.RANK], 0), pc.equal(table[S.STEP], 0)))
    rows = rows.sort_by([(S.SEQ, "ascending")])
    return rows, contents.stacks, dict(META_MIX, rank_dir="rank0")


@pytest.fixture
def sample():
    """Builders of the shared scenario (conftest helpers cannot be imported by tests)."""
    return types.SimpleNamespace(
        META_MIX=META_MIX,
        FRAMES_LINEAR=FRAMES_LINEAR,
        FRAMES_MODULE=FRAMES_MODULE,
        tensor=tensor,
        value=value,
        none=none,
        scenario=scenario,
        write_events=write_events,
        write_scenario=write_scenario,
        step0_rows=step0_rows,
    )
