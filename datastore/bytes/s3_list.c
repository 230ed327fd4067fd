/*
 * S3 listings: ListObjectsV2 pages of up to 1000 keys (encoding-type=url,
 * so that any key survives the XML), followed by their continuation tokens;
 * a prefix listed page after page, or as a tree of listings in flight
 * together.
 *
 * The tree: the prefix is listed first with delimiter '/', which names its
 * sub-folders; then every sub-folder is listed whole, all of them at once
 * through one multi handle, so that a bucket of many folders is indexed in
 * a few round trips rather than one per page. Each page is parsed and
 * dropped, and each key handed to the caller as it comes, so memory grows
 * with what the caller keeps only.
 *
 * A page is taken only when it is a ListObjectsV2 answer (root element
 * ListBucketResult, in S3's namespace or none): an HTML page of a captive
 * portal is an error, not an empty folder. A store that answers a
 * continuation token it gave before is an error, not a listing without end.
 */
#include "datastore/bytes/cache.h"
#include "datastore/bytes/http.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S3_LIST_MAX_PAGE ((size_t)64 << 20) /* largest listing page we accept */

/* Decodes the escapes of a listing asked with encoding-type=url in place:
 * %XX, and '+' for a space (as S3 writes spaces there; a '+' of a key comes
 * as %2B). Returns the new length. */
static size_t url_decode(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
            isxdigit((unsigned char)s[i + 2])) {
            char h[3] = {s[i + 1], s[i + 2], '\0'};
            s[o++] = (char)strtol(h, NULL, 16);
            i += 2;
        } else {
            s[o++] = s[i] == '+' ? ' ' : s[i];
        }
    }
    return o;
}

/* The text of an element, decoded into scratch (and NUL-terminated). */
static int list_text(dsrt_strbuf *scratch, const char *text, size_t n, int url_encoded) {
    void *buf = scratch->s;
    if (dsrt__grow(&buf, &scratch->cap, n + 1, 1) != 0) return -ENOMEM;
    scratch->s = buf;
    size_t k = dsrt__xml_unescape(text, n, scratch->s);
    if (url_encoded) k = url_decode(scratch->s, k);
    scratch->s[k] = '\0';
    scratch->len = k;
    return 0;
}

/* A short excerpt of an answer fit for a message: its first bytes, control
 * and non-ASCII bytes as spaces and '?', blanks squeezed (dsrt__fail then
 * masks what may be a credential). */
static void excerpt(const char *body, size_t len, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 4 < cap; i++) {
        unsigned char ch = (unsigned char)body[i];
        char c = ch < ' ' || ch == 0x7f ? ' ' : ch >= 0x80 ? '?' : (char)ch;
        if (c == ' ' && (o == 0 || out[o - 1] == ' ')) continue;
        out[o++] = c;
    }
    if (o + 4 >= cap) memcpy(out + o, "...", 3), o += 3;
    out[o] = '\0';
}

/* Whether body is a ListObjectsV2 answer: after the XML declaration,
 * comments and blanks, a root element ListBucketResult in S3's namespace
 * (or none), closed at the end. An HTML page (a captive portal, a proxy's
 * error) or anything else is not an empty listing. */
