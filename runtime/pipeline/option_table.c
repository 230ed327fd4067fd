/*
 * The data side's options as rows (options.h): the datastore's, the
 * pipeline's and augmentation's, and dsbench's own (profiling), with the
 * lookups every front end shares: an option by name, the nearest name for
 * "did you mean", and a value checked against its row. dsbench parses and
 * explains its options from these rows alone; dstrain and Python read the
 * rows that apply to them. A new option is one row here (and the code that
 * uses its value); its help line, its checks and its messages follow.
 */
#include "core/internal.h"

#include <dsrt/options.h>
#include <dsrt/pipeline.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Name tables the rows take their choices from

static const char *const SHUFFLE_NAMES[] = {[DSRT_SHUFFLE_NEVER] = "never",
                                            [DSRT_SHUFFLE_ONCE] = "once",
                                            [DSRT_SHUFFLE_EVERY_EPOCH] = "every-epoch"};

const char *dsrt_shuffle_name(dsrt_shuffle s) {
    return (unsigned)s < DSRT_ARRAY_SIZE(SHUFFLE_NAMES) ? SHUFFLE_NAMES[s] : "unknown";
}

int dsrt_shuffle_from_name(const char *name, dsrt_shuffle *s) {
    int v;
    int rc = dsrt__name_lookup(SHUFFLE_NAMES, DSRT_ARRAY_SIZE(SHUFFLE_NAMES), name, 0, &v);
    if (rc == 0) *s = (dsrt_shuffle)v;
    return rc;
}

/* A mix is made by dsrt_datastore_mix, never opened as a path. */
DSRT__CHOICE_FROM(dsrt_source_name, dsrt_source, DSRT_SOURCE_MIX)
DSRT__CHOICE_FROM(dsrt_label_source_name, dsrt_label_source, DSRT_LABEL_NONE + 1)
DSRT__CHOICE_FROM(dsrt_shard_order_name, dsrt_shard_order, DSRT_SHARD_ORDER_SHARD + 1)
DSRT__CHOICE_FROM(dsrt_mix_labels_name, dsrt_mix_labels, DSRT_MIX_LABELS_SEPARATE + 1)
DSRT__CHOICE_FROM(dsrt_shuffle_name, dsrt_shuffle, DSRT_SHUFFLE_EVERY_EPOCH + 1)
DSRT__CHOICE_FROM(dsrt_augment_layout_name, dsrt_augment_layout, DSRT_AUGMENT_U8_NHWC + 1)
DSRT__CHOICE_FROM(dsrt_augment_layout_dtype, dsrt_augment_layout, DSRT_AUGMENT_U8_NHWC + 1)

DSRT__CHOICE_OF(split_at, "train", "test")
DSRT__CHOICE_OF(convert_split_at, "train", "test", "both")
/* The reader's engines as options spell them (dsrt_io_name says io_uring,
 * which is taken as an older spelling). */
DSRT__CHOICE_OF(io_at, "auto", "uring", "pread")
DSRT__CHOICE_OF(cold_at, "auto", "drop-caches", "fadvise")
DSRT__CHOICE_OF(channels_at, "1", "3")

/* dsbench's work per image: none (decode only, the pipeline's native mode)
 * and the presets but the default. */
static const char *bench_preset_at(int i) {
    return i == 0 ? "none" : dsrt_augment_preset_name(i);
}

// ----------------------------------------------------------------------------
// The rows

#define DS_WHERE (DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX | DSRT_IN_DSBENCH_CONVERT)
#define RUNS     (DSRT_IN_DSBENCH | DSRT_IN_PY_PIPELINE)

