/*
 * Built-in networks, written in the description format (parse.c):
 *
 *   digits, cifar, alexnet, resnet20  the peer benchmark's PyTorch
 *            definitions, layer for layer;
 *   resnet18, resnet50, mobilenet_v2, mobilenet_v3_large,
 *   mobilenet_v3_small, efficientnet_b0  torchvision's, layer for layer
 *            (the same learnables: 11,689,512, 25,557,032, 3,504,872,
 *            5,483,032, 2,542,856 and 5,288,548 with 1000 classes), its
 *            batchnorm epsilons and momenta, its dropout and stochastic
 *            depth; the initialisers are the net's.
 *
 * The generated ones are written on first use into static buffers.
 */
#include "internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char DIGITS[] = "# digits: 28x28x1, as the peer benchmark's digits_net\n"
                             "input size=28x28x1\n"
                             "conv name=conv1 filters=20 size=5\n"
                             "batchnorm name=bn1\n"
                             "relu name=relu1\n"
                             "conv name=conv2 filters=20 size=3 pad=1\n"
                             "batchnorm name=bn2\n"
                             "relu name=relu2\n"
                             "conv name=conv3 filters=20 size=3 pad=1\n"
                             "batchnorm name=bn3\n"
                             "relu name=relu3\n"
                             "fc name=fc outputs=classes\n"
                             "softmax name=output\n";

#define CBR(i, f)                                                                                  \
    "conv name=conv" i " filters=" f " size=3 pad=same\nbatchnorm name=bn" i "\nrelu name=relu" i  \
    "\n"

static const char CIFAR[] =
    "# cifar: 32x32x3, as the peer benchmark's cifar_net (width 32, depth 4)\n"
    "input size=32x32x3\n" CBR("1_1", "32") CBR("1_2", "32") CBR("1_3", "32")
        CBR("1_4", "32") "maxpool name=pool1 size=2 stride=2\n" CBR("2_1", "64") CBR("2_2", "64")
            CBR("2_3", "64")
                CBR("2_4", "64") "maxpool name=pool2 size=2 stride=2\n" CBR("3_1", "128")
                    CBR("3_2", "128") CBR("3_3", "128")
                        CBR("3_4", "128") "avgpool name=pool3 size=8 stride=8\n"
                                          "fc name=fc outputs=classes\n"
                                          "softmax name=output\n";

static const char ALEXNET[] =
    "# alexnet: 227x227x3, the original AlexNet (grouped conv2/4/5, LRN after relu1/relu2)\n"
    "input size=227x227x3\n"
    "conv name=conv1 filters=96 size=11 stride=4\n"
    "relu name=relu1\n"
    "lrn name=norm1 size=5 alpha=1e-4 beta=0.75 k=1\n"
    "maxpool name=pool1 size=3 stride=2\n"
    "conv name=conv2 filters=256 size=5 pad=2 groups=2\n"
    "relu name=relu2\n"
    "lrn name=norm2 size=5 alpha=1e-4 beta=0.75 k=1\n"
    "maxpool name=pool2 size=3 stride=2\n"
    "conv name=conv3 filters=384 size=3 pad=1\n"
    "relu name=relu3\n"
    "conv name=conv4 filters=384 size=3 pad=1 groups=2\n"
    "relu name=relu4\n"
    "conv name=conv5 filters=256 size=3 pad=1 groups=2\n"
    "relu name=relu5\n"
    "maxpool name=pool5 size=3 stride=2\n"
    "fc name=fc6 outputs=4096\n"
    "relu name=relu6\n"
    "dropout name=drop6 p=0.5\n"
    "fc name=fc7 outputs=4096\n"
    "relu name=relu7\n"
    "dropout name=drop7 p=0.5\n"
    "fc name=fc8 outputs=classes\n"
    "softmax name=output\n";

/*
 * Residual networks, written out by the functions below on first use:
 * resnet18 and resnet50 as torchvision defines them (a 7x7 stride-2 stem,
 * 3x3 max pooling, four stages of basic or bottleneck blocks, the stride on
 * the block's first 3x3 convolution, a 1x1 projection with batchnorm where a
 * block changes the shape, global average pooling, one fully connected
 * layer), and resnet20, the CIFAR-size network of the peer benchmark (a 3x3
 * stem and three stages of three basic blocks, 16, 32 and 64 wide).
 */
