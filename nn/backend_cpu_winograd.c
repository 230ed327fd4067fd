/*
 * Winograd's minimal filtering F(2x2, 3x3) for the training convolutions of
 * the CPU backend where oneDNN 2.6 has none: 3x3, stride 1, padding 1, on
 * CPUs without AVX-512 (its Winograd is AVX-512 only, and for inference).
 * A 4x4 patch of the input gives a 2x2 patch of the output with 16
 * multiplications a channel pair instead of 36 (Lavin and Gray, "Fast
 * Algorithms for Convolutional Neural Networks", 2016):
 *
 *   Y = A^T [ (G g G^T) . (B^T d B) ] A
 *
 * summed over the input channels, in 16 matrix products (one a point of
 * the 4x4 transform): M[x] (tiles, K) = V[x] (tiles, C) U[x] (C, K).
 *
 * Tensors are in any layout whose channels come in runs of 8 or more
 * (NHWC, oneDNN's nChw8c and nChw16c: cpu_chans). The work is cut into blocks of
 * output tiles (block_tiles); a thread transforms a block's input patches
 * (V), multiplies (a 6x16 register kernel of fused multiply-adds over C),
 * and transforms back into the output, all in its own scratch, so a block
 * stays in the core's caches. Every output value is summed on one thread in
 * one order: the results do not depend on the number of threads. The
 * backward pass for the input is the same convolution of the output's
 * gradient with the filters turned 180 degrees and their channels swapped
 * (dsrt__wino_weights with backward set).
 */
#include "nn/backend_cpu.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WINO_X86 1
#endif

extern int omp_get_thread_num(void) __attribute__((weak));

/* Output tiles a block: as many as keep a block's transforms (16 points
 * of c + k floats a tile) within WINO_BLOCK_BYTES, a multiple of the
 * register kernel's 6 rows, 6 to 60. */
#ifndef WINO_BLOCK_BYTES
#define WINO_BLOCK_BYTES (512 * 1024)
#endif

static int block_tiles(int c, int k) {
    size_t t = WINO_BLOCK_BYTES / ((size_t)16 * sizeof(float) * (size_t)(c + k));
    return (int)DSRT_MAX(6, DSRT_MIN(60, t / 6 * 6));
}

/* A block's products read every point's filters (16 c k floats): past
 * 256 x 256 channels they no longer stay in a core's cache between blocks,
 * and the direct convolution is faster (ResNet-18's 512-channel 7x7 stage:
 * 1.6x slower by Winograd, whose 2x2 tiles also cover 8x8 for 7x7). Below
 * 32 channels the transforms outweigh the products (ResNet-20's 16-channel
 * stage: no faster forward, a slower backward). */
#define WINO_MAX_CK (256 * 256)
#define WINO_MIN_HW 64

int dsrt__wino_usable(const cpu_backend *be, int c, int k, int h, int w) {
#ifdef WINO_X86
    return be->isa == CPU_ISA_AVX2 && c % 16 == 0 && k % 16 == 0 && c >= 32 && k >= 32 &&
           c * k <= WINO_MAX_CK && h * w >= WINO_MIN_HW;
#else
    (void)be, (void)c, (void)k, (void)h, (void)w;
    return 0;
#endif
}

size_t dsrt__wino_scratch_floats(const cpu_backend *be, int c, int k) {
    return (size_t)dsrt__cpu_team(be) * 16 * block_tiles(c, k) * (size_t)(c + k);
}

/* U = G g G^T of one 3x3 filter g (row-major) into u[x * stride], x the
 * point of the 4x4 transform. */
static void filter_transform(const float g[9], float *u, size_t stride) {
    float t[4][3], r[16];
    for (int j = 0; j < 3; j++) {
        t[0][j] = g[j];
        t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        t[3][j] = g[6 + j];
    }
    for (int i = 0; i < 4; i++) {
        r[i * 4 + 0] = t[i][0];
        r[i * 4 + 1] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
        r[i * 4 + 2] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
        r[i * 4 + 3] = t[i][2];
    }
    for (int x = 0; x < 16; x++) u[(size_t)x * stride] = r[x];
}

