/*
 * The manifest source (manifest.c): a CSV of path,label, local or at a URL.
 * The parser works on memory so that the libFuzzer target in tests/fuzz can
 * drive it; `name` is used in messages only.
 */
#ifndef DSRT_DATASTORE_MANIFEST_H
#define DSRT_DATASTORE_MANIFEST_H

#include "datastore/sources/source.h"

/* Opens the manifest file at path into ix. */
int dsrt__manifest_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);

/* A manifest at a URL: fetched whole, relative paths taken relative to it. */
int dsrt__remote_manifest_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);

/* A manifest (CSV of path,label; RFC 4180 quoting). Relative paths are taken
 * relative to base_dir. Fills paths, labels and classes of ix. */
int dsrt__manifest_parse(dsrt_index *ix, const char *text, size_t len, const char *name,
                         const char *base_dir, int header);

#endif
