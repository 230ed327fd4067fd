/*
 * Locations and request strings (url.h): which paths are URLs, and the
 * string buffer requests are built in.
 */
#include "datastore/bytes/url.h"

#include <ctype.h>
#include <dsrt/datastore.h>
#include <dsrt/core.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

int dsrt_path_is_url(const char *path) {
    return dsrt__is_url(path);
}

int dsrt__is_url_n(const char *p, size_t n) {
    static const char *const schemes[] = {"s3://", "http://", "https://"};
    for (size_t k = 0; p && k < DSRT_ARRAY_SIZE(schemes); k++)
        if (n >= strlen(schemes[k]) && strncasecmp(p, schemes[k], strlen(schemes[k])) == 0)
            return 1;
    return 0;
}

int dsrt__is_url(const char *p) {
    return p && dsrt__is_url_n(p, strlen(p));
}

int dsrt__sb_add(dsrt_strbuf *b, const char *s, size_t n) {
    void *p = b->s;
    if (dsrt__grow(&p, &b->cap, b->len + n + 1, 1) != 0) return -ENOMEM;
    b->s = p;
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

int dsrt__sb_printf(dsrt_strbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -EINVAL;
    if ((size_t)n < sizeof tmp) return dsrt__sb_add(b, tmp, (size_t)n);
    void *p = b->s;
    if (dsrt__grow(&p, &b->cap, b->len + (size_t)n + 1, 1) != 0) return -ENOMEM;
    b->s = p;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int dsrt__sb_encode(dsrt_strbuf *b, const char *s, size_t n, int keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[3];
        int plain =
            isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        if (plain) {
            if (dsrt__sb_add(b, (const char *)&s[i], 1) != 0) return -ENOMEM;
            continue;
        }
        e[0] = '%';
        e[1] = hex[c >> 4];
        e[2] = hex[c & 15];
        if (dsrt__sb_add(b, e, 3) != 0) return -ENOMEM;
    }
    return 0;
}

int dsrt__s3_split(const char *url, const char **bucket, size_t *bucket_len, const char **key) {
    if (strncasecmp(url, "s3://", 5) != 0)
        return dsrt__fail(DSRT_EOPTION, "s3: %s: not an s3:// URL", url);
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t n = slash ? (size_t)(slash - b) : strlen(b);
    if (n == 0) return dsrt__fail(DSRT_EOPTION, "s3: %s: no bucket name", url);
    for (size_t i = 0; i < n; i++)
        if (b[i] == '?' || b[i] == '#' || b[i] == '@' || b[i] == ':' || (unsigned char)b[i] <= ' ')
            return dsrt__fail(DSRT_EOPTION, "s3: %s: \"%.*s\" is not a bucket name", url, (int)n,
                              b);
    *bucket = b;
    *bucket_len = n;
    *key = slash ? slash + 1 : b + n;
    return 0;
}
