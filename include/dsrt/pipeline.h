/*
 * dsrt pipeline: batches of augmented samples made in the background.
 *
 * A pipeline owns a fixed pool of batch slots in pinned host memory and a
 * team of worker threads, pinned to cores with hwloc. Each worker has its own
 * file reader (io_uring, several files in flight), JPEG/PNG decoder and
 * augmenter; it reads, decodes and augments each sample straight into its
 * place in the slot of the batch that carries it. While the consumer works on
 * batch k, batches k+1 ... k+prefetch are being made. Batches come out in
 * order, epoch after epoch, and are bit-identical whatever the number of
 * threads, the io back-end or the timing: every random choice is keyed by
 * (seed, epoch, sample id).
 *
 *   dsrt_pipeline *p;
 *   dsrt_pipeline_options po = dsrt_pipeline_defaults();
 *   dsrt_augment_options ao;
 *   dsrt_augment_preset_227(&ao);
 *   if (dsrt_pipeline_open(&p, ds, &ao, &po) != 0) ... dsrt_last_error() ...
 *   dsrt_batch *b;
 *   while (dsrt_pipeline_next(p, &b) == 0) {
 *       consume(b->data, b->labels, b->count);
 *       dsrt_batch_release(p, b);
 *   }
 *   dsrt_pipeline_close(p);
 *
 * Bad samples. A sample that cannot be read or decoded is skipped, counted
 * and named (dsrt_pipeline_stats, dsrt_pipeline_bad_samples), and its place
 * is taken by the next sample of the epoch's order that succeeds (position
 * p + 1, p + 2, ..., wrapping around), so batches are never short, and the
 * replacement is the same on every run. Samples found bad are remembered and
 * not read again in later epochs. With drop_bad set the place is left out
 * instead (the batch is shorter): each readable sample comes exactly once an
 * epoch, as evaluation wants. With fail_on_error set, the first bad sample
 * fails the run instead.
 *
 * Failures that are not the file's (too many open files, the kernel short
 * of memory, a read refused for now or interrupted) never make a sample
 * bad: the read is tried again after a pause that doubles (from 1 ms, for a
 * few seconds in all), then the run fails with that reason.
 *
 * Memory does not grow with the dataset: the slots and the reads in flight
 * are fixed when the pipeline opens, and each read buffer grows only to the
 * largest file it held (up to max_file_bytes). The epoch orders (4 bytes a
 * sample, a few epochs' worth) follow the dataset's size, and so does the
 * list of bad samples (a few dozen bytes for each one found).
 *
 * Threads. dsrt_pipeline_next(_timed), dsrt_batch_release and dsrt_pipeline_stats are
 * thread-safe: several threads may take batches (each gets a different one)
 * and release them (for example from a GPU stream callback). dsrt_pipeline_open,
 * dsrt_pipeline_reset and dsrt_pipeline_close belong to one thread and must not
 * run while any other call on the same pipeline does. The datastore must stay
 * open until the pipeline is closed.
 */
#ifndef DSRT_PIPELINE_H
#define DSRT_PIPELINE_H

#include <dsrt/augment.h>
#include <dsrt/datastore.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Options

/* Sample order per epoch (PyTorch DataLoader's shuffle, MATLAB
 * trainingOptions 'Shuffle'). */
typedef enum {
    DSRT_SHUFFLE_NEVER = 0,   /* the datastore's order, every epoch */
    DSRT_SHUFFLE_ONCE,        /* one random order, kept for every epoch */
    DSRT_SHUFFLE_EVERY_EPOCH, /* a new random order each epoch */
} dsrt_shuffle;

/* The shuffle's names ("never", "once", "every-epoch"), one table for the
 * tools and Python: the name of s, "unknown" for no shuffle; and s by name,
 * 0 or DSRT_EOPTION naming the valid ones. */
DSRT_API const char *dsrt_shuffle_name(dsrt_shuffle s);
DSRT_API int dsrt_shuffle_from_name(const char *name, dsrt_shuffle *s);

