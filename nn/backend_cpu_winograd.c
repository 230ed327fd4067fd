/*
 * Winograd's minimal filtering F(m x m, 3x3), m = 4 (or 2), for the
 * training convolutions of the CPU backend where oneDNN 2.6 has none: 3x3,
 * stride 1, padding 1, on CPUs without AVX-512 (its Winograd is AVX-512
 * only, and for inference). An (m+2)x(m+2) patch of the input gives an
 * m x m patch of the output with (m+2)^2 multiplications a channel pair
 * instead of 9 m^2: 36 for 16 outputs where the direct method does 144
 * (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
 * 2016):
 *
 *   Y = A^T [ (G g G^T) . (B^T d B) ] A
 *
 * summed over the input channels, in (m+2)^2 matrix products (one a point
 * of the transform): M[x] (tiles, K) = V[x] (tiles, C) U[x] (C, K).
 *
 * Tensors are in any layout whose channels come in runs of 8 or more
 * (NHWC, oneDNN's nChw8c and nChw16c: cpu_chans). The work is cut into
 * blocks of output tiles (block_tiles); a thread transforms a block's input
 * patches (V), multiplies (a 6x16 register kernel of fused multiply-adds
 * over C), and transforms back into the output, all in its own scratch, so
 * a block stays in the core's caches; where the filters' transforms are
 * too large for that, in stages (staged). Every output value is summed on
 * one thread in one order: the results do not depend on the number of
 * threads. The backward pass for the input is the same convolution of the
 * output's gradient with the filters turned 180 degrees and their channels
 * swapped (dsrt__wino_weights with backward set).
 */
#include "nn/backend_cpu.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define WINO_X86 1
#endif

extern int omp_get_thread_num(void) __attribute__((weak));

/* Output tiles a block: as many as keep a block's transforms (pts points
 * of c + k floats a tile) within WINO_BLOCK_BYTES, a multiple of the
 * register kernel's 6 rows, 6 to 60. */
#ifndef WINO_BLOCK_BYTES
#define WINO_BLOCK_BYTES (512 * 1024)
#endif

static int block_tiles(int pts, int c, int k) {
    size_t t = WINO_BLOCK_BYTES / ((size_t)pts * sizeof(float) * (size_t)(c + k));
    return (int)DSRT_MAX(6, DSRT_MIN(60, t / 6 * 6));
}

/* Measured up to 512 x 512 channels (ResNets' last stage, whose filters'
 * transforms the staged products stream: ResNet-18 trains 1.08x faster
 * with its 512-channel 7x7 convolutions by Winograd) and down to 7x7 maps
 * (whose 8x8 of tiles waste a quarter). Below 32 channels the transforms
 * outweigh the products (ResNet-20's 16-channel stage: 0.89x the images/s
 * by F(4x4, 3x3)). */
#define WINO_MAX_CK (512 * 512)
#define WINO_MIN_HW 49

int dsrt__wino_usable(const cpu_backend *be, int c, int k, int h, int w) {
#ifdef WINO_X86
    return be->isa == CPU_ISA_AVX2 && c % 16 == 0 && k % 16 == 0 && c >= 32 && k >= 32 &&
           c * k <= WINO_MAX_CK && h * w >= WINO_MIN_HW;
#else
    (void)be, (void)c, (void)k, (void)h, (void)w;
    return 0;
#endif
}

/* F(4x4, 3x3) takes 36 products for 16 outputs where F(2x2, 3x3) takes 64
 * (four tiles of 16), and its transforms read and write fewer values an
 * output: ResNet-18 and ResNet-20 train 1.17x faster by it, cifar 1.4x,
 * ResNet-50's 256-channel 14x14 convolutions 1.15x. be->wino_tile may ask
 * for F(2x2, 3x3) instead. */
int dsrt__wino_tile(const cpu_backend *be) {
    return be->wino_tile ? be->wino_tile : 4;
}

/* The filter transform G (a x 3), and its transpose in the weights'
 * gradient, for the output tiles m = 2 (points 0, 1, -1, infinity) and
 * m = 4 (0, 1, -1, 2, -2, infinity). */
