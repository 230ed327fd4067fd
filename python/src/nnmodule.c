/*
 * dsrt._nn: networks for the dsrt Python package (dsrt.Net, dsrt.onnx_import).
 *
 * A Net is a dsrt_net loaded from a model file (dsrt_model_load) or imported
 * from an ONNX model (dsrt_onnx_import), with what `dstrain classify` does
 * around it: image files decoded by dsrt's decoders and sized by its
 * augmenter, softmax probabilities from dsrt_net_predict, the class names of
 * the model. Arrays come in through the buffer protocol (NumPy) or DLPack
 * (__dlpack__: PyTorch, JAX, ...); probabilities go out as NumPy arrays.
 *
 * This extension is separate from dsrt._dsrt on purpose. _dsrt carries the
 * data library inside it and loads no compute library; _nn links the shared
 * libdsrt_train (and through it oneDNN), so it is loaded only when the
 * package first needs a network (dsrt/__init__.py imports it on first use of
 * dsrt.Net or dsrt.onnx_import). Its RUNPATH finds libdsrt_train beside the
 * module (a pip install copies it there), in the build tree, or in the
 * install's library folder.
 *
 * Every computation (reading arrays, decoding, the forward pass, saving)
 * runs with the GIL released; a Net's lock keeps two Python threads from
 * using one dsrt_net at once (a net belongs to one thread at a time).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <dsrt.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pyshared.h"

/* Largest image or class-names file read, as dstrain classify's cap. */
#define FILE_MAX ((size_t)256 << 20)
/* Images a forward pass, unless the caller says otherwise (dstrain classify's). */
#define DEFAULT_BATCH 64

// ----------------------------------------------------------------------------
// Files

/* Reads the regular file path whole (at most max bytes) into a malloc'd
 * buffer, *len its length. Runs without the GIL: on failure returns NULL
 * with *err an errno (or EFBIG, or EINVAL for a file that is not regular). */
static char *read_file(const char *path, size_t max, size_t *len, int *err) {
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
static PyObject *raise_read(int err, const char *what, PyObject *path) {
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
static PyObject *fs_path(PyObject *v) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(v, &b)) return NULL;
    return b;
}

/* 1 when path names an ONNX model: by its extension, as dstrain tells them
 * (the format has no magic number). */
static int is_onnx_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".onnx");
}

// ----------------------------------------------------------------------------
// Arrays: a NumPy array (buffer protocol) or a DLPack tensor, read in place

enum { DT_U8 = 0, DT_F32 = 1 };

typedef struct {
    const char *data; /* the first element */
    int ndim;
    Py_ssize_t shape[4];
    Py_ssize_t strides[4]; /* in bytes */
    int dtype;             /* DT_U8 or DT_F32 */
    Py_buffer view;        /* held when has_view */
    int has_view;
    PyObject *capsule; /* the DLPack capsule, held while the data is read */
} array_in;

