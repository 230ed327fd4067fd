/*
 * libFuzzer target for the CIFAR batch parser. The first input byte picks
 * CIFAR-10 or CIFAR-100, fine or coarse labels, and whether the rest is
 * parsed twice (appending a second batch to the first); the rest is the
 * batch. Every label that reaches the index must be in range, and a failed
 * parse must leave the sample count as it was.
 */
#include "datastore/sources/cifar/cifar.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every byte, so that ASan checks the whole buffer is really there. */
static void touch(const uint8_t *p, size_t n) {
    uint8_t s = 0;
    for (size_t i = 0; i < n; i++) s ^= p[i];
    __asm__ volatile("" : : "r"(s));
}

/* The index is on the stack; free what the parser put in it. */
static void index_clear(dsrt_index *ix) {
    free(ix->paths);
    free(ix->labels);
    free(ix->classes);
    free(ix->pixels);
    free(ix->warnings);
    dsrt__arena_free(&ix->arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    const dsrt_source kind = flags & 1 ? DSRT_SOURCE_CIFAR100 : DSRT_SOURCE_CIFAR10;
    const int coarse = (flags >> 1) & 1, rounds = flags & 4 ? 2 : 1;
    const int limit = kind == DSRT_SOURCE_CIFAR10 ? 10 : coarse ? 20 : 100;
    dsrt_index ix = {0};

    for (int r = 0; r < rounds; r++) {
        size_t before = ix.n;
        dsrt__clear_error();
        if (dsrt__cifar_parse(&ix, data + 1, size - 1, "fuzz.bin", kind, coarse) != 0) {
            if (ix.n != before || !dsrt_last_error()[0]) __builtin_trap();
            break;
        }
        if (ix.n != before + (size - 1) / (kind == DSRT_SOURCE_CIFAR10 ? 3073 : 3074))
            __builtin_trap();
    }
    for (size_t i = 0; i < ix.n; i++)
        if (ix.labels[i] < 0 || ix.labels[i] >= limit) __builtin_trap();
    if (ix.n) {
        if (ix.width != 32 || ix.height != 32 || ix.channels != 3) __builtin_trap();
        touch(ix.pixels, ix.n * 3072);
    }
    index_clear(&ix);
    return 0;
}
