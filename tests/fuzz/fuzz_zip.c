/*
 * libFuzzer target for ZIP archives: the input is an archive, opened from
 * memory as a file would be (the end records, ZIP64's, the central
 * directory, the checks of names, overlaps and sizes, the folder rules),
 * then every sample it indexes is read as the members layer reads it: its
 * range copied out of the input and decoded by the archive's codec (the
 * local header, stored bytes or inflate, the CRC). The first input byte
 * picks the label mode. Every range must lie inside the input, every
 * decoded member fit what its codec asked for, and every failure carry a
 * message.
 */
#include "datastore/sources/zip/zip.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Buffers larger than this are not taken (a claim, not a crash). */
#define MAX_SAMPLE ((size_t)16 << 20)

static void index_clear(dsrt_index *ix) {
    free(ix->paths);
    free(ix->labels);
    free(ix->classes);
    free(ix->warnings);
    if (ix->data_free) ix->data_free(ix->data);
    dsrt__arena_free(&ix->arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    dsrt_datastore_options o = dsrt_datastore_defaults();
    o.label_source = (dsrt_label_source)(data[0] % 3);
    o.include_subfolders = data[0] & 4 ? 0 : 1;
    /* A copy of exactly the rest, so that reading past it is caught. */
    size_t len = size - 1;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return 0;
    memcpy(buf, data + 1, len);
    dsrt__clear_error();
    dsrt_index ix = {0};
    int rc = dsrt__zip_open_memory(&ix, "fuzz.zip", buf, len, &o);
    if (rc != 0 && !dsrt_last_error()[0]) __builtin_trap();
    const dsrt_shardset *s = ix.data;
    for (size_t i = 0; rc == 0 && s && i < ix.n; i++) {
        if (s->offset[i] > len || s->size[i] > len - s->offset[i]) __builtin_trap();
        if (ix.labels[i] < 0 || (size_t)ix.labels[i] >= ix.num_classes) __builtin_trap();
        uint64_t decoded = s->codec->decoded_size(s, (uint32_t)i);
        size_t need = (size_t)(decoded > s->size[i] ? decoded : s->size[i]);
        if (need > MAX_SAMPLE) continue;
        uint8_t *b = malloc(need ? need : 1);
        if (!b) break;
        memcpy(b, buf + s->offset[i], (size_t)s->size[i]);
        size_t got = 0;
        dsrt__clear_error();
        int r = s->codec->decode(s, (uint32_t)i, ix.paths[i], b, need ? need : 1,
                                 (size_t)s->size[i], &got);
        if (r == 0 && got > (need ? need : 1)) __builtin_trap();
        if (r != 0 && !dsrt_last_error()[0]) __builtin_trap();
        free(b);
    }
    index_clear(&ix);
    free(buf);
    return 0;
}