static const dsrt_option DATASTORE_OPTIONS[] = {
    {.name = "source",
     .type = DSRT_OPTION_CHOICE,
     .arg = "KIND",
     .def = "auto",
     .choice = dsrt_source_name_at,
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .help = "the kind of DATA: auto tells it from DATA, or a source's name"},
    {.name = "labels",
     .type = DSRT_OPTION_CHOICE,
     .arg = "FROM",
     .def = "folder",
     .choice = dsrt_label_source_name_at,
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .help = "folder: the first sub-folder under DATA names the class (torchvision's "
             "ImageFolder); parent: the folder holding the file (MATLAB's 'foldernames'); none"},
    {.name = "extensions",
     .type = DSRT_OPTION_TEXT,
     .arg = "LIST",
     .def = "jpg,jpeg,jpe,jfif,png,webp",
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .help = "file extensions to take, comma-separated, in any case"},
    {.name = "no-subfolders",
     .type = DSRT_OPTION_FLAG,
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .py = "include_subfolders",
     .help = "only files directly inside each class folder (Python: include_subfolders=False)"},
    {.name = "no-follow",
     .type = DSRT_OPTION_FLAG,
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .py = "follow_symlinks",
     .help = "do not follow symbolic links (Python: follow_symlinks=False)"},
    {.name = "drop-empty-classes",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_PY_DATASTORE,
     .help = "leave out class folders without images (default: they are classes without samples, "
             "which dstrain refuses)"},
    {.name = "labels-path",
     .type = DSRT_OPTION_TEXT,
     .arg = "FILE",
     .where = DSRT_IN_PY_DATASTORE,
     .help = "IDX: the labels file [from the images file's name: train-images-idx3-ubyte -> "
             "train-labels-idx1-ubyte]"},
    {.name = "manifest-header",
     .type = DSRT_OPTION_TEXT,
     .arg = "BOOL",
     .where = DSRT_IN_PY_DATASTORE,
     .help = "manifest: whether the first line is a header [guessed: a header when its label "
             "field is label or class]"},
    {.name = "split",
     .type = DSRT_OPTION_CHOICE,
     .arg = "WHICH",
     .def = "train",
     .choice = split_at,
     .where = DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX | DSRT_IN_PY_DATASTORE,
     .help = "IDX and CIFAR folders: the split to read"},
    {.name = "split",
     .type = DSRT_OPTION_CHOICE,
     .arg = "WHICH",
     .def = "both",
     .choice = convert_split_at,
     .where = DSRT_IN_DSBENCH_CONVERT,
     .help = "IDX and CIFAR folders: the split to convert (both: OUT/train and OUT/test)"},
    {.name = "coarse",
     .type = DSRT_OPTION_FLAG,
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .py = "cifar100_coarse",
     .help = "CIFAR-100: the 20 coarse labels instead of the 100 fine (Python: "
             "cifar100_coarse=True)"},
    {.name = "order",
     .type = DSRT_OPTION_CHOICE,
     .arg = "HOW",
     .def = "auto",
     .choice = dsrt_shard_order_name_at,
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .help = "tar shards: exact reads each sample by offset in the global shuffle (the "
             "folder's batches); shard streams each shard, samples mixed in a shuffle buffer; "
             "auto: exact with dsrt's index on a disk that seeks cheaply, else shard"},
    {.name = "shuffle-buffer",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 1 << 24,
     .def = "1000",
     .where = DS_WHERE | DSRT_IN_PY_DATASTORE,
     .help = "tar shards in the shard order: samples mixed at once"},
    {.name = "mix",
     .type = DSRT_OPTION_TEXT,
     .arg = "W1,W2|FILE",
     .where = DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX | DSRT_IN_PY_DATASTORE,
     .help =
         "mix several DATA in these proportions (one weight a DATA, each >= 0): an epoch "
         "draws round(N * W / sum W) samples of each, interleaved at random; or FILE, "
         "lines PATH,WEIGHT[,PRESET] naming the sources (then no DATA); several DATA without it: "
         "in proportion to their sizes"},
    {.name = "mix-labels",
     .type = DSRT_OPTION_CHOICE,
     .arg = "HOW",
     .def = "merge",
     .choice = dsrt_mix_labels_name_at,
     .where = DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX | DSRT_IN_PY_DATASTORE,
     .help = "classes of a mix merged by name, or kept apart as K:NAME (separate)"},
    {.name = "mix-replacement",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH | DSRT_IN_PY_DATASTORE,
     .help = "a mix draws within each source with replacement (default: each source walked in "
             "fresh permutations, none twice before all once)"},
    {.name = "retry-deadline",
     .type = DSRT_OPTION_NUMBER,
     .arg = "S",
     .min = 0,
     .max = 86400,
     .def = "60",
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_DSBENCH | DSRT_IN_PY_DATASTORE |
              DSRT_IN_PY_PIPELINE,
     .help = "stop when a request to an object store still fails S seconds after its first "
             "failure"},
    {.name = "cache-dir",
     .type = DSRT_OPTION_TEXT,
     .arg = "DIR",
     .def = "none",
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_DSBENCH | DSRT_IN_PY_PIPELINE,
     .help = "keep what is fetched from an object store in DIR (made when missing), for later "
             "epochs, runs and processes; entries checked against the object's ETag and size "
             "and a hash"},
    {.name = "cache-limit",
     .type = DSRT_OPTION_SIZE,
     .arg = "SIZE",
     .min = 0,
     .max = 1.8e19,
     .def = "0",
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_DSBENCH | DSRT_IN_PY_PIPELINE,
     .help = "bytes the cache keeps at most (K, M, G, T: 20G, 512M; 0: no limit); once full, "
             "what it holds stays and the rest is read from the store"},
    {.name = "request-timeout",
     .type = DSRT_OPTION_NUMBER,
     .arg = "S",
     .min = 0.001,
     .max = 86400,
     .def = "30",
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_DSBENCH | DSRT_IN_PY_DATASTORE |
              DSRT_IN_PY_PIPELINE,
     .help = "retry a request to an object store that receives nothing for S seconds"},
};