typedef struct {
    size_t batch;      /* samples a batch; default 128 */
    unsigned prefetch; /* batches made ahead of the one the consumer holds: the
                          pool has prefetch + 1 slots. 1 to 1024; default 4 */
    /* Worker threads. 0 (default): one per core of the chosen cores. More
     * workers than cores share them round-robin. At most 1024. */
    unsigned threads;
    /* The cores to run on, as OS CPU numbers in list form ("0-3,8", as
     * taskset -c takes them), or NULL (default): the cores near the GPU when
     * dsrt is built with CUDA and one is present, else every core this
     * process may run on. Workers get one core each (all its hardware
     * threads that are in the list). */
    const char *cpus;
    int pin;              /* 1 (default): bind each worker to its core; 0: let the OS place them */
    int drop_last;        /* 1: drop each epoch's last, partial batch; 0 (default): keep it short */
    dsrt_shuffle shuffle; /* default DSRT_SHUFFLE_EVERY_EPOCH */
    uint64_t seed;        /* keys the shuffles and every random augmentation; default 0 */
    uint64_t epochs;      /* epochs to deliver; 0 (default): endless */
    /* Each worker's reader: io back-end, reads in flight per worker (each
     * with its own buffer; at most chunk of them), O_DIRECT. Default
     * dsrt_reader_defaults(). */
    dsrt_reader_options reader;
    dsrt_decoder_options decoder; /* default dsrt_decoder_defaults() */
    /* 1: the first sample that cannot be read or decoded fails the run:
     * dsrt_pipeline_next returns its code and dsrt_last_error() names the
     * file. 0 (default): skip it and fill its place (see above). */
    int fail_on_error;
    /* 1: a bad sample's place is left out and its batch delivered shorter
     * (count falls; a batch may even be empty): every readable sample once
     * an epoch, none twice. 0 (default): the place is filled by the next
     * sample of the order (see above). */
    int drop_bad;
    /* Give up with DSRT_ESKIPPED when this many positions in a row of an
     * epoch's order fail while filling one place. Default 1000. */
    unsigned max_consecutive_bad;
    /* Largest file read, in bytes; larger ones are bad samples
     * (DSRT_ETOOBIG). Read buffers start at 256 KiB of address space and
     * grow to the largest file they hold, up to this; only the pages a file
     * touches cost memory. Default 64 MiB. */
    size_t max_file_bytes;
    /* Samples a work item: a worker claims this many places of a batch at a
     * time and keeps up to reader.depth of their reads in flight. 0
     * (default): 16, or less when the prefetched batches would not give
     * every worker a chunk (batch * prefetch / threads), or the batch when
     * smaller. */
    size_t chunk;
    /*
     * 1: native size. Samples are not augmented: each is decoded at its own
     * size and written with the augment options' channels, layout and
     * normalisation only (torchvision's bare ToTensor with the defaults);
     * every other augment option is ignored. Each place of a slot holds up to
     * native_max_pixels pixels, and each batch says each sample's size
     * (dsrt_batch sizes); larger images are bad samples (DSRT_ETOOBIG).
     * Slots are batch places of that size: keep the batch small (dsbench's
     * decode-only mode uses 1). 0 (default): every sample is augmented to
     * the output size.
     */
    int native;
    uint64_t native_max_pixels; /* default 2097152 (2 Mpx: 24 MiB a place as float RGB) */
    /* CUDA device the batches go to (>= 0): the workers run on the cores
     * near it and the slots are registered with CUDA for asynchronous
     * copies (the CUDA runtime is loaded then, through dsrt's CUDA host
     * module). -1 (default): no device, and no CUDA library is loaded; the
     * slots are mlock'ed. Without CUDA, or without that device, the slots
     * are mlock'ed as for -1. */
    int gpu;
    /*
     * Data-parallel sharing: parts pipelines (one a worker process) with the
     * same options and data each deliver part (0 to parts - 1) of every
     * batch: places [count * part / parts, count * (part + 1) / parts) of
     * the batch of `batch` samples a single pipeline would make, so the
     * union of the parts is that batch, sample for sample. Every part walks
     * the same epoch orders; batches_per_epoch and positions (reset) are
     * those of the whole batches. A part may be empty (count 0) when a batch
     * has fewer samples than parts. Default 1 and 0 (parts 0 counts as 1):
     * the whole batch.
     */
    unsigned parts, part;
    /*
     * Batch mixing, as timm's Mixup does it in mode 'batch' (torchvision's
     * and timm's ImageNet recipes): once a batch is assembled, sample i of
     * it is mixed with sample count - 1 - i (the batch reversed; with an odd
     * count the middle sample is its own partner and stays as it is), all
     * with one lambda. The batch is mixed with probability mix_prob; then,
     * with both alphas set, cutmix with probability mix_switch_prob, else
     * mixup. Mixup: image = lambda * own + (1 - lambda) * partner, lambda ~
     * Beta(mixup_alpha, mixup_alpha). Cutmix: lambda ~ Beta(cutmix_alpha,
     * cutmix_alpha) sizes a box of sides sqrt(1 - lambda) of the image's
     * (int(H * r), int(W * r)) centred at a uniform pixel and clipped, or,
     * with cutmix_minmax, sides drawn uniformly in [int(H * min), int(H *
     * max)) (and W) placed uniformly inside; the box takes the partner's
     * pixels, and lambda becomes 1 - box area / image area, as timm's
     * correct_lam. The draws come from dsrt's counter-based generator keyed
     * by (seed, epoch, batch index), so a batch is bit-identical whatever
     * the threads and after a resume. With parts, each part mixes its own
     * share (as timm does each process's batch), with the same draws.
     *
     * Soft labels (dsrt_batch soft_labels) are made when mixing is on or
     * label_smoothing > 0: row i is lambda * onehot(label_i) + (1 - lambda)
     * * onehot(label_partner), each one-hot smoothed to 1 - e + e / classes
     * on the label and e / classes elsewhere (timm's mixup_target), so every
     * row sums to 1. Mixing needs float NCHW batches of the output size
     * (not uint8, not native) and no drop_bad; open refuses the rest.
     */
    double mixup_alpha;      /* > 0: mixup; 0 (default): none */
    double cutmix_alpha;     /* > 0: cutmix; 0 (default): none (1 with cutmix_minmax, as timm) */
    double cutmix_minmax[2]; /* 0 < min < max <= 1: box sides' range; {0, 0} (default): unused */
    double mix_prob;         /* probability that a batch is mixed, in [0, 1]; default 1 */
    double mix_switch_prob;  /* with both alphas: probability of cutmix, in [0, 1]; default 0.5 */
    double label_smoothing;  /* e in [0, 1); default 0 */
    size_t classes;          /* soft labels' width: 0 (default): dsrt_datastore_num_classes */
    /*
     * With parts > 1: 1 fills the last batch of each epoch (when it is
     * short, without drop_last) up to a multiple of parts with the samples
     * at the start of the epoch's order, as PyTorch's DistributedSampler
     * pads, so every part of every batch holds the same count (the epoch
     * then delivers a few samples twice). 0 (default): the parts of the last
     * batch differ by at most one, and one may be empty. Not with a source
     * that streams shards (the shard order).
     */
    int pad_last;
    /*
     * Sampling instead of walking the datastore once an epoch. Over a mix
     * (dsrt_datastore_mix) the epoch draws from its sources in proportion
     * to their weights. sample_weights draws each sample with replacement
     * in proportion to a weight of its own, as PyTorch's
     * WeightedRandomSampler does: NULL (default): none; "class-balanced":
     * each sample weighs 1 / (samples of its class), so every class comes
     * equally often; otherwise the path of a weights file, one weight a line
     * (a decimal number >= 0), as many lines as the datastore (or view) has
     * samples, in its order; blank lines and lines that start with '#' are
     * skipped. sample_weight_values, when sample_weights is NULL, gives the
     * weights themselves (dsrt_datastore_count of them, copied at open).
     * Not with a mix (its weights choose the samples). The draws are keyed
     * by (seed, epoch) (shuffle once: by seed alone, the same every epoch;
     * shuffle never is refused: draws are random), so batches are the same
     * whatever the threads, parts and resumes; a sample drawn twice in an
     * epoch is augmented differently each time. epoch_samples is the
     * samples of an epoch when sampling: 0 (default): the datastore's count
     * (for a mix, the samples of every source).
     */
    const char *sample_weights;
    const double *sample_weight_values;
    size_t epoch_samples;
} dsrt_pipeline_options;