typedef struct {
    const float *w;
    float *u;
    int k, c, backward;
} weights_job;

/* Filters [lo, hi) of the outer loop: for forward the input channels (each
 * writing its run of k values a point), for backward the output channels
 * (reading their c filters in a row, writing runs of c). */
static void weights_range(void *ctx, size_t lo, size_t hi) {
    const weights_job *j = ctx;
    size_t plane = (size_t)j->c * j->k;
    for (size_t a = lo; a < hi; a++) {
        int inner = j->backward ? j->c : j->k;
        for (int b = 0; b < inner; b++) {
            if (!j->backward) {
                /* U[x] is (C, K): input channel a, filter b. */
                filter_transform(j->w + ((size_t)b * j->c + a) * 9, j->u + a * j->k + b, plane);
            } else {
                /* The input's gradient: filter a turned 180 degrees, taking
                 * the output's channel a to input channel b; U[x] (K, C). */
                const float *g = j->w + (a * j->c + (size_t)b) * 9;
                float r[9];
                for (int q = 0; q < 9; q++) r[q] = g[8 - q];
                filter_transform(r, j->u + a * j->c + b, plane);
            }
        }
    }
}

void dsrt__wino_weights(cpu_backend *be, const float *w, int k, int c, int backward, float *u) {
    weights_job j = {.w = w, .u = u, .k = k, .c = c, .backward = backward};
    dsrt__cpu_parallel(be, (size_t)(backward ? k : c), weights_range, &j);
}

#ifdef WINO_X86

#define AVX2 __attribute__((target("avx2,fma")))

typedef struct {
    const float *x, *u, *bias;
    float *y, *scratch;
    const cpu_chans *xl, *yl;
    wino_epilogue e;
    size_t per_thread;
    int n, h, w, c, k, th, tw, tb;
    long tiles;
} wino_job;

/* The 4x4 patch of tile t's input, 8 channels from c0, as V rows: each of
 * the 16 points at v[x * tb * C]. */
AVX2 static void input_tile(const wino_job *j, long tile, int row, float *v) {
    int per = j->th * j->tw, n = (int)(tile / per), ty = (int)(tile % per) / j->tw,
        tx = (int)(tile % per) % j->tw;
    int y0 = 2 * ty - 1, x0 = 2 * tx - 1, C = j->c;
    int inside = y0 >= 0 && x0 >= 0 && y0 + 4 <= j->h && x0 + 4 <= j->w;
    const cpu_chans *l = j->xl;
    size_t xs = (size_t)j->tb * C;
    for (int c = 0; c < C; c += 8) {
        const float *img = j->x + (size_t)n * l->s_n + (c / l->inner) * l->s_b + c % l->inner;
        __m256 d[4][4], t[4][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) {
                int yy = y0 + a, xx = x0 + b;
                d[a][b] = inside || (yy >= 0 && yy < j->h && xx >= 0 && xx < j->w)
                              ? _mm256_loadu_ps(img + ((size_t)yy * j->w + xx) * l->inner)
                              : _mm256_setzero_ps();
            }
        for (int b = 0; b < 4; b++) {
            t[0][b] = _mm256_sub_ps(d[0][b], d[2][b]);
            t[1][b] = _mm256_add_ps(d[1][b], d[2][b]);
            t[2][b] = _mm256_sub_ps(d[2][b], d[1][b]);
            t[3][b] = _mm256_sub_ps(d[1][b], d[3][b]);
        }
        float *o = v + (size_t)row * C + c;
        for (int a = 0; a < 4; a++) {
            _mm256_storeu_ps(o + (size_t)(a * 4 + 0) * xs, _mm256_sub_ps(t[a][0], t[a][2]));
            _mm256_storeu_ps(o + (size_t)(a * 4 + 1) * xs, _mm256_add_ps(t[a][1], t[a][2]));
            _mm256_storeu_ps(o + (size_t)(a * 4 + 2) * xs, _mm256_sub_ps(t[a][2], t[a][1]));
            _mm256_storeu_ps(o + (size_t)(a * 4 + 3) * xs, _mm256_sub_ps(t[a][1], t[a][3]));
        }
    }
}

