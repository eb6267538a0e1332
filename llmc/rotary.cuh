// rotary.cuh: rotary position embedding as nanochat applies it: base 1e5, half-split ("rotate half")
// pairs (x[j], x[j + D/2]), rotation by -theta, positions counted from the start of each row. Also the
// rotary fused with the QK-norm that follows it in attention (rotary_rmsnorm_*): one pass over q and k
// instead of two, forward and backward.
#pragma once

#include "common.h"
#include "norm.cuh"

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

// One head vector v (D) of a token at position t rotated in place by -theta when sign = 1 (the forward):
//   out1 = x1*cos + x2*sin, out2 = -x1*sin + x2*cos;
// the rotation is orthogonal, so the backward is the same with sign = -1 (its transpose, +theta). c, s: the
// tables' row t (D/2).
static inline void rotary_rotate_row_cpu(float* v, const float* c, const float* s, float sign, int D) {
    const int half = D / 2;
    for (int j = 0; j < half; j++) {
        float x1 = v[j], x2 = v[j + half], sj = sign * s[j];
        v[j] = x1 * c[j] + x2 * sj;
        v[j + half] = -x1 * sj + x2 * c[j];
    }
}

// x (B, T, heads, D) rotated in place (rotary_rotate_row_cpu on every head vector)
static inline void rotary_rotate_cpu(float* x, const float* cos_table, const float* sin_table, float sign, int B, int T, int heads, int D) {
    const int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < heads; h++)
                rotary_rotate_row_cpu(x + (((size_t)b * T + t) * heads + h) * D, cos_table + t * half, sin_table + t * half, sign, D);
}

static inline void rotary_forward_cpu(float* x, const float* cos_table, const float* sin_table, int B, int T, int heads, int D) {
    rotary_rotate_cpu(x, cos_table, sin_table, 1.0f, B, T, heads, D);
}

// dx (B, T, heads, D) in place
static inline void rotary_backward_cpu(float* dx, const float* cos_table, const float* sin_table, int B, int T, int heads, int D) {
    rotary_rotate_cpu(dx, cos_table, sin_table, -1.0f, B, T, heads, D);
}

// x (B, T, heads, D), token n's heads at x + n * stride, in place: the rotary, then each head vector
// RMS-normalised and multiplied by scale (QK-norm); rstd (B, T, heads) of the rotated vectors
static inline void rotary_rmsnorm_forward_cpu(float* x, size_t stride, float* rstd, const float* cos_table, const float* sin_table, int B,
                                              int T, int heads, int D, float scale) {
    const int half = D / 2;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)B * T; n++) {
        const int t = (int)(n % T);
        for (int h = 0; h < heads; h++) {
            float* v = x + (size_t)n * stride + (size_t)h * D;
            rotary_rotate_row_cpu(v, cos_table + t * half, sin_table + t * half, 1.0f, D);
            rstd[(size_t)n * heads + h] = rmsnorm_row_forward_cpu(v, v, D, scale);
        }
    }
}

// dinp (B, T, heads, D) = dL/d(the rotary's input), overwritten, given dout = dL/d(the forward's output),
// out (the forward's output) and rstd; the three with token n's heads at + n * stride; dinp may be dout.
static inline void rotary_rmsnorm_backward_cpu(float* dinp, const float* dout, const float* out, size_t stride, const float* rstd,
                                               const float* cos_table, const float* sin_table, int B, int T, int heads, int D, float scale) {
    const int half = D / 2;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)B * T; n++) {
        const int t = (int)(n % T);
        for (int h = 0; h < heads; h++) {
            const size_t at = (size_t)n * stride + (size_t)h * D;
            rmsnorm_row_backward_cpu(dinp + at, dout + at, out + at, rstd[(size_t)n * heads + h], D, scale, false);
            rotary_rotate_row_cpu(dinp + at, cos_table + t * half, sin_table + t * half, -1.0f, D);
        }
    }
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

