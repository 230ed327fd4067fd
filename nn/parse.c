/*
 * Network descriptions: the text format and its one table of layer types
 * (the built-in networks written in it are in builtins.c).
 *
 * Format
 * ------
 * A description is plain text, one layer a line, from the input layer to the
 * classification output:
 *
 *     # digits: three convolutions and a classifier
 *     input size=28x28x1 normalization=none
 *     conv name=conv1 filters=20 size=5
 *     batchnorm
 *     relu
 *     fc outputs=classes
 *     softmax
 *
 * - A line is a layer type followed by options written name=value, separated
 *   by spaces or tabs. `#` starts a comment that runs to the end of the line;
 *   blank lines are ignored. Each option may appear once per line; options
 *   not given take their defaults.
 * - Every layer has `name=` (letters, digits, `_ . -`, at most 47 bytes);
 *   by default `<type>_<k>` for the k-th layer of that type (conv_1, relu_2).
 *   Names are unique in a network.
 * - Values: integers, decimal numbers (1e-4), words from a list, sizes
 *   `N` or `HxW` (height x width), and comma-separated lists.
 * - The first layer is `input`, the last is `softmax`, and neither appears
 *   elsewhere. Layers run in the order written; each takes the previous
 *   one's output unless `inputs=a,b` names the layers (above it) whose
 *   outputs it takes: a network is then a graph (ResNet's skip connections,
 *   Inception's branches). Only `add`, `concat` and `mul` take several inputs; a
 *   layer's output may feed several layers (its gradient is then the sum of
 *   theirs), and every layer's output but the last one's must feed one.
 *   Shapes are inferred; a layer whose input is too small for it, inputs
 *   that do not agree, or an option out of range, is an error naming the
 *   line and option.
 *
 * Layer types and options (defaults in brackets; MATLAB's layer in braces):
 *
 *   input      {imageInputLayer} image input, float NCHW batches
 *              size=HxWxC [from the caller]   normalization=none|zerocenter|
 *              zscore|rescale|rescale-symmetric [none]; per-channel statistics
 *              mean= std= min= max= as one value or one per channel [0,1,0,1];
 *              runtime code may set them from the data instead.
 *   conv       {convolution2dLayer, groupedConvolution2dLayer}
 *              filters=N (required)  size=K|KHxKW (required)  stride=S|SHxSW [1]
 *              pad=P|PHxPW|T,B,L,R|same [0]  dilation=D|DHxDW [1]  groups=G [1]
 *              bias=0|1 [1]  init=default|glorot|he|uniform [default: the net's]
 *              wlr= blr= [1] learn-rate factors of weights and bias;
 *              wl2= [1] bl2= [0] L2 factors
 *   batchnorm  {batchNormalizationLayer} eps= [1e-5] momentum= [0.1] (running
 *              average weight of the new batch); wlr blr (scale, offset) [1];
 *              wl2 bl2 [1]
 *   relu       {reluLayer} leak= [0]: slope for negative inputs
 *   leakyrelu  {leakyReluLayer} leak= [0.01]
 *   clip       {clippedReluLayer} min= max= [the float range: no bound]:
 *              min(max(x, min), max); relu6: clip with min=0 max=6
 *   sigmoid    {sigmoidLayer} 1 / (1 + e^-x)
 *   hardsigmoid  alpha= [1/6] beta= [0.5]: max(0, min(1, alpha x + beta))
 *   hardswish  x relu6(x + 3) / 6
 *   silu, swish  {swishLayer} x sigmoid(x)
 *   gelu       {geluLayer} approximate=none|tanh [none]: x Phi(x), or its tanh
 *              form; each activation's gradient at a kink is PyTorch's
 *   maxpool    {maxPooling2dLayer} size= (required) stride= [1] pad= [0] as conv
 *              ceil=0|1 [0]: 1 rounds the output size up (PyTorch's ceil_mode;
 *              a last window that would start in the padding is dropped)
 *   avgpool    {averagePooling2dLayer} as maxpool, and count_pad=0|1 [1]: 1
 *              divides each window's sum by its size, the padding counting
 *              as zeros (MATLAB's and PyTorch's default; a partial last
 *              window of ceil=1 by its part inside the padded input); 0 by
 *              the number of its elements inside the image (PyTorch's
 *              count_include_pad=False, ONNX's default)
 *   gap        {globalAveragePooling2dLayer} no options
 *   fc         {fullyConnectedLayer} outputs=N|classes (required)
 *              bias init wlr blr wl2 bl2 as conv
 *   dropout    {dropoutLayer} p= [0.5] probability of dropping; survivors are
 *              scaled by 1/(1-p) in training
 *   stochastic_depth  p= (required) the probability a whole image's input is
 *              dropped in training (drop path), the others scaled by 1/(1-p);
 *              the identity at inference
 *   layernorm  {layerNormalizationLayer over channels} eps= [1e-6]: each
 *              pixel's channels to zero mean and unit variance, then a
 *              learnable scale and offset a channel (ConvNeXt's LayerNorm2d);
 *              wlr blr wl2 bl2 as batchnorm
 *   scale      a learnable factor a channel (ConvNeXt's layer scale):
 *              init= [1] the factors' starting value; wlr= wl2= [1]
 *   pad        pad=T,B,L,R|P|PHxPW (required) value= [0]: constant padding
 *   lrn        {crossChannelNormalizationLayer} size= [5] channels in the
 *              window; alpha= [1e-4] beta= [0.75] k= [2]:
 *              y = x / (k + alpha/size * sum of x^2 over the window)^beta
 *   softmax    {softmaxLayer + classificationLayer} softmax and cross-entropy
 *              loss over the flattened input, which must have `classes` values
 *   add        {additionLayer} element-wise sum of two or more inputs of one
 *              shape; relu=0|1 [0] a ReLU on the sum (ResNet's)
 *   concat     {depthConcatenationLayer} two or more inputs of one height and
 *              width, side by side along the channels in the order named
 *   mul        {multiplicationLayer} the element-wise product of two inputs:
 *              the second of the first's shape, or 1x1 with its channels (a
 *              gate broadcast over the pixels: squeeze-and-excitation)
 *
 * Built-in networks (dsrt_net_builtin) are written in this format in
 * builtins.c.
 */
