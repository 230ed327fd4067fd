/*
 * What dsrt knows of S3 besides signing and listing: where a bucket lives
 * (endpoint, region, path-style or virtual-host addressing), who asks
 * (credentials as the AWS tools find them), and what the store's error
 * answers mean. Signing is in sigv4.c, listings in s3_list.c.
 */
#include "datastore/bytes/s3.h"

#include <ctype.h>
#include <dsrt/datastore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* The AWS files and the profile a configuration is read from. */
typedef struct {
    const char *profile;
    int named; /* the profile was named (AWS_PROFILE), not "default" */
    char cred_path[1024], conf_path[1024];
    char *creds, *conf; /* the files' text, or NULL */
    char conf_section[160];
} aws_files;

/* Credentials: the environment's, else the profile's in the credentials
 * file, else in the config file. */
static int load_credentials(dsrt_s3_config *c, aws_files *a) {
    char v[1024];
    int in_creds = 0, in_conf = 0;
    const char *ek = getenv("AWS_ACCESS_KEY_ID"), *es = getenv("AWS_SECRET_ACCESS_KEY");
    if ((ek && *ek) || (es && *es)) {
        if (!(ek && *ek) || !(es && *es))
            return dsrt__fail(DSRT_EOPTION, "s3: %s is set but %s is not",
                              ek && *ek ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                              ek && *ek ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
        snprintf(c->key, sizeof c->key, "%s", ek);
        snprintf(c->secret, sizeof c->secret, "%s", es);
        const char *t = getenv("AWS_SESSION_TOKEN");
        if (t && *t && !(c->token = dsrt__strdup(t))) return -ENOMEM;
        snprintf(c->source, sizeof c->source, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
        return 0;
    }
    const char *files[2] = {a->creds, a->conf};
    const char *sections[2] = {a->profile, a->conf_section};
    const char *paths[2] = {a->cred_path, a->conf_path};
    int *found[2] = {&in_creds, &in_conf};
    for (int f = 0; f < 2 && !c->key[0]; f++) {
        if (!files[f]) continue;
        int have_key = dsrt__aws_ini_get(files[f], sections[f], NULL, "aws_access_key_id", c->key,
                                         sizeof c->key, found[f]);
        int have_secret = dsrt__aws_ini_get(files[f], sections[f], NULL, "aws_secret_access_key",
                                            c->secret, sizeof c->secret, NULL);
        if (have_key != have_secret)
            return dsrt__fail(DSRT_EOPTION, "s3: %s: profile [%s] has %s but not %s", paths[f],
                              sections[f], have_key ? "aws_access_key_id" : "aws_secret_access_key",
                              have_key ? "aws_secret_access_key" : "aws_access_key_id");
        if (have_key) {
            if (dsrt__aws_ini_get(files[f], sections[f], NULL, "aws_session_token", v, sizeof v,
                                  NULL) &&
                !(c->token = dsrt__strdup(v)))
                return -ENOMEM;
            snprintf(c->source, sizeof c->source, "%.60s profile %.30s",
                     f == 0 ? "the credentials file" : "the config file", a->profile);
        }
    }
    if (a->conf && !in_conf)
        dsrt__aws_ini_get(a->conf, a->conf_section, NULL, "region", v, sizeof v, &in_conf);
    if (a->named && !in_creds && !in_conf)
        return dsrt__fail(DSRT_EOPTION,
                          "s3: AWS_PROFILE names profile \"%s\", which is in neither %s nor %s",
                          a->profile, a->creds ? a->cred_path : "~/.aws/credentials",
                          a->conf ? a->conf_path : "~/.aws/config");
    return 0;
}

/* Region, endpoint and addressing. */
static int load_place(dsrt_s3_config *c, aws_files *a) {
    char v[1024];
    int rc;
    const char *r = getenv("AWS_REGION");
    if (!r || !*r) r = getenv("AWS_DEFAULT_REGION");
    if (r && *r)
        snprintf(c->region, sizeof c->region, "%s", r);
    else if (a->conf &&
             dsrt__aws_ini_get(a->conf, a->conf_section, NULL, "region", v, sizeof v, NULL))
        snprintf(c->region, sizeof c->region, "%.63s", v);
    else
        snprintf(c->region, sizeof c->region, "us-east-1");
    for (const char *q = c->region; *q; q++)
        if (!isalnum((unsigned char)*q) && *q != '-')
            return dsrt__fail(DSRT_EOPTION, "s3: region \"%s\" is not a region name", c->region);

    const char *ep = getenv("AWS_ENDPOINT_URL_S3");
    const char *from = "AWS_ENDPOINT_URL_S3";
    if (!ep || !*ep) {
        ep = getenv("AWS_ENDPOINT_URL");
        from = "AWS_ENDPOINT_URL";
    }
    if (ep && *ep) {
        if ((rc = set_endpoint(c, ep, from)) != 0) return rc;
    } else if (a->conf && (dsrt__aws_ini_get(a->conf, a->conf_section, "s3", "endpoint_url", v,
                                             sizeof v, NULL) ||
                           dsrt__aws_ini_get(a->conf, a->conf_section, NULL, "endpoint_url", v,
                                             sizeof v, NULL))) {
        if ((rc = set_endpoint(c, v, a->conf_path)) != 0) return rc;
    } else {
        snprintf(c->scheme, sizeof c->scheme, "https");
        snprintf(c->host, sizeof c->host, "s3.%s.amazonaws.com", c->region);
    }

    const char *style = getenv("DSRT_S3_ADDRESSING");
    if (!(style && *style) && a->conf &&
        dsrt__aws_ini_get(a->conf, a->conf_section, "s3", "addressing_style", v, sizeof v, NULL))
        style = v;
    if (style && *style) {
        static const struct {
            const char *name;
            dsrt_s3_addressing value;
        } styles[] = {{"auto", DSRT_S3_ADDR_AUTO},
                      {"path", DSRT_S3_ADDR_PATH},
                      {"virtual", DSRT_S3_ADDR_VIRTUAL}};
        size_t k = 0;
        while (k < DSRT_ARRAY_SIZE(styles) && strcasecmp(style, styles[k].name) != 0) k++;
        if (k == DSRT_ARRAY_SIZE(styles))
            return dsrt__fail(DSRT_EOPTION,
                              "s3: addressing style \"%s\": not auto, path or virtual", style);
        c->addressing = styles[k].value;
    }
    return 0;
}

int dsrt__s3_config_load(dsrt_s3_config *c) {
    memset(c, 0, sizeof *c);
    aws_files a = {.profile = getenv("AWS_PROFILE")};
    if (!a.profile || !*a.profile) a.profile = getenv("AWS_DEFAULT_PROFILE");
    a.named = a.profile && *a.profile;
    if (!a.named) a.profile = "default";
    a.creds =
        aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", a.cred_path, sizeof a.cred_path);
    a.conf = aws_file("AWS_CONFIG_FILE", "config", a.conf_path, sizeof a.conf_path);
    if (strcmp(a.profile, "default") == 0)
        snprintf(a.conf_section, sizeof a.conf_section, "default");
    else
        snprintf(a.conf_section, sizeof a.conf_section, "profile %s", a.profile);
    int rc = load_credentials(c, &a);
    if (rc == 0) {
        c->anonymous = !c->key[0] || env_true("AWS_NO_SIGN_REQUEST");
        if (!c->key[0])
            snprintf(c->source, sizeof c->source, "no credentials (anonymous requests)");
        rc = load_place(c, &a);
    }
    free(a.creds);
    free(a.conf);
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
// XML: the few elements of S3's answers we read

/* Decodes XML character references and the five entities of text[0..n)
 * into out (which may be text itself: the result is never longer). */
size_t dsrt__xml_unescape(const char *text, size_t n, char *out) {
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
const char *dsrt__xml_find(const char *p, const char *end, const char *tag, size_t *len) {
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
void dsrt__xml_text(const char *body, size_t n, const char *tag, char *out, size_t cap) {
    size_t len;
    const char *t = body ? dsrt__xml_find(body, body + n, tag, &len) : NULL;
    out[0] = '\0';
    if (!t) return;
    len = DSRT_MIN(len, cap - 1);
    memcpy(out, t, len);
    out[dsrt__xml_unescape(out, len, out)] = '\0';
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < ' ') *c = ' ';
}

// ----------------------------------------------------------------------------
// The store's answers

int dsrt__s3_token_expired(long status, const char *body, size_t body_len) {
    if (status != 400 && status != 403) return 0;
    char code[64];
    dsrt__xml_text(body, body_len, "Code", code, sizeof code);
    return strcmp(code, "ExpiredToken") == 0 || strcmp(code, "TokenRefreshRequired") == 0 ||
           strcmp(code, "InvalidToken") == 0;
}

int dsrt__http_status_transient(long status, const char *body, size_t body_len) {
    if (status == 429 || status == 500 || status == 502 || status == 503 || status == 504 ||
        status == 408)
        return 1;
    char code[64];
    dsrt__xml_text(body, body_len, "Code", code, sizeof code);
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
    dsrt__xml_text(body, body_len, "Code", code, sizeof code);
    dsrt__xml_text(body, body_len, "Message", full, sizeof full);
    dsrt__xml_text(body, body_len, "Region", region, sizeof region);
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
        char origin[DSRT_S3_ENDPOINT_MAX];
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
