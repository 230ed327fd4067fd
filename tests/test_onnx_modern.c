/*
 * The classifiers people pick today, as exporters write them, against
 * onnxruntime. torchvision's mobilenet_v2, mobilenet_v3_small and _large,
 * efficientnet_b0, regnet_y_400mf, densenet121 and convnext_tiny (seeded
 * random weights, randomised batchnorm statistics, LayerNorm and layer-scale
 * values, the last layer scaled so that the probabilities are not flat),
 * exported by Debian's torch at opsets 13 and 17 for 64x64 images; a
 * channels-last model as tf2onnx writes one; a net whose blocks PyTorch
 * writes as ONNX local functions; TensorFlow's "same" padding and a view
 * computed from the input's shape; fuzz_onnx's seeds (the expansions the
 * import puts back together among them); and models of constructs dsrt
 * does not compute. tests/onnx_ref.py makes them and runs the runtime.
 *
 *   import: dstrain classify --json gives every image's probabilities
 *           within 1e-4 of onnxruntime's and the same top-1;
 *   round trip: ONNX -> dsrt -> ONNX -> dsrt gives the same weights bit for
 *           bit, and the export in onnxruntime on raw pixels agrees with
 *           dstrain classify;
 *   transfer: train --transfer from the imported mobilenet_v2 and from the
 *           channels-last model learns the new last layer, the others
 *           frozen bit for bit;
 *   refusal: each construct dsrt does not compute stops the import naming
 *           its node.
 *
 * Skips (77) as test_onnx_ref does.
 */
#include "onnx_test.h"

static const char *const FAMILIES[] = {
    "mobilenet_v2",   "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
    "regnet_y_400mf", "densenet121",        "convnext_tiny",
};

/* dstrain classify on MODEL (with extra options) against the runtime on
 * the same pixels (ort_opts: --torchvision, --scale S or nothing), the
 * images of folder img. */
static int agrees_on(const char *img, const char *model, const char *classify_opts,
                     const char *ort_opts) {
    return sh("cd '%s' && '%s' classify --model %s %s --json --threads 2 $(cat %s/paths.txt) > "
              "%s.jsonl && '%s' '%s' ort %s/pixels.npy %s %s %s.npy && '%s' '%s' compare 1e-4 "
              "%s.jsonl %s.npy",
              dir, dstrain, model, classify_opts, img, model, venv, script, img, ort_opts, model,
              model, venv, script, model, model);
}

static int agrees(const char *model, const char *classify_opts, const char *ort_opts) {
    return agrees_on("img", model, classify_opts, ort_opts);
}

/* After train --transfer from base.dsrt into trained.dsrt (in dir): how
 * many learnable layers but the new last one kept their weights. */
static int kept(const char *base, const char *trained) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/%s", dir, base);
    snprintf(b, sizeof b, "%s/%s", dir, trained);
    int same, changed;
    kept_layers(a, b, 3, &same, &changed);
    CHECK_EQ(changed, 0);
    return same;
}

static void test_families(void) {
    CHECK_EQ(sh("cd '%s' && %s '%s' images img 64 6 2>&1", dir, SYS_PY, script), 0);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(FAMILIES); k++) {
        const char *n = FAMILIES[k];
        CHECK_EQ(
            sh("cd '%s' && %s '%s' modern %s 64 %s > %s.log 2>&1", dir, SYS_PY, script, n, n, n),
            0);
        for (int opset = 13; opset <= 17; opset += 4) {
            char model[128];
            snprintf(model, sizeof model, "%s-%d.onnx", n, opset);
            fprintf(stderr, "  %s\n", model);
            CHECK_EQ(agrees(model, "--preprocess torchvision", "--torchvision"), 0);
        }
        /* ONNX -> dsrt -> ONNX -> dsrt; the export on raw pixels. */
        CHECK_EQ(sh("cd '%s' && '%s' import %s-17.onnx --preprocess torchvision --output %s.dsrt "
                    "&& '%s' export %s.dsrt --output %s-dsrt.onnx && '%s' import %s-dsrt.onnx "
                    "--output %s-back.dsrt",
                    dir, dstrain, n, n, dstrain, n, n, dstrain, n, n),
                 0);
        char a[600], b[600], exported[128];
        snprintf(a, sizeof a, "%s/%s.dsrt", dir, n);
        snprintf(b, sizeof b, "%s/%s-back.dsrt", dir, n);
        same_weights(a, b);
        snprintf(exported, sizeof exported, "%s-dsrt.onnx", n);
        CHECK_EQ(agrees(exported, "", ""), 0);
    }
}

/* tf2onnx's channels-last input: dsrt takes the model's layout, and
 * classify and --transfer on raw images give the model's answer. */
static void test_channels_last(void) {
    CHECK_EQ(sh("cd '%s' && %s '%s' images img32 32 6 2>&1 && '%s' '%s' modern-helper-models . "
                "2>&1",
                dir, SYS_PY, script, venv, script),
             0);
    CHECK_EQ(agrees_on("img32", "nhwc-13.onnx", "", "--scale 0.00392156862745098"), 0);
    CHECK_EQ(agrees_on("img32", "nhwc-17.onnx", "", "--scale 0.00392156862745098"), 0);
    CHECK_EQ(sh("cd '%s' && '%s' import nhwc-17.onnx --output nhwc.dsrt && '%s' train --transfer "
                "nhwc-17.onnx --data img32 --epochs 1 --batch 3 --lr-factor 0 --threads 2 "
                "--workers 1 --no-pin --quiet --no-progress --save nhwc-t.dsrt > nhwc-t.log 2>&1",
                dir, dstrain, dstrain),
             0);
    CHECK_EQ(kept("nhwc.dsrt", "nhwc-t.dsrt"), 2);
}