static const dsrt_option PIPELINE_OPTIONS[] = {
    {.name = "preset",
     .type = DSRT_OPTION_CHOICE,
     .arg = "NAME",
     .def = "227",
     .choice = bench_preset_at,
     .where = DSRT_IN_DSBENCH,
     .old = "pipeline",
     .old_where = DSRT_IN_DSBENCH,
     .help = "the work per image (torch_loader_bench.py's): 227 (shorter side 256, random "
             "227x227 crop and flip), 32 (resize to 32x32, flip, shift of up to 4 pixels), "
             "imagenet (torchvision's training recipe: random-resized 224 crop, flip, colour "
             "jitter 0.4, ImageNet's mean and std), imagenet-val (shorter side 256, centre 224 "
             "crop), none (decode only: each image at its own size as float CHW in [0, 1], one a "
             "batch)"},
    {.name = "preset",
     .type = DSRT_OPTION_CHOICE,
     .arg = "NAME",
     .def = "default",
     .choice = dsrt_augment_preset_name,
     .where = DSRT_IN_PY_PIPELINE,
     .help = "the augmentation to start from, the augment keywords changing it"},
    {.name = "layout",
     .type = DSRT_OPTION_CHOICE,
     .arg = "L",
     .def = "nchw",
     .choice = dsrt_augment_layout_name_at,
     .where = RUNS,
     .help = "the samples' layout: nchw (float32 planes) or nhwc (uint8 interleaved, not "
             "normalised)"},
    {.name = "dtype",
     .type = DSRT_OPTION_CHOICE,
     .arg = "T",
     .def = "float32",
     .choice = dsrt_augment_layout_dtype_at,
     .where = RUNS,
     .help = "the samples' type: float32 goes with nchw, uint8 with nhwc; either option alone "
             "picks both"},
    {.name = "channels",
     .type = DSRT_OPTION_CHOICE,
     .arg = "C",
     .def = "3",
     .choice = channels_at,
     .where = DSRT_IN_DSBENCH,
     .help = "output channels: 1 decodes JPEGs to their luma alone"},
    {.name = "no-decode-dc",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH,
     .old = "decode-dc",
     .old_where = DSRT_IN_DSBENCH,
     .help = "JPEGs decoded at 1/8 scale go through libjpeg's reduced inverse DCT, not their "
             "blocks' DC terms alone (the same luma, the chroma of subsampled files at twice "
             "the resolution; slower)"},
    {.name = "workers",
     .type = DSRT_OPTION_TEXT,
     .arg = "N",
     .def = "0",
     .where = RUNS,
     .old = "threads",
     .old_where = DSRT_IN_DSBENCH,
     .help = "pipeline worker threads (0: one per core); dsbench --sweep: a list of counts "
             "such as 1,2,4"},
    {.name = "cpus",
     .type = DSRT_OPTION_TEXT,
     .arg = "LIST",
     .where = RUNS,
     .help = "run the workers on these CPUs, e.g. 0-3,8 [all]"},
    {.name = "no-pin",
     .type = DSRT_OPTION_FLAG,
     .where = RUNS,
     .py = "pin",
     .help = "do not bind workers to cores (Python: pin=False)"},
    {.name = "batch",
     .type = DSRT_OPTION_INT,
     .arg = "B",
     .min = 1,
     .max = 1 << 24,
     .def = "128",
     .where = RUNS,
     .help = "images per batch (dsbench --preset default: 1)"},
    {.name = "prefetch",
     .type = DSRT_OPTION_INT,
     .arg = "P",
     .min = 1,
     .max = 1024,
     .def = "4",
     .where = RUNS,
     .help = "batches made ahead of the consumer"},
    {.name = "epochs",
     .type = DSRT_OPTION_INT,
     .arg = "E",
     .min = 1,
     .max = 1000000,
     .def = "3",
     .where = DSRT_IN_DSBENCH,
     .help = "epochs to run, the first a warm-up"},
    {.name = "epochs",
     .type = DSRT_OPTION_INT,
     .arg = "E",
     .min = 0,
     .max = (double)UINT64_MAX,
     .def = "0",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "epochs to deliver; 0: endless (each iteration is one epoch)"},
    {.name = "seed",
     .type = DSRT_OPTION_INT,
     .arg = "S",
     .min = 0,
     .max = (double)INT64_MAX,
     .def = "0",
     .where = RUNS,
     .help = "shuffle and augmentation seed"},
    {.name = "shuffle",
     .type = DSRT_OPTION_CHOICE,
     .arg = "WHEN",
     .def = "every-epoch",
     .choice = dsrt_shuffle_name_at,
     .where = RUNS,
     .old_values = "epoch=every-epoch",
     .help = "sample order: never, once (one order kept) or every-epoch (a new one each epoch)"},
    {.name = "drop-last",
     .type = DSRT_OPTION_FLAG,
     .where = RUNS,
     .help = "drop each epoch's last, partial batch"},
    {.name = "sample-weights",
     .type = DSRT_OPTION_TEXT,
     .arg = "HOW",
     .where = RUNS,
     .help = "draw each epoch's samples with replacement by weight (PyTorch's "
             "WeightedRandomSampler): class-balanced (1 / samples of the class) or FILE (one "
             "weight a line, a line a sample in DATA's order) [none]"},
    {.name = "epoch-samples",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = UINT32_MAX,
     .where = RUNS,
     .help = "samples an epoch with a mix or --sample-weights [all of DATA's]"},
    {.name = "io",
     .type = DSRT_OPTION_CHOICE,
     .arg = "HOW",
     .def = "auto",
     .choice = io_at,
     .where = RUNS,
     .old_values = "io_uring=uring",
     .help = "file reads: io_uring (auto falls back to pread where the kernel refuses it) or "
             "pread"},
    {.name = "io-depth",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 4096,
     .def = "16",
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_DSBENCH | DSRT_IN_PY_PIPELINE,
     .old = "depth",
     .old_where = DSRT_IN_TRAIN | DSRT_IN_EVAL | DSRT_IN_DSBENCH,
     .help = "file reads in flight per pipeline worker"},
    {.name = "remote-depth",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 4096,
     .def = "64",
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | RUNS,
     .help = "requests to an object store (s3://, https://) in flight per worker"},
    {.name = "max-connections",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 4096,
     .where = DSRT_IN_TRAIN | DSRT_IN_EVAL | RUNS,
     .help = "connections per host and worker [the remote depth, or $DSRT_S3_MAX_CONNECTIONS]"},
    {.name = "direct",
     .type = DSRT_OPTION_FLAG,
     .where = RUNS,
     .help = "open files with O_DIRECT (bypass the page cache)"},
    {.name = "fail-on-error",
     .type = DSRT_OPTION_FLAG,
     .where = RUNS,
     .help = "stop at the first bad image instead of skipping it"},
    {.name = "augment",
     .type = DSRT_OPTION_TEXT,
     .arg = "DICT",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "a dict of dsrt_augment_options' fields by name, over the preset's"},
    {.name = "max-pixels",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = (double)UINT64_MAX,
     .def = "178956970",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "images whose header claims more pixels are bad samples (decompression bombs; "
             "Pillow's threshold)"},
    {.name = "strict-decode",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_PY_PIPELINE,
     .help = "every libjpeg warning makes a bad sample (a truncated image always does)"},
    {.name = "drop-bad",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_PY_PIPELINE,
     .help = "leave a bad sample's place out (a shorter batch) instead of filling it with the "
             "next sample"},
    {.name = "max-consecutive-bad",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = UINT32_MAX,
     .def = "1000",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "give up when this many samples in a row fail while filling one place"},
    {.name = "max-file-bytes",
     .type = DSRT_OPTION_SIZE,
     .arg = "SIZE",
     .min = 1,
     .max = 1.8e19,
     .def = "64M",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "larger files are bad samples"},
    {.name = "chunk",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 0,
     .max = 1 << 24,
     .def = "0",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "samples a worker claims at a time (0: 16, fewer for small batches)"},
    {.name = "native",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_PY_PIPELINE,
     .help = "decode each image at its own size, unaugmented (dsbench --preset none)"},
    {.name = "native-max-pixels",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = (double)UINT64_MAX,
     .def = "2097152",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "native: pixels a batch place holds; larger images are bad samples"},
    {.name = "gpu",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = -1,
     .max = 65536,
     .def = "-1",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "the CUDA device the batches go to (workers near it, slots registered); -1: none"},
    {.name = "mixup-alpha",
     .type = DSRT_OPTION_TEXT,
     .arg = "A",
     .def = "0",
     .where = DSRT_IN_TRAIN | DSRT_IN_PY_PIPELINE,
     .old = "mixup",
     .old_where = DSRT_IN_TRAIN,
     .help = "mixup each batch with lambda ~ Beta(A, A) (timm's mixup_alpha); 0: none"},
    {.name = "cutmix-alpha",
     .type = DSRT_OPTION_TEXT,
     .arg = "A",
     .def = "0",
     .where = DSRT_IN_TRAIN | DSRT_IN_PY_PIPELINE,
     .old = "cutmix",
     .old_where = DSRT_IN_TRAIN,
     .help = "cutmix each batch with lambda ~ Beta(A, A) (timm's cutmix_alpha); 0: none"},
    {.name = "cutmix-minmax",
     .type = DSRT_OPTION_TEXT,
     .arg = "LO,HI",
     .def = "from lambda",
     .where = DSRT_IN_TRAIN | DSRT_IN_PY_PIPELINE,
     .help = "cutmix box sides drawn in [LO, HI) of the image's, 0 < LO < HI <= 1"},
    {.name = "mix-prob",
     .type = DSRT_OPTION_TEXT,
     .arg = "P",
     .def = "1",
     .where = DSRT_IN_TRAIN | DSRT_IN_PY_PIPELINE,
     .help = "probability that a batch is mixed"},
    {.name = "mix-switch-prob",
     .type = DSRT_OPTION_TEXT,
     .arg = "P",
     .def = "0.5",
     .where = DSRT_IN_TRAIN | DSRT_IN_PY_PIPELINE,
     .help = "with --mixup-alpha and --cutmix-alpha: probability of cutmix rather than mixup"},
    {.name = "label-smoothing",
     .type = DSRT_OPTION_TEXT,
     .arg = "E",
     .def = "0",
     .where = DSRT_IN_TRAIN | DSRT_IN_PY_PIPELINE,
     .help = "train against soft labels 1 - E + E/classes and E/classes, with or without mixing"},
    {.name = "num-classes",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 1 << 24,
     .where = DSRT_IN_PY_PIPELINE,
     .help = "classes of the soft labels of mixing and smoothing [the datastore's]"},
    {.name = "rank",
     .type = DSRT_OPTION_TEXT,
     .arg = "R",
     .where = DSRT_IN_PY_PIPELINE,
     .help = "this process's share of every batch (with world-size), or env (RANK and "
             "WORLD_SIZE, or SLURM_PROCID and SLURM_NTASKS) [the whole batch]"},
    {.name = "world-size",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 1 << 20,
     .where = DSRT_IN_PY_PIPELINE,
     .help = "processes sharing every batch, as dstrain's workers do [1]"},
};

