/*
 * Epoch orders that draw rather than walk: a mix's sources in proportion
 * to their weights, or each sample in proportion to a weight of its own
 * (PyTorch's WeightedRandomSampler). The pipeline asks a sampler for each
 * epoch's order instead of shuffling the datastore's positions; every
 * order is a pure function of (seed, epoch key), so batches stay the same
 * whatever the threads, the parts and a resume.
 */
#ifndef DSRT_DATASTORE_SAMPLING_H
#define DSRT_DATASTORE_SAMPLING_H

#include <dsrt/datastore.h>

typedef struct dsrt_sampler dsrt_sampler;

typedef struct {
    const char *weights;  /* NULL, "class-balanced" or a weights file (sample_weights) */
    const double *values; /* the weights themselves, when weights is NULL (or NULL) */
    size_t epoch_samples; /* 0: the datastore's count */
    int shuffle;          /* dsrt_shuffle: never is refused when sampling */
    const char *who;      /* prefix of messages: "pipeline" */
} dsrt_sampler_options;

/*
 * The sampler of ds with options o: *s NULL when ds is walked once an
 * epoch (not a mix, no weights); DSRT_EOPTION naming the option or the
 * file's line when one is wrong. Reads a weights file here, once.
 */
int dsrt__sampler_create(dsrt_sampler **s, const dsrt_datastore *ds, const dsrt_sampler_options *o);
void dsrt__sampler_destroy(dsrt_sampler *s);

/* Samples an epoch holds. */
size_t dsrt__sampler_count(const dsrt_sampler *s);

/* Fills order[0, count) with the view positions of epoch key. 0 or -ENOMEM. */
int dsrt__sampler_order(const dsrt_sampler *s, uint64_t seed, uint64_t key, uint32_t *order);

#endif
