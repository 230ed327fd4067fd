/*
 * What the files of dsrt._dsrt share: the objects (Datastore, Pipeline,
 * Batch, Tensor) and their types, and the helpers one type's file lends the
 * others. Each type's methods stay in its own file.
 */
#ifndef DSRT_PY_OBJECTS_H
#define DSRT_PY_OBJECTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dsrt.h>

#include <stdint.h>
#include <sys/types.h>

#include "pyshared.h"

/* A name from a table of (name, value) pairs ending with a NULL name. */
typedef struct {
    const char *name;
    int value;
} name_value;

typedef struct {
    PyObject ob_base;
    dsrt_datastore *ds;
    unsigned users; /* open Pipelines reading it: it may not be re-opened under them */
    int opening;    /* __init__ in progress (it releases the GIL) */
} DatastoreObject;

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

extern PyTypeObject Datastore_Type, Pipeline_Type, Batch_Type, Tensor_Type;

// ----------------------------------------------------------------------------
// names.c

/* An item of a sequence_of. */
typedef PyObject *(*item_fn)(void *ctx, size_t i);

/* Keywords that name a source, a label source, a mix's labels, a shard
 * order, a layout: 0, or -1 with ValueError naming the keyword. */
int get_source(PyObject *v, dsrt_source *out);

int get_labels(PyObject *v, dsrt_label_source *out);

int get_mix_labels(PyObject *v, dsrt_mix_labels *out);

int get_order(PyObject *v, dsrt_shard_order *out);

int get_layout(PyObject *v, const char *what, int dtype, dsrt_augment_layout *out);

/* v, one of t's names, as its value: 0, or -1 with ValueError listing them. */
int get_enum(PyObject *v, const char *what, const name_value *t, int *out);

/* A keyword that names one of an option row's choices (dsrt/options.h):
 * the index of the name, the message and "did you mean" of the tools. An
 * older name is taken with a DeprecationWarning. */
int get_choice(PyObject *v, const char *what, unsigned where, int *out);

/* A str keyword (None: NULL): 0, or -1 with TypeError. */
int get_str(PyObject *v, const char *what, const char **out);

/* A list (or a tuple) of item(ctx, i) for i in [0, n). */
PyObject *sequence_of(size_t n, int tuple, item_fn item, void *ctx);

// ----------------------------------------------------------------------------
// The types' files

/* 0 when the Datastore is open, or -1 with ValueError. */
int datastore_ready(DatastoreObject *self);

/* Seconds on the monotonic clock. */
double mono_s(void);

/* Whether this is a child made by fork after the pipeline was opened: its
 * copy of the pipeline has no worker threads (fork copies only the calling
 * thread) and its locks may be held by threads that do not exist here, so
 * it may be neither used nor closed; it is left as it is. */
int pipeline_forked(const PipelineObject *self);

/* RuntimeError for a pipeline used in a child made by fork; -1. */
int raise_forked(void);

/* Really closes the C pipeline: stops and joins the workers, frees slots.
 * In a child made by fork the pipeline is abandoned instead: there are no
 * workers to join, and freeing could wait on locks no thread here holds. */
void pipeline_really_close(PipelineObject *self);

/* A new Tensor viewing data of owner (a new reference), or NULL with an
 * exception set. */
TensorObject *tensor_new(BatchObject *owner, void *data, DLDataType dtype, const char *format,
                         int ndim, const int64_t *shape);

/* Sets the augment option named key to v. */
int augment_set(dsrt_augment_options *o, PyObject *key, PyObject *v);

#endif