typedef struct {
    char *buf;
    size_t size, at;
    const char *init; /* the convolutions' and the fc's init= ("" for the net's) */
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->at, t->at < t->size ? t->size - t->at : 0, fmt, ap);
    va_end(ap);
    if (n > 0) t->at += (size_t)n;
}

/* conv + batchnorm (+ relu) named p_conv, p_bn, p_relu. */
static void conv_bn(text *t, const char *p, int filters, int size, int stride, int pad, int relu,
                    const char *input) {
    put(t, "conv name=%s_conv filters=%d size=%d stride=%d pad=%d bias=0%s%s%s\n", p, filters, size,
        stride, pad, t->init, input ? " inputs=" : "", input ? input : "");
    put(t, "batchnorm name=%s_bn\n", p);
    if (relu) put(t, "relu name=%s_relu\n", p);
}

/* One residual block after layer `in` (cin channels): basic (two 3x3) or
 * bottleneck (1x1, 3x3, 1x1 of 4 x width); its output is named out. */
static void block(text *t, const char *in, int cin, int width, int stride, int bottleneck,
                  const char *out, int *cout) {
    char p[64], a[64], skip[64], last[64];
    int exp = bottleneck ? 4 * width : width;
    if (bottleneck) {
        snprintf(p, sizeof p, "%.40s_a", out);
        conv_bn(t, p, width, 1, 1, 0, 1, in);
        snprintf(p, sizeof p, "%.40s_b", out);
        conv_bn(t, p, width, 3, stride, 1, 1, NULL);
        snprintf(p, sizeof p, "%.40s_c", out);
        conv_bn(t, p, exp, 1, 1, 0, 0, NULL);
    } else {
        snprintf(p, sizeof p, "%.40s_a", out);
        conv_bn(t, p, width, 3, stride, 1, 1, in);
        snprintf(p, sizeof p, "%.40s_b", out);
        conv_bn(t, p, width, 3, 1, 1, 0, NULL);
    }
    snprintf(last, sizeof last, "%.50s_bn", p);
    if (stride != 1 || cin != exp) {
        snprintf(a, sizeof a, "%.40s_down", out);
        conv_bn(t, a, exp, 1, stride, 0, 0, in);
        snprintf(skip, sizeof skip, "%.50s_bn", a);
    } else {
        snprintf(skip, sizeof skip, "%s", in);
    }
    put(t, "add name=%s inputs=%s,%s relu=1\n", out, last, skip);
    *cout = exp;
}

/* stages: blocks a stage; widths: each stage's; cifar: the 3x3 stem. */
static void resnet(text *t, const char *title, const int *stages, const int *widths, int n_stages,
                   int bottleneck, int cifar) {
    put(t, "# %s\n", title);
    if (cifar) {
        put(t, "input size=32x32x3\n");
        conv_bn(t, "stem", widths[0], 3, 1, 1, 1, NULL);
    } else {
        put(t, "input size=224x224x3\n");
        conv_bn(t, "stem", 64, 7, 2, 3, 1, NULL);
        put(t, "maxpool name=stem_pool size=3 stride=2 pad=1\n");
    }
    char in[64], out[64];
    snprintf(in, sizeof in, "%s", cifar ? "stem_relu" : "stem_pool");
    int c = cifar ? widths[0] : 64;
    for (int s = 0; s < n_stages; s++)
        for (int b = 0; b < stages[s]; b++) {
            snprintf(out, sizeof out, "s%d_b%d", s + 1, b + 1);
            block(t, in, c, widths[s], b == 0 && s > 0 ? 2 : 1, bottleneck, out, &c);
            snprintf(in, sizeof in, "%s", out);
        }
    put(t, "gap name=pool\nfc name=fc outputs=classes%s\nsoftmax name=output\n", t->init);
}

static char RESNET18[8192], RESNET50[20480], RESNET20[8192];

