/*
 * What dsrt knows of S3: where a bucket lives (endpoint, region, path-style
 * or virtual-host addressing), who asks (credentials as the AWS tools find
 * them), how a request is signed (AWS Signature Version 4), what the store's
 * error answers mean, and how a prefix becomes a folder source.
 *
 * Signing is done here rather than by libcurl's CURLOPT_AWS_SIGV4: the
 * libcurl of Debian 12 (7.88) signs only host and x-amz-date, sends no
 * x-amz-content-sha256 (which S3 requires), passes the query string
 * through without putting it in canonical order, and has no place for a
 * session token, so S3 refuses what it signs. The hashes are OpenSSL's.
 *
 * Listing: ListObjectsV2 pages of up to 1000 keys (encoding-type=url, so
 * that any key survives the XML), followed by their continuation tokens.
 * The prefix is listed first with delimiter '/', which names its class
 * folders; then every class folder is listed, all of them at once through
 * one multi handle, so that a bucket of many classes is indexed in a few
 * round trips rather than one per page. Each page is parsed and dropped,
 * and every key that the folder rules take goes straight into the index's
 * arena as a URL, so memory grows with the index only. The folder rules are
 * the local folder's (labels from the first sub-prefix, from the prefix
 * holding the object, or none; extensions; sub-folders or not; empty class
 * folders; the same sort), so a bucket holding a copy of a folder gives the
 * same index, whatever order the pages come in.
 * Keys with an empty path component ("a//b.jpg") have no folder equivalent
 * and are left out with a warning. A page is taken only when it is a
 * ListObjectsV2 answer (root element ListBucketResult, in S3's namespace or
 * none): an HTML page of a captive portal is an error, not an empty class.
 * A store that answers a continuation token it gave before is an error, not
 * a listing without end.
 */
#include "datastore/remote.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define S3_LIST_MAX_PAGE ((size_t)64 << 20) /* largest listing page we accept */
/* "scheme://host/base" of an endpoint, NUL included. */
#define S3_ENDPOINT_MAX                                                                            \
    (sizeof((dsrt_s3_config *)0)->scheme + sizeof((dsrt_s3_config *)0)->host +                     \
     sizeof((dsrt_s3_config *)0)->base + 4)

// ----------------------------------------------------------------------------
// Locations and strings

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

// ----------------------------------------------------------------------------
// Configuration: environment, ~/.aws/credentials, ~/.aws/config

int dsrt__aws_ini_get(const char *text, const char *section, const char *sub, const char *key,
                      char *out, size_t cap, int *found_section) {
    const char *p = text;
    int in_section = 0, in_sub = 0, hit = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        const char *line = p;
        p += n + (eol != NULL);
        int indented = n > 0 && (line[0] == ' ' || line[0] == '\t');
        while (n > 0 && isspace((unsigned char)*line)) line++, n--;
        while (n > 0 && isspace((unsigned char)line[n - 1])) n--;
        if (n == 0 || line[0] == '#' || line[0] == ';') continue;
        if (line[0] == '[') {
            const char *s = line + 1, *e = memchr(line, ']', n);
            if (!e) continue;
            while (s < e && isspace((unsigned char)*s)) s++;
            const char *t = e;
            while (t > s && isspace((unsigned char)t[-1])) t--;
            in_section = strlen(section) == (size_t)(t - s) && memcmp(s, section, t - s) == 0;
            if (in_section && found_section) *found_section = 1;
            in_sub = 0;
            continue;
        }
        if (!in_section) continue;
        const char *eq = memchr(line, '=', n);
        if (!eq) continue;
        const char *k = line, *ke = eq;
        while (ke > k && isspace((unsigned char)ke[-1])) ke--;
        const char *v = eq + 1, *ve = line + n;
        while (v < ve && isspace((unsigned char)*v)) v++;
        if (!indented)
            in_sub =
                sub && v == ve && (size_t)(ke - k) == strlen(sub) && memcmp(k, sub, ke - k) == 0;
        if (v == ve) continue; /* a sub-section's opening line */
        if ((sub != NULL) != (indented && in_sub)) continue;
        if ((size_t)(ke - k) == strlen(key) && strncasecmp(k, key, ke - k) == 0) {
            snprintf(out, cap, "%.*s", (int)(ve - v), v);
            hit = 1;
        }
    }
    return hit;
}

/* The file at $env, else ~/.aws/name, read whole; NULL when there is none. */
static char *aws_file(const char *env, const char *name, char *path, size_t cap) {
    const char *e = getenv(env), *home = getenv("HOME");
    if (e && *e)
        snprintf(path, cap, "%s", e);
    else if (home && *home)
        snprintf(path, cap, "%s/.aws/%s", home, name);
    else
        return NULL;
    uint8_t *data;
    size_t len;
    if (dsrt__read_whole_file(path, (size_t)1 << 20, &data, &len) != 0) {
        dsrt__clear_error();
        return NULL;
    }
    return (char *)data;
}

static int env_true(const char *name) {
    const char *v = getenv(name);
    return v && (strcasecmp(v, "1") == 0 || strcasecmp(v, "yes") == 0 ||
                 strcasecmp(v, "true") == 0 || strcasecmp(v, "on") == 0);
}

/* Sets scheme, host and base path from an endpoint URL. */
static int set_endpoint(dsrt_s3_config *c, const char *url, const char *from) {
    const char *rest;
    if (strncasecmp(url, "https://", 8) == 0) {
        snprintf(c->scheme, sizeof c->scheme, "https");
        rest = url + 8;
    } else if (strncasecmp(url, "http://", 7) == 0) {
        snprintf(c->scheme, sizeof c->scheme, "http");
        rest = url + 7;
    } else {
        return dsrt__fail(DSRT_EOPTION, "s3: %s: endpoint \"%s\" is not an http:// or https:// URL",
                          from, url);
    }
    const char *slash = strchr(rest, '/');
    size_t hn = slash ? (size_t)(slash - rest) : strlen(rest);
    if (hn == 0 || hn >= sizeof c->host || memchr(rest, '@', hn) || memchr(rest, '?', hn))
        return dsrt__fail(DSRT_EOPTION, "s3: %s: endpoint \"%s\" has no usable host", from, url);
    snprintf(c->host, sizeof c->host, "%.*s", (int)hn, rest);
    /* The default port is left out, as curl leaves it out of Host. */
    size_t l = strlen(c->host);
    const char *def = c->scheme[4] == 's' ? ":443" : ":80";
    if (l > strlen(def) && strcmp(c->host + l - strlen(def), def) == 0)
        c->host[l - strlen(def)] = '\0';
    const char *path = slash ? slash : "";
    size_t pn = strlen(path);
    while (pn > 0 && path[pn - 1] == '/') pn--;
    if (pn >= sizeof c->base)
        return dsrt__fail(DSRT_EOPTION, "s3: %s: endpoint path too long", from);
    snprintf(c->base, sizeof c->base, "%.*s", (int)pn, path);
    c->custom = 1;
    return 0;
}

