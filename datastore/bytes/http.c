/*
 * The HTTP client of the datastore: GETs of objects (s3://, http://,
 * https://), whole or by byte range, many in flight at once on one thread.
 *
 * A client belongs to one thread and drives one libcurl multi handle: the
 * caller submits requests (up to depth of them), then collects them as they
 * finish, exactly as it does local reads (dsrt_reader hands URLs here), so a
 * pipeline worker keeps depth requests in flight while it decodes what has
 * arrived. Each request slot keeps its curl easy handle from one request to
 * the next, and the multi handle keeps the connections alive, so after the
 * first requests a GET costs no connection set-up; a shared handle keeps
 * DNS answers and TLS sessions for new connections. Connections to one host
 * are capped (max_connections; requests beyond wait in curl).
 *
 * Faults. An answer of 429, 500, 502, 503, 504 (or S3's SlowDown,
 * InternalError, RequestTimeout), a refused or reset connection, a
 * connection that receives nothing for timeout_s, an attempt not done
 * timeout_s after it started (a server that drips), is not the object's
 * fault: the request is tried again after a pause that doubles from 100 ms
 * up to 5 s, each drawn between half and all of that (jitter, so that many
 * clients throttled together do not come back together). A request still
 * failing retry_deadline_s after its first failure finishes with
 * DSRT_EREMOTE and the last cause. Expired temporary credentials
 * (ExpiredToken) are read again from where they came from, and the request
 * signed again at once when they changed, else retried like a throttled one
 * (reading them again at each refusal). Other answers finish at once: 404 with
 * -ENOENT (a missing object is a bad sample, like a missing file), denials,
 * wrong regions and missing buckets with DSRT_EREMOTE and what to check
 * (datastore/bytes/s3.c says it), an empty object with DSRT_EEMPTY, one larger
 * than its buffer with DSRT_ETOOBIG and its size. Messages name the
 * location without credentials: keys are only ever in the signature, and
 * every message is redacted (dsrt_text_redact: a URL's password, a
 * pre-signed URL's signature).
 *
 * A ranged GET takes its range and stops, whatever the server goes on
 * sending (one that ignores the Range and sends the whole object, or never
 * ends). An s3:// path goes out exactly as it was signed (no removal of dot
 * segments: "a/../b" is a key like any). A client made to open a datastore
 * asks its caller now and then whether to stop (interrupted), so that a
 * listing that waits on a store can be interrupted.
 */
#include "datastore/bytes/http.h"
#include "datastore/bytes/cache.h"

#include <assert.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HTTP_MAX_DEPTH     4096
#define HTTP_MAX_SECONDS   86400         /* longest deadline or timeout accepted */
#define HTTP_BACKOFF_NS    100000000ULL  /* first pause before a retry */
#define HTTP_BACKOFF_MAX   5000000000ULL /* longest pause */
#define HTTP_ERR_BODY      2048          /* bytes of an error answer kept */
#define HTTP_MSG           768
#define HTTP_RECV_BUFFER   (64L << 10) /* curl's receive buffer, per request slot */
#define HTTP_POLL_MAX_MS   1000
#define HTTP_POLL_ASK_MS   100 /* longest wait between two questions to interrupted */
#define HTTP_DEFAULT_CONNS "DSRT_S3_MAX_CONNECTIONS"
#define HTTP_ETAG          96
#define HTTP_CACHE_SPAN    16         /* blocks one ranged request may span through the cache */
#define HTTP_CACHE_POLL_NS 2000000ULL /* waiting for another's fill: a look this often */

enum { REQ_FREE = 0, REQ_ACTIVE, REQ_WAITING, REQ_DONE };

typedef struct {
    CURL *easy;
    struct curl_slist *hdrs;
    dsrt_strbuf url, headers; /* this attempt's */
    const char *loc;          /* as submitted */
    const char *query;        /* fetch: canonical query for s3:// */
    uint64_t offset, length;
    uint8_t *buf;
    size_t cap, got;
    size_t max; /* own: the largest buffer allowed */
    int own;    /* buf is ours and grows (fetch) */
    int is_s3;
    uint64_t tag;
    int state, status;
    long http;            /* status of the answer being received */
    int sized;            /* the answer's length was looked at */
    int toobig;           /* stopped: larger than the buffer */
    int enough;           /* stopped: the range asked is in (the server sent more) */
    uint64_t object_size; /* the whole object's, as the answer says it; UINT64_MAX: unknown */
    uint64_t skip;        /* bytes of a 200 answer to a ranged GET still to skip */
    uint64_t total;
    char err[HTTP_ERR_BODY];
    size_t err_len;
    char bucket_region[64];
    char curl_err[CURL_ERROR_SIZE];
    unsigned attempts;
    unsigned s3_gen; /* the credentials this attempt was signed with */
    int token;       /* the last answer refused the session token */
    uint64_t first_fail, retry_at;
    char cause[HTTP_MSG]; /* why the last attempt failed */
    char msg[HTTP_MSG];   /* the result's message */
    char etag[HTTP_ETAG]; /* of the answer being received */

    /* Through the cache: a whole object (CACHE_WHOLE), or the blocks
     * [k0, k0 + nblk) of a ranged request fetched whole into span, the
     * caller's range (ubuf, uoff, ulen) copied out of them at the end. */
    int cache;
    uint64_t version; /* the object's, as its listing gave it; 0: not known */
    uint8_t *ubuf;
    size_t ucap;
    uint64_t uoff, ulen;
    uint8_t *span; /* (span_cap) kept from one request to the next */
    size_t span_cap;
    uint64_t k0;
    unsigned nblk;
    int locks[HTTP_CACHE_SPAN]; /* fill locks: dsrt__cache_lock's 0 where held, -1 where not */
    uint64_t wait_since;        /* waiting for another's fill since; 0: not waiting */
} http_req;

enum { CACHE_NONE = 0, CACHE_WHOLE, CACHE_SPAN };

static void cache_release(dsrt_http *h, http_req *q);

