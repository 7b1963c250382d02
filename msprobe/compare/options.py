"""Compare options: tolerance tables, rank/step selections, modes.

Tolerances are relative (rtol) per dtype; a leaf pair uses the rtol of its
lower-precision dtype (``torch.testing.assert_close`` defaults: float64 1e-7,
float32 1.3e-6, float16 1e-3, bfloat16 1.6e-2); non-float dtypes compare exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from msprobe.compare.errors import CompareInputError

__all__ = ["CompareOptions", "parse_tol", "parse_ranges", "parse_rank_map", "dtype_class", "MODES", "FORMATS"]

MODES = ("auto", "md5", "statistics", "tensor")
FORMATS = ("summary", "csv", "parquet", "html", "xlsx")
STRICT = {"float64": 1e-7, "float32": 1.3e-6, "float16": 1e-3, "bfloat16": 1.6e-2}
LOOSE = {"float64": 1e-4, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
BITWISE = {"float64": 0.0, "float32": 0.0, "float16": 0.0, "bfloat16": 0.0}
PRESETS = {"strict": STRICT, "loose": LOOSE, "bitwise": BITWISE}


def dtype_class(dtype: Optional[str]) -> Optional[str]:
    """Canonical float name (``float64``/``float32``/``float16``/``bfloat16``) of a torch,
    MindSpore or numpy dtype spelling, ``"float"`` for other floats, else ``"int"``,
    ``"bool"``, ``"complex"`` or the spelling itself; None for None.

    >>> dtype_class("torch.bfloat16"), dtype_class("Float16"), dtype_class("torch.int64")
    ('bfloat16', 'float16', 'int')
    """
    if dtype is None:
        return None
    d = dtype.lower().rsplit(".", 1)[-1]
    if d in ("bfloat16", "bf16"):
        return "bfloat16"
    if d in ("float16", "half", "fp16"):
        return "float16"
    if d in ("float32", "float", "fp32"):
        return "float32"
    if d in ("float64", "double", "fp64"):
        return "float64"
    if "float" in d:
        return "float"
    if "complex" in d:
        return "complex"
    if d.startswith("bool"):
        return "bool"
    if "int" in d:
        return "int"
    return d


def parse_tol(spec: str) -> dict[str, float]:
    """``strict`` | ``loose`` | ``bitwise`` | comma-separated ``DTYPE=RTOL`` overrides on
    top of strict (``bfloat16=0.05,float32=1e-5``).

    Raises:
        CompareInputError: unknown preset or dtype, or an RTOL that is not a number ≥ 0.
    """
    spec = spec.strip()
    if spec in PRESETS:
        return dict(PRESETS[spec])
    table = dict(STRICT)
    for item in spec.split(","):
        dtype, sep, value = item.partition("=")
        name = dtype_class(dtype.strip()) if sep else None
        if not sep or name not in STRICT:
            raise CompareInputError(f"--tol: got {item!r}; allowed: strict, loose, bitwise or DTYPE=RTOL "
                                    f"with DTYPE one of {', '.join(STRICT)}")
        try:
            rtol = float(value)
        except ValueError:
            rtol = -1.0
        if not rtol >= 0:
            raise CompareInputError(f"--tol: {dtype.strip()}={value!r}: RTOL must be a number >= 0")
        table[name] = rtol
    return table


def parse_ranges(spec: Optional[str], what: str) -> Optional[frozenset[int]]:
    """``"0,2-3"`` → ``{0, 2, 3}``; None → None (everything). The syntax of
    :func:`msprobe.check_ranks.parse_ranks`.

    Raises:
        CompareInputError: an item is not an int or ``a-b`` with 0 ≤ a ≤ b.
    """
    if spec is None:
        return None
    from msprobe.check_ranks import CheckRanksInputError, parse_ranks

    try:
        return frozenset(parse_ranks(f"--{what}", spec))
    except CheckRanksInputError as exc:
        raise CompareInputError(str(exc)) from None


def parse_rank_map(spec) -> Optional[dict[int, int]]:
    """``--rank-map``: ``"0:1,1:0"`` (TARGET rank 0 pairs with BASELINE rank 1, and 1 with
    0) → ``{0: 1, 1: 0}``; a dict is checked the same way; None/empty → None (ranks pair by
    id). Ranks not named pair by id unless the map gives their BASELINE id to another rank.

    Raises:
        CompareInputError: an item is not ``T:B`` with integers >= 0, or a TARGET or
            BASELINE rank appears twice.
    """
    if spec is None or spec == "" or spec == {}:
        return None
    allowed = "allowed: comma-separated TARGET:BASELINE rank pairs like 0:1,1:0"
    if isinstance(spec, dict):
        items = [(str(k), str(v), f"{k}:{v}") for k, v in spec.items()]
    else:
        items = []
        for item in str(spec).split(","):
            t, sep, b = item.strip().partition(":")
            if not sep:
                raise CompareInputError(f"--rank-map: got {item.strip()!r}; {allowed}")
            items.append((t.strip(), b.strip(), item.strip()))
    out: dict[int, int] = {}
    for t, b, text in items:
        if not (t.isdigit() and b.isdigit()):
            raise CompareInputError(f"--rank-map: got {text!r}; {allowed} (ranks are integers >= 0)")
        ti, bi = int(t), int(b)
        if ti in out:
            raise CompareInputError(f"--rank-map: TARGET rank {ti} is mapped twice ({ti}:{out[ti]} and {text}); "
                                    f"each rank pairs with one rank")
        if bi in out.values():
            raise CompareInputError(f"--rank-map: BASELINE rank {bi} is mapped twice ({text} and an earlier pair); "
                                    f"each rank pairs with one rank")
        out[ti] = bi
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareOptions:
    """Validated options of one comparison (see :func:`msprobe.compare.compare`)."""

    mode: str = "auto"
    tol: dict = field(default_factory=lambda: dict(STRICT))
    loss_scale: float = 1.0
    ranks: Optional[frozenset] = None
    steps: Optional[frozenset] = None
    first_only: bool = False
    formats: tuple = ("summary", "csv", "parquet", "html")
    max_d: int = 20000
    mapping: object = None          # parsed msprobe.compare.mapping.Mapping, or None
    rank_map: Optional[dict] = None  # {TARGET rank: BASELINE rank} (--rank-map), or None
    workers: int = 1                # tensor mode: threads measuring leaf pairs

    @staticmethod
    def build(*, mode: str = "auto", tol="strict", loss_scale: float = 1.0, rank=None, step=None,
              first_only: bool = False, formats: Optional[Sequence[str]] = None, max_d: int = 20000,
              mapping=None, rank_map=None, workers=1) -> "CompareOptions":
        """Validate raw option values (strings as on the command line, or Python values).

        Raises:
            CompareInputError: naming the option, the value and what is allowed.
        """
        if mode not in MODES:
            raise CompareInputError(f"--mode: got {mode!r}; allowed: {', '.join(MODES)}")
        tol_table = parse_tol(tol) if isinstance(tol, str) else dict(tol)
        try:
            scale = float(loss_scale)
        except (TypeError, ValueError):
            scale = 0.0
        if not scale > 0 or scale == float("inf"):
            raise CompareInputError(f"--loss-scale: got {loss_scale!r}; allowed: a finite number > 0")
        if formats is None:
            fmts = ("summary", "csv", "parquet", "html")
        else:
            if isinstance(formats, str):
                formats = formats.split(",")
            fmts = tuple(f.strip() for f in formats if f.strip())
            bad = [f for f in fmts if f not in FORMATS]
            if bad:
                raise CompareInputError(f"--format: got {','.join(bad)!r}; allowed: {', '.join(FORMATS)}")
            if "xlsx" in fmts:
                import importlib.util

                if importlib.util.find_spec("openpyxl") is None:
                    raise CompareInputError("--format xlsx: needs the openpyxl package, which is not installed; "
                                            "use csv or parquet")
            if "summary" not in fmts:
                fmts = ("summary",) + fmts
        def sel(value, what):
            if value is None or isinstance(value, str):
                return parse_ranges(value, what)
            if isinstance(value, int):
                return frozenset({value})
            return frozenset(int(v) for v in value)
        if isinstance(workers, str) and workers.strip().isdigit():
            workers = int(workers)
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 256:
            raise CompareInputError(f"--workers: got {workers!r}; allowed: an integer from 1 to 256")
        if mapping is not None:
            from msprobe.compare.mapping import Mapping, load_mapping
            mapping = mapping if isinstance(mapping, Mapping) else load_mapping(mapping)
        return CompareOptions(mapping=mapping, rank_map=parse_rank_map(rank_map), mode=mode, tol=tol_table,
                              loss_scale=scale, ranks=sel(rank, "rank"), steps=sel(step, "step"),
                              first_only=bool(first_only), formats=fmts, max_d=max_d, workers=workers)
