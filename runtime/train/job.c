/*
 * The workers of a data-parallel run agree that they run the same job before
 * any step. Workers launched with different options or data would otherwise
 * train silently on overlapping or missing shares of the epochs (another
 * seed, batch or sample count), take different collective paths (a
 * checkpoint folder on one only) and fail much later on a timeout that
 * names the wrong cause.
 *
 * Every worker describes its job as a list of items: the options that shape
 * the order of the samples, their augmentation, the net and the optimizer,
 * the net's description, and each datastore's sample count, class names and
 * samples (the path of each below the data's common folder, its size and
 * label, or its pixels when they are held in memory). Worker 0's list goes to
 * every worker (one broadcast); a worker whose list differs fails, naming the
 * first item that differs with both values; then, when a class list or the
 * samples differ, worker 0's class names or per-sample hashes go out too and
 * the message names the first class or file that differs on each side. The
 * failure is agreed (dsrt__dp_agree), so every worker stops at once with the
 * message of the first worker that differs.
 */
#include "runtime/train/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FNV_BASIS 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

// ----------------------------------------------------------------------------
// The items of a job

typedef enum { K_INT, K_REAL, K_HASH } item_kind;

/* One item: a name and 64 bits (an integer, a double's bits or a hash). */
typedef struct {
    const char *name;
    item_kind kind;
    uint64_t bits;
    int data; /* 0, or which datastore's samples (1 train, 2 validation) a K_HASH of
                 samples is, or -1, -2 for their class names */
} job_item;

typedef struct {
    job_item *it;
    size_t n, cap;
    int oom; /* an item could not be added */
} job_list;

static void add(job_list *l, const char *name, item_kind kind, uint64_t bits, int data) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 128;
        job_item *m = realloc(l->it, cap * sizeof *m);
        if (!m) {
            l->oom = 1;
            return;
        }
        l->it = m;
        l->cap = cap;
    }
    l->it[l->n++] = (job_item){name, kind, bits, data};
}

static void add_int(job_list *l, const char *name, int64_t v) {
    add(l, name, K_INT, (uint64_t)v, 0);
}

static void add_real(job_list *l, const char *name, double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    add(l, name, K_REAL, b, 0);
}

/* The folder every path of ds lies in, as a prefix length (through its last
 * '/'): sample paths are compared below it, so that workers may mount the
 * data in different places. */
static size_t common_folder(const dsrt_datastore *ds) {
    size_t n = dsrt_datastore_count(ds), len = 0;
    const char *first = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *p = dsrt_datastore_path(ds, i);
        if (!p) continue;
        if (!first) {
            first = p;
            len = strlen(p);
            continue;
        }
        size_t k = 0;
        while (k < len && p[k] == first[k]) k++;
        len = k;
    }
    while (len > 0 && first[len - 1] != '/') len--;
    return len;
}

/* Sample i of ds: its path below the common folder, its size and label, or
 * its pixels and label when ds holds them in memory. */
static uint64_t sample_hash(const dsrt_datastore *ds, size_t i, size_t cut) {
    int32_t label = dsrt_datastore_label(ds, i);
    uint64_t h = fnv(FNV_BASIS, &label, sizeof label);
    const char *p = dsrt_datastore_path(ds, i);
    if (p) {
        struct stat st;
        int64_t size = stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
        h = fnv(h, p + cut, strlen(p + cut));
        return fnv(h, &size, sizeof size);
    }
    dsrt_image v;
    if (dsrt_datastore_pixels(ds, i, &v) == 0) {
        int32_t dims[3] = {v.width, v.height, v.channels};
        h = fnv(h, dims, sizeof dims);
        for (int y = 0; y < v.height; y++)
            h = fnv(h, v.data + (size_t)y * v.stride, (size_t)v.width * (size_t)v.channels);
    }
    return h;
}

/* (count) the hash of each sample of ds (malloc'd), and their hash. */
static uint64_t *sample_hashes(const dsrt_datastore *ds, uint64_t *all) {
    size_t n = dsrt_datastore_count(ds), cut = common_folder(ds);
    uint64_t *h = dsrt__malloc(n * sizeof *h + 1);
    *all = FNV_BASIS;
    for (size_t i = 0; h && i < n; i++) {
        h[i] = sample_hash(ds, i, cut);
        *all = fnv(*all, &h[i], sizeof h[i]);
    }
    return h;
}

