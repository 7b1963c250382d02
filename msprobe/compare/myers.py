"""Myers' shortest edit script (E. W. Myers, "An O(ND) Difference Algorithm and Its
Variations", Algorithmica 1986), written for call alignment.

:func:`align` returns the pairs of equal elements on one longest common subsequence
found by the greedy forward algorithm: for each edit distance ``d = 0, 1, ...`` it keeps,
per diagonal ``k = x - y``, the furthest reaching x, and follows "snakes" (runs of equal
elements) for free. Time O((N+M)·D), memory O(D²) for the saved frontiers, where D is the
number of inserted plus deleted elements. Unlike difflib's SequenceMatcher (longest block
first), it never prefers a long matching block that forces many edits elsewhere, so a
periodic trace (the same layer repeated) aligns layer by layer.
"""
from __future__ import annotations

from typing import Hashable, Optional, Sequence

__all__ = ["align", "EditLimitExceeded"]


class EditLimitExceeded(Exception):
    """The sequences differ by more than ``max_d`` edits (raised by :func:`align`)."""


def align(
    a: Sequence[Hashable], b: Sequence[Hashable], *, max_d: Optional[int] = None
) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` with ``a[i] == b[j]`` on a shortest edit script from ``a`` to ``b``.

    Args:
        a, b: sequences of hashable tokens (compared with ``==``).
        max_d: give up once more than this many insertions+deletions are needed.
    Returns:
        Index pairs, increasing in both ``i`` and ``j``; ``len(a) + len(b) - 2*len(pairs)``
        is the minimal number of edits. Example: ``align("abcab", "cbab")`` has 3 pairs
        (edit distance 3).
    Raises:
        EditLimitExceeded: more than ``max_d`` edits are needed.
    """
    n, m = len(a), len(b)
    # common prefix and suffix cost nothing and shrink the search
    lo = 0
    while lo < n and lo < m and a[lo] == b[lo]:
        lo += 1
    hi_a, hi_b = n, m
    while hi_a > lo and hi_b > lo and a[hi_a - 1] == b[hi_b - 1]:
        hi_a -= 1
        hi_b -= 1
    pairs = [(i, i) for i in range(lo)]
    middle = _middle(a, b, lo, hi_a, lo, hi_b, max_d)
    pairs.extend(middle)
    pairs.extend((hi_a + t, hi_b + t) for t in range(n - hi_a))
    return pairs


def _middle(a, b, a0: int, a1: int, b0: int, b1: int, max_d: Optional[int]) -> list[tuple[int, int]]:
    n, m = a1 - a0, b1 - b0
    if n == 0 or m == 0:
        return []
    limit = n + m if max_d is None else min(n + m, max_d)
    offset = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    found = -1
    for d in range(limit + 1):
        trace.append(v[offset - d - 1: offset + d + 2])  # frontier before step d (diagonals -d-1..d+1)
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]          # step down: insertion from b
            else:
                x = v[offset + k - 1] + 1      # step right: deletion from a
            y = x - k
            while x < n and y < m and a[a0 + x] == b[b0 + y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                found = d
                break
        if found >= 0:
            break
    if found < 0:
        raise EditLimitExceeded(f"more than {limit} edits needed")
    # backtrack through the saved frontiers
    pairs: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(found, 0, -1):
        frontier = trace[d]            # v before step d, indices shifted by d+1
        k = x - y

        def at(kk: int) -> int:
            return frontier[kk + d + 1]

        if k == -d or (k != d and at(k - 1) < at(k + 1)):
            prev_k = k + 1
        else:
            prev_k = k - 1
        prev_x = at(prev_k)
        prev_y = prev_x - prev_k
        start_x = prev_x if prev_k == k + 1 else prev_x + 1
        start_y = start_x - k
        while x > start_x and y > start_y:  # snake after the edit
            x -= 1
            y -= 1
            pairs.append((a0 + x, b0 + y))
        x, y = prev_x, prev_y
    while x > 0 and y > 0:                  # snake of d = 0
        x -= 1
        y -= 1
        pairs.append((a0 + x, b0 + y))
    pairs.reverse()
    return pairs
