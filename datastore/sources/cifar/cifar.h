/*
 * The CIFAR sources (cifar.c): CIFAR-10 and CIFAR-100 binary batches, as
 * in-memory sources. The parser works on memory so that the libFuzzer
 * target in tests/fuzz can drive it; `name` is used in messages only.
 */
#ifndef DSRT_DATASTORE_CIFAR_H
#define DSRT_DATASTORE_CIFAR_H

#include "datastore/sources/source.h"

/* Opens a CIFAR .bin batch (or the extracted folder) of kind
 * DSRT_SOURCE_CIFAR10 or DSRT_SOURCE_CIFAR100 into ix. */
int dsrt__cifar_load(dsrt_index *ix, const char *path, dsrt_source kind,
                     const dsrt_datastore_options *o);

/* One CIFAR binary batch: records of label byte(s) + 3072 CHW pixels.
 * Appends to ix->pixels (HWC) and ix->labels. kind picks 1 or 2 label bytes. */
int dsrt__cifar_parse(dsrt_index *ix, const uint8_t *buf, size_t len, const char *name,
                      dsrt_source kind, int coarse);

#endif
