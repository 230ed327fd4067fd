/*
 * ONNX import: a tensor's values, from any of its storages (raw bytes,
 * typed fields, external data files read with pread from the model's
 * folder, never through a link out of it), as floats or integers.
 */
#include "nn/onnx.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ONNX raw_data is little-endian; add byte swapping for this target"
#endif

// ----------------------------------------------------------------------------
// Tensors' values

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (!man) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Releases the pages of [p, p + n) that lie wholly inside it: what was
 * copied out of the model's bytes is not kept. */
static void release(const uint8_t *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* One of the copies of t that the import makes is made: after the last,
 * the pages of the model's bytes that held it go (an anonymous mapping's
 * pages read back as zeros, so never before). */
void dsrt__onnx_copied(onnx_import *c, onnx_tensor *t) {
    if (--t->reads > 0 || !c->own_map || !t->has_raw) return;
    if (t->raw.p >= c->map && t->raw.p < c->map + c->map_size) release(t->raw.p, t->raw.n);
}

/* n values of type d, little-endian at p, as floats into dst. */
static void convert(int d, const uint8_t *p, size_t n, float *dst) {
    if (d == ONNX_FLOAT) {
        memcpy(dst, p, n * 4);
    } else if (d == ONNX_DOUBLE) {
        for (size_t i = 0; i < n; i++) {
            double x;
            memcpy(&x, p + 8 * i, 8);
            dst[i] = (float)x;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            dst[i] = d == ONNX_FLOAT16 ? half_to_float(h) : bf16_to_float(h);
        }
    }
}

/* Whether real (a path without links) is inside the folder dir (also one). */
static int inside(const char *real, const char *dir) {
    size_t n = strlen(dir);
    if (strncmp(real, dir, n) != 0) return 0;
    return dir[n - 1] == '/' ? real[n] != '\0' : real[n] == '/';
}

/*
 * The external file of t: its location checked (relative, without '..'),
 * every link on the way followed and the file found inside the model's
 * folder, its size taken; once for all the tensors in it. A link is
 * followed where it stays inside the folder (a weights file linked beside
 * its model), never out of it.
 */
static int external(onnx_import *c, const onnx_tensor *t, onnx_ext_file **out) {
    char loc[ONNX_NAME_MAX + 1];
    onnx_str l = t->location;
    if (!c->dir)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED,
                               "tensor '%s': external data without a model folder",
                               ONNX_SHOWN(t->name));
    if (memchr(l.p, 0, l.n) || l.p[0] == '/')
        return dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "tensor '%s': external data at '%s': only a path relative to the model's "
            "folder is read",
            ONNX_SHOWN(t->name), ONNX_SHOWN(l));
    memcpy(loc, l.p, l.n);
    loc[l.n] = '\0';
    for (const char *s = loc; *s;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 2 && s[0] == '.' && s[1] == '.')
            return dsrt__onnx_fail(
                c, DSRT_EUNSUPPORTED,
                "tensor '%s': external data at '%s': a location with '..' is refused "
                "(it must lie in the model's folder)",
                ONNX_SHOWN(t->name), loc);
        s += len + (e != NULL);
    }
    for (int i = c->n_ext - 1; i >= 0; i--)
        if (!strcmp(c->ext[i].location, loc)) {
            *out = &c->ext[i];
            return 0;
        }
    if (!c->real_dir && !(c->real_dir = realpath(c->dir, NULL))) {
        int e = errno;
        return dsrt__onnx_fail(c, -e, "tensor '%s': external data: the model's folder %s: %s",
                               ONNX_SHOWN(t->name), c->dir, strerror(e));
    }
    onnx_ext_file *grown = realloc(c->ext, (size_t)(c->n_ext + 1) * sizeof *c->ext);
    if (!grown) return dsrt__fail(-ENOMEM, "out of memory");
    c->ext = grown;
    size_t plen = strlen(c->dir) + strlen(loc) + 2;
    char *path = dsrt__malloc(plen), *real = NULL;
    if (!path) return -ENOMEM;
    snprintf(path, plen, "%s/%s", c->dir, loc);
    real = realpath(path, NULL);
    int e = errno;
    free(path);
    if (!real)
        return dsrt__onnx_fail(c, -e, "tensor '%s': external data '%s': %s", ONNX_SHOWN(t->name),
                               loc, strerror(e));
    if (!inside(real, c->real_dir)) {
        int rc = dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "tensor '%s': external data '%s' lies outside the model's folder (a link "
            "leads to %s)",
            ONNX_SHOWN(t->name), loc, real);
        free(real);
        return rc;
    }
    int fd;
    struct stat st;
    int rc = dsrt__open_regular(real, &fd, &st);
    if (rc) {
        free(real);
        return dsrt__onnx_fail(c, rc, "tensor '%s': external data '%s': %s", ONNX_SHOWN(t->name),
                               loc, dsrt_last_error());
    }
    close(fd);
    onnx_ext_file *x = &c->ext[c->n_ext];
    if (!(x->location = dsrt__strdup(loc))) {
        free(real);
        return -ENOMEM;
    }
    x->path = real;
    x->size = (uint64_t)st.st_size;
    c->n_ext++;
    *out = x;
    return 0;
}