/* The defaults described above. */
DSRT_API dsrt_pipeline_options dsrt_pipeline_defaults(void);

// ----------------------------------------------------------------------------
// Batches

typedef struct {
    /* The samples, sample i at (char *)data + i * sample_stride:
     * float NCHW: (count, channels, height, width); uint8 NHWC:
     * (count, height, width, channels). In native mode sample i is
     * (channels, sizes[2i], sizes[2i+1]) (or HWC), packed at the start of its
     * place. The memory is pinned (page-locked) when the stats say so. */
    void *data;
    int32_t *labels;      /* (count) class index of each sample */
    uint32_t *ids;        /* (count) dsrt_datastore_id of the sample that filled each place */
    int32_t *sources;     /* (count) the mix source of each sample (dsrt_datastore_mix_source);
                             0 when the datastore is not a mix */
    int32_t *sizes;       /* (count, 2) height, width of each sample */
    size_t count;         /* samples in this batch: batch, or fewer in the last of an epoch
                             (with parts: this part's share) */
    size_t capacity;      /* places of a slot: the batch option (with parts: the largest part) */
    size_t sample_stride; /* bytes from one sample's start to the next */
    size_t sample_bytes;  /* bytes of one sample at the output size (native: the largest) */
    int shape[4];         /* (count, C, H, W) for float NCHW; (count, H, W, C) for uint8 NHWC;
                             native mode: H and W are 0 (see sizes) */
    dsrt_augment_layout layout;
    uint64_t epoch;  /* from 0 */
    uint64_t index;  /* batch in its epoch, from 0 */
    uint64_t global; /* epoch * batches_per_epoch + index: the same on a resumed run */
    /* With parts: the samples of the whole batch over every part, and the
     * place in it of this part's first sample (count and 0 without parts;
     * before drop_bad leaves any out). */
    size_t global_count, part_offset;
    /* Soft labels (see mixing in the options): (count, classes) floats, each
     * row summing to 1; NULL when neither mixing nor label smoothing is on.
     * labels stay each place's own class. */
    float *soft_labels;
    size_t classes;    /* row length of soft_labels; 0 without them */
    double mix_lambda; /* weight of each sample's own image and label: 1 when not mixed */
    int mix_cutmix;    /* 1: cutmix (the box), 0: mixup or not mixed */
    int mix_box[4];    /* cutmix box: rows [box[0], box[1]), columns [box[2], box[3]) */
} dsrt_batch;

