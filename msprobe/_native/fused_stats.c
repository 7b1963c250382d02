/*
 * msprobe._native.fused_stats: Max, Min, sum and sum of squares of a contiguous buffer of
 * float32, float64, bfloat16 or float16 values in one pass over memory.
 *
 * The sum and the sum of squares are accumulated in float64: every float32/bf16/fp16 value
 * and its square are exact in float64, so for those inputs neither can overflow or
 * underflow. Several independent accumulators (vector lanes) are summed over blocks of
 * BLOCK elements, the block totals are added into a second-level accumulator over a chunk of
 * CHUNK elements, and the chunks' totals are added in chunk order, so the rounding error is
 * that of chains of about BLOCK/16 + CHUNK/BLOCK + n/CHUNK additions.
 *
 * NaN semantics: Max and Min are NaN when any element is NaN. The hot loop uses plain
 * max/min instructions (which drop NaN operands); a NaN or an infinity makes the float64
 * sum non-finite, and only then a scalar pass fills has_nan/has_inf exactly and sets Max
 * and Min to NaN if a NaN was seen. For float64 input a finite sum may overflow: the same
 * scalar pass then reports has_nan = has_inf = False.
 *
 * No -ffast-math (it would break the NaN semantics) and no -march=native: the AVX2+FMA
 * (and F16C) kernels are compiled with a per-function target attribute and chosen at import time
 * with __builtin_cpu_supports; elsewhere the portable C kernels (auto-vectorised for the
 * baseline instruction set: SSE2 on x86-64, NEON on aarch64) run.
 *
 * Fused CRC-32 (summary_mode md5): reduce_crc_at runs the same kernels (same arithmetic, same
 * order, so the six statistics are bit-identical to reduce_at's) and, right after each block
 * of BLOCK elements has been reduced (while it is still in L1/L2 cache), feeds that block's
 * bytes to a caller-supplied CRC function, then the tail elements': memory is read once.
 * The CRC function has zlib crc32 chaining semantics,
 *   uint32_t crc(uint32_t init, const unsigned char *buf, uint64_t len)   (crc(crc(0, a), b) == crc32(a + b))
 * (ISA-L's crc32_gzip_refl; Python passes its address). float32/float64/float16 are CRC'ed
 * over their raw bytes; bfloat16 over the float32 values (bits << 16, 4 bytes per element in
 * native byte order, little-endian on x86-64/aarch64), converted block by block into a small
 * buffer: the bytes of the tensor converted to float32, as spec 3.5 asks.
 *
 * Python API (METH_FASTCALL, no argument parsing beyond integers):
 *   reduce_at(address: int, n: int, kind: int[, portable]) -> (max, min, sum, sumsq, has_nan, has_inf)
 *   reduce_crc_at(address: int, n: int, kind: int, crc_fn_address: int[, portable])
 *       -> (max, min, sum, sumsq, has_nan, has_inf, crc)   crc: int in [0, 2**32), CRC from 0
 *   reduce(buffer, kind: int[, portable]) -> the same, over a C- or F-contiguous buffer
 *   snapshot_at(address: int, n: int, kind: int[, crc_fn_address: int[, portable[, align]]])
 *       -> (bytes, reduce_at's tuple, or reduce_crc_at's when crc_fn_address is not 0): a copy of
 *       the elements' bytes made block by block right after each block is reduced (task tensor:
 *       the snapshot and the statistics from one read of the source); align (0, or a power
 *       of two up to 1 MiB): above 1 the copy is a read-only memoryview starting at a
 *       multiple of align in memory, inside a bytes object (a tensor file or shard writes
 *       its whole pages without copying them again: store.direct_io); 0 and 1 give bytes
 * Errors (ValueError): kind not 0-3, n < 1, address 0, crc_fn_address 0, align not a power of two.
 * Every reduction runs on the calling thread; the GIL is released for n >= GIL_FREE_MIN (the
 * CRC function must not need it), so several threads may reduce at once.
 * portable (default False): use the portable kernels even where AVX2 ones exist (tests).
 * kind: 0 float32, 1 float64, 2 bfloat16, 3 float16 (2-byte kinds: uint16 bit patterns). n >= 1.
 * isa() -> "avx2" or "generic": the kernels in use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define KIND_F32 0
#define KIND_F64 1
#define KIND_BF16 2
#define KIND_F16 3
#define NKINDS 4

/* bytes per element of a kind (2 for the 16-bit kinds; callers check the kind's range) */
static inline size_t kind_width(long kind) { return kind == KIND_F64 ? 8 : kind == KIND_F32 ? 4 : 2; }
#define BLOCK 4096 /* elements per first-level block (a multiple of every unroll width) */
#define GIL_FREE_MIN 65536 /* release the GIL for buffers at least this large */

typedef struct {
    double max, min, sum, sumsq;
} acc_t;

/* CRC-32 with zlib chaining semantics (ISA-L crc32_gzip_refl) */
typedef uint32_t (*crc_fn)(uint32_t init, const unsigned char *buf, uint64_t len);

/* What the kernels do with each block right after reducing it (while it is in cache):
 * fn != NULL: chain the CRC of its bytes into crc; dst != NULL: copy its bytes to the same
 * offset of dst (snapshot_at). NULL context: nothing (reduce_at). */
typedef struct {
    crc_fn fn;
    uint32_t crc;
    int kind;
    unsigned char *dst;
} crc_ctx;

/* cc: NULL for the plain reduction; else crc_span runs on every element of [0, n) once */
typedef void (*kernel_fn)(const void *p, size_t n, acc_t *out, crc_ctx *cc);

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 -> float32, exact (subnormals, infinities and NaN payloads included) */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in float32 */
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    u = sign | (exp == 0x1f ? 0x7f800000u | (man << 13) : ((exp + 112u) << 23) | (man << 13));
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Copy the bytes of elements [start, end) of p to cc->dst (when set) and chain them into
 * cc->crc (when cc->fn is set; bfloat16: as float32 values, converted BLOCK elements at a time
 * into a 16 KiB stack buffer). Called by the kernels after each block and once for the tail, in
 * element order; never touches the statistics. */
