/*
 * Arrays into dsrt._nn: a NumPy array (buffer protocol) or a DLPack tensor
 * (PyTorch, JAX, ...), read in place while the caller holds it.
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
// Arrays: a NumPy array (buffer protocol) or a DLPack tensor, read in place

void array_release(array_in *a) {
    if (a->has_view) PyBuffer_Release(&a->view);
    a->has_view = 0;
    /* Not renamed "used_dltensor": the producer's capsule destructor calls
     * the tensor's deleter, as DLPack has it for a capsule not consumed. */
    Py_CLEAR(a->capsule);
}

/* The dtype of a buffer format, or -1; *name the name to show. */
static int format_dtype(const char *f, const char **name) {
    static const struct {
        char c;
        const char *name;
    } names[] = {{'?', "bool"},    {'b', "int8"},    {'B', "uint8"},   {'h', "int16"},
                 {'H', "uint16"},  {'i', "int32"},   {'I', "uint32"},  {'l', "int64"},
                 {'L', "uint64"},  {'q', "int64"},   {'Q', "uint64"},  {'e', "float16"},
                 {'f', "float32"}, {'d', "float64"}, {'g', "float128"}};
    *name = f;
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (f[0] && !f[1]) {
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            if (names[i].c == f[0]) *name = names[i].name;
        if (f[0] == 'B') return DT_U8;
        if (f[0] == 'f') return DT_F32;
    }
    return -1;
}

/* The name of a DLPack dtype, into buf. */
static const char *dl_dtype_name(DLDataType t, char *buf, size_t cap) {
    static const char *const kinds[] = {"int",    "uint",    "float", "opaque",
                                        "bfloat", "complex", "bool"};
    const char *k = t.code < sizeof kinds / sizeof *kinds ? kinds[t.code] : "code";
    if (t.code == 6 && t.bits == 8)
        snprintf(buf, cap, "bool");
    else if (t.lanes != 1)
        snprintf(buf, cap, "%s%u x%u", k, t.bits, t.lanes);
    else
        snprintf(buf, cap, "%s%u", k, t.bits);
    return buf;
}

static const char *const dtypes_taken = "uint8 (pixels 0 to 255) or float32 (values 0 to 1)";

/* Reads obj as an array of 3 or 4 dimensions, uint8 or float32, in host
 * memory. what names the call in messages. */
int array_get(PyObject *obj, const char *what, array_in *a) {
    memset(a, 0, sizeof *a);
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &a->view, PyBUF_RECORDS_RO) != 0) return -1;
        a->has_view = 1;
        const char *name;
        int dt = format_dtype(a->view.format ? a->view.format : "B", &name);
        if (dt < 0) {
            PyErr_Format(PyExc_TypeError, "%s: dtype %s: expected %s", what, name, dtypes_taken);
            goto fail;
        }
        a->dtype = dt;
        a->ndim = a->view.ndim;
        if (a->ndim == 3 || a->ndim == 4) {
            for (int i = 0; i < a->ndim; i++) {
                a->shape[i] = a->view.shape[i];
                a->strides[i] = a->view.strides[i];
            }
        }
        a->data = a->view.buf;
    } else {
        PyObject *fn = PyObject_GetAttrString(obj, "__dlpack__");
        if (!fn) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "%s: expected a NumPy array or a tensor with __dlpack__ (PyTorch, ...), "
                         "not %.100s",
                         what, Py_TYPE(obj)->tp_name);
            return -1;
        }
        a->capsule = PyObject_CallNoArgs(fn);
        Py_DECREF(fn);
        if (!a->capsule) return -1;
        DLManagedTensor *m = PyCapsule_IsValid(a->capsule, "dltensor")
                                 ? PyCapsule_GetPointer(a->capsule, "dltensor")
                                 : NULL;
        if (!m) {
            PyErr_Format(PyExc_TypeError,
                         "%s: %.100s.__dlpack__() gave %.100s, not an unused DLPack capsule "
                         "(\"dltensor\")",
                         what, Py_TYPE(obj)->tp_name, Py_TYPE(a->capsule)->tp_name);
            goto fail;
        }
        const DLTensor *t = &m->dl_tensor;
        if (t->device.device_type != DL_CPU && t->device.device_type != DL_CUDA_HOST) {
            PyErr_Format(PyExc_ValueError,
                         "%s: the tensor lies on a device (DLPack device type %d, device %d): "
                         "%s reads host memory; copy it to the CPU first (tensor.cpu())",
                         what, (int)t->device.device_type, (int)t->device.device_id, what);
            goto fail;
        }
        char name[32];
        if (t->dtype.lanes == 1 && t->dtype.code == DL_UINT && t->dtype.bits == 8)
            a->dtype = DT_U8;
        else if (t->dtype.lanes == 1 && t->dtype.code == DL_FLOAT && t->dtype.bits == 32)
            a->dtype = DT_F32;
        else {
            PyErr_Format(PyExc_TypeError, "%s: dtype %s: expected %s", what,
                         dl_dtype_name(t->dtype, name, sizeof name), dtypes_taken);
            goto fail;
        }
        a->ndim = t->ndim;
        if (a->ndim == 3 || a->ndim == 4) {
            Py_ssize_t size = a->dtype == DT_U8 ? 1 : 4, step = size;
            for (int i = a->ndim - 1; i >= 0; i--) {
                if (t->shape[i] < 0) {
                    PyErr_Format(PyExc_ValueError,
                                 "%s: the tensor's dimension %d is %lld: DLPack dimensions are "
                                 "not negative",
                                 what, i, (long long)t->shape[i]);
                    goto fail;
                }
                a->shape[i] = (Py_ssize_t)t->shape[i];
                a->strides[i] = t->strides ? (Py_ssize_t)t->strides[i] * size : step;
                step *= a->shape[i];
            }
        }
        a->data = (const char *)t->data + t->byte_offset;
    }
    if (a->ndim != 3 && a->ndim != 4) {
        PyErr_Format(PyExc_ValueError,
                     "%s: a %d-D array: expected 3-D (one image: CHW or HWC) or 4-D (a batch: "
                     "NCHW or NHWC)",
                     what, a->ndim);
        goto fail;
    }
    if (a->ndim == 3) { /* one image: a batch of one */
        for (int i = 3; i > 0; i--) {
            a->shape[i] = a->shape[i - 1];
            a->strides[i] = a->strides[i - 1];
        }
        a->shape[0] = 1;
        a->strides[0] = 0;
    }
    return 0;
fail:
    array_release(a);
    return -1;
}

/* "(2, 3, 28, 28)" of a's shape as given (3-D without the batch). */
PyObject *shape_text(const array_in *a) {
    int first = a->ndim == 3 ? 1 : 0;
    PyObject *t = PyTuple_New(4 - first);
    if (!t) return NULL;
    for (int i = first; i < 4; i++) {
        PyObject *v = PyLong_FromSsize_t(a->shape[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i - first, v);
    }
    PyObject *s = PyObject_Repr(t);
    Py_DECREF(t);
    return s;
}
