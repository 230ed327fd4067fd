/*
 * ONNX import and export against onnxruntime, on models made here: a small
 * net of every operator PyTorch exports that dsrt imports (Debian's
 * python3-torch, opsets 9 and 17, seeded weights), models written with
 * onnx's helpers of what PyTorch does not write (Dropout, Identity,
 * Constant, MatMul + Add, Gemm with transB=0, alpha and beta, LRN,
 * AveragePool counting its padding, auto_pad, opsets 7, 11 and 21, external
 * data; Clip, Sigmoid, HardSigmoid, HardSwish and Gelu at opsets 9, 13 and
 * 21; squeeze-and-excitation's Mul, a layer scale, LayerNormalization, Pad
 * and ceil_mode pooling at opsets 9, 11 and 17), and dsrt nets of every
 * layer type, of every activation and of those layers trained here for a
 * few epochs.
 * tests/onnx_ref.py makes them and runs the runtime (in the environment of
 * scripts/onnx-venv.sh); the tool is dstrain, as a user runs it.
 *
 *   import: dstrain classify --json on an ONNX model gives every image's
 *           probabilities within 1e-4 of onnxruntime's, and the same top-1;
 *   export: the exported model passes onnx.checker, and in onnxruntime on
 *           raw pixels agrees with dstrain classify (1e-4, top-1) and with
 *           dstrain eval (its confusion matrix) on every image;
 *   round trip: ONNX -> dsrt -> ONNX -> dsrt gives bit-identical weights;
 *   transfer: train --transfer MODEL.onnx trains the new last layer, the
 *           others frozen (--lr-factor 0: bit for bit) or slowed (0.5);
 *   refusal: an unsupported operator stops dstrain naming the node.
 *
 * Skips (77) where the environment cannot be made (no PyPI) or PyPI's or
 * Debian's packages are missing. test_slow_onnx does the same with
 * torchvision's networks.
 */
#include "onnx_test.h"

static void test_import_small(void) {
    /* The models. */
    CHECK_EQ(sh("cd '%s' && %s '%s' torch-small small > torch.log 2>&1", dir, SYS_PY, script), 0);
    CHECK_EQ(sh("cd '%s' && '%s' '%s' helper-models . 2>&1", dir, venv, script), 0);
    CHECK_EQ(sh("cd '%s' && %s '%s' images img 32 12 2>&1", dir, SYS_PY, script), 0);
    static const char *const models[] = {
        "small-opset9", "small-opset17", "ops7",    "ops11",    "ops21",    "external", "acts9",
        "acts13",       "acts21",        "layers9", "layers11", "layers17", "folds13"};
    char ort_args[2048] = "", cmp_args[2048] = "";
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(models); k++) {
        const char *m = models[k];
        CHECK_EQ(sh("cd '%s' && '%s' classify --model %s.onnx --json --threads 2 $(cat "
                    "img/paths.txt) > %s.jsonl",
                    dir, dstrain, m, m),
                 0);
        size_t at = strlen(ort_args), ct = strlen(cmp_args);
        snprintf(ort_args + at, sizeof ort_args - at, " %s.onnx %s.npy", m, m);
        snprintf(cmp_args + ct, sizeof cmp_args - ct, " %s.jsonl %s.npy", m, m);
    }
    /* The runtime takes pixels / 255, as the import assumes by default. */
    CHECK_EQ(sh("cd '%s' && '%s' '%s' ort img/pixels.npy --scale 0.00392156862745098%s", dir, venv,
                script, ort_args),
             0);
    CHECK_EQ(sh("cd '%s' && '%s' '%s' compare 1e-4%s", dir, venv, script, cmp_args), 0);
    /* The same model with torchvision's normalisation. */
    CHECK_EQ(sh("cd '%s' && '%s' classify --model small-opset17.onnx --preprocess torchvision "
                "--json --threads 2 $(cat img/paths.txt) > tv.jsonl && '%s' '%s' ort "
                "img/pixels.npy --torchvision small-opset17.onnx tv.npy && '%s' '%s' compare "
                "1e-4 tv.jsonl tv.npy",
                dir, dstrain, venv, script, venv, script),
             0);
    /* A model told it takes pixels as they are (0 to 255), whose first Div
     * is 255 in one channel only: a normalisation, not the pixels' scale. */
    CHECK_EQ(sh("cd '%s' && '%s' classify --model folds13.onnx --input-scale 1 --json --threads 2 "
                "$(cat img/paths.txt) > raw.jsonl && '%s' '%s' ort img/pixels.npy --scale 1 "
                "folds13.onnx raw.npy && '%s' '%s' compare 1e-4 raw.jsonl raw.npy",
                dir, dstrain, venv, script, venv, script),
             0);
}

