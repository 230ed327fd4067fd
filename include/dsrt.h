/*
 * dsrt: background-dispatch image datastore, augmentation and training.
 * This header includes every public module header.
 */
#ifndef DSRT_H
#define DSRT_H

#include <dsrt/core.h>
#include <dsrt/datastore.h>
#include <dsrt/augment.h>
#include <dsrt/pipeline.h>
#include <dsrt/options.h>
#include <dsrt/nn.h>
#include <dsrt/train.h>
#include <dsrt/comm.h>

#endif
