/*
 * Class names kept in a network's description, and transfer learning.
 *
 * A model file keeps the description text its net was built from, so the
 * class names travel in it as comment lines ("# dsrt-class: NAME", one per
 * class, in class order) that the description parser ignores: a model
 * trained on a folder can later label images with the folder names without
 * any file beside it.
 *
 * Transfer learning rewrites the base net's description (the replaced fully
 * connected layer gets outputs=classes and its learn-rate factors, the
 * other learnable layers their factors multiplied by base_lr_factor), builds
 * the new net from it, and copies every kept layer's parameters and the
 * running statistics across. It uses only the public nn API (and the class
 * line's prefix, which nn/ writes too).
 */
#include "core/internal.h"
#include "nn/internal.h"

#include <dsrt/train.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLASS_PREFIX DSRT_CLASS_LINE

// ----------------------------------------------------------------------------
// A growing string

typedef struct {
    char *s;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (dsrt__grow((void **)&b->s, &b->cap, b->len + n + 1, 1)) {
        b->failed = 1;
        return;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_str(strbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static char *sb_done(strbuf *b) {
    if (b->failed || !b->s) {
        free(b->s);
        dsrt__fail(-ENOMEM, "out of memory writing a description");
        return NULL;
    }
    return b->s;
}

// ----------------------------------------------------------------------------
// Class names

static const char *spec_text(const char *spec) {
    const char *text = dsrt_net_builtin(spec, NULL);
    if (text) return text;
    if (!strpbrk(spec, " \t\n=#")) {
        dsrt__fail(DSRT_EOPTION, "net: unknown network '%s'", spec);
        return NULL;
    }
    return spec;
}

static int is_class_line(const char *line, size_t n) {
    size_t k = strlen(CLASS_PREFIX);
    return n >= k && memcmp(line, CLASS_PREFIX, k) == 0;
}

/* Appends text's lines to b, leaving out the class lines. */
static void copy_without_classes(strbuf *b, const char *text) {
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (!is_class_line(line, n)) {
            sb_add(b, line, n);
            sb_add(b, "\n", 1);
        }
        line += n + (end ? 1 : 0);
    }
}

static int add_classes(strbuf *b, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!names[i]) return dsrt__fail(DSRT_EOPTION, "class names: name %zu is missing", i);
        if (strpbrk(names[i], "\r\n")) {
            /* The name as it reads, line breaks shown. */
            char shown[300];
            size_t k = 0;
            for (const char *c = names[i]; *c && k + 3 < sizeof shown; c++) {
                if (*c == '\n' || *c == '\r') shown[k++] = '\\';
                shown[k++] = *c == '\n' ? 'n' : *c == '\r' ? 'r' : *c;
            }
            shown[k] = '\0';
            return dsrt__fail(DSRT_EOPTION,
                              "class names: class %zu, \"%s\": a name with a line break cannot be "
                              "kept in a model (its description holds one name a line); rename it",
                              i, shown);
        }
        sb_str(b, CLASS_PREFIX);
        sb_str(b, names[i]);
        sb_add(b, "\n", 1);
    }
    return 0;
}

int dsrt_class_names_parse(const char *text, size_t len, char ***names, int *count) {
    if (!names || !count || (!text && len)) return dsrt__fail(-EINVAL, "class names: no text");
    *names = NULL;
    *count = 0;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    if (len == 0) return dsrt__fail(DSRT_EFORMAT, "class names: no names in it");
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    if (lines > (size_t)1 << 24)
        return dsrt__fail(DSRT_EFORMAT, "class names: %zu lines (at most %d)", lines, 1 << 24);
    /* One block: the array, then every name NUL-terminated. */
    char **v = dsrt__malloc((lines + 1) * sizeof *v + len + 1);
    if (!v) return -ENOMEM;
    char *out = (char *)(v + lines + 1);
    size_t at = 0;
    for (size_t k = 0; k < lines; k++) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - at;
        if (n && text[at + n - 1] == '\r') n--;
        char why[128];
        if (dsrt__class_name_check(text + at, n, why, sizeof why) != 0) {
            free(v);
            return dsrt__fail(DSRT_EFORMAT, "class names: line %zu: %s", k + 1, why);
        }
        memcpy(out, text + at, n);
        out[n] = '\0';
        v[k] = out;
        out += n + 1;
        at = end + 1;
    }
    v[lines] = NULL;
    *names = v;
    *count = (int)lines;
    return 0;
}

void dsrt_class_names_free(char **names) {
    free(names);
}

