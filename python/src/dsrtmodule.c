/*
 * dsrt._dsrt: the CPython extension behind the dsrt Python package.
 *
 * It wraps the public C API (the headers under include/dsrt) and nothing else: a Datastore
 * is a dsrt_datastore, a Pipeline a dsrt_pipeline, a Batch one lent
 * dsrt_batch. A batch's samples and labels are handed to NumPy and PyTorch
 * without a copy, through DLPack (__dlpack__, __dlpack_device__) and the
 * buffer protocol: each exported tensor keeps its Batch alive, and the Batch
 * gives its slot back to the pipeline (dsrt_batch_release) when the last
 * tensor viewing it is freed. Holding tensors therefore holds slots: the
 * pipeline makes at most prefetch + 1 consecutive batches at a time, and
 * asking for one more while the oldest is still referenced raises dsrt.Error
 * (after a garbage collection, in case only a reference cycle held it)
 * rather than waiting for ever.
 *
 * Waiting for a batch releases the GIL and wakes every 100 ms to let Python
 * run its signal handlers, so Ctrl-C raises KeyboardInterrupt promptly;
 * closing the pipeline (close(), the context manager, or the object's end)
 * stops and joins the workers. A Pipeline belongs to one thread at a time.
 *
 * Misuse raises rather than crashes or hangs: in a child made by os.fork()
 * the parent's pipelines are dead (fork copies only the calling thread, so
 * their workers do not exist there): using one raises, closing or freeing
 * it abandons it at once, and the child may open pipelines of its own.
 * Opening again (__init__) a Datastore a Pipeline reads, or a Pipeline that
 * is open or has batches alive, is refused; every method and getter of an
 * object whose __init__ never ran raises ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dsrt.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pyshared.h"

// ----------------------------------------------------------------------------
// Names

/* A name from a table of (name, value) pairs ending with a NULL name. */
typedef struct {
    const char *name;
    int value;
} name_value;

/* The ValueError of a name the library refused. */
static int name_refused(const char *what) {
    PyErr_Format(PyExc_ValueError, "%s: %s", what, dsrt_last_error());
    return -1;
}

static int get_source(PyObject *v, dsrt_source *out) {
    const char *s = get_name(v, "source");
    return !s ? -1 : dsrt_source_from_name(s, out) ? name_refused("source") : 0;
}

static int get_labels(PyObject *v, dsrt_label_source *out) {
    const char *s = get_name(v, "labels");
    return !s ? -1 : dsrt_label_source_from_name(s, out) ? name_refused("labels") : 0;
}

static int get_mix_labels(PyObject *v, dsrt_mix_labels *out) {
    const char *s = get_name(v, "mix_labels");
    return !s ? -1 : dsrt_mix_labels_from_name(s, out) ? name_refused("mix_labels") : 0;
}

static int get_order(PyObject *v, dsrt_shard_order *out) {
    const char *s = get_name(v, "order");
    return !s ? -1 : dsrt_shard_order_from_name(s, out) ? name_refused("order") : 0;
}

static int get_layout(PyObject *v, const char *what, int dtype, dsrt_augment_layout *out) {
    const char *s = get_name(v, what);
    return !s ? -1 : dsrt_augment_layout_from_name(s, dtype, out) ? name_refused(what) : 0;
}

static int get_enum(PyObject *v, const char *what, const name_value *t, int *out) {
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: expected a string, not %.100s", what,
                         Py_TYPE(v)->tp_name);
        return -1;
    }
    char names[512] = "";
    size_t len = 0;
    for (const name_value *e = t; e->name; e++) {
        if (strcmp(s, e->name) == 0) {
            *out = e->value;
            return 0;
        }
        len += (size_t)snprintf(names + len, len < sizeof names ? sizeof names - len : 0, "%s%s",
                                e == t ? "" : ", ", e->name);
    }
    PyErr_Format(PyExc_ValueError, "%s: '%s': expected one of %s", what, s, names);
    return -1;
}

/* A keyword that names one of an option row's choices (dsrt/options.h):
 * the index of the name, the message and "did you mean" of the tools. An
 * older name is taken with a DeprecationWarning. */
static int get_choice(PyObject *v, const char *what, unsigned where, int *out) {
    const char *s = get_name(v, what);
    if (!s) return -1;
    const dsrt_option_group *groups;
    size_t n = dsrt_option_groups(&groups);
    const dsrt_option *row = dsrt_option_find(groups, n, what, where, NULL);
    double index;
    const char *renamed = NULL;
    if (!row) {
        PyErr_Format(PyExc_SystemError, "%s: no row in dsrt's option tables", what);
        return -1;
    }
    if (dsrt_option_value(row, what, s, &index, &renamed) != 0) {
        PyErr_SetString(PyExc_ValueError, dsrt_last_error());
        return -1;
    }
    if (renamed &&
        PyErr_WarnFormat(PyExc_DeprecationWarning, 1, "%s='%s' is now '%s'", what, s, renamed) != 0)
        return -1;
    *out = (int)index;
    return 0;
}

static int get_str(PyObject *v, const char *what, const char **out) {
    if (v == Py_None) {
        *out = NULL;
        return 0;
    }
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: expected a string or None, not %.100s", what,
                         Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = s;
    return 0;
}

// ----------------------------------------------------------------------------
// Building sequences

typedef PyObject *(*item_fn)(void *ctx, size_t i);

/* A list (or a tuple) of item(ctx, i) for i in [0, n). */
static PyObject *sequence_of(size_t n, int tuple, item_fn item, void *ctx) {
    PyObject *seq = tuple ? PyTuple_New((Py_ssize_t)n) : PyList_New((Py_ssize_t)n);
    for (size_t i = 0; seq && i < n; i++) {
        PyObject *v = item(ctx, i);
        if (!v) {
            Py_CLEAR(seq);
            break;
        }
        if (tuple)
            PyTuple_SET_ITEM(seq, (Py_ssize_t)i, v);
        else
            PyList_SET_ITEM(seq, (Py_ssize_t)i, v);
    }
    return seq;
}

// ----------------------------------------------------------------------------
// Datastore

typedef struct {
    PyObject ob_base;
    dsrt_datastore *ds;
    unsigned users; /* open Pipelines reading it: it may not be re-opened under them */
    int opening;    /* __init__ in progress (it releases the GIL) */
} DatastoreObject;

static PyTypeObject Datastore_Type;

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

