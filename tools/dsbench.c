/*
 * dsbench: profiles dsrt's input side on a dataset.
 *
 *   dsbench FOLDER --index [--json]      scan the dataset and report classes and counts
 *   dsbench convert SRC OUT              write an IDX or CIFAR source as an image folder
 *
 * Uses only the public API, like any program that embeds libdsrt.
 */
#include <dsrt.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tool_common.h"

static const char usage[] =
    "usage: dsbench DATA --index [options]\n"
    "       dsbench convert SRC OUT [options]\n"
    "\n"
    "Profiles dsrt's datastore on DATA: a folder of class sub-folders, a CSV manifest\n"
    "(path,label), IDX files (MNIST, Fashion-MNIST) or CIFAR-10/100 binary batches.\n"
    "\n"
    "Commands:\n"
    "  DATA --index          scan DATA and report the classes, the images per class\n"
    "                        and the time the scan took\n"
    "  convert SRC OUT       write an IDX or CIFAR source as OUT/<class>/<n>.png; a\n"
    "                        folder holding both splits gives OUT/train and OUT/test\n"
    "                        (a folder named 'convert' is written './convert')\n"
    "\n"
    "Options for DATA:\n"
    "  --source KIND         auto (default), folder, manifest, idx, cifar10, cifar100\n"
    "  --labels FROM         folder (default: the first sub-folder under DATA names the\n"
    "                        class, as torchvision's ImageFolder), parent (the folder\n"
    "                        holding the file, as MATLAB's 'foldernames'), none\n"
    "  --extensions LIST     file extensions to take, e.g. jpg,png (default\n"
    "                        jpg,jpeg,jpe,jfif,png; case-insensitive)\n"
    "  --no-subfolders       only files directly inside each class folder\n"
    "  --no-follow           do not follow symbolic links\n"
    "  --split train|test    for IDX and CIFAR folders (default train)\n"
    "  --coarse              CIFAR-100: the 20 coarse labels instead of the 100 fine\n"
    "  --json                one JSON line instead of a table:\n"
    "                        {\"classes\":[...],\"counts\":[...],\"images\":N,\"scan_s\":S}\n"
    "\n"
    "Options for convert:\n"
    "  --split train|test|both  which split of a folder of IDX/CIFAR files (default both)\n"
    "  --class-names LIST    comma-separated folder names, one per class, in class order\n"
    "  --source, --coarse    as above\n"
    "\n"
    "  -h, --help            this help\n"
    "  --version             dsrt's version\n";

typedef struct {
    const char *data;
    int index, json;
    dsrt_datastore_options ds;
    /* convert */
    const char *out;
    int split_both;
    const char *class_names;
} options;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ----------------------------------------------------------------------------
// Options

static int parse_source(const char *v, dsrt_source *s) {
    static const char *const names[] = {"auto", "folder", "manifest", "idx", "cifar10", "cifar100"};
    for (int k = 0; k < 6; k++)
        if (strcmp(v, names[k]) == 0) {
            *s = (dsrt_source)k;
            return 0;
        }
    return -1;
}

/* Parses the options shared by both commands; returns 1 when argv[*i] was one. */
static int parse_datastore_option(int argc, char **argv, int *i, options *o) {
    const char *a = argv[*i];
    if (strcmp(a, "--source") == 0) {
        const char *v = tool_value(argc, argv, i);
        if (parse_source(v, &o->ds.source) != 0)
            tool_die_usage("--source: '%s' is not auto, folder, manifest, idx, cifar10 or "
                           "cifar100",
                           v);
    } else if (strcmp(a, "--labels") == 0) {
        const char *v = tool_value(argc, argv, i);
        if (strcmp(v, "folder") == 0)
            o->ds.label_source = DSRT_LABEL_FOLDER_NAMES;
        else if (strcmp(v, "parent") == 0)
            o->ds.label_source = DSRT_LABEL_PARENT_FOLDER;
        else if (strcmp(v, "none") == 0)
            o->ds.label_source = DSRT_LABEL_NONE;
        else
            tool_die_usage("--labels: '%s' is not folder, parent or none", v);
    } else if (strcmp(a, "--extensions") == 0) {
        o->ds.extensions = tool_value(argc, argv, i);
    } else if (strcmp(a, "--no-subfolders") == 0) {
        o->ds.include_subfolders = 0;
    } else if (strcmp(a, "--no-follow") == 0) {
        o->ds.follow_symlinks = 0;
    } else if (strcmp(a, "--coarse") == 0) {
        o->ds.cifar100_coarse = 1;
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

static int run_index(const options *o) {
    dsrt_datastore *ds;
    double t0 = now_s();
    int rc = dsrt_datastore_open(&ds, o->data, &o->ds);
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
        printf("],\"images\":%zu,\"scan_s\":%.6f,\"warnings\":%zu}\n", n, scan_s,
               dsrt_datastore_warning_count(ds));
    } else {
        printf("%s: %zu images in %zu classes (%s source), indexed in %.3f s\n", o->data, n, nc,
               dsrt_source_name(dsrt_datastore_source(ds)), scan_s);
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
    int64_t n = dsrt_datastore_export(ds, out, names);
    if (n < 0) tool_die("%s", dsrt_last_error());
    fprintf(stderr, "dsbench: wrote %lld images in %zu classes to %s in %.1f s\n", (long long)n,
            dsrt_datastore_num_classes(ds), out, now_s() - t0);
    free(names);
    free(copy);
    dsrt_datastore_close(ds);
    return n;
}

static int run_convert(options *o) {
    struct stat st;
    if (stat(o->data, &st) != 0) tool_die("convert: %s: %s", o->data, strerror(errno));
    int both = o->split_both && S_ISDIR(st.st_mode);
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

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.ds = dsrt_datastore_defaults();
    o.split_both = 1;
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
        } else if (convert && strcmp(a, "--class-names") == 0) {
            o.class_names = tool_value(argc, argv, &i);
        } else if (a[0] == '-' && a[1] != '\0') {
            tool_die_usage("unknown option '%s'", a);
        } else if (n_pos < (size_t)(convert ? 2 : 1)) {
            positional[n_pos++] = a;
        } else {
            tool_die_usage("unexpected argument '%s'", a);
        }
    }
    if (convert) {
        if (n_pos != 2) tool_die_usage("convert needs SRC and OUT");
        o.data = positional[0];
        o.out = positional[1];
        return run_convert(&o);
    }
    if (n_pos != 1) tool_die_usage("no data given");
    o.data = positional[0];
    if (!o.index) tool_die_usage("nothing to do: give --index");
    return run_index(&o);
}