struct dsrt_http {
    CURLM *multi;
    CURLSH *share;
    int global;
    dsrt_remote_options o;
    dsrt_s3_config s3;
    int s3_state;    /* 0 not loaded, 1 loaded, < 0 the load's code */
    unsigned s3_gen; /* credentials read again after they expired */
    char s3_msg[HTTP_MSG];
    http_req *reqs;       /* (depth) */
    uint32_t *free_slots; /* (depth) */
    uint32_t *done;       /* (depth) FIFO of finished slots */
    unsigned depth, free_top, done_head, done_len;
    unsigned in_flight; /* submitted and not collected */
    dsrt_rng rng;
    int (*interrupted)(void *ctx); /* asked while waiting; non-zero stops with -EINTR */
    void *interrupted_ctx;
    uint64_t delivered_size; /* object_size of the last result handed over */
    char delivered_etag[HTTP_ETAG];
    dsrt_cache *cache; /* o.cache_dir's, or NULL */
    uint64_t requests, retries, bytes, connections;
    uint64_t last_ns, busy_ns;
    double in_flight_ns;
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Adds the time since the last change, weighted by the requests in flight. */
static void account(dsrt_http *h) {
    uint64_t t = now_ns();
    if (h->in_flight > 0 && h->last_ns) {
        h->busy_ns += t - h->last_ns;
        h->in_flight_ns += (double)h->in_flight * (double)(t - h->last_ns);
    }
    h->last_ns = t;
}

// ----------------------------------------------------------------------------
// Callbacks

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    http_req *q = ud;
    size_t len = size * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* A new answer (after a redirect or a 100 Continue): forget the last. */
        q->http = 0;
        q->err_len = 0;
        q->sized = 0;
        q->object_size = UINT64_MAX;
        q->bucket_region[0] = '\0';
        q->etag[0] = '\0';
        return len;
    }
    /* The object's size: "Content-Range: bytes a-b/SIZE" of a partial
     * answer, else the Content-Length of a whole one (curl has read it
     * before the body, so it is looked at once the body starts). */
    static const char range[] = "content-range:";
    if (len > sizeof range && strncasecmp(p, range, sizeof range - 1) == 0) {
        const char *slash = memchr(p, '/', len);
        uint64_t v = 0;
        size_t i = slash ? (size_t)(slash - p) + 1 : len, digits = 0;
        for (; i < len && p[i] >= '0' && p[i] <= '9' && digits < 19; i++, digits++)
            v = v * 10 + (uint64_t)(p[i] - '0');
        if (digits) q->object_size = v;
    }
    static const char etag[] = "etag:";
    if (len > sizeof etag && strncasecmp(p, etag, sizeof etag - 1) == 0) {
        const char *v = p + sizeof etag - 1;
        size_t vn = len - (sizeof etag - 1);
        while (vn && (*v == ' ' || *v == '\t')) v++, vn--;
        while (vn && (v[vn - 1] == '\r' || v[vn - 1] == '\n' || v[vn - 1] == ' ')) vn--;
        snprintf(q->etag, sizeof q->etag, "%.*s", (int)DSRT_MIN(vn, sizeof q->etag - 1), v);
    }
    static const char region[] = "x-amz-bucket-region:";
    if (len > sizeof region && strncasecmp(p, region, sizeof region - 1) == 0) {
        const char *v = p + sizeof region - 1;
        size_t vn = len - (sizeof region - 1);
        while (vn && (*v == ' ' || *v == '\t')) v++, vn--;
        while (vn && (v[vn - 1] == '\r' || v[vn - 1] == '\n' || v[vn - 1] == ' ')) vn--;
        snprintf(q->bucket_region, sizeof q->bucket_region, "%.*s", (int)DSRT_MIN(vn, (size_t)63),
                 v);
    }
    return len;
}

/* Makes an owned buffer hold need bytes (and a NUL). */
static int own_fit(http_req *q, size_t need) {
    if (need + 1 <= q->cap) return 0;
    size_t cap = q->cap ? q->cap : 4096;
    while (cap < need + 1) cap *= 2;
    uint8_t *b = realloc(q->buf, cap);
    if (!b) return -ENOMEM;
    q->buf = b;
    q->cap = cap;
    return 0;
}

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    http_req *q = ud;
    size_t len = size * n;
    if (q->http == 0) curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->http);
    if (q->http < 200 || q->http >= 300) {
        size_t keep = DSRT_MIN(len, sizeof q->err - 1 - q->err_len);
        memcpy(q->err + q->err_len, p, keep);
        q->err_len += keep;
        q->err[q->err_len] = '\0';
        return len;
    }
    if (!q->sized) {
        q->sized = 1;
        /* A server that ignored the Range sends the whole object. */
        q->skip = q->http == 200 ? q->offset : 0;
        curl_off_t cl = -1;
        curl_easy_getinfo(q->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
        if (q->http == 200 && cl >= 0) q->object_size = (uint64_t)cl;
        if (cl >= 0) {
            uint64_t body = (uint64_t)cl > q->skip ? (uint64_t)cl - q->skip : 0;
            if (q->length && body > q->length) body = q->length;
            if (!q->total) q->total = body;
            if ((!q->own && body > q->cap) || (q->own && body > q->max)) {
                q->total = body;
                q->toobig = 1;
                return 0;
            }
            if (q->own && own_fit(q, (size_t)body) != 0) return 0;
        }
    }
    if (q->skip) {
        size_t s = (size_t)DSRT_MIN((uint64_t)len, q->skip);
        q->skip -= s;
        p += s;
        len -= s;
    }
    /* Past the range asked (a server that ignored the Range, or one that
     * never ends): stop once the range is in rather than read the rest. */
    int past = q->length && q->got + len > q->length;
    if (past) len = (size_t)(q->length - q->got);
    if (len > 0 && q->got + len > (q->own ? q->max : q->cap)) {
        q->total = DSRT_MAX(q->total, (uint64_t)(q->got + len));
        q->toobig = 1;
        return 0;
    }
    if (len > 0 && q->own && own_fit(q, q->got + len) != 0) return 0;
    if (len > 0) memcpy(q->buf + q->got, p, len);
    q->got += len;
    if (past) {
        q->enough = 1;
        return 0;
    }
    return size * n;
}

// ----------------------------------------------------------------------------
// Create and destroy

dsrt_remote_options dsrt__remote_defaults(void) {
    return (dsrt_remote_options){
        .depth = 64, .max_connections = 0, .retry_deadline_s = 60, .timeout_s = 30};
}

int dsrt__remote_options_check(const dsrt_remote_options *o, const char *who) {
    if (o->depth < 1 || o->depth > HTTP_MAX_DEPTH)
        return dsrt__fail(DSRT_EOPTION, "%s: remote.depth: %u: not in [1, %d]", who, o->depth,
                          HTTP_MAX_DEPTH);
    if (o->max_connections > HTTP_MAX_DEPTH)
        return dsrt__fail(DSRT_EOPTION, "%s: remote.max_connections: %u: not in [0, %d]", who,
                          o->max_connections, HTTP_MAX_DEPTH);
    if (!(o->retry_deadline_s >= 0 && o->retry_deadline_s <= HTTP_MAX_SECONDS))
        return dsrt__fail(DSRT_EOPTION, "%s: remote.retry_deadline_s: %g: not in [0, %d]", who,
                          o->retry_deadline_s, HTTP_MAX_SECONDS);
    if (!(o->timeout_s > 0 && o->timeout_s <= HTTP_MAX_SECONDS))
        return dsrt__fail(DSRT_EOPTION, "%s: remote.timeout_s: %g: not in (0, %d]", who,
                          o->timeout_s, HTTP_MAX_SECONDS);
    return dsrt__cache_check(o->cache_dir, o->cache_limit, who);
}