static void test_round_trip(void) {
    /* ONNX -> dsrt (with class names) -> ONNX -> dsrt: the same weights. */
    CHECK_EQ(sh("cd '%s' && printf 'zero\\none\\ntwo\\nthree\\nfour\\nfive\\nsix\\nseven\\n"
                "eight\\nnine\\n' > names.txt && '%s' import small-opset17.onnx --output a.dsrt "
                "--preprocess torchvision --classes names.txt && '%s' export a.dsrt --output "
                "a.onnx --opset 21 && '%s' import a.onnx --output b.dsrt",
                dir, dstrain, dstrain, dstrain),
             0);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/a.dsrt", dir);
    snprintf(b, sizeof b, "%s/b.dsrt", dir);
    same_weights(a, b);
    /* The exported model on raw pixels agrees with the imported one. */
    CHECK_EQ(sh("cd '%s' && '%s' classify --model a.dsrt --json --threads 2 $(cat img/paths.txt) "
                "> a.jsonl && '%s' '%s' ort img/pixels.npy a.onnx a.npy && '%s' '%s' compare 1e-4 "
                "a.jsonl a.npy",
                dir, dstrain, venv, script, venv, script),
             0);
    CHECK_EQ(sh("cd '%s' && grep -q '\"label\": \"' a.jsonl && '%s' classify --model a.onnx "
                "--json $(head -1 img/paths.txt) | grep -q '\"label\": \"[a-z]*\"'",
                dir, dstrain),
             0);
}

/* A dsrt net of every layer type, trained here, exported, and run by the
 * runtime on raw pixels against dstrain classify and eval. */
static void test_export_native(void) {
    CHECK_EQ(sh("cd '%s' && cat > all.net <<'EOF'\n"
                "input size=32x32x3 normalization=zscore mean=0.45,0.5,0.55 std=0.25,0.2,0.3\n"
                "conv name=c1 filters=8 size=3 pad=same\n"
                "batchnorm name=b1\n"
                "relu name=r1\n"
                "conv name=c2 filters=8 size=3x2 stride=2x1 dilation=2 pad=2,1,0,2 groups=2 "
                "bias=0\n"
                "leakyrelu name=l2 leak=0.1\n"
                "lrn name=n2 size=3 alpha=1e-2 beta=0.6 k=1.5\n"
                "maxpool name=p2 size=3 stride=2 pad=1\n"
                "conv name=c3 filters=8 size=1\n"
                "add name=s inputs=p2,c3 relu=1\n"
                "avgpool name=a1 size=3 stride=1 pad=1 count_pad=0 inputs=s\n"
                "avgpool name=a2 size=3 stride=1 pad=1 inputs=s\n"
                "concat name=j inputs=a1,a2\n"
                "gap name=g\n"
                "fc name=f1 outputs=16\n"
                "dropout name=d p=0.2\n"
                "batchnorm name=b2\n"
                "relu name=r2\n"
                "fc name=f2 outputs=classes bias=0\n"
                "softmax name=out\n"
                "EOF\n"
                "'%s' train --data img --net all.net --epochs 3 --batch 4 --lr 0.05 --threads 2 "
                "--workers 1 --no-pin --quiet --no-progress --save n.dsrt > train.log 2>&1",
                dir, dstrain),
             0);
    for (int opset = 9; opset <= 13; opset += 4) {
        CHECK_EQ(sh("cd '%s' && '%s' export n.dsrt --output n%d.onnx --opset %d && '%s' classify "
                    "--model n.dsrt --json --threads 2 $(cat img/paths.txt) > n.jsonl && '%s' "
                    "'%s' ort img/pixels.npy n%d.onnx n%d.npy && '%s' '%s' compare 1e-4 n.jsonl "
                    "n%d.npy",
                    dir, dstrain, opset, opset, dstrain, venv, script, opset, opset, venv, script,
                    opset),
                 0);
        CHECK_EQ(sh("cd '%s' && '%s' eval --model n.dsrt --data img --json --threads 2 --workers "
                    "1 --no-pin > eval.json && '%s' '%s' eval-compare eval.json n%d.npy img",
                    dir, dstrain, venv, script, opset),
                 0);
    }
    /* The exported model imported again (its metadata gives its class
     * names and that it takes pixels as they are): eval agrees too. */
    CHECK_EQ(sh("cd '%s' && '%s' eval --model n13.onnx --data img --json --threads 2 --workers 1 "
                "--no-pin > eval2.json && '%s' '%s' eval-compare eval2.json n13.npy img",
                dir, dstrain, venv, script),
             0);
}