static void array_release(array_in *a) {
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
static int array_get(PyObject *obj, const char *what, array_in *a) {
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
        DLManagedTensor *m = PyCapsule_GetPointer(a->capsule, "dltensor");
        if (!m) goto fail;
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
static PyObject *shape_text(const array_in *a) {
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

// ----------------------------------------------------------------------------
// The Net object

typedef struct {
    PyObject ob_base;
    dsrt_net *net;
    dsrt_net_info info;
    dsrt_augment_options ao; /* image files and uint8 arrays to the net's input */
    dsrt_decoder *dec;
    dsrt_augmenter *aug;
    float *x;       /* (x_cap) input scratch: (n, channels, height, width) */
    size_t x_cap;   /* floats */
    uint8_t *hwc;   /* (hwc_cap) one uint8 image gathered to rows of HWC */
    size_t hwc_cap; /* bytes */
    PyThread_type_lock lock;
    PyObject *names; /* tuple of the class names, or None */
} NetObject;

static PyTypeObject Net_Type;

/* Takes the net's lock, waiting without the GIL when another thread has it. */
static void net_lock(NetObject *self) {
    if (PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) return;
    PyThreadState *ts = PyEval_SaveThread();
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    PyEval_RestoreThread(ts);
}

static void net_unlock(NetObject *self) {
    PyThread_release_lock(self->lock);
}

/* Grows the scratch to n floats (under the lock, without the GIL). */
static int x_reserve(NetObject *self, size_t n) {
    if (n <= self->x_cap) return 0;
    float *x = realloc(self->x, n * sizeof *x);
    if (!x) return -ENOMEM;
    self->x = x;
    self->x_cap = n;
    return 0;
}

static void net_dealloc(NetObject *self) {
    dsrt_net_destroy(self->net);
    dsrt_decoder_destroy(self->dec);
    dsrt_augmenter_destroy(self->aug);
    free(self->x);
    free(self->hwc);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_XDECREF(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The class names the net's description holds, as a tuple, or None. */
static PyObject *class_names(const dsrt_net *net, int classes) {
    char name[256];
    if (dsrt_net_class_name(net, 0, name, sizeof name) < 0) Py_RETURN_NONE;
    PyObject *t = PyTuple_New(classes);
    if (!t) return NULL;
    for (int c = 0; c < classes; c++) {
        PyObject *s;
        if (dsrt_net_class_name(net, c, name, sizeof name) < 0)
            s = PyUnicode_FromFormat("%d", c);
        else
            s = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace");
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, c, s);
    }
    return t;
}

/* A Net owning net (destroyed on failure), images sized as ao says. */
static PyObject *net_wrap(dsrt_net *net, const dsrt_augment_options *ao) {
    NetObject *self = (NetObject *)Net_Type.tp_alloc(&Net_Type, 0);
    if (!self) {
        dsrt_net_destroy(net);
        return NULL;
    }
    self->net = net;
    dsrt_net_get_info(net, &self->info);
    self->ao = *ao;
    self->ao.output_height = self->info.height;
    self->ao.output_width = self->info.width;
    self->ao.output_channels = self->info.channels;
    int rc = dsrt_augment_check(&self->ao);
    if (rc != 0) {
        raise_code(rc, NULL);
        goto fail;
    }
    if (!(self->lock = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        goto fail;
    }
    if ((rc = dsrt_decoder_create(&self->dec, NULL)) != 0 ||
        (rc = dsrt_augmenter_create(&self->aug)) != 0) {
        raise_code(rc, NULL);
        goto fail;
    }
    if (!(self->names = class_names(net, self->info.classes))) goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

// ----------------------------------------------------------------------------
// Loading: Net.load and onnx_import

/* What Net.load and onnx_import take besides the path. */
typedef struct {
    dsrt_onnx_import_options onnx;
    int onnx_given; /* a keyword that only an ONNX model takes */
    char **names;   /* classes=, parsed (dsrt_class_names_free) */
    int n_names;
    int threads;
    dsrt_augment_options ao;
} load_args;

static void load_args_free(load_args *l) {
    dsrt_class_names_free(l->names);
    l->names = NULL;
}

/* mean= or std=: one number or one a channel (at most
 * DSRT_ONNX_CHANNELS_MAX), finite; std positive. */
static int get_stats(PyObject *v, const char *what, int positive, float *out, int *n) {
    PyObject *seq = NULL;
    Py_ssize_t k = 1;
    if (!PyFloat_Check(v) && !PyLong_Check(v)) {
        seq = PySequence_Check(v) && !PyUnicode_Check(v) ? PySequence_Fast(v, "") : NULL;
        if (!seq) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "%s: expected a number or a sequence of numbers, not "
                         "%.100s",
                         what, Py_TYPE(v)->tp_name);
            return -1;
        }
        k = PySequence_Fast_GET_SIZE(seq);
    }
    if (k < 1 || k > DSRT_ONNX_CHANNELS_MAX) {
        Py_XDECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: %R: expected 1 to %d numbers", what, v,
                     DSRT_ONNX_CHANNELS_MAX);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        double x;
        if (get_double(seq ? PySequence_Fast_GET_ITEM(seq, i) : v, what, &x) != 0) {
            Py_XDECREF(seq);
            return -1;
        }
        if (!isfinite(x) || (positive && !(x > 0))) {
            Py_XDECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s: %R: each value must be finite%s", what, v,
                         positive ? " and positive" : "");
            return -1;
        }
        out[i] = (float)x;
    }
    Py_XDECREF(seq);
    *n = (int)k;
    return 0;
}

/* classes=: a path to a file of names (one a line, as dstrain's --classes),
 * or a sequence of names; parsed by dsrt_class_names_parse either way. */
static int get_classes(PyObject *v, load_args *l) {
    if (PyUnicode_Check(v) || PyBytes_Check(v) || PyObject_HasAttrString(v, "__fspath__")) {
        PyObject *path = fs_path(v);
        if (!path) return -1;
        size_t len = 0;
        int err = 0;
        char *text;
        PyThreadState *ts = PyEval_SaveThread();
        text = read_file(PyBytes_AS_STRING(path), FILE_MAX, &len, &err);
        PyEval_RestoreThread(ts);
        if (!text) {
            raise_read(err, "classes", v);
            Py_DECREF(path);
            return -1;
        }
        int rc = dsrt_class_names_parse(text, len, &l->names, &l->n_names);
        free(text);
        if (rc != 0) {
            char msg[1024];
            snprintf(msg, sizeof msg, "classes %s: %s", PyBytes_AS_STRING(path), dsrt_last_error());
            raise_code(rc, msg);
        }
        Py_DECREF(path);
        return rc ? -1 : 0;
    }
    PyObject *seq = PySequence_Check(v) ? PySequence_Fast(v, "") : NULL;
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "classes: expected a path to a file of names or a sequence of names, not "
                     "%.100s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    /* The names one a line, as a file would hold them: the same checks and
     * the same messages (line k is classes[k - 1]). */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *parts = PyList_New(0), *text = NULL;
    int rc = -1;
    if (!parts) goto out;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "classes: no names");
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "classes[%zd]: expected a string, not %.100s", i,
                         Py_TYPE(s)->tp_name);
            goto out;
        }
        if (PyUnicode_FindChar(s, '\n', 0, PY_SSIZE_T_MAX, 1) >= 0 ||
            PyUnicode_FindChar(s, '\r', 0, PY_SSIZE_T_MAX, 1) >= 0 ||
            PyUnicode_GET_LENGTH(s) == 0) {
            PyErr_Format(PyExc_ValueError,
                         "classes[%zd]: %R: a name is 1 to 255 bytes without "
                         "line breaks",
                         i, s);
            goto out;
        }
        if (PyList_Append(parts, s) != 0) goto out;
    }
    PyObject *nl = PyUnicode_FromString("\n");
    if (!nl) goto out;
    text = PyUnicode_Join(nl, parts);
    Py_DECREF(nl);
    if (!text) goto out;
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
    if (!utf8) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "classes: a name is not valid UTF-8 (a lone surrogate)");
        goto out;
    }
    int prc = dsrt_class_names_parse(utf8, (size_t)len, &l->names, &l->n_names);
    if (prc == DSRT_EFORMAT) {
        char msg[1024];
        snprintf(msg, sizeof msg, "classes: %s (line k is classes[k - 1])", dsrt_last_error());
        raise_code(DSRT_EOPTION, msg);
    } else if (prc != 0) {
        raise_code(prc, NULL);
    } else {
        rc = 0;
    }
out:
    Py_XDECREF(text);
    Py_XDECREF(parts);
    Py_DECREF(seq);
    return rc;
}

static const char *const size_modes[] = {"resize", "centercrop", NULL};

/* The keywords of Net.load and onnx_import after the path. */
#define LOAD_KEYWORDS                                                                              \
    "preprocess", "input_scale", "mean", "std", "input_size", "classes", "size_mode",              \
        "resize_shorter", "threads"

