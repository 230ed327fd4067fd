/*
 * The folder source: a local folder walked (folder.c), or a prefix in a
 * bucket listed (s3_folder.c), indexed by the same folder rules.
 */
#ifndef DSRT_DATASTORE_FOLDER_H
#define DSRT_DATASTORE_FOLDER_H

#include "datastore/sources/source.h"

/* A local folder walked. */
int dsrt__folder_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o);

/* A folder at s3://bucket/prefix: lists the keys and indexes them as the
 * local walk indexes a folder's files. */
int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);

#endif
