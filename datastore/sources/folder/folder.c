/*
 * The folder source: walks a folder of class sub-folders and indexes every
 * image file in it, labelled by folder name.
 *
 * The walk is built to be fast on folders of millions of files: directories
 * are opened relative to their parent (openat), file types come from
 * readdir's d_type so that a regular file costs no stat() at all (only
 * symbolic links and file systems that leave d_type unknown are stat'ed), and
 * every path goes into one arena. Each directory is fstat'ed once so that a
 * symbolic link leading back to one of its own ancestors is reported and not
 * followed; unreadable folders are reported and skipped.
 *
 * Order: the folder rules' (datastore/index/paths.c): classes sorted by name,
 * files within a class by folder and name, as torchvision's ImageFolder.
 */
#include "datastore/sources/folder/folder.h"

#include "datastore/bytes/url.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 256

typedef dsrt_folder_entry entry;

typedef struct {
    dsrt_index *ix;
    const dsrt_datastore_options *o;
    dsrt_extensions ext;

    entry *files;
    size_t n_files, cap_files;

    /* Parent-folder labels: the name of every folder visited, by folder id. */
    const char **dir_names;
    size_t n_dirs, cap_dirs;

    struct {
        dev_t dev;
        ino_t ino;
    } stack[MAX_DEPTH]; /* the folders from the root down to the current one */
    int depth;

    char path[PATH_MAX]; /* full path of the current folder */
    size_t path_len;
} walker;

static int wanted(const walker *w, const char *name) {
    return dsrt__extensions_match(&w->ext, name);
}

// ----------------------------------------------------------------------------
// The walk

/* The type of entry name in folder dirfd, following a symbolic link when the
 * options say so: DT_REG, DT_DIR, or DT_UNKNOWN for anything to skip. */
static int entry_type(walker *w, int dirfd, const struct dirent *de) {
    int t = de->d_type;
    if (t == DT_REG || t == DT_DIR) return t;
    if (t != DT_LNK && t != DT_UNKNOWN) return DT_UNKNOWN;
    struct stat st;
    if (t == DT_UNKNOWN) {
        if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) return DT_UNKNOWN;
        if (S_ISREG(st.st_mode)) return DT_REG;
        if (S_ISDIR(st.st_mode)) return DT_DIR;
        if (!S_ISLNK(st.st_mode)) return DT_UNKNOWN;
    }
    if (!w->o->follow_symlinks) return DT_UNKNOWN;
    if (fstatat(dirfd, de->d_name, &st, 0) != 0) {
        dsrt__index_warn(w->ix, "%s/%s: broken symbolic link (%s), skipped", w->path, de->d_name,
                         strerror(errno));
        return DT_UNKNOWN;
    }
    return S_ISREG(st.st_mode) ? DT_REG : S_ISDIR(st.st_mode) ? DT_DIR : DT_UNKNOWN;
}

static int add_file(walker *w, const char *name, int32_t group) {
    size_t n = strlen(name);
    void *buf = w->files;
    if (dsrt__grow(&buf, &w->cap_files, w->n_files + 1, sizeof(entry)) != 0) return -ENOMEM;
    w->files = buf;
    char *p = dsrt__arena_alloc(&w->ix->arena, w->path_len + 1 + n + 1, 1);
    if (!p) return -ENOMEM;
    memcpy(p, w->path, w->path_len);
    p[w->path_len] = '/';
    memcpy(p + w->path_len + 1, name, n + 1);
    entry *e = &w->files[w->n_files++];
    e->path = p;
    e->dir_len = (uint32_t)w->path_len;
    e->group = group;
    return 0;
}

/* Errors of the process, not of the folder (too many files open, no
 * memory): they fail the scan instead of dropping the folder's images. */
static int process_error(walker *w, const char *name, int e) {
    if (e != EMFILE && e != ENFILE && e != ENOMEM) return 0;
    return dsrt__fail(-e,
                      "datastore: %s%s%s: %s (a limit of the process or the system, not a "
                      "fault of the folder)",
                      w->path, name ? "/" : "", name ? name : "", strerror(e));
}