// ---- rotary + QK-norm, fused -----------------------------------------------------------------------------
// A head vector of D = 16 G channels belongs to a group of G consecutive threads; thread `lane` owns the 8
// pairs (8 lane + k, 8 lane + k + D/2), k < 8, so the rotation needs no exchange and the norm's sum is one
// group_sum. The rotated vector stays in fp32 registers for the norm (the unfused kernels round it to bf16
// in between). D = 64 (G = 4) and 128 (G = 8) with 16-byte aligned buffers; other shapes run the two
// kernels above in turn.

// x (rows = B T heads, D; token n's heads at x + n * stride) in place: rotate by -theta, then x * rstd *
// scale; rstd (rows)
template <int G>
__global__ void __launch_bounds__(256) rotary_rmsnorm_forward_kernel(floatX* x, size_t stride, float* rstd, const float* cos_table,
                                                                     const float* sin_table, int T, int heads, size_t rows,
                                                                     float scale) {
    constexpr int half = 8 * G, D = 16 * G;
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    if (row >= rows) return;  // the whole group leaves together
    const int lane = threadIdx.x % G, j0 = 8 * lane;
    const size_t n = row / heads;
    const int t = (int)(n % T);
    floatX* p = x + n * stride + (row % heads) * D + j0;
    float x1[8], x2[8], cf[8], sf[8];
    load8(x1, p);
    load8(x2, p + half);
    load8(cf, cos_table + (size_t)t * half + j0);
    load8(sf, sin_table + (size_t)t * half + j0);
    float sumsq = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = x1[k], b = x2[k];
        x1[k] = a * cf[k] + b * sf[k];
        x2[k] = -a * sf[k] + b * cf[k];
        sumsq += x1[k] * x1[k] + x2[k] * x2[k];
    }
    sumsq = group_sum<G>(sumsq);
    const float s = 1.0f / sqrtf(sumsq / D + RMSNORM_EPS);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        x1[k] = scale * (x1[k] * s);
        x2[k] = scale * (x2[k] * s);
    }
    store8(p, x1);
    store8(p + half, x2);
    if (lane == 0) rstd[row] = s;
}

// dinp (rows, D) = rotate by +theta of (scale rstd (dout - xhat mean(dout xhat))), xhat = out / scale;
// dout, out (rows, D); the three with token n's heads at + n * stride. dinp is only written, and may be
// dout: each thread reads its 16 elements of both before it writes them.
template <int G>
__global__ void __launch_bounds__(256) rotary_rmsnorm_backward_kernel(floatX* dinp, const floatX* dout, const floatX* out, size_t stride,
                                                                      const float* rstd, const float* cos_table,
                                                                      const float* sin_table, int T, int heads, size_t rows,
                                                                      float scale) {
    constexpr int half = 8 * G, D = 16 * G;
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    if (row >= rows) return;
    const int lane = threadIdx.x % G, j0 = 8 * lane;
    const size_t n = row / heads;
    const int t = (int)(n % T);
    const size_t off = n * stride + (row % heads) * D + j0;
    float g1[8], g2[8], y1[8], y2[8];
    load8(g1, dout + off);
    load8(g2, dout + off + half);
    load8(y1, out + off);
    load8(y2, out + off + half);
    const float inv_scale = 1.0f / scale;
    float dot = 0.0f;  // sum_i g_i xhat_i
#pragma unroll
    for (int k = 0; k < 8; k++) dot += g1[k] * (y1[k] * inv_scale) + g2[k] * (y2[k] * inv_scale);
    dot = group_sum<G>(dot);
    const float mean_dot = dot / D, s = scale * rstd[row];
    float cf[8], sf[8];
    load8(cf, cos_table + (size_t)t * half + j0);
    load8(sf, sin_table + (size_t)t * half + j0);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float a = s * (g1[k] - (y1[k] * inv_scale) * mean_dot), b = s * (g2[k] - (y2[k] * inv_scale) * mean_dot);
        g1[k] = a * cf[k] - b * sf[k];  // the transpose rotation: sin negated
        g2[k] = a * sf[k] + b * cf[k];
    }
    store8(dinp + off, g1);
    store8(dinp + off + half, g2);
}

