/*
 * The table of codecs (codecs.h): one entry a line of DSRT_FORMATS, in its
 * order, each the dsrt_codec_ops its file defines as dsrt__codec_<name>.
 * Sniffing asks them in turn; the default extensions and the formats named
 * in messages are theirs, so a new format is one file and one line.
 */
#include "datastore/codecs/codecs.h"

#include <stdio.h>
#include <string.h>

#define DSRT_CODEC_DECLARE_(kind, value, name) extern const dsrt_codec_ops dsrt__codec_##name;
DSRT_FORMATS(DSRT_CODEC_DECLARE_)
#undef DSRT_CODEC_DECLARE_

#define DSRT_CODEC_ENTRY_(kind, value, name) &dsrt__codec_##name,
static const dsrt_codec_ops *const CODECS[] = {DSRT_FORMATS(DSRT_CODEC_ENTRY_)};
#undef DSRT_CODEC_ENTRY_

size_t dsrt__codec_count(void) {
    return DSRT_ARRAY_SIZE(CODECS);
}

const dsrt_codec_ops *dsrt__codec_at(size_t k) {
    return k < DSRT_ARRAY_SIZE(CODECS) ? CODECS[k] : NULL;
}

const dsrt_codec_ops *dsrt__codec_ops(dsrt_format f) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(CODECS); k++)
        if (CODECS[k]->format == f) return CODECS[k];
    return NULL;
}

const dsrt_codec_ops *dsrt__codec_sniff(const uint8_t *buf, size_t len, int *short_) {
    int cut = 0;
    if (buf && len > 0)
        for (size_t k = 0; k < DSRT_ARRAY_SIZE(CODECS); k++) {
            int s = CODECS[k]->sniff(buf, len);
            if (s == DSRT_SNIFF_YES) {
                if (short_) *short_ = 0;
                return CODECS[k];
            }
            cut |= s == DSRT_SNIFF_SHORT;
        }
    if (short_) *short_ = cut;
    return NULL;
}

void dsrt__codec_names(char *out, size_t cap) {
    size_t n = 0, count = DSRT_ARRAY_SIZE(CODECS);
    out[0] = '\0';
    for (size_t k = 0; k < count && n < cap; k++) {
        const char *sep = k == 0 ? "" : k + 1 == count ? " or " : ", ";
        int w = snprintf(out + n, cap - n, "%s%s", sep, CODECS[k]->what);
        if (w < 0) break;
        n += (size_t)w;
    }
}

int dsrt__codec_extensions(int (*each)(void *ctx, const char *ext, size_t len), void *ctx) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(CODECS); k++)
        for (const char *p = CODECS[k]->extensions; *p;) {
            size_t n = strcspn(p, ",");
            int rc = n ? each(ctx, p, n) : 0;
            if (rc) return rc;
            p += n + (p[n] == ',');
        }
    return 0;
}

// ----------------------------------------------------------------------------
// The public side of the table

dsrt_format dsrt_detect_format(const void *buf, size_t len) {
    const dsrt_codec_ops *c = dsrt__codec_sniff(buf, len, NULL);
    return c ? c->format : DSRT_FORMAT_UNKNOWN;
}