/* The class names of ds, each ending in '\n' (malloc'd). */
static char *class_text(const dsrt_datastore *ds, size_t *len) {
    size_t n = ds ? dsrt_datastore_num_classes(ds) : 0, total = 1;
    for (size_t c = 0; c < n; c++) total += strlen(dsrt_datastore_class_name(ds, c)) + 1;
    char *t = dsrt__malloc(total);
    if (!t) return NULL;
    size_t at = 0;
    for (size_t c = 0; c < n; c++) {
        const char *name = dsrt_datastore_class_name(ds, c);
        size_t k = strlen(name);
        memcpy(t + at, name, k);
        t[at + k] = '\n';
        at += k + 1;
    }
    t[at] = '\0';
    *len = at;
    return t;
}

static void add_augment(job_list *l, const dsrt_augment_options *a) {
    add_int(l, "augment.output_height", a->output_height);
    add_int(l, "augment.output_width", a->output_width);
    add_int(l, "augment.output_channels", a->output_channels);
    add_int(l, "augment.size_mode", a->size_mode);
    add_int(l, "augment.resize_shorter", a->resize_shorter);
    add_int(l, "augment.rand_x_reflection", a->rand_x_reflection);
    add_int(l, "augment.rand_y_reflection", a->rand_y_reflection);
    add_real(l, "augment.reflection_probability", a->reflection_probability);
    static const struct {
        const char *name[2];
        size_t off;
    } ranges[] = {
        {{"augment.rand_rotation[0]", "augment.rand_rotation[1]"},
         offsetof(dsrt_augment_options, rand_rotation)},
        {{"augment.rand_scale[0]", "augment.rand_scale[1]"},
         offsetof(dsrt_augment_options, rand_scale)},
        {{"augment.rand_x_scale[0]", "augment.rand_x_scale[1]"},
         offsetof(dsrt_augment_options, rand_x_scale)},
        {{"augment.rand_y_scale[0]", "augment.rand_y_scale[1]"},
         offsetof(dsrt_augment_options, rand_y_scale)},
        {{"augment.rand_x_shear[0]", "augment.rand_x_shear[1]"},
         offsetof(dsrt_augment_options, rand_x_shear)},
        {{"augment.rand_y_shear[0]", "augment.rand_y_shear[1]"},
         offsetof(dsrt_augment_options, rand_y_shear)},
        {{"augment.rand_x_translation[0]", "augment.rand_x_translation[1]"},
         offsetof(dsrt_augment_options, rand_x_translation)},
        {{"augment.rand_y_translation[0]", "augment.rand_y_translation[1]"},
         offsetof(dsrt_augment_options, rand_y_translation)},
    };
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(ranges); i++) {
        const double *r = (const double *)((const char *)a + ranges[i].off);
        add_real(l, ranges[i].name[0], r[0]);
        add_real(l, ranges[i].name[1], r[1]);
    }
    add_int(l, "augment.translation_units", a->translation_units);
    add_int(l, "augment.translation_whole_pixels", a->translation_whole_pixels);
    static const char *const fill[3] = {"augment.fill_value[0]", "augment.fill_value[1]",
                                        "augment.fill_value[2]"};
    static const char *const mean[3] = {"augment.mean[0]", "augment.mean[1]", "augment.mean[2]"};
    static const char *const std[3] = {"augment.std[0]", "augment.std[1]", "augment.std[2]"};
    for (int c = 0; c < 3; c++) {
        add_real(l, fill[c], a->fill_value[c]);
        add_real(l, mean[c], a->mean[c]);
        add_real(l, std[c], a->std[c]);
    }
    add_int(l, "augment.layout", a->layout);
    add_int(l, "augment.norm", a->norm);
    add_real(l, "augment.decode_oversample", a->decode_oversample);
    add_int(l, "augment.decode_dc", a->decode_dc);
    static const struct {
        const char *name[2];
        size_t off;
    } recipe[] = {
        {{"augment.crop_scale[0]", "augment.crop_scale[1]"},
         offsetof(dsrt_augment_options, crop_scale)},
        {{"augment.crop_ratio[0]", "augment.crop_ratio[1]"},
         offsetof(dsrt_augment_options, crop_ratio)},
        {{"augment.brightness[0]", "augment.brightness[1]"},
         offsetof(dsrt_augment_options, brightness)},
        {{"augment.contrast[0]", "augment.contrast[1]"}, offsetof(dsrt_augment_options, contrast)},
        {{"augment.saturation[0]", "augment.saturation[1]"},
         offsetof(dsrt_augment_options, saturation)},
        {{"augment.hue[0]", "augment.hue[1]"}, offsetof(dsrt_augment_options, hue)},
        {{"augment.erase_scale[0]", "augment.erase_scale[1]"},
         offsetof(dsrt_augment_options, erase_scale)},
        {{"augment.erase_ratio[0]", "augment.erase_ratio[1]"},
         offsetof(dsrt_augment_options, erase_ratio)},
    };
    for (size_t i = 0; i < DSRT_ARRAY_SIZE(recipe); i++) {
        const double *r = (const double *)((const char *)a + recipe[i].off);
        add_real(l, recipe[i].name[0], r[0]);
        add_real(l, recipe[i].name[1], r[1]);
    }
    add_real(l, "augment.grayscale_probability", a->grayscale_probability);
    add_real(l, "augment.erase_probability", a->erase_probability);
    add_int(l, "augment.erase_random", a->erase_random);
    static const char *const erase[3] = {"augment.erase_value[0]", "augment.erase_value[1]",
                                         "augment.erase_value[2]"};
    for (int c = 0; c < 3; c++) add_real(l, erase[c], a->erase_value[c]);
}