static int load_args_parse(PyObject *const kv[9], load_args *l) {
    PyObject *preprocess = kv[0], *scale = kv[1], *mean = kv[2], *std = kv[3], *size = kv[4],
             *classes = kv[5], *mode = kv[6], *shorter = kv[7], *threads = kv[8];
    memset(l, 0, sizeof *l);
    l->onnx = dsrt_onnx_import_defaults();
    l->ao = dsrt_augment_defaults();
    if (preprocess && preprocess != Py_None) {
        const char *p = get_name(preprocess, "preprocess");
        if (!p) return -1;
        if (!strcmp(p, "torchvision")) {
            dsrt_onnx_preprocess_torchvision(&l->onnx);
        } else if (strcmp(p, "none") != 0) {
            PyErr_Format(PyExc_ValueError, "preprocess: '%s' is not 'torchvision' or 'none'", p);
            return -1;
        }
        l->onnx_given = 1;
    }
    if (scale && scale != Py_None) {
        double s;
        if (get_double(scale, "input_scale", &s) != 0) return -1;
        if (!(s > 0) || !isfinite(s)) {
            PyErr_Format(PyExc_ValueError, "input_scale: %R: not a positive number", scale);
            return -1;
        }
        l->onnx.input_scale = s;
        l->onnx_given = 1;
    }
    if (mean && mean != Py_None) {
        if (get_stats(mean, "mean", 0, l->onnx.mean, &l->onnx.n_mean) != 0) return -1;
        l->onnx_given = 1;
    }
    if (std && std != Py_None) {
        if (get_stats(std, "std", 1, l->onnx.std, &l->onnx.n_std) != 0) return -1;
        l->onnx_given = 1;
    }
    if (size && size != Py_None) {
        double hw[2];
        if (get_doubles(size, "input_size", hw, 2, 0) != 0) return -1;
        if (hw[0] != floor(hw[0]) || hw[1] != floor(hw[1]) || hw[0] < 1 || hw[1] < 1 ||
            hw[0] > 65536 || hw[1] > 65536) {
            PyErr_Format(PyExc_ValueError,
                         "input_size: %R: expected (height, width), each 1 to "
                         "65536 pixels",
                         size);
            return -1;
        }
        l->onnx.height = (int)hw[0];
        l->onnx.width = (int)hw[1];
        l->onnx_given = 1;
    }
    if (mode && mode != Py_None) {
        const char *m = get_name(mode, "size_mode");
        int k = 0;
        if (!m) return -1;
        while (size_modes[k] && strcmp(size_modes[k], m) != 0) k++;
        if (!size_modes[k]) {
            PyErr_Format(PyExc_ValueError, "size_mode: '%s' is not 'resize' or 'centercrop'", m);
            return -1;
        }
        l->ao.size_mode = k == 0 ? DSRT_AUGMENT_RESIZE : DSRT_AUGMENT_CENTERCROP;
    }
    if (shorter && shorter != Py_None) {
        int s;
        if (get_int(shorter, "resize_shorter", &s) != 0) return -1;
        if (s < 0 || s > 65536) {
            PyErr_Format(PyExc_ValueError, "resize_shorter: %d: not in [0, 65536]", s);
            return -1;
        }
        l->ao.resize_shorter = s;
    }
    if (threads && threads != Py_None) {
        if (get_int(threads, "threads", &l->threads) != 0) return -1;
        if (l->threads < 0 || l->threads > 4096) {
            PyErr_Format(PyExc_ValueError, "threads: %d: not in [0, 4096]", l->threads);
            return -1;
        }
    }
    if (classes && classes != Py_None) {
        if (get_classes(classes, l) != 0) return -1;
        l->onnx.class_names = (const char *const *)l->names;
        l->onnx.n_class_names = l->n_names;
    }
    return 0;
}

/* The net options Net.load gives: every core, as dstrain classify. */
static dsrt_net_options load_net_options(const load_args *l) {
    dsrt_net_options no = dsrt_net_defaults();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    no.threads = l->threads ? l->threads : (int)(ncpu > 0 ? ncpu : 1);
    return no;
}

/* A copy of net whose description names its classes (names, as many as
 * the net's classes): the same weights and state in a net built from the
 * described text. Returns 0, a negative code, or 1 when the rebuilt net's
 * buffers do not match (a description that does not build the same net). */
static int name_classes(dsrt_net **net, char **names, const dsrt_net_options *no) {
    dsrt_net_info info;
    dsrt_net_get_info(*net, &info);
    char *desc = dsrt_describe_classes(dsrt_net_description(*net), (const char *const *)names,
                                       (size_t)info.classes);
    if (!desc) return DSRT_EOPTION;
    dsrt_net *named = NULL;
    int rc =
        dsrt_net_create(&named, desc, info.height, info.width, info.channels, info.classes, no);
    free(desc);
    if (rc != 0) return rc;
    size_t np, nq, sp, sq;
    float *p = dsrt_net_params(*net, &np), *q = dsrt_net_params(named, &nq);
    float *s = dsrt_net_state(*net, &sp), *t = dsrt_net_state(named, &sq);
    if (!p || !q || !s || !t || np != nq || sp != sq) {
        dsrt_net_destroy(named);
        return 1;
    }
    memcpy(q, p, np * sizeof *p);
    memcpy(t, s, sp * sizeof *s);
    dsrt_net_params_changed(named);
    dsrt_net_destroy(*net);
    *net = named;
    return 0;
}

/* Loads path (a dsrt model or checkpoint, or an ONNX model) as l says into
 * *out; the exception set on failure. */
static int load_net(PyObject *path_o, const load_args *l, dsrt_net **out) {
    PyObject *path = fs_path(path_o);
    if (!path) return -1;
    const char *p = PyBytes_AS_STRING(path);
    int onnx = is_onnx_path(p), rc;
    dsrt_net *net = NULL;
    dsrt_net_options no = load_net_options(l);
    if (!onnx && l->onnx_given) {
        PyErr_Format(PyExc_ValueError,
                     "preprocess, input_scale, mean, std and input_size go with an ONNX model "
                     "(%R is not a .onnx file: a dsrt model keeps its own normalisation)",
                     path_o);
        goto fail;
    }
    PyThreadState *ts = PyEval_SaveThread();
    rc = onnx ? dsrt_onnx_import(&net, p, &l->onnx, &no) : dsrt_model_load(&net, p, &no);
    PyEval_RestoreThread(ts);
    if (rc != 0) {
        raise_code(rc, NULL);
        goto fail;
    }
    if (!onnx && l->names) {
        /* A dsrt model named anew: its description gets the names. */
        dsrt_net_info info;
        dsrt_net_get_info(net, &info);
        if (l->n_names != info.classes) {
            PyErr_Format(PyExc_ValueError, "classes: %d names for a model of %d classes",
                         l->n_names, info.classes);
            goto fail;
        }
        PyThreadState *ts = PyEval_SaveThread();
        rc = name_classes(&net, l->names, &no);
        PyEval_RestoreThread(ts);
        if (rc == 1) {
            PyErr_Format(dsrt_error, "classes: the model %R does not rebuild from its description",
                         path_o);
            goto fail;
        }
        if (rc != 0) {
            raise_code(rc, NULL);
            goto fail;
        }
    }
    Py_DECREF(path);
    *out = net;
    return 0;
fail:
    dsrt_net_destroy(net);
    Py_DECREF(path);
    return -1;
}

static PyObject *net_load(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", LOAD_KEYWORDS, NULL};
    PyObject *path, *kv[9] = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOOOOOOOO:load", kwlist, &path, &kv[0], &kv[1],
                                     &kv[2], &kv[3], &kv[4], &kv[5], &kv[6], &kv[7], &kv[8]))
        return NULL;
    load_args l;
    dsrt_net *net = NULL;
    int rc = load_args_parse(kv, &l);
    if (rc == 0) rc = load_net(path, &l, &net);
    load_args_free(&l);
    if (rc != 0) return NULL;
    return net_wrap(net, &l.ao);
}

