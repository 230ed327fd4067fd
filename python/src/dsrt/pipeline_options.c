/*
 * Pipeline()'s augment keywords: one table of the dsrt_augment_options
 * fields Python sets by name, their kinds and names, read into the options
 * with messages that name the keyword.
 */
#include "objects.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Pipeline options: one table for the augment keywords

typedef enum { K_INT, K_BOOL, K_DOUBLE, K_RANGE, K_RGB, K_ENUM, K_SIZE } key_kind;

static const name_value size_mode_names[] = {{"resize", DSRT_AUGMENT_RESIZE},
                                             {"centercrop", DSRT_AUGMENT_CENTERCROP},
                                             {"randcrop", DSRT_AUGMENT_RANDCROP},
                                             {"randresizedcrop", DSRT_AUGMENT_RANDRESIZEDCROP},
                                             {NULL, 0}};
static const name_value units_names[] = {
    {"input", DSRT_AUGMENT_UNITS_INPUT}, {"output", DSRT_AUGMENT_UNITS_OUTPUT}, {NULL, 0}};
static const name_value norm_names[] = {{"none", DSRT_AUGMENT_NORM_NONE},
                                        {"rescale", DSRT_AUGMENT_NORM_RESCALE},
                                        {"zerocenter", DSRT_AUGMENT_NORM_ZEROCENTER},
                                        {"zscore", DSRT_AUGMENT_NORM_ZSCORE},
                                        {NULL, 0}};

typedef struct {
    const char *name;
    key_kind kind;
    size_t offset;
    const name_value *names; /* K_ENUM */
} augment_key;

#define AUG(field, kind)                                                                           \
    { #field, kind, offsetof(dsrt_augment_options, field), NULL }
#define AUGE(field, names)                                                                         \
    { #field, K_ENUM, offsetof(dsrt_augment_options, field), names }

static const augment_key augment_keys[] = {
    {"output_size", K_SIZE, offsetof(dsrt_augment_options, output_height), NULL},
    AUG(output_height, K_INT),
    AUG(output_width, K_INT),
    AUG(output_channels, K_INT),
    AUGE(size_mode, size_mode_names),
    AUG(resize_shorter, K_INT),
    AUG(rand_x_reflection, K_BOOL),
    AUG(rand_y_reflection, K_BOOL),
    AUG(reflection_probability, K_DOUBLE),
    AUG(rand_rotation, K_RANGE),
    AUG(rand_scale, K_RANGE),
    AUG(rand_x_scale, K_RANGE),
    AUG(rand_y_scale, K_RANGE),
    AUG(rand_x_shear, K_RANGE),
    AUG(rand_y_shear, K_RANGE),
    AUG(rand_x_translation, K_RANGE),
    AUG(rand_y_translation, K_RANGE),
    AUGE(translation_units, units_names),
    AUG(translation_whole_pixels, K_BOOL),
    AUG(fill_value, K_RGB),
    AUGE(norm, norm_names),
    AUG(mean, K_RGB),
    AUG(std, K_RGB),
    AUG(decode_oversample, K_DOUBLE),
    AUG(decode_dc, K_BOOL),
    AUG(crop_scale, K_RANGE),
    AUG(crop_ratio, K_RANGE),
    AUG(brightness, K_RANGE),
    AUG(contrast, K_RANGE),
    AUG(saturation, K_RANGE),
    AUG(hue, K_RANGE),
    AUG(grayscale_probability, K_DOUBLE),
    AUG(erase_probability, K_DOUBLE),
    AUG(erase_scale, K_RANGE),
    AUG(erase_ratio, K_RANGE),
    AUG(erase_random, K_BOOL),
    AUG(erase_value, K_RGB),
};

/* Sets the augment option named key to v. */
int augment_set(dsrt_augment_options *o, PyObject *key, PyObject *v) {
    const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!k) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "augment: keys must be strings");
        return -1;
    }
    char what[96];
    snprintf(what, sizeof what, "augment: %s", k);
    for (size_t i = 0; i < sizeof augment_keys / sizeof *augment_keys; i++) {
        const augment_key *e = &augment_keys[i];
        if (strcmp(e->name, k) != 0) continue;
        char *f = (char *)o + e->offset;
        double d[3];
        switch (e->kind) {
        case K_INT:
            return get_int(v, what, (int *)f);
        case K_BOOL:
            return get_bool(v, what, (int *)f);
        case K_DOUBLE:
            return get_double(v, what, (double *)f);
        case K_RANGE:
            return get_doubles(v, what, (double *)f, 2, 0);
        case K_ENUM: {
            int x;
            if (get_enum(v, what, e->names, &x) != 0) return -1;
            memcpy(f, &x, sizeof x); /* the enums are int-sized */
            return 0;
        }
        case K_RGB:
            if (get_doubles(v, what, d, 3, 1) != 0) return -1;
            for (int c = 0; c < 3; c++) ((float *)f)[c] = (float)d[c];
            return 0;
        case K_SIZE:
            if (get_doubles(v, what, d, 2, 1) != 0) return -1;
            if (d[0] != (int)d[0] || d[1] != (int)d[1]) {
                PyErr_Format(PyExc_ValueError, "%s: %R: expected whole pixels", what, v);
                return -1;
            }
            o->output_height = (int)d[0];
            o->output_width = (int)d[1];
            return 0;
        }
    }
    char names[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof augment_keys / sizeof *augment_keys; i++)
        len += (size_t)snprintf(names + len, len < sizeof names ? sizeof names - len : 0, "%s%s",
                                i ? ", " : "", augment_keys[i].name);
    PyErr_Format(PyExc_ValueError, "augment: unknown option '%s' (options: %s)", k, names);
    return -1;
}
