/*
 * msprobe._native.file_io: write one file from three pieces with a CRC-32 of the middle one
 * patched into the other two, in one call that releases the GIL once (issue 5).
 *
 * Why: the payload writer thread stages a `.pt` file for every new tensor while the step
 * runs. In Python that is ~8 calls that each release and take back the GIL (CRC-32, open,
 * three writes, close, ...); every time the training thread releases the GIL (any torch
 * call does) the writer takes it and the training thread waits. One call per file instead.
 *
 * Python API (positional):
 *   write_patched(path, mode, head, data, tail, head_crc_at, tail_crc_at, crc_fn_address) -> crc
 *     path: str or bytes (file system encoding); created or truncated with permission bits
 *           `mode` (the process umask applies, as with os.open), written as head + data + tail.
 *     head, data, tail: bytes-like objects (C-contiguous buffers, read-only allowed).
 *     crc = crc_fn(0, data, len(data)), the C function at crc_fn_address with zlib crc32
 *           semantics (ISA-L's crc32_gzip_refl, msprobe.core.checksum.C_CRC32); it is written
 *           little-endian at head[head_crc_at:head_crc_at+4] and tail[tail_crc_at:tail_crc_at+4]
 *           of copies (the caller's objects are not changed). Returns crc (int).
 *   Errors: ValueError for an offset outside its piece or a crc_fn_address of 0; OSError
 *   (with the file name and errno) when the file cannot be opened or written; a file that
 *   failed in the middle is left as written so far (callers write a temporary name).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef uint32_t (*crc_fn)(uint32_t init, const unsigned char *buf, uint64_t len);

static void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* writev all of iov[0:cnt] (advancing over partial writes); 0, or -1 with errno set */
static int write_all(int fd, struct iovec *iov, int cnt) {
    while (cnt > 0) {
        if (iov->iov_len == 0) {
            iov++;
            cnt--;
            continue;
        }
        ssize_t n = writev(fd, iov, cnt);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        size_t left = (size_t)n;
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

static PyObject *write_patched(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *path_obj, *path = NULL; /* path: bytes, from PyUnicode_FSConverter */
    int mode;
    Py_buffer head, data, tail;
    Py_ssize_t head_at, tail_at;
    PyObject *fn_obj;
    if (!PyArg_ParseTuple(args, "Oiy*y*y*nnO:write_patched", &path_obj, &mode, &head, &data, &tail, &head_at,
                          &tail_at, &fn_obj))
        return NULL;
    PyObject *result = NULL;
    unsigned char *h = NULL, *t = NULL;
    if (!PyUnicode_FSConverter(path_obj, &path)) {
        path = NULL;
        goto done;
    }
    void *fn_ptr = PyLong_AsVoidPtr(fn_obj);
    if (fn_ptr == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "crc_fn_address is 0");
        goto done;
    }
    if (head_at < 0 || head_at + 4 > head.len || tail_at < 0 || tail_at + 4 > tail.len) {
        PyErr_Format(PyExc_ValueError, "CRC offsets %zd/%zd outside head (%zd bytes) / tail (%zd bytes)", head_at,
                     tail_at, head.len, tail.len);
        goto done;
    }
    h = (unsigned char *)malloc((size_t)head.len);
    t = (unsigned char *)malloc((size_t)tail.len);
    if (h == NULL || t == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    crc_fn fn;
    memcpy(&fn, &fn_ptr, sizeof fn); /* a data pointer cannot portably be cast to a function pointer */
    const char *name = PyBytes_AS_STRING(path);
    uint32_t crc = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    crc = fn(0, (const unsigned char *)data.buf, (uint64_t)data.len);
    memcpy(h, head.buf, (size_t)head.len);
    memcpy(t, tail.buf, (size_t)tail.len);
    put_le32(h + head_at, crc);
    put_le32(t + tail_at, crc);
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode_t)mode);
    if (fd < 0) {
        err = errno;
    } else {
        struct iovec iov[3] = {{h, (size_t)head.len}, {data.buf, (size_t)data.len}, {t, (size_t)tail.len}};
        if (write_all(fd, iov, 3) < 0) err = errno;
        if (close(fd) < 0 && err == 0) err = errno;
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj); /* the caller's path object */
        goto done;
    }
    result = PyLong_FromUnsignedLong((unsigned long)crc);
done:
    free(h);
    free(t);
    PyBuffer_Release(&head);
    PyBuffer_Release(&data);
    PyBuffer_Release(&tail);
    Py_XDECREF(path);
    return result;
}

static PyMethodDef METHODS[] = {
    {"write_patched", write_patched, METH_VARARGS,
     "write_patched(path, mode, head, data, tail, head_crc_at, tail_crc_at, crc_fn_address) -> crc\n\n"
     "Create or truncate path (permission bits mode, umask applied) holding head + data + tail, with\n"
     "crc = crc_fn(0, data) written little-endian at head[head_crc_at:+4] and tail[tail_crc_at:+4]\n"
     "(copies: the arguments are not changed); the GIL is released once for all of it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "file_io",
    "One-call file writes with a CRC-32 patched in, the GIL released once (payload staging).",
    -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_file_io(void) { return PyModule_Create(&MODULE); }