char *dsrt_describe_classes(const char *spec, const char *const *names, size_t n) {
    if (!spec) {
        dsrt__fail(-EINVAL, "describe: no description");
        return NULL;
    }
    const char *text = spec_text(spec);
    if (!text) return NULL;
    strbuf b = {0};
    copy_without_classes(&b, text);
    if (add_classes(&b, names, n)) {
        free(b.s);
        return NULL;
    }
    return sb_done(&b);
}

char *dsrt_describe_datastore_classes(const char *spec, const dsrt_datastore *ds) {
    size_t n = dsrt_datastore_num_classes(ds);
    const char **names = dsrt__calloc(n ? n : 1, sizeof *names);
    if (!names) return NULL;
    for (size_t i = 0; i < n; i++) names[i] = dsrt_datastore_class_name(ds, i);
    char *d = dsrt_describe_classes(spec, names, n);
    free(names);
    return d;
}

int dsrt_net_class_name(const dsrt_net *net, int c, char *buf, size_t size) {
    if (!net || c < 0 || (!buf && size)) return -EINVAL;
    int k = 0;
    for (const char *line = dsrt_net_description(net); *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (is_class_line(line, n) && k++ == c) {
            size_t p = strlen(CLASS_PREFIX), len = n - p;
            if (size) {
                size_t m = len < size - 1 ? len : size - 1;
                memcpy(buf, line + p, m);
                buf[m] = '\0';
            }
            return (int)len;
        }
        line += n + (end ? 1 : 0);
    }
    return -ENOENT;
}

// ----------------------------------------------------------------------------
// Transfer learning

dsrt_transfer_options dsrt_transfer_defaults(void) {
    dsrt_transfer_options o;
    memset(&o, 0, sizeof o);
    o.classes = 0;
    o.class_names = NULL;
    o.new_weight_lr = 20.0f;
    o.new_bias_lr = 20.0f;
    o.base_lr_factor = 1.0f;
    o.layer = NULL;
    return o;
}

#define MAX_TOKENS 64

/* Splits a layer line (comment removed) into tokens, in place. */
static int tokenize(char *line, char **tok) {
    int n = 0;
    for (char *p = line; *p && n < MAX_TOKENS;) {
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        tok[n++] = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\r') p++;
        if (*p) *p++ = '\0';
    }
    return n;
}

static int token_is(const char *tok, const char *key) {
    size_t k = strlen(key);
    return strncmp(tok, key, k) == 0 && tok[k] == '=';
}

static int has_lr_factors(const char *type) {
    return !strcmp(type, "conv") || !strcmp(type, "fc") || !strcmp(type, "batchnorm");
}

/* Writes one layer line: its tokens, with wlr/blr (and for the replaced
 * layer outputs) rewritten. */
static void write_layer(strbuf *b, char **tok, int n, int replaced, const char *name,
                        const dsrt_transfer_options *o) {
    double wlr = 1, blr = 1;
    int lr = has_lr_factors(tok[0]);
    sb_str(b, tok[0]);
    for (int i = 1; i < n; i++) {
        if (lr && token_is(tok[i], "wlr")) {
            wlr = strtod(tok[i] + 4, NULL);
            continue;
        }
        if (lr && token_is(tok[i], "blr")) {
            blr = strtod(tok[i] + 4, NULL);
            continue;
        }
        if (token_is(tok[i], "name")) continue;
        if (replaced && token_is(tok[i], "outputs")) continue;
        sb_add(b, " ", 1);
        sb_str(b, tok[i]);
    }
    char extra[256];
    snprintf(extra, sizeof extra, " name=%s", name);
    sb_str(b, extra);
    if (replaced) {
        snprintf(extra, sizeof extra, " outputs=classes wlr=%.9g blr=%.9g",
                 (double)o->new_weight_lr, (double)o->new_bias_lr);
        sb_str(b, extra);
    } else if (lr && (o->base_lr_factor != 1.0f || wlr != 1 || blr != 1)) {
        snprintf(extra, sizeof extra, " wlr=%.9g blr=%.9g", wlr * o->base_lr_factor,
                 blr * o->base_lr_factor);
        sb_str(b, extra);
    }
    sb_add(b, "\n", 1);
}

