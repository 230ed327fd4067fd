/*
 * A mix of datastores (datastore.h, dsrt_datastore_mix): a source whose
 * index is the samples of other datastores one after another, with their
 * classes merged by name or kept apart, and weights that the sampler
 * (datastore/sampling.c) draws each epoch's samples by. It is a line of
 * the table of sources like another, so the pipeline reads a mix as it
 * reads any datastore: through the reader this source makes, which hands
 * each position to the reader of the source it belongs to (a shard set's
 * ranged reads, a folder's files). When no source reads its samples
 * itself, every sample is a file by path and the mix reads them with one
 * reader over its own paths, as a folder does: no cost for mixing.
 *
 * Also the way the tools describe a mix (dsrt_datastore_open_mix): paths
 * and a weight list "0.7,0.3", or a mix file of "PATH,WEIGHT" lines.
 */
#include "datastore/sources/mixture/mixture.h"

#include "datastore/sources/source.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of a mix file read at most. */
#define MIX_FILE_MAX ((size_t)1 << 20)

// ----------------------------------------------------------------------------
// The mix

static void mixture_free(void *data) {
    dsrt_mixture *m = data;
    if (!m) return;
    for (size_t k = 0; m->src && k < m->k; k++) dsrt_datastore_close(m->src[k]);
    free(m->src);
    free(m->weight);
    free(m->off);
    for (size_t k = 0; m->preset && k < m->k; k++) free(m->preset[k]);
    free(m->preset);
    free(m);
}

dsrt_mix_options dsrt_mix_defaults(void) {
    return (dsrt_mix_options){.replacement = 0, .labels = DSRT_MIX_LABELS_MERGE};
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The mix's classes and each sample's label in them: merged by name (the
 * sorted union) or kept apart ("K:NAME", source by source). */
static int mixture_classes(dsrt_index *ix, const dsrt_mixture *m) {
    size_t total = 0, nc = 0;
    for (size_t k = 0; k < m->k; k++) total += dsrt_datastore_num_classes(m->src[k]);
    const char **names = dsrt__calloc(total ? total : 1, sizeof *names);
    int32_t *first = dsrt__calloc(m->k + 1, sizeof *first); /* separate: class of source k's 0 */
    char **owned = dsrt__calloc(total ? total : 1, sizeof *owned);
    int rc = -ENOMEM;
    if (!names || !first || !owned) goto out;
    for (size_t k = 0; k < m->k; k++) {
        size_t ck = dsrt_datastore_num_classes(m->src[k]);
        first[k] = (int32_t)nc;
        for (size_t c = 0; c < ck; c++) {
            const char *name = dsrt_datastore_class_name(m->src[k], c);
            if (m->labels == DSRT_MIX_LABELS_SEPARATE) {
                size_t len = strlen(name) + 24;
                if (!(owned[nc] = dsrt__malloc(len))) goto out;
                snprintf(owned[nc], len, "%zu:%s", k, name);
                name = owned[nc];
            }
            names[nc++] = name;
        }
    }
    if (m->labels == DSRT_MIX_LABELS_MERGE) {
        dsrt__sort(names, nc, sizeof *names, cmp_str);
        size_t u = 0;
        for (size_t c = 0; c < nc; c++)
            if (u == 0 || strcmp(names[u - 1], names[c]) != 0) names[u++] = names[c];
        nc = u;
    }
    if ((rc = dsrt__index_set_classes(ix, names, nc)) != 0) goto out;
    /* Each sample's label: its source's class, found by name when merged. */
    for (size_t k = 0; k < m->k; k++) {
        const dsrt_datastore *s = m->src[k];
        size_t ck = dsrt_datastore_num_classes(s);
        int32_t *map = dsrt__malloc((ck ? ck : 1) * sizeof *map);
        if (!map) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t c = 0; c < ck; c++) {
            if (m->labels == DSRT_MIX_LABELS_SEPARATE) {
                map[c] = first[k] + (int32_t)c;
                continue;
            }
            const char *name = dsrt_datastore_class_name(s, c);
            const char **hit = bsearch(&name, ix->classes, nc, sizeof *ix->classes, cmp_str);
            map[c] = (int32_t)(hit - ix->classes);
        }
        for (size_t j = 0; j < dsrt_datastore_count(s); j++)
            ix->labels[m->off[k] + j] = map[dsrt_datastore_label(s, j)];
        free(map);
    }
    rc = 0;
out:
    for (size_t c = 0; owned && c < total; c++) free(owned[c]);
    free(owned);
    free(first);
    free(names);
    return rc;
}

