/*
 * Model and checkpoint files: a small versioned binary format in which every
 * part carries its length and a CRC-32, so that a damaged, truncated or
 * foreign file is refused with the reason, never half-loaded. Files are
 * written atomically (temporary file, fsync, rename): a reader sees the old
 * file or the new one. The parameters and the optimizer's state are written
 * from the net's own buffers, never copied into one for the file.
 *
 * Format, version 1 or 2. All integers little-endian; floats IEEE-754
 * binary32 little-endian. Version 2 is version 1 for networks that are
 * graphs (a layer with inputs=, add or concat in DESC); a chain is still
 * written as version 1, which every reader of the format reads. A reader
 * that knows only version 1 refuses a version-2 file by its version, not by
 * a puzzling error in its description.
 *
 *   File header, 64 bytes:
 *      0  8  magic "DSRTMODL"
 *      8  4  format version (1, or 2 for a graph)
 *     12  4  kind: 1 model, 2 checkpoint
 *     16  4  header size (64)
 *     20  4  number of sections that follow
 *     24  4  input height     28  4  input width     32  4  input channels
 *     36  4  classes
 *     40  8  parameter count (floats)
 *     48  8  state count (floats)
 *     56  4  reserved, 0
 *     60  4  CRC-32 of bytes 0..59
 *
 *   Then each section: a 24-byte header, the payload, and zero bytes up to a
 *   multiple of 8:
 *      0  4  tag, four ASCII letters
 *      4  4  flags: bit 0 "optional" (a reader that does not know the tag
 *            skips the section; an unknown tag without it is refused);
 *            other bits 0
 *      8  8  payload length in bytes
 *     16  4  CRC-32 of the payload
 *     20  4  CRC-32 of bytes 0..19 of this section header
 *
 *   Sections (each at most once; the file ends right after the last):
 *     DESC  required  the network description text (nn/parse.c), UTF-8
 *     PARM  required  parameter count floats: the flat parameter buffer
 *     STAT  required  state count floats: running statistics, input stats
 *     OPTM  checkpoints  optimizer: u32 solver, u32 schedule, u32 clip,
 *           i32 drop period, f64 learn rate, momentum, l2, gradient decay,
 *           squared gradient decay, epsilon, drop factor, gradient threshold,
 *           i64 steps taken, u32 buffer count B, u32 reserved 0, then B x
 *           parameter count floats (SGDM velocity; Adam first and second
 *           moments; RMSProp mean square)
 *     POSN  checkpoints  i64 epoch, i64 iteration, u64 seed
 *     WOPT  optional, checkpoints of data-parallel runs whose workers each
 *           keep their own optimizer state (parameter averaging): u32
 *           workers W (at least 2), u32 buffer count B (OPTM's), u64
 *           parameter count, then for each worker 1 .. W-1: i64 steps
 *           taken, B x parameter count floats (worker 0's state is OPTM)
 *
 * The net is rebuilt from DESC for the stored input size and class count,
 * and must come out with exactly the stored parameter and state counts.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC          "DSRTMODL"
#define VERSION        2u /* the newest this build reads and writes */
#define HEADER_SIZE    64u
#define SECTION_HEADER 24u
#define KIND_MODEL     1u
#define KIND_CKPT      2u
#define FLAG_OPTIONAL  1u
#define MAX_SECTIONS   64u
#define MAX_DESC       (1u << 20)
#define MAX_FILE       ((size_t)1 << 36)
#define OPTM_FIXED     96u

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "model files are written with little-endian floats; add byte swapping for this target"
#endif

// ----------------------------------------------------------------------------
// Bytes

