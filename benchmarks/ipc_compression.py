"""What IPC buffer compression of the event log costs, where the log is written, and what it saves.

The log is written by the rank's writer process (store/writer_process.py), not by the
training process: the setting (``MSPROBE_LOG_COMPRESSION``: ``none``, ``lz4``, ``zstd``) is
given to the training process's environment, which hands it to its writer process, as a
user would set it. Each run is a fresh training process with the dispatch workload of
``benchmarks/workloads.py`` (the encoder shrunk to d_model 32, one thread: host time per
call decides the step time; level mix, statistics): one warm-up step, then ``--steps``
timed steps. Settings alternate run by run (the order rotates each round).

Per run it measures, over the timed steps (after the writer process caught up with the
warm-up, and again after it caught up with the last step):

* the training process's step time (wall, median over the steps) and CPU time per step
  (``time.process_time``: every thread of the training process, median over the steps);
* the training thread's CPU time per step (``time.thread_time``, median over the steps);
* the writer process's CPU time per step (user + system from ``/proc/{pid}/stat``, whole
  timed span divided by the steps; the clock tick is 10 ms, about 0.1 ms per step at 100
  steps);
* the catch-up time: how long the writer process still took, after the last timed step,
  to write everything handed over (near the time of one frame when it keeps up; a writer
  that falls behind the training shows here first, then as back-pressure in the step
  time);
* the log's bytes per step (growth of the rank's log files over the timed span).

Then the read side, on the log of the last run of each setting (settings alternating,
``--read-repeats`` times, each on a fresh copy of the dump): ``msprobe query`` over the
uncompacted log and ``msprobe compact``, each a fresh process: wall time, CPU time
(user + system of the child) and peak RSS.

``--pin CPU`` runs each training process and its writer process on that one CPU (no free
core: the writer's work then adds to the step), as on a host with fewer cores than busy
processes.

Per setting it prints the median and the spread (min–max over the runs), and the change
of the medians against ``none``. ``--json FILE`` keeps every run.

Usage: ``python benchmarks/ipc_compression.py [--runs 8] [--steps 100] [--layers 4]
[--modes none,lz4,zstd] [--read-repeats 3] [--pin CPU] [--json FILE]``
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
MODES = ("none", "lz4", "zstd")
QUERY = "SELECT step, count(*) AS tensors, max(norm) AS norm FROM tensors GROUP BY step ORDER BY step"
_CLI = "import sys; from msprobe.cli import main; sys.argv[0] = 'msprobe'; sys.exit(main())"


def _proc_cpu(pid: int) -> float:
    """User + system CPU time (s) of process ``pid`` so far (``/proc/{pid}/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _log_bytes(dump: Path) -> int:
    return sum(f.stat().st_size for f in (dump / ".msprobe" / "log").glob("*.arrows"))


def child(args) -> None:
    """One training process (the setting comes from the environment); writes its result
    as JSON to ``args.result``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    import torch._dynamo  # noqa: F401  (as workloads.py does)
    import torch

    from workloads import build_encoder, config_json
    from msprobe.pytorch import PrecisionDebugger

    torch.set_num_threads(1)
    model, train_step = build_encoder(args.layers, size="dispatch")
    dump = Path(args.dump)
    config = Path(args.dump).with_suffix(".json")
    config.write_text(json.dumps(config_json("mix_stats", str(dump))))
    dbg = PrecisionDebugger(config_path=str(config), dump_path=str(dump))

    def one_step() -> tuple[float, float, float]:
        c0, h0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()
        return time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - h0

    one_step()  # warm-up, recorded
    client = dbg.session._client
    if client is None:
        raise SystemExit("the log is not written by a writer process (MSPROBE_WRITER=inprocess?)")
    client.wait(300)
    writer0, bytes0 = _proc_cpu(client.pid), _log_bytes(dump)
    steps = [one_step() for _ in range(args.steps)]
    t0 = time.perf_counter()
    client.wait(300)
    catch_up = time.perf_counter() - t0
    writer1, bytes1 = _proc_cpu(client.pid), _log_bytes(dump)
    dbg.close()
    Path(args.result).write_text(json.dumps({
        "step_s": statistics.median(s for s, _, _ in steps),
        "cpu_s": statistics.median(c for _, c, _ in steps),
        "thread_cpu_s": statistics.median(h for _, _, h in steps),
        "catch_up_s": catch_up,
        "writer_cpu_s": (writer1 - writer0) / args.steps,
        "log_bytes": (bytes1 - bytes0) / args.steps,
    }))


def one_run(mode: str, work: Path, steps: int, layers: int, pin=None) -> dict:
    dump = work / f"dump-{mode}"
    shutil.rmtree(dump, ignore_errors=True)
    result = work / f"result-{mode}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MSPROBE_LOG_COMPRESSION": mode}
    env.pop("MSPROBE_WRITER", None)
    subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps), "--layers", str(layers),
                    "--dump", str(dump), "--result", str(result)], check=True, env=env, stdout=subprocess.DEVNULL,
                   preexec_fn=None if pin is None else (lambda: os.sched_setaffinity(0, {pin})))
    return json.loads(result.read_text())


def timed_command(argv: list[str]) -> dict:
    """Run ``argv`` to its end: wall time (s), CPU time (s, user + system) and peak RSS (MB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{argv[3:]} failed with status {proc.returncode}")
    return {"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024}


def read_side(mode: str, work: Path) -> dict:
    copy = work / f"read-{mode}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(work / f"dump-{mode}", copy)
    cli = [sys.executable, "-c", _CLI]
    found = {"query": timed_command(cli + ["query", str(copy), QUERY]),
             "compact": timed_command(cli + ["compact", str(copy)])}
    shutil.rmtree(copy, ignore_errors=True)
    return found


def _summary(values: list[float], scale: float) -> str:
    med = statistics.median(values) * scale
    return f"{med:8.2f} ({min(values) * scale:.2f}-{max(values) * scale:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="training processes per setting (alternating)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per process")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, the first is the baseline")
    parser.add_argument("--read-repeats", type=int, default=3, help="query and compact runs per setting")
    parser.add_argument("--pin", type=int, help="run each training process and its writer process on this one CPU")
    parser.add_argument("--json", help="write every run's numbers here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    modes = args.modes.split(",")
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: got {args.modes!r}; allowed: a comma-separated subset of {', '.join(MODES)}")
    work = Path(tempfile.mkdtemp(prefix="msprobe-ipc-compression-"))
    runs: dict[str, list] = {m: [] for m in modes}
    reads: dict[str, list] = {m: [] for m in modes}
    try:
        for r in range(args.runs):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                runs[mode].append(one_run(mode, work, args.steps, args.layers, args.pin))
        for r in range(args.read_repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                reads[mode].append(read_side(mode, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "reads": reads}, indent=1))

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    base = modes[0]
    pinned = "" if args.pin is None else f", training and writer process pinned to CPU {args.pin}"
    print(f"dispatch workload, mix statistics, {args.layers} layers, {args.steps} timed steps, "
          f"{args.runs} processes per setting (alternating){pinned}; median (min-max over the processes)")
    columns = [("step_s", "step ms"), ("cpu_s", "train CPU ms/step"), ("thread_cpu_s", "train thread CPU ms"),
               ("writer_cpu_s", "writer CPU ms/step"), ("catch_up_s", "catch-up ms")]
    print(f"{'setting':<8} " + " ".join(f"{title:>22} {'vs ' + base:>8}" for _, title in columns)
          + f" {'log KB/step':>11}")
    for mode in modes:
        print(f"{mode:<8} " + " ".join(
            f"{_summary([r[key] for r in runs[mode]], 1e3):>22} {100 * (med(mode, key) / med(base, key) - 1):>+7.1f}%"
            for key, _ in columns) + f" {med(mode, 'log_bytes') / 1024:>11.1f}")
    # settings alternate run by run: the ratio within a round cancels drift between rounds
    print(f"within-round ratios to {base}, median (min-max over the rounds):")
    for mode in modes[1:]:
        print(f"{mode:<8} " + "  ".join(
            f"{key} {_summary([a[key] / b[key] for a, b in zip(runs[mode], runs[base])], 1).strip()}"
            for key in ("step_s", "cpu_s", "thread_cpu_s", "writer_cpu_s")))
    if args.read_repeats:
        print(f"read side, {args.read_repeats} runs per setting (alternating), on a log of {args.steps + 1} steps: "
              "median (min-max)")
        print(f"{'setting':<8} {'command':<8} {'wall s':>20} {'CPU s':>20} {'peak RSS MB':>22}")
        for mode in modes:
            for command in ("query", "compact"):
                rows = [r[command] for r in reads[mode]]
                print(f"{mode:<8} {command:<8} {_summary([x['wall_s'] for x in rows], 1):>20} "
                      f"{_summary([x['cpu_s'] for x in rows], 1):>20} {_summary([x['rss_mb'] for x in rows], 1):>22}")


if __name__ == "__main__":
    main()