/* 1 when a and b name one file (either may not exist: 0). */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

static PyObject *mod_onnx_import(PyObject *m, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"src", "dst", LOAD_KEYWORDS, NULL};
    PyObject *src, *dst, *kv[9] = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OOOOOOOOO:onnx_import", kwlist, &src, &dst,
                                     &kv[0], &kv[1], &kv[2], &kv[3], &kv[4], &kv[5], &kv[6], &kv[7],
                                     &kv[8]))
        return NULL;
    PyObject *s = fs_path(src), *d = s ? fs_path(dst) : NULL, *result = NULL;
    load_args l;
    dsrt_net *net = NULL;
    int rc;
    memset(&l, 0, sizeof l);
    if (!d) goto out;
    if (!is_onnx_path(PyBytes_AS_STRING(s))) {
        PyErr_Format(PyExc_ValueError, "onnx_import: %R is not an ONNX model (a .onnx file)", src);
        goto out;
    }
    if (same_file(PyBytes_AS_STRING(s), PyBytes_AS_STRING(d))) {
        PyErr_Format(PyExc_ValueError,
                     "onnx_import: dst %R is the model read (%R): give another "
                     "name",
                     dst, src);
        goto out;
    }
    if (load_args_parse(kv, &l) != 0 || load_net(src, &l, &net) != 0) goto out;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dsrt_model_save(PyBytes_AS_STRING(d), net);
    PyEval_RestoreThread(ts);
    if (rc != 0) {
        raise_code(rc, NULL);
        dsrt_net_destroy(net);
        goto out;
    }
    result = net_wrap(net, &l.ao);
out:
    load_args_free(&l);
    Py_XDECREF(s);
    Py_XDECREF(d);
    return result;
}

// ----------------------------------------------------------------------------
// predict: arrays to the net's input

/* The net's layout of a: 0 NCHW, 1 NHWC, from layout_o (None or "auto":
 * the dimension that holds the net's channels), or -1 with ValueError. */
static int resolve_layout(const NetObject *self, const array_in *a, PyObject *layout_o) {
    int c = self->info.channels, want = -1;
    const char *first = a->ndim == 3 ? "0" : "1", *names[2][2] = {{"NCHW", "NHWC"}, {"CHW", "HWC"}};
    int three = a->ndim == 3;
    if (layout_o != Py_None) {
        const char *s = get_name(layout_o, "predict: layout");
        if (!s) return -1;
        if (!strcasecmp(s, "nchw") || !strcasecmp(s, "chw"))
            want = 0;
        else if (!strcasecmp(s, "nhwc") || !strcasecmp(s, "hwc"))
            want = 1;
        else if (strcasecmp(s, "auto") != 0) {
            PyErr_Format(PyExc_ValueError, "predict: layout: '%s' is not 'NCHW', 'NHWC' or 'auto'",
                         s);
            return -1;
        }
    }
    PyObject *shape = shape_text(a);
    if (!shape) return -1;
    int cfirst = a->shape[1] == c, clast = a->shape[3] == c;
    if (want >= 0) {
        Py_ssize_t got = want == 0 ? a->shape[1] : a->shape[3];
        if (got != c) {
            PyErr_Format(PyExc_ValueError,
                         "predict: shape %U as %s has %zd channels: the net takes %d", shape,
                         names[three][want], got, c);
            want = -1;
        }
    } else if (cfirst && clast) {
        PyErr_Format(PyExc_ValueError,
                     "predict: shape %U: the layout is ambiguous (dimensions %s and %d both have "
                     "the net's %d channels): give layout='%s' or '%s'",
                     shape, first, a->ndim - 1, c, names[three][0], names[three][1]);
    } else if (!cfirst && !clast) {
        PyErr_Format(PyExc_ValueError,
                     "predict: shape %U: the net takes %d channels, in dimension %s (%s) or the "
                     "last (%s)",
                     shape, c, first, names[three][0], names[three][1]);
    } else {
        want = cfirst ? 0 : 1;
    }
    Py_DECREF(shape);
    return want;
}

/* Where a's pixel (n, c, y, x) lies, for layout nhwc. */
static inline const char *at(const array_in *a, int nhwc, Py_ssize_t n, Py_ssize_t c, Py_ssize_t y,
                             Py_ssize_t x) {
    if (nhwc)
        return a->data + n * a->strides[0] + y * a->strides[1] + x * a->strides[2] +
               c * a->strides[3];
    return a->data + n * a->strides[0] + c * a->strides[1] + y * a->strides[2] + x * a->strides[3];
}

/* The (height, width) of a's images. */
static void image_size(const array_in *a, int nhwc, Py_ssize_t *h, Py_ssize_t *w) {
    *h = nhwc ? a->shape[1] : a->shape[2];
    *w = nhwc ? a->shape[2] : a->shape[3];
}

typedef struct {
    const array_in *a;
    int nhwc;
    int augment; /* uint8 through the augmenter, as image files */
    int batch;
    float *scores; /* (n, classes) */
} predict_job;

/* Writes images [i0, i0 + n) of the job's array as the net's input into
 * dst (float NCHW). Without the GIL. */
static int fill_input(NetObject *self, const predict_job *j, Py_ssize_t i0, int n, float *dst) {
    const array_in *a = j->a;
    int C = self->info.channels;
    Py_ssize_t H, W;
    image_size(a, j->nhwc, &H, &W);
    size_t per = (size_t)C * self->info.height * self->info.width;
    for (int i = 0; i < n; i++) {
        float *out = dst + (size_t)i * per;
        Py_ssize_t k = i0 + i;
        if (a->dtype == DT_F32) {
            for (int c = 0; c < C; c++)
                for (Py_ssize_t y = 0; y < H; y++)
                    for (Py_ssize_t x = 0; x < W; x++)
                        memcpy(out++, at(a, j->nhwc, k, c, y, x), sizeof(float));
        } else if (!j->augment) {
            for (int c = 0; c < C; c++)
                for (Py_ssize_t y = 0; y < H; y++)
                    for (Py_ssize_t x = 0; x < W; x++)
                        *out++ = (float)*(const uint8_t *)at(a, j->nhwc, k, c, y, x) / 255.0f;
        } else {
            /* The pixels as a decoder gives them (rows of HWC), then the
             * augmenter, as dstrain classify makes its input. */
            dsrt_image img = {.width = (int)W, .height = (int)H, .channels = C};
            const char *p0 = at(a, j->nhwc, k, 0, 0, 0);
            if (j->nhwc && a->strides[3] == 1 && a->strides[2] == C) {
                img.data = (uint8_t *)p0;
                img.stride = (size_t)a->strides[1];
                if (a->strides[1] < (Py_ssize_t)W * C) img.data = NULL; /* overlapping rows */
            }
            if (!img.data) {
                size_t need = (size_t)H * W * C;
                if (need > self->hwc_cap) {
                    uint8_t *b = realloc(self->hwc, need);
                    if (!b) return -ENOMEM;
                    self->hwc = b;
                    self->hwc_cap = need;
                }
                uint8_t *q = self->hwc;
                for (Py_ssize_t y = 0; y < H; y++)
                    for (Py_ssize_t x = 0; x < W; x++)
                        for (int c = 0; c < C; c++)
                            *q++ = *(const uint8_t *)at(a, j->nhwc, k, c, y, x);
                img.data = self->hwc;
                img.stride = (size_t)W * C;
            }
            int rc = dsrt_augment_apply(self->aug, &self->ao, &img, (int)W, (int)H, 0, 0, 0, out);
            if (rc != 0) return rc;
        }
    }
    return 0;
}

