"""Turn nested MindSpore call arguments into dump records (spec 3.3, section 9 fixes 4/13).

Every leaf of a nested input/output becomes one :class:`store.records.Leaf`:

* ``mindspore.Tensor`` (Parameters included): ``{"type": "mindspore.Tensor", "dtype":
  "Float32", "shape", "Max", "Min", "Mean", "Norm"}``, ``requires_grad`` for Parameters
  only (plain MindSpore tensors have no such flag), ``md5`` in summary_mode md5,
  ``data_name`` for task tensor (the tensor's bytes go to the payload store through
  ``capture``; the session names the file and the exporter writes it);
* ``numpy.ndarray``: the same record with ``type`` ``numpy.ndarray`` and the numpy dtype;
* ``None``: JSON ``null``; lists/tuples: lists; dicts, namedtuples, dataclasses: objects;
* MindSpore dtypes: ``{"type": "mindspore.dtype", "value": "Float16"}``; other values as
  in the PyTorch adapter (``int``, ``float``, ``bool``, ``str``, ``slice``, ``ellipsis``,
  numpy scalars, anything else as its qualified type name and a short repr).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Optional

import numpy as np
from mindspore import Parameter, Tensor
from mindspore.common import dtype as mstype

from msprobe.core.values import value_record as core_value_record
from msprobe.core.values import walk
from msprobe.mindspore.device_stats import DeviceStats, PendingLeaf
from msprobe.mindspore.stats import array_stats, crc32_hex, host_array
from store import schema
from store.records import Leaf


#: ``capture(array) -> payload reference or None``: stores one tensor's values (task ``tensor``).
TensorCapture = Callable[[np.ndarray], Optional[str]]


def value_record(obj: Any) -> dict:
    """The JSON record of a non-tensor, non-container value: MindSpore dtypes here (spec
    3.3, any position), everything else via :func:`msprobe.core.values.value_record`."""
    if isinstance(obj, mstype.Type):
        return {"type": "mindspore.dtype", "value": str(obj)}
    return core_value_record(obj)


class LeafBuilder:
    """Builds the leaves of one recorded argument structure.

    Args:
        md5: also compute CRC-32 (summary_mode md5).
        with_data: compute statistics (False for task ``structure``).
        capture: task ``tensor``: stores each tensor's host values (a snapshot taken when
            the leaf is built: before the call runs for inputs) and returns the payload
            reference for the leaf's ``payload``.
        device: statistics of MindSpore tensors are computed on their device and resolved
            at flush points (:mod:`msprobe.mindspore.device_stats`): their leaves are
            :class:`PendingLeaf` until then. Used only without ``md5`` and ``capture``
            (CRC-32 and tensor files need the host copy, which then gives the statistics
            too); numpy arrays are always measured at once.
    """

    __slots__ = ("md5", "with_data", "capture", "device")

    def __init__(self, *, md5: bool, with_data: bool = True, capture: Optional[TensorCapture] = None,
                 device: Optional[DeviceStats] = None) -> None:
        self.md5 = md5
        self.with_data = with_data
        self.capture = capture
        self.device = device if (with_data and not md5 and capture is None) else None

    def tensor_leaf(self, io: str, path: tuple, t: Any) -> "Leaf | PendingLeaf":
        """The leaf of one MindSpore tensor or numpy array (a :class:`PendingLeaf` while
        its device statistics are pending). With ``capture``, the leaf's ``payload`` is
        set; the session derives its ``data_name`` from the entry name, ``io`` and
        ``path`` (:func:`msprobe.core.naming.tensor_file_name`, spec 2.2)."""
        is_np = isinstance(t, np.ndarray)
        dt = t.dtype  # read once: on a tensor an op has just made, it waits for shape inference
        type_ = "numpy.ndarray" if is_np else "mindspore.Tensor"
        dtype = str(dt)
        shape = tuple(int(d) for d in t.shape)
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        rg = _requires_grad(t) if isinstance(t, Parameter) else None
        if not self.with_data or (self.device is not None and not is_np):
            leaf = Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type=type_, dtype=dtype,
                        shape=shape, numel=numel, requires_grad=rg)
            if not self.with_data or numel == 0:
                return leaf  # empty: no statistics (null), as array_stats gives
            pending = self.device.add(leaf, t, dt)
            if pending is not None:
                return pending
        a = host_array(t)
        st = array_stats(a)
        crc = crc32_hex(a) if self.md5 else None
        payload = self.capture(a) if self.capture is not None else None
        return Leaf(io=io, path=path, leaf_kind=schema.LEAF_TENSOR, type=type_, dtype=dtype, shape=shape,
                    numel=numel, max=st.max, min=st.min, mean=st.mean, norm=st.norm,
                    max_finite=st.max_finite, min_finite=st.min_finite, crc32=crc, requires_grad=rg,
                    has_nan=st.has_nan, has_inf=st.has_inf, payload=payload)

    def leaves(self, entry: str, io: str, value: Any, out: list[Leaf], path: tuple = ()) -> None:
        """Append the leaves of ``value`` (under top-level key ``io`` of ``entry``) to ``out``."""
        for p, v, kind in _walk(value, path, 0):
            if kind == schema.LEAF_TENSOR:
                out.append(self.tensor_leaf(io, p, v))
            elif kind == schema.LEAF_VALUE:
                out.append(Leaf(io=io, path=p, leaf_kind=kind, type=v.get("type"), value_json=json.dumps(v)))
            else:
                out.append(Leaf(io=io, path=p, leaf_kind=kind))

    def sequence(self, entry: str, io: str, values: Any, out: list[Leaf]) -> None:
        """Leaves of a top-level list (``input_args``, ``output``): element ``i`` at path ``(i,)``."""
        for i, v in enumerate(values):
            self.leaves(entry, io, v, out, (i,))

    def mapping(self, entry: str, io: str, values: dict, out: list[Leaf]) -> None:
        """Leaves of a top-level object (``input_kwargs``, ``parameters``)."""
        for k, v in values.items():
            self.leaves(entry, io, v, out, (str(k),))


def _requires_grad(p: Parameter) -> bool:
    """``p.requires_grad`` without the pipeline wait: the public property waits for
    MindSpore's whole asynchronous op queue to drain before reading ``_param_info``; the
    setter writes ``_param_info.requires_grad`` synchronously, so reading it directly gives
    the same value."""
    info = getattr(p, "_param_info", None)
    value = getattr(info, "requires_grad", None)
    return bool(p.requires_grad if value is None else value)


def _leaf_kind(value: Any) -> Optional[str]:
    return schema.LEAF_TENSOR if isinstance(value, (Tensor, np.ndarray)) else None


def _walk(value: Any, path: tuple, depth: int) -> Iterator[tuple[tuple, Any, str]]:
    return walk(value, leaf_kind=_leaf_kind, record=value_record, path=path, depth=depth)
