/*
 * The ZIP source (zip.c): an archive of images (the way Kaggle and many
 * dataset sites ship them), labelled by the folders inside it as a folder's
 * files would be, its members read as byte ranges of the archive (the
 * members layer, datastore/sources/members/members.h).
 */
#ifndef DSRT_DATASTORE_ZIP_H
#define DSRT_DATASTORE_ZIP_H

#include "datastore/sources/members/members.h"

/* Opens the archive held in buf[0..len) as one named name would open from a
 * file (for the fuzzer and the tests): its central directory into ix, whose
 * shard set then describes every sample's range of buf. */
int dsrt__zip_open_memory(dsrt_index *ix, const char *name, const uint8_t *buf, size_t len,
                          const dsrt_datastore_options *o);

#endif