/* A dsrt net of every activation kind (each after a convolution and batch
 * normalisation, so that their inputs reach the kinks), trained here until
 * its probabilities are far from uniform, exported at opsets 9 (Clip's
 * bounds as attributes; hardswish as HardSigmoid and Mul, GELU's Erf and
 * Tanh expansions), 13 (Clip's bounds as inputs), 17 and 21 (HardSwish,
 * Gelu), silu as Sigmoid and Mul at each: the runtime on raw pixels agrees
 * with dstrain classify (a clip bound moved from 0.75 to 0.7 moves the
 * probabilities by 6e-2). */
static void test_export_activations(void) {
    CHECK_EQ(sh("cd '%s' && cat > acts.net <<'EOF'\n"
                "input size=32x32x3 normalization=zscore mean=0.45,0.5,0.55 std=0.25,0.2,0.3\n"
                "conv filters=8 size=3 stride=2 pad=1\nbatchnorm\n"
                "relu6\n"
                "conv filters=8 size=3 pad=1\nbatchnorm\n"
                "clip min=-0.5 max=0.75\n"
                "conv filters=8 size=3 pad=1\nbatchnorm\n"
                "sigmoid\n"
                "conv filters=8 size=3 pad=1\nbatchnorm\n"
                "hardsigmoid alpha=0.3 beta=0.4\n"
                "conv filters=8 size=3 pad=1\nbatchnorm\n"
                "hardswish\n"
                "conv filters=8 size=3 stride=2 pad=1\nbatchnorm\n"
                "silu\n"
                "conv filters=8 size=3 pad=1\nbatchnorm\n"
                "gelu\n"
                "conv filters=8 size=3 pad=1\nbatchnorm\n"
                "gelu approximate=tanh\n"
                "gap\n"
                "fc outputs=classes\n"
                "softmax\n"
                "EOF\n"
                "'%s' train --data img --net acts.net --epochs 6 --batch 4 --lr 0.1 --threads 2 "
                "--workers 1 --no-pin --quiet --no-progress --save acts.dsrt > acts-train.log 2>&1 "
                "&& '%s' classify --model acts.dsrt --json --threads 2 $(cat img/paths.txt) > "
                "acts.jsonl",
                dir, dstrain, dstrain),
             0);
    static const int opsets[] = {9, 13, 17, 21};
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(opsets); k++)
        CHECK_EQ(sh("cd '%s' && '%s' export acts.dsrt --output acts%d.onnx --opset %d && '%s' '%s' "
                    "ort img/pixels.npy acts%d.onnx acts%d.npy && '%s' '%s' compare 1e-4 "
                    "acts.jsonl acts%d.npy",
                    dir, dstrain, opsets[k], opsets[k], venv, script, opsets[k], opsets[k], venv,
                    script, opsets[k]),
                 0);
}

/* A dsrt net of the products, layer normalisations, padding, stochastic
 * depth and ceil=1 pooling (a gate from a fully connected layer, partial
 * last windows averaged with and without the padding), trained here,
 * exported at opsets 11 (layernorm written out in ReduceMean, Sub, Mul,
 * Sqrt, Div) and 17 (LayerNormalization; stochastic depth leaves no node):
 * the runtime on raw pixels agrees with dstrain classify; the opset 17
 * model imported again evaluates as the runtime does. */