/* The items of a datastore: which (1 training, 2 validation). */
static void add_data(job_list *l, const dsrt_datastore *ds, int which, uint64_t files_hash) {
    static const char *const names[2][4] = {
        {"training data: samples", "training data: classes", "training data: class names",
         "training data: files (names, sizes, labels)"},
        {"validation data: samples", "validation data: classes", "validation data: class names",
         "validation data: files (names, sizes, labels)"}};
    const char *const *n = names[which - 1];
    /* The counts go with the lists they count: a difference names the first
     * class or sample that differs too. Classes first: a class more holds
     * samples more. */
    add(l, n[1], K_INT, (uint64_t)dsrt_datastore_num_classes(ds), -which);
    size_t len = 0;
    char *t = class_text(ds, &len);
    add(l, n[2], K_HASH, t ? fnv(FNV_BASIS, t, len) : 0, -which);
    free(t);
    add(l, n[0], K_INT, (uint64_t)dsrt_datastore_count(ds), which);
    add(l, n[3], K_HASH, files_hash, which);
}

/* Everything of the job that must be the same on every worker. */
static void job_items(const run *R, job_list *l, const uint64_t files_hash[2]) {
    const dsrt_train_options *o = R->o;
    add_int(l, "max_epochs", o->max_epochs);
    add_int(l, "batch", o->batch);
    add_int(l, "shuffle", o->shuffle);
    add_int(l, "drop_last", o->drop_last);
    add(l, "seed", K_INT, o->seed, 0);
    add_int(l, "optimizer.solver", o->optimizer.solver);
    add_real(l, "optimizer.learn_rate", o->optimizer.learn_rate);
    add_real(l, "optimizer.momentum", o->optimizer.momentum);
    add_real(l, "optimizer.l2", o->optimizer.l2);
    add_real(l, "optimizer.gradient_decay", o->optimizer.gradient_decay);
    add_real(l, "optimizer.sq_gradient_decay", o->optimizer.sq_gradient_decay);
    add_real(l, "optimizer.epsilon", o->optimizer.epsilon);
    add_int(l, "optimizer.schedule", o->optimizer.schedule);
    add_real(l, "optimizer.drop_factor", o->optimizer.drop_factor);
    add_int(l, "optimizer.drop_period", o->optimizer.drop_period);
    add_int(l, "optimizer.clip", o->optimizer.clip);
    add_real(l, "optimizer.grad_threshold", o->optimizer.grad_threshold);
    add_int(l, "validation (given or not)", o->validation != NULL);
    add_int(l, "validation_frequency", o->validation_frequency);
    add_int(l, "validation_patience", o->validation_patience);
    add_int(l, "validation_batch", o->validation_batch);
    add_int(l, "output_network", o->output_network);
    add_int(l, "checkpoint_path (given or not)", o->checkpoint_path != NULL);
    add_int(l, "checkpoint_frequency", o->checkpoint_frequency);
    add_int(l, "checkpoint_unit", o->checkpoint_unit);
    add_int(l, "resume (given or not)", o->resume != NULL);
    add_int(l, "averaging_frequency", o->averaging_frequency);
    add_int(l, "average_optimizer_state", o->average_optimizer_state);
    add_int(l, "bn_statistics", o->bn_statistics);
    add_int(l, "fail_on_error", o->fail_on_error);
    add_real(l, "mixup_alpha", o->mixup_alpha);
    add_real(l, "cutmix_alpha", o->cutmix_alpha);
    add_real(l, "cutmix_minmax[0]", o->cutmix_minmax[0]);
    add_real(l, "cutmix_minmax[1]", o->cutmix_minmax[1]);
    add_real(l, "mix_prob", o->mix_prob);
    add_real(l, "mix_switch_prob", o->mix_switch_prob);
    add_real(l, "label_smoothing", o->label_smoothing);
    add_augment(l, &o->augment);
    /* The data before the net, whose description names the classes. */
    add_data(l, R->train, 1, files_hash[0]);
    const char *desc = dsrt_net_description(R->net);
    add(l, "the net's description", K_HASH, fnv(FNV_BASIS, desc, strlen(desc)), 0);
    size_t np = 0;
    dsrt_net_params(R->net, &np);
    add_int(l, "the net's parameters", (int64_t)np);
    if (o->validation) add_data(l, o->validation, 2, files_hash[1]);
}