static int datastore_ready(DatastoreObject *self) {
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

static PyTypeObject Datastore_Type = {
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

// ----------------------------------------------------------------------------
// Pipeline, Batch and Tensor objects

typedef struct {
    PyObject ob_base;
    dsrt_pipeline *p;
    PyObject *ds;      /* the Datastore, kept open while p is */
    uint64_t bpe;      /* batches per epoch */
    uint64_t end;      /* global index past the last batch; UINT64_MAX: endless */
    uint64_t pos;      /* global index of the next batch */
    uint64_t iter_end; /* the current iteration stops before this batch */
    uint64_t *held;    /* (slots) global index of the live batch in each slot, or UINT64_MAX */
    unsigned slots;    /* prefetch + 1 */
    unsigned live;     /* Batch objects alive */
    int busy;          /* a call that released the GIL is in progress */
    int closing;       /* close() asked while batches were alive */
    int native;        /* native-size mode */
    uint64_t images;   /* samples delivered since the open or the last reset */
    double t0;         /* time of the open or the last reset (monotonic, s) */
    pid_t pid;         /* the process that opened it: in a child made by fork, whose
                          copy has no worker threads, it is dead (see pipeline_forked) */
} PipelineObject;

typedef struct {
    PyObject ob_base;
    PipelineObject *pipe;
    dsrt_batch *b;
} BatchObject;

/* A view of part of a batch (the samples, the labels, ...). */
typedef struct {
    PyObject ob_base;
    BatchObject *owner;
    void *data;
    int ndim;
    int64_t shape[4];
    int64_t strides[4]; /* elements */
    DLDataType dtype;
    const char *format; /* struct module format of one element */
    Py_ssize_t itemsize;
} TensorObject;

static PyTypeObject Pipeline_Type, Batch_Type, Tensor_Type;

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether this is a child made by fork after the pipeline was opened: its
 * copy of the pipeline has no worker threads (fork copies only the calling
 * thread) and its locks may be held by threads that do not exist here, so
 * it may be neither used nor closed; it is left as it is. */
static int pipeline_forked(const PipelineObject *self) {
    return self->bpe && self->pid != getpid();
}

static int raise_forked(void) {
    PyErr_SetString(PyExc_RuntimeError,
                    "Pipeline: opened in another process; this is a child made by fork, where "
                    "its worker threads do not exist: open a Pipeline in this process");
    return -1;
}

/* Really closes the C pipeline: stops and joins the workers, frees slots.
 * In a child made by fork the pipeline is abandoned instead: there are no
 * workers to join, and freeing could wait on locks no thread here holds. */
static void pipeline_really_close(PipelineObject *self) {
    int forked = pipeline_forked(self);
    dsrt_pipeline *p = self->p;
    self->p = NULL;
    if (p && !forked) {
        PyThreadState *ts = PyEval_SaveThread();
        dsrt_pipeline_close(p);
        PyEval_RestoreThread(ts);
    }
    PyMem_Free(self->held);
    self->held = NULL;
    if (self->ds) ((DatastoreObject *)self->ds)->users--;
    Py_CLEAR(self->ds);
}

// ----------------------------------------------------------------------------
// Tensor: DLPack and the buffer protocol

static TensorObject *tensor_new(BatchObject *owner, void *data, DLDataType dtype,
                                const char *format, int ndim, const int64_t *shape) {
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

static PyTypeObject Tensor_Type = {
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

// ----------------------------------------------------------------------------
// Batch

static void batch_dealloc(BatchObject *self) {
    PipelineObject *pipe = self->pipe;
    if (pipe && self->b) {
        uint64_t g = self->b->global;
        if (pipe->p && !pipeline_forked(pipe)) {
            if (pipe->held) pipe->held[g % pipe->slots] = UINT64_MAX;
            if (dsrt_batch_release(pipe->p, self->b) != 0) {
                PyErr_SetString(PyExc_RuntimeError, dsrt_last_error());
                PyErr_WriteUnraisable((PyObject *)self);
            }
        }
        pipe->live--;
        if (pipe->closing && pipe->live == 0) pipeline_really_close(pipe);
    }
    Py_XDECREF(pipe);
    PyObject_Free(self);
}

static const DLDataType dt_f32 = {DL_FLOAT, 32, 1}, dt_u8 = {DL_UINT, 8, 1},
                        dt_i32 = {DL_INT, 32, 1}, dt_u32 = {DL_UINT, 32, 1};

/* Sample i of a native-size batch: (C, h, w) or (h, w, C). */
static PyObject *native_sample(void *batch, size_t i) {
    BatchObject *self = batch;
    const dsrt_batch *b = self->b;
    int f32 = b->layout == DSRT_AUGMENT_F32_NCHW;
    int64_t h = b->sizes[2 * i], w = b->sizes[2 * i + 1];
    int64_t c = f32 ? b->shape[1] : b->shape[3];
    int64_t shape[3] = {c, h, w};
    if (!f32) shape[0] = h, shape[1] = w, shape[2] = c;
    return (PyObject *)tensor_new(self, (char *)b->data + i * b->sample_stride,
                                  f32 ? dt_f32 : dt_u8, f32 ? "f" : "B", 3, shape);
}

static PyObject *batch_images(BatchObject *self, void *unused) {
    const dsrt_batch *b = self->b;
    int f32 = b->layout == DSRT_AUGMENT_F32_NCHW;
    if (b->shape[2] == 0) /* native: one tensor a sample */
        return sequence_of(b->count, 1, native_sample, self);
    int64_t shape[4] = {(int64_t)b->count, b->shape[1], b->shape[2], b->shape[3]};
    return (PyObject *)tensor_new(self, b->data, f32 ? dt_f32 : dt_u8, f32 ? "f" : "B", 4, shape);
}

static PyObject *batch_labels(BatchObject *self, void *unused) {
    int64_t shape[1] = {(int64_t)self->b->count};
    return (PyObject *)tensor_new(self, self->b->labels, dt_i32, "i", 1, shape);
}

static PyObject *batch_soft_labels(BatchObject *self, void *unused) {
    const dsrt_batch *b = self->b;
    if (!b->soft_labels) Py_RETURN_NONE;
    int64_t shape[2] = {(int64_t)b->count, (int64_t)b->classes};
    return (PyObject *)tensor_new(self, b->soft_labels, dt_f32, "f", 2, shape);
}

static PyObject *batch_mix_lambda(BatchObject *self, void *unused) {
    return PyFloat_FromDouble(self->b->mix_lambda);
}

static PyObject *batch_mix_box(BatchObject *self, void *unused) {
    const dsrt_batch *b = self->b;
    if (!b->mix_cutmix) Py_RETURN_NONE;
    return Py_BuildValue("(iiii)", b->mix_box[0], b->mix_box[1], b->mix_box[2], b->mix_box[3]);
}

static PyObject *batch_ids(BatchObject *self, void *unused) {
    int64_t shape[1] = {(int64_t)self->b->count};
    return (PyObject *)tensor_new(self, self->b->ids, dt_u32, "I", 1, shape);
}

static PyObject *batch_sources(BatchObject *self, void *unused) {
    int64_t shape[1] = {(int64_t)self->b->count};
    return (PyObject *)tensor_new(self, self->b->sources, dt_i32, "i", 1, shape);
}

static PyObject *batch_sizes(BatchObject *self, void *unused) {
    int64_t shape[2] = {(int64_t)self->b->count, 2};
    return (PyObject *)tensor_new(self, self->b->sizes, dt_i32, "i", 2, shape);
}

static PyObject *batch_count(BatchObject *self, void *unused) {
    return PyLong_FromSize_t(self->b->count);
}
static PyObject *batch_epoch(BatchObject *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->b->epoch);
}
static PyObject *batch_index(BatchObject *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->b->index);
}
static PyObject *batch_global(BatchObject *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->b->global);
}

static Py_ssize_t batch_len(BatchObject *self) {
    return (Py_ssize_t)self->b->count;
}

static PyObject *batch_repr(BatchObject *self) {
    return PyUnicode_FromFormat("<dsrt.Batch epoch %llu index %llu: %zu samples>",
                                (unsigned long long)self->b->epoch,
                                (unsigned long long)self->b->index, self->b->count);
}

static PyGetSetDef batch_getset[] = {
    {"images", (getter)batch_images, NULL,
     "the samples: a Tensor (count, C, H, W) float32 or (count, H, W, C) uint8; in native\n"
     "mode a tuple of one Tensor per sample, each at its own size",
     NULL},
    {"labels", (getter)batch_labels, NULL, "class index of each sample: Tensor (count,) int32",
     NULL},
    {"soft_labels", (getter)batch_soft_labels, NULL,
     "targets with mixup, cutmix or label smoothing: Tensor (count, classes) float32, each\n"
     "row summing to 1 (what nn.CrossEntropyLoss and timm's SoftTargetCrossEntropy take);\n"
     "None without them",
     NULL},
    {"mix_lambda", (getter)batch_mix_lambda, NULL,
     "weight of each sample's own image and label (1.0 when the batch was not mixed)", NULL},
    {"mix_box", (getter)batch_mix_box, NULL,
     "cutmix: the box (y0, y1, x0, x1) that holds the partner's pixels; None otherwise", NULL},
    {"ids", (getter)batch_ids, NULL,
     "datastore id of the sample that filled each place: Tensor (count,) uint32", NULL},
    {"sizes", (getter)batch_sizes, NULL, "height and width of each sample: Tensor (count, 2) int32",
     NULL},
    {"sources", (getter)batch_sources, NULL,
     "the mix source each sample came from: Tensor (count,) int32 (0 when not a mix)", NULL},
    {"count", (getter)batch_count, NULL, "samples in this batch", NULL},
    {"epoch", (getter)batch_epoch, NULL, "epoch, from 0", NULL},
    {"index", (getter)batch_index, NULL, "batch in its epoch, from 0", NULL},
    {"global_index", (getter)batch_global, NULL, "epoch * batches_per_epoch + index", NULL},
    {NULL}};

static PySequenceMethods batch_as_sequence = {.sq_length = (lenfunc)batch_len};

static PyTypeObject Batch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch lent by a Pipeline. Its slot goes back to the pipeline when the Batch\n"
              "and every Tensor (and every DLPack or buffer view) made from it are freed.",
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_repr = (reprfunc)batch_repr,
    .tp_getset = batch_getset,
    .tp_as_sequence = &batch_as_sequence,
};

