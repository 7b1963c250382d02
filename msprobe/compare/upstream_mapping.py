"""Upstream msprobe's four mapping files for cross-framework compare, converted into one
:class:`~msprobe.compare.mapping.Mapping`: upstream's mapping files load too. The formats, and where each fact was read, are listed in
``docs/compare-upstream-formats.md``.

Upstream compares a MindSpore dump (its ``npu_path``/``-tp``, our TARGET) with a PyTorch dump
(``bench_path``/``-gp``, our BASELINE); every file below maps MindSpore names (keys, ``ms_*``)
to PyTorch names (values, ``pt_*``), which is our TARGET → BASELINE direction.

``-dm`` / ``--data_mapping`` (:data:`DATA`)
    ``{MS data name: PT data name}`` with full data names, one per argument leaf::

        Functional.flash_attention_score.4.forward.input.0: NPU.npu_fusion_attention.4.forward.input.0

    A data name is ``{call}.{category}.{index path}`` (spec section 2.2): ``call`` is an
    API call ``X.{n}.forward|backward`` or a module call ``P.Class.forward|backward.{n}``;
    ``category`` is ``input``, ``kwargs``, ``output`` or ``parameters``; a forward
    ``input.{name}`` whose first index is not a number is a keyword argument (upstream's
    statistics names spell keyword arguments ``input.{name}``, its tensor file names
    ``kwargs.{name}``). ``{Cell/Module path}.parameters_grad.{name}`` names a parameter
    gradient. Converted into :attr:`Mapping.calls` (``call → call``, renaming that one
    call; its backward follows a renamed forward) and :attr:`Mapping.leaf` keyed by the
    BASELINE call (``io.arg → io.arg``). As upstream, only the listed leaves of a mapped
    call are compared: the others move to ``*.unmapped.*`` (unpaired).
``-am`` / ``--api_mapping`` (:data:`API`)
    a list of ``{ms_api, pt_api, ms_args, pt_args, ms_outputs, pt_outputs}`` (a single
    such mapping, as upstream's documentation shows it, is one entry)::

        - ms_api: Functional.conv2d
          pt_api: Torch.conv2d
          ms_args: [0, 1]
          pt_args: [0, 1]
          ms_outputs: [0]
          pt_outputs: [0]

    ``ms_output``/``pt_output`` (the spelling upstream 1.2.2's code reads) are accepted
    for ``ms_outputs``/``pt_outputs``; ``ms_parameters``/``pt_parameters`` and
    ``ms_parameters_grad``/``pt_parameters_grad`` (upstream's length check lists them) are
    checked the same way. ``ms_api``/``pt_api`` become :attr:`Mapping.api`; the index
    lists (equal lengths, each optional) become :attr:`Mapping.leaf` entries: forward
    ``input_args.{ms} → input_args.{pt}`` (a name instead of an index is a keyword
    argument, ``input_kwargs.{name}``) and ``output.{ms} → output.{pt}``, backward
    ``input.{ms_out} → input.{pt_out}`` (gradients of the outputs) and ``output.{ms_arg}
    → output.{pt_arg}``. When a list is given, the MindSpore positions it leaves out are
    not compared (upstream: "abandoned"; they move to ``*.unmapped.{i}``, which the
    BASELINE lacks).
``-cm`` / ``--cell_mapping`` (:data:`CELL`)
    ``{MS cell: PT module}`` as ``path.Class`` without the ``Cell.``/``Module.`` prefix
    (``fc2.Dense: fc2.Linear``); each becomes an exact :attr:`Mapping.module` entry
    ``Cell.fc2.Dense → Module.fc2.Linear`` (that module only, not its children). Every
    entry, dotted or not, is also a substring rule (upstream 26.x "mapping by string in
    the cell name", :attr:`Mapping.cell_sub`): a cell without an exact entry has the first
    occurrence of each key in its ``path.Class`` replaced, in file order
    (``RowParallelLinear: TERowParallelLinear``).
``-lm`` / ``--layer_mapping`` (:data:`LAYER`)
    ``{MS layer class: {MS attribute: PT attribute}}``; ``TopLayer`` (upstream's current
    name) or ``Cell`` (its older name, which wins when both are given) holds the names
    directly under the root network::

        TopLayer:
          network_with_loss: module
        ParallelAttention:
          qkv_proj: query_key_value
        PipelineCell:
          model.module: module       # a dotted key spans several path levels

    Becomes :attr:`Mapping.children`: every module path component is renamed by the entry
    of its parent's class (read from the TARGET's module calls when applied); a dotted key
    ``a.b`` replaces that run of components (longest key first), and its value may be
    dotted too.

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
_API_KEYS = ("ms_api", "pt_api", "ms_args", "pt_args", "ms_outputs", "pt_outputs", "ms_output", "pt_output",
             "ms_parameters", "pt_parameters", "ms_parameters_grad", "pt_parameters_grad")
#: the root's entry of a layer_mapping file, and upstream's older name for it
TOP_LAYER, OLD_TOP_LAYER = "TopLayer", "Cell"

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
    if isinstance(doc, list) or (isinstance(doc, dict) and "ms_api" in doc and "pt_api" in doc):
        return API       # a list of entries, or one entry as upstream's documentation writes it
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
    ``parameters``, backward ``input``/``output``, a parameter name). A forward
    ``input.{name}`` whose first index is not a number is a keyword argument
    (``Torch.add.0.forward.input.alpha`` → ``input_kwargs``, ``alpha``): upstream's
    statistics rows name keyword arguments that way. None if not a data name."""
    m = _DATA_NAME.match(name)
    if m:
        direction = m.group("adir") or m.group("mdir")
        cat = m.group("cat")
        path = m.group("path") or ""
        if direction == "forward":
            io = {"input": "input_args", "kwargs": "input_kwargs"}.get(cat, cat)
            if io == "input_args" and path and not path.split(".", 1)[0].isdigit():
                io = "input_kwargs"
        else:
            io = cat
        return m.group("call"), io, path
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
        if not tc.endswith("parameters_grad"):
            leaf.setdefault(bc, {})[f"{tio}.{targ}"] = f"{bio}.{barg}"
    # upstream compares exactly the listed pairs: a mapped call's other leaves are not compared
    for bc, tab in leaf.items():
        ios = ("input_args", "input_kwargs", "output", "parameters") if _direction(bc) == "forward" \
            else ("input", "output")
        for io in ios:
            tab.setdefault(f"*{io}", f"{io}.unmapped")
    return {"calls": calls, "leaf": leaf}