static const dsrt_option PROFILING_OPTIONS[] = {
    {.name = "index",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH_INDEX,
     .help = "scan DATA and report the classes, the images per class and the time the scan "
             "took"},
    {.name = "json",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH | DSRT_IN_DSBENCH_INDEX,
     .help = "one JSON line per epoch and a summary (--index: one line), no progress bar"},
    {.name = "sweep",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH,
     .help = "run once per worker count (1, 2, 4, ... up to the cores, or the --workers list) "
             "and print a scaling table"},
    {.name = "cold",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH,
     .help = "drop DATA's files from the page cache before each epoch: the whole cache when "
             "allowed (root), else posix_fadvise DONTNEED on every file; the report says which"},
    {.name = "cold-method",
     .type = DSRT_OPTION_CHOICE,
     .arg = "M",
     .def = "auto",
     .choice = cold_at,
     .where = DSRT_IN_DSBENCH,
     .help = "how --cold drops (implies --cold)"},
    {.name = "bad-list",
     .type = DSRT_OPTION_TEXT,
     .arg = "FILE",
     .where = DSRT_IN_DSBENCH,
     .help = "write every bad image, with the reason, to FILE (one JSON object a line)"},
    {.name = "limit",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH,
     .help = "also measure the limit: one core decoding the same files at full size with "
             "TurboJPEG (libspng for PNG), files in memory; report images/s per worker as a "
             "share of it"},
    {.name = "limit-images",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 0,
     .max = (double)INT64_MAX,
     .def = "2000",
     .where = DSRT_IN_DSBENCH,
     .help = "files the limit decodes, spread over DATA (0: all)"},
    {.name = "limit-passes",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = 1000,
     .def = "3",
     .where = DSRT_IN_DSBENCH,
     .help = "passes over them; the best counts"},
    {.name = "checksum",
     .type = DSRT_OPTION_FLAG,
     .where = DSRT_IN_DSBENCH,
     .help = "hash every delivered batch (FNV-1a over samples and labels, in order) and print "
             "it: the same for any worker count, io engine or timing"},
    {.name = "class-names",
     .type = DSRT_OPTION_TEXT,
     .arg = "LIST",
     .where = DSRT_IN_DSBENCH_CONVERT,
     .help = "comma-separated folder names, one per class, in class order"},
    {.name = "shards",
     .type = DSRT_OPTION_SIZE,
     .arg = "SIZE",
     .min = 4096,
     .max = (double)((uint64_t)1 << 44),
     .where = DSRT_IN_DSBENCH_CONVERT,
     .help = "write tar shards of at most SIZE bytes (256M, 1G, ...) instead (any source)"},
    {.name = "shard-samples",
     .type = DSRT_OPTION_INT,
     .arg = "N",
     .min = 1,
     .max = (double)((uint64_t)1 << 40),
     .where = DSRT_IN_DSBENCH_CONVERT,
     .help = "with --shards: at most N samples a shard as well"},
};