// ----------------------------------------------------------------------------
// Pipeline options: one table for the augment keywords

typedef enum { K_INT, K_BOOL, K_DOUBLE, K_RANGE, K_RGB, K_ENUM, K_SIZE } key_kind;

static const name_value size_mode_names[] = {{"resize", DSRT_AUGMENT_RESIZE},
                                             {"centercrop", DSRT_AUGMENT_CENTERCROP},
                                             {"randcrop", DSRT_AUGMENT_RANDCROP},
                                             {"randresizedcrop", DSRT_AUGMENT_RANDRESIZEDCROP},
                                             {NULL, 0}};
static const name_value units_names[] = {
    {"input", DSRT_AUGMENT_UNITS_INPUT}, {"output", DSRT_AUGMENT_UNITS_OUTPUT}, {NULL, 0}};
static const name_value norm_names[] = {{"none", DSRT_AUGMENT_NORM_NONE},
                                        {"rescale", DSRT_AUGMENT_NORM_RESCALE},
                                        {"zerocenter", DSRT_AUGMENT_NORM_ZEROCENTER},
                                        {"zscore", DSRT_AUGMENT_NORM_ZSCORE},
                                        {NULL, 0}};

typedef struct {
    const char *name;
    key_kind kind;
    size_t offset;
    const name_value *names; /* K_ENUM */
} augment_key;

#define AUG(field, kind)                                                                           \
    { #field, kind, offsetof(dsrt_augment_options, field), NULL }
#define AUGE(field, names)                                                                         \
    { #field, K_ENUM, offsetof(dsrt_augment_options, field), names }

static const augment_key augment_keys[] = {
    {"output_size", K_SIZE, offsetof(dsrt_augment_options, output_height), NULL},
    AUG(output_height, K_INT),
    AUG(output_width, K_INT),
    AUG(output_channels, K_INT),
    AUGE(size_mode, size_mode_names),
    AUG(resize_shorter, K_INT),
    AUG(rand_x_reflection, K_BOOL),
    AUG(rand_y_reflection, K_BOOL),
    AUG(reflection_probability, K_DOUBLE),
    AUG(rand_rotation, K_RANGE),
    AUG(rand_scale, K_RANGE),
    AUG(rand_x_scale, K_RANGE),
    AUG(rand_y_scale, K_RANGE),
    AUG(rand_x_shear, K_RANGE),
    AUG(rand_y_shear, K_RANGE),
    AUG(rand_x_translation, K_RANGE),
    AUG(rand_y_translation, K_RANGE),
    AUGE(translation_units, units_names),
    AUG(translation_whole_pixels, K_BOOL),
    AUG(fill_value, K_RGB),
    AUGE(norm, norm_names),
    AUG(mean, K_RGB),
    AUG(std, K_RGB),
    AUG(decode_oversample, K_DOUBLE),
    AUG(decode_dc, K_BOOL),
    AUG(crop_scale, K_RANGE),
    AUG(crop_ratio, K_RANGE),
    AUG(brightness, K_RANGE),
    AUG(contrast, K_RANGE),
    AUG(saturation, K_RANGE),
    AUG(hue, K_RANGE),
    AUG(grayscale_probability, K_DOUBLE),
    AUG(erase_probability, K_DOUBLE),
    AUG(erase_scale, K_RANGE),
    AUG(erase_ratio, K_RANGE),
    AUG(erase_random, K_BOOL),
    AUG(erase_value, K_RGB),
};

/* Sets the augment option named key to v. */
static int augment_set(dsrt_augment_options *o, PyObject *key, PyObject *v) {
    const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!k) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "augment: keys must be strings");
        return -1;
    }
    char what[96];
    snprintf(what, sizeof what, "augment: %s", k);
    for (size_t i = 0; i < sizeof augment_keys / sizeof *augment_keys; i++) {
        const augment_key *e = &augment_keys[i];
        if (strcmp(e->name, k) != 0) continue;
        char *f = (char *)o + e->offset;
        double d[3];
        switch (e->kind) {
        case K_INT:
            return get_int(v, what, (int *)f);
        case K_BOOL:
            return get_bool(v, what, (int *)f);
        case K_DOUBLE:
            return get_double(v, what, (double *)f);
        case K_RANGE:
            return get_doubles(v, what, (double *)f, 2, 0);
        case K_ENUM: {
            int x;
            if (get_enum(v, what, e->names, &x) != 0) return -1;
            memcpy(f, &x, sizeof x); /* the enums are int-sized */
            return 0;
        }
        case K_RGB:
            if (get_doubles(v, what, d, 3, 1) != 0) return -1;
            for (int c = 0; c < 3; c++) ((float *)f)[c] = (float)d[c];
            return 0;
        case K_SIZE:
            if (get_doubles(v, what, d, 2, 1) != 0) return -1;
            if (d[0] != (int)d[0] || d[1] != (int)d[1]) {
                PyErr_Format(PyExc_ValueError, "%s: %R: expected whole pixels", what, v);
                return -1;
            }
            o->output_height = (int)d[0];
            o->output_width = (int)d[1];
            return 0;
        }
    }
    char names[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof augment_keys / sizeof *augment_keys; i++)
        len += (size_t)snprintf(names + len, len < sizeof names ? sizeof names - len : 0, "%s%s",
                                i ? ", " : "", augment_keys[i].name);
    PyErr_Format(PyExc_ValueError, "augment: unknown option '%s' (options: %s)", k, names);
    return -1;
}

static const name_value io_names[] = {
    {"auto", DSRT_IO_AUTO}, {"uring", DSRT_IO_URING}, {"pread", DSRT_IO_PREAD}, {NULL, 0}};

// ----------------------------------------------------------------------------
// Pipeline