/* m (rows, K) = v (rows, C) u (C, K): 6 rows by 16 columns a register
 * block, each sum over C in order; rows past a multiple of 6 one at a time
 * the same way. */
AVX2 static void multiply(const float *v, const float *u, float *m, int rows, int C, int K) {
    int r = 0;
    for (; r + 6 <= rows; r += 6)
        for (int k = 0; k < K; k += 16) {
            __m256 acc[6][2];
            for (int i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
            const float *uk = u + k, *vr = v + (size_t)r * C;
            for (int c = 0; c < C; c++, uk += K) {
                __m256 u0 = _mm256_loadu_ps(uk), u1 = _mm256_loadu_ps(uk + 8);
                for (int i = 0; i < 6; i++) {
                    __m256 b = _mm256_broadcast_ss(vr + (size_t)i * C + c);
                    acc[i][0] = _mm256_fmadd_ps(b, u0, acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(b, u1, acc[i][1]);
                }
            }
            for (int i = 0; i < 6; i++) {
                _mm256_storeu_ps(m + (size_t)(r + i) * K + k, acc[i][0]);
                _mm256_storeu_ps(m + (size_t)(r + i) * K + k + 8, acc[i][1]);
            }
        }
    for (; r < rows; r++)
        for (int k = 0; k < K; k += 16) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            const float *uk = u + k;
            for (int c = 0; c < C; c++, uk += K) {
                __m256 b = _mm256_broadcast_ss(v + (size_t)r * C + c);
                a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(uk), a0);
                a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(uk + 8), a1);
            }
            _mm256_storeu_ps(m + (size_t)r * K + k, a0);
            _mm256_storeu_ps(m + (size_t)r * K + k + 8, a1);
        }
}

/* y's 2x2 patch of tile t from the 16 products (m rows), with the bias and
 * the ReLU; a patch past the image's edge writes what lies inside. */
