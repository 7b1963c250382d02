"""Dict keys become distinct path components (msprobe.core.values.object_keys): keys of
different types with the same text (1 and "1") each keep their own leaf."""
from __future__ import annotations

from hypothesis import given, strategies as st

from msprobe.core.values import MAX_TEXT, key_text, object_keys, walk
from store import schema


def test_same_text_keys_get_numbered():
    assert object_keys([1, "1"]) == ["1", "1~2"]
    assert object_keys(["1", 1]) == ["1", "1~2"]
    assert object_keys([None, "None", 1.5, "1.5"]) == ["None", "None~2", "1.5", "1.5~2"]


def test_suffix_never_takes_another_keys_own_text():
    # "None~2" is a real key of the dict: the duplicate "None" skips to ~3
    assert object_keys([None, "None", "None~2"]) == ["None", "None~3", "None~2"]
    assert object_keys([1, "1", (1,), "1~2"]) == ["1", "1~3", "(1,)", "1~2"]


def test_distinct_texts_unchanged():
    assert object_keys(["a", "b", 3, (1, 2)]) == ["a", "b", "3", "(1, 2)"]
    assert object_keys([]) == []


class _BadStr:
    def __str__(self):
        raise RuntimeError("no text")


class _LongStr:
    def __str__(self):
        return "k" * (MAX_TEXT + 50)


def test_key_text_never_raises_and_is_short():
    assert key_text(_BadStr()) == f"<{__name__}._BadStr object>"
    text = key_text(_LongStr())
    assert len(text) == MAX_TEXT and text.endswith("...")
    long_str_key = "s" * (MAX_TEXT + 50)
    assert key_text(long_str_key) == long_str_key  # a str key is its own text, whole


@given(st.lists(st.one_of(st.integers(-3, 3), st.text(alphabet="0123~-N", max_size=4), st.none()),
                max_size=12, unique_by=lambda k: (type(k), k)))
def test_object_keys_distinct(keys):
    out = object_keys(keys)
    assert len(out) == len(keys)
    assert len(set(out)) == len(out)
    for k, text in zip(keys, out):  # each is its key's text, or that text with a ~n suffix
        base = str(k)
        assert text == base or (text.startswith(base + "~") and text[len(base) + 1:].isdigit())


def test_walk_keeps_both_values():
    leaves = list(walk({1: "a", "1": "b"}, leaf_kind=lambda v: None,
                       record=lambda v: {"type": "str", "value": v}, path=(0,)))
    assert [(p, v["value"], k) for p, v, k in leaves] == [
        ((0, "1"), "a", schema.LEAF_VALUE), ((0, "1~2"), "b", schema.LEAF_VALUE)]


def test_unique_file_names():
    from msprobe.core.naming import unique_file_names
    assert unique_file_names(["x.a.pt", "x.b.pt"]) == ["x.a.pt", "x.b.pt"]
    assert unique_file_names(["x.a_b.pt", "x.a_b.pt", "x.a_b.pt"]) == ["x.a_b.pt", "x.a_b-2.pt", "x.a_b-3.pt"]
    assert unique_file_names(["x.a_b.pt", "x.a_b.pt", "x.a_b-2.pt"]) == ["x.a_b.pt", "x.a_b-3.pt", "x.a_b-2.pt"]
    assert unique_file_names(["noext", "noext"]) == ["noext", "noext-2"]


class _ReversedIter(dict):
    """A dict subclass whose iteration order differs from values()' order."""

    def __iter__(self):
        return iter(list(dict.keys(self))[::-1])


def test_walk_pairs_each_key_with_its_own_value():
    # before: keys came from iterating the dict, values from values(): "b" got a's value
    d = _ReversedIter(a="A", b="B")
    leaves = list(walk(d, leaf_kind=lambda v: None, record=lambda v: {"type": "str", "value": v}))
    assert sorted((p, v["value"]) for p, v, _ in leaves) == [(("a",), "A"), (("b",), "B")]
