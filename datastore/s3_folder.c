/*
 * A folder in a bucket: s3://bucket/prefix listed (datastore/bytes/s3.h,
 * a tree of listings in flight together) and its keys indexed by the
 * folder rules, so that a bucket holding a copy of a folder gives the same
 * index, whatever order the pages come in: labels from the first
 * sub-prefix, from the prefix holding the object, or none; extensions;
 * sub-folders or not; empty class folders; the same sort. Every key the
 * rules take goes straight into the index's arena as a URL, so memory grows
 * with the index only. Keys with an empty path component ("a//b.jpg") have
 * no folder equivalent and are left out with a warning.
 */
#include "datastore/bytes/http.h"
#include "datastore/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// A folder in a bucket

typedef struct {
    const dsrt_datastore_options *o;
    dsrt_index *ix;
    dsrt_extensions ext;
    char *root;                  /* "s3://bucket/prefix" without a trailing '/' (in the arena) */
    size_t root_len, prefix_len; /* prefix_len: of the key prefix, '/' included */
    const char *root_base;       /* the root's last component: parent-label of root files */

    dsrt_folder_entry *files;
    size_t n_files, cap_files;
    /* Names of classes (folder-name labels) or folders (parent labels), in
     * order of first sight; entries' groups index them until sorted. */
    const char **names;
    size_t n_names, cap_names;
    uint32_t *slots; /* open-addressing set over names: index + 1 */
    size_t nslots;
    size_t *name_files; /* (n_names) files under each */
    size_t root_files, odd_keys;
    char *odd_first; /* the smallest key with an empty folder name */
} lister;

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return dsrt__mix64(h);
}

/* The id of name s[0..n), added when new. */
static int name_id(lister *l, const char *s, size_t n, int32_t *id) {
    if ((l->n_names + 1) * 2 > l->nslots) {
        size_t ns = l->nslots ? l->nslots * 2 : 256;
        uint32_t *slots = dsrt__calloc(ns, sizeof *slots);
        if (!slots) return -ENOMEM;
        for (size_t i = 0; i < l->n_names; i++) {
            size_t at = name_hash(l->names[i], strlen(l->names[i])) & (ns - 1);
            while (slots[at]) at = (at + 1) & (ns - 1);
            slots[at] = (uint32_t)i + 1;
        }
        free(l->slots);
        l->slots = slots;
        l->nslots = ns;
    }
    size_t at = name_hash(s, n) & (l->nslots - 1);
    for (; l->slots[at]; at = (at + 1) & (l->nslots - 1)) {
        const char *e = l->names[l->slots[at] - 1];
        if (strncmp(e, s, n) == 0 && e[n] == '\0') {
            *id = (int32_t)(l->slots[at] - 1);
            return 0;
        }
    }
    void *names = l->names;
    size_t cap = l->cap_names;
    if (dsrt__grow(&names, &cap, l->n_names + 1, sizeof *l->names) != 0) return -ENOMEM;
    l->names = names;
    void *counts = l->name_files;
    size_t cap2 = l->cap_names;
    if (dsrt__grow(&counts, &cap2, l->n_names + 1, sizeof *l->name_files) != 0) return -ENOMEM;
    l->name_files = counts;
    l->cap_names = DSRT_MIN(cap, cap2);
    char *copy = dsrt_arena_strndup(&l->ix->arena, s, n);
    if (!copy) return -ENOMEM;
    l->names[l->n_names] = copy;
    l->name_files[l->n_names] = 0;
    l->slots[at] = (uint32_t)l->n_names + 1;
    *id = (int32_t)l->n_names++;
    return 0;
}

static int add_file(lister *l, const char *rel, size_t rel_len, size_t dir_rel_len, int32_t group) {
    void *buf = l->files;
    if (dsrt__grow(&buf, &l->cap_files, l->n_files + 1, sizeof *l->files) != 0) return -ENOMEM;
    l->files = buf;
    char *p = dsrt_arena_alloc(&l->ix->arena, l->root_len + 1 + rel_len + 1, 1);
    if (!p) return -ENOMEM;
    memcpy(p, l->root, l->root_len);
    p[l->root_len] = '/';
    memcpy(p + l->root_len + 1, rel, rel_len);
    p[l->root_len + 1 + rel_len] = '\0';
    l->files[l->n_files++] = (dsrt_folder_entry){
        .path = p,
        .dir_len = (uint32_t)(dir_rel_len ? l->root_len + 1 + dir_rel_len : l->root_len),
        .group = group};
    if (group >= 0 && (size_t)group < l->n_names) l->name_files[group]++;
    return 0;
}

