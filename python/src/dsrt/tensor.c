/*
 * dsrt.Tensor: a view of part of a batch (its samples, its labels), lent to
 * NumPy and PyTorch without a copy through DLPack (__dlpack__,
 * __dlpack_device__) and the buffer protocol. Each exported tensor keeps its
 * Batch alive.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Tensor: DLPack and the buffer protocol

TensorObject *tensor_new(BatchObject *owner, void *data, DLDataType dtype, const char *format,
                         int ndim, const int64_t *shape) {
    TensorObject *t = PyObject_New(TensorObject, &Tensor_Type);
    if (!t) return NULL;
    Py_INCREF(owner);
    t->owner = owner;
    t->data = data;
    t->dtype = dtype;
    t->format = format;
    t->itemsize = dtype.bits / 8;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->strides[i] = stride;
        stride *= shape[i];
    }
    return t;
}

/* A tensor of a pipeline opened in another process (see pipeline_forked):
 * its memory may not have been copied by fork (pinned memory). Raises. */
static int tensor_forked(const TensorObject *self) {
    if (!self->owner->pipe || !pipeline_forked(self->owner->pipe)) return 0;
    PyErr_SetString(PyExc_BufferError,
                    "dsrt.Tensor: its batch belongs to a pipeline of another process (this is a "
                    "child made by fork): not exported");
    return 1;
}

static void tensor_dealloc(TensorObject *self) {
    Py_XDECREF(self->owner);
    PyObject_Free(self);
}

/* One DLPack export: the managed tensor and its shape, freed together. */
typedef struct {
    DLManagedTensor m;
    int64_t shape[4], strides[4];
} dl_export;

static void dl_deleter(DLManagedTensor *m) {
    /* Called by the consumer when its last view is freed, from any thread,
     * with or without the GIL. */
    if (!Py_IsInitialized()) return; /* the interpreter is gone: nothing to give back */
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyMem_RawFree(m);
    PyGILState_Release(g);
}

static void dl_capsule_destructor(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "used_dltensor")) return; /* the consumer owns it now */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m) {
        if (m->deleter) m->deleter(m);
    } else {
        PyErr_WriteUnraisable(cap);
    }
    PyErr_Restore(type, value, tb);
}

static PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                     &dl_device, &copy))
        return NULL;
    if (stream != Py_None) {
        PyErr_SetString(PyExc_ValueError, "__dlpack__: stream must be None for host memory");
        return NULL;
    }
    if (dl_device != Py_None) {
        int dt = -1, di = -1;
        if (!PyTuple_Check(dl_device) || PyTuple_GET_SIZE(dl_device) != 2 ||
            get_int(PyTuple_GET_ITEM(dl_device, 0), "__dlpack__: dl_device[0]", &dt) != 0 ||
            get_int(PyTuple_GET_ITEM(dl_device, 1), "__dlpack__: dl_device[1]", &di) != 0) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "__dlpack__: dl_device: expected a (device_type, device_id) tuple "
                             "of integers, not %R",
                             dl_device);
            }
            return NULL;
        }
        if (dt != DL_CPU || di != 0) {
            PyErr_Format(PyExc_BufferError,
                         "__dlpack__: dl_device (%d, %d): dsrt batches live in host memory "
                         "(kDLCPU, 0) only",
                         dt, di);
            return NULL;
        }
    }
    if (tensor_forked(self)) return NULL;
    if (copy != Py_None && PyObject_IsTrue(copy) == 1) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__: dsrt lends its batches without a copy (copy=True refused)");
        return NULL;
    }
    dl_export *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    memcpy(e->shape, self->shape, sizeof e->shape);
    memcpy(e->strides, self->strides, sizeof e->strides);
    DLTensor *t = &e->m.dl_tensor;
    t->data = self->data;
    t->device.device_type = DL_CPU;
    t->device.device_id = 0;
    t->ndim = self->ndim;
    t->dtype = self->dtype;
    t->shape = e->shape;
    t->strides = e->strides;
    t->byte_offset = 0;
    Py_INCREF(self); /* the export keeps the tensor, hence the batch, alive */
    e->m.manager_ctx = self;
    e->m.deleter = dl_deleter;
    PyObject *cap = PyCapsule_New(&e->m, "dltensor", dl_capsule_destructor);
    if (!cap) {
        Py_DECREF(self);
        PyMem_RawFree(e);
    }
    return cap;
}

static PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused) {
    return Py_BuildValue("(ii)", DL_CPU, 0);
}

static int tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags) {
    /* Writable: the slot belongs to the consumer while it is lent. C order,
     * so shape and strides may be left out when not asked for. */
    if (tensor_forked(self)) {
        view->obj = NULL;
        return -1;
    }
    view->buf = self->data;
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->readonly = 0;
    view->itemsize = self->itemsize;
    Py_ssize_t len = self->itemsize;
    for (int i = 0; i < self->ndim; i++) len *= (Py_ssize_t)self->shape[i];
    view->len = len;
    view->ndim = self->ndim;
    view->format = (flags & PyBUF_FORMAT) ? (char *)self->format : NULL;
    /* shape and strides live in the object: Py_ssize_t copies of them. */
    Py_ssize_t *dims = PyMem_Malloc(2 * 4 * sizeof *dims);
    if (!dims) {
        Py_CLEAR(view->obj);
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < self->ndim; i++) {
        dims[i] = (Py_ssize_t)self->shape[i];
        dims[4 + i] = (Py_ssize_t)(self->strides[i] * self->itemsize);
    }
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? dims : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims + 4 : NULL;
    view->suboffsets = NULL;
    view->internal = dims;
    return 0;
}

static void tensor_releasebuffer(TensorObject *self, Py_buffer *view) {
    PyMem_Free(view->internal);
}

static PyObject *dim_item(void *shape, size_t i) {
    return PyLong_FromLongLong(((int64_t *)shape)[i]);
}

static PyObject *tensor_shape(TensorObject *self, void *unused) {
    return sequence_of((size_t)self->ndim, 1, dim_item, self->shape);
}

static const char *dtype_name(DLDataType d) {
    if (d.code == DL_FLOAT) return "float32";
    if (d.code == DL_UINT) return d.bits == 8 ? "uint8" : "uint32";
    return "int32";
}

static PyObject *tensor_dtype(TensorObject *self, void *unused) {
    return PyUnicode_FromString(dtype_name(self->dtype));
}

static PyObject *tensor_repr(TensorObject *self) {
    PyObject *shape = tensor_shape(self, NULL);
    if (!shape) return NULL;
    PyObject *r = PyUnicode_FromFormat("<dsrt.Tensor %s %R>", dtype_name(self->dtype), shape);
    Py_DECREF(shape);
    return r;
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> capsule\n\n"
     "A DLPack capsule viewing this memory, without a copy; the batch stays lent until\n"
     "the consumer's last view of it is freed."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
     "(kDLCPU, 0): host memory"},
    {NULL}};

static PyGetSetDef tensor_getset[] = {
    {"shape", (getter)tensor_shape, NULL, "the dimensions", NULL},
    {"dtype", (getter)tensor_dtype, NULL, "float32, uint8, int32 or uint32", NULL},
    {NULL}};

static PyBufferProcs tensor_as_buffer = {(getbufferproc)tensor_getbuffer,
                                         (releasebufferproc)tensor_releasebuffer};

PyTypeObject Tensor_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A view of a batch's memory (pinned host memory), exported without a copy\n"
              "through DLPack (torch.from_dlpack, numpy.from_dlpack) or the buffer protocol\n"
              "(numpy.asarray, memoryview). It keeps its batch lent while alive.",
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
    .tp_as_buffer = &tensor_as_buffer,
};
