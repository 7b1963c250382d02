"""The direct path of LeafBuilder.leaves for None, plain scalars and flat lists of them
gives the same leaves as walking the value (msprobe.core.values.walk), and the dump
holds the records independently expected for them."""
from __future__ import annotations

import json
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pt_helpers import load_dump
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.leaves import LeafBuilder, _ValueTexts

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**80, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, math.nan, -math.nan]),
    st.text(max_size=8), st.text(min_size=60, max_size=80),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.lists(SCALARS, max_size=4).map(tuple),
                   st.lists(st.lists(SCALARS, max_size=2), max_size=2))


def _both(builder: LeafBuilder, value, path=(2,)):
    fast, walked = [], []
    builder.leaves("input_kwargs", value, fast, path)
    builder.walk_leaves("input_kwargs", value, walked, path)
    return fast, walked


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_direct_leaves_equal_walked(value):
    builder = LeafBuilder(md5=False)
    for _ in range(2):  # the second time from the remembered texts
        fast, walked = _both(builder, value)
        assert [tuple(leaf) for leaf in fast] == [tuple(leaf) for leaf in walked]
        assert all(type(leaf) is type(w) for leaf, w in zip(fast, walked))


def test_signed_zero_and_bool_int_kept_apart():
    """0.0 / -0.0 and True / 1 compare equal but are recorded differently."""
    builder = LeafBuilder(md5=False)
    texts = []
    for value in (0.0, -0.0, 0.0, True, 1, True, False, 0):
        out = []
        builder.leaves("input_args", value, out, (0,))
        texts.append(json.loads(out[0].value_json))
    assert texts == [{"type": "float", "value": 0.0}, {"type": "float", "value": -0.0},
                     {"type": "float", "value": 0.0}, {"type": "bool", "value": True},
                     {"type": "int", "value": 1}, {"type": "bool", "value": True},
                     {"type": "bool", "value": False}, {"type": "int", "value": 0}]
    assert math.copysign(1.0, texts[1]["value"]) == -1.0


def test_texts_bounded():
    texts = _ValueTexts()
    for i in range(_ValueTexts.MAX_ENTRIES + 10):
        assert json.loads(texts.tail(i, int)[-1]) == {"type": "int", "value": i}
    assert len(texts._by_type[int]) <= _ValueTexts.MAX_ENTRIES
    long_text = "y" * (_ValueTexts.MAX_KEY_STR + 1)
    assert json.loads(texts.tail(long_text, str)[-1]) == {"type": "str", "value": long_text}
    assert long_text not in texts._by_type[str]
    nan = texts.tail(math.nan, float)
    assert nan[-1] == '{"type": "float", "value": NaN}' and not texts._by_type[float]


def test_huge_int_is_unrecordable_on_both_paths():
    """An int too long for JSON text (Python's 4300-digit limit) is recorded "<unrecordable>"
    on both paths (no error escapes, so the recording goes on), and is not remembered;
    ints up to 2**64 are."""
    builder = LeafBuilder(md5=False)
    huge = 10 ** 5000
    fast, walked = _both(builder, huge)
    assert [tuple(x) for x in fast] == [tuple(x) for x in walked]
    assert json.loads(fast[0].value_json) == {"type": "int", "value": "<unrecordable>"}
    _both(builder, [huge, 2 ** 70, 2 ** 63])
    assert set(builder._texts._by_type[int]) == {2 ** 63}


def test_faked_class_takes_the_walk():
    """An object whose __class__ claims to be float is not taken for one by the direct
    path (it is walked, and recorded as the walk records it)."""
    class Fake:
        __class__ = property(lambda self: float)

        def __repr__(self):
            return "fake"

    builder = LeafBuilder(md5=False)
    fast, walked = _both(builder, Fake())
    assert [tuple(x) for x in fast] == [tuple(x) for x in walked]
    # isinstance() believes __class__: described as a float whose JSON text fails
    assert json.loads(fast[0].value_json) == {"type": "float", "value": "<unrecordable>"}
    assert not builder._texts._by_type[float]