static void test_export_layers(void) {
    CHECK_EQ(sh("cd '%s' && cat > layers.net <<'EOF'\n"
                "input size=32x32x3 normalization=zscore mean=0.45,0.5,0.55 std=0.25,0.2,0.3\n"
                "conv name=c1 filters=8 size=3 stride=2 pad=1\n"
                "relu name=r1\n"
                "gap name=g\n"
                "fc name=f1 outputs=8\n"
                "relu name=gr\n"
                "mul name=m inputs=r1,gr\n"
                "scale name=s init=0.5\n"
                "layernorm name=ln\n"
                "stochastic_depth name=sd p=0.2\n"
                "conv name=c2 filters=8 size=1 inputs=r1\n"
                "add name=res inputs=sd,c2\n"
                "pad name=p pad=1,1,0,2 value=0.25\n"
                "avgpool name=a size=3 stride=2 pad=1 ceil=1\n"
                "maxpool name=mp size=3 stride=2 ceil=1\n"
                "avgpool name=a2 size=2 stride=2 ceil=1 count_pad=0\n"
                "fc name=f2 outputs=16\n"
                "layernorm name=ln2\n"
                "fc name=f3 outputs=classes\n"
                "softmax name=out\n"
                "EOF\n"
                "'%s' train --data img --net layers.net --epochs 6 --batch 4 --lr 0.05 --threads 2 "
                "--workers 1 --no-pin --quiet --no-progress --save layers.dsrt > layers-train.log "
                "2>&1 && '%s' classify --model layers.dsrt --json --threads 2 $(cat img/paths.txt) "
                "> layers.jsonl",
                dir, dstrain, dstrain),
             0);
    for (int opset = 11; opset <= 17; opset += 6)
        CHECK_EQ(sh("cd '%s' && '%s' export layers.dsrt --output layers-out%d.onnx --opset %d && "
                    "'%s' '%s' ort img/pixels.npy layers-out%d.onnx layers-out%d.npy && '%s' '%s' "
                    "compare 1e-4 layers.jsonl layers-out%d.npy",
                    dir, dstrain, opset, opset, venv, script, opset, opset, venv, script, opset),
                 0);
    CHECK_EQ(
        sh("cd '%s' && '%s' eval --model layers-out17.onnx --data img --json --threads 2 "
           "--workers 1 --no-pin > layers-eval.json && '%s' '%s' eval-compare layers-eval.json "
           "layers-out17.npy img",
           dir, dstrain, venv, script),
        0);
}

/* --transfer from an ONNX model: the new last layer learns, the others are
 * frozen (--lr-factor 0) or slowed (0.5). */
static void test_transfer(void) {
    for (int frozen = 1; frozen >= 0; frozen--) {
        CHECK_EQ(sh("cd '%s' && '%s' train --transfer small-opset17.onnx --preprocess torchvision "
                    "--data img --epochs 2 --batch 4 --lr-factor %s --threads 2 --workers 1 "
                    "--no-pin --quiet --no-progress --save t.dsrt > transfer.log 2>&1",
                    dir, dstrain, frozen ? "0" : "0.5"),
                 0);
        char base[600], t[600];
        snprintf(base, sizeof base, "%s/a.dsrt", dir);
        snprintf(t, sizeof t, "%s/t.dsrt", dir);
        int same, changed;
        kept_layers(base, t, 3, &same, &changed);
        CHECK_GT(same + changed, 4);
        CHECK_EQ(frozen ? changed : same, 0);
    }
    /* The transferred net labels images with the data's class names. */
    CHECK_EQ(sh("cd '%s' && '%s' classify --model t.dsrt --json $(head -2 img/paths.txt) | "
                "grep -q '\"label\": \"c[0-2]\"'",
                dir, dstrain),
             0);
}

static void test_cli_refusal(void) {
    char out[4096];
    CHECK_NE(capture(out, sizeof out, "cd '%s' && '%s' import unsupported.onnx --output u.dsrt",
                     dir, dstrain),
             0);
    CHECK_CONTAINS(out, "node 0 'squash' (Tanh, opset 13): operator 'Tanh' is not supported");
    CHECK_NE(capture(out, sizeof out,
                     "cd '%s' && '%s' classify --model a.dsrt --preprocess "
                     "torchvision img",
                     dir, dstrain),
             0);
    CHECK_CONTAINS(out, "go with an ONNX model");
}

int main(void) {
    int rc = onnx_test_setup("onnx_ref");
    if (rc) return rc;
    RUN(test_import_small);
    RUN(test_round_trip);
    RUN(test_export_native);
    RUN(test_export_activations);
    RUN(test_export_layers);
    RUN(test_transfer);
    RUN(test_cli_refusal);
    return TEST_RESULT();
}