#include "internal.h"

#include <assert.h>
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Keywords: every kind's, in the order of nn/layers/list.h

const dsrt_layer_type *dsrt__layer_type_find(const char *name, dsrt_layer_kind *kind) {
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++)
        for (const dsrt_layer_type *t = dsrt__layers[k]->types; t->name; t++)
            if (!strcmp(t->name, name)) {
                *kind = (dsrt_layer_kind)k;
                return t;
            }
    return NULL;
}

/* The keyword's position among every kind's keywords (for default names). */
static int type_index(const dsrt_layer_type *row) {
    int at = 0;
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++)
        for (const dsrt_layer_type *t = dsrt__layers[k]->types; t->name; t++, at++)
            if (t == row) return at;
    return at;
}

/* How many keywords there are. */
static int type_count(void) {
    int n = 0;
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++)
        for (const dsrt_layer_type *t = dsrt__layers[k]->types; t->name; t++) n++;
    return n;
}

// ----------------------------------------------------------------------------
// Values

static int parse_long(const char *s, long *v) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (end == s || *end || errno) return -1;
    *v = x;
    return 0;
}

/* "12" or "3x5": two ints; a single value is used for both. */
static int parse_ints(const char *s, char sep, long *v, int max_n) {
    char buf[128];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    int n = 0;
    char *p = buf;
    for (;;) {
        char *q = strchr(p, sep);
        if (q) *q = '\0';
        if (n == max_n || parse_long(p, &v[n]) != 0) return -1;
        n++;
        if (!q) break;
        p = q + 1;
    }
    return n;
}