static int list_root_ok(const char *body, size_t len) {
    static const char root[] = "ListBucketResult", ns[] = "http://s3.amazonaws.com/doc/2006-03-01/";
    const char *p = body, *end = body + len;
    if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3; /* a UTF-8 byte-order mark */
    for (;;) {
        while (p < end && isspace((unsigned char)*p)) p++;
        const char *close = NULL;
        if (end - p >= 2 && (memcmp(p, "<?", 2) == 0))
            close = memmem(p, (size_t)(end - p), "?>", 2);
        else if (end - p >= 4 && memcmp(p, "<!--", 4) == 0)
            close = memmem(p, (size_t)(end - p), "-->", 3);
        else if (end - p >= 2 && memcmp(p, "<!", 2) == 0)
            close = memchr(p, '>', (size_t)(end - p));
        else
            break;
        if (!close) return 0;
        p = close + (*close == '-' ? 3 : *close == '?' ? 2 : 1);
    }
    size_t rn = sizeof root - 1;
    if (end - p < (ptrdiff_t)rn + 2 || p[0] != '<' || memcmp(p + 1, root, rn) != 0) return 0;
    p += 1 + rn;
    /* Attributes: only a default namespace matters. */
    const char *gt = memchr(p, '>', (size_t)(end - p));
    if (!gt || !(isspace((unsigned char)*p) || *p == '>' || *p == '/')) return 0;
    for (const char *a = p; a < gt;) {
        while (a < gt && isspace((unsigned char)*a)) a++;
        const char *eq = memchr(a, '=', (size_t)(gt - a));
        if (!eq) break;
        const char *q = eq + 1;
        while (q < gt && isspace((unsigned char)*q)) q++;
        if (q >= gt || (*q != '"' && *q != '\'')) return 0;
        const char *qe = memchr(q + 1, *q, (size_t)(gt - q - 1));
        if (!qe) return 0;
        const char *ne = eq;
        while (ne > a && isspace((unsigned char)ne[-1])) ne--;
        if (ne - a == 5 && memcmp(a, "xmlns", 5) == 0 &&
            ((size_t)(qe - q - 1) != sizeof ns - 1 || memcmp(q + 1, ns, sizeof ns - 1) != 0))
            return 0;
        a = qe + 1;
    }
    if (gt[-1] == '/')
        p = gt + 1; /* <ListBucketResult/>: an empty listing */
    else {
        static const char tail[] = "</ListBucketResult>";
        const char *t = end;
        while (t > gt && isspace((unsigned char)t[-1])) t--;
        if (t - gt < (ptrdiff_t)sizeof tail - 1 ||
            memcmp(t - (sizeof tail - 1), tail, sizeof tail - 1))
            return 0;
        p = t;
    }
    while (p < end && isspace((unsigned char)*p)) p++;
    return p == end;
}

int dsrt__s3_list_page(const char *body, size_t len, dsrt_strbuf *scratch, dsrt_strbuf *token,
                       dsrt_list_entry_fn on_entry, void *ud) {
    const char *end = body + len;
    if (!list_root_ok(body, len)) {
        char ex[100];
        excerpt(body, len, ex, sizeof ex);
        return dsrt__fail(DSRT_EREMOTE,
                          "the answer is not a ListObjectsV2 listing (no ListBucketResult in S3's "
                          "namespace): \"%s\" (%zu bytes)",
                          ex, len);
    }
    char enc[16];
    dsrt__xml_text(body, len, "EncodingType", enc, sizeof enc);
    int url_encoded = strcmp(enc, "url") == 0;
    /* Keys (<Contents><Key>), then sub-prefixes (<CommonPrefixes><Prefix>). */
    static const char *const blocks[2][2] = {{"Contents", "Key"}, {"CommonPrefixes", "Prefix"}};
    for (int is_prefix = 0; is_prefix < 2; is_prefix++) {
        const char *p = body, *b, *t;
        size_t bn, n;
        while ((b = dsrt__xml_find(p, end, blocks[is_prefix][0], &bn)) != NULL) {
            p = b + bn;
            if (!(t = dsrt__xml_find(b, b + bn, blocks[is_prefix][1], &n))) continue;
            /* An object's size: the <Size> of its <Contents>. */
            uint64_t size = 0;
            size_t sl;
            const char *sz = is_prefix ? NULL : dsrt__xml_find(b, b + bn, "Size", &sl);
            for (size_t i = 0; sz && i < sl && i < 19 && isdigit((unsigned char)sz[i]); i++)
                size = size * 10 + (uint64_t)(sz[i] - '0');
            /* Its version: the ETag (&quot; as the store writes its quotes) and size. */
            uint64_t version = 0;
            char etag[128];
            if (!is_prefix) {
                dsrt__xml_text(b, bn, "ETag", etag, sizeof etag);
                if (etag[0]) version = dsrt__cache_version(etag, strlen(etag), size);
            }
            int rc = list_text(scratch, t, n, url_encoded);
            if (rc == 0) rc = on_entry(ud, scratch->s, scratch->len, is_prefix, size, version);
            if (rc != 0) return rc;
        }
    }
    char truncated[8];
    dsrt__xml_text(body, len, "IsTruncated", truncated, sizeof truncated);
    token->len = 0;
    if (token->s) token->s[0] = '\0';
    if (strcmp(truncated, "true") != 0) return 0;
    size_t n;
    const char *t = dsrt__xml_find(body, end, "NextContinuationToken", &n);
    if (!t || n == 0)
        return dsrt__fail(DSRT_EREMOTE, "a truncated listing page without a continuation token");
    if (dsrt__sb_add(token, t, n) != 0) return -ENOMEM;
    token->len = dsrt__xml_unescape(token->s, token->len, token->s);
    token->s[token->len] = '\0';
    return 0;
}

