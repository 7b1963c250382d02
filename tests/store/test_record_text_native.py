"""The C encoder of dump.json text (store._record_text) against the Python one and json.dumps.

For every value the encoders accept, the text must be exactly
``json.dumps(store.entries._plain(value), indent=1)`` nested at the indent (upstream
dump.json is written by ``json.dumps(..., indent=1)``), byte for byte, with the extension
and without it; what one encoder refuses, the other refuses the same way (the caller then
falls back to ``json.dumps``). Skipped when the extension is not built.
"""
from __future__ import annotations

import json
import math
import random
import struct
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

native = pytest.importorskip("store._record_text")

from store import record_text  # noqa: E402
from store.entries import _plain  # noqa: E402
from store.json_text import _NotPlainJson  # noqa: E402

SUBNORMAL = 5e-324
HUGE = 1.7976931348623157e308
SPECIAL_FLOATS = [0.0, -0.0, SUBNORMAL, -SUBNORMAL, 2.2250738585072014e-308, 2.225073858507201e-308, HUGE, -HUGE,
                  1e16, 1e15, 9999999999999998.0, 1e17, 1e22, 1e23, 1e-4, 1e-5, 0.0001, 0.00001, 0.1, 0.3, 1 / 3,
                  123456789012345678.0, 2.0**53, 2.0**53 + 2, 2.0**-1074, 1.5, -2.5, 100.0, 1e300, 1e-300,
                  math.nan, -math.nan, math.inf, -math.inf, 3.4028234663852886e38, 1.1754943508222875e-38]


def _c_encoder():
    return record_text.records_encoder()


def _py_encoder():
    return record_text._python_records_encoder()


def _run(encode, value, indent=""):
    """("ok", text) or ("raises", exception type) of one encoder call."""
    out: list = []
    try:
        encode(value, indent, out)
    except Exception as error:  # noqa: BLE001 - the exception type is what is compared
        return "raises", type(error)
    return "ok", "".join(out)


def _reference(value, indent=""):
    """json.dumps of the plain value, nested at ``indent`` (its strings hold no raw newline)."""
    return json.dumps(_plain(value), indent=1).replace("\n", "\n" + indent)


def test_the_extension_is_the_encoder_records_encoder_returns():
    assert record_text._native is native
    assert type(_c_encoder()) is native.Encoder
    assert type(_py_encoder()) is not native.Encoder


# --- scalars --------------------------------------------------------------------------------
def _float_token(x: float) -> str:
    return "NaN" if x != x else "Infinity" if x == math.inf else "-Infinity" if x == -math.inf else repr(x)


@pytest.mark.parametrize("x", SPECIAL_FLOATS)
def test_float_text_of_special_values(x):
    assert native.float_text(x) == _float_token(x)
    assert native.float_text(x) == json.dumps(x)


@settings(max_examples=3000, deadline=None)
@given(x=st.floats(allow_nan=True, allow_infinity=True) | st.floats(width=32) | st.floats(width=16)
       | st.integers(0, 2**64 - 1).map(lambda bits: struct.unpack("<d", struct.pack("<Q", bits))[0]))
def test_float_text_is_float_repr(x):
    assert native.float_text(x) == _float_token(x)


def test_float_text_of_every_subnormal_power_and_many_bit_patterns():
    values = [2.0**e for e in range(-1074, 1024)] + [-(2.0**e) for e in range(-1074, 1024, 7)]
    values += [struct.unpack("<d", struct.pack("<Q", bits))[0] for bits in range(1, 1 << 20, 997)]
    values += [struct.unpack("<f", struct.pack("<I", bits))[0] for bits in range(0, 1 << 32, 1 << 19)]
    assert [native.float_text(x) for x in values] == [_float_token(x) for x in values]


def test_float_text_where_the_exact_integer_path_writes_it():
    """2**-47 <= |x| < 2**52 (store/_record_text.c short_repr; boundary and tie cases go to
    PyOS_double_to_string): random bit patterns over each binary exponent of the range
    (some with trailing zero bits), log-uniform values, float32 values, short decimals,
    ints, and the doubles next to powers of two and ten."""
    rng = random.Random(17)
    pack = struct.Struct("<d")
    bits = struct.Struct("<Q")
    values = []
    for biased in range(1075 - 101, 1075 + 2):  # 2**-48 .. 2**53
        for _ in range(400):
            word = (rng.getrandbits(1) << 63) | (biased << 52) | rng.getrandbits(52)
            if rng.random() < 0.2:
                word &= ~((1 << rng.randint(1, 52)) - 1)
            values.append(pack.unpack(bits.pack(word))[0])
    values += [10 ** rng.uniform(-15, 16) * rng.choice((1, -1)) for _ in range(40_000)]
    values += [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(40_000)]
    values += [round(rng.uniform(-1e6, 1e6), rng.randint(0, 8)) for _ in range(20_000)]
    values += [round(rng.uniform(-1e-5, 1e-5), rng.randint(6, 18)) for _ in range(20_000)]
    values += [float(rng.randint(-(2**53), 2**53)) for _ in range(20_000)]
    for base in [2.0**e for e in range(-110, 60)] + [10.0**p for p in range(-17, 17)] + [1e-4, 2.0**52, 2.0**-47]:
        word = bits.unpack(pack.pack(base))[0]
        values += [pack.unpack(bits.pack(word + d))[0] for d in range(-40, 41)]
    assert [native.float_text(x) for x in values] == [_float_token(x) for x in values]


