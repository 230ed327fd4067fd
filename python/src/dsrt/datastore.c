/*
 * dsrt.Datastore: a dsrt_datastore, opened from a folder, a manifest, shard
 * sets, an object store or a mix of them, with its samples, classes, views
 * (split, shuffle, partition, subset) and export.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Datastore

static const name_value split_names[] = {
    {"train", DSRT_SPLIT_TRAIN}, {"test", DSRT_SPLIT_TEST}, {NULL, 0}};

static PyObject *datastore_wrap(dsrt_datastore *ds) {
    DatastoreObject *o = PyObject_New(DatastoreObject, &Datastore_Type);
    if (!o) {
        dsrt_datastore_close(ds);
        return NULL;
    }
    o->ds = ds;
    o->users = 0;
    o->opening = 0;
    return (PyObject *)o;
}

/* Asked by dsrt_datastore_open while it waits on a store: runs the
 * interpreter's signal handlers (Ctrl-C raises KeyboardInterrupt), with the
 * GIL taken back for the moment. ctx is the thread state the open released. */
static int open_interrupted(void *ctx) {
    PyThreadState **ts = ctx;
    PyEval_RestoreThread(*ts);
    int stop = PyErr_CheckSignals() != 0;
    *ts = PyEval_SaveThread();
    return stop;
}

/* Datastore()'s path (one, or a sequence of them: a mix) and mix (weights
 * as a sequence or a string "0.7,0.3", or a mix file), as
 * dsrt_datastore_open_mix takes them. */
typedef struct {
    PyObject **bytes; /* (n) each path, file-system encoded */
    const char **paths;
    size_t n;
    PyObject *mix_bytes; /* the mix's text */
    const char *mix;
} data_paths;

static void data_paths_free(data_paths *d) {
    for (size_t k = 0; d->bytes && k < d->n; k++) Py_XDECREF(d->bytes[k]);
    PyMem_Free(d->bytes);
    PyMem_Free(d->paths);
    Py_XDECREF(d->mix_bytes);
    memset(d, 0, sizeof *d);
}

static int data_paths_get(data_paths *d, PyObject *path, PyObject *mix) {
    int many = PyList_Check(path) || PyTuple_Check(path);
    Py_ssize_t n = path == Py_None ? 0 : many ? PySequence_Size(path) : 1;
    if (n == 0 && mix == Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "Datastore: give a path (or paths and mix, or a mix file)");
        return -1;
    }
    d->bytes = PyMem_Calloc((size_t)(n ? n : 1), sizeof *d->bytes);
    d->paths = PyMem_Calloc((size_t)(n ? n : 1), sizeof *d->paths);
    if (!d->bytes || !d->paths) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *one = many ? PySequence_GetItem(path, k) : (Py_INCREF(path), path);
        int ok = one && PyUnicode_FSConverter(one, &d->bytes[k]);
        Py_XDECREF(one);
        d->n = (size_t)k + 1;
        if (!ok) return -1;
        d->paths[k] = PyBytes_AS_STRING(d->bytes[k]);
    }
    if (mix == Py_None) return 0;
    if (PyUnicode_Check(mix) || PyBytes_Check(mix) || PyObject_HasAttrString(mix, "__fspath__")) {
        if (!PyUnicode_FSConverter(mix, &d->mix_bytes)) return -1;
    } else {
        /* Numbers: written as the text the library parses, exactly. */
        Py_ssize_t k = PySequence_Check(mix) ? PySequence_Size(mix) : -1;
        if (k < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "mix: %R: expected weights (a sequence of numbers) or a mix file", mix);
            return -1;
        }
        double *w = PyMem_Calloc((size_t)(k ? k : 1), sizeof *w);
        if (!w) {
            PyErr_NoMemory();
            return -1;
        }
        PyObject *text = get_doubles(mix, "mix", w, k, 0) == 0 ? PyUnicode_FromString("") : NULL;
        for (Py_ssize_t i = 0; text && i < k; i++) {
            char one[40];
            snprintf(one, sizeof one, "%s%.17g", i ? "," : "", w[i]);
            PyObject *t = PyUnicode_FromFormat("%U%s", text, one);
            Py_DECREF(text);
            text = t;
        }
        PyMem_Free(w);
        if (!text) return -1;
        d->mix_bytes = PyUnicode_AsUTF8String(text);
        Py_DECREF(text);
        if (!d->mix_bytes) return -1;
    }
    d->mix = PyBytes_AS_STRING(d->mix_bytes);
    return 0;
}

