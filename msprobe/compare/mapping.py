"""Name mapping between two dumps (issue 8, "Matching" 5): one YAML file with sections

``api``     ``{TARGET API: BASELINE API}``, names without counter and direction
            (``Primitive.relu.ReLU: Functional.relu``); mapped calls are renumbered per
            new name in execution order, backward calls follow their forward.
``module``  ``{TARGET path prefix: BASELINE path prefix}`` on dotted boundaries, longest
            first (``Cell: Module``, ``Cell.net.body: Module.model``).
``layer``   ``{TARGET layer class: BASELINE layer class}`` for the class token of module
            calls (``Dense: Linear``, ``SequentialCell: Sequential``).
``leaf``    ``{BASELINE API[.forward|.backward]: {TARGET io.arg: BASELINE io.arg}}``
            argument/output index maps (``Functional.linear: {input_args.1: input_args.2}``);
            a target leaf mapped to a path the baseline lacks stays unpaired.
``ignore``  a list of name prefixes dropped from both sides before matching.

Only the TARGET side is renamed (into the BASELINE's vocabulary); reports show the
original TARGET names (:attr:`Renames.original`). When frameworks differ (PyTorch vs
MindSpore) :data:`BUILTIN` (``Cell`` → ``Module``) is applied under the user's mapping;
calls left unpaired are listed by name (:func:`unmatched_prefixes`).

Errors name the file, line and key (:class:`~msprobe.compare.errors.CompareInputError`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from msprobe.compare.errors import CompareInputError

__all__ = ["Mapping", "load_mapping", "apply_mapping", "BUILTIN", "SECTIONS", "unmatched_prefixes"]

SECTIONS = ("api", "module", "layer", "leaf", "ignore")
_MODULE_KINDS = ("module_forward", "module_backward", "parameters_grad")
_API_KINDS = ("api_forward", "api_backward")


@dataclass
class Mapping:
    """A parsed mapping (see module docstring)."""

    api: dict = field(default_factory=dict)
    module: dict = field(default_factory=dict)
    layer: dict = field(default_factory=dict)
    leaf: dict = field(default_factory=dict)
    ignore: tuple = ()
    source: str = "<dict>"

    def merged_over(self, base: "Mapping") -> "Mapping":
        """This mapping with ``base``'s entries where this one has none."""
        return Mapping(api={**base.api, **self.api}, module={**base.module, **self.module},
                       layer={**base.layer, **self.layer}, leaf={**base.leaf, **self.leaf},
                       ignore=tuple(base.ignore) + tuple(self.ignore), source=self.source)


#: PyTorch ↔ MindSpore defaults: the framework prefix only (layer classes and APIs differ
#: per model; they come from the user's mapping, and what stays unmatched is listed).
BUILTIN = Mapping(
    module={"Cell": "Module"},
    source="built-in PyTorch/MindSpore table")