int dsrt__s3_config_load(dsrt_s3_config *c) {
    memset(c, 0, sizeof *c);
    char cred_path[1024], conf_path[1024], v[1024];
    const char *profile = getenv("AWS_PROFILE");
    if (!profile || !*profile) profile = getenv("AWS_DEFAULT_PROFILE");
    int named = profile && *profile;
    if (!named) profile = "default";
    char *creds =
        aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", cred_path, sizeof cred_path);
    char *conf = aws_file("AWS_CONFIG_FILE", "config", conf_path, sizeof conf_path);
    char conf_section[160];
    if (strcmp(profile, "default") == 0)
        snprintf(conf_section, sizeof conf_section, "default");
    else
        snprintf(conf_section, sizeof conf_section, "profile %s", profile);
    int rc = 0, in_creds = 0, in_conf = 0;

    /* Credentials. */
    const char *ek = getenv("AWS_ACCESS_KEY_ID"), *es = getenv("AWS_SECRET_ACCESS_KEY");
    if ((ek && *ek) || (es && *es)) {
        if (!(ek && *ek) || !(es && *es)) {
            rc = dsrt__fail(DSRT_EOPTION, "s3: %s is set but %s is not",
                            ek && *ek ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                            ek && *ek ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
            goto out;
        }
        snprintf(c->key, sizeof c->key, "%s", ek);
        snprintf(c->secret, sizeof c->secret, "%s", es);
        const char *t = getenv("AWS_SESSION_TOKEN");
        if (t && *t && !(c->token = dsrt__strdup(t))) goto nomem;
        snprintf(c->source, sizeof c->source, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
    } else {
        const char *files[2] = {creds, conf};
        const char *sections[2] = {profile, conf_section};
        const char *paths[2] = {cred_path, conf_path};
        int *found[2] = {&in_creds, &in_conf};
        for (int f = 0; f < 2 && !c->key[0]; f++) {
            if (!files[f]) continue;
            int have_key = dsrt__aws_ini_get(files[f], sections[f], NULL, "aws_access_key_id",
                                             c->key, sizeof c->key, found[f]);
            int have_secret =
                dsrt__aws_ini_get(files[f], sections[f], NULL, "aws_secret_access_key", c->secret,
                                  sizeof c->secret, NULL);
            if (have_key != have_secret) {
                rc = dsrt__fail(DSRT_EOPTION, "s3: %s: profile [%s] has %s but not %s", paths[f],
                                sections[f],
                                have_key ? "aws_access_key_id" : "aws_secret_access_key",
                                have_key ? "aws_secret_access_key" : "aws_access_key_id");
                goto out;
            }
            if (have_key) {
                if (dsrt__aws_ini_get(files[f], sections[f], NULL, "aws_session_token", v, sizeof v,
                                      NULL) &&
                    !(c->token = dsrt__strdup(v)))
                    goto nomem;
                snprintf(c->source, sizeof c->source, "%.60s profile %.30s",
                         f == 0 ? "the credentials file" : "the config file", profile);
            }
        }
        if (conf && !in_conf)
            dsrt__aws_ini_get(conf, conf_section, NULL, "region", v, sizeof v, &in_conf);
        if (named && !in_creds && !in_conf) {
            rc = dsrt__fail(DSRT_EOPTION,
                            "s3: AWS_PROFILE names profile \"%s\", which is in neither %s nor %s",
                            profile, creds ? cred_path : "~/.aws/credentials",
                            conf ? conf_path : "~/.aws/config");
            goto out;
        }
    }
    c->anonymous = !c->key[0] || env_true("AWS_NO_SIGN_REQUEST");
    if (!c->key[0]) snprintf(c->source, sizeof c->source, "no credentials (anonymous requests)");

    /* Region. */
    const char *r = getenv("AWS_REGION");
    if (!r || !*r) r = getenv("AWS_DEFAULT_REGION");
    if (r && *r)
        snprintf(c->region, sizeof c->region, "%s", r);
    else if (conf && dsrt__aws_ini_get(conf, conf_section, NULL, "region", v, sizeof v, NULL))
        snprintf(c->region, sizeof c->region, "%.63s", v);
    else
        snprintf(c->region, sizeof c->region, "us-east-1");
    for (const char *q = c->region; *q; q++)
        if (!isalnum((unsigned char)*q) && *q != '-') {
            rc = dsrt__fail(DSRT_EOPTION, "s3: region \"%s\" is not a region name", c->region);
            goto out;
        }

    /* Endpoint. */
    const char *ep = getenv("AWS_ENDPOINT_URL_S3");
    const char *from = "AWS_ENDPOINT_URL_S3";
    if (!ep || !*ep) {
        ep = getenv("AWS_ENDPOINT_URL");
        from = "AWS_ENDPOINT_URL";
    }
    if (ep && *ep) {
        if ((rc = set_endpoint(c, ep, from)) != 0) goto out;
    } else if (conf &&
               (dsrt__aws_ini_get(conf, conf_section, "s3", "endpoint_url", v, sizeof v, NULL) ||
                dsrt__aws_ini_get(conf, conf_section, NULL, "endpoint_url", v, sizeof v, NULL))) {
        if ((rc = set_endpoint(c, v, conf_path)) != 0) goto out;
    } else {
        snprintf(c->scheme, sizeof c->scheme, "https");
        snprintf(c->host, sizeof c->host, "s3.%s.amazonaws.com", c->region);
    }

    /* Addressing. */
    const char *a = getenv("DSRT_S3_ADDRESSING");
    if (!(a && *a) && conf &&
        dsrt__aws_ini_get(conf, conf_section, "s3", "addressing_style", v, sizeof v, NULL))
        a = v;
    if (a && *a) {
        static const struct {
            const char *name;
            dsrt_s3_addressing value;
        } styles[] = {{"auto", DSRT_S3_ADDR_AUTO},
                      {"path", DSRT_S3_ADDR_PATH},
                      {"virtual", DSRT_S3_ADDR_VIRTUAL}};
        size_t k = 0;
        while (k < DSRT_ARRAY_SIZE(styles) && strcasecmp(a, styles[k].name) != 0) k++;
        if (k == DSRT_ARRAY_SIZE(styles)) {
            rc = dsrt__fail(DSRT_EOPTION, "s3: addressing style \"%s\": not auto, path or virtual",
                            a);
            goto out;
        }
        c->addressing = styles[k].value;
    }
    goto out;
nomem:
    rc = -ENOMEM;
out:
    free(creds);
    free(conf);
    if (rc != 0) dsrt__s3_config_free(c);
    return rc;
}

void dsrt__s3_config_free(dsrt_s3_config *c) {
    dsrt__s3_signer_free(c->signer);
    if (c->token) {
        memset(c->token, 0, strlen(c->token));
        free(c->token);
    }
    memset(c, 0, sizeof *c);
}

// ----------------------------------------------------------------------------
// Signature Version 4
//
// A signature is HMAC-SHA256(signing key, string to sign), the signing key
// being four HMACs of the secret, the date, the region and the service. The
// key changes once a day: a signer keeps it, and the HMAC's inner and outer
// SHA-256 states after the key's block, so that signing a request costs two
// short hashes and the hash of the canonical request. OpenSSL's SHA-256 is
// fetched once per signer: its one-shot functions look the algorithm up in
// the provider tables at every call, which cost more than the hashing.

struct dsrt_s3_signer {
    EVP_MD *md;
    char date8[9];                   /* the day of the key below */
    EVP_MD_CTX *inner, *outer, *ctx; /* HMAC states keyed by the signing key */
};

static void to_hex(const unsigned char *d, size_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static int crypto_fail(void) {
    return dsrt__fail(DSRT_EREMOTE, "s3: SHA-256 failed in OpenSSL");
}

/* The HMAC states of key into inner and outer (RFC 2104; the key is at most
 * one block here, 64 bytes). */
static int hmac_key(EVP_MD *md, const void *key, size_t klen, EVP_MD_CTX *inner,
                    EVP_MD_CTX *outer) {
    unsigned char ipad[64], opad[64];
    if (klen > sizeof ipad) return dsrt__fail(DSRT_EOPTION, "s3: the secret key is too long");
    memset(ipad, 0x36, sizeof ipad);
    memset(opad, 0x5c, sizeof opad);
    for (size_t i = 0; i < klen; i++) {
        ipad[i] ^= ((const unsigned char *)key)[i];
        opad[i] ^= ((const unsigned char *)key)[i];
    }
    int ok = EVP_DigestInit_ex(inner, md, NULL) && EVP_DigestUpdate(inner, ipad, sizeof ipad) &&
             EVP_DigestInit_ex(outer, md, NULL) && EVP_DigestUpdate(outer, opad, sizeof opad);
    OPENSSL_cleanse(ipad, sizeof ipad);
    OPENSSL_cleanse(opad, sizeof opad);
    return ok ? 0 : crypto_fail();
}

/* HMAC of data[0..n) from the states of a key; ctx is scratch. */
static int hmac_run(const EVP_MD_CTX *inner, const EVP_MD_CTX *outer, EVP_MD_CTX *ctx,
                    const void *data, size_t n, unsigned char out[32]) {
    unsigned char h[32];
    int ok = EVP_MD_CTX_copy_ex(ctx, inner) && EVP_DigestUpdate(ctx, data, n) &&
             EVP_DigestFinal_ex(ctx, h, NULL) && EVP_MD_CTX_copy_ex(ctx, outer) &&
             EVP_DigestUpdate(ctx, h, 32) && EVP_DigestFinal_ex(ctx, out, NULL);
    return ok ? 0 : crypto_fail();
}

/* HMAC-SHA256 with a key used once (deriving the signing key). */
static int hmac_once(dsrt_s3_signer *s, const void *key, size_t klen, const char *data,
                     unsigned char out[32]) {
    int rc = hmac_key(s->md, key, klen, s->inner, s->outer);
    return rc ? rc : hmac_run(s->inner, s->outer, s->ctx, data, strlen(data), out);
}

void dsrt__s3_signer_free(dsrt_s3_signer *s) {
    if (!s) return;
    EVP_MD_CTX_free(s->inner);
    EVP_MD_CTX_free(s->outer);
    EVP_MD_CTX_free(s->ctx);
    EVP_MD_free(s->md);
    free(s);
}

static int signer_new(dsrt_s3_signer **out) {
    dsrt_s3_signer *s = dsrt__calloc(1, sizeof *s);
    if (!s) return -ENOMEM;
    s->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    s->inner = EVP_MD_CTX_new();
    s->outer = EVP_MD_CTX_new();
    s->ctx = EVP_MD_CTX_new();
    if (!s->md || !s->inner || !s->outer || !s->ctx) {
        dsrt__s3_signer_free(s);
        return dsrt__fail(DSRT_EREMOTE, "s3: OpenSSL has no SHA-256 (EVP_MD_fetch)");
    }
    *out = s;
    return 0;
}

/* The signature of canonical_request at amz_date, with s keyed for its day
 * (the key derived again when the day changed). */
static int sign_with(dsrt_s3_signer *s, const char *secret, const char *region,
                     const char *amz_date, const char *canonical, size_t canonical_len,
                     char sig[65]) {
    unsigned char h[32], k[32];
    char hex[65], sts[512];
    int rc = 0;
    if (memcmp(s->date8, amz_date, 8) != 0) {
        char date8[9], scope_key[160];
        memcpy(date8, amz_date, 8);
        date8[8] = '\0';
        s->date8[0] = '\0';
        snprintf(scope_key, sizeof scope_key, "AWS4%s", secret);
        rc = hmac_once(s, scope_key, strlen(scope_key), date8, k);
        OPENSSL_cleanse(scope_key, sizeof scope_key);
        if (rc == 0) rc = hmac_once(s, k, 32, region, k);
        if (rc == 0) rc = hmac_once(s, k, 32, "s3", k);
        if (rc == 0) rc = hmac_once(s, k, 32, "aws4_request", k);
        if (rc == 0) rc = hmac_key(s->md, k, 32, s->inner, s->outer);
        OPENSSL_cleanse(k, sizeof k);
        if (rc != 0) return rc;
        memcpy(s->date8, date8, sizeof date8);
    }
    if (!EVP_Digest(canonical, canonical_len, h, NULL, s->md, NULL)) return crypto_fail();
    to_hex(h, 32, hex);
    int n = snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%.8s/%s/s3/aws4_request\n%s", amz_date,
                     amz_date, region, hex);
    if ((rc = hmac_run(s->inner, s->outer, s->ctx, sts, (size_t)n, h)) != 0) return rc;
    to_hex(h, 32, sig);
    return 0;
}

int dsrt__s3_sign(const char *secret, const char *region, const char *date8, const char *amz_date,
                  const char *canonical_request, char sig[65]) {
    if (strncmp(date8, amz_date, 8) != 0)
        return dsrt__fail(DSRT_EOPTION, "s3: date %s is not the day of %s", date8, amz_date);
    dsrt_s3_signer *s;
    int rc = signer_new(&s);
    if (rc == 0)
        rc = sign_with(s, secret, region, amz_date, canonical_request, strlen(canonical_request),
                       sig);
    dsrt__s3_signer_free(s);
    return rc;
}

/* Whether bucket can be a host name label (virtual-host addressing). */
static int dns_bucket(const char *b, size_t n, int https) {
    if (n < 3 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        if (!(islower((unsigned char)ch) || isdigit((unsigned char)ch) || ch == '-' || ch == '.'))
            return 0;
        if (ch == '.' && https) return 0; /* the certificate covers one label only */
    }
    return b[0] != '-' && b[n - 1] != '-';
}

int dsrt__s3_request(dsrt_s3_config *c, const char *s3url, const char *query, const char *range,
                     time_t now, dsrt_strbuf *url, dsrt_strbuf *headers) {
    const char *bucket, *key;
    size_t blen;
    int rc;
    dsrt_strbuf host = {0}, path = {0}, canon = {0};
    if ((rc = dsrt__s3_split(s3url, &bucket, &blen, &key)) != 0) return rc;
    int https = c->scheme[4] == 's';
    int virt =
        c->addressing == DSRT_S3_ADDR_VIRTUAL ||
        (c->addressing == DSRT_S3_ADDR_AUTO && !c->custom && dns_bucket(bucket, blen, https));
    rc = -ENOMEM;
    if (virt) {
        if (dsrt__sb_add(&host, bucket, blen) || dsrt__sb_add(&host, ".", 1) ||
            dsrt__sb_add(&host, c->host, strlen(c->host)))
            goto out;
    } else if (dsrt__sb_add(&host, c->host, strlen(c->host))) {
        goto out;
    }
    if (dsrt__sb_add(&path, c->base, strlen(c->base))) goto out;
    if (!virt && (dsrt__sb_add(&path, "/", 1) || dsrt__sb_encode(&path, bucket, blen, 0))) goto out;
    if ((*key || virt) &&
        (dsrt__sb_add(&path, "/", 1) || dsrt__sb_encode(&path, key, strlen(key), 1)))
        goto out;
    if (!query) query = "";
    if (dsrt__sb_printf(url, "%s://%s%s%s%s", c->scheme, host.s, path.s, *query ? "?" : "", query))
        goto out;
    if (dsrt__sb_printf(headers, "Host: %s\n", host.s)) goto out;
    if (range && dsrt__sb_printf(headers, "Range: %s\n", range)) goto out;
    if (c->anonymous) {
        rc = 0;
        goto out;
    }

    struct tm tm;
    char amz_date[20], date8[9], sig[65];
    gmtime_r(&now, &tm);
    strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
    memcpy(date8, amz_date, 8);
    date8[8] = '\0';
    const char *payload = "UNSIGNED-PAYLOAD";
    if (dsrt__sb_printf(&canon, "GET\n%s\n%s\nhost:%s\n", path.s, query, host.s)) goto out;
    if (range && dsrt__sb_printf(&canon, "range:%s\n", range)) goto out;
    if (dsrt__sb_printf(&canon, "x-amz-content-sha256:%s\nx-amz-date:%s\n", payload, amz_date))
        goto out;
    if (c->token &&
        (dsrt__sb_add(&canon, "x-amz-security-token:", 21) ||
         dsrt__sb_add(&canon, c->token, strlen(c->token)) || dsrt__sb_add(&canon, "\n", 1)))
        goto out;
    const char *signed_headers =
        range ? (c->token ? "host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token"
                          : "host;range;x-amz-content-sha256;x-amz-date")
              : (c->token ? "host;x-amz-content-sha256;x-amz-date;x-amz-security-token"
                          : "host;x-amz-content-sha256;x-amz-date");
    if (dsrt__sb_printf(&canon, "\n%s\n%s", signed_headers, payload)) goto out;
    if (!c->signer && (rc = signer_new(&c->signer)) != 0) goto out;
    if ((rc = sign_with(c->signer, c->secret, c->region, amz_date, canon.s, canon.len, sig)) != 0)
        goto out;
    rc = -ENOMEM;
    if (dsrt__sb_printf(headers, "x-amz-content-sha256: %s\nx-amz-date: %s\n", payload, amz_date))
        goto out;
    if (c->token &&
        (dsrt__sb_add(headers, "x-amz-security-token: ", 22) ||
         dsrt__sb_add(headers, c->token, strlen(c->token)) || dsrt__sb_add(headers, "\n", 1)))
        goto out;
    if (dsrt__sb_printf(headers,
                        "Authorization: AWS4-HMAC-SHA256 Credential=%s/%s/%s/s3/aws4_request, "
                        "SignedHeaders=%s, Signature=%s\n",
                        c->key, date8, c->region, signed_headers, sig))
        goto out;
    rc = 0;
out:
    free(host.s);
    free(path.s);
    free(canon.s);
    return rc;
}

// ----------------------------------------------------------------------------
// XML: the few elements of S3's answers we read

/* Decodes XML character references and the five entities of text[0..n)
 * into out (which may be text itself: the result is never longer). */
static size_t xml_unescape(const char *text, size_t n, char *out) {
    static const struct {
        const char *name;
        char c;
    } ents[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (text[i] != '&') {
            out[o++] = text[i++];
            continue;
        }
        size_t k = 0;
        while (k < DSRT_ARRAY_SIZE(ents) &&
               (n - i - 1 < strlen(ents[k].name) ||
                memcmp(text + i + 1, ents[k].name, strlen(ents[k].name)) != 0))
            k++;
        if (k < DSRT_ARRAY_SIZE(ents)) {
            out[o++] = ents[k].c;
            i += 1 + strlen(ents[k].name);
            continue;
        }
        if (i + 2 < n && text[i + 1] == '#') {
            size_t j = i + 2;
            int hexa = text[j] == 'x';
            j += hexa;
            unsigned long cp = 0;
            while (j < n && isxdigit((unsigned char)text[j]) && cp < 0x110000)
                cp = cp * (hexa ? 16 : 10) +
                     (unsigned long)(isdigit((unsigned char)text[j])
                                         ? text[j] - '0'
                                         : (tolower((unsigned char)text[j]) - 'a' + 10)),
                j++;
            if (j < n && text[j] == ';' && cp < 0x110000) {
                /* UTF-8 of the code point: at most as long as "&#NN;". */
                if (cp < 0x80) {
                    out[o++] = (char)cp;
                } else if (cp < 0x800) {
                    out[o++] = (char)(0xC0 | (cp >> 6));
                    out[o++] = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    out[o++] = (char)(0xE0 | (cp >> 12));
                    out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    out[o++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    out[o++] = (char)(0xF0 | (cp >> 18));
                    out[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    out[o++] = (char)(0x80 | (cp & 0x3F));
                }
                i = j + 1;
                continue;
            }
        }
        out[o++] = text[i++];
    }
    return o;
}

/* The text of the first <tag>...</tag> in [p, end), or NULL. */
static const char *xml_find(const char *p, const char *end, const char *tag, size_t *len) {
    char open[64], close[64];
    int on = snprintf(open, sizeof open, "<%s>", tag),
        cn = snprintf(close, sizeof close, "</%s>", tag);
    const char *s = memmem(p, (size_t)(end - p), open, (size_t)on);
    if (!s) return NULL;
    s += on;
    const char *e = memmem(s, (size_t)(end - s), close, (size_t)cn);
    if (!e) return NULL;
    *len = (size_t)(e - s);
    return s;
}

/* Copies the unescaped text of <tag> into out (cap bytes); "" when absent. */
static void xml_text(const char *body, size_t n, const char *tag, char *out, size_t cap) {
    size_t len;
    const char *t = body ? xml_find(body, body + n, tag, &len) : NULL;
    out[0] = '\0';
    if (!t) return;
    len = DSRT_MIN(len, cap - 1);
    memcpy(out, t, len);
    out[xml_unescape(out, len, out)] = '\0';
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < ' ') *c = ' ';
}

// ----------------------------------------------------------------------------
// The store's answers

int dsrt__s3_token_expired(long status, const char *body, size_t body_len) {
    if (status != 400 && status != 403) return 0;
    char code[64];
    xml_text(body, body_len, "Code", code, sizeof code);
    return strcmp(code, "ExpiredToken") == 0 || strcmp(code, "TokenRefreshRequired") == 0 ||
           strcmp(code, "InvalidToken") == 0;
}

int dsrt__http_status_transient(long status, const char *body, size_t body_len) {
    if (status == 429 || status == 500 || status == 502 || status == 503 || status == 504 ||
        status == 408)
        return 1;
    char code[64];
    xml_text(body, body_len, "Code", code, sizeof code);
    return strcmp(code, "RequestTimeout") == 0 || strcmp(code, "SlowDown") == 0 ||
           strcmp(code, "InternalError") == 0 || strcmp(code, "ServiceUnavailable") == 0;
}

/* Masks every copy of secret (when it is one: a few bytes at least) in s. */
static void scrub(char *s, const char *secret) {
    size_t n = secret ? strlen(secret) : 0;
    if (n < 4) return;
    for (char *p = strstr(s, secret); p; p = strstr(p + 3, secret)) {
        memcpy(p, "***", 3);
        memmove(p + 3, p + n, strlen(p + n) + 1);
    }
}

/* "scheme://host" of a URL (its user information left out). */
static void url_origin(const char *url, char *out, size_t cap) {
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    const char *at = h, *e = h + strcspn(h, "/?#");
    for (const char *p = h; p < e; p++)
        if (*p == '@') at = p + 1;
    snprintf(out, cap, "%.*s%.*s", (int)(h - url), url, (int)(e - at), at);
}

int dsrt__s3_http_error(const char *display, long status, const char *body, size_t body_len,
                        const char *bucket_region, const dsrt_s3_config *c, int is_s3) {
    char code[64], msg[200], full[2048], region[64];
    xml_text(body, body_len, "Code", code, sizeof code);
    xml_text(body, body_len, "Message", full, sizeof full);
    xml_text(body, body_len, "Region", region, sizeof region);
    /* A store may echo the request: no key, secret or token of ours is
     * repeated (the rest of the message is redacted as every one is). */
    if (c) {
        scrub(full, c->token);
        scrub(full, c->secret);
        scrub(full, c->key);
    }
    size_t mn = strnlen(full, sizeof msg - 1);
    memcpy(msg, full, mn);
    msg[mn] = '\0';
    if (!region[0] && bucket_region) snprintf(region, sizeof region, "%s", bucket_region);
    char what[300];
    snprintf(what, sizeof what, "HTTP %ld%s%s%s%s", status, code[0] ? " " : "", code,
             msg[0] ? ": " : "", msg);
    const char *from = c && !c->anonymous ? c->source : "anonymous requests";
    const char *here = c ? c->region : "";
    if (status == 404 && (!code[0] || strcmp(code, "NoSuchKey") == 0))
        return dsrt__fail(-ENOENT, "%s: no such object (%s)", display, what);
    if (status == 404 && strcmp(code, "NoSuchBucket") == 0) {
        /* Where the request went: the endpoint of an s3:// URL, the server
         * of any other. */
        char origin[S3_ENDPOINT_MAX];
        if (is_s3 && c)
            snprintf(origin, sizeof origin, "%s://%s%s", c->scheme, c->host, c->base);
        else
            url_origin(display, origin, sizeof origin);
        return dsrt__fail(DSRT_EREMOTE, "%s: the bucket does not exist at %s (%s): check %s",
                          display, origin, what,
                          is_s3 ? "the bucket name and AWS_ENDPOINT_URL" : "the URL");
    }
    if (status == 416)
        return dsrt__fail(DSRT_ETRUNCATED, "%s: the range asked lies past the object's end (%s)",
                          display, what);
    if (!is_s3)
        return dsrt__fail(status == 404 || status == 410 ? -ENOENT : DSRT_EREMOTE, "%s: %s",
                          display, what);
    if (status == 301 || status == 307 || strcmp(code, "AuthorizationHeaderMalformed") == 0 ||
        strcmp(code, "PermanentRedirect") == 0 ||
        strcmp(code, "IllegalLocationConstraintException") == 0)
        return dsrt__fail(
            DSRT_EREMOTE,
            "%s: the bucket is in another region than %s%s%s (%s): set AWS_REGION%s%s", display,
            here, region[0] ? ": in " : "", region, what, region[0] ? "=" : "", region);
    if (strcmp(code, "InvalidAccessKeyId") == 0)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: the store does not know the access key (%s; credentials from %s): "
                          "check AWS_ACCESS_KEY_ID or the profile, and AWS_ENDPOINT_URL",
                          display, what, from);
    if (strcmp(code, "SignatureDoesNotMatch") == 0)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: the request's signature was refused (%s; credentials from %s): "
                          "check AWS_SECRET_ACCESS_KEY or the profile's secret, and the region "
                          "(%s)",
                          display, what, from, here);
    if (strcmp(code, "RequestTimeTooSkewed") == 0)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: this machine's clock differs from the store's by too much (%s): "
                          "set the clock (NTP)",
                          display, what);
    if (strcmp(code, "ExpiredToken") == 0 || strcmp(code, "InvalidToken") == 0 ||
        strcmp(code, "TokenRefreshRequired") == 0)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: the session token was refused (%s; credentials from %s, read "
                          "again): renew the temporary credentials (AWS_SESSION_TOKEN, or the "
                          "profile's aws_session_token)",
                          display, what, from);
    if (status == 403 || status == 401)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: access denied (%s; credentials from %s): check that they may read "
                          "this bucket (s3:GetObject, s3:ListBucket, the bucket policy), and the "
                          "clock and region (%s)",
                          display, what, from, here);
    return dsrt__fail(DSRT_EREMOTE, "%s: %s", display, what);
}

