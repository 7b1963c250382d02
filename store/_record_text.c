/* store._record_text: the dump.json text of entry values in C (optional extension).
 *
 * An Encoder object is what store.record_text.records_encoder() returns when this module
 * is built: encoder(value, indent, out) appends to the list `out` one str, the text
 * json.dumps(store.entries._plain(value), indent=1) writes for `value` nested at `indent`
 * (upstream msprobe writes dump.json with json.dumps(..., indent=1)). Every byte of that
 * text is ASCII (ensure_ascii), so it is built in one char buffer and copied into a str
 * once.
 *
 * Values: dict (exact type, keys exact str), list, str, float, int (exact types), bool,
 * None, and tuples, the leaves store.entries.EntryBuilder keeps:
 *   - a tensor record, the 12 fields of store.entries.RECORD_FIELDS, written here when
 *     every field has the type EntryBuilder gives it (str/None, shape a tuple of ints or
 *     None, floats or None, requires_grad a bool or None);
 *   - a value leaf (value_json,) with value_json a str: parsed by json.loads, written by
 *     the same encoder at its depth;
 *   - any other tuple is handed to the Python callable `slow_leaf(leaf, indent)`
 *     (store.record_text._leaf_text), which returns its text or raises.
 * Anything else (a subclass of float, int, str, dict or list, a dict key that is not a
 * str, any other object) raises store.json_text._NotPlainJson, as the Python encoder
 * does: the caller then falls back to json.dumps. Nesting deeper than the interpreter's
 * recursion limit raises RecursionError. An `indent` that is not all spaces goes to the
 * Python encoder `fallback_factory()` makes.
 *
 * Floats are written as float.__repr__ writes them (NaN, Infinity, -Infinity as json.dumps
 * does): see write_double and short_repr below.
 *
 * Like the Python encoder, an Encoder keeps the text of each record and value leaf it
 * wrote, per depth, and writes an equal leaf again by copying that text. Only leaves of
 * exact types are looked up or kept, and a record with a zero float (0.0 and -0.0 are
 * equal keys, different texts) is neither: equal keys then have equal texts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define N_FIELDS 12
#define MAX_CACHED_DEPTH 64 /* indents (in spaces) up to this keep leaf texts */

/* --- output buffer ----------------------------------------------------------------------- */
typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int buf_reserve(Buf *b, Py_ssize_t need) {
    if (b->cap - b->len >= need)
        return 0;
    return buf_grow(b, need);
}

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

#define PUT_LIT(b, lit) buf_put((b), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* `lead` (a literal of 1-2 chars: "\n" or ",\n" or "{\n") then `n` spaces */
static inline int buf_break(Buf *b, const char *lead, Py_ssize_t lead_len, Py_ssize_t n) {
    if (buf_reserve(b, lead_len + n) < 0)
        return -1;
    memcpy(b->data + b->len, lead, (size_t)lead_len);
    memset(b->data + b->len + lead_len, ' ', (size_t)n);
    b->len += lead_len + n;
    return 0;
}

/* --- scalars -------------------------------------------------------------------------------- */
static const char HEX[] = "0123456789abcdef";

static inline char *put_u_escape(char *p, Py_UCS4 c) {
    p[0] = '\\';
    p[1] = 'u';
    p[2] = HEX[(c >> 12) & 0xf];
    p[3] = HEX[(c >> 8) & 0xf];
    p[4] = HEX[(c >> 4) & 0xf];
    p[5] = HEX[c & 0xf];
    return p + 6;
}

/* json.encoder.encode_basestring_ascii(s): "..." with \" \\ \n \r \t \b \f, every other
 * character outside ' '..'~' as \uXXXX (lower-case hex; UTF-16 surrogate pairs above
 * U+FFFF). `s` is a str (any subclass: only its characters are read). */
