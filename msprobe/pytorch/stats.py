"""Tensor statistics for dump records (spec section 3.4, with the fixes of section 9).

=====================  =====================  ==================================
tensor                 Max / Min              Mean / Norm
=====================  =====================  ==================================
empty, meta           null                   null
sparse (COO, CSR, CSC, over the matrix it represents: stored values and
BSR, BSC)              implicit zeros (:func:`sparse_stats`), never densified
bool                   any() / all()          null
complex                max/min of ``|z|``     mean of ``|z|`` / sqrt(sum ``|z|**2``)
float16/bfloat16/fp32  exact, source dtype    host: float64 (native pass; without
                                              it float64 up to 4096 elements, float32
                                              cascade above); device: Mean and Norm
                                              float64
float64, integer       exact (float64)        float64
0-dim (non-bool)       the value              Mean = value, Norm = ``|value|``
=====================  =====================  ==================================

NaN propagates through Max/Min (``has_nan``); when Max or Min is not finite,
``Max_except_inf_nan``/``Min_except_inf_nan`` are the max/min over the finite elements
(over the non-NaN ones when no element is finite; NaN when all are NaN).
CRC-32 (dump.json ``md5``, spec 3.5): the zlib CRC-32 (:mod:`msprobe.core.checksum`) of the C-order bytes of the tensor
on the host, bf16 converted to float32 first, as 8 lowercase hex digits.

Host (CPU) float32/bfloat16/float16/float64 tensors take the native pass when the optional
C extension ``msprobe._native.fused_stats`` is built (``pip install -e .`` with a C
compiler; :data:`NATIVE` is then the module, else None): one read of the memory gives Max,
Min and the float64 sum and sum of squares (Mean = sum / n, Norm = sqrt(sum of squares)).
Without it (or with ``MSPROBE_NO_NATIVE_STATS=1``) numpy and torch compute them
(``_small_f32_stats``, ``_host_stats``).

summary_mode md5 needs both the statistics and the CRC-32: for those tensors (plain,
contiguous, with data) :func:`fused_stats_crc` gets both from one read of the memory
(``NATIVE.reduce_crc_at`` with ISA-L's C CRC function, :data:`FUSED_CRC`); the statistics are
bit-identical to :func:`native_stats` over ``reduce_at`` and the CRC to :func:`crc32_hex`.
Without ``isal`` (or the extension) :data:`FUSED_CRC` is None and the two passes run.

Example: ``torch.tensor([1., -2., 3.])`` → Max 3.0, Min -2.0, Mean 0.6667, Norm 3.7417.
"""
from __future__ import annotations

import ctypes
import math
import zlib
from typing import Optional

import numpy as np
import torch

from msprobe._native import KIND_BF16, KIND_F16, KIND_F32, KIND_F64, load_fused_stats
from msprobe.core.checksum import C_CRC32, crc32
from msprobe.core.statistics import RESCALE_BIG as _BIG
from msprobe.core.statistics import RESCALE_SMALL as _SMALL
from msprobe.core.statistics import TensorStats, rescale_factor

#: the compiled one-pass statistics (``msprobe._native.fused_stats``), or None when it is
#: not built or ``MSPROBE_NO_NATIVE_STATS=1``: then numpy/torch compute them (see ``_host_stats``)
NATIVE = load_fused_stats()


def _fused_crc_address() -> Optional[int]:
    """:data:`msprobe.core.checksum.C_CRC32` when :data:`NATIVE` has ``reduce_crc_at`` and a
    self-test through it (300 float32 values: CRC against ``zlib.crc32``, statistics against
    ``reduce_at``) passes; else None."""
    if NATIVE is None or C_CRC32 is None or not hasattr(NATIVE, "reduce_crc_at"):
        return None
    a = np.random.default_rng(5).standard_normal(300).astype(np.float32)
    try:
        got = NATIVE.reduce_crc_at(a.ctypes.data, a.size, KIND_F32, C_CRC32)
        plain = NATIVE.reduce_at(a.ctypes.data, a.size, KIND_F32)
    except (TypeError, ValueError):  # pragma: no cover - an incompatible build
        return None
    if len(got) != 7 or got[6] != zlib.crc32(a.tobytes()) or tuple(got[:6]) != tuple(plain):
        return None
    return C_CRC32