static int parse_float(const char *s, double *v) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(x)) return -1;
    *v = x;
    return 0;
}

static int check_range(const dsrt_opt_spec *o, double v) {
    return v >= o->min && v <= o->max ? 0 : -1;
}

/* A float option's range is checked on the float that is kept: the one
 * nearest the bound written is in the range (eps=1e-12 read back from the
 * float 9.99999996e-13 that it is). */
static int check_float_range(const dsrt_opt_spec *o, double v) {
    if (!(fabs(v) <= FLT_MAX)) return -1;
    float f = (float)v;
    return f >= (float)o->min && f <= (float)o->max ? 0 : -1;
}

/* What an option's setter returns besides 0 and a negative code with its
 * message: the value does not parse, or is out of the option's range. */
enum { VALUE_BAD = 1, VALUE_RANGE = 2 };

static int set_int(const dsrt_opt_spec *o, char *base, const char *value) {
    long v;
    if (parse_long(value, &v) != 0) return VALUE_BAD;
    if (check_range(o, (double)v)) return VALUE_RANGE;
    *(int *)(base + o->off) = (int)v;
    return 0;
}

static int set_float(const dsrt_opt_spec *o, char *base, const char *value) {
    double d;
    if (parse_float(value, &d) != 0) return VALUE_BAD;
    if (check_float_range(o, d)) return VALUE_RANGE;
    *(float *)(base + o->off) = (float)d;
    return 0;
}

static int set_bool(const dsrt_opt_spec *o, char *base, const char *value) {
    int *ip = (int *)(base + o->off);
    if (!strcmp(value, "1") || !strcmp(value, "true"))
        *ip = 1;
    else if (!strcmp(value, "0") || !strcmp(value, "false"))
        *ip = 0;
    else
        return VALUE_BAD;
    return 0;
}

static int set_pair(const dsrt_opt_spec *o, char *base, const char *value) {
    int *ip = (int *)(base + o->off);
    long v[2];
    int n = parse_ints(value, 'x', v, 2);
    if (n < 1) return VALUE_BAD;
    if (n == 1) v[1] = v[0];
    if (check_range(o, (double)v[0]) || check_range(o, (double)v[1])) return VALUE_RANGE;
    ip[0] = (int)v[0];
    ip[1] = (int)v[1];
    return 0;
}

/* Ints checked against the option's range, then stored. */
static int set_ints(const dsrt_opt_spec *o, int *ip, const long *v, int n) {
    for (int i = 0; i < n; i++)
        if (check_range(o, (double)v[i])) return VALUE_RANGE;
    for (int i = 0; i < n; i++) ip[i] = (int)v[i];
    return 0;
}

static int set_pad(const dsrt_opt_spec *o, char *base, const char *value) {
    int *ip = (int *)(base + o->off), *same = (int *)(base + o->off2);
    long v[4];
    int n;
    if (!strcmp(value, "same")) {
        *same = 1;
        ip[0] = ip[1] = ip[2] = ip[3] = 0;
        return 0;
    }
    *same = 0;
    if (strchr(value, ',')) {
        n = parse_ints(value, ',', v, 4);
        if (n != 4) return VALUE_BAD;
    } else {
        n = parse_ints(value, 'x', v, 2);
        if (n < 1) return VALUE_BAD;
        if (n == 1) v[1] = v[0];
        v[2] = v[3] = v[1];
        v[1] = v[0];
    }
    return set_ints(o, ip, v, 4);
}

static int set_size3(const dsrt_opt_spec *o, char *base, const char *value) {
    long v[3];
    if (parse_ints(value, 'x', v, 3) != 3) return VALUE_BAD;
    return set_ints(o, (int *)(base + o->off), v, 3);
}