/* Checks the sources and weights, before anything is made. */
static int mixture_check(dsrt_datastore *const *sources, const double *weights, size_t n,
                         const dsrt_mix_options *o) {
    if (n < 2)
        return dsrt__fail(DSRT_EOPTION, "mix: %zu source%s: a mix needs two or more", n,
                          n == 1 ? "" : "s");
    if ((unsigned)o->replacement > 1)
        return dsrt__fail(DSRT_EOPTION, "mix: replacement: %d: not 0 or 1", o->replacement);
    if ((unsigned)o->labels > DSRT_MIX_LABELS_SEPARATE)
        return dsrt__fail(DSRT_EOPTION, "mix: labels: %d: not merge or separate", (int)o->labels);
    double sum = 0;
    uint64_t count = 0;
    for (size_t k = 0; k < n; k++) {
        if (!sources[k]) return dsrt__fail(DSRT_EOPTION, "mix: source %zu: NULL", k);
        const dsrt_index *ix = sources[k]->index;
        if (ix->source == DSRT_SOURCE_MIX)
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "mix: source %zu is a mix itself: give its "
                              "sources instead",
                              k);
        if (ix->pixels)
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "mix: source %zu (%s) holds its samples in memory: export it to a "
                              "folder first (dsrt_datastore_export) to mix it",
                              k, dsrt_source_name(ix->source));
        if (dsrt_datastore_count(sources[k]) == 0)
            return dsrt__fail(DSRT_EEMPTY, "mix: source %zu has no sample", k);
        count += dsrt_datastore_count(sources[k]);
        if (weights && !(weights[k] >= 0 && isfinite(weights[k])))
            return dsrt__fail(DSRT_EOPTION, "mix: weight %zu (%g): must be >= 0 and finite", k,
                              weights[k]);
        if (weights) sum += weights[k];
    }
    if (weights && !(sum > 0))
        return dsrt__fail(DSRT_EOPTION, "mix: every weight is 0: give one > 0");
    if (count > UINT32_MAX)
        return dsrt__fail(DSRT_ETOOBIG, "mix: %llu samples, more than 2^32-1",
                          (unsigned long long)count);
    return 0;
}

