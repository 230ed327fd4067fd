/*
 * dsrt augment: from the decoded pixels of one image to its sample in a
 * batch, with the random geometric transforms of MATLAB's imageDataAugmenter
 * and the output sizing of augmentedImageDatastore (or of the torchvision
 * transforms the presets reproduce).
 *
 * One call, dsrt_augment_apply, draws the random choices of a sample from a
 * counter-based generator keyed by (seed, epoch, sample id) (torchvision's
 * ImageNet recipe too: random-resized crop, colour jitter, grayscale,
 * random erasing), composes every
 * geometric step (shorter-side resize, reflection, rotation, scale, shear,
 * translation, crop or resize to the output size, and the decoder's DCT
 * scaling) into one map, and writes the result once, straight into the
 * sample's place in the batch, normalised and laid out as asked. The same key
 * gives the same bytes whatever the thread, the call order, or the scale the
 * image was decoded at.
 *
 * Coordinates. Every geometric option is defined on the image as stored (its
 * header size, full_w x full_h), or on the "working image" that the optional
 * shorter-side resize makes of it: the augmentation (MATLAB's order:
 * reflection, rotation, scale, shear, then translation, all about the
 * working image's centre, the result keeping the working image's size) is
 * applied there, then the output size mode takes the output from it. Pixel
 * centres lie at half-integers: pixel i covers [i, i + 1).
 *
 * Resampling. Resizes use the triangle ("bilinear") filter stretched by the
 * reduction factor when shrinking, so they antialias: the same filter as
 * Pillow's Image.resize(BILINEAR), which is what torchvision's Resize applies
 * to the PIL images an ImageFolder yields (torchvision 0.14 ignores its
 * antialias argument for PIL input). When the map keeps the axes (no
 * rotation or shear), the two axes are resampled separately, with tables of
 * taps per output row and column; flips, whole-pixel shifts and crops are
 * exact copies. An output pixel whose centre falls outside the source is
 * fill; one inside reads only source pixels (Pillow's edge handling).
 * The random-resized crop's resize reads only its window (Pillow crops,
 * then resizes). Otherwise every output pixel is a bilinear sample of the
 * source, its neighbours outside the source counting as fill (MATLAB's
 * imwarp), the source first shrunk with the antialiasing filter where the
 * map reduces it.
 * MATLAB resizes with bicubic interpolation: dsrt does not.
 *
 * Threads: options are plain data, read-only during a call, and may be shared
 * by every thread. A dsrt_augmenter (scratch memory) belongs to one thread at
 * a time. All other functions are thread-safe.
 */
#ifndef DSRT_AUGMENT_H
#define DSRT_AUGMENT_H

#include <dsrt/datastore.h>