// ----------------------------------------------------------------------------
// A folder in a bucket

typedef struct {
    const dsrt_datastore_options *o;
    dsrt_index *ix;
    dsrt_extensions ext;
    char *root;                  /* "s3://bucket/prefix" without a trailing '/' (in the arena) */
    size_t root_len, prefix_len; /* prefix_len: of the key prefix, '/' included */
    const char *root_base;       /* the root's last component: parent-label of root files */

    dsrt_folder_entry *files;
    size_t n_files, cap_files;
    /* Names of classes (folder-name labels) or folders (parent labels), in
     * order of first sight; entries' groups index them until sorted. */
    const char **names;
    size_t n_names, cap_names;
    uint32_t *slots; /* open-addressing set over names: index + 1 */
    size_t nslots;
    size_t *name_files; /* (n_names) files under each */
    size_t root_files, odd_keys;
    char *odd_first; /* the smallest key with an empty folder name */
} lister;

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return dsrt__mix64(h);
}

/* The id of name s[0..n), added when new. */
static int name_id(lister *l, const char *s, size_t n, int32_t *id) {
    if ((l->n_names + 1) * 2 > l->nslots) {
        size_t ns = l->nslots ? l->nslots * 2 : 256;
        uint32_t *slots = dsrt__calloc(ns, sizeof *slots);
        if (!slots) return -ENOMEM;
        for (size_t i = 0; i < l->n_names; i++) {
            size_t at = name_hash(l->names[i], strlen(l->names[i])) & (ns - 1);
            while (slots[at]) at = (at + 1) & (ns - 1);
            slots[at] = (uint32_t)i + 1;
        }
        free(l->slots);
        l->slots = slots;
        l->nslots = ns;
    }
    size_t at = name_hash(s, n) & (l->nslots - 1);
    for (; l->slots[at]; at = (at + 1) & (l->nslots - 1)) {
        const char *e = l->names[l->slots[at] - 1];
        if (strncmp(e, s, n) == 0 && e[n] == '\0') {
            *id = (int32_t)(l->slots[at] - 1);
            return 0;
        }
    }
    void *names = l->names;
    size_t cap = l->cap_names;
    if (dsrt__grow(&names, &cap, l->n_names + 1, sizeof *l->names) != 0) return -ENOMEM;
    l->names = names;
    void *counts = l->name_files;
    size_t cap2 = l->cap_names;
    if (dsrt__grow(&counts, &cap2, l->n_names + 1, sizeof *l->name_files) != 0) return -ENOMEM;
    l->name_files = counts;
    l->cap_names = DSRT_MIN(cap, cap2);
    char *copy = dsrt_arena_strndup(&l->ix->arena, s, n);
    if (!copy) return -ENOMEM;
    l->names[l->n_names] = copy;
    l->name_files[l->n_names] = 0;
    l->slots[at] = (uint32_t)l->n_names + 1;
    *id = (int32_t)l->n_names++;
    return 0;
}