/* Whether some layer takes another input than the layer above it. */
static int is_graph(const dsrt_net *net) {
    for (int i = 1; i < net->n_layers; i++)
        if (net->layers[i].n_inputs != 1 || net->layers[i].inputs[0] != i - 1) return 1;
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void putf64(uint8_t *p, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    put64(p, v);
}

static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static double getf64(const uint8_t *p) {
    uint64_t v = get64(p);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

static uint32_t crc(const void *p, size_t n) {
    return (uint32_t)crc32_z(0, p, n);
}

// ----------------------------------------------------------------------------
// Writing

/*
 * A file being written: its small bytes (the header, section headers,
 * small payloads, padding) in buf, and the pieces it is made of, in order,
 * each a range of buf or a large buffer of the caller's (the parameters,
 * the optimizer's state), which is written from where it is: saving a
 * model never holds a second copy of its weights.
 */
typedef struct {
    const void *p; /* NULL: buf + off */
    size_t off, n;
} piece;

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    piece *pieces;
    size_t n_pieces, cap_pieces;
    uint32_t sections;
    void *owned; /* freed with the writer */
} writer;

/* Parts at least this large are written from the caller's memory. */
#define BORROW_BYTES ((size_t)1 << 16)

static int add_piece(writer *w, const void *p, size_t off, size_t n) {
    if (!n) return 0;
    piece *last = w->n_pieces ? &w->pieces[w->n_pieces - 1] : NULL;
    if (!p && last && !last->p && last->off + last->n == off) {
        last->n += n;
        return 0;
    }
    int rc = dsrt__grow((void **)&w->pieces, &w->cap_pieces, w->n_pieces + 1, sizeof *w->pieces);
    if (rc) return rc;
    w->pieces[w->n_pieces++] = (piece){p, off, n};
    return 0;
}

/* n bytes of src (NULL: zeros) copied into buf. */
static int add_bytes(writer *w, const void *src, size_t n) {
    int rc = dsrt__grow((void **)&w->buf, &w->cap, w->len + n, 1);
    if (rc) return rc;
    if (src)
        memcpy(w->buf + w->len, src, n);
    else
        memset(w->buf + w->len, 0, n);
    rc = add_piece(w, NULL, w->len, n);
    w->len += n;
    return rc;
}

/* Appends a section (flags: FLAG_OPTIONAL or 0) whose payload is the
 * concatenation of parts; large parts must stay until the file is
 * written. */
static int section(writer *w, const char *tag, uint32_t flags, const void *const *parts,
                   const size_t *sizes, int nparts) {
    size_t n = 0;
    uint32_t c = (uint32_t)crc32_z(0, NULL, 0);
    for (int k = 0; k < nparts; k++) {
        n += sizes[k];
        if (sizes[k]) c = (uint32_t)crc32_z(c, parts[k], sizes[k]);
    }
    size_t padded = (n + 7) & ~(size_t)7;
    uint8_t h[SECTION_HEADER];
    memcpy(h, tag, 4);
    put32(h + 4, flags);
    put64(h + 8, n);
    put32(h + 16, c);
    put32(h + 20, crc(h, 20));
    int rc = add_bytes(w, h, sizeof h);
    for (int k = 0; !rc && k < nparts; k++)
        rc = sizes[k] >= BORROW_BYTES ? add_piece(w, parts[k], 0, sizes[k])
                                      : add_bytes(w, parts[k], sizes[k]);
    if (!rc) rc = add_bytes(w, NULL, padded - n);
    if (rc) return rc;
    w->sections++;
    return 0;
}

/* Section WOPT: the optimizer states of workers 1 .. ws->workers - 1. */
static int workers_section(writer *w, const dsrt_net *net, const dsrt_optimizer *opt,
                           const dsrt_ckpt_workers *ws) {
    int nb = dsrt__optimizer_n_buffers(opt), n = ws->workers - 1;
    size_t bytes = (size_t)nb * net->n_params * sizeof(float);
    const void **parts = dsrt__calloc(1 + 2 * (size_t)n, sizeof *parts);
    size_t *sizes = dsrt__calloc(1 + 2 * (size_t)n, sizeof *sizes);
    uint8_t *heads = dsrt__calloc(16 + 8 * (size_t)n, 1);
    int rc = -ENOMEM;
    if (parts && sizes && heads) {
        put32(heads, (uint32_t)ws->workers);
        put32(heads + 4, (uint32_t)nb);
        put64(heads + 8, net->n_params);
        parts[0] = heads;
        sizes[0] = 16;
        for (int k = 0; k < n; k++) {
            put64(heads + 16 + 8 * k, (uint64_t)ws->steps[k]);
            parts[1 + 2 * k] = heads + 16 + 8 * k;
            sizes[1 + 2 * k] = 8;
            parts[2 + 2 * k] = ws->states[k];
            sizes[2 + 2 * k] = bytes;
        }
        rc = section(w, "WOPT", FLAG_OPTIONAL, parts, sizes, 1 + 2 * n);
    }
    free(parts);
    free(sizes);
    w->owned = heads; /* a large one is written from where it is */
    return rc;
}

static int write_file(const char *path, const dsrt_net *net, const dsrt_optimizer *opt,
                      const dsrt_train_position *pos, const dsrt_ckpt_workers *ws, uint32_t kind) {
    writer w = {0};
    /* The newest numbers, where a device backend holds them. */
    int rc = dsrt__net_host((dsrt_net *)net, DSRT_BUF_PARAMS | DSRT_BUF_STATE);
    if (!rc && opt) rc = dsrt__optimizer_host((dsrt_optimizer *)opt);
    if (rc) return dsrt__fail_prefix(rc, "model: %s", path);
    if ((rc = add_bytes(&w, NULL, HEADER_SIZE))) goto fail;
    const void *parts[3];
    size_t sizes[3];
    parts[0] = net->desc;
    sizes[0] = strlen(net->desc);
    if ((rc = section(&w, "DESC", 0, parts, sizes, 1))) goto fail;
    parts[0] = net->params;
    sizes[0] = net->n_params * sizeof(float);
    if ((rc = section(&w, "PARM", 0, parts, sizes, 1))) goto fail;
    parts[0] = net->state;
    sizes[0] = net->n_state * sizeof(float);
    if ((rc = section(&w, "STAT", 0, parts, sizes, 1))) goto fail;
    if (opt) {
        dsrt_optimizer_options o = dsrt_optimizer_get_options(opt);
        uint8_t fixed[OPTM_FIXED];
        put32(fixed + 0, (uint32_t)o.solver);
        put32(fixed + 4, (uint32_t)o.schedule);
        put32(fixed + 8, (uint32_t)o.clip);
        put32(fixed + 12, (uint32_t)o.drop_period);
        const double d[] = {o.learn_rate,        o.momentum, o.l2,          o.gradient_decay,
                            o.sq_gradient_decay, o.epsilon,  o.drop_factor, o.grad_threshold};
        for (int k = 0; k < 8; k++) putf64(fixed + 16 + 8 * k, d[k]);
        put64(fixed + 80, (uint64_t)dsrt__optimizer_steps(opt));
        int nb = dsrt__optimizer_n_buffers(opt);
        put32(fixed + 88, (uint32_t)nb);
        put32(fixed + 92, 0);
        parts[0] = fixed;
        sizes[0] = sizeof fixed;
        for (int k = 0; k < nb; k++) {
            parts[1 + k] = dsrt__optimizer_state(opt, k);
            sizes[1 + k] = net->n_params * sizeof(float);
        }
        if ((rc = section(&w, "OPTM", 0, parts, sizes, 1 + nb))) goto fail;
        if (ws && ws->workers > 1 && (rc = workers_section(&w, net, opt, ws))) goto fail;
    }
    if (pos) {
        uint8_t b[24];
        put64(b, (uint64_t)pos->epoch);
        put64(b + 8, (uint64_t)pos->iteration);
        put64(b + 16, pos->seed);
        parts[0] = b;
        sizes[0] = sizeof b;
        if ((rc = section(&w, "POSN", 0, parts, sizes, 1))) goto fail;
    }
    uint8_t *h = w.buf;
    memcpy(h, MAGIC, 8);
    put32(h + 8, is_graph(net) ? 2u : 1u);
    put32(h + 12, kind);
    put32(h + 16, HEADER_SIZE);
    put32(h + 20, w.sections);
    put32(h + 24, (uint32_t)net->input.h);
    put32(h + 28, (uint32_t)net->input.w);
    put32(h + 32, (uint32_t)net->input.c);
    put32(h + 36, (uint32_t)net->classes);
    put64(h + 40, net->n_params);
    put64(h + 48, net->n_state);
    put32(h + 56, 0);
    put32(h + 60, crc(h, 60));
    const void **parts_of = dsrt__calloc(w.n_pieces, sizeof *parts_of);
    size_t *sizes_of = dsrt__calloc(w.n_pieces, sizeof *sizes_of);
    if (!parts_of || !sizes_of) {
        rc = -ENOMEM;
    } else {
        for (size_t k = 0; k < w.n_pieces; k++) {
            parts_of[k] = w.pieces[k].p ? w.pieces[k].p : w.buf + w.pieces[k].off;
            sizes_of[k] = w.pieces[k].n;
        }
        rc = dsrt__write_parts_atomic(path, parts_of, sizes_of, (int)w.n_pieces);
        if (rc) dsrt__fail_prefix(rc, "model: %s", path);
    }
    free(parts_of);
    free(sizes_of);
fail:
    free(w.buf);
    free(w.pieces);
    free(w.owned);
    return rc;
}

int dsrt_model_save(const char *path, const dsrt_net *net) {
    return write_file(path, net, NULL, NULL, NULL, KIND_MODEL);
}

int dsrt_checkpoint_save(const char *path, const dsrt_net *net, const dsrt_optimizer *opt,
                         const dsrt_train_position *pos) {
    return write_file(path, net, opt, pos, NULL, KIND_CKPT);
}

int dsrt__checkpoint_save_workers(const char *path, const dsrt_net *net, const dsrt_optimizer *opt,
                                  const dsrt_train_position *pos, const dsrt_ckpt_workers *ws) {
    return write_file(path, net, opt, pos, ws, KIND_CKPT);
}

// ----------------------------------------------------------------------------
// Reading

typedef struct {
    const uint8_t *data;
    uint64_t len;
    int present;
} sect;

enum { S_DESC, S_PARM, S_STAT, S_OPTM, S_POSN, S_WOPT, S_COUNT };
static const char *const TAGS[S_COUNT] = {"DESC", "PARM", "STAT", "OPTM", "POSN", "WOPT"};

static int read_optimizer(const sect *s, const char *name, dsrt_net *net, dsrt_optimizer **out) {
    const uint8_t *p = s->data;
    if (s->len < OPTM_FIXED)
        return dsrt__fail(DSRT_ECORRUPT, "model: %s: section OPTM: %llu bytes, fewer than %u", name,
                          (unsigned long long)s->len, OPTM_FIXED);
    dsrt_optimizer_options o;
    memset(&o, 0, sizeof o);
    o.solver = (dsrt_solver)get32(p);
    o.schedule = (dsrt_lr_schedule)get32(p + 4);
    o.clip = (dsrt_grad_clip)get32(p + 8);
    o.drop_period = (int)get32(p + 12);
    double *d[] = {&o.learn_rate,        &o.momentum, &o.l2,          &o.gradient_decay,
                   &o.sq_gradient_decay, &o.epsilon,  &o.drop_factor, &o.grad_threshold};
    for (int k = 0; k < 8; k++) *d[k] = getf64(p + 16 + 8 * k);
    int64_t steps = (int64_t)get64(p + 80);
    uint32_t nb = get32(p + 88);
    dsrt_optimizer *opt;
    int rc = dsrt_optimizer_create(&opt, net, &o);
    if (rc) return dsrt__fail_prefix(DSRT_ECORRUPT, "model: %s: section OPTM", name);
    uint64_t want = OPTM_FIXED + (uint64_t)nb * net->n_params * sizeof(float);
    if (nb != (uint32_t)dsrt__optimizer_n_buffers(opt) || s->len != want || steps < 0) {
        dsrt_optimizer_destroy(opt);
        return dsrt__fail(DSRT_ECORRUPT,
                          "model: %s: section OPTM: %u state buffers in %llu bytes do not fit "
                          "the solver and %zu parameters",
                          name, nb, (unsigned long long)s->len, net->n_params);
    }
    for (uint32_t k = 0; k < nb; k++)
        memcpy(dsrt__optimizer_buffer(opt, (int)k),
               p + OPTM_FIXED + (size_t)k * net->n_params * sizeof(float),
               net->n_params * sizeof(float));
    dsrt__optimizer_set_steps(opt, steps);
    *out = opt;
    return 0;
}

/* Replaces opt's state (read from OPTM: worker 0's) from section WOPT:
 * by worker rank's when the file holds own_world states, else by the mean
 * of every worker's (the sum in worker order times 1 / W, as the
 * communicators average). */
static int read_workers(const sect *s, const char *name, const dsrt_net *net, dsrt_optimizer *opt,
                        int rank, int own_world, int *workers) {
    const uint8_t *p = s->data;
    uint32_t nb = (uint32_t)dsrt__optimizer_n_buffers(opt);
    uint64_t per = 8 + (uint64_t)nb * net->n_params * sizeof(float);
    uint32_t w = s->len >= 16 ? get32(p) : 0;
    if (s->len < 16 || w < 2 || w > (1u << 20) || get32(p + 4) != nb ||
        get64(p + 8) != net->n_params || (s->len - 16) / per != w - 1 || (s->len - 16) % per)
        return dsrt__fail(DSRT_ECORRUPT,
                          "model: %s: section WOPT: %llu bytes do not hold the optimizer states "
                          "of %u workers (%u buffers of %zu parameters each)",
                          name, (unsigned long long)s->len, w, nb, net->n_params);
    *workers = (int)w;
    int worker = own_world == (int)w && rank >= 0 && rank < (int)w ? rank : -1;
    if (worker == 0) return 0;
    size_t n = net->n_params;
    for (uint32_t k = 1; k < w; k++)
        if ((int64_t)get64(p + 16 + (k - 1) * per) < 0)
            return dsrt__fail(DSRT_ECORRUPT, "model: %s: section WOPT: worker %u: negative steps",
                              name, k);
    for (uint32_t b = 0; b < nb; b++) {
        float *dst = dsrt__optimizer_buffer(opt, (int)b);
        if (!dst) return DSRT_EBACKEND;
        for (uint32_t k = 1; k < w; k++) {
            if (worker > 0 && k != (uint32_t)worker) continue;
            const uint8_t *src = p + 16 + (k - 1) * per + 8 + (size_t)b * n * sizeof(float);
            if (worker > 0) {
                memcpy(dst, src, n * sizeof(float));
                continue;
            }
            for (size_t i = 0; i < n; i++) {
                float v;
                memcpy(&v, src + i * sizeof(float), sizeof v);
                dst[i] += v;
            }
        }
        if (worker < 0) {
            float inv = 1.0f / (float)w;
            for (size_t i = 0; i < n; i++) dst[i] *= inv;
        }
    }
    if (worker > 0) dsrt__optimizer_set_steps(opt, (int64_t)get64(p + 16 + (worker - 1) * per));
    return 0;
}

int dsrt__model_read(const uint8_t *data, size_t size, const char *name, dsrt_net **netp,
                     dsrt_optimizer **optp, dsrt_train_position *pos,
                     const dsrt_net_options *options) {
    return dsrt__model_read_worker(data, size, name, netp, optp, pos, options, 0, 0, NULL);
}

/* The fixed header's sizes: sections, input, classes, parameters, state. */
typedef struct {
    uint32_t nsec, h, w, c, classes;
    uint64_t n_params, n_state;
} file_header;

/* Checks a model file's fixed header (magic, version, checksum, kind,
 * sizes) and reads its sizes into hd. */
static int read_header(const uint8_t *data, size_t size, const char *name, file_header *hd) {
    if (size == 0) return dsrt__fail(DSRT_ETRUNCATED, "model: %s: empty file", name);
    if (size < 8 ? memcmp(data, MAGIC, size) != 0 : memcmp(data, MAGIC, 8) != 0)
        return dsrt__fail(DSRT_EFORMAT, "model: %s: not a dsrt model file (bad magic)", name);
    if (size < HEADER_SIZE)
        return dsrt__fail(DSRT_ETRUNCATED,
                          "model: %s: truncated: %zu bytes, the header alone is %u", name, size,
                          HEADER_SIZE);
    uint32_t version = get32(data + 8);
    if (version < 1 || version > VERSION)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "model: %s: format version %u is not supported (this build reads 1 to "
                          "%u)",
                          name, version, VERSION);
    if (get32(data + 60) != crc(data, 60))
        return dsrt__fail(DSRT_ECHECKSUM, "model: %s: header checksum mismatch", name);
    uint32_t kind = get32(data + 12), hsize = get32(data + 16), nsec = get32(data + 20);
    uint32_t h = get32(data + 24), w = get32(data + 28), c = get32(data + 32);
    uint32_t classes = get32(data + 36);
    if ((kind != KIND_MODEL && kind != KIND_CKPT) || hsize != HEADER_SIZE || nsec > MAX_SECTIONS ||
        get32(data + 56) != 0)
        return dsrt__fail(DSRT_ECORRUPT, "model: %s: bad header (kind %u, size %u, %u sections)",
                          name, kind, hsize, nsec);
    if (h < 1 || w < 1 || c < 1 || h > 65536 || w > 65536 || c > 65536 || classes < 1 ||
        classes > (1u << 24))
        return dsrt__fail(DSRT_ECORRUPT, "model: %s: bad input size %ux%ux%u or class count %u",
                          name, h, w, c, classes);
    *hd = (file_header){nsec, h, w, c, classes, get64(data + 40), get64(data + 48)};
    return 0;
}