/* t's external file, with its bytes' span in it checked against the
 * file's size and the tensor's shape. */
int dsrt__onnx_external_span(onnx_import *c, const onnx_tensor *t, onnx_ext_file **x) {
    uint64_t want = t->count * (uint64_t)dsrt__onnx_dtype_size(t->dtype);
    int rc = external(c, t, x);
    if (rc) return rc;
    uint64_t size = (*x)->size;
    if (t->ext_offset > size || (t->has_ext_length && t->ext_length != want) ||
        want > size - t->ext_offset || (!t->has_ext_length && size - t->ext_offset != want))
        return dsrt__onnx_fail(
            c, DSRT_ECORRUPT,
            "tensor '%s': external data '%s': %s%llu bytes at offset %llu of a file of "
            "%llu; its shape makes %llu bytes",
            ONNX_SHOWN(t->name), ONNX_SHOWN(t->location), t->has_ext_length ? "" : "the rest, ",
            (unsigned long long)(t->has_ext_length ? t->ext_length
                                                   : size - DSRT_MIN(size, t->ext_offset)),
            (unsigned long long)t->ext_offset, (unsigned long long)size, (unsigned long long)want);
    return 0;
}

/* n bytes at off of t's external file (open as fd) into dst, to the last
 * one: a file that has shrunk since it was measured is an error naming it. */
static int read_at(onnx_import *c, const onnx_tensor *t, int fd, uint64_t off, void *dst,
                   size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, (uint8_t *)dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            return dsrt__onnx_fail(c, -e, "tensor '%s': external data '%s': %s",
                                   ONNX_SHOWN(t->name), ONNX_SHOWN(t->location), strerror(e));
        }
        if (r == 0)
            return dsrt__onnx_fail(
                c, DSRT_ETRUNCATED,
                "tensor '%s': external data '%s': the file ends at byte %llu, inside "
                "the tensor's bytes (it changed while it was read)",
                ONNX_SHOWN(t->name), ONNX_SHOWN(t->location), (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return 0;
}

/* t's external values as floats into dst: read with pread (never mapped,
 * so a file cut short while it is read is an error, not a SIGBUS), float32
 * straight into dst, other types a block at a time. */
static int external_floats(onnx_import *c, const onnx_tensor *t, float *dst) {
    onnx_ext_file *x;
    int fd, rc = dsrt__onnx_external_span(c, t, &x);
    if (rc) return rc;
    struct stat st;
    if ((rc = dsrt__open_regular(x->path, &fd, &st)))
        return dsrt__onnx_fail(c, rc, "tensor '%s': external data '%s': %s", ONNX_SHOWN(t->name),
                               x->location, dsrt_last_error());
    size_t n = (size_t)t->count, width = (size_t)dsrt__onnx_dtype_size(t->dtype);
    if (t->dtype == ONNX_FLOAT) {
        rc = read_at(c, t, fd, t->ext_offset, dst, n * width);
    } else {
        uint8_t buf[16384];
        for (size_t at = 0; at < n && !rc; at += sizeof buf / width) {
            size_t k = DSRT_MIN(n - at, sizeof buf / width);
            if (!(rc = read_at(c, t, fd, t->ext_offset + at * width, buf, k * width)))
                convert(t->dtype, buf, k, dst + at);
        }
    }
    close(fd);
    return rc;
}

/*
 * t's values as floats into dst (t->count of them, in the tensor's order):
 * float32, float16, bfloat16 and float64 tensors, from any of their
 * storages.
 */
int dsrt__onnx_tensor_floats(onnx_import *c, const onnx_tensor *t, float *dst) {
    size_t n = (size_t)t->count;
    if (t->made_f) {
        memcpy(dst, t->made_f, n * sizeof *dst);
        return 0;
    }
    int d = t->dtype;
    if (d != ONNX_FLOAT && d != ONNX_FLOAT16 && d != ONNX_BFLOAT16 && d != ONNX_DOUBLE)
        return dsrt__onnx_fail(
            c, DSRT_EUNSUPPORTED,
            "tensor '%s' holds %s values (dsrt reads float32, float16 and bfloat16 "
            "weights)",
            ONNX_SHOWN(t->name), dsrt__onnx_dtype_name(d));
    if (t->external) return external_floats(c, t, dst);
    if (t->has_raw) {
        convert(d, t->raw.p, n, dst);
        return 0;
    }
    /* Typed fields: float_data (fixed32), int32_data (float16 and bfloat16
     * bits as varints), double_data (fixed64); packed or not. */
    int field = d == ONNX_FLOAT ? 4 : d == ONNX_DOUBLE ? 10 : 5;
    dsrt_pb r = dsrt__pb_open(t->msg, c->map);
    dsrt_pb_field f;
    size_t at = 0;
    int rc;
    while ((rc = dsrt__pb_next(&r, &f)) > 0 && at < n) {
        if ((int)f.number != field) continue;
        if (f.wire != DSRT_PB_BYTES) {
            uint64_t u = f.u;
            if (field == 4) {
                uint32_t w = (uint32_t)u;
                memcpy(&dst[at++], &w, 4);
            } else if (field == 10) {
                double x;
                memcpy(&x, &u, 8);
                dst[at++] = (float)x;
            } else {
                dst[at++] =
                    d == ONNX_FLOAT16 ? half_to_float((uint16_t)u) : bf16_to_float((uint16_t)u);
            }
            continue;
        }
        const uint8_t *p = f.b.p, *end = f.b.p + f.b.n;
        while (p < end && at < n) {
            if (field == 4) {
                memcpy(&dst[at++], p, 4);
                p += 4;
            } else if (field == 10) {
                double x;
                memcpy(&x, p, 8);
                dst[at++] = (float)x;
                p += 8;
            } else {
                uint64_t u;
                size_t k = dsrt__pb_varint(p, end, &u);
                if (!k) break;
                dst[at++] =
                    d == ONNX_FLOAT16 ? half_to_float((uint16_t)u) : bf16_to_float((uint16_t)u);
                p += k;
            }
        }
    }
    if (rc < 0 || at != n)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "tensor '%s': %zu of its %zu values could be read",
                               ONNX_SHOWN(t->name), at, n);
    return 0;
}

