/*
 * libFuzzer target for the manifest (CSV) parser. The first input byte picks
 * the header mode and the base folder; the rest is the manifest. On success
 * every sample must have a path and a label in range, and the classes must be
 * distinct and in the documented order.
 */
#include "datastore/sources/manifest/manifest.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void index_clear(dsrt_index *ix) {
    free(ix->paths);
    free(ix->labels);
    free(ix->classes);
    free(ix->pixels);
    free(ix->warnings);
    dsrt__arena_free(&ix->arena);
}

static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const bases[4] = {NULL, "", "/base", "rel/dir/"};
    if (size < 1) return 0;
    const int header = (int)(data[0] % 3) - 1;
    const char *base = bases[(data[0] >> 2) & 3];
    /* A copy of exactly the text, so that reading past it is caught. */
    char *text = malloc(size - 1 ? size - 1 : 1);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);

    dsrt_index ix = {0};
    dsrt__clear_error();
    if (dsrt__manifest_parse(&ix, text, size - 1, "fuzz.csv", base, header) == 0) {
        int numeric = 1;
        for (size_t c = 0; c < ix.num_classes; c++) numeric &= all_digits(ix.classes[c]);
        for (size_t c = 1; c < ix.num_classes; c++) {
            const char *a = ix.classes[c - 1], *b = ix.classes[c];
            if (strcmp(a, b) == 0) __builtin_trap();
            if (!numeric && strcmp(a, b) > 0) __builtin_trap();
        }
        for (size_t i = 0; i < ix.n; i++) {
            if (ix.labels[i] < 0 || (size_t)ix.labels[i] >= ix.num_classes) __builtin_trap();
            if (!ix.paths[i] || !ix.paths[i][0]) __builtin_trap();
        }
    } else if (!dsrt_last_error()[0]) {
        __builtin_trap();
    }
    index_clear(&ix);
    free(text);
    return 0;
}