static int datastore_init(DatastoreObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path",
                             "source",
                             "labels",
                             "include_subfolders",
                             "extensions",
                             "follow_symlinks",
                             "drop_empty_classes",
                             "labels_path",
                             "split",
                             "cifar100_coarse",
                             "manifest_header",
                             "order",
                             "shuffle_buffer",
                             "retry_deadline",
                             "request_timeout",
                             "mix",
                             "mix_labels",
                             "mix_replacement",
                             NULL};
    PyObject *path = Py_None, *source = NULL, *labels = NULL, *subfolders = NULL, *ext = NULL,
             *follow = NULL, *drop_empty = NULL, *labels_path = NULL, *split = NULL, *coarse = NULL,
             *header = Py_None, *order = NULL, *buffer = NULL, *deadline = NULL,
             *req_timeout = NULL, *mix = Py_None, *mix_labels = NULL, *mix_replacement = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OOOOOOOOOOOOOOOOO:Datastore", kwlist, &path,
                                     &source, &labels, &subfolders, &ext, &follow, &drop_empty,
                                     &labels_path, &split, &coarse, &header, &order, &buffer,
                                     &deadline, &req_timeout, &mix, &mix_labels, &mix_replacement))
        return -1;
    int rc = -1, v;
    data_paths dp = {0};
    dsrt_mix_options mo = dsrt_mix_defaults();
    if (data_paths_get(&dp, path, mix) != 0) goto done;
    if (mix_labels && get_mix_labels(mix_labels, &mo.labels) != 0) goto done;
    if (mix_replacement && get_bool(mix_replacement, "mix_replacement", &mo.replacement) != 0)
        goto done;
    if (self->users > 0 || self->opening) {
        /* A Pipeline reads the index this would free. */
        PyErr_Format(PyExc_RuntimeError,
                     "Datastore: already open and in use (by %u Pipeline%s): it cannot be opened "
                     "again; make a new Datastore",
                     self->users, self->users == 1 ? "" : "s");
        goto done;
    }
    dsrt_datastore_options o = dsrt_datastore_defaults();
    if (source && get_source(source, &o.source) != 0) goto done;
    if (labels && get_labels(labels, &o.label_source) != 0) goto done;
    if (subfolders && get_bool(subfolders, "include_subfolders", &o.include_subfolders) != 0)
        goto done;
    if (ext && get_str(ext, "extensions", &o.extensions) != 0) goto done;
    if (follow && get_bool(follow, "follow_symlinks", &o.follow_symlinks) != 0) goto done;
    if (drop_empty && get_bool(drop_empty, "drop_empty_classes", &o.drop_empty_classes) != 0)
        goto done;
    if (labels_path && get_str(labels_path, "labels_path", &o.labels_path) != 0) goto done;
    if (split && get_enum(split, "split", split_names, &v) != 0) goto done;
    if (split) o.split = (dsrt_split)v;
    if (coarse && get_bool(coarse, "cifar100_coarse", &o.cifar100_coarse) != 0) goto done;
    if (header == Py_None) {
        o.manifest_header = -1;
    } else if (get_bool(header, "manifest_header", &o.manifest_header) != 0) {
        goto done;
    }
    if (order && get_order(order, &o.shard_order) != 0) goto done;
    uint64_t sb;
    if (buffer && get_u64(buffer, "shuffle_buffer", (uint64_t)1 << 24, &sb) != 0) goto done;
    if (buffer && sb == 0) {
        PyErr_SetString(PyExc_ValueError, "shuffle_buffer: must be at least 1");
        goto done;
    }
    if (buffer) o.shuffle_buffer = (size_t)sb;
    if (deadline && get_double(deadline, "retry_deadline", &o.remote.retry_deadline_s) != 0)
        goto done;
    if (req_timeout && get_double(req_timeout, "request_timeout", &o.remote.timeout_s) != 0)
        goto done;
    if (req_timeout && o.remote.timeout_s == 0) {
        /* 0 would be the default for the library: refused, as by Pipeline. */
        PyErr_SetString(PyExc_ValueError, "Datastore: remote.timeout_s: 0: not in (0, 86400]");
        goto done;
    }
    dsrt_datastore *ds = NULL;
    int code;
    self->opening = 1;
    PyThreadState *ts = PyEval_SaveThread();
    o.interrupted = open_interrupted;
    o.interrupted_ctx = &ts;
    code = dsrt_datastore_open_mix(&ds, dp.paths, dp.n, dp.mix, &o, &mo);
    PyEval_RestoreThread(ts);
    self->opening = 0;
    if (code != 0) {
        /* A signal handler's exception (KeyboardInterrupt) is the one raised. */
        if (!PyErr_Occurred()) raise_code(code, NULL);
        goto done;
    }
    dsrt_datastore_close(self->ds);
    self->ds = ds;
    rc = 0;