/*
 * A listing's continuation tokens must not come round again: a store that
 * answers a token it gave before would be listed for ever. Brent's cycle
 * detection: each token is compared with one kept, which is replaced by
 * the current one after 1, 2, 4, 8, ... pages, so that a loop of any length
 * is seen within a few times its length, in constant memory.
 */
typedef struct {
    dsrt_strbuf kept;
    size_t since, power, pages;
} token_watch;

/* 1 when token came before in this listing, 0 when not, or -ENOMEM. */
static int token_repeats(token_watch *w, const dsrt_strbuf *token) {
    w->pages++;
    if (w->kept.s && w->kept.len == token->len && memcmp(w->kept.s, token->s, token->len) == 0)
        return 1;
    if (++w->since >= w->power) {
        w->kept.len = 0;
        if (dsrt__sb_add(&w->kept, token->s, token->len) != 0) return -ENOMEM;
        w->power = w->power ? 2 * w->power : 2;
        w->since = 0;
    }
    return 0;
}

/* Where listings go, for messages: "http://host:port" (the endpoint). */
static void list_endpoint(dsrt_http *h, char *out, size_t cap) {
    const dsrt_s3_config *c = dsrt__http_s3(h);
    snprintf(out, cap, "%s://%s%s", c ? c->scheme : "?", c ? c->host : "?", c ? c->base : "");
}

/* The failure of a listing page: interrupted, a token that came again, or
 * the page's own (a message that names the place and the endpoint). */
static int list_fail(dsrt_http *h, int rc, const char *display, const char *prefix) {
    char ep[DSRT_S3_ENDPOINT_MAX];
    list_endpoint(h, ep, sizeof ep);
    return dsrt__fail_prefix(rc, "datastore: listing %s%s%s%s from %s", display,
                             prefix ? " (prefix \"" : "", prefix ? prefix : "", prefix ? "\")" : "",
                             ep);
}

static int token_again(dsrt_http *h, const token_watch *w, const char *display,
                       const char *prefix) {
    dsrt__fail(DSRT_EREMOTE,
               "the store answered a continuation token it had given before (page %zu): the "
               "listing would never end",
               w->pages);
    return list_fail(h, DSRT_EREMOTE, display, prefix);
}

/* The flat listing's entries: keys only (no delimiter, no sub-prefixes). */
typedef struct {
    dsrt_s3_each_fn each;
    void *ctx;
} flat_list;

static int flat_entry(void *ud, const char *s, size_t n, int is_prefix, uint64_t size,
                      uint64_t version) {
    flat_list *f = ud;
    if (is_prefix || memchr(s, '\0', n)) return 0;
    return f->each(f->ctx, s, n, size, version);
}

