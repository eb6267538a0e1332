// loss.cuh: logit softcap and cross-entropy, fused: the forward leaves the softcapped logits in place,
// and the backward turns them into their gradients in place, so probabilities are never stored.
// A target of IGNORE_INDEX (-1, PyTorch's and nanochat's ignore_index) is no prediction: its loss is 0, its
// row's gradient 0, and the mean loss is over the other targets (SFT masks everything but the assistant's
// tokens this way; pretraining targets are never ignored).
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend

// sum_i e^(x_i - shift) over a row of logits, as 16 independent lanes (as dot_lanes) so that it vectorises,
// in double: at V = 65,536 a float sum would lose ~1e-5 of its value. A NaN logit makes the sum NaN.
static inline double row_sum_exp_lanes(const float* x, int n, float shift) {
    double lanes[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += (double)expf_simd(x[i + l] - shift);
    for (; i < n; i++) lanes[i % 16] += (double)expf_simd(x[i] - shift);
    double sum = 0.0;
    for (int l = 0; l < 16; l++) sum += lanes[l];
    return sum;
}

// logits (N, V) in place: raw -> cap * tanh(raw / cap); losses (N) = -log softmax(capped)[target], 0 where
// the target is IGNORE_INDEX.
static inline void softcap_crossentropy_forward_cpu(float* losses, float* logits, const int* targets, size_t N, int V, float cap) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        float* row = logits + (size_t)n * V;
        for (int i = 0; i < V; i++) row[i] = cap * tanhf_simd(row[i] / cap);
        if (targets[n] == IGNORE_INDEX) {
            losses[n] = 0.0f;
            continue;
        }
        const float row_max = max_lanes(row, V);
        losses[n] = (float)(log(row_sum_exp_lanes(row, V, row_max)) + row_max - row[targets[n]]);
    }
}

// logits (n) in place: raw -> cap * tanh(raw / cap) (inference: no loss)
static inline void softcap_cpu(float* logits, size_t n, float cap) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) logits[i] = cap * tanhf_simd(logits[i] / cap);
}

// scale[0] = grad_scale / (the number of targets that are not IGNORE_INDEX, at least 1): the factor that
// turns the sum of a micro-batch's losses into grad_scale x their mean. It lives in backend memory, where the
// loss's backward and loss_sum_accumulate read it, so a CUDA graph of the micro-step stays valid while the
// count changes from batch to batch (SFT). A batch with every target ignored has loss 0 and no gradient
// (PyTorch's mean over no targets would be NaN).
static inline void loss_mean_scale_cpu(float* scale, const int* targets, size_t N, float grad_scale) {
    size_t count = 0;
    for (size_t n = 0; n < N; n++) count += targets[n] != IGNORE_INDEX;
    scale[0] = grad_scale / (float)(count > 0 ? count : 1);
}

// out[0] += factor[0] * sum(losses[0 .. n)): the training loss of a micro-batch, added up where the losses
// are (factor = loss_mean_scale's, with grad_scale = 1 / accumulation steps, gives the step's mean loss), so the
// loop reads one number per step.
static inline void loss_sum_accumulate_cpu(float* out, const float* factor, const float* losses, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += losses[i];
    out[0] += (float)(factor[0] * sum);
}

