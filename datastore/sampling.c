/*
 * Samplers (sampling.h): the epoch orders of a mix and of weighted
 * sampling.
 *
 * A mix's epoch gives source k round(count * w_k) draws (largest
 * remainders, so they add up to the epoch; MosaicML Streaming fixes its
 * streams' shares per epoch the same way, where WebDataset's RandomMix
 * picks a source per sample: both give the proportions, this one without
 * the epoch-to-epoch wobble), interleaved in an order shuffled by the
 * epoch's key. Without replacement, source k's draws are its global draws
 * key * take_k ... key * take_k + take_k - 1, draw g being place g % n_k
 * of the permutation number g / n_k of the source: a source is walked
 * whole, in a fresh permutation each time round, across epochs, and no
 * epoch depends on the one before. With replacement each draw is uniform.
 * Shuffled once, a mix keeps the interleave of epoch 0 and still draws
 * afresh each epoch (else the part of a source past its share would never
 * come); weighted sampling keeps epoch 0's draws.
 *
 * Weighted sampling draws each place of the epoch with replacement from
 * Vose's alias table of the weights: one uniform position and one uniform
 * number a draw, whatever the weights.
 */
#include "datastore/sampling.h"

#include "datastore/sources/mixture/mixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Random streams of the samplers, apart from the order functions' (views.c). */
enum { STREAM_MIX_SEQ = 11, STREAM_MIX_DRAW = 12, STREAM_MIX_CYCLE = 13, STREAM_WEIGHTED = 14 };

/* Bytes of a weights file read at most (a few dozen a sample). */
#define WEIGHTS_FILE_MAX ((size_t)1 << 34)

struct dsrt_sampler {
    size_t count; /* samples an epoch */
    size_t n;     /* view positions */
    /* Weighted: the alias table over view positions. */
    double *prob;    /* (n) */
    uint32_t *alias; /* (n) */
    /* A mix: each source's view positions, in view order, and its draws. */
    size_t k;
    uint32_t *by_source; /* (n) view positions grouped by source */
    size_t *start;       /* (k + 1) where each source's group begins */
    size_t *take;        /* (k) draws an epoch */
    int replacement;
    int once; /* shuffle once: the same order every epoch (a mix: the same
               * interleave, its sources still drawn afresh) */
};

void dsrt__sampler_destroy(dsrt_sampler *s) {
    if (!s) return;
    free(s->prob);
    free(s->alias);
    free(s->by_source);
    free(s->start);
    free(s->take);
    free(s);
}

size_t dsrt__sampler_count(const dsrt_sampler *s) {
    return s->count;
}

// ----------------------------------------------------------------------------
// Weights

/* Vose's alias table of w[0, n) (sum > 0): prob[i] the chance of keeping
 * i once i is drawn, alias[i] what is taken instead. */
static int alias_build(dsrt_sampler *s, const double *w, double sum) {
    size_t n = s->n, ns = 0, nl = 0;
    double *scaled = dsrt__malloc(n * sizeof *scaled);
    uint32_t *small = dsrt__malloc(n * sizeof *small), *large = dsrt__malloc(n * sizeof *large);
    s->prob = dsrt__malloc(n * sizeof *s->prob);
    s->alias = dsrt__malloc(n * sizeof *s->alias);
    int rc = -ENOMEM;
    if (!scaled || !small || !large || !s->prob || !s->alias) goto out;
    for (size_t i = 0; i < n; i++) {
        scaled[i] = w[i] / sum * (double)n;
        if (scaled[i] < 1)
            small[ns++] = (uint32_t)i;
        else
            large[nl++] = (uint32_t)i;
    }
    while (ns && nl) {
        uint32_t l = small[--ns], g = large[nl - 1];
        s->prob[l] = scaled[l];
        s->alias[l] = g;
        scaled[g] = scaled[g] + scaled[l] - 1;
        if (scaled[g] < 1) {
            nl--;
            small[ns++] = g;
        }
    }
    /* What is left is 1 but for rounding. */
    while (nl) {
        uint32_t g = large[--nl];
        s->prob[g] = 1;
        s->alias[g] = g;
    }
    while (ns) {
        uint32_t l = small[--ns];
        s->prob[l] = 1;
        s->alias[l] = l;
    }
    rc = 0;
out:
    free(scaled);
    free(small);
    free(large);
    return rc;
}