/* A small integer tensor (a shape) into out (at most cap values); returns
 * the count or < 0. */
int dsrt__onnx_tensor_ints(onnx_import *c, const onnx_tensor *t, int64_t *out, int cap) {
    if (t->count > (uint64_t)cap)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "tensor '%s': %llu values, more than %d",
                               ONNX_SHOWN(t->name), (unsigned long long)t->count, cap);
    int n = (int)t->count;
    if (t->made_i) {
        memcpy(out, t->made_i, (size_t)n * sizeof *out);
        return n;
    }
    if (t->dtype != ONNX_INT64 && t->dtype != ONNX_INT32)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "tensor '%s' holds %s values, not integers",
                               ONNX_SHOWN(t->name), dsrt__onnx_dtype_name(t->dtype));
    if (t->external)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "tensor '%s': a shape in external data",
                               ONNX_SHOWN(t->name));
    if (t->has_raw) {
        for (int i = 0; i < n; i++) {
            if (t->dtype == ONNX_INT64) {
                memcpy(&out[i], t->raw.p + 8 * i, 8);
            } else {
                int32_t v;
                memcpy(&v, t->raw.p + 4 * i, 4);
                out[i] = v;
            }
        }
        return n;
    }
    int field = t->dtype == ONNX_INT64 ? 7 : 5, at = 0, rc;
    dsrt_pb r = dsrt__pb_open(t->msg, c->map);
    dsrt_pb_field f;
    while ((rc = dsrt__pb_next(&r, &f)) > 0 && at < n) {
        if ((int)f.number != field) continue;
        if (f.wire != DSRT_PB_BYTES) {
            out[at++] = field == 7 ? (int64_t)f.u : (int64_t)(int32_t)f.u;
            continue;
        }
        const uint8_t *p = f.b.p, *end = p + f.b.n;
        uint64_t u;
        size_t k;
        while (p < end && at < n && (k = dsrt__pb_varint(p, end, &u))) {
            out[at++] = field == 7 ? (int64_t)u : (int64_t)(int32_t)u;
            p += k;
        }
    }
    if (rc < 0 || at != n)
        return dsrt__onnx_fail(c, DSRT_ECORRUPT, "tensor '%s': %d of its %d values could be read",
                               ONNX_SHOWN(t->name), at, n);
    return n;
}

/* A one-element float or bool constant's value. */
int dsrt__onnx_scalar(onnx_import *c, const onnx_tensor *t, double *out) {
    if (t->count != 1)
        return dsrt__onnx_fail(c, DSRT_EUNSUPPORTED, "tensor '%s' has %llu values, not one",
                               ONNX_SHOWN(t->name), (unsigned long long)t->count);
    if (t->dtype == ONNX_BOOL && t->has_raw) {
        *out = t->raw.p[0] != 0;
        return 0;
    }
    if (t->dtype == ONNX_BOOL || t->dtype == ONNX_INT64 || t->dtype == ONNX_INT32) {
        int64_t v;
        onnx_tensor u = *t;
        if (t->dtype == ONNX_BOOL) u.dtype = ONNX_INT32;
        int rc = dsrt__onnx_tensor_ints(c, &u, &v, 1);
        if (rc < 0) return rc;
        *out = (double)v;
        return 0;
    }
    float f;
    int rc = dsrt__onnx_tensor_floats(c, t, &f);
    *out = f;
    return rc;
}
