/*
 * The pipeline: worker threads that read, decode and augment samples straight
 * into a fixed pool of batch slots, and a consumer that takes the batches in
 * order. This is dsrt's background dispatch.
 *
 * Work. The batches of a run (from the last open or reset) are numbered
 * b = 0, 1, 2, ...; batch b is run position start + b, that is epoch
 * (start + b) / batches_per_epoch. Each batch is cut into chunks of `chunk`
 * places, and the chunks of all batches form one sequence of work items that
 * workers claim in order under the pipeline's mutex (item i is chunk
 * i % chunks_per_batch of batch i / chunks_per_batch). Batch b lives in slot
 * b % nslots; a worker that claims a chunk of batch b waits until that slot
 * has been released for b (the consumer gave back batch b - nslots). Inside a
 * chunk the worker keeps up to reader.depth reads in flight on its own reader
 * and decodes and augments each file as it arrives, straight into its place.
 * The slot counts its chunks left; the worker that finishes the last one
 * marks the batch ready and wakes the consumer, which takes batches in order.
 * Claiming chunks in order keeps the batches being made within nslots of the
 * consumer, so a slot is never waited for by a worker that holds unfinished
 * work an earlier batch needs: no deadlock, and memory stays fixed.
 *
 * Why chunks rather than whole batches or single samples: several workers
 * share a batch (its latency falls with the thread count, so a small prefetch
 * suffices), while the mutex is taken once per chunk, not per sample, and a
 * chunk gives the reader enough files to keep several reads in flight.
 *
 * Determinism. A place's sample is fixed by (epoch, position in the epoch's
 * order); its random augmentation by (seed, epoch, dsrt_datastore_id). A bad
 * sample's place is filled by positions p + 1, p + 2, ... of the same order,
 * the first that succeeds; since badness is a property of the file, the fill
 * is the same whichever thread finds it and whether it was already known.
 * Known-bad samples are kept in an atomic bitmap over datastore positions,
 * and each, with its path and reason, in a list the caller can read. With
 * drop_bad the place of a bad sample is left empty instead, and the batch is
 * closed up before the consumer gets it: each good sample once an epoch.
 *
 * Parts. With parts > 1 (data-parallel training, one pipeline a worker
 * process), every pipeline walks the same epoch orders and batches of the
 * full size, and delivers only its own contiguous share of each batch:
 * places [count * part / parts, count * (part + 1) / parts) of it. The
 * union of the parts of a batch is the batch one pipeline with parts = 1
 * makes, sample for sample (bad-sample fills included, since a fill depends
 * only on the order and the files).
 *
 * Errors of the process rather than of the file (too many open files, no
 * memory for the kernel, an interrupted or refused read) never make a sample
 * bad: the read is tried again after a pause that doubles, and when it still
 * fails the run stops with that reason.
 *
 * Objects in a store (a datastore of URLs) are read the same way, by the
 * reader's HTTP client: a worker keeps reader.remote.depth requests in
 * flight (64 by default, for the store's latency), so chunks are at least
 * that large. The client retries what the store did not answer; a request
 * it gives up on (DSRT_EREMOTE: unreachable, refused, denied) stops the
 * run with the cause, never marking a sample bad.
 *
 * Read buffers start small and grow, one at a time, to the size of the
 * largest file they had to hold (up to max_file_bytes): reserving
 * max_file_bytes for every read in flight of every worker would take
 * gigabytes of address space for datasets of kilobyte images.
 *
 * Epoch orders live in a small ring keyed by epoch. The batches in progress
 * span fewer than nslots consecutive batches, hence at most
 * 2 + nslots / batches_per_epoch epochs, which is the ring's size: an entry is
 * only rebuilt when no worker can still be using it.
 *
 * Reset and close stop the workers at the next sample (an atomic flag), wait
 * until none holds work (reset) or join them (close). A worker that stops
 * mid-chunk first collects its reads in flight, since the kernel writes into
 * its buffers.
 *
 * Sources. The pipeline knows no source: a worker reads through the reader
 * of sample bytes its datastore's source gives (datastore/sources/source.h:
 * a dsrt_reader on the paths of files and objects, or the source's own, as
 * the byte ranges of shard members, neighbours merged), and a source may
 * feed the pipeline: one more thread that reads ahead of the workers and
 * hands them each sample's bytes, and gives the epoch orders (the shard
 * order's stream: shards shuffled, samples mixed in a shuffle buffer).
 */
#include <dsrt/pipeline.h>

#include "datastore/bytes/http.h"
#include "datastore/sampling.h"
#include "datastore/sources/mixture/mixture.h"
#include "datastore/sources/source.h"
#include "runtime/internal.h"
#include "runtime/pipeline/mix.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PIPE_MAX_THREADS  1024
#define PIPE_MAX_PREFETCH 1024
#define PIPE_MAX_BATCH    (1u << 24)
#define PIPE_MAX_CHUNK    4096
#define PIPE_MAX_PARTS    65536
#define PIPE_CHUNK        16
#define PIPE_MSG          512
#define PIPE_PAGE         4096
#define PIPE_NONE         UINT64_MAX
#define PIPE_EMPTY        UINT32_MAX        /* id of a place left empty (drop_bad) */
#define PIPE_BUF_START    ((size_t)1 << 18) /* first size of a read buffer */
#define PIPE_BACKOFF_NS   1000000ULL        /* first pause before retrying a read that failed */
#define PIPE_BACKOFF_MAX  100000000ULL      /* for the process's sake; doubling up to this */
#define PIPE_STALL_NS     3000000000ULL     /* give up after this long with no read done */
#define PIPE_WAIT_READ    UINT64_MAX        /* hold_until: until one of the worker's reads ends */
#define PIPE_BAD_TEXT_MAX ((size_t)4 << 20) /* bytes of bad-sample reasons kept in full */

// ----------------------------------------------------------------------------
// Shapes

/* One batch slot. Everything but b's memory is guarded by the pipeline's mu. */
typedef struct {
    dsrt_batch b;       /* what the consumer sees; data, labels, ids, sizes fixed at open */
    uint64_t free_for;  /* the run batch this slot may be filled for */
    uint64_t ready_for; /* the run batch finished in it, or PIPE_NONE */
    unsigned remaining; /* chunks of free_for not finished yet */
    int lent;
    /* The failure of the lowest place of this batch, if any. */
    int fail_code;
    size_t fail_place;
    char fail_msg[PIPE_MSG];
} pipe_slot;

/* One place of the chunk a worker is filling. */
typedef struct {
    size_t place;   /* in the batch */
    uint64_t k;     /* positions tried past its own: the fill offset */
    uint32_t pos;   /* datastore position of the sample being read */
    int buf;        /* read buffer in use, or -1 */
    unsigned tries; /* reads of pos that failed for the process's sake */
    uint64_t since; /* when the first of them failed after the last read done anywhere (ns) */
    uint64_t done;  /* reads done in the pipeline then */
    size_t need;    /* bytes the file needs in a buffer (0: unknown) */
} pipe_place;

/* The lowest-place fatal failure of a chunk. */
typedef struct {
    int code;
    size_t place;
    char msg[PIPE_MSG];
} pipe_fail;

typedef struct {
    /* Counters, read by dsrt_pipeline_stats from any thread. */
    alignas(64) atomic_uint_fast64_t read_ns;
    atomic_uint_fast64_t decode_ns, augment_ns, wait_ns, idle_ns;
    atomic_uint_fast64_t samples, skipped, bytes, direct_refused;
    /* The reader's requests to a store (dsrt_remote_stats), copied after
     * each collect: the reader itself belongs to the worker's thread. */
    atomic_uint_fast64_t remote_requests, remote_retries, remote_connections;
    atomic_uint_fast64_t remote_in_flight_us, remote_busy_us, remote_bytes;
    atomic_uint_fast64_t cache_hits, cache_bytes, cache_misses, cache_evictions;
    atomic_int pinned;

    dsrt_pipeline *p;
    unsigned index;
    pthread_t thread;
    int started;
    dsrt_sample_reader *reader;
    dsrt_decoder *dec;
    dsrt_augmenter *aug;
    uint8_t **bufs;   /* (nbufs) read buffers, mmap'd */
    size_t *buf_size; /* (nbufs) bytes of each, up to buf_cap */
    int *free_bufs;   /* (nbufs) stack */
    /* No read is started before this time (ns), or before one of the
     * worker's reads ends (PIPE_WAIT_READ): a retry's pause. */
    uint64_t hold_until;
    unsigned streak; /* reads failed for the process's sake since the worker's last success */
    unsigned nbufs, nfree;
    pipe_place *places; /* (chunk) */
    size_t *pending;    /* (chunk) places waiting for a read */
} pipe_worker;

typedef struct {
    uint64_t key;
    int valid;
    uint32_t *order; /* (n) datastore positions in the epoch's order */
} pipe_order;

struct dsrt_pipeline {
    const dsrt_datastore *ds;
    size_t n;     /* samples an epoch: the datastore's, or the sampler's */
    size_t count; /* samples of the datastore (positions) */
    /* Draws each epoch's order (a mix, sample weights), or NULL: the
     * datastore's positions, shuffled. */
    dsrt_sampler *sampler;
    const dsrt_mixture *mixture; /* the mix ds is a view of, or NULL */
    /* (mixture->k) each source's augmentation, when some source has a
     * preset of its own (dsrt_mix_options.presets); else NULL: aug. */
    dsrt_augment_options *src_aug;
    dsrt_augment_options aug;    /* as given */
    dsrt_augment_options native; /* native mode: channels, layout and norm only */
    dsrt_pipeline_options o;
    char *cpus_opt;
    char *cache_dir; /* o.reader.remote.cache_dir's copy */
    int in_memory;
    int remote; /* samples are objects in a store */
    size_t sample_bytes, stride, slot_bytes, chunk, cpb, buf_cap;
    size_t cap;   /* places of a slot: the largest part of a batch */
    uint64_t bpe; /* batches per epoch */
    unsigned nslots, nthreads;

    dsrt_host_mem mem;
    pipe_slot *slots;
    void *meta;                /* labels, ids, sources and sizes of every slot */
    size_t classes;            /* soft labels' width, 0 without them (mix.c) */
    float *soft;               /* (nslots, cap, classes) soft labels of every slot */
    atomic_uint_fast64_t *bad; /* (ceil(count / 64)) bitmap of known-bad positions */

