/*
 * Runs against the shared library, whose calls between its own public
 * functions go through the PLT, so that this program can stand in for one of
 * them: it counts the calls to dsrt_augment_check and hands each on to the
 * library's. Augmenting a sample checks its options once, not once for
 * dsrt_augment_apply and again for the dsrt_augment_apply_params under it.
 * Skips when the library binds its own calls directly (then nothing can be
 * counted from outside).
 */
#include <dlfcn.h>
#include <dsrt.h>
#include <stdatomic.h>

#include "task.h"

static atomic_int check_calls;

int dsrt_augment_check(const dsrt_augment_options *o) {
    int (*real)(const dsrt_augment_options *);
    *(void **)&real = dlsym(RTLD_NEXT, "dsrt_augment_check");
    atomic_fetch_add(&check_calls, 1);
    return real(o);
}

int main(void) {
    dsrt_augment_options o;
    dsrt_augment_preset_32(&o);
    uint8_t px[40 * 30 * 3];
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 7);
    dsrt_image img = {.data = px, .width = 40, .height = 30, .channels = 3, .stride = 40 * 3};
    float *out = malloc(dsrt_augment_sample_bytes(&o));
    dsrt_augmenter *a;
    REQUIRE(out && dsrt_augmenter_create(&a) == 0);
    const int samples = 10;
    for (int i = 0; i < samples; i++)
        CHECK_OK(dsrt_augment_apply(a, &o, &img, 40, 30, 1, 0, (uint64_t)i, out));
    int through_plt = atomic_load(&check_calls);
    /* Called directly, the stand-in counts the call itself. */
    atomic_store(&check_calls, 0);
    dsrt_augment_params p;
    dsrt_augment_draw(&o, 40, 30, 1, 0, 0, &p);
    CHECK_OK(dsrt_augment_apply_params(a, &o, &img, 40, 30, &p, out));
    int params_calls = atomic_load(&check_calls);
    dsrt_augmenter_destroy(a);
    free(out);
    if (through_plt == 0) {
        printf("the library binds its own calls: nothing to count\n");
        return TEST_SKIP;
    }
    CHECK_EQ(through_plt, samples);
    CHECK_EQ(params_calls, 1);
    return TEST_RESULT();
}
