/*
 * The folder rules (index.h), which every source of files by name follows:
 * the extensions taken (by default those of every codec, from the one
 * table of codecs), the order of ImageFolder (class, folder, name), and
 * names relative to a root indexed as a folder's files would be, for the
 * keys under a prefix in a store and the members of an archive.
 *
 * Order: classes are sorted by name (byte order, which for UTF-8 is
 * code-point order, as Python's sorted()); within a class, files are sorted
 * by their folder's path and then by name, so class indices and sample
 * order match torchvision's ImageFolder on the same files.
 *
 * Names are taken in any order (the pages of a listing come as they come):
 * classes and folders get ids in order of first sight in a small hash
 * table, and are sorted and numbered at the end, so the index does not
 * depend on the order. Every name taken goes straight into the index's
 * arena as a path, so memory grows with the index only.
 */
#include "datastore/index/index.h"

#include "datastore/codecs/codecs.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ----------------------------------------------------------------------------
// Extensions

/* Adds ext[0..n) to e, in lower case: 0, or 1 when it does not fit. */
static int extension_add(dsrt_extensions *e, const char *ext, size_t n) {
    if (n > DSRT_MAX_EXT_LEN || e->n == DSRT_MAX_EXTENSIONS) return 1;
    for (size_t k = 0; k < n; k++) e->ext[e->n][k] = (char)tolower((unsigned char)ext[k]);
    e->ext[e->n][n] = '\0';
    e->n++;
    return 0;
}

static int default_extension(void *ctx, const char *ext, size_t n) {
    return extension_add(ctx, ext, n);
}

int dsrt__extensions_parse(dsrt_extensions *e, const char *list) {
    e->n = 0;
    if (!list) { /* the default: every codec's (the one list, codecs.h) */
        if (dsrt__codec_extensions(default_extension, e) != 0)
            return dsrt__fail(DSRT_EOPTION, "datastore: the codecs' extensions do not fit");
        return 0;
    }
    const char *p = list;
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        if (!*p) break;
        if (*p == '.') p++;
        const char *start = p;
        while (*p && *p != ',' && *p != ' ') p++;
        size_t n = (size_t)(p - start);
        if (n == 0) continue;
        if (extension_add(e, start, n) != 0)
            return dsrt__fail(DSRT_EOPTION,
                              "datastore: extensions \"%s\": at most %d, of at most "
                              "%d characters each",
                              list, DSRT_MAX_EXTENSIONS, DSRT_MAX_EXT_LEN);
    }
    if (e->n == 0)
        return dsrt__fail(DSRT_EOPTION, "datastore: extensions \"%s\" names no extension", list);
    return 0;
}