int dsrt_datastore_mix(dsrt_datastore **out, dsrt_datastore *const *sources, const double *weights,
                       size_t n, const dsrt_mix_options *o) {
    dsrt_mix_options defaults = dsrt_mix_defaults();
    dsrt_index *ix = NULL;
    dsrt_mixture *m = NULL;
    int rc;
    *out = NULL;
    if (!o) o = &defaults;
    if (n && !sources) return dsrt__fail(DSRT_EOPTION, "mix: sources: NULL");
    if ((rc = mixture_check(sources, weights, n, o)) != 0) return rc;

    rc = -ENOMEM;
    if (!(ix = dsrt__index_new(DSRT_SOURCE_MIX)) || !(m = dsrt__calloc(1, sizeof *m))) goto fail;
    ix->data = m;
    ix->data_free = mixture_free;
    m->k = n;
    m->replacement = o->replacement;
    m->labels = o->labels;
    m->src = dsrt__calloc(n, sizeof *m->src);
    m->weight = dsrt__calloc(n, sizeof *m->weight);
    m->off = dsrt__calloc(n + 1, sizeof *m->off);
    if (!m->src || !m->weight || !m->off) goto fail;
    for (size_t k = 0; o->presets && k < n; k++) {
        if (!o->presets[k]) continue;
        if (!m->preset && !(m->preset = dsrt__calloc(n, sizeof *m->preset))) goto fail;
        if (!(m->preset[k] = strdup(o->presets[k]))) goto fail;
    }
    double sum = 0;
    for (size_t k = 0; k < n; k++) {
        const dsrt_datastore *s = sources[k];
        size_t c = dsrt_datastore_count(s);
        /* A view of its own, so the caller may close the source. */
        uint32_t *order = dsrt__malloc(c * sizeof *order);
        if (!order) goto fail;
        for (size_t j = 0; j < c; j++) order[j] = dsrt__pos(s, j);
        if ((rc = dsrt__view_new(s->index, order, c, &m->src[k])) != 0) goto fail;
        rc = -ENOMEM;
        m->off[k + 1] = m->off[k] + c;
        m->weight[k] = weights ? weights[k] : (double)c;
        sum += m->weight[k];
        const dsrt_source_ops *ops = dsrt__source_of(s);
        m->readers |= ops && ops->reader != NULL;
        ix->remote |= s->index->remote;
    }
    for (size_t k = 0; k < n; k++) m->weight[k] /= sum;

    ix->n = m->off[n];
    ix->paths = dsrt__calloc(ix->n, sizeof *ix->paths);
    ix->labels = dsrt__calloc(ix->n, sizeof *ix->labels);
    if (!ix->paths || !ix->labels) goto fail;
    for (size_t k = 0; k < n; k++)
        for (size_t j = 0; j < dsrt_datastore_count(m->src[k]); j++)
            ix->paths[m->off[k] + j] = dsrt_datastore_path(m->src[k], j);
    /* The objects' versions (ETags) where a source has them: the cache of
     * an object store keys its entries by them, so an object replaced in
     * the store is read again rather than served from the old bytes. */
    for (size_t k = 0; k < n; k++) {
        const dsrt_index *si = m->src[k]->index;
        if (!si->versions) continue;
        if (!ix->versions &&
            !(ix->versions = dsrt__calloc(ix->n ? ix->n : 1, sizeof *ix->versions)))
            goto fail;
        for (size_t j = 0; j < dsrt_datastore_count(m->src[k]); j++)
            ix->versions[m->off[k] + j] = si->versions[dsrt__pos(m->src[k], j)];
    }
    if ((rc = mixture_classes(ix, m)) != 0) goto fail;
    for (size_t k = 0; k < n; k++)
        if (dsrt_datastore_warning_count(m->src[k]))
            dsrt__index_warn(ix, "source %zu: %s", k, dsrt_datastore_warnings(m->src[k]));
    if ((rc = dsrt__view_new(ix, NULL, ix->n, out)) == 0) return 0;
fail:
    if (ix)
        dsrt__index_free(ix); /* frees m with it */
    else
        mixture_free(m);
    return rc;
}

// ----------------------------------------------------------------------------
// Reading: each position through its source's reader

typedef struct {
    const dsrt_datastore *ds; /* the view of the mix the reader reads */
    const dsrt_mixture *m;
    dsrt_sample_reader **r; /* (m->k) */
    unsigned *in_flight;    /* (m->k) */
    size_t next;            /* the source collected from first next time */
} mix_reader;

static int mix_submit(void *impl, uint32_t pos, uint64_t epoch, void *buf, size_t cap,
                      uint64_t tag) {
    mix_reader *x = impl;
    uint32_t at = dsrt__pos(x->ds, pos);
    size_t k = dsrt__mixture_source(x->m, at);
    int rc = dsrt__sample_submit(x->r[k], (uint32_t)(at - x->m->off[k]), epoch, buf, cap, tag);
    if (rc == 0) x->in_flight[k]++;
    return rc;
}

/* Takes what any source has done, the sources in turn so none waits
 * behind another; with wait and nothing done, waits on one that has reads
 * in flight. */
static int mix_collect(void *impl, dsrt_read_result *res, int wait) {
    mix_reader *x = impl;
    size_t K = x->m->k, busy = K;
    for (size_t i = 0; i < K; i++) {
        size_t k = (x->next + i) % K;
        if (x->in_flight[k] == 0) continue;
        if (busy == K) busy = k;
        int rc = dsrt__sample_collect(x->r[k], res, 0);
        if (rc < 0) return rc;
        if (rc == 1) {
            x->in_flight[k]--;
            x->next = (k + 1) % K;
            return 1;
        }
    }
    if (!wait || busy == K) return 0;
    int rc = dsrt__sample_collect(x->r[busy], res, 1);
    if (rc == 1) {
        x->in_flight[busy]--;
        x->next = (busy + 1) % K;
    }
    return rc;
}