static void crc_span(crc_ctx *cc, const void *p, size_t start, size_t end) {
    if (start >= end) return;
    size_t w = kind_width(cc->kind);
    if (cc->dst) memcpy(cc->dst + start * w, (const unsigned char *)p + start * w, (end - start) * w);
    if (!cc->fn) return;
    if (cc->kind == KIND_BF16) {
        const uint16_t *h = (const uint16_t *)p + start;
        uint32_t buf[BLOCK];
        size_t left = end - start;
        while (left) {
            size_t m = left < BLOCK ? left : BLOCK;
            for (size_t k = 0; k < m; k++) buf[k] = (uint32_t)h[k] << 16;
            cc->crc = cc->fn(cc->crc, (const unsigned char *)buf, (uint64_t)m * 4u);
            h += m;
            left -= m;
        }
        return;
    }
    cc->crc = cc->fn(cc->crc, (const unsigned char *)p + start * w, (uint64_t)(end - start) * w);
}

/* ---------------------------------------------------------------- portable kernels */

#define LANES 8

/* T: element type; M: type of Max/Min (float for float32/bfloat16: exact, half the width) */
#define GENERIC_KERNEL(NAME, T, M, LOAD)                                                \
    static void NAME(const void *vp, size_t n, acc_t *out, crc_ctx *cc) {               \
        const T *p = (const T *)vp;                                                     \
        M mx[LANES], mn[LANES];                                                         \
        double tot = 0.0, totq = 0.0;                                                   \
        for (int j = 0; j < LANES; j++) { mx[j] = -INFINITY; mn[j] = INFINITY; }        \
        size_t i = 0;                                                                   \
        while (i + LANES <= n) {                                                        \
            size_t start = i;                                                           \
            size_t end = i + BLOCK <= n ? i + BLOCK : n - (n - i) % LANES;              \
            double s[LANES], q[LANES];                                                  \
            for (int j = 0; j < LANES; j++) { s[j] = 0.0; q[j] = 0.0; }                 \
            for (; i < end; i += LANES) {                                               \
                for (int j = 0; j < LANES; j++) {                                       \
                    M f = LOAD(p[i + j]);                                               \
                    mx[j] = f > mx[j] ? f : mx[j];                                      \
                    mn[j] = f < mn[j] ? f : mn[j];                                      \
                    double v = (double)f;                                               \
                    s[j] += v;                                                          \
                    q[j] += v * v;                                                      \
                }                                                                       \
            }                                                                           \
            double bs = 0.0, bq = 0.0;                                                  \
            for (int j = 0; j < LANES; j++) { bs += s[j]; bq += q[j]; }                 \
            tot += bs;                                                                  \
            totq += bq;                                                                 \
            if (cc) crc_span(cc, p, start, end); /* the block is still in cache */      \
        }                                                                               \
        M m1 = -INFINITY, m2 = INFINITY;                                                \
        for (int j = 0; j < LANES; j++) {                                               \
            m1 = mx[j] > m1 ? mx[j] : m1;                                               \
            m2 = mn[j] < m2 ? mn[j] : m2;                                               \
        }                                                                               \
        if (cc) crc_span(cc, p, i, n); /* the tail */                                   \
        for (; i < n; i++) {                                                            \
            M f = LOAD(p[i]);                                                           \
            m1 = f > m1 ? f : m1;                                                       \
            m2 = f < m2 ? f : m2;                                                       \
            double v = (double)f;                                                       \
            tot += v;                                                                   \
            totq += v * v;                                                              \
        }                                                                               \
        out->max = m1; out->min = m2; out->sum = tot; out->sumsq = totq;                \
    }

#define LOAD_PLAIN(x) (x)
GENERIC_KERNEL(f32_generic, float, float, LOAD_PLAIN)
GENERIC_KERNEL(f64_generic, double, double, LOAD_PLAIN)
GENERIC_KERNEL(bf16_generic, uint16_t, float, bf16_to_f32)
GENERIC_KERNEL(f16_generic, uint16_t, float, f16_to_f32)

/* ---------------------------------------------------------------- AVX2 + FMA kernels */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define HAVE_AVX2_KERNELS 1
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* Bytes ahead of the loads that each iteration of the AVX2 kernels prefetches (into all cache
 * levels, as the loads would): the pass over a tensor that another operation has just written
 * waits less for memory. Inside recorded training steps (encoder, L1, two torch threads) it took
 * the leaf path from ~39 to ~34 ms per step (median of four runs each); the non-temporal hint
 * was no better and may evict the tensor the next operation reads. A prefetch never faults and
 * never changes a value: the statistics are those of the plain loads. 4096 bytes rather than 512:
 * half of a tensor a two-thread operation wrote sits in the other core's cache, and the farther
 * prefetch covers that latency: a 1 MiB / 4 MiB float32 output of a two-thread torch op took
 * 65 / 253 us at 512, 58 / 215 at 2048, 56 / 204 at 4096 (no better at 8192); inside recorded L1
 * steps the statistics pass went from 16.6 / 15.7 to 14.0 / 12.5 ms per step (two runs each,
 * alternating). */
#define PREFETCH_AHEAD 4096

static inline AVX2 double hsum4(__m256d v) {
    __m128d lo = _mm256_castpd256_pd128(v), hi = _mm256_extractf128_pd(v, 1);
    lo = _mm_add_pd(lo, hi);
    return _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
}

static inline AVX2 float hmax8(__m256 v) {
    float a[8];
    _mm256_storeu_ps(a, v);
    float m = a[0];
    for (int j = 1; j < 8; j++) m = a[j] > m ? a[j] : m;
    return m;
}

static inline AVX2 float hmin8(__m256 v) {
    float a[8];
    _mm256_storeu_ps(a, v);
    float m = a[0];
    for (int j = 1; j < 8; j++) m = a[j] < m ? a[j] : m;
    return m;
}