static int add_file(lister *l, const char *rel, size_t rel_len, size_t dir_rel_len, int32_t group) {
    void *buf = l->files;
    if (dsrt__grow(&buf, &l->cap_files, l->n_files + 1, sizeof *l->files) != 0) return -ENOMEM;
    l->files = buf;
    char *p = dsrt_arena_alloc(&l->ix->arena, l->root_len + 1 + rel_len + 1, 1);
    if (!p) return -ENOMEM;
    memcpy(p, l->root, l->root_len);
    p[l->root_len] = '/';
    memcpy(p + l->root_len + 1, rel, rel_len);
    p[l->root_len + 1 + rel_len] = '\0';
    l->files[l->n_files++] = (dsrt_folder_entry){
        .path = p,
        .dir_len = (uint32_t)(dir_rel_len ? l->root_len + 1 + dir_rel_len : l->root_len),
        .group = group};
    if (group >= 0 && (size_t)group < l->n_names) l->name_files[group]++;
    return 0;
}

/* Whether a[0..n) comes before the string b in S3's order of keys (bytes). */
static int key_less(const char *a, size_t n, const char *b) {
    size_t bn = strlen(b);
    int c = memcmp(a, b, DSRT_MIN(n, bn));
    return c < 0 || (c == 0 && n < bn);
}