static void mix_cancel(void *impl) {
    mix_reader *x = impl;
    for (size_t k = 0; k < x->m->k; k++) {
        dsrt__sample_cancel(x->r[k]);
        x->in_flight[k] = 0;
    }
}

static size_t mix_need(const void *impl, uint32_t pos) {
    const mix_reader *x = impl;
    uint32_t at = dsrt__pos(x->ds, pos);
    size_t k = dsrt__mixture_source(x->m, at);
    return dsrt__sample_need(x->r[k], (uint32_t)(at - x->m->off[k]));
}

static dsrt_io mix_io(const void *impl) {
    return dsrt__sample_io(((const mix_reader *)impl)->r[0]);
}

static const char *mix_fallback(const void *impl) {
    const mix_reader *x = impl;
    for (size_t k = 0; k < x->m->k; k++) {
        const char *why = dsrt__sample_fallback(x->r[k]);
        if (why) return why;
    }
    return NULL;
}

static uint64_t mix_direct_refused(const void *impl) {
    const mix_reader *x = impl;
    uint64_t n = 0;
    for (size_t k = 0; k < x->m->k; k++) n += dsrt__sample_direct_refused(x->r[k]);
    return n;
}

static void mix_remote_stats(const void *impl, dsrt_remote_stats *s) {
    const mix_reader *x = impl;
    memset(s, 0, sizeof *s);
    for (size_t k = 0; k < x->m->k; k++) {
        dsrt_remote_stats one;
        dsrt__sample_remote_stats(x->r[k], &one);
        s->requests += one.requests;
        s->retries += one.retries;
        s->bytes += one.bytes;
        s->connections += one.connections;
        s->in_flight_s += one.in_flight_s;
        s->busy_s += one.busy_s;
    }
}

static void mix_destroy(void *impl) {
    mix_reader *x = impl;
    if (!x) return;
    for (size_t k = 0; x->r && k < x->m->k; k++) dsrt__sample_reader_destroy(x->r[k]);
    free(x->r);
    free(x->in_flight);
    free(x);
}

static const dsrt_sample_reader_ops MIX_READER_OPS = {
    .submit = mix_submit,
    .collect = mix_collect,
    .cancel = mix_cancel,
    .need = mix_need,
    .io = mix_io,
    .fallback = mix_fallback,
    .direct_refused = mix_direct_refused,
    .remote_stats = mix_remote_stats,
    .destroy = mix_destroy,
};

static int mix_reader_create(void **impl, const dsrt_sample_reader_ops **ops,
                             const dsrt_datastore *ds, const dsrt_reader_options *o,
                             dsrt_feed *feed) {
    (void)feed; /* a mix has none: the sampler orders it */
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    if (!m->readers) return dsrt__path_reader(impl, ops, ds, o);
    mix_reader *x = dsrt__calloc(1, sizeof *x);
    int rc = -ENOMEM;
    if (!x) return rc;
    x->ds = ds;
    x->m = m;
    x->r = dsrt__calloc(m->k, sizeof *x->r);
    x->in_flight = dsrt__calloc(m->k, sizeof *x->in_flight);
    if (!x->r || !x->in_flight) goto fail;
    for (size_t k = 0; k < m->k; k++)
        if ((rc = dsrt__sample_reader_create(&x->r[k], m->src[k], o, NULL)) != 0) goto fail;
    *impl = x;
    *ops = &MIX_READER_OPS;
    return 0;
fail:
    mix_destroy(x);
    return rc;
}

static int mix_read(const dsrt_datastore *ds, size_t i, size_t max, dsrt_buf_fn buf, void *ctx,
                    uint8_t **data, size_t *size, int64_t *mtime) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    uint32_t at = dsrt__pos(ds, i);
    size_t k = dsrt__mixture_source(m, at);
    return dsrt__sample_read(m->src[k], at - m->off[k], max, buf, ctx, data, size, mtime);
}

static int mix_folders(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir),
                       void *ctx) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < m->k; k++) rc = dsrt__sample_folders(m->src[k], each, ctx);
    return rc;
}

