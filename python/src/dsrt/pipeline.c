/*
 * dsrt.Pipeline: a dsrt_pipeline over a Datastore, its keywords read
 * against the library's option table, batches handed out in order.
 * Waiting for a batch releases the GIL and wakes every 100 ms to let Python
 * run its signal handlers; in a child made by os.fork() the parent's
 * pipelines are dead and are abandoned, never joined.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether this is a child made by fork after the pipeline was opened: its
 * copy of the pipeline has no worker threads (fork copies only the calling
 * thread) and its locks may be held by threads that do not exist here, so
 * it may be neither used nor closed; it is left as it is. */
int pipeline_forked(const PipelineObject *self) {
    return self->bpe && self->pid != getpid();
}

int raise_forked(void) {
    PyErr_SetString(PyExc_RuntimeError,
                    "Pipeline: opened in another process; this is a child made by fork, where "
                    "its worker threads do not exist: open a Pipeline in this process");
    return -1;
}

/* Really closes the C pipeline: stops and joins the workers, frees slots.
 * In a child made by fork the pipeline is abandoned instead: there are no
 * workers to join, and freeing could wait on locks no thread here holds. */
void pipeline_really_close(PipelineObject *self) {
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
    PyObject *mixup, *cutmix, *cutmix_minmax, *mix_prob, *switch_prob, *mix_switch, *smoothing,
        *classes, *rank, *world;
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
    /* switch_prob: the older name of mix_switch_prob (dstrain's --mix-switch-prob). */
    if (pa->switch_prob && pa->mix_switch) {
        PyErr_SetString(PyExc_TypeError,
                        "mix_switch_prob and switch_prob (its older name) are one option: give "
                        "mix_switch_prob");
        return -1;
    }
    if (pa->switch_prob &&
        PyErr_WarnEx(PyExc_DeprecationWarning, "switch_prob is now mix_switch_prob", 1) != 0)
        return -1;
    if (!pa->mix_switch) pa->mix_switch = pa->switch_prob;
    if (pa->mix_switch && get_double(pa->mix_switch, "mix_switch_prob", &o->mix_switch_prob) != 0)
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
                             "mix_switch_prob",
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
            args, kw, "O!|$OOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOO:Pipeline", kwlist,
            &Datastore_Type, &pa.ds, &pa.preset, &pa.augment, &pa.layout, &pa.dtype, &pa.batch,
            &pa.prefetch, &pa.workers, &pa.cpus, &pa.pin, &pa.drop_last, &pa.shuffle, &pa.seed,
            &pa.epochs, &pa.io, &pa.depth, &pa.direct, &pa.max_pixels, &pa.strict, &pa.fail,
            &pa.drop_bad, &pa.max_bad, &pa.max_file, &pa.chunk, &pa.native, &pa.native_px, &pa.gpu,
            &pa.remote_depth, &pa.max_conns, &pa.deadline, &pa.req_timeout, &pa.cache_dir,
            &pa.cache_limit, &pa.mixup, &pa.cutmix, &pa.cutmix_minmax, &pa.mix_prob,
            &pa.switch_prob, &pa.mix_switch, &pa.smoothing, &pa.classes, &pa.rank, &pa.world,
            &pa.sample_weights, &pa.epoch_samples))
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

PyTypeObject Pipeline_Type = {
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
        "         mix_switch_prob=0.5, label_smoothing=0.0, num_classes=None, rank=None,\n"
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