    pthread_mutex_t order_mu;
    pipe_order *orders;
    unsigned norders;
    /* Resumed from a run of elastic_parts parts whose order differs from
     * this run's (a feed whose lanes follow the parts): epoch elastic_epoch
     * is that run's order, finished by this run's parts (0: none). */
    unsigned elastic_parts;
    uint64_t elastic_epoch;
    uint32_t *elastic_order; /* (n) */

    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv, ctl_cv;
    uint64_t start;       /* run position of run batch 0: epoch * bpe + batch */
    uint64_t run_batches; /* batches in this run, PIPE_NONE when endless */
    uint64_t next_item, next_batch;
    uint64_t fatal_batch; /* lowest run batch with a fatal failure, or PIPE_NONE */
    int sticky_code;
    char sticky_msg[PIPE_MSG];
    int pause, stop;
    unsigned active;
    atomic_int abort;
    atomic_uint_fast64_t consumer_wait_ns, batches;
    atomic_uint_fast64_t reads_done; /* reads that succeeded, for telling a stall */
    atomic_int stalled; /* a read gave up for the process's sake, and none succeeded since */

    pthread_mutex_t bad_mu;
    char bad_msgs[DSRT_PIPELINE_BAD_MESSAGES][PIPE_MSG];
    atomic_uint nbad_msgs;
    atomic_uint_fast64_t nbad;
    dsrt_bad_sample *bad_list; /* (nbad_list) every bad sample, in the order found */
    size_t nbad_list, cap_bad_list;
    dsrt_arena bad_text;     /* their reasons */
    char last_bad[PIPE_MSG]; /* the latest bad sample's message */

    dsrt_io io;
    char io_fallback[256];
    int has_fallback;
    dsrt_cpus *cpus;
    pipe_worker *workers;
    int sync_ready; /* mutex and condvars initialised */

