"""Framework-neutral predicates deciding what a recording session keeps.

- :func:`parse_int_list`: the ``rank`` / ``step`` lists of config.json (spec 5.6).
- :class:`DataMode`: the ``data_mode`` axes direction x side (spec 5.4, section 9 fix 21).
- :class:`NameList`: the ``list`` substring filter (spec 5.5, kept per section 9).
- :class:`ScopeRange`: the ``scope`` range, inclusive at both ends (spec 5.5, section 9
  fix 19). A ``ScopeRange`` holds state (whether the range is open); it belongs to one
  session and is reset at each step.

Nothing here imports a deep-learning framework.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from msprobe.core.errors import ConfigError

__all__ = [
    "DATA_MODES",
    "MAX_RANK_OR_STEP",
    "DataMode",
    "Direction",
    "NameList",
    "ScopeRange",
    "Side",
    "parse_int_list",
]

Direction = Literal["forward", "backward"]
Side = Literal["input", "output"]

#: Allowed ``data_mode`` elements, in documentation order.
DATA_MODES: Final = ("all", "forward", "backward", "input", "output")
#: Largest rank or step number accepted in config.json (spec 5.3: out of [0, 1e6] fails).
MAX_RANK_OR_STEP: Final = 1_000_000

_DIRECTIONS: Final = ("forward", "backward")
_SIDES: Final = ("input", "output")
_RANGE_RE: Final = re.compile(r"(\d+)(?:-(\d+))?", re.ASCII)
_INT_LIST_ALLOWED: Final = (
    f"a list of integers 0..{MAX_RANK_OR_STEP}, integer strings ('4') and 'a-b' range strings with a <= b"
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_int_list(field: str, value: Any) -> tuple[int, ...]:
    """Expand a ``rank`` or ``step`` list into sorted, distinct integers (spec 5.6).

    Args:
        field: the field name used in errors (``"rank"`` or ``"step"``).
        value: a ``list`` (or ``tuple``) whose elements are ints in
            ``0..MAX_RANK_OR_STEP`` (``bool`` is not an int here), strings of ASCII
            digits (``"4"``, as upstream 26.x accepts) or ``"a-b"`` strings with
            ``a <= b``, both ends inclusive and in the same bounds.

    Returns:
        The expanded values, deduplicated and sorted; ``()`` for an empty list, which
        means "all".

    Raises:
        ConfigError: naming ``field`` when ``value`` is not a list or an element is bad.

    Example: ``parse_int_list("step", [0, "2-4", 3])`` returns ``(0, 2, 3, 4)``;
    ``parse_int_list("step", ["0", "4-6"])`` returns ``(0, 4, 5, 6)``.
    """
    if not isinstance(value, (list, tuple)):
        raise ConfigError(field, value, _INT_LIST_ALLOWED, f"expected a list, got {type(value).__name__}")
    result: set[int] = set()
    for element in value:
        if _is_int(element):
            if not 0 <= element <= MAX_RANK_OR_STEP:
                raise ConfigError(field, element, _INT_LIST_ALLOWED, "value out of range")
            result.add(element)
        elif isinstance(element, str):
            match = _RANGE_RE.fullmatch(element)
            if match is None:
                raise ConfigError(field, element, _INT_LIST_ALLOWED,
                                  "a string must be an integer '4' or a range 'a-b'")
            last_text = match[1] if match[2] is None else match[2]
            if max(len(match[1]), len(last_text)) > len(str(MAX_RANK_OR_STEP)):
                raise ConfigError(field, element, _INT_LIST_ALLOWED, "value out of range")
            first, last = int(match[1]), int(last_text)
            if first > last:
                raise ConfigError(
                    field, element, _INT_LIST_ALLOWED, f"range start {first} is greater than end {last}"
                )
            if last > MAX_RANK_OR_STEP:
                raise ConfigError(field, element, _INT_LIST_ALLOWED, "value out of range")
            result.update(range(first, last + 1))
        else:
            raise ConfigError(
                field, element, _INT_LIST_ALLOWED, f"element of type {type(element).__name__}"
            )
    return tuple(sorted(result))


@dataclass(frozen=True, slots=True)
class DataMode:
    """Which pieces of a call are recorded: ``data_mode`` as two axes (spec 5.4).

    ``directions`` is a subset of {forward, backward}, ``sides`` of {input, output}; an
    axis not named in ``data_mode`` allows both. A piece is recorded if its direction and
    its side are both allowed. Per section 9 fix 21, a module's ``parameters`` count as
    forward input and ``parameters_grad`` as backward output.

    Example: ``DataMode.from_config(("forward", "output"))`` allows forward output only:
    ``allows("forward", "output")`` is True, ``allows("forward", "input")`` and
    ``allows_parameters()`` are False, and so is everything backward.
    """

    directions: frozenset[str]
    sides: frozenset[str]

    @classmethod
    def from_config(cls, data_mode: Sequence[str], *, field: str = "data_mode") -> DataMode:
        """Validate a ``data_mode`` list and build its axes.

        Raises:
            ConfigError: naming ``field`` when ``data_mode`` is not a non-empty list of
                distinct values from ``DATA_MODES``, or combines ``"all"`` with others.
        """
        if not isinstance(data_mode, (list, tuple)):
            raise ConfigError(field, data_mode, DATA_MODES, "expected a list")
        if not data_mode:
            raise ConfigError(field, data_mode, DATA_MODES, "the list must not be empty")
        for element in data_mode:
            if not isinstance(element, str) or element not in DATA_MODES:
                raise ConfigError(field, element, DATA_MODES)
        if len(set(data_mode)) != len(data_mode):
            raise ConfigError(field, data_mode, DATA_MODES, "duplicate values")
        if "all" in data_mode and len(data_mode) > 1:
            raise ConfigError(field, data_mode, DATA_MODES, "'all' cannot be combined with other values")
        directions = frozenset(d for d in _DIRECTIONS if d in data_mode) or frozenset(_DIRECTIONS)
        sides = frozenset(s for s in _SIDES if s in data_mode) or frozenset(_SIDES)
        return cls(directions=directions, sides=sides)

    def allows(self, direction: Direction, side: Side) -> bool:
        """True if ``side`` ("input"/"output") of a ``direction`` ("forward"/"backward")
        call is recorded. Raises ``ValueError`` for any other direction or side."""
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction: got {direction!r}; allowed: forward, backward")
        if side not in _SIDES:
            raise ValueError(f"side: got {side!r}; allowed: input, output")
        return direction in self.directions and side in self.sides

    @property
    def forward(self) -> bool:
        """True if some part of forward calls is recorded."""
        return "forward" in self.directions

    @property
    def backward(self) -> bool:
        """True if some part of backward calls is recorded."""
        return "backward" in self.directions

    def allows_parameters(self) -> bool:
        """Module ``parameters`` are recorded (they count as forward input, fix 21)."""
        return self.allows("forward", "input")

    def allows_parameters_grad(self) -> bool:
        """``parameters_grad`` are recorded (they count as backward output, fix 21)."""
        return self.allows("backward", "output")

    def backward_keys(self) -> tuple[str, ...]:
        """The top-level keys of a backward entry that this data_mode keeps, in dump.json
        order: ``("input", "output")`` for ``["all"]``, ``("input",)`` for ``["input"]``."""
        return tuple(side for side in ("input", "output") if self.allows("backward", side))


class NameList:
    """The ``list`` filter: a name is kept if any configured string is a substring of it
    (spec 5.5; substring matching is kept per section 9, so ``"relu"`` also keeps
    ``Functional.leaky_relu.0.forward``). An empty list keeps every name.

    Example: ``NameList(["relu"]).matches("Functional.relu.0.backward")`` is True,
    ``NameList(["relu"]).matches("Functional.gelu.0.forward")`` is False.
    """

    __slots__ = ("_names",)

    def __init__(self, names: Iterable[str]) -> None:
        names = tuple(names)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"NameList names must be str, got {type(name).__name__}")
        self._names: tuple[str, ...] = names

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def matches(self, name: str) -> bool:
        """True if ``name`` contains any configured string, or the list is empty."""
        if not self._names:
            return True
        return any(configured in name for configured in self._names)

    def __repr__(self) -> str:
        return f"NameList({list(self._names)!r})"


class ScopeRange:
    """The ``scope`` range: entries between ``first`` and ``last`` in hook order, both
    ends included (spec 5.5 and section 9 fix 19).

    The session calls :meth:`enter` when an entry (API call or module) starts and
    :meth:`exit` when it has finished. The range opens at ``enter(first)`` and closes
    at ``exit(last)``, so the end API keeps its output and an end module keeps everything
    that runs inside it. An empty scope (``first is None``) is always in range. Covering
    the backward of what was covered forward is up to the session (it knows the
    forward/backward pairing).

    Example, with ``ScopeRange("Functional.relu.0.forward", "Tensor.__add__.1.forward")``:
    ``enter("Functional.linear.0.forward")`` → False; ``enter("Functional.relu.0.forward")``
    → True; ``enter("Tensor.__add__.1.forward")`` → True and ``in_range`` stays True until
    ``exit("Tensor.__add__.1.forward")``, after which it is False.
    """

    __slots__ = ("first", "last", "_open")

    def __init__(self, first: str | None = None, last: str | None = None) -> None:
        if (first is None) != (last is None):
            raise ValueError("ScopeRange needs both ends or neither")
        self.first = first
        self.last = last
        self._open = False

    @classmethod
    def from_config(cls, scope: Sequence[str]) -> ScopeRange:
        """Build from a validated ``Config.scope``: ``()`` or ``(first, last)``."""
        if not scope:
            return cls()
        if len(scope) != 2:
            raise ValueError(f"scope: got {list(scope)!r}; allowed: 0 or 2 names")
        return cls(scope[0], scope[1])

    @property
    def in_range(self) -> bool:
        """True while the range is open (always True for an empty scope)."""
        return self.first is None or self._open

    def enter(self, name: str) -> bool:
        """An entry named ``name`` starts; returns whether it is in range."""
        if self.first is not None and name == self.first:
            self._open = True
        return self.in_range

    def exit(self, name: str) -> None:
        """The entry named ``name`` has finished; closes the range after ``last``."""
        if self.last is not None and name == self.last:
            self._open = False

    def reset(self) -> None:
        """Close the range (at a step boundary)."""
        self._open = False

    def __repr__(self) -> str:
        return f"ScopeRange({self.first!r}, {self.last!r}, open={self._open})"
