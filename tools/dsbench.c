/*
 * dsbench: profiles dsrt's input side on a dataset.
 *
 *   dsbench FOLDER --index [--json]      scan the dataset and report classes and counts
 *   dsbench convert SRC OUT              write an IDX or CIFAR source as an image folder
 *   dsbench convert SRC OUT --shards SIZE  write any source as tar shards
 *   dsbench FOLDER [--pipeline 227|32|imagenet|imagenet-val|none] [--threads N] ...
 *                                        run the input pipeline alone and report images/s,
 *                                        per epoch and per stage
 *
 * The pipeline mode does the work of torch_loader_bench.py (a PyTorch
 * DataLoader over an ImageFolder) with dsrt: 227, 32, imagenet and
 * imagenet-val are the augment presets of those names, none decodes each image at its own size into
 * float CHW in [0, 1] (the pipeline's native mode, one image a batch, as the
 * PyTorch script does). The consumer only takes and releases batches (and
 * hashes them with --checksum), so the figure is the pipeline's own rate.
 *
 * Uses only the public API, like any program that embeds libdsrt.
 */
#include <dsrt.h>

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tool_common.h"
#include "tool_options.h"

#define DSRT_MIN_SIZE(a, b) ((a) < (b) ? (a) : (b))

static const char usage[] =
    "usage: dsbench DATA [DATA...] [pipeline options]\n"
    "       dsbench DATA --index [options]\n"
    "       dsbench convert SRC OUT [options]\n"
    "\n"
    "Profiles dsrt's datastore on DATA: a folder of class sub-folders, a CSV manifest\n"
    "(path,label), IDX files (MNIST, Fashion-MNIST), CIFAR-10/100 binary batches, or\n"
    "tar shards (a folder of them, a .tar, a glob 'dir/shard-*.tar' or a brace list\n"
    "'dir/shard-{000000..000146}.tar'; members <key>.jpg|png|webp and <key>.cls).\n"
    "A folder or a shard set may be a prefix in an object store (s3://bucket/prefix)\n"
    "and a manifest a URL (s3://, https://) whose paths may be URLs; credentials,\n"
    "region and endpoint come from the environment and ~/.aws as for the AWS tools\n"
    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,\n"
    "AWS_ENDPOINT_URL, AWS_PROFILE; none, or AWS_NO_SIGN_REQUEST=YES: anonymous).\n"
    "\n"
    "Commands:\n"
    "  DATA                  run the input pipeline alone over DATA (read, decode,\n"
    "                        augment into batch slots, in background threads) and\n"
    "                        report images/s per epoch, their median after the first\n"
    "                        (warm-up) epoch, and where the time went\n"
    "  DATA --index          scan DATA and report the classes, the images per class\n"
    "                        and the time the scan took\n"
    "  convert SRC OUT       write an IDX or CIFAR source as OUT/<class>/<n>.png; a\n"
    "                        folder holding both splits gives OUT/train and OUT/test\n"
    "                        (a folder named 'convert' is written './convert')\n"
    "  convert SRC OUT --shards SIZE\n"
    "                        write any source (folder, manifest, IDX, CIFAR, shards)\n"
    "                        as WebDataset tar shards OUT/shard-000000.tar, ... of at\n"
    "                        most SIZE bytes (256M, 1G, ...): <key>.cls and\n"
    "                        <key>.jpg|png|webp, files as they are, pixels as PNG;\n"
    "                        with OUT/classes.json and the index\n"
    "                        OUT/dsrt-shards.index.\n"
    "                        The set is staged in a hidden folder in OUT and moved\n"
    "                        into place whole, so a failed or killed conversion\n"
    "                        leaves the set OUT held. OUT must be new, empty or a\n"
    "                        set dsrt wrote: dsrt keeps a record of its files\n"
    "                        (OUT/.dsrt-shards-written) and removes or replaces only\n"
    "                        those; anything else in OUT is refused and left alone.\n"
    "                        OUT may not be, hold or lie inside SRC's folder\n"
    "\n"
    "--index takes the datastore options and --json; convert the datastore options,\n"
    "--split, --class-names, --shards and --shard-samples. With --json, the pipeline\n"
    "prints one line per epoch, then a summary with images_per_s (the median after\n"
    "the warm-up), images, bad_files (the first 20: path, error), bad_files_total,\n"
    "skipped, workers, io, per-stage seconds, samples_per_source and, with\n"
    "--checksum, checksum (hex); --index prints\n"
    "{\"classes\":[...],\"counts\":[...],\"images\":N,\"scan_s\":S}.\n"
    "An older spelling (--threads, --pipeline, --decode-dc 0, --shuffle epoch) is\n"
    "taken with a note.\n";

