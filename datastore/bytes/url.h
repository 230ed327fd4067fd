/*
 * Locations and the strings requests are made of: whether a path is a URL
 * of an object (s3://, http://, https://), an s3:// URL's bucket and key,
 * and a growing string buffer with the percent-encoding S3 wants.
 */
#ifndef DSRT_DATASTORE_BYTES_URL_H
#define DSRT_DATASTORE_BYTES_URL_H

#include "core/internal.h"

/* 1 for "s3://", "http://" and "https://" (any case). */
int dsrt__is_url(const char *path);
/* 1 when p[0..n) starts with one of them. */
int dsrt__is_url_n(const char *p, size_t n);

/* "s3://bucket/key" -> bucket and key (key may be empty). The pointers
 * point into url; *bucket_len is the bucket's length. */
int dsrt__s3_split(const char *url, const char **bucket, size_t *bucket_len, const char **key);

/* A string that grows; s is NUL-terminated, freed with free. */
typedef struct {
    char *s;
    size_t len, cap;
} dsrt_strbuf;

/* Each returns 0 or -ENOMEM. */
int dsrt__sb_add(dsrt_strbuf *b, const char *s, size_t n);
int dsrt__sb_printf(dsrt_strbuf *b, const char *fmt, ...) DSRT_PRINTF(2, 3);
/* Appends s[0..n) percent-encoded as S3 wants it (unreserved bytes kept,
 * and '/' kept when keep_slash). */
int dsrt__sb_encode(dsrt_strbuf *b, const char *s, size_t n, int keep_slash);

#endif