static void make_resnets(void) {
    static const int r18[] = {2, 2, 2, 2}, r50[] = {3, 4, 6, 3}, w[] = {64, 128, 256, 512};
    static const int r20[] = {3, 3, 3}, w20[] = {16, 32, 64};
    text t = {RESNET18, sizeof RESNET18, 0, ""};
    resnet(&t, "resnet18: 224x224x3, torchvision's resnet18 (basic blocks 2-2-2-2)", r18, w, 4, 0,
           0);
    t = (text){RESNET50, sizeof RESNET50, 0, ""};
    resnet(&t, "resnet50: 224x224x3, torchvision's resnet50 (bottleneck blocks 3-4-6-3)", r50, w, 4,
           1, 0);
    /* The peer's resnet20 keeps PyTorch's default initialisers. */
    t = (text){RESNET20, sizeof RESNET20, 0, " init=uniform"};
    resnet(&t, "resnet20: 32x32x3, the peer benchmark's CIFAR resnet20 (3 x 3 basic blocks)", r20,
           w20, 3, 0, 1);
}

/*
 * The mobile networks: torchvision's mobilenet_v2, mobilenet_v3_large and
 * _small and efficientnet_b0 (width and depth 1.0). Each is a stem
 * convolution, inverted-residual blocks (a 1x1 expansion unless the
 * expansion ratio is 1, a depthwise kxk convolution, squeeze-and-excitation
 * where the block has it, a 1x1 projection with no activation, the skip
 * where the block keeps its shape), a 1x1 convolution to the head's width,
 * global average pooling and the classifier.
 */

/* torchvision's _make_divisible(v, 8): channels a multiple of 8, never
 * below 90% of v. */
static int divisible8(double v) {
    int n = (int)(v + 4) / 8 * 8;
    if (n < 8) n = 8;
    if (n < 0.9 * v) n += 8;
    return n;
}

/* conv (+ batchnorm with eps and momentum) (+ activation act, "" for none)
 * named p_conv, p_bn, p_act. */
static void conv_bn_act(text *t, const char *p, int filters, int size, int stride, int groups,
                        const char *bn, const char *act, const char *input) {
    put(t, "conv name=%s_conv filters=%d size=%d stride=%d pad=%d bias=0", p, filters, size, stride,
        (size - 1) / 2);
    if (groups > 1) put(t, " groups=%d", groups);
    put(t, "%s%s\n", input ? " inputs=" : "", input ? input : "");
    put(t, "batchnorm name=%s_bn%s\n", p, bn);
    if (*act) put(t, "%s name=%s_act\n", act, p);
}

/* Squeeze-and-excitation after layer x (c channels): global average
 * pooling, a 1x1 convolution to sq channels, act, one back to c, the gate
 * (gate), x times it; named p_se. */
static void squeeze_excite(text *t, const char *p, const char *x, int c, int sq, const char *act,
                           const char *gate) {
    put(t, "gap name=%s_se_pool inputs=%s\n", p, x);
    put(t, "conv name=%s_se_fc1 filters=%d size=1\n", p, sq);
    put(t, "%s name=%s_se_act\n", act, p);
    put(t, "conv name=%s_se_fc2 filters=%d size=1\n", p, c);
    put(t, "%s name=%s_se_gate\n", gate, p);
    put(t, "mul name=%s_se inputs=%s,%s_se_gate\n", p, x, p);
}

/* One inverted-residual block after layer `in` (cin channels): expansion
 * to exp channels, depthwise k x k with stride, squeeze to sq channels
 * (0: none), projection to cout; the block's last layer is named p (the
 * skip's add, or the projection's batchnorm p_project_bn, into last). sd:
 * the stochastic depth's p on the skip (< 0: none). */
static void inverted_residual(text *t, const char *p, const char *in, int cin, int exp, int k,
                              int stride, int sq, int cout, const char *bn, const char *act,
                              const char *se_act, const char *gate, double sd, char *last,
                              size_t cap) {
    char q[64], x[96];
    const char *from = in;
    if (exp != cin) {
        snprintf(q, sizeof q, "%.50s_expand", p);
        conv_bn_act(t, q, exp, 1, 1, 1, bn, act, from);
        from = NULL;
    }
    snprintf(q, sizeof q, "%.50s_dw", p);
    conv_bn_act(t, q, exp, k, stride, exp, bn, act, from);
    snprintf(x, sizeof x, "%.50s_dw_act", p);
    if (sq) {
        squeeze_excite(t, p, x, exp, sq, se_act, gate);
        snprintf(x, sizeof x, "%.50s_se", p);
    }
    snprintf(q, sizeof q, "%.50s_project", p);
    conv_bn_act(t, q, cout, 1, 1, 1, bn, "", x);
    if (stride == 1 && cin == cout) {
        char drop[96];
        snprintf(drop, sizeof drop, "%.50s_project_bn", p);
        if (sd >= 0) {
            put(t, "stochastic_depth name=%s_drop p=%.6g\n", p, sd);
            snprintf(drop, sizeof drop, "%.50s_drop", p);
        }
        put(t, "add name=%s inputs=%s,%s\n", p, drop, in);
        snprintf(last, cap, "%s", p);
    } else {
        snprintf(last, cap, "%.50s_project_bn", p);
    }
}