/* The forward passes of predict, batch by batch. Without the GIL. */
static int predict_run(NetObject *self, const predict_job *j) {
    const array_in *a = j->a;
    Py_ssize_t N = a->shape[0];
    size_t per = (size_t)self->info.channels * self->info.height * self->info.width;
    int C = self->info.classes;
    /* float32 NCHW laid out as the net reads it: no copy. */
    int in_place =
        a->dtype == DT_F32 && !j->nhwc && a->strides[3] == 4 && a->strides[2] == 4 * a->shape[3] &&
        a->strides[1] == a->strides[2] * a->shape[2] &&
        (N == 1 || a->strides[0] == a->strides[1] * a->shape[1]) && ((uintptr_t)a->data & 3) == 0;
    if (!in_place) {
        Py_ssize_t b = N < j->batch ? N : j->batch;
        int rc = x_reserve(self, (size_t)b * per);
        if (rc) return rc;
    }
    for (Py_ssize_t i0 = 0; i0 < N; i0 += j->batch) {
        int n = (int)(N - i0 < j->batch ? N - i0 : j->batch), rc;
        const float *x = self->x;
        if (in_place)
            x = (const float *)(a->data + i0 * (N == 1 ? 0 : a->strides[0]));
        else if ((rc = fill_input(self, j, i0, n, self->x)) != 0)
            return rc;
        rc = dsrt_net_predict(self->net, x, n, j->scores + (size_t)i0 * C, NULL, NULL, NULL);
        if (rc != 0) return rc;
    }
    return 0;
}

/* A NumPy float32 array of shape (n, classes) over buf (a bytearray). */
static PyObject *numpy_scores(PyObject *buf, Py_ssize_t n, int classes) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) return NULL;
    PyObject *flat = PyObject_CallMethod(np, "frombuffer", "Os", buf, "float32");
    Py_DECREF(np);
    if (!flat) return NULL;
    PyObject *r = PyObject_CallMethod(flat, "reshape", "ni", n, classes);
    Py_DECREF(flat);
    return r;
}

static int get_batch(int batch) {
    if (batch >= 1 && batch <= 65536) return 0;
    PyErr_Format(PyExc_ValueError, "batch: %d: not in [1, 65536]", batch);
    return -1;
}

static PyObject *net_predict(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"x", "layout", "batch", NULL};
    PyObject *x, *layout = Py_None;
    int batch = DEFAULT_BATCH;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$Oi:predict", kwlist, &x, &layout, &batch))
        return NULL;
    if (get_batch(batch)) return NULL;
    array_in a;
    if (array_get(x, "predict", &a) != 0) return NULL;
    PyObject *buf = NULL, *result = NULL;
    predict_job j = {.a = &a, .batch = batch};
    if ((j.nhwc = resolve_layout(self, &a, layout)) < 0) goto out;
    Py_ssize_t H, W;
    image_size(&a, j.nhwc, &H, &W);
    int same = H == self->info.height && W == self->info.width;
    int identity = same && self->ao.resize_shorter == 0;
    int C = self->info.channels;
    if (a.dtype == DT_F32 && !same) {
        PyErr_Format(PyExc_ValueError,
                     "predict: float32 images are the net's input as they are and must be %dx%d "
                     "(height x width), not %zdx%zd; uint8 images are resized as image files are",
                     self->info.height, self->info.width, H, W);
        goto out;
    }
    if (a.dtype == DT_U8) {
        j.augment = C == 1 || C == 3;
        if (!j.augment && !identity) {
            PyErr_Format(PyExc_ValueError,
                         "predict: uint8 images of %d channels cannot be resized (1 or 3 "
                         "channels can): give %dx%d images",
                         C, self->info.height, self->info.width);
            goto out;
        }
        if (H < 1 || W < 1 || H > INT32_MAX || W > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "predict: images of %zdx%zd pixels", H, W);
            goto out;
        }
    }
    Py_ssize_t N = a.shape[0];
    int classes = self->info.classes;
    if (!(buf = PyByteArray_FromStringAndSize(NULL, N * classes * (Py_ssize_t)sizeof(float))))
        goto out;
    j.scores = (float *)PyByteArray_AS_STRING(buf);
    int rc;
    net_lock(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = predict_run(self, &j);
    PyEval_RestoreThread(ts);
    net_unlock(self);
    if (rc != 0) {
        raise_code(rc, NULL);
        goto out;
    }
    result = numpy_scores(buf, N, classes);
out:
    array_release(&a);
    Py_XDECREF(buf);
    return result;
}

// ----------------------------------------------------------------------------
// classify: image files

/* The files of paths (one path or a sequence of them), a folder standing
 * for its images as dstrain classify lists them: a list of bytes. */