static int write_str(Buf *b, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (PyUnicode_IS_ASCII(s)) {
        const unsigned char *c = (const unsigned char *)data;
        Py_ssize_t i = 0;
        while (i < n && c[i] >= ' ' && c[i] <= '~' && c[i] != '"' && c[i] != '\\')
            i++;
        if (i == n) { /* nothing to escape */
            if (buf_reserve(b, n + 2) < 0)
                return -1;
            char *p = b->data + b->len;
            *p++ = '"';
            memcpy(p, c, (size_t)n);
            p[n] = '"';
            b->len += n + 2;
            return 0;
        }
    }
    /* at most 12 chars per code point (a surrogate pair), 6 in the BMP */
    Py_ssize_t per = kind == PyUnicode_4BYTE_KIND ? 12 : 6;
    if (n > (PY_SSIZE_T_MAX - 2) / per) {
        PyErr_NoMemory();
        return -1;
    }
    if (buf_reserve(b, n * per + 2) < 0)
        return -1;
    char *p = b->data + b->len;
    *p++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= ' ' && c <= '~' && c != '"' && c != '\\') {
            *p++ = (char)c;
            continue;
        }
        switch (c) {
        case '"': *p++ = '\\'; *p++ = '"'; break;
        case '\\': *p++ = '\\'; *p++ = '\\'; break;
        case '\n': *p++ = '\\'; *p++ = 'n'; break;
        case '\r': *p++ = '\\'; *p++ = 'r'; break;
        case '\t': *p++ = '\\'; *p++ = 't'; break;
        case '\b': *p++ = '\\'; *p++ = 'b'; break;
        case '\f': *p++ = '\\'; *p++ = 'f'; break;
        default:
            if (c >= 0x10000) {
                Py_UCS4 v = c - 0x10000;
                p = put_u_escape(p, 0xd800 | ((v >> 10) & 0x3ff));
                p = put_u_escape(p, 0xdc00 | (v & 0x3ff));
            } else {
                p = put_u_escape(p, c);
            }
        }
    }
    *p++ = '"';
    b->len = p - b->data;
    return 0;
}

/* --- float.__repr__ ---------------------------------------------------------------------
 * float.__repr__(x) is PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL): the
 * shortest decimal string that reads back as x and, of those, the closest to x (David
 * Gay's dtoa, mode 0), in fixed notation for 1e-4 <= |x| < 1e16, else d.ddde-XX. That
 * call costs about 0.5 us for the 16-17 digit statistics of float32 tensors, most of the
 * encoder's time. For 2**-47 <= |x| < 2**52 (normal), short_repr finds the same digits
 * with exact 128-bit integer arithmetic, and leaves to PyOS_double_to_string every case
 * where a reading rule could matter: a candidate on the boundary of x's rounding interval
 * (where round-half-even reading decides) and two candidates equally close to x.
 *
 * x = m * 2**e (m < 2**53). In units of 2**(e-2) (D = 2**k, k = 2 - e), x is X = 4m, the
 * interval of reals that read back as x lies between L = 4m - 2 (4m - 1 when m = 2**52:
 * the double below is closer) and H = 4m + 2. A decimal c * 10**q lies strictly inside
 * when L/D < c * 10**q < H/D, i.e. for q = -t < 0: L * 5**t < c * 2**(k - t) (k > t in
 * this range: a shift), for q >= 0: L < c * (10**q * 2**k). The shortest decimals are
 * those of the largest q with such a c (then no c is a multiple of 10: c/10 would do at
 * q + 1); "some c at q" holds for every q below the largest one, so the largest is found
 * by a galloping then binary search between a q that surely has one (10**q at most a
 * third of the interval) and one that surely has none (10**q above x). The digits are
 * those of the c closest to x. */
#ifdef __SIZEOF_INT128__
#define HAVE_SHORT_REPR 1
typedef unsigned __int128 u128;
static u128 POW10[18]; /* 10**0 .. 10**17, filled at import */
static u128 POW5[32];  /* 5**0 .. 5**31 */
#define SHORT_MIN 7.105427357601002e-15 /* 2**-47: below, 5**t would not fit */
#define SHORT_MAX 4503599627370496.0    /* 2**52: beyond, x is an integer of 16+ digits */

/* The candidates c at q: a < c * unit < b, where unit is 2**shift (q < 0, div == 0) or
 * div (q >= 0); xx is x in the same scale. */
typedef struct {
    u128 a, b, xx, div;
    int shift;
} Scale;

static inline Scale scaled(u128 L, u128 H, u128 X, int k, int q) {
    Scale r;
    if (q < 0) {
        u128 f = POW5[-q];
        r.a = L * f;
        r.b = H * f;
        r.xx = X * f;
        r.shift = k + q;
        r.div = 0;
    } else {
        r.a = L;
        r.b = H;
        r.xx = X;
        r.shift = 0;
        r.div = POW10[q] << k;
    }
    return r;
}

static inline u128 floor_div(u128 v, const Scale *s) {
    return s->div ? v / s->div : v >> s->shift;
}

