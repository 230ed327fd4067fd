/*
 * What the two extensions of the dsrt package share: dsrt._dsrt (the data
 * side, over libdsrt linked in) and dsrt._nn (networks, over the shared
 * libdsrt_train), each compiling its own copy. The DLPack ABI both read and
 * write, the mapping of a dsrt error code to a Python exception, and the
 * readers of keyword values that name the keyword in their messages.
 *
 * dsrt_error is each extension's own pointer to dsrt.Error: _dsrt makes the
 * class, _nn takes it from _dsrt, so both raise the one class.
 */
#ifndef DSRT_PYSHARED_H
#define DSRT_PYSHARED_H

#include <Python.h>

#include <dsrt/core.h>
#include <dsrt/options.h>

#include <errno.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// DLPack: the ABI of dlpack.h (v0.8, DLManagedTensor), which every consumer
// (torch.from_dlpack, numpy.from_dlpack) reads.

typedef struct {
    int32_t device_type; /* kDLCPU = 1 */
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code; /* kDLInt = 0, kDLUInt = 1, kDLFloat = 2 */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

enum { DL_CPU = 1, DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2 };
/* Device types a consumer meets: a CUDA device's memory, and pinned host
 * memory (readable as the CPU's). */
enum { DL_CUDA = 2, DL_CUDA_HOST = 3 };

// ----------------------------------------------------------------------------
// Errors

/* dsrt.Error, a RuntimeError with .code: each extension defines its own
 * pointer (in its module.c). */
extern PyObject *dsrt_error;

/* Raises the exception for dsrt code rc with message msg (NULL:
 * dsrt_last_error()): ValueError for a bad option, MemoryError for -ENOMEM,
 * OSError (FileNotFoundError, ...) for other -errno, else dsrt.Error. */
static inline PyObject *raise_code(int rc, const char *msg) {
    if (!msg || !*msg) msg = dsrt_last_error();
    if (!*msg) msg = dsrt_strerror(rc);
    if (rc == DSRT_EOPTION) {
        PyErr_SetString(PyExc_ValueError, msg);
    } else if (rc == -ENOMEM) {
        PyErr_SetString(PyExc_MemoryError, msg);
    } else if (rc < 0 && rc > DSRT_EFORMAT) { /* -errno: dsrt's own codes start at -1001 */
        PyObject *args = Py_BuildValue("(is)", -rc, msg);
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    } else {
        PyObject *args = Py_BuildValue("(s)", msg);
        PyObject *e = args ? PyObject_Call(dsrt_error, args, NULL) : NULL;
        Py_XDECREF(args);
        if (e) {
            PyObject *code = PyLong_FromLong(rc);
            if (code) PyObject_SetAttrString(e, "code", code);
            Py_XDECREF(code);
            PyErr_SetObject(dsrt_error, e);
            Py_DECREF(e);
        }
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// Reading keyword values

/* A choice named by a string (a layout, a mode, dsrt_source_from_name and
 * its kin): the string of v, or NULL with the exception set. */
static inline const char *get_name(PyObject *v, const char *what) {
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (!s && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "%s: expected a string, not %.100s", what,
                     Py_TYPE(v)->tp_name);
    return s;
}

/* v as a non-negative integer no larger than max; ValueError naming what. */
static inline int get_u64(PyObject *v, const char *what, uint64_t max, uint64_t *out) {
    if (PyBool_Check(v) || !PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an integer, not %.100s", what,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow < 0 || (!overflow && x < 0)) {
        PyErr_Format(PyExc_ValueError, "%s: %S: must not be negative", what, v);
        return -1;
    }
    unsigned long long u = overflow ? PyLong_AsUnsignedLongLong(v) : (unsigned long long)x;
    if (u == (unsigned long long)-1 && PyErr_Occurred()) { /* above 2^64 - 1 */
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: %S: at most %llu", what, v, (unsigned long long)max);
        return -1;
    }
    if (u > max) {
        PyErr_Format(PyExc_ValueError, "%s: %S: at most %llu", what, v, (unsigned long long)max);
        return -1;
    }
    *out = u;
    return 0;
}

static inline int get_int(PyObject *v, const char *what, int *out) {
    if (PyBool_Check(v) || !PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: expected an integer, not %.100s", what,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long x = PyLong_AsLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %S: out of range", what, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static inline int get_double(PyObject *v, const char *what, double *out) {
    if (PyBool_Check(v) || !(PyFloat_Check(v) || PyLong_Check(v))) {
        PyErr_Format(PyExc_TypeError, "%s: expected a number, not %.100s", what,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static inline int get_bool(PyObject *v, const char *what, int *out) {
    int b = PyObject_IsTrue(v);
    if (b < 0) return -1;
    *out = b;
    return 0;
}

/* v as exactly n numbers (a scalar too when scalar_ok: every element). */
static inline int get_doubles(PyObject *v, const char *what, double *out, Py_ssize_t n,
                              int scalar_ok) {
    if (scalar_ok && (PyFloat_Check(v) || PyLong_Check(v)) && !PyBool_Check(v)) {
        double x;
        if (get_double(v, what, &x) != 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) out[i] = x;
        return 0;
    }
    PyObject *seq = PySequence_Check(v) && !PyUnicode_Check(v) ? PySequence_Fast(v, "") : NULL;
    if (!seq || PySequence_Fast_GET_SIZE(seq) != n) {
        Py_XDECREF(seq);
        PyErr_Clear();
        if (n == 2)
            PyErr_Format(PyExc_ValueError, "%s: %R: expected (low, high)", what, v);
        else
            PyErr_Format(PyExc_ValueError, "%s: %R: expected %zd numbers%s", what, v, n,
                         scalar_ok ? " or one" : "");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_double(PySequence_Fast_GET_ITEM(seq, i), what, &out[i]) != 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

// ----------------------------------------------------------------------------
// Option rows (dsrt/options.h) as dicts, for dsrt.options() and Net.options()

/* Appends a new str to list: 0, or -1 with the exception set. */
static inline int append_str(PyObject *list, const char *s) {
    PyObject *v = PyUnicode_FromString(s);
    int rc = v ? PyList_Append(list, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* One row as a dict: name (Python's spelling), option (the tools'), type,
 * default, choices, help, places. */
static inline PyObject *option_dict(const dsrt_option *o, const char *group) {
    static const struct {
        unsigned bit;
        const char *name;
    } places[] = {{DSRT_IN_DSBENCH, "dsbench"},
                  {DSRT_IN_DSBENCH_INDEX, "dsbench --index"},
                  {DSRT_IN_DSBENCH_CONVERT, "dsbench convert"},
                  {DSRT_IN_PY_DATASTORE, "Datastore"},
                  {DSRT_IN_PY_PIPELINE, "Pipeline"},
                  {DSRT_IN_PY_NET, "Net"}};
    char py[64];
    snprintf(py, sizeof py, "%s", o->py ? o->py : o->name);
    for (char *c = py; *c; c++)
        if (*c == '-') *c = '_';
    PyObject *choices = PyList_New(0), *where = PyList_New(0), *d = NULL;
    if (!choices || !where) goto done;
    for (int i = 0; o->choice && o->choice(i); i++)
        if (*o->choice(i) && append_str(choices, o->choice(i)) != 0) goto done;
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++)
        if ((o->where & places[i].bit) && append_str(where, places[i].name) != 0) goto done;
    d = Py_BuildValue("{s:s,s:s,s:s,s:s,s:z,s:O,s:s,s:O,s:z}", "name", py, "option", o->name,
                      "group", group, "type", dsrt_option_type_name(o->type), "default", o->def,
                      "choices", choices, "help", o->help, "where", where, "old", o->old);
done:
    Py_XDECREF(choices);
    Py_XDECREF(where);
    return d;
}

/* Every row of the n groups as a list of dicts (option_dict), or NULL
 * with the exception set. */
static inline PyObject *options_list(const dsrt_option_group *groups, size_t n) {
    PyObject *list = PyList_New(0);
    for (size_t g = 0; list && g < n; g++)
        for (size_t i = 0; i < groups[g].count; i++) {
            PyObject *d = option_dict(&groups[g].options[i], groups[g].name);
            if (!d || PyList_Append(list, d) != 0) {
                Py_XDECREF(d);
                Py_CLEAR(list);
                break;
            }
            Py_DECREF(d);
        }
    return list;
}

#endif