int dsrt__http_create(dsrt_http **out, const dsrt_remote_options *o) {
    *out = NULL;
    dsrt_remote_options opt = o ? *o : dsrt__remote_defaults();
    int rc = dsrt__remote_options_check(&opt, "remote");
    if (rc != 0) return rc;
    if (opt.max_connections == 0) {
        const char *e = getenv(HTTP_DEFAULT_CONNS);
        if (e && *e) {
            char *end;
            unsigned long v = strtoul(e, &end, 10);
            if (*end || v < 1 || v > HTTP_MAX_DEPTH)
                return dsrt__fail(DSRT_EOPTION, "remote: %s=%s: not a number in 1..%d",
                                  HTTP_DEFAULT_CONNS, e, HTTP_MAX_DEPTH);
            opt.max_connections = (unsigned)v;
        } else {
            opt.max_connections = opt.depth;
        }
    }
    rc = -ENOMEM;
    dsrt_http *h = dsrt__calloc(1, sizeof *h);
    if (!h) return rc;
    h->o = opt;
    h->depth = opt.depth;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        rc = dsrt__fail(DSRT_EREMOTE, "remote: curl_global_init failed");
        goto fail;
    }
    h->global = 1;
    h->reqs = dsrt__calloc(h->depth, sizeof *h->reqs);
    h->free_slots = dsrt__calloc(h->depth, sizeof *h->free_slots);
    h->done = dsrt__calloc(h->depth, sizeof *h->done);
    if (!h->reqs || !h->free_slots || !h->done) goto fail;
    if (!(h->multi = curl_multi_init()) || !(h->share = curl_share_init())) {
        rc = dsrt__fail(-ENOMEM, "remote: curl_multi_init failed");
        goto fail;
    }
    CURLMcode mc =
        curl_multi_setopt(h->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)opt.max_connections);
    if (mc == CURLM_OK)
        mc = curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS,
                               (long)DSRT_MAX(opt.max_connections, opt.depth));
    if (mc != CURLM_OK) {
        rc = dsrt__fail(DSRT_EREMOTE, "remote: curl_multi_setopt: %s", curl_multi_strerror(mc));
        goto fail;
    }
    CURLSHcode sc = curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    if (sc == CURLSHE_OK)
        sc = curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    if (sc != CURLSHE_OK) {
        rc = dsrt__fail(DSRT_EREMOTE, "remote: curl_share_setopt: %s", curl_share_strerror(sc));
        goto fail;
    }
    for (unsigned i = 0; i < h->depth; i++) {
        h->free_slots[h->free_top++] = h->depth - 1 - i;
        for (unsigned k = 0; k < HTTP_CACHE_SPAN; k++) h->reqs[i].locks[k] = -1;
    }
    if (opt.cache_dir && *opt.cache_dir &&
        (rc = dsrt__cache_open(&h->cache, opt.cache_dir, opt.cache_limit)) != 0)
        goto fail;
    h->rng = dsrt_rng_init(now_ns(), (uint64_t)(uintptr_t)h, 0, 0x68747470);
    *out = h;
    return 0;
fail:
    dsrt__http_destroy(h);
    return rc;
}

static void req_clear(http_req *q) {
    curl_slist_free_all(q->hdrs);
    q->hdrs = NULL;
    q->url.len = 0;
    q->headers.len = 0;
}

void dsrt__http_destroy(dsrt_http *h) {
    if (!h) return;
    for (unsigned i = 0; h->reqs && i < h->depth; i++) {
        http_req *q = &h->reqs[i];
        if (q->easy) {
            if (q->state == REQ_ACTIVE) curl_multi_remove_handle(h->multi, q->easy);
            curl_easy_cleanup(q->easy);
        }
        req_clear(q);
        free(q->url.s);
        free(q->headers.s);
        if (q->own) free(q->buf);
        cache_release(h, q);
        free(q->span);
    }
    dsrt__cache_close(h->cache);
    if (h->multi) curl_multi_cleanup(h->multi);
    if (h->share) curl_share_cleanup(h->share);
    if (h->s3_state == 1) dsrt__s3_config_free(&h->s3);
    free(h->reqs);
    free(h->free_slots);
    free(h->done);
    if (h->global) curl_global_cleanup();
    free(h);
}

const dsrt_s3_config *dsrt__http_s3(const dsrt_http *h) {
    return h->s3_state == 1 ? &h->s3 : NULL;
}

/*
 * Temporary credentials expire (the store answers ExpiredToken): the
 * configuration is read again, from the environment and the AWS files as at
 * the start, where whatever renews them (an SSO login, a credential helper
 * writing ~/.aws/credentials, a program setting AWS_SESSION_TOKEN) has put
 * new ones. Returns 0 when q may be signed again at once: the credentials
 * changed since q's attempt was signed (by this reading or an earlier one).
 * Otherwise the request waits like a throttled one and asks again, reading
 * them again at each refusal, until the retry deadline: a renewal that comes
 * a little late loses nothing.
 */
static int s3_refresh(dsrt_http *h, http_req *q) {
    if (q->s3_gen != h->s3_gen) return 0; /* renewed since q was signed */
    dsrt_s3_config c;
    if (dsrt__s3_config_load(&c) != 0) {
        dsrt__clear_error();
        return -1;
    }
    int same = strcmp(c.key, h->s3.key) == 0 && strcmp(c.secret, h->s3.secret) == 0 &&
               strcmp(c.token ? c.token : "", h->s3.token ? h->s3.token : "") == 0;
    if (same || c.anonymous) {
        dsrt__s3_config_free(&c);
        return -1;
    }
    dsrt__s3_config_free(&h->s3);
    h->s3 = c;
    h->s3_gen++;
    return 0;
}

/* Loads the S3 configuration the first time an s3:// URL comes. */
static int s3_config(dsrt_http *h) {
    if (h->s3_state == 0) {
        int rc = dsrt__s3_config_load(&h->s3);
        h->s3_state = rc == 0 ? 1 : rc;
        if (rc != 0) snprintf(h->s3_msg, sizeof h->s3_msg, "%s", dsrt_last_error());
    }
    if (h->s3_state < 0) return dsrt__fail(h->s3_state, "%s", h->s3_msg);
    return 0;
}

// ----------------------------------------------------------------------------
// Attempts

/* The easy handle of slot q, made the first time. */
static int easy_init(dsrt_http *h, http_req *q) {
    if (q->easy) return 0;
    CURL *e = curl_easy_init();
    if (!e) return dsrt__fail(-ENOMEM, "remote: curl_easy_init failed");
    long timeout = (long)(h->o.timeout_s + 0.999);
    CURLcode c = CURLE_OK;
#define SET(opt, val)                                                                              \
    if (c == CURLE_OK) c = curl_easy_setopt(e, opt, val)
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_WRITEFUNCTION, on_data);
    SET(CURLOPT_WRITEDATA, q);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, q);
    SET(CURLOPT_PRIVATE, q);
    SET(CURLOPT_ERRORBUFFER, q->curl_err);
    SET(CURLOPT_CONNECTTIMEOUT_MS, (long)(h->o.timeout_s * 1000));
    SET(CURLOPT_LOW_SPEED_LIMIT, 1L);
    SET(CURLOPT_LOW_SPEED_TIME, timeout > 0 ? timeout : 1L);
    /* The whole attempt, first byte to last: a server that drips a byte now
     * and then passes the low-speed check for ever. */
    SET(CURLOPT_TIMEOUT_MS, (long)(h->o.timeout_s * 1000));
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_SHARE, h->share);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_MAXREDIRS, 5L);
    SET(CURLOPT_USERAGENT, "dsrt");
    /* An image in one read from the socket, rather than several of 16 KiB. */
    SET(CURLOPT_BUFFERSIZE, HTTP_RECV_BUFFER);
