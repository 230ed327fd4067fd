/*
 * Object storage inside the datastore: the HTTP client that fetches objects
 * (http.c, on libcurl's multi interface) and what it knows of S3 (s3.c: the
 * configuration the AWS tools read, addressing, Signature Version 4, the
 * store's error answers, and listing a prefix into an index).
 *
 * A location is a URL: s3://bucket/key is signed and sent to the configured
 * endpoint, http:// and https:// URLs are fetched as they are. A request
 * names a location and optionally a byte range, so that readers of whole
 * images and of ranges inside larger objects share one client.
 */
#ifndef DSRT_DATASTORE_REMOTE_H
#define DSRT_DATASTORE_REMOTE_H

#include "datastore/internal.h"

#include <stdint.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Locations

/* 1 for "s3://", "http://" and "https://" (any case). */
int dsrt__is_url(const char *path);

// ----------------------------------------------------------------------------
// S3 configuration, from the environment and the AWS files

typedef enum { DSRT_S3_ADDR_AUTO = 0, DSRT_S3_ADDR_PATH, DSRT_S3_ADDR_VIRTUAL } dsrt_s3_addressing;

/* What signing keeps from one request to the next (datastore/s3.c). */
typedef struct dsrt_s3_signer dsrt_s3_signer;
void dsrt__s3_signer_free(dsrt_s3_signer *s);

typedef struct {
    char key[128], secret[128];
    char *token; /* session token, or NULL */
    char region[64];
    char scheme[8]; /* "https" or "http" */
    char host[256]; /* endpoint host[:port] */
    char base[256]; /* endpoint path prefix ("" or "/path"), no trailing '/' */
    int custom;     /* an endpoint was configured (not AWS's) */
    int anonymous;  /* no signature */
    dsrt_s3_addressing addressing;
    char source[96];        /* where the credentials came from, for messages (never the keys) */
    dsrt_s3_signer *signer; /* made at the first signature, freed with the rest */
} dsrt_s3_config;

/* Reads the configuration: credentials from AWS_ACCESS_KEY_ID /
 * AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else the profile (AWS_PROFILE,
 * else "default") of AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials;
 * region from AWS_REGION, AWS_DEFAULT_REGION or the profile of
 * AWS_CONFIG_FILE or ~/.aws/config (else us-east-1); endpoint from
 * AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or the profile's endpoint_url (else
 * AWS's); addressing from DSRT_S3_ADDRESSING or the profile's
 * s3.addressing_style. No credentials anywhere, or AWS_NO_SIGN_REQUEST set,
 * means anonymous requests. Fails only on a malformed setting. */
int dsrt__s3_config_load(dsrt_s3_config *c);

/* Looks up key in section `section` of the NUL-terminated text of an AWS
 * INI file (sub is a nested sub-section such as "s3", or NULL). Returns 1
 * and the value in out (cap bytes), 0 when absent; *found_section (if not
 * NULL) is set to 1 when the section exists. */
int dsrt__aws_ini_get(const char *text, const char *section, const char *sub, const char *key,
                      char *out, size_t cap, int *found_section);
void dsrt__s3_config_free(dsrt_s3_config *c);

/* "s3://bucket/key" -> bucket and key (key may be empty). The pointers
 * point into url; *bucket_len is the bucket's length. */
int dsrt__s3_split(const char *url, const char **bucket, size_t *bucket_len, const char **key);

/* Appends s percent-encoded as S3 wants it (unreserved bytes kept, and '/'
 * kept when keep_slash). Returns 0 or -ENOMEM. */
typedef struct {
    char *s;
    size_t len, cap;
} dsrt_strbuf;
int dsrt__sb_add(dsrt_strbuf *b, const char *s, size_t n);
int dsrt__sb_printf(dsrt_strbuf *b, const char *fmt, ...) DSRT_PRINTF(2, 3);
int dsrt__sb_encode(dsrt_strbuf *b, const char *s, size_t n, int keep_slash);

/*
 * The HTTP request for a GET of s3://bucket/key?query (query canonical:
 * sorted, encoded; may be ""), with byte range "bytes=a-b" or NULL: the URL
 * into *url and the headers (host is curl's; x-amz-date,
 * x-amz-content-sha256, x-amz-security-token, Authorization) appended to
 * *headers as "Name: value" lines separated by '\n'. now is the signing time.
 */
int dsrt__s3_request(dsrt_s3_config *c, const char *s3url, const char *query, const char *range,
                     time_t now, dsrt_strbuf *url, dsrt_strbuf *headers);

/* The signature of a canonical request, for the test vectors: fills
 * sig[65] (hex). */