/* Whether a[0..n) comes before the string b in S3's order of keys (bytes). */
static int key_less(const char *a, size_t n, const char *b) {
    size_t bn = strlen(b);
    int c = memcmp(a, b, DSRT_MIN(n, bn));
    return c < 0 || (c == 0 && n < bn);
}

/* One key of the listing, relative to the prefix: rel[0..n). */
static int take_key(lister *l, const char *rel, size_t n) {
    if (n == 0) return 0; /* the prefix's own folder marker */
    const char *last = NULL;
    size_t slashes = 0;
    for (size_t i = 0; i < n; i++)
        if (rel[i] == '/') {
            if (i == 0 || rel[i - 1] == '/') {
                /* Named at the end: the smallest, whatever the order of pages. */
                l->odd_keys++;
                if (!l->odd_first || key_less(rel, n, l->odd_first)) {
                    char *c = dsrt__malloc(n + 1);
                    if (!c) return -ENOMEM;
                    memcpy(c, rel, n);
                    c[n] = '\0';
                    free(l->odd_first);
                    l->odd_first = c;
                }
                return 0;
            }
            slashes++;
            last = rel + i;
        }
    int marker = rel[n - 1] == '/'; /* "cls/" made by a console or a sync of an empty folder */
    const char *name = last ? last + 1 : rel;
    size_t dir_len = last ? (size_t)(last - rel) : 0;
    int32_t g = 0;
    int rc;
    int sub = l->o->include_subfolders;
    switch (l->o->label_source) {
    case DSRT_LABEL_FOLDER_NAMES: {
        if (slashes == 0) {
            /* Image files directly in the root: not in a class. */
            l->root_files += dsrt__extensions_match_n(&l->ext, rel, n);
            return 0;
        }
        const char *cls_end = memchr(rel, '/', n);
        if ((rc = name_id(l, rel, (size_t)(cls_end - rel), &g)) != 0) return rc;
        if (marker || (!sub && slashes > 1)) return 0;
        break;
    }
    case DSRT_LABEL_PARENT_FOLDER: {
        if (marker || (!sub && slashes > 0)) return 0;
        const char *base = last ? (const char *)memrchr(rel, '/', dir_len) : NULL;
        const char *folder = last ? (base ? base + 1 : rel) : l->root_base;
        size_t fl = last ? (size_t)(last - folder) : strlen(l->root_base);
        /* The class is created only when a file of it is taken. */
        if (!dsrt__extensions_match_n(&l->ext, name, (size_t)(rel + n - name))) return 0;
        if ((rc = name_id(l, folder, fl, &g)) != 0) return rc;
        return add_file(l, rel, n, dir_len, g);
    }
    default:
        if (marker || (!sub && slashes > 0)) return 0;
        break;
    }
    if (!dsrt__extensions_match_n(&l->ext, name, (size_t)(rel + n - name))) return 0;
    return add_file(l, rel, n, dir_len, g);
}

// ----------------------------------------------------------------------------
// A folder in a bucket, from its listing

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Classes from the names seen: sorted, each entry's group renumbered; with
 * folder-name labels the empty ones are reported (and dropped if asked). */
static int finish_classes(lister *l) {
    size_t n = l->n_names;
    int rc = -ENOMEM;
    const char **sorted = dsrt__malloc((n ? n : 1) * sizeof *sorted);
    int32_t *renum = dsrt__malloc((n ? n : 1) * sizeof *renum);
    if (!sorted || !renum) goto out;
    if (n) memcpy(sorted, l->names, n * sizeof *sorted);
    if (n > 1) qsort(sorted, n, sizeof *sorted, cmp_str);
    int folders = l->o->label_source == DSRT_LABEL_FOLDER_NAMES;
    size_t kept = 0;
    for (size_t c = 0; c < n; c++) {
        int32_t id;
        name_id(l, sorted[c], strlen(sorted[c]), &id); /* present: never adds */
        if (folders && l->name_files[id] == 0) {
            dsrt__index_warn(l->ix, "%s/%s: class folder holds no image file%s", l->root, sorted[c],
                             l->o->drop_empty_classes ? ": not a class" : "");
            if (l->o->drop_empty_classes) {
                renum[id] = -1;
                continue;
            }
        }
        renum[id] = (int32_t)kept;
        sorted[kept++] = sorted[c];
    }
    for (size_t i = 0; i < l->n_files; i++) l->files[i].group = renum[l->files[i].group];
    rc = dsrt__index_set_classes(l->ix, sorted, kept);
out:
    free(sorted);
    free(renum);
    return rc;
}