int dsrt__s3_list(dsrt_http *h, const char *bucket, size_t blen, const char *prefix, size_t plen,
                  const char *display, dsrt_s3_each_fn each, void *ctx) {
    dsrt_strbuf query = {0}, token = {0}, scratch = {0};
    token_watch watch = {0};
    flat_list f = {each, ctx};
    char list_url[300];
    int rc;
    snprintf(list_url, sizeof list_url, "s3://%.*s/", (int)blen, bucket);
    do {
        /* Parameters in canonical (sorted) order, values encoded. */
        query.len = 0;
        rc = -ENOMEM;
        if (token.len &&
            (dsrt__sb_add(&query, "continuation-token=", 19) ||
             dsrt__sb_encode(&query, token.s, token.len, 0) || dsrt__sb_add(&query, "&", 1)))
            break;
        if (dsrt__sb_add(&query, "encoding-type=url&list-type=2&max-keys=1000&prefix=", 51) ||
            dsrt__sb_encode(&query, prefix ? prefix : "", plen, 0))
            break;
        uint8_t *page;
        size_t len;
        if ((rc = dsrt__http_fetch(h, list_url, query.s, S3_LIST_MAX_PAGE, &page, &len)) != 0) {
            if (rc == -ENOENT)
                rc = dsrt__fail(DSRT_EREMOTE, "datastore: %s: the store answered 404 to a listing",
                                display);
            else
                dsrt__fail_prefix(rc, "datastore: listing %s", display);
            break;
        }
        rc = dsrt__s3_list_page((const char *)page, len, &scratch, &token, flat_entry, &f);
        free(page);
        if (rc < 0) list_fail(h, rc, display, NULL);
        if (rc == 0 && token.len > 0 && (rc = token_repeats(&watch, &token)) == 1)
            rc = token_again(h, &watch, display, NULL);
    } while (rc == 0 && token.len > 0);
    free(query.s);
    free(token.s);
    free(scratch.s);
    free(watch.kept.s);
    return rc;
}

// ----------------------------------------------------------------------------
// A tree of listings in flight together

/*
 * The keys of the prefix are exactly the first listing's keys plus every
 * sub-folder's, so what the caller builds of them is what a single listing
 * gives, whatever the order of arrival.
 */
typedef struct {
    char *prefix; /* the key prefix this job lists (decoded) */
    dsrt_strbuf token, query;
    token_watch watch; /* the tokens seen */
    int delimited;     /* the prefix's own listing, with delimiter '/' */
} list_job;

typedef struct {
    list_job *jobs;
    size_t n_jobs, cap_jobs;
    size_t *ready; /* jobs with a page to ask for, FIFO */
    size_t ready_head, ready_len, cap_ready;
    size_t prefix_len; /* of the first job's prefix */
    int spawn;         /* sub-prefixes become jobs */
    dsrt_s3_each_fn each;
    void *ctx;
} list_run;

static int push_ready(list_run *r, size_t job) {
    if (r->ready_head > 0 && r->ready_head + r->ready_len == r->cap_ready) {
        memmove(r->ready, r->ready + r->ready_head, r->ready_len * sizeof *r->ready);
        r->ready_head = 0;
    }
    void *buf = r->ready;
    if (dsrt__grow(&buf, &r->cap_ready, r->ready_head + r->ready_len + 1, sizeof *r->ready) != 0)
        return -ENOMEM;
    r->ready = buf;
    r->ready[r->ready_head + r->ready_len++] = job;
    return 0;
}

static int add_job(list_run *r, const char *prefix, size_t n, int delimited) {
    void *buf = r->jobs;
    if (dsrt__grow(&buf, &r->cap_jobs, r->n_jobs + 1, sizeof *r->jobs) != 0) return -ENOMEM;
    r->jobs = buf;
    list_job *j = &r->jobs[r->n_jobs];
    *j = (list_job){.delimited = delimited};
    if (!(j->prefix = dsrt__malloc(n + 1))) return -ENOMEM;
    memcpy(j->prefix, prefix, n);
    j->prefix[n] = '\0';
    r->n_jobs++;
    return push_ready(r, r->n_jobs - 1);
}

/* One entry of a page: a key goes to the caller, a sub-prefix (of the
 * first listing) becomes a job. */
static int take_entry(void *ud, const char *s, size_t n, int is_prefix, uint64_t size,
                      uint64_t version) {
    list_run *r = ud;
    if (n < r->prefix_len || memcmp(s, r->jobs[0].prefix, r->prefix_len) != 0)
        return 0; /* not under the prefix: cannot happen */
    if (memchr(s, '\0', n)) return 0;
    if (is_prefix) return r->spawn ? add_job(r, s, n, 0) : 0;
    return r->each(r->ctx, s, n, size, version);
}