def _indexes(d: _Doc, path: tuple, value: Any, names: bool) -> Optional[list]:
    if value is None:
        return None
    ok = isinstance(value, list) and all(
        (isinstance(i, int) and not isinstance(i, bool) and i >= 0) or (names and isinstance(i, str) and i.strip())
        for i in value)
    if not ok or len(set(map(str, value))) != len(value):
        what = "argument indexes (or keyword names)" if names else "indexes"
        raise d.error(path, f"key {path[-1]!r}: expected a list of distinct {what} like [0, 1], got {value!r}")
    return [int(i) if isinstance(i, str) and i.strip().isdigit() else i for i in value]


#: (what, MindSpore key, PyTorch key, other spelling of both) of an api_mapping entry
_API_LISTS = (("args", "ms_args", "pt_args", None),
              ("outputs", "ms_outputs", "pt_outputs", ("ms_output", "pt_output")),
              ("parameters", "ms_parameters", "pt_parameters", None),
              ("parameters_grad", "ms_parameters_grad", "pt_parameters_grad", None))


def _api_list(d: _Doc, at: tuple, item: dict, key: str, alias: Optional[str], names: bool):
    """One index list of an api_mapping entry (``at``: the entry's path in the file), under
    ``key`` or its other spelling ``alias``; returns (list or None, the key used)."""
    value = _indexes(d, at + (key,), item.get(key), names)
    if alias is not None and alias in item:
        other = _indexes(d, at + (alias,), item.get(alias), names)
        if value is not None and other != value:
            raise d.error(at + (alias,), f"{key} and {alias} (the same list) differ: {value!r} vs {other!r}")
        value, key = other, alias
    return value, key


