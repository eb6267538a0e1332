// mlp.cuh: the MLP's elementwise activation, ReLU squared (the two matmuls around it are in matmul.cuh).
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend

// out (n) = relu(inp)^2
static inline void relu2_forward_cpu(float* out, const float* inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        float r = inp[i] > 0.0f ? inp[i] : 0.0f;
        out[i] = r * r;
    }
}

// dinp (n) = dout * 2 * relu(inp)   (overwrites; the MLP's pre-activation gradient has no other source)
static inline void relu2_backward_cpu(float* dinp, const float* dout, const float* inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        float r = inp[i] > 0.0f ? inp[i] : 0.0f;
        dinp[i] = dout[i] * 2.0f * r;
    }
}

// CUDA backend: the twins of these functions come with issue #6.