static PyObject *expand_paths(PyObject *paths) {
    PyObject *seq, *out = PyList_New(0);
    if (!out) return NULL;
    if (PyUnicode_Check(paths) || PyBytes_Check(paths) ||
        PyObject_HasAttrString(paths, "__fspath__")) {
        seq = PyTuple_Pack(1, paths);
    } else {
        seq = PySequence_Check(paths) ? PySequence_Fast(paths, "") : NULL;
        if (!seq) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "classify: expected a path or a sequence of paths, not %.100s",
                         Py_TYPE(paths)->tp_name);
        }
    }
    if (!seq) goto fail;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *p = fs_path(PySequence_Fast_GET_ITEM(seq, i));
        if (!p) goto fail_seq;
        struct stat st;
        if (stat(PyBytes_AS_STRING(p), &st) != 0 || !S_ISDIR(st.st_mode)) {
            /* A file, or what is not there: its reading says why. */
            int rc = PyList_Append(out, p);
            Py_DECREF(p);
            if (rc) goto fail_seq;
            continue;
        }
        dsrt_datastore_options o = dsrt_datastore_defaults();
        o.source = DSRT_SOURCE_FOLDER;
        o.label_source = DSRT_LABEL_NONE;
        dsrt_datastore *ds = NULL;
        int rc;
        PyThreadState *ts = PyEval_SaveThread();
        rc = dsrt_datastore_open(&ds, PyBytes_AS_STRING(p), &o);
        PyEval_RestoreThread(ts);
        Py_DECREF(p);
        if (rc != 0) {
            raise_code(rc, NULL);
            goto fail_seq;
        }
        for (size_t k = 0; k < dsrt_datastore_count(ds); k++) {
            const char *f = dsrt_datastore_path(ds, k);
            PyObject *b = PyBytes_FromString(f);
            if (!b || PyList_Append(out, b) != 0) {
                Py_XDECREF(b);
                dsrt_datastore_close(ds);
                goto fail_seq;
            }
            Py_DECREF(b);
        }
        dsrt_datastore_close(ds);
    }
    Py_DECREF(seq);
    return out;
fail_seq:
    Py_DECREF(seq);
fail:
    Py_DECREF(out);
    return NULL;
}

typedef struct {
    char **files;
    Py_ssize_t n;
    int batch;
    float *scores;
    /* The first failure: its file, and an errno (read) or a dsrt code. */
    Py_ssize_t bad;
    int err, rc;
} classify_job;

/* Decodes file f into dst as dstrain classify does. Without the GIL. */
static int classify_file(NetObject *self, const char *f, float *dst, int *err) {
    size_t len = 0;
    char *data = read_file(f, FILE_MAX, &len, err);
    if (!data) return 0;
    dsrt_image_info info;
    dsrt_image img;
    dsrt_decode_request req = {.channels = self->info.channels};
    int rc = dsrt_decoder_info(self->dec, data, len, &info);
    if (rc == 0) {
        dsrt_augment_decode_size(&self->ao, info.width, info.height, &req.min_width,
                                 &req.min_height);
        rc = dsrt_decode(self->dec, data, len, &req, &img);
    }
    if (rc == 0)
        rc = dsrt_augment_apply(self->aug, &self->ao, &img, info.width, info.height, 0, 0, 0, dst);
    free(data);
    return rc;
}

static void classify_run(NetObject *self, classify_job *j) {
    size_t per = (size_t)self->info.channels * self->info.height * self->info.width;
    int C = self->info.classes;
    Py_ssize_t b = j->n < j->batch ? j->n : j->batch;
    if ((j->rc = x_reserve(self, (size_t)b * per)) != 0) return;
    for (Py_ssize_t i0 = 0; i0 < j->n; i0 += j->batch) {
        int n = (int)(j->n - i0 < j->batch ? j->n - i0 : j->batch);
        for (int i = 0; i < n; i++) {
            j->rc = classify_file(self, j->files[i0 + i], self->x + (size_t)i * per, &j->err);
            if (j->rc || j->err) {
                j->bad = i0 + i;
                return;
            }
        }
        j->rc =
            dsrt_net_predict(self->net, self->x, n, j->scores + (size_t)i0 * C, NULL, NULL, NULL);
        if (j->rc) return;
    }
}

static PyObject *net_classify(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"paths", "batch", "with_paths", NULL};
    PyObject *paths;
    int batch = DEFAULT_BATCH, with_paths = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$ip:classify", kwlist, &paths, &batch,
                                     &with_paths))
        return NULL;
    if (get_batch(batch)) return NULL;
    if (self->info.channels != 1 && self->info.channels != 3) {
        PyErr_Format(PyExc_ValueError,
                     "classify: the net takes %d channels; image files give 1 or 3 (use "
                     "predict)",
                     self->info.channels);
        return NULL;
    }
    PyObject *list = expand_paths(paths), *buf = NULL, *result = NULL;
    if (!list) return NULL;
    classify_job j = {.n = PyList_GET_SIZE(list), .batch = batch, .bad = -1};
    int classes = self->info.classes;
    if (!(j.files = PyMem_Calloc((size_t)j.n + 1, sizeof *j.files))) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < j.n; i++) j.files[i] = PyBytes_AS_STRING(PyList_GET_ITEM(list, i));
    if (!(buf = PyByteArray_FromStringAndSize(NULL, j.n * classes * (Py_ssize_t)sizeof(float))))
        goto out;
    j.scores = (float *)PyByteArray_AS_STRING(buf);
    net_lock(self);
    PyThreadState *ts = PyEval_SaveThread();
    classify_run(self, &j);
    PyEval_RestoreThread(ts);
    net_unlock(self);
    if (j.bad >= 0) {
        PyObject *name = PyUnicode_DecodeFSDefault(j.files[j.bad]);
        if (!name) goto out;
        if (j.err) {
            raise_read(j.err, "classify", name);
        } else {
            PyObject *msg = PyUnicode_FromFormat("classify: %S: %s", name, dsrt_last_error());
            if (msg) raise_code(j.rc, PyUnicode_AsUTF8(msg));
            Py_XDECREF(msg);
        }
        Py_DECREF(name);
        goto out;
    }
    if (j.rc) {
        raise_code(j.rc, NULL);
        goto out;
    }
    PyObject *scores = numpy_scores(buf, j.n, classes);
    if (!scores || !with_paths) {
        result = scores;
        goto out;
    }
    PyObject *names = PyList_New(j.n);
    for (Py_ssize_t i = 0; names && i < j.n; i++) {
        PyObject *s = PyUnicode_DecodeFSDefault(j.files[i]);
        if (!s)
            Py_CLEAR(names);
        else
            PyList_SET_ITEM(names, i, s);
    }
    if (names)
        result = Py_BuildValue("(NN)", names, scores);
    else
        Py_DECREF(scores);
out:
    PyMem_Free(j.files);
    Py_XDECREF(buf);
    Py_DECREF(list);
    return result;
}

// ----------------------------------------------------------------------------
// top: the likeliest labels

/* The label of class c: its name, or its number when the net names none. */
static PyObject *label_of(NetObject *self, int c) {
    if (self->names != Py_None) return Py_NewRef(PyTuple_GET_ITEM(self->names, c));
    return PyUnicode_FromFormat("%d", c);
}

