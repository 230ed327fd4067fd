/*
 * AWS Signature Version 4 for S3 requests, and the requests themselves:
 * the URL of s3://bucket/key at the configured endpoint (virtual-host or
 * path-style addressing) and its signed headers.
 *
 * Signing is done here rather than by libcurl's CURLOPT_AWS_SIGV4: the
 * libcurl of Debian 12 (7.88) signs only host and x-amz-date, sends no
 * x-amz-content-sha256 (which S3 requires), passes the query string
 * through without putting it in canonical order, and has no place for a
 * session token, so S3 refuses what it signs. The hashes are OpenSSL's.
 */
#include "datastore/bytes/s3.h"

#include <ctype.h>
#include <dsrt/datastore.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