// ----------------------------------------------------------------------------
// Opening, taking batches, closing

typedef struct dsrt_pipeline dsrt_pipeline;

/*
 * Opens a pipeline over ds that delivers batches of samples augmented as
 * augment says (NULL: dsrt_augment_defaults()), shaped by o (NULL: the
 * defaults), starting at epoch 0, batch 0. Every option is checked before
 * any thread starts: a bad one fails with DSRT_EOPTION and dsrt_last_error()
 * names it. The options are copied (cpus included); ds is not: it must stay
 * open until dsrt_pipeline_close. On failure *p is NULL.
 */
DSRT_API int dsrt_pipeline_open(dsrt_pipeline **p, const dsrt_datastore *ds,
                                const dsrt_augment_options *augment,
                                const dsrt_pipeline_options *o);

/*
 * Lends the next batch, in order, waiting for it if it is not ready yet.
 * The batch stays valid until dsrt_batch_release (or the next reset or the
 * close). Several batches may be held at once, up to the number of slots;
 * asking for one more than that fails with -EDEADLK. Returns 0, DSRT_EEOF
 * after the last batch of the last epoch, or the code of the failure that
 * stopped the run (with fail_on_error: the bad sample's code, and
 * dsrt_last_error() says "pipeline: PATH: reason"; DSRT_ESKIPPED; -ENOMEM).
 * A failure stays until dsrt_pipeline_reset.
 */