#undef SET
    if (c != CURLE_OK) {
        curl_easy_cleanup(e);
        return dsrt__fail(DSRT_EREMOTE, "remote: curl_easy_setopt: %s", curl_easy_strerror(c));
    }
    q->easy = e;
    return 0;
}

/* Builds this attempt's URL and headers and hands the request to curl. */
static int attempt_start(dsrt_http *h, http_req *q) {
    int rc;
    req_clear(q);
    char range[64] = "";
    if (q->offset || q->length) {
        if (q->length)
            snprintf(range, sizeof range, "bytes=%llu-%llu", (unsigned long long)q->offset,
                     (unsigned long long)(q->offset + q->length - 1));
        else
            snprintf(range, sizeof range, "bytes=%llu-", (unsigned long long)q->offset);
    }
    if (q->is_s3) {
        rc = dsrt__s3_request(&h->s3, q->loc, q->query, range[0] ? range : NULL, time(NULL),
                              &q->url, &q->headers);
        if (rc != 0) return rc;
        q->s3_gen = h->s3_gen;
    } else {
        if (dsrt__sb_add(&q->url, q->loc, strlen(q->loc)) != 0) return -ENOMEM;
        if (range[0] && dsrt__sb_printf(&q->headers, "Range: %s\n", range) != 0) return -ENOMEM;
    }
    /* curl wants one list entry a header; the buffer has them '\n'-separated. */
    for (char *line = q->headers.s; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        struct curl_slist *l = curl_slist_append(q->hdrs, line);
        if (!l) return -ENOMEM;
        q->hdrs = l;
        if (!nl) break;
        line = nl + 1;
    }
    /* No "Expect:" and no "Accept: *\/\*": nothing that is not signed. */
    struct curl_slist *l = curl_slist_append(q->hdrs, "Accept:");
    if (!l) return -ENOMEM;
    q->hdrs = l;
    q->http = 0;
    q->sized = 0;
    q->toobig = 0;
    q->enough = 0;
    q->object_size = UINT64_MAX;
    q->skip = 0;
    q->err_len = 0;
    q->got = 0;
    q->bucket_region[0] = '\0';
    q->etag[0] = '\0';
    q->curl_err[0] = '\0';
    q->attempts++;
    CURLcode c = curl_easy_setopt(q->easy, CURLOPT_URL, q->url.s);
    if (c == CURLE_OK) c = curl_easy_setopt(q->easy, CURLOPT_HTTPHEADER, q->hdrs);
    if (c == CURLE_OK) c = curl_easy_setopt(q->easy, CURLOPT_FOLLOWLOCATION, q->is_s3 ? 0L : 1L);
    /* A signed path goes out as it was signed: curl would otherwise remove
     * its dot segments ("a/../b"), and the key asked would be another. */
    if (c == CURLE_OK) c = curl_easy_setopt(q->easy, CURLOPT_PATH_AS_IS, q->is_s3 ? 1L : 0L);
    if (c != CURLE_OK)
        return dsrt__fail(DSRT_EREMOTE, "remote: curl_easy_setopt: %s", curl_easy_strerror(c));
    CURLMcode mc = curl_multi_add_handle(h->multi, q->easy);
    if (mc != CURLM_OK)
        return dsrt__fail(DSRT_EREMOTE, "remote: curl_multi_add_handle: %s",
                          curl_multi_strerror(mc));
    q->state = REQ_ACTIVE;
    return 0;
}

static void finish(dsrt_http *h, http_req *q, int status) {
    cache_release(h, q);
    q->status = status;
    q->state = REQ_DONE;
    h->done[(h->done_head + h->done_len) % h->depth] = (uint32_t)(q - h->reqs);
    h->done_len++;
}

/* Ends q with the thread's current message. */
static void finish_msg(dsrt_http *h, http_req *q, int status) {
    snprintf(q->msg, sizeof q->msg, "%s", dsrt_last_error());
    finish(h, q, status);
}

/* What a request of q was sent to, for messages: for s3:// the endpoint
 * and where the credentials came from (or that none were found and the
 * requests went unsigned); "" for other URLs, whose message shows them. */
static void tried(const dsrt_http *h, const http_req *q, char *out, size_t cap) {
    out[0] = '\0';
    if (!q->is_s3 || h->s3_state != 1) return;
    const dsrt_s3_config *c = &h->s3;
    snprintf(out, cap, " (tried %s://%s%s%s; credentials: %s)", c->scheme, c->host, c->base,
             c->custom ? "" : ", AWS's (AWS_ENDPOINT_URL names another store)",
             c->anonymous ? "none found, requests unsigned (AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, give them)"
                          : c->source);
}

/* A failure that is not the object's: try again after a jittered pause, or
 * give up at the deadline. */
static void retry_or_fail(dsrt_http *h, http_req *q, const char *display) {
    uint64_t t = now_ns();
    if (q->first_fail == 0) q->first_fail = t;
    uint64_t deadline = q->first_fail + (uint64_t)(h->o.retry_deadline_s * 1e9);
    if (t >= deadline) {
        char where[1024];
        tried(h, q, where, sizeof where);
        dsrt__fail(DSRT_EREMOTE,
                   "%s: the store %s after %u attempts over %.1f s (retry deadline %g s)%s; the "
                   "last: %s",
                   display, q->token ? "still refused the session token" : "did not answer",
                   q->attempts, (double)(t - q->first_fail) * 1e-9, h->o.retry_deadline_s, where,
                   q->cause);
        finish_msg(h, q, DSRT_EREMOTE);
        return;
    }
    unsigned k = DSRT_MIN(q->attempts - 1, 30u);
    uint64_t pause = DSRT_MIN(HTTP_BACKOFF_NS << k, HTTP_BACKOFF_MAX);
    pause = (uint64_t)((double)pause * (0.5 + 0.5 * dsrt_rng_uniform(&h->rng)));
    q->retry_at = DSRT_MIN(t + pause, deadline);
    q->state = REQ_WAITING;
    h->retries++;
}

// ----------------------------------------------------------------------------
// Through the cache

/* The name of q's entry, or of its span's block i. */
static uint64_t cache_key_of(const http_req *q, unsigned i) {
    return dsrt__cache_key(q->loc, q->version,
                           q->cache == CACHE_WHOLE ? DSRT_CACHE_WHOLE : q->k0 + i);
}