done:
    data_paths_free(&dp);
    return rc;
}

static void datastore_dealloc(DatastoreObject *self) {
    dsrt_datastore_close(self->ds);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int datastore_ready(DatastoreObject *self) {
    if (self->ds) return 0;
    PyErr_SetString(PyExc_ValueError, "Datastore: not opened");
    return -1;
}

static Py_ssize_t datastore_len(DatastoreObject *self) {
    if (datastore_ready(self) != 0) return -1;
    return (Py_ssize_t)dsrt_datastore_count(self->ds);
}

/* Sample index i, negative counting from the end. */
static int datastore_index(DatastoreObject *self, Py_ssize_t i, size_t *out) {
    if (datastore_ready(self) != 0) return -1;
    Py_ssize_t n = (Py_ssize_t)dsrt_datastore_count(self->ds);
    Py_ssize_t k = i < 0 ? i + n : i;
    if (k < 0 || k >= n) {
        PyErr_Format(PyExc_IndexError, "sample %zd: the datastore has %zd (from -%zd to %zd)", i, n,
                     n, n - 1);
        return -1;
    }
    *out = (size_t)k;
    return 0;
}

/* The sample index given as a method's argument. */
static int datastore_arg(DatastoreObject *self, PyObject *arg, size_t *i) {
    Py_ssize_t k = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (k == -1 && PyErr_Occurred()) return -1;
    return datastore_index(self, k, i);
}

static PyObject *datastore_label(DatastoreObject *self, PyObject *arg) {
    size_t i;
    if (datastore_arg(self, arg, &i) != 0) return NULL;
    return PyLong_FromLong(dsrt_datastore_label(self->ds, i));
}

static PyObject *datastore_path(DatastoreObject *self, PyObject *arg) {
    size_t i;
    if (datastore_arg(self, arg, &i) != 0) return NULL;
    const char *p = dsrt_datastore_path(self->ds, i);
    if (!p) Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(p);
}

static PyObject *datastore_id(DatastoreObject *self, PyObject *arg) {
    size_t i;
    if (datastore_arg(self, arg, &i) != 0) return NULL;
    return PyLong_FromUnsignedLong(dsrt_datastore_id(self->ds, i));
}

static PyObject *label_item(void *ds, size_t i) {
    return PyLong_FromLong(dsrt_datastore_label(ds, i));
}

static PyObject *datastore_labels(DatastoreObject *self, PyObject *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return sequence_of(dsrt_datastore_count(self->ds), 0, label_item, self->ds);
}

static PyObject *class_item(void *ds, size_t c) {
    return PyUnicode_DecodeFSDefault(dsrt_datastore_class_name(ds, c));
}

static PyObject *datastore_classes(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return sequence_of(dsrt_datastore_num_classes(self->ds), 1, class_item, self->ds);
}

static PyObject *count_item(void *counts, size_t c) {
    return PyLong_FromSize_t(((size_t *)counts)[c]);
}

static PyObject *datastore_class_counts(DatastoreObject *self, PyObject *unused) {
    if (datastore_ready(self) != 0) return NULL;
    size_t n = dsrt_datastore_num_classes(self->ds);
    size_t *counts = PyMem_Calloc(n ? n : 1, sizeof *counts);
    if (!counts) return PyErr_NoMemory();
    dsrt_datastore_class_counts(self->ds, counts);
    PyObject *l = sequence_of(n, 0, count_item, counts);
    PyMem_Free(counts);
    return l;
}

static PyObject *datastore_source(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return PyUnicode_FromString(dsrt_source_name(dsrt_datastore_source(self->ds)));
}

static PyObject *datastore_warnings(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return PyUnicode_DecodeFSDefault(dsrt_datastore_warnings(self->ds));
}

static PyObject *datastore_split_each_label(DatastoreObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"fraction", "randomized", "seed", "count", NULL};
    PyObject *frac = Py_None, *count = Py_None, *seed = NULL;
    int randomized = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Op$OO:split_each_label", kwlist, &frac,
                                     &randomized, &seed, &count) ||
        datastore_ready(self) != 0)
        return NULL;
    dsrt_split_options o = {0};
    o.randomized = randomized;
    if (seed && get_u64(seed, "split_each_label: seed", UINT64_MAX, &o.seed) != 0) return NULL;
    /* An integer first argument is a count per label, as MATLAB's. */
    if (count == Py_None && frac != Py_None && PyLong_Check(frac) && !PyBool_Check(frac))
        count = frac, frac = Py_None;
    if ((frac == Py_None) == (count == Py_None)) {
        PyErr_SetString(PyExc_TypeError,
                        "split_each_label: give a fraction in (0, 1] or a count > 0 of each label");
        return NULL;
    }
    /* The range is the library's to check (and to name). */
    if (frac != Py_None) {
        if (get_double(frac, "split_each_label: fraction", &o.fraction) != 0) return NULL;
    } else {
        uint64_t c;
        if (get_u64(count, "split_each_label: count", SIZE_MAX, &c) != 0) return NULL;
        o.count = (size_t)c;
    }
    dsrt_datastore *a = NULL, *b = NULL;
    int rc = dsrt_datastore_split_each_label(self->ds, &o, &a, &b);
    if (rc != 0) return raise_code(rc, NULL);
    PyObject *pa = datastore_wrap(a);
    if (!pa) {
        dsrt_datastore_close(b);
        return NULL;
    }
    PyObject *pb = datastore_wrap(b);
    if (!pb) {
        Py_DECREF(pa);
        return NULL;
    }
    return Py_BuildValue("(NN)", pa, pb);
}

