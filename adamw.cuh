// adamw.cuh: AdamW as nanochat runs it (spec 3.2): decoupled weight decay applied first with the
// scheduled lr, moments in lerp form, bias correction, eps 1e-10. Matches torch.optim.AdamW.
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend

// One step on n elements: p, m, v updated in place from the gradient g; t = 1-based step count.
//   p *= 1 - lr * wd;  m += (1 - beta1)(g - m);  v += (1 - beta2)(g^2 - v)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
static inline void adamw_update_cpu(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1,
                                    float beta2, float eps, float wd, int t) {
    const float bias1 = 1.0f - powf(beta1, (float)t);
    const float bias2 = 1.0f - powf(beta2, (float)t);
    const float step_size = lr / bias1;
    const float decay = 1.0f - lr * wd;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        float gi = g[i];
        m[i] += (1.0f - beta1) * (gi - m[i]);
        v[i] += (1.0f - beta2) * (gi * gi - v[i]);
        float pi = p[i] * decay;
        p[i] = pi - step_size * m[i] / (sqrtf(v[i] / bias2) + eps);
    }
}

// CUDA backend: the twin of this function comes with issue #6.
