/*
 * dstrain classify: the label and scores of image files or of a folder's
 * images, read and decoded on threads beside the net's batches.
 */
#include "dstrain.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest image file classify reads. */
#define IMAGE_FILE_MAX ((size_t)256 << 20)

static struct {
    const char *model, *size_mode;
    int top, batch, threads, json, resize_shorter;
    device_args dev;
    onnx_args onnx;
} cl;

static const option CLASSIFY_OPTIONS[] = {
    {"model", OPT_STR, &cl.model},
    {"top", OPT_INT, &cl.top},
    {"batch", OPT_INT, &cl.batch},
    {"threads", OPT_INT, &cl.threads},
    DEVICE_OPTIONS(cl.dev),
    ONNX_OPTIONS(cl.onnx),
    ONNX_CLASSES_OPTION(cl.onnx),
    {"json", OPT_FLAG, &cl.json},
    {"size-mode", OPT_STR, &cl.size_mode},
    {"resize-shorter", OPT_INT, &cl.resize_shorter},
    {NULL, 0, NULL},
};

static void classify_usage(FILE *f) {
    fprintf(f,
            "usage: %s classify --model FILE [options] PATH...\n\n"
            "Labels images: each PATH is a JPEG, PNG or WebP file, or a folder whose images\n"
            "(in its sub-folders too) are all labelled. Prints, for each image, its path and\n"
            "the K likeliest labels (--top, 3 by default) with their scores (softmax\n"
            "probabilities), or with --json all the scores. Images are resized to the model's\n"
            "input size and converted to its channels, as in training. Columns are separated\n"
            "by tabs; a tab, newline or backslash in a path or class name is written \\t, \\n\n"
            "or \\\\.\n\n"
            "options:\n",
            prog);
    print_options(f, "classify", CLASSIFY_OPTIONS);
}

/*
 * classify streams: a thread reads, decodes and resizes the next batch's
 * images while the net computes on this one, two batches in turn, in the
 * order the paths were given.
 */
typedef struct {
    float *x;
    const char **paths; /* c->files' */
    int n, failures;
    int full; /* 0: the reader's to fill; 1: the net's; 2: the net's, and the last */
} classify_batch;

