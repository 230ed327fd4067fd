/*
 * Error codes and messages. The code table is DSRT_ERRNO_MAP in core.h; the
 * message with context lives in a per-thread buffer, so a failing call on one
 * thread never overwrites the message another thread is about to read.
 *
 * Messages name files and URLs, and some quote what a server answered, so
 * every message is redacted as it is made (dsrt_text_redact): a URL's
 * password or a pre-signed URL's signature never reaches a log, whichever
 * module wrote the message.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define DSRT_ERROR_MAX 1024

static _Thread_local char dsrt_error_buf[DSRT_ERROR_MAX];

const char *dsrt_strerror(int code) {
    switch (code) {
#define DSRT_STRERROR_CASE(name, value, text)                                                      \
    case value:                                                                                    \
        return text;
        DSRT_ERRNO_MAP(DSRT_STRERROR_CASE)
#undef DSRT_STRERROR_CASE
    case 0:
        return "success";
    default:
        break;
    }
    if (code < 0 && code > -4096) return strerror(-code);
    return "unknown error";
}

const char *dsrt_last_error(void) {
    return dsrt_error_buf;
}

// ----------------------------------------------------------------------------
// Redaction

/* What ends a secret's value: a parameter's or a header field's end. */
#define VALUE_END "&,; \t\r\n\"'<>#"
#define LINE_END  "\r\n\"'<>"

/* Names whose values are secrets: of query parameters (pre-signed URLs of
 * S3 and Google Cloud Storage, Azure's SAS), of request headers a server may
 * echo, and of the AWS files' settings. */
static const struct {
    const char *name;
    const char *end;
} SECRETS[] = {
    {"X-Amz-Signature", VALUE_END},
    {"X-Amz-Credential", VALUE_END},
    {"X-Amz-Security-Token", VALUE_END},
    {"X-Goog-Signature", VALUE_END},
    {"X-Goog-Credential", VALUE_END},
    {"AWSAccessKeyId", VALUE_END},
    {"Signature", VALUE_END},
    {"Credential", VALUE_END},
    {"sig", VALUE_END},
    {"aws_access_key_id", VALUE_END},
    {"aws_secret_access_key", VALUE_END},
    {"aws_session_token", VALUE_END},
    {"Authorization", LINE_END},
};

typedef struct {
    char *s;
    size_t n, cap;
} redact_out;

static void put(redact_out *o, const char *p, size_t n) {
    size_t room = o->cap - 1 - o->n;
    if (n > room) n = room;
    memcpy(o->s + o->n, p, n);
    o->n += n;
}

static int name_char(char c) {
    return isalnum((unsigned char)c) || c == '-' || c == '_';
}

/* At "://": the scheme's slashes, then the authority without its user
 * information. Returns the bytes of text consumed. */
static size_t redact_authority(redact_out *o, const char *t) {
    size_t i = 3, at = 0;
    put(o, t, 3);
    for (; t[i] && !strchr("/?# \t\r\n\"'<>", t[i]); i++)
        if (t[i] == '@') at = i;
    if (!at) return 3;
    put(o, "***@", 4);
    return at + 1;
}

/* At the start of a name: a secret's name, its separator ("=", ":" and
 * blanks, or ">" of an XML element) and "***" for its value. Returns the
 * bytes of text consumed, 0 when no secret starts here. */
static size_t redact_secret(redact_out *o, const char *t, int after_lt) {
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(SECRETS); k++) {
        size_t n = strlen(SECRETS[k].name);
        if (strncasecmp(t, SECRETS[k].name, n) != 0 || name_char(t[n])) continue;
        size_t v = n;
        const char *end = SECRETS[k].end;
        if (t[v] == '=') {
            v++;
        } else if (t[v] == ':') {
            v++;
            while (t[v] == ' ' || t[v] == '\t') v++;
        } else if (t[v] == '>' && after_lt) {
            v++;
            end = "<";
        } else {
            continue;
        }
        /* A value ends at its separator, and at ": " (a message goes on). */
        size_t e = v;
        while (t[e] && !strchr(end, t[e]) && !(t[e] == ':' && (t[e + 1] == ' ' || !t[e + 1]))) e++;
        if (e == v) return 0; /* no value: nothing to hide */
        put(o, t, v);
        put(o, "***", 3);
        return e;
    }
    return 0;
}

void dsrt_text_redact(const char *text, char *out, size_t cap) {
    if (cap == 0) return;
    redact_out o = {out, 0, cap};
    for (size_t i = 0; text[i] && o.n + 1 < cap;) {
        size_t used = 0;
        if (text[i] == ':' && text[i + 1] == '/' && text[i + 2] == '/')
            used = redact_authority(&o, text + i);
        else if (!name_char(text[i]) || (i > 0 && name_char(text[i - 1])))
            used = 0;
        else
            used = redact_secret(&o, text + i, i > 0 && text[i - 1] == '<');
        if (used) {
            i += used;
            continue;
        }
        put(&o, text + i, 1);
        i++;
    }
    out[o.n] = '\0';
}

// ----------------------------------------------------------------------------
// Messages

int dsrt__vfail(int code, const char *fmt, va_list ap) {
    char raw[DSRT_ERROR_MAX];
    vsnprintf(raw, sizeof raw, fmt, ap);
    dsrt_text_redact(raw, dsrt_error_buf, sizeof dsrt_error_buf);
    return code;
}

int dsrt__fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dsrt__vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

int dsrt__fail_prefix(int code, const char *fmt, ...) {
    char prefix[DSRT_ERROR_MAX / 4], old[DSRT_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, dsrt_error_buf, sizeof old);
    if (old[0] == '\0') snprintf(old, sizeof old, "%s", dsrt_strerror(code));
    size_t n = strlen(prefix);
    memcpy(dsrt_error_buf, prefix, n);
    dsrt_error_buf[n] = ':';
    dsrt_error_buf[n + 1] = ' ';
    snprintf(dsrt_error_buf + n + 2, sizeof dsrt_error_buf - n - 2, "%s", old);
    memcpy(old, dsrt_error_buf, sizeof old);
    dsrt_text_redact(old, dsrt_error_buf, sizeof dsrt_error_buf);
    return code;
}

void dsrt__clear_error(void) {
    dsrt_error_buf[0] = '\0';
}

unsigned dsrt_version(void) {
    return DSRT_VERSION_NUMBER;
}

#define DSRT_STR2(x) #x
#define DSRT_STR(x)  DSRT_STR2(x)

const char *dsrt_version_string(void) {
    return DSRT_STR(DSRT_VERSION_MAJOR) "." DSRT_STR(DSRT_VERSION_MINOR) "." DSRT_STR(
        DSRT_VERSION_PATCH);
}