static const float G2[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};
static const float G4[6][3] = {{0.25f, 0, 0},
                               {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                               {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                               {1.0f / 24, 1.0f / 12, 1.0f / 6},
                               {1.0f / 24, -1.0f / 12, 1.0f / 6},
                               {0, 0, 1}};

static inline float g_at(int m, int r, int c) {
    return m == 2 ? G2[r][c] : G4[r][c];
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
    int m, a, pts; /* output tile m x m, transform a x a (a = m + 2), pts = a a */
    long tiles;
} wino_job;

/* G (a x 3) row i times the columns g0, g1, g2 of 8 filters. */
AVX2 static inline __m256 g_row(int m, int i, __m256 g0, __m256 g1, __m256 g2) {
    return _mm256_fmadd_ps(_mm256_set1_ps(g_at(m, i, 0)), g0,
                           _mm256_fmadd_ps(_mm256_set1_ps(g_at(m, i, 1)), g1,
                                           _mm256_mul_ps(_mm256_set1_ps(g_at(m, i, 2)), g2)));
}

/* G^T (3 x a) row r times a values d[0], d[stride], ... of 8 filters. */
AVX2 static inline __m256 gt_row(int m, int r, const __m256 *d, int stride) {
    __m256 s = _mm256_setzero_ps();
    for (int i = 0; i < m + 2; i++) {
        float c = g_at(m, i, r);
        if (c != 0) s = _mm256_fmadd_ps(_mm256_set1_ps(c), d[i * stride], s);
    }
    return s;
}

/* U = G g G^T of 8 filters at once (g: their 9 taps, row-major) into
 * u[x * stride], x the point of the a x a transform; inlined for each m so
 * that G's entries are constants. */
AVX2 static inline __attribute__((always_inline)) void filter_transform(int m, const __m256 g[9],
                                                                        float *u, size_t stride) {
    int a = m + 2;
    __m256 t[6][3];
    for (int i = 0; i < a; i++)
        for (int j = 0; j < 3; j++) t[i][j] = g_row(m, i, g[j], g[3 + j], g[6 + j]);
    for (int i = 0; i < a; i++)
        for (int j = 0; j < a; j++)
            _mm256_storeu_ps(u + (size_t)(i * a + j) * stride,
                             g_row(m, j, t[i][0], t[i][1], t[i][2]));
}

typedef struct {
    const float *w;
    float *u;
    int k, c, m, backward;
} weights_job;

/* The 9 taps of 8 filters f + i s (i = 0..7) as 9 vectors of the 8: the
 * first 8 taps of each loaded whole and transposed, the last one by one
 * (gathers, one a tap, took two thirds of the time on Zen 5). */
AVX2 static inline void taps8(const float *f, size_t s, __m256 g[9]) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(f + i * s);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            r[i + h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0x44);
            r[i + h + 2] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0xee);
        }
    /* r[0..3] hold taps 0, 2, 1, 3 (low halves) and 4, 6, 5, 7 (high
     * halves) of filters 0-3, r[4..7] those of filters 4-7. */
    static const int tap_of[4] = {0, 2, 1, 3};
    for (int q = 0; q < 4; q++) {
        g[tap_of[q]] = _mm256_permute2f128_ps(r[q], r[q + 4], 0x20);
        g[tap_of[q] + 4] = _mm256_permute2f128_ps(r[q], r[q + 4], 0x31);
    }
    g[8] = _mm256_setr_ps(f[8], f[s + 8], f[2 * s + 8], f[3 * s + 8], f[4 * s + 8], f[5 * s + 8],
                          f[6 * s + 8], f[7 * s + 8]);
}

/* Filters [lo, hi) of the outer loop, 8 of the inner at a time: for
 * forward the input channels (each writing its run of k values a point),
 * for backward the output channels (reading their c filters in a row,
 * writing runs of c). */
AVX2 static void weights_range(void *ctx, size_t lo, size_t hi) {
    const weights_job *j = ctx;
    size_t plane = (size_t)j->c * j->k;
    int inner = j->backward ? j->c : j->k;
    /* Forward: filter b of input channel a at w[(b c + a) 9], the next
     * filter 9 c floats on; backward: the output channel a's filter from
     * input channel b at w[(a c + b) 9], turned 180 degrees. */
    size_t s = j->backward ? 9 : 9 * (size_t)j->c;
    for (size_t a = lo; a < hi; a++)
        for (int b = 0; b < inner; b += 8) {
            const float *f =
                j->backward ? j->w + (a * j->c + (size_t)b) * 9 : j->w + ((size_t)b * j->c + a) * 9;
            __m256 t[9], g[9];
            taps8(f, s, t);
            for (int q = 0; q < 9; q++) g[q] = t[j->backward ? 8 - q : q];
            float *u = j->u + a * inner + b;
            if (j->m == 2)
                filter_transform(2, g, u, plane);
            else
                filter_transform(4, g, u, plane);
        }
}

