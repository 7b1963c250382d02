"""The SQL/numpy engine paths give exactly what the plain-Python reference implementations
(:func:`msprobe.compare.align.align_step`, :func:`msprobe.compare.verdicts.call_verdicts`)
give on the recorded runs, and the segment shortcuts give what Myers (or its greedy
fallback) gives."""
from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import msprobe.compare as C
from msprobe.compare.align import Call, _segment_pairs, align_step
from msprobe.compare.load import load_side
from msprobe.compare.myers import EditLimitExceeded, align as myers_align
from msprobe.compare.verdicts import CALL_AGG_SQL, call_verdicts

CASES = [("gelu", "base"), ("ins", "base"), ("base", "ins"), ("ins_ln", "base"), ("bf16", "fp32"),
         ("bf16_fragile", "fp32_fragile"), ("two_steps", "base"), ("nan", "fp32")]


def _calls(path) -> dict:
    """{(rank, step): [Call]} with a signature built in Python from the leaves."""
    side = load_side(path, "X")
    sigs: dict = {}
    for leaf in side.leaves.to_pylist():
        if leaf["leaf_kind"] != "tensor":
            continue
        d = leaf["dtype"]
        dc = "f" if d is not None and any(x in d.lower() for x in ("float", "half", "double")) else d
        sigs.setdefault((leaf["rank"], leaf["step"], leaf["cseq"]), set()).add(
            (leaf["io"], leaf["arg"], dc, tuple(leaf["shape"] or ())))
    out: dict = {}
    for c in sorted(side.calls.to_pylist(), key=lambda c: (c["rank"], c["step"], c["seq"])):
        sig = hash(frozenset(sigs.get((c["rank"], c["step"], c["seq"]), ())))
        out.setdefault((c["rank"], c["step"]), []).append(Call(c["seq"], c["name"], c["kind"], sig))
    return out


@pytest.mark.parametrize("target,baseline", CASES)
def test_alignment_equals_python_reference(runs, target, baseline):
    r = C.compare(runs[target], runs[baseline])
    t, b = _calls(runs[target]), _calls(runs[baseline])
    expected = []
    for key in sorted(set(t) & set(b)):
        expected += [key + tuple(row) for row in align_step(t[key], b[key])]
    got = r.con.sql("SELECT rank, step, ord, t_name, b_name, t_seq, b_seq, kind, how FROM alignment "
                    "ORDER BY rank, step, ord").fetchall()
    assert got == expected
    if target == "ins":   # the three inserted calls and their backward, nothing else
        inserted = sorted(n for (n,) in r.con.sql("SELECT t_name FROM alignment WHERE how = 'inserted'").fetchall())
        assert len(inserted) == 6 and {n.split(".")[1] for n in inserted} == {"tanh", "__mul__", "__add__"}


@pytest.mark.parametrize("target,baseline", CASES)
def test_call_verdicts_equal_python_reference(runs, target, baseline, monkeypatch):
    # the whole-run comparison keeps the sides' tables (t_calls ...) that CALL_AGG_SQL reads
    # (one step at a time, test_compare_stepwise.py, gives the same calls)
    from msprobe.compare import engine
    monkeypatch.setattr(engine, "STEP_AT_A_TIME", False)
    r = C.compare(runs[target], runs[baseline])
    rows = call_verdicts(r.con.sql(CALL_AGG_SQL).to_arrow_table().to_pylist())
    expected = sorted((x["rank"], x["step"], x["ord"], x["verdict"], x["reason"], x["e"]) for x in rows)
    got = sorted(r.con.sql("SELECT rank, step, ord, verdict, reason, e FROM calls").fetchall())
    assert len(got) == len(expected)
    for g, x in zip(got, expected):
        assert g[:5] == x[:5]
        assert (g[5] is None and x[5] is None) or g[5] == x[5] or (math.isnan(g[5]) and math.isnan(x[5]))
    if target in ("gelu", "bf16_fragile"):
        assert any(v == "origin" for _, _, _, v, _, _ in got)


def _reference(a: list, b: list, max_d: int):
    try:
        return [(i, j) for i, j in myers_align(a, b, max_d=max_d)], "myers"
    except EditLimitExceeded:
        positions: dict = {}
        for j, tok in enumerate(b):
            positions.setdefault(tok, []).append(j)
        out, last = [], -1
        for i, tok in enumerate(a):
            js = positions.get(tok, [])
            k = bisect.bisect_right(js, last)
            if k < len(js):
                last = js[k]
                out.append((i, last))
        return out, "greedy"


@settings(max_examples=300, deadline=None)
@given(a=st.lists(st.integers(0, 5), max_size=30), b=st.lists(st.integers(0, 5), max_size=30),
       max_d=st.integers(0, 40))
def test_segment_shortcuts_equal_myers(a, b, max_d):
    got = _segment_pairs(np.array(a, np.int64), np.array(b, np.int64), max_d)
    pairs, how = _reference(a, b, max_d)
    if not pairs:
        assert got is None
        return
    assert got is not None
    gi, gj, ghow = got
    assert list(zip(gi.tolist(), gj.tolist())) == pairs
    assert ghow == how


def test_segment_equal_and_disjoint_tokens():
    same = np.arange(1000, dtype=np.int64)
    i, j, how = _segment_pairs(same, same.copy(), 5)
    assert how == "myers" and i.tolist() == j.tolist() == list(range(1000))
    assert _segment_pairs(np.arange(50, dtype=np.int64), np.arange(50, 90, dtype=np.int64), 20000) is None