/* One key of the listing, relative to the prefix: rel[0..n). */
static int take_key(lister *l, const char *rel, size_t n) {
    if (n == 0) return 0; /* the prefix's own folder marker */
    const char *last = NULL;
    size_t slashes = 0;
    for (size_t i = 0; i < n; i++)
        if (rel[i] == '/') {
            if (i == 0 || rel[i - 1] == '/') {
                /* Named at the end: the smallest, whatever the order of pages. */
                l->odd_keys++;
                if (!l->odd_first || key_less(rel, n, l->odd_first)) {
                    char *c = dsrt__malloc(n + 1);
                    if (!c) return -ENOMEM;
                    memcpy(c, rel, n);
                    c[n] = '\0';
                    free(l->odd_first);
                    l->odd_first = c;
                }
                return 0;
            }
            slashes++;
            last = rel + i;
        }
    int marker = rel[n - 1] == '/'; /* "cls/" made by a console or a sync of an empty folder */
    const char *name = last ? last + 1 : rel;
    size_t dir_len = last ? (size_t)(last - rel) : 0;
    int32_t g = 0;
    int rc;
    int sub = l->o->include_subfolders;
    switch (l->o->label_source) {
    case DSRT_LABEL_FOLDER_NAMES: {
        if (slashes == 0) {
            /* Image files directly in the root: not in a class. */
            l->root_files += dsrt__extensions_match_n(&l->ext, rel, n);
            return 0;
        }
        const char *cls_end = memchr(rel, '/', n);
        if ((rc = name_id(l, rel, (size_t)(cls_end - rel), &g)) != 0) return rc;
        if (marker || (!sub && slashes > 1)) return 0;
        break;
    }
    case DSRT_LABEL_PARENT_FOLDER: {
        if (marker || (!sub && slashes > 0)) return 0;
        const char *base = last ? (const char *)memrchr(rel, '/', dir_len) : NULL;
        const char *folder = last ? (base ? base + 1 : rel) : l->root_base;
        size_t fl = last ? (size_t)(last - folder) : strlen(l->root_base);
        /* The class is created only when a file of it is taken. */
        if (!dsrt__extensions_match_n(&l->ext, name, (size_t)(rel + n - name))) return 0;
        if ((rc = name_id(l, folder, fl, &g)) != 0) return rc;
        return add_file(l, rel, n, dir_len, g);
    }
    default:
        if (marker || (!sub && slashes > 0)) return 0;
        break;
    }
    if (!dsrt__extensions_match_n(&l->ext, name, (size_t)(rel + n - name))) return 0;
    return add_file(l, rel, n, dir_len, g);
}

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
    size_t k = xml_unescape(text, n, scratch->s);
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
    xml_text(body, len, "EncodingType", enc, sizeof enc);
    int url_encoded = strcmp(enc, "url") == 0;
    /* Keys (<Contents><Key>), then sub-prefixes (<CommonPrefixes><Prefix>). */
    static const char *const blocks[2][2] = {{"Contents", "Key"}, {"CommonPrefixes", "Prefix"}};
    for (int is_prefix = 0; is_prefix < 2; is_prefix++) {
        const char *p = body, *b, *t;
        size_t bn, n;
        while ((b = xml_find(p, end, blocks[is_prefix][0], &bn)) != NULL) {
            p = b + bn;
            if (!(t = xml_find(b, b + bn, blocks[is_prefix][1], &n))) continue;
            /* An object's size: the <Size> of its <Contents>. */
            uint64_t size = 0;
            size_t sl;
            const char *sz = is_prefix ? NULL : xml_find(b, b + bn, "Size", &sl);
            for (size_t i = 0; sz && i < sl && i < 19 && isdigit((unsigned char)sz[i]); i++)
                size = size * 10 + (uint64_t)(sz[i] - '0');
            int rc = list_text(scratch, t, n, url_encoded);
            if (rc == 0) rc = on_entry(ud, scratch->s, scratch->len, is_prefix, size);
            if (rc != 0) return rc;
        }
    }
    char truncated[8];
    xml_text(body, len, "IsTruncated", truncated, sizeof truncated);
    token->len = 0;
    if (token->s) token->s[0] = '\0';
    if (strcmp(truncated, "true") != 0) return 0;
    size_t n;
    const char *t = xml_find(body, end, "NextContinuationToken", &n);
    if (!t || n == 0)
        return dsrt__fail(DSRT_EREMOTE, "a truncated listing page without a continuation token");
    if (dsrt__sb_add(token, t, n) != 0) return -ENOMEM;
    token->len = xml_unescape(token->s, token->len, token->s);
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
    char ep[S3_ENDPOINT_MAX];
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