static const dsrt_option_group GROUPS[] = {
    {"datastore", "Datastore options", DATASTORE_OPTIONS, DSRT_ARRAY_SIZE(DATASTORE_OPTIONS)},
    {"pipeline", "Pipeline and augmentation options", PIPELINE_OPTIONS,
     DSRT_ARRAY_SIZE(PIPELINE_OPTIONS)},
    {"profiling", "Profiling options (dsbench)", PROFILING_OPTIONS,
     DSRT_ARRAY_SIZE(PROFILING_OPTIONS)},
};

size_t dsrt_option_groups(const dsrt_option_group **groups) {
    *groups = GROUPS;
    return DSRT_ARRAY_SIZE(GROUPS);
}

// ----------------------------------------------------------------------------
// Lookups

/* 1 when a[0, n) and b are one name, '-' and '_' alike. */
static int same_name(const char *a, size_t n, const char *b) {
    for (size_t i = 0; i < n; i++, b++) {
        char x = a[i] == '_' ? '-' : a[i], y = *b == '_' ? '-' : *b;
        if (!*b || x != y) return 0;
    }
    return *b == '\0';
}

static const char *bare(const char *name) {
    return name[0] == '-' && name[1] == '-' ? name + 2 : name;
}

const dsrt_option *dsrt_option_find(const dsrt_option_group *groups, size_t n, const char *name,
                                    unsigned where, int *old) {
    name = bare(name);
    size_t len = strcspn(name, "=");
    const dsrt_option *by_old = NULL;
    for (size_t g = 0; g < n; g++)
        for (size_t i = 0; i < groups[g].count; i++) {
            const dsrt_option *o = &groups[g].options[i];
            if ((o->where & where) && same_name(name, len, o->name)) {
                if (old) *old = 0;
                return o;
            }
            if (o->old && (o->old_where & where) && same_name(name, len, o->old)) by_old = o;
        }
    if (old) *old = by_old != NULL;
    return by_old;
}

