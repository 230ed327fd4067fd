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
 *
 * One file a mode: index.c, convert.c, pipeline.c; this file the options
 * (rows of the library's tables bound to the fields they set), the usage
 * and main.
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
const char *choice_name(const char *option, int i) {
    tool_tables t = tables();
    const dsrt_option *row = tool_option_find(&t, option, DSRT_IN_DSBENCH, NULL);
    const char *name = row && row->choice ? row->choice(i) : NULL;
    return name ? name : "unknown";
}

const char *preset_name(const options *o) {
    return choice_name("preset", (int)o->kind);
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
    {"io-depth", SET_UNSIGNED, AT(po.reader.depth), AFTER_PIPELINE},
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