/* The keywords of Pipeline(). */
typedef struct {
    PyObject *ds, *preset, *augment, *layout, *dtype, *batch, *prefetch, *workers, *cpus, *pin,
        *drop_last, *shuffle, *seed, *epochs, *io, *depth, *direct, *max_pixels, *strict, *fail,
        *drop_bad, *max_bad, *max_file, *chunk, *native, *native_px, *gpu, *remote_depth,
        *max_conns, *deadline, *req_timeout, *cache_dir, *cache_limit;
    PyObject *mixup, *cutmix, *cutmix_minmax, *mix_prob, *switch_prob, *smoothing, *classes, *rank,
        *world;
    PyObject *sample_weights, *epoch_samples;
    /* sample_weights given as numbers, or as a path (its str): freed once
     * the pipeline is open. */
    double *weights;
    PyObject *weights_path;
} pipeline_args;

/* Augmentation: the preset, then the augment keywords, then layout and dtype. */
static int pipeline_augment(const pipeline_args *pa, dsrt_augment_options *a) {
    *a = dsrt_augment_defaults();
    int v;
    if (pa->preset != Py_None) {
        if (get_choice(pa->preset, "preset", DSRT_IN_PY_PIPELINE, &v) != 0) return -1;
        if (dsrt_augment_preset_from_name(dsrt_augment_preset_name(v), a) != 0) {
            PyErr_SetString(PyExc_ValueError, dsrt_last_error());
            return -1;
        }
    }
    int norm_given = 0;
    if (pa->augment != Py_None) {
        if (!PyDict_Check(pa->augment)) {
            PyErr_Format(PyExc_TypeError, "augment: expected a dict, not %.100s",
                         Py_TYPE(pa->augment)->tp_name);
            return -1;
        }
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(pa->augment, &pos, &key, &value))
            if (augment_set(a, key, value) != 0) return -1;
        norm_given = PyDict_GetItemString(pa->augment, "norm") != NULL;
    }
    dsrt_augment_layout lay = DSRT_AUGMENT_F32_NCHW, dt = DSRT_AUGMENT_F32_NCHW;
    int by_layout = pa->layout != Py_None, by_dtype = pa->dtype != Py_None;
    if (by_layout && get_layout(pa->layout, "layout", 0, &lay) != 0) return -1;
    if (by_dtype && get_layout(pa->dtype, "dtype", 1, &dt) != 0) return -1;
    if (by_layout && by_dtype && lay != dt) {
        PyErr_Format(PyExc_ValueError,
                     "layout %s with dtype %s: dsrt makes float32 NCHW or uint8 NHWC batches",
                     dsrt_augment_layout_name(lay), dsrt_augment_layout_dtype(dt));
        return -1;
    }
    if (!by_layout) lay = dt;
    if ((by_layout || by_dtype) && lay == DSRT_AUGMENT_U8_NHWC) {
        a->layout = DSRT_AUGMENT_U8_NHWC;
        if (!norm_given) a->norm = DSRT_AUGMENT_NORM_NONE; /* uint8 takes no normalisation */
    } else if (by_layout || by_dtype) {
        a->layout = DSRT_AUGMENT_F32_NCHW;
    }
    int rc = dsrt_augment_check(a);
    if (rc != 0) {
        raise_code(rc, NULL);
        return -1;
    }
    return 0;
}

/* An environment variable as an integer in [min, max], with its name in
 * the message when it is not one. */
static int env_int(const char *name, long min, long max, long *out) {
    const char *v = getenv(name);
    char *end;
    errno = 0;
    long x = v && *v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < min || x > max) {
        PyErr_Format(PyExc_ValueError, "rank='env': %s=%s: expected an integer in [%ld, %ld]", name,
                     v ? v : "", min, max);
        return -1;
    }
    *out = x;
    return 0;
}

/*
 * rank and world_size: this process's share of every epoch, as parts of
 * each global batch of batch * world_size samples (dstrain's workers under
 * mpirun take theirs the same way); rank='env' reads torchrun's RANK and
 * WORLD_SIZE, or Slurm's SLURM_PROCID and SLURM_NTASKS. Without drop_last
 * the last batch is padded from the start of the order (pad_last), so every
 * rank gets as many samples.
 */
static int pipeline_ranks(const pipeline_args *pa, dsrt_pipeline_options *o) {
    PyObject *r = pa->rank && pa->rank != Py_None ? pa->rank : NULL;
    PyObject *w = pa->world && pa->world != Py_None ? pa->world : NULL;
    if (!r && !w) return 0;
    long rank = 0, world = 1;
    const long most = 65536;
    if (r && PyUnicode_Check(r)) {
        if (PyUnicode_CompareWithASCIIString(r, "env") != 0) {
            PyErr_Format(PyExc_ValueError, "rank: %R: expected an integer or 'env'", r);
            return -1;
        }
        if (w) {
            PyErr_SetString(PyExc_ValueError,
                            "rank='env' reads world_size from the environment too: give no "
                            "world_size");
            return -1;
        }
        const char *rn = "RANK", *wn = "WORLD_SIZE";
        if (!getenv(rn) && !getenv(wn)) rn = "SLURM_PROCID", wn = "SLURM_NTASKS";
        if (!getenv(rn) && !getenv(wn)) {
            PyErr_SetString(PyExc_ValueError,
                            "rank='env': neither RANK and WORLD_SIZE (torchrun) nor SLURM_PROCID "
                            "and SLURM_NTASKS (Slurm) are set");
            return -1;
        }
        if (env_int(wn, 1, most, &world) != 0 || env_int(rn, 0, most - 1, &rank) != 0) return -1;
        if (rank >= world) {
            PyErr_Format(PyExc_ValueError, "rank='env': %s=%ld is not below %s=%ld", rn, rank, wn,
                         world);
            return -1;
        }
    } else {
        if (!r || !w) {
            PyErr_SetString(PyExc_ValueError,
                            "rank and world_size go together (or rank='env' alone)");
            return -1;
        }
        uint64_t u;
        if (get_u64(w, "world_size", (uint64_t)most, &u) != 0) return -1;
        world = (long)u;
        if (world < 1) {
            PyErr_SetString(PyExc_ValueError, "world_size: 0: must be at least 1");
            return -1;
        }
        if (get_u64(r, "rank", (uint64_t)most, &u) != 0) return -1;
        rank = (long)u;
        if (rank >= world) {
            PyErr_Format(PyExc_ValueError, "rank: %ld: not below world_size %ld", rank, world);
            return -1;
        }
    }
    if (o->batch > SIZE_MAX / (size_t)world) {
        PyErr_Format(PyExc_ValueError, "batch: %zu times world_size %ld is too large", o->batch,
                     world);
        return -1;
    }
    o->batch *= (size_t)world;
    o->parts = (unsigned)world;
    o->part = (unsigned)rank;
    o->pad_last = !o->drop_last && world > 1;
    return 0;
}