static int mix_open(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    (void)ix, (void)o;
    return dsrt__fail(DSRT_EOPTION,
                      "datastore: %s: a mix is made from datastores (dsrt_datastore_mix, --mix), "
                      "not opened from a path",
                      path);
}

const dsrt_source_ops dsrt__source_mix = {
    .kind = DSRT_SOURCE_MIX,
    .open = mix_open,
    .reader = mix_reader_create,
    .read = mix_read,
    .folders = mix_folders,
};

// ----------------------------------------------------------------------------
// A mix as the tools describe one

/* Parses "0.7,0.3" into w (at most cap): the count, or -1 when text is not
 * such a list (then it names a mix file). */
static long weights_parse(const char *text, double *w, size_t cap) {
    size_t n = 0;
    const char *s = text;
    for (;;) {
        char *end;
        while (*s == ' ') s++;
        double v = strtod(s, &end);
        if (end == s) return -1;
        while (*end == ' ') end++;
        if (*end != ',' && *end != '\0') return -1;
        if (n < cap) w[n] = v;
        n++;
        if (*end == '\0') return (long)n;
        s = end + 1;
    }
}

/* One line of a mix file, cut at its last commas: the path into *path (a
 * new string, relative ones from dir) and the weight. */
static int mix_line(const char *file, size_t line, char *text, const char *dir, char **path,
                    double *weight, char **preset) {
    *preset = NULL;
    char *c1 = strrchr(text, ',');
    if (!c1 || c1 == text)
        return dsrt__fail(DSRT_EFORMAT, "mix: %s:%zu: '%s' is not PATH,WEIGHT", file, line, text);
    char *end;
    double v = strtod(c1 + 1, &end);
    while (*end == ' ' || *end == '\t' || *end == '\r') end++;
    if (end == c1 + 1 || *end != '\0') {
        /* Not a weight last: a third column, or no weight at all. */
        /* A third column: the source's augment preset, after its weight. */
        *c1 = '\0';
        char *c0 = strrchr(text, ',');
        char *name = c1 + 1;
        while (*name == ' ' || *name == '\t') name++;
        size_t nl = strlen(name);
        while (nl && (name[nl - 1] == ' ' || name[nl - 1] == '\t' || name[nl - 1] == '\r'))
            name[--nl] = '\0';
        if (c0 && c0 != text && nl && (v = strtod(c0 + 1, &end), end != c0 + 1)) {
            while (*end == ' ' || *end == '\t') end++;
            if (*end == '\0') {
                if (!(*preset = strdup(name))) return -ENOMEM;
                c1 = c0;
                goto weighed;
            }
        }
        *c1 = ',';
        return dsrt__fail(DSRT_EFORMAT, "mix: %s:%zu: '%s' is not PATH,WEIGHT[,PRESET]", file, line,
                          text);
    }
weighed:
    *c1 = '\0';
    *weight = v;
    size_t need = strlen(dir) + strlen(text) + 2;
    if (!(*path = dsrt__malloc(need))) return -ENOMEM;
    if (text[0] == '/' || dsrt_path_is_url(text) || strcmp(dir, ".") == 0)
        snprintf(*path, need, "%s", text);
    else
        snprintf(*path, need, "%s/%s", dir, text);
    return 0;
}

/* The sources, weights and presets (NULL entries where a line has none) a
 * mix file lists. */