static PyObject *net_top(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"probabilities", "k", NULL};
    PyObject *probs;
    int k = 3;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i:top", kwlist, &probs, &k)) return NULL;
    int C = self->info.classes;
    if (k < 1) {
        PyErr_Format(PyExc_ValueError, "top: k: %d: must be at least 1", k);
        return NULL;
    }
    if (k > C) k = C;
    PyObject *np = PyImport_ImportModule("numpy"), *arr = NULL, *result = NULL;
    if (!np) return NULL;
    arr = PyObject_CallMethod(np, "ascontiguousarray", "Os", probs, "float32");
    Py_DECREF(np);
    if (!arr) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(arr, &v, PyBUF_C_CONTIGUOUS | PyBUF_ND) != 0) goto out;
    if ((v.ndim != 1 && v.ndim != 2) || v.shape[v.ndim - 1] != C) {
        PyErr_Format(PyExc_ValueError, "top: expected probabilities of shape (n, %d) or (%d,)", C,
                     C);
        PyBuffer_Release(&v);
        goto out;
    }
    Py_ssize_t rows = v.ndim == 2 ? v.shape[0] : 1;
    int *best = PyMem_Malloc((size_t)k * sizeof *best);
    PyObject *all = PyList_New(rows);
    for (Py_ssize_t r = 0; all && best && r < rows; r++) {
        const float *s = (const float *)v.buf + (size_t)r * C;
        for (int q = 0; q < C; q++) {
            if (!isfinite(s[q])) {
                PyErr_Format(PyExc_ValueError,
                             "top: row %zd: the scores are not finite (NaN or infinite): the "
                             "model's weights or input statistics are broken",
                             r);
                Py_CLEAR(all);
                break;
            }
        }
        if (!all) break;
        /* The first of equal scores first, as dstrain classify lists them. */
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int q = 0; q < C; q++) {
                int taken = 0;
                for (int t = 0; t < j; t++) taken |= best[t] == q;
                if (!taken && (b < 0 || s[q] > s[b])) b = q;
            }
            best[j] = b;
        }
        PyObject *row = PyList_New(k);
        for (int j = 0; row && j < k; j++) {
            PyObject *label = label_of(self, best[j]);
            PyObject *pair = label ? Py_BuildValue("(Nd)", label, (double)s[best[j]]) : NULL;
            if (!pair)
                Py_CLEAR(row);
            else
                PyList_SET_ITEM(row, j, pair);
        }
        if (!row)
            Py_CLEAR(all);
        else
            PyList_SET_ITEM(all, r, row);
    }
    if (!best && all) {
        Py_CLEAR(all);
        PyErr_NoMemory();
    }
    PyMem_Free(best);
    PyBuffer_Release(&v);
    if (!all) goto out;
    if (v.ndim == 1) {
        result = Py_NewRef(PyList_GET_ITEM(all, 0));
        Py_DECREF(all);
    } else {
        result = all;
    }
out:
    Py_DECREF(arr);
    return result;
}

// ----------------------------------------------------------------------------
// Writing: save and export

