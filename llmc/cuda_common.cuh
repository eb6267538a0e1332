// cuda_common.cuh: what every CUDA op of the CUDA backend shares (compiled only by nvcc).
//
// Conventions of the CUDA backend (dev/docs/design.md#conventions-of-the-cuda-backend):
// * activations and matmul inputs are bf16 (floatX); parameters (master weights), their gradients and
//   the optimizer state are fp32; norms, softmax, losses and every reduction accumulate in fp32;
// * every op takes its cudaStream_t last and never synchronises the device;
// * deterministic: no atomics in reductions, a fixed reduction order, so two runs give identical bits;
// * each op's CPU twin (same header) is its specification; dev/cuda/ compares the two on random inputs.
#pragma once
#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cstdint>
#include <cuda_runtime.h>
#include "common.h"

typedef __nv_bfloat16 floatX;  // activation type of the CUDA backend

#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)
static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fail("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}
// XSA_CUDA_SYNC=1 (the correctness stages of dev/gpu_check.sh): every kernel launch and cuBLASLt call is
// followed by a device synchronisation and a check, so that a fault names the launch that caused it (the
// function that launched it, file and line) rather than surfacing at a later synchronisation; CUDA graphs
// are off then (a stream being captured cannot be synchronised). Slow: for finding faults, not for timing.
static inline bool cuda_sync_debug() {
    static const bool on = getenv("XSA_CUDA_SYNC") && strcmp(getenv("XSA_CUDA_SYNC"), "0") != 0;
    return on;
}
// after a kernel launch (or a library call that launches): launch errors (bad configuration) surface here,
// execution errors at the next sync, or here with XSA_CUDA_SYNC=1
static inline void cuda_check_launch(const char* what, const char* file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && cuda_sync_debug()) err = cudaDeviceSynchronize();
    if (err != cudaSuccess)
        fail("CUDA error after %s (%s:%d)%s: %s", what, file, line,
             cuda_sync_debug() ? "" : ", or in work queued before it (XSA_CUDA_SYNC=1 names the faulting launch)", cudaGetErrorString(err));
}
#define cudaCheckLaunch() cuda_check_launch(__func__, __FILE__, __LINE__)

// Device memory is allocated and freed only through these four, which count every change: a captured CUDA
// graph bakes in the addresses of the buffers its kernels use, so backend_graph_run captures anew whenever
// the count moved (rather than compare a hand-kept list of buffers, which a new buffer could silently miss).
static uint64_t g_device_memory_epoch = 0;
template <typename T>
static inline cudaError_t cuda_malloc(T** p, size_t bytes) {
    g_device_memory_epoch++;
    return cudaMalloc((void**)p, bytes);
}
static inline void cuda_free(void* p) {
    if (!p) return;
    g_device_memory_epoch++;
    cuda_check(cudaFree(p), __FILE__, __LINE__);
}
template <typename T>
static inline void cuda_malloc_async(T** p, size_t bytes, cudaStream_t stream) {  // stream-ordered: no device-wide sync
    g_device_memory_epoch++;
    cuda_check(cudaMallocAsync((void**)p, bytes, stream), __FILE__, __LINE__);
}
static inline void cuda_free_async(void* p, cudaStream_t stream) {
    if (!p) return;
    g_device_memory_epoch++;
    cuda_check(cudaFreeAsync(p, stream), __FILE__, __LINE__);
}

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

// sum (MAX false) or max (MAX true) over a block of blockDim.x threads (a multiple of 32, at most 1024);
// every thread gets the result. `shared` holds 32 floats. Fixed order: warp results, then warp 0 combines them.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : (MAX ? -INFINITY : 0.0f);
    return MAX ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v, float* shared) { return block_reduce<false>(v, shared); }
__device__ __forceinline__ float block_max(float v, float* shared) { return block_reduce<true>(v, shared); }

// 16-byte access helpers of the elementwise kernels (norm, rotary, mlp, residual, embedding). One thread
// moves 8 consecutive elements: one 16-byte load for 8 bf16, two for 8 fp32. Pointers must be 16-byte aligned.
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

// The device and the limits the kernels are sized by, read once at start-up.
struct CudaContext {
    int device = 0;
    int sm_count = 0;
    int cc_major = 0, cc_minor = 0;    // compute capability
    size_t shared_per_block_optin = 0; // dynamic shared memory a block may have with the opt-in (attention_check_smem)
    size_t memory = 0;                 // global memory, bytes
    char name[256] = {0};
};
static CudaContext g_cuda;

// The architectures this binary holds GPU code for (the Makefile's CUDA_ARCH), for the error below
#ifndef XSA_CUDA_ARCH
#define XSA_CUDA_ARCH "unknown"
#endif
__global__ void __launch_bounds__(32) cuda_probe_kernel() {}

// Stops with one line if the kernels cannot run on this GPU: mma.sync on bf16, ldmatrix and cp.async need
// compute capability 8.0 (Ampere) or later, and the binary must hold code the GPU can run.
static inline void cuda_context_init() {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&g_cuda.device));
    cudaCheck(cudaGetDeviceProperties(&prop, g_cuda.device));
    g_cuda.sm_count = prop.multiProcessorCount;
    g_cuda.cc_major = prop.major;
    g_cuda.cc_minor = prop.minor;
    g_cuda.shared_per_block_optin = prop.sharedMemPerBlockOptin;
    g_cuda.memory = prop.totalGlobalMem;
    snprintf(g_cuda.name, sizeof g_cuda.name, "%s", prop.name);
    if (prop.major < 8)
        fail("%s has compute capability %d.%d; the CUDA backend needs 8.0 or later (Ampere: bf16 tensor cores with mma.sync, "
             "cp.async): use the CPU backend (make train_gpt_cpu)", prop.name, prop.major, prop.minor);
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, cuda_probe_kernel) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky error
        fail("this binary holds no GPU code for %s (compute capability %d.%d): it was built for CUDA_ARCH=\"%s\"; rebuild with "
             "make clean && make train_gpt CUDA_ARCH=%d%d", prop.name, prop.major, prop.minor, XSA_CUDA_ARCH, prop.major, prop.minor);
    }
}

#endif  // __CUDACC__