/* 8 float32 values: fold into max/min and two float64 sum/sumsq accumulator pairs */
#define F32_STEP(v, MX, MN, SA, SB, QA, QB)                                          \
    do {                                                                             \
        MX = _mm256_max_ps(v, MX);                                                   \
        MN = _mm256_min_ps(v, MN);                                                   \
        __m256d lo_ = _mm256_cvtps_pd(_mm256_castps256_ps128(v));                    \
        __m256d hi_ = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));                  \
        SA = _mm256_add_pd(SA, lo_);                                                 \
        SB = _mm256_add_pd(SB, hi_);                                                 \
        QA = _mm256_fmadd_pd(lo_, lo_, QA);                                          \
        QB = _mm256_fmadd_pd(hi_, hi_, QB);                                          \
    } while (0)

/* F32_STEP for float32 in memory at PTR (v: its 8 values, loaded): each half is converted
 * straight from memory, which saves the lane extraction (same values, same arithmetic) */
#define F32_STEP_MEM(PTR, v, MX, MN, SA, SB, QA, QB)                                 \
    do {                                                                             \
        MX = _mm256_max_ps(v, MX);                                                   \
        MN = _mm256_min_ps(v, MN);                                                   \
        __m256d lo_ = _mm256_cvtps_pd(_mm_loadu_ps(PTR));                            \
        __m256d hi_ = _mm256_cvtps_pd(_mm_loadu_ps((PTR) + 4));                      \
        SA = _mm256_add_pd(SA, lo_);                                                 \
        SB = _mm256_add_pd(SB, hi_);                                                 \
        QA = _mm256_fmadd_pd(lo_, lo_, QA);                                          \
        QB = _mm256_fmadd_pd(hi_, hi_, QB);                                          \
    } while (0)
/* the converted-register form, for 16-bit inputs widened to float32 in registers */
#define F32_STEP_REG(PTR, v, MX, MN, SA, SB, QA, QB) F32_STEP(v, MX, MN, SA, SB, QA, QB)

static inline AVX2 __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

#define NARROW_KERNEL(NAME, T, LOAD8, LOAD1, STEP)                                                   \
    static AVX2 void NAME(const void *vp, size_t n, acc_t *out, crc_ctx *cc) {                 \
        const T *p = (const T *)vp;                                                            \
        __m256 mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0;                                     \
        __m256 mn0 = _mm256_set1_ps(INFINITY), mn1 = mn0;                                      \
        __m256d tot = _mm256_setzero_pd(), totq = tot;                                         \
        size_t i = 0;                                                                          \
        while (i + 16 <= n) {                                                                  \
            size_t start = i;                                                                  \
            size_t end = i + BLOCK <= n ? i + BLOCK : n - (n - i) % 16;                        \
            __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;                       \
            __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;                                        \
            for (; i < end; i += 16) {                                                         \
                _mm_prefetch((const char *)(p + i) + PREFETCH_AHEAD, _MM_HINT_T0);            \
                __m256 a = LOAD8(p + i), b = LOAD8(p + i + 8);                                 \
                STEP(p + i, a, mx0, mn0, s0, s1, q0, q1);                                      \
                STEP(p + i + 8, b, mx1, mn1, s2, s3, q2, q3);                                  \
            }                                                                                  \
            tot = _mm256_add_pd(tot, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3))); \
            totq = _mm256_add_pd(totq, _mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3))); \
            if (cc) crc_span(cc, p, start, end); /* the block is still in cache */             \
        }                                                                                      \
        float m1 = hmax8(_mm256_max_ps(mx0, mx1)), m2 = hmin8(_mm256_min_ps(mn0, mn1));        \
        double t = hsum4(tot), tq = hsum4(totq);                                               \
        if (cc) crc_span(cc, p, i, n); /* the tail */                                          \
        for (; i < n; i++) {                                                                   \
            float f = LOAD1(p[i]);                                                             \
            m1 = f > m1 ? f : m1;                                                              \
            m2 = f < m2 ? f : m2;                                                              \
            double v = f;                                                                      \
            t += v;                                                                            \
            tq += v * v;                                                                       \
        }                                                                                      \
        out->max = m1; out->min = m2; out->sum = t; out->sumsq = tq;                           \
    }

static inline AVX2 __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

#define LOAD_F32X8(ptr) _mm256_loadu_ps(ptr)
NARROW_KERNEL(f32_avx2, float, LOAD_F32X8, LOAD_PLAIN, F32_STEP_MEM)
NARROW_KERNEL(bf16_avx2, uint16_t, load_bf16x8, bf16_to_f32, F32_STEP_REG)
NARROW_KERNEL(f16_avx2, uint16_t, load_f16x8, f16_to_f32, F32_STEP_REG)

static AVX2 void f64_avx2(const void *vp, size_t n, acc_t *out, crc_ctx *cc) {
    const double *p = (const double *)vp;
    __m256d mx0 = _mm256_set1_pd(-INFINITY), mx1 = mx0;
    __m256d mn0 = _mm256_set1_pd(INFINITY), mn1 = mn0;
    __m256d tot = _mm256_setzero_pd(), totq = tot;
    size_t i = 0;
    while (i + 8 <= n) {
        size_t start = i;
        size_t end = i + BLOCK <= n ? i + BLOCK : n - (n - i) % 8;
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
        for (; i < end; i += 8) {
            _mm_prefetch((const char *)(p + i) + PREFETCH_AHEAD, _MM_HINT_T0);
            __m256d a = _mm256_loadu_pd(p + i), b = _mm256_loadu_pd(p + i + 4);
            mx0 = _mm256_max_pd(a, mx0);
            mx1 = _mm256_max_pd(b, mx1);
            mn0 = _mm256_min_pd(a, mn0);
            mn1 = _mm256_min_pd(b, mn1);
            s0 = _mm256_add_pd(s0, a);
            s1 = _mm256_add_pd(s1, b);
            q0 = _mm256_fmadd_pd(a, a, q0);
            q1 = _mm256_fmadd_pd(b, b, q1);
        }
        tot = _mm256_add_pd(tot, _mm256_add_pd(s0, s1));
        totq = _mm256_add_pd(totq, _mm256_add_pd(q0, q1));
        if (cc) crc_span(cc, p, start, end); /* the block is still in cache */
    }
    double a[4], b[4];
    _mm256_storeu_pd(a, _mm256_max_pd(mx0, mx1));
    _mm256_storeu_pd(b, _mm256_min_pd(mn0, mn1));
    double m1 = a[0], m2 = b[0];
    for (int j = 1; j < 4; j++) {
        m1 = a[j] > m1 ? a[j] : m1;
        m2 = b[j] < m2 ? b[j] : m2;
    }
    double t = hsum4(tot), tq = hsum4(totq);
    if (cc) crc_span(cc, p, i, n); /* the tail */
    for (; i < n; i++) {
        double v = p[i];
        m1 = v > m1 ? v : m1;
        m2 = v < m2 ? v : m2;
        t += v;
        tq += v * v;
    }
    out->max = m1; out->min = m2; out->sum = t; out->sumsq = tq;
}
#endif