const char *dsrt_option_nearest(const dsrt_option_group *groups, size_t n, const char *name,
                                unsigned where) {
    name = bare(name);
    size_t len = strcspn(name, "=");
    const char *best = NULL;
    int best_d = (len > 4 ? 2 : 1) + 1;
    for (size_t g = 0; g < n; g++)
        for (size_t i = 0; i < groups[g].count; i++) {
            const dsrt_option *o = &groups[g].options[i];
            if (!(o->where & where)) continue;
            int d = dsrt__edit_distance(name, len, o->name, best_d - 1);
            if (d < best_d) best = o->name, best_d = d;
        }
    return best;
}

const char *dsrt_nearest_name(const char *name, const char *const *names) {
    size_t n = 0;
    while (names[n]) n++;
    return dsrt__nearest(name, strlen(name), names, n);
}

const char *dsrt_option_type_name(dsrt_option_type t) {
    static const char *const names[] = {"flag", "integer", "number", "size", "choice", "text"};
    return (unsigned)t < DSRT_ARRAY_SIZE(names) ? names[t] : "unknown";
}

// ----------------------------------------------------------------------------
// Values

/* A size in bytes with an optional K, M, G or T (powers of 1024; "KiB",
 * "MB" and "M" alike): 0 and *bytes, or -1. */