/* The nsec sections after the header, each checked (its header's and its
 * payload's checksums, padding, flags): the known ones into s by id, the
 * unknown optional ones skipped. They must end the file. */
static int read_sections(const uint8_t *data, size_t size, const char *name, uint32_t nsec,
                         sect *s) {
    size_t at = HEADER_SIZE;
    for (uint32_t k = 0; k < nsec; k++) {
        if (size - at < SECTION_HEADER)
            return dsrt__fail(DSRT_ETRUNCATED,
                              "model: %s: truncated: section %u of %u starts at byte %zu of %zu",
                              name, k + 1, nsec, at, size);
        const uint8_t *sh = data + at;
        char tag[5] = {0};
        memcpy(tag, sh, 4);
        for (int i = 0; i < 4; i++)
            if (tag[i] < 0x20 || tag[i] > 0x7e) tag[i] = '?';
        if (get32(sh + 20) != crc(sh, 20))
            return dsrt__fail(DSRT_ECHECKSUM,
                              "model: %s: section %u ('%s') at byte %zu: header checksum mismatch",
                              name, k + 1, tag, at);
        uint32_t flags = get32(sh + 4);
        uint64_t len = get64(sh + 8);
        at += SECTION_HEADER;
        if (len > size - at || ((len + 7) & ~(uint64_t)7) > size - at)
            return dsrt__fail(DSRT_ETRUNCATED,
                              "model: %s: truncated: section '%s' needs %llu bytes at byte %zu, "
                              "the file has %zu",
                              name, tag, (unsigned long long)len, at, size - at);
        const uint8_t *payload = data + at;
        if (get32(sh + 16) != crc(payload, (size_t)len))
            return dsrt__fail(DSRT_ECHECKSUM, "model: %s: section '%s': checksum mismatch", name,
                              tag);
        size_t padded = (size_t)((len + 7) & ~(uint64_t)7);
        for (size_t i = (size_t)len; i < padded; i++)
            if (payload[i] != 0)
                return dsrt__fail(DSRT_ECORRUPT, "model: %s: section '%s': non-zero padding", name,
                                  tag);
        at += padded;
        if (flags & ~FLAG_OPTIONAL)
            return dsrt__fail(DSRT_ECORRUPT, "model: %s: section '%s': unknown flags 0x%x", name,
                              tag, flags);
        int id = -1;
        for (int i = 0; i < S_COUNT; i++)
            if (!memcmp(sh, TAGS[i], 4)) id = i;
        if (id < 0) {
            if (flags & FLAG_OPTIONAL) continue;
            return dsrt__fail(DSRT_EUNSUPPORTED,
                              "model: %s: section '%s' is required but not known to this build",
                              name, tag);
        }
        if (s[id].present)
            return dsrt__fail(DSRT_ECORRUPT, "model: %s: section '%s' appears twice", name, tag);
        s[id] = (sect){payload, len, 1};
    }
    if (at != size)
        return dsrt__fail(DSRT_ECORRUPT, "model: %s: %zu bytes after the last section", name,
                          size - at);
    return 0;
}