static const kernel_fn PORTABLE[NKINDS] = {f32_generic, f64_generic, bf16_generic, f16_generic};
static kernel_fn KERNELS[NKINDS] = {f32_generic, f64_generic, bf16_generic, f16_generic};
static const char *ISA = "generic";

/* Rare path (the sum is not finite): exact has_nan/has_inf; Max/Min NaN if any NaN. */
static void scan_special(const void *p, size_t n, int kind, acc_t *acc, int *has_nan, int *has_inf) {
    int nan = 0, inf = 0;
    for (size_t i = 0; i < n && !(nan && inf); i++) {
        double v = kind == KIND_F32 ? (double)((const float *)p)[i]
                 : kind == KIND_F64 ? ((const double *)p)[i]
                 : kind == KIND_BF16 ? (double)bf16_to_f32(((const uint16_t *)p)[i])
                 : (double)f16_to_f32(((const uint16_t *)p)[i]);
        nan |= isnan(v) != 0;
        inf |= isinf(v) != 0;
    }
    if (nan) acc->max = acc->min = NAN;
    *has_nan = nan;
    *has_inf = inf;
}

/* ---------------------------------------------------------------- chunks */

/* Buffers longer than CHUNK elements are reduced CHUNK elements at a time (a multiple of BLOCK,
 * so each chunk but the last has no tail) and the chunks' results are combined in chunk order:
 * Max/Min keep the earlier chunk's value on a tie (inside a chunk the kernels' lanes decide
 * which of -0.0 and +0.0 a zero Max/Min is, so it may differ from one pass over the whole
 * buffer), the float64 sums are added chunk after chunk. */
#define CHUNK 16384

/* The kernel over n elements, CHUNK at a time (see CHUNK); with cc, the CRC is chained and the
 * snapshot copied in element order across the chunks, as one kernel call over n would. */
static void reduce_chunks(const void *p, size_t n, int kind, kernel_fn kernel, crc_ctx *cc, acc_t *out) {
    if (n <= CHUNK) {
        kernel(p, n, out, cc);
        return;
    }
    const unsigned char *bytes = (const unsigned char *)p;
    size_t width = kind_width(kind);
    crc_ctx chunk_cc = {cc ? cc->fn : NULL, cc ? cc->crc : 0, kind, NULL};
    int per_block = cc && (cc->fn || cc->dst);
    acc_t acc, part;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t len = n - off < CHUNK ? n - off : CHUNK;
        chunk_cc.dst = cc && cc->dst ? cc->dst + off * width : NULL;
        kernel(bytes + off * width, len, &part, per_block ? &chunk_cc : NULL);
        if (off == 0) {
            acc = part;
        } else {
            acc.max = part.max > acc.max ? part.max : acc.max;
            acc.min = part.min < acc.min ? part.min : acc.min;
            acc.sum += part.sum;
            acc.sumsq += part.sumsq;
        }
    }
    if (cc && cc->fn) cc->crc = chunk_cc.crc;
    *out = acc;
}

/* The reduction of n elements of one kind at p, with the CRC-32 of their bytes chained into
 * cc->crc when cc is not NULL; NULL with ValueError for a bad kind or n. */
static PyObject *run(const void *p, Py_ssize_t n, long kind, int portable, crc_ctx *cc) {
    if (kind < 0 || kind >= NKINDS) {
        PyErr_Format(PyExc_ValueError,
                     "kind must be 0 (float32), 1 (float64), 2 (bfloat16) or 3 (float16), got %ld", kind);
        return NULL;
    }
    if (n <= 0) {
        PyErr_Format(PyExc_ValueError, "need at least one element, got n=%zd", n);
        return NULL;
    }
    acc_t acc;
    int has_nan = 0, has_inf = 0;
    kernel_fn kernel = portable ? PORTABLE[kind] : KERNELS[kind];
    if (cc) cc->kind = (int)kind;
    if (n >= GIL_FREE_MIN) {
        Py_BEGIN_ALLOW_THREADS
        reduce_chunks(p, (size_t)n, (int)kind, kernel, cc, &acc);
        if (!isfinite(acc.sum)) scan_special(p, (size_t)n, (int)kind, &acc, &has_nan, &has_inf);
        Py_END_ALLOW_THREADS
    } else {
        reduce_chunks(p, (size_t)n, (int)kind, kernel, cc, &acc);
        if (!isfinite(acc.sum)) scan_special(p, (size_t)n, (int)kind, &acc, &has_nan, &has_inf);
    }
    if (cc && cc->fn)
        return Py_BuildValue("(ddddNNk)", acc.max, acc.min, acc.sum, acc.sumsq, PyBool_FromLong(has_nan),
                             PyBool_FromLong(has_inf), (unsigned long)cc->crc);
    return Py_BuildValue("(ddddNN)", acc.max, acc.min, acc.sum, acc.sumsq,
                         PyBool_FromLong(has_nan), PyBool_FromLong(has_inf));
}

