"""store.records.Leaf: an immutable tuple of LEAF_FIELDS with attribute access, keyword
construction, make_leaf (the hot path's positional constructor) and replace()."""
from __future__ import annotations

import copy
import math
import pickle

import pytest

from store import schema as S
from store.log_reader import LogReader
from store.log_writer import LogWriter
from store.records import LEAF_FIELDS, Call, Leaf, make_leaf

FULL = dict(io="output", path=(0, "k"), leaf_kind="tensor", type="torch.Tensor", dtype="torch.float32",
            shape=(2, 3), numel=6, max=2.5, min=-1.0, mean=0.25, norm=3.0, max_finite=None, min_finite=None,
            crc32="0badf00d", requires_grad=False, has_nan=False, has_inf=False, data_name="x.pt",
            payload="shard1:00ff", value_json=None)


def test_keywords_and_positions_agree():
    by_keywords = Leaf(**FULL)
    by_position = make_leaf(tuple(FULL[name] for name in LEAF_FIELDS))
    assert by_keywords == by_position and type(by_position) is Leaf
    for i, name in enumerate(LEAF_FIELDS):
        assert getattr(by_position, name) == FULL[name] == by_position[i]
    assert hash(by_keywords) == hash(by_position)


def test_fields_not_given_are_none():
    leaf = Leaf(io="output", path=(), leaf_kind="none")
    assert leaf.io == "output" and leaf.path == () and leaf.leaf_kind == "none"
    assert all(getattr(leaf, name) is None for name in LEAF_FIELDS[3:])
    assert len(leaf) == len(LEAF_FIELDS) == 20


def test_required_fields_and_keywords_only():
    with pytest.raises(TypeError):
        Leaf(io="output", path=())  # leaf_kind missing
    with pytest.raises(TypeError):
        Leaf("output", (), "none")  # positional: keywords only, as the dataclass was
    with pytest.raises(TypeError):
        Leaf(io="output", path=(), leaf_kind="none", maximum=1.0)


def test_immutable():
    leaf = Leaf(**FULL)
    with pytest.raises(AttributeError):
        leaf.max = 1.0
    with pytest.raises(AttributeError):
        leaf.extra = 1  # no instance dict


def test_replace_changes_only_the_named_fields():
    leaf = Leaf(**FULL)
    changed = leaf.replace(max=math.inf, has_inf=True, path=(1,))
    assert type(changed) is Leaf
    assert (changed.max, changed.has_inf, changed.path) == (math.inf, True, (1,))
    assert leaf.max == 2.5 and leaf.path == (0, "k")  # the original is untouched
    for name in LEAF_FIELDS:
        if name not in ("max", "has_inf", "path"):
            assert getattr(changed, name) == getattr(leaf, name)
    assert leaf.replace() == leaf


def test_replace_rejects_an_unknown_field():
    with pytest.raises(TypeError, match="no field 'Max'"):
        Leaf(**FULL).replace(Max=1.0)


def test_make_leaf_rejects_a_wrong_length():
    with pytest.raises(ValueError, match="need 20 values"):
        make_leaf(("output", (), "none"))


def test_pickle_copy_and_repr():
    leaf = Leaf(**FULL)
    for other in (pickle.loads(pickle.dumps(leaf)), copy.copy(leaf), copy.deepcopy(leaf)):
        assert other == leaf and type(other) is Leaf
    assert repr(leaf).startswith("Leaf(io='output', path=(0, 'k'), leaf_kind='tensor', ")
    assert eval(repr(leaf), {"Leaf": Leaf}) == leaf  # noqa: S307 - our own repr


def test_log_writer_columns_from_made_leaves(tmp_path):
    """Leaves built by make_leaf go through the writer's zip transposition column by column."""
    a = make_leaf(tuple(FULL[name] for name in LEAF_FIELDS))
    b = Leaf(io="input_kwargs", path=("alpha",), leaf_kind="value", type="int", value_json='{"type":"int","value":2}')
    call = Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch",
                keys=("input_kwargs", "output"), leaves=(a, b))
    with LogWriter(tmp_path, 0) as writer:
        writer.append(call)
        writer.flush()
        path = writer.path
    rows = [r for batch in LogReader(path).read_new() for r in batch.to_pylist() if r[S.ROW] == S.ROW_LEAF]
    assert [r[S.PATH] for r in rows] == ['[0,"k"]', '["alpha"]']
    assert [r[S.ARG] for r in rows] == ["0.k", "alpha"]
    assert rows[0][S.MAX] == 2.5 and rows[0][S.CRC32] == "0badf00d" and rows[0][S.PAYLOAD] == "shard1:00ff"
    assert rows[0][S.SHAPE] == [2, 3] and rows[0][S.DATA_NAME] == "x.pt"
    assert rows[1][S.VALUE_JSON] == '{"type":"int","value":2}' and rows[1][S.MAX] is None


def test_log_writer_fails_clearly_on_a_record_that_is_not_a_leaf(tmp_path):
    call = Call(step=0, kind="api_forward", name="Torch.add.0.forward", api_type="Torch", keys=("output",),
                leaves=(Leaf(io="output", path=(0,), leaf_kind="none"), ("output", (1,), "none")))
    writer = LogWriter(tmp_path, 0)
    writer.append(call)
    with pytest.raises(Exception, match="converting records"):
        writer.flush()
    assert writer.failed


def test_null_leaf_equals_keyword_leaf():
    from store.records import null_leaf
    leaf = null_leaf("output", (1, "k"))
    assert leaf == Leaf(io="output", path=(1, "k"), leaf_kind="none")
    assert type(leaf) is Leaf and leaf.leaf_kind == "none" and leaf.value_json is None