static int set_enum(const dsrt_opt_spec *o, char *base, const char *value) {
    size_t len = strlen(value);
    const char *c = o->choices;
    for (int i = 0; *c; i++) {
        const char *e = strchr(c, '|');
        size_t cl = e ? (size_t)(e - c) : strlen(c);
        if (cl == len && !memcmp(c, value, len)) {
            *(int *)(base + o->off) = i;
            return 0;
        }
        if (!e) break;
        c = e + 1;
    }
    return dsrt__fail(DSRT_EOPTION, "option '%s': '%s' is not one of %s", o->name, value,
                      o->choices);
}

static int set_floats(const dsrt_opt_spec *o, char *base, const char *value) {
    float *f = (float *)(base + o->off);
    int *count = (int *)(base + o->off2);
    char buf[1024];
    double d;
    int n = 0;
    if (strlen(value) >= sizeof buf) return VALUE_BAD;
    strcpy(buf, value);
    for (char *p = buf;;) {
        char *q = strchr(p, ',');
        if (q) *q = '\0';
        if (n == DSRT_STATS_MAX)
            return dsrt__fail(DSRT_EOPTION, "option '%s': more than %d values", o->name,
                              DSRT_STATS_MAX);
        if (parse_float(p, &d) != 0) return VALUE_BAD;
        if (check_float_range(o, d)) return VALUE_RANGE;
        f[n++] = (float)d;
        if (!q) break;
        p = q + 1;
    }
    *count = n;
    return 0;
}

static int set_outputs(const dsrt_opt_spec *o, char *base, const char *value) {
    if (!strcmp(value, "classes")) {
        *(int *)(base + o->off) = DSRT_CLASSES_AUTO;
        return 0;
    }
    return set_int(o, base, value);
}

static int set_init(const dsrt_opt_spec *o, char *base, const char *value) {
    int *ip = (int *)(base + o->off);
    if (!strcmp(value, "default"))
        *ip = DSRT_INIT_DEFAULT;
    else if (!strcmp(value, "glorot"))
        *ip = DSRT_INIT_GLOROT;
    else if (!strcmp(value, "he"))
        *ip = DSRT_INIT_HE;
    else if (!strcmp(value, "uniform"))
        *ip = DSRT_INIT_UNIFORM;
    else
        return dsrt__fail(DSRT_EOPTION,
                          "option 'init': '%s' is not one of default|glorot|he|uniform", value);
    return 0;
}

/* Each type of option: its setter, and what a value of it looks like. */
static const struct {
    int (*set)(const dsrt_opt_spec *o, char *base, const char *value);
    const char *what;
} OPT_TYPES[] = {
    [OPT_INT] = {set_int, "an integer"},
    [OPT_FLOAT] = {set_float, "a number"},
    [OPT_BOOL] = {set_bool, "0 or 1"},
    [OPT_PAIR] = {set_pair, "N or HxW"},
    [OPT_PAD] = {set_pad, "same, N, HxW or T,B,L,R"},
    [OPT_SIZE3] = {set_size3, "HxWxC"},
    [OPT_ENUM] = {set_enum, "a word"},
    [OPT_FLOATS] = {set_floats, "a number or a comma-separated list"},
    [OPT_OUTPUTS] = {set_outputs, "an integer or 'classes'"},
    [OPT_INIT] = {set_init, "a word"},
};

/* Stores value into opts per spec; returns 0 or DSRT_EOPTION with a message
 * (without the line prefix). */
static int set_option(dsrt_layer_opts *opts, const dsrt_opt_spec *o, const char *value) {
    int rc = OPT_TYPES[o->type].set(o, (char *)opts, value);
    if (rc == VALUE_BAD)
        return dsrt__fail(DSRT_EOPTION, "option '%s': expected %s, got '%s'", o->name,
                          OPT_TYPES[o->type].what, value);
    if (rc == VALUE_RANGE)
        return dsrt__fail(DSRT_EOPTION, "option '%s': '%s' is out of range [%g, %g]", o->name,
                          value, o->min, o->max);
    return rc;
}