DSRT_API int dsrt_pipeline_next(dsrt_pipeline *p, dsrt_batch **b);

/*
 * dsrt_pipeline_next waiting at most timeout_ms milliseconds (0: not at all,
 * negative: for ever): -ETIMEDOUT when the next batch is not ready by then,
 * and nothing changes, so the call can simply be made again. For a caller
 * that must look up between waits (a language runtime checking for Ctrl-C, an
 * event loop). Otherwise as dsrt_pipeline_next, thread-safe like it.
 */
DSRT_API int dsrt_pipeline_next_timed(dsrt_pipeline *p, dsrt_batch **b, int timeout_ms);

/* Gives a lent batch's slot back to the workers. Returns 0, or DSRT_EOPTION
 * when b is not a batch of p lent out now. */
DSRT_API int dsrt_batch_release(dsrt_pipeline *p, dsrt_batch *b);

/*
 * Restarts the pipeline at batch batch_in_epoch of epoch epoch, as a
 * training run resuming from a checkpoint does: the batches delivered from
 * there are the same as those of an uninterrupted run. Work in progress is
 * abandoned and every lent batch is taken back: batches lent before the reset
 * must be neither used nor released after it. Clears a failure. Returns 0,
 * or DSRT_EOPTION when the position is past the end.
 */
DSRT_API int dsrt_pipeline_reset(dsrt_pipeline *p, uint64_t epoch, uint64_t batch_in_epoch);

/*
 * dsrt_pipeline_reset to a position of a run that had from_parts parts
 * (data-parallel workers; 0 or this pipeline's parts: the same run, as
 * dsrt_pipeline_reset): a job stopped on W workers resumed on W' (more or
 * fewer). Every batch is the batch the earlier run would have made, its
 * places striped over this run's parts, so over the interrupted and the
 * resumed run each sample of the epoch comes exactly once. The datastore's
 * shuffled order does not depend on the parts, so that holds by itself; the
 * shard order gives each part whole shards, so the rest of the interrupted
 * epoch follows the order the from_parts parts made (its samples read each
 * by offset, as the exact order reads them) and the epochs after it stream
 * whole shards to this run's parts. DSRT_EOPTION for from_parts out of range.
 */
DSRT_API int dsrt_pipeline_resume(dsrt_pipeline *p, uint64_t epoch, uint64_t batch_in_epoch,
                                  unsigned from_parts);

/* Batches in each epoch: ceil(count / batch), or floor with drop_last;
 * count is epoch_samples when sampling (see the options). */
DSRT_API uint64_t dsrt_pipeline_batches_per_epoch(const dsrt_pipeline *p);

/* Stops the workers (mid-epoch is fine), waits for them and frees
 * everything, the slots included. NULL is accepted. */
DSRT_API void dsrt_pipeline_close(dsrt_pipeline *p);

/*
 * Host memory as the pipeline's slots are made: page-locked (mmap, then
 * registered with CUDA for device gpu >= 0 when the CUDA runtime and the
 * device are there, else mlock where the limits allow; -1: no device), so a
 * GPU can copy from it asynchronously.
 * Zeroed, page-aligned. NULL (with the message) when out of memory.
 * dsrt_pinned_free accepts NULL.
 */
DSRT_API void *dsrt_pinned_alloc(size_t bytes, int gpu);
DSRT_API void dsrt_pinned_free(void *p);

