/*
 * Exporting in-memory sources as image folders: every sample of an IDX or
 * CIFAR datastore (or of a view of one) becomes out/<class name>/<n>.png, so
 * that MNIST or CIFAR can be fed through the folder path of the pipeline, or
 * looked at, or handed to another tool that expects ImageFolder's layout.
 *
 * n is the sample's position in the datastore or view given, so exporting a
 * shuffled view numbers the files in the shuffled order. Every class gets its
 * folder, even one with no sample in the view, so the exported folder opens
 * with the same set of classes.
 */
#include "datastore/index/index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p: creates path and its missing parents; existing folders are fine. */
static int mkdir_p(const char *path) {
    char *p = dsrt__strdup(path);
    int rc = 0;
    if (!p) return -ENOMEM;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = dsrt__fail(-errno, "export: %s: %s", p, strerror(errno));
            break;
        }
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = dsrt__fail(-ENOTDIR, "export: %s: exists and is not a folder", p);
            break;
        }
        *s = saved;
        if (saved == '\0') break;
    }
    free(p);
    return rc;
}

/* A class name must be usable as one folder name, and tell classes apart. */
static int check_name(const char *const *names, size_t c) {
    const char *s = names[c];
    if (!s || !*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
        return dsrt__fail(DSRT_EOPTION, "export: class %zu: \"%s\" cannot be a folder name", c,
                          s ? s : "(null)");
    for (size_t k = 0; k < c; k++)
        if (!strcmp(names[k], s))
            return dsrt__fail(DSRT_EOPTION, "export: classes %zu and %zu are both named \"%s\"", k,
                              c, s);
    return 0;
}

int64_t dsrt_datastore_export(const dsrt_datastore *ds, const char *out,
                              const char *const *class_names) {
    if (!ds || !out || !*out) return dsrt__fail(DSRT_EOPTION, "export: no datastore or no folder");
    const dsrt_index *ix = ds->index;
    if (!ix->pixels)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "export: a %s datastore holds files, not pixels; only IDX and CIFAR "
                          "datastores can be exported",
                          dsrt_source_name(ix->source));
    const char *const *names = class_names ? class_names : ix->classes;
    size_t longest = 0;
    int rc;
    for (size_t c = 0; c < ix->num_classes; c++) {
        if ((rc = check_name(names, c)) != 0) return rc;
        longest = DSRT_MAX(longest, strlen(names[c]));
    }
    if ((rc = mkdir_p(out)) != 0) return rc;

    size_t cap = strlen(out) + longest + 32;
    char *path = dsrt__malloc(cap);
    if (!path) return -ENOMEM;
    for (size_t c = 0; c < ix->num_classes; c++) {
        snprintf(path, cap, "%s/%s", out, names[c]);
        if ((rc = mkdir_p(path)) != 0) goto fail;
    }

    const size_t sample = (size_t)ix->width * ix->height * ix->channels;
    for (size_t i = 0; i < ds->n; i++) {
        uint32_t p = dsrt__pos(ds, i);
        int32_t label = ix->labels[p];
        if (label < 0 || (size_t)label >= ix->num_classes) {
            rc = dsrt__fail(DSRT_ECORRUPT, "export: sample %zu has label %d of %zu classes", i,
                            (int)label, ix->num_classes);
            goto fail;
        }
        dsrt_image img = {
            .data = ix->pixels + (size_t)p * sample,
            .width = ix->width,
            .height = ix->height,
            .channels = ix->channels,
            .stride = (size_t)ix->width * ix->channels,
        };
        snprintf(path, cap, "%s/%s/%05zu.png", out, names[label], i);
        if ((rc = dsrt_png_write(path, &img)) != 0) goto fail;
    }
    /* One flush of the whole file system at the end, rather than one per
     * file: the export is durable when it returns. */
    int fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        syncfs(fd);
        close(fd);
    }
    free(path);
    return (int64_t)ds->n;
fail:
    free(path);
    return rc;
}
