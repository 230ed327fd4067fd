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
    "Options for DATA:\n"
    "  --source KIND         auto (default: told from DATA) or a source's name: folder,\n"
    "                        manifest, shards, ... (a name dsrt does not know is\n"
    "                        answered with the list of those it does)\n"
    "  --labels FROM         folder (default: the first sub-folder under DATA names the\n"
    "                        class, as torchvision's ImageFolder), parent (the folder\n"
    "                        holding the file, as MATLAB's 'foldernames'), none\n"
    "  --extensions LIST     file extensions to take, e.g. jpg,png (default\n"
    "                        jpg,jpeg,jpe,jfif,png,webp; case-insensitive)\n"
    "  --no-subfolders       only files directly inside each class folder\n"
    "  --no-follow           do not follow symbolic links\n"
    "  --split train|test    for IDX and CIFAR folders (default train)\n"
    "  --coarse              CIFAR-100: the 20 coarse labels instead of the 100 fine\n"
    "  --order auto|exact|shard  shards: exact reads each sample by offset in the same\n"
    "                        global shuffle as any datastore (batches equal the\n"
    "                        folder's); shard streams each shard front to back, shards\n"
    "                        shuffled each epoch, samples mixed in a shuffle buffer;\n"
    "                        auto: exact with dsrt's index on a disk that seeks\n"
    "                        cheaply, else shard\n"
    "  --shuffle-buffer N    shards, shard order: samples mixed at once (default 1000)\n"
    "  --json                one JSON line instead of a table:\n"
    "                        {\"classes\":[...],\"counts\":[...],\"images\":N,\"scan_s\":S}\n"
    "  --mix W1,W2,...|FILE  mix several DATA in these proportions (one weight a DATA,\n"
    "                        each >= 0): an epoch draws round(N * W / sum W) samples\n"
    "                        from each, interleaved at random; or FILE, lines of\n"
    "                        PATH,WEIGHT naming the sources themselves (then no DATA;\n"
    "                        relative paths from FILE's folder; '#' comments). Several\n"
    "                        DATA without --mix: weights in proportion to their sizes\n"
    "  --mix-labels merge|separate  classes of a mix merged by name (default), or kept\n"
    "                        apart as K:NAME (K the source's number from 0)\n"
    "\n"
    "Pipeline options:\n"
    "  --pipeline 227|32|imagenet|imagenet-val|none  the work per image (default\n"
    "                        227), as torch_loader_bench.py does it:\n"
    "                        227: shorter side to 256, random 227x227 crop, random\n"
    "                        left-right flip, float NCHW in [0, 1]\n"
    "                        32: resize to 32x32, random flip, random shift of up to\n"
    "                        4 pixels (zero fill), float NCHW in [0, 1]\n"
    "                        imagenet: torchvision's ImageNet training recipe:\n"
    "                        random-resized 224x224 crop (scale 0.08-1, ratio\n"
    "                        3/4-4/3), random flip, colour jitter 0.4 (brightness,\n"
    "                        contrast, saturation, random order), normalised with\n"
    "                        ImageNet's mean and std\n"
    "                        imagenet-val: shorter side to 256, centre 224x224 crop,\n"
    "                        normalised as imagenet\n"
    "                        none: decode only: each image at its own size as float\n"
    "                        CHW in [0, 1], one image a batch unless --batch says\n"
    "  --layout nchw|nhwc    the samples' layout: nchw (default) is float32 planes,\n"
    "                        nhwc is uint8 rows of interleaved channels (what a GPU\n"
    "                        stages and normalises itself), no normalisation\n"
    "  --dtype float32|uint8 the samples' type: float32 goes with nchw (the\n"
    "                        default), uint8 with nhwc; either option alone picks both\n"
    "  --channels 1|3        output channels (default 3): 1 decodes JPEGs to their\n"
    "                        luma alone\n"
    "  --decode-dc 0|1       JPEGs decoded at 1/8 scale (pipeline 32 on most photos):\n"
    "                        1 (default) takes each pixel from its block's DC term,\n"
    "                        luma equal to libjpeg's, chroma as the file stores it;\n"
    "                        0 has libjpeg decode them\n"
    "  --threads N           worker threads (default 0: one per core); with --sweep,\n"
    "                        a list of counts such as 1,2,4\n"
    "  --sweep               run once per thread count (1, 2, 4, ... up to the cores,\n"
    "                        or the --threads list) and print a scaling table\n"
    "  --cpus LIST           run the workers on these CPUs (e.g. 0-3,8)\n"
    "  --no-pin              do not bind workers to cores\n"
    "  --batch B             images per batch (default 128; 1 with --pipeline none)\n"
    "  --prefetch P          batches made ahead of the consumer (default 4)\n"
    "  --epochs E            epochs to run, the first a warm-up (default 3)\n"
    "  --seed S              shuffle and augmentation seed (default 0)\n"
    "  --shuffle never|once|epoch  sample order (default epoch: a new one each epoch)\n"
    "  --drop-last           drop each epoch's last, partial batch\n"
    "  --mix-replacement     a mix draws within each source with replacement (default:\n"
    "                        each source walked in fresh permutations, none twice\n"
    "                        before all once)\n"
    "  --sample-weights class-balanced|FILE  draw each epoch's samples with replacement\n"
    "                        in proportion to a weight a sample (PyTorch's\n"
    "                        WeightedRandomSampler): class-balanced weighs each 1 /\n"
    "                        (samples of its class); FILE holds one weight a line, one\n"
    "                        line a sample in DATA's order ('#' comments)\n"
    "  --epoch-samples N     samples an epoch with --mix or --sample-weights (default:\n"
    "                        all of DATA's)\n"
    "  --io auto|uring|pread file reads: io_uring (auto falls back to pread where the\n"
    "                        kernel refuses it), or pread (default auto)\n"
    "  --depth N             reads in flight per worker (default 16)\n"
    "  --remote-depth N      requests to an object store in flight per worker\n"
    "                        (default 64)\n"
    "  --max-connections N   connections per host and worker (default: the remote\n"
    "                        depth, or $DSRT_S3_MAX_CONNECTIONS)\n"
    "  --retry-deadline S    give up on a request the store keeps failing (throttled,\n"
    "                        errors, unreachable) S seconds after its first failure\n"
    "                        and stop the run (default 60)\n"
    "  --request-timeout S   retry a request that receives nothing for S seconds\n"
    "                        (default 30)\n"
    "  --direct              open files with O_DIRECT (bypass the page cache)\n"
    "  --cold                drop DATA's files from the page cache before each epoch:\n"
    "                        the whole cache (sync, /proc/sys/vm/drop_caches = 3) when\n"
    "                        allowed (root), else posix_fadvise DONTNEED on every file\n"
    "                        of DATA; the report says which\n"
    "  --cold-method M       auto (default), drop-caches or fadvise (implies --cold)\n"
    "  --fail-on-error       stop at the first bad image instead of skipping it\n"
    "  --bad-list FILE       write every bad image, with the reason, to FILE (one JSON\n"
    "                        object a line: path, error); the report names the first 20\n"
    "  --limit               also measure the limit: one core decoding the same files at\n"
    "                        full size to RGB with TurboJPEG (fast DCT; libspng for PNG),\n"
    "                        files in memory, nothing else; and report each run's\n"
    "                        images/s per thread as a share of it\n"
    "  --limit-images N      files the limit decodes, spread over DATA (default 2000;\n"
    "                        0: all)\n"
    "  --limit-passes N      passes over them; the best counts (default 3)\n"
    "  --checksum            hash every delivered batch (samples and labels, in order;\n"
    "                        FNV-1a over 64-bit words in 4 lanes) and print the hash:\n"
    "                        the same for any thread count, io back-end or timing\n"
    "  --json                one JSON line per epoch, then a summary line with\n"
    "                        images_per_s (median after the warm-up), images,\n"
    "                        bad_files (the first 20: path, error), bad_files_total,\n"
    "                        skipped (times a bad file was passed over), threads,\n"
    "                        io, per-stage seconds, samples_per_source (the samples\n"
    "                        delivered from each DATA of a mix) and, with --checksum,\n"
    "                        checksum (hex); no progress bar\n"
    "  Also --source, --labels, --extensions, --no-subfolders, --no-follow, --split,\n"
    "  --coarse as for --index.\n"
    "\n"
    "Options for convert:\n"
    "  --split train|test|both  which split of a folder of IDX/CIFAR files (default both)\n"
    "  --class-names LIST    comma-separated folder names, one per class, in class order\n"
    "  --shards SIZE         write tar shards of at most SIZE bytes instead (any source)\n"
    "  --shard-samples N     with --shards: at most N samples a shard as well\n"
    "  --source, --coarse, --labels, --extensions, ...  as above\n"
    "\n"
    "  -h, --help            this help\n"
    "  --version             dsrt's version\n";