/* Opens sub-folder name of dirfd and pushes it: 1 when entered, 0 when it
 * was skipped (unreadable, a loop; reported), negative on failure. On 1 the
 * caller owns *fd and must call leave(). */
static int enter(walker *w, int dirfd, const char *name, int *fd) {
    size_t n = strlen(name);
    if (w->path_len + 1 + n + 1 > sizeof w->path || w->depth == MAX_DEPTH) {
        dsrt__index_warn(w->ix, "%s/%s: path too long or folders nested too deep, skipped", w->path,
                         name);
        return 0;
    }
    int f = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f < 0) {
        int e = errno, rc = process_error(w, name, e);
        if (rc) return rc;
        dsrt__index_warn(w->ix, "%s/%s: %s, skipped", w->path, name, strerror(e));
        return 0;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        dsrt__index_warn(w->ix, "%s/%s: %s, skipped", w->path, name, strerror(errno));
        close(f);
        return 0;
    }
    for (int k = 0; k < w->depth; k++) {
        if (w->stack[k].dev == st.st_dev && w->stack[k].ino == st.st_ino) {
            dsrt__index_warn(w->ix,
                             "%s/%s: symbolic link loop (leads back to an enclosing "
                             "folder), not followed",
                             w->path, name);
            close(f);
            return 0;
        }
    }
    w->stack[w->depth].dev = st.st_dev;
    w->stack[w->depth].ino = st.st_ino;
    w->depth++;
    w->path[w->path_len] = '/';
    memcpy(w->path + w->path_len + 1, name, n + 1);
    w->path_len += 1 + n;
    *fd = f;
    return 1;
}

static void leave(walker *w, size_t path_len) {
    w->depth--;
    w->path_len = path_len;
    w->path[path_len] = '\0';
}

static int new_dir_group(walker *w, const char *name) {
    void *buf = w->dir_names;
    if (dsrt__grow(&buf, &w->cap_dirs, w->n_dirs + 1, sizeof(char *)) != 0) return -ENOMEM;
    w->dir_names = buf;
    char *s = dsrt__arena_strndup(&w->ix->arena, name, strlen(name));
    if (!s) return -ENOMEM;
    w->dir_names[w->n_dirs] = s;
    return (int)w->n_dirs++;
}

/*
 * Indexes the folder open as fd (already entered). group >= 0 labels every
 * file below with that class; group < 0 labels each file by the folder that
 * holds it (a new folder id per folder, named dir_name). Takes fd.
 */
static int walk(walker *w, int fd, int32_t group, const char *dir_name) {
    int rc = 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        if ((rc = process_error(w, NULL, e)) != 0) return rc;
        dsrt__index_warn(w->ix, "%s: %s, skipped", w->path, strerror(e));
        return 0;
    }
    int32_t files_group = group;
    if (group < 0) {
        int id = new_dir_group(w, dir_name);
        if (id < 0) {
            closedir(d);
            return id;
        }
        files_group = id;
    }
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
        int t = entry_type(w, dirfd(d), de);
        if (t == DT_REG) {
            if (wanted(w, name) && (rc = add_file(w, name, files_group)) != 0) break;
        } else if (t == DT_DIR && w->o->include_subfolders) {
            size_t saved = w->path_len;
            int sub;
            int entered = enter(w, dirfd(d), name, &sub);
            if (entered < 0) {
                rc = entered;
                break;
            }
            if (entered) {
                rc = walk(w, sub, group, name);
                leave(w, saved);
                if (rc != 0) break;
            }
        }
        errno = 0;
    }
    if (rc == 0 && errno != 0 && (rc = process_error(w, NULL, errno)) == 0)
        dsrt__index_warn(w->ix, "%s: %s while listing", w->path, strerror(errno));
    closedir(d);
    return rc;
}