static PyObject *net_save(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", NULL};
    PyObject *path_o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:save", kwlist, &path_o)) return NULL;
    PyObject *path = fs_path(path_o);
    if (!path) return NULL;
    int rc;
    net_lock(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = dsrt_model_save(PyBytes_AS_STRING(path), self->net);
    PyEval_RestoreThread(ts);
    net_unlock(self);
    Py_DECREF(path);
    if (rc != 0) return raise_code(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *net_export(NetObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "opset", NULL};
    PyObject *path_o;
    dsrt_onnx_export_options o = dsrt_onnx_export_defaults();
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$i:export", kwlist, &path_o, &o.opset))
        return NULL;
    if (o.opset < 7 || o.opset > 21) {
        PyErr_Format(PyExc_ValueError, "export: opset %d: dsrt writes opsets 7 to 21", o.opset);
        return NULL;
    }
    PyObject *path = fs_path(path_o);
    if (!path) return NULL;
    int rc;
    net_lock(self);
    PyThreadState *ts = PyEval_SaveThread();
    rc = dsrt_onnx_export(self->net, PyBytes_AS_STRING(path), &o);
    PyEval_RestoreThread(ts);
    net_unlock(self);
    Py_DECREF(path);
    if (rc != 0) return raise_code(rc, NULL);
    Py_RETURN_NONE;
}

// ----------------------------------------------------------------------------
// Properties

static PyObject *net_input_shape(NetObject *self, void *unused) {
    return Py_BuildValue("(iii)", self->info.channels, self->info.height, self->info.width);
}

static PyObject *net_classes(NetObject *self, void *unused) {
    return Py_NewRef(self->names);
}

static PyObject *net_num_classes(NetObject *self, void *unused) {
    return PyLong_FromLong(self->info.classes);
}

static PyObject *net_learnables(NetObject *self, void *unused) {
    return PyLong_FromSize_t(self->info.learnable);
}

static PyObject *net_layers(NetObject *self, void *unused) {
    PyObject *t = PyTuple_New(self->info.layers);
    for (int i = 0; t && i < self->info.layers; i++) {
        dsrt_layer_info li;
        PyObject *pair = dsrt_net_layer(self->net, i, &li) == 0
                             ? Py_BuildValue("(ss)", li.name, li.type)
                             : raise_code(-EINVAL, NULL);
        if (!pair)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, pair);
    }
    return t;
}

static PyObject *net_description(NetObject *self, void *unused) {
    const char *d = dsrt_net_description(self->net);
    return PyUnicode_DecodeUTF8(d, (Py_ssize_t)strlen(d), "replace");
}

static PyObject *net_backend(NetObject *self, void *unused) {
    return PyUnicode_FromString(self->info.backend);
}

static PyObject *net_threads(NetObject *self, void *unused) {
    return PyLong_FromLong(dsrt_net_threads(self->net));
}

static PyObject *net_repr(NetObject *self) {
    return PyUnicode_FromFormat("<dsrt.Net: %d layers, input (%d, %d, %d), %d classes, %zu "
                                "learnables>",
                                self->info.layers, self->info.channels, self->info.height,
                                self->info.width, self->info.classes, self->info.learnable);
}

static PyMethodDef net_methods[] = {
    {"load", (PyCFunction)(void (*)(void))net_load, METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Net.load(path, *, preprocess=None, input_scale=None, mean=None, std=None,\n"
     "         input_size=None, classes=None, size_mode='resize', resize_shorter=0,\n"
     "         threads=0) -> Net\n\n"
     "Loads a dsrt model or checkpoint file, or imports an ONNX model (a path ending in\n"
     ".onnx), as `dstrain classify --model` does. For an ONNX model: preprocess\n"
     "('torchvision' or 'none'), input_scale, mean and std (one value or one a channel)\n"
     "say how the model wants its pixels (it takes pixels x input_scale, less mean, over\n"
     "std), written into the net's input layer; input_size=(height, width) fixes a size\n"
     "the model leaves open. A dsrt model keeps its own normalisation and refuses them.\n"
     "classes: the class names, a list or the path of a file of one name a line (the\n"
     "C library's parser, dstrain's --classes), as many as the model's classes.\n"
     "size_mode ('resize' or 'centercrop') and resize_shorter (the shorter side first\n"
     "resized to it, 0: not) say how image files and uint8 arrays are brought to the\n"
     "net's input size. threads: compute threads, 0 for every core. Raises ValueError\n"
     "for a bad option, OSError when a file cannot be read, dsrt.Error for a model the\n"
     "library refuses, with its message."},
    {"predict", (PyCFunction)(void (*)(void))net_predict, METH_VARARGS | METH_KEYWORDS,
     "predict(x, *, layout='auto', batch=64) -> numpy.ndarray (n, classes) float32\n\n"
     "Class probabilities of images: x a NumPy array or any tensor with __dlpack__ in\n"
     "host memory (a torch CPU tensor), 4-D (a batch) or 3-D (one image). uint8 holds\n"
     "pixels 0 to 255, made into the net's input exactly as image files are (resized\n"
     "as the load's size_mode and resize_shorter say; 1 or 3 channels); float32 is the\n"
     "net's input itself, values 0 to 1 (a Pipeline's float32 batch, torchvision's\n"
     "ToTensor), of the net's height and width. layout 'NCHW' or 'NHWC' ('CHW'/'HWC'\n"
     "for one image); 'auto' takes the one whose channel dimension holds the net's\n"
     "channels and refuses a shape where both do. Any strides are read. A float32 NCHW\n"
     "array laid out contiguously is read in place; others are copied batch by batch.\n"
     "Raises TypeError for an unsupported dtype or object, ValueError for a wrong rank,\n"
     "channel count or size. The GIL is released while computing."},
    {"classify", (PyCFunction)(void (*)(void))net_classify, METH_VARARGS | METH_KEYWORDS,
     "classify(paths, *, batch=64, with_paths=False) -> numpy.ndarray (n, classes)\n\n"
     "Class probabilities of image files (JPEG, PNG, WebP), decoded by dsrt's decoders and\n"
     "sized as `dstrain classify` does: the same numbers as its --json scores. paths: one\n"
     "path or a sequence; a folder stands for its images (sub-folders too) in dsrt's\n"
     "sorted order. with_paths=True returns (files, probabilities). A file that cannot\n"
     "be read raises OSError with its name, one that does not decode dsrt.Error naming\n"
     "it. top(probabilities) gives the labels. The GIL is released while computing."},
    {"top", (PyCFunction)(void (*)(void))net_top, METH_VARARGS | METH_KEYWORDS,
     "top(probabilities, k=3) -> [[(label, probability), ...], ...]\n\n"
     "The k likeliest classes of each row of probabilities ((n, classes), or one row\n"
     "(classes,)), likeliest first, as `dstrain classify` lists them: the label is the\n"
     "class name, or its number when the model names none. A row that is not finite\n"
     "raises ValueError."},
    {"save", (PyCFunction)(void (*)(void))net_save, METH_VARARGS | METH_KEYWORDS,
     "save(path)\n\nWrites the net as a dsrt model file (description, class names,\n"
     "weights, statistics), atomically: the file is complete or absent."},
    {"export", (PyCFunction)(void (*)(void))net_export, METH_VARARGS | METH_KEYWORDS,
     "export(path, *, opset=13)\n\nWrites the net as an ONNX model, as `dstrain export`:\n"
     "its inference graph taking 'pixels' (float32 NCHW, values 0 to 255, any batch\n"
     "size), the softmax output 'probabilities', the class names in metadata_props."},
    {NULL}};

static PyGetSetDef net_getset[] = {
    {"input_shape", (getter)net_input_shape, NULL, "(channels, height, width) of the net's input",
     NULL},
    {"classes", (getter)net_classes, NULL,
     "the class names, a tuple in class order, or None when the model names none", NULL},
    {"num_classes", (getter)net_num_classes, NULL, "the number of classes (scores a row)", NULL},
    {"learnables", (getter)net_learnables, NULL, "the number of learnable parameters", NULL},
    {"layers", (getter)net_layers, NULL,
     "the layers, the input layer first: a tuple of (name, type)", NULL},
    {"description", (getter)net_description, NULL, "the description the net was built from", NULL},
    {"backend", (getter)net_backend, NULL, "where it computes: 'cpu-onednn'", NULL},
    {"threads", (getter)net_threads, NULL, "CPU compute threads", NULL},
    {NULL}};

static PyTypeObject Net_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Net",
    .tp_basicsize = sizeof(NetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A trained network, for inference: Net.load(path, ...) makes one.\n\n"
              "What `dstrain classify` does, from Python: predict(array) on NumPy arrays or\n"
              "DLPack tensors, classify(paths) on image files, top(probabilities) for the\n"
              "labels; save(path) and export(path) write it as a dsrt or ONNX model. Every\n"
              "computation releases the GIL; one Net computes for one thread at a time (others\n"
              "wait).",
    .tp_dealloc = (destructor)net_dealloc,
    .tp_repr = (reprfunc)net_repr,
    .tp_methods = net_methods,
    .tp_getset = net_getset,
};

// ----------------------------------------------------------------------------
// Module

static PyMethodDef module_methods[] = {
    {"onnx_import", (PyCFunction)(void (*)(void))mod_onnx_import, METH_VARARGS | METH_KEYWORDS,
     "onnx_import(src, dst, *, preprocess=None, input_scale=None, mean=None, std=None,\n"
     "            input_size=None, classes=None, size_mode='resize', resize_shorter=0,\n"
     "            threads=0) -> Net\n\n"
     "Imports the ONNX model src and writes it as the dsrt model file dst, as `dstrain\n"
     "import` does (dst must not be src); returns the net. The keywords are Net.load's."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_nn",
    .m_doc = "dsrt's networks for inference (libdsrt_train on oneDNN), loaded on first use.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__nn(void) {
    if (PyType_Ready(&Net_Type) < 0) return NULL;
    /* dsrt.Error is _dsrt's: both extensions raise the one class. */
    PyObject *data = PyImport_ImportModule("dsrt._dsrt");
    if (!data) return NULL;
    dsrt_error = PyObject_GetAttrString(data, "Error");
    Py_DECREF(data);
    if (!dsrt_error) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Net", (PyObject *)&Net_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
