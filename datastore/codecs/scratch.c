/*
 * Scratch memory for decoding (codecs.h): buffers that grow on demand and
 * are kept between images, so that after the first few images a decoder's
 * own allocations stop. The decoder owns them and lends them to the codec
 * of each image; nothing here knows a format.
 */
#include "datastore/codecs/codecs.h"

#include <stdlib.h>

/* Grows by half again at least, so that a stream of images of slowly rising
 * sizes does not reallocate every time. */
uint8_t *dsrt__scratch(uint8_t **buf, size_t *cap, size_t need, size_t align) {
    if (need <= *cap && *buf) return *buf;
    if (need > SIZE_MAX - align) {
        dsrt__fail(-ENOMEM, "decode: out of memory: %zu bytes", need);
        return NULL;
    }
    size_t c = *cap + *cap / 2;
    if (c < need) c = need;
    if (c > SIZE_MAX - align) c = need;
    c = (c + align - 1) & ~(align - 1);
    free(*buf);
    *buf = NULL;
    *cap = 0;
    void *p = NULL;
    if (posix_memalign(&p, align, c) != 0) {
        /* The generous size failed; the exact one may not. */
        c = (need + align - 1) & ~(align - 1);
        if (posix_memalign(&p, align, c ? c : align) != 0) {
            dsrt__fail(-ENOMEM, "decode: out of memory allocating %zu bytes", need);
            return NULL;
        }
    }
    *buf = p;
    *cap = c;
    return p;
}

uint8_t *dsrt__codec_pixels(dsrt_codec_scratch *sc, size_t need) {
    return dsrt__scratch(&sc->pixels, &sc->pixels_cap, need ? need : 1, DSRT_PIXEL_ALIGN);
}

uint8_t *dsrt__codec_work(dsrt_codec_scratch *sc, size_t need) {
    return dsrt__scratch(&sc->work, &sc->work_cap, need ? need : 1, DSRT_PIXEL_ALIGN);
}

int dsrt__codec_target(dsrt_codec_scratch *sc, uint8_t *dst, size_t cap, int w, int h, int ch,
                       uint8_t **out) {
    size_t bytes = (size_t)w * (size_t)h * (size_t)ch;
    *out = NULL;
    if (dst && cap < bytes)
        return dsrt__fail(DSRT_ETOOBIG,
                          "decode: destination holds %zu bytes, the %dx%dx%d image needs %zu", cap,
                          w, h, ch, bytes);
    if (!dst && !(dst = dsrt__codec_pixels(sc, bytes))) return -ENOMEM;
    *out = dst;
    return 0;
}

void dsrt__codec_scratch_free(dsrt_codec_scratch *sc) {
    free(sc->pixels);
    free(sc->work);
    sc->pixels = sc->work = NULL;
    sc->pixels_cap = sc->work_cap = 0;
}
