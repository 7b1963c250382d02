"""Cost of the sync-free device statistics (msprobe.pytorch.deferred) on a CUDA device.

For tensors of several sizes and dtypes, prints per recorded tensor: the host (CPU) time
of :func:`stats_vector` (the kernel launches the recorder pays on the training thread),
the device time of its kernels, the number of kernels it launches, and the device time
of one plain reduction (``x.sum()``) over the same tensor for scale; then the cost of
one flush (:meth:`DeferredStats.resolve`) of 1,000 pending vectors. Not a test.

    python benchmarks/device_stats.py [--device cuda] [--repeat 200]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from msprobe.pytorch.deferred import DeferredStats, PendingLeaf, stats_vector  # noqa: E402
from store import schema  # noqa: E402
from store.records import Call, Leaf  # noqa: E402


def device_ms(fn, repeat):
    """Mean device milliseconds of ``fn`` (CUDA events around ``repeat`` calls)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def host_us(fn, repeat):
    """Mean host microseconds of ``fn`` (kernels queued, not waited for)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / repeat * 1e6


def kernels(fn):
    """Number of device kernels ``fn`` launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    print("device:", torch.cuda.get_device_name(dev), "torch", torch.__version__)
    print("| dtype | numel | host µs/tensor | device µs/tensor | kernels | device µs of x.sum() |")
    print("|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for numel in (1_000, 1_000_000, 16_000_000):
            x = torch.randn(numel, device=dev).to(dtype)
            row = (str(dtype).replace("torch.", ""), numel, host_us(lambda: stats_vector(x), args.repeat),
                   device_ms(lambda: stats_vector(x), args.repeat) * 1e3, kernels(lambda: stats_vector(x)),
                   device_ms(lambda: x.sum(), args.repeat) * 1e3)
            print("| %s | %d | %.1f | %.1f | %d | %.1f |" % row)
    x = torch.randn(4096, device=dev)
    leaf = Leaf(io="output", path=(0,), leaf_kind=schema.LEAF_TENSOR, type="torch.Tensor", dtype="torch.float32",
                shape=(4096,), numel=4096)
    call = Call(step=0, kind=schema.CALL_KINDS[0], name="Torch.neg.0.forward", api_type="Torch")
    d = DeferredStats()
    for _ in range(1000):
        d.add(call, [PendingLeaf(leaf, stats_vector(x))])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = d.resolve()
    t1 = time.perf_counter()
    print("resolve of 1000 pending vectors: %.2f ms host, %d transfer(s), %d calls" % ((t1 - t0) * 1e3, d.transfers, len(out)))


if __name__ == "__main__":
    main()
