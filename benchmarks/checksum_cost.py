#!/usr/bin/env python
"""Write-side cost of the log's batch checksums (log format 2) on the dispatch workload.

Records the ``dispatch`` workload (benchmarks/workloads.py) with msprobe for a few steps.
The log is written by the rank's writer process (store/writer_process.py), which seals
every batch (serialise, CRC-32, digits written in place) before writing it; the training
process never computes a checksum. Per recorded step it measures the training process's
wall and CPU time and the writer process's CPU time (``psutil``, read after
``wait_files()`` so the step's batches and files are written; clock-tick resolution, so
enough steps are needed). Then it reads the batches the writer wrote and, in alternating
rounds in this process:

* ``crc``: CRC-32 of every batch message (what the checksum adds to the writer's work);
* ``plain``: writes them with a pyarrow IPC stream writer, the way format 1 wrote them;
* ``sealed``: writes them through :class:`store.log_frame.MessageSealer` then
  ``file.write``, the way :class:`LogWriter` writes now.

The CRC per recorded step is reported as a share of the recorded step (its wall time and
the training process's CPU time) and of the writer process's CPU per step. All write
times are CPU time of this process (``time.process_time``: user and system, file writes
included), which other processes on a shared machine disturb less than wall time. Prints
medians with the spread (min–max over rounds).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/checksum_cost.py --config mix_stats --steps 40 --rounds 9

A script, not a test: pytest does not collect it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from workloads import build_encoder, config_json  # noqa: E402


def record(dump: Path, config: str, steps: int, threads: int) -> dict[str, list[float]]:
    """Record ``steps`` steps (after one warm-up step) of the dispatch workload. Returns,
    per recorded step (unit: s): ``wall`` and ``cpu`` of the training step (start() to
    step(), this process's CPU time: other processes on a shared machine count less) and
    ``writer`` (CPU time of the writer process from before start() until wait_files()
    returns after step(); empty when the log is written in this process)."""
    import psutil
    import torch

    from msprobe.pytorch import PrecisionDebugger

    torch.set_num_threads(threads)
    model, train_step = build_encoder(4, size="dispatch")
    cfg_path = dump.parent / "config.json"
    cfg_path.write_text(json.dumps(config_json(config, str(dump))))
    dbg = PrecisionDebugger(config_path=str(cfg_path), dump_path=str(dump))
    times: dict[str, list[float]] = {"wall": [], "cpu": [], "writer": []}
    writer = None
    for i in range(steps + 1):
        if writer is None and dbg.session._client is not None:
            writer = psutil.Process(dbg.session._client.pid)
        w0 = sum(writer.cpu_times()[:2]) if writer is not None else None
        t0, c0 = time.perf_counter(), time.process_time()
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        dbg.wait_files()
        if i:
            times["wall"].append(wall)
            times["cpu"].append(cpu)
            if w0 is not None:
                times["writer"].append(sum(writer.cpu_times()[:2]) - w0)
    dbg.close()
    return times


#: times each round writes the whole log (the round's time is the mean)
REPEAT = 10


def write_plain(path: str, batches) -> float:
    import pyarrow as pa

    from store import schema as S

    t0 = time.process_time()
    for _ in range(REPEAT):
        with open(path, "wb") as f:
            writer = pa.ipc.new_stream(f, S.LOG_SCHEMA)
            for batch in batches:
                writer.write_batch(batch)
                f.flush()
            writer.close()
    return (time.process_time() - t0) / REPEAT


def write_sealed(path: str, batches) -> float:
    from store.log_frame import END_OF_STREAM, MessageSealer, schema_message

    t0 = time.process_time()
    for _ in range(REPEAT):
        with open(path, "wb") as f:
            f.write(schema_message())
            sealer = MessageSealer()
            for batch in batches:
                message = sealer.seal(batch)
                f.write(message)
                message.release()
                f.flush()
            f.write(END_OF_STREAM)
    return (time.process_time() - t0) / REPEAT


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="mix_stats", help="a config of benchmarks/workloads.py (default mix_stats)")
    p.add_argument("--steps", type=int, default=40, help="recorded steps (after one warm-up step)")
    p.add_argument("--rounds", type=int, default=9, help="alternating write rounds")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    from store.log_reader import read_log, find_log_files, LogReader

    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "dump"
        times = record(dump, args.config, args.steps, args.threads)
        batches = []
        for path in find_log_files(dump):
            batches += LogReader(path).read_new()
        steps = args.steps + 1
        rows = sum(b.num_rows for b in batches)
        size = sum(b.nbytes for b in batches)
        scratch = os.path.join(tmp, "scratch.arrows")
        plain, sealed = [], []
        for _ in range(args.rounds):
            plain.append(write_plain(scratch, batches))
            sealed.append(write_sealed(scratch, batches))
        from store.log_frame import MessageSealer, crc32

        sealer = MessageSealer()
        messages = []
        for batch in batches:
            view = sealer.seal(batch)
            messages.append(bytes(view))
            view.release()
        crc = []
        for _ in range(args.rounds):
            t0 = time.process_time()
            for _ in range(REPEAT):
                for message in messages:
                    crc32(message)
            crc.append((time.process_time() - t0) / REPEAT / steps)
        per_step = [(s - q) / steps for s, q in zip(sealed, plain)]
        wall, cpu = statistics.median(times["wall"]), statistics.median(times["cpu"])
        crc_step = statistics.median(crc)

        def spread(values: list[float], unit: float = 1e3) -> str:
            return (f"median {statistics.median(values) * unit:.2f} (min {min(values) * unit:.2f}, "
                    f"max {max(values) * unit:.2f})")

        print(f"workload dispatch, config {args.config}, {args.threads} torch thread(s), "
              f"{len(times['wall'])} recorded steps")
        print(f"recorded step, wall ms: {spread(times['wall'])}")
        print(f"recorded step, training-process CPU ms: {spread(times['cpu'])}")
        if times["writer"]:
            writer_mean = sum(times["writer"]) / len(times["writer"])
            print(f"writer process CPU per recorded step, ms: mean {writer_mean * 1e3:.2f} "
                  f"({spread(times['writer'])}; clock-tick resolution)")
        else:
            print("writer process: none (the log is written in this process)")
        print(f"log: {len(batches)} batches, {rows} rows, {size / 1e6:.2f} MB in {steps} steps "
              f"({len(batches) / steps:.1f} batches/step)")
        print(f"write all batches (CPU ms), plain:  {spread(plain)}")
        print(f"write all batches (CPU ms), sealed: {spread(sealed)}")
        print(f"CRC-32 alone per recorded step, us: {spread(crc, 1e6)}")
        print(f"  = {crc_step / wall * 100:.3f} % of a recorded step's wall time, "
              f"{crc_step / cpu * 100:.3f} % of its training-process CPU")
        if times["writer"]:
            print(f"  = {crc_step / writer_mean * 100:.3f} % of the writer process's CPU per recorded step (mean)")
        print(f"sealed less plain write per recorded step, us: {spread(per_step, 1e6)} = "
              f"{statistics.median(per_step) / wall * 100:.3f} % of a recorded step's wall time")


if __name__ == "__main__":
    main()
