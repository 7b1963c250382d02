"""Which tool wrote a dump, and what its records mean next to another tool's.

A side of a comparison is produced by this project (``msprobe``), upstream
mindstudio-probe 1.x (``upstream-1.x``, 1.2.2 and the releases it documents) or upstream
26.x (``upstream-26``). :func:`detect` reads the producer from the dump itself;
:func:`reconcile` then makes the two sides say the same thing before they are paired
(``docs/compare-upstream-formats.md``, section "Dumps of different tools"):

- **alias slots** (ours, any pair of producers): a backward slot whose record carries
  ``"alias_of": "output.0"`` holds the same gradient as the slot it names (one tensor in
  several argument slots, docs/pytorch.md "Backward entries"). It is not compared (the
  named slot is) and is counted under ``alias_slot``.
- **API backward outputs** (ours against upstream): upstream records, for an API
  backward, the inputs of the API's last autograd node (spec section 8, defect 3:
  ``cross_entropy`` gives the gradient of its ``nll_loss`` input, ``linear`` the bias,
  input and transposed weight gradients), ours the gradients w.r.t. the forward
  arguments. These leaves are not compared, on either side, and are counted under
  ``api_backward_output``. The gradient w.r.t. each intermediate tensor is still compared:
  it is the ``input`` (gradient w.r.t. the outputs) of the backward of the API that
  produced the tensor, which both tools record with the same meaning.
- **0-dim Norm** (ours against upstream): upstream writes a 0-dim tensor's value as its
  Norm (defect 10, negative for a negative value); its absolute value is compared.
- **checksums of different kinds**: the ``md5`` field holds CRC-32 (8 hex digits) or the
  64-bit XOR of summary_mode ``xor`` (``0x`` + 16 hex digits); checksums of different
  kinds are never compared (the statistics are; ``--mode md5`` then stops with an error).

Statistics noise (:func:`noise_profiles`): each producer computes
Mean and Norm in its own way (ours in float64, upstream with ``torch.mean``/``torch.norm``
in the tensor's dtype, accumulating in float32), so two tools' statistics of the same
tensor differ by rounding; :func:`msprobe.compare.metrics.leaf_pairs_sql` subtracts that
allowance from each statistic's error term when the producers differ.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:  # load imports this module
    from msprobe.compare.load import Side

__all__ = ["OURS", "UPSTREAM_1", "UPSTREAM_26", "PRODUCERS", "detect", "reconcile", "noise_profiles",
           "SKIP_REASONS", "checksum_kind"]

OURS = "msprobe"
UPSTREAM_1 = "upstream-1.x"
UPSTREAM_26 = "upstream-26"
PRODUCERS = (OURS, UPSTREAM_1, UPSTREAM_26)

#: why leaves were left out of the comparison (keys of summary.json ``skipped``)
SKIP_REASONS = {
    "alias_slot": "backward slot holding the same gradient as another slot (alias_of); that slot is compared",
    "api_backward_output": "API backward output: upstream records the inputs of the API's last autograd node, "
                           "ours the gradients w.r.t. the forward arguments",
}

_PROC_DIR = re.compile(r"^proc\d+$")
_XOR = re.compile(r"^0x[0-9a-fA-F]{16}$")
_CRC = re.compile(r"^[0-9a-fA-F]{8}$")


def checksum_kind(text: Optional[str]) -> Optional[str]:
    """``"xor"`` (``0x`` + 16 hex digits), ``"crc32"`` (8 hex digits), None for None or
    anything else."""
    if text is None:
        return None
    if _XOR.match(text):
        return "xor"
    if _CRC.match(text):
        return "crc32"
    return None


def detect(dump_files: Iterable[Path], *, stack_v26: bool, names: Iterable[str], leaves: pa.Table) -> str:
    """The producer of an upstream-layout side (dump.json files).

    Ours when a dump.json lies in the layout our exporter writes (``dump_path/.msprobe/log``
    two or three levels above: ``dump_path/step{N}/{rank}/dump.json``); upstream 26.x when
    any of its marks is present: a ``proc{pid}`` directory (26.x's non-distributed layout),
    the deduplicated stack.json (``{"0": [[names], [frames]]}``), an indexed
    ``parameters_grad.{n}`` entry, a DTensor record with ``device_mesh``/``placements``, or
    an XOR checksum in ``md5``; else upstream 1.x.

    Args:
        dump_files: the dump.json paths of the side.
        stack_v26: whether some stack.json had the deduplicated format.
        names: entry names of the side (as written in dump.json).
        leaves: the side's leaf table (columns ``value_json``, ``crc32``).
    """
    files = list(dump_files)
    for f in files:
        for up in list(f.resolve().parents)[1:4]:
            if (up / ".msprobe" / "log").is_dir():
                return OURS
    if stack_v26 or any(_PROC_DIR.match(part) for f in files for part in f.parent.parts):
        return UPSTREAM_26
    if any(re.search(r"\.parameters_grad\.\d+$", n) for n in names):
        return UPSTREAM_26
    if leaves.num_rows:
        vj = leaves["value_json"]
        if pc.any(pc.fill_null(pc.match_substring(vj, '"placements"'), False)).as_py():
            return UPSTREAM_26
        crc = leaves["crc32"]
        if pc.any(pc.fill_null(pc.match_substring_regex(crc, r"^0x[0-9a-fA-F]{16}$"), False)).as_py():
            return UPSTREAM_26
    return UPSTREAM_1


def noise_profiles(t_producer: Optional[str], b_producer: Optional[str]) -> Optional[tuple[str, str]]:
    """The two statistics profiles to allow for, or None when both sides computed their
    statistics the same way (same producer: the same tensor gives the same bits)."""
    if t_producer is None or b_producer is None or t_producer == b_producer:
        return None
    return t_producer, b_producer


def _semantics(producer: Optional[str]) -> str:
    return "ours" if producer == OURS else "upstream"


def _drop(side, mask: pa.Array) -> int:
    n = pc.sum(pc.cast(mask, pa.int64())).as_py() or 0
    if n:
        side.leaves = side.leaves.filter(pc.invert(mask))
    return n


def reconcile(t: Side, b: Side, notes: list[str]) -> dict[str, dict]:
    """Apply the rules of the module docstring to the two sides (in place: their
    ``leaves`` tables); returns summary.json's ``skipped``:
    ``{reason: {"TARGET": n, "BASELINE": m, "why": text}}`` for each reason that left out
    a leaf, and appends one note per reason and one when checksum kinds differ.

    Args:
        t, b: the target and the baseline :class:`msprobe.compare.load.Side`
            (``producer`` set); their ``leaves`` tables are filtered in place.
        notes: the comparison's notes, one string each (appended to).
    """
    skipped: dict = {}

    def count(reason: str, label: str, n: int) -> None:
        if n:
            skipped.setdefault(reason, {"TARGET": 0, "BASELINE": 0, "why": SKIP_REASONS[reason]})[label] += n

    cross = _semantics(t.producer) != _semantics(b.producer)
    for label, side in (("TARGET", t), ("BASELINE", b)):
        leaves = side.leaves
        if leaves.num_rows == 0:
            continue
        alias = pc.fill_null(pc.and_(pc.equal(leaves["leaf_kind"], "tensor"),
                                     pc.match_substring(leaves["value_json"], '"alias_of"')), False)
        count("alias_slot", label, _drop(side, alias))
        if cross:
            names = side.calls.filter(pc.equal(side.calls["kind"], "api_backward"))["name"].unique()
            leaves = side.leaves
            mask = pc.and_(pc.is_in(leaves["name"], names), pc.equal(leaves["io"], "output"))
            count("api_backward_output", label, _drop(side, pc.fill_null(mask, False)))
            if _semantics(side.producer) == "upstream":
                _abs_zero_dim_norm(side)
    notes += skip_notes(skipped)
    kinds = [_kinds(s.leaves) for s in (t, b)]
    if kinds[0] and kinds[1] and not (kinds[0] & kinds[1]):
        notes.append(f"checksums not compared: TARGET holds {'/'.join(sorted(kinds[0]))}, BASELINE "
                     f"{'/'.join(sorted(kinds[1]))} (field 'md5')")
        for side in (t, b):
            i = side.leaves.schema.get_field_index("crc32")
            side.leaves = side.leaves.set_column(i, side.leaves.schema.field(i),
                                                 pa.nulls(side.leaves.num_rows, pa.string()))
    return skipped


def skip_notes(skipped: dict) -> list[str]:
    """The notes of :func:`reconcile` for its ``skipped`` counts, one per reason."""
    return [f"skipped {c['TARGET']} TARGET and {c['BASELINE']} BASELINE leaves ({reason}): {c['why']}"
            for reason, c in skipped.items()]


def _kinds(leaves: pa.Table) -> set:
    if leaves.num_rows == 0:
        return set()
    values = pc.unique(leaves["crc32"].drop_null()).to_pylist()
    return {k for k in (checksum_kind(v) for v in values[:1000]) if k is not None}


def _abs_zero_dim_norm(side) -> None:
    leaves = side.leaves
    zero_dim = pc.fill_null(pc.equal(pc.list_value_length(leaves["shape"]), 0), False)
    if not pc.any(zero_dim).as_py():
        return
    norm = pc.if_else(zero_dim, pc.abs(leaves["norm"]), leaves["norm"])
    i = leaves.schema.get_field_index("norm")
    side.leaves = leaves.set_column(i, leaves.schema.field(i), norm)