def _api(d: _Doc) -> dict:
    single = isinstance(d.doc, dict) and "ms_api" in d.doc    # one entry, as upstream's documentation shows
    doc = [d.doc] if single else d.doc
    if not isinstance(doc, list):
        raise d.error((), f"expected a list of entries with keys {', '.join(_API_KEYS[:6])}, "
                          f"got a {type(d.doc).__name__}")
    api: dict = {}
    leaf: dict = {}
    for i, item in enumerate(doc):
        at = () if single else (i,)
        if not isinstance(item, dict):
            raise d.error(at, f"item {i}: expected a mapping with keys {', '.join(_API_KEYS[:6])}, got {item!r}")
        for key in item:
            if key not in _API_KEYS:
                raise d.error(at + (key,), f"item {i}: unknown key {key!r}; allowed: {', '.join(_API_KEYS)}")
        for key in ("ms_api", "pt_api"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise d.error(at + (key,) if key in item else at, f"item {i}: key {key!r}: expected an API name "
                              f"like 'Functional.conv2d' / 'Torch.conv2d', got {item.get(key)!r}")
        ms, pt = item["ms_api"], item["pt_api"]
        if ms in api and api[ms] != pt:
            raise d.error(at + ("ms_api",), f"item {i}: {ms!r} is mapped to both {api[ms]!r} and {pt!r}")
        if ms != pt:
            api[ms] = pt
        fwd: dict = {}
        bwd: dict = {}
        for what, ms_key, pt_key, aliases in _API_LISTS:
            names = what != "outputs"
            a, ka = _api_list(d, at, item, ms_key, aliases and aliases[0], names)
            b, kb = _api_list(d, at, item, pt_key, aliases and aliases[1], names)
            if a is None and b is None:
                continue
            if a is None or b is None or len(a) != len(b):
                raise d.error(at + (ka if ka in item else kb,), f"item {i}: {ka} and {kb} must both be given, "
                                                                f"with equal lengths; got {a!r} and {b!r}")
            if what == "args":
                for x, y in zip(a, b):
                    fwd[f"{'input_kwargs' if isinstance(x, str) else 'input_args'}.{x}"] = \
                        f"{'input_kwargs' if isinstance(y, str) else 'input_args'}.{y}"
                    if isinstance(x, int) and isinstance(y, int):
                        bwd[f"output.{x}"] = f"output.{y}"
                fwd["*input_args"] = "input_args.unmapped"   # positions left out are not compared
                fwd["*input_kwargs"] = "input_kwargs.unmapped"
                bwd["*output"] = "output.unmapped"
            elif what == "outputs":
                for x, y in zip(a, b):
                    fwd[f"output.{x}"] = f"output.{y}"
                    bwd[f"input.{x}"] = f"input.{y}"
                fwd["*output"] = "output.unmapped"
                bwd["*input"] = "input.unmapped"
            elif what == "parameters":    # API calls record no parameters: checked, kept for completeness
                for x, y in zip(a, b):
                    fwd[f"parameters.{x}"] = f"parameters.{y}"
        if fwd:
            leaf[f"{pt}.forward"] = fwd
            leaf[f"{pt}.backward"] = bwd
    return {"api": api, "leaf": leaf}


def _cell(d: _Doc) -> dict:
    table = _str_map(d, (), d.doc, "fc2.Dense: fc2.Linear")
    module, sub = {}, {}
    for k, v in table.items():
        for name in (k, v):
            if name != name.strip() or name.strip(".") != name or ".." in name:
                raise d.error((k,), f"{name!r}: expected a cell/module name 'path.Class' like 'fc2.Dense' "
                                    f"(without the Cell./Module. prefix) or a part of one like 'RowParallelLinear'")
        t = k[len("Cell."):] if k.startswith("Cell.") else k
        b = v[len("Module."):] if v.startswith("Module.") else v
        if "." in t:
            module[f"Cell.{t}"] = f"Module.{b}"     # exact: that cell only
        sub[t] = b                                  # and, as upstream 26.x, a substring rule
    return {"module": module, "cell_sub": sub}


def _layer(d: _Doc) -> dict:
    if not isinstance(d.doc, dict):
        raise d.error((), f"expected {{LayerClass: {{ms_attribute: pt_attribute}}}} with a {TOP_LAYER} entry for "
                          f"the root, got a {type(d.doc).__name__}")
    children = {}
    for cls, table in d.doc.items():
        if not isinstance(cls, str):
            raise d.error((cls,), f"key {cls!r}: expected a layer class name")
        m = _str_map(d, (cls,), table, "qkv_proj: query_key_value")
        for k, v in m.items():
            if any(not part.strip() or part != part.strip() for name in (k, v) for part in name.split(".")):
                raise d.error((cls, k), f"{cls}: {k!r}: {v!r}: expected attribute names like 'qkv_proj' or "
                                        f"dotted paths like 'model.module' (no empty parts or spaces)")
        # upstream renamed the root's entry from Cell to TopLayer and reads Cell over TopLayer
        children[TOP_LAYER if cls == OLD_TOP_LAYER else cls] = m
    if OLD_TOP_LAYER in d.doc and TOP_LAYER in d.doc:
        children[TOP_LAYER] = dict(d.doc[OLD_TOP_LAYER])
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
