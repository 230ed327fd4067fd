/*
 * The names a keyword takes (source, labels, order, layout, ...), read
 * through the library's name tables so that Python spells them as the tools
 * do, and the lists and tuples the objects' getters build.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The ValueError of a name the library refused. */
static int name_refused(const char *what) {
    PyErr_Format(PyExc_ValueError, "%s: %s", what, dsrt_last_error());
    return -1;
}

int get_source(PyObject *v, dsrt_source *out) {
    const char *s = get_name(v, "source");
    return !s ? -1 : dsrt_source_from_name(s, out) ? name_refused("source") : 0;
}

int get_labels(PyObject *v, dsrt_label_source *out) {
    const char *s = get_name(v, "labels");
    return !s ? -1 : dsrt_label_source_from_name(s, out) ? name_refused("labels") : 0;
}

int get_mix_labels(PyObject *v, dsrt_mix_labels *out) {
    const char *s = get_name(v, "mix_labels");
    return !s ? -1 : dsrt_mix_labels_from_name(s, out) ? name_refused("mix_labels") : 0;
}

int get_order(PyObject *v, dsrt_shard_order *out) {
    const char *s = get_name(v, "order");
    return !s ? -1 : dsrt_shard_order_from_name(s, out) ? name_refused("order") : 0;
}

int get_layout(PyObject *v, const char *what, int dtype, dsrt_augment_layout *out) {
    const char *s = get_name(v, what);
    return !s ? -1 : dsrt_augment_layout_from_name(s, dtype, out) ? name_refused(what) : 0;
}

int get_enum(PyObject *v, const char *what, const name_value *t, int *out) {
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
int get_choice(PyObject *v, const char *what, unsigned where, int *out) {
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

int get_str(PyObject *v, const char *what, const char **out) {
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

/* A list (or a tuple) of item(ctx, i) for i in [0, n). */
PyObject *sequence_of(size_t n, int tuple, item_fn item, void *ctx) {
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