// ----------------------------------------------------------------------------
// Sorting and labels

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Parent-folder labels: folder ids -> classes named by distinct folder names. */
static int label_by_parent(walker *w) {
    size_t nd = w->n_dirs;
    const char **names = dsrt__malloc((nd ? nd : 1) * sizeof *names);
    int32_t *class_of = dsrt__malloc((nd ? nd : 1) * sizeof *class_of);
    int rc = -ENOMEM;
    if (!names || !class_of) goto out;
    memcpy(names, w->dir_names, nd * sizeof *names);
    dsrt__sort(names, nd, sizeof *names, cmp_name);
    size_t nc = 0;
    for (size_t k = 0; k < nd; k++)
        if (nc == 0 || strcmp(names[nc - 1], names[k]) != 0) names[nc++] = names[k];
    for (size_t k = 0; k < nd; k++) {
        const char *key = w->dir_names[k];
        const char **hit = bsearch(&key, names, nc, sizeof *names, cmp_name);
        class_of[k] = (int32_t)(hit - names);
    }
    /* Only classes that hold files count. */
    size_t *used = dsrt__calloc(nc ? nc : 1, sizeof *used);
    if (!used) goto out;
    for (size_t i = 0; i < w->n_files; i++) used[class_of[w->files[i].group]]++;
    int32_t *renum = (int32_t *)used; /* same size, reused in place below */
    size_t kept = 0;
    for (size_t c = 0; c < nc; c++) {
        size_t u = used[c];
        renum[c] = u ? (int32_t)kept : -1;
        if (u) names[kept++] = names[c];
    }
    for (size_t i = 0; i < w->n_files; i++) w->files[i].group = renum[class_of[w->files[i].group]];
    free(used);
    rc = dsrt__index_set_classes(w->ix, names, kept);
out:
    free(names);
    free(class_of);
    return rc;
}

/* Folder-name labels: removes the classes no file has, numbering the rest
 * in the same order. */
static int drop_empty(walker *w, const char **classes, size_t *n_classes) {
    size_t n = *n_classes, kept = 0;
    int32_t *renum = dsrt__calloc(n ? n : 1, sizeof *renum);
    if (!renum) return -ENOMEM;
    for (size_t i = 0; i < w->n_files; i++) renum[w->files[i].group] = 1;
    for (size_t c = 0; c < n; c++) {
        int used = renum[c];
        renum[c] = used ? (int32_t)kept : -1;
        if (used) classes[kept++] = classes[c];
    }
    for (size_t i = 0; i < w->n_files; i++) w->files[i].group = renum[w->files[i].group];
    free(renum);
    *n_classes = kept;
    return 0;
}

// ----------------------------------------------------------------------------
// Entry point