static int parse_size(const char *value, uint64_t *bytes) {
    static const char units[] = "KMGT";
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    if (end == value || errno || value[0] == '-') return -1;
    int shift = 0;
    if (*end) {
        const char *u = strchr(units, *end & ~0x20);
        if (!u || !*u) return -1;
        shift = 10 * (int)(u - units + 1);
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return -1;
    }
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *bytes = (uint64_t)v << shift;
    return 0;
}

/* The new name of an older value name in o->old_values ("old=new,...")
 * into buf, or NULL. */
static const char *renamed_value(const dsrt_option *o, const char *value, char *buf, size_t cap) {
    size_t n = strlen(value);
    for (const char *p = o->old_values; p && *p;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!eq) break;
        if ((size_t)(eq - p) == n && strncmp(p, value, n) == 0) {
            size_t m = end ? (size_t)(end - eq - 1) : strlen(eq + 1);
            snprintf(buf, cap, "%.*s", (int)m, eq + 1);
            return buf;
        }
        p = end ? end + 1 : "";
    }
    return NULL;
}

static int choice_value(const dsrt_option *o, const char *spelled, const char *value,
                        double *number, const char **renamed) {
    const char *names[64];
    size_t n = 0;
    while (n < DSRT_ARRAY_SIZE(names) - 1 && (names[n] = o->choice((int)n))) {
        if (!*names[n]) names[n] = NULL; /* a hole in the enum */
        n++;
    }
    char buf[64];
    const char *want = renamed_value(o, value, buf, sizeof buf);
    for (size_t i = 0; i < n; i++)
        if (names[i] && strcmp(want ? want : value, names[i]) == 0) {
            *number = (double)i;
            if (renamed && want) *renamed = names[i];
            return 0;
        }
    char list[512];
    size_t at = 0, shown = 0, named = 0;
    for (size_t i = 0; i < n; i++) named += names[i] != NULL;
    for (size_t i = 0; i < n && at < sizeof list; i++)
        if (names[i])
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s",
                                   shown++ == 0     ? ""
                                   : shown == named ? " or "
                                                    : ", ",
                                   names[i]);
    const char *near = dsrt__nearest(value, strlen(value), names, n);
    if (near)
        return dsrt__fail(DSRT_EOPTION, "%s: '%s' is not %s (did you mean %s?)", spelled, value,
                          list, near);
    return dsrt__fail(DSRT_EOPTION, "%s: '%s' is not %s", spelled, value, list);
}