/* Reads a weights file: one number a line, n of them. */
static int weights_read(const char *who, const char *file, double *w, size_t n) {
    FILE *f = fopen(file, "r");
    if (!f) return dsrt__fail(-errno, "%s: sample_weights: %s: %s", who, file, strerror(errno));
    char buf[256];
    size_t line = 0, got = 0, bytes = 0;
    int rc = 0;
    while (rc == 0 && fgets(buf, sizeof buf, f)) {
        line++;
        size_t len = strlen(buf);
        if ((bytes += len) > WEIGHTS_FILE_MAX) {
            rc = dsrt__fail(DSRT_ETOOBIG, "%s: sample_weights: %s: larger than %zu bytes", who,
                            file, WEIGHTS_FILE_MAX);
            break;
        }
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = '\0';
        char *s = buf, *end;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s || *s == '#') continue;
        double v = strtod(s, &end);
        while (*end == ' ' || *end == '\t') end++;
        if (end == s || *end)
            rc = dsrt__fail(DSRT_EFORMAT, "%s: sample_weights: %s:%zu: '%.40s' is not a weight",
                            who, file, line, s);
        else if (!(v >= 0 && isfinite(v)))
            rc = dsrt__fail(DSRT_EOPTION,
                            "%s: sample_weights: %s:%zu: %g: a weight must be >= 0 and finite", who,
                            file, line, v);
        else if (got < n)
            w[got] = v;
        got++;
    }
    if (rc == 0 && ferror(f))
        rc = dsrt__fail(-EIO, "%s: sample_weights: %s: read error", who, file);
    fclose(f);
    if (rc == 0 && got != n)
        rc = dsrt__fail(DSRT_EOPTION,
                        "%s: sample_weights: %s: %zu weights for %zu samples (one a line, in "
                        "the datastore's order)",
                        who, file, got, n);
    return rc;
}

/* The weights o asks for, into w (n of them), checked. */
static int weights_get(const dsrt_datastore *ds, const dsrt_sampler_options *o, double *w, size_t n,
                       double *sum) {
    int rc = 0;
    if (o->weights && strcmp(o->weights, "class-balanced") == 0) {
        size_t nc = dsrt_datastore_num_classes(ds);
        size_t *counts = dsrt__calloc(nc ? nc : 1, sizeof *counts);
        if (!counts) return -ENOMEM;
        dsrt_datastore_class_counts(ds, counts);
        for (size_t i = 0; i < n; i++) w[i] = 1.0 / (double)counts[dsrt_datastore_label(ds, i)];
        free(counts);
    } else if (o->weights) {
        if ((rc = weights_read(o->who, o->weights, w, n)) != 0) return rc;
    } else {
        for (size_t i = 0; i < n; i++) {
            if (!(o->values[i] >= 0 && isfinite(o->values[i])))
                return dsrt__fail(DSRT_EOPTION,
                                  "%s: sample_weight_values[%zu]: %g: a weight must be >= 0 and "
                                  "finite",
                                  o->who, i, o->values[i]);
            w[i] = o->values[i];
        }
    }
    *sum = 0;
    for (size_t i = 0; i < n; i++) *sum += w[i];
    if (!(*sum > 0) || !isfinite(*sum))
        return dsrt__fail(DSRT_EOPTION, "%s: sample_weights: %s: every weight is 0", o->who,
                          o->weights ? o->weights : "the values");
    return 0;
}

static int weighted_create(dsrt_sampler *s, const dsrt_datastore *ds,
                           const dsrt_sampler_options *o) {
    double sum = 0, *w = dsrt__malloc(s->n * sizeof *w);
    if (!w) return -ENOMEM;
    int rc = weights_get(ds, o, w, s->n, &sum);
    if (rc == 0) rc = alias_build(s, w, sum);
    free(w);
    return rc;
}