typedef struct {
    dsrt_net *net;
    dsrt_net_info ni;
    dsrt_decoder *dec;
    dsrt_augmenter *aug;
    dsrt_augment_options ao;
    float *scores;
    char **files; /* every image, folders listed */
    size_t n_files;
    classify_batch b[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int failures;
} classifier;

/* Predicts batch b and prints its images' classes. */
static void classify_flush(classifier *c, classify_batch *b) {
    if (b->n == 0) return;
    int C = c->ni.classes;
    if (dsrt_net_predict(c->net, b->x, b->n, c->scores, NULL, NULL, NULL) != 0) {
        fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
        c->failures += b->n;
    } else {
        char name[256], nb[32];
        for (int i = 0; i < b->n; i++) {
            const float *s = c->scores + (size_t)i * C;
            int finite = 1;
            for (int q = 0; q < C; q++) finite &= isfinite(s[q]) != 0;
            if (!finite) {
                /* No class can be named from NaN: the image fails, and the
                 * JSON line says so with its scores as they are. */
                fprintf(stderr,
                        "%s classify: %s: the model's scores are not finite (NaN or infinite): "
                        "its weights or input statistics are broken\n",
                        prog, b->paths[i]);
                c->failures++;
                if (cl.json) {
                    printf("{\"path\": ");
                    tool_json_string(stdout, b->paths[i]);
                    printf(", \"label\": null, \"class\": null, \"score\": null, \"scores\": [");
                    for (int q = 0; q < C; q++)
                        printf("%s%s", q ? ", " : "", jnum(nb, (double)s[q]));
                    printf("], \"error\": \"scores not finite\"}\n");
                }
                continue;
            }
            int k = cl.top < C ? cl.top : C;
            int best[64];
            if (k > 64) k = 64;
            for (int j = 0; j < k; j++) {
                int top = -1;
                for (int q = 0; q < C; q++) {
                    int taken = 0;
                    for (int t = 0; t < j; t++) taken |= best[t] == q;
                    if (!taken && (top < 0 || s[q] > s[top])) top = q;
                }
                best[j] = top;
            }
            if (cl.json) {
                printf("{\"path\": ");
                tool_json_string(stdout, b->paths[i]);
                if (dsrt_net_class_name(c->net, best[0], name, sizeof name) < 0)
                    snprintf(name, sizeof name, "%d", best[0]);
                printf(", \"label\": ");
                tool_json_string(stdout, name);
                printf(", \"class\": %d, \"score\": %.6g, \"scores\": [", best[0],
                       (double)s[best[0]]);
                for (int q = 0; q < C; q++) printf("%s%.6g", q ? ", " : "", (double)s[q]);
                printf("]}\n");
            } else {
                /* Tab-separated: tabs and newlines in names are escaped. */
                tool_text_field(stdout, b->paths[i]);
                for (int j = 0; j < k; j++) {
                    if (dsrt_net_class_name(c->net, best[j], name, sizeof name) < 0)
                        snprintf(name, sizeof name, "%d", best[j]);
                    putchar('\t');
                    tool_text_field(stdout, name);
                    printf("\t%.4f", (double)s[best[j]]);
                }
                printf("\n");
            }
        }
    }
    b->n = 0;
}

/* Reads, decodes and resizes path into batch b's next image; a failure
 * is reported and counted in b. */
static void classify_file(classifier *c, classify_batch *b, const char *path) {
    size_t len = 0;
    char why[256];
    char *data = tool_read_file(path, IMAGE_FILE_MAX, &len, why, sizeof why);
    dsrt_image_info info;
    dsrt_image img;
    if (!data) {
        fprintf(stderr, "%s classify: %s: %s\n", prog, path, why);
        b->failures++;
        return;
    }
    dsrt_decode_request req = {.channels = c->ni.channels};
    int ok = dsrt_decoder_info(c->dec, data, len, &info) == 0;
    if (ok) {
        dsrt_augment_decode_size(&c->ao, info.width, info.height, &req.min_width, &req.min_height);
        ok = dsrt_decode(c->dec, data, len, &req, &img) == 0;
    }
    float *dst = b->x + (size_t)b->n * c->ni.channels * c->ni.height * c->ni.width;
    if (ok)
        ok = dsrt_augment_apply(c->aug, &c->ao, &img, info.width, info.height, 0, 0, 0, dst) == 0;
    free(data);
    if (!ok) {
        fprintf(stderr, "%s classify: %s: %s\n", prog, path, dsrt_last_error());
        b->failures++;
        return;
    }
    b->paths[b->n++] = path;
}

/* The reader: fills the two batches in turn, each once the net is done
 * with it; the last one it fills is marked with full = 2. */
static void *classify_reader(void *arg) {
    classifier *c = arg;
    size_t next = 0;
    for (int k = 0;; k ^= 1) {
        classify_batch *b = &c->b[k];
        pthread_mutex_lock(&c->mu);
        while (b->full) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        while (b->n < cl.batch && next < c->n_files) classify_file(c, b, c->files[next++]);
        pthread_mutex_lock(&c->mu);
        b->full = next < c->n_files ? 1 : 2;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (next == c->n_files) return NULL;
    }
}

/* Classifies c->files: the reader one batch ahead of the net. */
static int classify_all(classifier *c) {
    pthread_t reader;
    if (pthread_create(&reader, NULL, classify_reader, c) != 0) {
        fprintf(stderr, "%s classify: cannot start the reading thread\n", prog);
        return -1;
    }
    for (int k = 0;; k ^= 1) {
        classify_batch *b = &c->b[k];
        pthread_mutex_lock(&c->mu);
        while (!b->full) pthread_cond_wait(&c->cv, &c->mu);
        int last = b->full == 2;
        pthread_mutex_unlock(&c->mu);
        classify_flush(c, b);
        c->failures += b->failures;
        b->failures = 0;
        pthread_mutex_lock(&c->mu);
        b->full = 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (last) break;
    }
    pthread_join(reader, NULL);
    return 0;
}

/* Adds path to c->files (a copy); -1 when out of memory. */
static int classify_add(classifier *c, size_t *cap, const char *path) {
    if (c->n_files == *cap) {
        size_t n = *cap ? 2 * *cap : 256;
        char **f = realloc(c->files, n * sizeof *f);
        if (!f) return -1;
        c->files = f;
        *cap = n;
    }
    if (!(c->files[c->n_files] = strdup(path))) return -1;
    c->n_files++;
    return 0;
}

/* The options into cl and the paths (the arguments that are neither
 * options nor their values) into paths. Returns -1 to go on, else the exit
 * status (0 after --help). */
static int classify_args(int argc, char **argv, char **paths, int *npaths, int *mode) {
    memset(&cl, 0, sizeof cl);
    cl.top = 3;
    cl.batch = 64;
    char **opts = calloc((size_t)argc + 1, sizeof *opts);
    int nopts = 0;
    if (!opts) return 1;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0 && strcmp(argv[i], "-h") != 0) {
            paths[(*npaths)++] = argv[i];
            continue;
        }
        opts[nopts++] = argv[i];
        const option *o = CLASSIFY_OPTIONS;
        while (o->name && strcmp(argv[i] + 2, o->name) != 0) o++;
        if (o->name && o->type != OPT_FLAG && i + 1 < argc) opts[nopts++] = argv[++i];
    }
    int rc = parse_options("classify", nopts, opts, CLASSIFY_OPTIONS, classify_usage);
    free(opts);
    if (rc) return rc > 0 ? 0 : 2;
    if (!cl.model || *npaths == 0) {
        fprintf(stderr,
                "%s classify: --model FILE and at least one PATH are required (see %s "
                "classify --help)\n",
                prog, prog);
        return 2;
    }
    *mode = cl.size_mode ? parse_choice("classify", "size-mode", cl.size_mode) : 0;
    return *mode < 0 ? 2 : -1;
}

