"""Bit-flip trial: damage a real msprobe event log at random places and check that every
damage is detected and reported, or provably harmless; never a silently changed value or a
silently dropped row.

Usage::

    PYTHONPATH=$PWD .venv/bin/python tools/bitflip_trial.py [--dump DUMP_PATH] [--trials 32] [--seed 44]

Without ``--dump`` it records a small training run (an MLP and a LayerNorm, 4 steps at level
mix, task statistics) into a temporary directory. Each trial copies the log, flips one bit
(odd trials overwrite one aligned 4-byte word with random bits instead) at a random offset,
and reads it back with :func:`store.log_reader.read_log` and ``msprobe query``. A trial passes
when:

* no row is read that the undamaged log does not hold (no changed value is read as data),
* no row is lost without a reported skip that covers the damaged byte, by the reader and
  on ``msprobe query``'s stderr.

Outcomes: "detected, batch skipped exactly" (the rows read are the undamaged log's less
those of the batch whose message holds the damaged byte: the message ranges come from the
Arrow IPC framing of the clean file), "detected, nothing lost" (the schema message or the
end-of-stream marker), "detected, more rows lost than the damaged batch (reported)",
"undetected, no value changed (harmless)" (a padding byte of a log without checksums); a
trial fails with "SILENT: ..." or "FAILED: not reported". Run it with ``PYTHONPATH`` at an
older checkout to see what a log without checksums gives.

Prints one line per trial and a summary; exits 1 when a trial fails.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

from store import schema as S
from store.log_reader import find_log_files, read_log


def record(path: Path, steps: int = 4) -> Path:
    """A small seeded training run recorded at level mix into ``path``."""
    import torch
    import torch.nn as nn

    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    config = path.parent / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(path), "level": "mix"}))
    debugger = PrecisionDebugger(config_path=str(config))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        debugger.start(model=net)
        (net(x) * x[:, :4]).mean().backward()
        debugger.stop()
        debugger.step()
        opt.step()
        opt.zero_grad()
    debugger.close()
    return path


def message_ranges(data: bytes) -> list[tuple[int, int, int]]:
    """``(start, end, rows)`` of every IPC message of a clean log: the schema message and
    the end-of-stream marker have ``rows`` 0."""
    out, pos, schema = [], 0, None
    while pos < len(data):
        if struct.unpack_from("<i", data, pos + 4)[0] == 0:
            out.append((pos, pos + 8, 0))
            break
        source = pa.BufferReader(pa.py_buffer(data[pos:]))
        message = pa.ipc.read_message(source)
        if schema is None:
            schema = pa.ipc.read_schema(message)
            rows = 0
        else:
            rows = pa.ipc.read_record_batch(message, schema).num_rows
        out.append((pos, pos + source.tell(), rows))
        pos += source.tell()
    return out


def rows_of(table: pa.Table) -> list[str]:
    """Each row of ``table`` as the ``repr`` of its values (exact for floats; hashable)."""
    return [repr(tuple(row.values())) for row in table.to_pylist()]


def _where(skip) -> str:
    """The part of a skip's description before its reason."""
    if hasattr(skip, "describe"):
        return skip.describe().split(": ", 1)[0]
    return f"skipped {skip.path} at byte {skip.offset}"  # the Skipped of older versions


def run_query(dump: Path) -> tuple[int, str]:
    """``msprobe query DUMP "SELECT count(*) FROM tensors"``: (its count, its stderr)."""
    from msprobe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["query", str(dump), "SELECT count(*) AS n FROM tensors", "--format", "csv"])
    if code != 0:
        raise SystemExit(f"msprobe query exited {code}: {err.getvalue()}")
    return int(out.getvalue().split()[-1]), err.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dump", help="an msprobe dump path with one log file (default: record one)")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--seed", type=int, default=44)
    args = p.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = Path(args.dump) if args.dump else record(tmp / "recorded")
        (log,) = find_log_files(source)[:1]
        clean = log.read_bytes()
        messages = message_ranges(clean)
        clean_rows = rows_of(read_log(source).table)
        clean_count, clean_err = run_query(source)
        assert clean_err == "", clean_err
        work = tmp / "work"
        shutil.copytree(source, work)
        target = work / S.STORE_DIR / S.LOG_DIR / log.name
        print(f"log {log.name}: {len(clean)} bytes, {len(messages) - 2} batches, {len(clean_rows)} rows, "
              f"{clean_count} tensors")
        outcomes: dict[str, int] = {}
        failures = 0
        for trial in range(args.trials):
            damaged = bytearray(clean)
            if trial % 2 == 0:
                at = rng.randrange(len(clean))
                bit = rng.randrange(8)
                damaged[at] ^= 1 << bit
                what = f"bit {bit} of byte {at}"
                first = at
            else:
                at = rng.randrange(len(clean) // 4) * 4
                damaged[at:at + 4] = rng.getrandbits(32).to_bytes(4, "little")
                changed = [at + k for k in range(4) if damaged[at + k] != clean[at + k]]
                what = f"word at byte {at}"
                if not changed:
                    print(f"trial {trial:2d}: {what}: the random word equals the old one; no damage")
                    outcomes["no damage"] = outcomes.get("no damage", 0) + 1
                    continue
                first = changed[0]
            target.write_bytes(bytes(damaged))
            index = next(i for i, (s, e, _) in enumerate(messages) if s <= first < e)
            start, end, lost = messages[index]
            part = "schema message" if index == 0 else "end-of-stream marker" if index == len(messages) - 1 \
                else f"batch {index - 1} ({lost} rows)"
            # the clean rows less those of the damaged batch (read_log keeps file order)
            before = sum(r for _, _, r in messages[:index])
            expected = clean_rows[:before] + clean_rows[before + lost:]
            contents = read_log(work)
            got = rows_of(contents.table)
            covered = [s for s in contents.skipped
                       if s.offset <= first < (getattr(s, "end", None) or len(clean))]
            count, err = run_query(work)
            stderr_says = any(f"skipped {target} at byte {s.offset}" in err for s in covered)
            known = set(clean_rows)
            if any(row not in known for row in got):
                outcome = "SILENT: a changed value read as data"
            elif len(got) < len(clean_rows) and not (covered and stderr_says):
                outcome = "SILENT: rows dropped without a report covering the damage"
            elif got == expected and covered and stderr_says:
                outcome = "detected, batch skipped exactly" if lost else "detected, nothing lost"
            elif got == clean_rows and covered and stderr_says:
                outcome = "detected, nothing lost"
            elif got == clean_rows and not contents.skipped:
                outcome = "undetected, no value changed (harmless)"
            elif covered and stderr_says:
                outcome = "detected, more rows lost than the damaged batch (reported)"
            else:
                outcome = "FAILED: not reported"
            failures += outcome.startswith(("SILENT", "FAILED"))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            print(f"trial {trial:2d}: {what} in {part}: {outcome}; rows read {len(got)} of {len(clean_rows)}, "
                  f"query tensors {count} of {clean_count}; reported: "
                  + ("; ".join(_where(s).replace(str(target), "log") for s in covered) or "-"))
        print("summary: " + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())))
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