// ----------------------------------------------------------------------------
// Name sets

static size_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* name's slot: where it is, or the free slot where it would go. */
static size_t name_slot(const dsrt_layer_names *s, const char *name) {
    size_t k = name_hash(name) & (s->cap - 1);
    while (s->name[k][0] && strcmp(s->name[k], name)) k = (k + 1) & (s->cap - 1);
    return k;
}

int *dsrt__layer_names_find(const dsrt_layer_names *s, const char *name) {
    if (!s->cap) return NULL;
    size_t k = name_slot(s, name);
    return s->name[k][0] ? &s->value[k] : NULL;
}

int dsrt__layer_names_add(dsrt_layer_names *s, const char *name, int value) {
    assert(name[0] && strlen(name) < DSRT_LAYER_NAME_MAX);
    if (dsrt__layer_names_find(s, name)) return 1;
    if (2 * (s->n + 1) > s->cap) { /* at most half full */
        dsrt_layer_names g = {0};
        g.cap = s->cap ? 2 * s->cap : 64;
        g.name = dsrt__calloc(g.cap, sizeof *g.name);
        g.value = dsrt__calloc(g.cap, sizeof *g.value);
        if (!g.name || !g.value) {
            dsrt__layer_names_free(&g);
            return -ENOMEM;
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->name[i][0]) {
                size_t k = name_slot(&g, s->name[i]);
                memcpy(g.name[k], s->name[i], sizeof g.name[k]);
                g.value[k] = s->value[i];
            }
        g.n = s->n;
        dsrt__layer_names_free(s);
        *s = g;
    }
    size_t k = name_slot(s, name);
    snprintf(s->name[k], sizeof s->name[k], "%s", name);
    s->value[k] = value;
    s->n++;
    return 0;
}

void dsrt__layer_names_free(dsrt_layer_names *s) {
    free(s->name);
    free(s->value);
    memset(s, 0, sizeof *s);
}

// ----------------------------------------------------------------------------
// Lines

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= DSRT_LAYER_NAME_MAX) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.' && *s != '-') return 0;
    return 1;
}

/* Lists "a, b, c" of a type's option names into buf. */
static void option_names(const dsrt_layer_type *t, char *buf, size_t size) {
    size_t at = 0;
    buf[0] = '\0';
    at += (size_t)snprintf(buf, size, "name, inputs");
    for (const dsrt_opt_spec *o = t->opts; o->name && at < size; o++)
        at += (size_t)snprintf(buf + at, size - at, ", %s", o->name);
}

#define MAX_TOKENS 64

/* Parses one layer line (already stripped of its comment), tokens split in
 * place. Returns 0, or DSRT_EOPTION with the message (no line prefix). */