/* Drops q's fill locks and gives it back its caller's range: q is a plain
 * request again (its result's size 0 unless the caller sets it after). */
static void cache_release(dsrt_http *h, http_req *q) {
    if (q->cache == CACHE_NONE) return;
    for (unsigned i = 0; i < HTTP_CACHE_SPAN; i++)
        if (q->locks[i] >= 0) {
            dsrt__cache_unlock(h->cache, cache_key_of(q, i), q->locks[i]);
            q->locks[i] = -1;
        }
    if (q->cache == CACHE_SPAN) {
        q->buf = q->ubuf;
        q->cap = q->ucap;
        q->offset = q->uoff;
        q->length = q->ulen;
        q->got = 0;
    }
    q->cache = CACHE_NONE;
    q->wait_since = 0;
}

/* Whether q should wait for another's fill (1: it does, REQ_WAITING): not
 * longer than a request's timeout, after which it fetches on its own. */
static int cache_wait(dsrt_http *h, http_req *q) {
    uint64_t t = now_ns();
    if (!q->wait_since) q->wait_since = t;
    if (t - q->wait_since > (uint64_t)(h->o.timeout_s * 1e9)) return 0;
    q->state = REQ_WAITING;
    q->retry_at = t + HTTP_CACHE_POLL_NS;
    return 1;
}

/* q's whole object from the cache: 1 when it was there (q finished), 0
 * when not, or a negative code. */
static int whole_lookup(dsrt_http *h, http_req *q, uint64_t key) {
    size_t got;
    uint64_t size;
    int rc = dsrt__cache_read(h->cache, key, q->loc, 0, q->cap, q->buf, &got, &size);
    if (rc != 1) return rc;
    dsrt__cache_count(h->cache, 1, got);
    q->object_size = size;
    if (size > q->cap) {
        char display[512];
        dsrt_text_redact(q->loc, display, sizeof display);
        q->total = size;
        dsrt__fail(DSRT_ETOOBIG, "%s: %llu bytes, larger than the buffer of %zu bytes", display,
                   (unsigned long long)size, q->cap);
        finish_msg(h, q, DSRT_ETOOBIG);
        return 1;
    }
    q->got = got;
    q->msg[0] = '\0';
    finish(h, q, 0);
    return 1;
}

/* Hands q its caller's range, got bytes of which are in: short when the
 * object ends first. */
static void span_finish(dsrt_http *h, http_req *q, size_t got) {
    cache_release(h, q);
    q->got = got;
    if (got < q->length) {
        char display[512];
        dsrt_text_redact(q->loc, display, sizeof display);
        dsrt__fail(DSRT_ETRUNCATED, "%s: the object ends before the range (%zu of %llu bytes)",
                   display, got, (unsigned long long)q->length);
        finish_msg(h, q, DSRT_ETRUNCATED);
        return;
    }
    q->msg[0] = '\0';
    finish(h, q, 0);
}

/* Entry key's fill lock, unless another request of this client holds it:
 * the lock is a byte lock of the client's open file, which its own requests
 * share, so two of them asking for one object at once (a sample and, in the
 * same chunk, its place's replacement) would both fetch it. -EWOULDBLOCK
 * then, as for another process's fill. */
static int cache_lock(dsrt_http *h, const http_req *q, uint64_t key) {
    for (unsigned r = 0; r < h->depth; r++) {
        const http_req *o = &h->reqs[r];
        if (o == q || o->cache == CACHE_NONE) continue;
        for (unsigned i = 0; i < HTTP_CACHE_SPAN; i++)
            if (o->locks[i] >= 0 && cache_key_of(o, i) == key) return -EWOULDBLOCK;
    }
    return dsrt__cache_lock(h->cache, key);
}

/* Starts q through the cache: answered from its entries (finished), waiting
 * for another process's fill of them, or fetched (its fill locks held).
 * When the cache keeps nothing more this epoch, a miss is fetched as the
 * caller asked, with no lock taken: what the store sends goes straight to
 * the caller. */
static int cache_begin(dsrt_http *h, http_req *q) {
    if (q->cache == CACHE_WHOLE) {
        uint64_t key = cache_key_of(q, 0);
        int rc = whole_lookup(h, q, key);
        if (rc != 0) return rc < 0 ? rc : 0;
        int lk = dsrt__cache_full(h->cache) ? -ENOSPC : cache_lock(h, q, key);
        if (lk == -EWOULDBLOCK && cache_wait(h, q)) return 0;
        if (lk >= 0) {
            q->locks[0] = lk;
            /* Filled between the look and the lock. */
            if ((rc = whole_lookup(h, q, key)) != 0) return rc < 0 ? rc : 0;
        }
    } else {
        /* The range from the blocks there; the missing ones are fetched. */
        unsigned missing = 0, busy = 0, held = 0;
        uint8_t miss[HTTP_CACHE_SPAN] = {0};
        size_t got = 0;
        int ended = 0;
        for (unsigned i = 0; i < q->nblk && !ended; i++) {
            uint64_t bs = (q->k0 + i) * DSRT_CACHE_BLOCK;
            uint64_t a = DSRT_MAX(q->uoff, bs),
                     e = DSRT_MIN(q->uoff + q->ulen, bs + DSRT_CACHE_BLOCK);
            size_t n;
            uint64_t size;
            int rc = dsrt__cache_read(h->cache, cache_key_of(q, i), q->loc, a - bs, (size_t)(e - a),
                                      q->ubuf + (a - q->uoff), &n, &size);
            if (rc < 0) return rc;
            if (rc == 0) {
                miss[i] = 1;
                missing++;
                continue;
            }
            got += n;
            ended = n < e - a; /* the object's last block */
        }
        if (!missing) {
            dsrt__cache_count(h->cache, 1, got);
            span_finish(h, q, got);
            return 0;
        }
        if (dsrt__cache_full(h->cache)) {
            /* Only the caller's range, not whole blocks nothing would keep. */
            cache_release(h, q);
            dsrt__cache_count(h->cache, 0, 0);
            return attempt_start(h, q);
        }
        for (unsigned i = 0; i < q->nblk; i++) {
            if (!miss[i]) continue;
            int lk = cache_lock(h, q, cache_key_of(q, i));
            if (lk >= 0) q->locks[i] = lk, held++;
            busy += lk == -EWOULDBLOCK;
        }
        /* Every missing block being filled by another: wait for them. */
        if (!held && busy && cache_wait(h, q)) return 0;
        size_t need = (size_t)q->nblk * DSRT_CACHE_BLOCK;
        if (need > q->span_cap) {
            uint8_t *b = realloc(q->span, need);
            if (!b) return -ENOMEM;
            q->span = b;
            q->span_cap = need;
        }
        q->buf = q->span;
        q->cap = need;
        q->offset = q->k0 * DSRT_CACHE_BLOCK;
        q->length = need;
    }
    dsrt__cache_count(h->cache, 0, 0);
    q->wait_since = 0;
    return attempt_start(h, q);
}