static inline u128 times_unit(u128 c, const Scale *s) {
    return s->div ? c * s->div : c << s->shift;
}

/* floor(e * log10(2)) for |e| < 1000, or one less when e < 0 (78913 / 2**18 exceeds
 * log10(2) by 3e-6): a lower bound for e < 0, and an upper bound for e >= 0 */
static inline int floor_log10_pow2(int e) {
    return e >= 0 ? (e * 78913) >> 18 : -(((-e) * 78913 + (1 << 18) - 1) >> 18);
}

static inline int has_candidate(u128 L, u128 H, int k, int q) {
    Scale s = scaled(L, H, 0, k, q);
    return times_unit(floor_div(s.a, &s) + 1, &s) < s.b; /* the least c with c*unit > a */
}

/* the repr of x (finite, SHORT_MIN <= |x| < SHORT_MAX) in out (>= 32 bytes): its length,
 * or 0 when PyOS_double_to_string must decide */
static int short_repr(double x, char *out) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint64_t frac = bits & ((1ULL << 52) - 1);
    int biased = (int)((bits >> 52) & 0x7ff);
    uint64_t m = frac | (1ULL << 52);
    int e = biased - 1075; /* x = m * 2**e, -99 <= e <= -1 in this range */
    int k = 2 - e;         /* 3 .. 101 */
    if (biased == 0 || e < -99 || e > -1)
        return 0;
    u128 X = (u128)m << 2, H = X + 2, L = frac == 0 ? X - 1 : X - 2;
    /* 10**q_lo <= 2**e / 10: the interval (>= 0.75 * 2**e) holds a c at q_lo */
    int q_lo = floor_log10_pow2(e) - 1;
    /* above x's leading digit: c * 10**q < 2**(e + 53) has no c >= 1 for q >= q_hi
     * (e + 53 < 0: floor_log10_pow2 may be one low, hence + 2) */
    int q_hi = floor_log10_pow2(e + 53) + 2;
    /* H * 5**31 < 2**55 * 2**72 fits; q < 0 means k + q > 0 (-q <= 0.31 * -e + 2 < k) */
    if (q_lo < -31 || q_hi > 17 || k + q_lo <= 0 || !has_candidate(L, H, k, q_lo))
        return 0;
    /* largest q in [q_lo, q_hi) with a candidate: gallop up, then bisect */
    int step = 1, bad = q_hi;
    while (q_lo + step < q_hi) {
        if (!has_candidate(L, H, k, q_lo + step)) {
            bad = q_lo + step;
            break;
        }
        q_lo += step;
        step *= 2;
    }
    while (bad - q_lo > 1) {
        int mid = q_lo + (bad - q_lo) / 2;
        if (has_candidate(L, H, k, mid))
            q_lo = mid;
        else
            bad = mid;
    }
    int q = q_lo;
    Scale sc = scaled(L, H, X, k, q);
    /* a decimal with these digits (or fewer) on a boundary: the reading rule decides */
    if (times_unit(floor_div(sc.a, &sc), &sc) == sc.a || times_unit(floor_div(sc.b, &sc), &sc) == sc.b)
        return 0;
    u128 cf = floor_div(sc.xx, &sc), below = times_unit(cf, &sc), unit = times_unit(1, &sc);
    u128 rem = sc.xx - below;
    u128 c;
    if (rem == 0) {
        c = cf;
    } else {
        int low_ok = below > sc.a, high_ok = below + unit < sc.b;
        u128 twice = rem << 1;
        if (twice == unit)
            return 0; /* equally close: the reading rule decides */
        c = (twice < unit ? low_ok : !high_ok) ? cf : cf + 1;
        if (!(c == cf ? low_ok : high_ok))
            return 0;
    }
    if (c == 0 || c >= POW10[17] || c % 10 == 0)
        return 0; /* cannot happen (c has at most 17 digits, none trailing zero): be safe */
    char digits[24];
    int n = 0;
    uint64_t v = (uint64_t)c;
    char tmp[24];
    while (v) {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    }
    for (int i = 0; i < n; i++)
        digits[i] = tmp[n - 1 - i];
    int decpt = n + q; /* x ~ 0.d1d2...dn * 10**decpt; -14 <= decpt <= 16 here */
    if (decpt < -99 || decpt > 16)
        return 0;
    char *p = out;
    if (bits >> 63)
        *p++ = '-';
    if (decpt <= -4) { /* d.ddde-XX (at least two exponent digits) */
        int exp10 = 1 - decpt; /* 5 .. 99 */
        *p++ = digits[0];
        if (n > 1) {
            *p++ = '.';
            memcpy(p, digits + 1, (size_t)(n - 1));
            p += n - 1;
        }
        *p++ = 'e';
        *p++ = '-';
        *p++ = (char)('0' + exp10 / 10);
        *p++ = (char)('0' + exp10 % 10);
    } else if (decpt <= 0) {
        *p++ = '0';
        *p++ = '.';
        for (int i = 0; i < -decpt; i++)
            *p++ = '0';
        memcpy(p, digits, (size_t)n);
        p += n;
    } else if (decpt >= n) {
        memcpy(p, digits, (size_t)n);
        p += n;
        for (int i = n; i < decpt; i++)
            *p++ = '0';
        *p++ = '.';
        *p++ = '0';
    } else {
        memcpy(p, digits, (size_t)decpt);
        p += decpt;
        *p++ = '.';
        memcpy(p, digits + decpt, (size_t)(n - decpt));
        p += n - decpt;
    }
    return (int)(p - out);
}
#endif /* __SIZEOF_INT128__ (elsewhere every float goes to PyOS_double_to_string) */