void dsrt__wino_weights(cpu_backend *be, const float *w, int m, int k, int c, int backward,
                        float *u) {
    weights_job j = {.w = w, .u = u, .k = k, .c = c, .m = m, .backward = backward};
    dsrt__cpu_parallel(be, (size_t)(backward ? k : c), weights_range, &j);
}

/* Where tile t lies: its image and its top-left output pixel. */
static void tile_at(const wino_job *j, long tile, int *n, int *oy, int *ox) {
    int per = j->th * j->tw;
    *n = (int)(tile / per);
    *oy = j->m * ((int)(tile % per) / j->tw);
    *ox = j->m * ((int)(tile % per) % j->tw);
}

/* B^T d of a column of the input patch, for m = 2 (4 values) and m = 4
 * (6 values). */
AVX2 static inline void bt2(const __m256 *d, __m256 *r) {
    r[0] = _mm256_sub_ps(d[0], d[2]);
    r[1] = _mm256_add_ps(d[1], d[2]);
    r[2] = _mm256_sub_ps(d[2], d[1]);
    r[3] = _mm256_sub_ps(d[1], d[3]);
}

AVX2 static inline void bt4(const __m256 *d, __m256 *r) {
    const __m256 four = _mm256_set1_ps(4), five = _mm256_set1_ps(5), two = _mm256_set1_ps(2);
    __m256 d4d2 = _mm256_sub_ps(d[4], d[2]);
    r[0] = _mm256_fmadd_ps(four, d[0], _mm256_fnmadd_ps(five, d[2], d[4]));
    r[1] = _mm256_fnmadd_ps(four, _mm256_add_ps(d[1], d[2]), _mm256_add_ps(d[3], d[4]));
    r[2] = _mm256_fmadd_ps(four, _mm256_sub_ps(d[1], d[2]), _mm256_sub_ps(d[4], d[3]));
    r[3] = _mm256_fmadd_ps(two, _mm256_sub_ps(d[3], d[1]), d4d2);
    r[4] = _mm256_fmadd_ps(two, _mm256_sub_ps(d[1], d[3]), d4d2);
    r[5] = _mm256_fmadd_ps(four, d[1], _mm256_fnmadd_ps(five, d[3], d[5]));
}

/* The a x a patch of tile t's input, 8 channels at a time, as V rows: each
 * point x at v[x * tb * C]; zero past the image's edge. */
AVX2 static void input_tile(const wino_job *j, long tile, int row, float *v) {
    int n, oy, ox, a = j->a, C = j->c;
    tile_at(j, tile, &n, &oy, &ox);
    int y0 = oy - 1, x0 = ox - 1;
    int inside = y0 >= 0 && x0 >= 0 && y0 + a <= j->h && x0 + a <= j->w;
    const cpu_chans *l = j->xl;
    size_t xs = (size_t)j->tb * C;
    for (int c = 0; c < C; c += 8) {
        const float *img = j->x + (size_t)n * l->s_n + (c / l->inner) * l->s_b + c % l->inner;
        __m256 col[6], t[6][6], r[6];
        /* Columns first, then rows. */
        for (int b = 0; b < a; b++) {
            for (int i = 0; i < a; i++) {
                int yy = y0 + i, xx = x0 + b;
                col[i] = inside || (yy >= 0 && yy < j->h && xx >= 0 && xx < j->w)
                             ? _mm256_loadu_ps(img + ((size_t)yy * j->w + xx) * l->inner)
                             : _mm256_setzero_ps();
            }
            if (a == 4)
                bt2(col, r);
            else
                bt4(col, r);
            for (int i = 0; i < a; i++) t[i][b] = r[i];
        }
        float *o = v + (size_t)row * C + c;
        for (int i = 0; i < a; i++) {
            if (a == 4)
                bt2(t[i], r);
            else
                bt4(t[i], r);
            for (int b = 0; b < a; b++) _mm256_storeu_ps(o + (size_t)(i * a + b) * xs, r[b]);
        }
    }
}

