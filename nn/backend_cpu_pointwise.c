/*
 * The weights' gradient of pointwise (1x1) training convolutions on CPUs
 * without AVX-512:
 *
 *   dW (k, c) = sum over the output's pixels p of dY (k, p) X (c, s p)
 *
 * (s the stride; no padding, no dilation). oneDNN 2.6's 1x1 kernel takes
 * it at about 200 GFLOP/s on two Zen 5 cores capped to AVX2 in ResNet-50
 * at batch 16 (its forward 240), a sixth of the step; this one at 205 to
 * 230, mostly 215 and up.
 *
 * A register block holds 6 output by 16 input channels of dW: each pixel
 * adds 6 broadcast values of dY times two vectors of X's 16 channels (12
 * fused multiply-adds to 8 loads). The pixels go in chunks of PW_CHUNK; a
 * thread owns a contiguous range of blocks, input-channel group by group,
 * and runs every chunk through them in order: it packs a group's 16
 * channels of the chunk (any stride) into 16 KB that stay in the
 * first-level cache while the output gradient's chunk streams past, and
 * reads and writes dW once a chunk. Every value of dW is one thread's,
 * summed over the pixels in order: the result does not depend on the
 * number of threads. Tensors are in any layout whose channels come in runs
 * of 8 or more (cpu_chans).
 */
#include "nn/backend_cpu.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PW_X86 1
#endif

#define PW_ROWS  6   /* output channels a register block */
#define PW_COLS  16  /* input channels a register block */
#define PW_CHUNK 256 /* output pixels a chunk: a group's 16 KB of X */

int dsrt__pw_wgrad_usable(const cpu_backend *be, int c) {
#ifdef PW_X86
    return be->pointwise && be->isa == CPU_ISA_AVX2 && c % PW_COLS == 0;
#else
    (void)be, (void)c;
    return 0;
#endif
}

#ifdef PW_X86

#define AVX2 __attribute__((target("avx2,fma")))

typedef struct {
    const float *x, *dy;
    const cpu_chans *xl, *yl;
    float *dw, *db;
    int ow, iw, sh, sw, c, k;
    int kgroups;   /* blocks of PW_ROWS output channels */
    long per, run; /* output pixels an image; a run whose inputs lie evenly spaced */
    long pixels;
    /* The outputs summed over: a window of vw columns from (oy0, ox0) (all
     * of them for a 1x1 convolution), and the offset of their inputs in X
     * (pixels, may be negative: a tap of a padded filter). */
    int oy0, ox0, vw;
    long x0;
} pw_job;

/* A run of a chunk's pixels whose inputs lie evenly spaced: its first
 * pixel's offsets in X and dY (past the channels'), its length. */
typedef struct {
    size_t x, d;
    long cnt;
} pw_seg;

#define PW_SEGS 64 /* runs a chunk at most */

/* acc (rows x 16) += the products of cnt pixels: X's 16 channels packed at
 * x (16 floats a pixel), dY's rows at d + off[r], dstep floats a pixel.
 * Two pixels a turn, each turn fetching dY's lines PW_AHEAD pixels on (the
 * first input-channel group of a chunk reads them from memory: the
 * hardware's prefetcher alone leaves the 56x56 layers at two thirds of the
 * rate they reach in cache). */
#define PW_AHEAD 128

