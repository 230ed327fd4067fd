/*
 * Helpers shared by dsrt's command-line tools; see tool_common.h.
 */
#include "tool_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *tool_name = "dsrt";

/* At exit, what the module loader warned of (a module in a folder every
 * user may write to, say): the library never prints. */
static void print_module_warnings(void) {
    const char *w = dsrt_module_warnings();
    for (const char *line = w; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        fprintf(stderr, "%s: warning: %.*s\n", tool_name, (int)n, line);
        line += n + (end != NULL);
    }
}

void tool_set_name(const char *name) {
    static int registered;
    tool_name = name;
    if (!registered++) atexit(print_module_warnings);
}

const char *tool_program(void) {
    return tool_name;
}

void tool_die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", tool_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

void tool_die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", tool_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help'.\n", tool_name);
    exit(2);
}

const char *tool_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) tool_die_usage("option %s needs a value", argv[*i]);
    return argv[++*i];
}

long long tool_int(const char *option, const char *value, long long min, long long max) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end != '\0')
        tool_die_usage("%s: '%s' is not an integer", option, value);
    if (v < min || v > max) tool_die_usage("%s: %lld is outside [%lld, %lld]", option, v, min, max);
    return v;
}

uint64_t tool_bytes(const char *option, const char *value, uint64_t min, uint64_t max) {
    static const struct {
        char c;
        int shift;
    } units[] = {{'K', 10}, {'M', 20}, {'G', 30}, {'T', 40}};
    char *end;
    errno = 0;
    unsigned long long v = strtoull(value, &end, 10);
    int shift = 0, ok = end != value && errno == 0 && value[0] != '-';
    if (ok && *end) {
        size_t k = 0;
        while (k < sizeof units / sizeof units[0] && units[k].c != (*end & ~0x20)) k++;
        ok = k < sizeof units / sizeof units[0];
        if (ok) {
            shift = units[k].shift;
            end++;
            if (*end == 'i') end++;
            if (*end == 'B' || *end == 'b') end++;
            ok = *end == '\0';
        }
    }
    if (ok && shift && v > (UINT64_MAX >> shift)) ok = 0;
    uint64_t bytes = ok ? (uint64_t)v << shift : 0;
    if (!ok || bytes < min || bytes > max)
        tool_die_usage("%s: '%s' is not a size in bytes from %llu to %llu (suffixes K, M, G, T)",
                       option, value, (unsigned long long)min, (unsigned long long)max);
    return bytes;
}

dsrt_shard_order tool_shard_order(const char *option, const char *value) {
    dsrt_shard_order o;
    if (dsrt_shard_order_from_name(value, &o) != 0)
        tool_die_usage("%s: %s", option, dsrt_last_error());
    return o;
}

double tool_double(const char *option, const char *value, double min, double max) {
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end != '\0' || !isfinite(v))
        tool_die_usage("%s: '%s' is not a number", option, value);
    if (v < min || v > max) tool_die_usage("%s: %g is outside [%g, %g]", option, v, min, max);
    return v;
}

/* Length of the UTF-8 sequence at p (1 to 4), or 0 when it is not valid
 * UTF-8 (overlong forms, surrogates and code points past U+10FFFF too). */
static int utf8_length(const unsigned char *p) {
    unsigned c = p[0];
    int n = c < 0x80             ? 1
            : (c & 0xe0) == 0xc0 ? 2
            : (c & 0xf0) == 0xe0 ? 3
            : (c & 0xf8) == 0xf0 ? 4
                                 : 0;
    if (n <= 1) return n;
    uint32_t cp = c & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

const char *tool_json_number(char *buf, const char *fmt, double v) {
    if (!isfinite(v)) return "null";
    snprintf(buf, 32, fmt, v);
    return buf;
}

void tool_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = utf8_length(p);
        if (n == 0) {
            fputs("\\ufffd", f);
            p++;
            continue;
        }
        if (n > 1) {
            fwrite(p, 1, (size_t)n, f);
            p += n;
            continue;
        }
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
        p++;
    }
    fputc('"', f);
}

void tool_text_field(FILE *f, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int n = utf8_length(p);
        if (n > 1) {
            fwrite(p, 1, (size_t)n, f);
            p += n - 1;
        } else if (n == 0)
            fprintf(f, "\\x%02x", *p);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\r')
            fputs("\\r", f);
        else if (*p == '\\')
            fputs("\\\\", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
}

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a folder";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    return "not a regular file";
}

int tool_open_regular(const char *path, char *why, size_t why_cap, long long *size) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, why_cap, "%s", strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_cap, "%s", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_cap, "is %s, not a regular file", file_kind(st.st_mode));
    } else {
        *size = (long long)st.st_size;
        return fd;
    }
    close(fd);
    return -1;
}

char *tool_read_file(const char *path, size_t max, size_t *len, char *why, size_t why_cap) {
    *len = 0;
    long long size;
    int fd = tool_open_regular(path, why, why_cap, &size);
    if (fd < 0) return NULL;
    char *buf = NULL;
    if ((unsigned long long)size > max) {
        snprintf(why, why_cap, "%lld bytes, more than the limit of %zu", size, max);
        goto fail;
    }
    size_t n = (size_t)size, got = 0;
    buf = malloc(n + 1);
    if (!buf) {
        snprintf(why, why_cap, "out of memory for %zu bytes", n);
        goto fail;
    }
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(why, why_cap, "%s", strerror(errno));
            goto fail;
        }
        if (r == 0) break; /* it shrank */
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *len = got;
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

// ----------------------------------------------------------------------------
// Bad files

const char *tool_shown(const char *text, char *buf, size_t cap) {
    dsrt_text_redact(text, buf, cap);
    return buf;
}

