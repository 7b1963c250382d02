"""Upstream msprobe's four mapping files for cross-framework compare, converted into one
:class:`~msprobe.compare.mapping.Mapping` (issue 8, "Matching" 5: "upstream's mapping files
also load").

Upstream compares a MindSpore dump (its ``npu_path``, our TARGET) with a PyTorch dump
(``bench_path``, our BASELINE); every file below maps MindSpore names (keys, ``ms_*``) to
PyTorch names (values, ``pt_*``), which is our TARGET → BASELINE direction.

``-dm`` / ``--data_mapping`` (:data:`DATA`)
    ``{MS data name: PT data name}`` with full data names, one per argument leaf::

        Functional.flash_attention_score.4.forward.input.0: NPU.npu_fusion_attention.4.forward.input.0

    A data name is ``{call}.{category}.{index path}`` (spec section 2.2): ``call`` is an
    API call ``X.{n}.forward|backward`` or a module call ``P.Class.forward|backward.{n}``;
    ``category`` is ``input``, ``kwargs``, ``output`` or ``parameters``. Converted into
    :attr:`Mapping.calls` (``call → call``, renaming that one call; its backward follows
    a renamed forward) and :attr:`Mapping.leaf` keyed by the BASELINE call (``io.arg →
    io.arg``).
``-am`` / ``--api_mapping`` (:data:`API`)
    a list of ``{ms_api, pt_api, ms_args, pt_args, ms_outputs, pt_outputs}``::

        - ms_api: Functional.conv2d
          pt_api: Torch.conv2d
          ms_args: [0, 1]
          pt_args: [0, 1]
          ms_outputs: [0]
          pt_outputs: [0]

    ``ms_api``/``pt_api`` become :attr:`Mapping.api`; the index lists (equal lengths,
    each optional) become :attr:`Mapping.leaf` entries: forward ``input_args.{ms} →
    input_args.{pt}`` and ``output.{ms} → output.{pt}``, backward ``input.{ms_out} →
    input.{pt_out}`` (gradients of the outputs) and ``output.{ms_arg} → output.{pt_arg}``.
    When a list is given, the MindSpore positions it leaves out are not compared (they
    move to ``input_args.unmapped_{i}``, which the BASELINE lacks).
``-cm`` / ``--cell_mapping`` (:data:`CELL`)
    ``{MS cell: PT module}`` as ``path.Class`` without the ``Cell.``/``Module.`` prefix
    (``fc2.Dense: fc2.Linear``); each becomes an exact :attr:`Mapping.module` entry
    ``Cell.fc2.Dense → Module.fc2.Linear`` (that module only, not its children).
``-lm`` / ``--layer_mapping`` (:data:`LAYER`)
    ``{MS layer class: {MS attribute: PT attribute}}``; ``TopLayer`` holds the names
    directly under the root network::

        TopLayer:
          network_with_loss: module
        ParallelAttention:
          qkv_proj: query_key_value

    Becomes :attr:`Mapping.children`: every module path component is renamed by the entry
    of its parent's class (read from the TARGET's module calls when applied).

:func:`detect` tells the four formats and ours apart (``--mapping`` accepts any of them);
:func:`load_upstream` parses one file of a given kind. Errors name the file, the line and
the key (:class:`~msprobe.compare.errors.CompareInputError`, exit status 2).
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional, Union

from msprobe.compare.errors import CompareInputError

__all__ = ["DATA", "API", "CELL", "LAYER", "KINDS", "FLAGS", "detect", "load_upstream", "read_yaml",
           "parse_data_name"]

DATA, API, CELL, LAYER = "data_mapping", "api_mapping", "cell_mapping", "layer_mapping"
KINDS = (DATA, API, CELL, LAYER)
#: the command-line spelling of each kind, for messages
FLAGS = {DATA: "-dm", API: "-am", CELL: "-cm", LAYER: "-lm"}
_API_KEYS = ("ms_api", "pt_api", "ms_args", "pt_args", "ms_outputs", "pt_outputs")

_DATA_NAME = re.compile(
    r"^(?P<call>.+?\.(?:\d+\.(?P<adir>forward|backward)|(?P<mdir>forward|backward)\.\d+))"
    r"\.(?P<cat>input|kwargs|output|parameters)(?:\.(?P<path>.*))?$")
_GRAD_NAME = re.compile(r"^(?P<call>.+\.parameters_grad)\.(?P<path>.+)$")


class _Doc:
    """A YAML document and the line (1-based) of each key/item, by path tuple."""

    def __init__(self, where: str, doc: Any, lines: dict) -> None:
        self.where, self.doc, self.lines = where, doc, lines

    def line(self, *path) -> str:
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                return f"line {self.lines[path[:n]]}"
        return "line ?"

    def error(self, path: tuple, message: str) -> CompareInputError:
        return CompareInputError(f"{self.where}: {self.line(*path)}: {message}")


def _walk(node, path: tuple, lines: dict) -> None:
    import yaml

    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            lines[path + (key,)] = k.start_mark.line + 1
            _walk(v, path + (key,), lines)
            lines[path + (key,)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(v, path + (i,), lines)


def read_yaml(source: Union[str, os.PathLike], what: str = "--mapping") -> _Doc:
    """Read a YAML file with the line of every key (keys as written, scalars as strings).

    Raises:
        CompareInputError: unreadable file, or a YAML syntax error (with its line).
    """
    import yaml

    where = f"{what} {os.fspath(source)!r}"
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CompareInputError(f"{where}: unreadable: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        raise CompareInputError(f"{where}: {line}YAML error: {getattr(exc, 'problem', exc)}") from None
    lines: dict = {}
    if node is not None:
        _walk(node, (), lines)
    return _Doc(where, doc, lines)


def detect(doc: Any, sections: tuple) -> Optional[str]:
    """Which format a loaded YAML document is: None for ours (a dict using any of our
    ``sections``, or empty), else one of :data:`KINDS`. Guesses from the shape: a list →
    ``api_mapping``; a dict of dicts → ``layer_mapping``; a dict with a data name as a key
    (``X.0.forward.input.0``) → ``data_mapping``, else ``cell_mapping``."""
    if doc is None or (isinstance(doc, dict) and (not doc or any(k in sections for k in doc))):
        return None
    if isinstance(doc, list):
        return API
    if isinstance(doc, dict):
        values = list(doc.values())
        if all(isinstance(v, dict) for v in values):
            return LAYER
        if any(isinstance(k, str) and (_DATA_NAME.match(k) or _GRAD_NAME.match(k)) for k in doc):
            return DATA     # any data name: parse as data_mapping, so a bad key is named as such
        return CELL
    return None


def parse_data_name(name: str) -> Optional[tuple[str, str, str]]:
    """``Functional.conv2d.0.forward.input.1`` → ``("Functional.conv2d.0.forward",
    "input_args", "1")``; module, kwargs, backward and ``parameters_grad`` names likewise
    (io as our leaves spell it: ``input_args``, ``input_kwargs``, ``output``,
    ``parameters``, backward ``input``/``output``, a parameter name). None if not a data
    name."""
    m = _DATA_NAME.match(name)
    if m:
        direction = m.group("adir") or m.group("mdir")
        cat = m.group("cat")
        if direction == "forward":
            io = {"input": "input_args", "kwargs": "input_kwargs"}.get(cat, cat)
        else:
            io = cat
        return m.group("call"), io, m.group("path") or ""
    m = _GRAD_NAME.match(name)
    if m:
        return m.group("call"), m.group("path"), ""
    return None


def _str_map(d: _Doc, path: tuple, value: Any, example: str) -> dict:
    if not isinstance(value, dict):
        raise d.error(path, f"expected a mapping like {example!r}, got a {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
            raise d.error(path + (k,), f"key {k!r}: expected a name: name pair like {example!r}, got {k!r}: {v!r}")
    return dict(value)


def _direction(call: str) -> str:
    if call.endswith(".parameters_grad"):
        return "parameters_grad"
    a, b = call.rsplit(".", 2)[-2:]
    return b if b in ("forward", "backward") else a


def _data(d: _Doc) -> dict:
    table = _str_map(d, (), d.doc, "Functional.conv2d.0.forward.input.0: Torch.conv2d.0.forward.input.0")
    calls: dict = {}
    leaf: dict = {}
    for k, v in table.items():
        pk, pv = parse_data_name(k), parse_data_name(v)
        for side, name, parsed in (("key", k, pk), ("value", v, pv)):
            if parsed is None:
                raise d.error((k,), f"{side} {name!r} is not a data name; allowed: "
                                    f"CALL.input|kwargs|output|parameters.INDEX with CALL like "
                                    f"'Functional.conv2d.0.forward' or 'Cell.fc.Dense.forward.0'")
        (tc, tio, targ), (bc, bio, barg) = pk, pv
        if _direction(tc) != _direction(bc):
            raise d.error((k,), f"{k!r} and {v!r}: directions differ ({_direction(tc)} vs {_direction(bc)})")
        if calls.get(tc, bc) != bc:
            raise d.error((k,), f"call {tc!r} is mapped to both {calls[tc]!r} and {bc!r}")
        if tc != bc:
            calls[tc] = bc
        if (tio, targ) != (bio, barg) and not tc.endswith("parameters_grad"):
            leaf.setdefault(bc, {})[f"{tio}.{targ}"] = f"{bio}.{barg}"
    return {"calls": calls, "leaf": leaf}


def _indexes(d: _Doc, path: tuple, value: Any) -> Optional[list]:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                              for i in value):
        raise d.error(path, f"key {path[-1]!r}: expected a list of argument indexes like [0, 1], got {value!r}")
    return value


def _api(d: _Doc) -> dict:
    if not isinstance(d.doc, list):
        raise d.error((), f"expected a list of entries with keys {', '.join(_API_KEYS)}, "
                          f"got a {type(d.doc).__name__}")
    api: dict = {}
    leaf: dict = {}
    for i, item in enumerate(d.doc):
        if not isinstance(item, dict):
            raise d.error((i,), f"item {i}: expected a mapping with keys {', '.join(_API_KEYS)}, got {item!r}")
        for key in item:
            if key not in _API_KEYS:
                raise d.error((i, key), f"item {i}: unknown key {key!r}; allowed: {', '.join(_API_KEYS)}")
        for key in ("ms_api", "pt_api"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise d.error((i, key) if key in item else (i,), f"item {i}: key {key!r}: expected an API name "
                              f"like 'Functional.conv2d' / 'Torch.conv2d', got {item.get(key)!r}")
        ms, pt = item["ms_api"], item["pt_api"]
        if ms in api and api[ms] != pt:
            raise d.error((i, "ms_api"), f"item {i}: {ms!r} is mapped to both {api[ms]!r} and {pt!r}")
        if ms != pt:
            api[ms] = pt
        fwd: dict = {}
        bwd: dict = {}
        for what, ms_key, pt_key, fwd_io, bwd_io in (("args", "ms_args", "pt_args", "input_args", "output"),
                                                    ("outputs", "ms_outputs", "pt_outputs", "output", "input")):
            a = _indexes(d, (i, ms_key), item.get(ms_key))
            b = _indexes(d, (i, pt_key), item.get(pt_key))
            if a is None and b is None:
                continue
            if a is None or b is None or len(a) != len(b):
                raise d.error((i, ms_key if ms_key in item else pt_key),
                              f"item {i}: {ms_key} and {pt_key} must both be given, with equal lengths; "
                              f"got {a!r} and {b!r}")
            for x, y in zip(a, b):
                fwd[f"{fwd_io}.{x}"] = f"{fwd_io}.{y}"
                bwd[f"{bwd_io}.{x}"] = f"{bwd_io}.{y}"
            if what == "args":
                fwd["*input_args"] = "input_args.unmapped"   # positions left out are not compared
                bwd["*output"] = "output.unmapped"
        if fwd:
            leaf[f"{pt}.forward"] = fwd
            leaf[f"{pt}.backward"] = bwd
    return {"api": api, "leaf": leaf}


def _cell(d: _Doc) -> dict:
    table = _str_map(d, (), d.doc, "fc2.Dense: fc2.Linear")
    module = {}
    for k, v in table.items():
        for name in (k, v):
            if "." not in name.strip(".") or name != name.strip():
                raise d.error((k,), f"{name!r}: expected a cell/module name 'path.Class' like 'fc2.Dense' "
                                    f"(without the Cell./Module. prefix)")
        t = k if k.startswith("Cell.") else f"Cell.{k}"
        b = v if v.startswith("Module.") else f"Module.{v}"
        module[t] = b
    return {"module": module}


def _layer(d: _Doc) -> dict:
    if not isinstance(d.doc, dict):
        raise d.error((), f"expected {{LayerClass: {{ms_attribute: pt_attribute}}}} with a TopLayer entry for the "
                          f"root, got a {type(d.doc).__name__}")
    children = {}
    for cls, table in d.doc.items():
        if not isinstance(cls, str):
            raise d.error((cls,), f"key {cls!r}: expected a layer class name")
        m = _str_map(d, (cls,), table, "qkv_proj: query_key_value")
        for k, v in m.items():
            if "." in k or "." in v:
                raise d.error((cls, k), f"{cls}: {k!r}: {v!r}: expected attribute names without dots")
        children[cls] = m
    return {"children": children}


def load_upstream(source: Union[str, os.PathLike], kind: Optional[str] = None, *, _doc: Optional[_Doc] = None):
    """Parse one upstream mapping file into a :class:`~msprobe.compare.mapping.Mapping`.

    Args:
        source: the YAML file.
        kind: one of :data:`KINDS`; None guesses with :func:`detect`.
    Raises:
        CompareInputError: unreadable file, YAML error, or an entry of the wrong shape,
            naming the file, the line and the key.
    """
    from msprobe.compare.mapping import Mapping, SECTIONS

    what = "--mapping" if kind is None else f"{FLAGS[kind]}/--{kind}"
    d = _doc or read_yaml(source, what)
    if kind is None:
        kind = detect(d.doc, SECTIONS)
        if kind is None:
            raise d.error((), "not an upstream mapping file")
    if d.doc is None:
        return Mapping(source=f"{kind} {os.fspath(source)}")
    parsed = {DATA: _data, API: _api, CELL: _cell, LAYER: _layer}[kind](d)
    return Mapping(source=f"{kind} {os.fspath(source)}", **parsed)