// ----------------------------------------------------------------------------
// A mix

static int mix_create(dsrt_sampler *s, const dsrt_datastore *ds, const dsrt_mixture *m,
                      const dsrt_sampler_options *o) {
    size_t K = m->k;
    s->k = K;
    s->replacement = m->replacement;
    s->by_source = dsrt__malloc(s->n * sizeof *s->by_source);
    s->start = dsrt__calloc(K + 1, sizeof *s->start);
    s->take = dsrt__calloc(K, sizeof *s->take);
    size_t *fill = dsrt__calloc(K, sizeof *fill);
    double *rem = dsrt__calloc(K, sizeof *rem);
    int rc = -ENOMEM;
    if (!s->by_source || !s->start || !s->take || !fill || !rem) goto out;
    for (size_t i = 0; i < s->n; i++) s->start[dsrt_datastore_mix_source(ds, i) + 1]++;
    for (size_t k = 0; k < K; k++) s->start[k + 1] += s->start[k];
    for (size_t i = 0; i < s->n; i++) {
        size_t k = dsrt_datastore_mix_source(ds, i);
        s->by_source[s->start[k] + fill[k]++] = (uint32_t)i;
    }
    /* The draws of each source: the largest remainders get the rest. */
    size_t given = 0;
    for (size_t k = 0; k < K; k++) {
        double exact = (double)s->count * m->weight[k];
        s->take[k] = (size_t)floor(exact);
        rem[k] = exact - (double)s->take[k];
        given += s->take[k];
    }
    while (given < s->count) {
        size_t best = 0;
        for (size_t k = 1; k < K; k++)
            if (rem[k] > rem[best]) best = k;
        s->take[best]++;
        rem[best] = -1;
        given++;
    }
    /* A share rounded to nothing would never be drawn, in any epoch (the
     * shares are the same every epoch). */
    for (size_t k = 0; k < K; k++)
        if (!s->take[k] && m->weight[k] > 0) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "%s: mix source %zu (weight %.3g) gets no sample of an epoch of %zu, "
                            "and so none ever: give epoch_samples (--epoch-samples) of at least "
                            "%.0f, or a larger weight",
                            o->who, k, m->weight[k], s->count, ceil(0.5 / m->weight[k]));
            goto out;
        }
    for (size_t k = 0; k < K; k++)
        if (s->take[k] && s->start[k + 1] == s->start[k]) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "%s: mix source %zu (weight %g) has no sample in this datastore (a "
                            "view that left it out)",
                            o->who, k, m->weight[k]);
            goto out;
        }
    rc = 0;
out:
    free(fill);
    free(rem);
    return rc;
}