_ENCODE_STR = json.encoder.encode_basestring_ascii
_ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())  # lone surrogates too


@settings(max_examples=1500, deadline=None)
@given(s=st.text(_ANY_CHAR) | st.text(st.characters(max_codepoint=0x7F)) | st.text(st.characters(max_codepoint=0xFF)))
def test_str_text_is_encode_basestring_ascii(s):
    assert native.str_text(s) == _ENCODE_STR(s)


def test_str_text_of_controls_surrogates_and_astral_characters():
    for s in ["", '"', "\\", "\x7f", "\x00\x01\x1f", "\b\f\n\r\t", "é", "\u2028", "\ud800", "\udfff", "a\ud83d",
              "\U0001F600", "\U0010FFFF", "x" * 10000 + "é", "ab\"cd\\ef"]:
        assert native.str_text(s) == _ENCODE_STR(s)


# --- entry values ---------------------------------------------------------------------------
_FLOATS = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(SPECIAL_FLOATS) \
    | st.floats(width=32)
_NAMES = st.sampled_from(["torch.Tensor", "torch.nn.parameter.Parameter", "mindspore.Tensor", "é\u2028", 'q"\\\n\x01'])
_DTYPES = st.sampled_from(["torch.float32", "torch.bool", "bool", "Bool", "torch.int8", "Float16", "\x7fé"])
_TEXT = st.text(_ANY_CHAR, max_size=12)


@st.composite
def _records(draw) -> tuple:
    """A record tuple of store.entries.RECORD_FIELDS with the types EntryBuilder gives."""
    return (
        draw(st.none() | _NAMES | _TEXT),
        draw(st.none() | _DTYPES | _TEXT),
        draw(st.none() | st.tuples() | st.lists(st.integers(0, 2**40) | st.integers(-5, 5) | st.integers(2**63, 2**70),
                                               max_size=4).map(tuple)),
        draw(_FLOATS), draw(_FLOATS), draw(_FLOATS), draw(_FLOATS),
        draw(st.none() | st.booleans()),
        draw(_FLOATS), draw(_FLOATS),
        draw(st.none() | st.sampled_from(["00000000", "8e0be875"]) | _TEXT),
        draw(st.none() | st.sampled_from(["a.pt", "Torch.x.0.forward.output.0.pt"]) | _TEXT),
    )


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_VALUE_LEAVES = (_JSON.map(json.dumps) | st.sampled_from(['{"type": "int", "value": 3}', "1e400", "-1e400", " [ ] ",
                                                          '"\\ud800"', "-0.0", "12345678901234567890"])).map(
    lambda text: (text,))
_SCALARS = st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | _FLOATS | _TEXT


def _entry_values(leaves):
    return st.recursive(
        _SCALARS | leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT | st.sampled_from(["input_args", "output"]),
                                                                    inner, max_size=4),
        max_leaves=12,
    )


_ENTRY_VALUES = _entry_values(_records() | _VALUE_LEAVES)
_INDENTS = st.sampled_from(["", " ", "  ", "   "]) | st.integers(0, 70).map(lambda n: " " * n)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_ENTRY_VALUES, min_size=1, max_size=4), indent=_INDENTS)
def test_c_text_equals_python_text_and_json_dumps(values, indent):
    """Several values through one encoder of each kind (equal leaves come from the kept
    texts the second time), each text equal to the reference."""
    c_encode, py_encode = _c_encoder(), _py_encoder()
    for value in values + values:
        expected = _reference(value, indent)
        assert _run(c_encode, value, indent) == ("ok", expected)
        assert _run(py_encode, value, indent) == ("ok", expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=_records(), indent=_INDENTS)