/* The sections a model needs are there, and their sizes agree with the
 * header's. */
static int check_sections(const sect *s, const char *name, const file_header *hd) {
    for (int i = S_DESC; i <= S_STAT; i++)
        if (!s[i].present)
            return dsrt__fail(DSRT_ECORRUPT, "model: %s: section '%s' is missing", name, TAGS[i]);
    if (s[S_PARM].len != hd->n_params * sizeof(float) || hd->n_params > s[S_PARM].len ||
        s[S_STAT].len != hd->n_state * sizeof(float) || hd->n_state > s[S_STAT].len)
        return dsrt__fail(DSRT_ECORRUPT,
                          "model: %s: sections PARM and STAT hold %llu and %llu bytes, the "
                          "header says %llu and %llu floats",
                          name, (unsigned long long)s[S_PARM].len,
                          (unsigned long long)s[S_STAT].len, (unsigned long long)hd->n_params,
                          (unsigned long long)hd->n_state);
    if (s[S_DESC].len == 0 || s[S_DESC].len > MAX_DESC ||
        memchr(s[S_DESC].data, 0, (size_t)s[S_DESC].len))
        return dsrt__fail(DSRT_ECORRUPT, "model: %s: section DESC is not a description text", name);
    if (s[S_POSN].present && s[S_POSN].len != 24)
        return dsrt__fail(DSRT_ECORRUPT, "model: %s: section POSN: %llu bytes, not 24", name,
                          (unsigned long long)s[S_POSN].len);
    return 0;
}

