/*
 * A folder in a bucket: s3://bucket/prefix listed (datastore/bytes/s3.h,
 * a tree of listings in flight together) and its keys indexed by the
 * folder rules (datastore/index/paths.c), so that a bucket holding a copy
 * of a folder gives the same index, whatever order the pages come in.
 */
#include "datastore/sources/folder/folder.h"

#include "datastore/bytes/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S3_LIST_DEPTH 64 /* listing requests in flight */

typedef struct {
    dsrt_names *names;
    size_t prefix_len;  /* of the key prefix, '/' included */
    uint64_t *versions; /* (n) of each key, in the listing's order */
    size_t n, cap;
} keys;

/* One key of the listing, from the bucket's root; aux is its place in the
 * listing, where its version is kept. */
static int each_key(void *ctx, const char *key, size_t len, uint64_t size, uint64_t version) {
    (void)size;
    keys *k = ctx;
    void *v = k->versions;
    if (k->n >= UINT32_MAX || dsrt__grow(&v, &k->cap, k->n + 1, sizeof *k->versions) != 0)
        return -ENOMEM;
    k->versions = v;
    k->versions[k->n] = version;
    return dsrt__names_take(k->names, key + k->prefix_len, len - k->prefix_len, (uint32_t)k->n++);
}

/* Each sample's version from its listing place (aux). */
static int keep_versions(dsrt_index *ix, const keys *k, const uint32_t *aux) {
    if (!(ix->versions = dsrt__calloc(ix->n ? ix->n : 1, sizeof *ix->versions))) return -ENOMEM;
    for (size_t i = 0; i < ix->n; i++) ix->versions[i] = k->versions[aux[i]];
    return 0;
}

/* Lists every key under the prefix into the names: sub-folders too,
 * unless they hold nothing the index takes (sub-folders left out and
 * labels not from class folders). */
static int list_all(keys *k, const dsrt_datastore_options *o, const char *bucket, size_t blen,
                    const char *prefix, const char *display) {
    dsrt_http *h = NULL;
    int sub = o->include_subfolders || o->label_source == DSRT_LABEL_FOLDER_NAMES;
    int rc = dsrt__http_create_opening(&h, o, S3_LIST_DEPTH);
    if (rc == 0) {
        dsrt_remote_options ro;
        dsrt__remote_opening_options(o, &ro);
        unsigned depth = DSRT_MIN(ro.depth, (unsigned)S3_LIST_DEPTH);
        rc = dsrt__s3_list_tree(h, depth, bucket, blen, prefix, k->prefix_len, sub, display,
                                each_key, k);
    }
    dsrt__http_destroy(h);
    return rc;
}

int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    keys k = {0};
    dsrt_strbuf prefix = {0};
    const char *bucket, *key;
    size_t blen;
    int rc, any = 0;
    ix->remote = 1;
    if ((rc = dsrt__s3_split(url, &bucket, &blen, &key)) != 0) return rc;

    /* "s3://b/p/" and "s3://b/p" index the same folder, as "data/" and "data". */
    size_t klen = strlen(key);
    while (klen > 0 && key[klen - 1] == '/') klen--;
    rc = -ENOMEM;
    if (klen && (dsrt__sb_add(&prefix, key, klen) || dsrt__sb_add(&prefix, "/", 1))) goto out;
    size_t root_len = 5 + blen + (klen ? 1 + klen : 0);
    char root[8192];
    snprintf(root, sizeof root, "%.*s", (int)root_len, url);
    k.prefix_len = prefix.len;
    if ((rc = dsrt__names_create(&k.names, ix, o, url, root_len, '/', NULL)) != 0) goto out;
    if ((rc = list_all(&k, o, bucket, blen, prefix.s ? prefix.s : "", root)) != 0) goto out;
    uint32_t *aux = NULL;
    if ((rc = dsrt__names_finish(k.names, &aux, &any)) != 0) goto out;
    rc = keep_versions(ix, &k, aux);
    free(aux);
    if (rc != 0) goto out;
    if (!any)
        rc = dsrt__fail(DSRT_EEMPTY,
                        "datastore: %s: no object under this prefix (check the bucket and prefix, "
                        "and that the credentials may list it)",
                        root);
out:
    free(prefix.s);
    free(k.versions);
    dsrt__names_destroy(k.names);
    return rc;
}