/* float.__repr__ for finite values (the same call float_repr makes, or short_repr where
 * it gives the same text), NaN, Infinity, -Infinity otherwise (json.dumps's tokens) */
static int write_double(Buf *b, double x) {
    if (isnan(x))
        return PUT_LIT(b, "NaN");
    if (isinf(x))
        return x > 0 ? PUT_LIT(b, "Infinity") : PUT_LIT(b, "-Infinity");
#ifdef HAVE_SHORT_REPR
    double ax = fabs(x);
    if (ax >= SHORT_MIN && ax < SHORT_MAX) {
        if (buf_reserve(b, 40) < 0)
            return -1;
        int n = short_repr(x, b->data + b->len);
        if (n > 0) {
            b->len += n;
            return 0;
        }
    }
#endif
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL)
        return -1;
    int rc = buf_put(b, text, (Py_ssize_t)strlen(text));
    PyMem_Free(text);
    return rc;
}

/* int.__repr__ of an exact int */
static int write_int(Buf *b, PyObject *v) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (!overflow) {
        char tmp[24];
        char *end = tmp + sizeof(tmp);
        char *p = end;
        unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
        do {
            *--p = (char)('0' + (u % 10));
            u /= 10;
        } while (u);
        if (x < 0)
            *--p = '-';
        return buf_put(b, p, end - p);
    }
    PyObject *text = PyLong_Type.tp_repr(v); /* ValueError past sys.set_int_max_str_digits */
    if (text == NULL)
        return -1;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    int rc = s == NULL ? -1 : buf_put(b, s, n);
    Py_DECREF(text);
    return rc;
}

/* --- the encoder object ---------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *not_plain;        /* exception class raised for values that are not plain JSON */
    PyObject *loads;            /* json.loads */
    PyObject *bool_dtypes;      /* set of dtype names whose Max/Min are bools */
    PyObject *slow_leaf;        /* slow_leaf(leaf, indent) -> str */
    PyObject *fallback_factory; /* () -> Python encode(value, indent, out) */
    PyObject *fallback;         /* made on first use */
    PyObject *texts[MAX_CACHED_DEPTH + 1]; /* per indent: leaf (record tuple or value str) -> bytes */
} Encoder;

static int encode_value(Encoder *self, Buf *b, PyObject *v, Py_ssize_t depth);

static int not_plain(Encoder *self) {
    PyErr_SetNone(self->not_plain);
    return -1;
}

/* a str's text, which must be ASCII (JSON text with ensure_ascii) */
static int put_ascii_text(Encoder *self, Buf *b, PyObject *text) {
    if (!PyUnicode_Check(text) || !PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_TypeError, "slow_leaf must return ASCII JSON text");
        return -1;
    }
    return buf_put(b, (const char *)PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text));
}

static inline int is_float_or_none(PyObject *v) {
    return v == Py_None || PyFloat_CheckExact(v);
}

static inline int is_str_or_none(PyObject *v) {
    return v == Py_None || PyUnicode_CheckExact(v);
}

/* 1 when every field of the 12-tuple `r` has the type EntryBuilder gives it and its md5
 * is not summary_mode xor's "0x..." checksum (such a record, without statistics keys, is
 * written by the Python path: store.entries._tensor_record) */
