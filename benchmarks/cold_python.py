"""How much slower the recorder's Python gets after a large tensor operation (cache and TLB
contents evicted), the state every recorded call runs in during training. Times one
statistics-memo hit of ``LeafBuilder.tensor_leaf`` (about 10 us in a tight loop) right
after an in-place pass over a buffer of 0-64 MiB, and one ``store.records.Leaf`` build and
one 20-item tuple build after a 32 MiB pass; then, warm and after a 32 MiB pass, one
scalar argument's leaf by the direct path of ``LeafBuilder.leaves`` and by walking it
(``walk_leaves``), and single PyTorch attribute reads (``str(t.dtype)``, ``tuple(t.shape)``,
``t.data_ptr()``): each distinct one costs microseconds once its code has left the caches.
Not a test.

    python benchmarks/cold_python.py
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from msprobe.pytorch.leaves import LeafBuilder  # noqa: E402
from store.records import Leaf  # noqa: E402


def median_us(fn, sweep, runs=200):
    times = []
    for _ in range(runs):
        if sweep is not None:
            sweep.mul_(1.0)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e6


def main():
    torch.set_num_threads(1)
    builder = LeafBuilder(md5=False, with_data=True, capture=None)
    builder.memo.layout_free = True
    x = torch.randn(8, 128, 256)
    builder.tensor_leaf("output", (0,), x)  # from now on a memo hit
    hit = lambda: builder.tensor_leaf("output", (0,), x)  # noqa: E731
    for mib in (0, 1, 2, 4, 8, 16, 32, 64):
        sweep = torch.randn(mib << 18) if mib else None
        print(f"after a {mib:2d} MiB pass: tensor_leaf (memo hit) {median_us(hit, sweep):6.1f} us")
    sweep = torch.randn(32 << 18)
    leaf = lambda: Leaf(io="output", path=(0,), leaf_kind="tensor", type="torch.Tensor",  # noqa: E731
                        dtype="torch.float32", shape=(8, 128, 256), numel=262144, max=1.0, min=-1.0,
                        mean=0.0, norm=1.0, requires_grad=False, has_nan=False, has_inf=False)
    items = ("output", (0,), "tensor", "torch.Tensor", "torch.float32", (8, 128, 256), 262144, 1.0, -1.0, 0.0,
             1.0, None, None, None, False, False, False, None, None, None)
    build = lambda: tuple(items)  # noqa: E731
    for name, fn in (("Leaf(...)", leaf), ("tuple of 20", build)):
        print(f"{name:12s} warm {median_us(fn, None):6.1f} us, after a 32 MiB pass {median_us(fn, sweep):6.1f} us")
    out: list = []
    small = torch.randn(64)
    cases = (
        ("scalar leaf, direct", lambda: builder.leaves("input_args", 0.5, out, (1,))),
        ("scalar leaf, walked", lambda: builder.walk_leaves("input_args", 0.5, out, (1,))),
        ("str(t.dtype)", lambda: str(small.dtype)),
        ("tuple(t.shape)", lambda: tuple(small.shape)),
        ("t.data_ptr()", small.data_ptr),
    )
    for name, fn in cases:
        print(f"{name:20s} warm {median_us(fn, None):6.1f} us, after a 32 MiB pass {median_us(fn, sweep):6.1f} us")
        out.clear()


if __name__ == "__main__":
    main()
