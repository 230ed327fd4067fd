/*
 * dsbench DATA: the input pipeline alone, as torch_loader_bench.py runs a
 * PyTorch DataLoader: images/s per epoch and per stage, the median after
 * the warm-up, the bad files, and with --checksum a hash of the batches.
 */
#include "dsbench.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU seconds of the whole process, every thread. */
double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------
// dsbench DATA: the pipeline alone

/* The --checksum hash: FNV-1a over 64-bit words, in 4 interleaved lanes so
 * that it runs at memory speed; the tail bytes and each buffer's length go
 * into the lanes too, and the lanes are folded with byte-wise FNV-1a. */
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME  0x100000001b3ULL

typedef struct {
    uint64_t lane[4];
} checksum;

static void checksum_init(checksum *c) {
    for (int i = 0; i < 4; i++) c->lane[i] = FNV_OFFSET ^ (uint64_t)i;
}

static void checksum_add(checksum *c, const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t l0 = c->lane[0], l1 = c->lane[1], l2 = c->lane[2], l3 = c->lane[3];
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        l0 = (l0 ^ w[0]) * FNV_PRIME;
        l1 = (l1 ^ w[1]) * FNV_PRIME;
        l2 = (l2 ^ w[2]) * FNV_PRIME;
        l3 = (l3 ^ w[3]) * FNV_PRIME;
    }
    for (; i < n; i++) l0 = (l0 ^ p[i]) * FNV_PRIME;
    l1 = (l1 ^ (uint64_t)n) * FNV_PRIME;
    c->lane[0] = l0, c->lane[1] = l1, c->lane[2] = l2, c->lane[3] = l3;
}

static uint64_t checksum_final(const checksum *c) {
    uint64_t h = FNV_OFFSET;
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 8; b++) h = (h ^ ((c->lane[i] >> (8 * b)) & 0xff)) * FNV_PRIME;
    return h;
}

/* A batch's samples (each at its own size in native mode) and labels. */
static void checksum_batch(checksum *c, const dsrt_batch *b) {
    int f32 = b->layout == DSRT_AUGMENT_F32_NCHW;
    int ch = f32 ? b->shape[1] : b->shape[3];
    for (size_t i = 0; i < b->count; i++) {
        size_t bytes = b->sample_bytes;
        if (b->shape[2] == 0)
            bytes = (size_t)b->sizes[2 * i] * (size_t)b->sizes[2 * i + 1] * (size_t)ch *
                    (f32 ? sizeof(float) : 1);
        checksum_add(c, (const char *)b->data + i * b->sample_stride, bytes);
    }
    checksum_add(c, b->labels, b->count * sizeof *b->labels);
}