int dsrt__s3_sign(const char *secret, const char *region, const char *date8, const char *amz_date,
                  const char *canonical_request, char sig[65]);

/* The message for a failed answer of the store (status, XML error body,
 * x-amz-bucket-region header or ""), for location display. Sets the
 * thread's error and returns the code: -ENOENT for a missing object (a bad
 * file), DSRT_EREMOTE for everything that is the store's or the set-up's. */
int dsrt__s3_http_error(const char *display, long status, const char *body, size_t body_len,
                        const char *bucket_region, const dsrt_s3_config *c, int is_s3);

/* What a listing page holds: each key (is_prefix 0, with its object's
 * size) or sub-prefix (1, size 0), decoded, s[0..n) NUL-terminated. A
 * non-zero return stops the page with that code. */
typedef int (*dsrt_list_entry_fn)(void *ud, const char *s, size_t n, int is_prefix, uint64_t size);

/* Reads one ListObjectsV2 page: each <Contents><Key> and each
 * <CommonPrefixes><Prefix>, decoded (XML entities, and %XX and '+' where
 * the page says EncodingType url), to on_entry; *token gets the next page's
 * continuation token, "" on the last page. scratch is reused between calls
 * (free its s at the end). DSRT_EREMOTE for a truncated page without a
 * token. */
int dsrt__s3_list_page(const char *body, size_t len, dsrt_strbuf *scratch, dsrt_strbuf *token,
                       dsrt_list_entry_fn on_entry, void *ud);

/* Whether an answer refuses the session token (ExpiredToken,
 * TokenRefreshRequired, InvalidToken): worth reading the credentials
 * again. */
int dsrt__s3_token_expired(long status, const char *body, size_t body_len);

/* Whether an HTTP answer is worth trying again (throttling, server errors,
 * the store's RequestTimeout). */
int dsrt__http_status_transient(long status, const char *body, size_t body_len);

// ----------------------------------------------------------------------------
// The client

/* Refuses remote options out of range (DSRT_EOPTION, the message naming
 * who and the field), so that a pipeline refuses them before any thread. */
int dsrt__remote_options_check(const dsrt_remote_options *o, const char *who);

typedef struct dsrt_http dsrt_http;

/* A client for one thread: a curl multi handle with o->depth requests in
 * flight at most. */
int dsrt__http_create(dsrt_http **h, const dsrt_remote_options *o);
void dsrt__http_destroy(dsrt_http *h);

/* Queues a GET of url's bytes [offset, offset + length) (length 0: all)
 * into buf[0..cap). url and buf stay valid until the result is collected.
 * -EBUSY when depth requests are in flight. */
int dsrt__http_submit(dsrt_http *h, const char *url, uint64_t offset, uint64_t length, void *buf,
                      size_t cap, uint64_t tag);

/* One finished request, as dsrt_reader_collect. With wait, blocks until one
 * is done or extra_fd (>= 0) is readable (then returns 0). */
int dsrt__http_collect(dsrt_http *h, dsrt_read_result *res, int wait, int extra_fd);

unsigned dsrt__http_in_flight(const dsrt_http *h);
/* Drops every request in flight or finished and not collected. */
void dsrt__http_cancel(dsrt_http *h);
void dsrt__http_stats(const dsrt_http *h, dsrt_remote_stats *s);

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

/* The client's S3 configuration. */
const dsrt_s3_config *dsrt__http_s3(const dsrt_http *h);

// ----------------------------------------------------------------------------
// Sources in a store

/* One object of a listing: its key (decoded, from the bucket's root) and
 * size. A non-zero return stops the listing with that code. */
typedef int (*dsrt_s3_each_fn)(void *ctx, const char *key, size_t len, uint64_t size);

/* Lists every object whose key starts with prefix[0..plen) in the bucket
 * (ListObjectsV2, page after page, with h), calling each for each; display
 * names the place in messages. */
int dsrt__s3_list(dsrt_http *h, const char *bucket, size_t blen, const char *prefix, size_t plen,
                  const char *display, dsrt_s3_each_fn each, void *ctx);

/* A folder at s3://bucket/prefix: lists the keys and indexes them as
 * dsrt__folder_load indexes a folder's files. */
int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);

/* A manifest at a URL: fetched whole, relative paths taken relative to it. */
int dsrt__remote_manifest_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o);

/* A whole object into a new buffer, with a client of its own (the simple
 * read of dsrt_datastore_read_image). */
int dsrt__remote_read_whole(const char *url, size_t max, uint8_t **out, size_t *len);

#endif