static int record_is_exact(PyObject *r) {
    PyObject **f = &PyTuple_GET_ITEM(r, 0);
    if (!is_str_or_none(f[0]) || !is_str_or_none(f[1]) || !is_str_or_none(f[10]) || !is_str_or_none(f[11]))
        return 0;
    if (f[10] != Py_None && PyUnicode_GET_LENGTH(f[10]) >= 2 && PyUnicode_READ_CHAR(f[10], 0) == '0'
        && PyUnicode_READ_CHAR(f[10], 1) == 'x')
        return 0;
    if (f[7] != Py_None && !PyBool_Check(f[7]))
        return 0;
    static const int floats[] = {3, 4, 5, 6, 8, 9};
    for (int i = 0; i < 6; i++)
        if (!is_float_or_none(f[floats[i]]))
            return 0;
    PyObject *shape = f[2];
    if (shape == Py_None)
        return 1;
    if (!PyTuple_CheckExact(shape))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++)
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(shape, i)))
            return 0;
    return 1;
}

/* 1 when a float field of an exact record is 0.0 or -0.0 */
static int record_has_zero(PyObject *r) {
    static const int floats[] = {3, 4, 5, 6, 8, 9};
    for (int i = 0; i < 6; i++) {
        PyObject *v = PyTuple_GET_ITEM(r, floats[i]);
        if (v != Py_None && PyFloat_AS_DOUBLE(v) == 0.0)
            return 1;
    }
    return 0;
}

static inline int write_str_or_null(Buf *b, PyObject *v) {
    return v == Py_None ? PUT_LIT(b, "null") : write_str(b, v);
}

static inline int write_float_or_null(Buf *b, PyObject *v) {
    return v == Py_None ? PUT_LIT(b, "null") : write_double(b, PyFloat_AS_DOUBLE(v));
}

/* the ``_tensor_record`` dict of an exact record, nested at `depth` spaces */
static int write_record(Encoder *self, Buf *b, PyObject *r, Py_ssize_t depth) {
    PyObject **f = &PyTuple_GET_ITEM(r, 0);
    Py_ssize_t inner = depth + 1;
#define FIELD(key)                                                                 \
    do {                                                                           \
        if (buf_break(b, ",\n", 2, inner) < 0 || PUT_LIT(b, "\"" key "\": ") < 0) \
            return -1;                                                             \
    } while (0)
    if (buf_break(b, "{\n", 2, inner) < 0 || PUT_LIT(b, "\"type\": ") < 0 || write_str_or_null(b, f[0]) < 0)
        return -1;
    FIELD("dtype");
    if (write_str_or_null(b, f[1]) < 0)
        return -1;
    FIELD("shape");
    PyObject *shape = f[2];
    if (shape == Py_None) {
        if (PUT_LIT(b, "null") < 0)
            return -1;
    } else if (PyTuple_GET_SIZE(shape) == 0) {
        if (PUT_LIT(b, "[]") < 0)
            return -1;
    } else {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
            if (buf_break(b, i ? ",\n" : "[\n", 2, inner + 1) < 0 || write_int(b, PyTuple_GET_ITEM(shape, i)) < 0)
                return -1;
        }
        if (buf_break(b, "\n", 1, inner) < 0 || PUT_LIT(b, "]") < 0)
            return -1;
    }
    int is_bool = 0;
    if (f[1] != Py_None) {
        is_bool = PySet_Contains(self->bool_dtypes, f[1]);
        if (is_bool < 0)
            return -1;
    }
    if (is_bool) { /* bool(Max), bool(Min) (NaN is true); Mean and Norm null */
        FIELD("Max");
        if (f[3] == Py_None ? PUT_LIT(b, "null") < 0
                            : (PyFloat_AS_DOUBLE(f[3]) != 0.0 ? PUT_LIT(b, "true") : PUT_LIT(b, "false")) < 0)
            return -1;
        FIELD("Min");
        if (f[4] == Py_None ? PUT_LIT(b, "null") < 0
                            : (PyFloat_AS_DOUBLE(f[4]) != 0.0 ? PUT_LIT(b, "true") : PUT_LIT(b, "false")) < 0)
            return -1;
        FIELD("Mean");
        if (PUT_LIT(b, "null") < 0)
            return -1;
        FIELD("Norm");
        if (PUT_LIT(b, "null") < 0)
            return -1;
    } else {
        FIELD("Max");
        if (write_float_or_null(b, f[3]) < 0)
            return -1;
        FIELD("Min");
        if (write_float_or_null(b, f[4]) < 0)
            return -1;
        FIELD("Mean");
        if (write_float_or_null(b, f[5]) < 0)
            return -1;
        FIELD("Norm");
        if (write_float_or_null(b, f[6]) < 0)
            return -1;
    }
    if (f[7] != Py_None) {
        FIELD("requires_grad");
        if ((f[7] == Py_True ? PUT_LIT(b, "true") : PUT_LIT(b, "false")) < 0)
            return -1;
    }
    if (f[8] != Py_None) {
        FIELD("Max_except_inf_nan");
        if (write_double(b, PyFloat_AS_DOUBLE(f[8])) < 0)
            return -1;
    }
    if (f[9] != Py_None) {
        FIELD("Min_except_inf_nan");
        if (write_double(b, PyFloat_AS_DOUBLE(f[9])) < 0)
            return -1;
    }
    if (f[10] != Py_None) {
        FIELD("md5");
        if (write_str(b, f[10]) < 0)
            return -1;
    }
    if (f[11] != Py_None) {
        FIELD("data_name");
        if (write_str(b, f[11]) < 0)
            return -1;
    }