int dsrt__model_read_worker(const uint8_t *data, size_t size, const char *name, dsrt_net **netp,
                            dsrt_optimizer **optp, dsrt_train_position *pos,
                            const dsrt_net_options *options, int rank, int own_world,
                            int *workers) {
    if (workers) *workers = 1;
    dsrt_net *net = NULL;
    char *text = NULL;
    int rc;
    *netp = NULL;
    if (optp) *optp = NULL;
    if (pos) memset(pos, 0, sizeof *pos);

    file_header hd = {0};
    if ((rc = read_header(data, size, name, &hd))) return rc;
    uint32_t h = hd.h, w = hd.w, c = hd.c, classes = hd.classes;
    uint64_t n_params = hd.n_params, n_state = hd.n_state;

    sect s[S_COUNT] = {{0}};
    if ((rc = read_sections(data, size, name, hd.nsec, s))) return rc;
    if ((rc = check_sections(s, name, &hd))) return rc;

    /* The net, from its description, for the stored sizes. */
    text = dsrt__malloc((size_t)s[S_DESC].len + 1);
    if (!text) return -ENOMEM;
    memcpy(text, s[S_DESC].data, (size_t)s[S_DESC].len);
    text[s[S_DESC].len] = '\0';
    char source[320];
    snprintf(source, sizeof source, "model: %s: description", name);
    dsrt_desc d;
    if ((rc = dsrt__desc_parse(&d, text, source))) {
        rc = DSRT_ECORRUPT;
        goto fail;
    }
    dsrt_net_options o = options ? *options : dsrt_net_defaults();
    if (s[S_POSN].present) o.seed = get64(s[S_POSN].data + 16);
    size_t expect[2] = {(size_t)n_params, (size_t)n_state};
    rc = dsrt__net_build(&net, &d, text, source, (int)h, (int)w, (int)c, (int)classes, &o, 0,
                         expect);
    if (rc) {
        if (rc == DSRT_EOPTION) rc = DSRT_ECORRUPT;
        goto fail;
    }
    if (net->classes != (int)classes) {
        rc = dsrt__fail(DSRT_ECORRUPT, "model: %s: the description makes %d classes, not %u", name,
                        net->classes, classes);
        goto fail;
    }
    memcpy(net->params, s[S_PARM].data, (size_t)n_params * sizeof(float));
    memcpy(net->state, s[S_STAT].data, (size_t)n_state * sizeof(float));
    /* NaN or infinite weights or statistics give every image the same
     * scores, or none: refused here, naming the file. */
    for (int k = 0; k < 2; k++) {
        const float *v = k ? net->state : net->params;
        size_t n = k ? (size_t)n_state : (size_t)n_params, bad = 0;
        for (size_t i = 0; i < n; i++) bad += !isfinite(v[i]);
        if (bad) {
            rc = dsrt__fail(DSRT_ECORRUPT, "model: %s: %zu of its %zu %s are not finite", name, bad,
                            n, k ? "running statistics" : "weights");
            goto fail;
        }
    }
    net->version++;
    if (s[S_POSN].present) {
        const uint8_t *p = s[S_POSN].data;
        net->iteration = (int64_t)get64(p + 8);
        if (pos)
            *pos = (dsrt_train_position){(int64_t)get64(p), (int64_t)get64(p + 8), get64(p + 16)};
    }
    if (optp && s[S_OPTM].present && (rc = read_optimizer(&s[S_OPTM], name, net, optp))) goto fail;
    if (optp && *optp && s[S_WOPT].present) {
        int w = 1;
        rc = read_workers(&s[S_WOPT], name, net, *optp, rank, own_world, &w);
        if (workers) *workers = w;
        if (rc) {
            dsrt_optimizer_destroy(*optp);
            *optp = NULL;
            goto fail;
        }
    }
    free(text);
    *netp = net;
    return 0;
fail:
    dsrt_net_destroy(net);
    free(text);
    return rc;
}