void dsrt__extensions_text(const dsrt_extensions *e, char *out, size_t cap) {
    size_t at = 0;
    out[0] = '\0';
    for (size_t k = 0; k < e->n && at < cap; k++) {
        int w = snprintf(out + at, cap - at, "%s%s", k ? "," : "", e->ext[k]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

int dsrt__extensions_match_n(const dsrt_extensions *e, const char *name, size_t n) {
    const char *dot = memrchr(name, '.', n);
    if (!dot || dot == name) return 0;
    dot++;
    size_t len = (size_t)(name + n - dot);
    for (size_t k = 0; k < e->n; k++)
        if (strlen(e->ext[k]) == len && strncasecmp(dot, e->ext[k], len) == 0) return 1;
    return 0;
}

int dsrt__extensions_match(const dsrt_extensions *e, const char *name) {
    return dsrt__extensions_match_n(e, name, strlen(name));
}

// ----------------------------------------------------------------------------
// Sorting

/* (group, folder path, file name): ImageFolder's order within each class. */
static int cmp_entry(const void *pa, const void *pb) {
    const dsrt_folder_entry *a = pa, *b = pb;
    if (a->group != b->group) return a->group < b->group ? -1 : 1;
    size_t la = a->dir_len, lb = b->dir_len;
    int r = memcmp(a->path, b->path, DSRT_MIN(la, lb));
    if (r) return r;
    if (la != lb) return la < lb ? -1 : 1;
    return strcmp(a->path + la + 1, b->path + lb + 1);
}

/* Folder path then name, ignoring the group: the plain walk order. */
static int cmp_entry_path(const void *pa, const void *pb) {
    const dsrt_folder_entry *a = pa, *b = pb;
    size_t la = a->dir_len, lb = b->dir_len;
    int r = memcmp(a->path, b->path, DSRT_MIN(la, lb));
    if (r) return r;
    if (la != lb) return la < lb ? -1 : 1;
    return strcmp(a->path + la + 1, b->path + lb + 1);
}

void dsrt__folder_sort(dsrt_folder_entry *e, size_t n, int by_group) {
    dsrt__sort(e, n, sizeof *e, by_group ? cmp_entry : cmp_entry_path);
}

int dsrt__folder_fill(dsrt_index *ix, const dsrt_folder_entry *e, size_t n) {
    ix->n = n;
    ix->paths = dsrt__malloc((n ? n : 1) * sizeof *ix->paths);
    ix->labels = dsrt__malloc((n ? n : 1) * sizeof *ix->labels);
    if (!ix->paths || !ix->labels) return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        ix->paths[i] = e[i].path;
        ix->labels[i] = e[i].group;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Names relative to a root

struct dsrt_names {
    const dsrt_datastore_options *o;
    dsrt_index *ix;
    dsrt_extensions ext;
    char *root; /* "s3://bucket/prefix", "x.zip" (in the arena) */
    size_t root_len;
    char sep;              /* between the root and a name */
    const char *root_base; /* the root's last component: parent-label of root files */

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
    char *odd_first; /* the smallest name with an empty folder name */
    uint32_t aux;    /* of the name being taken */
};

typedef struct dsrt_names lister;

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
    char *copy = dsrt__arena_strndup(&l->ix->arena, s, n);
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
    char *p = dsrt__arena_alloc(&l->ix->arena, l->root_len + 1 + rel_len + 1, 1);
    if (!p) return -ENOMEM;
    memcpy(p, l->root, l->root_len);
    p[l->root_len] = l->sep;
    memcpy(p + l->root_len + 1, rel, rel_len);
    p[l->root_len + 1 + rel_len] = '\0';
    l->files[l->n_files++] = (dsrt_folder_entry){
        .path = p,
        .dir_len = (uint32_t)(dir_rel_len ? l->root_len + 1 + dir_rel_len : l->root_len),
        .group = group,
        .aux = l->aux};
    if (group >= 0 && (size_t)group < l->n_names) l->name_files[group]++;
    return 0;
}

/* Whether a[0..n) comes before the string b in byte order (S3's order of keys). */
static int key_less(const char *a, size_t n, const char *b) {
    size_t bn = strlen(b);
    int c = memcmp(a, b, DSRT_MIN(n, bn));
    return c < 0 || (c == 0 && n < bn);
}

/* One name, relative to the root: rel[0..n). */
static int take_name(lister *l, const char *rel, size_t n) {
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
    dsrt__sort(sorted, n, sizeof *sorted, cmp_str);
    int folders = l->o->label_source == DSRT_LABEL_FOLDER_NAMES;
    size_t kept = 0;
    for (size_t c = 0; c < n; c++) {
        int32_t id;
        name_id(l, sorted[c], strlen(sorted[c]), &id); /* present: never adds */
        if (folders && l->name_files[id] == 0) {
            dsrt__index_warn(l->ix, "%s%c%s: class folder holds no image file%s", l->root, l->sep,
                             sorted[c], l->o->drop_empty_classes ? ": not a class" : "");
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

int dsrt__names_create(dsrt_names **out, dsrt_index *ix, const dsrt_datastore_options *o,
                       const char *root, size_t root_len, char sep, const char *base) {
    *out = NULL;
    lister *l = dsrt__calloc(1, sizeof *l);
    if (!l) return -ENOMEM;
    l->o = o;
    l->ix = ix;
    l->sep = sep;
    int rc = dsrt__extensions_parse(&l->ext, o->extensions);
    if (rc == 0 && !(l->root = dsrt__arena_strndup(&ix->arena, root, root_len))) rc = -ENOMEM;
    if (rc == 0 && base && !(base = dsrt__arena_strndup(&ix->arena, base, strlen(base))))
        rc = -ENOMEM;
    if (rc != 0) {
        free(l);
        return rc;
    }
    l->root_len = root_len;
    if (base) {
        l->root_base = base;
    } else {
        /* The root's last component. */
        const char *from = strncasecmp(l->root, "s3://", 5) == 0 ? l->root + 5 : l->root;
        const char *slash = memrchr(from, '/', root_len - (size_t)(from - l->root));
        l->root_base = slash ? slash + 1 : from;
    }
    *out = l;
    return 0;
}

int dsrt__names_take(dsrt_names *l, const char *name, size_t n, uint32_t aux) {
    l->aux = aux;
    return take_name(l, name, n);
}

int dsrt__names_finish(dsrt_names *l, uint32_t **aux, int *any) {
    dsrt_index *ix = l->ix;
    const dsrt_datastore_options *o = l->o;
    int rc;
    if (aux) *aux = NULL;
    if (l->odd_keys > 0)
        dsrt__index_warn(
            ix, "%s%c%s: a key with an empty folder name has no folder equivalent, left out",
            l->root, l->sep, l->odd_first);
    if (l->odd_keys > 1)
        dsrt__index_warn(ix, "%s: %zu keys with empty folder names left out", l->root, l->odd_keys);
    if (l->root_files)
        dsrt__index_warn(ix,
                         "%s: %zu image file%s directly in the root ignored (not inside a class "
                         "folder)",
                         l->root, l->root_files, l->root_files > 1 ? "s" : "");
    if (o->label_source == DSRT_LABEL_NONE) {
        const char *none = "";
        rc = dsrt__index_set_classes(ix, &none, 1);
    } else {
        rc = finish_classes(l);
    }
    if (rc != 0) return rc;
    dsrt__folder_sort(l->files, l->n_files, o->label_source != DSRT_LABEL_NONE);
    if ((rc = dsrt__folder_fill(ix, l->files, l->n_files)) != 0) return rc;
    if (any) *any = l->n_files > 0 || l->n_names > 0;
    if (aux) {
        if (!(*aux = dsrt__malloc((l->n_files ? l->n_files : 1) * sizeof **aux))) return -ENOMEM;
        for (size_t i = 0; i < l->n_files; i++) (*aux)[i] = l->files[i].aux;
    }
    return 0;
}

void dsrt__names_destroy(dsrt_names *l) {
    if (!l) return;
    free(l->files);
    free(l->names);
    free(l->slots);
    free(l->name_files);
    free(l->odd_first);
    free(l);
}
