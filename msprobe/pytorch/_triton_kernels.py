"""The Triton kernels of :mod:`msprobe.pytorch.triton_stats` (imported on first use: only
where a CUDA tensor is recorded and Triton is installed)."""
import triton
import triton.language as tl


@triton.jit
def accumulators(BLOCK: tl.constexpr):
    """Empty per-lane accumulators of both kernels: NaN count, max/min over non-NaN values,
    max/min over finite values, sum, sum of squares (float64)."""
    inf = float("inf")
    # one tensor each: the kernels update some with +=
    return (tl.zeros([BLOCK], dtype=tl.float64),
            tl.full([BLOCK], -inf, dtype=tl.float64), tl.full([BLOCK], inf, dtype=tl.float64),
            tl.full([BLOCK], -inf, dtype=tl.float64), tl.full([BLOCK], inf, dtype=tl.float64),
            tl.zeros([BLOCK], dtype=tl.float64), tl.zeros([BLOCK], dtype=tl.float64))


@triton.jit
def reduced(nans, nn_max, nn_min, fin_max, fin_min, total, squares):
    """The accumulators of :func:`accumulators` reduced over their lanes."""
    return (tl.sum(nans, axis=0), tl.max(nn_max, axis=0), tl.min(nn_min, axis=0), tl.max(fin_max, axis=0),
            tl.min(fin_min, axis=0), tl.sum(total, axis=0), tl.sum(squares, axis=0))


@triton.jit
def rows(x_ptr, out_ptr, n, FINAL: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr,
          COLS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    base = pid * (BLOCK * ITERS)
    lanes = tl.arange(0, BLOCK)
    inf = float("inf")
    nans, nn_max, nn_min, fin_max, fin_min, total, squares = accumulators(BLOCK)
    for i in range(ITERS):
        offs = base + i * BLOCK + lanes
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float64)
        is_nan = x != x
        finite = inside & (tl.abs(x) < inf)  # false for ±inf and NaN
        number = inside & (x == x)
        nans += tl.where(inside & is_nan, 1.0, 0.0)
        nn_max = tl.maximum(nn_max, tl.where(number, x, -inf))
        nn_min = tl.minimum(nn_min, tl.where(number, x, inf))
        fin_max = tl.maximum(fin_max, tl.where(finite, x, -inf))
        fin_min = tl.minimum(fin_min, tl.where(finite, x, inf))
        total += tl.where(inside, x, 0.0)
        squares += tl.where(inside, x * x, 0.0)
    n_nan, r_nn_max, r_nn_min, r_fin_max, r_fin_min, r_total, r_squares = reduced(
        nans, nn_max, nn_min, fin_max, fin_min, total, squares)
    if FINAL:
        store_final(out_ptr, n_nan, r_nn_max, r_nn_min, r_fin_max, r_fin_min, r_total, r_squares)
    else:
        row = out_ptr + pid * COLS
        tl.store(row + 0, n_nan)
        tl.store(row + 1, r_nn_max)
        tl.store(row + 2, r_nn_min)
        tl.store(row + 3, r_fin_max)
        tl.store(row + 4, r_fin_min)
        tl.store(row + 5, r_total)
        tl.store(row + 6, r_squares)

@triton.jit
def store_final(out_ptr, n_nan, nn_max, nn_min, fin_max, fin_min, total, squares):
    nan = float("nan")
    tl.store(out_ptr + 0, tl.where(n_nan > 0, nan, nn_max))
    tl.store(out_ptr + 1, tl.where(n_nan > 0, nan, nn_min))
    tl.store(out_ptr + 2, nn_max)
    tl.store(out_ptr + 3, nn_min)
    tl.store(out_ptr + 4, fin_max)
    tl.store(out_ptr + 5, fin_min)
    tl.store(out_ptr + 6, total)
    tl.store(out_ptr + 7, tl.sqrt(squares))

@triton.jit
def combine(rows_ptr, out_ptr, count, BLOCK: tl.constexpr, COLS: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    inf = float("inf")
    nans, nn_max, nn_min, fin_max, fin_min, total, squares = accumulators(BLOCK)
    for start in range(0, count, BLOCK):
        idx = start + lanes
        inside = idx < count
        row = rows_ptr + idx.to(tl.int64) * COLS
        nans += tl.load(row + 0, mask=inside, other=0.0)
        nn_max = tl.maximum(nn_max, tl.load(row + 1, mask=inside, other=-inf))
        nn_min = tl.minimum(nn_min, tl.load(row + 2, mask=inside, other=inf))
        fin_max = tl.maximum(fin_max, tl.load(row + 3, mask=inside, other=-inf))
        fin_min = tl.minimum(fin_min, tl.load(row + 4, mask=inside, other=inf))
        total += tl.load(row + 5, mask=inside, other=0.0)
        squares += tl.load(row + 6, mask=inside, other=0.0)
    n_nan, r_nn_max, r_nn_min, r_fin_max, r_fin_min, r_total, r_squares = reduced(
        nans, nn_max, nn_min, fin_max, fin_min, total, squares)
    store_final(out_ptr, n_nan, r_nn_max, r_nn_min, r_fin_max, r_fin_min, r_total, r_squares)
