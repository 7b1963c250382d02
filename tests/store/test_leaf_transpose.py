"""The log writer's transposition of leaf records into columns (store.log_writer._leaf_values):
the same columns as reading each leaf's attributes, and no young garbage collection
started by the transposition itself."""
from __future__ import annotations

import gc
import sys

import pytest

from store import log_writer
from store.records import Leaf, make_leaf


def _leaves(n: int) -> list[Leaf]:
    return [make_leaf(("output", (i % 3, str(i)), "tensor", "torch.Tensor", "torch.float32", (i, 2), 2 * i,
                       float(i), -float(i), i / 7, i * 1.5, None, None, None, i % 2 == 0, False, i % 5 == 0,
                       f"n{i}.pt" if i % 4 else None, None, None)) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 64, 500])
def test_columns_equal_attributes(n):
    leaves = _leaves(n)
    paths, columns = log_writer._leaf_values(leaves)
    assert paths == [leaf.path for leaf in leaves]
    assert len(columns) == len(log_writer._LEAF_COLUMN_NAMES)
    for attr, values in zip(log_writer._LEAF_COLUMN_NAMES, columns):
        assert values == [getattr(leaf, attr) for leaf in leaves]
    assert len({id(c) for c in columns}) == len(columns)  # one list per column


def test_bad_leaf_raises():
    leaves = _leaves(40)
    leaves[35] = tuple(leaves[35])[:-1]
    with pytest.raises(ValueError):
        log_writer._leaf_values(leaves)
    with pytest.raises(TypeError):
        log_writer._leaf_values(_leaves(3) + [None])


@pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info >= (3, 14),
                    reason="counts CPython's generational collector (3.11-3.13)")
def test_no_collection_started_by_transposing():
    """zip(*leaves) over 600 leaves holds 600 iterators at once; in chunks the
    collector's allocation count stays far below a threshold of 200."""
    leaves = _leaves(600)
    started = []

    def on_gc(phase, info):
        if phase == "start":
            started.append(info["generation"])

    old = gc.get_threshold()
    gc.collect()
    gc.callbacks.append(on_gc)
    gc.set_threshold(200, old[1], old[2])
    try:
        log_writer._leaf_values(leaves)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(on_gc)
    assert started == []