// ----------------------------------------------------------------------------
// Comparing

static void show(char *out, size_t size, const job_item *it, uint64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    if (it->kind == K_REAL)
        snprintf(out, size, "%.17g", d);
    else if (it->kind == K_HASH)
        snprintf(out, size, "%016llx", (unsigned long long)bits);
    else if (!strcmp(it->name, "seed"))
        snprintf(out, size, "%llu", (unsigned long long)bits);
    else
        snprintf(out, size, "%lld", (long long)bits);
}

/* Appends "; " and the formatted text to msg (size bytes). */
static void append(char *msg, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *msg, size_t size, const char *fmt, ...) {
    size_t at = strlen(msg);
    if (at + 3 >= size) return;
    memcpy(msg + at, "; ", 3);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + at + 2, size - at - 2, fmt, ap);
    va_end(ap);
}

/* Worker 0's class names (a broadcast of their text) against this worker's
 * (ds NULL: none): the first that differs, appended to msg when tell. */
static int differing_class(run *R, const dsrt_datastore *ds, int tell, char *msg, size_t size) {
    size_t len = 0;
    char *mine = class_text(ds, &len);
    double n = R->rank == 0 ? (double)len : 0;
    int rc = mine ? 0 : -ENOMEM;
    if ((rc = dsrt__dp_agree(R, rc, &n, 1))) goto out;
    char *theirs = dsrt__malloc((size_t)n + 1);
    rc = theirs ? 0 : -ENOMEM;
    if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) {
        free(theirs);
        goto out;
    }
    if (R->rank == 0) memcpy(theirs, mine, (size_t)n);
    if ((rc = dsrt_comm_bcast(R->comm, theirs, (size_t)n, 0))) {
        free(theirs);
        rc = dsrt__fail_prefix(rc, "train: comparing the workers' jobs");
        goto out;
    }
    theirs[(size_t)n] = '\0';
    if (tell) {
        const char *a = theirs, *b = mine;
        for (int c = 0;; c++) {
            size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
            if (!*a && !*b) break;
            if (!*a || !*b || la != lb || memcmp(a, b, la) != 0) {
                append(msg, size, "class %d is %s%.*s%s on worker 0, %s%.*s%s on worker %d", c,
                       *a ? "'" : "", (int)(*a ? la : 6), *a ? a : "absent", *a ? "'" : "",
                       *b ? "'" : "", (int)(*b ? lb : 6), *b ? b : "absent", *b ? "'" : "",
                       R->rank);
                break;
            }
            a += la + (a[la] == '\n');
            b += lb + (b[lb] == '\n');
        }
    }
    free(theirs);
