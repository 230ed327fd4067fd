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
 * Listing: ListObjectsV2 pages of up to 1000 keys, followed by their
 * continuation tokens; each page is parsed and dropped, and every key that
 * the folder rules take goes straight into the index's arena as a URL, so
 * memory grows with the index only. The folder rules are the local
 * folder's (labels from the first sub-prefix, from the prefix holding the
 * object, or none; extensions; sub-folders or not; empty class folders; the
 * same sort), so a bucket holding a copy of a folder gives the same index.
 * Keys with an empty path component ("a//b.jpg") have no folder equivalent
 * and are left out with a warning.
 */
#include "datastore/remote.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define S3_LIST_MAX_PAGE ((size_t)64 << 20) /* largest listing page we accept */

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

void dsrt__url_display(const char *url, char *out, size_t cap) {
    const char *scheme_end = strstr(url, "://");
    const char *host = scheme_end ? scheme_end + 3 : url;
    const char *slash = strchr(host, '/');
    const char *at = memchr(host, '@', slash ? (size_t)(slash - host) : strlen(host));
    const char *q = strchr(url, '?');
    size_t head = (size_t)(host - url);
    const char *rest = at ? at + 1 : host;
    size_t rest_len = q && q > rest ? (size_t)(q - rest) : strlen(rest);
    snprintf(out, cap, "%.*s%.*s%s", (int)head, url, (int)rest_len, rest, q ? "?..." : "");
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

/* Looks up key in section `section` of an AWS INI file (sub is a nested
 * sub-section such as "s3", or NULL). Returns 1 and the value in out, 0
 * when absent; *found_section says whether the section exists. */
static int ini_get(const char *text, const char *section, const char *sub, const char *key,
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
            int have_key = ini_get(files[f], sections[f], NULL, "aws_access_key_id", c->key,
                                   sizeof c->key, found[f]);
            int have_secret = ini_get(files[f], sections[f], NULL, "aws_secret_access_key",
                                      c->secret, sizeof c->secret, NULL);
            if (have_key != have_secret) {
                rc = dsrt__fail(DSRT_EOPTION, "s3: %s: profile [%s] has %s but not %s", paths[f],
                                sections[f],
                                have_key ? "aws_access_key_id" : "aws_secret_access_key",
                                have_key ? "aws_secret_access_key" : "aws_access_key_id");
                goto out;
            }
            if (have_key) {
                if (ini_get(files[f], sections[f], NULL, "aws_session_token", v, sizeof v, NULL) &&
                    !(c->token = dsrt__strdup(v)))
                    goto nomem;
                snprintf(c->source, sizeof c->source, "%.60s profile %.30s",
                         f == 0 ? "the credentials file" : "the config file", profile);
            }
        }
        if (conf && !in_conf) ini_get(conf, conf_section, NULL, "region", v, sizeof v, &in_conf);
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
    else if (conf && ini_get(conf, conf_section, NULL, "region", v, sizeof v, NULL))
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
    } else if (conf && (ini_get(conf, conf_section, "s3", "endpoint_url", v, sizeof v, NULL) ||
                        ini_get(conf, conf_section, NULL, "endpoint_url", v, sizeof v, NULL))) {
        if ((rc = set_endpoint(c, v, conf_path)) != 0) goto out;
    } else {
        snprintf(c->scheme, sizeof c->scheme, "https");
        snprintf(c->host, sizeof c->host, "s3.%s.amazonaws.com", c->region);
    }

    /* Addressing. */
    const char *a = getenv("DSRT_S3_ADDRESSING");
    if (!(a && *a) && conf &&
        ini_get(conf, conf_section, "s3", "addressing_style", v, sizeof v, NULL))
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
    if (c->token) {
        memset(c->token, 0, strlen(c->token));
        free(c->token);
    }
    memset(c, 0, sizeof *c);
}

// ----------------------------------------------------------------------------
// Signature Version 4

static void to_hex(const unsigned char *d, size_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hmac(const void *key, size_t klen, const char *data, unsigned char out[32]) {
    size_t outlen = 0;
    if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, klen, (const unsigned char *)data,
                   strlen(data), out, 32, &outlen) ||
        outlen != 32)
        return dsrt__fail(DSRT_EREMOTE, "s3: HMAC-SHA256 failed in OpenSSL");
    return 0;
}

