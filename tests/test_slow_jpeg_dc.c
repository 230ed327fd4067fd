/*
 * The DC-term decoder against libjpeg's 1/8 decode, for a bounded number of
 * cases (tests/dcdiff.h says what is made and checked; the libFuzzer target
 * tests/fuzz/fuzz_jpeg_dc.c runs the same check without a bound): recipes
 * drawn from a hash of the case's number for the turbo, libjpeg and synth
 * families, and real files (every kind test images come in) with bytes
 * changed anywhere for the raw family. Passes when no case differs; prints
 * the cases tried, taken by the DC decoder, decoded and refused by both,
 * by family and whether they were edited.
 *
 *   DSRT_DCDIFF_CASES=n     cases (default 20000)
 *   DSRT_DCDIFF_FIRST=k     the first case's number (default 0)
 *   DSRT_WRITE_CORPUS=dir   writes every file checked there, a seed corpus
 *                           for fuzz_jpeg_dc
 *
 * A difference names the case: DSRT_DCDIFF_FIRST=k DSRT_DCDIFF_CASES=1
 * runs it alone.
 */
#include "dcdiff.h"
#include "task.h"

/* A real file of case k: one of test images' kinds, with up to three bytes
 * changed after its first two. */
static uint8_t *raw_case(uint32_t k, size_t *len, int *edited) {
    uint32_t h = timg_hash(k * 2654435761u + 17);
    int kind = (int)(h % TIMG_JPEG_KINDS);
    int w = 1 + (int)(timg_hash(h) % 120), hh = 1 + (int)(timg_hash(h + 1) % 120);
    uint8_t *j = timg_make_jpeg(kind, w, hh, h, len);
    if (!j) return NULL;
    int changes = (int)(timg_hash(h + 2) % 6);
    changes = changes > 3 ? 0 : changes;
    *edited = changes > 0;
    for (int c = 0; c<changes && * len> 2; c++) {
        uint32_t r = timg_hash(h + 3 + (uint32_t)c);
        j[2 + r % (*len - 2)] = (uint8_t)(r >> 24);
    }
    return j;
}

int main(void) {
    const char *s = getenv("DSRT_DCDIFF_CASES"), *f = getenv("DSRT_DCDIFF_FIRST");
    long cases = s ? atol(s) : 20000, first = f ? atol(f) : 0;
    const char *dir = getenv("DSRT_WRITE_CORPUS");
    if (dir && timg_mkdirs(dir) != 0) dir = NULL;
    dd_kept kept = {0};
    dd_stats st;
    memset(&st, 0, sizeof st);
    for (long c = first; c < first + cases; c++) {
        uint8_t *file = NULL;
        size_t len = 0;
        int bad;
        if (c % 4 == 3) {
            int edited = 0;
            file = raw_case((uint32_t)c, &len, &edited);
            if (!file) {
                st.no_file++;
                continue;
            }
            char name[64];
            snprintf(name, sizeof name, "case %ld: raw%s", c, edited ? ", edited" : "");
            bad = dd_check(file, len, DD_RAW, edited, &kept, &st, name);
        } else {
            uint8_t recipe[64];
            for (size_t i = 0; i < sizeof recipe; i++)
                recipe[i] = (uint8_t)timg_hash((uint32_t)c * 977u + (uint32_t)i * 7919u + 1);
            recipe[0] = (uint8_t)(c % 4); /* turbo, libjpeg, synth in turn */
            bad = dd_run(recipe, sizeof recipe, &kept, &st, &file, &len);
        }
        if (bad) fprintf(stderr, "case %ld differs\n", c);
        CHECK_EQ(bad, 0);
        if (dir && file) {
            char path[4096];
            snprintf(path, sizeof path, "%s/dcdiff-%06ld.jpg", dir, c);
            timg_write_file(path, file, len);
        }
        free(file);
    }
    dd_kept_free(&kept);
    dd_report(&st, stderr);
    CHECK_EQ(st.mismatches, 0);
    return TEST_RESULT();
}