static inline bool rotary_rmsnorm_fused_ok(int D, size_t stride, const void* a, const void* b, const void* c, const void* d, const void* e) {
    return (D == 64 || D == 128) && stride % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d) && aligned16(e);
}

// The unfused kernels take rows of one buffer, heads * D apart
static inline void rotary_rmsnorm_check_unfused(size_t stride, int heads, int D, const char* who) {
    if (stride != (size_t)heads * D) fail("%s: head vectors %zu apart need head_dim 64 or 128 and 16-byte alignment", who, stride);
}

// x (B, T, heads, D), token n's heads at x + n * stride, in place: rotary, then QK-norm (rmsnorm times
// scale); rstd (B, T, heads)
static inline void rotary_rmsnorm_forward_cuda(floatX* x, size_t stride, float* rstd, const float* cos_table, const float* sin_table,
                                               int B, int T, int heads, int D, float scale, cudaStream_t stream) {
    const size_t rows = (size_t)B * T * heads;
    if (rows == 0) return;
    if (!rotary_rmsnorm_fused_ok(D, stride, x, x, x, cos_table, sin_table)) {
        rotary_rmsnorm_check_unfused(stride, heads, D, "rotary_rmsnorm_forward_cuda");
        rotary_forward_cuda(x, cos_table, sin_table, B, T, heads, D, stream);
        rmsnorm_forward_cuda(x, rstd, x, rows, D, scale, stream);
        return;
    }
    const int G = D / 16, grid = ceil_div((long)rows * G, 256);
    if (G == 4) rotary_rmsnorm_forward_kernel<4><<<grid, 256, 0, stream>>>(x, stride, rstd, cos_table, sin_table, T, heads, rows, scale);
    else rotary_rmsnorm_forward_kernel<8><<<grid, 256, 0, stream>>>(x, stride, rstd, cos_table, sin_table, T, heads, rows, scale);
    cudaCheckLaunch();
}

// dinp (B, T, heads, D) = dL/d(the rotary's input), overwritten (it may be dout); dout, out (B, T, heads, D),
// the three with token n's heads at + n * stride; rstd of the forward
static inline void rotary_rmsnorm_backward_cuda(floatX* dinp, const floatX* dout, const floatX* out, size_t stride, const float* rstd,
                                                const float* cos_table, const float* sin_table, int B, int T, int heads, int D,
                                                float scale, cudaStream_t stream) {
    const size_t rows = (size_t)B * T * heads;
    if (rows == 0) return;
    if (!rotary_rmsnorm_fused_ok(D, stride, dinp, dout, out, cos_table, sin_table)) {
        rotary_rmsnorm_check_unfused(stride, heads, D, "rotary_rmsnorm_backward_cuda");
        rmsnorm_backward_cuda(dinp, dout, out, rstd, rows, D, scale, GRAD_OVERWRITE, stream);
        rotary_backward_cuda(dinp, cos_table, sin_table, B, T, heads, D, stream);
        return;
    }
    const int G = D / 16, grid = ceil_div((long)rows * G, 256);
    if (G == 4)
        rotary_rmsnorm_backward_kernel<4><<<grid, 256, 0, stream>>>(dinp, dout, out, stride, rstd, cos_table, sin_table, T, heads, rows, scale);
    else rotary_rmsnorm_backward_kernel<8><<<grid, 256, 0, stream>>>(dinp, dout, out, stride, rstd, cos_table, sin_table, T, heads, rows,
                                                                     scale);
    cudaCheckLaunch();
}

#endif  // __CUDACC__