/* args[0:3] = (address, n, kind) of reduce_at and reduce_crc_at; -1 with an exception set */
static int parse_span(PyObject *const *args, void **p, Py_ssize_t *n, long *kind) {
    *p = PyLong_AsVoidPtr(args[0]);
    if (*p == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "address is 0");
        return -1;
    }
    *n = PyLong_AsSsize_t(args[1]);
    if (*n == -1 && PyErr_Occurred()) return -1;
    *kind = PyLong_AsLong(args[2]);
    if (*kind == -1 && PyErr_Occurred()) return -1;
    return 0;
}

static PyObject *reduce_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "reduce_at(address, n, kind[, portable]) takes 3 or 4 arguments");
        return NULL;
    }
    void *p;
    Py_ssize_t n;
    long kind;
    if (parse_span(args, &p, &n, &kind) < 0) return NULL;
    int portable = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (portable < 0) return NULL;
    return run(p, n, kind, portable, NULL);
}

static PyObject *reduce_crc_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "reduce_crc_at(address, n, kind, crc_fn_address[, portable]) takes 4 or 5 arguments");
        return NULL;
    }
    void *p;
    Py_ssize_t n;
    long kind;
    if (parse_span(args, &p, &n, &kind) < 0) return NULL;
    void *fn = PyLong_AsVoidPtr(args[3]);
    if (fn == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "crc_fn_address is 0: need the address of a C function "
                                              "uint32_t crc(uint32_t, const unsigned char *, uint64_t)");
        return NULL;
    }
    int portable = nargs == 5 ? PyObject_IsTrue(args[4]) : 0;
    if (portable < 0) return NULL;
    crc_ctx cc;
    /* a data pointer cannot portably be cast to a function pointer: copy the bits */
    memcpy(&cc.fn, &fn, sizeof cc.fn);
    cc.crc = 0;
    cc.dst = NULL;
    return run(p, n, kind, portable, &cc);
}

/* snapshot_at(address, n, kind, crc_fn_address=0, portable=False, align=0) -> (data, reduction)
 * data: bytes; with align > 1 a read-only memoryview of the n * width bytes inside a bytes
 * object, starting at a multiple of align in memory (the slack is at most align - 1 bytes) */
static PyObject *snapshot_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 3 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError,
                        "snapshot_at(address, n, kind[, crc_fn_address[, portable[, align]]]) takes 3 to 6 arguments");
        return NULL;
    }
    void *p;
    Py_ssize_t n;
    long kind;
    if (parse_span(args, &p, &n, &kind) < 0) return NULL;
    crc_ctx cc;
    cc.fn = NULL;
    cc.crc = 0;
    cc.dst = NULL;
    if (nargs >= 4) {
        void *fn = PyLong_AsVoidPtr(args[3]);
        if (fn == NULL && PyErr_Occurred()) return NULL;
        memcpy(&cc.fn, &fn, sizeof cc.fn); /* 0: no CRC */
    }
    int portable = nargs >= 5 ? PyObject_IsTrue(args[4]) : 0;
    if (portable < 0) return NULL;
    Py_ssize_t align = 0;
    if (nargs == 6) {
        align = PyLong_AsSsize_t(args[5]);
        if (align == -1 && PyErr_Occurred()) return NULL;
        if (align < 0 || align > (1 << 20) || (align & (align - 1)) != 0) {
            PyErr_Format(PyExc_ValueError, "align=%zd; allowed: 0, or a power of two up to 1 MiB", align);
            return NULL;
        }
    }
    if (kind < 0 || kind >= NKINDS || n <= 0) return run(p, n, kind, portable, NULL); /* its ValueError */
    Py_ssize_t w = (Py_ssize_t)kind_width(kind);
    Py_ssize_t slack = align > 1 ? align - 1 : 0;
    if (n > (PY_SSIZE_T_MAX - slack) / w) {
        PyErr_Format(PyExc_ValueError, "n=%zd elements is too many bytes for one bytes object", n);
        return NULL;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * w + slack);
    if (data == NULL) return NULL;
    char *start = PyBytes_AS_STRING(data);
    Py_ssize_t offset = slack ? (Py_ssize_t)((align - ((uintptr_t)start & (uintptr_t)(align - 1))) & (uintptr_t)(align - 1)) : 0;
    cc.dst = (unsigned char *)start + offset;
    PyObject *reduced = run(p, n, kind, portable, &cc);
    if (reduced == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    if (slack) { /* the aligned part: memoryview(data)[offset:offset + n * w] */
        PyObject *whole = PyMemoryView_FromObject(data);
        Py_DECREF(data);
        if (whole == NULL) {
            Py_DECREF(reduced);
            return NULL;
        }
        PyObject *lo = PyLong_FromSsize_t(offset), *hi = PyLong_FromSsize_t(offset + n * w);
        PyObject *range = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        data = range ? PyObject_GetItem(whole, range) : NULL;
        Py_XDECREF(range);
        Py_DECREF(whole);
        if (data == NULL) {
            Py_DECREF(reduced);
            return NULL;
        }
    }
    return Py_BuildValue("(NN)", data, reduced);
}

static PyObject *reduce_buffer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "reduce(buffer, kind[, portable]) takes 2 or 3 arguments");
        return NULL;
    }
    int portable = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (portable < 0) return NULL;
    long kind = PyLong_AsLong(args[1]);
    if (kind == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_ANY_CONTIGUOUS) != 0) return NULL;
    Py_ssize_t width = (Py_ssize_t)kind_width(kind);
    PyObject *res;
    if (view.len % width != 0) {
        PyErr_Format(PyExc_ValueError, "buffer of %zd bytes is not a whole number of %zd-byte elements",
                     view.len, width);
        res = NULL;
    } else {
        res = run(view.buf, view.len / width, kind, portable, NULL);
    }
    PyBuffer_Release(&view);
    return res;
}