typedef enum { PIPE_227 = 0, PIPE_32, PIPE_NONE, PIPE_IMAGENET, PIPE_IMAGENET_VAL } pipe_kind;

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
    int decode_dc;    /* --decode-dc: 0 or 1 */
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
static const char *const cold_names[] = {"auto", "drop-caches", "fadvise"};

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
// Options

/* Parses the options shared by both commands; returns 1 when argv[*i] was one. */
static int parse_datastore_option(int argc, char **argv, int *i, options *o) {
    const char *a = argv[*i];
    if (strcmp(a, "--source") == 0) {
        const char *v = tool_value(argc, argv, i);
        if (dsrt_source_from_name(v, &o->ds.source) != 0)
            tool_die_usage("--source: %s", dsrt_last_error());
    } else if (strcmp(a, "--labels") == 0) {
        if (dsrt_label_source_from_name(tool_value(argc, argv, i), &o->ds.label_source) != 0)
            tool_die_usage("--labels: %s", dsrt_last_error());
    } else if (strcmp(a, "--extensions") == 0) {
        o->ds.extensions = tool_value(argc, argv, i);
    } else if (strcmp(a, "--no-subfolders") == 0) {
        o->ds.include_subfolders = 0;
    } else if (strcmp(a, "--no-follow") == 0) {
        o->ds.follow_symlinks = 0;
    } else if (strcmp(a, "--coarse") == 0) {
        o->ds.cifar100_coarse = 1;
    } else if (strcmp(a, "--mix") == 0) {
        o->mix = tool_value(argc, argv, i);
    } else if (strcmp(a, "--mix-labels") == 0) {
        if (dsrt_mix_labels_from_name(tool_value(argc, argv, i), &o->mo.labels) != 0)
            tool_die_usage("--mix-labels: %s", dsrt_last_error());
    } else if (strcmp(a, "--order") == 0) {
        o->ds.shard_order = tool_shard_order("--order", tool_value(argc, argv, i));
    } else if (strcmp(a, "--shuffle-buffer") == 0) {
        o->ds.shuffle_buffer =
            (size_t)tool_int("--shuffle-buffer", tool_value(argc, argv, i), 1, 1 << 24);
    } else if (strcmp(a, "--split") == 0) {
        const char *v = tool_value(argc, argv, i);
        o->split_both = 0;
        if (strcmp(v, "train") == 0)
            o->ds.split = DSRT_SPLIT_TRAIN;
        else if (strcmp(v, "test") == 0)
            o->ds.split = DSRT_SPLIT_TEST;
        else if (strcmp(v, "both") == 0)
            o->split_both = 1;
        else
            tool_die_usage("--split: '%s' is not train, test or both", v);
    } else {
        return 0;
    }
    return 1;
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

static const char *const kind_names[] = {"227", "32", "none", "imagenet", "imagenet-val"};

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
           kind_names[o->kind], dsrt_augment_layout_name(layout_of(o)),
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
           o->cold ? cold_names[o->cold_method] : "false", o->cold ? "\"" : "", o->epochs, images,
           (unsigned long long)r->delivered, tool_json_number(b[0], "%.1f", r->median));
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
    if (o->kind == PIPE_227)
        dsrt_augment_preset_227(&aug);
    else if (o->kind == PIPE_32)
        dsrt_augment_preset_32(&aug);
    else if (o->kind == PIPE_IMAGENET)
        dsrt_augment_preset_imagenet(&aug);
    else if (o->kind == PIPE_IMAGENET_VAL)
        dsrt_augment_preset_imagenet_val(&aug);
    else
        aug = dsrt_augment_defaults(); /* native: float CHW in [0, 1], nothing else */
    aug.output_channels = o->channels;
    aug.decode_dc = o->decode_dc;
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
                   o->shown, images, kind_names[o->kind], dsrt_augment_layout_dtype(layout_of(o)),
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