static int flat_entry(void *ud, const char *s, size_t n, int is_prefix, uint64_t size) {
    flat_list *f = ud;
    if (is_prefix || memchr(s, '\0', n)) return 0;
    return f->each(f->ctx, s, n, size);
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
// A folder in a bucket, from its listing

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Classes from the names seen: sorted, each entry's group renumbered; with
 * folder-name labels the empty ones are reported (and dropped if asked). */
static int finish_classes(lister *l) {
    size_t n = l->n_names;
    int rc = -ENOMEM;
    const char **sorted = dsrt__malloc((n ? n : 1) * sizeof *sorted);
    int32_t *renum = dsrt__malloc((n ? n : 1) * sizeof *renum);
    if (!sorted || !renum) goto out;
    if (n) memcpy(sorted, l->names, n * sizeof *sorted);
    if (n > 1) qsort(sorted, n, sizeof *sorted, cmp_str);
    int folders = l->o->label_source == DSRT_LABEL_FOLDER_NAMES;
    size_t kept = 0;
    for (size_t c = 0; c < n; c++) {
        int32_t id;
        name_id(l, sorted[c], strlen(sorted[c]), &id); /* present: never adds */
        if (folders && l->name_files[id] == 0) {
            dsrt__index_warn(l->ix, "%s/%s: class folder holds no image file%s", l->root, sorted[c],
                             l->o->drop_empty_classes ? ": not a class" : "");
            if (l->o->drop_empty_classes) {
                renum[id] = -1;
                continue;
            }
        }
        renum[id] = (int32_t)kept;
        sorted[kept++] = sorted[c];
    }
    for (size_t i = 0; i < l->n_files; i++) l->files[i].group = renum[l->files[i].group];
    rc = dsrt__index_set_classes(l->ix, sorted, kept);
out:
    free(sorted);
    free(renum);
    return rc;
}

/*
 * Listing a prefix concurrently. The first listing asks for the prefix with
 * delimiter '/': it answers the keys right under the prefix and each
 * sub-prefix ("prefix/cat/") once. Each sub-prefix is then listed whole
 * (without delimiter) as a job of its own, all of them in flight together
 * on one multi handle, each job following its own continuation tokens. The
 * keys of the prefix are exactly the first listing's keys plus every job's,
 * so the index is the one a single listing gives: the order of arrival
 * changes nothing once the entries are sorted. Only with sub-folders left
 * out and labels not from class folders do the sub-prefixes hold nothing
 * the index takes, and they are not listed.
 */
#define S3_LIST_DEPTH 64 /* listing requests in flight */

typedef struct {
    char *prefix; /* the key prefix this job lists (decoded) */
    dsrt_strbuf token, query;
    token_watch watch; /* the tokens seen */
    int delimited;     /* the prefix's own listing, with delimiter '/' */
} list_job;

typedef struct {
    lister *l;
    list_job *jobs;
    size_t n_jobs, cap_jobs;
    size_t *ready; /* jobs with a page to ask for, FIFO */
    size_t ready_head, ready_len, cap_ready;
    int spawn; /* sub-prefixes become jobs */
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

/* One entry of a page: a key goes to the folder rules, a sub-prefix (of
 * the first listing) becomes a job. */
static int take_entry(void *ud, const char *s, size_t n, int is_prefix, uint64_t size) {
    (void)size;
    list_run *r = ud;
    lister *l = r->l;
    if (n < l->prefix_len || memcmp(s, r->jobs[0].prefix, l->prefix_len) != 0)
        return 0; /* not under the prefix: cannot happen */
    if (memchr(s, '\0', n)) return 0;
    if (is_prefix) return r->spawn ? add_job(r, s, n, 0) : 0;
    return take_key(l, s + l->prefix_len, n - l->prefix_len);
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

/* Lists every key under the lister's prefix into it. */
static int list_all(lister *l, const char *bucket, size_t blen, const char *prefix,
                    size_t prefix_len) {
    list_run r = {.l = l};
    dsrt_http *h = NULL;
    dsrt_strbuf scratch = {0}, next = {0};
    char list_url[300];
    snprintf(list_url, sizeof list_url, "s3://%.*s/", (int)blen, bucket);
    const dsrt_datastore_options *o = l->o;
    r.spawn = o->include_subfolders || o->label_source == DSRT_LABEL_FOLDER_NAMES;
    int rc = dsrt__http_create_opening(&h, o, S3_LIST_DEPTH);
    unsigned depth = 0;
    if (rc == 0) {
        dsrt_remote_options ro;
        dsrt__remote_opening_options(o, &ro);
        depth = DSRT_MIN(ro.depth, (unsigned)S3_LIST_DEPTH);
        rc = add_job(&r, prefix, prefix_len, 1);
    }
    while (rc == 0 && (r.ready_len > 0 || dsrt__http_in_flight(h) > 0)) {
        while (r.ready_len > 0 && dsrt__http_in_flight(h) < depth) {
            size_t id = r.ready[r.ready_head++];
            r.ready_len--;
            list_job *j = &r.jobs[id];
            if ((rc = job_query(j, &j->query)) != 0) goto out;
            if ((rc = dsrt__http_submit_whole(h, list_url, j->query.s, S3_LIST_MAX_PAGE, id)) != 0)
                goto out;
        }
        dsrt_read_result res;
        if ((rc = dsrt__http_collect(h, &res, 1, -1)) < 0) {
            list_fail(h, rc, l->root, NULL);
            goto out;
        }
        if (rc == 0) continue;
        list_job *j = &r.jobs[res.tag];
        if (res.status != 0) {
            free(res.buf);
            rc = res.status;
            if (rc == -ENOENT)
                rc = dsrt__fail(DSRT_EREMOTE, "datastore: %s: the store answered 404 to a listing",
                                l->root);
            else
                dsrt__fail_prefix(rc, "datastore: listing %s", l->root);
            goto out;
        }
        /* take_entry may add jobs (and move them): the token comes apart. */
        rc = dsrt__s3_list_page((const char *)res.buf, res.size, &scratch, &next, take_entry, &r);
        free(res.buf);
        j = &r.jobs[res.tag];
        if (rc != 0) {
            list_fail(h, rc, l->root, j->prefix);
            goto out;
        }
        dsrt_strbuf t = j->token;
        j->token = next;
        next = t;
        if (j->token.len > 0) {
            if ((rc = token_repeats(&j->watch, &j->token)) != 0) {
                if (rc == 1) rc = token_again(h, &j->watch, l->root, j->prefix);
                goto out;
            }
            if ((rc = push_ready(&r, res.tag)) != 0) goto out;
        } else {
            free(j->query.s);
            free(j->token.s);
            j->query = j->token = (dsrt_strbuf){0};
        }
    }
out:
    dsrt__http_cancel(h);
    dsrt__http_destroy(h);
    list_run_free(&r);
    free(scratch.s);
    free(next.s);
    return rc;
}

int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    lister l = {.o = o, .ix = ix};
    dsrt_strbuf prefix = {0};
    const char *bucket, *key;
    size_t blen;
    int rc;
    ix->remote = 1;
    if ((rc = dsrt__extensions_parse(&l.ext, o->extensions)) != 0) return rc;
    if ((rc = dsrt__s3_split(url, &bucket, &blen, &key)) != 0) return rc;

    /* "s3://b/p/" and "s3://b/p" index the same folder, as "data/" and "data". */
    size_t klen = strlen(key);
    while (klen > 0 && key[klen - 1] == '/') klen--;
    rc = -ENOMEM;
    if (klen && (dsrt__sb_add(&prefix, key, klen) || dsrt__sb_add(&prefix, "/", 1))) goto out;
    l.root_len = 5 + blen + (klen ? 1 + klen : 0);
    if (!(l.root = dsrt_arena_strndup(&ix->arena, url, l.root_len))) goto out;
    l.prefix_len = prefix.len;
    const char *base = strrchr(l.root + 5, '/');
    l.root_base = base ? base + 1 : l.root + 5;

    if ((rc = list_all(&l, bucket, blen, prefix.s ? prefix.s : "", prefix.len)) != 0) goto out;

    if (l.odd_keys > 0)
        dsrt__index_warn(
            ix, "%s/%s: a key with an empty folder name has no folder equivalent, left out", l.root,
            l.odd_first);
    if (l.odd_keys > 1)
        dsrt__index_warn(ix, "%s: %zu keys with empty folder names left out", l.root, l.odd_keys);
    if (l.root_files)
        dsrt__index_warn(ix,
                         "%s: %zu image file%s directly in the root ignored (not inside a class "
                         "folder)",
                         l.root, l.root_files, l.root_files > 1 ? "s" : "");
    if (o->label_source == DSRT_LABEL_NONE) {
        const char *none = "";
        rc = dsrt__index_set_classes(ix, &none, 1);
    } else {
        rc = finish_classes(&l);
    }
    if (rc != 0) goto out;
    dsrt__folder_sort(l.files, l.n_files, o->label_source != DSRT_LABEL_NONE);
    rc = dsrt__folder_fill(ix, l.files, l.n_files);
    if (rc == 0 && l.n_files == 0 && l.n_names == 0)
        rc = dsrt__fail(DSRT_EEMPTY,
                        "datastore: %s: no object under this prefix (check the bucket and prefix, "
                        "and that the credentials may list it)",
                        l.root);
out:
    free(prefix.s);
    free(l.files);
    free(l.names);
    free(l.slots);
    free(l.name_files);
    free(l.odd_first);
    return rc;
}

// ----------------------------------------------------------------------------
// Manifests at a URL, and single objects

int dsrt__remote_read_whole(const char *url, size_t max, uint8_t **out, size_t *len) {
    dsrt_http *h = NULL;
    dsrt_remote_options ro = dsrt_reader_defaults().remote;
    ro.depth = 1;
    int rc = dsrt__http_create(&h, &ro);
    if (rc == 0) rc = dsrt__http_fetch(h, url, NULL, max, out, len);
    dsrt__http_destroy(h);
    return rc;
}

int dsrt__remote_manifest_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    uint8_t *text = NULL;
    size_t len;
    ix->remote = 1;
    dsrt_http *h = NULL;
    int rc = dsrt__http_create_opening(&h, o, 1);
    if (rc == 0) rc = dsrt__http_fetch(h, url, NULL, (size_t)4 << 30, &text, &len);
    dsrt__http_destroy(h);
    if (rc != 0) return dsrt__fail_prefix(rc, "manifest");
    /* Relative paths are relative to the manifest's "folder": the URL up to
     * its last '/' (query left out). */
    char *dir = dsrt__strdup(url);
    if (!dir) {
        free(text);
        return -ENOMEM;
    }
    char *q = strchr(dir, '?');
    if (q) *q = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    char display[512];
    dsrt_text_redact(url, display, sizeof display);
    rc = dsrt__manifest_parse(ix, (const char *)text, len, display, dir,
                              o ? o->manifest_header : -1);
    free(dir);
    free(text);
    return rc;
}