/* ---- small_leaf: the whole dump record of a small plain CPU tensor in one call ---------------
 * small_leaf(t, io, path, table) -> Leaf or None
 * table = (plain_types: tuple of types, strided: the torch.strided object, dtypes: dict
 *          dtype -> (kind, itemsize, dtype_text), max_bytes: int, leaf_type: a tuple subclass,
 *          template: a tuple of the leaf's fields with the constant ones set, slots: a tuple of
 *          NSLOTS ints, where in the leaf io, path, dtype_text, shape, numel, max, min, mean,
 *          norm, requires_grad and the CRC-32 text go, crc_fn_address: 0, or the address of a
 *          CRC-32 function as reduce_crc_at takes it)
 * The field order is the caller's (store.schema.LEAF_FIELDS): this code knows none.
 * For a tensor whose exact type is in plain_types, on the CPU, strided, not nested, not a
 * negative-bit view, C-contiguous or dense in another order of its dimensions (reduced in
 * memory order, as msprobe.pytorch.stats.tensor_stats reduces such views), of a dtype in dtypes, with 1 to max_bytes bytes of elements
 * that lie inside its storage's allocation, whose elements are all finite and need no
 * rescaling (msprobe.core.statistics.rescale_factor): a leaf_type tuple holding template's
 * items with those at `slots` replaced by io, path, dtype_text, tuple(t.shape), n, max, min,
 * mean, norm and t.requires_grad, with Max and Min exact, Mean = sum / n and Norm = sqrt(sum of squares) from the same float64
 * reduction as reduce_at (a 0-dim tensor: Mean = its value, Norm = |value|), bit-identical to
 * msprobe.pytorch.stats.native_stats over reduce_at's tuple. With crc_fn_address not 0 only
 * C-contiguous tensors are taken, and the CRC-32 of their bytes (bfloat16: of their float32
 * values), computed in the same pass as reduce_crc_at does, goes in as 8 lowercase hex digits
 * (msprobe.pytorch.stats.fused_stats_crc); with 0 that field is None. Any other tensor, and any error
 * while reading its attributes (cleared), gives None: the caller then takes its own path. */
static PyObject *S_is_cpu, *S_layout, *S_is_nested, *S_is_neg, *S_is_contiguous, *S_dtype, *S_numel,
    *S_untyped_storage, *S_data_ptr, *S_nbytes, *S_dim, *S_shape, *S_requires_grad, *S_stride;

#define NSLOTS 11 /* the fields small_leaf sets: io, path, dtype, shape, numel, max, min, mean, norm, requires_grad, crc */
#define NSLOTS_TEXT "11"
#define MAX_FIELDS 64
/* the last slots tuple read (a strong reference) and, per field of the template, the index
 * in small_leaf's items of the value it takes, -1 for the template's own */
static PyObject *slots_seen = NULL;
static signed char field_source[MAX_FIELDS];
static Py_ssize_t source_len = -1;
#define RESCALE_BIG 0x1p400
#define RESCALE_SMALL 0x1p-400

/* the attribute `name` of o is exactly `want` (True, False, an object); -1 on error */
static int attr_is(PyObject *o, PyObject *name, PyObject *want) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int same = v == want;
    Py_DECREF(v);
    return same;
}

/* o.name() is exactly `want`; -1 on error */
static int method_is(PyObject *o, PyObject *name, PyObject *want) {
    PyObject *v = PyObject_CallMethodNoArgs(o, name);
    if (v == NULL) return -1;
    int same = v == want;
    Py_DECREF(v);
    return same;
}

/* o.name() as a C integer (Py_ssize_t or address); -1 with an exception set on error */
static long long method_ll(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_CallMethodNoArgs(o, name);
    if (v == NULL) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return x;
}

/* 1 if t's elements fill a block of memory exactly once in some order of its dimensions
 * (x.t(), x.permute(...): no gap, no stride 0; msprobe.pytorch.stats.is_dense), 0 if not,
 * -1 on error. Its element [0, ..., 0] is then the block's lowest address (strides >= 0). */
static int dense_view(PyObject *t) {
    PyObject *strides = PyObject_CallMethodNoArgs(t, S_stride);
    if (strides == NULL) return -1;
    PyObject *shape = PyObject_GetAttr(t, S_shape);
    if (shape == NULL) {
        Py_DECREF(strides);
        return -1;
    }
    int dense = 0;
    Py_ssize_t nd = PyTuple_Check(strides) && PyTuple_Check(shape) ? PyTuple_GET_SIZE(strides) : -1;
    long long st[64], sz[64];
    Py_ssize_t k = 0;
    if (nd >= 0 && nd <= 64 && PyTuple_GET_SIZE(shape) == nd) {
        dense = 1;
        for (Py_ssize_t i = 0; i < nd && dense; i++) {
            long long a = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
            long long b = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
            if (PyErr_Occurred()) dense = -1;
            else if (b != 1) { /* insertion by stride */
                Py_ssize_t j = k++;
                while (j > 0 && st[j - 1] > a) { st[j] = st[j - 1]; sz[j] = sz[j - 1]; j--; }
                st[j] = a;
                sz[j] = b;
            }
        }
        long long expected = 1;
        for (Py_ssize_t i = 0; i < k && dense == 1; i++) {
            if (st[i] != expected) dense = 0;
            expected *= sz[i];
        }
    }
    Py_DECREF(strides);
    Py_DECREF(shape);
    return dense;
}

