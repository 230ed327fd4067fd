/*
 * Net.classify: image files (one path, several, or a folder) decoded by
 * dsrt's decoders and sized by its augmenter as `dstrain classify` does,
 * then classified in batches.
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

PyObject *net_classify(NetObject *self, PyObject *args, PyObject *kw) {
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
    self->oom = NULL;
    PyThreadState *ts = PyEval_SaveThread();
    classify_run(self, &j);
    PyEval_RestoreThread(ts);
    const char *oom = self->oom;
    net_unlock(self);
    if (j.rc == -ENOMEM && oom) {
        PyErr_Format(PyExc_MemoryError, "classify: %s", oom);
        goto out;
    }
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