out:
    free(mine);
    return rc;
}

/* Describes sample i of ds for a message (path below the common folder and
 * size, or its id), or "none" past the end. */
static void describe_sample(const dsrt_datastore *ds, size_t i, char *out, size_t size) {
    size_t n = ds ? dsrt_datastore_count(ds) : 0;
    if (i >= n) {
        snprintf(out, size, "none (%zu samples)", n);
        return;
    }
    const char *p = dsrt_datastore_path(ds, i);
    if (!p) {
        snprintf(out, size, "the sample of id %u held in memory",
                 (unsigned)dsrt_datastore_id(ds, i));
        return;
    }
    struct stat st;
    long long bytes = stat(p, &st) == 0 ? (long long)st.st_size : -1;
    snprintf(out, size, "'%.300s' (%lld bytes, class %d)", p + common_folder(ds), bytes,
             dsrt_datastore_label(ds, i));
}

/* Worker 0's per-sample hashes against this worker's (ds NULL: none): the
 * first sample that differs on each worker, then worker 0 tells what it has
 * there; appended to msg when tell. */
static int differing_file(run *R, const dsrt_datastore *ds, const uint64_t *mine, int tell,
                          char *msg, size_t size) {
    size_t n = ds ? dsrt_datastore_count(ds) : 0;
    double n0 = R->rank == 0 ? (double)n : 0;
    int rc = dsrt__dp_agree(R, 0, &n0, 1);
    if (rc) return rc;
    uint64_t *theirs = dsrt__malloc((size_t)n0 * sizeof *theirs + 1);
    double *at = dsrt__calloc((size_t)R->world, sizeof *at);
    rc = theirs && at ? 0 : -ENOMEM;
    if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) goto out;
    if (R->rank == 0) memcpy(theirs, mine, (size_t)n0 * sizeof *theirs);
    if ((rc = dsrt_comm_bcast(R->comm, theirs, (size_t)n0 * sizeof *theirs, 0))) {
        rc = dsrt__fail_prefix(rc, "train: comparing the workers' jobs");
        goto out;
    }
    size_t first = 0;
    while (first < n && first < (size_t)n0 && mine[first] == theirs[first]) first++;
    at[R->rank] = tell ? (double)first : -1;
    if ((rc = dsrt__dp_agree(R, 0, at, (size_t)R->world))) goto out;
    /* Worker 0 describes its sample at each worker's first difference. */
    char(*said)[400] = dsrt__calloc((size_t)R->world, sizeof *said);
    if ((rc = dsrt__dp_agree(R, said ? 0 : -ENOMEM, NULL, 0))) {
        free(said);
        goto out;
    }
    if (R->rank == 0)
        for (int k = 0; k < R->world; k++)
            if (at[k] >= 0) describe_sample(ds, (size_t)at[k], said[k], sizeof said[k]);
    rc = dsrt_comm_bcast(R->comm, said, (size_t)R->world * sizeof *said, 0);
    if (rc) {
        rc = dsrt__fail_prefix(rc, "train: comparing the workers' jobs");
    } else if (tell) {
        char here[400];
        describe_sample(ds, first, here, sizeof here);
        said[R->rank][sizeof said[R->rank] - 1] = '\0';
        append(msg, size, "sample %zu is %s on worker 0, %s on worker %d", first, said[R->rank],
               here, R->rank);
    }
    free(said);
out:
    free(theirs);
    free(at);
    return rc;
}

