/*
 * libFuzzer target for tar shards: the first input byte picks what the rest
 * is. 0-1: a shard, scanned into samples as a shard set's files are (the tar
 * walk with pax headers, GNU long names and damaged headers, then members
 * grouped by key); every sample found must lie inside the input unless the
 * walk said it was cut short, and the walk must stop. 2: dsrt's shard index;
 * when it parses, every sample must lie inside its shard and have a label of
 * a class. 3: classes.json. Bad input may fail, but always with a message.
 */
#include "datastore/sources/shards/shards.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void index_clear(dsrt_index *ix) {
    free(ix->warnings);
    dsrt__arena_free(&ix->arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int what = data[0] % 4;
    /* A copy of exactly the rest, so that reading past it is caught. */
    size_t len = size - 1;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return 0;
    memcpy(buf, data + 1, len);
    dsrt__clear_error();
    dsrt_index ix = {0};
    dsrt_arena arena = {0};
    if (what <= 1) {
        dsrt_shard_sample *s = NULL;
        size_t n = 0;
        int rc =
            dsrt__shard_scan_memory(buf, len, "fuzz.tar", what ? "png,cls" : NULL, &ix, &s, &n);
        if (rc == 0) {
            for (size_t i = 0; i < n; i++) {
                if (s[i].offset > len) __builtin_trap();
                if (s[i].offset % DSRT_TAR_BLOCK != 0) __builtin_trap();
            }
        } else if (!dsrt_last_error()[0]) {
            __builtin_trap();
        }
        free(s);
    } else if (what == 2) {
        dsrt_shard_index x;
        if (dsrt__shard_index_parse(buf, len, "fuzz.index", &x, &arena) == 0) {
            size_t at = 0;
            for (size_t k = 0; k < x.nshards; k++)
                for (uint32_t j = 0; j < x.shard_count[k]; j++, at++) {
                    if (x.offset[at] + x.size[at] > x.shard_size[k]) __builtin_trap();
                    if (x.label[at] < 0 || (size_t)x.label[at] >= (x.nclasses ? x.nclasses : 1))
                        __builtin_trap();
                    if (!x.member[at] || !x.member[at][0]) __builtin_trap();
                }
            if (at != x.n) __builtin_trap();
            dsrt__shard_index_clear(&x);
        } else if (!dsrt_last_error()[0]) {
            __builtin_trap();
        }
    } else {
        const char **names = NULL;
        size_t n = 0;
        if (dsrt__classes_json_parse((const char *)buf, len, "fuzz.json", &arena, &names, &n) ==
            0) {
            for (size_t c = 0; c < n; c++)
                if (!names[c]) __builtin_trap();
            free(names);
        } else if (!dsrt_last_error()[0]) {
            __builtin_trap();
        }
    }
    dsrt__arena_free(&arena);
    index_clear(&ix);
    free(buf);
    return 0;
}