int cmd_classify(int argc, char **argv) {
    char **paths = calloc((size_t)argc + 1, sizeof *paths);
    int npaths = 0, status = 1, mode = 0, rc;
    if (!paths) return 1;
    if ((rc = classify_args(argc, argv, paths, &npaths, &mode)) >= 0) {
        free(paths);
        return rc;
    }
    classifier c = {0};
    size_t cap = 0;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    dsrt_net_options no = dsrt_net_defaults();
    if ((rc = resolve_device_args("classify", &cl.dev, &no, NULL))) {
        status = rc;
        goto out;
    }
    no.threads = cl.threads;
    if ((status = load_model("classify", "--model", cl.model, &cl.onnx, &no, &c.net))) goto out;
    status = 1;
    dsrt_net_get_info(c.net, &c.ni);
    if (!cl.threads) {
        /* eval's split: every core but those the decoding thread fills. */
        unsigned workers;
        int threads;
        if (dsrt_cores_split(&c.ni, NULL, &workers, &threads) == 0)
            dsrt_net_set_threads(c.net, threads);
    }
    c.ao = dsrt_augment_defaults();
    c.ao.size_mode = mode == 1 ? DSRT_AUGMENT_CENTERCROP : DSRT_AUGMENT_RESIZE;
    c.ao.resize_shorter = cl.resize_shorter;
    c.ao.output_height = c.ni.height;
    c.ao.output_width = c.ni.width;
    c.ao.output_channels = c.ni.channels;
    size_t per = (size_t)c.ni.channels * c.ni.height * c.ni.width;
    c.scores = malloc((size_t)cl.batch * c.ni.classes * sizeof *c.scores);
    int nomem =
        !c.scores || dsrt_decoder_create(&c.dec, NULL) != 0 || dsrt_augmenter_create(&c.aug) != 0;
    for (int k = 0; k < 2 && !nomem; k++) {
        c.b[k].x = malloc((size_t)cl.batch * per * sizeof *c.b[k].x);
        c.b[k].paths = calloc((size_t)cl.batch, sizeof *c.b[k].paths);
        nomem = !c.b[k].x || !c.b[k].paths;
    }
    /* Every image first (a folder's in its listing's order), then the
     * batches. */
    for (int i = 0; i < npaths && !nomem; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            int e = errno;
            char shown[4096];
            fprintf(stderr, "%s classify: %s: %s\n", prog,
                    tool_shown(paths[i], shown, sizeof shown), strerror(e));
            c.failures++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            nomem = classify_add(&c, &cap, paths[i]) != 0;
            continue;
        }
        dsrt_datastore_options dso = dsrt_datastore_defaults();
        dso.source = DSRT_SOURCE_FOLDER;
        dso.label_source = DSRT_LABEL_NONE;
        dsrt_datastore *ds;
        if (dsrt_datastore_open(&ds, paths[i], &dso) != 0) {
            fprintf(stderr, "%s classify: %s\n", prog, dsrt_last_error());
            c.failures++;
            continue;
        }
        for (size_t k = 0; k < dsrt_datastore_count(ds) && !nomem; k++)
            nomem = classify_add(&c, &cap, dsrt_datastore_path(ds, k)) != 0;
        dsrt_datastore_close(ds);
    }
    if (nomem) {
        fprintf(stderr, "%s classify: out of memory\n", prog);
        goto out;
    }
    if (c.n_files && classify_all(&c) != 0) goto out;
    status = c.failures ? 1 : 0;
out:
    for (size_t i = 0; i < c.n_files; i++) free(c.files[i]);
    free(c.files);
    for (int k = 0; k < 2; k++) {
        free(c.b[k].x);
        free(c.b[k].paths);
    }
    free(c.scores);
    dsrt_decoder_destroy(c.dec);
    dsrt_augmenter_destroy(c.aug);
    dsrt_net_destroy(c.net);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    free(paths);
    return status;
}
