"""Benchmark ``msprobe compare`` on two synthetic 1,000,000-leaf statistics dumps.

Two logs are written straight in the store's Arrow format (no training needed):
``--calls`` API calls (default 250,000) with 4 tensor leaves each, in a periodic layer
trace with a module anchor every 20 calls; the target has 10 inserted calls and one
perturbed output (Max × 1.01) at 60 % of the trace. The compare runs in a child process
so its peak RSS is measured alone. Prints wall time, peak RSS and whether the answer is
right (first origin = the perturbed call, 10 inserted calls, 0 deleted).

Cases (``--case``):

``stats``   the above (target: ≤ 10 s, ≤ 2 GB RSS on 2 cores).
``names``   every name differs: the target's module paths are ``Module.model.layers.N``
            (no module anchor pairs) and every API counter is shifted by one, so API
            calls pair only through the edit script on (API, signature) over the whole
            trace; the module calls stay unpaired (paths differ, no mapping), so the right
            answer has 10 + calls/20 inserted and calls/20 deleted (target ≤ 60 s).
``tensor``  task tensor: ``--calls`` (default here 50) calls with 4 float32 leaves of
            ``--numel`` elements (default 1,000,000) saved as ``.npy`` files; every
            target tensor differs from the baseline by a relative 1e-7 (so every pair is
            measured, verdict close) and one output by 1e-3 (the origin). Reports tensor
            bytes read per second (both sides' files, page cache warm) against the
            target ≥ 0.5 GB/s, and peak RSS against 2 × the largest pair + 300 MB.
            ``--workers N`` is passed on.

    python benchmarks/compare.py [--case stats|names|tensor] [--calls N] [--keep DIR]
        [--threads 2] [--workers N] [--numel N]

Not collected by pytest.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from store import schema as S  # noqa: E402
from store.log_frame import write_batches  # noqa: E402

OPS = ("Functional.linear", "Functional.gelu", "Functional.layer_norm", "Tensor.__add__")


def write_log(dump: Path, n_calls: int, *, inserted: tuple = (), perturbed: int = -1, renamed: bool = False,
              numel: int = 0, noise: float = 0.0) -> dict:
    """Write one rank-0 log; returns ``{"perturbed": name}``. ``renamed``: other module
    paths and API counters + 1 (every name differs). ``numel`` > 0: task tensor, each
    leaf a float32 ``.npy`` of that many elements (the same values on both sides, times
    ``1 + noise`` on the target, ``1 + 1e-3`` for the perturbed output)."""
    cols = {name: [] for name in S.LOG_SCHEMA.names}

    def row(**values):
        for name in S.LOG_SCHEMA.names:
            cols[name].append(values.get(name))

    seq = 0
    row(rank=0, step=0, seq=seq, row=S.ROW_MARKER, kind=S.MARKER_START,
        meta=json.dumps({"task": "tensor" if numel else "statistics", "level": "mix", "framework": "pytorch",
                         "dump_data_dir": None, "rank_dir": "rank"}))
    data_dir = dump / "step0" / "rank0" / "dump_tensor_data"
    if numel:
        import numpy as np
        data_dir.mkdir(parents=True, exist_ok=True)
        values = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
    prefix = "Module.model.layers" if renamed else "Module.layers"
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
        name = f"{op}.{n + 1 if renamed else n}.forward"
        seq += 1
        row(rank=0, step=0, seq=seq, row=S.ROW_CALL, kind=S.API_FORWARD, name=name, api_type=op.split(".")[0],
            parent=f"{prefix}.{layer}.Block.forward.0", keys='["input_args","input_kwargs","output"]')
        base = (emitted % 997) / 997.0 + 0.5
        for k, (io, arg) in enumerate((("input_args", "0"), ("input_args", "1"), ("output", "0"), ("output", "1"))):
            mx = base + k
            hit = emitted == perturbed and not extra and io == "output" and arg == "0"
            if hit:
                mx *= 1.01
                result["perturbed"] = name
            data_name = None
            if numel:
                data_name = f"{name}.{io}.{arg}.npy"
                scale = (1 + 1e-3) if hit else (1 + noise)
                np.save(data_dir / data_name, (values * np.float32(base + k) * np.float32(scale)).astype(np.float32))
            row(rank=0, step=0, seq=seq, row=S.ROW_LEAF, kind=S.API_FORWARD, name=name, io=io, path=f"[{arg}]",
                arg=arg, leaf_kind=S.LEAF_TENSOR, type="torch.Tensor", dtype="torch.float32",
                shape=[numel] if numel else [64, 64], numel=numel or 4096, max=mx, min=-base, mean=base / 10,
                norm=base * 30, requires_grad=True, has_nan=False, has_inf=False, data_name=data_name)
        if not extra:
            emitted += 1
        i += 1
        if not extra and emitted % 20 == 0:
            seq += 1
            row(rank=0, step=0, seq=seq, row=S.ROW_CALL, kind=S.MODULE_FORWARD,
                name=f"{prefix}.{layer}.Block.forward.0", api_type="Module",
                keys='["input_args","input_kwargs","output","parameters"]')
            layer += 1
    table = pa.table(cols, schema=S.LOG_SCHEMA)
    log_dir = dump / S.STORE_DIR / S.LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"rank0.{os.getpid()}.{time.time_ns()}{S.LOG_SUFFIX}", "wb") as sink:
        write_batches(sink, table.to_batches(max_chunksize=65536))
    return result


def child(target: str, baseline: str, out: str, threads: int, mode: str, workers: int) -> None:
    import duckdb

    duckdb.default_connection().execute(f"SET threads = {threads}")
    start = time.perf_counter()
    import msprobe.compare as C

    r = C.compare(target, baseline, out=out, formats=["summary", "parquet"], mode=mode, workers=workers)
    wall = time.perf_counter() - start
    inserted = r.con.sql("SELECT count(*) FROM alignment WHERE how = 'inserted'").fetchall()[0][0]
    deleted = r.con.sql("SELECT count(*) FROM alignment WHERE how = 'deleted'").fetchall()[0][0]
    leaves = r.con.sql("SELECT count(*) FROM tensors").fetchall()[0][0]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss = usage.ru_maxrss / 1024
    cpu = usage.ru_utime + usage.ru_stime
    first = r.first[0]
    print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(rss), "leaf_pairs": leaves,
                      "inserted": inserted, "deleted": deleted, "first_origin": first and first["name"],
                      "tensor_pairs": r.stats.get("tensor_pairs"), "stages_s": r.timings}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("stats", "names", "tensor"), default="stats")
    parser.add_argument("--calls", type=int, default=None, help="API calls (default 250,000; tensor case 50)")
    parser.add_argument("--numel", type=int, default=1_000_000, help="tensor case: elements per leaf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--keep", default=None, help="directory to keep the dumps in")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.threads, args.mode, args.workers)
        return
    calls = args.calls or (50 if args.case == "tensor" else 250_000)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="msprobe_cmp_bench_"))
    if not args.keep:
        atexit.register(shutil.rmtree, root, True)  # the generated dumps, at exit
    t0 = time.perf_counter()
    if not (root / "baseline").exists():
        numel = args.numel if args.case == "tensor" else 0
        write_log(root / "baseline", calls, numel=numel)
        inserted = tuple(range(1000, 11000, 1000)) if args.case != "tensor" else (10,)
        info = write_log(root / "target", calls, inserted=inserted, perturbed=int(calls * 0.6),
                         renamed=args.case == "names", numel=numel, noise=1e-7)
        # names: the module calls' paths differ (no mapping), so they stay unpaired
        modules = calls // 20 if args.case == "names" else 0
        info.update(case=args.case, inserted=len(inserted) + modules, deleted=modules, calls=calls, numel=numel)
        (root / "expected.json").write_text(json.dumps(info))
    info = json.loads((root / "expected.json").read_text())
    if info.get("case", "stats") != args.case:
        sys.exit(f"{root} holds case {info.get('case', 'stats')!r}, not {args.case!r}")
    tensor_bytes = 0
    if args.case == "tensor":
        for side in ("baseline", "target"):   # warm the page cache, count the bytes
            for f in (root / side / "step0" / "rank0" / "dump_tensor_data").iterdir():
                tensor_bytes += len(f.read_bytes())
    print(f"dumps ready in {time.perf_counter() - t0:.1f} s under {root}; expected first origin {info['perturbed']}")
    mode = "tensor" if args.case == "tensor" else "auto"
    proc = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--workers", str(args.workers),
                           "--mode", mode, "--child", str(root / "target"), str(root / "baseline"), str(root / "out")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr)
        sys.exit(1)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["case"] = args.case
    result["right_answer"] = (result["first_origin"] == info["perturbed"]
                              and result["inserted"] == info.get("inserted", 10)
                              and result["deleted"] == info.get("deleted", 0))
    if tensor_bytes:
        pair_mb = 2 * info["numel"] * 4 / 2**20
        result["tensor_gb"] = round(tensor_bytes / 1e9, 3)
        result["tensor_gb_per_s"] = round(tensor_bytes / 1e9 / result["wall_s"], 3)
        result["tensor_stage_gb_per_s"] = round(tensor_bytes / 1e9 / result["stages_s"]["leaf_metrics"], 3)
        result["rss_limit_mb"] = round(2 * pair_mb + 300)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