    /* The source's feed (the shard order's stream), or NULL, and its thread. */
    dsrt_feed *feed;
    pthread_t feed_thread;
    int feed_started;
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void add(atomic_uint_fast64_t *c, uint64_t v) {
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* Copies a message into a PIPE_MSG buffer, cut if longer. */
static void msg_copy(char *dst, const char *src) {
    size_t n = strnlen(src, PIPE_MSG - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static size_t round_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

// ----------------------------------------------------------------------------
// Options

dsrt_pipeline_options dsrt_pipeline_defaults(void) {
    dsrt_pipeline_options o;
    memset(&o, 0, sizeof o);
    o.batch = 128;
    o.prefetch = 4;
    o.threads = 0;
    o.cpus = NULL;
    o.pin = 1;
    o.drop_last = 0;
    o.shuffle = DSRT_SHUFFLE_EVERY_EPOCH;
    o.seed = 0;
    o.epochs = 0;
    o.reader = dsrt_reader_defaults();
    o.decoder = dsrt_decoder_defaults();
    o.fail_on_error = 0;
    o.drop_bad = 0;
    o.max_consecutive_bad = 1000;
    o.max_file_bytes = (size_t)64 << 20;
    o.chunk = 0;
    o.native = 0;
    o.native_max_pixels = (uint64_t)1 << 21;
    o.gpu = -1;
    o.parts = 1;
    o.part = 0;
    o.mix_prob = 1.0;
    o.mix_switch_prob = 0.5;
    return o;
}

static int check_options(const dsrt_pipeline_options *o, size_t n) {
    if (o->batch < 1 || o->batch > PIPE_MAX_BATCH)
        return dsrt__fail(DSRT_EOPTION, "pipeline: batch: %zu: not in [1, %u]", o->batch,
                          PIPE_MAX_BATCH);
    if (o->prefetch < 1 || o->prefetch > PIPE_MAX_PREFETCH)
        return dsrt__fail(DSRT_EOPTION, "pipeline: prefetch: %u: not in [1, %d]", o->prefetch,
                          PIPE_MAX_PREFETCH);
    if (o->threads > PIPE_MAX_THREADS)
        return dsrt__fail(DSRT_EOPTION, "pipeline: threads: %u: not in [0, %d]", o->threads,
                          PIPE_MAX_THREADS);
    if (o->pin != 0 && o->pin != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: pin: %d: not 0 or 1", o->pin);
    if (o->drop_last != 0 && o->drop_last != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: drop_last: %d: not 0 or 1", o->drop_last);
    if (o->drop_last && o->batch > n)
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: drop_last: batch %zu is larger than the %zu samples: "
                          "no batch left",
                          o->batch, n);
    if ((unsigned)o->shuffle > DSRT_SHUFFLE_EVERY_EPOCH)
        return dsrt__fail(DSRT_EOPTION, "pipeline: shuffle: %d: unknown", (int)o->shuffle);
    if (o->fail_on_error != 0 && o->fail_on_error != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: fail_on_error: %d: not 0 or 1",
                          o->fail_on_error);
    if (o->drop_bad != 0 && o->drop_bad != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: drop_bad: %d: not 0 or 1", o->drop_bad);
    if (o->max_consecutive_bad < 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: max_consecutive_bad: 0: must be at least 1");
    if (o->max_file_bytes < 1 || o->max_file_bytes > ((size_t)1 << 40))
        return dsrt__fail(DSRT_EOPTION, "pipeline: max_file_bytes: %zu: not in [1, 2^40]",
                          o->max_file_bytes);
    if (o->chunk > PIPE_MAX_CHUNK)
        return dsrt__fail(DSRT_EOPTION, "pipeline: chunk: %zu: not in [0, %d]", o->chunk,
                          PIPE_MAX_CHUNK);
    if (o->native != 0 && o->native != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: native: %d: not 0 or 1", o->native);
    if (o->native && (o->native_max_pixels < 1 || o->native_max_pixels > ((uint64_t)1 << 32)))
        return dsrt__fail(DSRT_EOPTION, "pipeline: native_max_pixels: %llu: not in [1, 2^32]",
                          (unsigned long long)o->native_max_pixels);
    if (o->gpu < -1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: gpu: %d: not -1 (auto) or a device", o->gpu);
    if (o->parts > PIPE_MAX_PARTS)
        return dsrt__fail(DSRT_EOPTION, "pipeline: parts: %u: not in [0, %d]", o->parts,
                          PIPE_MAX_PARTS);
    if (o->part >= DSRT_MAX(o->parts, 1u))
        return dsrt__fail(DSRT_EOPTION, "pipeline: part: %u: not in [0, parts %u)", o->part,
                          DSRT_MAX(o->parts, 1u));
    if (o->pad_last != 0 && o->pad_last != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: pad_last: %d: not 0 or 1", o->pad_last);
    if (o->reader.io != DSRT_IO_AUTO && o->reader.io != DSRT_IO_URING &&
        o->reader.io != DSRT_IO_PREAD)
        return dsrt__fail(DSRT_EOPTION, "pipeline: reader.io: %d: unknown", (int)o->reader.io);
    if (o->reader.depth < 1 || o->reader.depth > 4096)
        return dsrt__fail(DSRT_EOPTION, "pipeline: reader.depth: %u: not in [1, 4096]",
                          o->reader.depth);
    int rc = dsrt__remote_options_check(&o->reader.remote, "pipeline: reader");
    if (rc != 0) return rc;
    if (o->reader.direct != 0 && o->reader.direct != 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: reader.direct: %d: not 0 or 1",
                          o->reader.direct);
    if (o->decoder.max_pixels < 1)
        return dsrt__fail(DSRT_EOPTION, "pipeline: decoder.max_pixels: 0: must be at least 1");
    return 0;
}

// ----------------------------------------------------------------------------
// Run positions and slots

/* Samples in batch `index` of an epoch, over all parts (with pad_last, the
 * last one rounded up to a multiple of the parts: positions past the end
 * of the order wrap to its start). */
static size_t batch_count(const dsrt_pipeline *p, uint64_t index) {
    size_t first = (size_t)index * p->o.batch;
    size_t count = DSRT_MIN(p->o.batch, p->n - first);
    if (p->o.pad_last && p->o.parts > 1)
        count = DSRT_MIN((count + p->o.parts - 1) / p->o.parts * p->o.parts, p->o.batch);
    return count;
}

/* The first place of this pipeline's part in a batch of `count` samples. */
static size_t part_start(const dsrt_pipeline *p, size_t count, unsigned part) {
    return (size_t)((uint64_t)count * part / p->o.parts);
}

/* Makes slot s free for run batch b (guarded by mu). */
static void slot_prepare(dsrt_pipeline *p, pipe_slot *s, uint64_t b) {
    uint64_t g = p->start + b;
    s->free_for = b;
    s->ready_for = PIPE_NONE;
    s->lent = 0;
    s->fail_code = 0;
    s->fail_place = SIZE_MAX;
    s->fail_msg[0] = '\0';
    s->b.epoch = g / p->bpe;
    s->b.index = g % p->bpe;
    s->b.global = g;
    size_t all = batch_count(p, s->b.index), lo = part_start(p, all, p->o.part);
    s->b.global_count = all;
    s->b.part_offset = lo;
    s->b.count = part_start(p, all, p->o.part + 1) - lo;
    s->b.shape[0] = (int)s->b.count;
    s->b.mix_lambda = 1.0;
    s->b.mix_cutmix = 0;
    memset(s->b.mix_box, 0, sizeof s->b.mix_box);
    s->remaining = (unsigned)((s->b.count + p->chunk - 1) / p->chunk);
    if (s->remaining == 0) {
        /* An empty part (a batch smaller than the parts): ready as it is. */
        s->ready_for = b;
        pthread_cond_broadcast(&p->ready_cv);
    }
}

/* Starts a run at position start (guarded by mu, no worker active). */
static void run_start(dsrt_pipeline *p, uint64_t start) {
    p->start = start;
    p->run_batches = p->o.epochs ? p->o.epochs * p->bpe - start : PIPE_NONE;
    p->next_item = 0;
    p->next_batch = 0;
    p->fatal_batch = PIPE_NONE;
    p->sticky_code = 0;
    p->sticky_msg[0] = '\0';
    atomic_store_explicit(&p->stalled, 0, memory_order_relaxed);
    for (unsigned i = 0; i < p->nslots; i++) slot_prepare(p, &p->slots[i], i);
}

// ----------------------------------------------------------------------------
// Epoch orders and known-bad samples

/* The order of the epoch: positions of the datastore (NULL when the
 * feed's plan or the sampler had no memory for it). */
static const uint32_t *order_get(dsrt_pipeline *p, uint64_t epoch) {
    if (p->elastic_parts && epoch == p->elastic_epoch) return p->elastic_order;
    /* A sampler takes every epoch's number (a mix draws afresh each epoch
     * under any shuffle; it keeps the order fixed itself where asked). */
    uint64_t key = p->o.shuffle == DSRT_SHUFFLE_EVERY_EPOCH || p->sampler ? epoch : 0;
    pthread_mutex_lock(&p->order_mu);
    pipe_order *e = &p->orders[key % p->norders];
    if (!e->valid || e->key != key) {
        e->valid = 0;
        if (p->feed || p->sampler) {
            if ((p->feed ? dsrt__feed_order(p->feed, key, 0, e->order)
                         : dsrt__sampler_order(p->sampler, p->o.seed, key, e->order)) != 0) {
                pthread_mutex_unlock(&p->order_mu);
                return NULL;
            }
        } else {
            for (size_t i = 0; i < p->n; i++) e->order[i] = (uint32_t)i;
            if (p->o.shuffle != DSRT_SHUFFLE_NEVER)
                dsrt_shuffle_indices(e->order, p->n, p->o.seed, key);
        }
        e->key = key;
        e->valid = 1;
    }
    const uint32_t *order = e->order;
    pthread_mutex_unlock(&p->order_mu);
    return order;
}

static int bad_known(const dsrt_pipeline *p, uint32_t pos) {
    uint64_t w = atomic_load_explicit(&p->bad[pos / 64], memory_order_relaxed);
    return (int)((w >> (pos % 64)) & 1);
}

/* Marks pos bad; the first time, counts it and keeps it in the list with
 * its reason. raw is "PATH: what: reason" (see sample_msg); what is kept is
 * redacted (a pre-signed URL's signature, a URL's password). */
static void bad_mark(dsrt_pipeline *p, uint32_t pos, int code, const char *raw) {
    const char *path = dsrt_datastore_path(p->ds, pos);
    size_t pl = path ? strlen(path) : 0;
    char msg[PIPE_MSG], reason[PIPE_MSG];
    dsrt_text_redact(raw, msg, sizeof msg);
    if (path && strncmp(raw, path, pl) == 0 && raw[pl] == ':' && raw[pl + 1] == ' ')
        dsrt_text_redact(raw + pl + 2, reason, sizeof reason);
    else
        memcpy(reason, msg, sizeof reason);
    uint64_t bit = (uint64_t)1 << (pos % 64);
    uint64_t old = atomic_fetch_or_explicit(&p->bad[pos / 64], bit, memory_order_relaxed);
    pthread_mutex_lock(&p->bad_mu);
    msg_copy(p->last_bad, msg);
    if (old & bit) {
        pthread_mutex_unlock(&p->bad_mu);
        return;
    }
    atomic_fetch_add_explicit(&p->nbad, 1, memory_order_relaxed);
    unsigned k = atomic_load_explicit(&p->nbad_msgs, memory_order_relaxed);
    if (k < DSRT_PIPELINE_BAD_MESSAGES) {
        msg_copy(p->bad_msgs[k], msg);
        atomic_store_explicit(&p->nbad_msgs, k + 1, memory_order_release);
    }
    void *list = p->bad_list;
    if (dsrt__grow(&list, &p->cap_bad_list, p->nbad_list + 1, sizeof *p->bad_list) == 0) {
        p->bad_list = list;
        size_t rl = strlen(reason);
        char *text = NULL;
        if (p->bad_text.total + rl + 1 <= PIPE_BAD_TEXT_MAX)
            text = dsrt__arena_strndup(&p->bad_text, reason, rl);
        p->bad_list[p->nbad_list++] = (dsrt_bad_sample){
            .id = dsrt_datastore_id(p->ds, pos),
            .path = path,
            .code = code,
            .error = text ? text : dsrt_strerror(code),
        };
    }
    pthread_mutex_unlock(&p->bad_mu);
}

/* Errors that belong to the process or the system, not to the file: too
 * many files open, memory, a read refused or interrupted for now. */
static int is_transient(int code) {
    return code == -EMFILE || code == -ENFILE || code == -ENOMEM || code == -EAGAIN ||
           code == -EINTR;
}

// ----------------------------------------------------------------------------
// One sample

/* "PATH: what: reason" from this thread's last error, dropping the module
 * prefix and path the message may already carry. */
static void sample_msg(char *out, const char *path, const char *what, int code) {
    const char *m = dsrt_last_error();
    size_t wl = strlen(what), pl = path ? strlen(path) : 0;
    if (strncmp(m, what, wl) == 0 && m[wl] == ':' && m[wl + 1] == ' ') m += wl + 2;
    if (path && strncmp(m, path, pl) == 0 && m[pl] == ':' && m[pl + 1] == ' ') m += pl + 2;
    if (!m[0]) m = dsrt_strerror(code);
    snprintf(out, PIPE_MSG, "%s: %s: %s", path ? path : "(memory)", what, m);
}

/* What became of one attempt at a place. */
enum { SAMPLE_OK = 0, SAMPLE_BAD = 1, SAMPLE_FATAL = 2 };

/* The key of a sample's random augmentation: its id, so that it does not
 * depend on the order samples come in; when sampling, a sample may come
 * twice in an epoch, and each time is told apart by its place in the
 * epoch's order (at), which is the same on every run. */
static uint64_t augment_key(const dsrt_pipeline *p, uint32_t pos, uint64_t at) {
    uint64_t id = dsrt_datastore_id(p->ds, pos);
    return p->sampler ? id | (at + 1) << 32 : id;
}

/* The augmentation of the sample at pos: its source's in a mix whose
 * sources have presets of their own, else the pipeline's. */
static const dsrt_augment_options *sample_aug(const dsrt_pipeline *p, uint32_t pos) {
    if (!p->src_aug) return &p->aug;
    return &p->src_aug[dsrt__mixture_source(p->mixture, dsrt_datastore_id(p->ds, pos))];
}

/*
 * Each source's augmentation for a mix whose sources name presets: the
 * preset's recipe (crop, resize, flips, colour, erasing) at the pipeline's
 * output size, channels, layout and normalisation, so batches keep one
 * shape; a source without one takes the pipeline's. NULL *out when no
 * source names one. A name that is no preset is refused, naming the source.
 */
static int source_augments(const dsrt_mixture *m, const dsrt_augment_options *aug, int native,
                           dsrt_augment_options **out) {
    *out = NULL;
    if (!m || !m->preset) return 0;
    if (native)
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: native: the sources of this mix have augment presets of "
                          "their own; native batches are not augmented");
    dsrt_augment_options *a = dsrt__calloc(m->k, sizeof *a);
    if (!a) return -ENOMEM;
    for (size_t k = 0; k < m->k; k++) {
        a[k] = *aug;
        if (!m->preset[k]) continue;
        int rc = dsrt_augment_preset_from_name(m->preset[k], &a[k]);
        if (rc == 0) {
            a[k].output_height = aug->output_height;
            a[k].output_width = aug->output_width;
            a[k].output_channels = aug->output_channels;
            a[k].layout = aug->layout;
            a[k].norm = aug->norm;
            memcpy(a[k].mean, aug->mean, sizeof a[k].mean);
            memcpy(a[k].std, aug->std, sizeof a[k].std);
            rc = dsrt_augment_check(&a[k]);
        }
        if (rc != 0) {
            free(a);
            return dsrt__fail_prefix(rc, "pipeline: mix source %zu (%s): augment preset '%s'", k,
                                     dsrt_datastore_path(m->src[k], 0), m->preset[k]);
        }
    }
    *out = a;
    return 0;
}

/* Decodes (or converts) and augments the sample at pos, place `at` of the
 * epoch's order, into place `place` of slot s. buf is the file's bytes, or
 * NULL for in-memory sources. */
static int sample_fill(pipe_worker *w, pipe_slot *s, size_t place, uint32_t pos, uint64_t at,
                       const uint8_t *buf, size_t size, char *msg, int *code) {
    dsrt_pipeline *p = w->p;
    const char *path = dsrt_datastore_path(p->ds, pos);
    int ch = p->aug.output_channels;
    uint64_t t0 = now_ns();
    dsrt_image img;
    dsrt_window win, *wp = NULL;
    int full_w, full_h, rc;
    dsrt_decode_request req = {.channels = ch};
    if (!buf) {
        rc = dsrt_datastore_read_image(p->ds, pos, w->dec, &req, &img);
        if (rc != 0) goto bad_decode;
        full_w = img.width;
        full_h = img.height;
    } else {
        dsrt_image_info info;
        rc = dsrt_decode_begin(w->dec, buf, size, &info);
        if (rc != 0) goto bad_decode;
        full_w = info.width;
        full_h = info.height;
        if (p->o.native) {
            if ((uint64_t)full_w * (uint64_t)full_h > p->o.native_max_pixels || full_w > 65535 ||
                full_h > 65535) {
                *code = DSRT_ETOOBIG;
                snprintf(msg, PIPE_MSG,
                         "%s: decode: %dx%d pixels, more than native_max_pixels (%llu)", path,
                         full_w, full_h, (unsigned long long)p->o.native_max_pixels);
                return SAMPLE_BAD;
            }
        } else {
            /* Only what the sample reads: its region, at the smallest scale. */
            rc = dsrt_augment_decode_request(w->aug, sample_aug(p, pos), &info, p->o.seed,
                                             s->b.epoch, augment_key(p, pos, at), &req);
            if (rc != 0) {
                *code = rc;
                snprintf(msg, PIPE_MSG, "pipeline: augment: %s: %s", path ? path : "(memory)",
                         dsrt_last_error());
                return SAMPLE_FATAL;
            }
        }
        rc = dsrt_decode_finish(w->dec, &req, &img, &win);
        if (rc != 0) goto bad_decode;
        wp = &win;
    }
    uint64_t t1 = now_ns();
    add(&w->decode_ns, t1 - t0);

    const dsrt_augment_options *ao = sample_aug(p, pos);
    dsrt_augment_options nat;
    if (p->o.native) {
        if ((uint64_t)img.width * (uint64_t)img.height > p->o.native_max_pixels) {
            *code = DSRT_ETOOBIG;
            snprintf(msg, PIPE_MSG, "%s: decode: %dx%d pixels, more than native_max_pixels (%llu)",
                     path ? path : "(memory)", img.width, img.height,
                     (unsigned long long)p->o.native_max_pixels);
            return SAMPLE_BAD;
        }
        nat = p->native;
        nat.output_width = img.width;
        nat.output_height = img.height;
        ao = &nat;
    }
    uint8_t *dst = (uint8_t *)s->b.data + place * p->stride;
    rc = dsrt_augment_apply_window(w->aug, ao, &img, wp, full_w, full_h, p->o.seed, s->b.epoch,
                                   augment_key(p, pos, at), dst);
    add(&w->augment_ns, now_ns() - t1);
    if (rc != 0) {
        /* Not the sample's fault: options or memory. */
        *code = rc;
        snprintf(msg, PIPE_MSG, "pipeline: augment: %s: %s", path ? path : "(memory)",
                 dsrt_last_error());
        return SAMPLE_FATAL;
    }
    s->b.labels[place] = dsrt_datastore_label(p->ds, pos);
    s->b.ids[place] = dsrt_datastore_id(p->ds, pos);
    s->b.sources[place] =
        p->mixture ? (int32_t)dsrt__mixture_source(p->mixture, s->b.ids[place]) : 0;
    if (p->o.native) {
        s->b.sizes[2 * place] = img.height;
        s->b.sizes[2 * place + 1] = img.width;
    }
    add(&w->samples, 1);
    add(&w->bytes, size);
    return SAMPLE_OK;

bad_decode:
    add(&w->decode_ns, now_ns() - t0);
    *code = rc;
    if (rc == -ENOMEM) {
        snprintf(msg, PIPE_MSG, "pipeline: %s", dsrt_last_error());
        return SAMPLE_FATAL;
    }
    if (!buf && dsrt_last_error()[0]) {
        snprintf(msg, PIPE_MSG, "%s", dsrt_last_error());
        return SAMPLE_BAD;
    }
    sample_msg(msg, path, "decode", rc);
    return SAMPLE_BAD;
}

// ----------------------------------------------------------------------------
// One chunk

/* Keeps the lowest-place fatal failure of the chunk. */
static void chunk_fail(pipe_fail *f, size_t place, int code, const char *msg) {
    if (f->code != 0 && f->place <= place) return;
    f->code = code;
    f->place = place;
    msg_copy(f->msg, msg);
}

/* Leaves place pl empty (drop_bad): the batch is closed up before delivery. */
static void place_empty(pipe_slot *s, const pipe_place *pl) {
    s->b.ids[pl->place] = PIPE_EMPTY;
}

/* The datastore position to try next for place pl, passing over known-bad
 * samples: SAMPLE_OK, SAMPLE_BAD when the place stays empty (drop_bad), or
 * SAMPLE_FATAL when max_consecutive_bad positions in a row failed. */
static int place_next(pipe_worker *w, pipe_slot *s, const uint32_t *order, uint64_t epoch_pos,
                      pipe_place *pl, pipe_fail *f) {
    dsrt_pipeline *p = w->p;
    uint64_t limit = DSRT_MIN((uint64_t)p->o.max_consecutive_bad, (uint64_t)p->n);
    for (;;) {
        if (pl->k >= limit) {
            char m[PIPE_MSG], last[PIPE_MSG];
            pthread_mutex_lock(&p->bad_mu);
            msg_copy(last, p->last_bad);
            pthread_mutex_unlock(&p->bad_mu);
            snprintf(m, sizeof m,
                     "pipeline: %llu samples in a row failed from position %llu of the epoch's "
                     "order; the last: %.400s",
                     (unsigned long long)pl->k, (unsigned long long)epoch_pos,
                     last[0] ? last : "(none kept)");
            chunk_fail(f, pl->place, DSRT_ESKIPPED, m);
            return SAMPLE_FATAL;
        }
        uint32_t pos = order[(epoch_pos + pl->k) % p->n];
        if (p->o.fail_on_error || !bad_known(p, pos)) {
            pl->pos = pos;
            return SAMPLE_OK;
        }
        add(&w->skipped, 1);
        if (p->o.drop_bad) {
            place_empty(s, pl);
            return SAMPLE_BAD;
        }
        pl->k++;
    }
}

/* A failed attempt at place pl: with fail_on_error it is fatal, else the
 * sample is marked bad and the place tries the next position (or, with
 * drop_bad, stays empty). Returns 1 when the place must be tried again. */
static int place_failed(pipe_worker *w, pipe_slot *s, pipe_place *pl, int code, const char *msg,
                        pipe_fail *f) {
    dsrt_pipeline *p = w->p;
    bad_mark(p, pl->pos, code, msg);
    if (p->o.fail_on_error) {
        char m[PIPE_MSG + 16];
        snprintf(m, sizeof m, "pipeline: %s", msg);
        chunk_fail(f, pl->place, code, m);
        return 0;
    }
    add(&w->skipped, 1);
    if (p->o.drop_bad) {
        place_empty(s, pl);
        return 0;
    }
    pl->k++;
    return 1;
}

/* A read of place pl that failed for the process's sake (is_transient).
 * While other reads of the worker are in flight, the next starts when one of
 * them ends (it gives back its file); else after a pause that doubles. The
 * run fails when no read at all succeeded in the pipeline for PIPE_STALL_NS
 * since the place's first such failure. Returns 1 when the place is to be
 * tried again, 0 with the failure in f. */
static int place_retry(pipe_worker *w, pipe_place *pl, unsigned in_flight, int code,
                       const char *path, pipe_fail *f) {
    dsrt_pipeline *p = w->p;
    uint64_t t = now_ns(), done = atomic_load_explicit(&p->reads_done, memory_order_relaxed);
    if (pl->tries++ == 0 || pl->done != done) {
        pl->since = t;
        pl->done = done;
    }
    if (t - pl->since < PIPE_STALL_NS && !atomic_load_explicit(&p->stalled, memory_order_relaxed)) {
        uint64_t pause = PIPE_BACKOFF_NS << DSRT_MIN(w->streak, 30u);
        w->streak++;
        w->hold_until = in_flight > 0 ? PIPE_WAIT_READ : t + DSRT_MIN(pause, PIPE_BACKOFF_MAX);
        return 1;
    }
    char m[PIPE_MSG];
    snprintf(m, sizeof m,
             "pipeline: %.300s: read: %s: a limit of the process or the system, not a fault of "
             "the file (tried %u times; no read succeeded for %.1f s)",
             path, dsrt_strerror(code), pl->tries, (double)(t - pl->since) * 1e-9);
    chunk_fail(f, pl->place, code, m);
    atomic_store_explicit(&p->stalled, 1, memory_order_relaxed);
    return 0;
}

/* Makes read buffer bi hold at least need bytes (up to buf_cap). A failure
 * is the process's: out of address space. */
static int buf_fit(pipe_worker *w, int bi, size_t need, const char *path) {
    dsrt_pipeline *p = w->p;
    if (w->buf_size[bi] >= need) return 0;
    size_t size = w->buf_size[bi] ? w->buf_size[bi] : PIPE_BUF_START;
    while (size < need && size < p->buf_cap) size = size > p->buf_cap / 2 ? p->buf_cap : size * 2;
    size = round_up(DSRT_MIN(size, p->buf_cap), DSRT_DIRECT_ALIGN);
    void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (b == MAP_FAILED)
        return dsrt__fail(-ENOMEM,
                          "pipeline: %s: no address space left for a read buffer of %zu bytes "
                          "(ulimit -v?): %s",
                          path ? path : "(start)", size, strerror(errno));
    if (w->bufs[bi]) munmap(w->bufs[bi], w->buf_size[bi]);
    w->bufs[bi] = b;
    w->buf_size[bi] = size;
    return 0;
}

/* The worker's reader, whatever the source. */
static int fetch_submit(pipe_worker *w, const pipe_place *pl, uint64_t epoch, int bi,
                        uint64_t tag) {
    return dsrt__sample_submit(w->reader, pl->pos, epoch, w->bufs[bi], w->buf_size[bi], tag);
}

static int fetch_collect(pipe_worker *w, dsrt_read_result *r, int wait) {
    return dsrt__sample_collect(w->reader, r, wait);
}

/* Bytes a buffer needs for the sample at pos: what the reader knows of it
 * beforehand (a member's size, with the room O_DIRECT wants), or what a
 * first read learnt (pl->need, for files). */
static size_t fetch_need(const pipe_worker *w, const pipe_place *pl) {
    return DSRT_MAX(pl->need, dsrt__sample_need(w->reader, pl->pos));
}

/* Drops every read still in flight. */
static void reader_drain(pipe_worker *w) {
    dsrt__sample_cancel(w->reader);
    w->nfree = 0;
    for (unsigned i = 0; i < w->nbufs; i++) w->free_bufs[w->nfree++] = (int)i;
}

static void remote_stats_copy(pipe_worker *w) {
    dsrt_remote_stats rs;
    dsrt__sample_remote_stats(w->reader, &rs);
    atomic_store_explicit(&w->remote_requests, rs.requests, memory_order_relaxed);
    atomic_store_explicit(&w->remote_retries, rs.retries, memory_order_relaxed);
    atomic_store_explicit(&w->remote_connections, rs.connections, memory_order_relaxed);
    atomic_store_explicit(&w->remote_in_flight_us, (uint64_t)(rs.in_flight_s * 1e6),
                          memory_order_relaxed);
    atomic_store_explicit(&w->remote_busy_us, (uint64_t)(rs.busy_s * 1e6), memory_order_relaxed);
    atomic_store_explicit(&w->remote_bytes, rs.bytes, memory_order_relaxed);
    atomic_store_explicit(&w->cache_hits, rs.cache_hits, memory_order_relaxed);
    atomic_store_explicit(&w->cache_bytes, rs.cache_bytes, memory_order_relaxed);
    atomic_store_explicit(&w->cache_misses, rs.cache_misses, memory_order_relaxed);
    atomic_store_explicit(&w->cache_evictions, rs.cache_evictions, memory_order_relaxed);
}

/* Adds a reader's or a feed's cache counters and bytes from the store. */
static void remote_add(dsrt_pipeline_statistics *s, uint64_t bytes, uint64_t hits,
                       uint64_t cache_bytes, uint64_t misses, uint64_t evictions) {
    s->remote_bytes += bytes;
    s->cache_hits += hits;
    s->cache_bytes += cache_bytes;
    s->cache_misses += misses;
    s->cache_evictions += evictions;
}

/* Sleeps until t (ns) or abort, whichever comes first. */
static void pause_until(dsrt_pipeline *p, uint64_t t) {
    for (uint64_t now = now_ns(); now < t && !atomic_load_explicit(&p->abort, memory_order_relaxed);
         now = now_ns()) {
        uint64_t d = DSRT_MIN(t - now, (uint64_t)10000000);
        struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
        nanosleep(&ts, NULL);
    }
}

/* The places [lo, hi) of a slot being filled: the epoch's order, the places
 * waiting for a read (w->pending[0, npending)) and the reads in flight. */
typedef struct {
    pipe_slot *s;
    const uint32_t *order;
    uint64_t first; /* the epoch position of the slot's place 0 */
    size_t npending;
    unsigned in_flight;
    uint64_t t0; /* when the worker's current stretch of reading began */
    pipe_fail *f;
} pipe_chunk;

/* Place pl waits for a read again. */
static void chunk_again(pipe_worker *w, pipe_chunk *c, const pipe_place *pl) {
    w->pending[c->npending++] = (size_t)(pl - w->places);
}

/* Starts reads for waiting places while buffers last, unless a retry asked
 * for a pause; in memory, fills them at once. Returns 1 when stopped by
 * reset or close. */
static int chunk_start(pipe_worker *w, pipe_chunk *c) {
    dsrt_pipeline *p = w->p;
    char msg[PIPE_MSG];
    int code;
    c->t0 = now_ns();
    while (c->npending > 0 && (p->in_memory || (w->nfree > 0 && c->t0 >= w->hold_until))) {
        pipe_place *pl = &w->places[w->pending[--c->npending]];
        if (place_next(w, c->s, c->order, c->first + pl->place, pl, c->f) != SAMPLE_OK) continue;
        if (p->in_memory) {
            add(&w->read_ns, now_ns() - c->t0);
            int r = sample_fill(w, c->s, pl->place, pl->pos, c->first + pl->place + pl->k, NULL, 0,
                                msg, &code);
            c->t0 = now_ns();
            if (r == SAMPLE_FATAL) chunk_fail(c->f, pl->place, code, msg);
            if (r == SAMPLE_BAD && place_failed(w, c->s, pl, code, msg, c->f))
                chunk_again(w, c, pl);
            if (atomic_load_explicit(&p->abort, memory_order_relaxed)) return 1;
            continue;
        }
        int bi = w->free_bufs[--w->nfree];
        const char *path = dsrt_datastore_path(p->ds, pl->pos);
        int rc = buf_fit(w, bi, fetch_need(w, pl), path);
        if (rc == 0) rc = fetch_submit(w, pl, c->s->b.epoch, bi, (uint64_t)(pl - w->places));
        if (rc != 0) {
            /* No address space for the buffer, a full reader or a
             * misaligned buffer: none of them the file's fault. */
            w->free_bufs[w->nfree++] = bi;
            snprintf(msg, sizeof msg, "%s%s",
                     strncmp(dsrt_last_error(), "pipeline: ", 10) ? "pipeline: " : "",
                     dsrt_last_error());
            chunk_fail(c->f, pl->place, rc, msg);
            continue;
        }
        pl->buf = bi;
        c->in_flight++;
    }
    return 0;
}

/* A read of the chunk ended (res): the place is filled, found bad, or waits
 * for another read. */
static void chunk_read_done(pipe_worker *w, pipe_chunk *c, dsrt_read_result *res) {
    dsrt_pipeline *p = w->p;
    char msg[PIPE_MSG];
    int code;
    c->in_flight--;
    if (w->hold_until == PIPE_WAIT_READ) w->hold_until = 0; /* a file given back */
    if (res->status == 0) {
        w->streak = 0;
        atomic_fetch_add_explicit(&p->reads_done, 1, memory_order_relaxed);
        if (atomic_load_explicit(&p->stalled, memory_order_relaxed))
            atomic_store_explicit(&p->stalled, 0, memory_order_relaxed);
    }
    if (p->o.reader.direct)
        atomic_store_explicit(&w->direct_refused, dsrt__sample_direct_refused(w->reader),
                              memory_order_relaxed);
    if (p->remote) remote_stats_copy(w);
    pipe_place *pl = &w->places[res->tag];
    w->free_bufs[w->nfree++] = pl->buf;
    pl->buf = -1;
    /* The buffers are whole pages: the cap is the option's, to the byte. */
    if (res->status == 0 && res->size > p->o.max_file_bytes) res->status = DSRT_ETOOBIG;
    if (res->status == DSRT_ETOOBIG && res->size <= p->o.max_file_bytes && res->size > pl->need) {
        /* Larger than its buffer, not than the limit: again, in a larger one. */
        pl->need = res->size;
        chunk_again(w, c, pl);
        return;
    }
    if (res->status == DSRT_EREMOTE) {
        /* The store, not the object: the run stops with the cause. */
        snprintf(msg, sizeof msg, "pipeline: %s", dsrt_last_error());
        chunk_fail(c->f, pl->place, res->status, msg);
        return;
    }
    if (is_transient(res->status)) {
        if (place_retry(w, pl, c->in_flight, res->status, res->path, c->f)) chunk_again(w, c, pl);
        return;
    }
    int r;
    if (res->status != 0) {
        code = res->status;
        if (code == DSRT_ETOOBIG)
            snprintf(msg, sizeof msg, "%s: read: %zu bytes, more than max_file_bytes (%zu)",
                     res->path, res->size, p->o.max_file_bytes);
        else
            sample_msg(msg, res->path, "read", code);
        r = SAMPLE_BAD;
    } else {
        r = sample_fill(w, c->s, pl->place, pl->pos, c->first + pl->place + pl->k, res->buf,
                        res->size, msg, &code);
    }
    if (r == SAMPLE_FATAL) chunk_fail(c->f, pl->place, code, msg);
    if (r == SAMPLE_BAD && place_failed(w, c->s, pl, code, msg, c->f)) chunk_again(w, c, pl);
}

/* Fills places [lo, hi) of run batch b's slot s. Returns 1 when stopped by
 * reset or close (the slot is then rebuilt or freed), else 0 with any fatal
 * failure in *f. */
static int chunk_run(pipe_worker *w, pipe_slot *s, size_t lo, size_t hi, pipe_fail *f) {
    dsrt_pipeline *p = w->p;
    pipe_chunk c = {.s = s,
                    .order = order_get(p, s->b.epoch),
                    .f = f,
                    .first = s->b.index * (uint64_t)p->o.batch + s->b.part_offset};
    if (!c.order) {
        chunk_fail(f, lo, -ENOMEM, "pipeline: out of memory for the epoch's order");
        return 0;
    }
    for (size_t i = lo; i < hi; i++) {
        pipe_place *pl = &w->places[i - lo];
        *pl = (pipe_place){.place = i, .k = 0, .buf = -1};
        w->pending[c.npending++] = i - lo;
    }
    while (c.npending > 0 || c.in_flight > 0) {
        if (atomic_load_explicit(&p->abort, memory_order_relaxed)) {
            reader_drain(w);
            return 1;
        }
        if (chunk_start(w, &c)) return 1;
        if (c.in_flight == 0) {
            add(&w->read_ns, now_ns() - c.t0);
            if (c.npending > 0 && w->hold_until != PIPE_WAIT_READ) pause_until(p, w->hold_until);
            if (w->hold_until == PIPE_WAIT_READ) w->hold_until = 0; /* none in flight */
            continue;
        }
        dsrt_read_result res;
        int rc = fetch_collect(w, &res, 1);
        add(&w->read_ns, now_ns() - c.t0);
        if (rc <= 0) {
            /* The reader itself failed: every place still in flight fails. */
            char msg[PIPE_MSG];
            if (rc == 0) rc = -EIO;
            snprintf(msg, sizeof msg, "pipeline: %s", dsrt_last_error());
            for (size_t i = 0; i < hi - lo; i++)
                if (w->places[i].buf >= 0) chunk_fail(f, w->places[i].place, rc, msg);
            reader_drain(w);
            for (size_t i = 0; i < hi - lo; i++) w->places[i].buf = -1;
            return 0;
        }
        chunk_read_done(w, &c, &res);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Workers

/* Waits on cv, adding the time to *ns. */
static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, atomic_uint_fast64_t *ns) {
    uint64_t t = now_ns();
    pthread_cond_wait(cv, mu);
    add(ns, now_ns() - t);
}

static void *worker_main(void *arg) {
    pipe_worker *w = arg;
    dsrt_pipeline *p = w->p;
    if (p->o.pin && dsrt__cpus_bind(p->cpus, w->index) == 0)
        atomic_store_explicit(&w->pinned, 1, memory_order_relaxed);
    pipe_fail f;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->stop) break;
        if (p->pause) {
            timed_wait(&p->work_cv, &p->mu, &w->idle_ns);
            continue;
        }
        uint64_t item = p->next_item, b = item / p->cpb;
        if (p->run_batches != PIPE_NONE && b >= p->run_batches) {
            timed_wait(&p->work_cv, &p->mu, &w->idle_ns);
            continue;
        }
        if (p->fatal_batch != PIPE_NONE && b > p->fatal_batch) {
            timed_wait(&p->work_cv, &p->mu, &w->idle_ns);
            continue;
        }
        pipe_slot *s = &p->slots[b % p->nslots];
        if (s->free_for > b) {
            /* An empty part: ready when its slot was prepared, it may be
             * taken and its slot reused before its items are claimed. */
            p->next_item++;
            continue;
        }
        if (s->free_for != b) {
            timed_wait(&p->work_cv, &p->mu, &w->wait_ns);
            continue;
        }
        p->next_item++;
        size_t lo = (size_t)(item % p->cpb) * p->chunk;
        if (lo >= s->b.count) continue; /* the short last batch has fewer chunks */
        size_t hi = DSRT_MIN(lo + p->chunk, s->b.count);
        p->active++;
        pthread_mutex_unlock(&p->mu);

        f.code = 0;
        int stopped = chunk_run(w, s, lo, hi, &f);

        pthread_mutex_lock(&p->mu);
        p->active--;
        if (!stopped && !p->pause && !p->stop) {
            if (f.code != 0) {
                if (f.place < s->fail_place) {
                    s->fail_code = f.code;
                    s->fail_place = f.place;
                    msg_copy(s->fail_msg, f.msg);
                }
                if (p->fatal_batch == PIPE_NONE || b < p->fatal_batch) p->fatal_batch = b;
            }
            if (--s->remaining == 0) {
                /* The batch is whole: mix it (mix.c) before the consumer
                 * sees it, outside the lock, still counted active so that
                 * a reset or close waits for it. */
                if (p->classes && s->fail_code == 0) {
                    p->active++;
                    pthread_mutex_unlock(&p->mu);
                    uint64_t t = now_ns();
                    dsrt__mix_batch(&p->o, &s->b);
                    add(&w->augment_ns, now_ns() - t);
                    pthread_mutex_lock(&p->mu);
                    p->active--;
                }
                if (!p->pause && !p->stop) {
                    s->ready_for = b;
                    pthread_cond_broadcast(&p->ready_cv);
                }
            }
        }
        if (p->active == 0 && (p->pause || p->stop)) pthread_cond_broadcast(&p->ctl_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void worker_free(pipe_worker *w) {
    dsrt__sample_reader_destroy(w->reader);
    dsrt_decoder_destroy(w->dec);
    dsrt_augmenter_destroy(w->aug);
    if (w->bufs)
        for (unsigned i = 0; i < w->nbufs; i++)
            if (w->bufs[i]) munmap(w->bufs[i], w->buf_size[i]);
    free(w->bufs);
    free(w->buf_size);
    free(w->free_bufs);
    free(w->places);
    free(w->pending);
}

/* A worker's reader, decoder, augmenter and read buffers. The buffers only
 * reserve address space, a small size first (grown as files need): pages
 * cost memory when a file lands in them, on the worker's own NUMA node. */
static int worker_init(dsrt_pipeline *p, pipe_worker *w, unsigned index) {
    w->p = p;
    w->index = index;
    int rc;
    if (!p->in_memory) {
        dsrt_reader_options ro = p->o.reader;
        ro.depth = (unsigned)DSRT_MIN((size_t)ro.depth, p->chunk);
        ro.remote.depth = (unsigned)DSRT_MIN((size_t)ro.remote.depth, p->chunk);
        w->nbufs = p->remote ? ro.remote.depth : ro.depth;
        rc = dsrt__sample_reader_create(&w->reader, p->ds, &ro, p->feed);
        if (rc != 0) return dsrt__fail_prefix(rc, "pipeline: worker %u", index);
        w->bufs = dsrt__calloc(w->nbufs, sizeof *w->bufs);
        w->buf_size = dsrt__calloc(w->nbufs, sizeof *w->buf_size);
        w->free_bufs = dsrt__calloc(w->nbufs, sizeof *w->free_bufs);
        if (!w->bufs || !w->buf_size || !w->free_bufs) return -ENOMEM;
        for (unsigned i = 0; i < w->nbufs; i++) {
            if ((rc = buf_fit(w, (int)i, DSRT_MIN(PIPE_BUF_START, p->buf_cap), NULL)) != 0)
                return rc;
            w->free_bufs[w->nfree++] = (int)i;
        }
    }
    if ((rc = dsrt_decoder_create(&w->dec, &p->o.decoder)) != 0)
        return dsrt__fail_prefix(rc, "pipeline: decoder");
    if ((rc = dsrt_augmenter_create(&w->aug)) != 0)
        return dsrt__fail(rc, "pipeline: out of memory for an augmenter");
    w->places = dsrt__calloc(p->chunk, sizeof *w->places);
    w->pending = dsrt__calloc(p->chunk, sizeof *w->pending);
    if (!w->places || !w->pending) return -ENOMEM;
    return 0;
}

// ----------------------------------------------------------------------------
// Open and close

void dsrt_pipeline_close(dsrt_pipeline *p) {
    if (!p) return;
    if (p->sync_ready) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        atomic_store(&p->abort, 1);
        pthread_cond_broadcast(&p->work_cv);
        pthread_cond_broadcast(&p->ready_cv);
        pthread_mutex_unlock(&p->mu);
    }
    if (p->workers)
        for (unsigned i = 0; i < p->nthreads; i++)
            if (p->workers[i].started) pthread_join(p->workers[i].thread, NULL);
    if (p->feed_started) {
        dsrt__feed_stop(p->feed);
        pthread_join(p->feed_thread, NULL);
    }
    if (p->workers) {
        for (unsigned i = 0; i < p->nthreads; i++) worker_free(&p->workers[i]);
        free(p->workers);
    }
    dsrt__feed_destroy(p->feed);
    if (p->sync_ready) {
        pthread_cond_destroy(&p->ctl_cv);
        pthread_cond_destroy(&p->ready_cv);
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
        pthread_mutex_destroy(&p->order_mu);
        pthread_mutex_destroy(&p->bad_mu);
    }
    if (p->orders)
        for (unsigned i = 0; i < p->norders; i++) free(p->orders[i].order);
    free(p->orders);
    free(p->elastic_order);
    free(p->src_aug);
    free(p->bad);
    dsrt__sampler_destroy(p->sampler);
    free(p->bad_list);
    dsrt__arena_free(&p->bad_text);
    free(p->meta);
    free(p->soft);
    free(p->slots);
    dsrt__host_free(&p->mem);
    dsrt__cpus_close(p->cpus);
    free(p->cpus_opt);
    free(p->cache_dir);
    free(p);
}

/* The options native mode writes with: the output's channels, layout and
 * normalisation; no geometry. */
static dsrt_augment_options native_options(const dsrt_augment_options *a) {
    dsrt_augment_options n = dsrt_augment_defaults();
    n.output_channels = a->output_channels;
    n.layout = a->layout;
    n.norm = a->norm;
    memcpy(n.mean, a->mean, sizeof n.mean);
    memcpy(n.std, a->std, sizeof n.std);
    return n;
}

/* Slots, their batch headers and their labels, ids and sizes. */
static int slots_init(dsrt_pipeline *p) {
    const dsrt_augment_options *a = &p->aug;
    size_t elem = a->layout == DSRT_AUGMENT_F32_NCHW ? sizeof(float) : 1;
    p->sample_bytes = p->o.native ? (size_t)p->o.native_max_pixels * a->output_channels * elem
                                  : dsrt_augment_sample_bytes(a);
    p->stride = p->sample_bytes;
    size_t B = p->cap;
    if (p->stride > SIZE_MAX / B / (p->nslots + 1))
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: batch %zu of %zu-byte samples does not fit "
                          "in memory",
                          B, p->stride);
    p->slot_bytes = round_up(B * p->stride, PIPE_PAGE);
    int rc = dsrt__host_alloc(&p->mem, p->slot_bytes * p->nslots, p->o.gpu);
    if (rc != 0) return rc;

    size_t per = B * (2 * sizeof(int32_t) + sizeof(uint32_t) + 2 * sizeof(int32_t));
    p->slots = dsrt__calloc(p->nslots, sizeof *p->slots);
    p->meta = dsrt__calloc(p->nslots, per);
    if (!p->slots || !p->meta) return -ENOMEM;
    if (p->classes && !(p->soft = dsrt__calloc((size_t)p->nslots * B, p->classes * sizeof(float))))
        return -ENOMEM;
    for (unsigned i = 0; i < p->nslots; i++) {
        dsrt_batch *b = &p->slots[i].b;
        char *m = (char *)p->meta + i * per;
        b->data = (char *)p->mem.ptr + i * p->slot_bytes;
        b->labels = (int32_t *)m;
        b->ids = (uint32_t *)(m + B * sizeof(int32_t));
        b->sizes = (int32_t *)(m + B * 2 * sizeof(int32_t));
        b->sources = (int32_t *)(m + B * 4 * sizeof(int32_t));
        b->capacity = B;
        if (p->soft) {
            b->soft_labels = p->soft + (size_t)i * B * p->classes;
            b->classes = p->classes;
        }
        b->sample_stride = p->stride;
        b->sample_bytes = p->sample_bytes;
        b->layout = a->layout;
        int C = a->output_channels, H = p->o.native ? 0 : a->output_height,
            W = p->o.native ? 0 : a->output_width;
        if (a->layout == DSRT_AUGMENT_F32_NCHW) {
            b->shape[1] = C;
            b->shape[2] = H;
            b->shape[3] = W;
        } else {
            b->shape[1] = H;
            b->shape[2] = W;
            b->shape[3] = C;
        }
        for (size_t j = 0; j < B; j++) {
            b->sizes[2 * j] = H;
            b->sizes[2 * j + 1] = W;
        }
    }
    return 0;
}

/* The mutexes and condition variables; on a failure the ones made are
 * destroyed again and sync_ready stays 0. */
static int sync_init(dsrt_pipeline *p) {
    pthread_mutex_t *mus[] = {&p->mu, &p->order_mu, &p->bad_mu};
    pthread_cond_t *cvs[] = {&p->work_cv, &p->ready_cv, &p->ctl_cv};
    size_t nm = 0, nc = 0;
    /* The monotonic clock: dsrt_pipeline_next_timed's deadline must not move
     * with the wall clock. */
    pthread_condattr_t ca;
    int e = pthread_condattr_init(&ca);
    if (e == 0) {
        e = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        while (e == 0 && nm < DSRT_ARRAY_SIZE(mus) && (e = pthread_mutex_init(mus[nm], NULL)) == 0)
            nm++;
        while (e == 0 && nc < DSRT_ARRAY_SIZE(cvs) && (e = pthread_cond_init(cvs[nc], &ca)) == 0)
            nc++;
        pthread_condattr_destroy(&ca);
    }
    if (e == 0) {
        p->sync_ready = 1;
        return 0;
    }
    while (nc > 0) pthread_cond_destroy(cvs[--nc]);
    while (nm > 0) pthread_mutex_destroy(mus[--nm]);
    return dsrt__fail(-e, "pipeline: making its locks: %s", strerror(e));
}

/* The feed's thread (the shard order's stream: the shards read ahead of
 * the workers). */
static void *feed_main(void *arg) {
    dsrt__feed_run(arg);
    return NULL;
}

/* Epochs the batches in progress may span (fewer than nslots of them). */
static unsigned epochs_open(const dsrt_pipeline *p) {
    return 2 + (unsigned)((p->nslots + p->bpe - 1) / p->bpe);
}

/* The feed of the datastore's source, when it has one for this run. */
static int feed_open(dsrt_pipeline *p) {
    /* The feed keeps the samples of every epoch a worker may still ask
     * for: as many as the epoch orders' ring holds. */
    dsrt_feed_options fo = {.shuffle = p->o.shuffle,
                            .seed = p->o.seed,
                            .batch = p->o.batch,
                            .drop_last = p->o.drop_last,
                            .parts = p->o.parts,
                            .part = p->o.part,
                            .reader = p->o.reader,
                            .epochs = p->o.epochs,
                            .open_epochs = epochs_open(p)};
    int rc = dsrt__feed_open(&p->feed, p->ds, &fo);
    if (rc) return dsrt__fail_prefix(rc, "pipeline");
    if (p->feed && p->sampler)
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: sample_weights: not with the shard order's stream, which "
                          "orders the samples itself (give the exact order)");
    if (p->feed && p->o.pad_last && p->o.parts > 1)
        return dsrt__fail(DSRT_EOPTION,
                          "pipeline: pad_last: not with the shard order's stream (give the exact "
                          "order, or drop_last)");
    return 0;
}

/* The sizes of the run: chunks, batches per epoch; checks the epochs and
 * gpu options against them. */
static int sizes_plan(dsrt_pipeline *p) {
    const dsrt_pipeline_options *o = &p->o;
    /* Chunks small enough that the prefetched batches hold a chunk for every
     * worker (many cores, small batches), at most PIPE_CHUNK. */
    p->cap = (o->batch + o->parts - 1) / o->parts; /* the largest part of a batch */
    size_t chunk = o->chunk;
    if (chunk == 0) {
        size_t most = p->remote ? DSRT_MAX((size_t)PIPE_CHUNK, (size_t)o->reader.remote.depth)
                                : (size_t)PIPE_CHUNK;
        chunk = p->cap * o->prefetch / p->nthreads;
        chunk = DSRT_MAX((size_t)1, DSRT_MIN(chunk, most));
    }
    p->chunk = DSRT_MIN(chunk, p->cap);
    p->cpb = (p->cap + p->chunk - 1) / p->chunk;
    p->bpe = o->drop_last ? p->n / o->batch : (p->n + o->batch - 1) / o->batch;
    if (o->epochs > UINT64_MAX / p->bpe / p->cpb)
        return dsrt__fail(DSRT_EOPTION, "pipeline: epochs: %llu: too many",
                          (unsigned long long)o->epochs);
    if (o->gpu >= 0) {
        int ndev = dsrt__cuda_device_count();
        if (ndev > 0 && o->gpu >= ndev)
            return dsrt__fail(DSRT_EOPTION, "pipeline: gpu: %d: there are %d CUDA devices", o->gpu,
                              ndev);
    }
    return 0;
}

/* The source's feed thread, then the workers. */
static int threads_start(dsrt_pipeline *p) {
    if (p->feed) {
        int e = pthread_create(&p->feed_thread, NULL, feed_main, p->feed);
        if (e != 0) return dsrt__fail(-e, "pipeline: starting the source's feed: %s", strerror(e));
        p->feed_started = 1;
    }
    for (unsigned i = 0; i < p->nthreads; i++) {
        int e = pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]);
        if (e != 0)
            return dsrt__fail(-e, "pipeline: starting worker %u of %u: %s", i, p->nthreads,
                              strerror(e));
        p->workers[i].started = 1;
    }
    return 0;
}

int dsrt_pipeline_open(dsrt_pipeline **out, const dsrt_datastore *ds,
                       const dsrt_augment_options *augment, const dsrt_pipeline_options *o) {
    if (!out) return dsrt__fail(DSRT_EOPTION, "pipeline: NULL handle pointer");
    *out = NULL;
    dsrt__clear_error(); /* a failure below keeps its own message (see fail:) */
    if (!ds) return dsrt__fail(DSRT_EOPTION, "pipeline: datastore: NULL");
    size_t count = dsrt_datastore_count(ds);
    if (count == 0) return dsrt__fail(DSRT_EEMPTY, "pipeline: the datastore has no sample");
    if (count > UINT32_MAX)
        return dsrt__fail(DSRT_EOPTION, "pipeline: %zu samples: more than 2^32 - 1", count);
    dsrt_pipeline_options opt = o ? *o : dsrt_pipeline_defaults();
    dsrt_augment_options aug = augment ? *augment : dsrt_augment_defaults();
    /* The sampler first: the epoch's size, which the options are checked
     * against, is its. */
    dsrt_sampler *sampler = NULL;
    dsrt_sampler_options so = {.weights = opt.sample_weights,
                               .values = opt.sample_weight_values,
                               .epoch_samples = opt.epoch_samples,
                               .shuffle = (int)opt.shuffle,
                               .who = "pipeline"};
    if ((unsigned)opt.shuffle > DSRT_SHUFFLE_EVERY_EPOCH)
        return dsrt__fail(DSRT_EOPTION, "pipeline: shuffle: %d: unknown", (int)opt.shuffle);
    int rc = dsrt__sampler_create(&sampler, ds, &so);
    if (rc != 0) return rc;
    size_t n = sampler ? dsrt__sampler_count(sampler) : count;
    if (n == 0) {
        dsrt__sampler_destroy(sampler);
        return dsrt__fail(DSRT_EOPTION, "pipeline: epoch_samples: 0 samples an epoch");
    }
    if ((rc = check_options(&opt, n)) != 0) {
        dsrt__sampler_destroy(sampler);
        return rc;
    }
    if (opt.parts == 0) opt.parts = 1;
    if ((rc = dsrt_augment_check(&aug)) != 0) return dsrt__fail_prefix(rc, "pipeline");
    size_t classes = 0;
    if ((rc = dsrt__mix_check(&opt, &aug, dsrt_datastore_num_classes(ds), &classes)) != 0) {
        dsrt__sampler_destroy(sampler);
        return rc;
    }

    dsrt_pipeline *p = dsrt__calloc(1, sizeof *p);
    if (!p) {
        dsrt__sampler_destroy(sampler);
        return -ENOMEM;
    }
    rc = -ENOMEM;
    p->ds = ds;
    p->n = n;
    p->count = count;
    p->sampler = sampler;
    p->mixture = dsrt__mixture_of(ds);
    p->o = opt;
    p->aug = aug;
    if ((rc = source_augments(p->mixture, &aug, opt.native, &p->src_aug)) != 0) goto fail;
    p->classes = classes;
    p->native = native_options(&aug);
    p->in_memory = dsrt_datastore_path(ds, 0) == NULL;
    p->remote = !p->in_memory && dsrt_datastore_remote(ds);
    if (opt.cpus && !(p->cpus_opt = dsrt__strdup(opt.cpus))) goto fail;
    p->o.cpus = p->cpus_opt;
    /* The cache folder is opened by each worker's reader, after the open. */
    if (opt.reader.remote.cache_dir && !(p->cache_dir = dsrt__strdup(opt.reader.remote.cache_dir)))
        goto fail;
    p->o.reader.remote.cache_dir = p->cache_dir;
    p->nslots = opt.prefetch + 1;
    p->buf_cap = round_up(opt.max_file_bytes, DSRT_DIRECT_ALIGN);

    /* Cores: checks the cpus option, so before anything large is allocated. */
    unsigned threads = opt.threads;
    if ((rc = dsrt__cpus_open(&p->cpus, p->cpus_opt, opt.gpu, &threads)) != 0) goto fail;
    p->nthreads = threads;

    if ((rc = sizes_plan(p)) != 0) goto fail;

    /* The source's feed, which the workers' readers draw on. */
    if ((rc = feed_open(p)) != 0) goto fail;

    /* Every worker's reader, decoder and augmenter, before any thread. */
    p->workers = dsrt__calloc(p->nthreads, sizeof *p->workers);
    if (!p->workers) goto fail;
    for (unsigned i = 0; i < p->nthreads; i++)
        if ((rc = worker_init(p, &p->workers[i], i)) != 0) goto fail;
    if (!p->in_memory) {
        const pipe_worker *w0 = &p->workers[0];
        p->io = dsrt__sample_io(w0->reader);
        const char *why = dsrt__sample_fallback(w0->reader);
        if (why) {
            snprintf(p->io_fallback, sizeof p->io_fallback, "%s", why);
            p->has_fallback = 1;
        }
    } else {
        p->io = DSRT_IO_AUTO;
    }

    rc = -ENOMEM;
    if ((rc = slots_init(p)) != 0) goto fail;
    rc = -ENOMEM;
    p->bad = dsrt__calloc((count + 63) / 64, sizeof *p->bad);
    if (!p->bad) goto fail;
    /* An order for each epoch in flight where each epoch has its own (a
     * sampler's under any shuffle: order_get). */
    p->norders = p->o.shuffle == DSRT_SHUFFLE_EVERY_EPOCH || p->sampler ? epochs_open(p) : 1;
    p->orders = dsrt__calloc(p->norders, sizeof *p->orders);
    if (!p->orders) goto fail;
    for (unsigned i = 0; i < p->norders; i++)
        if (!(p->orders[i].order = dsrt__malloc(n * sizeof(uint32_t)))) goto fail;
    if ((rc = sync_init(p)) != 0) goto fail;
    run_start(p, 0);

    if ((rc = threads_start(p)) != 0) goto fail;
    *out = p;
    return 0;

fail:
    if (rc == -ENOMEM && !dsrt_last_error()[0]) dsrt__fail(rc, "pipeline: out of memory");
    dsrt_pipeline_close(p);
    return rc;
}

// ----------------------------------------------------------------------------
// The consumer

/* drop_bad: closes up the places left empty, keeping the order of the rest.
 * The slot is lent to the caller, so no worker touches it. */
static void slot_close_up(dsrt_pipeline *p, dsrt_batch *b) {
    size_t kept = 0;
    for (size_t i = 0; i < b->count; i++) {
        if (b->ids[i] == PIPE_EMPTY) continue;
        if (kept != i) {
            memmove((char *)b->data + kept * p->stride, (char *)b->data + i * p->stride, p->stride);
            b->labels[kept] = b->labels[i];
            b->ids[kept] = b->ids[i];
            b->sources[kept] = b->sources[i];
            b->sizes[2 * kept] = b->sizes[2 * i];
            b->sizes[2 * kept + 1] = b->sizes[2 * i + 1];
        }
        kept++;
    }
    b->count = kept;
    b->shape[0] = (int)kept;
}

/* dsrt_pipeline_next and dsrt_pipeline_next_timed: waits until deadline
 * (CLOCK_MONOTONIC, ns), or for ever when it is UINT64_MAX. */
static int pipeline_next(dsrt_pipeline *p, dsrt_batch **out, uint64_t deadline) {
    *out = NULL;
    int rc = 0;
    uint64_t waited = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->sticky_code != 0) {
            rc = dsrt__fail(p->sticky_code, "%s", p->sticky_msg);
            break;
        }
        if (p->stop) {
            rc = dsrt__fail(DSRT_ECLOSED, "pipeline: closed");
            break;
        }
        uint64_t b = p->next_batch;
        if (p->run_batches != PIPE_NONE && b >= p->run_batches) {
            rc = dsrt__fail(DSRT_EEOF, "pipeline: end of the last epoch (%llu)",
                            (unsigned long long)p->o.epochs);
            break;
        }
        pipe_slot *s = &p->slots[b % p->nslots];
        if (s->lent) {
            rc = dsrt__fail(-EDEADLK, "pipeline: all %u slots are lent out: release a batch first",
                            p->nslots);
            break;
        }
        if (s->ready_for != b) {
            /* Another consumer thread may take b meanwhile: look again after. */
            uint64_t t = now_ns();
            if (deadline == UINT64_MAX) {
                pthread_cond_wait(&p->ready_cv, &p->mu);
            } else if (t >= deadline) {
                rc = dsrt__fail(-ETIMEDOUT, "pipeline: batch %llu is not ready yet",
                                (unsigned long long)b);
                break;
            } else {
                struct timespec ts = {(time_t)(deadline / 1000000000u),
                                      (long)(deadline % 1000000000u)};
                pthread_cond_timedwait(&p->ready_cv, &p->mu, &ts);
            }
            waited += now_ns() - t;
            continue;
        }
        if (s->fail_code != 0) {
            p->sticky_code = s->fail_code;
            msg_copy(p->sticky_msg, s->fail_msg);
            rc = dsrt__fail(p->sticky_code, "%s", p->sticky_msg);
            break;
        }
        s->lent = 1;
        p->next_batch++;
        add(&p->batches, 1);
        *out = &s->b;
        break;
    }
    pthread_mutex_unlock(&p->mu);
    if (*out && p->o.drop_bad) slot_close_up(p, *out);
    if (waited) add(&p->consumer_wait_ns, waited);
    return rc;
}

int dsrt_pipeline_next(dsrt_pipeline *p, dsrt_batch **out) {
    return pipeline_next(p, out, UINT64_MAX);
}

int dsrt_pipeline_next_timed(dsrt_pipeline *p, dsrt_batch **out, int timeout_ms) {
    if (timeout_ms < 0) return pipeline_next(p, out, UINT64_MAX);
    return pipeline_next(p, out, now_ns() + (uint64_t)timeout_ms * 1000000u);
}

int dsrt_batch_release(dsrt_pipeline *p, dsrt_batch *b) {
    if (!b) return dsrt__fail(DSRT_EOPTION, "pipeline: release: NULL batch");
    pipe_slot *s = (pipe_slot *)((char *)b - offsetof(pipe_slot, b));
    size_t i = (size_t)(s - p->slots);
    if (s < p->slots || i >= p->nslots || &p->slots[i].b != b)
        return dsrt__fail(DSRT_EOPTION, "pipeline: release: not a batch of this pipeline");
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (!s->lent) {
        rc = dsrt__fail(DSRT_EOPTION, "pipeline: release: batch %llu is not lent out",
                        (unsigned long long)b->global);
    } else {
        slot_prepare(p, s, s->free_for + p->nslots);
        pthread_cond_broadcast(&p->work_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int dsrt_pipeline_reset(dsrt_pipeline *p, uint64_t epoch, uint64_t batch_in_epoch) {
    return dsrt_pipeline_resume(p, epoch, batch_in_epoch, 0);
}

int dsrt_pipeline_resume(dsrt_pipeline *p, uint64_t epoch, uint64_t batch_in_epoch,
                         unsigned from_parts) {
    if (batch_in_epoch >= p->bpe)
        return dsrt__fail(DSRT_EOPTION, "pipeline: reset: batch %llu: an epoch has %llu",
                          (unsigned long long)batch_in_epoch, (unsigned long long)p->bpe);
    if (epoch > UINT64_MAX / p->bpe / p->cpb - 1 ||
        (p->o.epochs && epoch * p->bpe + batch_in_epoch > p->o.epochs * p->bpe))
        return dsrt__fail(DSRT_EOPTION, "pipeline: reset: epoch %llu batch %llu is past the end",
                          (unsigned long long)epoch, (unsigned long long)batch_in_epoch);
    if (from_parts > PIPE_MAX_PARTS)
        return dsrt__fail(DSRT_EOPTION, "pipeline: resume: from_parts %u: not in [0, %d]",
                          from_parts, PIPE_MAX_PARTS);
    /* Only a feed's order depends on the parts (whole shards to each);
     * positions in the datastore's shuffled order are the same for any
     * number, and each part's places are its share of the same batches. */
    unsigned elastic = p->feed && from_parts && from_parts != p->o.parts ? from_parts : 0;
    if (elastic && !p->elastic_order &&
        !(p->elastic_order = dsrt__malloc((p->n ? p->n : 1) * sizeof *p->elastic_order)))
        return -ENOMEM;
    if (elastic) {
        uint64_t key = p->o.shuffle == DSRT_SHUFFLE_EVERY_EPOCH ? epoch : 0;
        int rc = dsrt__feed_order(p->feed, key, elastic, p->elastic_order);
        if (rc) return dsrt__fail_prefix(rc, "pipeline: resume");
    }
    pthread_mutex_lock(&p->mu);
    p->pause = 1;
    atomic_store(&p->abort, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_cond_broadcast(&p->ready_cv);
    while (p->active > 0) pthread_cond_wait(&p->ctl_cv, &p->mu);
    p->elastic_parts = elastic;
    p->elastic_epoch = epoch;
    run_start(p, epoch * p->bpe + batch_in_epoch);
    if (p->feed) dsrt__feed_seek(p->feed, epoch, batch_in_epoch * p->o.batch, elastic);
    atomic_store(&p->abort, 0);
    p->pause = 0;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

uint64_t dsrt_pipeline_batches_per_epoch(const dsrt_pipeline *p) {
    return p->bpe;
}

// ----------------------------------------------------------------------------
// Statistics

void dsrt_pipeline_stats(const dsrt_pipeline *p, dsrt_pipeline_statistics *s) {
    memset(s, 0, sizeof *s);
    uint64_t r = 0, d = 0, a = 0, wt = 0, id = 0;
    for (unsigned i = 0; i < p->nthreads; i++) {
        pipe_worker *w = &p->workers[i];
        r += atomic_load_explicit(&w->read_ns, memory_order_relaxed);
        d += atomic_load_explicit(&w->decode_ns, memory_order_relaxed);
        a += atomic_load_explicit(&w->augment_ns, memory_order_relaxed);
        wt += atomic_load_explicit(&w->wait_ns, memory_order_relaxed);
        id += atomic_load_explicit(&w->idle_ns, memory_order_relaxed);
        s->samples += atomic_load_explicit(&w->samples, memory_order_relaxed);
        s->skipped += atomic_load_explicit(&w->skipped, memory_order_relaxed);
        s->bytes_read += atomic_load_explicit(&w->bytes, memory_order_relaxed);
        s->direct_refused += atomic_load_explicit(&w->direct_refused, memory_order_relaxed);
        s->pinned_threads += (unsigned)atomic_load_explicit(&w->pinned, memory_order_relaxed);
        s->remote_requests += atomic_load_explicit(&w->remote_requests, memory_order_relaxed);
        s->remote_retries += atomic_load_explicit(&w->remote_retries, memory_order_relaxed);
        s->remote_connections += atomic_load_explicit(&w->remote_connections, memory_order_relaxed);
        remote_add(s, atomic_load_explicit(&w->remote_bytes, memory_order_relaxed),
                   atomic_load_explicit(&w->cache_hits, memory_order_relaxed),
                   atomic_load_explicit(&w->cache_bytes, memory_order_relaxed),
                   atomic_load_explicit(&w->cache_misses, memory_order_relaxed),
                   atomic_load_explicit(&w->cache_evictions, memory_order_relaxed));
        /* Each worker's mean while it fetched, summed over the workers. */
        uint64_t busy_us = atomic_load_explicit(&w->remote_busy_us, memory_order_relaxed);
        if (busy_us)
            s->remote_in_flight +=
                (double)atomic_load_explicit(&w->remote_in_flight_us, memory_order_relaxed) /
                (double)busy_us;
    }
    s->read_s = r * 1e-9;
    s->decode_s = d * 1e-9;
    s->augment_s = a * 1e-9;
    s->slot_wait_s = wt * 1e-9;
    s->idle_s = id * 1e-9;
    s->consumer_wait_s =
        atomic_load_explicit(&((dsrt_pipeline *)p)->consumer_wait_ns, memory_order_relaxed) * 1e-9;
    s->batches = atomic_load_explicit(&((dsrt_pipeline *)p)->batches, memory_order_relaxed);
    s->bad_samples = atomic_load_explicit(&((dsrt_pipeline *)p)->nbad, memory_order_relaxed);
    s->threads = p->nthreads;
    s->slots = p->nslots;
    s->slot_bytes = p->slot_bytes;
    s->io = p->io;
    s->io_fallback = p->has_fallback ? p->io_fallback : NULL;
    s->pinned_memory = p->mem.cuda;
    s->locked_memory = p->mem.locked;
    s->cpus = dsrt__cpus_list(p->cpus);
    if (p->feed) {
        dsrt_feed_stats fs;
        dsrt__feed_stats(p->feed, &fs);
        s->stream_bytes = fs.bytes;
        s->stream_samples = fs.served;
        s->stream_ranged = fs.ranged;
        s->remote_requests += fs.remote.requests;
        s->remote_retries += fs.remote.retries;
        s->remote_connections += fs.remote.connections;
        remote_add(s, fs.remote.bytes, fs.remote.cache_hits, fs.remote.cache_bytes,
                   fs.remote.cache_misses, fs.remote.cache_evictions);
    }
    unsigned k = atomic_load_explicit(&((dsrt_pipeline *)p)->nbad_msgs, memory_order_acquire);
    for (unsigned i = 0; i < k; i++) s->bad_messages[i] = p->bad_msgs[i];
    s->bad_message_count = k;
}

size_t dsrt_pipeline_bad_samples(const dsrt_pipeline *p, size_t first, dsrt_bad_sample *out,
                                 size_t max) {
    dsrt_pipeline *q = (dsrt_pipeline *)p; /* the list's lock */
    pthread_mutex_lock(&q->bad_mu);
    size_t n = p->nbad_list;
    for (size_t i = first; i < n && i - first < max; i++) out[i - first] = p->bad_list[i];
    pthread_mutex_unlock(&q->bad_mu);
    return n;
}
