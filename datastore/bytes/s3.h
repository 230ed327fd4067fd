/*
 * What dsrt knows of S3: the configuration the AWS tools read (s3.c),
 * addressing and AWS Signature Version 4 (sigv4.c), the store's error
 * answers (s3.c), and listings (s3_list.c: ListObjectsV2 pages, a prefix
 * listed whole or as a tree of concurrent listings).
 */
#ifndef DSRT_DATASTORE_BYTES_S3_H
#define DSRT_DATASTORE_BYTES_S3_H

#include "datastore/bytes/url.h"

#include <stdint.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Configuration, from the environment and the AWS files (s3.c)

typedef enum { DSRT_S3_ADDR_AUTO = 0, DSRT_S3_ADDR_PATH, DSRT_S3_ADDR_VIRTUAL } dsrt_s3_addressing;

/* What signing keeps from one request to the next (sigv4.c). */
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

/* "scheme://host/base" of an endpoint, NUL included. */
#define DSRT_S3_ENDPOINT_MAX                                                                       \
    (sizeof((dsrt_s3_config *)0)->scheme + sizeof((dsrt_s3_config *)0)->host +                     \
     sizeof((dsrt_s3_config *)0)->base + 4)

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
void dsrt__s3_config_free(dsrt_s3_config *c);

/* Looks up key in section `section` of the NUL-terminated text of an AWS
 * INI file (sub is a nested sub-section such as "s3", or NULL). Returns 1
 * and the value in out (cap bytes), 0 when absent; *found_section (if not
 * NULL) is set to 1 when the section exists. */
int dsrt__aws_ini_get(const char *text, const char *section, const char *sub, const char *key,
                      char *out, size_t cap, int *found_section);

// ----------------------------------------------------------------------------
// Requests (sigv4.c)

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

// ----------------------------------------------------------------------------
// Answers (s3.c)

/* The message for a failed answer of the store (status, XML error body,
 * x-amz-bucket-region header or ""), for location display. Sets the
 * thread's error and returns the code: -ENOENT for a missing object (a bad
 * file), DSRT_EREMOTE for everything that is the store's or the set-up's. */
int dsrt__s3_http_error(const char *display, long status, const char *body, size_t body_len,
                        const char *bucket_region, const dsrt_s3_config *c, int is_s3);

/* Whether an answer refuses the session token (ExpiredToken,
 * TokenRefreshRequired, InvalidToken): worth reading the credentials
 * again. */
int dsrt__s3_token_expired(long status, const char *body, size_t body_len);

/* Whether an HTTP answer is worth trying again (throttling, server errors,
 * the store's RequestTimeout). */
int dsrt__http_status_transient(long status, const char *body, size_t body_len);

/* The few XML of S3's answers: character references and the five entities
 * of text[0..n) decoded into out (which may be text: never longer); the
 * text of the first <tag>...</tag> in [p, end), or NULL; its unescaped
 * text into out (cap bytes), "" when absent. */
size_t dsrt__xml_unescape(const char *text, size_t n, char *out);
const char *dsrt__xml_find(const char *p, const char *end, const char *tag, size_t *len);
void dsrt__xml_text(const char *body, size_t n, const char *tag, char *out, size_t cap);

// ----------------------------------------------------------------------------
// Listings (s3_list.c)

/* What a listing page holds: each key (is_prefix 0, with its object's
 * size and version: dsrt__cache_version of its ETag and size, 0 without an
 * ETag) or sub-prefix (1, size and version 0), decoded, s[0..n)
 * NUL-terminated. A non-zero return stops the page with that code. */
typedef int (*dsrt_list_entry_fn)(void *ud, const char *s, size_t n, int is_prefix, uint64_t size,
                                  uint64_t version);

/* Reads one ListObjectsV2 page: each <Contents><Key> and each
 * <CommonPrefixes><Prefix>, decoded (XML entities, and %XX and '+' where
 * the page says EncodingType url), to on_entry; *token gets the next page's
 * continuation token, "" on the last page. scratch is reused between calls
 * (free its s at the end). DSRT_EREMOTE for a truncated page without a
 * token. */
int dsrt__s3_list_page(const char *body, size_t len, dsrt_strbuf *scratch, dsrt_strbuf *token,
                       dsrt_list_entry_fn on_entry, void *ud);

typedef struct dsrt_http dsrt_http;

/* One object of a listing: its key (decoded, from the bucket's root),
 * size and version (as dsrt_list_entry_fn's). A non-zero return stops the
 * listing with that code. */
typedef int (*dsrt_s3_each_fn)(void *ctx, const char *key, size_t len, uint64_t size,
                               uint64_t version);

/* Lists every object whose key starts with prefix[0..plen) in the bucket
 * (ListObjectsV2, page after page, with h), calling each for each; display
 * names the place in messages. */
int dsrt__s3_list(dsrt_http *h, const char *bucket, size_t blen, const char *prefix, size_t plen,
                  const char *display, dsrt_s3_each_fn each, void *ctx);

/*
 * Lists every object under the folder prefix[0..plen) ("" or ending in
 * '/'), many listings at once: the prefix first with delimiter '/', which
 * names its sub-folders, then (with sub set) each sub-folder whole as a
 * listing of its own, at most depth of them in flight on h, each following
 * its own continuation tokens. Calls each for every key (keys come in no
 * particular order). display names the place in messages.
 */
int dsrt__s3_list_tree(dsrt_http *h, unsigned depth, const char *bucket, size_t blen,
                       const char *prefix, size_t plen, int sub, const char *display,
                       dsrt_s3_each_fn each, void *ctx);

#endif
