"""EntryBuilder over rows in any order: the same entries as over the rows stably sorted by
``seq`` with pyarrow (the reference; the builder itself sorts with numpy and Python, not
pyarrow.compute), for shuffled rows, duplicated rows, rows split into chunks and parts."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import schema as S
from store.entries import EntryBuilder, build_entries, entry_values
from store.log_writer import LogWriter
from store.records import Call, Leaf


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> pa.Table:
    """One step's rows: 6 calls (names repeat) of 4 leaves each (a path set twice)."""
    calls = []
    for i in range(6):
        leaves = tuple(Leaf(io="input_args", path=(j,), leaf_kind="tensor", type="torch.Tensor",
                            dtype="torch.float32", shape=(i + 1,), numel=i + 1, max=float(10 * i + j),
                            min=0.0, mean=0.5, norm=1.0) for j in range(3))
        leaves += (Leaf(io="input_args", path=(0,), leaf_kind="value", value_json=f'{{"v":{i}}}'),)  # same path again
        name = f"Torch.add.{i % 4}.forward"  # names repeat: later calls add to earlier entries
        calls.append(Call(step=0, kind="api_forward", name=name, api_type="Torch",
                          keys=("input_args", "output"), leaves=leaves))
    with LogWriter(tmp_path_factory.mktemp("log"), 0, flush_rows=5, flush_interval_s=3600) as writer:
        for call in calls:
            writer.append(call)
        return writer.take_step(0)


def _json(builder_or_pair) -> str:
    order, entries = builder_or_pair
    return json.dumps(entry_values(order, entries), sort_keys=False)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_row_order_matches_a_stable_sort(rows, data):
    n = rows.num_rows
    order = data.draw(st.permutations(range(n)))
    order += data.draw(st.lists(st.integers(0, n - 1), max_size=5))  # duplicated rows
    shuffled = rows.take(pa.array(order, pa.int64()))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(order)), max_size=3)))
    chunked = pa.concat_tables([shuffled.slice(a, b - a) for a, b in zip([0] + cuts, cuts + [len(order)])])
    expected = _json(build_entries(shuffled.sort_by([(S.SEQ, "ascending")])))  # pyarrow: stable
    assert _json(build_entries(chunked)) == expected
    # fed in parts of ascending seq ranges (as take_step hands them out): the same entries
    ordered = shuffled.sort_by([(S.SEQ, "ascending")])
    split = data.draw(st.integers(0, ordered.num_rows))
    seqs = ordered[S.SEQ].to_pylist()
    while 0 < split < len(seqs) and seqs[split - 1] == seqs[split]:
        split += 1  # a call and its leaves stay in one part
    builder = EntryBuilder()
    builder.add(ordered.slice(0, split))
    builder.add(ordered.slice(split))
    assert _json((builder.order(), builder.entries)) == expected
