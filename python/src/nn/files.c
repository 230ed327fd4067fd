/*
 * The files dsrt._nn reads and writes: whole files read with the GIL
 * released, their errors raised as Python's, paths in the file-system
 * encoding.
 */
#include "nn.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Files

/* Reads the regular file path whole (at most max bytes) into a malloc'd
 * buffer, *len its length. Runs without the GIL: on failure returns NULL
 * with *err an errno (or EFBIG, or EINVAL for a file that is not regular). */
char *read_file(const char *path, size_t max, size_t *len, int *err) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    char *buf = NULL;
    struct stat st;
    *len = 0;
    if (fd < 0) {
        *err = errno;
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        *err = errno;
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        *err = EISDIR;
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        *err = EINVAL;
        goto fail;
    }
    if ((unsigned long long)st.st_size > max) {
        *err = EFBIG;
        goto fail;
    }
    size_t n = (size_t)st.st_size, got = 0;
    if (!(buf = malloc(n + 1))) {
        *err = ENOMEM;
        goto fail;
    }
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            *err = errno;
            goto fail;
        }
        if (r == 0) break; /* it shrank */
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *len = got;
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

/* The exception of read_file's err for path; what names the argument. */
PyObject *raise_read(int err, const char *what, PyObject *path) {
    if (err == EINVAL)
        return PyErr_Format(PyExc_ValueError, "%s %S: not a regular file", what, path);
    if (err == EFBIG)
        return PyErr_Format(PyExc_ValueError, "%s %S: more than the limit of %zu bytes", what, path,
                            FILE_MAX);
    if (err == ENOMEM) return PyErr_NoMemory();
    PyObject *msg = PyUnicode_FromFormat("%s: %s", what, strerror(err));
    if (!msg) return NULL;
    PyObject *args = Py_BuildValue("(iOO)", err, msg, path);
    Py_DECREF(msg);
    if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* v (str or os.PathLike) as a new bytes object of the file system encoding. */
PyObject *fs_path(PyObject *v) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(v, &b)) return NULL;
    return b;
}

/* 1 when path names an ONNX model: by its extension, as dstrain tells them
 * (the format has no magic number). */
int is_onnx_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".onnx");
}