// ----------------------------------------------------------------------------
// Statistics

/* Bad-sample messages kept: "PATH: read: reason" or "PATH: decode: reason". */
#define DSRT_PIPELINE_BAD_MESSAGES 8

typedef struct {
    /* Seconds summed over the workers since the pipeline opened. */
    double read_s;      /* opening files and waiting for reads */
    double decode_s;    /* header and pixel decoding */
    double augment_s;   /* augmentation, writing into the slot */
    double slot_wait_s; /* waiting for a free slot: the consumer is the bottleneck */
    double idle_s;      /* waiting for work at the end of the last epoch or after a failure */
    /* Seconds the consumer spent in dsrt_pipeline_next waiting for a batch:
     * the pipeline is the bottleneck. */
    double consumer_wait_s;
    uint64_t samples; /* places filled */
    uint64_t batches; /* batches delivered */
    uint64_t skipped; /* times a bad sample was passed over (a bad sample met again counts again) */
    uint64_t bad_samples;    /* distinct samples found bad */
    uint64_t bytes_read;     /* bytes of files read */
    uint64_t direct_refused; /* files read through the page cache although O_DIRECT was asked */
    unsigned threads;        /* workers */
    unsigned pinned_threads; /* workers bound to their core */
    unsigned slots;
    size_t slot_bytes; /* bytes of each slot's samples */
    dsrt_io io; /* the back-end in use: DSRT_IO_URING or DSRT_IO_PREAD (AUTO: pixels in memory) */
    const char *io_fallback; /* why not io_uring, or NULL */
    int pinned_memory;       /* slots registered with CUDA (page-locked, for async copies) */
    int locked_memory;       /* slots locked in memory (registered with CUDA, or mlock) */
    const char *cpus;        /* the cores in use, list form ("0-15") */
    /* Objects in a store: requests finished, attempts repeated after a
     * throttle, error, reset or stall, connections opened (the other
     * requests reused one), and requests in flight at once over all
     * workers, on average while they fetched. */
    uint64_t remote_requests, remote_retries, remote_connections;
    double remote_in_flight;
    /* Bytes received from the store; with a cache (reader.remote.cache_dir):
     * requests answered from it and their bytes, requests that went to the
     * store for want of an entry, entries removed to make room. */
    uint64_t remote_bytes;
    uint64_t cache_hits, cache_bytes, cache_misses, cache_evictions;
    /* A shard set read in the shard order: bytes the stream read, samples it
     * handed over, and samples read by offset instead (after a resume, the
     * replacements of bad samples, the few another part lends). */
    uint64_t stream_bytes, stream_samples, stream_ranged;
    /* The first DSRT_PIPELINE_BAD_MESSAGES bad samples found, then only
     * counted in bad_samples. */
    const char *bad_messages[DSRT_PIPELINE_BAD_MESSAGES];
    unsigned bad_message_count;
} dsrt_pipeline_statistics;

/* Fills *s. Strings point into the pipeline and live as long as it. */
DSRT_API void dsrt_pipeline_stats(const dsrt_pipeline *p, dsrt_pipeline_statistics *s);

/* A sample found bad. */
typedef struct {
    uint32_t id;      /* dsrt_datastore_id */
    const char *path; /* the file, or NULL for a sample held in memory */
    int code;         /* why: DSRT_EEMPTY, DSRT_ECORRUPT, -ENOENT, ... */
    /* What was wrong, without the path: "read: empty file", "decode:
     * Premature end of JPEG file" (past the first 4 MiB of such text, only
     * dsrt_strerror(code)). */
    const char *error;
} dsrt_bad_sample;

/*
 * Copies the bad samples found so far, from the first-th in the order they
 * were found, at most max of them, into out, and returns how many were
 * found in all. Strings live as long as the pipeline (paths as long as the
 * datastore). Thread-safe.
 */
DSRT_API size_t dsrt_pipeline_bad_samples(const dsrt_pipeline *p, size_t first,
                                          dsrt_bad_sample *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
