"""The rows the log writer keeps for the step files (LogWriter.take_step): a step's call,
leaf and marker rows, split out of batches that hold several steps; the live export fed
with them writes the bytes of the offline export of the same log."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import arrow_np
from store import schema as S
from store.entries import CALL_COLUMNS, LEAF_COLUMNS
from store.export import StepExporter, export_log
from store.log_writer import LogWriter
from store.records import Call, Leaf, Marker, Stack

META = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "rank_dir": "rank"}


class Text(str):
    """A str subclass: Arrow stores its text, reading back gives a plain str."""


def _tensor(io, path, dtype="torch.float32", shape=(2,), **stats):
    fields = dict(type="torch.Tensor", dtype=dtype, shape=shape, numel=2, max=1.5, min=-0.5, mean=0.5, norm=1.6,
                  requires_grad=False)
    fields.update(stats)
    return Leaf(io=io, path=path, leaf_kind="tensor", **fields)


def _value(io, path, text):
    return Leaf(io=io, path=path, leaf_kind="value", type="x", value_json=text)


def _odd_call(n: int, step: int = 0, kind: str = "api_forward") -> Call:
    """A call whose leaves hold every kind of value, some of another Python type than
    their column's (Arrow converts those: int or bool or numpy floats in float64 columns,
    numpy bools, str subclasses, list shapes, numpy ints in shapes)."""
    inf, nan = math.inf, math.nan
    leaves = (
        _tensor("input_args", (0,), max=nan, min=-inf, mean=nan, norm=inf),
        _tensor("input_args", (1,), max=-0.0, min=-0.0, mean=0.0, norm=0.0),
        _tensor("input_args", (2, 0), dtype="torch.int64", max=3, min=-2, mean=0.5, norm=3.6),    # ints in floats
        _tensor("input_args", (2, 1), dtype="torch.bool", max=True, min=False, mean=None, norm=None),
        _tensor("input_args", (2, 2), dtype="torch.float16", max=np.float32(1.1), min=np.float64(-2.5),
                mean=np.float16(0.25), norm=2 ** 53),
        _tensor("input_args", (3, "k"), dtype=Text("torch.float32"), shape=[3, 1], requires_grad=np.bool_(True)),
        _tensor("input_args", (3, "j", 0), shape=(np.int64(4),), max_finite=1.0, min_finite=np.float32(-1.0),
                crc32="0000abcd"),
        _tensor("input_args", (4,), shape=()),
        Leaf(io="input_args", path=(5,), leaf_kind="none"),
        Leaf(io="input_args", path=(6,), leaf_kind="empty_list"),
        Leaf(io="input_args", path=(7,), leaf_kind="empty_dict"),
        _value("input_kwargs", ("alpha",), '{"type":"int","value":3}'),
        _value("input_kwargs", ("beta",), '{"type":"float","value":3.0}'),
        _value("input_kwargs", ("size",), '{"type":"torch.Size","value":[3,0]}'),
        _value("input_kwargs", ("sl",), '{"type":"slice","value":[null,5,null]}'),
        _value("input_kwargs", ("s",), Text('{"type":"str","value":"\\u00e9"}')),
        _tensor("output", (0,), max=2, min=1, mean=1, norm=True),
    )
    return Call(step=step, kind=kind, name=f"Torch.odd.{n}.forward", api_type=Text("Torch"),
                keys=("input_args", "input_kwargs", "output"), leaves=leaves, stack_id=n % 2,
                is_recompute=np.bool_(False) if n % 3 == 0 else None, parent=Text("Module.m.M.forward.0"))


def _pg_call(step: int = 0) -> Call:
    return Call(step=step, kind="parameters_grad", name="Module.m.M.parameters_grad", api_type="Module",
                keys=("weight", "bias"), leaves=(_tensor("weight", (), max=1, min=0),
                                                  Leaf(io="bias", path=(), leaf_kind="none")))


def _live_and_offline(tmp_path, json_files, steps, *, flush_rows=5, order=None) -> tuple[dict, dict]:
    """Write ``steps`` (per step: a list of events and "take" markers where the live export
    takes and writes) through a LogWriter with a live StepExporter per step; returns the
    live files and those export_log rebuilds from the log."""
    dump = tmp_path / "d"
    exporter = None
    with LogWriter(dump, 0, flush_rows=flush_rows, flush_interval_s=3600) as writer:
        for step, events in enumerate(steps):
            exporter = StepExporter(exporter)
            taken = []
            for event in events:
                if isinstance(event, Call):
                    writer.append(event)
                elif isinstance(event, Stack):
                    writer.append_stack(event)
                elif isinstance(event, Marker):
                    writer.append_marker(event)
                else:  # "take": stop() or step()
                    taken.append(writer.take_step(step))
                    if order is None:
                        exporter.add(taken[-1])
                        exporter.write(writer.stacks(), META, dump / f"step{step}" / "rank")
            if order is not None:  # the parts in another order: rows out of seq order
                for i in order:
                    exporter.add(taken[i])
                exporter.write(writer.stacks(), META, dump / f"step{step}" / "rank")
    export_log(dump, tmp_path / "re")
    return json_files(dump), json_files(tmp_path / "re")


def _step(step: int, first: int) -> list:
    return [Marker(step=step, kind="start", meta=META), Stack(stack_id=0, frames=("a", "b")),
            Stack(stack_id=1, frames=("c",)),
            _odd_call(first, step), _odd_call(first + 1, step), "take",          # stop()
            Marker(step=step, kind="stop", meta=META),
            Marker(step=step, kind="start", meta=META),                          # start() again
            _odd_call(first + 2, step), _pg_call(step), "take",                  # stop()
            _odd_call(first + 3, step, kind="api_backward"), _pg_call(step),     # backward at step()
            Marker(step=step, kind="step_end", meta=META), "take"]


@pytest.mark.parametrize("flush_rows", [1, 5, 512])
def test_live_export_equals_offline_export(tmp_path, json_files, flush_rows):
    live, offline = _live_and_offline(tmp_path, json_files, [_step(0, 0), _step(1, 10)], flush_rows=flush_rows)
    assert sorted(live) == sorted(offline) and len(live) == 6
    for name in live:
        assert live[name] == offline[name], name


def test_live_export_equals_offline_export_with_parts_out_of_seq_order(tmp_path, json_files):
    live, offline = _live_and_offline(tmp_path, json_files, [_step(0, 0)], order=(2, 0, 1))
    assert sorted(live) == sorted(offline) and len(live) == 3
    for name in live:
        assert live[name] == offline[name], name


def test_rows_table_is_take_step(tmp_path):
    """take_step: the call, leaf and marker rows of the step, no stack rows; the rows of
    other steps stay for their own take_step."""
    with LogWriter(tmp_path, 0, flush_rows=3, flush_interval_s=3600) as writer:
        writer.append_stack(Stack(stack_id=0, frames=("a",)))
        writer.append_marker(Marker(step=0, kind="start", meta=META))
        writer.append(_odd_call(0, 0))
        writer.append(_odd_call(1, 1))
        writer.append_marker(Marker(step=1, kind="start", meta=META))
        table = writer.take_step(0)
        assert table.schema == S.LOG_SCHEMA
        assert sorted(set(table[S.ROW].to_pylist())) == ["call", "leaf", "marker"]
        assert set(table[S.STEP].to_pylist()) == {0}
        rest = writer.take_step(1)
        assert rest[S.ROW].to_pylist().count("marker") == 1 and rest.num_rows == 19
        assert writer._retained == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(["call", "marker", "stack"]), st.integers(0, 2)), max_size=8),
       step=st.integers(0, 3))
def test_split_equals_filtering_by_the_step_column(tmp_path, rows, step):
    """A flushed batch splits into the rows of ``step`` and the others: the same rows, in
    order, as filtering the batch's non-stack rows by the step column."""
    with LogWriter(tmp_path, 0, flush_rows=10**6, flush_interval_s=3600) as writer:
        for i, (row, s) in enumerate(rows):
            if row == "call":
                writer.append(_odd_call(i, s))
            elif row == "marker":
                writer.append_marker(Marker(step=s, kind="start", meta=META))
            else:
                writer.append_stack(Stack(stack_id=i, frames=("f",)))
        part = writer._build_batch()
    assert part.steps == frozenset(s for row, s in rows if row != "stack")
    everything = part.rows().to_pylist()
    taken, kept = part.split(step)
    mine = [r for r in everything if r[S.STEP] == step]
    other = [r for r in everything if r[S.STEP] != step]
    assert repr(taken.rows().to_pylist() if taken is not None else []) == repr(mine)  # repr: NaN == NaN
    assert repr(kept.rows().to_pylist() if kept is not None else []) == repr(other)