def test_equal_records_with_zeros_of_both_signs_keep_their_own_text(record, indent):
    """0.0 == -0.0 (and a kept text is found by equality): each record's text is its own."""
    flipped = tuple(-x if type(x) is float and x == 0.0 and i in (3, 4, 5, 6, 8, 9) else x
                    for i, x in enumerate(record))
    encode = _c_encoder()
    for value in ([record, flipped, record], {"a": flipped, "b": [record]}):
        assert _run(encode, value, indent) == ("ok", _reference(value, indent))


def test_a_record_equal_to_a_kept_one_but_of_other_types_is_written_by_its_own_types():
    """A kept text is found by equality: 3 == 3.0 and True == 1, texts differ. Only
    records of column types are kept by the C encoder. (The Python encoder keeps any
    hashable record and writes a shape item with int.__repr__: both are wrong for such
    records, which EntryBuilder never makes; see the next test.)"""
    record = ("torch.Tensor", "torch.float32", (2,), 3.0, 1.0, 2.0, 4.0, None, None, None, None, None)
    ints = ("torch.Tensor", "torch.float32", (2,), 3, 1, 2, 4, None, None, None, None, None)  # == record
    bools = ("torch.Tensor", "torch.float32", (True,), 3.0, 1.0, 2.0, 4.0, None, None, None, None, None)
    ones = bools[:2] + ((1,),) + bools[3:]  # == bools
    for value in ([record, ints, ints, record], [ones, bools, bools], [bools]):
        assert _run(_c_encoder(), value, "  ") == ("ok", _reference(value, "  "))


@pytest.mark.parametrize("value", [
    [("t", "d", (2,), 3.0, None, None, None, None, None, None, None, None),
     ("t", "d", (2,), 3, None, None, None, None, None, None, None, None)],
    [("t", "d", (True,), None, None, None, None, None, None, None, None, None)],
])
def test_python_encoder_known_differences_on_records_entrybuilder_never_makes(value):
    """Documents the pure-Python encoder's shortcuts (not the C one's behaviour)."""
    assert _run(_py_encoder(), value)[1] != _reference(value)
    assert _run(_c_encoder(), value) == ("ok", _reference(value))


# --- what the fast paths leave to Python, and what is refused --------------------------------
class _Float(float):
    pass


class _Int(int):
    pass


class _Str(str):
    pass


class _Dict(dict):
    pass


class _List(list):
    pass


_RECORD = ("torch.Tensor", "torch.float32", (2, 3), 1.5, -0.5, 0.25, 2.0, True, None, None, None, "x.pt")


def _with(index, value):
    fields = list(_RECORD)
    fields[index] = value
    return tuple(fields)


ODD_VALUES = [
    {1: "int key"}, {None: 1}, {("a",): 1}, {_Str("k"): 1}, _Float(1.5), _Int(3), _Str("s"), _Dict(a=1), _List([1]),
    object(), {1, 2}, b"bytes", bytearray(b"x"), 1j, [1, object()], {"a": [_Float(0.5)]}, [(), ("a", "b")],
    ("too", "short"), tuple(range(13)), ([1],), (5,), (None,), (b"[1]",), ("not json",), ("[1, 2",), ("NaN",),
    ([1, 2],), (("nested",),),
    # records whose fields are not the types EntryBuilder gives: written from their dict by Python
    _with(3, 3), _with(3, True), _with(3, _Float(2.0)), _with(3, "text"), _with(3, [1.0]), _with(3, object()),
    _with(2, [2, 3]), _with(2, (2.0, 3)), _with(2, (True,)), _with(2, (_Int(2),)), _with(2, "2x3"), _with(2, ((2,),)),
    _with(0, 5), _with(0, _Str("torch.Tensor")), _with(1, ["torch.bool"]), _with(1, _Str("torch.bool")),
    _with(7, 1), _with(7, "yes"), _with(10, 123), _with(11, _Str("n.pt")), _with(8, 1), _with(9, {"a": 1}),
    _with(1, "torch.bool")[:5] + ("mean", [1]) + _with(1, "torch.bool")[7:],
]


def _final(encode, value, indent):
    """What the dump gets: the encoder's text, json.dumps's text when the encoder raises
    _NotPlainJson (the caller's fallback; its own exception type if it has none), or the
    type of any other exception."""
    result = _run(encode, value, indent)
    if result == ("raises", _NotPlainJson):
        try:
            return "ok", _reference(value, indent)
        except Exception as error:  # noqa: BLE001
            return "raises", type(error)
    return result


_PYTHON_DIFFERS = {ODD_VALUES.index(_with(2, (True,)))}  # see test_python_encoder_known_differences...