static int job_query(const list_job *j, dsrt_strbuf *q) {
    /* Parameters in canonical (sorted) order, values encoded. */
    q->len = 0;
    if (j->token.len &&
        (dsrt__sb_add(q, "continuation-token=", 19) ||
         dsrt__sb_encode(q, j->token.s, j->token.len, 0) || dsrt__sb_add(q, "&", 1)))
        return -ENOMEM;
    if (j->delimited && dsrt__sb_add(q, "delimiter=%2F&", 14)) return -ENOMEM;
    if (dsrt__sb_add(q, "encoding-type=url&list-type=2&max-keys=1000&prefix=", 51) ||
        dsrt__sb_encode(q, j->prefix, strlen(j->prefix), 0))
        return -ENOMEM;
    return 0;
}

static void list_run_free(list_run *r) {
    for (size_t i = 0; i < r->n_jobs; i++) {
        free(r->jobs[i].prefix);
        free(r->jobs[i].token.s);
        free(r->jobs[i].query.s);
        free(r->jobs[i].watch.kept.s);
    }
    free(r->jobs);
    free(r->ready);
}

/* A finished page of job res->tag: its entries taken, its next page asked
 * for or the job done. */
static int tree_page(list_run *r, dsrt_http *h, dsrt_read_result *res, dsrt_strbuf *scratch,
                     dsrt_strbuf *next, const char *display) {
    int rc;
    if (res->status != 0) {
        free(res->buf);
        rc = res->status;
        if (rc == -ENOENT)
            return dsrt__fail(DSRT_EREMOTE, "datastore: %s: the store answered 404 to a listing",
                              display);
        return dsrt__fail_prefix(rc, "datastore: listing %s", display);
    }
    /* take_entry may add jobs (and move them): the token comes apart. */
    rc = dsrt__s3_list_page((const char *)res->buf, res->size, scratch, next, take_entry, r);
    free(res->buf);
    list_job *j = &r->jobs[res->tag];
    if (rc != 0) return list_fail(h, rc, display, j->prefix);
    dsrt_strbuf t = j->token;
    j->token = *next;
    *next = t;
    if (j->token.len > 0) {
        if ((rc = token_repeats(&j->watch, &j->token)) != 0)
            return rc == 1 ? token_again(h, &j->watch, display, j->prefix) : rc;
        return push_ready(r, res->tag);
    }
    free(j->query.s);
    free(j->token.s);
    j->query = j->token = (dsrt_strbuf){0};
    return 0;
}

int dsrt__s3_list_tree(dsrt_http *h, unsigned depth, const char *bucket, size_t blen,
                       const char *prefix, size_t plen, int sub, const char *display,
                       dsrt_s3_each_fn each, void *ctx) {
    list_run r = {.prefix_len = plen, .spawn = sub, .each = each, .ctx = ctx};
    dsrt_strbuf scratch = {0}, next = {0};
    char list_url[300];
    snprintf(list_url, sizeof list_url, "s3://%.*s/", (int)blen, bucket);
    int rc = add_job(&r, prefix, plen, 1);
    while (rc == 0 && (r.ready_len > 0 || dsrt__http_in_flight(h) > 0)) {
        while (rc == 0 && r.ready_len > 0 && dsrt__http_in_flight(h) < depth) {
            size_t id = r.ready[r.ready_head++];
            r.ready_len--;
            list_job *j = &r.jobs[id];
            if ((rc = job_query(j, &j->query)) == 0)
                rc = dsrt__http_submit_whole(h, list_url, j->query.s, S3_LIST_MAX_PAGE, id);
        }
        if (rc != 0) break;
        dsrt_read_result res;
        if ((rc = dsrt__http_collect(h, &res, 1, -1)) < 0) {
            list_fail(h, rc, display, NULL);
            break;
        }
        if (rc == 1) rc = tree_page(&r, h, &res, &scratch, &next, display);
    }
    dsrt__http_cancel(h);
    list_run_free(&r);
    free(scratch.s);
    free(next.s);
    return rc;
}