/* ONNX local functions, inlined; shape arithmetic, folded. */
static void test_functions_and_shapes(void) {
    CHECK_EQ(sh("cd '%s' && %s '%s' torch-functions fn > fn.log 2>&1 && %s '%s' torch-shapes sh > "
                "sh.log 2>&1",
                dir, SYS_PY, script, SYS_PY, script),
             0);
    CHECK_EQ(agrees_on("img32", "fn.onnx", "", "--scale 0.00392156862745098"), 0);
    /* fuzz_onnx's seeds: a function with attributes by reference, "same"
     * padding of Shape, Gather, arithmetic, Clip, Xor, Where and Concat,
     * the expansions put back as one layer each, a channels-last input. */
    CHECK_EQ(sh("cd '%s' && %s '%s' images img8 8 6 2>&1 && '%s' '%s' fuzz-seeds . 2>&1", dir,
                SYS_PY, script, venv, script),
             0);
    static const char *const seeds[] = {"function.onnx", "shapes.onnx", "expansions.onnx",
                                        "nhwc.onnx"};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(seeds); k++)
        CHECK_EQ(agrees_on("img8", seeds[k], "", "--scale 0.00392156862745098"), 0);
    char out[8192];
    CHECK_EQ(
        capture(out, sizeof out, "cd '%s' && '%s' analyze --net expansions.onnx", dir, dstrain), 0);
    CHECK_CONTAINS(out, " silu ");
    CHECK_CONTAINS(out, " hardswish ");
    CHECK_CONTAINS(out, " layernorm ");
    CHECK_CONTAINS(out, " gelu ");
    CHECK(strstr(out, " mul ") == NULL && strstr(out, " sigmoid ") == NULL);
    CHECK_EQ(agrees_on("img32", "sh-13.onnx", "", "--scale 0.00392156862745098"), 0);
    CHECK_EQ(agrees_on("img32", "sh-17.onnx", "", "--scale 0.00392156862745098"), 0);
    /* The padding computed from the shapes is the convolutions' own: no
     * pad layer is left. */
    CHECK_EQ(capture(out, sizeof out, "cd '%s' && '%s' analyze --net sh-13.onnx", dir, dstrain), 0);
    CHECK_CONTAINS(out, " conv ");
    CHECK(strstr(out, " pad ") == NULL);
}

/* Transfer learning from the imported mobilenet_v2: the new last layer
 * learns, the others frozen (--lr-factor 0). */
static void test_transfer(void) {
    CHECK_EQ(sh("cd '%s' && '%s' train --transfer mobilenet_v2-13.onnx --preprocess torchvision "
                "--data img --epochs 1 --batch 3 --lr-factor 0 --threads 2 --workers 1 --no-pin "
                "--quiet --no-progress --save mt.dsrt > mt.log 2>&1 && '%s' export mt.dsrt "
                "--output mt.onnx",
                dir, dstrain, dstrain),
             0);
    CHECK_GT(kept("mobilenet_v2.dsrt", "mt.dsrt"), 50);
    CHECK_NE(sh("grep -q 'says nothing of how its input' '%s/mt.log'", dir), 0);
    /* Without --preprocess nothing says how torchvision's model takes its
     * input: dstrain says so before any work (classify, eval, train). */
    CHECK_EQ(sh("cd '%s' && '%s' classify --model mobilenet_v2-13.onnx --threads 2 img > plain.log "
                "2>&1 && grep -q 'says nothing of how its input is normalised' plain.log",
                dir, dstrain),
             0);
    CHECK_EQ(agrees("mt.onnx", "", ""), 0);
}

static void test_refusals(void) {
    static const char *const cases[][2] = {
        {"transpose", "node 0 'swap_hw' (Transpose, opset 17): perm (0, 1, 3, 2)"},
        {"layernorm_width", "node 0 'ln_w' (LayerNormalization, opset 17)"},
        {"mul_spatial", "node 1 'attend' (Mul, opset 17)"},
        {"flatten_nhwc", "node 1 'flat_nhwc' (Flatten, opset 17): it flattens a channels-last"},
        {"batch_shape", "'batch_as_float'"},
        {"shape_overflow", "node 2 'too_big' (Mul, opset 17): its integers pass 64 bits"},
        {"function_loop", "node 0 'call_loop' (Loop): functions call functions more than 16 deep"},
        {"batch_compare", "'batch_gt' (Greater, opset 17): its result depends on the batch size"},
        {"bias_rank", "'matmul' (MatMul, opset 17): bias 'm.b' of 1 values in 3 dimensions"},
        {"layernorm_scale_2d", "'ln_2d' (LayerNormalization, opset 17): Scale 's' has 8 values in "
                               "2 dimensions"},
        {"pool_same_stride", "'pool_s3' (AveragePool, opset 17): auto_pad SAME_UPPER with stride "
                             "down 3 past its window of 1"},
    };
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(cases); k++) {
        char out[4096];
        CHECK_NE(capture(out, sizeof out, "cd '%s' && '%s' import refused.%s.onnx --output r.dsrt",
                         dir, dstrain, cases[k][0]),
                 0);
        CHECK_CONTAINS(out, cases[k][1]);
        char made[700];
        snprintf(made, sizeof made, "%s/r.dsrt", dir);
        CHECK_NE(access(made, F_OK), 0);
    }
}

int main(void) {
    int rc = onnx_test_setup("onnx_modern");
    if (rc) return rc;
    RUN(test_families);
    RUN(test_channels_last);
    RUN(test_functions_and_shapes);
    RUN(test_transfer);
    RUN(test_refusals);
    return TEST_RESULT();
}
