#!/usr/bin/env python
"""Overhead benchmark: how much slower does a training step get with msprobe recording?

Runs one workload in fresh subprocesses, interleaving the configurations (A B C ... A B C ...)
so that drift in machine load hits every configuration alike, several runs each, and prints
per configuration: median step time, ratio to the uninstrumented run, peak RSS, bytes written
per step and dump.json entries recorded per step.

    .venv/bin/python benchmarks/overhead.py --workload encoder --runs 5
    .venv/bin/python benchmarks/overhead.py --workload dispatch --configs l1_stats,mix_stats,l1_md5,mix_stopped,mix_finished
    .venv/bin/python benchmarks/overhead.py --layers 2,4,8 --configs none,l1_stats
    MSPROBE_UPSTREAM_PYTHON=/work/venv-upstream/bin/python .venv/bin/python benchmarks/overhead.py

See benchmarks/README.md for what each number means.  A script, not a test: pytest does not
collect it.
"""

import argparse
import datetime
import json
import os
import platform
import random
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from workloads import CONFIGS  # noqa: E402  (benchmarks/ only; never the msprobe package)

CONFIG_ORDER = ["none", "l1_stats", "mix_stats", "l1_md5", "mix_md5", "l0_params_md5", "l1_tensor", "mix_stopped",
                "mix_finished"]
CONFIG_LABELS = {
    "none": "uninstrumented",
    "l1_stats": "L1 statistics",
    "mix_stats": "mix statistics",
    "l1_md5": "L1 md5",
    "mix_md5": "mix md5",
    "l0_params_md5": "L0 md5, data_mode forward+input",
    "l1_tensor": "L1 tensor",
    "mix_stopped": "mix, hooks installed, stopped",
    "mix_finished": "mix, steps after the last step of `step`",
}


# --------------------------------------------------------------------------------------------
# Running one child
# --------------------------------------------------------------------------------------------