#undef FIELD
    if (buf_break(b, "\n", 1, depth) < 0 || PUT_LIT(b, "}") < 0)
        return -1;
    return 0;
}

/* the per-depth dict of kept leaf texts (NULL without error: this depth keeps none) */
static PyObject *texts_at(Encoder *self, Py_ssize_t depth) {
    if (depth > MAX_CACHED_DEPTH)
        return NULL;
    if (self->texts[depth] == NULL)
        self->texts[depth] = PyDict_New(); /* NULL on error: the caller checks PyErr_Occurred */
    return self->texts[depth];
}

/* keep buf[start:] as the text of `key` */
static int keep_text(PyObject *texts, PyObject *key, Buf *b, Py_ssize_t start) {
    PyObject *text = PyBytes_FromStringAndSize(b->data + start, b->len - start);
    if (text == NULL)
        return -1;
    int rc = PyDict_SetItem(texts, key, text);
    Py_DECREF(text);
    return rc;
}

static PyObject *spaces(Py_ssize_t depth) {
    PyObject *s = PyUnicode_New(depth, 127);
    if (s != NULL)
        memset(PyUnicode_DATA(s), ' ', (size_t)depth);
    return s;
}

static int write_leaf(Encoder *self, Buf *b, PyObject *leaf, Py_ssize_t depth) {
    Py_ssize_t n = PyTuple_GET_SIZE(leaf);
    PyObject *key = NULL;
    int cache = 0;
    if (n == N_FIELDS && record_is_exact(leaf)) {
        key = leaf;
        cache = !record_has_zero(leaf);
    } else if (n == 1 && PyUnicode_CheckExact(PyTuple_GET_ITEM(leaf, 0))) {
        key = PyTuple_GET_ITEM(leaf, 0);
        cache = 1;
    }
    if (key == NULL) { /* not a leaf of exact types: the Python path writes (or refuses) it */
        PyObject *indent = spaces(depth);
        if (indent == NULL)
            return -1;
        PyObject *text = PyObject_CallFunctionObjArgs(self->slow_leaf, leaf, indent, NULL);
        Py_DECREF(indent);
        if (text == NULL)
            return -1;
        int rc = put_ascii_text(self, b, text);
        Py_DECREF(text);
        return rc;
    }
    PyObject *texts = texts_at(self, depth);
    if (texts == NULL && PyErr_Occurred())
        return -1;
    if (texts != NULL && cache) {
        PyObject *text = PyDict_GetItemWithError(texts, key); /* borrowed */
        if (text != NULL)
            return buf_put(b, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text));
        if (PyErr_Occurred())
            return -1;
    }
    Py_ssize_t start = b->len;
    if (n == 1) {
        PyObject *parsed = PyObject_CallOneArg(self->loads, key);
        if (parsed == NULL)
            return -1;
        int rc = encode_value(self, b, parsed, depth);
        Py_DECREF(parsed);
        if (rc < 0)
            return -1;
    } else if (write_record(self, b, leaf, depth) < 0) {
        return -1;
    }
    if (texts != NULL && cache)
        return keep_text(texts, key, b, start);
    return 0;
}

