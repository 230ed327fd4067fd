/*
 * libFuzzer target for class-name lists (--classes files, one name a line):
 * any bytes are either refused with a message naming the line, or give
 * names that each hold 1 to 255 bytes of UTF-8 without control characters,
 * one for each line of the text (blank lines at the end aside), which read
 * back the same when written one a line again.
 */
#include "core/internal.h"

#include <dsrt/train.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char **names = NULL;
    int n = 0;
    int rc = dsrt_class_names_parse((const char *)data, size, &names, &n);
    if (rc != 0) {
        if (names || !strstr(dsrt_last_error(), "class names: ")) abort();
        return 0;
    }
    if (!names || n < 1 || names[n]) abort();
    size_t total = 0;
    char why[128];
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (dsrt__class_name_check(names[i], len, why, sizeof why) != 0) abort();
        total += len + 1;
    }
    /* Written back one a line, they read the same. */
    char *text = malloc(total);
    if (!text) abort();
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        memcpy(text + at, names[i], len);
        text[at + len] = '\n';
        at += len + 1;
    }
    char **again = NULL;
    int m = 0;
    if (dsrt_class_names_parse(text, at, &again, &m) != 0 || m != n) abort();
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], again[i]) != 0) abort();
    dsrt_class_names_free(again);
    dsrt_class_names_free(names);
    free(text);
    return 0;
}
