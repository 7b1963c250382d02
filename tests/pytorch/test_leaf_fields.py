"""Every field of a tensor leaf built by ``LeafBuilder.tensor_leaf`` lands under its own name:
``_stats_leaf`` builds the leaf positionally (``store.records.make_leaf``, LEAF_FIELDS order),
so a swapped pair (max/min, max_finite/min_finite, has_nan/has_inf, crc32/payload) would go
unnoticed by tests reading one field. Expected values from numpy float64 and zlib."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from msprobe.pytorch.leaves import LeafBuilder
from store.records import LEAF_FIELDS, Leaf


def _expected(t: torch.Tensor, crc32, payload) -> dict:
    a = t.detach().to(torch.float64).numpy().ravel()
    finite = a[np.isfinite(a)]
    not_finite = not np.isfinite(a).all()
    return dict(
        io="input_args", path=(1, "w"), leaf_kind="tensor", type="torch.Tensor", dtype=str(t.dtype),
        shape=tuple(t.shape), numel=a.size, max=float(a.max()), min=float(a.min()), mean=float(a.mean()),
        norm=float(np.sqrt(np.sum(a * a))),
        max_finite=float(finite.max()) if not_finite else None,
        min_finite=float(finite.min()) if not_finite else None,
        crc32=crc32, requires_grad=bool(t.requires_grad), has_nan=bool(np.isnan(a).any()),
        has_inf=bool(np.isinf(a).any()), data_name=None, payload=payload, value_json=None)


@pytest.mark.parametrize("md5", [True, False])
@pytest.mark.parametrize("values", [[3.0, -np.inf, 0.5, -2.0], [4.0, -1.0, 0.25, 2.0]])
def test_tensor_leaf_fields_by_name(md5, values):
    t = torch.tensor(values, dtype=torch.float64).requires_grad_(True)
    refs = []
    builder = LeafBuilder(md5=md5, capture=lambda x: refs.append(x) or "shard0:00ff")
    leaf = builder.tensor_leaf("input_args", (1, "w"), t)
    crc = f"{zlib.crc32(np.asarray(values, dtype='<f8').tobytes()):08x}" if md5 else None
    expected = _expected(t, crc, "shard0:00ff")
    assert type(leaf) is Leaf and len(refs) == 1
    for name in LEAF_FIELDS:
        assert getattr(leaf, name) == expected[name], (name, getattr(leaf, name), expected[name])
    assert leaf == Leaf(**expected)
