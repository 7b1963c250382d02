"""Cost of CPU tensor statistics: the native one-pass reduction (msprobe._native.fused_stats)
against the torch passes it replaces, single-threaded.

    python benchmarks/fused_stats.py [--numel 4194304] [--reps 30]

Prints min and median milliseconds per call for a large tensor (float32, bfloat16, float16, float64)
and microseconds per ``tensor_stats`` call for small float32 tensors, with the extension and
with ``NATIVE = None`` (the fallback). Not collected by pytest.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _times(fn, reps: int) -> tuple[float, float]:
    ts = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - start)
    return min(ts) * 1e3, statistics.median(ts) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=4 << 20)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args(argv)

    import torch

    import msprobe.pytorch.stats as stats

    torch.set_num_threads(1)
    native = stats.NATIVE
    print(f"native: {native.isa() if native else None}")
    n = args.numel
    x = torch.randn(n)

    def three_passes(t):
        mn, mx = torch.aminmax(t)
        mx.item(), mn.item()
        t.sum().item()
        stats._norm32(t)

    rows = [("float32 aminmax", lambda: torch.aminmax(x)),
            ("float32 sum", lambda: x.sum().item()),
            ("float32 _norm32", lambda: stats._norm32(x)),
            ("float32 three passes", lambda: three_passes(x))]
    if native:
        rows.append(("float32 fused pass", lambda: native.reduce_at(x.data_ptr(), n, 0)))
        b, d, h = x.to(torch.bfloat16), x.to(torch.float64), x.to(torch.float16)
        rows += [("bfloat16 fused pass", lambda: native.reduce_at(b.data_ptr(), n, 2)),
                 ("float16 fused pass", lambda: native.reduce_at(h.data_ptr(), n, 3)),
                 ("float16 widen + three passes", lambda: three_passes(h.float())),
                 ("float64 fused pass", lambda: native.reduce_at(d.data_ptr(), n, 1))]
        if native.isa() != "generic":
            rows.append(("float32 fused pass, portable kernel",
                         lambda: native.reduce_at(x.data_ptr(), n, 0, True)))
    for name, fn in rows:
        lo, med = _times(fn, args.reps)
        print(f"{name:40s} min {lo:7.3f} ms  median {med:7.3f} ms  ({lo / n * 1e6:.3f} ms per M)")

    for label, mod in (("native", native), ("fallback", None)):
        stats.NATIVE = mod
        if label == "native" and mod is None:
            continue
        for size in (1, 256, 4096, 65536, n):
            t = torch.randn(size)
            lo, med = _times(lambda: stats.tensor_stats(t), max(args.reps, 2000 if size <= 4096 else 20))
            print(f"tensor_stats {label:8s} {size:8d} elements: min {lo * 1e3:9.1f} us  median {med * 1e3:9.1f} us")
    stats.NATIVE = native


if __name__ == "__main__":
    main()
