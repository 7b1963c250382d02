"""Name mapping between two dumps: one YAML file with sections

``api``     ``{TARGET API: BASELINE API}``, names without counter and direction
            (``Primitive.relu.ReLU: Functional.relu``); mapped calls are renumbered per
            new name in execution order, backward calls follow their forward.
``module``  ``{TARGET path prefix: BASELINE path prefix}`` on dotted boundaries, longest
            first (``Cell: Module``, ``Cell.net.body: Module.model``).
``layer``   ``{TARGET layer class: BASELINE layer class}`` for the class token of module
            calls (``Dense: Linear``, ``SequentialCell: Sequential``).
``leaf``    ``{BASELINE API[.forward|.backward] or BASELINE call: {TARGET io.arg: BASELINE
            io.arg}}`` argument/output index maps (``Functional.linear: {input_args.1:
            input_args.2}``); nested elements follow their argument (``input_args.0.1``);
            a target leaf mapped to a path the baseline lacks stays unpaired.
``ignore``  a list of name prefixes dropped from both sides before matching.

Module names are renamed in this order: an exact ``module`` entry for the whole
``Cell.path.Class`` stem, else the class token by ``layer``, then path prefixes by
``module``.

Only the TARGET side is renamed (into the BASELINE's vocabulary); reports show the
original TARGET names (:attr:`Renames.original`). When frameworks differ (PyTorch vs
MindSpore) the built-in table applies under the user's mapping (:func:`framework_mapping`);
calls left unpaired are listed by name (:func:`unmatched_prefixes`).

Upstream's four mapping files (``data_mapping``, ``api_mapping``, ``cell_mapping``,
``layer_mapping``; :mod:`msprobe.compare.upstream_mapping`) load into the same model, which
adds :attr:`Mapping.calls` (one call renamed, counter included),
:attr:`Mapping.children` (attribute names per layer class, dotted runs of path levels
allowed) and :attr:`Mapping.cell_sub` (cell_mapping's substring rules, applied to a
``Cell`` stem without an exact entry); :func:`load_mapping` tells the formats apart, and a
list of sources merges (later entries win).

The built-in PyTorch/MindSpore table (:mod:`msprobe.compare.builtin_table`) adds
:attr:`Mapping.candidates`, :attr:`Mapping.families` and :attr:`Mapping.primitive`:
candidate BASELINE names per TARGET API, resolved against the names the BASELINE actually
recorded (:func:`resolve_api`).

Errors name the file, line and key (:class:`~msprobe.compare.errors.CompareInputError`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa

from msprobe.compare.errors import CompareInputError

__all__ = ["Mapping", "load_mapping", "apply_mapping", "resolve_api", "framework_mapping", "BUILTIN", "SECTIONS",
           "unmatched_prefixes", "Renames"]

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
    calls: dict = field(default_factory=dict)       # full TARGET call name -> BASELINE call name
    children: dict = field(default_factory=dict)    # layer class ("TopLayer": root) -> {attr: attr}
    candidates: dict = field(default_factory=dict)  # TARGET API -> tuple of BASELINE APIs, first recorded wins
    families: dict = field(default_factory=dict)    # TARGET family -> tuple of BASELINE families
    primitive: dict = field(default_factory=dict)   # Primitive class -> tuple of BASELINE APIs
    cell_sub: dict = field(default_factory=dict)    # cell_mapping substring -> replacement, in file order
    primitive_leaf: dict = field(default_factory=dict)  # Primitive class -> {direction: {io.arg: io.arg}}
    parameter: dict = field(default_factory=dict)   # TARGET layer class -> {parameter: BASELINE parameter}

    def merged_over(self, base: "Mapping") -> "Mapping":
        """This mapping with ``base``'s entries where this one has none (``leaf`` and
        ``children`` merge per API / class)."""
        leaf = {k: dict(v) for k, v in base.leaf.items()}
        for k, v in self.leaf.items():
            leaf[k] = {**leaf.get(k, {}), **v}
        children = {k: dict(v) for k, v in base.children.items()}
        for k, v in self.children.items():
            children[k] = {**children.get(k, {}), **v}
        source = self.source if base.source in ("<dict>", "") else \
            (f"{base.source} + {self.source}" if self.source not in ("<dict>", "") else base.source)
        return Mapping(api={**base.api, **self.api}, module={**base.module, **self.module},
                       layer={**base.layer, **self.layer}, leaf=leaf,
                       ignore=tuple(base.ignore) + tuple(x for x in self.ignore if x not in base.ignore),
                       source=source, calls={**base.calls, **self.calls}, children=children,
                       candidates={**base.candidates, **self.candidates},
                       families={**base.families, **self.families},
                       primitive={**base.primitive, **self.primitive},
                       cell_sub={**base.cell_sub, **self.cell_sub},
                       primitive_leaf={**base.primitive_leaf, **self.primitive_leaf},
                       parameter={**base.parameter, **self.parameter})


#: PyTorch ↔ MindSpore minimum: the framework prefix only. The full built-in table
#: (layer classes, API renames from MindSpore's published mapping) is
#: :func:`msprobe.compare.builtin_table.builtin_mapping`.
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


def load_mapping(source) -> Mapping:
    """Parse a mapping: our YAML format or any of upstream's four (detected from the
    file's shape, :func:`msprobe.compare.upstream_mapping.detect`), an already-loaded dict,
    a :class:`Mapping`, or a list/tuple of these merged in order (later entries win).

    Raises:
        CompareInputError: unreadable file or YAML syntax error (with line), a section that
            is not one of :data:`SECTIONS` (with its line), or a section of the wrong shape;
            for upstream formats see :func:`msprobe.compare.upstream_mapping.load_upstream`.
    """

    if isinstance(source, Mapping):
        return source
    if isinstance(source, (list, tuple)):
        merged = Mapping(source="")
        for item in source:
            merged = load_mapping(item).merged_over(merged)
        return merged
    lines: dict[str, int] = {}
    if isinstance(source, dict):
        doc, where = source, "<dict>"
        from msprobe.compare.upstream_mapping import _Doc, detect, load_upstream
        kind = detect(doc, SECTIONS)
        if kind is not None:
            return load_upstream("<dict>", kind, _doc=_Doc("<dict>", doc, {}))
    else:
        where = str(source)
        from msprobe.compare.upstream_mapping import detect, load_upstream, read_yaml
        parsed = read_yaml(source, "--mapping")
        doc = parsed.doc
        lines = {str(path[0]): line for path, line in parsed.lines.items() if len(path) == 1}
        kind = detect(doc, SECTIONS)
        if kind is not None:
            return load_upstream(source, kind, _doc=parsed)
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


def _split_module(name: str, kind: str) -> tuple[str, str]:
    """``Cell.fc.Dense.forward.0`` → (``Cell.fc.Dense``, ``.forward.0``)."""
    if kind == "parameters_grad":
        return name[: -len(".parameters_grad")], ".parameters_grad"
    stem, d, c = name.rsplit(".", 2)
    return stem, f".{d}.{c}"


def _stem_map(stem: str, m: Mapping, module: dict) -> str:
    """Rename a module stem (``Cell.path.Class``): an exact ``module`` entry (cell_mapping)
    first; else, when a ``cell_sub`` rule occurs in a ``Cell`` stem's ``path.Class``, the
    first occurrence of each rule's key replaced in order, with ``Cell`` → ``Module``
    (upstream 26.x's "mapping by string in the cell name"); else the class by ``layer``,
    then path prefixes by ``module``."""
    if stem in module:
        return module[stem]
    if m.cell_sub and stem.startswith("Cell."):
        body = new = stem[len("Cell."):]
        for old, repl in m.cell_sub.items():
            if old in new:
                new = new.replace(old, repl, 1)
        if new != body:
            return f"Module.{new}"
    head, _, cls = stem.rpartition(".")
    if cls in m.layer:
        stem = f"{head}.{m.layer[cls]}"
    return _prefix_map(stem, module)


def _module_name(name: str, kind: str, m: Mapping, paths: Optional[dict] = None) -> str:
    """Rename a module call: a ``calls`` entry, else its path by ``paths`` (the expanded
    ``children``), then :func:`_stem_map`."""
    if name in m.calls:
        return m.calls[name]
    stem, tail = _split_module(name, kind)
    if paths:
        stem = paths.get(stem, stem)
    return _stem_map(stem, m, m.module) + tail


def _children_entries(module_stems, children: dict) -> dict:
    """Expand ``children`` ({layer class or ``TopLayer``: {attr: attr}}) into exact stem
    renames for the given module stems (``Cell.a.b.Class``): path components are renamed
    by the entries of their parent's class (``TopLayer`` for the root's children); a dotted
    key (``model.module``) replaces that run of components, longest key first, and the
    next component's parent is the last one the key covered; a value may be dotted. Parent
    classes come from the stems themselves."""
    if not children:
        return {}
    rules: dict = {}        # class -> first component -> [(key components, value)], longest first
    for cls, table in children.items():
        by_first = rules.setdefault(cls, {})
        for k, v in table.items():
            parts = tuple(k.split("."))
            by_first.setdefault(parts[0], []).append((parts, v))
        for lst in by_first.values():
            lst.sort(key=lambda kv: -len(kv[0]))
    class_of: dict[tuple, str] = {}
    split = []
    for stem in module_stems:
        parts = stem.split(".")
        if len(parts) < 3:
            continue
        path, cls = tuple(parts[1:-1]), parts[-1]
        class_of[path] = cls
        split.append((stem, parts[0], path, cls))
    out = {}
    for stem, prefix, path, cls in split:
        new = []
        i = 0
        while i < len(path):
            parent_cls = "TopLayer" if i == 0 else class_of.get(path[:i])
            step, repl = 1, path[i]
            for key, value in rules.get(parent_cls, {}).get(path[i], ()):
                if path[i:i + len(key)] == key:
                    step, repl = len(key), value
                    break
            new.append(repl)
            i += step
        if tuple(new) != path:
            out[stem] = ".".join([prefix, *new, cls])
    return out


def _ignored(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@dataclass
class Renames:
    """``original``: mapped TARGET name → original name; ``ignored``: {side: count};
    ``api``: the API renames in effect ({TARGET API: BASELINE API}, the built-in
    table's candidates resolved against the BASELINE's recorded names); ``by_name``: the
    API names (without counter and direction, BASELINE's vocabulary) that Primitive calls
    with a ``primitive_leaf`` map were renamed to: their leaves differ by construction, so
    calls of these names align by name and order only, on both sides."""

    original: dict = field(default_factory=dict)
    ignored: dict = field(default_factory=dict)
    api: dict = field(default_factory=dict)
    baseline_original: dict = field(default_factory=dict)   # when the BASELINE side was renamed
    by_name: set = field(default_factory=set)   # API names (BASELINE's vocabulary) aligned by name only


def _drop_ignored(side, prefixes, label: str, renames: Renames) -> None:
    if not prefixes:
        return
    names = side.calls["name"].to_pylist()
    keep = [not _ignored(n, prefixes) for n in names]
    renames.ignored[label] = keep.count(False)
    side.calls = side.calls.filter(pa.array(keep))
    lkeep = [not _ignored(n, prefixes) for n in side.leaves["name"].to_pylist()]
    side.leaves = side.leaves.filter(pa.array(lkeep, pa.bool_()))


def _api_base(name: str) -> str:
    return name.rsplit(".", 2)[0]


def resolve_api(m: Mapping, target_apis, baseline_apis) -> dict:
    """The API renames in effect: ``m.api`` as given; for other TARGET APIs (names without
    counter and direction) the first of these that the BASELINE recorded: the table's
    ``candidates`` for the name, the name itself (same-name APIs map by default), the
    name in each of ``families[family]`` (``Mint.matmul`` → ``Torch.matmul``), and for
    ``Primitive.{attr}.{Class}`` the ``primitive[Class]`` candidates.

    Args:
        m: the mapping.
        target_apis, baseline_apis: iterables of API names without counter/direction.
    Returns:
        ``{TARGET API: BASELINE API}`` for the names that change.
    """
    out = {k: v for k, v in m.api.items()}
    if not (m.candidates or m.families or m.primitive):
        return out
    have = set(baseline_apis)
    for name in sorted(set(target_apis)):
        if name in out:
            continue
        family, _, rest = name.partition(".")
        tries = list(m.candidates.get(name, ()))
        tries.append(name)
        tries.extend(f"{f}.{rest}" for f in m.families.get(family, ()))
        if family == "Primitive":
            tries.extend(m.primitive.get(name.rsplit(".", 1)[-1], ()))
        for cand in tries:
            if cand in have:
                if cand != name:
                    out[name] = cand
                break
    return out


def _move_leaf(table: dict, io: str, arg: str) -> Optional[tuple[str, str]]:
    """New (io, arg) of a leaf under a ``leaf`` table: exact ``io.arg`` entry, else the
    longest entry that is a prefix on a dot boundary (nested elements follow their
    argument), else a ``*io`` wildcard (positions the table leaves out are not compared)."""
    key = f"{io}.{arg}" if arg else io
    moved = table.get(key)
    if moved is None:
        parts = key.split(".")
        for n in range(len(parts) - 1, 1, -1):
            hit = table.get(".".join(parts[:n]))
            if hit is not None:
                moved = hit + "." + ".".join(parts[n:])
                break
    if moved is None and f"*{io}" in table:
        moved = f"{table['*' + io]}.{arg}" if arg else table["*" + io]
    if moved is None:
        return None
    new_io, _, new_arg = moved.partition(".")
    return new_io, new_arg


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
    api_map = resolve_api(mapping, (_api_base(n) for n, k in zip(names, kinds) if k in _API_KINDS),
                          (_api_base(n) for n, k in zip(baseline.calls["name"].to_pylist(),
                                                        baseline.calls["kind"].to_pylist()) if k in _API_KINDS))
    renames.api = api_map
    paths: dict = {}
    if mapping.children:
        stems = {_split_module(n, k)[0] for n, k in zip(names, kinds) if k in _MODULE_KINDS}
        paths = _children_entries(sorted(stems), mapping.children)
    new: dict[tuple, str] = {}
    counters: dict[tuple, int] = {}
    fwd_new: dict[tuple, str] = {}
    seqs = calls["seq"].to_pylist()
    order = sorted(range(len(names)), key=lambda i: (ranks[i], steps[i], seqs[i]))
    for i in order:
        name, kind, key = names[i], kinds[i], (ranks[i], steps[i])
        if kind in _MODULE_KINDS:
            out = _module_name(name, kind, mapping, paths)
        elif kind in _API_KINDS and (api_map or mapping.calls):
            base, counter, direction = name.rsplit(".", 2)
            nb = api_map.get(base, base)
            if kind == "api_forward":
                if name in mapping.calls:
                    out = mapping.calls[name]
                    fwd_new[key + (f"{base}.{counter}",)] = out.rsplit(".", 1)[0]
                elif nb != base:
                    n = counters.get(key + (nb,), 0)
                    counters[key + (nb,)] = n + 1
                    out = f"{nb}.{n}.forward"
                    fwd_new[key + (f"{base}.{counter}",)] = f"{nb}.{n}"
                else:
                    out = name
            elif name in mapping.calls:
                out = mapping.calls[name]
            else:
                stem = fwd_new.get(key + (f"{base}.{counter}",), f"{nb}.{counter}")
                out = f"{stem}.{direction}"
        else:
            out = mapping.calls.get(name, name)
        new[(ranks[i], steps[i], name)] = out
        if out != name:
            renames.original[out] = name
    if not renames.original and not mapping.leaf and not mapping.primitive_leaf and not mapping.parameter:
        return renames
    new_names = [new[(r, s, n)] for r, s, n in zip(ranks, steps, names)]
    parents = [None if p is None else _module_name(p, "module_forward", mapping, paths) if p.count(".") >= 3 else p
               for p in calls["parent"].to_pylist()]
    target.calls = calls.set_column(calls.schema.get_field_index("name"), "name", pa.array(new_names, pa.string())) \
        .set_column(calls.schema.get_field_index("parent"), "parent", pa.array(parents, pa.string()))
    leaves = target.leaves
    lnames = [new.get((r, s, n), n) for r, s, n in zip(leaves["rank"].to_pylist(), leaves["step"].to_pylist(),
                                                         leaves["name"].to_pylist())]
    ios, args = leaves["io"].to_pylist(), leaves["arg"].to_pylist()
    if mapping.leaf or mapping.primitive_leaf or mapping.parameter:
        recorded = leaves["name"].to_pylist()
        for i, n in enumerate(lnames):
            table = None
            if mapping.leaf:
                base, _, direction = n.rsplit(".", 2) if n.count(".") >= 2 else (n, "", "")
                table = mapping.leaf.get(n) or mapping.leaf.get(f"{base}.{direction}") or mapping.leaf.get(base)
                if table is None and direction not in ("forward", "backward"):   # module call: P.forward.0
                    stem, d, _c = n.rsplit(".", 2) if n.count(".") >= 2 else (n, "", "")
                    table = mapping.leaf.get(f"{stem}.{d}") or mapping.leaf.get(stem)
            if table is None and mapping.primitive_leaf:
                table = _primitive_leaf_table(recorded[i], mapping.primitive_leaf)
            if table:
                moved = _move_leaf(table, ios[i], args[i] or "")
                if moved:
                    ios[i], args[i] = moved
            elif mapping.parameter:
                ios[i], args[i] = _parameter_leaf(recorded[i], ios[i], args[i], mapping.parameter)
    if mapping.primitive_leaf:
        for name, new_name in api_map.items():
            if name.startswith("Primitive.") and name.rsplit(".", 1)[-1] in mapping.primitive_leaf:
                renames.by_name.add(new_name)
    for col, values in (("name", lnames), ("io", ios), ("arg", args)):
        leaves = leaves.set_column(leaves.schema.get_field_index(col), col, pa.array(values, pa.string()))
    target.leaves = leaves
    return renames


def _primitive_leaf_table(name: str, table: dict) -> Optional[dict]:
    """The ``primitive_leaf`` map of a recorded ``Primitive.{attr}.{Class}.{n}.{direction}``
    leaf name (None for other names)."""
    if not name.startswith("Primitive."):
        return None
    parts = name.rsplit(".", 3)
    if len(parts) != 4:
        return None
    return table.get(parts[1], {}).get(parts[3])


def _parameter_leaf(name: str, io: str, arg: Optional[str], table: dict) -> tuple:
    """``(io, arg)`` of a module leaf with its parameter renamed by ``parameter``
    ({layer class: {parameter: BASELINE parameter}}): ``parameters.{p}`` of a forward call,
    io ``{p}`` of a ``parameters_grad`` call (``name`` as recorded)."""
    if name.endswith(".parameters_grad"):
        cls = name[: -len(".parameters_grad")].rsplit(".", 1)[-1]
        renamed = table.get(cls, {}).get(io)
        return (renamed, arg) if renamed else (io, arg)
    if io == "parameters" and arg:
        parts = name.rsplit(".", 3)
        if len(parts) == 4 and parts[2] == "forward":
            head, _, rest = arg.partition(".")
            renamed = table.get(parts[1], {}).get(head)
            if renamed:
                return io, renamed + (f".{rest}" if rest else "")
    return io, arg


def set_aside_cell_input_gradients(side) -> int:
    """MindSpore side of a PyTorch/MindSpore comparison: move the backward ``output`` leaves
    of Cell calls to io ``output_whole_gradient`` (same arg), so they pair with nothing
    (not even as a leftover leaf of io ``output``). MindSpore's
    recorder holds there the whole gradient of the Cell's input tensor (every use of it),
    PyTorch's the module's own contribution (docs/mindspore.md, "Backward entries"); the two
    differ wherever the input has another user. Returns the number of leaves moved."""
    kinds = side.calls["kind"].to_pylist()
    keys = {(r, s, n) for r, s, n, k in zip(side.calls["rank"].to_pylist(), side.calls["step"].to_pylist(),
                                            side.calls["name"].to_pylist(), kinds) if k == "module_backward"}
    if not keys:
        return 0
    leaves = side.leaves
    ios = leaves["io"].to_pylist()
    moved = 0
    for i, key in enumerate(zip(leaves["rank"].to_pylist(), leaves["step"].to_pylist(), leaves["name"].to_pylist())):
        if ios[i] == "output" and key in keys:
            ios[i] = "output_whole_gradient"
            moved += 1
    side.leaves = leaves.set_column(leaves.schema.get_field_index("io"), "io", pa.array(ios, pa.string()))
    return moved


def framework_mapping(target, baseline, user: Optional[Mapping], notes: list):
    """Frameworks differ: the mapping to apply to the TARGET, and the BASELINE's renames.

    MindSpore TARGET, PyTorch BASELINE: the built-in table
    (:func:`msprobe.compare.builtin_table.builtin_mapping`) under the user's mapping.
    PyTorch TARGET, MindSpore BASELINE: the table renames the BASELINE into PyTorch names
    here (:func:`apply_mapping` with the sides swapped; reports show the BASELINE's mapped
    names, :attr:`Renames.baseline_original` the recorded ones) and the user's mapping, if
    any, applies to the TARGET. Other pairs: the user's mapping only.

    Args:
        target, baseline: :class:`~msprobe.compare.load.Side` objects (``framework`` set).
        user: the user's mapping or None.
        notes: the comparison's notes; one line is added.
    Returns:
        ``(mapping for the TARGET or None, BASELINE Renames or None)``.
    """
    from msprobe.compare.builtin_table import builtin_mapping

    tf, bf = target.framework, baseline.framework
    head = f"frameworks differ: TARGET {tf}, BASELINE {bf}; "
    for side in (target, baseline):
        if side.framework == "mindspore" and {tf, bf} == {"mindspore", "pytorch"} and set_aside_cell_input_gradients(side):
            notes.append("mindspore Cell backward 'output' leaves (the whole gradient of each input) are not "
                         "compared with PyTorch's (each module's own contribution): io 'output_whole_gradient'")
    if tf == "mindspore" and bf == "pytorch":
        table = builtin_mapping()
        notes.append(head + (f"mapping {user.source} over the {table.source}" if user is not None else
                             f"no mapping given: the {table.source}; unmatched names are listed"))
        return (user.merged_over(table) if user is not None else table), None
    if tf == "pytorch" and bf == "mindspore":
        table = builtin_mapping()
        notes.append(head + f"the {table.source} renames the BASELINE into PyTorch names"
                     + (f"; mapping {user.source} on the TARGET" if user is not None else
                        "; unmatched names are listed"))
        return user, apply_mapping(baseline, target, table)
    notes.append(head + (f"mapping {user.source}" if user is not None else "no built-in table for this pair"))
    return user, None


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
            out["baseline"].add(base_name(renames.baseline_original.get(b, b), kind))
    return {k: sorted(v)[:limit] for k, v in out.items()}