int dsrt_option_value(const dsrt_option *o, const char *spelled, const char *value, double *number,
                      const char **renamed) {
    if (renamed) *renamed = NULL;
    *number = 0;
    if (o->type == DSRT_OPTION_FLAG || o->type == DSRT_OPTION_TEXT) return 0;
    if (o->type == DSRT_OPTION_CHOICE && o->choice)
        return choice_value(o, spelled, value, number, renamed);
    char *end;
    errno = 0;
    if (o->type == DSRT_OPTION_SIZE) {
        uint64_t b;
        if (parse_size(value, &b) != 0 || (double)b < o->min || (double)b > o->max)
            return dsrt__fail(DSRT_EOPTION,
                              "%s: '%s' is not a size in bytes from %.0f to %.0f (suffixes K, "
                              "M, G, T)",
                              spelled, value, o->min, o->max);
        *number = (double)b;
        return 0;
    }
    if (o->type == DSRT_OPTION_INT) {
        /* Counts and seeds reach 2^64 - 1; the rest are signed. */
        double v = o->min >= 0 ? (value[0] == '-' ? -1.0 : (double)strtoull(value, &end, 10))
                               : (double)strtoll(value, &end, 10);
        if (value[0] == '-' && o->min >= 0) end = (char *)value;
        if (errno || end == value || *end)
            return dsrt__fail(DSRT_EOPTION, "%s: '%s' is not an integer", spelled, value);
        if (v < o->min || v > o->max)
            return dsrt__fail(DSRT_EOPTION, "%s: %s is outside [%.0f, %.0f]", spelled, value,
                              o->min, o->max);
        *number = v;
        return 0;
    }
    double v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v))
        return dsrt__fail(DSRT_EOPTION, "%s: '%s' is not a number", spelled, value);
    if (v < o->min || v > o->max)
        return dsrt__fail(DSRT_EOPTION, "%s: %g is outside [%g, %g]", spelled, v, o->min, o->max);
    *number = v;
    return 0;
}