/* --preset, in the order of its names in the option table. */
typedef enum { PIPE_NONE = 0, PIPE_227, PIPE_32, PIPE_IMAGENET, PIPE_IMAGENET_VAL } pipe_kind;

#define MAX_DATA 64

typedef struct {
    const char *data;
    char shown[4096]; /* data as messages show it (credentials masked) */
    /* Several DATA and --mix: a mix (dsrt_datastore_open_mix). */
    const char *paths[MAX_DATA];
    size_t npaths;
    const char *mix;
    dsrt_mix_options mo;
    int index, json;
    /* pipeline mode */
    pipe_kind kind;
    int nhwc;         /* --layout nhwc / --dtype uint8: uint8 NHWC samples */
    int layout_given; /* -1 nchw/float32 asked, 1 nhwc/uint8 asked, 0 neither */
    int channels;     /* --channels: 1 or 3 */
    int no_decode_dc; /* --no-decode-dc */
    dsrt_pipeline_options po;
    int batch_given, sweep, cold, checksum;
    int cold_method; /* COLD_AUTO, COLD_DROP_CACHES, COLD_FADVISE */
    int limit;       /* --limit */
    size_t limit_images;
    unsigned limit_passes;
    const char *threads_list;
    const char *bad_list; /* --bad-list FILE */
    FILE *bad_out;
    unsigned epochs;
    int pipeline_given; /* some pipeline option was given */
    dsrt_datastore_options ds;
    /* convert */
    const char *out;
    int split_both;
    const char *class_names;
    uint64_t shard_bytes, shard_samples; /* --shards, --shard-samples */
} options;

enum { COLD_AUTO = 0, COLD_DROP_CACHES, COLD_FADVISE };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU seconds of the whole process, every thread. */
static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------
// Options: rows of the library's tables (dsrt/options.h), bound here to
// the fields they set

static tool_tables tables(void) {
    tool_tables t = {{NULL, NULL}, {0, 0}};
    t.count[0] = dsrt_option_groups(&t.groups[0]);
    return t;
}

/* The i-th name of the dsbench option's choices ("cold-method", 1:
 * "drop-caches"). */
static const char *choice_name(const char *option, int i) {
    tool_tables t = tables();
    const dsrt_option *row = tool_option_find(&t, option, DSRT_IN_DSBENCH, NULL);
    const char *name = row && row->choice ? row->choice(i) : NULL;
    return name ? name : "unknown";
}

static const char *preset_name(const options *o) {
    return choice_name("preset", (int)o->kind);
}

// ----------------------------------------------------------------------------
// dsbench DATA --index

static void print_warnings(const dsrt_datastore *ds) {
    size_t n = dsrt_datastore_warning_count(ds);
    if (n == 0) return;
    fprintf(stderr, "dsbench: %zu warning%s while indexing:\n%s", n, n > 1 ? "s" : "",
            dsrt_datastore_warnings(ds));
    if (n > 20) fprintf(stderr, "  ... and %zu more\n", n - 20);
}

/* Opens DATA: one datastore, or the mix of several (--mix). */
static int open_data(const options *o, dsrt_datastore **ds) {
    return dsrt_datastore_open_mix(ds, o->paths, o->npaths, o->mix, &o->ds, &o->mo);
}

