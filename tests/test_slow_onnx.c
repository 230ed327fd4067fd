/*
 * torchvision's alexnet, resnet18 and squeezenet1_1 (seeded random weights,
 * the last layer scaled so that the probabilities are not flat), exported
 * by PyTorch at opset 13, against onnxruntime (label "slow": each takes
 * seconds to make and to run):
 *
 *   import: dstrain classify --json --preprocess torchvision on 224x224
 *           photos gives every probability within 1e-4 of onnxruntime's
 *           and the same top-1 on every image;
 *   round trip and export: ONNX -> dsrt -> ONNX -> dsrt gives the same
 *           weights bit for bit, and the exported model in onnxruntime on
 *           raw pixels agrees with dstrain classify (1e-4, top-1);
 *   transfer: dstrain train --transfer resnet18.onnx on a photo folder
 *           trains the new last layer alone (--lr-factor 0: every other
 *           layer bit for bit the same) or all (--lr-factor 0.1).
 *
 * Skips (77) as test_onnx_ref does.
 */
#include "onnx_test.h"

static const char *const NETS[] = {"squeezenet1_1", "resnet18", "alexnet"};

static void test_torchvision(void) {
    CHECK_EQ(sh("cd '%s' && %s '%s' images img 224 6 2>&1", dir, SYS_PY, script), 0);
    for (size_t k = 0; k < DSRT_ARRAY_SIZE(NETS); k++) {
        const char *n = NETS[k];
        CHECK_EQ(sh("cd '%s' && %s '%s' torchvision %s %s.onnx > %s.log 2>&1", dir, SYS_PY, script,
                    n, n, n),
                 0);
        CHECK_EQ(sh("cd '%s' && '%s' classify --model %s.onnx --preprocess torchvision --json "
                    "--threads 2 $(cat img/paths.txt) > %s.jsonl && '%s' '%s' ort img/pixels.npy "
                    "--torchvision %s.onnx %s.npy && '%s' '%s' compare 1e-4 %s.jsonl %s.npy",
                    dir, dstrain, n, n, venv, script, n, n, venv, script, n, n),
                 0);
        if (k == 2) continue; /* alexnet's round trip is resnet18's, at 240 MB */
        /* ONNX -> dsrt -> ONNX -> dsrt, and the export against classify and
         * eval on raw pixels. */
        CHECK_EQ(sh("cd '%s' && '%s' import %s.onnx --preprocess torchvision --output %s.dsrt "
                    "&& '%s' export %s.dsrt --output %s-dsrt.onnx && '%s' import %s-dsrt.onnx "
                    "--output %s-back.dsrt",
                    dir, dstrain, n, n, dstrain, n, n, dstrain, n, n),
                 0);
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s.dsrt", dir, n);
        snprintf(b, sizeof b, "%s/%s-back.dsrt", dir, n);
        same_weights(a, b);
        CHECK_EQ(sh("cd '%s' && '%s' classify --model %s.dsrt --json --threads 2 $(cat "
                    "img/paths.txt) > %s-dsrt.jsonl && '%s' '%s' ort img/pixels.npy %s-dsrt.onnx "
                    "%s-dsrt.npy && '%s' '%s' compare 1e-4 %s-dsrt.jsonl %s-dsrt.npy",
                    dir, dstrain, n, n, venv, script, n, n, venv, script, n, n),
                 0);
    }
}

/* Transfer learning from the imported resnet18 on the photo folder. */
static void test_transfer_resnet18(void) {
    for (int frozen = 1; frozen >= 0; frozen--) {
        CHECK_EQ(sh("cd '%s' && '%s' train --transfer resnet18.onnx --preprocess torchvision "
                    "--data img --epochs 1 --batch 3 --lr-factor %s --threads 2 --workers 1 "
                    "--no-pin --quiet --no-progress --save t18.dsrt > t18.log 2>&1",
                    dir, dstrain, frozen ? "0" : "0.1"),
                 0);
        char base[600], t[600];
        snprintf(base, sizeof base, "%s/resnet18.dsrt", dir);
        snprintf(t, sizeof t, "%s/t18.dsrt", dir);
        int same, changed;
        kept_layers(base, t, 3, &same, &changed);
        CHECK_EQ(same + changed, 20); /* the 20 convolutions (their batchnorm folded by PyTorch) */
        CHECK_EQ(frozen ? changed : same, 0);
    }
    /* The new net on the photos, with their folders' names. */
    CHECK_EQ(sh("cd '%s' && '%s' eval --model t18.dsrt --data img --json --threads 2 --workers 1 "
                "--no-pin | grep -q '\"classes\": \\[\"c0\", \"c1\", \"c2\"\\]'",
                dir, dstrain),
             0);
}

int main(void) {
    int rc = onnx_test_setup("slow_onnx");
    if (rc) return rc;
    RUN(test_torchvision);
    RUN(test_transfer_resnet18);
    return TEST_RESULT();
}
