/*
 * The limit an input pipeline is measured against (dsrt_datastore_decode_limit):
 * one core decoding the files of a datastore at full size to RGB, files
 * already in memory, nothing else. JPEGs go through TurboJPEG's
 * tjDecompress2 with its fast integer DCT (libjpeg-turbo's fastest
 * full-size decode), every other format (PNG, WebP) through the decoder.
 */
#include "datastore/index/index.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

/* Files read for the limit, at most this many bytes in all. */
#define LIMIT_MAX_BYTES ((size_t)1 << 30)

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double wall_s(void) {
    return clock_s(CLOCK_MONOTONIC);
}

typedef struct {
    uint8_t *data;
    size_t size;
    int width, height, jpeg;
} limit_file;

/* One pass over the files, its wall-clock seconds (*cpu: the thread's CPU
 * seconds). A file that fails is marked (width -1) and left out after. */
static double limit_pass(tjhandle *tj, dsrt_decoder *d, limit_file *f, size_t n, uint8_t *rgb,
                         double *cpu) {
    double t0 = wall_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (size_t i = 0; i < n; i++) {
        if (f[i].width <= 0) continue;
        int rc;
        if (f[i].jpeg) {
            rc = tjDecompress2(*tj, f[i].data, (unsigned long)f[i].size, rgb, f[i].width, 0,
                               f[i].height, TJPF_RGB, TJFLAG_FASTDCT);
            if (rc != 0 && tjGetErrorCode(*tj) == TJERR_WARNING) rc = 0;
            if (rc != 0) { /* a failed handle misbehaves: a fresh one */
                tjDestroy(*tj);
                *tj = tjInitDecompress();
            }
        } else {
            dsrt_decode_request r = {
                .channels = 3, .dst = rgb, .dst_cap = (size_t)f[i].width * f[i].height * 3};
            dsrt_image img;
            rc = dsrt_decode(d, f[i].data, f[i].size, &r, &img);
        }
        if (rc != 0) f[i].width = -1;
    }
    *cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    return wall_s() - t0;
}

int dsrt_datastore_decode_limit(const dsrt_datastore *ds, size_t max_images, unsigned passes,
                                dsrt_decode_limit *out) {
    assert(ds && out);
    memset(out, 0, sizeof *out);
    double start = wall_s();
    size_t n = dsrt_datastore_count(ds);
    if (n == 0 || !dsrt_datastore_path(ds, 0))
        return dsrt__fail(DSRT_EUNSUPPORTED, "decode limit: the samples are pixels in memory, "
                                             "not files to decode");
    if (max_images == 0 || max_images > n) max_images = n;
    if (passes == 0) passes = 1;
    int rc = 0;
    tjhandle tj = tjInitDecompress();
    dsrt_decoder *d = NULL;
    limit_file *f = dsrt__calloc(max_images, sizeof *f);
    uint8_t *rgb = NULL;
    size_t taken = 0, bytes = 0, biggest = 0;
    if (!tj || !f || (rc = dsrt_decoder_create(&d, NULL)) != 0) {
        rc = rc ? rc : dsrt__fail(-ENOMEM, "decode limit: out of memory");
        goto fail;
    }
    /* Files spread evenly over ds: every class, not the first ones. */
    for (size_t k = 0; k < max_images && bytes < LIMIT_MAX_BYTES; k++) {
        const char *path = dsrt_datastore_path(ds, k * n / max_images);
        limit_file *lf = &f[taken];
        dsrt_image_info info;
        if (dsrt__read_whole_file(path, (size_t)256 << 20, &lf->data, &lf->size) != 0 ||
            dsrt_decoder_info(d, lf->data, lf->size, &info) != 0) {
            free(lf->data);
            lf->data = NULL;
            out->skipped++;
            continue;
        }
        lf->width = info.width;
        lf->height = info.height;
        lf->jpeg = info.format == DSRT_FORMAT_JPEG;
        biggest = DSRT_MAX(biggest, (size_t)info.width * (size_t)info.height);
        bytes += lf->size;
        taken++;
    }
    if (taken == 0) {
        rc = dsrt__fail(DSRT_EEMPTY, "decode limit: none of the files decodes");
        goto fail;
    }
    if (!(rgb = dsrt__malloc(biggest * 3))) {
        rc = dsrt__fail(-ENOMEM, "decode limit: out of memory for a %zu-pixel image", biggest);
        goto fail;
    }
    double best = 0, best_cpu = 0;
    for (unsigned p = 0; p < passes; p++) {
        double cpu, t = limit_pass(&tj, d, f, taken, rgb, &cpu);
        if (!tj) {
            rc = dsrt__fail(-ENOMEM, "decode limit: tjInitDecompress: out of memory");
            goto fail;
        }
        if (p == 0 || t < best) best = t;
        if (p == 0 || cpu < best_cpu) best_cpu = cpu;
    }
    for (size_t i = 0; i < taken; i++) {
        if (f[i].width < 0) {
            out->skipped++;
            continue;
        }
        out->images++;
        out->megapixels += (double)f[i].width * f[i].height / 1e6;
    }
    if (out->images == 0) {
        rc = dsrt__fail(DSRT_EEMPTY, "decode limit: none of the files decodes");
        goto fail;
    }
    best = DSRT_MAX(best, 1e-9);
    out->images_per_s = (double)out->images / best;
    out->megapixels_per_s = out->megapixels / best;
    out->cpu_images_per_s = (double)out->images / DSRT_MAX(best_cpu, 1e-9);
fail:
    out->seconds = wall_s() - start;
    for (size_t i = 0; f && i < max_images; i++) free(f[i].data);
    free(f);
    free(rgb);
    dsrt_decoder_destroy(d);
    if (tj) tjDestroy(tj);
    return rc;
}
