/*
 * The index and its views: what every source fills when it opens (paths or
 * in-memory pixels, labels, class names, warnings), the view that the public
 * handle is, and the folder rules that turn file names into classes.
 *
 * index.c keeps the index (its arena, warnings, class names, reference
 * count) and answers the queries on a view; views.c makes views (split per
 * label, shuffle, partition in ranges, subset); paths.c has the folder
 * rules: extensions, the sort of ImageFolder, and the indexing of relative
 * names (the keys of a bucket, the members of an archive) as a folder's
 * files would be indexed. Nothing here reads a file.
 */
#ifndef DSRT_DATASTORE_INDEX_H
#define DSRT_DATASTORE_INDEX_H

#include <dsrt/datastore.h>
#include <stdatomic.h>

#include "core/internal.h"

// ----------------------------------------------------------------------------
// The index: what a source gives. Immutable once opened, shared by views.

typedef struct dsrt_index {
    atomic_int refs;
    dsrt_source source;
    int remote;         /* some paths are URLs of objects in a store */
    size_t n;           /* samples */
    const char **paths; /* (n) file paths in the arena; NULL for in-memory sources */
    int32_t *labels;    /* (n) class index of each sample */
    size_t num_classes;
    const char **classes; /* (num_classes) class names, in class-index order */
    dsrt_arena arena;     /* every path and class name */

    /* In-memory sources (IDX, CIFAR): pixels of every sample, HWC uint8. */
    uint8_t *pixels; /* (n, height, width, channels) */
    int width, height, channels;

    /* Objects in a store: each sample's version, its ETag and size as
     * listed (dsrt__cache_version; 0: not known), so that a cache of the
     * objects takes no entry of another version; NULL when none is known. */
    uint64_t *versions; /* (n) */

    /* What the source keeps besides (a shard set's byte ranges), freed
     * with the index by data_free. */
    void *data;
    void (*data_free)(void *data);

    /* Problems met while opening that did not stop it. */
    char *warnings; /* lines, NUL-terminated; NULL when none */
    size_t warnings_len, warnings_cap;
    size_t warning_count;
} dsrt_index;

/* The public handle: a view of an index. */
struct dsrt_datastore {
    dsrt_index *index;
    uint32_t *order; /* (n) index positions, or NULL for all of them in index order */
    size_t n;
};

/* Index position of view position i. */
static inline uint32_t dsrt__pos(const dsrt_datastore *ds, size_t i) {
    return ds->order ? ds->order[i] : (uint32_t)i;
}

/* A new empty index of kind source; NULL when out of memory. */
dsrt_index *dsrt__index_new(dsrt_source source);
/* Frees an index no view holds any more (or that none ever held). */
void dsrt__index_free(dsrt_index *ix);

/* Adds a warning line (printf-style); after the first 20 lines only counts. */
void dsrt__index_warn(dsrt_index *ix, const char *fmt, ...) DSRT_PRINTF(2, 3);

/* Sets the class names (copied into the arena); labels already in ix. */
int dsrt__index_set_classes(dsrt_index *ix, const char *const *names, size_t count);

/* A new view of ix holding the n index positions of order (taken: freed
 * with the view, also when this fails; NULL: every position in order). */
int dsrt__view_new(dsrt_index *ix, uint32_t *order, size_t n, dsrt_datastore **out);

/* Part i of n of view ds as contiguous ranges of its positions: a new array
 * of the part's index positions. */
int dsrt__view_ranges(const dsrt_datastore *ds, size_t n, size_t i, uint32_t **order,
                      size_t *count);

// ----------------------------------------------------------------------------
// The folder rules (paths.c): shared by the local walk, the listing of a
// prefix in a store and the members of an archive, so that all index the
// same files the same way.

#define DSRT_MAX_EXTENSIONS 32
#define DSRT_MAX_EXT_LEN    15
typedef struct {
    char ext[DSRT_MAX_EXTENSIONS][DSRT_MAX_EXT_LEN + 1]; /* lower case, no dot */
    size_t n;
} dsrt_extensions;
/* Parses "jpg,png" (NULL: the default list, every codec's extensions:
 * dsrt__codec_extensions). */
int dsrt__extensions_parse(dsrt_extensions *e, const char *list);
/* The list e holds, "jpg,jpeg,...", into out (for messages). */
void dsrt__extensions_text(const dsrt_extensions *e, char *out, size_t cap);
/* Whether file name (or name[0..n)) has one of the extensions. */
int dsrt__extensions_match(const dsrt_extensions *e, const char *name);
int dsrt__extensions_match_n(const dsrt_extensions *e, const char *name, size_t n);

typedef struct {
    const char *path; /* full path, in the index arena */
    uint32_t dir_len; /* length of the folder part of path (before the last '/') */
    int32_t group;    /* class index, or folder id while walking (parent-folder labels) */
    uint32_t aux;     /* the caller's (a member's number) */
} dsrt_folder_entry;
/* Sorts by (class, folder, name) (ImageFolder's order), or by_group 0 by
 * (folder, name). */
void dsrt__folder_sort(dsrt_folder_entry *e, size_t n, int by_group);
/* Fills ix's paths and labels (group) from entries. */
int dsrt__folder_fill(dsrt_index *ix, const dsrt_folder_entry *e, size_t n);

/*
 * Names relative to a root (the keys under a prefix, the members of an
 * archive) indexed as a folder's files: labels from the first folder, from
 * the folder holding the name, or none; the extensions; sub-folders or not;
 * empty class folders reported (and dropped if asked); names directly in
 * the root and names with an empty folder ("a//b.jpg") left out with a
 * warning; the folder's sort. A name ending in '/' is a folder of its own
 * (a class when it is one). Names may come in any order: the index is the
 * same.
 */
typedef struct dsrt_names dsrt_names;

/* A lister filling ix: each path is root (root_len bytes), sep, then the
 * name ("s3://b/p" '/' "cat/1.jpg"; "x.zip" ':' "cat/1.jpg"). base names
 * the root's folder (the class of files directly in it, with parent-folder
 * labels); NULL: the root's last component. */
int dsrt__names_create(dsrt_names **l, dsrt_index *ix, const dsrt_datastore_options *o,
                       const char *root, size_t root_len, char sep, const char *base);
/* Takes name[0..n) (aux is kept for it): 0, or -ENOMEM. */
int dsrt__names_take(dsrt_names *l, const char *name, size_t n, uint32_t aux);
/* Sets the classes, sorts and fills ix's paths and labels; *aux (when not
 * NULL) gets a new array of each index position's aux. *any is 1 when any
 * name was seen at all (a class folder included). */
int dsrt__names_finish(dsrt_names *l, uint32_t **aux, int *any);
void dsrt__names_destroy(dsrt_names *l);

#endif
