/*
 * Net.predict and Net.top: arrays to the net's input (NCHW or NHWC, uint8
 * or float), softmax probabilities out as NumPy arrays, the likeliest
 * labels of them.
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
                    if (!b) {
                        self->oom = "out of memory for an image's pixels";
                        return -ENOMEM;
                    }
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
PyObject *numpy_scores(PyObject *buf, Py_ssize_t n, int classes) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) return NULL;
    PyObject *flat = PyObject_CallMethod(np, "frombuffer", "Os", buf, "float32");
    Py_DECREF(np);
    if (!flat) return NULL;
    PyObject *r = PyObject_CallMethod(flat, "reshape", "ni", n, classes);
    Py_DECREF(flat);
    return r;
}

int get_batch(int batch) {
    if (batch >= 1 && batch <= 65536) return 0;
    PyErr_Format(PyExc_ValueError, "batch: %d: not in [1, 65536]", batch);
    return -1;
}

PyObject *net_predict(NetObject *self, PyObject *args, PyObject *kw) {
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
    /* A broadcast array can hold more images than memory holds scores. */
    if (N > PY_SSIZE_T_MAX / ((Py_ssize_t)classes * (Py_ssize_t)sizeof(float))) {
        PyErr_Format(PyExc_ValueError, "predict: %zd images: too many for %d scores each", N,
                     classes);
        goto out;
    }
    if (!(buf = PyByteArray_FromStringAndSize(NULL, N * classes * (Py_ssize_t)sizeof(float))))
        goto out;
    j.scores = (float *)PyByteArray_AS_STRING(buf);
    int rc;
    net_lock(self);
    self->oom = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    rc = predict_run(self, &j);
    PyEval_RestoreThread(ts);
    const char *oom = self->oom;
    net_unlock(self);
    if (rc == -ENOMEM && oom) {
        PyErr_Format(PyExc_MemoryError, "predict: %s", oom);
        goto out;
    }
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
// top: the likeliest labels

/* The label of class c: its name, or its number when the net names none. */
static PyObject *label_of(NetObject *self, int c) {
    if (self->names != Py_None) return Py_NewRef(PyTuple_GET_ITEM(self->names, c));
    return PyUnicode_FromFormat("%d", c);
}

PyObject *net_top(NetObject *self, PyObject *args, PyObject *kw) {
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