@pytest.mark.parametrize("value", ODD_VALUES, ids=range(len(ODD_VALUES)))
@pytest.mark.parametrize("indent", ["", "  "])
def test_unusual_values_end_as_with_the_python_encoder(value, indent):
    """Text equal to json.dumps's, or _NotPlainJson (the caller then uses json.dumps),
    or the exception the Python encoder raises too."""
    for wrapped in (value, [value], {"k": [1.5, value]}):
        c_result = _run(_c_encoder(), wrapped, indent)
        if c_result[0] == "ok":
            assert c_result[1] == _reference(wrapped, indent)
        if ODD_VALUES.index(value) not in _PYTHON_DIFFERS:
            assert _final(_c_encoder(), wrapped, indent) == _final(_py_encoder(), wrapped, indent)


def test_refused_values_raise_not_plain_json():
    for value in ({1: "x"}, _Float(1.0), _Int(1), _Str("s"), object(), [_Dict()], ("a", "b")):
        with pytest.raises(_NotPlainJson):
            _c_encoder()(value, "  ", [])


@pytest.mark.parametrize("make", [lambda v: [v], lambda v: {"k": v}, lambda v: [{"k": v}]])
def test_nesting_too_deep_raises_recursion_error_like_python(make):
    value: object = 1.0
    for _ in range(100_000):
        value = make(value)
    for encode in (_c_encoder(), _py_encoder()):
        with pytest.raises(RecursionError):
            encode(value, "  ", [])


def test_deep_but_allowed_nesting_is_written():
    value: object = [_RECORD, ("[[[1]]]",)]
    for _ in range(150):
        value = {"k": [value]}
    assert _run(_c_encoder(), value, "  ") == ("ok", _reference(value, "  "))


def test_an_indent_that_is_not_spaces_goes_to_the_python_encoder():
    value = {"a": [_RECORD, ("[1]",), 2.5]}
    for indent in ["\t", " x", "é"]:
        assert _run(_c_encoder(), value, indent) == _run(_py_encoder(), value, indent)


def test_out_may_be_any_object_with_append():
    class Out:
        def __init__(self):
            self.parts = []

        def append(self, part):
            self.parts.append(part)

    out = Out()
    _c_encoder()([_RECORD], "", out)
    assert out.parts == [_reference([_RECORD])]


def test_huge_ints_raise_like_int_repr():
    big = 10 ** 5000 if sys.get_int_max_str_digits() else None  # 0: no limit
    if big is None:
        pytest.skip("no int digit limit")
    for value in ([big], {"shape": [big]}, (("torch.Tensor", "torch.float32", (big,), None, None, None, None,
                                              None, None, None, None, None))):
        assert _run(_c_encoder(), value) == _run(_py_encoder(), value)
        assert _run(_c_encoder(), value)[1] is ValueError


def test_a_value_leaf_text_that_is_not_json_raises_the_json_error():
    for encode in (_c_encoder(), _py_encoder()):
        with pytest.raises(json.JSONDecodeError):
            encode([("[1,",)], "", [])


# --- the whole export ---------------------------------------------------------------------------
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_recorded_steps_export_the_same_bytes_with_and_without_the_extension(tmp_path, monkeypatch, json_files, level):
    """Live export of recorded steps (extension on, then off) against the offline export
    of the same log with the extension in the other state: every .json byte-identical."""
    torch = pytest.importorskip("torch")
    from msprobe.pytorch import PrecisionDebugger
    from store.export import export_log

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 4)
            self.emb = torch.nn.Embedding(10, 6)

        def forward(self, ids):
            x = self.emb(ids)
            y = self.fc(x).relu()
            mask = y > 0.1  # a bool tensor
            return (y * mask).sum(dim=-1), mask, ids.max()

    for native_on in (True, False):
        monkeypatch.setattr(record_text, "_native", native if native_on else None)
        assert (type(record_text.records_encoder()) is native.Encoder) is native_on
        torch.manual_seed(0)
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        dump = tmp_path / f"dump_{native_on}"
        debugger = PrecisionDebugger(dump_path=str(dump), level=level)
        for _ in range(2):
            debugger.start(net)
            out, _mask, _top = net(torch.randint(0, 10, (3, 5)))
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            debugger.stop()
            debugger.step()
        debugger.close()
        live = json_files(dump)
        assert any(name.endswith("dump.json") for name in live)
        monkeypatch.setattr(record_text, "_native", None if native_on else native)
        export_log(dump, tmp_path / f"offline_{native_on}")
        offline = json_files(tmp_path / f"offline_{native_on}")
        dumps = [name for name in live if name.endswith("dump.json")]
        assert dumps and {name: live[name] for name in dumps} == {name: offline[name] for name in dumps}