def _check_str_map(section: str, value, line: int, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise CompareInputError(f"{where}: line {line}: section {section!r}: expected a mapping of names to names "
                                f"(e.g. 'Cell: Module'), got {value!r}")
    return dict(value)


def load_mapping(source: Union[str, os.PathLike, dict]) -> Mapping:
    """Parse a mapping YAML file (or an already-loaded dict).

    Raises:
        CompareInputError: unreadable file or YAML syntax error (with line), a section that
            is not one of :data:`SECTIONS` (with its line), or a section of the wrong shape.
    """
    import yaml

    lines: dict[str, int] = {}
    if isinstance(source, dict):
        doc, where = source, "<dict>"
    else:
        where = str(source)
        try:
            text = open(source, encoding="utf-8").read()
        except OSError as exc:
            raise CompareInputError(f"--mapping {where!r}: unreadable: {exc}") from None
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f"line {mark.line + 1}: " if mark is not None else ""
            raise CompareInputError(f"--mapping {where!r}: {line}YAML error: {getattr(exc, 'problem', exc)}") from None
        if isinstance(node, yaml.MappingNode):
            for k, _ in node.value:
                lines[str(k.value)] = k.start_mark.line + 1
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise CompareInputError(f"--mapping {where!r}: line 1: expected sections {', '.join(SECTIONS)}, "
                                f"got a {type(doc).__name__}")
    for key in doc:
        if key not in SECTIONS:
            raise CompareInputError(f"--mapping {where!r}: line {lines.get(str(key), '?')}: unknown key {key!r}; "
                                    f"allowed sections: {', '.join(SECTIONS)}")
    leaf = doc.get("leaf") or {}
    if not isinstance(leaf, dict) or not all(isinstance(v, dict) for v in leaf.values()):
        raise CompareInputError(f"--mapping {where!r}: line {lines.get('leaf', '?')}: section 'leaf': expected "
                                f"{{API: {{io.arg: io.arg}}}}, got {leaf!r}")
    for api, m in leaf.items():
        for a, b in m.items():
            if not (isinstance(a, str) and isinstance(b, str) and "." in a and "." in b):
                raise CompareInputError(f"--mapping {where!r}: line {lines.get('leaf', '?')}: section 'leaf', "
                                        f"{api!r}: got {a!r}: {b!r}; allowed: 'io.arg: io.arg' (input_args.0)")
    ignore = doc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise CompareInputError(f"--mapping {where!r}: line {lines.get('ignore', '?')}: section 'ignore': "
                                f"expected a list of name prefixes, got {ignore!r}")
    return Mapping(api=_check_str_map("api", doc.get("api"), lines.get("api", 0), where),
                   module=_check_str_map("module", doc.get("module"), lines.get("module", 0), where),
                   layer=_check_str_map("layer", doc.get("layer"), lines.get("layer", 0), where),
                   leaf={k: dict(v) for k, v in leaf.items()}, ignore=tuple(ignore), source=where)


def _prefix_map(name: str, table: dict) -> str:
    for old in sorted(table, key=len, reverse=True):
        if name == old or name.startswith(old + "."):
            return table[old] + name[len(old):]
    return name


def _module_name(name: str, kind: str, m: Mapping) -> str:
    if kind == "parameters_grad":
        stem, tail = name[: -len(".parameters_grad")], ".parameters_grad"
    else:
        stem, d, c = name.rsplit(".", 2)
        tail = f".{d}.{c}"
    head, _, cls = stem.rpartition(".")
    if cls in m.layer:
        stem = f"{head}.{m.layer[cls]}"
    return _prefix_map(stem, m.module) + tail


def _ignored(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@dataclass
class Renames:
    """``original``: mapped TARGET name → original name; ``ignored``: {side: count}."""

    original: dict = field(default_factory=dict)
    ignored: dict = field(default_factory=dict)


def _drop_ignored(side, prefixes, label: str, renames: Renames) -> None:
    if not prefixes:
        return
    names = side.calls["name"].to_pylist()
    keep = [not _ignored(n, prefixes) for n in names]
    renames.ignored[label] = keep.count(False)
    side.calls = side.calls.filter(pa.array(keep))
    lkeep = [not _ignored(n, prefixes) for n in side.leaves["name"].to_pylist()]
    side.leaves = side.leaves.filter(pa.array(lkeep, pa.bool_()))


def apply_mapping(target, baseline, mapping: Mapping) -> Renames:
    """Drop ``ignore`` prefixes from both sides and rename the TARGET side's calls, their
    leaves (``name``, and ``io``/``arg`` per ``leaf``) and module parents in place.

    Args:
        target, baseline: :class:`~msprobe.compare.load.Side` objects.
        mapping: the parsed mapping.
    Returns:
        :class:`Renames`.
    """
    renames = Renames()
    _drop_ignored(target, mapping.ignore, "TARGET", renames)
    _drop_ignored(baseline, mapping.ignore, "BASELINE", renames)
    calls = target.calls
    names, kinds = calls["name"].to_pylist(), calls["kind"].to_pylist()
    ranks, steps = calls["rank"].to_pylist(), calls["step"].to_pylist()
    new: dict[tuple, str] = {}
    counters: dict[tuple, int] = {}
    fwd_new: dict[tuple, str] = {}
    order = sorted(range(len(names)), key=lambda i: (ranks[i], steps[i], calls["seq"][i].as_py()))
    for i in order:
        name, kind, key = names[i], kinds[i], (ranks[i], steps[i])
        if kind in _MODULE_KINDS:
            out = _module_name(name, kind, mapping)
        elif kind in _API_KINDS and mapping.api:
            base, counter, direction = name.rsplit(".", 2)
            nb = mapping.api.get(base, base)
            if kind == "api_forward":
                n = counters.get(key + (nb,), 0)
                counters[key + (nb,)] = n + 1
                out = f"{nb}.{n}.forward"
                fwd_new[key + (f"{base}.{counter}",)] = f"{nb}.{n}"
            else:
                stem = fwd_new.get(key + (f"{base}.{counter}",), f"{nb}.{counter}")
                out = f"{stem}.{direction}"
        else:
            out = name
        new[(ranks[i], steps[i], name)] = out
        if out != name:
            renames.original[out] = name
    if not renames.original and not mapping.leaf:
        return renames
    new_names = [new[(r, s, n)] for r, s, n in zip(ranks, steps, names)]
    parents = [None if p is None else _module_name(p, "module_forward", mapping) if p.count(".") >= 3 else p
               for p in calls["parent"].to_pylist()]
    target.calls = calls.set_column(calls.schema.get_field_index("name"), "name", pa.array(new_names, pa.string())) \
        .set_column(calls.schema.get_field_index("parent"), "parent", pa.array(parents, pa.string()))
    leaves = target.leaves
    lnames = [new.get((r, s, n), n) for r, s, n in zip(leaves["rank"].to_pylist(), leaves["step"].to_pylist(),
                                                         leaves["name"].to_pylist())]
    ios, args = leaves["io"].to_pylist(), leaves["arg"].to_pylist()
    if mapping.leaf:
        for i, n in enumerate(lnames):
            base, _, direction = n.rsplit(".", 2) if n.count(".") >= 2 else (n, "", "")
            table = mapping.leaf.get(f"{base}.{direction}") or mapping.leaf.get(base)
            if table:
                moved = table.get(f"{ios[i]}.{args[i]}")
                if moved:
                    ios[i], _, args[i] = moved.partition(".")
    for col, values in (("name", lnames), ("io", ios), ("arg", args)):
        leaves = leaves.set_column(leaves.schema.get_field_index(col), col, pa.array(values, pa.string()))
    target.leaves = leaves
    return renames


def unmatched_prefixes(con, renames: Renames, limit: int = 50) -> dict:
    """Names (without counter and direction) of unpaired calls per side, original TARGET
    spelling: ``{"target": [...], "baseline": [...]}``, sorted, at most ``limit`` each."""
    from msprobe.compare.align import base_name

    out = {"target": set(), "baseline": set()}
    for t, b, kind in con.execute("SELECT t_name, b_name, kind FROM alignment WHERE t_name IS NULL OR b_name IS NULL"
                                  ).fetchall():
        if t is not None:
            out["target"].add(base_name(renames.original.get(t, t), kind))
        else:
            out["baseline"].add(base_name(b, kind))
    return {k: sorted(v)[:limit] for k, v in out.items()}