static int encode_value(Encoder *self, Buf *b, PyObject *v, Py_ssize_t depth) {
    if (PyUnicode_CheckExact(v))
        return write_str(b, v);
    if (PyFloat_CheckExact(v))
        return write_double(b, PyFloat_AS_DOUBLE(v));
    if (v == Py_None)
        return PUT_LIT(b, "null");
    if (v == Py_True)
        return PUT_LIT(b, "true");
    if (v == Py_False)
        return PUT_LIT(b, "false");
    if (PyLong_CheckExact(v))
        return write_int(b, v);
    if (PyTuple_CheckExact(v))
        return write_leaf(self, b, v, depth);
    if (PyList_CheckExact(v)) {
        if (PyList_GET_SIZE(v) == 0)
            return PUT_LIT(b, "[]");
        if (Py_EnterRecursiveCall(" while encoding a JSON array"))
            return -1;
        int rc = 0;
        for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(v); i++) {
            PyObject *item = PyList_GET_ITEM(v, i);
            Py_INCREF(item);
            rc = buf_break(b, i ? ",\n" : "[\n", 2, depth + 1);
            if (rc == 0)
                rc = encode_value(self, b, item, depth + 1);
            Py_DECREF(item);
        }
        Py_LeaveRecursiveCall();
        if (rc < 0 || buf_break(b, "\n", 1, depth) < 0)
            return -1;
        return PUT_LIT(b, "]");
    }
    if (PyDict_CheckExact(v)) {
        if (PyDict_GET_SIZE(v) == 0)
            return PUT_LIT(b, "{}");
        if (Py_EnterRecursiveCall(" while encoding a JSON object"))
            return -1;
        int rc = 0;
        Py_ssize_t pos = 0, i = 0;
        PyObject *key, *item;
        Py_INCREF(v);
        while (rc == 0 && PyDict_Next(v, &pos, &key, &item)) {
            if (!PyUnicode_CheckExact(key)) {
                rc = not_plain(self);
                break;
            }
            Py_INCREF(key);
            Py_INCREF(item);
            rc = buf_break(b, i++ ? ",\n" : "{\n", 2, depth + 1);
            if (rc == 0)
                rc = write_str(b, key);
            if (rc == 0)
                rc = PUT_LIT(b, ": ");
            if (rc == 0)
                rc = encode_value(self, b, item, depth + 1);
            Py_DECREF(key);
            Py_DECREF(item);
        }
        Py_DECREF(v);
        Py_LeaveRecursiveCall();
        if (rc < 0 || buf_break(b, "\n", 1, depth) < 0)
            return -1;
        return PUT_LIT(b, "}");
    }
    return not_plain(self);
}

static PyObject *Encoder_call(Encoder *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"value", "indent", "out", NULL};
    PyObject *value, *indent, *out;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OUO:encode", kwlist, &value, &indent, &out))
        return NULL;
    Py_ssize_t depth = PyUnicode_GET_LENGTH(indent);
    int all_spaces = PyUnicode_IS_ASCII(indent);
    for (Py_ssize_t i = 0; all_spaces && i < depth; i++)
        all_spaces = ((const char *)PyUnicode_DATA(indent))[i] == ' ';
    if (!all_spaces) { /* never in dump.json: the Python encoder writes whatever indent it is */
        if (self->fallback == NULL) {
            self->fallback = PyObject_CallNoArgs(self->fallback_factory);
            if (self->fallback == NULL)
                return NULL;
        }
        return PyObject_CallFunctionObjArgs(self->fallback, value, indent, out, NULL);
    }
    Buf b = {NULL, 0, 0};
    if (buf_grow(&b, 1) < 0)
        return NULL;
    PyObject *text = NULL;
    if (encode_value(self, &b, value, depth) == 0) {
        text = PyUnicode_New(b.len, 127);
        if (text != NULL)
            memcpy(PyUnicode_DATA(text), b.data, (size_t)b.len);
    }
    PyMem_Free(b.data);
    if (text == NULL)
        return NULL;
    int rc = PyList_CheckExact(out) ? PyList_Append(out, text) : -2;
    if (rc == -2) {
        PyObject *r = PyObject_CallMethod(out, "append", "O", text);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(text);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int Encoder_traverse(Encoder *self, visitproc visit, void *arg) {
    Py_VISIT(self->not_plain);
    Py_VISIT(self->loads);
    Py_VISIT(self->bool_dtypes);
    Py_VISIT(self->slow_leaf);
    Py_VISIT(self->fallback_factory);
    Py_VISIT(self->fallback);
    for (int i = 0; i <= MAX_CACHED_DEPTH; i++)
        Py_VISIT(self->texts[i]);
    return 0;
}

static int Encoder_clear(Encoder *self) {
    Py_CLEAR(self->not_plain);
    Py_CLEAR(self->loads);
    Py_CLEAR(self->bool_dtypes);
    Py_CLEAR(self->slow_leaf);
    Py_CLEAR(self->fallback_factory);
    Py_CLEAR(self->fallback);
    for (int i = 0; i <= MAX_CACHED_DEPTH; i++)
        Py_CLEAR(self->texts[i]);
    return 0;
}

static void Encoder_dealloc(Encoder *self) {
    PyObject_GC_UnTrack(self);
    Encoder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Encoder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"not_plain", "loads", "bool_dtypes", "slow_leaf", "fallback_factory", NULL};
    PyObject *not_plain_exc, *loads, *bool_dtypes, *slow_leaf, *fallback_factory;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:Encoder", kwlist, &not_plain_exc, &loads, &bool_dtypes,
                                     &slow_leaf, &fallback_factory))
        return NULL;
    if (!PyExceptionClass_Check(not_plain_exc)) {
        PyErr_SetString(PyExc_TypeError, "not_plain must be an exception class");
        return NULL;
    }
    if (!PyAnySet_Check(bool_dtypes)) {
        PyErr_SetString(PyExc_TypeError, "bool_dtypes must be a set or frozenset");
        return NULL;
    }
    Encoder *self = (Encoder *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->not_plain = Py_NewRef(not_plain_exc);
    self->loads = Py_NewRef(loads);
    self->bool_dtypes = Py_NewRef(bool_dtypes);
    self->slow_leaf = Py_NewRef(slow_leaf);
    self->fallback_factory = Py_NewRef(fallback_factory);
    return (PyObject *)self;
}