static int parse_line(dsrt_layer *l, char **tok, int ntok) {
    memset(l, 0, sizeof *l); /* the caller frees inputs_text whatever happens */
    dsrt_layer_kind kind;
    const dsrt_layer_type *t = dsrt__layer_type_find(tok[0], &kind);
    if (!t) {
        char names[1024];
        size_t at = 0;
        for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++)
            for (const dsrt_layer_type *r = dsrt__layers[k]->types; r->name && at < sizeof names;
                 r++)
                at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "",
                                       r->name);
        return dsrt__fail(DSRT_EOPTION, "unknown layer type '%s' (types: %s)", tok[0], names);
    }
    l->kind = kind;
    l->type = t->name;
    l->def = t;
    int seen[64] = {0};
    int nopts = 0;
    while (t->opts[nopts].name) nopts++;
    /* Defaults first, then the given values. */
    for (int i = 0; i < nopts; i++)
        if (t->opts[i].def && set_option(&l->o, &t->opts[i], t->opts[i].def) != 0)
            return DSRT_EOPTION; /* a bad default is a bug in the table */
    int named = 0;
    for (int k = 1; k < ntok; k++) {
        char *eq = strchr(tok[k], '=');
        if (!eq || eq == tok[k])
            return dsrt__fail(DSRT_EOPTION, "%s: expected name=value, got '%s'", t->name, tok[k]);
        *eq = '\0';
        const char *key = tok[k], *value = eq + 1;
        if (!*value) return dsrt__fail(DSRT_EOPTION, "%s: option '%s' has no value", t->name, key);
        if (!strcmp(key, "name")) {
            if (named) return dsrt__fail(DSRT_EOPTION, "%s: option 'name' given twice", t->name);
            if (!valid_name(value))
                return dsrt__fail(DSRT_EOPTION,
                                  "%s: option 'name': '%s' is not 1 to %d letters, digits or _.-",
                                  t->name, value, DSRT_LAYER_NAME_MAX - 1);
            strcpy(l->name, value);
            named = 1;
            continue;
        }
        if (!strcmp(key, "inputs")) {
            if (l->inputs_text)
                return dsrt__fail(DSRT_EOPTION, "%s: option 'inputs' given twice", t->name);
            if (dsrt__layers[kind]->max_inputs == 0)
                return dsrt__fail(DSRT_EOPTION, "%s: option 'inputs': the layer takes none",
                                  t->name);
            /* Names separated by commas; resolved when the net is built. */
            int n = 0;
            for (const char *p = value; *p; n++) {
                const char *e = strchr(p, ',');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                char nm[DSRT_LAYER_NAME_MAX];
                if (len == 0 || len >= sizeof nm) goto bad_inputs;
                memcpy(nm, p, len);
                nm[len] = '\0';
                if (!valid_name(nm)) goto bad_inputs;
                p = e ? e + 1 : p + len;
                if (e && !*p) goto bad_inputs;
            }
            if (n > DSRT_INPUTS_MAX)
                return dsrt__fail(DSRT_EOPTION, "%s: option 'inputs': %d names, at most %d",
                                  t->name, n, DSRT_INPUTS_MAX);
            if (!(l->inputs_text = dsrt__strdup(value))) return -ENOMEM;
            continue;
        bad_inputs:
            return dsrt__fail(DSRT_EOPTION,
                              "%s: option 'inputs': '%s' is not a comma-separated list of layer "
                              "names",
                              t->name, value);
        }
        int i = 0;
        while (i < nopts && strcmp(t->opts[i].name, key)) i++;
        if (i == nopts) {
            char names[512];
            option_names(t, names, sizeof names);
            return dsrt__fail(DSRT_EOPTION, "%s: unknown option '%s' (options: %s)", t->name, key,
                              names);
        }
        if (seen[i]) return dsrt__fail(DSRT_EOPTION, "%s: option '%s' given twice", t->name, key);
        seen[i] = 1;
        if (set_option(&l->o, &t->opts[i], value) != 0)
            return dsrt__fail_prefix(DSRT_EOPTION, "%s", t->name);
    }
    for (int i = 0; i < nopts; i++)
        if (!t->opts[i].def && !seen[i])
            return dsrt__fail(DSRT_EOPTION, "%s: option '%s' is required", t->name,
                              t->opts[i].name);
    return 0;
}

