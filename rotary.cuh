// rotary.cuh: rotary position embedding as nanochat applies it: base 1e5, half-split ("rotate half")
// pairs (x[j], x[j + D/2]), rotation by -theta, positions counted from the start of each row.
#pragma once

#include "common.h"

static const float ROTARY_BASE = 100000.0f;

// cos, sin (T, D/2): angle[t][j] = t * base^(-2j/D), all in fp32 as nanochat computes them.
static inline void rotary_tables(float* cos_table, float* sin_table, int T, int D) {
    int half = D / 2;
    for (int j = 0; j < half; j++) {
        float inv_freq = 1.0f / powf(ROTARY_BASE, (float)(2 * j) / (float)D);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_table[t * half + j] = cosf(angle);
            sin_table[t * half + j] = sinf(angle);
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// CPU backend

// x (B, T, heads, D) rotated in place by -theta when sign = 1 (the forward):
//   out1 = x1*cos + x2*sin, out2 = -x1*sin + x2*cos;
// the rotation is orthogonal, so the backward is the same with sign = -1 (its transpose, +theta).
static inline void rotary_rotate_cpu(float* x, const float* cos_table, const float* sin_table, float sign, int B, int T, int heads, int D) {
    int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* c = cos_table + t * half;
            const float* s = sin_table + t * half;
            for (int h = 0; h < heads; h++) {
                float* v = x + (((size_t)b * T + t) * heads + h) * D;
                for (int j = 0; j < half; j++) {
                    float x1 = v[j], x2 = v[j + half], sj = sign * s[j];
                    v[j] = x1 * c[j] + x2 * sj;
                    v[j + half] = -x1 * sj + x2 * c[j];
                }
            }
        }
}

static inline void rotary_forward_cpu(float* x, const float* cos_table, const float* sin_table, int B, int T, int heads, int D) {
    rotary_rotate_cpu(x, cos_table, sin_table, 1.0f, B, T, heads, D);
}

// dx (B, T, heads, D) in place
static inline void rotary_backward_cpu(float* dx, const float* cos_table, const float* sin_table, int B, int T, int heads, int D) {
    rotary_rotate_cpu(dx, cos_table, sin_table, -1.0f, B, T, heads, D);
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend: x (B, T, heads, D) bf16 rotated in place; cos, sin (T, D/2) fp32 on the device (made by
// rotary_tables and copied once). One thread owns 8 pairs (j..j+7, j+D/2..j+D/2+7): two 16-byte loads of
// x, four of the tables; a scalar kernel (one pair per thread) covers D/2 % 8 != 0 or unaligned buffers.
#ifdef __CUDACC__
#include "cuda_common.cuh"

// BACKWARD rotates by +theta (the transpose): the same formulas with sin negated.
template <bool VEC, bool BACKWARD>
__global__ void __launch_bounds__(256) rotary_kernel(floatX* x, const float* cos_table, const float* sin_table, int T,
                                                     int heads, int D, size_t total) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int half = D / 2, per_row = VEC ? half / 8 : half;
    const size_t row = i / per_row;  // (b, t, h)
    const int j0 = (int)(i % per_row) * (VEC ? 8 : 1);
    const int t = (int)((row / heads) % T);
    const float* c = cos_table + (size_t)t * half + j0;
    const float* s = sin_table + (size_t)t * half + j0;
    floatX* p = x + row * D + j0;
    if (VEC) {
        float x1[8], x2[8], cf[8], sf[8];
        load8(x1, p);
        load8(x2, p + half);
        load8(cf, c);
        load8(sf, s);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float sk = BACKWARD ? -sf[k] : sf[k];
            const float a = x1[k], b = x2[k];
            x1[k] = a * cf[k] + b * sk;
            x2[k] = -a * sk + b * cf[k];
        }
        store8(p, x1);
        store8(p + half, x2);
    } else {
        const float sk = BACKWARD ? -s[0] : s[0];
        const float a = to_float(p[0]), b = to_float(p[half]);
        p[0] = to_floatX(a * c[0] + b * sk);
        p[half] = to_floatX(-a * sk + b * c[0]);
    }
}

template <bool BACKWARD>
static inline void rotary_launch(floatX* x, const float* cos_table, const float* sin_table, int B, int T, int heads, int D,
                                 cudaStream_t stream) {
    const size_t rows = (size_t)B * T * heads;
    const int half = D / 2;
    if (rows == 0 || half == 0) return;
    const bool vec = half % 8 == 0 && aligned16(x) && aligned16(cos_table) && aligned16(sin_table);
    const size_t total = rows * (vec ? half / 8 : half);
    const int grid = ceil_div((long)total, 256);
    if (vec) rotary_kernel<true, BACKWARD><<<grid, 256, 0, stream>>>(x, cos_table, sin_table, T, heads, D, total);
    else rotary_kernel<false, BACKWARD><<<grid, 256, 0, stream>>>(x, cos_table, sin_table, T, heads, D, total);
    cudaCheckLaunch();
}

// x (B, T, heads, D) in place: out1 = x1 cos + x2 sin, out2 = -x1 sin + x2 cos
static inline void rotary_forward_cuda(floatX* x, const float* cos_table, const float* sin_table, int B, int T, int heads,
                                       int D, cudaStream_t stream) {
    rotary_launch<false>(x, cos_table, sin_table, B, T, heads, D, stream);
}

// dx (B, T, heads, D) in place: the transpose rotation
static inline void rotary_backward_cuda(floatX* dx, const float* cos_table, const float* sin_table, int B, int T, int heads,
                                        int D, cudaStream_t stream) {
    rotary_launch<true>(dx, cos_table, sin_table, B, T, heads, D, stream);
}

#endif  // __CUDACC__