static void mobilenet_v2(text *t) {
    /* expansion, channels, blocks, stride of the first */
    static const int cfg[][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                 {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
    put(t, "# mobilenet_v2: 224x224x3, torchvision's mobilenet_v2 (width 1.0)\n"
           "input size=224x224x3\n");
    conv_bn_act(t, "stem", 32, 3, 2, 1, "", "relu6", NULL);
    char in[64] = "stem_act", p[32], last[64];
    int c = 32, b = 0;
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(cfg); s++)
        for (int i = 0; i < cfg[s][2]; i++) {
            snprintf(p, sizeof p, "b%d", ++b);
            inverted_residual(t, p, in, c, c * cfg[s][0], 3, i == 0 ? cfg[s][3] : 1, 0, cfg[s][1],
                              "", "relu6", NULL, NULL, -1, last, sizeof last);
            snprintf(in, sizeof in, "%s", last);
            c = cfg[s][1];
        }
    conv_bn_act(t, "head", 1280, 1, 1, 1, "", "relu6", in);
    put(t, "gap name=pool\ndropout name=drop p=0.2\nfc name=fc outputs=classes\n"
           "softmax name=output\n");
}

/* MobileNetV3's blocks: kernel, expanded channels, output channels,
 * squeeze-and-excitation, hardswish (else ReLU), stride. */
typedef struct {
    int k, exp, out, se, hs, stride;
} v3_block;

static void mobilenet_v3(text *t, const char *title, const v3_block *cfg, int n, int head,
                         int last_width) {
    static const char BN[] = " eps=0.001 momentum=0.01";
    put(t, "# %s\ninput size=224x224x3\n", title);
    conv_bn_act(t, "stem", 16, 3, 2, 1, BN, "hardswish", NULL);
    char in[64] = "stem_act", p[32], last[64];
    int c = 16;
    for (int b = 0; b < n; b++) {
        const v3_block *k = &cfg[b];
        snprintf(p, sizeof p, "b%d", b + 1);
        inverted_residual(t, p, in, c, k->exp, k->k, k->stride, k->se ? divisible8(k->exp / 4) : 0,
                          k->out, BN, k->hs ? "hardswish" : "relu", "relu", "hardsigmoid", -1, last,
                          sizeof last);
        snprintf(in, sizeof in, "%s", last);
        c = k->out;
    }
    conv_bn_act(t, "head", head, 1, 1, 1, BN, "hardswish", in);
    put(t,
        "gap name=pool\nfc name=fc1 outputs=%d\nhardswish name=fc1_act\n"
        "dropout name=drop p=0.2\nfc name=fc outputs=classes\nsoftmax name=output\n",
        last_width);
}

static void efficientnet_b0(text *t) {
    /* expansion, kernel, stride, channels, blocks */
    static const int cfg[][5] = {{1, 3, 1, 16, 1}, {6, 3, 2, 24, 2},  {6, 5, 2, 40, 2},
                                 {6, 3, 2, 80, 3}, {6, 5, 1, 112, 3}, {6, 5, 2, 192, 4},
                                 {6, 3, 1, 320, 1}};
    int total = 0;
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(cfg); s++) total += cfg[s][4];
    put(t, "# efficientnet_b0: 224x224x3, torchvision's efficientnet_b0\n"
           "input size=224x224x3\n");
    conv_bn_act(t, "stem", 32, 3, 2, 1, "", "silu", NULL);
    char in[64] = "stem_act", p[32], last[64];
    int c = 32, b = 0;
    for (size_t s = 0; s < DSRT_ARRAY_SIZE(cfg); s++)
        for (int i = 0; i < cfg[s][4]; i++) {
            snprintf(p, sizeof p, "b%d", b + 1);
            /* Stochastic depth rises linearly to 0.2 over the blocks. */
            double sd = 0.2 * b / total;
            b++;
            inverted_residual(t, p, in, c, c * cfg[s][0], cfg[s][1], i == 0 ? cfg[s][2] : 1,
                              c / 4 > 1 ? c / 4 : 1, cfg[s][3], "", "silu", "silu", "sigmoid", sd,
                              last, sizeof last);
            snprintf(in, sizeof in, "%s", last);
            c = cfg[s][3];
        }
    conv_bn_act(t, "head", 4 * 320, 1, 1, 1, "", "silu", in);
    put(t, "gap name=pool\ndropout name=drop p=0.2\nfc name=fc outputs=classes\n"
           "softmax name=output\n");
}