/* Drops the pages of one file from the page cache. */
static void fadvise_drop(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* --cold with auto: 1 when the whole page cache may be dropped here. */
static int can_drop_caches(void) {
    return access("/proc/sys/vm/drop_caches", W_OK) == 0;
}

/* Drops ds's data from the page cache (--cold): the whole cache, dentries
 * and inodes included, when method says so; else every file of ds (its
 * shards, for a shard set) with posix_fadvise. Returns 0, or -1 when
 * drop_caches was refused (the files were dropped instead). */
static int drop_cache(const dsrt_datastore *ds, int method) {
    if (method == COLD_DROP_CACHES) {
        sync();
        int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
        if (fd >= 0 && write(fd, "3\n", 2) == 2) {
            close(fd);
            return 0;
        }
        if (fd >= 0) close(fd);
    }
    size_t shards = dsrt_datastore_shard_count(ds);
    for (size_t k = 0; k < shards; k++)
        if (!dsrt_path_is_url(dsrt_datastore_shard_path(ds, k)))
            fadvise_drop(dsrt_datastore_shard_path(ds, k));
    size_t n = shards ? 0 : dsrt_datastore_count(ds);
    for (size_t i = 0; i < n; i++) {
        const char *path = dsrt_datastore_path(ds, i);
        if (!path) break;                     /* pixels in memory: nothing to drop */
        if (dsrt_path_is_url(path)) continue; /* an object: not in this machine's cache */
        fadvise_drop(path);
    }
    return method == COLD_DROP_CACHES ? -1 : 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of the epochs after the first (all of them when there is one). */
static double median_rate(const double *rates, unsigned n) {
    unsigned first = n > 1 ? 1 : 0, k = n - first;
    double *v = malloc(k * sizeof *v);
    if (!v) tool_die("out of memory");
    memcpy(v, rates + first, k * sizeof *v);
    qsort(v, k, sizeof *v, cmp_double);
    double m = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
    free(v);
    return m;
}

typedef struct {
    unsigned threads;
    tool_bad_list bad;
    double *rates;     /* (epochs) images/s */
    double *cpu_rates; /* (epochs) images per second of the process's CPU time */
    double cpu_median;
    double median, seconds;
    uint64_t delivered;
    uint64_t hash;
    dsrt_pipeline_statistics st;
    char cpus[256], io_fallback[256];
    size_t shards, shuffle_buffer; /* a shard set: its shards, and how it is read */
    dsrt_shard_order order;
    uint64_t *per_source; /* (nsources) samples delivered from each source of a mix */
    size_t nsources;
} run_result;

static void progress(const options *o, unsigned epoch, size_t done, size_t total, double t0) {
    double dt = now_s() - t0;
    int width = 30, fill = total ? (int)((double)done / total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[width] = '\0';
    fprintf(stderr, "\r  epoch %u/%u [%s] %zu/%zu images %8.1f images/s ", epoch + 1, o->epochs,
            bar, done, total, dt > 0 ? done / dt : 0.0);
}

/* Adds the bad samples of p from the first-th on to l. */
static void collect_bad(const dsrt_pipeline *p, tool_bad_list *l) {
    dsrt_bad_sample b[256];
    for (;;) {
        size_t first = (size_t)l->total;
        size_t total = dsrt_pipeline_bad_samples(p, first, b, 256);
        if (total <= first) break;
        for (size_t i = 0; i < DSRT_MIN_SIZE(total - first, 256); i++) tool_bad_add(l, &b[i]);
    }
}

/* The pipeline failed: name the bad files found so far, then the failure. */
static void die_pipeline(const options *o, const dsrt_pipeline *p, run_result *r) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dsrt_last_error());
    collect_bad(p, &r->bad);
    dsrt_pipeline_statistics st;
    dsrt_pipeline_stats(p, &st);
    tool_bad_print("dsbench", "", &r->bad, st.skipped, 0, o->bad_list);
    tool_die("%s", msg);
}

/* Runs o->epochs epochs with `threads` workers. */
static void run_pipeline_once(const options *o, const dsrt_datastore *ds,
                              const dsrt_augment_options *aug, unsigned threads, run_result *r) {
    dsrt_pipeline_options po = o->po;
    po.threads = threads;
    po.epochs = o->epochs;
    dsrt_pipeline *p;
    memset(r, 0, sizeof *r);
    if (dsrt_pipeline_open(&p, ds, aug, &po) != 0) tool_die("%s", dsrt_last_error());
    uint64_t bpe = dsrt_pipeline_batches_per_epoch(p);
    size_t per_epoch = po.drop_last       ? (size_t)bpe * po.batch
                       : po.epoch_samples ? po.epoch_samples
                                          : dsrt_datastore_count(ds);
    r->nsources = dsrt_datastore_mix_sources(ds);
    if (!(r->per_source = calloc(r->nsources, sizeof *r->per_source))) tool_die("out of memory");
    int bar = !o->json && isatty(2);
    checksum c;
    checksum_init(&c);
    r->bad.out = o->bad_out;
    r->rates = calloc(o->epochs, sizeof *r->rates);
    r->cpu_rates = calloc(o->epochs, sizeof *r->cpu_rates);
    if (!r->rates || !r->cpu_rates) tool_die("out of memory");
    double c0 = cpu_s();
    uint64_t skipped_before = 0;
    double t_run = now_s(), t0 = t_run;
    for (unsigned e = 0; e < o->epochs; e++) {
        if (o->cold) {
            /* Park the workers (a run with nothing left), drop, restart. */
            if (dsrt_pipeline_reset(p, o->epochs, 0) != 0) tool_die("%s", dsrt_last_error());
            if (drop_cache(ds, o->cold_method) != 0)
                tool_die("--cold-method drop-caches: /proc/sys/vm/drop_caches refused (not root?)");
            if (dsrt_pipeline_reset(p, e, 0) != 0) tool_die("%s", dsrt_last_error());
            t0 = now_s();
        }
        size_t images = 0;
        double last_bar = 0;
        for (uint64_t k = 0; k < bpe; k++) {
            dsrt_batch *b;
            if (dsrt_pipeline_next(p, &b) != 0) {
                if (bar) fputc('\n', stderr);
                die_pipeline(o, p, r);
            }
            if (b->epoch != e || b->index != k)
                tool_die("internal error: batch %llu of epoch %llu where %llu of %u was due",
                         (unsigned long long)b->index, (unsigned long long)b->epoch,
                         (unsigned long long)k, e);
            images += b->count;
            for (size_t i = 0; i < b->count; i++) r->per_source[b->sources[i]]++;
            if (o->checksum) checksum_batch(&c, b);
            if (dsrt_batch_release(p, b) != 0) tool_die("%s", dsrt_last_error());
            if (bar && (now_s() - last_bar > 0.1 || k + 1 == bpe)) {
                last_bar = now_s();
                progress(o, e, images, per_epoch, t0);
            }
        }
        double t1 = now_s(), dt = t1 - t0, c1 = cpu_s();
        r->rates[e] = images / dt;
        r->cpu_rates[e] = images / (c1 - c0 > 1e-9 ? c1 - c0 : 1e-9);
        c0 = c1;
        r->delivered += images;
        dsrt_pipeline_stats(p, &r->st);
        uint64_t skipped = r->st.skipped - skipped_before;
        skipped_before = r->st.skipped;
        if (bar) fputs("\r\033[K", stderr);
        if (o->json) {
            char b[2][32];
            printf("{\"threads\":%u,\"epoch\":%u,\"images\":%zu,\"seconds\":%s,"
                   "\"images_per_s\":%s,\"skipped\":%llu,\"warmup\":%s}\n",
                   r->st.threads, e, images, tool_json_number(b[0], "%.6f", dt),
                   tool_json_number(b[1], "%.1f", r->rates[e]), (unsigned long long)skipped,
                   e == 0 && o->epochs > 1 ? "true" : "false");
            fflush(stdout);
        } else if (!o->sweep) {
            if (e == 0)
                printf("%5s  %8s  %9s  %10s  %7s\n", "epoch", "images", "seconds", "images/s",
                       "skipped");
            printf("%5u  %8zu  %9.3f  %10.1f  %7llu%s\n", e, images, dt, r->rates[e],
                   (unsigned long long)skipped, e == 0 && o->epochs > 1 ? "  (warm-up)" : "");
        }
        t0 = t1;
    }
    r->seconds = now_s() - t_run;
    dsrt_pipeline_stats(p, &r->st);
    r->shards = dsrt_datastore_shard_count(ds);
    r->order = dsrt_datastore_shard_order(ds);
    r->shuffle_buffer = dsrt_datastore_shuffle_buffer(ds);
    r->threads = r->st.threads;
    snprintf(r->cpus, sizeof r->cpus, "%s", r->st.cpus ? r->st.cpus : "");
    snprintf(r->io_fallback, sizeof r->io_fallback, "%s",
             r->st.io_fallback ? r->st.io_fallback : "");
    collect_bad(p, &r->bad);
    if (!o->json) tool_bad_print("dsbench", "", &r->bad, r->st.skipped, 0, o->bad_list);
    /* Stats strings point into the pipeline: copied above. */
    r->st.cpus = NULL;
    r->st.io_fallback = NULL;
    for (unsigned i = 0; i < DSRT_PIPELINE_BAD_MESSAGES; i++) r->st.bad_messages[i] = NULL;
    dsrt_pipeline_close(p);
    r->median = median_rate(r->rates, o->epochs);
    r->cpu_median = median_rate(r->cpu_rates, o->epochs);
    r->hash = checksum_final(&c);
}

/* Where the time went, in words. */
static void print_stages(const run_result *r) {
    const dsrt_pipeline_statistics *s = &r->st;
    double n = s->samples ? (double)s->samples : 1.0;
    double work = s->read_s + s->decode_s + s->augment_s;
    printf("per image, summed over %u worker%s (ms): read %.3f  decode %.3f  augment %.3f  "
           "waiting for a slot %.3f\n",
           s->threads, s->threads == 1 ? "" : "s", 1e3 * s->read_s / n, 1e3 * s->decode_s / n,
           1e3 * s->augment_s / n, 1e3 * s->slot_wait_s / n);
    double waited = r->seconds > 0 ? s->consumer_wait_s / r->seconds : 0;
    const char *stage = "decode";
    double top = s->decode_s;
    if (s->augment_s > top) stage = "augment", top = s->augment_s;
    if (s->read_s > top) stage = "read", top = s->read_s;
    if (waited > 0.5)
        printf("the consumer waited %.0f%% of the run: the pipeline is the bottleneck, and "
               "%s its largest stage (%.0f%% of the workers' busy time)\n",
               100 * waited, stage, work > 0 ? 100 * top / work : 0.0);
    else
        printf("the consumer waited %.0f%% of the run; the workers waited %.1f s for free slots: "
               "the consumer is the bottleneck\n",
               100 * waited, s->slot_wait_s);
}

/* The reader in use; "memory" when the samples are pixels held in memory. */
static const char *io_name(const dsrt_pipeline_statistics *s) {
    return s->io == DSRT_IO_AUTO ? "memory" : dsrt_io_name(s->io);
}

/* What every report says about the machine and the limit. */
typedef struct {
    double load[3];  /* load average over 1, 5 and 15 minutes, before the runs */
    const char *isa; /* the augmenters' kernels */
    int have_limit;
    dsrt_decode_limit limit;
} context;

/* Images/s per worker thread, and its share of the limit. */
static double per_thread(const run_result *r) {
    return r->threads ? r->median / r->threads : 0.0;
}

static void json_summary(const options *o, const context *cx, const run_result *r, size_t images) {
    const dsrt_pipeline_statistics *s = &r->st;
    char b[8][32];
    printf("{\"data\":");
    tool_json_string(stdout, o->shown);
    printf(",\"pipeline\":\"%s\",\"layout\":\"%s\",\"dtype\":\"%s\",\"channels\":%d,"
           "\"batch\":%zu,\"prefetch\":%u,\"threads\":%u,\"cpus\":",
           preset_name(o), dsrt_augment_layout_name(layout_of(o)),
           dsrt_augment_layout_dtype(layout_of(o)), o->channels, o->po.batch, o->po.prefetch,
           r->threads);
    tool_json_string(stdout, r->cpus);
    printf(",\"pinned_threads\":%u,\"io\":\"%s\",\"io_fallback\":", s->pinned_threads, io_name(s));
    if (r->io_fallback[0])
        tool_json_string(stdout, r->io_fallback);
    else
        printf("null");
    printf(",\"direct\":%s,\"cold\":%s%s%s,\"epochs\":%u,\"images\":%zu,\"delivered\":%llu,"
           "\"images_per_s\":%s,\"epochs_images_per_s\":[",
           o->po.reader.direct ? "true" : "false", o->cold ? "\"" : "",
           o->cold ? choice_name("cold-method", o->cold_method) : "false", o->cold ? "\"" : "",
           o->epochs, images, (unsigned long long)r->delivered,
           tool_json_number(b[0], "%.1f", r->median));
    for (unsigned e = 0; e < o->epochs; e++)
        printf("%s%s", e ? "," : "", tool_json_number(b[0], "%.1f", r->rates[e]));
    printf("]");
    tool_bad_json(stdout, "", &r->bad, s->skipped);
    printf(",\"read_s\":%s,\"decode_s\":%s,"
           "\"augment_s\":%s,\"slot_wait_s\":%s,\"consumer_wait_s\":%s,\"seconds\":%s,"
           "\"locked_memory\":%s,\"pinned_memory\":%s",
           tool_json_number(b[0], "%.3f", s->read_s), tool_json_number(b[1], "%.3f", s->decode_s),
           tool_json_number(b[2], "%.3f", s->augment_s),
           tool_json_number(b[3], "%.3f", s->slot_wait_s),
           tool_json_number(b[4], "%.3f", s->consumer_wait_s),
           tool_json_number(b[5], "%.3f", r->seconds), s->locked_memory ? "true" : "false",
           s->pinned_memory ? "true" : "false");
    if (o->checksum) printf(",\"checksum\":\"%016llx\"", (unsigned long long)r->hash);
    printf(",\"samples_per_source\":[");
    for (size_t k = 0; k < r->nsources; k++)
        printf("%s%llu", k ? "," : "", (unsigned long long)r->per_source[k]);
    printf("]");
    if (r->shards)
        printf(",\"shards\":%zu,\"order\":\"%s\",\"shuffle_buffer\":%zu,\"stream_bytes\":%llu,"
               "\"stream_samples\":%llu,\"stream_ranged\":%llu",
               r->shards, dsrt_shard_order_name(r->order), r->shuffle_buffer,
               (unsigned long long)s->stream_bytes, (unsigned long long)s->stream_samples,
               (unsigned long long)s->stream_ranged);
    printf(",\"per_thread_images_per_s\":%s,\"images_per_cpu_s\":%s,\"augment_isa\":\"%s\","
           "\"load_average\":[%s,%s,%s]",
           tool_json_number(b[0], "%.1f", per_thread(r)),
           tool_json_number(b[1], "%.1f", r->cpu_median), cx->isa,
           tool_json_number(b[2], "%.2f", cx->load[0]), tool_json_number(b[3], "%.2f", cx->load[1]),
           tool_json_number(b[4], "%.2f", cx->load[2]));
    if (cx->have_limit)
        printf(",\"limit\":{\"images\":%zu,\"skipped\":%zu,\"passes\":%u,\"images_per_s\":%s,"
               "\"megapixels_per_s\":%s,\"cpu_images_per_s\":%s},\"of_limit\":%s,"
               "\"of_limit_cpu\":%s",
               cx->limit.images, cx->limit.skipped, o->limit_passes,
               tool_json_number(b[0], "%.1f", cx->limit.images_per_s),
               tool_json_number(b[1], "%.1f", cx->limit.megapixels_per_s),
               tool_json_number(b[2], "%.1f", cx->limit.cpu_images_per_s),
               tool_json_number(b[3], "%.4f", per_thread(r) / cx->limit.images_per_s),
               tool_json_number(b[4], "%.4f", r->cpu_median / cx->limit.cpu_images_per_s));
    printf(",\"bytes_per_s\":%s",
           tool_json_number(b[0], "%.0f", r->seconds > 0 ? s->bytes_read / r->seconds : 0.0));
    if (s->remote_requests)
        printf(",\"remote\":{\"requests\":%llu,\"retries\":%llu,\"connections\":%llu,"
               "\"in_flight\":%s}",
               (unsigned long long)s->remote_requests, (unsigned long long)s->remote_retries,
               (unsigned long long)s->remote_connections,
               tool_json_number(b[0], "%.1f", s->remote_in_flight));
    if (s->cache_hits || s->cache_misses)
        printf(",\"cache\":{\"hits\":%llu,\"misses\":%llu,\"bytes_from_cache\":%llu,"
               "\"bytes_from_store\":%llu,\"requests_to_store\":%llu,\"evictions\":%llu}",
               (unsigned long long)s->cache_hits, (unsigned long long)s->cache_misses,
               (unsigned long long)s->cache_bytes, (unsigned long long)s->remote_bytes,
               (unsigned long long)s->remote_requests, (unsigned long long)s->cache_evictions);
    printf("}\n");
    fflush(stdout);
}

/* Thread counts for --sweep: the --threads list, or 1, 2, 4, ... and the cores. */
static unsigned sweep_counts(const options *o, const dsrt_datastore *ds, unsigned *counts,
                             unsigned max) {
    unsigned n = 0;
    if (o->threads_list) {
        char *copy = strdup(o->threads_list);
        if (!copy) tool_die("out of memory");
        for (char *tok = strtok(copy, ","); tok && n < max; tok = strtok(NULL, ","))
            counts[n++] = (unsigned)tool_int("--threads", tok, 1, 1024);
        free(copy);
        return n;
    }
    /* The cores the pipeline would use: ask it, with a tiny one. */
    dsrt_pipeline_options po = o->po;
    po.threads = 0;
    po.batch = 1;
    po.prefetch = 1;
    po.epochs = 1;
    dsrt_pipeline *p;
    if (dsrt_pipeline_open(&p, ds, NULL, &po) != 0) tool_die("%s", dsrt_last_error());
    dsrt_pipeline_statistics s;
    dsrt_pipeline_stats(p, &s);
    dsrt_pipeline_close(p);
    for (unsigned t = 1; t < s.threads && n < max; t *= 2) counts[n++] = t;
    if (n < max) counts[n++] = s.threads;
    return n;
}

/* The augment options of the --pipeline kind. */
static dsrt_augment_options pipeline_augment(const options *o) {
    dsrt_augment_options aug;
    /* none: native, float CHW in [0, 1], nothing else (the defaults). */
    if (dsrt_augment_preset_from_name(o->kind == PIPE_NONE ? "default" : preset_name(o), &aug))
        tool_die("%s", dsrt_last_error());
    aug.output_channels = o->channels;
    aug.decode_dc = !o->no_decode_dc;
    if (o->nhwc) {
        aug.layout = DSRT_AUGMENT_U8_NHWC;
        aug.norm = DSRT_AUGMENT_NORM_NONE;
    }
    return aug;
}

/* What every run shares: the load before it, the augment kernels, the
 * decode limit when asked (printed here). */
static void context_make(const options *o, const dsrt_datastore *ds, context *cx) {
    memset(cx, 0, sizeof *cx);
    if (getloadavg(cx->load, 3) != 3) cx->load[0] = cx->load[1] = cx->load[2] = -1;
    dsrt_augmenter *probe;
    if (dsrt_augmenter_create(&probe) != 0) tool_die("%s", dsrt_last_error());
    cx->isa = dsrt_augmenter_isa(probe); /* a static string */
    dsrt_augmenter_destroy(probe);
    if (o->limit) {
        if (dsrt_datastore_decode_limit(ds, o->limit_images, o->limit_passes, &cx->limit) != 0)
            tool_die("--limit: %s", dsrt_last_error());
        cx->have_limit = 1;
        if (!o->json)
            printf("limit: one core decodes %zu of these files at %.1f images/s (%.1f MP/s; "
                   "%.1f a second of its CPU time): full size to RGB, TurboJPEG fast DCT, files "
                   "in memory, nothing else (best of %u passes)\n",
                   cx->limit.images, cx->limit.images_per_s, cx->limit.megapixels_per_s,
                   cx->limit.cpu_images_per_s, o->limit_passes);
    }
}

/* The lines before a run's figures: the data and the pipeline, the shards
 * and the cold cache. */
static void print_head(const options *o, const run_result *r, size_t images, unsigned i) {
    const dsrt_pipeline_statistics *s = &r->st;
    if (!o->sweep || i == 0) {
        if (o->sweep)
            printf("%s: %zu images\n", o->shown, images);
        else
            printf("%s: %zu images, pipeline %s (%s %s, %d channel%s), batch %zu, %u thread%s "
                   "on CPUs %s (%u pinned), io %s%s%s%s, %u slots of %.1f MB (%s)\n",
                   o->shown, images, preset_name(o), dsrt_augment_layout_dtype(layout_of(o)),
                   o->nhwc ? "NHWC" : "NCHW", o->channels, o->channels == 1 ? "" : "s", o->po.batch,
                   r->threads, r->threads == 1 ? "" : "s", r->cpus, s->pinned_threads, io_name(s),
                   r->io_fallback[0] ? " (" : "", r->io_fallback, r->io_fallback[0] ? ")" : "",
                   s->slots, s->slot_bytes / 1e6,
                   s->pinned_memory   ? "pinned for CUDA (cudaHostRegister)"
                   : s->locked_memory ? "locked"
                                      : "not locked");
    }
    if (!o->sweep && (r->shards || o->cold)) {
        if (r->shards) printf("%zu shards, %s order", r->shards, dsrt_shard_order_name(r->order));
        if (r->shards && r->order == DSRT_SHARD_ORDER_SHARD)
            printf(" (shuffle buffer %zu; the stream read %.1f MB, handed over %llu samples, "
                   "%llu read by offset)",
                   r->shuffle_buffer, s->stream_bytes / 1e6, (unsigned long long)s->stream_samples,
                   (unsigned long long)s->stream_ranged);
        if (o->cold)
            printf("%spage cache dropped before each epoch (%s)", r->shards ? "; " : "",
                   o->cold_method == COLD_DROP_CACHES ? "the whole cache: /proc/sys/vm/drop_caches"
                                                      : "posix_fadvise DONTNEED on each file");
        printf("\n");
    }
}

/* A run's figures. */
static void print_result(const options *o, const context *cx, const run_result *r) {
    const dsrt_pipeline_statistics *s = &r->st;
    printf("median %.1f images/s%s; %.1f per thread", r->median,
           o->epochs > 1 ? " over the epochs after the warm-up" : "", per_thread(r));
    if (cx->have_limit)
        printf(", %.0f%% of the limit", 100.0 * per_thread(r) / cx->limit.images_per_s);
    printf(" (load average %.2f before the run; augment kernels %s)\n", cx->load[0], cx->isa);
    printf("in CPU time: %.1f images per second of the process's CPU", r->cpu_median);
    if (cx->have_limit)
        printf(", %.0f%% of the limit's %.1f (figures that other load on the machine "
               "does not move)",
               100.0 * r->cpu_median / cx->limit.cpu_images_per_s, cx->limit.cpu_images_per_s);
    printf("\n");
    print_stages(r);
    printf("read %.1f MB/s", r->seconds > 0 ? s->bytes_read / r->seconds / 1e6 : 0.0);
    if (s->remote_requests)
        printf(" from the store: %llu requests (%llu retried), %llu connections, %.1f "
               "in flight on average",
               (unsigned long long)s->remote_requests, (unsigned long long)s->remote_retries,
               (unsigned long long)s->remote_connections, s->remote_in_flight);
    printf("\n");
    if (r->nsources > 1) {
        uint64_t all = 0;
        for (size_t k = 0; k < r->nsources; k++) all += r->per_source[k];
        printf("samples per source:");
        for (size_t k = 0; k < r->nsources; k++)
            printf(" %zu: %llu (%.1f%%)", k, (unsigned long long)r->per_source[k],
                   all ? 100.0 * r->per_source[k] / all : 0.0);
        printf("\n");
    }
    if (s->cache_hits || s->cache_misses)
        printf("cache: %llu hits (%.1f MB), %llu misses (%.1f MB from the store), %llu "
               "evictions\n",
               (unsigned long long)s->cache_hits, s->cache_bytes / 1e6,
               (unsigned long long)s->cache_misses, s->remote_bytes / 1e6,
               (unsigned long long)s->cache_evictions);
    if (o->checksum) printf("checksum %016llx\n", (unsigned long long)r->hash);
}

/* A line of the --sweep table (the head before the first); the speedup is
 * against the first run's rate a thread. */
static void print_sweep_row(const options *o, const context *cx, const run_result *r, unsigned i,
                            double first_median, unsigned first_threads) {
    const dsrt_pipeline_statistics *s = &r->st;
    if (i == 0)
        printf("%7s  %10s  %8s  %10s  %8s  %8s  %8s%s%s\n", "threads", "images/s", "speedup",
               "efficiency", "read ms", "decode", "augment", cx->have_limit ? "  of limit" : "",
               o->checksum ? "  checksum" : "");
    double n = s->samples ? (double)s->samples : 1.0;
    double sp = r->median / first_median * first_threads;
    printf("%7u  %10.1f  %7.2fx  %9.0f%%  %8.3f  %8.3f  %8.3f", r->threads, r->median, sp,
           100.0 * sp / r->threads, 1e3 * s->read_s / n, 1e3 * s->decode_s / n,
           1e3 * s->augment_s / n);
    if (cx->have_limit) printf("  %7.0f%%", 100.0 * per_thread(r) / cx->limit.images_per_s);
    if (o->checksum) printf("  %016llx", (unsigned long long)r->hash);
    printf("\n");
    fflush(stdout);
}

int run_pipeline(options *o) {
    dsrt_datastore *ds;
    if (o->cold && o->cold_method == COLD_AUTO)
        o->cold_method = can_drop_caches() ? COLD_DROP_CACHES : COLD_FADVISE;
    if (open_data(o, &ds) != 0) tool_die("%s", dsrt_last_error());
    print_warnings(ds);
    dsrt_augment_options aug = pipeline_augment(o);
    o->po.native = o->kind == PIPE_NONE;
    if (!o->batch_given) o->po.batch = o->kind == PIPE_NONE ? 1 : 128;
    size_t images = o->po.epoch_samples ? o->po.epoch_samples : dsrt_datastore_count(ds);

    context cx;
    context_make(o, ds, &cx);

    unsigned counts[64], ncounts = 1;
    counts[0] = o->po.threads;
    if (o->sweep) ncounts = sweep_counts(o, ds, counts, 64);
    run_result *res = calloc(ncounts, sizeof *res);
    if (!res) tool_die("out of memory");
    FILE *bad_out = o->bad_out; /* the first run writes the list */
    for (unsigned i = 0; i < ncounts; i++) {
        run_result *r = &res[i];
        run_pipeline_once(o, ds, &aug, counts[i], r);
        o->bad_out = NULL;
        if (o->json) {
            json_summary(o, &cx, r, images);
            continue;
        }
        print_head(o, r, images, i);
        if (!o->sweep)
            print_result(o, &cx, r);
        else
            print_sweep_row(o, &cx, r, i, res[0].median, counts[0]);
    }
    if (o->json && o->sweep) {
        printf("{\"sweep\":[");
        for (unsigned i = 0; i < ncounts; i++) {
            char b[32];
            printf("%s{\"threads\":%u,\"images_per_s\":%s", i ? "," : "", res[i].threads,
                   tool_json_number(b, "%.1f", res[i].median));
            if (cx.have_limit)
                printf(",\"of_limit\":%s",
                       tool_json_number(b, "%.4f", per_thread(&res[i]) / cx.limit.images_per_s));
            printf("}");
        }
        printf("]}\n");
    }
    o->bad_out = bad_out;
    for (unsigned i = 0; i < ncounts; i++) {
        free(res[i].rates);
        free(res[i].cpu_rates);
        free(res[i].per_source);
        tool_bad_free(&res[i].bad);
    }
    free(res);
    dsrt_datastore_close(ds);
    return 0;
}
