"""``msprobe`` command line: ``msprobe export`` and ``msprobe query``.

::

    msprobe --version
        the version of the installed distribution msprobe-recorder
    msprobe export DUMP_PATH [-o OUT] [--rank 0,2-3] [--step 0-4] [--tensorboard DIR]
        rebuild step{N}/{rank}/dump.json, stack.json, construct.json (or {rank}/debug.json)
        from the log under DUMP_PATH; prints each directory written and each skipped part.
        A MindSpore kernel dump (level L2, GRAPH_MODE) without a log is first read into
        the log (msprobe.kernel_dump.ingest)
    msprobe query DUMP_PATH "SQL" [--format table|csv|json|parquet] [-o FILE] [--rank R] [--step S]
        run SQL over the views tensors, calls, stacks, replicas, summary (see store.query);
        prints the result, or writes it to FILE (--format parquet needs -o). DUMP_PATH may
        be the OUT of msprobe compare: its tables tensors, calls, alignment (Parquet, or CSV)
    msprobe report DUMP_PATH [-o report.html] [--threshold T] [--jump J] [--max-rows N]
        [--max-steps N] [--rank R] [--step S]
        write one self-contained HTML page showing the recording (see msprobe.report)
    msprobe compact DUMP_PATH [-o OUT] [--follow [--interval S]]
        write the steps finished since the last run as Hive-partitioned Parquet (default
        DUMP_PATH/.msprobe/parquet; store.manifest) that the readers and any Parquet engine
        (DuckDB, Polars, Spark) read; --follow keeps going while training runs; the log
        stays the source of truth
    msprobe compare TARGET BASELINE [-o OUT] [--mode auto|md5|statistics|tensor] [--rank 0,2-3]
        [--step 0-4] [--tol strict|loose|bitwise|DTYPE=RTOL] [--loss-scale S] [--first-only]
        [--format summary,csv,parquet,html] [--mapping MAP.yaml] [--rank-map 0:1,1:0] [--workers N]
        [-dm DATA.yaml] [-am [API.yaml]] [-cm [CELL.yaml]] [-lm [LAYER.yaml]]
        upstream spellings: -i compare.json, -tp/-gp, -o/--output_path, -m auto, -s, -c, -hl,
        -f/-fm, -da, -tensor_log, --xlsx (docs/compare-upstream-formats.md)
        find the first divergence between two dumps (see msprobe.compare); exit status 0
        identical or close, 1 diverged, 3 incomplete (a step, rank or log part on one side
        only or damaged), 4 inconclusive (almost nothing pairs), 2 bad input (docs/compare.md)
    msprobe check-ranks DUMP_PATH [--group 0-7 ...] [--step 0-4] [--all-calls] [--tol REL]
        the first tensor on which data-parallel replicas disagree (see msprobe.check_ranks);
        exit status 0 all agree, 1 a disagreement, 3 incomplete (a log part skipped or a
        rank of a group without records, nothing disagreeing), 2 bad input
    msprobe compare TARGET --nan-origin
        the first call per rank that turns finite inputs into NaN/Inf; exit status 0 none,
        1 one found, 2 bad input

Every command that reads a log (export, query, report, compact, compare, check-ranks) prints
on stderr each part it did not read as data (a damaged batch, a torn tail, a rank without a
log, a tensor whose payload shard is missing or damaged), one line each, then a warning that
the result is partial; logs of format 1 (no checksums) are named as unverified
(docs/reliability.md).

Exit status: 0 on success; 2 for a usage error, a missing dump path, a dump path without a
log, a failed export or an invalid query (message on stderr); 141 (128 + SIGPIPE, what a
shell reports for a process that SIGPIPE ended) without a message when stdout is closed
early, as by ``msprobe query ... | head``, for every subcommand. Imports no deep-learning
framework.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from store.errors import StoreError

__all__ = ["main"]

FORMATS = ("table", "csv", "json", "parquet")

#: exit status when stdout is closed before the output is written (``| head``): 128 + SIGPIPE (13)
EXIT_STDOUT_CLOSED = 141


class _SelectionError(ValueError):
    """A malformed ``--rank``/``--step`` list (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that writing help or usage to a closed stdout raises
    (argparse ignores the error, so ``msprobe --help | true`` would exit 0 or 141 depending
    on stdout's buffering); the subparsers are of this class too."""

    def _print_message(self, message, file=None):
        if message and file is sys.stdout:
            file.write(message)
            return
        super()._print_message(message, file)


DISTRIBUTION = "msprobe-recorder"


def package_version() -> str:
    """The version of the installed distribution :data:`DISTRIBUTION` (its package
    metadata, ``importlib.metadata``), or ``'unknown (msprobe-recorder is not installed)'``
    when msprobe runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return f"unknown ({DISTRIBUTION} is not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="msprobe", description="msprobe precision-debugging dump tools"
    )
    parser.add_argument("--version", action="version", version=f"msprobe {package_version()}",
                        help="print the version of the installed msprobe-recorder and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    export = commands.add_parser(
        "export", help="rebuild the dump layout (dump.json, stack.json, construct.json) from the log"
    )
    export.add_argument("dump_path", metavar="DUMP_PATH", help="the dump_path of the run")
    export.add_argument(
        "-o", "--out", metavar="OUT", default=None, help="output directory (default: DUMP_PATH)"
    )
    export.add_argument(
        "--tensorboard", metavar="DIR", default=None,
        help="write per-step scalars (output and gradient Norm per module, NaN/Inf counts) as TensorBoard "
             "event files under DIR/rank{R}; the dump layout is then written only when -o is given",
    )
    _add_selection(export, "export")
    query = commands.add_parser("query", help="run SQL over the views tensors, calls, stacks")
    query.add_argument("dump_path", metavar="DUMP_PATH", help="the dump_path of the run")
    query.add_argument("sql", metavar="SQL", help="one SQL statement")
    query.add_argument(
        "--format", choices=FORMATS, default="table",
        help="output format (default: table; parquet needs -o)",
    )
    query.add_argument("-o", "--out", metavar="FILE", default=None,
                       help="write the result to FILE instead of stdout")
    _add_selection(query, "query")
    report = commands.add_parser("report", help="write a self-contained HTML report of a recording")
    report.add_argument("dump_path", metavar="DUMP_PATH", help="the dump_path of the run")
    report.add_argument("-o", "--out", metavar="FILE", default="report.html",
                        help="the HTML file to write (default: report.html)")
    report.add_argument("--threshold", type=float, default=1e4,
                        help="list tensors whose |Max| or |Min| reaches this (default: 1e4)")
    report.add_argument("--jump", type=float, default=10.0,
                        help="list Norm changes by this factor or more between steps (default: 10)")
    report.add_argument("--max-rows", type=int, default=200,
                        help="most modules per heat map; more are sampled evenly (default: 200)")
    report.add_argument("--max-steps", type=int, default=200,
                        help="most heat-map columns; more steps are binned (default: 200)")
    report.add_argument("--max-ranks", type=int, default=16,
                        help="most ranks shown in detail (graph, trends, module tree): those holding NaN/Inf "
                             "first, then the lowest; every rank is in the overview (default: 16)")
    _add_selection(report, "show")
    compact = commands.add_parser("compact", help="write finished steps of the log as partitioned Parquet")
    compact.add_argument("dump_path", metavar="DUMP_PATH", help="the dump_path of the run")
    compact.add_argument(
        "-o", "--out", metavar="OUT", default=None,
        help="output directory (default: DUMP_PATH/.msprobe/parquet, where the readers look)",
    )
    compact.add_argument("--follow", action="store_true",
                         help="keep compacting each step as it finishes until every log file is closed")
    compact.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                         help="with --follow: seconds between passes (default: 2)")
    _add_compare(commands)
    ranks = commands.add_parser("check-ranks", help="find the first tensor on which replicas disagree")
    ranks.add_argument("dump_path", metavar="DUMP_PATH", help="our dump path or an upstream step*/rank*/ layout")
    ranks.add_argument("--group", action="append", default=None, metavar="RANKS",
                       help="ranks that are replicas of each other, e.g. 0-3; repeat for several groups "
                            "(default: every rank of the recorded world size)")
    ranks.add_argument("--step", default=None, help="steps to check, e.g. 0-4 (default: all)")
    ranks.add_argument("--all-calls", action="store_true",
                       help="compare every recorded tensor (ranks fed the same data), not only what must "
                            "agree: parameters, replicated collective outputs, outputs of calls whose inputs agreed")
    ranks.add_argument("--tol", default="0", help="relative tolerance of statistics where no CRC-32 was "
                                                  "recorded (default 0: equal statistics)")
    return parser


def _add_selection(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--rank", default=None, help=f"ranks to {verb}, e.g. 0,2-3 (default: all); "
                                                     "other ranks' files are not read")
    parser.add_argument("--step", default=None, help=f"steps to {verb}, e.g. 0-4 (default: all)")


def _selection(args: argparse.Namespace) -> tuple[Optional[list], Optional[list]]:
    """(ranks, steps) of ``--rank``/``--step`` (None where not given).

    Raises:
        ValueError: a malformed list (the message names the option).
    """
    from msprobe.check_ranks import CheckRanksInputError, parse_ranks

    try:
        ranks = list(parse_ranks("--rank", args.rank)) if args.rank is not None else None
        steps = list(parse_ranks("--step", args.step)) if args.step is not None else None
    except CheckRanksInputError as exc:
        raise _SelectionError(str(exc)) from None
    return ranks, steps


def _add_compare(commands) -> None:
    cmp = commands.add_parser("compare", help="find the first divergence between two dumps")
    cmp.add_argument("target", metavar="TARGET", nargs="?", default=None,
                     help="dump path, upstream dump directory or dump.json")
    cmp.add_argument("baseline", metavar="BASELINE", nargs="?", default=None, help="the reference dump")
    cmp.add_argument("-o", "--out", metavar="OUT", default=None, help="output directory (default: no files)")
    cmp.add_argument("-m", "--mode", default="auto",
                     help="auto, md5, statistics or tensor (auto: tensor when both hold tensor data, else "
                          "statistics; upstream's -m auto is the same)")
    cmp.add_argument("--rank", default=None, help="ranks to compare, e.g. 0,2-3")
    cmp.add_argument("--step", default=None, help="steps to compare, e.g. 0-4")
    cmp.add_argument("--tol", default="strict", help="strict, loose, bitwise or DTYPE=RTOL[,...]")
    cmp.add_argument("--loss-scale", default="1", help="divide target backward values by S")
    cmp.add_argument("--first-only", action="store_true",
                     help="stop at each rank's first origin (outputs end there; tensor mode reads no further)")
    cmp.add_argument("--format", default=None, help="comma list of summary,csv,parquet,html,xlsx")
    cmp.add_argument("--mapping", default=None, metavar="MAP.yaml",
                     help="name mapping: our sections api, module, layer, leaf, ignore, or an upstream mapping file")
    cmp.add_argument("--workers", default="1",
                     help="tensor mode: threads reading and measuring leaf pairs, one pair in memory each (1-256)")
    cmp.add_argument("--nan-origin", action="store_true", help="one dump: first call with finite inputs "
                     "and non-finite outputs")
    up = cmp.add_argument_group(
        "upstream spellings (run the same engine; docs/compare-upstream-formats.md)")
    up.add_argument("-i", "--input_path", default=None,
                    help="compare.json: npu_path (= TARGET), bench_path (= BASELINE), optional stack_path, "
                         "is_print_compare_log, rank_id, step_id")
    up.add_argument("-tp", "--target_path", default=None, help="= TARGET")
    up.add_argument("-gp", "--golden_path", default=None, help="= BASELINE")
    up.add_argument("--output_path", dest="out_alias", default=None, metavar="OUT", help="= -o")
    up.add_argument("-s", "--stack_mode", action="store_true", help="accepted: stacks are always reported")
    up.add_argument("-c", "--compare_only", action="store_true",
                    help="accepted: no advisor file is written; the first divergence is always reported")
    up.add_argument("-hl", "--highlight", action="store_true",
                    help="accepted: xlsx rows of origin and propagated calls are always highlighted")
    up.add_argument("-tensor_log", "--is_print_compare_log", action="store_true", help="accepted (no per-call log)")
    up.add_argument("-f", "-fm", "--fuzzy_match", action="store_true", help="accepted: matching is always structural")
    up.add_argument("-da", "--diff_analyze", action="store_true", help="accepted: the first divergence is always found")
    up.add_argument("--xlsx", action="store_true", help="= --format xlsx")
    up.add_argument("-dm", "--data_mapping", default=None, metavar="YAML",
                    help="upstream data_mapping file: {MS data name: PT data name}")
    for flag, long, what in (("-cm", "--cell_mapping", "{ms path.Class or part of it: pt path.Class}"),
                             ("-am", "--api_mapping", "a list of {ms_api, pt_api, ms_args, pt_args, ...}"),
                             ("-lm", "--layer_mapping", "{LayerClass: {ms_attr: pt_attr}}, TopLayer for the root")):
        up.add_argument(flag, long, default=None, metavar="YAML",
                        help=f"upstream {long[2:]} file: {what}; without a file (the next argument does not "
                             f"end in .yaml/.yml) the flag alone is accepted: the built-in table applies")
    cmp.add_argument("--rank-map", default=None, metavar="T:B,...",
                     help="pair TARGET rank T with BASELINE rank B, e.g. 0:1,1:0 (others pair by id)")


def _upstream_args(args: argparse.Namespace) -> None:
    """Fold upstream spellings into TARGET/BASELINE/OUT/format; raises CompareInputError."""
    from msprobe.compare import CompareInputError

    from msprobe.compare.upstream_mapping import load_upstream

    maps = []
    for name in ("layer_mapping", "cell_mapping", "api_mapping", "data_mapping"):
        if getattr(args, name):      # "" (flag without a file): the built-in table applies anyway
            maps.append(load_upstream(getattr(args, name), name))
    if maps:
        from msprobe.compare.mapping import load_mapping

        args.mapping = load_mapping(maps + ([args.mapping] if args.mapping else []))
    if args.input_path:
        _compare_json(args)
    if args.target_path:
        args.target = args.target_path
    if args.golden_path:
        args.baseline = args.golden_path
    if args.out_alias and not args.out:
        args.out = args.out_alias
    if args.xlsx:
        args.format = ",".join(filter(None, [args.format or "summary,csv,parquet,html", "xlsx"]))
    if args.target is None:
        raise CompareInputError("TARGET missing: msprobe compare TARGET BASELINE (or -tp/-gp, or -i compare.json)")


#: upstream's mapping flags whose file is optional (``nargs='?'`` upstream), by spelling
_BARE_FLAGS = {"-am": "--api_mapping", "--api_mapping": "--api_mapping", "-cm": "--cell_mapping",
               "--cell_mapping": "--cell_mapping", "-lm": "--layer_mapping", "--layer_mapping": "--layer_mapping"}


def _bare_mapping_flags(argv: list) -> list:
    """Upstream allows ``-am``, ``-cm`` and ``-lm`` without a file. Ours also has the
    positionals TARGET BASELINE, so ``-am TARGET BASELINE`` would be ambiguous: the next
    argument is the flag's file only if it ends in ``.yaml``/``.yml`` (upstream reads only
    ``.yaml`` files); otherwise the flag stands alone (``--api_mapping=``, the built-in table)."""
    out = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in _BARE_FLAGS:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("-") and nxt.lower().endswith((".yaml", ".yml")):
                out += [a, nxt]
                i += 2
                continue
            out.append(_BARE_FLAGS[a] + "=")
            i += 1
            continue
        if a == "--":
            out.extend(argv[i:])
            break
        out.append(a)
        i += 1
    return out


def _compare_json(args: argparse.Namespace) -> None:
    """Read upstream's compare.json (``-i``): ``npu_path`` → TARGET, ``bench_path`` →
    BASELINE (required, non-empty strings); ``stack_path`` (optional string, must exist;
    stacks are read from the dump directory anyway); ``is_print_compare_log`` (optional
    bool); ``rank_id``/``step_id`` (optional lists of ints, upstream's kernel-compare
    selection; non-empty lists become ``--rank``/``--step`` unless those are given).
    Other keys are ignored, as upstream does. Raises CompareInputError naming the key."""
    from msprobe.compare import CompareInputError

    where = f"-i {args.input_path!r}"
    try:
        spec = json.loads(Path(args.input_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CompareInputError(f"{where}: unreadable compare.json: {exc}") from None
    if not isinstance(spec, dict) or "npu_path" not in spec or "bench_path" not in spec:
        raise CompareInputError(f"{where}: fields 'npu_path' and 'bench_path' are required")
    for key in ("npu_path", "bench_path"):
        if not isinstance(spec[key], str) or not spec[key]:
            raise CompareInputError(f"{where}: field {key!r}: expected a path (string), got {spec[key]!r}")
    stack = spec.get("stack_path")
    if stack is not None and (not isinstance(stack, str) or not Path(stack).is_file()):
        raise CompareInputError(f"{where}: field 'stack_path': expected an existing stack.json, got {stack!r}")
    if not isinstance(spec.get("is_print_compare_log", True), bool):
        raise CompareInputError(f"{where}: field 'is_print_compare_log': expected true or false, "
                                f"got {spec['is_print_compare_log']!r}")
    for key, attr in (("rank_id", "rank"), ("step_id", "step")):
        ids = spec.get(key)
        if ids is None:
            continue
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                for x in ids):
            raise CompareInputError(f"{where}: field {key!r}: expected a list of integers >= 0 like [0, 1], "
                                    f"got {ids!r}")
        if ids and getattr(args, attr) is None:
            setattr(args, attr, ",".join(map(str, ids)))
    args.target, args.baseline = spec["npu_path"], spec["bench_path"]


#: ``--nan-origin`` prints one line per rank without an origin up to this many such ranks,
#: else one line naming them as ranges
_RANK_LINES = 8


def _run_compare(args: argparse.Namespace) -> int:
    from msprobe.compare import CompareInputError, compare
    from msprobe.compare.outputs import console_summary

    try:
        _upstream_args(args)
        if args.nan_origin:
            from msprobe.compare.nan_origin import nan_origin

            if args.baseline is not None:
                raise CompareInputError("--nan-origin takes one dump; got a BASELINE too")
            result = nan_origin(args.target, ranks=args.rank, steps=args.step)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / "summary.json").write_text(json.dumps(result, indent=1))
            clean = [r["rank"] for r in result["ranks"] if not r["first_origin"]]
            for r in result["ranks"]:
                f = r["first_origin"]
                if f:
                    print(f"rank {r['rank']}: first NaN/Inf origin {f['name']} (step {f['step']}, "
                          f"{f['direction']}) in {f['module'] or '(top level)'}")
                elif len(clean) <= _RANK_LINES:
                    print(f"rank {r['rank']}: no NaN/Inf origin")
            if len(clean) > _RANK_LINES:
                from store.replicas import group_text

                print(f"ranks {group_text(clean)}: no NaN/Inf origin")
            for line in result["notices"]:
                print(line, file=sys.stderr)
            # 1 when an origin was found; infinities that never come from finite inputs (a
            # causal mask built with float("-inf")) are intended and leave the status 0;
            # 3 when none was found but part of the dump was not read
            if any(r["first_origin"] for r in result["ranks"]):
                return 1
            return 3 if result["notices"] else 0
        if args.baseline is None:
            raise CompareInputError("BASELINE missing: msprobe compare TARGET BASELINE (or TARGET --nan-origin)")
        from msprobe.progress import Progress

        with Progress("msprobe compare", unit="stage") as bar:
            result = compare(args.target, args.baseline, out=args.out, mode=args.mode, tol=args.tol,
                             loss_scale=args.loss_scale, rank=args.rank, step=args.step,
                             first_only=args.first_only, formats=args.format, mapping=args.mapping,
                             rank_map=args.rank_map, workers=args.workers, progress=bar.advance,
                             keep_tables=args.out is not None)
    except CompareInputError as exc:
        print(f"msprobe compare: error: {exc}", file=sys.stderr)
        return 2
    _print_notices(result.notices)
    print(console_summary(result.summary))
    return result.exit_code


def _text(value: Any, *, null: str) -> str:
    if value is None:
        return null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def format_table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned text columns: header, a dashed rule, one line per row; NULL for null.

    >>> print(format_table(["a", "bb"], [[1, None]]))
    a | bb
    --+-----
    1 | NULL
    """
    cells = [[_text(value, null="NULL") for value in row] for row in rows]
    widths = [len(name) for name in names]
    for row in cells:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row)]
    lines = [" | ".join(name.ljust(width) for name, width in zip(names, widths)).rstrip()]
    lines.append("-+-".join("-" * width for width in widths))
    for row in cells:
        lines.append(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _format_csv(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    for row in rows:
        writer.writerow([_text(value, null="") for value in row])
    return out.getvalue().rstrip("\n")


def _write_pt(path: Path, payload: Any) -> None:
    """Tensor-file callback for PyTorch dumps; imports torch only when a tensor is written."""
    from msprobe.pytorch.payload import write_pt

    write_pt(path, payload)


_SKIP_LINE = re.compile(r"^((TARGET|BASELINE): )?skipped ")


def _print_notices(lines: Sequence[str]) -> None:
    """Print on stderr what a command did not read as data (damaged log batches, torn
    tails, missing or damaged payload shards, unverified logs), one line each, followed by
    a count: a result computed without them is partial."""
    for line in lines:
        print(line, file=sys.stderr)
    skipped = sum(1 for line in lines if _SKIP_LINE.match(line))
    if skipped:
        print(f"warning: {skipped} part(s) of the dump were skipped (above); the result is partial",
              file=sys.stderr)


def _run_export(args: argparse.Namespace) -> int:
    from msprobe.kernel_dump.ingest import ingest_if_missing

    ranks, steps = _selection(args)
    try:
        kernels = ingest_if_missing(args.dump_path)   # a MindSpore kernel dump (L2) not yet in the log
    except ValueError as exc:   # a malformed statistic.csv
        print(f"msprobe export: error: {exc}", file=sys.stderr)
        return 2
    if kernels is not None:
        kernel_steps = "; ".join(f"rank {r}: steps {', '.join(map(str, s))}" for r, s in sorted(kernels.steps.items()))
        print(f"read {kernels.calls} kernels ({kernels.tensors} tensors) of MindSpore's kernel dump into the log"
              + (f" ({kernel_steps})" if kernel_steps else ""))
    if args.tensorboard is not None:
        from msprobe.report.tensorboard import write_tensorboard

        try:
            written = write_tensorboard(args.dump_path, args.tensorboard, ranks=ranks, steps=steps)
        except ImportError as exc:
            print(f"msprobe export: error: {exc}", file=sys.stderr)
            return 2
        for rank, points in written.items():
            print(f"wrote {Path(args.tensorboard) / f'rank{rank}'} ({points} scalars)")
        if args.out is None:
            return 0
    from msprobe.core.npy_payload import write_npy
    from msprobe.progress import Progress
    from store.export import export_log

    with Progress("msprobe export", unit="dir") as bar:
        report = export_log(args.dump_path, args.out, tensor_writers={"pytorch": _write_pt, "mindspore": write_npy},
                            progress=bar.advance, ranks=ranks, steps=steps)
    directories: list[Path] = []
    for path in report.written:
        if path.parent not in directories:
            directories.append(path.parent)
    for directory in directories:
        names = ", ".join(p.name for p in report.written if p.parent == directory)
        print(f"wrote {directory} ({names})")
    _print_notices(report.notices())
    if not report.written:
        print("nothing to export")
    return 0


def _run_compact(args: argparse.Namespace) -> int:
    from store.compact import compact, follow
    from store.log_reader import notices

    def show(report) -> None:
        for path, rows in zip(report.written, report.rows):
            print(f"wrote {path} ({rows} rows)", flush=True)
        _print_notices(notices(report.skipped))

    if args.follow:
        if not args.interval > 0:
            print(f"msprobe compact: error: --interval: got {args.interval}; expected seconds > 0", file=sys.stderr)
            return 2
        from store.errors import LogNotFoundError
        from store.log_reader import find_log_files

        try:
            find_log_files(args.dump_path)
        except LogNotFoundError:   # the run has not started yet, or the path is mistyped
            print(f"msprobe compact: waiting for a log under {Path(args.dump_path) / '.msprobe' / 'log'} "
                  "(Ctrl-C stops)", file=sys.stderr, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            follow(args.dump_path, args.out, interval=args.interval, report=show)
        return 0
    report = compact(args.dump_path, args.out)
    show(report)
    if report.pending:
        print(f"left in the log: {report.pending} rows of steps not finished yet")
    if report.archivable:
        print(f"log files wholly in parts (may be archived): {', '.join(report.archivable)}")
    return 0


def _run_check_ranks(args: argparse.Namespace) -> int:
    from msprobe.check_ranks import CheckRanksInputError, check_ranks, format_report, parse_ranks

    try:
        groups = [list(parse_ranks("--group", g)) for g in args.group] if args.group else None
        steps = list(parse_ranks("--step", args.step)) if args.step is not None else None
        try:
            tol = float(args.tol)
        except ValueError:
            raise CheckRanksInputError(f"--tol: got {args.tol!r}; expected a finite number >= 0") from None
        result = check_ranks(args.dump_path, groups=groups, steps=steps, all_calls=args.all_calls, tol=tol)
    except CheckRanksInputError as exc:
        print(f"msprobe check-ranks: error: {exc}", file=sys.stderr)
        return 2
    _print_notices(result.notices)
    print(format_report(result))
    return result.exit_code


def _run_query(args: argparse.Namespace) -> int:
    from msprobe.compare.outputs import is_compare_output, query_outputs
    from store.query import query

    if args.format == "parquet" and not args.out:
        print("msprobe query: error: --format parquet writes a file: give -o FILE", file=sys.stderr)
        return 2
    here = Path(args.dump_path)
    if (here / "summary.json").is_file() and not (here / ".msprobe").is_dir() and not is_compare_output(here):
        print(f"msprobe query: error: {str(here)!r} is an output directory of msprobe compare (summary.json) "
              f"without its tables in Parquet or CSV (tensors, calls, alignment), so there is nothing to query; "
              f"rerun the compare with --format parquet (or csv) and -o {str(here)!r}, or query the dump path "
              f"of one of the compared runs", file=sys.stderr)
        return 2
    if is_compare_output(here) and not (here / ".msprobe").is_dir():
        if args.rank is not None or args.step is not None:
            print(f"msprobe query: error: {str(here)!r} is an output directory of msprobe compare: --rank/--step "
                  "choose the files of a dump path; select rows in the SQL instead (WHERE rank = ... AND step = ...)",
                  file=sys.stderr)
            return 2
        table = query_outputs(here, args.sql)   # an OUT directory of msprobe compare
    else:
        notices: list[str] = []
        ranks, steps = _selection(args)
        table = query(args.dump_path, args.sql, ranks=ranks, steps=steps, notices=notices)
        _print_notices(notices)
    names = table.column_names
    columns = [table.column(name).to_pylist() for name in names]
    rows = list(zip(*columns)) if columns else []
    if args.format == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, args.out)
        print(f"wrote {args.out} ({table.num_rows} rows)")
        return 0
    if args.format == "json":
        text = json.dumps([dict(zip(names, row)) for row in rows], indent=1, default=str)
    elif args.format == "csv":
        text = _format_csv(names, rows)
    else:
        text = format_table(names, rows)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.out} ({table.num_rows} rows)")
        return 0
    print(text)
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from msprobe.progress import Progress
    from msprobe.report import write_report

    notices: list[str] = []
    with Progress("msprobe report", unit="part") as bar:
        try:
            ranks, steps = _selection(args)
            path = write_report(args.dump_path, args.out, progress=bar.advance, threshold=args.threshold,
                                jump=args.jump, max_rows=args.max_rows, max_steps=args.max_steps,
                                max_ranks=args.max_ranks,
                                ranks=ranks, steps=steps, notices=notices)
        except ValueError as exc:
            print(f"msprobe report: error: {exc}", file=sys.stderr)
            return 2
    _print_notices(notices)
    print(f"wrote {path}")
    return 0


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): no message, and stdout pointed at
    devnull so that the interpreter's flush at exit does not fail again on the rest of the
    buffer (the recipe of Python's signal module docs, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):   # stdout without a file descriptor (captured in a test)
        pass
    return EXIT_STDOUT_CLOSED


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``msprobe`` command line; returns the exit status (0 ok, 2 error, 141 stdout
    closed early).

    Args:
        argv: arguments without the program name; None means ``sys.argv[1:]``.
    """
    try:
        status = _main(argv)
        sys.stdout.flush()   # a closed pipe shows here, not in the interpreter's flush at exit
    except BrokenPipeError:
        return _stdout_closed()
    return status


def _main(argv: Optional[Sequence[str]]) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] in ("-f", "--framework") and argv[1] in ("pytorch", "mindspore"):
        argv = argv[2:]  # upstream's "msprobe -f pytorch compare ..."
    if argv and argv[0] == "compare":
        argv = ["compare"] + _bare_mapping_flags(argv[1:])
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage error (2) or --help (0)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        if args.command == "export":
            return _run_export(args)
        if args.command == "compact":
            return _run_compact(args)
        if args.command == "compare":
            return _run_compare(args)
        if args.command == "check-ranks":
            return _run_check_ranks(args)
        if args.command == "report":
            return _run_report(args)
        return _run_query(args)
    except BrokenPipeError:
        raise   # stdout closed early: main() ends quietly
    except _SelectionError as exc:
        print(f"msprobe {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (StoreError, OSError) as exc:
        print(f"msprobe {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