/* Fisher-Yates over a[0, n) with r's numbers. */
static void shuffle(uint32_t *a, size_t n, dsrt_rng *r) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)dsrt_rng_below(r, i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* Source k's draws of epoch key into out[0, take_k). */
static int mix_draws(const dsrt_sampler *s, size_t k, uint64_t seed, uint64_t key, uint32_t *out,
                     uint32_t *perm) {
    const uint32_t *list = s->by_source + s->start[k];
    size_t nk = s->start[k + 1] - s->start[k], take = s->take[k];
    if (s->replacement) {
        dsrt_rng r = dsrt_rng_init(seed, key, k, STREAM_MIX_DRAW);
        for (size_t t = 0; t < take; t++) out[t] = list[dsrt_rng_below(&r, nk)];
        return 0;
    }
    __uint128_t g = (__uint128_t)key * take;
    uint64_t cycle = UINT64_MAX;
    for (size_t t = 0; t < take; t++, g++) {
        uint64_t c = (uint64_t)(g / nk);
        if (c != cycle) {
            cycle = c;
            for (size_t j = 0; j < nk; j++) perm[j] = (uint32_t)j;
            dsrt_rng r = dsrt_rng_init(seed, cycle, k, STREAM_MIX_CYCLE);
            shuffle(perm, nk, &r);
        }
        out[t] = list[perm[(size_t)(g % nk)]];
    }
    return 0;
}

static int mix_order(const dsrt_sampler *s, uint64_t seed, uint64_t key, uint32_t *order) {
    size_t K = s->k, most = 0;
    for (size_t k = 0; k < K; k++) most = DSRT_MAX(most, s->start[k + 1] - s->start[k]);
    uint32_t *draws = dsrt__malloc((s->count ? s->count : 1) * sizeof *draws);
    uint32_t *perm = dsrt__malloc((most ? most : 1) * sizeof *perm);
    size_t *at = dsrt__calloc(K + 1, sizeof *at);
    int rc = -ENOMEM;
    if (!draws || !perm || !at) goto out;
    /* Each source's draws, one block after another. */
    for (size_t k = 0; k < K; k++) {
        at[k + 1] = at[k] + s->take[k];
        mix_draws(s, k, seed, key, draws + at[k], perm);
    }
    /* Which source each place takes from, shuffled, then its next draw. */
    size_t t = 0;
    for (size_t k = 0; k < K; k++)
        for (size_t j = 0; j < s->take[k]; j++) order[t++] = (uint32_t)k;
    dsrt_rng r = dsrt_rng_init(seed, s->once ? 0 : key, 0, STREAM_MIX_SEQ);
    shuffle(order, s->count, &r);
    for (size_t i = 0; i < s->count; i++) order[i] = draws[at[order[i]]++];
    rc = 0;
out:
    free(draws);
    free(perm);
    free(at);
    return rc;
}

// ----------------------------------------------------------------------------
// The sampler

int dsrt__sampler_create(dsrt_sampler **out, const dsrt_datastore *ds,
                         const dsrt_sampler_options *o) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    int weighted = o->weights || o->values;
    *out = NULL;
    if (o->weights && o->values)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: sample_weights (%s) and sample_weight_values: give one of them",
                          o->who, o->weights);
    if (weighted && m)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: sample_weights: not with a mix (its weights choose the sources); "
                          "weigh the samples of one datastore",
                          o->who);
    if (!weighted && !m) {
        if (o->epoch_samples)
            return dsrt__fail(DSRT_EOPTION,
                              "%s: epoch_samples: %zu: only with a mix or sample_weights (a "
                              "datastore alone is walked once an epoch)",
                              o->who, o->epoch_samples);
        return 0;
    }
    if (o->shuffle == 0 /* DSRT_SHUFFLE_NEVER */)
        return dsrt__fail(DSRT_EOPTION,
                          "%s: shuffle never: %s draws at random; use once or every-epoch", o->who,
                          m ? "a mix" : "sample_weights");
    if (o->epoch_samples > UINT32_MAX)
        return dsrt__fail(DSRT_EOPTION, "%s: epoch_samples: %zu: more than 2^32 - 1", o->who,
                          o->epoch_samples);
    dsrt_sampler *s = dsrt__calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->n = dsrt_datastore_count(ds);
    s->count = o->epoch_samples ? o->epoch_samples : s->n;
    s->once = o->shuffle == 1 /* DSRT_SHUFFLE_ONCE */;
    int rc = m ? mix_create(s, ds, m, o) : weighted_create(s, ds, o);
    if (rc != 0) {
        dsrt__sampler_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int dsrt__sampler_order(const dsrt_sampler *s, uint64_t seed, uint64_t key, uint32_t *order) {
    if (s->k) return mix_order(s, seed, key, order);
    dsrt_rng r = dsrt_rng_init(seed, s->once ? 0 : key, 0, STREAM_WEIGHTED);
    for (size_t t = 0; t < s->count; t++) {
        uint32_t i = (uint32_t)dsrt_rng_below(&r, s->n);
        order[t] = dsrt_rng_uniform(&r) < s->prob[i] ? i : s->alias[i];
    }
    return 0;
}
