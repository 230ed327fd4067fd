/*
 * runtime/ internals shared by the pipeline and the training loop: the
 * platform below them (platform/internal.h: cores, devices, pinned memory)
 * and what they share of the datastore's options. Nothing here is public;
 * names carry a double underscore.
 */
#ifndef DSRT_RUNTIME_INTERNAL_H
#define DSRT_RUNTIME_INTERNAL_H

#include "platform/internal.h"

#include <dsrt/datastore.h>

/* Copies the fields of src that are set (non-zero) into dst: a training
 * run's object-store options over the reader's defaults. */
static inline void dsrt__remote_apply(dsrt_remote_options *dst, const dsrt_remote_options *src) {
    if (src->depth) dst->depth = src->depth;
    if (src->max_connections) dst->max_connections = src->max_connections;
    if (src->retry_deadline_s > 0) dst->retry_deadline_s = src->retry_deadline_s;
    if (src->timeout_s > 0) dst->timeout_s = src->timeout_s;
}

#endif
