/*
 * Net.load and dsrt.onnx_import: a Net from a dsrt model file or an ONNX
 * model, its input normalisation and class names as keywords say.
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

/* The row of Net.load's keyword what in dsrt's option tables. */
static const dsrt_option *net_row(const char *what) {
    const dsrt_option_group *groups;
    size_t n = dsrt_train_option_groups(&groups);
    const dsrt_option *row = dsrt_option_find(groups, n, what, DSRT_IN_PY_NET, NULL);
    if (!row) PyErr_Format(PyExc_SystemError, "%s: no row in dsrt's option tables", what);
    return row;
}

/* A keyword naming one of its row's choices: the index (*name the choice),
 * or -1 with the tools' message ("did you mean"). */
static int net_choice(PyObject *v, const char *what, const char **name) {
    const char *s = get_name(v, what);
    const dsrt_option *row = s ? net_row(what) : NULL;
    double index;
    if (!row) return -1;
    if (dsrt_option_value(row, what, s, &index, NULL) != 0) {
        PyErr_SetString(PyExc_ValueError, dsrt_last_error());
        return -1;
    }
    if (name) *name = row->choice((int)index);
    return (int)index;
}

/* An integer keyword within its row's range: 0, or -1 with the message. */
static int net_int(PyObject *v, const char *what, int *out) {
    const dsrt_option *row = net_row(what);
    if (!row || get_int(v, what, out) != 0) return -1;
    if (*out < row->min || *out > row->max) {
        char msg[160]; /* PyErr_Format has no %f */
        snprintf(msg, sizeof msg, "%s: %d: not in [%.0f, %.0f]", what, *out, row->min, row->max);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    return 0;
}

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
        const char *name;
        if (net_choice(preprocess, "preprocess", &name) < 0) return -1;
        if (!strcmp(name, "torchvision")) dsrt_onnx_preprocess_torchvision(&l->onnx);
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
        int k = net_choice(mode, "size_mode", NULL);
        if (k < 0) return -1;
        l->ao.size_mode = k == 0 ? DSRT_AUGMENT_RESIZE : DSRT_AUGMENT_CENTERCROP;
    }
    if (shorter && shorter != Py_None) {
        int s;
        if (net_int(shorter, "resize_shorter", &s) != 0) return -1;
        l->ao.resize_shorter = s;
    }
    if (threads && threads != Py_None) {
        if (net_int(threads, "threads", &l->threads) != 0) return -1;
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
    if (onnx) {
        /* A model fed other numbers than it was trained on answers wrongly
         * without an error: said now. */
        dsrt_net_info info;
        dsrt_net_get_info(net, &info);
        if (info.input_assumed &&
            PyErr_WarnFormat(PyExc_UserWarning, 1,
                             "%S says nothing of how its input is normalised (no preprocess, "
                             "input_scale, mean or std, no dsrt metadata, no normalisation in its "
                             "graph): it is given pixels scaled to [0, 1]; for torchvision's "
                             "models give preprocess='torchvision'",
                             path_o) != 0)
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

PyObject *net_load(PyTypeObject *type, PyObject *args, PyObject *kw) {
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

PyObject *mod_onnx_import(PyObject *m, PyObject *args, PyObject *kw) {
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
    if (is_onnx_path(PyBytes_AS_STRING(d))) {
        PyErr_Format(PyExc_ValueError,
                     "onnx_import: dst %R: it writes a dsrt model file, which a .onnx name "
                     "would have read back as ONNX (Net.export writes ONNX)",
                     dst);
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
