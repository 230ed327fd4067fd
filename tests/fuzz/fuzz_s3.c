/*
 * libFuzzer target for the parsers of the object-storage client that read
 * bytes from outside: ListObjectsV2 pages and the store's error answers
 * (both from the server), and the AWS credentials and config files. The
 * first input byte picks the parser (and, for error answers, the HTTP
 * status); the rest is the text (for listing pages, a whole page, or the
 * key and sub-prefix of a well-formed one).
 *
 * A listing page must hand over NUL-terminated entries and, when it
 * succeeds, a NUL-terminated continuation token; a failing one must say
 * why. An error answer must give a code and a message, and one a store
 * says to retry must not be a bad object. An INI lookup must give a
 * NUL-terminated value that fits its buffer. Redacting a text, and the
 * result again, must give a NUL-terminated text that fits its buffer.
 */
#include "datastore/bytes/s3.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    size_t keys, prefixes;
} seen;

static int on_entry(void *ud, const char *s, size_t n, int is_prefix, uint64_t size,
                    uint64_t version) {
    seen *e = ud;
    (void)size;
    (void)version;
    if (s[n] != '\0') __builtin_trap();
    if (is_prefix)
        e->prefixes++;
    else
        e->keys++;
    /* Stop a page now and then, as the lister does on an error. */
    return n == 7 && s[0] == '!' ? DSRT_EOPTION : 0;
}

static void list_page(const char *text, size_t n) {
    dsrt_strbuf scratch = {0}, token = {0};
    seen e = {0};
    dsrt__clear_error();
    int rc = dsrt__s3_list_page(text, n, &scratch, &token, on_entry, &e);
    if (rc == 0 && token.len > 0 && (!token.s || token.s[token.len] != '\0')) __builtin_trap();
    if (rc != 0 && rc != DSRT_EOPTION && !dsrt_last_error()[0]) __builtin_trap();
    free(scratch.s);
    free(token.s);
}

static void error_answer(long status, const char *text, size_t n) {
    static const long statuses[] = {301, 307, 400, 401, 403, 404, 409, 410,
                                    416, 429, 500, 503, 200, 206, 302, 418};
    status = statuses[status % DSRT_ARRAY_SIZE(statuses)];
    dsrt_s3_config c = {.region = "us-east-1", .scheme = "https", .host = "s3.example"};
    dsrt__clear_error();
    int transient = dsrt__http_status_transient(status, text, n);
    (void)dsrt__s3_token_expired(status, text, n);
    int rc = dsrt__s3_http_error("s3://b/k", status, text, n, "eu-west-1", (status & 1) ? &c : NULL,
                                 (status & 2) != 0);
    if (rc >= 0 || !dsrt_last_error()[0]) __builtin_trap();
    if (transient && rc == -ENOENT && status != 404) __builtin_trap();
}

static void ini(const char *text) {
    static const char *const sections[] = {"default", "profile dsrt", "x"};
    static const char *const subs[] = {NULL, "s3"};
    static const char *const keys[] = {"aws_access_key_id", "region", "endpoint_url",
                                       "addressing_style"};
    for (size_t a = 0; a < DSRT_ARRAY_SIZE(sections); a++)
        for (size_t b = 0; b < DSRT_ARRAY_SIZE(subs); b++)
            for (size_t k = 0; k < DSRT_ARRAY_SIZE(keys); k++) {
                char out[16];
                int found = 0;
                memset(out, 'x', sizeof out);
                int hit =
                    dsrt__aws_ini_get(text, sections[a], subs[b], keys[k], out, sizeof out, &found);
                if (hit && (!memchr(out, '\0', sizeof out) || !found)) __builtin_trap();
            }
}

static void redact(const char *text) {
    char out[256], again[256];
    dsrt_text_redact(text, out, sizeof out);
    if (!memchr(out, '\0', sizeof out)) __builtin_trap();
    dsrt_text_redact(out, again, sizeof again);
    if (!memchr(again, '\0', sizeof again)) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    /* A copy of exactly the text (and one with a NUL after it for the INI
     * reader), so that reading past it is caught. */
    size_t n = size - 1;
    char *text = malloc(n ? n : 1);
    char *z = malloc(n + 1);
    if (!text || !z) {
        free(text);
        free(z);
        return 0;
    }
    memcpy(text, data + 1, n);
    memcpy(z, data + 1, n);
    z[n] = '\0';
    switch (data[0] % 5) {
    case 0:
        list_page(text, n);
        break;
    case 3: {
        /* The text as a key and a sub-prefix of a well-formed page, so that
         * the decoding of entities and escapes is reached at once. */
        static const char head[] = "<ListBucketResult><EncodingType>url</EncodingType>"
                                   "<IsTruncated>true</IsTruncated><Contents><Key>",
                          mid[] = "</Key></Contents><CommonPrefixes><Prefix>",
                          tail[] = "</Prefix></CommonPrefixes><NextContinuationToken>t&amp;1"
                                   "</NextContinuationToken></ListBucketResult>";
        size_t len = sizeof head - 1 + 2 * n + sizeof mid - 1 + sizeof tail - 1;
        char *page = malloc(len);
        if (!page) break;
        char *p = page;
        memcpy(p, head, sizeof head - 1);
        memcpy(p += sizeof head - 1, text, n);
        memcpy(p += n, mid, sizeof mid - 1);
        memcpy(p += sizeof mid - 1, text, n);
        memcpy(p += n, tail, sizeof tail - 1);
        list_page(page, len);
        free(page);
        break;
    }
    case 1:
        error_answer(data[0] / 3, text, n);
        break;
    case 4:
        redact(z);
        break;
    default:
        ini(z);
        break;
    }
    free(text);
    free(z);
    return 0;
}