static PyObject *small_leaf(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != 8) {
        PyErr_SetString(PyExc_TypeError, "small_leaf(tensor, io, path, table) takes 4 arguments; table: "
                                         "(plain_types, strided, dtypes, max_bytes, leaf_type, template, slots, "
                                         "crc_fn_address)");
        return NULL;
    }
    PyObject *t = args[0], *table = args[3];
    PyObject *plain = PyTuple_GET_ITEM(table, 0), *strided = PyTuple_GET_ITEM(table, 1);
    PyObject *dtypes = PyTuple_GET_ITEM(table, 2), *leaf_type = PyTuple_GET_ITEM(table, 4);
    PyObject *template = PyTuple_GET_ITEM(table, 5), *slots = PyTuple_GET_ITEM(table, 6);
    if (!PyTuple_Check(plain) || !PyDict_Check(dtypes) || !PyType_Check(leaf_type)
        || !PyType_IsSubtype((PyTypeObject *)leaf_type, &PyTuple_Type) || !PyTuple_Check(template)
        || !PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) != NSLOTS) {
        PyErr_SetString(PyExc_TypeError, "small_leaf: table needs a tuple of types, a dict, a tuple subclass, "
                                         "a template tuple and a tuple of " NSLOTS_TEXT " slots");
        return NULL;
    }
    Py_ssize_t nfields = PyTuple_GET_SIZE(template);
    if (slots != slots_seen || nfields != source_len) { /* read once per slots tuple (held) */
        if (nfields > MAX_FIELDS) {
            PyErr_SetString(PyExc_ValueError, "small_leaf: the template has too many fields");
            return NULL;
        }
        signed char source[MAX_FIELDS];
        memset(source, -1, sizeof source);
        for (int i = 0; i < NSLOTS; i++) {
            Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, i));
            if (at == -1 && PyErr_Occurred()) return NULL;
            if (at < 0 || at >= nfields || source[at] != -1) {
                PyErr_SetString(PyExc_ValueError, "small_leaf: a slot lies outside the template or twice in slots");
                return NULL;
            }
            source[at] = (signed char)i;
        }
        memcpy(field_source, source, sizeof source);
        source_len = nfields;
        Py_INCREF(slots);
        Py_XSETREF(slots_seen, slots);
    }
    long long max_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(table, 3));
    if (max_bytes == -1 && PyErr_Occurred()) return NULL;
    void *crc_address = PyLong_AsVoidPtr(PyTuple_GET_ITEM(table, 7)); /* NULL for 0: no CRC-32 */
    if (crc_address == NULL && PyErr_Occurred()) return NULL;
    int found = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(plain); i++)
        found |= (PyObject *)Py_TYPE(t) == PyTuple_GET_ITEM(plain, i);
    if (!found) Py_RETURN_NONE;

    PyObject *dtype = NULL, *storage = NULL, *shape = NULL, *leaf = NULL;
    int ok;
    if ((ok = attr_is(t, S_is_cpu, Py_True)) != 1) goto none;
    if ((ok = attr_is(t, S_layout, strided)) != 1) goto none;
    if ((ok = attr_is(t, S_is_nested, Py_False)) != 1) goto none;
    if ((ok = method_is(t, S_is_neg, Py_False)) != 1) goto none;
    if ((ok = method_is(t, S_is_contiguous, Py_True)) == -1) goto none;
    if (!ok && (crc_address != NULL || dense_view(t) != 1)) goto none; /* a CRC-32 reads the bytes in C order */
    dtype = PyObject_GetAttr(t, S_dtype);
    if (dtype == NULL) goto none;
    PyObject *entry = PyDict_GetItemWithError(dtypes, dtype); /* borrowed */
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) goto none;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    long long width = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
    PyObject *dtype_text = PyTuple_GET_ITEM(entry, 2);
    if (PyErr_Occurred() || kind < 0 || kind >= NKINDS || width != (long long)kind_width(kind)) goto none;
    long long n = method_ll(t, S_numel);
    if (n < 1 || n * width > max_bytes || n >= GIL_FREE_MIN) goto none; /* small: reduced holding the GIL */
    storage = PyObject_CallMethodNoArgs(t, S_untyped_storage);
    if (storage == NULL) goto none; /* a torch.func transform's wrapper: no storage */
    long long start = method_ll(storage, S_data_ptr);
    long long nbytes = start == -1 ? -1 : method_ll(storage, S_nbytes);
    long long ptr = nbytes == -1 ? -1 : method_ll(t, S_data_ptr);
    if (PyErr_Occurred()) goto none;
    /* the n elements from ptr lie in the allocation: not for a storage freed or shrunk by
     * resize_ (a view's pointer is then its offset) nor functionalize's wrappers (address 0) */
    if (!start || ptr < start || ptr + n * width > start + nbytes) goto none;
    int zero_dim = 0;
    if (n == 1) {
        long long dim = method_ll(t, S_dim);
        if (dim == -1) goto none;
        zero_dim = dim == 0;
    }
    acc_t acc;
    crc_ctx cc = {NULL, 0, (int)kind, NULL};
    memcpy(&cc.fn, &crc_address, sizeof cc.fn); /* a data pointer cannot portably be cast to a function pointer */
    reduce_chunks((const void *)(uintptr_t)ptr, (size_t)n, (int)kind, KERNELS[kind], crc_address ? &cc : NULL, &acc);
    if (!isfinite(acc.sum) || !isfinite(acc.sumsq) || !isfinite(acc.max) || !isfinite(acc.min)) goto none;
    double m = fmax(fabs(acc.max), fabs(acc.min));
    if (!(m == 0.0 || (RESCALE_SMALL < m && m < RESCALE_BIG))) goto none;
    double mean = zero_dim ? acc.max : acc.sum / (double)n;
    double norm = zero_dim ? fabs(acc.max) : sqrt(acc.sumsq);
    PyObject *shape_obj = PyObject_GetAttr(t, S_shape);
    if (shape_obj == NULL) goto none;
    shape = PySequence_Tuple(shape_obj);
    Py_DECREF(shape_obj);
    if (shape == NULL) goto none;
    PyObject *rg = PyObject_GetAttr(t, S_requires_grad);
    if (rg == NULL) goto none;
    int requires_grad = PyObject_IsTrue(rg);
    Py_DECREF(rg);
    if (requires_grad < 0) goto none;
    char crc_text[9];
    if (crc_address) snprintf(crc_text, sizeof crc_text, "%08x", (unsigned)(cc.crc & 0xFFFFFFFFu));
    /* in the order of `slots`: io, path, dtype_text, shape (borrowed), then new references,
     * requires_grad (borrowed), the CRC-32 text (new) or None (borrowed) */
    PyObject *items[NSLOTS] = {args[1], args[2], dtype_text, shape, PyLong_FromLongLong(n),
                               PyFloat_FromDouble(acc.max), PyFloat_FromDouble(acc.min), PyFloat_FromDouble(mean),
                               PyFloat_FromDouble(norm), requires_grad ? Py_True : Py_False,
                               crc_address ? PyUnicode_FromStringAndSize(crc_text, 8) : Py_None};
    int built = items[4] && items[5] && items[6] && items[7] && items[8] && items[10];
    if (built) leaf = ((PyTypeObject *)leaf_type)->tp_alloc((PyTypeObject *)leaf_type, nfields);
    if (leaf != NULL) {
        for (Py_ssize_t i = 0; i < nfields; i++) {
            int k = field_source[i];
            PyObject *item = k < 0 ? PyTuple_GET_ITEM(template, i) : items[k];
            if (k < 4 || k == 9 || (k == 10 && !crc_address)) Py_INCREF(item); /* the new references move in */
            PyTuple_SET_ITEM(leaf, i, item);
        }
    } else {
        for (int i = 4; i <= 8; i++) Py_XDECREF(items[i]);
        if (crc_address) Py_XDECREF(items[10]);
    }
    Py_DECREF(shape);
    Py_DECREF(storage);
    Py_DECREF(dtype);
    return leaf; /* NULL with MemoryError set when an allocation failed */