static int run_index(const options *o) {
    dsrt_datastore *ds;
    double t0 = now_s();
    int rc = open_data(o, &ds);
    double scan_s = now_s() - t0;
    if (rc != 0) tool_die("%s", dsrt_last_error());
    print_warnings(ds);

    size_t nc = dsrt_datastore_num_classes(ds), n = dsrt_datastore_count(ds);
    size_t *counts = calloc(nc ? nc : 1, sizeof *counts);
    if (!counts) tool_die("out of memory");
    dsrt_datastore_class_counts(ds, counts);
    if (o->json) {
        printf("{\"source\":\"%s\",\"classes\":[", dsrt_source_name(dsrt_datastore_source(ds)));
        for (size_t c = 0; c < nc; c++) {
            if (c) putchar(',');
            tool_json_string(stdout, dsrt_datastore_class_name(ds, c));
        }
        printf("],\"counts\":[");
        for (size_t c = 0; c < nc; c++) printf("%s%zu", c ? "," : "", counts[c]);
        char b[32];
        printf("],\"images\":%zu,\"scan_s\":%s,\"warnings\":%zu", n,
               tool_json_number(b, "%.6f", scan_s), dsrt_datastore_warning_count(ds));
        if (dsrt_datastore_shard_count(ds))
            printf(",\"shards\":%zu,\"order\":\"%s\",\"shuffle_buffer\":%zu",
                   dsrt_datastore_shard_count(ds),
                   dsrt_shard_order_name(dsrt_datastore_shard_order(ds)),
                   dsrt_datastore_shuffle_buffer(ds));
        printf("}\n");
    } else {
        printf("%s: %zu images in %zu classes (%s source), indexed in %.3f s\n", o->shown, n, nc,
               dsrt_source_name(dsrt_datastore_source(ds)), scan_s);
        if (dsrt_datastore_shard_count(ds))
            printf("%zu shards, read in the %s order (shuffle buffer %zu)\n",
                   dsrt_datastore_shard_count(ds),
                   dsrt_shard_order_name(dsrt_datastore_shard_order(ds)),
                   dsrt_datastore_shuffle_buffer(ds));
        printf("%6s  %10s  %s\n", "class", "images", "name");
        for (size_t c = 0; c < nc; c++)
            printf("%6zu  %10zu  %s\n", c, counts[c], dsrt_datastore_class_name(ds, c));
    }
    free(counts);
    dsrt_datastore_close(ds);
    return 0;
}

// ----------------------------------------------------------------------------
// dsbench convert SRC OUT

/* Splits "a,b,c" into a NULL-terminated array (the string is modified). */
static const char **split_names(char *list, size_t *count) {
    size_t n = 1;
    for (char *p = list; *p; p++) n += *p == ',';
    const char **names = calloc(n + 1, sizeof *names);
    if (!names) tool_die("out of memory");
    size_t k = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) names[k++] = tok;
    *count = k;
    return names;
}

static int64_t convert_one(const options *o, dsrt_split split, const char *out) {
    dsrt_datastore_options dso = o->ds;
    dso.split = split;
    dsrt_datastore *ds;
    if (dsrt_datastore_open(&ds, o->data, &dso) != 0) tool_die("%s", dsrt_last_error());
    const char **names = NULL;
    char *copy = NULL;
    if (o->class_names) {
        size_t count;
        copy = strdup(o->class_names);
        if (!copy) tool_die("out of memory");
        names = split_names(copy, &count);
        if (count != dsrt_datastore_num_classes(ds))
            tool_die("--class-names: %zu names given, the data has %zu classes", count,
                     dsrt_datastore_num_classes(ds));
    }
    double t0 = now_s();
    int64_t n;
    if (o->shard_bytes) {
        dsrt_shard_write_options so = dsrt_shard_write_defaults();
        so.shard_bytes = o->shard_bytes;
        so.shard_samples = o->shard_samples;
        so.class_names = names;
        uint64_t samples;
        int64_t shards = dsrt_shards_write(ds, out, &so, &samples);
        if (shards < 0) tool_die("%s", dsrt_last_error());
        n = (int64_t)samples;
        fprintf(stderr,
                "dsbench: wrote %lld images in %zu classes to %s as %lld shard%s in %.1f s\n",
                (long long)n, dsrt_datastore_num_classes(ds), out, (long long)shards,
                shards == 1 ? "" : "s", now_s() - t0);
    } else {
        n = dsrt_datastore_export(ds, out, names);
        if (n < 0) tool_die("%s", dsrt_last_error());
        fprintf(stderr, "dsbench: wrote %lld images in %zu classes to %s in %.1f s\n", (long long)n,
                dsrt_datastore_num_classes(ds), out, now_s() - t0);
    }
    free(names);
    free(copy);
    dsrt_datastore_close(ds);
    return n;
}