AVX2 static void output_tile(const wino_job *j, long tile, int row, const float *m) {
    int per = j->th * j->tw, n = (int)(tile / per), ty = (int)(tile % per) / j->tw,
        tx = (int)(tile % per) % j->tw, K = j->k;
    int rows = DSRT_MIN(2, j->h - 2 * ty), cols = DSRT_MIN(2, j->w - 2 * tx);
    size_t xs = (size_t)j->tb * K;
    const __m256 zero = _mm256_setzero_ps(), leak = _mm256_set1_ps(j->e.leak),
                 leak2 = _mm256_set1_ps(j->e.leak2);
    for (int k = 0; k < K; k += 8) {
        __m256 p[16], s[2][4];
        for (int x = 0; x < 16; x++)
            p[x] = _mm256_loadu_ps(m + (size_t)x * xs + (size_t)row * K + k);
        for (int b = 0; b < 4; b++) {
            s[0][b] = _mm256_add_ps(_mm256_add_ps(p[b], p[4 + b]), p[8 + b]);
            s[1][b] = _mm256_sub_ps(_mm256_sub_ps(p[4 + b], p[8 + b]), p[12 + b]);
        }
        __m256 bias = j->bias ? _mm256_loadu_ps(j->bias + k) : zero;
        for (int a = 0; a < rows; a++) {
            __m256 o[2] = {_mm256_add_ps(_mm256_add_ps(s[a][0], s[a][1]), s[a][2]),
                           _mm256_sub_ps(_mm256_sub_ps(s[a][1], s[a][2]), s[a][3])};
            const cpu_chans *l = j->yl;
            float *y = j->y + (size_t)n * l->s_n + (k / l->inner) * l->s_b + k % l->inner +
                       ((size_t)(2 * ty + a) * j->w + 2 * tx) * l->inner;
            for (int b = 0; b < cols; b++) {
                float *at = y + (size_t)b * l->inner;
                __m256 v = _mm256_add_ps(o[b], bias);
                if (j->e.relu)
                    v = _mm256_blendv_ps(v, _mm256_mul_ps(v, leak),
                                         _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
                if (j->e.sum) v = _mm256_add_ps(v, _mm256_loadu_ps(at));
                if (j->e.relu2)
                    v = _mm256_blendv_ps(v, _mm256_mul_ps(v, leak2),
                                         _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
                _mm256_storeu_ps(at, v);
            }
        }
    }
}

/* Blocks [lo, hi) of tb tiles, in this thread's scratch. */
AVX2 static void blocks(void *ctx, size_t lo, size_t hi) {
    const wino_job *j = ctx;
    int t = omp_get_thread_num ? omp_get_thread_num() : 0;
    float *v = j->scratch + (size_t)t * j->per_thread, *m = v + (size_t)16 * j->tb * j->c;
    for (size_t b = lo; b < hi; b++) {
        long first = (long)b * j->tb;
        int rows = (int)DSRT_MIN((long)j->tb, j->tiles - first);
        for (int r = 0; r < rows; r++) input_tile(j, first + r, r, v);
        for (int x = 0; x < 16; x++)
            multiply(v + (size_t)x * j->tb * j->c, j->u + (size_t)x * j->c * j->k,
                     m + (size_t)x * j->tb * j->k, rows, j->c, j->k);
        for (int r = 0; r < rows; r++) output_tile(j, first + r, r, m);
    }
}

void dsrt__wino_conv(cpu_backend *be, const float *x, const cpu_chans *xl, const float *u,
                     const float *bias, float *y, const cpu_chans *yl, int n, int h, int w, int c,
                     int k, const wino_epilogue *e, float *scratch) {
    wino_job j = {.e = *e,
                  .x = x,
                  .u = u,
                  .bias = bias,
                  .y = y,
                  .scratch = scratch,
                  .xl = xl,
                  .yl = yl,
                  .tb = block_tiles(c, k),
                  .per_thread = (size_t)16 * block_tiles(c, k) * (size_t)(c + k),
                  .n = n,
                  .h = h,
                  .w = w,
                  .c = c,
                  .k = k,
                  .th = (h + 1) / 2,
                  .tw = (w + 1) / 2};
    j.tiles = (long)n * j.th * j.tw;
    dsrt__cpu_parallel(be, (size_t)((j.tiles + j.tb - 1) / j.tb), blocks, &j);
}

// ----------------------------------------------------------------------------
// The weights' gradient: dU[x] (C, K) = sum over tiles of V[x]^T (the input
// patches' transforms) times the output gradient patches' A dY A^T, then
// dW = G^T dU G. Tiles go in chunks of a size set by the channels alone;
// each (point, 16 filters) of dU is one thread's, summed over every tile in
// order, so the result does not depend on the number of threads.

/* Tiles a chunk: its two transforms within WINO_CHUNK_BYTES, 6 to 512. */
#define WINO_CHUNK_BYTES (2 * 1024 * 1024)

static int chunk_tiles(int c, int k) {
    size_t t = WINO_CHUNK_BYTES / ((size_t)16 * sizeof(float) * (size_t)(c + k));
    return (int)DSRT_MAX(6, DSRT_MIN(512, t / 6 * 6));
}

size_t dsrt__wino_wgrad_floats(int c, int k) {
    return (size_t)16 * c * k + (size_t)16 * chunk_tiles(c, k) * (size_t)(c + k);
}

typedef struct {
    wino_job j;        /* x, xl, y (the output gradient), yl, the sizes; tb: the chunk */
    float *v, *g, *du; /* the chunk's transforms; the sums */
    long first;        /* the chunk's first tile */
    int rows;
    float *dw, *db;
} wgrad_job;

/* The 4x4 transform A dY A^T of tile t's 2x2 output gradient (zero past the
 * edge), 8 channels at a time, as rows of g. */
AVX2 static void grad_tile(const wino_job *j, long tile, int row, float *g) {
    int per = j->th * j->tw, n = (int)(tile / per), ty = (int)(tile % per) / j->tw,
        tx = (int)(tile % per) % j->tw, K = j->k;
    int rows = DSRT_MIN(2, j->h - 2 * ty), cols = DSRT_MIN(2, j->w - 2 * tx);
    const cpu_chans *l = j->yl;
    size_t xs = (size_t)j->tb * K;
    for (int k = 0; k < K; k += 8) {
        const float *img = j->y + (size_t)n * l->s_n + (k / l->inner) * l->s_b + k % l->inner;
        __m256 d[2][2];
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                d[a][b] = a < rows && b < cols
                              ? _mm256_loadu_ps(img + ((size_t)(2 * ty + a) * j->w + 2 * tx + b) *
                                                          l->inner)
                              : _mm256_setzero_ps();
        /* A = (1 0; 1 1; 1 -1; 0 -1): rows first, then columns. */
        __m256 t[4][2];
        for (int b = 0; b < 2; b++) {
            t[0][b] = d[0][b];
            t[1][b] = _mm256_add_ps(d[0][b], d[1][b]);
            t[2][b] = _mm256_sub_ps(d[0][b], d[1][b]);
            t[3][b] = _mm256_sub_ps(_mm256_setzero_ps(), d[1][b]);
        }
        float *o = g + (size_t)row * K + k;
        for (int a = 0; a < 4; a++) {
            _mm256_storeu_ps(o + (size_t)(a * 4 + 0) * xs, t[a][0]);
            _mm256_storeu_ps(o + (size_t)(a * 4 + 1) * xs, _mm256_add_ps(t[a][0], t[a][1]));
            _mm256_storeu_ps(o + (size_t)(a * 4 + 2) * xs, _mm256_sub_ps(t[a][0], t[a][1]));
            _mm256_storeu_ps(o + (size_t)(a * 4 + 3) * xs,
                             _mm256_sub_ps(_mm256_setzero_ps(), t[a][1]));
        }
    }
}

/* Tiles [lo, hi) of the chunk: both transforms. */
AVX2 static void wgrad_tiles(void *ctx, size_t lo, size_t hi) {
    const wgrad_job *w = ctx;
    for (size_t r = lo; r < hi; r++) {
        input_tile(&w->j, w->first + (long)r, (int)r, w->v);
        grad_tile(&w->j, w->first + (long)r, (int)r, w->g);
    }
}

/* Units [lo, hi) of (point, 16 filters): du[x][c][k..k+15] += the chunk's
 * rows in order, 4 input channels at a time. */
AVX2 static void wgrad_sums(void *ctx, size_t lo, size_t hi) {
    const wgrad_job *w = ctx;
    int C = w->j.c, K = w->j.k, kb = K / 16;
    for (size_t u = lo; u < hi; u++) {
        int x = (int)(u / (size_t)kb), k = (int)(u % (size_t)kb) * 16;
        const float *v = w->v + (size_t)x * w->j.tb * C, *g = w->g + (size_t)x * w->j.tb * K + k;
        float *du = w->du + (size_t)x * C * K + k;
        for (int c = 0; c < C; c += 4) {
            __m256 a[4][2];
            for (int i = 0; i < 4; i++) {
                a[i][0] = _mm256_loadu_ps(du + (size_t)(c + i) * K);
                a[i][1] = _mm256_loadu_ps(du + (size_t)(c + i) * K + 8);
            }
            const float *vt = v + c;
            for (int t = 0; t < w->rows; t++, vt += C) {
                __m256 g0 = _mm256_loadu_ps(g + (size_t)t * K),
                       g1 = _mm256_loadu_ps(g + (size_t)t * K + 8);
                for (int i = 0; i < 4; i++) {
                    __m256 b = _mm256_broadcast_ss(vt + i);
                    a[i][0] = _mm256_fmadd_ps(b, g0, a[i][0]);
                    a[i][1] = _mm256_fmadd_ps(b, g1, a[i][1]);
                }
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(du + (size_t)(c + i) * K, a[i][0]);
                _mm256_storeu_ps(du + (size_t)(c + i) * K + 8, a[i][1]);
            }
        }
    }
}

/* Filters [lo, hi): dW = G^T dU G, and the bias's gradient, the output
 * gradient's sum over every pixel in order. */
static void wgrad_finish(void *ctx, size_t lo, size_t hi) {
    const wgrad_job *w = ctx;
    int C = w->j.c, K = w->j.k;
    const cpu_chans *l = w->j.yl;
    for (size_t k = lo; k < hi; k++) {
        for (int c = 0; c < C; c++) {
            float d[16], t[3][4];
            for (int x = 0; x < 16; x++) d[x] = w->du[((size_t)x * C + c) * K + k];
            /* G^T = (1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1), on rows then columns. */
            for (int b = 0; b < 4; b++) {
                t[0][b] = d[b] + 0.5f * (d[4 + b] + d[8 + b]);
                t[1][b] = 0.5f * (d[4 + b] - d[8 + b]);
                t[2][b] = 0.5f * (d[4 + b] + d[8 + b]) + d[12 + b];
            }
            float *o = w->dw + ((size_t)k * C + c) * 9;
            for (int a = 0; a < 3; a++) {
                o[a * 3 + 0] = t[a][0] + 0.5f * (t[a][1] + t[a][2]);
                o[a * 3 + 1] = 0.5f * (t[a][1] - t[a][2]);
                o[a * 3 + 2] = 0.5f * (t[a][1] + t[a][2]) + t[a][3];
            }
        }
        if (!w->db) continue;
        double sum = 0;
        size_t px = (size_t)w->j.h * w->j.w;
        for (int n = 0; n < w->j.n; n++) {
            const float *img = w->j.y + (size_t)n * l->s_n + (k / l->inner) * l->s_b + k % l->inner;
            for (size_t p = 0; p < px; p++) sum += img[p * l->inner];
        }
        w->db[k] = (float)sum;
    }
}

void dsrt__wino_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl, const float *dy,
                             const cpu_chans *yl, int n, int h, int w, int c, int k, float *dw,
                             float *db, float *scratch) {
    wgrad_job g = {.j = {.x = x,
                         .y = (float *)dy,
                         .xl = xl,
                         .yl = yl,
                         .n = n,
                         .h = h,
                         .w = w,
                         .c = c,
                         .k = k,
                         .th = (h + 1) / 2,
                         .tw = (w + 1) / 2,
                         .tb = chunk_tiles(c, k)},
                   .dw = dw,
                   .db = db};
    g.j.tiles = (long)n * g.j.th * g.j.tw;
    g.du = scratch;
    g.v = scratch + (size_t)16 * c * k;
    g.g = g.v + (size_t)16 * g.j.tb * c;
    memset(g.du, 0, (size_t)16 * c * k * sizeof(float));
    for (g.first = 0; g.first < g.j.tiles; g.first += g.j.tb) {
        g.rows = (int)DSRT_MIN((long)g.j.tb, g.j.tiles - g.first);
        dsrt__cpu_parallel(be, (size_t)g.rows, wgrad_tiles, &g);
        dsrt__cpu_parallel(be, (size_t)16 * (k / 16), wgrad_sums, &g);
    }
    dsrt__cpu_parallel(be, (size_t)k, wgrad_finish, &g);
}

#else

void dsrt__wino_conv(cpu_backend *be, const float *x, const cpu_chans *xl, const float *u,
                     const float *bias, float *y, const cpu_chans *yl, int n, int h, int w, int c,
                     int k, const wino_epilogue *e, float *scratch) {
    (void)be, (void)x, (void)xl, (void)u, (void)bias, (void)y, (void)yl, (void)n, (void)h, (void)w;
    (void)c, (void)k, (void)e, (void)scratch; /* never chosen: dsrt__wino_usable says 0 */
}

void dsrt__wino_weights_grad(cpu_backend *be, const float *x, const cpu_chans *xl, const float *dy,
                             const cpu_chans *yl, int n, int h, int w, int c, int k, float *dw,
                             float *db, float *scratch) {
    (void)be, (void)x, (void)xl, (void)dy, (void)yl, (void)n, (void)h, (void)w, (void)c;
    (void)k, (void)dw, (void)db, (void)scratch; /* never chosen */
}

size_t dsrt__wino_wgrad_floats(int c, int k) {
    (void)c, (void)k;
    return 0;
}

#endif