/* One key of the listing, from the bucket's root. */
static int each_key(void *ctx, const char *key, size_t len, uint64_t size) {
    (void)size;
    lister *l = ctx;
    return take_key(l, key + l->prefix_len, len - l->prefix_len);
}

#define S3_LIST_DEPTH 64 /* listing requests in flight */

/* Lists every key under the lister's prefix into it: sub-folders too,
 * unless they hold nothing the index takes (sub-folders left out and
 * labels not from class folders). */
static int list_all(lister *l, const char *bucket, size_t blen, const char *prefix,
                    size_t prefix_len) {
    const dsrt_datastore_options *o = l->o;
    dsrt_http *h = NULL;
    int sub = o->include_subfolders || o->label_source == DSRT_LABEL_FOLDER_NAMES;
    int rc = dsrt__http_create_opening(&h, o, S3_LIST_DEPTH);
    if (rc == 0) {
        dsrt_remote_options ro;
        dsrt__remote_opening_options(o, &ro);
        unsigned depth = DSRT_MIN(ro.depth, (unsigned)S3_LIST_DEPTH);
        rc = dsrt__s3_list_tree(h, depth, bucket, blen, prefix, prefix_len, sub, l->root, each_key,
                                l);
    }
    dsrt__http_destroy(h);
    return rc;
}

int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    lister l = {.o = o, .ix = ix};
    dsrt_strbuf prefix = {0};
    const char *bucket, *key;
    size_t blen;
    int rc;
    ix->remote = 1;
    if ((rc = dsrt__extensions_parse(&l.ext, o->extensions)) != 0) return rc;
    if ((rc = dsrt__s3_split(url, &bucket, &blen, &key)) != 0) return rc;

    /* "s3://b/p/" and "s3://b/p" index the same folder, as "data/" and "data". */
    size_t klen = strlen(key);
    while (klen > 0 && key[klen - 1] == '/') klen--;
    rc = -ENOMEM;
    if (klen && (dsrt__sb_add(&prefix, key, klen) || dsrt__sb_add(&prefix, "/", 1))) goto out;
    l.root_len = 5 + blen + (klen ? 1 + klen : 0);
    if (!(l.root = dsrt_arena_strndup(&ix->arena, url, l.root_len))) goto out;
    l.prefix_len = prefix.len;
    const char *base = strrchr(l.root + 5, '/');
    l.root_base = base ? base + 1 : l.root + 5;

    if ((rc = list_all(&l, bucket, blen, prefix.s ? prefix.s : "", prefix.len)) != 0) goto out;

    if (l.odd_keys > 0)
        dsrt__index_warn(
            ix, "%s/%s: a key with an empty folder name has no folder equivalent, left out", l.root,
            l.odd_first);
    if (l.odd_keys > 1)
        dsrt__index_warn(ix, "%s: %zu keys with empty folder names left out", l.root, l.odd_keys);
    if (l.root_files)
        dsrt__index_warn(ix,
                         "%s: %zu image file%s directly in the root ignored (not inside a class "
                         "folder)",
                         l.root, l.root_files, l.root_files > 1 ? "s" : "");
    if (o->label_source == DSRT_LABEL_NONE) {
        const char *none = "";
        rc = dsrt__index_set_classes(ix, &none, 1);
    } else {
        rc = finish_classes(&l);
    }
    if (rc != 0) goto out;
    dsrt__folder_sort(l.files, l.n_files, o->label_source != DSRT_LABEL_NONE);
    rc = dsrt__folder_fill(ix, l.files, l.n_files);
    if (rc == 0 && l.n_files == 0 && l.n_names == 0)
        rc = dsrt__fail(DSRT_EEMPTY,
                        "datastore: %s: no object under this prefix (check the bucket and prefix, "
                        "and that the credentials may list it)",
                        l.root);
out:
    free(prefix.s);
    free(l.files);
    free(l.names);
    free(l.slots);
    free(l.name_files);
    free(l.odd_first);
    return rc;
}