static int mix_file_read(const char *file, dsrt_strlist *paths, double **weights, char ***presets) {
    FILE *f = fopen(file, "r");
    if (!f) return dsrt__fail(-errno, "mix: %s: %s", file, strerror(errno));
    char dir[4096], buf[8192];
    dsrt__dir_of(file, dir, sizeof dir);
    size_t line = 0, cap = 0, pcap = 0, bytes = 0;
    int rc = 0;
    while (rc == 0 && fgets(buf, sizeof buf, f)) {
        line++;
        size_t len = strlen(buf);
        bytes += len;
        if (bytes > MIX_FILE_MAX) {
            rc = dsrt__fail(DSRT_ETOOBIG, "mix: %s: larger than %zu bytes", file, MIX_FILE_MAX);
            break;
        }
        if (len == sizeof buf - 1 && buf[len - 1] != '\n') {
            rc = dsrt__fail(DSRT_EFORMAT, "mix: %s:%zu: line longer than %zu bytes", file, line,
                            sizeof buf - 2);
            break;
        }
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = '\0';
        char *s = buf;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s || *s == '#') continue;
        char *path = NULL, *preset = NULL;
        double w = 0;
        void *v = *weights;
        if ((rc = mix_line(file, line, s, dir, &path, &w, &preset)) != 0) {
            free(preset);
            break;
        }
        if ((rc = dsrt__grow(&v, &cap, paths->n + 1, sizeof **weights)) == 0) {
            *weights = v;
            (*weights)[paths->n] = w;
            v = *presets;
            if ((rc = dsrt__grow(&v, &pcap, paths->n + 1, sizeof **presets)) == 0) {
                *presets = v;
                (*presets)[paths->n] = preset;
                preset = NULL;
                rc = dsrt__strlist_add(paths, path, strlen(path));
            }
        }
        free(preset);
        free(path);
    }
    if (rc == 0 && ferror(f)) rc = dsrt__fail(-EIO, "mix: %s: read error", file);
    fclose(f);
    if (rc == 0 && paths->n == 0)
        rc = dsrt__fail(DSRT_EEMPTY, "mix: %s: no PATH,WEIGHT line", file);
    return rc;
}

int dsrt_datastore_open_mix(dsrt_datastore **out, const char *const *paths, size_t npaths,
                            const char *mix, const dsrt_datastore_options *o,
                            const dsrt_mix_options *mo) {
    dsrt_strlist listed = {0};
    double *w = NULL;
    char **presets = NULL; /* (listed.n) a mix file's third column */
    dsrt_datastore **src = NULL;
    size_t n = npaths;
    int rc = -ENOMEM;
    *out = NULL;
    if (npaths && !paths) return dsrt__fail(DSRT_EOPTION, "mix: paths: NULL");
    if (npaths == 1 && !mix) return dsrt_datastore_open(out, paths[0], o);
    if (mix) {
        long count = weights_parse(mix, NULL, 0);
        if (count >= 0) {
            if (npaths == 0)
                return dsrt__fail(DSRT_EOPTION, "mix: weights %s but no data path to mix", mix);
            if ((size_t)count != npaths)
                return dsrt__fail(DSRT_EOPTION, "mix: %ld weight%s (%s) for %zu source%s", count,
                                  count == 1 ? "" : "s", mix, npaths, npaths == 1 ? "" : "s");
            if (!(w = dsrt__malloc(npaths * sizeof *w))) return rc;
            weights_parse(mix, w, npaths);
        } else {
            if (npaths)
                return dsrt__fail(DSRT_EOPTION,
                                  "mix: %s: a mix file names its sources: give no data path "
                                  "with it (or weights such as 0.7,0.3)",
                                  mix);
            if ((rc = mix_file_read(mix, &listed, &w, &presets)) != 0) goto out;
            paths = (const char *const *)listed.v;
            n = listed.n;
        }
    }
    if (n < 2) {
        rc = dsrt__fail(DSRT_EOPTION, "mix: one source (%s): a mix needs two or more",
                        n ? paths[0] : "none");
        goto out;
    }
    for (size_t k = 0; w && k < n; k++)
        if (!(w[k] >= 0 && isfinite(w[k]))) {
            rc = dsrt__fail(DSRT_EOPTION, "mix: weight %g of %s: must be >= 0 and finite", w[k],
                            paths[k]);
            goto out;
        }
    rc = -ENOMEM;
    if (!(src = dsrt__calloc(n, sizeof *src))) goto out;
    for (size_t k = 0; k < n; k++)
        if ((rc = dsrt_datastore_open(&src[k], paths[k], o)) != 0) goto out;
    dsrt_mix_options with = mo ? *mo : dsrt_mix_defaults();
    for (size_t k = 0; presets && k < n; k++)
        if (presets[k]) with.presets = (const char *const *)presets;
    rc = dsrt_datastore_mix(out, src, w, n, &with);
out:
    for (size_t k = 0; src && k < n; k++) dsrt_datastore_close(src[k]);
    for (size_t k = 0; presets && k < listed.n; k++) free(presets[k]);
    free(presets);
    free(src);
    free(w);
    dsrt__strlist_free(&listed);
    return rc;
}
