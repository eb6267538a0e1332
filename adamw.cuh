// adamw.cuh: AdamW as nanochat runs it (dev/docs/optim.md#adamw): decoupled weight decay applied first with the
// scheduled lr, moments in lerp form, bias correction, eps 1e-10. Matches torch.optim.AdamW.
#pragma once

#include "llmc/common.h"

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

// ----------------------------------------------------------------------------------------------------
// CUDA backend (API in dev/cuda/API.md)

#ifdef __CUDACC__
#include "llmc/cuda_common.cuh"

__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, float beta1, float beta2, float eps,
                                              float step_size, float decay, float bias2) {
    m += (1.0f - beta1) * (g - m);
    v += (1.0f - beta2) * (g * g - v);
    p = p * decay - step_size * m / (sqrtf(v / bias2) + eps);
}

// p, g, m, v (n) fp32; each thread 4 consecutive elements, as one 16-byte access per array when all
// four pointers are 16-byte aligned (vec), element by element otherwise and at the tail. Memory-bound:
// 28 bytes per element (4 reads, 3 writes).
static const int ADAMW_THREADS = 256;
__global__ void __launch_bounds__(ADAMW_THREADS) adamw_kernel(float* p, const float* g, float* m, float* v, size_t n, float beta1, float beta2, float eps,
                             float step_size, float decay, float bias2, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    if (vec && i + 4 <= n) {
        float4 pp = *reinterpret_cast<float4*>(p + i), mm = *reinterpret_cast<float4*>(m + i);
        float4 vv = *reinterpret_cast<float4*>(v + i);
        const float4 gg = *reinterpret_cast<const float4*>(g + i);
        adamw_element(pp.x, gg.x, mm.x, vv.x, beta1, beta2, eps, step_size, decay, bias2);
        adamw_element(pp.y, gg.y, mm.y, vv.y, beta1, beta2, eps, step_size, decay, bias2);
        adamw_element(pp.z, gg.z, mm.z, vv.z, beta1, beta2, eps, step_size, decay, bias2);
        adamw_element(pp.w, gg.w, mm.w, vv.w, beta1, beta2, eps, step_size, decay, bias2);
        *reinterpret_cast<float4*>(p + i) = pp;
        *reinterpret_cast<float4*>(m + i) = mm;
        *reinterpret_cast<float4*>(v + i) = vv;
    } else {
        size_t end = i + 4 < n ? i + 4 : n;
        for (size_t j = i; j < end; j++) adamw_element(p[j], g[j], m[j], v[j], beta1, beta2, eps, step_size, decay, bias2);
    }
}

// The twin of adamw_update_cpu: p, m, v (n) fp32 updated in place from g (n) fp32; t = 1-based step.
// The bias corrections are computed on the host with the same expressions as the CPU twin (same floats).
static inline void adamw_update_cuda(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                                     float eps, float wd, int t, cudaStream_t stream) {
    if (n == 0) return;
    const float bias1 = 1.0f - powf(beta1, (float)t);
    const float bias2 = 1.0f - powf(beta2, (float)t);
    const float step_size = lr / bias1;
    const float decay = 1.0f - lr * wd;
    const bool vec = ((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) % 16 == 0;
    adamw_kernel<<<ceil_div((long)ceil_div((long)n, 4), ADAMW_THREADS), ADAMW_THREADS, 0, stream>>>(p, g, m, v, n, beta1, beta2, eps,
                                                                                        step_size, decay, bias2, vec);
    cudaCheckLaunch();
}
#endif  // __CUDACC__
