// norm.cuh: RMSNorm without a learnable weight, as nanochat uses everywhere (token embedding, block
// inputs, QK-norm per head, final norm): out = scale * x / sqrt(mean(x^2) + eps), eps = fp32 epsilon.
#pragma once

#include "common.h"

// torch.finfo(torch.float32).eps: the eps F.rms_norm uses when none is given (spec 1.7)
static const float RMSNORM_EPS = 1.1920929e-07f;

// ----------------------------------------------------------------------------------------------------
// CPU backend

// out (rows, C) = scale * inp * rstd; rstd (rows) = 1 / sqrt(mean(inp^2) + eps), kept for the backward.
// `rows` is B*T for the residual stream, or B*T*heads with C = head_dim for QK-norm.
static inline void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, size_t rows, int C, float scale) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++) {
        const float* x = inp + (size_t)r * C;
        float* y = out + (size_t)r * C;
        float sumsq = 0.0f;
        for (int i = 0; i < C; i++) sumsq += x[i] * x[i];
        float s = 1.0f / sqrtf(sumsq / C + RMSNORM_EPS);
        for (int i = 0; i < C; i++) y[i] = scale * (x[i] * s);
        rstd[r] = s;
    }
}

// dinp (rows, C) += scale * rstd * (dout - xhat * mean(dout * xhat)), with xhat = out / scale the unit-RMS
// input. Using the saved output instead of the input keeps one buffer fewer alive between the passes.
static inline void rmsnorm_backward_cpu(float* dinp, const float* dout, const float* out, const float* rstd,
                                        size_t rows, int C, float scale) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++) {
        const float* g = dout + (size_t)r * C;
        const float* y = out + (size_t)r * C;
        float* dx = dinp + (size_t)r * C;
        float inv_scale = 1.0f / scale;
        float dot = 0.0f;  // sum_i g_i * xhat_i
        for (int i = 0; i < C; i++) dot += g[i] * (y[i] * inv_scale);
        float mean_dot = dot / C;
        float s = scale * rstd[r];
        for (int i = 0; i < C; i++) dx[i] += s * (g[i] - (y[i] * inv_scale) * mean_dot);
    }
}

// CUDA backend: the twins of these functions come with issue #6.
