/*
 * Internal helpers shared by every dsrt module: error reporting with context,
 * a counter-based random generator, and small memory utilities. Nothing here
 * is part of the public API; the names carry a double underscore.
 */
#ifndef DSRT_CORE_INTERNAL_H
#define DSRT_CORE_INTERNAL_H

#include <dsrt/core.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define DSRT_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define DSRT_MAX(a, b)     ((a) > (b) ? (a) : (b))
#define DSRT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#if defined(__GNUC__)
#define DSRT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define DSRT_LIKELY(x)    __builtin_expect(!!(x), 1)
#define DSRT_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#else
#define DSRT_PRINTF(f, a)
#define DSRT_LIKELY(x)   (x)
#define DSRT_UNLIKELY(x) (x)
#endif

/* Marks the inline functions that CUDA kernels share with the C code (the
 * generator below, nn/arith.h), so that both compute the same bits. */
#if defined(__CUDACC__)
#define DSRT_HOST_DEVICE __host__ __device__
#else
#define DSRT_HOST_DEVICE
#endif

// ----------------------------------------------------------------------------
// Errors

/* Sets this thread's message (printf-style) and returns code, so that a
 * failing path reads: return dsrt__fail(DSRT_ECORRUPT, "idx: %s: ...", path); */
int dsrt__fail(int code, const char *fmt, ...) DSRT_PRINTF(2, 3);
int dsrt__vfail(int code, const char *fmt, va_list ap);

/* Prefixes this thread's current message: "what: " + message. Returns code. */
int dsrt__fail_prefix(int code, const char *fmt, ...) DSRT_PRINTF(2, 3);

/* Clears this thread's message. */
void dsrt__clear_error(void);

// ----------------------------------------------------------------------------
// Counter-based random numbers.
//
// Every random choice in dsrt is a pure function of a key (seed, epoch,
// sample id, stream) and a counter, so results do not depend on which thread
// draws them or when. The mixer is SplitMix64's finaliser applied to a
// Weyl-sequence counter, keyed by hashing the key words together.

typedef struct {
    uint64_t key;
    uint64_t counter;
} dsrt_rng;

static inline DSRT_HOST_DEVICE uint64_t dsrt__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A generator keyed by four words; the same words always give the same stream. */
static inline DSRT_HOST_DEVICE dsrt_rng dsrt_rng_init(uint64_t seed, uint64_t epoch, uint64_t id,
                                                      uint64_t stream) {
    uint64_t k = dsrt__mix64(seed + 0x9e3779b97f4a7c15ULL);
    k = dsrt__mix64(k ^ (epoch + 0x632be59bd9b4e019ULL));
    k = dsrt__mix64(k ^ (id + 0x8cb92ba72f3d8dd7ULL));
    k = dsrt__mix64(k ^ (stream + 0xd1b54a32d192ed03ULL));
    dsrt_rng r = {k, 0};
    return r;
}