/*
 * The header of the file at path checked before the file is read whole: a
 * file that is no model (or a damaged header) is refused from its first
 * bytes, and a model file larger than its header's counts allow (a model's
 * description, parameters and statistics, with their section headers) is
 * refused before its bytes are read into memory. A checkpoint, whose
 * workers' optimizer states have no bound in the header, is bounded only
 * by MAX_FILE.
 */
static int precheck(const char *path) {
    int fd;
    struct stat st;
    int rc = dsrt__open_regular(path, &fd, &st);
    if (rc) return rc;
    uint8_t head[HEADER_SIZE];
    ssize_t got;
    do got = pread(fd, head, sizeof head, 0);
    while (got < 0 && errno == EINTR);
    int err = errno;
    close(fd);
    if (got < 0) return dsrt__fail(-err, "model: %s: %s", path, strerror(err));
    file_header hd;
    if ((rc = read_header(head, (size_t)got, path, &hd))) return rc;
    if (get32(head + 12) != KIND_MODEL) return 0;
    long double most = (long double)HEADER_SIZE + (long double)hd.nsec * (SECTION_HEADER + 8) +
                       MAX_DESC + 4.0L * ((long double)hd.n_params + (long double)hd.n_state);
    if ((long double)st.st_size > most)
        return dsrt__fail(DSRT_ECORRUPT,
                          "model: %s: %lld bytes, more than a model of %llu parameters and %llu "
                          "statistics takes",
                          path, (long long)st.st_size, (unsigned long long)hd.n_params,
                          (unsigned long long)hd.n_state);
    return 0;
}