int dsrt__s3_sign(const char *secret, const char *region, const char *date8, const char *amz_date,
                  const char *canonical_request, char sig[65]) {
    unsigned char h[32], k[32];
    char hex[65], scope_key[160], sts[512];
    SHA256((const unsigned char *)canonical_request, strlen(canonical_request), h);
    to_hex(h, 32, hex);
    snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s/%s/s3/aws4_request\n%s", amz_date, date8,
             region, hex);
    snprintf(scope_key, sizeof scope_key, "AWS4%s", secret);
    int rc = hmac(scope_key, strlen(scope_key), date8, k);
    memset(scope_key, 0, sizeof scope_key);
    if (rc == 0) rc = hmac(k, 32, region, k);
    if (rc == 0) rc = hmac(k, 32, "s3", k);
    if (rc == 0) rc = hmac(k, 32, "aws4_request", k);
    if (rc == 0) rc = hmac(k, 32, sts, h);
    memset(k, 0, sizeof k);
    if (rc == 0) to_hex(h, 32, sig);
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

int dsrt__s3_request(const dsrt_s3_config *c, const char *s3url, const char *query,
                     const char *range, time_t now, dsrt_strbuf *url, dsrt_strbuf *headers) {
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
    if ((rc = dsrt__s3_sign(c->secret, c->region, date8, amz_date, canon.s, sig)) != 0) goto out;
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

int dsrt__http_status_transient(long status, const char *body, size_t body_len) {
    if (status == 429 || status == 500 || status == 502 || status == 503 || status == 504 ||
        status == 408)
        return 1;
    char code[64];
    xml_text(body, body_len, "Code", code, sizeof code);
    return strcmp(code, "RequestTimeout") == 0 || strcmp(code, "SlowDown") == 0 ||
           strcmp(code, "InternalError") == 0 || strcmp(code, "ServiceUnavailable") == 0;
}

int dsrt__s3_http_error(const char *display, long status, const char *body, size_t body_len,
                        const char *bucket_region, const dsrt_s3_config *c, int is_s3) {
    char code[64], msg[200], region[64];
    xml_text(body, body_len, "Code", code, sizeof code);
    xml_text(body, body_len, "Message", msg, sizeof msg);
    xml_text(body, body_len, "Region", region, sizeof region);
    if (!region[0] && bucket_region) snprintf(region, sizeof region, "%s", bucket_region);
    char what[300];
    snprintf(what, sizeof what, "HTTP %ld%s%s%s%s", status, code[0] ? " " : "", code,
             msg[0] ? ": " : "", msg);
    const char *from = c && !c->anonymous ? c->source : "anonymous requests";
    const char *here = c ? c->region : "";
    if (status == 404 && (!code[0] || strcmp(code, "NoSuchKey") == 0))
        return dsrt__fail(-ENOENT, "%s: no such object (%s)", display, what);
    if (status == 404 && strcmp(code, "NoSuchBucket") == 0)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: the bucket does not exist at %s://%s (%s): check the bucket name "
                          "and AWS_ENDPOINT_URL",
                          display, c ? c->scheme : "https", c ? c->host : "?", what);
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
                          "%s: the session token was refused (%s; credentials from %s): renew the "
                          "temporary credentials (AWS_SESSION_TOKEN)",
                          display, what, from);
    if (status == 403 || status == 401)
        return dsrt__fail(DSRT_EREMOTE,
                          "%s: access denied (%s; credentials from %s): check that they may read "
                          "this bucket (s3:GetObject, s3:ListBucket, the bucket policy), and the "
                          "clock and region (%s)",
                          display, what, from, here);
    if (status == 416)
        return dsrt__fail(DSRT_ETRUNCATED, "%s: the range asked lies past the object's end (%s)",
                          display, what);
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
    char *scratch;
    size_t scratch_cap;
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

