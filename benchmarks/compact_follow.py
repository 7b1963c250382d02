"""Does ``msprobe compact --follow`` keep up with training, and what does it cost the training
process? Not a test.

Runs the dispatch workload (``benchmarks/workloads.py``: host time per call decides the step)
recorded at level mix for ``--steps`` steps in fresh processes, alternating runs without and
with ``msprobe compact DUMP --follow --interval 1`` started beside the training process.
Prints per setting the median step time and CPU time per step of the training process and,
with compaction, the compactor's CPU time per recorded step, the steps compacted when
training ended, and how long after the end of training the compactor finished (every log
file wholly in parts).

Usage: ``python benchmarks/compact_follow.py [--runs 3] [--steps 200] [--config mix_stats]``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the compactor: msprobe's CLI in-process, then its own CPU time
_FOLLOW = """
import json, resource, sys
from msprobe.cli import main
rc = main(sys.argv[1:])
u = resource.getrusage(resource.RUSAGE_SELF)
print("@@" + json.dumps({"rc": rc, "cpu": u.ru_utime + u.ru_stime}), file=sys.stderr)
"""


def compacted_steps(dump: Path) -> int:
    """Distinct steps in the compaction summary (0 before the first pass)."""
    import pyarrow.parquet as pq

    summary = dump / ".msprobe" / "parquet" / "_summary.parquet"
    if not summary.exists():
        return 0
    return len(set(pq.read_table(summary, columns=["step"])["step"].to_pylist()))


def one_run(work: Path, steps: int, config: str, follow: bool) -> dict:
    dump = work / "dump"
    shutil.rmtree(dump, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    compactor = None
    if follow:
        compactor = subprocess.Popen([sys.executable, "-c", _FOLLOW, "compact", str(dump), "--follow",
                                      "--interval", "1"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
    result = work / "result.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workloads.py"), "--workload", "dispatch",
                    "--config", config, "--steps", str(steps), "--threads", "1", "--dump-path", str(dump),
                    "--config-path", str(work / "config.json"), "--result", str(result)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    ended = time.perf_counter()
    out = json.loads(result.read_text())
    row = {"step_ms": 1e3 * statistics.median(out["step_times"]),
           "cpu_ms": 1e3 * statistics.median(out["cpu_times"]), "steps": out["recorded_steps"]}
    if compactor is not None:
        row["compacted_at_end"] = compacted_steps(dump)
        _, err = compactor.communicate(timeout=600)
        row["catch_up_s"] = time.perf_counter() - ended
        lines = [ln for ln in err.splitlines() if ln.startswith("@@")]
        if not lines:
            raise RuntimeError(f"compact --follow gave no result: {err[-2000:]}")
        got = json.loads(lines[-1][2:])
        row["compactor_cpu_ms_per_step"] = 1e3 * got["cpu"] / max(out["recorded_steps"], 1)
        row["compacted"] = compacted_steps(dump)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per setting, alternating")
    parser.add_argument("--steps", type=int, default=200, help="recorded steps per run")
    parser.add_argument("--config", default="mix_stats", help="a configuration of benchmarks/workloads.py")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="msprobe-compact-follow-"))
    rows: dict[bool, list] = {False: [], True: []}
    try:
        for _ in range(args.runs):
            for follow in (False, True):
                rows[follow].append(one_run(work, args.steps, args.config, follow))
                print(("with compact --follow" if follow else "without           "), rows[follow][-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for follow in (False, True):
        got = rows[follow]
        line = (f"{'with' if follow else 'without'} compact --follow: step {statistics.median(r['step_ms'] for r in got):.1f} ms "
                f"(runs {', '.join(format(r['step_ms'], '.1f') for r in got)}), training CPU "
                f"{statistics.median(r['cpu_ms'] for r in got):.1f} ms per step")
        if follow:
            line += (f"; compactor CPU {statistics.median(r['compactor_cpu_ms_per_step'] for r in got):.1f} ms per step, "
                     f"steps compacted when training ended {[r['compacted_at_end'] for r in got]} of "
                     f"{got[0]['steps']}, finished {', '.join(format(r['catch_up_s'], '.1f') for r in got)} s after it")
        print(line)


if __name__ == "__main__":
    main()
