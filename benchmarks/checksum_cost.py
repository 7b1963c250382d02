#!/usr/bin/env python
"""Write-side cost of the log's batch checksums (log format 2) on the dispatch workload.

Records the ``dispatch`` workload (benchmarks/workloads.py) with msprobe for a few steps
and times each recorded step, then reads the batches the log writer wrote and writes them
again, in alternating rounds, two ways into a scratch file:

* ``plain``: a pyarrow IPC stream writer, the way format 1 wrote them (no checksum);
* ``sealed``: :class:`store.log_frame.MessageSealer` (serialise into memory, CRC-32 of the
  message, digits written in place) then ``file.write``, the way :class:`LogWriter` writes now.

The difference per recorded step, against the recorded step's time, is the checksum's
share of a step. All times are CPU time of this process (``time.process_time``: user and
system, file writes included), which other processes on a shared machine disturb less
than wall time. Prints medians with the spread (min–max over rounds).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/checksum_cost.py --config mix_stats --rounds 9

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


def record(dump: Path, config: str, steps: int, threads: int) -> list[float]:
    """Record ``steps`` steps (after one warm-up step) of the dispatch workload; the CPU
    time of this process in each recorded step (unit: s; CPU time, not wall time, so that
    other processes on a shared machine count less)."""
    import torch

    from msprobe.pytorch import PrecisionDebugger

    torch.set_num_threads(threads)
    model, train_step = build_encoder(4, size="dispatch")
    cfg_path = dump.parent / "config.json"
    cfg_path.write_text(json.dumps(config_json(config, str(dump))))
    dbg = PrecisionDebugger(config_path=str(cfg_path), dump_path=str(dump))
    times = []
    for i in range(steps + 1):
        t0 = time.process_time()
        dbg.start(model)
        train_step()
        dbg.stop()
        dbg.step()
        if i:
            times.append(time.process_time() - t0)
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
    p.add_argument("--steps", type=int, default=6, help="recorded steps (after one warm-up step)")
    p.add_argument("--rounds", type=int, default=9, help="alternating write rounds")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    from store.log_reader import read_log, find_log_files, LogReader

    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "dump"
        step_times = record(dump, args.config, args.steps, args.threads)
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
        step = statistics.median(step_times)
        share = [d / step * 100 for d in per_step]
        print(f"workload dispatch, config {args.config}, {args.threads} torch thread(s)")
        print(f"recorded step (CPU time): median {step * 1e3:.2f} ms (min {min(step_times) * 1e3:.2f}, "
              f"max {max(step_times) * 1e3:.2f}) over {len(step_times)} steps")
        print(f"log: {len(batches)} batches, {rows} rows, {size / 1e6:.2f} MB in {steps} steps "
              f"({len(batches) / steps:.1f} batches/step)")
        print(f"write all batches (CPU time), plain:  median {statistics.median(plain) * 1e3:.2f} ms "
              f"(min {min(plain) * 1e3:.2f}, max {max(plain) * 1e3:.2f})")
        print(f"write all batches (CPU time), sealed: median {statistics.median(sealed) * 1e3:.2f} ms "
              f"(min {min(sealed) * 1e3:.2f}, max {max(sealed) * 1e3:.2f})")
        print(f"CRC-32 alone per recorded step: median {statistics.median(crc) * 1e6:.1f} us "
              f"(min {min(crc) * 1e6:.1f}, max {max(crc) * 1e6:.1f}) = "
              f"{statistics.median(crc) / step * 100:.3f} % of a recorded step")
        print(f"checksum cost per recorded step (CPU time): median {statistics.median(per_step) * 1e6:.1f} us "
              f"(min {min(per_step) * 1e6:.1f}, max {max(per_step) * 1e6:.1f}) = "
              f"{statistics.median(share):.3f} % of a recorded step (min {min(share):.3f}, max {max(share):.3f})")


if __name__ == "__main__":
    main()