int dsrt__dp_same_job(run *R) {
    if (!R->comm || R->world < 2) return 0;
    const dsrt_datastore *data[2] = {R->train, R->o->validation};
    uint64_t *hashes[2] = {NULL, NULL}, all[2] = {0, 0};
    job_list l = {0};
    double *v = NULL;
    char msg[1024] = "";
    int rc = 0;
    for (int d = 0; d < 2 && !rc; d++)
        if (data[d] && !(hashes[d] = sample_hashes(data[d], &all[d]))) rc = -ENOMEM;
    if (!rc) job_items(R, &l, all);
    if (!rc && l.oom) rc = -ENOMEM;
    if ((rc = dsrt__dp_agree(R, rc, NULL, 0))) goto out;
    /* Lists differ in length only when validation data is given on some
     * workers, an item of its own before them: compare the common part. */
    size_t n = l.n;
    double n0d = R->rank == 0 ? (double)n : 0;
    if ((rc = dsrt__dp_agree(R, 0, &n0d, 1))) goto out;
    size_t n0 = (size_t)n0d;
    v = dsrt__calloc(2 * n0 + 1, sizeof *v);
    if ((rc = dsrt__dp_agree(R, v ? 0 : -ENOMEM, NULL, 0))) goto out;
    if (R->rank == 0)
        for (size_t i = 0; i < n; i++) {
            v[2 * i] = (double)(l.it[i].bits >> 32);
            v[2 * i + 1] = (double)(l.it[i].bits & 0xffffffffu);
        }
    if ((rc = dsrt_comm_bcast(R->comm, v, 2 * n0 * sizeof *v, 0))) {
        rc = dsrt__fail_prefix(rc, "train: comparing the workers' jobs");
        goto out;
    }
    /* The first item that differs from worker 0's, and whether a class list
     * or the samples of a datastore differ (then worker 0 sends them). */
    const job_item *bad = NULL;
    uint64_t theirs = 0;
    double need[4] = {0, 0, 0, 0}; /* class names, samples; of training, validation data */
    for (size_t i = 0; i < n && i < n0; i++) {
        uint64_t b = ((uint64_t)v[2 * i] << 32) | (uint64_t)v[2 * i + 1];
        if (b == l.it[i].bits) continue;
        if (!bad) {
            bad = &l.it[i];
            theirs = b;
        }
        int d = l.it[i].data;
        if (d) need[(d > 0 ? 2 : 0) + (abs(d) - 1)] = 1;
    }
    if ((rc = dsrt__dp_agree(R, 0, need, 4))) goto out;
    if (bad && bad->kind == K_HASH) {
        snprintf(msg, sizeof msg, "%s differ between worker 0 and worker %d", bad->name, R->rank);
    } else if (bad) {
        char a[64], b[64];
        show(a, sizeof a, bad, theirs);
        show(b, sizeof b, bad, bad->bits);
        snprintf(msg, sizeof msg, "%s is %s on worker 0, %s on worker %d", bad->name, a, b,
                 R->rank);
    }
    /* Every worker takes part in these rounds, with or without the data. */
    for (int d = 0; d < 2 && !rc; d++) {
        int tell = bad && abs(bad->data) == d + 1;
        if (need[d] != 0) rc = differing_class(R, data[d], tell && bad->data < 0, msg, sizeof msg);
        if (!rc && need[2 + d] != 0)
            rc = differing_file(R, data[d], hashes[d], tell && bad->data > 0, msg, sizeof msg);
    }
    if (!rc && bad)
        rc = dsrt__fail(DSRT_EOPTION, "train: the workers do not run the same job: %s", msg);
    rc = dsrt__dp_agree(R, rc, NULL, 0);
out:
    free(v);
    free(l.it);
    free(hashes[0]);
    free(hashes[1]);
    return rc;
}

int dsrt__dp_same_position(run *R, const dsrt_train_position *pos) {
    if (!R->comm || R->world < 2) return 0;
    double v[3] = {(double)pos->epoch, (double)pos->iteration, (double)(pos->seed >> 32)};
    double w[4] = {v[0], v[1], v[2], (double)(pos->seed & 0xffffffffu)};
    int rc = dsrt_comm_bcast(R->comm, w, sizeof w, 0);
    if (rc) return dsrt__fail_prefix(rc, "train: resume: comparing the workers' checkpoints");
    uint64_t seed0 = ((uint64_t)w[2] << 32) | (uint64_t)w[3];
    if (w[0] != v[0] || w[1] != v[1] || seed0 != pos->seed)
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: the workers do not resume the same run: the checkpoint is "
                        "at epoch %.0f, iteration %.0f, seed %llu on worker 0, at epoch %lld, "
                        "iteration %lld, seed %llu on worker %d",
                        w[0], w[1], (unsigned long long)seed0, (long long)pos->epoch,
                        (long long)pos->iteration, (unsigned long long)pos->seed, R->rank);
    return dsrt__dp_agree(R, rc, NULL, 0);
}