PyDoc_STRVAR(Encoder_doc,
"Encoder(not_plain, loads, bool_dtypes, slow_leaf, fallback_factory)\n"
"\n"
"encoder(value, indent, out) appends to the list `out` the text\n"
"json.dumps(store.entries._plain(value), indent=1) writes for `value` nested at\n"
"`indent` (a str), tuples in it being record/value leaves (store.entries.RECORD_FIELDS).\n"
"Raises `not_plain` for values that are not plain JSON, RecursionError when nested\n"
"too deep; what `loads` and `slow_leaf` raise propagates. Keeps the text of each\n"
"leaf it wrote: make one per dump.");

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "store._record_text.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_call = (ternaryfunc)Encoder_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = Encoder_doc,
    .tp_traverse = (traverseproc)Encoder_traverse,
    .tp_clear = (inquiry)Encoder_clear,
    .tp_new = Encoder_new,
};

/* float_text(x): the JSON text this module writes for a float (tests compare it with
 * float.__repr__) */
static PyObject *float_text(PyObject *module, PyObject *arg) {
    double x = PyFloat_AsDouble(arg);
    if (x == -1.0 && PyErr_Occurred())
        return NULL;
    Buf b = {NULL, 0, 0};
    if (write_double(&b, x) < 0) {
        PyMem_Free(b.data);
        return NULL;
    }
    PyObject *text = PyUnicode_FromStringAndSize(b.data, b.len);
    PyMem_Free(b.data);
    return text;
}

/* str_text(s): encode_basestring_ascii(s) as this module writes it */
static PyObject *str_text(PyObject *module, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "str_text needs a str");
        return NULL;
    }
    Buf b = {NULL, 0, 0};
    if (write_str(&b, arg) < 0) {
        PyMem_Free(b.data);
        return NULL;
    }
    PyObject *text = PyUnicode_FromStringAndSize(b.data, b.len);
    PyMem_Free(b.data);
    return text;
}

static PyMethodDef module_methods[] = {
    {"float_text", float_text, METH_O, "float_text(x: float) -> str: JSON text of a float (NaN, Infinity, repr)."},
    {"str_text", str_text, METH_O, "str_text(s: str) -> str: json.encoder.encode_basestring_ascii(s)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "store._record_text",
    .m_doc = "dump.json text of entry values in C (see store.record_text.records_encoder).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__record_text(void) {
#ifdef HAVE_SHORT_REPR
    POW10[0] = POW5[0] = 1;
    for (int i = 1; i < 18; i++)
        POW10[i] = POW10[i - 1] * 10;
    for (int i = 1; i < 32; i++)
        POW5[i] = POW5[i - 1] * 5;
#endif
    if (PyType_Ready(&EncoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
