/*
 * What the files of dsrt._nn share: the Net object and its type, arrays
 * read in place, and the helpers one file lends the others.
 */
#ifndef DSRT_PY_NN_H
#define DSRT_PY_NN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <dsrt.h>

#include <stdint.h>

#include "pyshared.h"

/* Largest image or class-names file read, as dstrain classify's cap. */
#define FILE_MAX ((size_t)256 << 20)
/* Images a forward pass, unless the caller says otherwise (dstrain classify's). */
#define DEFAULT_BATCH 64

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
    /* What the binding itself could not allocate in the call that holds the
     * lock (NULL: nothing, or a failure of dsrt's, which names itself). */
    const char *oom;
    PyObject *names; /* tuple of the class names, or None */
} NetObject;

extern PyTypeObject Net_Type;

/* Reads the regular file path whole (at most max bytes) into a malloc'd
 * buffer, *len its length. Runs without the GIL: on failure returns NULL
 * with *err an errno (or EFBIG, or EINVAL for a file that is not regular). */
char *read_file(const char *path, size_t max, size_t *len, int *err);

/* The exception of read_file's err for path; what names the argument. */
PyObject *raise_read(int err, const char *what, PyObject *path);

/* v (str or os.PathLike) as a new bytes object of the file system encoding. */
PyObject *fs_path(PyObject *v);

/* 1 when path names an ONNX model: by its extension, as dstrain tells them
 * (the format has no magic number). */
int is_onnx_path(const char *path);

/* Lets go of what array_get holds. */
void array_release(array_in *a);

/* Reads obj as an array of 3 or 4 dimensions, uint8 or float32, in host
 * memory. what names the call in messages. */
int array_get(PyObject *obj, const char *what, array_in *a);

/* "(2, 3, 28, 28)" of a's shape as given (3-D without the batch). */
PyObject *shape_text(const array_in *a);

/* Takes the net's lock, waiting without the GIL when another thread has it. */
void net_lock(NetObject *self);

/* Gives the net's lock back. */
void net_unlock(NetObject *self);

/* Grows the scratch to n floats (under the lock, without the GIL). */
int x_reserve(NetObject *self, size_t n);

/* The class names the net's description holds, as a tuple, or None. */
PyObject *class_names(const dsrt_net *net, int classes);

/* A Net owning net (destroyed on failure), images sized as ao says. */
PyObject *net_wrap(dsrt_net *net, const dsrt_augment_options *ao);

/* The methods and the module function each file defines. */
PyObject *net_load(PyTypeObject *type, PyObject *args, PyObject *kw);

PyObject *mod_onnx_import(PyObject *m, PyObject *args, PyObject *kw);

/* A NumPy float32 array of shape (n, classes) over buf (a bytearray). */
PyObject *numpy_scores(PyObject *buf, Py_ssize_t n, int classes);

/* The batch keyword checked: 0 when in [1, 65536], else -1 with ValueError. */
int get_batch(int batch);

PyObject *net_predict(NetObject *self, PyObject *args, PyObject *kw);

PyObject *net_top(NetObject *self, PyObject *args, PyObject *kw);

PyObject *net_classify(NetObject *self, PyObject *args, PyObject *kw);

#endif