/* The answer's version, as the listing would give it. */
static uint64_t answer_version(const http_req *q, uint64_t size) {
    return q->etag[0] ? dsrt__cache_version(q->etag, strlen(q->etag), size) : 0;
}

/* A whole object fetched: kept, unless it is not the version listed (it
 * changed since). */
static void whole_publish(dsrt_http *h, http_req *q) {
    if (q->locks[0] < 0 || (q->version && answer_version(q, q->got) != q->version)) return;
    dsrt_cache_entry e = {.url = q->loc,
                          .version = q->version,
                          .block = DSRT_CACHE_WHOLE,
                          .etag = q->etag,
                          .object_size = q->got};
    dsrt__cache_put(h->cache, cache_key_of(q, 0), &e, q->buf, q->got);
}

/* A span fetched (up to the object's end): its whole blocks kept, the
 * caller's range copied out. */
static void span_done(dsrt_http *h, http_req *q) {
    uint64_t osize = q->object_size;
    int whole = q->got == q->length || (osize != UINT64_MAX && q->offset + q->got == osize);
    if (whole && osize != UINT64_MAX && (!q->version || answer_version(q, osize) == q->version))
        for (unsigned i = 0; i < q->nblk; i++) {
            size_t bs = (size_t)i * DSRT_CACHE_BLOCK;
            if (bs >= q->got) break;
            size_t n = DSRT_MIN((size_t)DSRT_CACHE_BLOCK, q->got - bs);
            if (q->locks[i] < 0 || (n < DSRT_CACHE_BLOCK && q->offset + bs + n != osize)) continue;
            dsrt_cache_entry e = {.url = q->loc,
                                  .version = q->version,
                                  .block = q->k0 + i,
                                  .etag = q->etag,
                                  .object_size = osize};
            dsrt__cache_put(h->cache, cache_key_of(q, i), &e, q->span + bs, n);
        }
    size_t lead = (size_t)(q->uoff - q->offset);
    size_t got = q->got > lead ? (size_t)DSRT_MIN((uint64_t)(q->got - lead), q->ulen) : 0;
    memcpy(q->ubuf, q->span + lead, got);
    span_finish(h, q, got);
}

/* q's attempt was answered with a status that is not success: the
 * credentials signed again (an expired token), a retry (throttled, a
 * server error), or the store's error. */
static void answered_error(dsrt_http *h, http_req *q, const char *display) {
    q->token = q->is_s3 && dsrt__s3_token_expired(q->http, q->err, q->err_len);
    if (q->token && s3_refresh(h, q) == 0) {
        /* Signed again with the credentials found now. */
        h->retries++;
        int rc = attempt_start(h, q);
        if (rc != 0) {
            dsrt__fail_prefix(rc, "%s", display);
            finish_msg(h, q, rc);
        }
        return;
    }
    if (q->token || dsrt__http_status_transient(q->http, q->err, q->err_len)) {
        /* Keep the store's own words for the message at the deadline. */
        dsrt__s3_http_error(display, q->http, q->err, q->err_len, q->bucket_region,
                            dsrt__http_s3(h), q->is_s3);
        const char *m = dsrt_last_error();
        size_t dl = strlen(display);
        if (strncmp(m, display, dl) == 0 && m[dl] == ':') m += DSRT_MIN(dl + 2, strlen(m));
        snprintf(q->cause, sizeof q->cause, "%s", m);
        retry_or_fail(h, q, display);
        return;
    }
    h->requests++;
    int rc = dsrt__s3_http_error(display, q->http, q->err, q->err_len, q->bucket_region,
                                 dsrt__http_s3(h), q->is_s3);
    finish_msg(h, q, rc);
    return;
}

/* q's attempt failed before an answer (c: curl's result): not retried when
 * nothing of the store was ever reached by name or TLS, retried when the
 * connection failed or broke, else an error. */
static void transport_failed(dsrt_http *h, http_req *q, CURLcode c, const char *display) {
    /* A name that does not resolve, or a TLS handshake refused, before the
     * store ever answered: no retry heals that (a host that answered before
     * and stops resolving is a passing fault, retried below). */
    if ((c == CURLE_COULDNT_RESOLVE_HOST || c == CURLE_COULDNT_RESOLVE_PROXY ||
         c == CURLE_SSL_CONNECT_ERROR) &&
        h->requests == 0) {
        char where[1024];
        tried(h, q, where, sizeof where);
        dsrt__fail(DSRT_EREMOTE, "%s: %s%s%s%s; not retried: %s", display, curl_easy_strerror(c),
                   q->curl_err[0] ? ": " : "", q->curl_err, where,
                   c == CURLE_SSL_CONNECT_ERROR ? "the store refused the TLS handshake"
                                                : "the host name does not resolve");
        finish_msg(h, q, DSRT_EREMOTE);
        return;
    }
    switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_AGAIN:
        snprintf(q->cause, sizeof q->cause, "%s%s%s", curl_easy_strerror(c),
                 q->curl_err[0] ? ": " : "", q->curl_err);
        retry_or_fail(h, q, display);
        return;
    default:
        h->requests++;
        dsrt__fail(DSRT_EREMOTE, "%s: %s%s%s", display, curl_easy_strerror(c),
                   q->curl_err[0] ? ": " : "", q->curl_err);
        finish_msg(h, q, DSRT_EREMOTE);
        return;
    }
}

/* curl finished one attempt of q with result c. */
static void attempt_done(dsrt_http *h, http_req *q, CURLcode c) {
    long conns = 0;
    if (curl_easy_getinfo(q->easy, CURLINFO_NUM_CONNECTS, &conns) == CURLE_OK && conns > 0)
        h->connections += (uint64_t)conns;
    curl_multi_remove_handle(h->multi, q->easy);
    if (q->http == 0) curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->http);
    if (c == CURLE_WRITE_ERROR && q->enough) c = CURLE_OK; /* stopped with the range in */
    if (c == CURLE_OK && q->http >= 200 && q->http < 300 && q->got > 0 &&
        (!q->length || q->got == q->length)) {
        h->requests++;
        h->bytes += q->got;
        q->msg[0] = '\0';
        if (q->cache == CACHE_SPAN) {
            span_done(h, q);
            return;
        }
        if (q->cache == CACHE_WHOLE) whole_publish(h, q);
        finish(h, q, 0);
        return;
    }

    /* Something to say: the location as messages show it. */
    char display[512];
    dsrt_text_redact(q->loc, display, sizeof display);
    if (c == CURLE_WRITE_ERROR && q->toobig) {
        dsrt__fail(DSRT_ETOOBIG, "%s: %llu bytes, larger than the buffer of %zu bytes", display,
                   (unsigned long long)q->total, q->own ? q->max : q->cap);
        finish_msg(h, q, DSRT_ETOOBIG);
        return;
    }
    if (c == CURLE_WRITE_ERROR && q->own) {
        dsrt__fail(-ENOMEM, "%s: out of memory for the answer", display);
        finish_msg(h, q, -ENOMEM);
        return;
    }
    if (c == CURLE_OK && q->http >= 200 && q->http < 300) {
        h->requests++;
        h->bytes += q->got;
        if (q->cache == CACHE_SPAN) {
            span_done(h, q); /* the object ends inside the span */
            return;
        }
        if (q->got == 0 && !q->length) {
            dsrt__fail(DSRT_EEMPTY, "%s: empty object", display);
            finish_msg(h, q, DSRT_EEMPTY);
        } else if (q->length && q->got < q->length) {
            dsrt__fail(DSRT_ETRUNCATED, "%s: the object ends before the range (%zu of %llu bytes)",
                       display, q->got, (unsigned long long)q->length);
            finish_msg(h, q, DSRT_ETRUNCATED);
        } else {
            q->msg[0] = '\0';
            finish(h, q, 0);
        }
        return;
    }
    if (c == CURLE_OK) {
        answered_error(h, q, display);
        return;
    }
    transport_failed(h, q, c, display);
}

