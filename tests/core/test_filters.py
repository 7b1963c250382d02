"""Tests of msprobe.core.filters: data_mode, list, scope, rank/step parsing (spec 5.4–5.6, 9)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msprobe.core import ConfigError, DataMode, NameList, ScopeRange, parse_int_list

PIECES = [(d, s) for d in ("forward", "backward") for s in ("input", "output")]


# --- parse_int_list -------------------------------------------------------------------------


def test_parse_int_list_expands_sorts_and_deduplicates():
    assert parse_int_list("step", [0, "2-4", 3]) == (0, 2, 3, 4)
    assert parse_int_list("rank", []) == ()
    assert parse_int_list("rank", ["5-5", 5, "0-1"]) == (0, 1, 5)
    assert parse_int_list("step", ("1-3",)) == (1, 2, 3)


def test_parse_int_list_accepts_integer_strings_mixed_with_ints_and_ranges():
    # upstream 26.x accepts "0" as well as 0 and "4-6"
    assert parse_int_list("step", ["0", "4-6", 2]) == (0, 2, 4, 5, 6)
    assert parse_int_list("rank", ["1", 0, "3-4", "1"]) == (0, 1, 3, 4)
    assert parse_int_list("step", ["007"]) == (7,)
    with pytest.raises(ConfigError, match=r"`step`: got '1000001';.*out of range"):
        parse_int_list("step", ["1000001"])
    with pytest.raises(ConfigError, match=r"`step`: got '12345678';.*out of range"):
        parse_int_list("step", ["12345678"])


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        ({"a": 1}, r"config field `rank`: got \{'a': 1\};.*expected a list, got dict"),
        ([-1], r"`rank`: got -1;.*out of range"),
        ([False], r"`rank`: got False;.*element of type bool"),
        (["5-3"], r"`rank`: got '5-3';.*range start 5 is greater than end 3"),
        (["1 - 3"], r"`rank`: got '1 - 3';.*must be an integer '4' or a range"),
        ([""], r"`rank`: got '';.*must be an integer '4' or a range"),
        (["+1"], r"`rank`: got '\+1'"),
        (["1.0"], r"`rank`: got '1.0'"),
        (["-1-3"], r"`rank`: got '-1-3'"),
        (["１-２"], r"`rank`: got '１-２'"),  # full-width digits are not ASCII digits
        ([None], r"`rank`: got None"),
    ],
)
def test_parse_int_list_errors_name_the_field(value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_int_list("rank", value)


@given(st.lists(st.integers(0, 50) | st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=8))
def test_parse_int_list_matches_set_semantics(elements):
    value = [e if isinstance(e, int) else f"{e[0]}-{e[0] + e[1]}" for e in elements]
    expected = set()
    for e in elements:
        expected |= {e} if isinstance(e, int) else set(range(e[0], e[0] + e[1] + 1))
    assert parse_int_list("step", value) == tuple(sorted(expected))


# --- DataMode ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data_mode", "allowed"),
    [
        (["all"], set(PIECES)),
        (["forward"], {("forward", "input"), ("forward", "output")}),
        (["backward"], {("backward", "input"), ("backward", "output")}),
        (["input"], {("forward", "input"), ("backward", "input")}),
        (["output"], {("forward", "output"), ("backward", "output")}),
        (["forward", "output"], {("forward", "output")}),
        (["backward", "input"], {("backward", "input")}),
        (["forward", "backward"], set(PIECES)),
        (["input", "output"], set(PIECES)),
        (["forward", "backward", "input", "output"], set(PIECES)),
    ],
)
def test_data_mode_axes(data_mode, allowed):
    mode = DataMode.from_config(data_mode)
    assert {piece for piece in PIECES if mode.allows(*piece)} == allowed
    assert mode.forward == any(d == "forward" for d, _ in allowed)
    assert mode.backward == any(d == "backward" for d, _ in allowed)


@pytest.mark.parametrize(
    ("data_mode", "parameters", "parameters_grad"),
    [
        (["all"], True, True),
        (["forward"], True, False),
        (["backward"], False, True),
        (["input"], True, False),  # fix 21: parameters_grad is backward *output*
        (["output"], False, True),
        (["forward", "output"], False, False),  # fix 21: parameters are forward *input*
        (["backward", "output"], False, True),
    ],
)
def test_data_mode_parameters(data_mode, parameters, parameters_grad):
    mode = DataMode.from_config(data_mode)
    assert mode.allows_parameters() is parameters
    assert mode.allows_parameters_grad() is parameters_grad


@pytest.mark.parametrize(
    ("data_mode", "pattern"),
    [
        ([], r"config field `data_mode`: got \[\]; allowed: all, forward, backward, input, output; the list must not be empty"),
        (["all", "forward"], r"'all' cannot be combined"),
        (["input", "input"], r"duplicate values"),
        (["sideways"], r"got 'sideways'; allowed: all, forward, backward, input, output$"),
        ("forward", r"got 'forward';.*expected a list"),
    ],
)
def test_data_mode_invalid(data_mode, pattern):
    with pytest.raises(ConfigError, match=pattern):
        DataMode.from_config(data_mode)


def test_data_mode_field_name_in_error():
    with pytest.raises(ConfigError, match=r"`tensor.data_mode`"):
        DataMode.from_config([], field="tensor.data_mode")


def test_data_mode_allows_rejects_bad_axis():
    mode = DataMode.from_config(["all"])
    with pytest.raises(ValueError, match="direction: got 'sideways'"):
        mode.allows("sideways", "input")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="side: got 'middle'"):
        mode.allows("forward", "middle")  # type: ignore[arg-type]


# --- NameList ------------------------------------------------------------------------------


def test_name_list_substring_matching():
    names = NameList(["relu"])
    assert names.matches("Functional.relu.0.forward")
    assert names.matches("Functional.relu.0.backward")
    assert names.matches("Functional.leaky_relu.0.forward")  # substring, kept per spec 9
    assert not names.matches("Functional.gelu.0.forward")
    exact = NameList(["Functional.relu.0.forward"])
    assert exact.matches("Functional.relu.0.forward")
    assert not exact.matches("Functional.relu.0.backward")
    several = NameList(["head", "conv"])
    assert several.matches("Module.head.Linear.backward.0")
    assert several.matches("Functional.conv2d.3.forward")
    assert not several.matches("Tensor.add.0.forward")


def test_empty_name_list_matches_everything():
    names = NameList([])
    assert names.names == ()
    assert names.matches("anything") and names.matches("")
    assert NameList(("a",)).names == ("a",)


def test_name_list_rejects_non_strings():
    with pytest.raises(TypeError, match="must be str"):
        NameList(["a", 1])  # type: ignore[list-item]


# --- ScopeRange ----------------------------------------------------------------------------


def test_scope_range_inclusive_at_both_ends():
    scope = ScopeRange("Functional.relu.0.forward", "Tensor.__add__.1.forward")
    assert scope.enter("Functional.linear.0.forward") is False
    scope.exit("Functional.linear.0.forward")
    assert scope.enter("Functional.relu.0.forward") is True
    scope.exit("Functional.relu.0.forward")
    assert scope.enter("Tensor.mul.0.forward") is True
    scope.exit("Tensor.mul.0.forward")
    assert scope.enter("Tensor.__add__.1.forward") is True
    assert scope.in_range  # the end API's output is still in range (fix 19)
    scope.exit("Tensor.__add__.1.forward")
    assert not scope.in_range
    assert scope.enter("Functional.linear.1.forward") is False


def test_scope_range_module_end_covers_children():
    scope = ScopeRange("Module.a.A.forward.0", "Module.b.B.forward.0")
    assert scope.enter("Module.a.A.forward.0")
    scope.exit("Module.a.A.forward.0")
    assert scope.enter("Module.b.B.forward.0")
    assert scope.enter("Functional.relu.3.forward")  # runs inside the end module
    scope.exit("Functional.relu.3.forward")
    assert scope.in_range
    scope.exit("Module.b.B.forward.0")
    assert not scope.in_range


def test_scope_range_same_start_and_end_and_reset():
    scope = ScopeRange("Functional.relu.0.forward", "Functional.relu.0.forward")
    assert scope.enter("Functional.relu.0.forward")
    scope.exit("Functional.relu.0.forward")
    assert not scope.in_range
    scope.enter("Functional.relu.0.forward")
    scope.reset()
    assert not scope.in_range


def test_scope_range_end_before_start_is_ignored():
    scope = ScopeRange("A.x.0.forward", "B.y.0.forward")
    assert not scope.enter("B.y.0.forward")
    scope.exit("B.y.0.forward")
    assert not scope.in_range


def test_empty_scope_is_always_in_range():
    scope = ScopeRange.from_config(())
    assert scope.first is None and scope.in_range
    assert scope.enter("anything")
    scope.exit("anything")
    assert scope.in_range
    bounded = ScopeRange.from_config(("a", "b"))
    assert (bounded.first, bounded.last) == ("a", "b")
    with pytest.raises(ValueError, match="0 or 2 names"):
        ScopeRange.from_config(("a",))
    with pytest.raises(ValueError, match="both ends or neither"):
        ScopeRange("a", None)