static char MOBILENET_V2[24576], MOBILENET_V3_LARGE[32768], MOBILENET_V3_SMALL[24576],
    EFFICIENTNET_B0[32768];
static pthread_once_t made_once = PTHREAD_ONCE_INIT;

static void make_nets(void) {
    make_resnets();
    text t = {MOBILENET_V2, sizeof MOBILENET_V2, 0, ""};
    mobilenet_v2(&t);
    static const v3_block large[] = {
        {3, 16, 16, 0, 0, 1},   {3, 64, 24, 0, 0, 2},   {3, 72, 24, 0, 0, 1},
        {5, 72, 40, 1, 0, 2},   {5, 120, 40, 1, 0, 1},  {5, 120, 40, 1, 0, 1},
        {3, 240, 80, 0, 1, 2},  {3, 200, 80, 0, 1, 1},  {3, 184, 80, 0, 1, 1},
        {3, 184, 80, 0, 1, 1},  {3, 480, 112, 1, 1, 1}, {3, 672, 112, 1, 1, 1},
        {5, 672, 160, 1, 1, 2}, {5, 960, 160, 1, 1, 1}, {5, 960, 160, 1, 1, 1},
    };
    static const v3_block small[] = {
        {3, 16, 16, 1, 0, 2},  {3, 72, 24, 0, 0, 2},  {3, 88, 24, 0, 0, 1},  {5, 96, 40, 1, 1, 2},
        {5, 240, 40, 1, 1, 1}, {5, 240, 40, 1, 1, 1}, {5, 120, 48, 1, 1, 1}, {5, 144, 48, 1, 1, 1},
        {5, 288, 96, 1, 1, 2}, {5, 576, 96, 1, 1, 1}, {5, 576, 96, 1, 1, 1},
    };
    t = (text){MOBILENET_V3_LARGE, sizeof MOBILENET_V3_LARGE, 0, ""};
    mobilenet_v3(&t, "mobilenet_v3_large: 224x224x3, torchvision's mobilenet_v3_large", large,
                 (int)DSRT_ARRAY_SIZE(large), 960, 1280);
    t = (text){MOBILENET_V3_SMALL, sizeof MOBILENET_V3_SMALL, 0, ""};
    mobilenet_v3(&t, "mobilenet_v3_small: 224x224x3, torchvision's mobilenet_v3_small", small,
                 (int)DSRT_ARRAY_SIZE(small), 576, 1024);
    t = (text){EFFICIENTNET_B0, sizeof EFFICIENTNET_B0, 0, ""};
    efficientnet_b0(&t);
}

static const char *const BUILTIN_NAMES[] = {
    "digits",
    "cifar",
    "alexnet",
    "resnet18",
    "resnet50",
    "resnet20",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "efficientnet_b0",
    NULL,
};

const char *dsrt_net_builtin(const char *name, const char *const **names) {
    const char *const texts[] = {DIGITS,
                                 CIFAR,
                                 ALEXNET,
                                 RESNET18,
                                 RESNET50,
                                 RESNET20,
                                 MOBILENET_V2,
                                 MOBILENET_V3_LARGE,
                                 MOBILENET_V3_SMALL,
                                 EFFICIENTNET_B0};
    if (names) *names = BUILTIN_NAMES;
    if (!name) return NULL;
    pthread_once(&made_once, make_nets);
    for (int i = 0; BUILTIN_NAMES[i]; i++)
        if (!strcmp(BUILTIN_NAMES[i], name)) return texts[i];
    return NULL;
}