AVX2 static inline __attribute__((always_inline)) void pw_block(int rows, const float *x,
                                                                const float *d, size_t dstep,
                                                                const size_t *off, long cnt,
                                                                __m256 acc[PW_ROWS][2]) {
    /* In locals: stores through acc (__m256 may alias floats) would keep
     * the sums in memory. */
    __m256 a[PW_ROWS][2];
    for (int r = 0; r < rows; r++) a[r][0] = acc[r][0], a[r][1] = acc[r][1];
    long q = 0;
    for (; q + 2 <= cnt; q += 2, x += 2 * PW_COLS, d += 2 * dstep) {
        _mm_prefetch((const char *)(d + off[0] + PW_AHEAD * dstep), _MM_HINT_T0);
        _mm_prefetch((const char *)(d + off[rows - 1] + PW_AHEAD * dstep), _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            __m256 x0 = _mm256_load_ps(x + h * PW_COLS), x1 = _mm256_load_ps(x + h * PW_COLS + 8);
            for (int r = 0; r < rows; r++) {
                __m256 b = _mm256_broadcast_ss(d + h * dstep + off[r]);
                a[r][0] = _mm256_fmadd_ps(b, x0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(b, x1, a[r][1]);
            }
        }
    }
    if (q < cnt) {
        __m256 x0 = _mm256_load_ps(x), x1 = _mm256_load_ps(x + 8);
        for (int r = 0; r < rows; r++) {
            __m256 b = _mm256_broadcast_ss(d + off[r]);
            a[r][0] = _mm256_fmadd_ps(b, x0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(b, x1, a[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) acc[r][0] = a[r][0], acc[r][1] = a[r][1];
}

/* X's channels [c0, c0 + 16) over a chunk's runs, packed into xp: 16
 * floats a pixel in the chunk's order, read once from memory and then by
 * every block of output channels. */
AVX2 static void pw_pack(const pw_job *j, int c0, const pw_seg *seg, int ns, float *xp) {
    const cpu_chans *xl = j->xl;
    const float *xa = j->x + (size_t)c0 / xl->inner * xl->s_b + (size_t)c0 % xl->inner,
                *xb = j->x + (size_t)(c0 + 8) / xl->inner * xl->s_b + (size_t)(c0 + 8) % xl->inner;
    size_t step = (size_t)j->sw * xl->inner;
    for (int s = 0; s < ns; s++) {
        const float *a = xa + seg[s].x, *b = xb + seg[s].x;
        for (long q = 0; q < seg[s].cnt; q++, a += step, b += step, xp += PW_COLS) {
            _mm_prefetch((const char *)(a + 64 * step), _MM_HINT_T0);
            _mm_prefetch((const char *)(b + 64 * step), _MM_HINT_T0);
            _mm256_store_ps(xp, _mm256_loadu_ps(a));
            _mm256_store_ps(xp + 8, _mm256_loadu_ps(b));
        }
    }
}

/* Block u (input-channel group u / kgroups, output rows u % kgroups) over
 * a chunk's runs (X's group packed in xp), each through pw_block with the
 * rows a constant; first: the chunk is the first (dw not yet summed into). */
AVX2 static void pw_unit(const pw_job *j, size_t u, const float *xp, const pw_seg *seg, int ns,
                         int first) {
    int c0 = (int)(u / (size_t)j->kgroups) * PW_COLS, k0 = (int)(u % (size_t)j->kgroups) * PW_ROWS;
    int rows = DSRT_MIN(PW_ROWS, j->k - k0);
    const cpu_chans *yl = j->yl;
    __m256 acc[PW_ROWS][2];
    float *dw = j->dw + (size_t)k0 * j->c + c0;
    for (int r = 0; r < PW_ROWS; r++)
        for (int h = 0; h < 2; h++)
            acc[r][h] = r < rows && !first ? _mm256_loadu_ps(dw + (size_t)r * j->c + 8 * h)
                                           : _mm256_setzero_ps();
    size_t off[PW_ROWS] = {0};
    for (int r = 0; r < rows; r++)
        off[r] = (size_t)(k0 + r) / yl->inner * yl->s_b + (size_t)(k0 + r) % yl->inner;
    size_t dstep = yl->inner;
    for (int s = 0; s < ns; xp += (size_t)seg[s].cnt * PW_COLS, s++) {
        const float *d = j->dy + seg[s].d;
        long cnt = seg[s].cnt;
        /* The rows a constant in each call, so that the sums stay in
         * registers. */
#define PW_ROWS_CASE(n)                                                                            \
    case n:                                                                                        \
        pw_block(n, xp, d, dstep, off, cnt, acc);                                                  \
        break
        switch (rows) {
            PW_ROWS_CASE(6);
            PW_ROWS_CASE(5);
            PW_ROWS_CASE(4);
            PW_ROWS_CASE(3);
            PW_ROWS_CASE(2);
        default:
            pw_block(1, xp, d, dstep, off, cnt, acc);
#undef PW_ROWS_CASE
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_ps(dw + (size_t)r * j->c, acc[r][0]);
        _mm256_storeu_ps(dw + (size_t)r * j->c + 8, acc[r][1]);
    }
}

/* Blocks [lo, hi), every chunk of pixels through them in order: a chunk
 * ends at PW_CHUNK pixels or PW_SEGS runs of X, whichever comes first. dY
 * is dense: its runs end only with an image. */
AVX2 static void pw_range(void *ctx, size_t lo, size_t hi) {
    const pw_job *j = ctx;
    const cpu_chans *xl = j->xl, *yl = j->yl;
    pw_seg xs[PW_SEGS], ds[PW_SEGS];
    float xp[PW_CHUNK * PW_COLS] __attribute__((aligned(64)));
    for (long p = 0; p < j->pixels;) {
        long stop = DSRT_MIN(j->pixels, p + PW_CHUNK), p0 = p;
        int nx = 0, nd = 0;
        while (p < stop && nx < PW_SEGS) {
            long img = p / j->per, q = p % j->per;
            long end = DSRT_MIN(stop, p - q % j->run + j->run);
            long oy = j->oy0 + q / j->vw, ox = j->ox0 + q % j->vw;
            long at = (oy * j->sh * j->iw + ox * j->sw) + j->x0;
            xs[nx++] =
                (pw_seg){.x = (size_t)img * xl->s_n + (size_t)at * xl->inner, .cnt = end - p};
            /* dY's runs join within an image where the window is whole
             * rows. */
            if (nd && q && j->vw == j->ow)
                ds[nd - 1].cnt += end - p;
            else
                ds[nd++] =
                    (pw_seg){.d = (size_t)img * yl->s_n + (size_t)(oy * j->ow + ox) * yl->inner,
                             .cnt = end - p};
            p = end;
        }
        size_t packed = (size_t)-1;
        for (size_t u = lo; u < hi; u++) {
            size_t g = u / (size_t)j->kgroups;
            if (g != packed) pw_pack(j, (int)g * PW_COLS, xs, nx, xp);
            packed = g;
            pw_unit(j, u, xp, ds, nd, p0 == 0);
        }
    }
}

/* The bias's gradient of output channels [8 lo, 8 hi) where dY's runs of
 * channels are multiples of 8 (else channels [lo, hi)): dY's sum over
 * every pixel, in order, in double. */
AVX2 static void pw_bias(void *ctx, size_t lo, size_t hi) {
    const pw_job *j = ctx;
    const cpu_chans *l = j->yl;
    if (l->inner % 8 == 0) {
        for (size_t k = 8 * lo; k < 8 * hi; k += 8) {
            __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
            for (long i = 0; i < j->pixels / j->per; i++) {
                const float *d = j->dy + (size_t)i * l->s_n + k / l->inner * l->s_b + k % l->inner;
                for (long p = 0; p < j->per; p++, d += l->inner) {
                    __m256 v = _mm256_loadu_ps(d);
                    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
                    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
                }
            }
            double s[8];
            _mm256_storeu_pd(s, s0);
            _mm256_storeu_pd(s + 4, s1);
            for (size_t q = k; q < k + 8 && q < (size_t)j->k; q++) j->db[q] = (float)s[q - k];
        }
        return;
    }
    for (size_t k = lo; k < hi; k++) {
        double sum = 0;
        for (long i = 0; i < j->pixels / j->per; i++) {
            const float *d = j->dy + (size_t)i * l->s_n + k / l->inner * l->s_b + k % l->inner;
            for (long p = 0; p < j->per; p++) sum += d[(size_t)p * l->inner];
        }
        j->db[k] = (float)sum;
    }
}

/* The job of x, dy and dw over the window of vh x vw outputs from (oy0,
 * ox0) whose inputs lie x0 pixels on. */
static void pw_window(pw_job *j, int n, int oy0, int ox0, int vh, int vw, long x0) {
    j->oy0 = oy0;
    j->ox0 = ox0;
    j->vw = vw;
    j->x0 = x0;
    j->per = (long)vh * vw;
    /* A strided input's pixels are evenly spaced within a row; at stride 1
     * through a whole image. */
    j->run = j->sh == 1 && j->sw == 1 && vw == j->ow && (long)j->iw == j->ow ? j->per : vw;
    j->pixels = (long)n * j->per;
}

static void pw_sums(cpu_backend *be, pw_job *j) {
    if (!j->pixels)
        memset(j->dw, 0, (size_t)j->k * j->c * sizeof *j->dw);
    else
        dsrt__cpu_parallel(be, (size_t)(j->c / PW_COLS) * j->kgroups, pw_range, j);
}

/* db: dY's sums over the pixels (every pixel of every image). */
static void pw_bias_sums(cpu_backend *be, pw_job *j, int n, int oh) {
    pw_window(j, n, 0, 0, oh, j->ow, 0);
    dsrt__cpu_parallel(be, j->yl->inner % 8 == 0 ? (size_t)(j->k + 7) / 8 : (size_t)j->k, pw_bias,
                       j);
}

static pw_job pw_job_of(const float *x, const cpu_chans *xl, const float *dy, const cpu_chans *yl,
                        float *dw, float *db, int ow, int iw, int sh, int sw, int c, int k) {
    return (pw_job){.x = x,
                    .dy = dy,
                    .xl = xl,
                    .yl = yl,
                    .dw = dw,
                    .db = db,
                    .ow = ow,
                    .iw = iw,
                    .sh = sh,
                    .sw = sw,
                    .c = c,
                    .k = k,
                    .kgroups = (k + PW_ROWS - 1) / PW_ROWS};
}

void dsrt__pw_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl, const float *dy,
                           const cpu_chans *yl, int n, int oh, int ow, int iw, int sh, int sw,
                           int c, int k, float *dw, float *db) {
    pw_job j = pw_job_of(x, xl, dy, yl, dw, db, ow, iw, sh, sw, c, k);
    pw_window(&j, n, 0, 0, oh, ow, 0);
    pw_sums(be, &j);
    if (db) pw_bias_sums(be, &j, n, oh);
}

/* The first output index o from 0 whose input o s + d lies at or past 0,
 * and the end of those whose input lies before n. */
static int first_in(int s, int d) {
    return d >= 0 ? 0 : (-d + s - 1) / s;
}

static int end_in(int s, int d, int n, int outs) {
    int e = n - d <= 0 ? 0 : (n - d + s - 1) / s;
    return DSRT_MIN(e, outs);
}

typedef struct {
    const float *tap;
    float *dw;
    size_t per, taps, k_c; /* c floats an output channel, taps a filter, k c a tap */
} pw_spread_job;

/* Output channels [lo, hi): each filter's taps from the taps' sums. */
static void pw_spread(void *ctx, size_t lo, size_t hi) {
    const pw_spread_job *s = ctx;
    for (size_t o = lo; o < hi; o++)
        for (size_t i = 0; i < s->per; i++)
            for (size_t q = 0; q < s->taps; q++)
                s->dw[(o * s->per + i) * s->taps + q] = s->tap[q * s->k_c + o * s->per + i];
}

void dsrt__pw_taps_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl,
                                const float *dy, const cpu_chans *yl, const pw_taps *t, float *dw,
                                float *db, float *tap) {
    pw_job j = pw_job_of(x, xl, dy, yl, tap, db, t->ow, t->iw, t->sh, t->sw, t->c, t->k);
    int taps = t->kh * t->kw;
    for (int ky = 0; ky < t->kh; ky++)
        for (int kx = 0; kx < t->kw; kx++) {
            int dy0 = ky - t->pt, dx0 = kx - t->pl;
            int oy0 = first_in(t->sh, dy0), oy1 = end_in(t->sh, dy0, t->ih, t->oh);
            int ox0 = first_in(t->sw, dx0), ox1 = end_in(t->sw, dx0, t->iw, t->ow);
            int vh = DSRT_MAX(0, oy1 - oy0), vw = DSRT_MAX(0, ox1 - ox0);
            j.dw = tap + (size_t)(ky * t->kw + kx) * t->k * t->c;
            pw_window(&j, vh && vw ? t->n : 0, oy0, ox0, vh, vw ? vw : 1, (long)dy0 * t->iw + dx0);
            pw_sums(be, &j);
        }
    pw_spread_job sp = {.tap = tap,
                        .dw = dw,
                        .per = (size_t)t->c,
                        .taps = (size_t)taps,
                        .k_c = (size_t)t->k * t->c};
    dsrt__cpu_parallel(be, (size_t)t->k, pw_spread, &sp);
    if (db) pw_bias_sums(be, &j, t->n, t->oh);
}

#else

void dsrt__pw_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl, const float *dy,
                           const cpu_chans *yl, int n, int oh, int ow, int iw, int sh, int sw,
                           int c, int k, float *dw, float *db) {
    (void)be, (void)x, (void)xl, (void)dy, (void)yl, (void)n, (void)oh, (void)ow, (void)iw;
    (void)sh, (void)sw, (void)c, (void)k, (void)dw, (void)db; /* never chosen: not usable */
}

void dsrt__pw_taps_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl,
                                const float *dy, const cpu_chans *yl, const pw_taps *t, float *dw,
                                float *db, float *tap) {
    (void)be, (void)x, (void)xl, (void)dy, (void)yl, (void)t, (void)dw, (void)db, (void)tap;
}

#endif