void tool_bad_add(tool_bad_list *l, const dsrt_bad_sample *b) {
    /* Shown with credentials masked: a pre-signed URL's signature, a URL's
     * password (the pipeline's reasons come masked already). */
    char path[4096], error[2048];
    if (b->path) dsrt_text_redact(b->path, path, sizeof path);
    dsrt_text_redact(b->error ? b->error : "", error, sizeof error);
    l->total++;
    if (l->n_shown < TOOL_BAD_SHOWN) {
        dsrt_bad_sample *k = &l->shown[l->n_shown];
        *k = *b;
        k->path = b->path ? strdup(path) : NULL;
        k->error = strdup(error);
        if ((b->path && !k->path) || !k->error) {
            free((char *)k->path);
            free((char *)k->error);
        } else {
            l->n_shown++;
        }
    }
    if (l->out) {
        fputs("{\"path\": ", l->out);
        if (b->path)
            tool_json_string(l->out, path);
        else
            fprintf(l->out, "null, \"id\": %u", (unsigned)b->id);
        fputs(", \"error\": ", l->out);
        tool_json_string(l->out, error);
        if (l->data) {
            fputs(", \"data\": ", l->out);
            tool_json_string(l->out, l->data);
        }
        if (fputs("}\n", l->out) == EOF) l->write_failed = 1;
    }
}

void tool_bad_free(tool_bad_list *l) {
    for (size_t i = 0; i < l->n_shown; i++) {
        free((char *)l->shown[i].path);
        free((char *)l->shown[i].error);
    }
    l->n_shown = 0;
}

void tool_bad_print(const char *who, const char *what, const tool_bad_list *l, uint64_t skipped,
                    int left_out, const char *list_path) {
    if (l->total == 0) return;
    /* The line in one write: stderr is unbuffered, and under mpirun a
     * worker's stdout reaches the terminal apart from it, between writes. */
    char how[64];
    if (left_out)
        snprintf(how, sizeof how, " left out");
    else
        snprintf(how, sizeof how, ", skipped %llu time%s", (unsigned long long)skipped,
                 skipped == 1 ? "" : "s");
    fprintf(stderr, "%s: %llu bad %s%sfile%s%s:\n", who, (unsigned long long)l->total, what,
            what[0] ? " " : "", l->total == 1 ? "" : "s", how);
    for (size_t i = 0; i < l->n_shown; i++) {
        fputs("  ", stderr);
        if (l->shown[i].path)
            tool_text_field(stderr, l->shown[i].path);
        else
            fprintf(stderr, "(sample %u)", (unsigned)l->shown[i].id);
        fputs(": ", stderr);
        tool_text_field(stderr, l->shown[i].error);
        fputc('\n', stderr);
    }
    if (l->total > l->n_shown) {
        fprintf(stderr, "  ... and %llu more", (unsigned long long)(l->total - l->n_shown));
        if (list_path)
            fprintf(stderr, " (all of them in %s)\n", list_path);
        else
            fprintf(stderr, " (--bad-list FILE writes them all)\n");
    }
}

void tool_bad_json(FILE *f, const char *prefix, const tool_bad_list *l, uint64_t skipped) {
    fprintf(f, ", \"%sbad_files\": [", prefix);
    for (size_t i = 0; i < l->n_shown; i++) {
        fputs(i ? ", {\"path\": " : "{\"path\": ", f);
        if (l->shown[i].path)
            tool_json_string(f, l->shown[i].path);
        else
            fprintf(f, "null, \"id\": %u", (unsigned)l->shown[i].id);
        fputs(", \"error\": ", f);
        tool_json_string(f, l->shown[i].error);
        fputc('}', f);
    }
    fprintf(f, "], \"%sbad_files_total\": %llu, \"%sskipped\": %llu", prefix,
            (unsigned long long)l->total, prefix, (unsigned long long)skipped);
}

// ----------------------------------------------------------------------------
// Output files

FILE *tool_open_output(const char *path, char *why, size_t why_cap) {
    /* O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of
     * waiting; it is cleared again for the writes. */
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
    if (fd < 0) {
        snprintf(why, why_cap, "%s",
                 errno == ENXIO ? "a FIFO that nothing reads" : strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        snprintf(why, why_cap, "%s", S_ISDIR(st.st_mode) ? "is a folder" : strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) {
        snprintf(why, why_cap, "%s", strerror(errno));
        close(fd);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "w");
    if (!f) {
        snprintf(why, why_cap, "%s", strerror(errno));
        close(fd);
    }
    return f;
}

int tool_same_file(const char *a, const char *b) {
    struct stat x, y;
    if (!a || !b || stat(a, &x) != 0 || stat(b, &y) != 0) return 0;
    return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int tool_check_output(const char *path, int regular, char *why, size_t why_cap) {
    struct stat st;
    if (!path[0]) {
        snprintf(why, why_cap, "an empty name");
        return -1;
    }
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            snprintf(why, why_cap, "is a folder");
            return -1;
        }
        if (regular && !S_ISREG(st.st_mode)) {
            snprintf(why, why_cap, "is %s, not a regular file", file_kind(st.st_mode));
            return -1;
        }
    }
    /* The folder must take a new file: try one. */
    size_t n = strlen(path);
    char *probe = malloc(n + 48);
    if (!probe) {
        snprintf(why, why_cap, "out of memory");
        return -1;
    }
    snprintf(probe, n + 48, "%s.write-check.%ld", path, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(why, why_cap, "cannot write in %.*s: %s", (int)(slash - path + 1), path,
                     strerror(errno));
        else
            snprintf(why, why_cap, "cannot write in the current folder: %s", strerror(errno));
        free(probe);
        return -1;
    }
    close(fd);
    unlink(probe);
    free(probe);
    return 0;
}