none:
    PyErr_Clear();
    Py_XDECREF(shape);
    Py_XDECREF(storage);
    Py_XDECREF(dtype);
    Py_RETURN_NONE;
}

static PyObject *isa(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(ISA);
}

static PyMethodDef METHODS[] = {
    {"reduce_at", (PyCFunction)(void (*)(void))reduce_at, METH_FASTCALL,
     "reduce_at(address, n, kind, portable=False) -> (max, min, sum, sumsq, has_nan, has_inf)\n\n"
     "Reduce n contiguous elements at a raw address (the caller keeps the memory alive).\n"
     "kind: 0 float32, 1 float64, 2 bfloat16, 3 float16. Sums in float64."},
    {"reduce_crc_at", (PyCFunction)(void (*)(void))reduce_crc_at, METH_FASTCALL,
     "reduce_crc_at(address, n, kind, crc_fn_address, portable=False)\n"
     "    -> (max, min, sum, sumsq, has_nan, has_inf, crc)\n\n"
     "reduce_at's statistics (bit-identical) and, in the same pass over memory, the CRC-32 of\n"
     "the elements' bytes (bfloat16: of their float32 values) computed with the C function at\n"
     "crc_fn_address, uint32_t crc(uint32_t init, const unsigned char *buf, uint64_t len) with\n"
     "zlib crc32 chaining semantics (ISA-L crc32_gzip_refl). crc: int, from init 0."},
    {"snapshot_at", (PyCFunction)(void (*)(void))snapshot_at, METH_FASTCALL,
     "snapshot_at(address, n, kind, crc_fn_address=0, portable=False, align=0) -> (data, reduction)\n\n"
     "A copy of the n elements' bytes (data: bytes, n * element size; with align > 1, a power of\n"
     "two, a read-only memoryview of them inside a bytes object, starting at a multiple of align\n"
     "in memory) and their reduction in the\n"
     "same pass over memory: each block is copied right after it is reduced, while it is in\n"
     "cache. reduction: reduce_at's tuple (bit-identical), or reduce_crc_at's when\n"
     "crc_fn_address is not 0."},
    {"reduce", (PyCFunction)(void (*)(void))reduce_buffer, METH_FASTCALL,
     "reduce(buffer, kind, portable=False) -> (max, min, sum, sumsq, has_nan, has_inf)\n\n"
     "The same over a contiguous buffer (numpy array, memoryview); its length in bytes\n"
     "must be a multiple of the element size of kind."},
    {"small_leaf", (PyCFunction)(void (*)(void))small_leaf, METH_FASTCALL,
     "small_leaf(tensor, io, path, table) -> Leaf or None\n\n"
     "The dump leaf (statistics included, and the CRC-32 when the table names a CRC function)\n"
     "of a small contiguous plain CPU tensor with finite values in one call; None for any\n"
     "other tensor (see the comment above small_leaf)."},
    {"isa", isa, METH_NOARGS, "isa() -> 'avx2' or 'generic': the kernels chosen at import."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "fused_stats",
    "One-pass Max, Min, sum and sum of squares (float64) of float32/float64/bfloat16/float16 buffers,\n"
    "optionally with the CRC-32 of their bytes in the same pass.",
    -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_fused_stats(void) {
#ifdef HAVE_AVX2_KERNELS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        KERNELS[KIND_F32] = f32_avx2;
        KERNELS[KIND_F64] = f64_avx2;
        KERNELS[KIND_BF16] = bf16_avx2;
        KERNELS[KIND_F16] = f16_avx2;
        ISA = "avx2";
    }
#endif
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(S_is_cpu, "is_cpu");
    INTERN(S_layout, "layout");
    INTERN(S_is_nested, "is_nested");
    INTERN(S_is_neg, "is_neg");
    INTERN(S_is_contiguous, "is_contiguous");
    INTERN(S_dtype, "dtype");
    INTERN(S_numel, "numel");
    INTERN(S_untyped_storage, "untyped_storage");
    INTERN(S_data_ptr, "data_ptr");
    INTERN(S_nbytes, "nbytes");
    INTERN(S_dim, "dim");
    INTERN(S_shape, "shape");
    INTERN(S_requires_grad, "requires_grad");
    INTERN(S_stride, "stride");
#undef INTERN
    PyObject *module = PyModule_Create(&MODULE);
    /* the form of small_leaf's table: 3 = (..., leaf_type, template, slots of 11 fields, crc_fn_address) */
    if (module != NULL && PyModule_AddIntConstant(module, "SMALL_LEAF_TABLE", 3) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