def child_env(impl):
    """Environment for a child: ours gets the repository on PYTHONPATH, upstream gets none."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONSTARTUP", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if impl == "ours":
        env["PYTHONPATH"] = REPO_ROOT
    return env


def busy_cpu_seconds():
    """Busy CPU seconds of the whole machine so far (from /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / float(os.sysconf("SC_CLK_TCK"))


def count_tensors(node):
    """Tensor records (dicts with ``"type": "torch.Tensor"``) anywhere in a dump.json value."""
    if isinstance(node, dict):
        if node.get("type") == "torch.Tensor":
            return 1
        return sum(count_tensors(v) for v in node.values())
    if isinstance(node, list):
        return sum(count_tensors(v) for v in node)
    return 0


def dump_stats(dump_path):
    """(bytes on disk, counting hard-linked files once; list of entry counts per dump.json;
    list of tensor record counts per dump.json)."""
    total, seen, entries, tensors = 0, set(), [], []
    if not os.path.isdir(dump_path):
        return 0, entries, tensors
    for root, _dirs, files in os.walk(dump_path):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_size
            rel = os.path.relpath(full, dump_path).split(os.sep)
            if name == "dump.json" and len(rel) == 3 and rel[0].startswith("step"):
                try:
                    with open(full) as f:
                        data = json.load(f).get("data", {})
                    entries.append(len(data))
                    tensors.append(count_tensors(data))
                except (OSError, ValueError):
                    entries.append(None)
                    tensors.append(None)
    return total, entries, tensors


def drop_caches():
    """``sync``, then drop the clean page cache (``/proc/sys/vm/drop_caches``: Linux, root),
    so that every child starts with the same empty cache (see benchmarks/README.md, "The
    page cache").

    Raises:
        SystemExit: the file cannot be written (not Linux, or not root).
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as exc:
        raise SystemExit(f"--drop-caches: cannot write /proc/sys/vm/drop_caches ({exc}); it needs Linux and root")


def run_child(python, impl, workload, layers, config, args, scratch_root, trash):
    """Run one measurement in a fresh process; returns a dict (with 'error' on failure).
    Its scratch directory is kept (``res["scratch"]``) with --keep-dumps, else handed to
    ``trash`` (a :class:`Trash`), also when the run is interrupted meanwhile."""
    scratch = tempfile.mkdtemp(prefix="%s-%s-%s-" % (impl, config, layers), dir=scratch_root)
    res = None
    try:
        res = _measure(python, impl, workload, layers, config, args, scratch)
        return res
    finally:
        if args.keep_dumps:
            if res is not None:
                res["scratch"] = scratch
        else:  # the disk check only after a complete child (an interrupted one has no size)
            trash.add(scratch, res["dump_bytes"] if res is not None else 0, check=res is not None)


def _measure(python, impl, workload, layers, config, args, scratch):
    """:func:`run_child` in the scratch directory ``scratch``."""
    # The child runs a copy of workloads.py from the scratch directory, with cwd there, so the
    # repository is not on sys.path (sys.path[0] is the script's directory) unless PYTHONPATH
    # puts it there (ours only).
    script = os.path.join(scratch, "workloads.py")
    shutil.copy(os.path.join(HERE, "workloads.py"), script)
    dump_path = os.path.join(scratch, "dump")
    result_path = os.path.join(scratch, "result.json")
    cmd = [
        python, script, "--workload", workload, "--layers", str(layers), "--config", config,
        "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device,
        "--dump-path", dump_path,
        "--config-path", os.path.join(scratch, "config.json"), "--repo-root", REPO_ROOT,
        "--result", result_path,
    ]
    if not args.import_dynamo:
        cmd.append("--no-import-dynamo")
    if args.drop_caches:
        drop_caches()
    busy0, ru0 = busy_cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=child_env(impl), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=args.timeout)
        out, rc = proc.stdout.decode("utf-8", "replace"), proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = (exc.stdout or b"").decode("utf-8", "replace") + "\n[timed out]", -1
    wall = time.perf_counter() - t0
    busy1, ru1 = busy_cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    # CPU seconds per second used by everything else on the machine while the child ran.
    foreign = max(0.0, (busy1 - busy0) - child_cpu) / wall if busy0 is not None and busy1 is not None else None
    res = {}
    if rc == 0 and os.path.exists(result_path):
        with open(result_path) as f:
            res = json.load(f)
    else:
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        res["error"] = "rc=%s: %s" % (rc, lines[-1] if lines else "(no output)")
        res["output_tail"] = "\n".join(lines[-30:])
    res["wall_s"] = wall
    res["foreign_cores"] = foreign
    nbytes, entries, tensors = dump_stats(dump_path)
    res["dump_bytes"] = nbytes
    res["dump_entries"] = entries
    res["dump_tensors"] = tensors
    if impl == "upstream" and res.get("msprobe_file") and os.path.realpath(res["msprobe_file"]).startswith(
            os.path.realpath(REPO_ROOT) + os.sep):
        res["error"] = "upstream child imported msprobe from this repository: %s" % res["msprobe_file"]
    return res


class Trash:
    """Child scratch directories to delete at the end of the run, not after each child.

    Why: on an ext4 file system without a journal (the benchmark VM's root file system) the
    kernel will not reuse an inode freed less than 60 s ago (360 s while its inode-table
    block is dirty), and every file created meanwhile walks past each such inode
    (``recently_deleted`` in ``fs/ext4/ialloc.c``): after one tensor child's dump (about a
    thousand files) is deleted, creating a file took 400 us instead of 16-37 us, which the
    next children's writers paid (benchmarks/RESULTS.md, section "AMD EPYC AVX-512 VM:
    ten runs of the issue's benchmark; deleted dumps and file creation"). A training run does
    not delete files while it records, so deletions are put off until the run ends, or
    until the scratch file system's free space falls below ``reserve`` bytes plus twice the
    largest dump seen (room for the next child's dump, which may grow larger than any
    before it; then they are deleted at once and counted in ``deleted_early``). The kept
    dumps' small files stay in the page cache meanwhile (see benchmarks/README.md).

    Args:
        root: the scratch root (its file system's free space is checked).
        reserve: bytes to leave free besides the largest dump (unit: bytes).
    """

    def __init__(self, root, reserve=4 << 30):
        self.root, self.reserve = root, reserve
        self.paths, self.largest, self.deleted_early = [], 0, 0

    def add(self, path, nbytes, check=True):
        """Put off deleting ``path`` (a child's scratch directory holding ``nbytes`` bytes);
        ``check``: delete everything put off now if the scratch disk runs short."""
        self.paths.append(path)
        self.largest = max(self.largest, nbytes)
        if check and shutil.disk_usage(self.root).free < self.reserve + 2 * self.largest:
            self.deleted_early += len(self.paths)
            self.empty()

    def empty(self):
        """Delete every directory put off so far."""
        for path in self.paths:
            shutil.rmtree(path, ignore_errors=True)
        self.paths = []


# --------------------------------------------------------------------------------------------
# Aggregation and printing
# --------------------------------------------------------------------------------------------

def summarise(runs):
    """Aggregate the runs of one (impl, workload, layers, config)."""
    ok = [r for r in runs if "error" not in r and "skipped" not in r]
    s = {"n_ok": len(ok), "n": len(runs)}
    skipped = [r["skipped"] for r in runs if "skipped" in r]
    if skipped:
        s["skipped"] = skipped[0]
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        s["error"] = errors[0]
        s["output_tail"] = next(r.get("output_tail", "") for r in runs if "error" in r)
    if not ok:
        return s
    per_run = [statistics.median(r["step_times"]) for r in ok]
    s["step_s"] = statistics.median(per_run)
    s["step_s_min"], s["step_s_max"] = min(per_run), max(per_run)
    s["dbg_s"] = statistics.median(statistics.median(r["debugger_call_times"]) for r in ok)
    s["cpu_s"] = statistics.median(statistics.median(r["cpu_times"]) for r in ok)
    s["peak_rss_mib"] = statistics.median(
        (r.get("vm_hwm_kib") or r["ru_maxrss_kib"]) for r in ok) / 1024.0
    s["rss_growth_mib"] = statistics.median(
        (r["rss_kib_per_step"][-1] - r["rss_kib_per_step"][0]) for r in ok) / 1024.0
    steps = ok[0]["recorded_steps"] or (len(ok[0]["step_times"]) + 1)
    s["bytes_per_step"] = statistics.median(r["dump_bytes"] for r in ok) / steps
    ents = [e for r in ok for e in r["dump_entries"] if e is not None]
    s["entries_per_step"] = statistics.median(ents) if ents else 0
    tens = [e for r in ok for e in r.get("dump_tensors", []) if e is not None]
    s["tensors_per_step"] = statistics.median(tens) if tens else 0
    s["losses"] = ok[0]["losses"]
    s["msprobe_file"] = ok[0].get("msprobe_file")
    return s


def paired_ratio(runs, base_runs):
    """Median over rounds of (this configuration's run median step / the uninstrumented run
    median step of the same round): rounds interleave the configurations, so a round in
    which the whole machine ran slow cancels out. Rounds in which either run failed are
    left out; None when no round has both."""
    ratios = [statistics.median(r["step_times"]) / statistics.median(b["step_times"])
              for r, b in zip(runs, base_runs) if r.get("step_times") and b.get("step_times")]
    return statistics.median(ratios) if ratios else None


def ratio_interval(runs, base_runs, level=0.9, draws=4000, seed=0):
    """Bootstrap interval of the ratio of medians: ``(low, high)``, the central ``level``
    share of ``median(resampled run medians) / median(resampled uninstrumented run
    medians)`` over ``draws`` resamplings (with replacement, each side on its own, fixed
    ``seed``: the same runs give the same interval). It shows how far the ratio of eight
    runs can move when processes differ as much as they do on a noisy VM. None with fewer
    than three good runs on either side.

    Raises:
        ValueError: ``level`` not strictly between 0 and 1, or ``draws`` < 1.
    """
    if not 0.0 < level < 1.0 or draws < 1:
        raise ValueError("ratio_interval: level must be in (0, 1) and draws >= 1, got %r, %r" % (level, draws))
    mine = [statistics.median(r["step_times"]) for r in runs if r.get("step_times")]
    base = [statistics.median(b["step_times"]) for b in base_runs if b.get("step_times")]
    if len(mine) < 3 or len(base) < 3:
        return None
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(mine, k=len(mine))) /
                    statistics.median(rng.choices(base, k=len(base))) for _ in range(draws))
    tail = (1.0 - level) / 2.0
    return ratios[int(tail * draws)], ratios[min(draws - 1, int((1.0 - tail) * draws))]


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024.0


def table(summaries, impls, configs):
    """Markdown table for one (workload, layers): summaries[(impl, config)] -> summary."""
    head = ["configuration"]
    for impl in impls:
        head += ["%s step ms" % impl, "%s ratio" % impl, "%s ratio 90%% interval" % impl,
                 "%s paired ratio" % impl, "%s CPU ratio" % impl,
                 "%s peak RSS MiB" % impl,
                 "%s bytes/step" % impl, "%s entries/step" % impl,
                 "%s µs/entry" % impl, "%s tensors/step" % impl, "%s µs/tensor" % impl]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cfg in configs:
        row = [CONFIG_LABELS.get(cfg, cfg)]
        for impl in impls:
            s = summaries.get((impl, cfg), {})
            base = summaries.get((impl, "none"), {})
            if "step_s" not in s:
                why = "skipped" if "skipped" in s else ("failed" if "error" in s else "—")
                row += [why, "", "", "", "", "", "", "", "", "", ""]
                continue
            ms = "%.0f (%.0f–%.0f)" % (s["step_s"] * 1e3, s["step_s_min"] * 1e3, s["step_s_max"] * 1e3)
            ratio = "%.2f" % (s["step_s"] / base["step_s"]) if "step_s" in base else "?"
            paired = "%.2f" % s["paired"] if s.get("paired") is not None else "?"
            interval = "%.2f–%.2f" % s["interval"] if s.get("interval") is not None and cfg != "none" else ""
            cpu_ratio = "%.2f" % (s["cpu_s"] / base["cpu_s"]) if "cpu_s" in base else "?"
            rss = "%.0f" % s["peak_rss_mib"]
            if "peak_rss_mib" in base and cfg != "none":
                rss += " (%+.0f%%)" % (100.0 * (s["peak_rss_mib"] / base["peak_rss_mib"] - 1))
            per_entry = per_tensor = ""
            if "step_s" in base and CONFIGS[cfg][3] == "record":  # per recorded entry: recording steps only
                extra_us = (s["step_s"] - base["step_s"]) * 1e6
                if s["entries_per_step"]:
                    per_entry = "%.1f" % (extra_us / s["entries_per_step"])
                if s["tensors_per_step"]:
                    per_tensor = "%.1f" % (extra_us / s["tensors_per_step"])
            row += [ms, ratio, interval, paired, cpu_ratio, rss,
                    fmt_bytes(s["bytes_per_step"]) if cfg != "none" else "",
                    "%.0f" % s["entries_per_step"] if cfg != "none" else "",
                    per_entry, "%.0f" % s["tensors_per_step"] if cfg != "none" else "", per_tensor]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def machine_line():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        avail = len(os.sched_getaffinity(0))
    except AttributeError:
        avail = os.cpu_count()
    return "%s, %s cores available (%s logical CPUs), %s" % (
        model, avail, os.cpu_count(), platform.platform())


def memory_line():
    """Memory and page-cache state from ``/proc/meminfo`` (Linux; None elsewhere). The tensor
    task's files are written through the page cache where they are small, and a full cache
    makes every new page cost a reclaim: the same code measured 557 ms per step right after
    dropping the caches against 778 ms with 18 of 24 GB cached (benchmarks/RESULTS.md,
    section "Intel Xeon VM: the page cache and the tensor task"). Record it beside every result."""
    try:
        with open("/proc/meminfo") as f:
            info = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
    except (OSError, ValueError, IndexError):
        return None
    gib = 1 << 20  # /proc/meminfo counts KiB
    return "memory: %.1f GiB total, %.1f GiB free, %.1f GiB page cache, %.1f GiB dirty" % (
        info.get("MemTotal", 0) / gib, info.get("MemFree", 0) / gib, info.get("Cached", 0) / gib,
        info.get("Dirty", 0) / gib)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description="msprobe overhead benchmark (see benchmarks/README.md)")
    p.add_argument("--workload", default="encoder", choices=["encoder", "dispatch", "lm"],
                   help="encoder: compute-bound on a CPU; dispatch: the encoder shrunk to d_model 32, "
                        "4 heads, feed-forward 128, batch 2 x 16, where the host time per recorded call "
                        "decides the step time (as on a GPU); lm: the char-LM example")
    p.add_argument("--layers", default="4",
                   help="encoder layer counts, comma separated (e.g. 2,4,8); ignored for lm")
    p.add_argument("--configs", default=",".join(CONFIG_ORDER),
                   help="comma separated, from: %s (none is always added)" % ", ".join(CONFIG_ORDER))
    p.add_argument("--runs", type=int, default=5, help="fresh processes per configuration")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per process (after 1 warm-up); default 5, 40 for dispatch")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads in the child; default 2, 1 for dispatch")
    p.add_argument("--device", default="cpu",
                   help="torch device of the encoder workload (cpu; cuda on a GPU machine: each step "
                        "ends with torch.cuda.synchronize())")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for our msprobe (default: this one); the repository is put "
                        "on its PYTHONPATH")
    p.add_argument("--upstream-python", default=os.environ.get("MSPROBE_UPSTREAM_PYTHON"),
                   help="interpreter with mindstudio-probe installed (default: $MSPROBE_UPSTREAM_PYTHON)")
    p.add_argument("--no-ours", action="store_true", help="run only the upstream interpreter")
    p.add_argument("--ours-configs", default=None,
                   help="restrict our package to these configurations (e.g. none while it is unfinished)")
    p.add_argument("--no-import-dynamo", dest="import_dynamo", action="store_false",
                   help="do not import torch._dynamo first in every child (upstream 1.2.2 then "
                        "crashes in optimizer.step)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    p.add_argument("--scratch", default=None,
                   help="directory for dumps (default: a temporary directory on local disk)")
    p.add_argument("--keep-dumps", action="store_true")
    p.add_argument("--drop-caches", action="store_true",
                   help="sync and drop the page cache before every child (Linux, root): runs made at "
                        "different times then start from the same state")
    p.add_argument("--json", dest="json_out",
                   help="write all raw results as JSON here (rewritten after every process)")
    p.add_argument("--report", metavar="JSON",
                   help="run nothing: print (and with --write-results append) the table for a "
                        "JSON file written by --json")
    p.add_argument("--write-results", action="store_true",
                   help="append a section to benchmarks/RESULTS.md")
    p.add_argument("--quiet", action="store_true", help="no per-process progress lines")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 40 if args.workload == "dispatch" else 5
    if args.threads is None:
        args.threads = 1 if args.workload == "dispatch" else 2
    return args


def render(raw, meta):
    """The printed/appended text for raw results; meta as saved in the JSON file."""
    header = [
        "machine: %s" % meta["machine"],
    ]
    if meta.get("memory"):
        header.append("%s (at the start)" % meta["memory"])
    header += [
        "date: %s" % meta["date"],
        "command: `%s`" % meta["command"],
        "workload: %s on %s, %d run(s) x %d timed step(s) after 1 warm-up, torch threads %d, "
        "torch._dynamo imported first: %s, elapsed %.0f s%s" % (
            meta["workload"], meta.get("device", "cpu"), meta["runs_done"], meta["steps"], meta["threads"],
            "yes" if meta["import_dynamo"] else "no", meta["elapsed_s"],
            "" if meta["runs_done"] == meta["runs"] else " (interrupted: %d of %d rounds complete)" % (
                meta["runs_done"], meta["runs"])),
    ]
    if meta.get("deleted_early"):
        header.append("dumps deleted during the run (scratch disk nearly full): %d; file creation after "
                      "deletions is slower on some file systems (benchmarks/README.md, \"Deleted dumps\")"
                      % meta["deleted_early"])
    loads = [r["foreign_cores"] for rs in raw.values() for r in rs if r.get("foreign_cores") is not None]
    if loads:
        header.append("other load on the machine while children ran: median %.2f, max %.2f CPUs busy (%s)" % (
            statistics.median(loads), max(loads),
            "machine was shared: wall-clock ratios are noisy, compare the CPU ratios too"
            if max(loads) > 0.25 else "quiet"))
    blocks = []
    impl_names = [name for name, _cfgs in meta["impls"]]
    for layers in meta["layers"]:
        summaries = {}
        for impl, impl_cfgs in meta["impls"]:
            for cfg in impl_cfgs:
                summaries[(impl, cfg)] = summarise(raw.get((impl, layers, cfg), []))
                summaries[(impl, cfg)]["paired"] = paired_ratio(raw.get((impl, layers, cfg), []),
                                                                raw.get((impl, layers, "none"), []))
                summaries[(impl, cfg)]["interval"] = ratio_interval(raw.get((impl, layers, cfg), []),
                                                                    raw.get((impl, layers, "none"), []))
        title = "%s%s" % (meta["workload"], " (%d layers)" % layers if layers else "")
        notes = []
        for (impl, cfg), s in sorted(summaries.items()):
            if "error" in s:
                notes.append("- %s %s: %d/%d runs failed: %s" % (impl, cfg, s["n"] - s["n_ok"], s["n"],
                                                                 s["error"]))
            if s.get("rss_growth_mib", 0) > 16:
                notes.append("- %s %s: RSS grew %.0f MiB from the first to the last timed step" % (
                    impl, cfg, s["rss_growth_mib"]))
        block = "#### %s\n\n%s" % (title, table(summaries, impl_names, meta["configs"]))
        if notes:
            block += "\n\n" + "\n".join(notes)
        blocks.append(block)
    text = "\n".join(header) + "\n\n" + "\n\n".join(blocks) + "\n"
    text += ("\nstep ms: median over runs of each run's median step (min–max of the run medians); "
             "ratio: step time / the same interpreter's uninstrumented step time; ratio 90% interval: "
             "bootstrap over the runs of both (how far the ratio moves when other processes are drawn); "
             "paired ratio: median "
             "over rounds of the run's median step / the uninstrumented run's of the same round; CPU ratio: the "
             "same for process CPU time per step; peak RSS: VmHWM of the child (change vs "
             "uninstrumented); bytes/step: size of dump_path / recorded steps (warm-up included); "
             "entries/step: median number of keys in step*/rank*/dump.json; µs/entry, µs/tensor: "
             "(step time - uninstrumented step time) / entries (tensor records) per step, the recorder's "
             "host time per recorded call (tensor).\n")
    return text


def save_json(path, raw, meta):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "results": [
            {"impl": k[0], "layers": k[1], "config": k[2], "runs": v} for k, v in raw.items()]},
            f, indent=1)
    os.replace(tmp, path)


def load_json(path):
    with open(path) as f:
        doc = json.load(f)
    raw = {(r["impl"], r["layers"], r["config"]): r["runs"] for r in doc["results"]}
    return raw, doc["meta"]


def write_results(text, workload):
    path = os.path.join(HERE, "RESULTS.md")
    new = not os.path.exists(path)
    with open(path, "a") as f:
        if new:
            f.write("# Overhead benchmark results\n\nAppended by `benchmarks/overhead.py "
                    "--write-results`; newest last.\n")
        f.write("\n## %s, %s\n\n%s" % (workload, datetime.date.today().isoformat(), text))
    print("appended to %s" % os.path.relpath(path, os.getcwd()))


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        raw, meta = load_json(args.report)
        text = render(raw, meta)
        print(text)
        if args.write_results:
            write_results(text, meta["workload"])
        return 0

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit("unknown configuration %r; known: %s" % (c, ", ".join(CONFIG_ORDER)))
    if "none" not in configs:
        configs.insert(0, "none")
    configs = [c for c in CONFIG_ORDER if c in configs]
    layer_counts = [int(x) for x in args.layers.split(",")] if args.workload != "lm" else [0]

    impls = []  # (name, python, configs)
    if not args.no_ours:
        ours_cfgs = configs
        if args.ours_configs:
            keep = set(c.strip() for c in args.ours_configs.split(",")) | {"none"}
            ours_cfgs = [c for c in configs if c in keep]
        impls.append(("ours", args.python, ours_cfgs))
    if args.upstream_python:
        if not os.path.exists(args.upstream_python):
            raise SystemExit("MSPROBE_UPSTREAM_PYTHON=%s does not exist" % args.upstream_python)
        impls.append(("upstream", args.upstream_python, configs))
    if not impls:
        raise SystemExit("nothing to run (--no-ours without an upstream interpreter)")

    cmd = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO_ROOT)] + sys.argv[1:])
    cmd = "python " + cmd
    if args.upstream_python and "MSPROBE_UPSTREAM_PYTHON" in os.environ:
        cmd = "MSPROBE_UPSTREAM_PYTHON=%s %s" % (os.environ["MSPROBE_UPSTREAM_PYTHON"], cmd)
    started = time.time()
    meta = {
        "machine": machine_line(),
        "memory": memory_line(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": cmd,
        "workload": args.workload, "runs": args.runs, "runs_done": 0, "steps": args.steps,
        "threads": args.threads, "device": args.device, "import_dynamo": args.import_dynamo, "elapsed_s": 0.0,
        "layers": layer_counts, "configs": configs,
        "impls": [[name, cfgs] for name, _py, cfgs in impls],
        "pythons": {name: py for name, py, _cfgs in impls},
    }

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    # SIGTERM (and SIGINT, which shells ignore in background jobs) end the run early and
    # report the complete rounds; subprocess.run kills the running child on the way out.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    scratch_root = args.scratch or tempfile.mkdtemp(prefix="msprobe-bench-")
    os.makedirs(scratch_root, exist_ok=True)
    trash = Trash(scratch_root)
    raw = {}  # (impl, layers, config) -> [results]
    skipped_workload = None
    try:
        try:
            skipped_workload = _run_rounds(args, impls, layer_counts, configs, raw, meta, started,
                                           scratch_root, trash)
        except KeyboardInterrupt:
            print("interrupted; reporting the complete rounds so far", file=sys.stderr)
            # keep only complete rounds so every configuration has the same number of runs
            for key in raw:
                raw[key] = raw[key][:meta["runs_done"]]
        finally:
            meta["deleted_early"] = trash.deleted_early
            # from here on a second SIGTERM/SIGINT must not cut the report or the cleanup short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return _report(raw, meta, args, impls, layer_counts, skipped_workload, started)
    finally:  # after the report (deleting many GB takes a while), and after any error too
        trash.empty()
        if not args.scratch and not args.keep_dumps:
            shutil.rmtree(scratch_root, ignore_errors=True)


def _run_rounds(args, impls, layer_counts, configs, raw, meta, started, scratch_root, trash):
    """:func:`main`'s measurements: ``args.runs`` rounds, each running every configuration
    (and interpreter) once, interleaved; results are appended to ``raw`` (and saved with
    --json after every child), ``meta["runs_done"]`` counts the complete rounds. Returns
    the reason the workload was skipped, or None."""
    for run in range(args.runs):
        for layers in layer_counts:
            # Interleave: every configuration (and interpreter) once per round.
            for cfg in configs:
                for impl, python, impl_cfgs in impls:
                    if cfg not in impl_cfgs:
                        continue
                    res = run_child(python, impl, args.workload, layers, cfg, args, scratch_root, trash)
                    raw.setdefault((impl, layers, cfg), []).append(res)
                    if not args.quiet:
                        if "step_times" in res:
                            msg = "median step %.0f ms" % (statistics.median(res["step_times"]) * 1e3)
                        else:
                            msg = res.get("skipped") or res.get("error")
                        print("[run %d/%d] %-8s layers=%-2s %-12s %s (%.0f s)" % (
                            run + 1, args.runs, impl, layers or "-", cfg, msg, res["wall_s"]),
                            file=sys.stderr, flush=True)
                    meta["elapsed_s"] = time.time() - started
                    if args.json_out:
                        save_json(args.json_out, raw, meta)
                    if "skipped" in res:
                        return res["skipped"]
        meta["runs_done"] = run + 1
    return None


def _report(raw, meta, args, impls, layer_counts, skipped_workload, started):
    """Save and print the results of :func:`main`'s run; returns the exit status."""
    meta["elapsed_s"] = time.time() - started
    if args.json_out:
        save_json(args.json_out, raw, meta)

    if skipped_workload:
        print("workload %s skipped: %s" % (args.workload, skipped_workload))
        return 0
    if meta["runs_done"] == 0:
        print("no complete round")
        return 1
    for impl, _py, _c in impls:
        for layers in layer_counts:
            bad = [r for r in raw.get((impl, layers, "none"), []) if "error" in r]
            if bad and not args.quiet:
                print("--- %s none failed; last output:\n%s" % (impl, bad[0].get("output_tail", "")),
                      file=sys.stderr)
    text = render(raw, meta)
    print(text)
    if args.write_results:
        write_results(text, args.workload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
