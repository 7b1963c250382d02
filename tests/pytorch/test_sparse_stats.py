"""Sparse tensors (COO, CSR, CSC, BSR, hybrid COO) are recorded with the statistics of the
matrix they represent: Max/Min over the stored values and the implicit zeros, Mean over all
elements, Norm; checked against numpy float64 over the dense equivalent, and for a matrix
too large to densify against numpy over its stored values."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.stats import tensor_stats
from pt_helpers import load_dump

pytestmark = pytest.mark.filterwarnings("ignore:Sparse (CSR|BSR|CSC) tensor support is in beta")


def _dense_expect(t: torch.Tensor) -> dict:
    a = t.to_dense().to(torch.float64).numpy().ravel()
    return {"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
            "Norm": float(np.sqrt((a * a).sum()))}


def _matrix() -> torch.Tensor:
    torch.manual_seed(0)
    d = torch.randn(6, 8)
    d[d.abs() < 0.9] = 0.0
    return d


def _uncoalesced() -> torch.Tensor:
    # duplicate index (1, 2) adds up to -3.5; every stored value negative: Max is an implicit 0
    idx = torch.tensor([[0, 1, 1, 4], [0, 2, 2, 7]])
    return torch.sparse_coo_tensor(idx, torch.tensor([-1.0, -1.5, -2.0, -0.25]), (5, 9), check_invariants=True)


CASES = {
    "coo": lambda: _matrix().to_sparse(),
    "coo_uncoalesced_negative": _uncoalesced,
    "csr": lambda: _matrix().to_sparse_csr(),
    "csc": lambda: _matrix().to_sparse_csc(),
    "bsr": lambda: _matrix().to_sparse_bsr((2, 2)),
    "hybrid_coo": lambda: _matrix().reshape(6, 4, 2).to_sparse(1),
    "coo_float64": lambda: _matrix().double().to_sparse(),
    "coo_fp16": lambda: _matrix().half().to_sparse(),
    "csr_all_stored": lambda: (torch.arange(12.0).reshape(3, 4) + 1).to_sparse_csr(),
    "coo_nothing_stored": lambda: torch.zeros(4, 5).to_sparse(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sparse_statistics_equal_dense_numpy(case):
    t = CASES[case]()
    s = tensor_stats(t)
    exp = _dense_expect(t)
    assert (s.max, s.min) == (exp["Max"], exp["Min"])
    assert s.mean == pytest.approx(exp["Mean"], rel=1e-12, abs=1e-300)
    assert s.norm == pytest.approx(exp["Norm"], rel=1e-12, abs=1e-300)
    assert (s.has_nan, s.has_inf) == (False, False)


def test_sparse_nan_and_bool():
    t = torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 3]]), torch.tensor([float("nan"), -4.0]), (3, 4))
    s = tensor_stats(t)
    assert math.isnan(s.max) and math.isnan(s.min) and s.has_nan
    assert (s.max_finite, s.min_finite) == (0.0, -4.0)  # the implicit zeros are finite
    b = torch.tensor([[True, False], [False, True]]).to_sparse()
    sb = tensor_stats(b)
    assert (sb.max, sb.min) == (1.0, 0.0)  # any / all (zeros are implicit)


def test_large_sparse_matrix_is_not_densified():
    n = 1 << 20  # 2^40 elements: a dense copy would need 4 TiB
    idx = torch.tensor([[0, 5, 77, n - 1], [3, 5, 1000, n - 1]])
    vals = torch.tensor([2.5, -1.0, 7.0, 0.5])
    t = torch.sparse_coo_tensor(idx, vals, (n, n))
    s = tensor_stats(t)
    v = vals.double().numpy()
    assert (s.max, s.min) == (7.0, -1.0)
    assert s.mean == pytest.approx(v.sum() / float(n * n), rel=1e-12)
    assert s.norm == pytest.approx(float(np.sqrt((v * v).sum())), rel=1e-12)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_sparse_arguments_recorded(tmp_path, task):
    coo, csr = _matrix().to_sparse(), _matrix().to_sparse_csr()
    dense = torch.randn(8, 3)
    ref = (torch.mm(coo, dense), torch.mul(csr, 3))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", task=task)
    dbg.start()
    out = (torch.mm(coo, dense), torch.mul(csr, 3))
    dbg.stop()
    dbg.step()
    dbg.close()
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1].to_dense(), ref[1].to_dense())
    data = load_dump(tmp_path / "d")[0]["data"]
    checks = [(data["Torch.mm.0.forward"]["input_args"][0], coo),
              (data["Torch.mul.0.forward"]["input_args"][0], csr),
              (data["Torch.mul.0.forward"]["output"][0], out[1])]
    for rec, t in checks:
        exp = _dense_expect(t)
        assert rec["shape"] == list(t.shape)
        assert (rec["Max"], rec["Min"]) == (exp["Max"], exp["Min"])
        assert rec["Mean"] == pytest.approx(exp["Mean"], rel=1e-12)
        assert rec["Norm"] == pytest.approx(exp["Norm"], rel=1e-12)
    assert data["Torch.mm.0.forward"]["output"][0]["Norm"] == pytest.approx(_dense_expect(out[0])["Norm"], rel=1e-12)