static int load(const char *path, dsrt_net **net, dsrt_optimizer **opt, dsrt_train_position *pos,
                const dsrt_net_options *options, int rank, int own_world, int *workers) {
    uint8_t *data;
    size_t size;
    if (!path || !net) return dsrt__fail(-EINVAL, "model: no path");
    *net = NULL;
    if (opt) *opt = NULL;
    int rc = precheck(path);
    if (rc) return rc;
    rc = dsrt__read_whole_file(path, MAX_FILE, &data, &size);
    if (rc) return dsrt__fail_prefix(rc, "model");
    rc =
        dsrt__model_read_worker(data, size, path, net, opt, pos, options, rank, own_world, workers);
    free(data);
    return rc;
}

int dsrt_model_load(dsrt_net **net, const char *path, const dsrt_net_options *options) {
    return load(path, net, NULL, NULL, options, 0, 0, NULL);
}

int dsrt_checkpoint_load(const char *path, dsrt_net **net, dsrt_optimizer **opt,
                         dsrt_train_position *pos, const dsrt_net_options *options) {
    return load(path, net, opt, pos, options, 0, 0, NULL);
}

int dsrt__checkpoint_load_worker(const char *path, dsrt_net **net, dsrt_optimizer **opt,
                                 dsrt_train_position *pos, const dsrt_net_options *options,
                                 int rank, int own_world, int *workers) {
    return load(path, net, opt, pos, options, rank, own_world, workers);
}