int dsrt__desc_parse(dsrt_desc *d, const char *text, const char *source) {
    int rc = 0, cap = 0, line_no = 0;
    char *copy = NULL;
    dsrt_layer_names names = {0};
    d->layers = NULL;
    d->n = 0;
    if (!text) return dsrt__fail(-EINVAL, "%s: no description", source);
    copy = dsrt__strdup(text);
    if (!copy) return -ENOMEM;
    for (char *line = copy; line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        line_no++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *tok[MAX_TOKENS];
        int ntok = 0;
        for (char *p = line;;) {
            while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\v' || *p == '\f') p++;
            if (!*p) break;
            if (ntok == MAX_TOKENS) {
                rc = dsrt__fail(DSRT_EOPTION, "%s: line %d: more than %d words", source, line_no,
                                MAX_TOKENS);
                goto fail;
            }
            tok[ntok++] = p;
            while (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\v' && *p != '\f') p++;
            if (*p) *p++ = '\0';
        }
        line = next;
        if (ntok == 0) continue;
        if (d->n == DSRT_LAYERS_MAX) {
            rc = dsrt__fail(DSRT_EOPTION, "%s: line %d: more than %d layers", source, line_no,
                            DSRT_LAYERS_MAX);
            goto fail;
        }
        if (d->n == cap) {
            size_t c = (size_t)cap;
            rc = dsrt__grow((void **)&d->layers, &c, (size_t)d->n + 1, sizeof *d->layers);
            if (rc) goto fail;
            cap = (int)c;
        }
        dsrt_layer *l = &d->layers[d->n];
        rc = parse_line(l, tok, ntok);
        if (rc) {
            free(l->inputs_text);
            dsrt__fail_prefix(rc, "%s: line %d", source, line_no);
            goto fail;
        }
        l->line = line_no;
        d->n++;
    }
    if (d->n == 0) {
        rc = dsrt__fail(DSRT_EOPTION, "%s: no layers", source);
        goto fail;
    }
    /* The names given, each once; then default names, <type>_<k>, k
     * counting that type from 1 and skipping names taken. */
    for (int i = 0; i < d->n; i++) {
        const dsrt_layer *l = &d->layers[i];
        if (!l->name[0]) continue;
        if ((rc = dsrt__layer_names_add(&names, l->name, i)) < 0) goto fail;
        if (rc) {
            int j = *dsrt__layer_names_find(&names, l->name);
            rc = dsrt__fail(DSRT_EOPTION, "%s: line %d: name '%s' is already used on line %d",
                            source, l->line, l->name, d->layers[j].line);
            goto fail;
        }
    }
    int n_types = type_count();
    int *seen = dsrt__calloc((size_t)n_types, 2 * sizeof *seen), *next = seen + n_types;
    if (!seen) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < d->n; i++) {
        dsrt_layer *l = &d->layers[i];
        int t = type_index(l->def);
        int k = ++seen[t];
        if (l->name[0]) continue;
        /* The names below next[t] were taken when the last one was made. */
        for (k = DSRT_MAX(k, next[t]);; k++) {
            snprintf(l->name, sizeof l->name, "%s_%d", l->type, k);
            if (!dsrt__layer_names_find(&names, l->name)) break;
        }
        next[t] = k + 1;
        if ((rc = dsrt__layer_names_add(&names, l->name, i)) < 0) {
            free(seen);
            goto fail;
        }
    }
    free(seen);
    dsrt__layer_names_free(&names);
    free(copy);
    return 0;
fail:
    dsrt__layer_names_free(&names);
    free(copy);
    dsrt__desc_free(d);
    return rc;
}

void dsrt__desc_free(dsrt_desc *d) {
    for (int i = 0; d->layers && i < d->n; i++) free(d->layers[i].inputs_text);
    free(d->layers);
    d->layers = NULL;
    d->n = 0;
}

size_t dsrt__desc_help(char *buf, size_t size) {
    size_t at = 0;
    for (int k = 0; k < DSRT_LAYER_KIND_COUNT; k++)
        for (const dsrt_layer_type *t = dsrt__layers[k]->types; t->name; t++) {
            at += (size_t)snprintf(buf + DSRT_MIN(at, size), size - DSRT_MIN(at, size),
                                   "  %-10s %s\n            name=", t->name, t->help);
            for (const dsrt_opt_spec *o = t->opts; o->name; o++)
                at += (size_t)snprintf(buf + DSRT_MIN(at, size), size - DSRT_MIN(at, size),
                                       " %s=%s", o->name, o->def ? o->def : "(required)");
            at += (size_t)snprintf(buf + DSRT_MIN(at, size), size - DSRT_MIN(at, size), "\n");
        }
    return at;
}