#: address of the C CRC-32 function :func:`fused_stats_crc` passes to ``NATIVE.reduce_crc_at``,
#: or None (no extension, an old build without ``reduce_crc_at``, no ``isal``, or a failed
#: self-test): summary_mode md5 then computes statistics and CRC-32 in two passes
FUSED_CRC = _fused_crc_address()

_F64 = torch.float64
_F32 = torch.float32
_LOW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# dtypes numpy reads directly (host path); bf16 and complex go through torch first
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
                           torch.int32, torch.int64, torch.uint8})
#: dtypes the native pass reads, and their ``kind`` codes
NATIVE_KIND = {torch.float32: KIND_F32, torch.float64: KIND_F64, torch.bfloat16: KIND_BF16,
               torch.float16: KIND_F16}
_CHUNK = 1 << 20  # elements converted to float64 at a time on the host path
#: CPU float tensors up to this many elements get float64-accumulated Mean/Norm (numpy);
#: larger float32 ones take PyTorch's fused float32 reductions (see ``_host_stats``)
SMALL_NUMEL = 1 << 12
_TINY = 2.0 ** -56  # below this |max|, _norm32's float32 squares lose precision
_ROW = 256  # elements per partial norm in _norm32
#: tensor types whose memory the fast path may read directly (subclasses such as DTensor or
#: FakeTensor may override data access, so they take the general path)
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_NUMPY_OF = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
             torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
             torch.uint8: np.uint8, torch.bool: np.bool_,
             torch.complex64: np.complex64, torch.complex128: np.complex128}


def _dtypes(*names: str) -> frozenset:
    """The ``torch`` dtypes of these names that this PyTorch has (others are skipped)."""
    return frozenset(d for d in (getattr(torch, name, None) for name in names) if isinstance(d, torch.dtype))


