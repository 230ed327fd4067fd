/*
 * A mix of datastores (dsrt_datastore_mix): what the sampler and the
 * pipeline ask of one besides the public queries. The mix's index holds
 * the samples of every source one after another; source k's are the index
 * positions [off[k], off[k + 1]), position off[k] + j being the source's
 * own view position j.
 */
#ifndef DSRT_DATASTORE_MIXTURE_H
#define DSRT_DATASTORE_MIXTURE_H

#include "datastore/index/index.h"

typedef struct {
    size_t k;               /* sources */
    dsrt_datastore **src;   /* (k) the mix's own views of the sources */
    double *weight;         /* (k) normalised to sum 1 */
    size_t *off;            /* (k + 1) index position of each source's first sample */
    int replacement;        /* dsrt_mix_options */
    dsrt_mix_labels labels; /* dsrt_mix_options */
    int readers;            /* some source reads its samples with a reader of its own */
    char **preset;          /* (k) each source's augment preset name, NULL entries: none;
                               NULL when no source has one */
} dsrt_mixture;

/* The mix ds is a view of, or NULL when it is not one (these two are
 * defined in datastore/mix_query.c, below the mix source). */
const dsrt_mixture *dsrt__mixture_of(const dsrt_datastore *ds);

/* The source of index position pos (a binary search over off). */
size_t dsrt__mixture_source(const dsrt_mixture *m, uint32_t pos);

#endif