int dsrt__folder_load(dsrt_index *ix, const char *path, const dsrt_datastore_options *o) {
    walker *w = dsrt__calloc(1, sizeof *w);
    const char **classes = NULL;
    size_t n_classes = 0, cap_classes = 0, root_files = 0;
    int rc, root = -1;
    DIR *d = NULL;
    if (!w) return -ENOMEM;
    w->ix = ix;
    w->o = o;
    if ((rc = dsrt__extensions_parse(&w->ext, o->extensions)) != 0) goto out;

    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "data/" and "data" index the same */
    if (n + 1 > sizeof w->path) {
        rc = dsrt__fail(-ENAMETOOLONG, "datastore: %s: path too long", path);
        goto out;
    }
    memcpy(w->path, path, n);
    w->path[n] = '\0';
    w->path_len = n;
    root = open(w->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        rc = dsrt__fail(-errno, "datastore: %s: %s", w->path, strerror(errno));
        goto out;
    }
    struct stat st;
    if (fstat(root, &st) != 0) {
        rc = dsrt__fail(-errno, "datastore: %s: %s", w->path, strerror(errno));
        goto out;
    }
    w->stack[0].dev = st.st_dev;
    w->stack[0].ino = st.st_ino;
    w->depth = 1;

    if (o->label_source != DSRT_LABEL_FOLDER_NAMES) {
        const char *base = strrchr(w->path, '/');
        base = base && base[1] ? base + 1 : w->path;
        int fd = root;
        root = -1;
        rc = walk(w, fd, o->label_source == DSRT_LABEL_NONE ? 0 : -1, base);
        if (rc != 0) goto out;
        if (o->label_source == DSRT_LABEL_NONE) {
            const char *none = "";
            rc = dsrt__index_set_classes(ix, &none, 1);
        } else {
            rc = label_by_parent(w);
        }
        if (rc != 0) goto out;
        dsrt__folder_sort(w->files, w->n_files, o->label_source != DSRT_LABEL_NONE);
    } else {
        /* Classes: the sub-folders of the root, sorted by name. */
        d = fdopendir(root);
        if (!d) {
            rc = dsrt__fail(-errno, "datastore: %s: %s", w->path, strerror(errno));
            goto out;
        }
        root = -1;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            const char *name = de->d_name;
            if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
                continue;
            int t = entry_type(w, dirfd(d), de);
            if (t == DT_REG) {
                root_files += wanted(w, name);
            } else if (t == DT_DIR) {
                void *buf = classes;
                if ((rc = dsrt__grow(&buf, &cap_classes, n_classes + 1, sizeof(char *))) != 0)
                    goto out;
                classes = buf;
                if (!(classes[n_classes++] = dsrt__arena_strndup(&ix->arena, name, strlen(name)))) {
                    rc = -ENOMEM;
                    goto out;
                }
            }
        }
        dsrt__sort(classes, n_classes, sizeof *classes, cmp_name);
        if (root_files)
            dsrt__index_warn(ix,
                             "%s: %zu image file%s directly in the root ignored (not inside "
                             "a class folder)",
                             w->path, root_files, root_files > 1 ? "s" : "");
        for (size_t c = 0; c < n_classes; c++) {
            size_t saved = w->path_len, before = w->n_files;
            int fd;
            int entered = enter(w, dirfd(d), classes[c], &fd);
            if (entered < 0) {
                rc = entered;
                goto out;
            }
            if (!entered) continue;
            rc = walk(w, fd, (int32_t)c, classes[c]);
            leave(w, saved);
            if (rc != 0) goto out;
            if (w->n_files == before)
                dsrt__index_warn(ix, "%s/%s: class folder holds no image file%s", w->path,
                                 classes[c], o->drop_empty_classes ? ": not a class" : "");
        }
        if (o->drop_empty_classes && (rc = drop_empty(w, classes, &n_classes)) != 0) goto out;
        if ((rc = dsrt__index_set_classes(ix, classes, n_classes)) != 0) goto out;
        dsrt__folder_sort(w->files, w->n_files, 1);
    }
    rc = dsrt__folder_fill(ix, w->files, w->n_files);
out:
    if (d) closedir(d);
    if (root >= 0) close(root);
    free(classes);
    if (w) {
        free(w->files);
        free(w->dir_names);
        free(w);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// The source

static int detect(const dsrt_probe *p) {
    return p->exists && p->folder;
}

/* Only s3:// prefixes can be listed as folders. */
static int detect_url(const char *url, const dsrt_datastore_options *o) {
    (void)o;
    return strncasecmp(url, "s3://", 5) == 0;
}

static int open_url(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    if (strncasecmp(url, "s3://", 5) == 0) return dsrt__s3_folder_load(ix, url, o);
    return dsrt__fail(DSRT_EUNSUPPORTED,
                      "datastore: a folder source cannot be read from a URL (folders from s3:// "
                      "prefixes and manifests can): copy it to a local file");
}

/* The root of a local folder: the longest folder every path starts with. */
static int folders(const dsrt_datastore *ds, int (*each)(void *ctx, const char *dir), void *ctx) {
    const dsrt_index *ix = ds->index;
    char dir[4096];
    if (ix->remote || !ix->n) return 0;
    const char *p0 = ix->paths[0];
    size_t common = strlen(p0);
    for (size_t i = 1; i < ix->n && common > 0; i++) {
        size_t m = 0;
        while (m < common && ix->paths[i][m] == p0[m]) m++;
        common = m;
    }
    while (common > 0 && p0[common - 1] != '/') common--;
    if (common == 0)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(common > 1 ? common - 1 : 1), p0);
    return each(ctx, dir);
}

const dsrt_source_ops dsrt__source_folder = {
    .kind = DSRT_SOURCE_FOLDER,
    .what = "a folder",
    .empty = "; check the extensions option",
    .detect = detect,
    .detect_url = detect_url,
    .open = dsrt__folder_load,
    .open_url = open_url,
    .folders = folders,
};
