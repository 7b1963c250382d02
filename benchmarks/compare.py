"""Benchmark ``msprobe compare`` on two synthetic 1,000,000-leaf statistics dumps.

Two logs are written straight in the store's Arrow format (no training needed):
``--calls`` API calls (default 250,000) with 4 tensor leaves each, in a periodic layer
trace with a module anchor every 20 calls; the target has 10 inserted calls and one
perturbed output (Max × 1.01) at 60 % of the trace. The compare runs in a child process
so its peak RSS is measured alone. Prints wall time, peak RSS and whether the answer is
right (first origin = the perturbed call, 10 inserted calls, 0 deleted).

    python benchmarks/compare.py [--calls 250000] [--keep DIR] [--threads 2]

Not collected by pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from store import schema as S  # noqa: E402

OPS = ("Functional.linear", "Functional.gelu", "Functional.layer_norm", "Tensor.__add__")


def write_log(dump: Path, n_calls: int, *, inserted: tuple = (), perturbed: int = -1) -> dict:
    """Write one rank-0 log; returns ``{"perturbed": name}``."""
    cols = {name: [] for name in S.LOG_SCHEMA.names}

    def row(**values):
        for name in S.LOG_SCHEMA.names:
            cols[name].append(values.get(name))

    seq = 0
    row(rank=0, step=0, seq=seq, row=S.ROW_MARKER, kind=S.MARKER_START,
        meta=json.dumps({"task": "statistics", "level": "mix", "framework": "pytorch",
                         "dump_data_dir": None, "rank_dir": "rank"}))
    counters: dict[str, int] = {}
    layer = 0
    result = {}
    ins = set(inserted)
    i = 0
    emitted = 0
    while emitted < n_calls:
        extra = i in ins
        op = "Torch.tanh" if extra else OPS[emitted % len(OPS)]
        n = counters.get(op, 0)
        counters[op] = n + 1
        name = f"{op}.{n}.forward"
        seq += 1
        row(rank=0, step=0, seq=seq, row=S.ROW_CALL, kind=S.API_FORWARD, name=name, api_type=op.split(".")[0],
            parent=f"Module.layers.{layer}.Block.forward.0", keys='["input_args","input_kwargs","output"]')
        base = (emitted % 997) / 997.0 + 0.5
        for k, (io, arg) in enumerate((("input_args", "0"), ("input_args", "1"), ("output", "0"), ("output", "1"))):
            mx = base + k
            if emitted == perturbed and not extra and io == "output" and arg == "0":
                mx *= 1.01
                result["perturbed"] = name
            row(rank=0, step=0, seq=seq, row=S.ROW_LEAF, kind=S.API_FORWARD, name=name, io=io, path=f"[{arg}]",
                arg=arg, leaf_kind=S.LEAF_TENSOR, type="torch.Tensor", dtype="torch.float32", shape=[64, 64],
                numel=4096, max=mx, min=-base, mean=base / 10, norm=base * 30, requires_grad=True,
                has_nan=False, has_inf=False)
        if not extra:
            emitted += 1
        i += 1
        if not extra and emitted % 20 == 0:
            seq += 1
            row(rank=0, step=0, seq=seq, row=S.ROW_CALL, kind=S.MODULE_FORWARD,
                name=f"Module.layers.{layer}.Block.forward.0", api_type="Module",
                keys='["input_args","input_kwargs","output","parameters"]')
            layer += 1
    table = pa.table(cols, schema=S.LOG_SCHEMA)
    log_dir = dump / S.STORE_DIR / S.LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(log_dir / f"rank0.{os.getpid()}.{time.time_ns()}{S.LOG_SUFFIX}"), "wb") as sink:
        with pa.ipc.new_stream(sink, S.LOG_SCHEMA) as writer:
            writer.write_table(table, max_chunksize=65536)
    return result


def child(target: str, baseline: str, out: str, threads: int) -> None:
    import duckdb

    duckdb.default_connection().execute(f"SET threads = {threads}")
    start = time.perf_counter()
    import msprobe.compare as C

    r = C.compare(target, baseline, out=out, formats=["summary", "parquet"])
    wall = time.perf_counter() - start
    inserted = r.con.sql("SELECT count(*) FROM alignment WHERE how = 'inserted'").fetchall()[0][0]
    deleted = r.con.sql("SELECT count(*) FROM alignment WHERE how = 'deleted'").fetchall()[0][0]
    leaves = r.con.sql("SELECT count(*) FROM tensors").fetchall()[0][0]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss = usage.ru_maxrss / 1024
    cpu = usage.ru_utime + usage.ru_stime
    first = r.first[0]
    print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(rss), "leaf_pairs": leaves,
                      "inserted": inserted, "deleted": deleted, "first_origin": first and first["name"], "stages_s": r.timings}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=250_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", default=None, help="directory to keep the dumps in")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.threads)
        return
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="msprobe_cmp_bench_"))
    t0 = time.perf_counter()
    if not (root / "baseline").exists():
        write_log(root / "baseline", args.calls)
        info = write_log(root / "target", args.calls, inserted=tuple(range(1000, 11000, 1000)),
                         perturbed=int(args.calls * 0.6))
        (root / "expected.json").write_text(json.dumps(info))
    info = json.loads((root / "expected.json").read_text())
    print(f"dumps ready in {time.perf_counter() - t0:.1f} s under {root}; expected first origin {info['perturbed']}")
    proc = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--child",
                           str(root / "target"), str(root / "baseline"), str(root / "out")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr)
        sys.exit(1)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["right_answer"] = (result["first_origin"] == info["perturbed"] and result["inserted"] == 10
                              and result["deleted"] == 0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