def test_scalar_arguments_in_dump(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    x = torch.arange(6.0).reshape(2, 3)
    dbg.start()
    for _ in range(2):  # the second call takes the remembered texts
        torch.add(x, x, alpha=-0.0)
        torch.nn.functional.dropout(x, 0.0, False, False)
        torch.nn.functional.layer_norm(x, (3,), None, None, 1e-5)
    dbg.stop()
    dbg.close()
    data = load_dump(tmp_path / "d")[0]["data"]
    for n in (0, 1):
        add = data[f"Torch.add.{n}.forward"]
        assert add["input_kwargs"]["alpha"] == {"type": "float", "value": -0.0}
        assert math.copysign(1.0, add["input_kwargs"]["alpha"]["value"]) == -1.0
        drop = data[f"Functional.dropout.{n}.forward"]["input_args"]
        assert drop[1:] == [{"type": "float", "value": 0.0}, {"type": "bool", "value": False},
                            {"type": "bool", "value": False}]
        ln = data[f"Functional.layer_norm.{n}.forward"]["input_args"]
        assert ln[1:] == [[{"type": "int", "value": 3}], None, None, {"type": "float", "value": 1e-5}]


def test_undescribable_scalar_like_the_walk(monkeypatch):
    """A scalar whose record fails is recorded "<unrecordable>" on both paths, and is not
    remembered: described again once the record works."""
    from msprobe.pytorch import leaves as leaves_module
    good = leaves_module.value_record
    builder = LeafBuilder(md5=False)

    def broken(obj):
        raise RuntimeError("cannot describe this value")

    monkeypatch.setattr(leaves_module, "value_record", broken)
    fast, walked = _both(builder, 0.5)
    assert [tuple(x) for x in fast] == [tuple(x) for x in walked]
    assert json.loads(fast[0].value_json) == {"type": "float", "value": "<unrecordable>"}
    monkeypatch.setattr(leaves_module, "value_record", good)
    fast, _ = _both(builder, 0.5)
    assert json.loads(fast[0].value_json) == {"type": "float", "value": 0.5}


def _generator_args(path):
    """Record ``torch.multinomial(p, 2, generator=g)`` (a ``torch.Generator``) and a
    ``dropout`` given a Python generator (``Module.parameters()``, truthy, as ``inplace``;
    with ``training`` false the call returns its input) into ``path``; returns the dump's data."""
    dbg = PrecisionDebugger(dump_path=str(path), level="L1")
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.7])
    lin = torch.nn.Linear(2, 2)
    dbg.start()
    torch.multinomial(p, 2, generator=g)
    torch.nn.functional.dropout(p, 0.0, False, lin.parameters())   # a generator object as `inplace`
    dbg.stop()
    dbg.close()
    return load_dump(path)[0]["data"]


def test_object_arguments_record_without_address(tmp_path):
    """A torch.Generator and a Python generator are recorded by type and a repr without
    the memory address: the same text in two runs (different objects, different addresses)."""
    one, two = _generator_args(tmp_path / "a"), _generator_args(tmp_path / "b")
    gen = one["Torch.multinomial.0.forward"]["input_kwargs"]["generator"]
    assert gen == {"type": "torch._C.Generator", "value": "<torch._C.Generator object>"}
    py_gen = one["Functional.dropout.0.forward"]["input_args"][3]
    assert py_gen == {"type": "generator", "value": "<generator object Module.parameters>"}
    for key in ("Torch.multinomial.0.forward", "Functional.dropout.0.forward"):
        assert json.dumps(one[key]["input_args"]) == json.dumps(two[key]["input_args"])
        assert json.dumps(one[key]["input_kwargs"]) == json.dumps(two[key]["input_kwargs"])