/* Parses the options of reading: the io engine, depths, the store's
 * connections, O_DIRECT, a cold cache. Returns 1 when argv[*i] was one. */
static int parse_read_option(int argc, char **argv, int *i, options *o) {
    const char *a = argv[*i];
    dsrt_pipeline_options *po = &o->po;
    if (strcmp(a, "--io") == 0) {
        const char *v = tool_value(argc, argv, i);
        if (strcmp(v, "auto") == 0)
            po->reader.io = DSRT_IO_AUTO;
        else if (strcmp(v, "uring") == 0 || strcmp(v, "io_uring") == 0)
            po->reader.io = DSRT_IO_URING;
        else if (strcmp(v, "pread") == 0)
            po->reader.io = DSRT_IO_PREAD;
        else
            tool_die_usage("--io: '%s' is not auto, uring or pread", v);
    } else if (strcmp(a, "--depth") == 0) {
        po->reader.depth = (unsigned)tool_int("--depth", tool_value(argc, argv, i), 1, 4096);
    } else if (strcmp(a, "--remote-depth") == 0) {
        po->reader.remote.depth =
            (unsigned)tool_int("--remote-depth", tool_value(argc, argv, i), 1, 4096);
    } else if (strcmp(a, "--max-connections") == 0) {
        po->reader.remote.max_connections =
            (unsigned)tool_int("--max-connections", tool_value(argc, argv, i), 1, 4096);
    } else if (strcmp(a, "--retry-deadline") == 0) {
        po->reader.remote.retry_deadline_s =
            tool_double("--retry-deadline", tool_value(argc, argv, i), 0, 86400);
    } else if (strcmp(a, "--request-timeout") == 0) {
        po->reader.remote.timeout_s =
            tool_double("--request-timeout", tool_value(argc, argv, i), 0.001, 86400);
    } else if (strcmp(a, "--direct") == 0) {
        po->reader.direct = 1;
    } else if (strcmp(a, "--cold") == 0) {
        o->cold = 1;
    } else if (strcmp(a, "--cold-method") == 0) {
        const char *v = tool_value(argc, argv, i);
        int k = 0;
        while (k < 3 && strcmp(v, cold_names[k]) != 0) k++;
        if (k == 3) tool_die_usage("--cold-method: '%s' is not auto, drop-caches or fadvise", v);
        o->cold = 1;
        o->cold_method = k;
    } else {
        return 0;
    }
    return 1;
}