/* The samples' layout the options ask for. */
static dsrt_augment_layout layout_of(const options *o) {
    return o->nhwc ? DSRT_AUGMENT_U8_NHWC : DSRT_AUGMENT_F32_NCHW;
}

/* 1 when SRC is a source of pixels in memory (IDX or CIFAR files), whose
 * folders hold both splits. */
static int has_splits(const options *o) {
    dsrt_datastore *ds;
    if (dsrt_datastore_open(&ds, o->data, &o->ds) != 0) tool_die("%s", dsrt_last_error());
    int pixels = dsrt_datastore_path(ds, 0) == NULL;
    dsrt_datastore_close(ds);
    return pixels;
}

static int run_convert(options *o) {
    /* A URL, a glob or a brace list is no local file; the data source says
     * what is wrong with it when it is opened. */
    struct stat st;
    int folder = 0;
    if (stat(o->data, &st) == 0)
        folder = S_ISDIR(st.st_mode);
    else if (!dsrt_path_is_url(o->data) && !strpbrk(o->data, "*?[{"))
        tool_die("convert: %s: %s", o->shown, strerror(errno));
    int both = o->split_both && folder && (!o->shard_bytes || has_splits(o));
    if (!both) {
        convert_one(o, o->ds.split, o->out);
        return 0;
    }
    size_t n = strlen(o->out) + 16;
    char *train = malloc(n), *test = malloc(n);
    if (!train || !test) tool_die("out of memory");
    snprintf(train, n, "%s/train", o->out);
    snprintf(test, n, "%s/test", o->out);
    convert_one(o, DSRT_SPLIT_TRAIN, train);
    convert_one(o, DSRT_SPLIT_TEST, test);
    free(train);
    free(test);
    return 0;
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

static int run_pipeline(options *o) {
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

/* How a row's value is stored: where (an offset into options) and as
 * what; then what else it sets. */
typedef enum {
    SET_ONE,  /* a flag: int = 1 */
    SET_ZERO, /* a flag: int = 0 */
    SET_INT,  /* int: the number, or a choice's index (an enum's value) */
    SET_UNSIGNED,
    SET_SIZE, /* size_t */
    SET_U64,
    SET_DOUBLE,
    SET_TEXT, /* const char * */
    SET_CALL, /* set_special decides */
} set_kind;

enum { AFTER_PIPELINE = 1, AFTER_LIMIT = 2, AFTER_COLD = 4, AFTER_BATCH = 8 };

typedef struct {
    const char *name;
    set_kind kind;
    size_t at;     /* offsetof(options, ...) */
    unsigned then; /* AFTER_* */
} binding;

#define AT(field) offsetof(options, field)
static const binding BINDINGS[] = {
    {"source", SET_INT, AT(ds.source), 0},
    {"labels", SET_INT, AT(ds.label_source), 0},
    {"extensions", SET_TEXT, AT(ds.extensions), 0},
    {"no-subfolders", SET_ZERO, AT(ds.include_subfolders), 0},
    {"no-follow", SET_ZERO, AT(ds.follow_symlinks), 0},
    {"split", SET_CALL, 0, 0},
    {"coarse", SET_ONE, AT(ds.cifar100_coarse), 0},
    {"order", SET_INT, AT(ds.shard_order), 0},
    {"shuffle-buffer", SET_SIZE, AT(ds.shuffle_buffer), 0},
    {"mix", SET_TEXT, AT(mix), 0},
    {"mix-labels", SET_INT, AT(mo.labels), 0},
    {"mix-replacement", SET_ONE, AT(mo.replacement), AFTER_PIPELINE},
    {"retry-deadline", SET_DOUBLE, AT(po.reader.remote.retry_deadline_s), AFTER_PIPELINE},
    {"request-timeout", SET_DOUBLE, AT(po.reader.remote.timeout_s), AFTER_PIPELINE},
    {"cache-dir", SET_TEXT, AT(po.reader.remote.cache_dir), AFTER_PIPELINE},
    {"cache-limit", SET_U64, AT(po.reader.remote.cache_limit), AFTER_PIPELINE},
    {"preset", SET_INT, AT(kind), AFTER_PIPELINE},
    {"layout", SET_CALL, 0, AFTER_PIPELINE},
    {"dtype", SET_CALL, 0, AFTER_PIPELINE},
    {"channels", SET_CALL, 0, AFTER_PIPELINE},
    {"no-decode-dc", SET_CALL, 0, AFTER_PIPELINE},
    {"workers", SET_CALL, 0, AFTER_PIPELINE},
    {"cpus", SET_TEXT, AT(po.cpus), AFTER_PIPELINE},
    {"no-pin", SET_ZERO, AT(po.pin), AFTER_PIPELINE},
    {"batch", SET_SIZE, AT(po.batch), AFTER_PIPELINE | AFTER_BATCH},
    {"prefetch", SET_UNSIGNED, AT(po.prefetch), AFTER_PIPELINE},
    {"epochs", SET_UNSIGNED, AT(epochs), AFTER_PIPELINE},
    {"seed", SET_U64, AT(po.seed), AFTER_PIPELINE},
    {"shuffle", SET_INT, AT(po.shuffle), AFTER_PIPELINE},
    {"drop-last", SET_ONE, AT(po.drop_last), AFTER_PIPELINE},
    {"sample-weights", SET_TEXT, AT(po.sample_weights), AFTER_PIPELINE},
    {"epoch-samples", SET_SIZE, AT(po.epoch_samples), AFTER_PIPELINE},
    {"io", SET_INT, AT(po.reader.io), AFTER_PIPELINE},
    {"depth", SET_UNSIGNED, AT(po.reader.depth), AFTER_PIPELINE},
    {"remote-depth", SET_UNSIGNED, AT(po.reader.remote.depth), AFTER_PIPELINE},
    {"max-connections", SET_UNSIGNED, AT(po.reader.remote.max_connections), AFTER_PIPELINE},
    {"direct", SET_ONE, AT(po.reader.direct), AFTER_PIPELINE},
    {"fail-on-error", SET_ONE, AT(po.fail_on_error), AFTER_PIPELINE},
    {"index", SET_ONE, AT(index), 0},
    {"json", SET_ONE, AT(json), 0},
    {"sweep", SET_ONE, AT(sweep), AFTER_PIPELINE},
    {"cold", SET_ONE, AT(cold), AFTER_PIPELINE},
    {"cold-method", SET_INT, AT(cold_method), AFTER_PIPELINE | AFTER_COLD},
    {"bad-list", SET_TEXT, AT(bad_list), AFTER_PIPELINE},
    {"limit", SET_ONE, AT(limit), AFTER_PIPELINE},
    {"limit-images", SET_SIZE, AT(limit_images), AFTER_PIPELINE | AFTER_LIMIT},
    {"limit-passes", SET_UNSIGNED, AT(limit_passes), AFTER_PIPELINE | AFTER_LIMIT},
    {"checksum", SET_ONE, AT(checksum), AFTER_PIPELINE},
    {"class-names", SET_TEXT, AT(class_names), 0},
    {"shards", SET_U64, AT(shard_bytes), 0},
    {"shard-samples", SET_U64, AT(shard_samples), 0},
};
#undef AT

/* --layout and --dtype: two names for one choice. The augmenter writes
 * float32 NCHW or uint8 NHWC; each option alone picks the pair, together
 * they must agree. */
static void set_layout(options *o, const tool_arg *a, int dtype) {
    dsrt_augment_layout l = (dsrt_augment_layout)a->number;
    int want = l == DSRT_AUGMENT_U8_NHWC ? 1 : -1;
    dsrt_augment_layout given = o->layout_given > 0 ? DSRT_AUGMENT_U8_NHWC : DSRT_AUGMENT_F32_NCHW;
    if (o->layout_given && o->layout_given != want)
        tool_die_usage("%s %s: dsrt writes float32 NCHW or uint8 NHWC samples, not %s with %s",
                       a->spelled, a->value, a->value,
                       dtype ? dsrt_augment_layout_name(given) : dsrt_augment_layout_dtype(given));
    o->layout_given = want;
    o->nhwc = l == DSRT_AUGMENT_U8_NHWC;
}

/* The rows whose value sets more than one field. */
static void set_special(options *o, const tool_arg *a) {
    const char *name = a->row->name;
    if (strcmp(name, "split") == 0) {
        o->split_both = strcmp(a->value, "both") == 0;
        if (!o->split_both) o->ds.split = (dsrt_split)a->number;
    } else if (strcmp(name, "layout") == 0 || strcmp(name, "dtype") == 0) {
        set_layout(o, a, name[0] == 'd');
    } else if (strcmp(name, "channels") == 0) {
        o->channels = atoi(a->value);
    } else if (strcmp(name, "no-decode-dc") == 0) {
        /* The older --decode-dc 0|1 takes a value. */
        o->no_decode_dc = a->value ? strcmp(a->value, "0") == 0 : 1;
    } else if (strchr(a->value, ',')) { /* --workers: a count or a list */
        o->threads_list = a->value;
        for (const char *c = a->value; *c; c++)
            if (!(*c == ',' || (*c >= '0' && *c <= '9')))
                tool_die_usage("%s: '%s' is not a count or a list like 1,2,4", a->spelled,
                               a->value);
    } else {
        o->po.threads = (unsigned)tool_int(a->spelled, a->value, 0, 1024);
        o->threads_list = o->po.threads ? a->value : NULL;
    }
}

static void set_option(options *o, const tool_arg *a) {
    const binding *b = BINDINGS;
    while (b < BINDINGS + sizeof BINDINGS / sizeof BINDINGS[0] && strcmp(b->name, a->row->name))
        b++;
    if (b == BINDINGS + sizeof BINDINGS / sizeof BINDINGS[0])
        tool_die("--%s: dsbench has no field for it", a->row->name);
    char *f = (char *)o + b->at;
    switch (b->kind) {
    case SET_ONE:
    case SET_ZERO:
        *(int *)f = b->kind == SET_ONE;
        break;
    case SET_INT:
        *(int *)f = (int)a->number;
        break;
    case SET_UNSIGNED:
        *(unsigned *)f = (unsigned)a->number;
        break;
    case SET_SIZE:
        *(size_t *)f = (size_t)a->number;
        break;
    case SET_U64:
        *(uint64_t *)f = (uint64_t)strtoull(a->value, NULL, 10);
        if (a->row->type == DSRT_OPTION_SIZE) *(uint64_t *)f = (uint64_t)a->number;
        break;
    case SET_DOUBLE:
        *(double *)f = a->number;
        break;
    case SET_TEXT:
        *(const char **)f = a->value;
        break;
    case SET_CALL:
        set_special(o, a);
        break;
    }
    if (b->then & AFTER_PIPELINE) o->pipeline_given = 1;
    if (b->then & AFTER_LIMIT) o->limit = 1;
    if (b->then & AFTER_COLD) o->cold = 1;
    if (b->then & AFTER_BATCH) o->batch_given = 1;
}

static void usage_print(void) {
    fputs(usage, stdout);
    tool_tables t = tables();
    tool_option_help(stdout, &t, DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX | DSRT_IN_DSBENCH_CONVERT);
    printf("  %-24s dsrt's version\n", "--version");
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.ds = dsrt_datastore_defaults();
    o.split_both = 1;
    o.po = dsrt_pipeline_defaults();
    o.mo = dsrt_mix_defaults();
    o.kind = PIPE_227;
    o.epochs = 3;
    o.channels = 3;
    o.limit_images = 2000;
    o.limit_passes = 3;
    tool_set_name("dsbench");
    if (argc < 2) tool_die_usage("no data given");

    int convert = strcmp(argv[1], "convert") == 0;
    const char *positional[2] = {NULL, NULL};
    size_t n_pos = 0;
    tool_tables t = tables();
    unsigned where = convert ? DSRT_IN_DSBENCH_CONVERT : DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX;
    for (int i = 1 + convert; i < argc; i++) {
        const char *a = argv[i];
        tool_arg arg;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage_print();
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("dsbench (dsrt) %s\n", dsrt_version_string());
            return 0;
        } else if (tool_option_read(&t, where, argc, argv, &i, &arg, tool_die_usage) == 0) {
            set_option(&o, &arg);
        } else if (a[0] == '-' && a[1] != '\0') {
            tool_die_usage("unknown option '%s'", a);
        } else if (!convert && o.npaths < MAX_DATA) {
            o.paths[o.npaths++] = a;
        } else if (convert && n_pos < 2) {
            positional[n_pos++] = a;
        } else {
            tool_die_usage("unexpected argument '%s'", a);
        }
    }
    /* The store's requests while opening take the same deadline and timeout. */
    o.ds.remote = o.po.reader.remote;
    if (convert) {
        if (n_pos != 2) tool_die_usage("convert needs SRC and OUT");
        if (o.shard_samples && !o.shard_bytes) tool_die_usage("--shard-samples needs --shards");
        o.data = positional[0];
        dsrt_text_redact(o.data, o.shown, sizeof o.shown);
        o.out = positional[1];
        return run_convert(&o);
    }
    if (o.npaths == 0 && !o.mix) tool_die_usage("no data given");
    if (o.npaths > 1 || o.mix) {
        /* "A + B", or the mix file. */
        size_t at = 0;
        for (size_t k = 0; k < o.npaths && at < sizeof o.shown; k++) {
            char one[4096];
            dsrt_text_redact(o.paths[k], one, sizeof one);
            at += (size_t)snprintf(o.shown + at, sizeof o.shown - at, "%s%s", k ? " + " : "", one);
        }
        if (!o.npaths) snprintf(o.shown, sizeof o.shown, "mix %s", o.mix);
        o.data = o.npaths ? o.paths[0] : o.mix;
    } else {
        o.data = o.paths[0];
        dsrt_text_redact(o.data, o.shown, sizeof o.shown);
    }
    if (o.index) {
        if (o.pipeline_given) tool_die_usage("--index scans only: pipeline options do not apply");
        return run_index(&o);
    }
    if (o.threads_list && strchr(o.threads_list, ',') && !o.sweep)
        tool_die_usage("--threads: a list needs --sweep");
    char why[512];
    if (o.bad_list && (tool_check_output(o.bad_list, 0, why, sizeof why) ||
                       !(o.bad_out = tool_open_output(o.bad_list, why, sizeof why))))
        tool_die_usage("--bad-list %s: %s", o.bad_list, why);
    int rc = run_pipeline(&o);
    if (o.bad_out && (ferror(o.bad_out) | fclose(o.bad_out)))
        tool_die("--bad-list %s: the list could not be written in full", o.bad_list);
    return rc;
}