static PyObject *datastore_shuffle(DatastoreObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"seed", NULL};
    PyObject *seedo = NULL;
    uint64_t seed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:shuffle", kwlist, &seedo) ||
        datastore_ready(self) != 0)
        return NULL;
    if (seedo && get_u64(seedo, "shuffle: seed", UINT64_MAX, &seed) != 0) return NULL;
    dsrt_datastore *v = NULL;
    int rc = dsrt_datastore_shuffle(self->ds, seed, &v);
    return rc != 0 ? raise_code(rc, NULL) : datastore_wrap(v);
}

static PyObject *datastore_partition(DatastoreObject *self, PyObject *args) {
    Py_ssize_t n, i;
    if (!PyArg_ParseTuple(args, "nn:partition", &n, &i) || datastore_ready(self) != 0) return NULL;
    if (n <= 0 || i < 0 || i >= n) {
        PyErr_Format(PyExc_ValueError, "partition: part %zd of %zd: need 0 <= i < n", i, n);
        return NULL;
    }
    dsrt_datastore *v = NULL;
    int rc = dsrt_datastore_partition(self->ds, (size_t)n, (size_t)i, &v);
    return rc != 0 ? raise_code(rc, NULL) : datastore_wrap(v);
}

static PyObject *datastore_subset(DatastoreObject *self, PyObject *arg) {
    if (datastore_ready(self) != 0) return NULL;
    PyObject *seq = PySequence_Fast(arg, "subset: expected a sequence of sample positions");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint32_t *idx = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *idx);
    PyObject *res = NULL;
    if (!idx) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        uint64_t v;
        if (get_u64(PySequence_Fast_GET_ITEM(seq, k), "subset: position", UINT32_MAX, &v) != 0)
            goto done;
        idx[k] = (uint32_t)v;
    }
    dsrt_datastore *v = NULL;
    int rc = dsrt_datastore_subset(self->ds, idx, (size_t)n, &v);
    res = rc != 0 ? raise_code(rc, NULL) : datastore_wrap(v);
done:
    PyMem_Free(idx);
    Py_DECREF(seq);
    return res;
}

static PyObject *datastore_location(DatastoreObject *self, PyObject *arg) {
    size_t i;
    if (datastore_arg(self, arg, &i) != 0) return NULL;
    dsrt_sample_location loc;
    int rc = dsrt_datastore_location(self->ds, i, &loc);
    if (rc != 0) return raise_code(rc, NULL);
    return Py_BuildValue("(NKKs)",
                         PyUnicode_DecodeFSDefault(dsrt_datastore_shard_path(self->ds, loc.shard)),
                         (unsigned long long)loc.offset, (unsigned long long)loc.size, loc.member);
}

static PyObject *datastore_shards(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    size_t n = dsrt_datastore_shard_count(self->ds);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; l && k < n; k++) {
        PyObject *s = PyUnicode_DecodeFSDefault(dsrt_datastore_shard_path(self->ds, k));
        if (!s) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)k, s);
    }
    return l;
}

