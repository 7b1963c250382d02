"""Myers' shortest edit script against an independent dynamic-programming LCS."""
from __future__ import annotations

import random

import pytest

from msprobe.compare.myers import EditLimitExceeded, align


def lcs_length(a, b) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            table[i][j] = table[i + 1][j + 1] + 1 if a[i] == b[j] else max(table[i + 1][j], table[i][j + 1])
    return table[0][0]


def test_hand_examples():
    assert align("abcab", "cbab") == [(2, 0), (3, 2), (4, 3)]
    assert align("", "abc") == [] and align("abc", "") == []
    assert align("abc", "abc") == [(0, 0), (1, 1), (2, 2)]


def test_random_against_dp():
    rng = random.Random(0)
    for _ in range(1500):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 12))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 12))]
        pairs = align(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(pairs, pairs[1:]))
        assert len(pairs) == lcs_length(a, b), (a, b, pairs)


def test_periodic_trace_aligns_layer_by_layer():
    layer = ["linear", "gelu", "ln", "linear", "add"]
    a = layer * 4
    b = layer[:2] + ["tanh", "mul", "add"] + layer[2:] + layer * 3   # three ops inserted in layer 0
    pairs = align(a, b)
    assert len(pairs) == len(a)
    inserted = sorted(set(range(len(b))) - {j for _, j in pairs})
    assert [b[j] for j in inserted] == ["tanh", "mul", "add"]
    assert inserted == [2, 3, 4]


def test_edit_limit():
    with pytest.raises(EditLimitExceeded):
        align("abcdef", "uvwxyz", max_d=3)
    assert len(align("abcdef", "abXdef", max_d=2)) == 5