static inline DSRT_HOST_DEVICE uint64_t dsrt_rng_u64(dsrt_rng *r) {
    r->counter++;
    return dsrt__mix64(r->key + r->counter * 0x9e3779b97f4a7c15ULL);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double dsrt_rng_uniform(dsrt_rng *r) {
    return (double)(dsrt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n), n > 0, without modulo bias (Lemire). */
static inline uint64_t dsrt_rng_below(dsrt_rng *r, uint64_t n) {
    uint64_t x = dsrt_rng_u64(r);
    __uint128_t m = (__uint128_t)x * n;
    uint64_t l = (uint64_t)m;
    if (l < n) {
        uint64_t t = -n % n;
        while (l < t) {
            x = dsrt_rng_u64(r);
            m = (__uint128_t)x * n;
            l = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

// ----------------------------------------------------------------------------
// Memory

/* malloc/calloc/realloc that set the thread's message on failure. */
void *dsrt__malloc(size_t n);
void *dsrt__calloc(size_t count, size_t size);
void *dsrt__realloc(void *p, size_t n);
char *dsrt__strdup(const char *s);

/* Grows *buf (capacity *cap elements of size elem) to hold at least need
 * elements, doubling. Returns 0 or -ENOMEM. */
int dsrt__grow(void **buf, size_t *cap, size_t need, size_t elem);

/* The length (1 to 4) of the well-formed UTF-8 character at p, which has n
 * bytes left; 0 when the bytes there are not one (a stray continuation, an
 * overlong form, a surrogate, past U+10FFFF, cut short). */
int dsrt__utf8_char(const unsigned char *p, size_t n);

/* Checks a class name of n bytes as a model keeps it: 1 to 255 bytes of
 * UTF-8 without control characters (U+0000 to U+001F but the tab, U+007F to
 * U+009F). Returns 0, or -1 with the reason in why ("a control character
 * (U+0001) at byte 4"). */
int dsrt__class_name_check(const char *s, size_t n, char *why, size_t why_cap);

/* qsort, which must not be given a NULL array even with no element (an
 * empty list's array may be NULL): sorts only when there are two or more. */
void dsrt__sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *));

/* Writes the folder part of path to out (cap bytes): "." when it has none,
 * "/" for a path in the root. */
void dsrt__dir_of(const char *path, char *out, size_t cap);

/* A growing list of strings, each in an allocation of its own. */
typedef struct {
    char **v;
    size_t n, cap;
} dsrt_strlist;

/* Appends a copy of s's first len bytes. Returns 0 or -ENOMEM. */
int dsrt__strlist_add(dsrt_strlist *l, const char *s, size_t len);
/* Frees the strings and the list, and empties it. */
void dsrt__strlist_free(dsrt_strlist *l);

/* A bump arena of strings: many small strings in few large blocks, freed at
 * once. Pointers into it stay valid while it lives. */
typedef struct dsrt_arena_block dsrt_arena_block;
typedef struct {
    dsrt_arena_block *head;
    size_t used, cap; /* of the head block */
    size_t total;     /* bytes handed out */
} dsrt_arena;

void *dsrt__arena_alloc(dsrt_arena *a, size_t n, size_t align);
char *dsrt__arena_strndup(dsrt_arena *a, const char *s, size_t n);
void dsrt__arena_free(dsrt_arena *a);

/* The value of name in a table of names (names[v] is value v's; NULL where
 * no value has one), in any case when icase is set: 0 and *value, or
 * DSRT_EOPTION with the message "'NAME' is not a, b or c", and "(did you
 * mean b?)" when one is a slip away. */
int dsrt__name_lookup(const char *const *names, size_t n, const char *name, int icase, int *value);

/* The choice functions of option rows (dsrt/options.h), made from a name
 * function of the library: the i-th name is the name of the enum's value
 * i, "" where the enum has no such value (a hole), NULL from end on (a name
 * function calls a value it does not know "unknown"). */
#define DSRT__CHOICE_FROM(fn, type, end)                                                           \
    static const char *fn##_at(int i) {                                                            \
        if (i < 0 || i >= (int)(end)) return NULL;                                                 \
        const char *n = fn((type)i);                                                               \
        return n && strcmp(n, "unknown") ? n : "";                                                 \
    }

/* A choice function over a list of names of its own. */
#define DSRT__CHOICE_OF(fn, ...)                                                                   \
    static const char *fn(int i) {                                                                 \
        static const char *const names[] = {__VA_ARGS__, NULL};                                    \
        return i >= 0 && (size_t)i < DSRT_ARRAY_SIZE(names) ? names[i] : NULL;                     \
    }

/* The edit distance (insertions, deletions, substitutions, swaps of two
 * neighbours) between a[0, na) and b, stopping early past limit (then
 * limit + 1). */
int dsrt__edit_distance(const char *a, size_t na, const char *b, int limit);

/* Of names[0, n) (NULL entries skipped), the one nearest to a[0, na) when
 * it is a slip away (one edit for short names, two past four letters), or
 * NULL: what "did you mean" offers. */
const char *dsrt__nearest(const char *a, size_t na, const char *const *names, size_t n);

// ----------------------------------------------------------------------------
// Files

struct stat;

/* "a FIFO", "a character device", ...: what a file of this st_mode is. */
const char *dsrt__file_kind(unsigned mode);

/* Opens path for reading without waiting (a FIFO does not block the open)
 * and refuses anything but a regular file (-EISDIR for a folder,
 * DSRT_EFORMAT for a FIFO, device or socket), with "PATH: reason". On 0,
 * *fd is open and *st its fstat. */
int dsrt__open_regular(const char *path, int *fd, struct stat *st);

/* Reads the whole file at path into a new buffer (NUL-terminated, not
 * counted in *size), refusing files larger than max bytes and anything but
 * a regular file. */
int dsrt__read_whole_file(const char *path, size_t max, uint8_t **data, size_t *size);

/* Writes data to path atomically and durably: a temporary file in the same
 * folder, fsync, rename, then fsync of the folder. For checkpoints and
 * models: after a crash the file is either the old one or the new one.
 * Both writers refuse to replace anything but a regular file (or a link). */
int dsrt__write_file_atomic(const char *path, const void *data, size_t size);

/* The same for a file made of n parts written one after the other: a large
 * file is written from where its pieces are, never copied into one buffer
 * first. */
int dsrt__write_parts_atomic(const char *path, const void *const *parts, const size_t *sizes,
                             int n);

/* Writes data to path through a temporary file and a rename, without
 * fsync: readers never see half a file, and writing many files stays fast
 * (the caller may syncfs once at the end). */
int dsrt__write_file_replace(const char *path, const void *data, size_t size);

#endif