int dsrt_net_transfer(dsrt_net **out, const dsrt_net *base, const dsrt_transfer_options *o,
                      const dsrt_net_options *options) {
    if (!out || !base || !o) return dsrt__fail(-EINVAL, "transfer: no net or options");
    *out = NULL;
    if (o->classes < 1 || o->classes > (1 << 24))
        return dsrt__fail(DSRT_EOPTION, "transfer: classes: %d: not in [1, 2^24]", o->classes);
    if (!(o->new_weight_lr >= 0 && o->new_weight_lr <= 1e6) ||
        !(o->new_bias_lr >= 0 && o->new_bias_lr <= 1e6) ||
        !(o->base_lr_factor >= 0 && o->base_lr_factor <= 1e6))
        return dsrt__fail(
            DSRT_EOPTION, "transfer: learn-rate factors %g, %g, %g: each must be in [0, 1e6]",
            (double)o->new_weight_lr, (double)o->new_bias_lr, (double)o->base_lr_factor);
    dsrt_net_info bi;
    dsrt_net_get_info(base, &bi);

    /* The layer to replace. */
    int target = -1;
    dsrt_layer_info li;
    for (int i = 1; i < bi.layers; i++) {
        dsrt_net_layer(base, i, &li);
        if (o->layer ? !strcmp(li.name, o->layer) : !strcmp(li.type, "fc")) target = i;
    }
    if (target < 0)
        return dsrt__fail(DSRT_EOPTION, "transfer: %s%s%s: no such layer in the base net",
                          o->layer ? "layer '" : "no fully connected layer",
                          o->layer ? o->layer : "", o->layer ? "'" : "");
    dsrt_net_layer(base, target, &li);
    if (strcmp(li.type, "fc") != 0)
        return dsrt__fail(DSRT_EOPTION, "transfer: layer '%s' is a %s layer, not fc", li.name,
                          li.type);
    for (int i = target + 1; i < bi.layers; i++) {
        dsrt_layer_info after;
        dsrt_net_layer(base, i, &after);
        if (after.weights_count || after.bias_count)
            return dsrt__fail(DSRT_EOPTION,
                              "transfer: layer '%s' has learnable layer '%s' after it: only the "
                              "last one before the output can be replaced",
                              li.name, after.name);
    }

    /* The new description, layer line by layer line. */
    char *copy = dsrt__strdup(dsrt_net_description(base));
    if (!copy) return -ENOMEM;
    strbuf b = {0};
    int layer = 0, rc = 0;
    for (char *line = copy; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        size_t len = strlen(line);
        if (is_class_line(line, len)) {
            line = next;
            continue;
        }
        char *hash = strchr(line, '#'), *comment = NULL;
        if (hash) {
            comment = dsrt__strdup(hash);
            *hash = '\0';
        }
        char *tok[MAX_TOKENS];
        int n = tokenize(line, tok);
        if (n == 0) {
            if (comment) sb_str(&b, comment);
            sb_add(&b, "\n", 1);
        } else {
            dsrt_layer_info l;
            if (dsrt_net_layer(base, layer, &l) != 0 || strcmp(l.type, tok[0]) != 0) {
                rc = dsrt__fail(DSRT_EOPTION, "transfer: the base net's description does not "
                                              "match its layers");
                free(comment);
                break;
            }
            write_layer(&b, tok, n, layer == target, l.name, o);
            layer++;
        }
        free(comment);
        line = next;
    }
    free(copy);
    if (!rc && o->class_names) rc = add_classes(&b, o->class_names, (size_t)o->classes);
    char *desc = rc ? (free(b.s), NULL) : sb_done(&b);
    if (!desc) return rc ? rc : -ENOMEM;

    /* The new net, and the kept layers' weights and the state copied in. */
    dsrt_net *net = NULL;
    rc = dsrt_net_create(&net, desc, bi.height, bi.width, bi.channels, o->classes, options);
    free(desc);
    if (rc) return dsrt__fail_prefix(rc, "transfer");
    dsrt_net_info ni;
    dsrt_net_get_info(net, &ni);
    size_t bs, ns;
    const float *bstate = dsrt_net_state((dsrt_net *)base, &bs);
    float *nstate = dsrt_net_state(net, &ns);
    const float *bp = dsrt_net_params((dsrt_net *)base, NULL);
    float *np = dsrt_net_params(net, NULL);
    if (ni.layers != bi.layers || bs != ns) {
        rc = dsrt__fail(DSRT_ECORRUPT, "transfer: the new net's layers or state differ in size");
        goto fail;
    }
    for (int i = 1; i < bi.layers; i++) {
        dsrt_layer_info a, c;
        dsrt_net_layer(base, i, &a);
        dsrt_net_layer(net, i, &c);
        if (i == target) continue;
        if (a.weights_count != c.weights_count || a.bias_count != c.bias_count) {
            rc = dsrt__fail(DSRT_ECORRUPT, "transfer: layer '%s' changed size", a.name);
            goto fail;
        }
        memcpy(np + c.weights_offset, bp + a.weights_offset, a.weights_count * sizeof(float));
        memcpy(np + c.bias_offset, bp + a.bias_offset, a.bias_count * sizeof(float));
    }
    memcpy(nstate, bstate, bs * sizeof(float));
    dsrt_net_params_changed(net);
    *out = net;
    return 0;
fail:
    dsrt_net_destroy(net);
    return rc;
}