/* The pipeline keywords over dsrt_pipeline_defaults(). */
static int pipeline_options(pipeline_args *pa, dsrt_pipeline_options *o) {
    *o = dsrt_pipeline_defaults();
    int v;
    uint64_t u;
#define U64_OPT(obj, name, max, dst)                                                               \
    if (obj) {                                                                                     \
        if (get_u64(obj, name, max, &u) != 0) return -1;                                           \
        dst = u;                                                                                   \
    }
#define BOOL_OPT(obj, name, dst)                                                                   \
    if (obj && get_bool(obj, name, &dst) != 0) return -1;
    U64_OPT(pa->batch, "batch", SIZE_MAX, o->batch);
    U64_OPT(pa->prefetch, "prefetch", UINT32_MAX, o->prefetch);
    U64_OPT(pa->workers, "workers", UINT32_MAX, o->threads);
    if (get_str(pa->cpus, "cpus", &o->cpus) != 0) return -1;
    BOOL_OPT(pa->pin, "pin", o->pin);
    BOOL_OPT(pa->drop_last, "drop_last", o->drop_last);
    if (pa->shuffle) {
        if (PyBool_Check(pa->shuffle)) {
            o->shuffle = pa->shuffle == Py_True ? DSRT_SHUFFLE_EVERY_EPOCH : DSRT_SHUFFLE_NEVER;
        } else {
            if (get_choice(pa->shuffle, "shuffle", DSRT_IN_PY_PIPELINE, &v) != 0) return -1;
            o->shuffle = (dsrt_shuffle)v;
        }
    }
    U64_OPT(pa->seed, "seed", UINT64_MAX, o->seed);
    U64_OPT(pa->epochs, "epochs", UINT64_MAX, o->epochs);
    if (pa->io) {
        if (get_enum(pa->io, "io", io_names, &v) != 0) return -1;
        o->reader.io = (dsrt_io)v;
    }
    U64_OPT(pa->depth, "io_depth", UINT32_MAX, o->reader.depth);
    BOOL_OPT(pa->direct, "direct", o->reader.direct);
    U64_OPT(pa->max_pixels, "max_pixels", UINT64_MAX, o->decoder.max_pixels);
    BOOL_OPT(pa->strict, "strict_decode", o->decoder.strict);
    BOOL_OPT(pa->fail, "fail_on_error", o->fail_on_error);
    BOOL_OPT(pa->drop_bad, "drop_bad", o->drop_bad);
    U64_OPT(pa->max_bad, "max_consecutive_bad", UINT32_MAX, o->max_consecutive_bad);
    U64_OPT(pa->max_file, "max_file_bytes", SIZE_MAX, o->max_file_bytes);
    U64_OPT(pa->chunk, "chunk", SIZE_MAX, o->chunk);
    BOOL_OPT(pa->native, "native", o->native);
    U64_OPT(pa->native_px, "native_max_pixels", UINT64_MAX, o->native_max_pixels);
    if (pa->gpu && get_int(pa->gpu, "gpu", &o->gpu) != 0) return -1;
    U64_OPT(pa->remote_depth, "remote_depth", UINT32_MAX, o->reader.remote.depth);
    U64_OPT(pa->max_conns, "max_connections", UINT32_MAX, o->reader.remote.max_connections);
    if (pa->cache_dir && get_str(pa->cache_dir, "cache_dir", &o->reader.remote.cache_dir) != 0)
        return -1;
    U64_OPT(pa->cache_limit, "cache_limit", UINT64_MAX, o->reader.remote.cache_limit);
    if (pa->deadline &&
        get_double(pa->deadline, "retry_deadline", &o->reader.remote.retry_deadline_s) != 0)
        return -1;
    if (pa->req_timeout &&
        get_double(pa->req_timeout, "request_timeout", &o->reader.remote.timeout_s) != 0)
        return -1;
    if (pa->mixup && get_double(pa->mixup, "mixup_alpha", &o->mixup_alpha) != 0) return -1;
    if (pa->cutmix && get_double(pa->cutmix, "cutmix_alpha", &o->cutmix_alpha) != 0) return -1;
    if (pa->cutmix_minmax && pa->cutmix_minmax != Py_None &&
        get_doubles(pa->cutmix_minmax, "cutmix_minmax", o->cutmix_minmax, 2, 0) != 0)
        return -1;
    if (pa->mix_prob && get_double(pa->mix_prob, "mix_prob", &o->mix_prob) != 0) return -1;
    if (pa->switch_prob && get_double(pa->switch_prob, "switch_prob", &o->mix_switch_prob) != 0)
        return -1;
    if (pa->smoothing && get_double(pa->smoothing, "label_smoothing", &o->label_smoothing) != 0)
        return -1;
    if (pa->classes && pa->classes != Py_None)
        U64_OPT(pa->classes, "num_classes", (uint64_t)1 << 24, o->classes);
    U64_OPT(pa->epoch_samples, "epoch_samples", UINT32_MAX, o->epoch_samples);
    if (pa->sample_weights && pa->sample_weights != Py_None) {
        PyObject *w = pa->sample_weights;
        if (PyUnicode_Check(w) || PyBytes_Check(w) || PyObject_HasAttrString(w, "__fspath__")) {
            /* "class-balanced" or a weights file: a str, as the library reads it. */
            PyObject *fs = pa->weights_path = PyOS_FSPath(w);
            int bad = !fs || !PyUnicode_Check(fs);
            if (!bad) o->sample_weights = PyUnicode_AsUTF8(fs);
            if (bad || !o->sample_weights) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "sample_weights: a str path is needed");
                return -1;
            }
        } else {
            Py_ssize_t n = PySequence_Check(w) ? PySequence_Size(w) : -1;
            if (n < 0) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "sample_weights: %R: expected 'class-balanced', a weights file or a "
                             "sequence of numbers",
                             w);
                return -1;
            }
            if (!(pa->weights = PyMem_Calloc((size_t)(n ? n : 1), sizeof *pa->weights))) {
                PyErr_NoMemory();
                return -1;
            }
            if (get_doubles(w, "sample_weights", pa->weights, n, 0) != 0) return -1;
            Py_ssize_t want = (Py_ssize_t)dsrt_datastore_count(((DatastoreObject *)pa->ds)->ds);
            if (n != want) {
                PyErr_Format(PyExc_ValueError,
                             "sample_weights: %zd weights for %zd samples (one a sample, in the "
                             "datastore's order)",
                             n, want);
                return -1;
            }
            o->sample_weight_values = pa->weights;
        }
    }
#undef U64_OPT
#undef BOOL_OPT
    return pipeline_ranks(pa, o);
}

/* Opens the pipeline on datastore ds and makes self its handle. */
static int pipeline_start(PipelineObject *self, PyObject *ds, const dsrt_augment_options *a,
                          const dsrt_pipeline_options *o) {
    dsrt_pipeline *p = NULL;
    DatastoreObject *dso = (DatastoreObject *)ds;
    const dsrt_datastore *cds = dso->ds;
    /* The datastore stays as it is while this opens (the GIL is released)
     * and while the pipeline lives; so does this object. */
    dso->users++;
    self->busy = 1;
    PyThreadState *ts = PyEval_SaveThread();
    int rc = dsrt_pipeline_open(&p, cds, a, o);
    PyEval_RestoreThread(ts);
    self->busy = 0;
    if (rc != 0) dso->users--;
    if (rc != 0) {
        raise_code(rc, NULL);
        return -1;
    }
    dsrt_pipeline_statistics st;
    dsrt_pipeline_stats(p, &st);
    self->held = PyMem_Malloc(st.slots * sizeof *self->held);
    if (!self->held) {
        dsrt_pipeline_close(p);
        dso->users--;
        PyErr_NoMemory();
        return -1;
    }
    for (unsigned i = 0; i < st.slots; i++) self->held[i] = UINT64_MAX;
    self->slots = st.slots;
    self->p = p;
    Py_INCREF(ds);
    self->ds = ds;
    self->bpe = dsrt_pipeline_batches_per_epoch(p);
    self->end =
        o->epochs && o->epochs <= UINT64_MAX / self->bpe ? o->epochs * self->bpe : UINT64_MAX;
    self->pos = 0;
    self->iter_end = self->bpe;
    self->native = o->native;
    self->images = 0;
    self->closing = 0;
    self->live = 0;
    self->pid = getpid();
    self->t0 = mono_s();
    return 0;
}