// ----------------------------------------------------------------------------
// Submit and collect

static int submit(dsrt_http *h, const char *url, const char *query, uint64_t offset,
                  uint64_t length, void *buf, size_t cap, int own, uint64_t tag, uint64_t version) {
    if (h->free_top == 0)
        return dsrt__fail(-EBUSY, "read: %s: %u requests already in flight", url, h->depth);
    int is_s3 = strncasecmp(url, "s3://", 5) == 0;
    int rc;
    if (is_s3 && (rc = s3_config(h)) != 0) return rc;
    http_req *q = &h->reqs[h->free_slots[h->free_top - 1]];
    if ((rc = easy_init(h, q)) != 0) return rc;
    q->loc = url;
    q->query = query;
    q->offset = offset;
    q->length = length;
    q->own = own;
    q->buf = own ? NULL : buf;
    q->cap = own ? 0 : cap;
    q->max = own ? cap : 0;
    q->is_s3 = is_s3;
    q->tag = tag;
    q->status = 0;
    q->total = 0;
    q->attempts = 0;
    q->token = 0;
    q->first_fail = 0;
    q->cause[0] = q->msg[0] = '\0';
    q->version = version;
    q->cache = CACHE_NONE;
    q->wait_since = 0;
    if (h->cache && !own && !query) {
        uint64_t k1 = length ? (offset + length - 1) / DSRT_CACHE_BLOCK : 0;
        if (!offset && !length) {
            q->cache = CACHE_WHOLE;
        } else if (length && k1 - offset / DSRT_CACHE_BLOCK < HTTP_CACHE_SPAN) {
            q->cache = CACHE_SPAN;
            q->ubuf = buf;
            q->ucap = cap;
            q->uoff = offset;
            q->ulen = length;
            q->k0 = offset / DSRT_CACHE_BLOCK;
            q->nblk = (unsigned)(k1 - q->k0 + 1);
        }
    }
    rc = q->cache ? cache_begin(h, q) : attempt_start(h, q);
    if (rc != 0) {
        cache_release(h, q);
        q->state = REQ_FREE;
        q->loc = NULL;
        if (own) free(q->buf);
        q->buf = NULL;
        return dsrt__fail_prefix(rc, "read: %s", url);
    }
    h->free_top--;
    account(h);
    h->in_flight++;
    return 0;
}

int dsrt__http_submit(dsrt_http *h, const char *url, uint64_t version, uint64_t offset,
                      uint64_t length, void *buf, size_t cap, uint64_t tag) {
    return submit(h, url, NULL, offset, length, buf, cap, 0, tag, version);
}

/* Hands finished slot q to the caller and frees it. */
static void deliver(dsrt_http *h, http_req *q, dsrt_read_result *res) {
    res->tag = q->tag;
    res->path = q->loc;
    res->buf = q->buf;
    res->size = q->status == DSRT_ETOOBIG ? (size_t)DSRT_MIN(q->total, (uint64_t)SIZE_MAX) : q->got;
    res->status = q->status;
    /* Whole objects come NUL-terminated (own_fit keeps a byte for it). */
    if (q->own && q->buf) q->buf[q->got] = '\0';
    if (q->status != 0) dsrt__fail(q->status, q->own ? "%s" : "read: %s", q->msg);
    h->delivered_size = q->object_size;
    snprintf(h->delivered_etag, sizeof h->delivered_etag, "%s", q->etag);
    req_clear(q);
    q->state = REQ_FREE;
    q->loc = NULL;
    q->buf = NULL;
    account(h);
    h->in_flight--;
    h->free_slots[h->free_top++] = (uint32_t)(q - h->reqs);
}

/* Lets curl work, then moves finished attempts on and starts due retries. */
static int pump(dsrt_http *h) {
    int running;
    CURLMcode mc = curl_multi_perform(h->multi, &running);
    if (mc != CURLM_OK)
        return dsrt__fail(DSRT_EREMOTE, "remote: curl_multi_perform: %s", curl_multi_strerror(mc));
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(h->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE) continue;
        http_req *q = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&q);
        if (q && q->state == REQ_ACTIVE) attempt_done(h, q, m->data.result);
    }
    uint64_t t = now_ns();
    for (unsigned i = 0; i < h->depth; i++) {
        http_req *q = &h->reqs[i];
        if (q->state != REQ_WAITING || q->retry_at > t) continue;
        int rc = q->wait_since ? cache_begin(h, q) : attempt_start(h, q);
        if (rc != 0) {
            char display[512];
            dsrt_text_redact(q->loc, display, sizeof display);
            dsrt__fail_prefix(rc, "%s", display);
            finish_msg(h, q, rc);
        }
    }
    return 0;
}

/* Whether the caller asks to stop (the interrupted callback); sets the
 * message when it does. */
static int interrupted(dsrt_http *h) {
    if (!h->interrupted || !h->interrupted(h->interrupted_ctx)) return 0;
    dsrt__fail(-EINTR, "interrupted");
    return 1;
}

int dsrt__http_collect(dsrt_http *h, dsrt_read_result *res, int wait, int extra_fd) {
    if (interrupted(h)) return -EINTR;
    for (;;) {
        if (h->done_len > 0) {
            http_req *q = &h->reqs[h->done[h->done_head]];
            h->done_head = (h->done_head + 1) % h->depth;
            h->done_len--;
            deliver(h, q, res);
            return 1;
        }
        if (h->in_flight == 0) return 0;
        int rc = pump(h);
        if (rc != 0) return rc;
        if (h->done_len > 0) continue;
        if (!wait) return 0;

        long ms = -1, most = h->interrupted ? HTTP_POLL_ASK_MS : HTTP_POLL_MAX_MS;
        curl_multi_timeout(h->multi, &ms);
        if (ms < 0 || ms > most) ms = most;
        uint64_t t = now_ns();
        for (unsigned i = 0; i < h->depth; i++) {
            const http_req *q = &h->reqs[i];
            if (q->state != REQ_WAITING) continue;
            long until = q->retry_at > t ? (long)((q->retry_at - t + 999999) / 1000000) : 0;
            if (until < ms) ms = until;
        }
        struct curl_waitfd extra = {.fd = extra_fd, .events = CURL_WAIT_POLLIN};
        CURLMcode mc = curl_multi_poll(h->multi, extra_fd >= 0 ? &extra : NULL,
                                       extra_fd >= 0 ? 1 : 0, (int)ms, NULL);
        if (mc != CURLM_OK)
            return dsrt__fail(DSRT_EREMOTE, "remote: curl_multi_poll: %s", curl_multi_strerror(mc));
        if (extra_fd >= 0 && extra.revents) return 0;
        if (interrupted(h)) return -EINTR;
    }
}