// logits (N, V) in place: capped logits -> dL/d(raw logits) for L = scale[0] * sum_n losses[n]
// (scale from loss_mean_scale: grad_scale x the mean loss): (softmax - onehot) * scale * (1 - (capped / cap)^2);
// 0 on the rows whose target is IGNORE_INDEX.
static inline void softcap_crossentropy_backward_cpu(float* logits, const int* targets, size_t N, int V, float cap, const float* scale) {
    const float grad_scale = scale[0];
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        float* row = logits + (size_t)n * V;
        if (targets[n] == IGNORE_INDEX) {
            for (int i = 0; i < V; i++) row[i] = 0.0f;
            continue;
        }
        const float row_max = max_lanes(row, V);
        const float inv_sum = (float)(1.0 / row_sum_exp_lanes(row, V, row_max));
        const float target_capped = row[targets[n]];
        for (int i = 0; i < V; i++) {
            const float t = row[i] / cap;
            row[i] = expf_simd(row[i] - row_max) * inv_sum * grad_scale * (1.0f - t * t);
        }
        // the target's entry again, with the one-hot term (kept out of the loop above, which then has no
        // compare in it)
        const float t = target_capped / cap;
        row[targets[n]] = (expf_simd(target_capped - row_max) * inv_sum - 1.0f) * grad_scale * (1.0f - t * t);
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend (API in dev/cuda/API.md)
//
// One block per row of logits (V up to 65536 and beyond, any V). All math in fp32; the logits are bf16 in
// memory. A row is walked in 16-byte chunks of 8 bf16 where its alignment allows (a row starts at n*V*2
// bytes, so for odd V the aligned body is found per row), element by element in the unaligned head and
// the tail. Each thread keeps an online (max, sum of exp(x - max)) pair over the elements it owns; the
// pairs are merged in a fixed butterfly/warp order, so the result is deterministic.
//   forward:  one pass: read raw, write capped, accumulate (max, sum) of the fp32 capped values; the loss
//             uses the fp32 capped values (as PyTorch does after logits.float()), not the bf16 stored ones.
//   backward: two passes over the stored capped row: (max, sum), then the gradient written in place (the
//             second read mostly hits L2: a row is at most a few hundred KB).
// Differences from the CPU twin: the CPU sums exp in double; the stored capped logits are bf16, so the
// backward's softmax sees logits rounded to bf16 (|error| <= 2^-9 relative, as in llm.c).

#ifdef __CUDACC__
#include "cuda_common.cuh"

static const int LOSS_THREADS = 512;

// online softmax statistics: (m, s) with s = sum exp(x - m)
struct LossLse {
    float m, s;
};

__device__ __forceinline__ void loss_lse_add(LossLse& a, float x) {
    if (x > a.m) {
        a.s = a.s * expf(a.m - x) + 1.0f;  // m = -inf on the first element: expf(-inf) = 0
        a.m = x;
    } else {
        a.s += expf(x - a.m);  // NaN x lands here and poisons s, so a NaN logit gives a NaN loss
    }
}

__device__ __forceinline__ LossLse loss_lse_merge(LossLse a, LossLse b) {
    float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return a;  // both empty
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// merge over the block, fixed order (butterfly in each warp, then warp 0 over the warps); every thread
// gets the result. blockDim.x a multiple of 32.
__device__ __forceinline__ LossLse loss_lse_block(LossLse v) {
    __shared__ float shm[32], shs[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int offset = 16; offset > 0; offset >>= 1) {
        LossLse o = {__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
        v = loss_lse_merge(v, o);
    }
    __syncthreads();  // shm/shs may still be read by a previous call
    if (lane == 0) { shm[warp] = v.m; shs[warp] = v.s; }
    __syncthreads();
    v = lane < warps ? LossLse{shm[lane], shs[lane]} : LossLse{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset >>= 1) {
        LossLse o = {__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
        v = loss_lse_merge(v, o);
    }
    return v;
}

// Walk a bf16 row of V elements with the whole block: f(index, value) returns the value to store when
// WRITE. The element -> thread mapping depends only on V and the row's alignment, so a second walk of the
// same row gives every thread the same elements (each thread rewrites only what it read itself).
template <bool WRITE, typename F>
__device__ __forceinline__ void loss_row_walk(floatX* row, int V, F f) {
    int head = (int)(((16 - ((uintptr_t)row & 15)) & 15) / 2);  // elements before the first 16-byte boundary
    if (head > V) head = V;
    const int nvec = (V - head) / 8, tail = head + nvec * 8;
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
        uint4* p = reinterpret_cast<uint4*>(row + head) + c;
        uint4 packed = *p;
        floatX* x = reinterpret_cast<floatX*>(&packed);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float y = f(head + c * 8 + j, to_float(x[j]));
            if (WRITE) x[j] = to_floatX(y);
        }
        if (WRITE) *p = packed;
    }
    // unaligned head [0, head) and tail [tail, V): at most 7 + 7 elements, spread over the threads
    const int extra = head + (V - tail);
    for (int e = threadIdx.x; e < extra; e += blockDim.x) {
        int i = e < head ? e : tail + (e - head);
        float y = f(i, to_float(row[i]));
        if (WRITE) row[i] = to_floatX(y);
    }
}

// logits (N, V) bf16 in place raw -> cap tanh(raw / cap); losses (N) fp32 = logsumexp(capped) - capped[target],
// 0 where the target is IGNORE_INDEX (its row is capped all the same). grid N blocks of LOSS_THREADS
__global__ void __launch_bounds__(LOSS_THREADS) softcap_crossentropy_forward_kernel(float* losses, floatX* logits,
                                                                                     const int* targets, int V, float cap) {
    floatX* row = logits + (size_t)blockIdx.x * V;
    const int target = targets[blockIdx.x];
    const bool ignored = target == IGNORE_INDEX;
    float raw_target = 0.0f;
    if (threadIdx.x == 0 && !ignored) raw_target = to_float(row[target]);
    __syncthreads();  // read before any thread overwrites it with its capped value
    LossLse acc = {-INFINITY, 0.0f};
    loss_row_walk<true>(row, V, [&](int, float x) {
        float c = cap * tanhf(x / cap);
        loss_lse_add(acc, c);
        return c;
    });
    acc = loss_lse_block(acc);
    // the same expression as in the walk, so the target term is exactly the summed element
    if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.0f : logf(acc.s) + acc.m - cap * tanhf(raw_target / cap);
}

// logits (N, V) bf16 in place: capped -> (softmax - onehot(target)) scale[0] (1 - (capped / cap)^2), 0 on the
// rows whose target is IGNORE_INDEX. grid N blocks of LOSS_THREADS
__global__ void __launch_bounds__(LOSS_THREADS) softcap_crossentropy_backward_kernel(floatX* logits, const int* targets,
                                                                                      int V, float cap, const float* scale) {
    floatX* row = logits + (size_t)blockIdx.x * V;
    const int target = targets[blockIdx.x];
    if (target == IGNORE_INDEX) {
        loss_row_walk<true>(row, V, [](int, float) { return 0.0f; });
        return;
    }
    const float grad_scale = scale[0];
    LossLse acc = {-INFINITY, 0.0f};
    loss_row_walk<false>(row, V, [&](int, float x) {
        loss_lse_add(acc, x);
        return x;
    });
    acc = loss_lse_block(acc);  // ends with barriers: every read of pass 1 is done before pass 2 writes
    const float m = acc.m, inv_sum = 1.0f / acc.s;
    loss_row_walk<true>(row, V, [&](int i, float x) {
        float t = x / cap;
        float p = expf(x - m) * inv_sum;
        float indicator = i == target ? 1.0f : 0.0f;
        return (p - indicator) * grad_scale * (1.0f - t * t);
    });
}

// logits (n) bf16 in place raw -> cap tanh(raw / cap); 8 elements per thread, 16-byte accesses when aligned
static const int SOFTCAP_THREADS = 256;
__global__ void __launch_bounds__(SOFTCAP_THREADS) softcap_kernel(floatX* logits, size_t n, float cap, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    if (vec && i + 8 <= n) {
        uint4 packed = *reinterpret_cast<uint4*>(logits + i);
        floatX* x = reinterpret_cast<floatX*>(&packed);
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = to_floatX(cap * tanhf(to_float(x[j]) / cap));
        *reinterpret_cast<uint4*>(logits + i) = packed;
    } else {
        size_t end = i + 8 < n ? i + 8 : n;
        for (size_t j = i; j < end; j++) logits[j] = to_floatX(cap * tanhf(to_float(logits[j]) / cap));
    }
}

// scale[0] = grad_scale / max(1, number of targets (N) that are not IGNORE_INDEX); one block of LOSS_THREADS,
// the count exact in integers (__syncthreads_count per pass over blockDim targets)
__global__ void __launch_bounds__(LOSS_THREADS) loss_mean_scale_kernel(float* scale, const int* targets, size_t N, float grad_scale) {
    size_t count = 0;
    for (size_t start = 0; start < N; start += blockDim.x) {
        const size_t n = start + threadIdx.x;
        count += (size_t)__syncthreads_count(n < N && targets[n] != IGNORE_INDEX);
    }
    if (threadIdx.x == 0) scale[0] = grad_scale / (float)(count > 0 ? count : 1);
}

// out[0] += factor[0] * sum(losses[0 .. n)); one block of LOSS_THREADS: each thread sums a fixed strided
// subset in order, then block_sum's fixed tree. A micro-batch has at most a few hundred thousand losses.
__global__ void __launch_bounds__(LOSS_THREADS) loss_sum_accumulate_kernel(float* out, const float* factor, const float* losses, size_t n) {
    __shared__ float shared[32];
    float v = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) v += losses[i];
    v = block_sum(v, shared);
    if (threadIdx.x == 0) out[0] += factor[0] * v;
}

// losses (N) fp32; logits (N, V) bf16, raw -> capped in place; targets (N) in [0, V) or IGNORE_INDEX
static inline void softcap_crossentropy_forward_cuda(float* losses, floatX* logits, const int* targets, size_t N, int V,
                                                     float cap, cudaStream_t stream) {
    if (N == 0) return;
    if (V <= 0) fail("softcap_crossentropy_forward_cuda: V = %d", V);
    softcap_crossentropy_forward_kernel<<<(unsigned)N, LOSS_THREADS, 0, stream>>>(losses, logits, targets, V, cap);
    cudaCheckLaunch();
}

// logits (N, V) bf16, capped -> dL/d(raw logits) in place, for L = scale[0] * sum_n losses[n] (scale: device memory)
static inline void softcap_crossentropy_backward_cuda(floatX* logits, const int* targets, size_t N, int V, float cap,
                                                      const float* scale, cudaStream_t stream) {
    if (N == 0) return;
    if (V <= 0) fail("softcap_crossentropy_backward_cuda: V = %d", V);
    softcap_crossentropy_backward_kernel<<<(unsigned)N, LOSS_THREADS, 0, stream>>>(logits, targets, V, cap, scale);
    cudaCheckLaunch();
}

// scale[0] (device memory) = grad_scale / max(1, targets (N) not IGNORE_INDEX)
static inline void loss_mean_scale_cuda(float* scale, const int* targets, size_t N, float grad_scale, cudaStream_t stream) {
    loss_mean_scale_kernel<<<1, LOSS_THREADS, 0, stream>>>(scale, targets, N, grad_scale);
    cudaCheckLaunch();
}

// inference: logits (n) bf16 in place raw -> capped
static inline void softcap_cuda(floatX* logits, size_t n, float cap, cudaStream_t stream) {
    if (n == 0) return;
    softcap_kernel<<<ceil_div((long)ceil_div((long)n, 8), SOFTCAP_THREADS), SOFTCAP_THREADS, 0, stream>>>(logits, n, cap, (uintptr_t)logits % 16 == 0);
    cudaCheckLaunch();
}

// out[0] += factor[0] * sum(losses[0 .. n)), deterministic (see the kernel); factor in device memory
static inline void loss_sum_accumulate_cuda(float* out, const float* factor, const float* losses, size_t n, cudaStream_t stream) {
    loss_sum_accumulate_kernel<<<1, LOSS_THREADS, 0, stream>>>(out, factor, losses, n);
    cudaCheckLaunch();
}
#endif  // __CUDACC__