static int pipeline_init(PipelineObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"datastore",
                             "preset",
                             "augment",
                             "layout",
                             "dtype",
                             "batch",
                             "prefetch",
                             "workers",
                             "cpus",
                             "pin",
                             "drop_last",
                             "shuffle",
                             "seed",
                             "epochs",
                             "io",
                             "io_depth",
                             "direct",
                             "max_pixels",
                             "strict_decode",
                             "fail_on_error",
                             "drop_bad",
                             "max_consecutive_bad",
                             "max_file_bytes",
                             "chunk",
                             "native",
                             "native_max_pixels",
                             "gpu",
                             "remote_depth",
                             "max_connections",
                             "retry_deadline",
                             "request_timeout",
                             "cache_dir",
                             "cache_limit",
                             "mixup_alpha",
                             "cutmix_alpha",
                             "cutmix_minmax",
                             "mix_prob",
                             "switch_prob",
                             "label_smoothing",
                             "num_classes",
                             "rank",
                             "world_size",
                             "sample_weights",
                             "epoch_samples",
                             NULL};
    pipeline_args pa = {.preset = Py_None,
                        .augment = Py_None,
                        .layout = Py_None,
                        .dtype = Py_None,
                        .cpus = Py_None};
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!|$OOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOO:Pipeline", kwlist,
            &Datastore_Type, &pa.ds, &pa.preset, &pa.augment, &pa.layout, &pa.dtype, &pa.batch,
            &pa.prefetch, &pa.workers, &pa.cpus, &pa.pin, &pa.drop_last, &pa.shuffle, &pa.seed,
            &pa.epochs, &pa.io, &pa.depth, &pa.direct, &pa.max_pixels, &pa.strict, &pa.fail,
            &pa.drop_bad, &pa.max_bad, &pa.max_file, &pa.chunk, &pa.native, &pa.native_px, &pa.gpu,
            &pa.remote_depth, &pa.max_conns, &pa.deadline, &pa.req_timeout, &pa.cache_dir,
            &pa.cache_limit, &pa.mixup, &pa.cutmix, &pa.cutmix_minmax, &pa.mix_prob,
            &pa.switch_prob, &pa.smoothing, &pa.classes, &pa.rank, &pa.world, &pa.sample_weights,
            &pa.epoch_samples))
        return -1;
    if (self->p || self->live || self->busy) {
        /* Open, or its batches still alive: in use. */
        PyErr_SetString(PyExc_RuntimeError,
                        "Pipeline: already open and in use: it cannot be opened again; close() "
                        "it and drop its batches first, or make a new Pipeline");
        return -1;
    }
    if (datastore_ready((DatastoreObject *)pa.ds) != 0) return -1;
    dsrt_augment_options a;
    dsrt_pipeline_options o;
    int rc = pipeline_augment(&pa, &a) != 0 || pipeline_options(&pa, &o) != 0
                 ? -1
                 : pipeline_start(self, pa.ds, &a, &o);
    PyMem_Free(pa.weights);
    Py_XDECREF(pa.weights_path);
    return rc;
}

static void pipeline_dealloc(PipelineObject *self) {
    /* No Batch is alive: each holds a reference to the pipeline. */
    pipeline_really_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether the pipeline was ever opened (__init__ ran); raises if not. */
static int pipeline_opened(const PipelineObject *self) {
    if (self->bpe) return 0;
    PyErr_SetString(PyExc_ValueError, "Pipeline: not opened (__init__ was not called)");
    return -1;
}

/* Open, in this process: raises otherwise (closed, never opened, forked). */
static int pipeline_open_here(PipelineObject *self) {
    if (pipeline_opened(self) != 0) return -1;
    if (!self->p || self->closing) {
        PyErr_SetString(PyExc_ValueError, "Pipeline: closed");
        return -1;
    }
    if (pipeline_forked(self)) return raise_forked();
    return 0;
}

static int pipeline_usable(PipelineObject *self) {
    if (pipeline_open_here(self) != 0) return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Pipeline: in use by another thread (a pipeline belongs to one thread)");
        return -1;
    }
    return 0;
}

/* The next batch, or NULL: with an exception set, or without at the end of
 * the iteration. */
static PyObject *pipeline_take(PipelineObject *self) {
    if (pipeline_usable(self) != 0) return NULL;
    if (self->pos >= self->iter_end || self->pos >= self->end) return NULL;
    dsrt_batch *b = NULL;
    int rc, collected = 0;
    self->busy = 1;
    for (;;) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = dsrt_pipeline_next_timed(self->p, &b, 100);
        PyEval_RestoreThread(ts);
        if (rc == -ETIMEDOUT) {
            if (PyErr_CheckSignals() != 0) {
                self->busy = 0;
                return NULL;
            }
            continue;
        }
        if (rc == -EDEADLK && !collected) {
            /* Perhaps only a reference cycle still holds the old batch. */
            collected = 1;
            self->busy = 0;
            PyGC_Collect();
            if (!self->p || self->closing) return pipeline_usable(self), NULL;
            self->busy = 1;
            continue;
        }
        break;
    }
    self->busy = 0;
    if (rc == DSRT_EEOF) return NULL;
    if (rc == -EDEADLK) {
        uint64_t want = self->pos, old = self->held[want % self->slots];
        PyErr_Format(dsrt_error,
                     "Pipeline: batch %llu needs the slot of batch %llu, which is still "
                     "referenced (by its Batch or a tensor made from it): at most %u "
                     "consecutive batches (prefetch + 1) can be held; drop the old references "
                     "or open the pipeline with a larger prefetch",
                     (unsigned long long)want, (unsigned long long)old, self->slots);
        return NULL;
    }
    if (rc != 0) return raise_code(rc, NULL);
    BatchObject *bo = PyObject_New(BatchObject, &Batch_Type);
    if (!bo) {
        dsrt_batch_release(self->p, b);
        return NULL;
    }
    Py_INCREF(self);
    bo->pipe = self;
    bo->b = b;
    self->live++;
    self->held[b->global % self->slots] = b->global;
    self->pos = b->global + 1;
    self->images += b->count;
    return (PyObject *)bo;
}

static PyObject *pipeline_iter(PipelineObject *self) {
    if (pipeline_open_here(self) != 0) return NULL;
    /* One epoch: from where the pipeline stands to the end of that epoch. */
    self->iter_end = (self->pos / self->bpe + 1) * self->bpe;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *pipeline_iternext(PipelineObject *self) {
    return pipeline_take(self); /* NULL without an exception: StopIteration */
}

static PyObject *pipeline_next_method(PipelineObject *self, PyObject *unused) {
    if (pipeline_usable(self) != 0) return NULL;
    self->iter_end = UINT64_MAX;
    PyObject *b = pipeline_take(self);
    if (!b && !PyErr_Occurred()) Py_RETURN_NONE;
    return b;
}

static Py_ssize_t pipeline_len(PipelineObject *self) {
    if (pipeline_opened(self) != 0) return -1;
    if (!self->p) {
        PyErr_SetString(PyExc_ValueError, "Pipeline: closed");
        return -1;
    }
    return (Py_ssize_t)self->bpe;
}

static PyObject *pipeline_reset(PipelineObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"epoch", "batch", "from_world_size", NULL};
    PyObject *eo = NULL, *bo = NULL, *fo = NULL;
    uint64_t epoch = 0, batch = 0, from = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:reset", kwlist, &eo, &bo, &fo) ||
        pipeline_usable(self) != 0)
        return NULL;
    if (get_u64(eo, "reset: epoch", UINT64_MAX, &epoch) != 0) return NULL;
    if (bo && get_u64(bo, "reset: batch", UINT64_MAX, &batch) != 0) return NULL;
    if (fo && fo != Py_None && get_u64(fo, "reset: from_world_size", 65536, &from) != 0)
        return NULL;
    if (self->live > 0) PyGC_Collect();
    if (!self->p || self->closing) return pipeline_usable(self), NULL;
    if (self->live > 0) {
        PyErr_Format(dsrt_error,
                     "Pipeline: reset: %u batch%s still referenced (by a Batch or a tensor made "
                     "from it); a reset takes every slot back, so drop them first",
                     self->live, self->live == 1 ? " is" : "es are");
        return NULL;
    }
    int rc;
    self->busy = 1;
    PyThreadState *ts = PyEval_SaveThread();
    rc = dsrt_pipeline_resume(self->p, epoch, batch, (unsigned)from);
    PyEval_RestoreThread(ts);
    self->busy = 0;
    if (rc != 0) return raise_code(rc, NULL);
    self->pos = epoch * self->bpe + batch;
    self->iter_end = (epoch + 1) * self->bpe;
    self->images = 0;
    self->t0 = mono_s();
    Py_RETURN_NONE;
}