void dsrt__http_cancel(dsrt_http *h) {
    if (!h) return;
    for (unsigned i = 0; i < h->depth; i++) {
        http_req *q = &h->reqs[i];
        if (q->state == REQ_FREE) continue;
        if (q->state == REQ_ACTIVE) curl_multi_remove_handle(h->multi, q->easy);
        req_clear(q);
        cache_release(h, q);
        if (q->own) free(q->buf);
        q->buf = NULL;
        q->loc = NULL;
        q->state = REQ_FREE;
        h->free_slots[h->free_top++] = i;
    }
    account(h);
    h->in_flight = 0;
    h->done_len = 0;
}

unsigned dsrt__http_in_flight(const dsrt_http *h) {
    return h ? h->in_flight : 0;
}

void dsrt__http_stats(const dsrt_http *h, dsrt_remote_stats *s) {
    memset(s, 0, sizeof *s);
    if (!h) return;
    s->requests = h->requests;
    s->retries = h->retries;
    s->bytes = h->bytes;
    s->connections = h->connections;
    s->in_flight_s = h->in_flight_ns * 1e-9;
    s->busy_s = (double)h->busy_ns * 1e-9;
    dsrt__cache_stats(h->cache, s);
}

void dsrt__http_epoch(dsrt_http *h, uint64_t epoch) {
    dsrt__cache_epoch(h->cache, epoch);
}

uint64_t dsrt__http_delivered_version(const dsrt_http *h) {
    return h->delivered_etag[0] && h->delivered_size != UINT64_MAX
               ? dsrt__cache_version(h->delivered_etag, strlen(h->delivered_etag),
                                     h->delivered_size)
               : 0;
}

int dsrt__http_submit_whole(dsrt_http *h, const char *url, const char *query, size_t max,
                            uint64_t tag) {
    return submit(h, url, query, 0, 0, NULL, max, 1, tag, 0);
}

int dsrt__http_fetch_range(dsrt_http *h, const char *url, uint64_t offset, uint64_t length,
                           void *buf, size_t *got, uint64_t *object_size) {
    *got = 0;
    *object_size = UINT64_MAX;
    assert(h->in_flight == 0 && length > 0);
    int rc = submit(h, url, NULL, offset, length, buf, (size_t)length, 0, 0, 0);
    if (rc != 0) return rc;
    dsrt_read_result res = {0};
    do rc = dsrt__http_collect(h, &res, 1, -1);
    while (rc == 0 && h->in_flight > 0);
    if (rc < 0) {
        dsrt__http_cancel(h);
        return rc;
    }
    *got = res.status == 0 || res.status == DSRT_ETRUNCATED ? res.size : 0;
    *object_size = h->delivered_size;
    return res.status; /* the message, when it failed, is the thread's */
}

int dsrt__remote_opening_options(const dsrt_datastore_options *o, dsrt_remote_options *ro) {
    *ro = dsrt__remote_defaults();
    if (o) {
        const dsrt_remote_options *r = &o->remote;
        if (r->depth) ro->depth = r->depth;
        if (r->max_connections) ro->max_connections = r->max_connections;
        if (r->retry_deadline_s != 0) ro->retry_deadline_s = r->retry_deadline_s;
        if (r->timeout_s != 0) ro->timeout_s = r->timeout_s;
        /* The requests that open are not cached, but a cache folder that
         * cannot be one is refused before they start. */
        int rc = dsrt__cache_check(r->cache_dir, r->cache_limit, "datastore: remote");
        if (rc != 0) return rc;
    }
    return dsrt__remote_options_check(ro, "datastore");
}

int dsrt__http_create_opening(dsrt_http **h, const dsrt_datastore_options *o, unsigned depth) {
    dsrt_remote_options ro;
    int rc = dsrt__remote_opening_options(o, &ro);
    if (rc != 0) return rc;
    ro.depth = DSRT_MIN(ro.depth, depth);
    if ((rc = dsrt__http_create(h, &ro)) != 0) return rc;
    if (o) {
        (*h)->interrupted = o->interrupted;
        (*h)->interrupted_ctx = o->interrupted_ctx;
    }
    return 0;
}

int dsrt__http_fetch(dsrt_http *h, const char *url, const char *query, size_t max, uint8_t **out,
                     size_t *len) {
    *out = NULL;
    *len = 0;
    assert(h->in_flight == 0);
    int rc = dsrt__http_submit_whole(h, url, query, max, 0);
    if (rc != 0) return rc;
    dsrt_read_result res = {0};
    do rc = dsrt__http_collect(h, &res, 1, -1);
    while (rc == 0 && h->in_flight > 0);
    if (rc < 0) {
        dsrt__http_cancel(h);
        return rc;
    }
    if (res.status != 0) {
        free(res.buf);
        return res.status; /* the message is the thread's */
    }
    uint8_t *b = res.buf;
    if (!b && !(b = calloc(1, 1))) return -ENOMEM;
    *out = b;
    *len = res.size;
    return 0;
}

// ----------------------------------------------------------------------------
// Single objects, with a client of their own

int dsrt__remote_read_whole(const char *url, size_t max, uint8_t **out, size_t *len) {
    dsrt_http *h = NULL;
    dsrt_remote_options ro = dsrt__remote_defaults();
    ro.depth = 1;
    int rc = dsrt__http_create(&h, &ro);
    if (rc == 0) rc = dsrt__http_fetch(h, url, NULL, max, out, len);
    dsrt__http_destroy(h);
    return rc;
}

int dsrt__remote_read_range(const char *url, uint64_t offset, uint64_t length, void *buf,
                            size_t *got) {
    dsrt_http *h = NULL;
    dsrt_remote_options ro = dsrt__remote_defaults();
    ro.depth = 1;
    *got = 0;
    int rc = dsrt__http_create(&h, &ro);
    if (rc != 0) return rc;
    dsrt_read_result res = {0};
    rc = dsrt__http_submit(h, url, 0, offset, length, buf, (size_t)length, 0);
    if (rc == 0) rc = dsrt__http_collect(h, &res, 1, -1) == 1 ? res.status : -EIO;
    if (rc == 0 || rc == DSRT_ETRUNCATED) *got = res.size;
    dsrt__http_destroy(h);
    return rc;
}
