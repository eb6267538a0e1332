// cuda_common.cuh: what every CUDA op of the CUDA backend shares (compiled only by nvcc).
//
// Conventions of the CUDA backend (../shared/DESIGN.md):
// * activations and matmul inputs are bf16 (floatX); parameters (master weights), their gradients and
//   the optimizer state are fp32; norms, softmax, losses and every reduction accumulate in fp32;
// * every op takes its cudaStream_t last and never synchronises the device;
// * deterministic: no atomics in reductions, a fixed reduction order, so two runs give identical bits;
// * each op's CPU twin (same header) is its specification; dev/cuda/ compares the two on random inputs.
#pragma once
#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "common.h"

typedef __nv_bfloat16 floatX;  // activation type of the CUDA backend

#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fail("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}
// after a kernel launch: launch errors (bad configuration) surface here, execution errors at the next sync
#define cudaCheckLaunch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

static inline int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

__device__ __forceinline__ float to_float(floatX x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ floatX to_floatX(float x) { return __float2bfloat16_rn(x); }

// sum over a warp, every lane gets the total (butterfly order: fixed, so deterministic)
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the total.
// `shared` holds 32 floats. Fixed order: warp sums, then warp 0 sums the warp results.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(v);
}

// The device's SM count and a scratch buffer for two-pass deterministic reductions, set up once.
struct CudaContext {
    int device = 0;
    int sm_count = 0;
    size_t shared_per_block_optin = 0;
    char name[256] = {0};
};
static CudaContext g_cuda;

static inline void cuda_context_init() {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&g_cuda.device));
    cudaCheck(cudaGetDeviceProperties(&prop, g_cuda.device));
    g_cuda.sm_count = prop.multiProcessorCount;
    g_cuda.shared_per_block_optin = prop.sharedMemPerBlockOptin;
    snprintf(g_cuda.name, sizeof g_cuda.name, "%s", prop.name);
}

#endif  // __CUDACC__
