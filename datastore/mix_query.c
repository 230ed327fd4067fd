/*
 * What a datastore knows of the mix it may be a view of (mixture.h): the
 * mix's table read from the index, and the public queries over it. Kept
 * here, below the mix source, because the sampler (sampling.c) and the
 * pipeline ask them of any datastore, while the mix source itself opens
 * datastores (datastore.c): with these in the source's folder the two
 * folders would call each other.
 */
#include "datastore/sources/mixture/mixture.h"

const dsrt_mixture *dsrt__mixture_of(const dsrt_datastore *ds) {
    return ds->index->source == DSRT_SOURCE_MIX ? ds->index->data : NULL;
}

size_t dsrt__mixture_source(const dsrt_mixture *m, uint32_t pos) {
    size_t lo = 0, hi = m->k; /* off[lo] <= pos < off[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->off[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

size_t dsrt_datastore_mix_sources(const dsrt_datastore *ds) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    return m ? m->k : 1;
}

size_t dsrt_datastore_mix_source(const dsrt_datastore *ds, size_t i) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    return m && i < ds->n ? dsrt__mixture_source(m, dsrt__pos(ds, i)) : 0;
}

const char *dsrt_datastore_mix_preset(const dsrt_datastore *ds, size_t k) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    return m && m->preset && k < m->k ? m->preset[k] : NULL;
}

size_t dsrt_datastore_mix_samples(const dsrt_datastore *ds, size_t k) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    if (!m) return k == 0 ? ds->n : 0;
    return k < m->k ? m->off[k + 1] - m->off[k] : 0;
}

int dsrt_datastore_mix_replacement(const dsrt_datastore *ds) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    return m ? m->replacement : 0;
}

double dsrt_datastore_mix_weight(const dsrt_datastore *ds, size_t k) {
    const dsrt_mixture *m = dsrt__mixture_of(ds);
    if (!m) return k == 0 ? 1.0 : 0.0;
    return k < m->k ? m->weight[k] : 0.0;
}