static PyObject *datastore_order(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return PyUnicode_FromString(dsrt_shard_order_name(dsrt_datastore_shard_order(self->ds)));
}

static PyObject *datastore_shuffle_buffer(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return PyLong_FromSize_t(dsrt_datastore_shuffle_buffer(self->ds));
}

/* write_shards(out, *, shard_bytes=256 MiB, shard_samples=0, class_names=None). */
static PyObject *datastore_write_shards(DatastoreObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"out", "shard_bytes", "shard_samples", "class_names", NULL};
    PyObject *out = NULL, *bytes = NULL, *samples = NULL, *names = Py_None, *res = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$OOO:write_shards", kwlist,
                                     PyUnicode_FSConverter, &out, &bytes, &samples, &names))
        return NULL;
    dsrt_shard_write_options o = dsrt_shard_write_defaults();
    const char **cn = NULL;
    PyObject *seq = NULL;
    if (datastore_ready(self) != 0) goto done;
    if (bytes && get_u64(bytes, "shard_bytes", UINT64_MAX, &o.shard_bytes) != 0) goto done;
    if (samples && get_u64(samples, "shard_samples", UINT64_MAX, &o.shard_samples) != 0) goto done;
    if (names != Py_None) {
        size_t nc = dsrt_datastore_num_classes(self->ds);
        seq = PySequence_Fast(names, "write_shards: class_names must be a sequence of str");
        if (!seq) goto done;
        if ((size_t)PySequence_Fast_GET_SIZE(seq) != nc) {
            PyErr_Format(PyExc_ValueError, "write_shards: %zd class names for %zu classes",
                         PySequence_Fast_GET_SIZE(seq), nc);
            goto done;
        }
        cn = PyMem_Calloc(nc ? nc : 1, sizeof *cn);
        if (!cn) {
            PyErr_NoMemory();
            goto done;
        }
        for (size_t c = 0; c < nc; c++)
            if (get_str(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)c), "class_names", &cn[c]) != 0 ||
                !cn[c])
                goto done;
        o.class_names = cn;
    }
    uint64_t written = 0;
    const char *path = PyBytes_AS_STRING(out);
    PyThreadState *ts = PyEval_SaveThread();
    int64_t k = dsrt_shards_write(self->ds, path, &o, &written);
    PyEval_RestoreThread(ts);
    res = k < 0 ? raise_code((int)k, NULL) : PyLong_FromLongLong(k);
done:
    PyMem_Free(cn);
    Py_XDECREF(seq);
    Py_XDECREF(out);
    return res;
}

static PyObject *datastore_repr(DatastoreObject *self) {
    if (!self->ds) return PyUnicode_FromString("<dsrt.Datastore (not opened)>");
    return PyUnicode_FromFormat("<dsrt.Datastore %s: %zu samples, %zu classes>",
                                dsrt_source_name(dsrt_datastore_source(self->ds)),
                                dsrt_datastore_count(self->ds),
                                dsrt_datastore_num_classes(self->ds));
}

static PyObject *weight_item(void *ds, size_t k) {
    return PyFloat_FromDouble(dsrt_datastore_mix_weight(ds, k));
}

static PyObject *datastore_mix_weights(DatastoreObject *self, void *unused) {
    if (datastore_ready(self) != 0) return NULL;
    return sequence_of(dsrt_datastore_mix_sources(self->ds), 1, weight_item, self->ds);
}

static PyObject *datastore_mix_source(DatastoreObject *self, PyObject *arg) {
    size_t i;
    if (datastore_arg(self, arg, &i) != 0) return NULL;
    return PyLong_FromSize_t(dsrt_datastore_mix_source(self->ds, i));
}