static PyObject *pipeline_close(PipelineObject *self, PyObject *unused) {
    if (pipeline_forked(self)) {
        /* A child made by fork: abandoned at once, nothing to wait for (the
         * thread that may have been busy with it is not in this process). */
        self->closing = 1;
        pipeline_really_close(self);
        Py_RETURN_NONE;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Pipeline: close: in use by another thread");
        return NULL;
    }
    if (!self->p) Py_RETURN_NONE;
    self->closing = 1;
    if (self->live == 0) pipeline_really_close(self);
    Py_RETURN_NONE;
}

static PyObject *pipeline_enter(PipelineObject *self, PyObject *unused) {
    if (pipeline_open_here(self) != 0) return NULL;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *pipeline_exit(PipelineObject *self, PyObject *args) {
    PyObject *r = pipeline_close(self, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

/* Sets d[key] = v, stealing v. */
static int dict_put(PyObject *d, const char *key, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *str_or_none(const char *s) {
    if (!s) Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(s);
}

static PyObject *pipeline_stats(PipelineObject *self, PyObject *unused) {
    if (pipeline_opened(self) != 0) return NULL;
    if (!self->p) {
        PyErr_SetString(PyExc_ValueError, "Pipeline: closed");
        return NULL;
    }
    if (pipeline_forked(self)) return raise_forked(), NULL;
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(self->p, &s);
    double dt = mono_s() - self->t0;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    int bad = 0;
    bad |= dict_put(d, "images_per_s", PyFloat_FromDouble(dt > 0 ? self->images / dt : 0.0));
    bad |= dict_put(d, "images", PyLong_FromUnsignedLongLong(self->images));
    bad |= dict_put(d, "seconds", PyFloat_FromDouble(dt));
    bad |= dict_put(d, "read_s", PyFloat_FromDouble(s.read_s));
    bad |= dict_put(d, "decode_s", PyFloat_FromDouble(s.decode_s));
    bad |= dict_put(d, "augment_s", PyFloat_FromDouble(s.augment_s));
    bad |= dict_put(d, "slot_wait_s", PyFloat_FromDouble(s.slot_wait_s));
    bad |= dict_put(d, "idle_s", PyFloat_FromDouble(s.idle_s));
    bad |= dict_put(d, "consumer_wait_s", PyFloat_FromDouble(s.consumer_wait_s));
    bad |= dict_put(d, "samples", PyLong_FromUnsignedLongLong(s.samples));
    bad |= dict_put(d, "batches", PyLong_FromUnsignedLongLong(s.batches));
    bad |= dict_put(d, "skipped", PyLong_FromUnsignedLongLong(s.skipped));
    bad |= dict_put(d, "bad_samples", PyLong_FromUnsignedLongLong(s.bad_samples));
    bad |= dict_put(d, "bytes_read", PyLong_FromUnsignedLongLong(s.bytes_read));
    bad |= dict_put(d, "direct_refused", PyLong_FromUnsignedLongLong(s.direct_refused));
    bad |= dict_put(d, "threads", PyLong_FromUnsignedLong(s.threads));
    bad |= dict_put(d, "pinned_threads", PyLong_FromUnsignedLong(s.pinned_threads));
    bad |= dict_put(d, "slots", PyLong_FromUnsignedLong(s.slots));
    bad |= dict_put(d, "slot_bytes", PyLong_FromSize_t(s.slot_bytes));
    bad |= dict_put(d, "io", PyUnicode_FromString(dsrt_io_name(s.io)));
    bad |= dict_put(d, "io_fallback", str_or_none(s.io_fallback));
    bad |= dict_put(d, "pinned_memory", PyBool_FromLong(s.pinned_memory));
    bad |= dict_put(d, "locked_memory", PyBool_FromLong(s.locked_memory));
    bad |= dict_put(d, "cpus", str_or_none(s.cpus));
    /* Object storage: requests answered, retried, connections opened, the
     * mean requests in flight while any was. */
    bad |= dict_put(d, "remote_requests", PyLong_FromUnsignedLongLong(s.remote_requests));
    bad |= dict_put(d, "remote_retries", PyLong_FromUnsignedLongLong(s.remote_retries));
    bad |= dict_put(d, "remote_connections", PyLong_FromUnsignedLongLong(s.remote_connections));
    bad |= dict_put(d, "remote_in_flight", PyFloat_FromDouble(s.remote_in_flight));
    /* The cache of remote bytes: bytes from the store, reads from the
     * cache and their bytes, reads that went to the store, evictions. */
    bad |= dict_put(d, "remote_bytes", PyLong_FromUnsignedLongLong(s.remote_bytes));
    bad |= dict_put(d, "cache_hits", PyLong_FromUnsignedLongLong(s.cache_hits));
    bad |= dict_put(d, "cache_bytes", PyLong_FromUnsignedLongLong(s.cache_bytes));
    bad |= dict_put(d, "cache_misses", PyLong_FromUnsignedLongLong(s.cache_misses));
    bad |= dict_put(d, "cache_evictions", PyLong_FromUnsignedLongLong(s.cache_evictions));
    /* Tar shards in the shard order: bytes and samples the stream read, its
     * ranged reads. */
    bad |= dict_put(d, "stream_bytes", PyLong_FromUnsignedLongLong(s.stream_bytes));
    bad |= dict_put(d, "stream_samples", PyLong_FromUnsignedLongLong(s.stream_samples));
    bad |= dict_put(d, "stream_ranged", PyLong_FromUnsignedLongLong(s.stream_ranged));
    /* Every bad sample found so far: (path, reason). */
    PyObject *l = PyList_New(0);
    bad |= l == NULL;
    dsrt_bad_sample buf[64];
    for (size_t first = 0; l;) {
        size_t total = dsrt_pipeline_bad_samples(self->p, first, buf, 64);
        if (total <= first) break;
        size_t k = total - first < 64 ? total - first : 64;
        for (size_t i = 0; i < k; i++) {
            PyObject *t = Py_BuildValue("(NN)", str_or_none(buf[i].path),
                                        PyUnicode_DecodeFSDefault(buf[i].error));
            if (!t || PyList_Append(l, t) != 0) bad = 1;
            Py_XDECREF(t);
        }
        first += k;
        if (bad) break;
    }
    if (l) bad |= dict_put(d, "bad_files", l);
    if (bad) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *pipeline_get_position(PipelineObject *self, void *unused) {
    if (pipeline_opened(self) != 0) return NULL;
    return Py_BuildValue("(KK)", (unsigned long long)(self->pos / self->bpe),
                         (unsigned long long)(self->pos % self->bpe));
}

static PyObject *pipeline_get_bpe(PipelineObject *self, void *unused) {
    if (pipeline_opened(self) != 0) return NULL;
    return PyLong_FromUnsignedLongLong(self->bpe);
}

static PyObject *pipeline_get_closed(PipelineObject *self, void *unused) {
    if (pipeline_opened(self) != 0) return NULL;
    return PyBool_FromLong(!self->p || self->closing);
}

static PyObject *pipeline_get_slots(PipelineObject *self, void *unused) {
    if (pipeline_opened(self) != 0) return NULL;
    return PyLong_FromUnsignedLong(self->slots);
}

static PyMethodDef pipeline_methods[] = {
    {"next", (PyCFunction)pipeline_next_method, METH_NOARGS,
     "next() -> the next Batch, across epochs, or None after the last epoch"},
    {"reset", (PyCFunction)(void (*)(void))pipeline_reset, METH_VARARGS | METH_KEYWORDS,
     "reset(epoch, batch=0, from_world_size=None): resume at batch `batch` of epoch\n"
     "`epoch`, exactly as an uninterrupted run delivers it. from_world_size: the ranks\n"
     "of the run that stopped there, when it had another number than world_size: the\n"
     "rest of its epoch is its batches striped over this run's ranks, each sample once\n"
     "(keep batch * world_size, the global batch, the same).\n"
     "No batch may still be referenced."},
    {"close", (PyCFunction)pipeline_close, METH_NOARGS,
     "close(): stop the workers and free the slots (at once, or when the last batch\n"
     "still referenced is freed). Closing twice is fine."},
    {"stats", (PyCFunction)pipeline_stats, METH_NOARGS,
     "stats() -> dict: images_per_s (delivered since the open or the last reset),\n"
     "per-stage seconds summed over the workers (read_s, decode_s, augment_s,\n"
     "slot_wait_s, idle_s), consumer_wait_s, skipped, bad_files [(path, reason)], ..."},
    {"__enter__", (PyCFunction)pipeline_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)pipeline_exit, METH_VARARGS, NULL},
    {NULL}};

static PyGetSetDef pipeline_getset[] = {
    {"position", (getter)pipeline_get_position, NULL, "(epoch, batch) of the next batch", NULL},
    {"batches_per_epoch", (getter)pipeline_get_bpe, NULL, "batches in each epoch", NULL},
    {"slots", (getter)pipeline_get_slots, NULL, "prefetch + 1: batches that can be held at once",
     NULL},
    {"closed", (getter)pipeline_get_closed, NULL, "whether close() was called", NULL},
    {NULL}};

static PySequenceMethods pipeline_as_sequence = {.sq_length = (lenfunc)pipeline_len};

static PyTypeObject Pipeline_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dsrt.Pipeline",
    .tp_basicsize = sizeof(PipelineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Pipeline(datastore, *, preset=None, augment=None, layout=None, dtype=None,\n"
        "         batch=128, prefetch=4, workers=0, cpus=None, pin=True, drop_last=False,\n"
        "         shuffle='every-epoch', seed=0, epochs=0, io='auto', io_depth=16, direct=False,\n"
        "         max_pixels=178956970, strict_decode=False, fail_on_error=False,\n"
        "         drop_bad=False, max_consecutive_bad=1000, max_file_bytes=64 MiB, chunk=0,\n"
        "         native=False, native_max_pixels=2097152, gpu=-1, remote_depth=64,\n"
        "         max_connections=0, retry_deadline=60.0, request_timeout=30.0,\n"
        "         cache_dir=None, cache_limit=0,\n"
        "         mixup_alpha=0.0, cutmix_alpha=0.0, cutmix_minmax=None, mix_prob=1.0,\n"
        "         switch_prob=0.5, label_smoothing=0.0, num_classes=None, rank=None,\n"
        "         world_size=None, sample_weights=None, epoch_samples=None)\n\n"
        "Batches of augmented samples made in the background by `workers` threads (0: one\n"
        "per core), in order, bit-identical for a seed whatever the thread count.\n"
        "Iterating yields the batches of one epoch (from the current position to the end\n"
        "of its epoch); len() is the batches per epoch. mixup_alpha ... num_classes mix\n"
        "each batch as timm's Mixup (mode 'batch') and give Batch.soft_labels. rank and\n"
        "world_size (or rank='env': RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS) give this\n"
        "process its share of every epoch, `batch` samples a batch, as dstrain's workers\n"
        "take theirs; without drop_last the last batch is padded from the start of the\n"
        "order, as DistributedSampler pads. cache_dir keeps what is fetched from a store\n"
        "on local disk (whole objects, 1 MiB blocks of shards) for later epochs, runs and\n"
        "processes, at most cache_limit bytes (0: no limit). See docs/python.md for every\n"
        "option.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pipeline_init,
    .tp_dealloc = (destructor)pipeline_dealloc,
    .tp_iter = (getiterfunc)pipeline_iter,
    .tp_iternext = (iternextfunc)pipeline_iternext,
    .tp_methods = pipeline_methods,
    .tp_getset = pipeline_getset,
    .tp_as_sequence = &pipeline_as_sequence,
};

// ----------------------------------------------------------------------------
// Module

static PyObject *mod_version(PyObject *m, PyObject *unused) {
    return PyUnicode_FromString(dsrt_version_string());
}

/* Appends a new str to list: 0, or -1 with the exception set. */
static int append_str(PyObject *list, const char *s) {
    PyObject *v = PyUnicode_FromString(s);
    int rc = v ? PyList_Append(list, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* One row as a dict: name (Python's spelling), option (the tools'), type,
 * default, choices, help, places. */
static PyObject *option_dict(const dsrt_option *o, const char *group) {
    static const struct {
        unsigned bit;
        const char *name;
    } places[] = {{DSRT_IN_DSBENCH, "dsbench"},
                  {DSRT_IN_DSBENCH_INDEX, "dsbench --index"},
                  {DSRT_IN_DSBENCH_CONVERT, "dsbench convert"},
                  {DSRT_IN_PY_DATASTORE, "Datastore"},
                  {DSRT_IN_PY_PIPELINE, "Pipeline"}};
    char py[64];
    snprintf(py, sizeof py, "%s", o->name);
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

static PyObject *mod_options(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    const dsrt_option_group *groups;
    size_t n = dsrt_option_groups(&groups);
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

static PyMethodDef module_methods[] = {
    {"version", mod_version, METH_NOARGS, "version() -> the version of libdsrt in use"},
    {"options", mod_options, METH_NOARGS,
     "options() -> the data side's option rows, one dict each: name (as a keyword),\n"
     "option (as dsbench spells it), group, type, default, choices, help, where, old"},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_dsrt",
    .m_doc = "dsrt's datastore and background pipeline, with batches lent to NumPy and\n"
             "PyTorch without a copy (DLPack).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__dsrt(void) {
    PyTypeObject *types[] = {&Datastore_Type, &Pipeline_Type, &Batch_Type, &Tensor_Type};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    dsrt_error = PyErr_NewExceptionWithDoc(
        "dsrt.Error", "A failure reported by libdsrt; .code is its (negative) code.",
        PyExc_RuntimeError, NULL);
    if (!dsrt_error || PyModule_AddObjectRef(m, "Error", dsrt_error) < 0) goto fail;
    static const char *names[] = {"Datastore", "Pipeline", "Batch", "Tensor"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
