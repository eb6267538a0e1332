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

#ifndef XSA_VEC8_HELPERS
#define XSA_VEC8_HELPERS
// 16-byte access helpers shared by the elementwise headers (norm, rotary, mlp, residual, embedding).
// The block is repeated verbatim in each of them behind this guard so that every header compiles on its
// own; keep the copies identical (they belong in cuda_common.cuh). One thread moves 8 consecutive
// elements: one 16-byte load for 8 bf16, two for 8 fp32. Pointers must be 16-byte aligned.
static inline bool aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

__device__ __forceinline__ int4 ld16(const void* p) { return *reinterpret_cast<const int4*>(p); }

__device__ __forceinline__ void unpack8(float (&f)[8], int4 raw) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
}

__device__ __forceinline__ int4 pack8(const float (&f)[8]) {
    int4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
    return raw;
}

__device__ __forceinline__ void load8(float (&f)[8], const floatX* p) { unpack8(f, ld16(p)); }
__device__ __forceinline__ void load8(float (&f)[8], const float* p) {
    float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void store8(floatX* p, const float (&f)[8]) { *reinterpret_cast<int4*>(p) = pack8(f); }
__device__ __forceinline__ void store8(float* p, const float (&f)[8]) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(f[4], f[5], f[6], f[7]);
}

// Sum over a group of G consecutive lanes (G a power of two <= 32, groups aligned in the warp); every
// lane of the group gets the group's total. Only the group's own lanes take part, so a group whose row
// is out of range may return early. Butterfly order: fixed, deterministic.
template <int G>
__device__ __forceinline__ float group_sum(float v) {
    const unsigned mask = G == 32 ? 0xffffffffu : ((1u << (G % 32)) - 1u) << (threadIdx.x % 32 / G * G);
#pragma unroll
    for (int offset = G / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset);
    return v;
}
#endif  // XSA_VEC8_HELPERS

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