static PyMethodDef datastore_methods[] = {
    {"mix_source", (PyCFunction)datastore_mix_source, METH_O,
     "mix_source(i) -> the source of a mix sample i came from (0 when not a mix)"},
    {"label", (PyCFunction)datastore_label, METH_O, "label(i) -> class index of sample i"},
    {"labels", (PyCFunction)datastore_labels, METH_NOARGS, "labels() -> every sample's label"},
    {"path", (PyCFunction)datastore_path, METH_O,
     "path(i) -> the file of sample i, or None for pixels held in memory"},
    {"id", (PyCFunction)datastore_id, METH_O,
     "id(i) -> the stable identity of sample i (its position as opened)"},
    {"class_counts", (PyCFunction)datastore_class_counts, METH_NOARGS,
     "class_counts() -> samples of each class"},
    {"split_each_label", (PyCFunction)(void (*)(void))datastore_split_each_label,
     METH_VARARGS | METH_KEYWORDS,
     "split_each_label(fraction_or_count, randomized=False, *, seed=0) -> (first, rest)\n\n"
     "MATLAB's splitEachLabel: a fraction in (0, 1] (or an integer count > 0) of each\n"
     "label into the first view, the rest into the second."},
    {"shuffle", (PyCFunction)(void (*)(void))datastore_shuffle, METH_VARARGS | METH_KEYWORDS,
     "shuffle(seed=0) -> a view in a random order keyed by seed"},
    {"partition", (PyCFunction)datastore_partition, METH_VARARGS,
     "partition(n, i) -> part i of n contiguous parts (for rank i of n)"},
    {"subset", (PyCFunction)datastore_subset, METH_O,
     "subset(positions) -> a view holding these sample positions, in this order"},
    {"location", (PyCFunction)datastore_location, METH_O,
     "location(i) -> (shard, offset, size, member): where sample i of a shard set lies"},
    {"write_shards", (PyCFunction)(void (*)(void))datastore_write_shards,
     METH_VARARGS | METH_KEYWORDS,
     "write_shards(out, *, shard_bytes=256 MiB, shard_samples=0, class_names=None) -> shards\n\n"
     "Writes the samples (in this view's order) as WebDataset tar shards\n"
     "out/shard-000000.tar, ... (<key>.cls, <key>.jpg|png), classes.json and dsrt's index,\n"
     "staged and moved into place whole. out must be new, empty or a set dsrt wrote\n"
     "(only the files its record lists are replaced); anything else in it, or an out\n"
     "that is, holds or lies inside the data's folder, raises ValueError."},
    {NULL}};

static PyGetSetDef datastore_getset[] = {
    {"mix_weights", (getter)datastore_mix_weights, NULL,
     "a mix's sources' weights, normalised to sum 1: a tuple (1.0,) when not a mix", NULL},
    {"classes", (getter)datastore_classes, NULL, "class names, in class-index order", NULL},
    {"source", (getter)datastore_source, NULL, "folder, manifest, idx, cifar10, cifar100 or shards",
     NULL},
    {"shards", (getter)datastore_shards, NULL, "the shard files of a shard set ([] otherwise)",
     NULL},
    {"order", (getter)datastore_order, NULL,
     "how a shard set is read: 'exact' or 'shard' ('exact' for other sources)", NULL},
    {"shuffle_buffer", (getter)datastore_shuffle_buffer, NULL,
     "a shard set's shuffle buffer in the shard order, in samples", NULL},
    {"warnings", (getter)datastore_warnings, NULL,
     "problems met while opening that did not stop it, one a line", NULL},
    {NULL}};

static PySequenceMethods datastore_as_sequence = {.sq_length = (lenfunc)datastore_len};

PyTypeObject Datastore_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Datastore",
    .tp_basicsize = sizeof(DatastoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Datastore(path, *, source='auto', labels='folder', include_subfolders=True,\n"
              "          extensions=None, follow_symlinks=True, drop_empty_classes=False,\n"
              "          labels_path=None, split='train', cifar100_coarse=False,\n"
              "          manifest_header=None, order='auto', shuffle_buffer=1000,\n"
              "          retry_deadline=60.0, request_timeout=30.0, mix=None,\n"
              "          mix_labels='merge', mix_replacement=False)\n\n"
              "An index of samples with labels: a folder of class sub-folders, a CSV manifest\n"
              "(path,label), IDX files (MNIST, Fashion-MNIST), CIFAR-10/100 batches or tar\n"
              "shards (a folder of them, a .tar, a glob or a brace list; order 'exact' or\n"
              "'shard' says how a pipeline reads them). A folder or shard set may be a prefix\n"
              "in an object store ('s3://bucket/prefix') and a manifest a URL (s3://, https://)\n"
              "naming objects by URL; credentials, region and endpoint come from the\n"
              "environment and ~/.aws as for the AWS tools. retry_deadline and\n"
              "request_timeout (seconds) apply to the requests that list the prefix or fetch\n"
              "the manifest or a shard set's index; Ctrl-C interrupts the open\n"
              "(KeyboardInterrupt).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)datastore_init,
    .tp_dealloc = (destructor)datastore_dealloc,
    .tp_repr = (reprfunc)datastore_repr,
    .tp_methods = datastore_methods,
    .tp_getset = datastore_getset,
    .tp_as_sequence = &datastore_as_sequence,
};
