/*
 * The HTTP client that fetches objects (s3://, http://, https://), whole or
 * by byte range, many in flight on one thread (http.c, on libcurl's multi
 * interface). It is the io engine's counterpart for objects in a store: the
 * file reader hands it URLs, the readers of ranged members their objects.
 *
 * A location is a URL: s3://bucket/key is signed and sent to the configured
 * endpoint (datastore/bytes/s3.h), http:// and https:// URLs are fetched as
 * they are. A request names a location and optionally a byte range.
 */
#ifndef DSRT_DATASTORE_BYTES_HTTP_H
#define DSRT_DATASTORE_BYTES_HTTP_H

#include <dsrt/datastore.h>

#include "datastore/bytes/s3.h"

#include <stdint.h>

/* The defaults of remote options (dsrt_reader_defaults().remote). */
dsrt_remote_options dsrt__remote_defaults(void);

/* Refuses remote options out of range (DSRT_EOPTION, the message naming
 * who and the field), so that a pipeline refuses them before any thread. */
int dsrt__remote_options_check(const dsrt_remote_options *o, const char *who);

typedef struct dsrt_http dsrt_http;

/* A client for one thread: a curl multi handle with o->depth requests in
 * flight at most (o NULL: the defaults). */
int dsrt__http_create(dsrt_http **h, const dsrt_remote_options *o);
void dsrt__http_destroy(dsrt_http *h);

/* Queues a GET of url's bytes [offset, offset + length) (length 0: all)
 * into buf[0..cap). url and buf stay valid until the result is collected.
 * version is the object's as its listing gave it (dsrt__cache_version of
 * its ETag and size), 0 when not known: with a cache (remote.cache_dir),
 * the entries of another version are not taken. -EBUSY when depth requests
 * are in flight. */
int dsrt__http_submit(dsrt_http *h, const char *url, uint64_t version, uint64_t offset,
                      uint64_t length, void *buf, size_t cap, uint64_t tag);

/* One finished request, as dsrt_reader_collect. With wait, blocks until one
 * is done or extra_fd (>= 0) is readable (then returns 0). */
int dsrt__http_collect(dsrt_http *h, dsrt_read_result *res, int wait, int extra_fd);

unsigned dsrt__http_in_flight(const dsrt_http *h);
/* Drops every request in flight or finished and not collected. */
void dsrt__http_cancel(dsrt_http *h);
void dsrt__http_stats(const dsrt_http *h, dsrt_remote_stats *s);
/* The epoch the requests to follow read, for a cache's eviction
 * (dsrt__cache_epoch); nothing without a cache. */
void dsrt__http_epoch(dsrt_http *h, uint64_t epoch);
/* The version (ETag and size) of the object of the last result handed
 * over, 0 when its answer gave no ETag or size. */
uint64_t dsrt__http_delivered_version(const dsrt_http *h);

/* Queues a GET of a whole object (at most max bytes) into a buffer of its
 * own, which the result hands over NUL-terminated (res.buf: the caller
 * frees it, also on failure). query as dsrt__http_fetch's; it and url stay
 * valid until the result is collected. A failed result's message is the
 * location's and the cause's, without the reader's "read: ". */
int dsrt__http_submit_whole(dsrt_http *h, const char *url, const char *query, size_t max,
                            uint64_t tag);

/* A whole object (at most max bytes) into a new NUL-terminated buffer, on
 * the calling thread, retried like any request. query, for s3:// URLs, is a
 * canonical query string or NULL. */
int dsrt__http_fetch(dsrt_http *h, const char *url, const char *query, size_t max, uint8_t **out,
                     size_t *len);

/* The bytes [offset, offset + length) of url into buf (length bytes), on
 * the calling thread, retried like any request. *got gets the bytes
 * received (fewer when the object ends first: DSRT_ETRUNCATED), and
 * *object_size the whole object's size as the answer gave it
 * (Content-Range, or the Content-Length of a whole answer), UINT64_MAX when
 * it gave none. */
int dsrt__http_fetch_range(dsrt_http *h, const char *url, uint64_t offset, uint64_t length,
                           void *buf, size_t *got, uint64_t *object_size);

/* The remote options of the requests that open a datastore: the fields
 * of o->remote that are set (non-zero) over the reader's defaults, checked
 * (DSRT_EOPTION naming the field). o may be NULL. */
int dsrt__remote_opening_options(const dsrt_datastore_options *o, dsrt_remote_options *ro);

/* A client for the requests that open a datastore (listings, a manifest,
 * a shard set's index and scans): the fields of o->remote that are set
 * over the reader's defaults, at most depth requests in flight, and o's
 * interrupted callback asked while it waits (every 100 ms at least), whose
 * non-zero answer fails the wait with -EINTR. o may be NULL. */
int dsrt__http_create_opening(dsrt_http **h, const dsrt_datastore_options *o, unsigned depth);

/* The client's S3 configuration (NULL before its first s3:// request). */
const dsrt_s3_config *dsrt__http_s3(const dsrt_http *h);

/* A whole object into a new buffer, with a client of its own (the simple
 * reads on the calling thread, as dsrt_datastore_read_image's). */
int dsrt__remote_read_whole(const char *url, size_t max, uint8_t **out, size_t *len);

/* The bytes [offset, offset + length) of url into buf, with a client of its
 * own; *got as dsrt__http_fetch_range's (DSRT_ETRUNCATED when fewer). */
int dsrt__remote_read_range(const char *url, uint64_t offset, uint64_t length, void *buf,
                            size_t *got);

#endif
