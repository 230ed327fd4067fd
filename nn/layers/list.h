/*
 * The layer kinds, one line each: its enum name and the name of its ops
 * table (nn/layers/<file>.c defines dsrt__layer_<name>; the CUDA module's
 * nn/layers/<file>_cuda.c defines dsrt__cuda_layer_<name>). Everything that
 * handles layers (the parser, the net, the backends, ONNX import and
 * export) reaches a kind through the tables this list makes; adding a kind
 * is its own file(s) and one line here.
 *
 * The order is the order of the enum, which nothing outside a running
 * process keeps (model files keep the description text).
 */
#ifndef DSRT_NN_LAYERS_LIST_H
#define DSRT_NN_LAYERS_LIST_H

#define DSRT_LAYER_KINDS(X)                                                                        \
    X(INPUT, input)                                                                                \
    X(CONV, conv)                                                                                  \
    X(BATCHNORM, batchnorm)                                                                        \
    X(RELU, relu)                                                                                  \
    X(CLIP, clip)                                                                                  \
    X(SIGMOID, sigmoid)                                                                            \
    X(HARDSIGMOID, hardsigmoid)                                                                    \
    X(HARDSWISH, hardswish)                                                                        \
    X(SILU, silu)                                                                                  \
    X(GELU, gelu)                                                                                  \
    X(MAXPOOL, maxpool)                                                                            \
    X(AVGPOOL, avgpool)                                                                            \
    X(GAP, gap)                                                                                    \
    X(FC, fc)                                                                                      \
    X(DROPOUT, dropout)                                                                            \
    X(LRN, lrn)                                                                                    \
    X(SOFTMAX, softmax)                                                                            \
    X(ADD, add)                                                                                    \
    X(CONCAT, concat)                                                                              \
    X(MUL, mul)                                                                                    \
    X(SCALE, scale)                                                                                \
    X(LAYERNORM, layernorm)                                                                        \
    X(PAD, pad)                                                                                    \
    X(STOCHASTIC_DEPTH, stochastic_depth)

#endif