/* Columns [k0, k1) of rows [r, r + R) of m (rows, K) = v (rows, C) u (C, K),
 * R by 16 a register block, each sum over C in order; inlined for each R so
 * that the accumulators stay in registers. */
AVX2 static inline __attribute__((always_inline)) void multiply_rows(int R, const float *v,
                                                                     const float *u, float *m,
                                                                     int r, int C, int K, int k0,
                                                                     int k1) {
    for (int k = k0; k < k1; k += 16) {
        __m256 acc[6][2];
        for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        const float *uk = u + k, *vr = v + (size_t)r * C;
        for (int c = 0; c < C; c++, uk += K) {
            __m256 u0 = _mm256_loadu_ps(uk), u1 = _mm256_loadu_ps(uk + 8);
            for (int i = 0; i < R; i++) {
                __m256 b = _mm256_broadcast_ss(vr + (size_t)i * C + c);
                acc[i][0] = _mm256_fmadd_ps(b, u0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(b, u1, acc[i][1]);
            }
        }
        for (int i = 0; i < R; i++) {
            _mm256_storeu_ps(m + (size_t)(r + i) * K + k, acc[i][0]);
            _mm256_storeu_ps(m + (size_t)(r + i) * K + k + 8, acc[i][1]);
        }
    }
}

/* Columns [k0, k1) of m (rows, K) = v (rows, C) u (C, K): 6 rows a register
 * block, the rows past a multiple of 6 in blocks of 4, 2 and 1 (one row at
 * a time kept two chains of sums, a quarter of the rate: 64 tiles, the 7x7
 * maps of ResNet's last stage at batch 16, leave 4). */
AVX2 static void multiply(const float *v, const float *u, float *m, int rows, int C, int K, int k0,
                          int k1) {
    int r = 0;
    for (; r + 6 <= rows; r += 6) multiply_rows(6, v, u, m, r, C, K, k0, k1);
    if (rows - r >= 4) multiply_rows(4, v, u, m, r, C, K, k0, k1), r += 4;
    if (rows - r >= 2) multiply_rows(2, v, u, m, r, C, K, k0, k1), r += 2;
    if (rows - r == 1) multiply_rows(1, v, u, m, r, C, K, k0, k1);
}

/* A^T p of a column of the products, for m = 2 (4 values to 2) and m = 4
 * (6 to 4). */
AVX2 static inline void at2(const __m256 *p, __m256 *o) {
    o[0] = _mm256_add_ps(_mm256_add_ps(p[0], p[1]), p[2]);
    o[1] = _mm256_sub_ps(_mm256_sub_ps(p[1], p[2]), p[3]);
}

AVX2 static inline void at4(const __m256 *p, __m256 *o) {
    const __m256 two = _mm256_set1_ps(2), four = _mm256_set1_ps(4), eight = _mm256_set1_ps(8);
    __m256 s12 = _mm256_add_ps(p[1], p[2]), d12 = _mm256_sub_ps(p[1], p[2]);
    __m256 s34 = _mm256_add_ps(p[3], p[4]), d34 = _mm256_sub_ps(p[3], p[4]);
    o[0] = _mm256_add_ps(_mm256_add_ps(p[0], s12), s34);
    o[1] = _mm256_fmadd_ps(two, d34, d12);
    o[2] = _mm256_fmadd_ps(four, s34, s12);
    o[3] = _mm256_add_ps(_mm256_fmadd_ps(eight, d34, d12), p[5]);
}

/* y's m x m patch of tile t from the products (mm rows), with the bias and
 * the epilogue; a patch past the image's edge writes what lies inside. */
AVX2 static void output_tile(const wino_job *j, long tile, int row, const float *mm) {
    int n, oy, ox, a = j->a, K = j->k;
    tile_at(j, tile, &n, &oy, &ox);
    int rows = DSRT_MIN(j->m, j->h - oy), cols = DSRT_MIN(j->m, j->w - ox);
    size_t xs = (size_t)j->tb * K;
    const __m256 zero = _mm256_setzero_ps(), leak = _mm256_set1_ps(j->e.leak),
                 leak2 = _mm256_set1_ps(j->e.leak2);
    const cpu_chans *l = j->yl;
    for (int k = 0; k < K; k += 8) {
        __m256 col[6], s[4][6], o[4];
        for (int b = 0; b < a; b++) {
            for (int i = 0; i < a; i++)
                col[i] = _mm256_loadu_ps(mm + (size_t)(i * a + b) * xs + (size_t)row * K + k);
            if (a == 4)
                at2(col, o);
            else
                at4(col, o);
            for (int i = 0; i < j->m; i++) s[i][b] = o[i];
        }
        __m256 bias = j->bias ? _mm256_loadu_ps(j->bias + k) : zero;
        for (int r = 0; r < rows; r++) {
            if (a == 4)
                at2(s[r], o);
            else
                at4(s[r], o);
            float *y = j->y + (size_t)n * l->s_n + (k / l->inner) * l->s_b + k % l->inner +
                       ((size_t)(oy + r) * j->w + ox) * l->inner;
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
    float *v = j->scratch + (size_t)t * j->per_thread, *m = v + (size_t)j->pts * j->tb * j->c;
    for (size_t b = lo; b < hi; b++) {
        long first = (long)b * j->tb;
        int rows = (int)DSRT_MIN((long)j->tb, j->tiles - first);
        for (int r = 0; r < rows; r++) input_tile(j, first + r, r, v);
        for (int x = 0; x < j->pts; x++)
            multiply(v + (size_t)x * j->tb * j->c, j->u + (size_t)x * j->c * j->k,
                     m + (size_t)x * j->tb * j->k, rows, j->c, j->k, 0, j->k);
        for (int r = 0; r < rows; r++) output_tile(j, first + r, r, m);
    }
}

/* Where the filters outgrow the cache (more than WINO_FUSED_U_BYTES), a
 * block's few rows of products would stream them from further out for
 * every block: the work goes in stages instead, over a chunk of tiles at a
 * time (their transforms within WINO_STAGE_BYTES): every tile's input
 * transform, then the products point by point in columns of 64 filters,
 * each unit reading its filters once for the whole chunk, then every
 * tile's output transform. */
#define WINO_FUSED_U_BYTES ((size_t)5 << 20)
#define WINO_STAGE_BYTES   (16u << 20)
#define WINO_STAGE_COLS    64

static int staged(int pts, int c, int k) {
    return (size_t)pts * c * k * sizeof(float) > WINO_FUSED_U_BYTES;
}

static int stage_tiles(int pts, int c, int k) {
    size_t t = WINO_STAGE_BYTES / ((size_t)pts * sizeof(float) * (size_t)(c + k));
    return (int)DSRT_MAX(6, t / 6 * 6);
}

typedef struct {
    const wino_job *j;
    float *v, *m;
    long first;
    int rows;
} stage_job;

AVX2 static void stage_in(void *ctx, size_t lo, size_t hi) {
    const stage_job *s = ctx;
    for (size_t r = lo; r < hi; r++) input_tile(s->j, s->first + (long)r, (int)r, s->v);
}

/* Units [lo, hi) of (point, WINO_STAGE_COLS filters). */
AVX2 static void stage_products(void *ctx, size_t lo, size_t hi) {
    const stage_job *s = ctx;
    const wino_job *j = s->j;
    size_t cols = (size_t)(j->k + WINO_STAGE_COLS - 1) / WINO_STAGE_COLS;
    for (size_t u = lo; u < hi; u++) {
        int x = (int)(u / cols), k0 = (int)(u % cols) * WINO_STAGE_COLS;
        multiply(s->v + (size_t)x * j->tb * j->c, j->u + (size_t)x * j->c * j->k,
                 s->m + (size_t)x * j->tb * j->k, s->rows, j->c, j->k, k0,
                 DSRT_MIN(j->k, k0 + WINO_STAGE_COLS));
    }
}

AVX2 static void stage_out(void *ctx, size_t lo, size_t hi) {
    const stage_job *s = ctx;
    for (size_t r = lo; r < hi; r++) output_tile(s->j, s->first + (long)r, (int)r, s->m);
}

/* The job's sizes for output tiles of m x m. */
static void job_sizes(wino_job *j, int m, int n, int h, int w, int c, int k) {
    j->m = m;
    j->a = m + 2;
    j->pts = j->a * j->a;
    j->n = n;
    j->h = h;
    j->w = w;
    j->c = c;
    j->k = k;
    j->th = (h + m - 1) / m;
    j->tw = (w + m - 1) / m;
    j->tiles = (long)n * j->th * j->tw;
}

size_t dsrt__wino_scratch_floats(const cpu_backend *be, int m, int c, int k) {
    int pts = (m + 2) * (m + 2);
    if (staged(pts, c, k)) return (size_t)pts * stage_tiles(pts, c, k) * (size_t)(c + k);
    return (size_t)dsrt__cpu_team(be) * pts * block_tiles(pts, c, k) * (size_t)(c + k);
}

void dsrt__wino_conv(cpu_backend *be, int m, const float *x, const cpu_chans *xl, const float *u,
                     const float *bias, float *y, const cpu_chans *yl, int n, int h, int w, int c,
                     int k, const wino_epilogue *e, float *scratch) {
    wino_job j = {
        .e = *e, .x = x, .u = u, .bias = bias, .y = y, .scratch = scratch, .xl = xl, .yl = yl};
    job_sizes(&j, m, n, h, w, c, k);
    if (staged(j.pts, c, k)) {
        j.tb = stage_tiles(j.pts, c, k);
        stage_job s = {.j = &j, .v = scratch, .m = scratch + (size_t)j.pts * j.tb * c};
        size_t units = (size_t)j.pts * ((k + WINO_STAGE_COLS - 1) / WINO_STAGE_COLS);
        for (s.first = 0; s.first < j.tiles; s.first += j.tb) {
            s.rows = (int)DSRT_MIN((long)j.tb, j.tiles - s.first);
            dsrt__cpu_parallel(be, (size_t)s.rows, stage_in, &s);
            dsrt__cpu_parallel(be, units, stage_products, &s);
            dsrt__cpu_parallel(be, (size_t)s.rows, stage_out, &s);
        }
        return;
    }
    j.tb = block_tiles(j.pts, c, k);
    j.per_thread = (size_t)j.pts * j.tb * (size_t)(c + k);
    dsrt__cpu_parallel(be, (size_t)((j.tiles + j.tb - 1) / j.tb), blocks, &j);
}

// ----------------------------------------------------------------------------
// The weights' gradient: dU[x] (C, K) = sum over tiles of V[x]^T (the input
// patches' transforms) times the output gradient patches' A dY A^T, then
// dW = G^T dU G. Tiles go in chunks of a size set by the channels alone;
// each (point, 16 filters) of dU is one thread's, summed over every tile in
// order, so the result does not depend on the number of threads.

/* Tiles a chunk: its two transforms within WINO_CHUNK_BYTES or, where the
 * sums dU are larger, within their size, 6 to 512. Each chunk reads and
 * writes all of dU: with 512 x 512 channels (37.7 MB of sums) chunks of
 * 2 MB, 12 tiles, streamed dU through memory six times a step for ResNet's
 * last stage, and sums of 12 rows do too little work for what they move. */
#define WINO_CHUNK_BYTES (2 * 1024 * 1024)

static int chunk_tiles(int pts, int c, int k) {
    size_t sums = (size_t)pts * c * k * sizeof(float);
    size_t t =
        DSRT_MAX((size_t)WINO_CHUNK_BYTES, sums) / ((size_t)pts * sizeof(float) * (size_t)(c + k));
    return (int)DSRT_MAX(6, DSRT_MIN(512, t / 6 * 6));
}

size_t dsrt__wino_wgrad_floats(int m, int c, int k) {
    size_t pts = (size_t)(m + 2) * (m + 2);
    return pts * c * k + pts * chunk_tiles((int)pts, c, k) * (size_t)(c + k);
}

typedef struct {
    wino_job j;        /* x, xl, y (the output gradient), yl, the sizes; tb: the chunk */
    float *v, *g, *du; /* the chunk's transforms; the sums */
    long first;        /* the chunk's first tile */
    int rows;
    float *dw, *db;
} wgrad_job;

/* A y of a column of the output gradient's patch, A = (A^T)^T: m = 2 (2
 * values to 4) and m = 4 (4 to 6). */
AVX2 static inline void a2(const __m256 *y, __m256 *r) {
    r[0] = y[0];
    r[1] = _mm256_add_ps(y[0], y[1]);
    r[2] = _mm256_sub_ps(y[0], y[1]);
    r[3] = _mm256_sub_ps(_mm256_setzero_ps(), y[1]);
}

AVX2 static inline void a4(const __m256 *y, __m256 *r) {
    const __m256 two = _mm256_set1_ps(2), four = _mm256_set1_ps(4), eight = _mm256_set1_ps(8);
    __m256 even = _mm256_fmadd_ps(four, y[2], y[0]),
           odd = _mm256_fmadd_ps(eight, y[3], _mm256_mul_ps(two, y[1]));
    __m256 s02 = _mm256_add_ps(y[0], y[2]), s13 = _mm256_add_ps(y[1], y[3]);
    r[0] = y[0];
    r[1] = _mm256_add_ps(s02, s13);
    r[2] = _mm256_sub_ps(s02, s13);
    r[3] = _mm256_add_ps(even, odd);
    r[4] = _mm256_sub_ps(even, odd);
    r[5] = y[3];
}

/* The a x a transform A dY A^T of tile t's m x m output gradient (zero past
 * the edge), 8 channels at a time, as rows of g. */
AVX2 static void grad_tile(const wino_job *j, long tile, int row, float *g) {
    int n, oy, ox, a = j->a, m = j->m, K = j->k;
    tile_at(j, tile, &n, &oy, &ox);
    int rows = DSRT_MIN(m, j->h - oy), cols = DSRT_MIN(m, j->w - ox);
    const cpu_chans *l = j->yl;
    size_t xs = (size_t)j->tb * K;
    for (int k = 0; k < K; k += 8) {
        const float *img = j->y + (size_t)n * l->s_n + (k / l->inner) * l->s_b + k % l->inner;
        __m256 col[4], t[6][4], r[6];
        /* Columns first (each column's m values to a), then rows. */
        for (int b = 0; b < m; b++) {
            for (int i = 0; i < m; i++)
                col[i] = i < rows && b < cols
                             ? _mm256_loadu_ps(img + ((size_t)(oy + i) * j->w + ox + b) * l->inner)
                             : _mm256_setzero_ps();
            if (m == 2)
                a2(col, r);
            else
                a4(col, r);
            for (int i = 0; i < a; i++) t[i][b] = r[i];
        }
        float *o = g + (size_t)row * K + k;
        for (int i = 0; i < a; i++) {
            if (m == 2)
                a2(t[i], r);
            else
                a4(t[i], r);
            for (int b = 0; b < a; b++) _mm256_storeu_ps(o + (size_t)(i * a + b) * xs, r[b]);
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
 * rows in order, 4 input channels at a time; the first chunk starts the
 * sums from zero. */
AVX2 static void wgrad_sums(void *ctx, size_t lo, size_t hi) {
    const wgrad_job *w = ctx;
    int C = w->j.c, K = w->j.k, kb = K / 16, first = w->first == 0;
    for (size_t u = lo; u < hi; u++) {
        int x = (int)(u / (size_t)kb), k = (int)(u % (size_t)kb) * 16;
        const float *v = w->v + (size_t)x * w->j.tb * C, *g = w->g + (size_t)x * w->j.tb * K + k;
        float *du = w->du + (size_t)x * C * K + k;
        for (int c = 0; c < C; c += 4) {
            __m256 a[4][2];
            for (int i = 0; i < 4; i++) {
                a[i][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(du + (size_t)(c + i) * K);
                a[i][1] =
                    first ? _mm256_setzero_ps() : _mm256_loadu_ps(du + (size_t)(c + i) * K + 8);
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

/* Input channels [lo, hi): dW = G^T dU G, 8 filters at a time. A channel's
 * sums are a run of K floats at each of the a^2 points: walking the filters
 * inside the channel reads each run whole and in order (filters outside
 * channels read half a cache line at 36 places a step, the other half long
 * after). */
AVX2 static void wgrad_finish(void *ctx, size_t lo, size_t hi) {
    const wgrad_job *w = ctx;
    int C = w->j.c, K = w->j.k, m = w->j.m, a = w->j.a;
    for (size_t c = lo; c < hi; c++)
        for (int k0 = 0; k0 < K; k0 += 8) {
            __m256 d[36], t[3][6];
            float o[9][8];
            for (int x = 0; x < a * a; x++)
                d[x] = _mm256_loadu_ps(w->du + ((size_t)x * C + c) * K + k0);
            for (int r = 0; r < 3; r++)
                for (int b = 0; b < a; b++) t[r][b] = gt_row(m, r, d + b, a);
            for (int r = 0; r < 3; r++)
                for (int q = 0; q < 3; q++) _mm256_storeu_ps(o[r * 3 + q], gt_row(m, q, t[r], 1));
            for (int f = 0; f < 8; f++)
                for (int q = 0; q < 9; q++) w->dw[(((size_t)k0 + f) * C + c) * 9 + q] = o[q][f];
        }
}

/* Filters [lo, hi): the bias's gradient, the output gradient's sum over
 * every pixel in order. */
static void wgrad_bias(void *ctx, size_t lo, size_t hi) {
    const wgrad_job *w = ctx;
    const cpu_chans *l = w->j.yl;
    size_t px = (size_t)w->j.h * w->j.w;
    for (size_t k = lo; k < hi; k++) {
        double sum = 0;
        for (int n = 0; n < w->j.n; n++) {
            const float *img = w->j.y + (size_t)n * l->s_n + (k / l->inner) * l->s_b + k % l->inner;
            for (size_t p = 0; p < px; p++) sum += img[p * l->inner];
        }
        w->db[k] = (float)sum;
    }
}

void dsrt__wino_weights_grad(cpu_backend *be, int m, const float *x, const cpu_chans *xl,
                             const float *dy, const cpu_chans *yl, int n, int h, int w, int c,
                             int k, float *dw, float *db, float *scratch) {
    wgrad_job g = {.j = {.x = x, .y = (float *)dy, .xl = xl, .yl = yl}, .dw = dw, .db = db};
    job_sizes(&g.j, m, n, h, w, c, k);
    g.j.tb = chunk_tiles(g.j.pts, c, k);
    g.du = scratch;
    g.v = scratch + (size_t)g.j.pts * c * k;
    g.g = g.v + (size_t)g.j.pts * g.j.tb * c;
    for (g.first = 0; g.first < g.j.tiles; g.first += g.j.tb) {
        g.rows = (int)DSRT_MIN((long)g.j.tb, g.j.tiles - g.first);
        dsrt__cpu_parallel(be, (size_t)g.rows, wgrad_tiles, &g);
        dsrt__cpu_parallel(be, (size_t)g.j.pts * (k / 16), wgrad_sums, &g);
    }
    dsrt__cpu_parallel(be, (size_t)c, wgrad_finish, &g);
    if (db) dsrt__cpu_parallel(be, (size_t)k, wgrad_bias, &g);
}

#else

void dsrt__wino_conv(cpu_backend *be, int m, const float *x, const cpu_chans *xl, const float *u,
                     const float *bias, float *y, const cpu_chans *yl, int n, int h, int w, int c,
                     int k, const wino_epilogue *e, float *scratch) {
    (void)be, (void)m, (void)x, (void)xl, (void)u, (void)bias, (void)y, (void)yl, (void)n;
    (void)h, (void)w, (void)c, (void)k, (void)e, (void)scratch; /* never chosen: not usable */
}

void dsrt__wino_weights_grad(cpu_backend *be, int m, const float *x, const cpu_chans *xl,
                             const float *dy, const cpu_chans *yl, int n, int h, int w, int c,
                             int k, float *dw, float *db, float *scratch) {
    (void)be, (void)m, (void)x, (void)xl, (void)dy, (void)yl, (void)n, (void)h, (void)w;
    (void)c, (void)k, (void)dw, (void)db, (void)scratch; /* never chosen */
}

size_t dsrt__wino_wgrad_floats(int m, int c, int k) {
    (void)m, (void)c, (void)k;
    return 0;
}

size_t dsrt__wino_scratch_floats(const cpu_backend *be, int m, int c, int k) {
    (void)be, (void)m, (void)c, (void)k;
    return 0;
}

void dsrt__wino_weights(cpu_backend *be, const float *w, int m, int k, int c, int backward,
                        float *u) {
    (void)be, (void)w, (void)m, (void)k, (void)c, (void)backward, (void)u; /* never chosen */
}

#endif
