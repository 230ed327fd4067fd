/*
 * Batch mixing for the pipeline (mixup, cutmix, label smoothing into soft
 * labels): the batch-level step that runs once every place of a batch is
 * filled. Internal to libdsrt; runtime/pipeline/mix.c says how.
 */
#ifndef DSRT_PIPELINE_MIX_H
#define DSRT_PIPELINE_MIX_H

#include <dsrt/pipeline.h>

/* 1 when the options ask for soft labels (mixing or label smoothing). */
int dsrt__mix_wanted(const dsrt_pipeline_options *o);

/*
 * Checks the mixing options against the augment options and the datastore's
 * class count ds_classes; *classes gets the soft labels' width (0 when none
 * are wanted). DSRT_EOPTION naming the option when one is out of range.
 */
int dsrt__mix_check(const dsrt_pipeline_options *o, const dsrt_augment_options *a,
                    size_t ds_classes, size_t *classes);

/*
 * Mixes batch b in place (its float NCHW samples, b->count of them) and
 * writes its soft labels (b->soft_labels, b->classes wide) and mix fields,
 * with the draws keyed by (o->seed, b->epoch, b->index).
 */
void dsrt__mix_batch(const dsrt_pipeline_options *o, dsrt_batch *b);

#endif
