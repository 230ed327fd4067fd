/*
 * libFuzzer target for the IDX parser and the gzip inflater under it: any
 * input must either parse into data of exactly the size its dimensions give,
 * or fail with a message, without reading outside the input or allocating
 * past the limit.
 */
#include "datastore/sources/idx/idx.h"

#include <stdlib.h>

/* Small, so that a forged header cannot make the fuzzer run out of memory. */
#define FUZZ_MAX_BYTES ((size_t)16 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every byte, so that ASan checks the whole buffer is really there. */
static void touch(const uint8_t *p, size_t n) {
    uint8_t s = 0;
    for (size_t i = 0; i < n; i++) s ^= p[i];
    __asm__ volatile("" : : "r"(s));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsrt_idx idx;
    dsrt__clear_error();
    if (dsrt__idx_parse(data, size, "fuzz.idx", FUZZ_MAX_BYTES, &idx) == 0) {
        size_t want = 1;
        if (idx.ndim < 1 || idx.ndim > 4) __builtin_trap();
        for (int d = 0; d < idx.ndim; d++) want *= idx.dims[d];
        if (want != idx.size || idx.size > FUZZ_MAX_BYTES || !idx.data) __builtin_trap();
        touch(idx.data, idx.size);
        free(idx.data);
    } else if (idx.data || !dsrt_last_error()[0]) {
        __builtin_trap();
    }

    uint8_t *out = NULL;
    size_t n = 0;
    if (dsrt__gunzip(data, size, "fuzz.gz", FUZZ_MAX_BYTES, &out, &n) == 0) {
        if (!out || n > FUZZ_MAX_BYTES) __builtin_trap();
        touch(out, n);
        free(out);
    } else if (out) {
        __builtin_trap();
    }
    return 0;
}
