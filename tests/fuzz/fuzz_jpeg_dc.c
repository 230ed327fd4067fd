/*
 * libFuzzer target: the DC-term decoder (datastore/codecs/jpeg_dc.c) against
 * libjpeg's 1/8 decode, each input in fresh decoders and again in decoders
 * kept across inputs (tests/dcdiff.h says what is made and checked). An
 * input is a recipe: its first bytes choose the family that makes a JPEG
 * (TurboJPEG, libjpeg's encoder, synthetic files) and its parameters, the
 * bytes after them the edits that damage it; an input that starts with
 * FF D8 is a JPEG itself, so real files seed it too (test_decode and
 * test_slow_jpeg_dc write corpora with DSRT_WRITE_CORPUS=dir). A
 * difference traps, which keeps the input.
 */
#include "../dcdiff.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dd_kept kept;
    static dd_stats st;
    if (size > (size_t)1 << 16) return 0;
    uint8_t *file;
    size_t len;
    int bad = dd_run(data, size, &kept, &st, &file, &len);
    free(file);
    if (bad) __builtin_trap();
    return 0;
}