#: the 8-bit float dtypes of this PyTorch (no numpy dtype holds them; float32 holds their values exactly)
_FLOAT8 = _dtypes("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
#: dtypes PyTorch stores but cannot compute with (no copy, comparison or arithmetic kernel):
#: sub-byte integers, raw bit containers, packed float4. Their leaves get dtype and shape
#: with all-null statistics (the same as a tensor without readable data).
OPAQUE_DTYPES = _dtypes("bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float4_e2m1fn_x2",
                        *(f"uint{n}" for n in range(1, 8)), *(f"int{n}" for n in range(1, 8)))


def host_array(x: torch.Tensor, any_order: bool = False) -> np.ndarray:
    """A flat numpy view of a CPU tensor's values, valid while ``x`` lives.

    ``Tensor.numpy()`` is not used on purpose: it marks the tensor's storage as not
    resizable for ever, which breaks code that frees storages by resizing them (FSDP).
    Non-contiguous tensors (and conj/neg views) are copied first, into C order; with
    ``any_order`` a dense one (:func:`is_dense`, such as ``x.t()``) is read in memory
    order without a copy (enough for order-free reductions such as Max or a sum).
    """
    x = x.resolve_conj().resolve_neg()
    if not x.is_contiguous():
        x = in_memory_order(x) if any_order else x.contiguous()
    n = x.numel()
    if n == 0:
        return np.empty(0, dtype=_NUMPY_OF[x.dtype])
    buf = (ctypes.c_char * (n * x.element_size())).from_address(x.data_ptr())
    buf._owner = x  # the array's base keeps the tensor (maybe a fresh contiguous copy) alive
    return np.frombuffer(buf, dtype=_NUMPY_OF[x.dtype], count=n)


def is_dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements fill a block of memory exactly once: contiguous in some
    order of its dimensions (``x.t()``, ``x.permute(...)``), no gap, no broadcast stride 0."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def in_memory_order(x: torch.Tensor) -> torch.Tensor:
    """The elements of ``x`` as a contiguous 1-D tensor: a view in memory order when ``x``
    is dense (no copy), else a C-order copy."""
    if x.is_contiguous():
        return x.view(-1)
    if is_dense(x):
        return x.as_strided((x.numel(),), (1,), x.storage_offset())
    return x.contiguous().view(-1)


def computable(t: torch.Tensor) -> torch.Tensor:
    """The values statistics are computed over: ``t`` itself, or for a quantized tensor
    (``torch.qint8``, ``quint8``, ``qint32``, ``quint4x2``, per tensor or per channel) its
    dequantized float32 values, ``(q - zero_point) * scale``, which is what the tensor means
    numerically (its integer codes alone depend on the scale chosen)."""
    if t.is_quantized:
        with torch.no_grad():
            return t.dequantize()
    return t


#: quantized dtypes packing several values in a byte
_PACKED_QUANTIZED = _dtypes("quint4x2", "quint2x4")


def opaque(t: torch.Tensor) -> bool:
    """True for a tensor whose values no PyTorch kernel reads: a dtype of
    :data:`OPAQUE_DTYPES`, or a view of a packed quantized dtype (``quint4x2``,
    ``quint2x4``) other than a whole contiguous tensor. PyTorch 2.13 has no copy kernel for
    those (``dequantize()`` of ``q.t()`` raises) and reads the others from the wrong bytes
    (``q[1:3].dequantize()`` and ``int_repr()`` start at the byte, not the value, of the
    storage offset). Such leaves get null statistics, and no CRC-32 where its bytes are not
    its own contiguous block.

    Args:
        t: any tensor.
    """
    if t.dtype in OPAQUE_DTYPES:
        return True
    return t.dtype in _PACKED_QUANTIZED and not (t.is_contiguous() and t.storage_offset() == 0)


def has_data(t: torch.Tensor) -> bool:
    """False for tensors whose values cannot be read (meta, sparse, other layouts, empty,
    storage freed by resizing it to 0 bytes as FSDP does, or shrunk below what ``t``
    views: :func:`storage_covers`)."""
    if not (t.layout == torch.strided and not t.is_meta and t.numel() > 0):
        return False
    return storage_holds(t) is not False  # None: a tensor subclass without a storage


def storage_holds(t: torch.Tensor) -> Optional[bool]:
    """:func:`storage_covers` of the non-empty strided ``t`` and its own storage's size
    (False for a storage freed to 0 bytes); None when ``t`` has no storage to ask (a
    ``torch.func`` wrapper, a tensor subclass)."""
    try:
        nbytes = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return None
    return storage_covers(t, nbytes)


def storage_covers(t: torch.Tensor, nbytes: int) -> bool:
    """Whether a storage of ``nbytes`` bytes holds every element the non-empty strided
    tensor ``t`` views: ``(storage_offset + 1 + sum((size - 1) * stride)) * element_size
    <= nbytes`` (packed quantized dtypes: that many elements, 2 or 4 per byte). A storage
    resized below that (``untyped_storage().resize_()``, as FSDP frees parameter memory)
    leaves views whose data pointer is not 0 and whose elements lie outside the
    allocation: reading them would crash the process."""
    elements = t.storage_offset() + 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())
                                            if size > 0)
    per_byte = _PER_BYTE.get(t.dtype)
    if per_byte is not None:  # a packed quantized dtype: elements share bytes
        return -(-elements // per_byte) <= nbytes
    return elements * t.element_size() <= nbytes


#: elements per byte of the packed quantized dtypes (their element_size() says 1)
_PER_BYTE = {dtype: n for name, n in (("quint4x2", 2), ("quint2x4", 4))
             if (dtype := getattr(torch, name, None)) is not None}


def materialized(t: torch.Tensor) -> torch.Tensor:
    """``t``, or for a ZeroTensor (``torch._efficientzerotensor``, which autograd formulas
    make for gradients known to be zero: no memory, ``data_ptr()`` 0 while its storage
    reports bytes) a new tensor of the zeros it stands for, same dtype, shape, device and
    ``requires_grad``. Readers of memory (the native pass, CRC-32, payload copies) must not
    touch address 0."""
    is_zero = getattr(t, "_is_zerotensor", None)
    if is_zero is None or t.layout != torch.strided or not is_zero():
        return t
    return torch.zeros(t.shape, dtype=t.dtype, device=t.device, requires_grad=t.requires_grad)


def tensor_stats(t: torch.Tensor, *, high: bool = False) -> TensorStats:
    """Compute the statistics of ``t`` (any shape/dtype/device); never modifies ``t``.

    ``high`` (config.json ``precision: "high"``): Mean and Norm accumulate in float64 on
    every path; without it the host fallback for large float16/bfloat16/float32 tensors
    (no native extension) accumulates in float32 (:func:`_host_stats`). Every other path
    accumulates in float64 either way.

    Raises nothing for odd tensors: those without readable data and those of a dtype
    PyTorch cannot compute with (:func:`opaque`: :data:`OPAQUE_DTYPES`, views of packed
    quantized tensors) get all-null stats; a quantized
    tensor (``torch.qint8``...) gets the statistics of its dequantized values
    (:func:`computable`).
    """
    if t.layout in SPARSE_LAYOUTS:
        return sparse_stats(t, high=high)
    if not has_data(t):
        return TensorStats()
    t = materialized(t)
    if NATIVE is not None and t.dtype in NATIVE_KIND and t.is_cpu and type(t) in PLAIN_TYPES:
        return native_stats(t, _native_reduce(t))
    if opaque(t):
        return TensorStats()
    if t.is_quantized:
        t = computable(t)
    if t.dtype is _F32 and t.is_cpu and type(t) in PLAIN_TYPES:
        fast = _small_f32_stats(t)
        if fast is not None:
            return fast
    s = TensorStats()
    with torch.no_grad():
        x = t.detach()
        dtype = x.dtype
        if dtype == torch.bool:
            s.max = float(bool(x.any()))
            s.min = float(bool(x.all()))
            s.has_nan = s.has_inf = False
            return s
        if x.device.type == "cpu" and (dtype in _NUMPY_DTYPES or dtype == torch.bfloat16 or x.is_complex()):
            vals = _host_stats(x, high)
        elif x.is_complex():
            mag = x.abs().to(_F64)
            vals = torch.stack([mag.max(), mag.min(), mag.mean(), torch.linalg.vector_norm(mag)]).tolist()
        elif dtype in _LOW_FLOATS:
            mn, mx = torch.aminmax(x)
            vals = torch.stack([
                mx.to(_F64), mn.to(_F64), x.mean(dtype=_F64),
                torch.linalg.vector_norm(x, dtype=_F64),  # float32 squares overflow above ~1.8e19
            ]).tolist()
        else:
            x64 = x.to(_F64)
            mn, mx = torch.aminmax(x64)
            vals = torch.stack([mx, mn, x64.mean(), torch.linalg.vector_norm(x64)]).tolist()
        s.max, s.min, s.mean, s.norm = vals
        if x.dim() == 0:  # its value (spec 3.2: item()), -0.0 included; Norm |x| (section 9)
            s.mean = s.max
            s.norm = abs(s.max)
        fin_max, fin_min = math.isfinite(s.max), math.isfinite(s.min)
        s.has_nan = math.isnan(s.max) or math.isnan(s.min)
        s.has_inf = (not s.has_nan) and (math.isinf(s.max) or math.isinf(s.min))
        if not (fin_max and fin_min):
            _except_inf_nan(x, s)
        else:
            _rescaled(x, s)
    return s


#: layouts whose stored values stand for a larger matrix with implicit zeros
SPARSE_LAYOUTS = frozenset((torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc))


def sparse_stats(t: torch.Tensor, *, high: bool = False) -> TensorStats:
    """The statistics of the matrix a sparse tensor (:data:`SPARSE_LAYOUTS`) represents,
    from its stored values, without densifying it: Max/Min over the stored values and,
    when some elements are not stored, the implicit zeros; Mean = sum of the stored values
    / ``t.numel()``; Norm = sqrt(sum of the squared stored values) (the zeros add nothing).
    An uncoalesced COO tensor is coalesced first (duplicate indices add up, as in the
    matrix). Stored values are reduced by :func:`tensor_stats` (float64 sums), so a hybrid
    tensor's dense dimensions and block layouts' blocks count element by element. bool:
    Max = any, Min = all (False when a zero is implicit). Meta tensors and empty ones give
    null statistics; ``Max_except_inf_nan``/``Min_except_inf_nan`` include the implicit
    zeros (which are finite)."""
    numel = t.numel()
    if numel == 0 or t.device.type == "meta":
        return TensorStats()
    with torch.no_grad():
        x = t.detach()
        if x.layout is torch.sparse_coo and not x.is_coalesced():
            x = x.coalesce()
        values = x.values()
    stored = values.numel()
    zeros = stored < numel
    if stored == 0:
        s = TensorStats()
        s.max = s.min = 0.0
        s.mean = s.norm = None if t.dtype == torch.bool else 0.0
        s.has_nan = s.has_inf = False
        return s
    s = tensor_stats(values.reshape(-1), high=high)
    if s.max is None or not zeros:
        return s
    if t.dtype == torch.bool:
        s.min = 0.0
        return s
    s.max = s.max if math.isnan(s.max) else max(s.max, 0.0)
    s.min = s.min if math.isnan(s.min) else min(s.min, 0.0)
    if s.mean is not None:
        s.mean = s.mean * stored / numel
    if s.max_finite is not None:  # stored values hold NaN or Inf: the zeros are finite
        s.max_finite = 0.0 if math.isnan(s.max_finite) else max(s.max_finite, 0.0)
        s.min_finite = 0.0 if math.isnan(s.min_finite) else min(s.min_finite, 0.0)
    return s


def _rescaled(t: torch.Tensor, s: TensorStats) -> TensorStats:
    """``s`` with Mean and Norm recomputed over ``t / f`` and scaled back where
    :func:`msprobe.core.statistics.rescale_factor` gives a factor ``f`` (magnitudes whose
    float64 sums overflow or whose squares underflow); else ``s`` unchanged."""
    scale = rescale_factor(s)
    if scale is None:
        return s
    with torch.no_grad():
        x = t.detach()
        y = (x.abs() if x.is_complex() else x).to(_F64) / scale
        s.mean = float(y.sum()) / y.numel() * scale if y.dim() else s.max
        s.norm = float(torch.linalg.vector_norm(y)) * scale if y.dim() else abs(s.max)
    return s


def _native_reduce(x: torch.Tensor) -> tuple:
    """``NATIVE`` over a non-empty real CPU tensor of a dtype in ``NATIVE_KIND``, read in
    memory order (a dense view such as ``x.t()`` without a copy, any other view copied):
    ``(max, min, sum, sumsq, has_nan, has_inf)``, sums in float64."""
    if x.is_neg() or not (x.is_contiguous() or is_dense(x)):
        x = x.detach().resolve_neg()  # no autograd record for the copies below
        if not (x.is_contiguous() or is_dense(x)):
            x = x.contiguous()
    # a dense tensor's lowest address is its element [0, ..., 0] (strides are >= 0); x holds
    # the memory until the call returns
    return NATIVE.reduce_at(x.data_ptr(), x.numel(), NATIVE_KIND[x.dtype])


def native_stats(t: torch.Tensor, reduced: tuple, n: Optional[int] = None,
                 zero_dim: Optional[bool] = None) -> TensorStats:
    """:func:`tensor_stats` of a plain CPU float32/float64/bfloat16/float16 tensor with data,
    from ``reduced``, the native pass over it (``(max, min, sum, sumsq, has_nan, has_inf)``,
    :func:`_native_reduce`): Max/Min exact, Mean = sum / n and Norm = sqrt(sum of squares)
    accumulated in float64 over the source values; the rare non-finite case fills the
    ``*_except_inf_nan`` fields with :func:`_except_inf_nan`, and magnitudes whose float64
    sums overflow or underflow are rescaled (:func:`_rescaled`). Spec 3.4 and section 9
    (a 0-dim tensor: Max = Min = Mean = its value, Norm = ``|value|``).

    Args:
        t: the tensor ``reduced`` was computed over (any shape; read again only in the rare
            non-finite or rescaled case).
        reduced: ``(max, min, sum, sumsq, has_nan, has_inf)``: floats (sums in float64 over
            the source values) and bools.
        n, zero_dim: ``t.numel()`` and ``t.dim() == 0`` when the caller has them (None:
            read from ``t``).

    Example: ``torch.tensor([1.0, -3.0])`` reduced to ``(1.0, -3.0, -2.0, 10.0, False, False)``
    gives Max 1.0, Min -3.0, Mean -1.0, Norm sqrt(10) = 3.1623; ``torch.tensor(-0.0)``
    gives Mean -0.0 (its value; the float64 sum from +0.0 is +0.0). Raises nothing."""
    mx, mn, total, squares, has_nan, has_inf = reduced
    if zero_dim is None:
        zero_dim = not t.dim()
    s = TensorStats()
    s.max, s.min = mx, mn
    # a 0-dim tensor reports its value (spec 3.2: item()); a float64 sum from +0.0 would lose -0.0
    s.mean = mx if zero_dim else total / (t.numel() if n is None else n)
    s.norm = abs(mx) if zero_dim else math.sqrt(squares)
    s.has_nan, s.has_inf = has_nan, has_inf
    if not (math.isfinite(mx) and math.isfinite(mn)):
        with torch.no_grad():
            _except_inf_nan(t.detach(), s)
    amx, amn = abs(mx), abs(mn)
    if amx < _BIG and amn < _BIG and (amx > _SMALL or amn > _SMALL):  # NaN, inf: compare False
        return s
    return _rescaled(t, s)


def fused_stats_crc(t: torch.Tensor, kind: int) -> tuple[TensorStats, str]:
    """Statistics and CRC-32 of ``t`` in one pass over its memory (summary_mode md5):
    ``(native_stats(t, ...), crc)``, equal to ``(tensor_stats(t), crc32_hex(t))``: the
    statistics bit for bit (the same kernels as :func:`_native_reduce`), the CRC over the same
    bytes (bfloat16 as float32; spec 3.5).

    Args:
        t: a plain (:data:`PLAIN_TYPES`) C-contiguous CPU tensor, not a neg/conj view, with at
            least one element and data (:func:`has_data`), of a dtype in :data:`NATIVE_KIND`;
            the caller checks this (memory is read at ``t.data_ptr()``).
        kind: ``NATIVE_KIND[t.dtype]``.

    Returns ``(TensorStats, 8 lowercase hex digits)``. Raises ValueError when :data:`FUSED_CRC`
    is None (no fused pass here), and (from the extension) for a ``kind`` outside 0-3.
    """
    if FUSED_CRC is None:
        raise ValueError("fused statistics + CRC-32 unavailable (FUSED_CRC is None): use tensor_stats and crc32_hex")
    reduced = NATIVE.reduce_crc_at(t.data_ptr(), t.numel(), kind, FUSED_CRC)
    return native_stats(t, reduced[:6]), format(reduced[6] & 0xFFFFFFFF, "08x")


def _small_f32_stats(t: torch.Tensor) -> Optional[TensorStats]:
    """The common case in a few microseconds: a small, contiguous, finite CPU float32
    tensor with readable data (:func:`has_data`; numpy on its memory, Mean and Norm in
    float64). None: take the general path."""
    n = t.numel()
    if n > SMALL_NUMEL or not t.is_contiguous() or t.is_neg():
        return None
    a = host_array(t)
    mx = float(np.maximum.reduce(a))
    mn = float(np.minimum.reduce(a))
    if not (math.isfinite(mx) and math.isfinite(mn)):
        return None
    a64 = a.astype(np.float64)
    s = TensorStats()
    s.max, s.min = mx, mn
    s.mean = float(np.add.reduce(a64)) / n if t.dim() else mx  # 0-dim: its value, -0.0 included
    s.norm = math.sqrt(float(np.dot(a64, a64))) if t.dim() else abs(mx)
    s.has_nan = s.has_inf = False
    return s


def _host_stats(x: torch.Tensor, high: bool = False) -> list[float]:
    """Max, Min, Mean, Norm of a CPU tensor, single-threaded.

    * with :data:`NATIVE` (the compiled one-pass reduction) and a float32/bfloat16/float16/
      float64 tensor (complex: ``|z|``): Max/Min exact (NaN if any NaN), Mean = sum / n and
      Norm = sqrt(sum of squares) with the sums accumulated in float64 over the source
      values (float32/bf16/fp16 values and their squares are exact in float64, so nothing
      overflows or underflows; blocked multi-accumulator sums, relative error ~1e-15 of
      ``sum(|x|)``), one read of each element: about 0.4 ms per 1M float32 elements on one
      AVX2 core (memory bandwidth). Otherwise (extension absent, or integer tensors):
    * Max/Min: exact, over the source values; NaN propagates;
    * small tensors (at most ``SMALL_NUMEL`` elements) and all float64/integer tensors:
      numpy, Mean and Norm accumulated in float64 (buffered cast, no full float64 copy);
    * larger float16/bfloat16/float32 tensors (fp16/bf16 widened to float32 first): one
      ``torch.aminmax`` pass, PyTorch's float32 cascade sum for Mean (error below
      ``eps32 * log2(n) * sum(|x|)``, typically ~1e-8 relative) and :func:`_norm32` for
      Norm (typically ~1e-7 relative); spec section 9 asks for at least float32
      accumulation. Both are re-done in float64 if they overflow while the data is finite.
      With ``high`` (``precision: "high"``) these tensors take numpy's float64 path too.

    Complex tensors go through ``|z|``. This fallback costs about 1.6 ms per 1M float32
    elements on one core (three passes), numpy's float64 path about 0.9 ms.
    """
    if x.is_complex():
        x = x.abs()
    if NATIVE is not None and x.dtype in NATIVE_KIND:
        mx, mn, total, squares, _, _ = _native_reduce(x)
        return [mx, mn, total / x.numel(), math.sqrt(squares)]
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.to(_F32)
    x = x.resolve_conj().resolve_neg()
    n = x.numel()
    if x.dtype == _F32 and n > SMALL_NUMEL and not high:
        x = in_memory_order(x)  # the statistics do not depend on the order of the elements
        mn_t, mx_t = torch.aminmax(x)
        mx, mn = mx_t.item(), mn_t.item()
        total = x.sum().item()
        norm = _norm32(x.view(-1))
        finite = math.isfinite(mx) and math.isfinite(mn)
        tiny = 0.0 < max(abs(mx), abs(mn)) < _TINY  # float32 squares underflow: Norm 0 or inexact
        if finite and (tiny or not (math.isfinite(total) and math.isfinite(norm))):
            a = host_array(x, any_order=True)
            total = float(np.add.reduce(a, dtype=np.float64))
            norm = _norm64(a)
        return [mx, mn, total / n, norm]
    a = host_array(x, any_order=True)
    with np.errstate(all="ignore"):
        mx = float(np.maximum.reduce(a))
        mn = float(np.minimum.reduce(a))
        mean = float(np.add.reduce(a, dtype=np.float64)) / a.size
        norm = _norm64(a)
    return [mx, mn, mean, norm]


def _norm32(x: torch.Tensor) -> float:
    """L2 norm of a contiguous 1-D float32 tensor, accumulated in float32 but accurately.

    ``vector_norm`` over a whole CPU tensor accumulates each SIMD lane sequentially: on data
    with many equal values (anything that went through bf16) its error reaches 1e-4
    relative. Norms of 256-element rows keep those chains short; their squares are then
    added by PyTorch's cascade sum (error a few float32 ulps), at the same cost.
    """
    n = x.numel()
    body = n - n % _ROW
    sq = torch.linalg.vector_norm(x[:body].view(-1, _ROW), dim=1).square_().sum().item()
    if body < n:
        sq += torch.linalg.vector_norm(x[body:]).item() ** 2
    return math.sqrt(sq)


def _norm64(a: np.ndarray) -> float:
    squares = 0.0
    for start in range(0, a.size, _CHUNK):
        c = a[start:start + _CHUNK].astype(np.float64)
        squares += float(np.dot(c, c))
    return math.sqrt(squares)


def _except_inf_nan(x: torch.Tensor, s: TensorStats) -> None:
    """Rare path: Max/Min not finite. Fills has_nan/has_inf exactly and the except fields."""
    v = x.abs() if x.is_complex() else x
    v = v.to(_F64)
    nan = torch.isnan(v)
    inf = torch.isinf(v)
    s.has_nan = bool(nan.any())
    s.has_inf = bool(inf.any())
    finite = v[~(nan | inf)]
    if finite.numel():
        s.max_finite, s.min_finite = float(finite.max()), float(finite.min())
        return
    not_nan = v[~nan]
    if not_nan.numel():
        s.max_finite, s.min_finite = float(not_nan.max()), float(not_nan.min())
    else:
        s.max_finite = s.min_finite = float("nan")


def crc32_hex(t: torch.Tensor) -> Optional[str]:
    """CRC-32 of the tensor's C-order host bytes (bf16 and float8 → float32 first, as spec 3.5
    does for bf16; a quantized tensor's
    integer codes, ``int_repr()``; a contiguous tensor of an :data:`OPAQUE_DTYPES` dtype its
    stored bytes), 8 hex digits.

    Empty tensors give ``"00000000"``; tensors without readable data, views of packed
    quantized tensors (:func:`opaque`) and non-contiguous opaque-dtype tensors give None.
    """
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    if t.numel() and not has_data(t):  # storage freed: its memory must not be read
        return None
    with torch.no_grad():
        x = t.detach()
        if x.is_quantized:  # the stored integer codes
            if opaque(x):  # a packed view: int_repr() reads other values' bytes
                return None
            x = x.int_repr()
        elif x.dtype in OPAQUE_DTYPES:  # the stored bytes, when they lie in C order
            if not x.is_contiguous():
                return None
            x = x.view(-1).view(torch.uint8)  # 1-d first: a 0-dim bits16 has no byte view
        if x.dtype == torch.bfloat16 or x.dtype in _FLOAT8:  # numpy has no such dtype: exact in float32
            x = x.to(_F32)
        x = x.cpu()
        if x.dtype not in _NUMPY_OF:
            return None
        arr = host_array(x)
        return format(crc32(arr.view(np.uint8)) & 0xFFFFFFFF, "08x")