#ifdef __cplusplus
extern "C" {
#endif

// ----------------------------------------------------------------------------
// Options

/* How the output (output_width x output_height) is taken from the working
 * image (MATLAB augmentedImageDatastore 'OutputSizeMode'). */
typedef enum {
    DSRT_AUGMENT_RESIZE = 0, /* the whole working image resized to the output size */
    DSRT_AUGMENT_CENTERCROP, /* the central window, offset floor((W - w) / 2) */
    DSRT_AUGMENT_RANDCROP,   /* a window at a uniform random whole-pixel offset
                              * in [0, W - w] (centred where W < w) */
    /* torchvision's RandomResizedCrop: a random window of random area and
     * aspect (crop_scale, crop_ratio), resized to the output. Its draws
     * follow torchvision 0.14's RandomResizedCrop.get_params: the area is
     * U(crop_scale) W H, the log of the aspect (w / h) uniform in the log
     * of crop_ratio, w = round(sqrt(area aspect)), h = round(sqrt(area /
     * aspect)) (round half to even, as Python's round), accepted when 0 <
     * w <= W and 0 < h <= H, the offsets then uniform whole pixels; after
     * 10 refusals the central window of the whole image clamped to the
     * aspect range. The resize reads only the window's pixels (Pillow's
     * crop then resize: the filter's taps end at the window's edges), and
     * the reflections flip the window (RandomHorizontalFlip after the
     * crop). */
    DSRT_AUGMENT_RANDRESIZEDCROP,
} dsrt_augment_size_mode;

/* The colour adjustments, in torchvision ColorJitter's numbering (the order
 * it applies them in is a random permutation of these, per sample). */
typedef enum {
    DSRT_AUGMENT_BRIGHTNESS = 0,
    DSRT_AUGMENT_CONTRAST,
    DSRT_AUGMENT_SATURATION,
    DSRT_AUGMENT_HUE,
} dsrt_augment_color_op;

/* Layout and type of one sample in the batch. */
typedef enum {
    DSRT_AUGMENT_F32_NCHW = 0, /* float: planes of output_height x output_width */
    DSRT_AUGMENT_U8_NHWC,      /* uint8: rows of output_width x channels, no normalisation */
} dsrt_augment_layout;

/* Normalisation of float output. Pixel values x are in [0, 255]; mean and std
 * are given in the same units (MATLAB imageInputLayer's Mean and
 * StandardDeviation). torchvision's ToTensor + Normalize(m, s) is
 * DSRT_AUGMENT_NORM_ZSCORE with mean = 255 m and std = 255 s. */
typedef enum {
    DSRT_AUGMENT_NORM_NONE = 0,   /* x, in [0, 255] */
    DSRT_AUGMENT_NORM_RESCALE,    /* x / 255, in [0, 1] (torchvision ToTensor) */
    DSRT_AUGMENT_NORM_ZEROCENTER, /* x - mean[c] */
    DSRT_AUGMENT_NORM_ZSCORE,     /* (x - mean[c]) / std[c] */
} dsrt_augment_norm;

/* The pixels that rand_x_translation and rand_y_translation count. */
typedef enum {
    DSRT_AUGMENT_UNITS_INPUT = 0, /* pixels of the image as stored, at full size (MATLAB) */
    DSRT_AUGMENT_UNITS_OUTPUT,    /* pixels of the output (torchvision RandomCrop padding) */
} dsrt_augment_units;

typedef struct {
    /* Output size, in pixels; default 224 x 224. */
    int output_height, output_width;
    /* 1 (gray) or 3 (RGB). The image given to dsrt_augment_apply must have
     * this many channels: ask the decoder for them (dsrt_decode_request
     * channels), which converts gray to RGB or RGB to gray. Default 3. */
    int output_channels;
    dsrt_augment_size_mode size_mode; /* default DSRT_AUGMENT_RESIZE */
    /* When > 0, the image is first resized (keeping its aspect) so that its
     * shorter side is this long, the longer one truncated as torchvision's
     * Resize(int) does; the result is the working image. 0 (default): the
     * working image is the image as stored. */
    int resize_shorter;

    /* Reflection left-right / top-bottom, each with probability
     * reflection_probability when set (MATLAB RandXReflection and
     * RandYReflection: 0 or 1; default 0). */
    int rand_x_reflection, rand_y_reflection;
    double reflection_probability; /* in [0, 1]; default 0.5 */

    /* Every range below is [low, high] and drawn uniformly; [v, v] means
     * the constant v, and the defaults are the identity. */
    /* Rotation in degrees, within [-360, 360]; positive turns the image
     * counter-clockwise as displayed (like MATLAB's imrotate). Default
     * [0, 0]. */
    double rand_rotation[2];
    /* Scale factor, the same for x and y, within [DSRT_AUGMENT_SCALE_MIN,
     * DSRT_AUGMENT_SCALE_MAX] (> 1 enlarges). When it is not [1, 1],
     * rand_x_scale and rand_y_scale are ignored (as in MATLAB). */
    double rand_scale[2];
    double rand_x_scale[2], rand_y_scale[2]; /* each within the same; default [1, 1] */
    /* Shear angles in degrees, within [-DSRT_AUGMENT_SHEAR_MAX,
     * DSRT_AUGMENT_SHEAR_MAX]: x' = x + tan(a) y for x shear, y' = y + tan(a) x
     * for y shear (x shear first). Default [0, 0]. */
    double rand_x_shear[2], rand_y_shear[2];
    /* Translation, in translation_units pixels, within
     * [-DSRT_AUGMENT_TRANSLATION_MAX, DSRT_AUGMENT_TRANSLATION_MAX];
     * positive moves the content right / down. Default [0, 0]. */
    double rand_x_translation[2], rand_y_translation[2];
    dsrt_augment_units translation_units; /* default DSRT_AUGMENT_UNITS_INPUT */
    /* 1: translations are whole pixels, uniform over the integers in the
     * range (torchvision's RandomCrop with padding); 0 (default): continuous
     * (MATLAB). */
    int translation_whole_pixels;
    /* Value of output pixels whose source lies outside the image, per
     * channel, in [0, 255] (MATLAB FillValue; gray uses fill_value[0]).
     * Default 0. */
    float fill_value[3];

    dsrt_augment_layout layout; /* default DSRT_AUGMENT_F32_NCHW */
    dsrt_augment_norm norm;     /* default DSRT_AUGMENT_NORM_RESCALE; NONE for uint8 */
    float mean[3], std[3];      /* per channel, [0, 255] units; default 0 and 1 */

    /* dsrt_augment_decode_size asks for a decoded image this many times
     * denser than the output needs (>= 1; default 1: as small as the output
     * allows). Above 1, a JPEG's DCT scaling leaves the last factor of
     * reduction to dsrt's antialiasing resize, closer to a resize of the
     * full image (at 1/8 the DCT scaling is an 8 x 8 box average). */
    double decode_oversample;
    /* 1 (default): JPEGs that decode at 1/8 scale take each pixel from its
     * block's DC term (dsrt_decode_request.dc_eighth: the same luma as
     * libjpeg's, chroma at the resolution the file stores it, faster); 0:
     * libjpeg's reduced inverse DCT. */
    int decode_dc;

    /* Fields below were added after the first release: new fields go at the
     * end, and dsrt_augment_defaults sets every one. */

    /* DSRT_AUGMENT_RANDRESIZEDCROP: the window's area as a fraction of the
     * working image's, within (0, 1] (default [0.08, 1]), and its aspect,
     * width / height, within [DSRT_AUGMENT_RATIO_MIN, DSRT_AUGMENT_RATIO_MAX]
     * (default [3/4, 4/3]): torchvision's scale and ratio. */
    double crop_scale[2];
    double crop_ratio[2];

    /*
     * Colour, torchvision's ColorJitter on the PIL image: each factor drawn
     * uniformly from its range, the four adjustments applied in a random
     * order (a permutation drawn per sample), each one that is not the
     * identity range ([1, 1]; hue [0, 0]) being applied, as PIL's
     * ImageEnhance and torchvision's adjust_hue do it, on bytes (each step
     * truncated to 8 bits, as PIL's blend does):
     *   brightness f: x f;
     *   contrast f:   m + f (x - m), m the mean of the whole sample's gray
     *                 (ITU-R 601-2 luma, as PIL's convert("L")), rounded;
     *   saturation f: g + f (x - g), g the pixel's gray;
     *   hue h:        the hue of PIL's HSV moved by h turns (h in [-0.5,
     *                 0.5]); saturation and hue leave gray output as it is.
     * torchvision's ColorJitter(b, c, s, h) is brightness [max(0, 1 - b),
     * 1 + b], the same for contrast and saturation, hue [-h, h]. Factors
     * within [0, DSRT_AUGMENT_COLOR_MAX]. Defaults: the identity.
     * The adjustments work on the resampled sample rounded to bytes (PIL's
     * resize gives bytes too), before the normalisation.
     */
    double brightness[2], contrast[2], saturation[2], hue[2];
    /* After the colour adjustments, the sample is turned gray (the luma
     * replicated into each channel, as PIL's convert("L")) with this
     * probability (torchvision RandomGrayscale). In [0, 1]; default 0. */
    double grayscale_probability;

    /*
     * torchvision's RandomErasing, after the normalisation, on float output
     * only: with probability erase_probability, a box of area U(erase_scale)
     * times the output's and aspect (height / width) log-uniform in
     * erase_ratio (h = round(sqrt(area aspect)), w = round(sqrt(area /
     * aspect)), accepted when h < output_height and w < output_width, at a
     * uniform whole-pixel offset; no box after 10 refusals) is set to
     * erase_value[c] (in normalised units: 0 is the mean with ZSCORE), or,
     * with erase_random, to values drawn from a standard normal, one a
     * pixel and channel. Defaults: probability 0, scale [0.02, 0.33],
     * ratio [0.3, 3.3], value 0, not random.
     */
    double erase_probability;
    double erase_scale[2];
    double erase_ratio[2];
    int erase_random;
    float erase_value[3];
} dsrt_augment_options;

/* The defaults: 224 x 224 x 3, resize, no augmentation, float NCHW in [0, 1]. */
DSRT_API dsrt_augment_options dsrt_augment_defaults(void);

/* A layout's name, "nchw" or "nhwc", and the type of its values, "float32"
 * or "uint8" ("unknown" out of range). */
DSRT_API const char *dsrt_augment_layout_name(dsrt_augment_layout l);
DSRT_API const char *dsrt_augment_layout_dtype(dsrt_augment_layout l);
/* The layout a name gives: a layout's name (dtype 0) or its type's (dtype
 * 1), in any case; 0, or DSRT_EOPTION with the message "'NAME' is not nchw
 * or nhwc" (or "float32 or uint8"). Thread-safe. */
DSRT_API int dsrt_augment_layout_from_name(const char *name, int dtype, dsrt_augment_layout *l);

/*
 * Sets *o to torchvision's Resize(256), RandomCrop(227),
 * RandomHorizontalFlip(), ToTensor(): shorter side to 256 (antialiased
 * bilinear), a random 227 x 227 crop, left-right reflection with
 * probability 0.5, float NCHW in [0, 1].
 */
DSRT_API void dsrt_augment_preset_227(dsrt_augment_options *o);

/*
 * Sets *o to torchvision's Resize((32, 32)), RandomHorizontalFlip(),
 * RandomCrop(32, padding=4), ToTensor(): resize to 32 x 32 (antialiased
 * bilinear), left-right reflection with probability 0.5, a whole-pixel
 * translation in [-4, 4] output pixels in x and y with zero fill, float NCHW
 * in [0, 1]. decode_oversample is 1: JPEGs decode at the smallest DCT scale
 * that still covers 32 x 32 (the scaled inverse DCT is itself the low-pass
 * filter: at 1/8 each pixel is its 8 x 8 block's mean), the resize
 * antialiasing from there.
 */
DSRT_API void dsrt_augment_preset_32(dsrt_augment_options *o);

/*
 * Sets *o to torchvision's ImageNet training recipe: RandomResizedCrop(224)
 * (scale [0.08, 1], ratio [3/4, 4/3]), RandomHorizontalFlip(),
 * ColorJitter(0.4, 0.4, 0.4), ToTensor(), Normalize(mean = (0.485, 0.456,
 * 0.406), std = (0.229, 0.224, 0.225)): float NCHW. A JPEG decodes only the
 * window, at the coarsest DCT scale that keeps it at least 224 pixels wide
 * and high.
 */
DSRT_API void dsrt_augment_preset_imagenet(dsrt_augment_options *o);

/*
 * Sets *o to torchvision's ImageNet evaluation transform: Resize(256),
 * CenterCrop(224), ToTensor(), Normalize with ImageNet's mean and std, as
 * dsrt_augment_preset_imagenet.
 */
DSRT_API void dsrt_augment_preset_imagenet_val(dsrt_augment_options *o);

/*
 * The presets by name, one table for the tools and Python: the i-th (from
 * 0) preset's name ("default", "227", "32", "imagenet", "imagenet-val"),
 * NULL past the last; and the preset named name written into *o ("default":
 * dsrt_augment_defaults). 0, or DSRT_EOPTION naming the presets.
 */
DSRT_API const char *dsrt_augment_preset_name(int i);
DSRT_API int dsrt_augment_preset_from_name(const char *name, dsrt_augment_options *o);

/* The ranges dsrt_augment_check allows for the random transforms. Within
 * them every combination is applied to any image without failing (the
 * transform stays far from singular, the resampling tables stay small);
 * dstrain, dsbench and the Python package take their limits from here. */
#define DSRT_AUGMENT_SCALE_MIN       1e-3
#define DSRT_AUGMENT_SCALE_MAX       1e3
#define DSRT_AUGMENT_SHEAR_MAX       89.0
#define DSRT_AUGMENT_ROTATION_MAX    360.0
#define DSRT_AUGMENT_TRANSLATION_MAX 1e6
#define DSRT_AUGMENT_RATIO_MIN       1e-3 /* crop_ratio, erase_ratio */
#define DSRT_AUGMENT_RATIO_MAX       1e3
#define DSRT_AUGMENT_COLOR_MAX       1e3 /* brightness, contrast, saturation factors */

/*
 * Checks every option: the one check every way into dsrt makes before any
 * work (dsrt_pipeline_open, dsrt_train_check, the tools, the Python
 * package), so that options it accepts never fail later, at a sample.
 * Returns 0, or DSRT_EOPTION with dsrt_last_error() naming the option and
 * its value ("augment: rand_rotation: [30, -30]: low is above high").
 */
DSRT_API int dsrt_augment_check(const dsrt_augment_options *o);

/* Bytes of one sample in the batch: height * width * channels times 4 for
 * float, 1 for uint8. Sample i of a batch starts at i times this. */
DSRT_API size_t dsrt_augment_sample_bytes(const dsrt_augment_options *o);

/*
 * The smallest decoded size (*min_w x *min_h) that keeps full quality for an
 * image stored at full_w x full_h: the output's pixel density on the source,
 * times decode_oversample (times the largest random scale, and the same
 * density on both axes under rotation or shear), never more than the full
 * size. Put it in dsrt_decode_request min_width / min_height. The 227 preset
 * on a 500 x 375 JPEG asks for 341 x 256 (its shorter side must reach 256),
 * so the full size; the 32 preset asks for 32 x 32, which a 500 x 375 JPEG
 * meets at 1/8 scale (63 x 47). For the random-resized crop, whose window
 * is a sample's own, it is the size that serves the smallest window the
 * options allow (dsrt_augment_decode_request asks for each sample's).
 * Depends only on the options and the full size; a full size that is not
 * positive gives 0 x 0 (decode at full size).
 */
DSRT_API void dsrt_augment_decode_size(const dsrt_augment_options *o, int full_w, int full_h,
                                       int *min_w, int *min_h);

// ----------------------------------------------------------------------------
// Random choices

/* The random choices of one sample, all in working-image units. */
typedef struct {
    int x_reflect, y_reflect; /* 0 or 1 */
    double rotation;          /* degrees */
    double x_scale, y_scale;
    double x_shear, y_shear;             /* degrees */
    double x_translation, y_translation; /* working-image pixels */
    int crop_x, crop_y; /* output window's offset in the working image (crop modes) */
    /* Fields below were added after the first release (at the end). */
    /* DSRT_AUGMENT_RANDRESIZEDCROP: the window's size, working-image pixels
     * (0 in the other modes). */
    int crop_width, crop_height;
    /* Colour factors (applied only where the options' range is not the
     * identity), the order of the adjustments (a permutation of
     * dsrt_augment_color_op), and 1 to turn the sample gray. */
    double brightness, contrast, saturation, hue;
    int color_order[4];
    int grayscale;
    /* Random erasing: the box in output pixels (width 0: none), and the key
     * of its random values (erase_random). */
    int erase_x, erase_y, erase_width, erase_height;
    uint64_t erase_key;
} dsrt_augment_params;

/*
 * Draws the choices of sample sample_id in epoch epoch for an image stored at
 * full_w x full_h. Each choice has its own generator,
 * dsrt_rng_init(seed, epoch, sample_id, stream) with a stream per option, so
 * the result depends on nothing else: not on the thread, the call order, the
 * decode scale, nor on which other options are set.
 */
DSRT_API void dsrt_augment_draw(const dsrt_augment_options *o, int full_w, int full_h,
                                uint64_t seed, uint64_t epoch, uint64_t sample_id,
                                dsrt_augment_params *p);

// ----------------------------------------------------------------------------
// Applying

/* Scratch memory for one thread: resampling tables and row buffers, grown
 * on demand and kept between calls. */
typedef struct dsrt_augmenter dsrt_augmenter;

/*
 * Creates an augmenter. Its resampling runs on the widest vectors the CPU
 * has (AVX-512, AVX2, or plain C), chosen here; the environment variable
 * DSRT_MAX_CPU_ISA=scalar|avx2|avx512 caps the choice. Every choice writes
 * the same bytes. Returns 0, -ENOMEM, or DSRT_EOPTION when DSRT_MAX_CPU_ISA
 * names no instruction set.
 */
DSRT_API int dsrt_augmenter_create(dsrt_augmenter **a);
/* The instructions a's resampling runs on: "avx512", "avx2" or "scalar". */
DSRT_API const char *dsrt_augmenter_isa(const dsrt_augmenter *a);
/* Frees an augmenter. NULL is accepted. */
DSRT_API void dsrt_augmenter_destroy(dsrt_augmenter *a);

/*
 * Augments img, the decoded pixels of an image stored at full_w x full_h
 * (img may be smaller: the decoder's DCT scaling), and writes the sample to
 * dst, dsrt_augment_sample_bytes(o) bytes: for float NCHW, channel c's plane
 * starts at (float *)dst + c * output_height * output_width; for uint8 NHWC,
 * row y at (uint8_t *)dst + y * output_width * output_channels. The random
 * choices are dsrt_augment_draw(o, full_w, full_h, seed, epoch, sample_id).
 * img has output_channels channels, or 1 for 3 (a gray image, replicated:
 * the bytes are those of its RGB). Returns 0, DSRT_EOPTION (bad options, or
 * img->channels does not fit output_channels) or -ENOMEM; on failure dst
 * is left as it was.
 */
DSRT_API int dsrt_augment_apply(dsrt_augmenter *a, const dsrt_augment_options *o,
                                const dsrt_image *img, int full_w, int full_h, uint64_t seed,
                                uint64_t epoch, uint64_t sample_id, void *dst);

/* The same with the random choices given (for a fixed transform, or to
 * replay one). */
DSRT_API int dsrt_augment_apply_params(dsrt_augmenter *a, const dsrt_augment_options *o,
                                       const dsrt_image *img, int full_w, int full_h,
                                       const dsrt_augment_params *p, void *dst);

/*
 * Decoding only what a sample reads. dsrt_augment_decode_request fills the
 * request for sample sample_id of an image whose header says info:
 * channels (with allow_gray for 3: a gray image is replicated here, not
 * converted by the decoder), the smallest size (dsrt_augment_decode_size)
 * and the region of the stored image the sample reads, resampling filters'
 * reach included (the random crop of the 227 preset keeps about 79% of a
 * 256-pixel-short image). A rotation or shear asks for the whole image.
 * For the random-resized crop the region is the sample's window (to whole
 * decoded pixels) and the size the coarsest DCT scale that keeps the
 * window at least as dense as the output (times decode_oversample), never
 * below it: the sample is then within 1 level of 255 on average (at most
 * 16) of the same sample from a full-size decode, and equal to it where the
 * window needs the full size.
 * dst and dst_cap are left as they are (the caller's choice of where the
 * pixels go: initialise them). Returns 0, or DSRT_EOPTION for bad options,
 * -ENOMEM. The augmenter's scratch is used; apply_window rebuilds what it
 * needs.
 *
 * dsrt_augment_apply_window is dsrt_augment_apply for img lying in a
 * decoded image as win says (dsrt_decode_finish gives it; NULL: img is the
 * whole image). The bytes written are those of dsrt_augment_apply on the
 * whole decode, whatever the window, as long as the window holds the
 * request's region; a window that does not is DSRT_EOPTION.
 */
DSRT_API int dsrt_augment_decode_request(dsrt_augmenter *a, const dsrt_augment_options *o,
                                         const dsrt_image_info *info, uint64_t seed, uint64_t epoch,
                                         uint64_t sample_id, dsrt_decode_request *req);
DSRT_API int dsrt_augment_apply_window(dsrt_augmenter *a, const dsrt_augment_options *o,
                                       const dsrt_image *img, const dsrt_window *win, int full_w,
                                       int full_h, uint64_t seed, uint64_t epoch,
                                       uint64_t sample_id, void *dst);

#ifdef __cplusplus
}
#endif
#endif
