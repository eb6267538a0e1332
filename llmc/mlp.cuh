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

// ----------------------------------------------------------------------------------------------------
// CUDA backend: one thread per 8 elements, one 16-byte access per operand when every pointer is 16-byte
// aligned; the last thread handles a tail of n % 8 elements one by one (so any n works), and unaligned
// buffers take the same kernel with scalar accesses throughout.
#ifdef __CUDACC__
#include "cuda_common.cuh"

// out (n) = relu(inp)^2
template <bool VEC>
__global__ void __launch_bounds__(256) relu2_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (VEC && i0 + 8 <= n) {
        float f[8];
        load8(f, inp + i0);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float r = f[k] > 0.0f ? f[k] : 0.0f;
            f[k] = r * r;
        }
        store8(out + i0, f);
    } else {
        const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
        for (size_t i = i0; i < i1; i++) {
            const float v = to_float(inp[i]), r = v > 0.0f ? v : 0.0f;
            out[i] = to_floatX(r * r);
        }
    }
}

// dinp (n) = dout * 2 relu(inp); dinp may alias dout (each element is read before it is written, by one thread)
template <bool VEC>
__global__ void __launch_bounds__(256) relu2_backward_kernel(floatX* dinp, const floatX* dout, const floatX* inp, size_t n) {
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (VEC && i0 + 8 <= n) {
        float g[8], x[8];
        load8(g, dout + i0);
        load8(x, inp + i0);
#pragma unroll
        for (int k = 0; k < 8; k++) g[k] = g[k] * 2.0f * (x[k] > 0.0f ? x[k] : 0.0f);
        store8(dinp + i0, g);
    } else {
        const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
        for (size_t i = i0; i < i1; i++) {
            const float x = to_float(inp[i]);
            dinp[i] = to_floatX(to_float(dout[i]) * 2.0f * (x > 0.0f ? x : 0.0f));
        }
    }
}

static inline void relu2_forward_cuda(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int grid = ceil_div((long)((n + 7) / 8), 256);
    if (aligned16(out) && aligned16(inp)) relu2_forward_kernel<true><<<grid, 256, 0, stream>>>(out, inp, n);
    else relu2_forward_kernel<false><<<grid, 256, 0, stream>>>(out, inp, n);
    cudaCheckLaunch();
}

static inline void relu2_backward_cuda(floatX* dinp, const floatX* dout, const floatX* inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int grid = ceil_div((long)((n + 7) / 8), 256);
    if (aligned16(dinp) && aligned16(dout) && aligned16(inp))
        relu2_backward_kernel<true><<<grid, 256, 0, stream>>>(dinp, dout, inp, n);
    else relu2_backward_kernel<false><<<grid, 256, 0, stream>>>(dinp, dout, inp, n);
    cudaCheckLaunch();
}

#endif  // __CUDACC__
