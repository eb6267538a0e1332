// residual.cuh: the elementwise ops on the residual stream: the per-layer lambda mix with the x0 skip
// (x = resid_lambda * x + x0_lambda * x0), residual adds, and the backout subtraction.
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend

// out (n) = a * x + b * x0
static inline void lambda_mix_forward_cpu(float* out, const float* x, const float* x0, float a, float b, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) out[i] = a * x[i] + b * x0[i];
}

// Backward of out = a * x + b * x0 given dout (n): da += dout . x, db += dout . x0, dx0 (n) += b * dout,
// and dout is rescaled in place into dx = a * dout (so the caller's residual gradient flows on).
static inline void lambda_mix_backward_cpu(float* dout, float* dx0, float* da, float* db, const float* x, const float* x0,
                                           float a, float b, size_t n) {
    *da += (float)dot_deterministic(dout, x, n);
    *db += (float)dot_deterministic(dout, x0, n);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        dx0[i] += b * dout[i];
        dout[i] *= a;
    }
}

// y (n) += x
static inline void add_inplace_cpu(float* y, const float* x, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) y[i] += x[i];
}

// y (n) += a * x
static inline void axpy_cpu(float* y, float a, const float* x, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) y[i] += a * x[i];
}

// CUDA backend: the twins of these functions come with issue #6.
