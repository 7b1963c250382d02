"""The built-in MindSpore → PyTorch name table, used for
PyTorch↔MindSpore when no mapping file is given; built from MindSpore's published API mapping.

The data is ``ms_pt_table.yaml`` next to this module (shipped as package data): written by
hand from MindSpore's "PyTorch and MindSpore API Mapping Table" for the names our two
recorders give (its header says which family is which). Sections:

``module``      path prefixes (``Cell: Module``);
``layer``       layer class tokens (``Dense: Linear``, ``SequentialCell: Sequential``);
``families``    ``{MindSpore family: [PyTorch families]}`` tried with the same API name
                (``Mint.matmul`` → ``Torch.matmul``);
``api``         ``{MindSpore API: [PyTorch candidates]}`` for names that differ
                (``Functional.concat: [Torch.cat]``);
``primitive``   ``{Primitive class: [PyTorch candidates]}`` for ``Primitive.{attr}.{Class}``;
``primitive_leaf`` ``{Primitive class: {forward|backward: {io.arg: io.arg}}}``: argument and
                output positions of a Primitive that differ from its PyTorch counterpart's
                (``LayerNorm(x, gamma, beta) -> (y, mean, rstd)`` vs ``layer_norm(x, shape,
                weight, bias, eps) -> y``); positions moved to ``*.unmapped.*`` pair with
                nothing;
``parameter``   ``{layer class: {MindSpore parameter: PyTorch parameter}}`` for the
                ``parameters`` of module forward calls and ``parameters_grad`` keys
                (``LayerNorm: {gamma: weight, beta: bias}``).

Candidates resolve against the names the BASELINE recorded
(:func:`msprobe.compare.mapping.resolve_api`). :func:`builtin_mapping` returns the table as
a :class:`~msprobe.compare.mapping.Mapping`; :func:`table_entries` counts its entries.
"""
from __future__ import annotations

import os
from typing import Optional

from msprobe.compare.errors import CompareInputError
from msprobe.compare.mapping import Mapping

__all__ = ["TABLE_PATH", "builtin_mapping", "table_entries"]

TABLE_PATH = os.path.join(os.path.dirname(__file__), "ms_pt_table.yaml")
_SECTIONS = ("module", "layer", "families", "api", "primitive", "primitive_leaf", "parameter")


def _names(value, where: str) -> tuple:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CompareInputError(f"{where}: expected a list of names, got {value!r}")
    return tuple(value)


def builtin_mapping(path: Optional[str] = None) -> Mapping:
    """Load the table (default :data:`TABLE_PATH`) as a Mapping (source ``built-in
    MindSpore/PyTorch table``).

    Raises:
        CompareInputError: the file is missing or malformed (section and key named).
    """
    import yaml

    path = path or TABLE_PATH
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CompareInputError(f"built-in table {path!r}: unreadable: {exc}") from None
    if not isinstance(doc, dict) or any(k not in _SECTIONS for k in doc):
        raise CompareInputError(f"built-in table {path!r}: allowed sections {', '.join(_SECTIONS)}, "
                                f"got {list(doc) if isinstance(doc, dict) else type(doc).__name__}")
    out = {}
    for section in _SECTIONS:
        table = doc.get(section) or {}
        if not isinstance(table, dict):
            raise CompareInputError(f"built-in table {path!r}: section {section!r}: expected a mapping")
        if section == "primitive_leaf":
            out[section] = {k: _leaf_maps(v, f"built-in table {path!r}: {section}.{k}") for k, v in table.items()}
            continue
        if section == "parameter":
            for k, v in table.items():
                if not isinstance(v, dict) or not all(isinstance(a, str) and isinstance(b, str) for a, b in v.items()):
                    raise CompareInputError(f"built-in table {path!r}: {section}.{k}: expected parameter: parameter")
            out[section] = {k: dict(v) for k, v in table.items()}
            continue
        if section in ("module", "layer"):
            for k, v in table.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise CompareInputError(f"built-in table {path!r}: {section}.{k}: expected name: name")
            out[section] = dict(table)
        else:
            out[section] = {k: _names(v, f"built-in table {path!r}: {section}.{k}") for k, v in table.items()}
    return Mapping(module=out["module"], layer=out["layer"], families=out["families"],
                   candidates=out["api"], primitive=out["primitive"], primitive_leaf=out["primitive_leaf"],
                   parameter=out["parameter"], source="built-in MindSpore/PyTorch table")


def _leaf_maps(value, where: str) -> dict:
    """``{forward|backward: {io.arg: io.arg}}`` of one ``primitive_leaf`` entry."""
    if not isinstance(value, dict) or any(k not in ("forward", "backward") for k in value):
        raise CompareInputError(f"{where}: expected {{forward|backward: {{io.arg: io.arg}}}}, got {value!r}")
    out = {}
    for direction, table in value.items():
        if not isinstance(table, dict) or not all(isinstance(a, str) and isinstance(b, str) and "." in a and "." in b
                                                  for a, b in table.items()):
            raise CompareInputError(f"{where}.{direction}: expected io.arg: io.arg, got {table!r}")
        out[direction] = dict(table)
    return out


def table_entries(m: Optional[Mapping] = None) -> dict:
    """``{section: number of entries}`` of the table (for docs and tests)."""
    m = m or builtin_mapping()
    return {"module": len(m.module), "layer": len(m.layer), "families": len(m.families),
            "api": len(m.candidates), "primitive": len(m.primitive), "primitive_leaf": len(m.primitive_leaf),
            "parameter": len(m.parameter)}