/* One key of the listing, relative to the prefix: rel[0..n). */
static int take_key(lister *l, const char *rel, size_t n) {
    if (n == 0) return 0; /* the prefix's own folder marker */
    const char *last = NULL;
    size_t slashes = 0;
    for (size_t i = 0; i < n; i++)
        if (rel[i] == '/') {
            if (i == 0 || rel[i - 1] == '/') {
                if (l->odd_keys++ == 0)
                    dsrt__index_warn(l->ix,
                                     "%s/%.*s: a key with an empty folder name has no folder "
                                     "equivalent, left out",
                                     l->root, (int)n, rel);
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

/* Decodes %XX escapes in place; returns the new length. */
static size_t percent_decode(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n + 0 && isxdigit((unsigned char)s[i + 1]) &&
            isxdigit((unsigned char)s[i + 2])) {
            char h[3] = {s[i + 1], s[i + 2], '\0'};
            s[o++] = (char)strtol(h, NULL, 16);
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

/* Takes every key of one ListObjectsV2 page; sets *token to the next
 * page's continuation token ("" on the last page). */
static int take_page(lister *l, const char *body, size_t len, dsrt_strbuf *token) {
    const char *end = body + len, *p = body;
    size_t n;
    char enc[16];
    xml_text(body, len, "EncodingType", enc, sizeof enc);
    int url_encoded = strcmp(enc, "url") == 0;
    const char *t;
    while ((t = xml_find(p, end, "Key", &n)) != NULL) {
        p = t + n;
        void *buf = l->scratch;
        if (dsrt__grow(&buf, &l->scratch_cap, n + 1, 1) != 0) return -ENOMEM;
        l->scratch = buf;
        size_t k = xml_unescape(t, n, l->scratch);
        if (url_encoded) k = percent_decode(l->scratch, k);
        l->scratch[k] = '\0';
        if (k < l->prefix_len) continue; /* not under the prefix: cannot happen */
        if (memchr(l->scratch, '\0', k)) continue;
        int rc = take_key(l, l->scratch + l->prefix_len, k - l->prefix_len);
        if (rc != 0) return rc;
    }
    char truncated[8];
    xml_text(body, len, "IsTruncated", truncated, sizeof truncated);
    token->len = 0;
    if (token->s) token->s[0] = '\0';
    if (strcmp(truncated, "true") != 0) return 0;
    t = xml_find(body, end, "NextContinuationToken", &n);
    if (!t || n == 0)
        return dsrt__fail(DSRT_EREMOTE,
                          "s3: %s: a truncated listing page without a continuation token", l->root);
    if (dsrt__sb_add(token, t, n) != 0) return -ENOMEM;
    token->len = xml_unescape(token->s, token->len, token->s);
    token->s[token->len] = '\0';
    return 0;
}

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
    memcpy(sorted, l->names, n * sizeof *sorted);
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

int dsrt__s3_folder_load(dsrt_index *ix, const char *url, const dsrt_datastore_options *o) {
    lister l = {.o = o, .ix = ix};
    dsrt_http *h = NULL;
    dsrt_strbuf query = {0}, token = {0}, prefix = {0};
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

    dsrt_remote_options ro = dsrt_reader_defaults().remote;
    ro.depth = 1;
    if ((rc = dsrt__http_create(&h, &ro)) != 0) goto out;
    char list_url[300];
    snprintf(list_url, sizeof list_url, "s3://%.*s/", (int)blen, bucket);
    do {
        /* Parameters in canonical (sorted) order, values encoded. */
        query.len = 0;
        rc = -ENOMEM;
        if (token.len &&
            (dsrt__sb_add(&query, "continuation-token=", 19) ||
             dsrt__sb_encode(&query, token.s, token.len, 0) || dsrt__sb_add(&query, "&", 1)))
            goto out;
        if (dsrt__sb_add(&query, "list-type=2&max-keys=1000&prefix=", 33) ||
            dsrt__sb_encode(&query, prefix.s ? prefix.s : "", prefix.len, 0))
            goto out;
        uint8_t *page;
        size_t len;
        if ((rc = dsrt__http_fetch(h, list_url, query.s, S3_LIST_MAX_PAGE, &page, &len)) != 0) {
            if (rc == -ENOENT)
                rc = dsrt__fail(DSRT_EREMOTE, "datastore: %s: the store answered 404 to a listing",
                                l.root);
            else
                dsrt__fail_prefix(rc, "datastore: listing %s", l.root);
            goto out;
        }
        rc = take_page(&l, (const char *)page, len, &token);
        free(page);
        if (rc != 0) goto out;
    } while (token.len > 0);

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
    dsrt__http_destroy(h);
    free(query.s);
    free(token.s);
    free(prefix.s);
    free(l.files);
    free(l.names);
    free(l.slots);
    free(l.name_files);
    free(l.scratch);
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
    uint8_t *text;
    size_t len;
    ix->remote = 1;
    int rc = dsrt__remote_read_whole(url, (size_t)4 << 30, &text, &len);
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
    dsrt__url_display(url, display, sizeof display);
    rc = dsrt__manifest_parse(ix, (const char *)text, len, display, dir,
                              o ? o->manifest_header : -1);
    free(dir);
    free(text);
    return rc;
}
