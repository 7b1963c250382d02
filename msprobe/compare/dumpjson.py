"""Streaming importer: upstream ``dump.json`` → Arrow rows of the compare tables.

:func:`iter_entries` reads a dump.json incrementally (1 MiB chunks) and yields its
top-level fields and then one ``(name, entry)`` per key of ``data``, so at most one entry
(plus one chunk) is in memory. Python's JSON decoder reads the ``NaN``/``Infinity``
tokens upstream writes (spec section 3). A truncated or malformed file raises
:class:`~msprobe.compare.errors.CompareInputError` naming the path and the byte offset.

:func:`entry_leaves` flattens one entry into leaf rows in the same shape as the store's
leaf rows (``io``, ``arg`` = path joined with ``.``, ``leaf_kind``, statistics...).
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Iterator, Optional, Union

from msprobe.compare.errors import CompareInputError

__all__ = ["iter_entries", "entry_kind", "entry_leaves", "TENSOR_TYPES"]

TENSOR_TYPES = frozenset({"torch.Tensor", "mindspore.Tensor", "numpy.ndarray", "torch.nn.parameter.Parameter",
                          "torch.distributed.tensor.DTensor"})
#: keys of a tensor record kept, as a JSON object, in the leaf's ``value_json``: ``alias_of``
#: (ours: the slot holds the same gradient as the slot named) and a DTensor's ``device_mesh``
#: and ``placements`` (upstream 26.x: mesh ranks, ``[{"Shard": {"dim": 0}}]``)
EXTRA_KEYS = ("alias_of", "device_mesh", "placements")
_PGRAD_INDEX = re.compile(r"\.parameters_grad\.(\d+)$")
_CHUNK = 1 << 20
_WS = " \t\r\n"


class _Stream:
    """A text window over a file with byte-offset bookkeeping for error messages."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.handle = open(path, "r", encoding="utf-8", errors="strict")
        self.buf = ""
        self.pos = 0
        self.dropped_bytes = 0
        self.eof = False

    def close(self) -> None:
        self.handle.close()

    def more(self) -> bool:
        if self.eof:
            return False
        if self.pos > _CHUNK:
            self.dropped_bytes += len(self.buf[: self.pos].encode("utf-8"))
            self.buf = self.buf[self.pos:]
            self.pos = 0
        try:
            chunk = self.handle.read(_CHUNK)
        except UnicodeDecodeError as exc:
            raise CompareInputError(f"{self.path}: not UTF-8 text near byte {self.offset()}: {exc.reason}") from None
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def offset(self, pos: Optional[int] = None) -> int:
        pos = self.pos if pos is None else pos
        return self.dropped_bytes + len(self.buf[:pos].encode("utf-8"))

    def fail(self, what: str, pos: Optional[int] = None) -> CompareInputError:
        at = self.offset(pos)
        state = "truncated" if self.eof and (pos or self.pos) >= len(self.buf) else "malformed"
        return CompareInputError(f"{self.path}: {state} dump.json at byte {at}: {what}")

    def skip_ws(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                raise self.fail("unexpected end of file")

    def expect(self, char: str) -> None:
        found = self.skip_ws()
        if found != char:
            raise self.fail(f"expected {char!r}, found {found!r}")
        self.pos += 1

    def value(self, decoder: json.JSONDecoder) -> Any:
        self.skip_ws()
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if exc.pos >= len(self.buf) - 1 or not self.eof:
                    if self.more():
                        continue
                raise self.fail(exc.msg, exc.pos) from None
            # a number or literal at the window end may continue in the next chunk
            if end >= len(self.buf) and not self.eof and not isinstance(value, (dict, list, str)):
                if self.more():
                    continue
            self.pos = end
            return value


def _member_keys(stream: _Stream, decoder: json.JSONDecoder, what: str) -> Iterator[str]:
    """The keys of the JSON object at the stream's position, each after its ``:``; the
    caller reads the member's value before asking for the next key. ``what`` names the key
    in the error raised when one is not a string."""
    stream.expect("{")
    first = True
    while True:
        if stream.skip_ws() == "}":
            stream.pos += 1
            return
        if not first:
            stream.expect(",")
        first = False
        key = stream.value(decoder)
        if not isinstance(key, str):
            raise stream.fail(f"expected {what}, found {key!r}")
        stream.expect(":")
        yield key


def iter_entries(path: Union[str, os.PathLike]) -> Iterator[tuple[str, Any]]:
    """Yield ``("header", {task, level, framework, dump_data_dir})`` once ``data`` starts,
    then ``(name, entry)`` per entry of ``data`` in file order.

    Raises:
        CompareInputError: the file is not a JSON object, has no ``data`` object, or is
            truncated or malformed (message: path and byte offset).
    """
    path = str(path)
    stream = _Stream(path)
    decoder = json.JSONDecoder()
    header: dict[str, Any] = {}
    saw_data = False
    try:
        stream.more()
        if not stream.buf.strip() and stream.eof:
            raise CompareInputError(f"{path}: empty dump.json (0 entries); expected a JSON object with 'data'")
        for key in _member_keys(stream, decoder, "a key string"):
            if key != "data":
                header[key] = stream.value(decoder)
                continue
            saw_data = True
            yield "header", dict(header)
            for name in _member_keys(stream, decoder, "an entry name"):
                yield name, stream.value(decoder)
    finally:
        stream.close()
    if not saw_data:
        raise CompareInputError(f"{path}: field 'data' missing; expected {{'task', 'level', 'framework', 'data': {{...}}}}")


def entry_kind(name: str) -> str:
    """Call kind of a dump.json entry name (spec section 2.1).

    ``Functional.linear.0.forward`` → ``api_forward``; ``Module.fc.Linear.forward.0`` →
    ``module_forward``; ``....parameters_grad`` and upstream 26.x's ``....parameters_grad.{n}``
    → ``parameters_grad``; anything else
    (``y.0``) → ``debug_save``.
    """
    parts = name.split(".")
    if name.endswith(".parameters_grad") or _PGRAD_INDEX.search(name):
        return "parameters_grad"
    if parts[0] in ("Module", "Cell") and len(parts) >= 3 and parts[-2] in ("forward", "backward") and parts[-1].isdigit():
        return "module_forward" if parts[-2] == "forward" else "module_backward"
    if len(parts) >= 3 and parts[-1] in ("forward", "backward") and parts[-2].isdigit():
        return "api_forward" if parts[-1] == "forward" else "api_backward"
    return "debug_save"


def _num(value: Any) -> Optional[float]:
    if value is None or isinstance(value, (dict, list, str)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _tensor_leaf(io: str, arg: str, rec: dict) -> dict:
    stats = [_num(rec.get(k)) for k in ("Max", "Min", "Mean", "Norm")]
    has_nan = any(s is not None and math.isnan(s) for s in stats)
    has_inf = any(s is not None and math.isinf(s) for s in stats[:2])
    shape = rec.get("shape")
    shape = [int(s) for s in shape] if isinstance(shape, list) else None
    numel = math.prod(shape) if shape is not None else None
    return {
        "io": io, "arg": arg, "leaf_kind": "tensor", "type": rec.get("type"),
        "dtype": None if rec.get("dtype") is None else str(rec.get("dtype")),
        "shape": shape, "numel": numel,
        "max": stats[0], "min": stats[1], "mean": stats[2], "norm": stats[3],
        "max_finite": _num(rec.get("Max_except_inf_nan")), "min_finite": _num(rec.get("Min_except_inf_nan")),
        "crc32": _checksum(rec, shape), "requires_grad": rec.get("requires_grad"),
        "has_nan": has_nan, "has_inf": has_inf, "data_name": rec.get("data_name"),
        "value_json": _extras(rec),
    }


_SCALAR_DTYPES = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4",
                  "int16": "<i2", "int8": "<i1", "uint8": "<u1", "bool": "<?"}


def _checksum(rec: dict, shape: Optional[list]) -> Optional[str]:
    """The ``md5`` field as text. Upstream 26.x (summary_mode xor) writes a 0-dim tensor's
    value there instead of a checksum (observed: ``"md5": 1.0``); that value is the
    tensor, so its XOR checksum is computed from it (little-endian bytes of the dtype,
    zero-padded to 8 bytes, as :func:`msprobe.core.checksum.xor64`). None for other
    non-text values."""
    value = rec.get("md5")
    if value is None or isinstance(value, str):
        return value
    if shape != [] or isinstance(value, (dict, list)):
        return None
    import numpy as np

    dtype = str(rec.get("dtype") or "").rsplit(".", 1)[-1]
    try:
        if dtype == "bfloat16":
            raw = (np.array(float(value), np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        elif dtype in _SCALAR_DTYPES:
            raw = np.array(value, dtype=_SCALAR_DTYPES[dtype]).tobytes()
        else:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    return "0x%016x" % int.from_bytes(raw.ljust(8, b"\0"), "little")


def _extras(rec: dict) -> Optional[str]:
    extra = {k: rec[k] for k in EXTRA_KEYS if k in rec}
    return json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else None


def _is_tensor_record(value: dict) -> bool:
    """A tensor record: a tensor ``type``, or ``dtype`` and ``shape`` with statistics, a
    checksum or a file (an xor/md5 record has no statistics)."""
    if value.get("type") in TENSOR_TYPES:
        return True
    return "dtype" in value and "shape" in value and any(k in value for k in ("Max", "md5", "data_name"))


def _plain_leaf(io: str, arg: str, kind: str, value: Any = None) -> dict:
    return {
        "io": io, "arg": arg, "leaf_kind": kind,
        "type": value.get("type") if isinstance(value, dict) else None,
        "value_json": None if kind != "value" else json.dumps(value, sort_keys=True, allow_nan=True),
    }


def _walk(io: str, path: list, value: Any, out: list) -> None:
    arg = ".".join(str(p) for p in path)
    if value is None:
        out.append(_plain_leaf(io, arg, "none"))
    elif isinstance(value, list):
        if not value:
            out.append(_plain_leaf(io, arg, "empty_list"))
        for i, item in enumerate(value):
            _walk(io, path + [i], item, out)
    elif isinstance(value, dict):
        if _is_tensor_record(value):
            out.append(_tensor_leaf(io, arg, value))
        elif not value:
            out.append(_plain_leaf(io, arg, "empty_dict"))
        elif "type" in value or "class_type" in value:
            out.append(_plain_leaf(io, arg, "value", value))
        else:
            for key, item in value.items():
                _walk(io, path + [key], item, out)
    else:
        out.append(_plain_leaf(io, arg, "value", {"type": type(value).__name__, "value": value}))


def entry_leaves(kind: str, entry: Any) -> list[dict]:
    """Leaf rows of one dump.json entry (spec section 3.2/3.3), in file order.

    Args:
        kind: the entry's call kind (:func:`entry_kind`).
        entry: the decoded entry object.
    Returns:
        dicts with keys ``io``, ``arg``, ``leaf_kind`` and, for tensors, the statistics
        (``max``... as float, NaN/Inf kept), ``crc32`` (the ``md5`` field), ``data_name``.
    """
    out: list[dict] = []
    if not isinstance(entry, dict) and kind != "debug_save":
        return out
    if kind == "debug_save":
        _walk("", [], entry, out)  # a debug save entry is the saved value itself
        return out
    for io, value in entry.items():
        if io == "is_recompute" or value == {} or value == []:
            continue  # empty top-level containers carry no leaf (as in the store)
        _walk(io, [], value, out)
    return out