/* Parses the pipeline options; returns 1 when argv[*i] was one. */
static int parse_pipeline_option(int argc, char **argv, int *i, options *o) {
    const char *a = argv[*i];
    dsrt_pipeline_options *po = &o->po;
    if (strcmp(a, "--pipeline") == 0) {
        const char *v = tool_value(argc, argv, i);
        int k = 0;
        while (k < 5 && strcmp(v, kind_names[k]) != 0) k++;
        if (k == 5)
            tool_die_usage("--pipeline: '%s' is not 227, 32, imagenet, imagenet-val or none", v);
        o->kind = (pipe_kind)k;
    } else if (strcmp(a, "--layout") == 0 || strcmp(a, "--dtype") == 0) {
        /* Two names for one choice: the augmenter writes float32 NCHW or
         * uint8 NHWC. Each option alone picks the pair; together they must
         * agree. */
        const char *v = tool_value(argc, argv, i);
        int which = strcmp(a, "--dtype") == 0;
        dsrt_augment_layout l;
        if (dsrt_augment_layout_from_name(v, which, &l) != 0)
            tool_die_usage("%s: %s", a, dsrt_last_error());
        int want = l == DSRT_AUGMENT_U8_NHWC ? 1 : -1;
        dsrt_augment_layout given =
            o->layout_given > 0 ? DSRT_AUGMENT_U8_NHWC : DSRT_AUGMENT_F32_NCHW;
        if (o->layout_given && o->layout_given != want)
            tool_die_usage(
                "%s %s: dsrt writes float32 NCHW or uint8 NHWC samples, not %s with %s", a, v, v,
                which ? dsrt_augment_layout_name(given) : dsrt_augment_layout_dtype(given));
        o->layout_given = want;
        o->nhwc = l == DSRT_AUGMENT_U8_NHWC;
    } else if (strcmp(a, "--decode-dc") == 0) {
        o->decode_dc = (int)tool_int("--decode-dc", tool_value(argc, argv, i), 0, 1);
    } else if (strcmp(a, "--channels") == 0) {
        o->channels = (int)tool_int("--channels", tool_value(argc, argv, i), 1, 3);
        if (o->channels == 2) tool_die_usage("--channels: 2 is not 1 or 3");
    } else if (strcmp(a, "--threads") == 0) {
        const char *v = tool_value(argc, argv, i);
        if (strchr(v, ',')) {
            o->threads_list = v;
            for (const char *c = v; *c; c++)
                if (!(*c == ',' || (*c >= '0' && *c <= '9')))
                    tool_die_usage("--threads: '%s' is not a count or a list like 1,2,4", v);
        } else {
            po->threads = (unsigned)tool_int("--threads", v, 0, 1024);
            o->threads_list = po->threads ? v : NULL;
        }
    } else if (strcmp(a, "--sweep") == 0) {
        o->sweep = 1;
    } else if (strcmp(a, "--cpus") == 0) {
        po->cpus = tool_value(argc, argv, i);
    } else if (strcmp(a, "--no-pin") == 0) {
        po->pin = 0;
    } else if (strcmp(a, "--batch") == 0) {
        po->batch = (size_t)tool_int("--batch", tool_value(argc, argv, i), 1, 1 << 24);
        o->batch_given = 1;
    } else if (strcmp(a, "--prefetch") == 0) {
        po->prefetch = (unsigned)tool_int("--prefetch", tool_value(argc, argv, i), 1, 1024);
    } else if (strcmp(a, "--epochs") == 0) {
        o->epochs = (unsigned)tool_int("--epochs", tool_value(argc, argv, i), 1, 1000000);
    } else if (strcmp(a, "--seed") == 0) {
        po->seed = (uint64_t)tool_int("--seed", tool_value(argc, argv, i), 0, INT64_MAX);
    } else if (strcmp(a, "--shuffle") == 0) {
        const char *v = tool_value(argc, argv, i);
        if (strcmp(v, "never") == 0)
            po->shuffle = DSRT_SHUFFLE_NEVER;
        else if (strcmp(v, "once") == 0)
            po->shuffle = DSRT_SHUFFLE_ONCE;
        else if (strcmp(v, "epoch") == 0)
            po->shuffle = DSRT_SHUFFLE_EVERY_EPOCH;
        else
            tool_die_usage("--shuffle: '%s' is not never, once or epoch", v);
    } else if (strcmp(a, "--drop-last") == 0) {
        po->drop_last = 1;
    } else if (strcmp(a, "--mix-replacement") == 0) {
        o->mo.replacement = 1;
    } else if (strcmp(a, "--sample-weights") == 0) {
        po->sample_weights = tool_value(argc, argv, i);
    } else if (strcmp(a, "--epoch-samples") == 0) {
        po->epoch_samples =
            (size_t)tool_int("--epoch-samples", tool_value(argc, argv, i), 1, UINT32_MAX);
    } else if (strcmp(a, "--fail-on-error") == 0) {
        po->fail_on_error = 1;
    } else if (strcmp(a, "--checksum") == 0) {
        o->checksum = 1;
    } else if (strcmp(a, "--limit") == 0) {
        o->limit = 1;
    } else if (strcmp(a, "--limit-images") == 0) {
        o->limit_images =
            (size_t)tool_int("--limit-images", tool_value(argc, argv, i), 0, INT64_MAX);
        o->limit = 1;
    } else if (strcmp(a, "--limit-passes") == 0) {
        o->limit_passes = (unsigned)tool_int("--limit-passes", tool_value(argc, argv, i), 1, 1000);
        o->limit = 1;
    } else if (strcmp(a, "--bad-list") == 0) {
        o->bad_list = tool_value(argc, argv, i);
    } else if (!parse_read_option(argc, argv, i, o)) {
        return 0;
    }
    o->pipeline_given = 1;
    return 1;
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.ds = dsrt_datastore_defaults();
    o.split_both = 1;
    o.po = dsrt_pipeline_defaults();
    o.mo = dsrt_mix_defaults();
    o.epochs = 3;
    o.channels = 3;
    o.decode_dc = 1;
    o.limit_images = 2000;
    o.limit_passes = 3;
    tool_set_name("dsbench");
    if (argc < 2) tool_die_usage("no data given");

    int convert = strcmp(argv[1], "convert") == 0;
    const char *positional[2] = {NULL, NULL};
    size_t n_pos = 0;
    for (int i = 1 + convert; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("dsbench (dsrt) %s\n", dsrt_version_string());
            return 0;
        } else if (parse_datastore_option(argc, argv, &i, &o)) {
            continue;
        } else if (!convert && strcmp(a, "--index") == 0) {
            o.index = 1;
        } else if (!convert && strcmp(a, "--json") == 0) {
            o.json = 1;
        } else if (!convert && parse_pipeline_option(argc, argv, &i, &o)) {
            continue;
        } else if (convert && strcmp(a, "--class-names") == 0) {
            o.class_names = tool_value(argc, argv, &i);
        } else if (convert && strcmp(a, "--shards") == 0) {
            o.shard_bytes =
                tool_bytes("--shards", tool_value(argc, argv, &i), 4096, (uint64_t)1 << 44);
        } else if (convert && strcmp(a, "--shard-samples") == 0) {
            o.shard_samples = (uint64_t)tool_int("--shard-samples", tool_value(argc, argv, &i), 1,
                                                 (long long)1 << 40);
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
