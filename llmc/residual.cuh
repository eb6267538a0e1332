// residual.cuh: the elementwise ops on the residual stream: the per-layer lambda mix with the x0 skip
// (x = resid_lambda * x + x0_lambda * x0), residual adds, and the backout subtraction.
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend

// Scalar parameters (the lambdas) are passed by pointer, as the CUDA twins need them (device memory).

// out (n) = a[0] * x + b[0] * x0
static inline void lambda_mix_forward_cpu(float* out, const float* x, const float* x0, const float* a, const float* b, size_t n) {
    const float sa = a[0], sb = b[0];
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) out[i] = sa * x[i] + sb * x0[i];
}

// out[0] += factor * (x . y) over n elements (deterministic, see dot_deterministic)
static inline void dot_accumulate_cpu(float* out, float factor, const float* x, const float* y, size_t n) {
    out[0] += factor * (float)dot_deterministic(x, y, n);
}

// Backward of out = a * x + b * x0 given dout (n): da += dout . x, db += dout . x0, dx0 (n) += b * dout,
// and dout is rescaled in place into dx = a * dout (so the caller's residual gradient flows on).
static inline void lambda_mix_backward_cpu(float* dout, float* dx0, float* da, float* db, const float* x, const float* x0,
                                           const float* a, const float* b, size_t n) {
    dot_accumulate_cpu(da, 1.0f, dout, x, n);
    dot_accumulate_cpu(db, 1.0f, dout, x0, n);
    const float sa = a[0], sb = b[0];
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        dx0[i] += sb * dout[i];
        dout[i] *= sa;
    }
}

// y (n) += x
static inline void add_inplace_cpu(float* y, const float* x, size_t n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) y[i] += x[i];
}

// y (n) += factor * scalar[0] * x   (the backout: factor -1, scalar = backout_lambda)
static inline void scaled_add_cpu(float* y, const float* scalar, float factor, const float* x, size_t n) {
    const float s = factor * scalar[0];
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) y[i] += s * x[i];
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend. Elementwise kernels: one thread per 8 elements, 16-byte accesses when every pointer is
// 16-byte aligned, a scalar tail for n % 8 (and a scalar path for unaligned buffers). Scalar parameters
// (the lambdas) are read from device memory, so a captured graph sees their current values.
//
// Dot products are two-pass and deterministic: a fixed grid of DOT_PARTIALS blocks, each summing a fixed
// strided set of elements (fp32 per thread, then block_sum) into scratch[block]; then one block sums the
// DOT_PARTIALS partials in a fixed tree and adds factor * sum into out[0]. The grid does not depend on the
// device, so the bits do not either.
#ifdef __CUDACC__
#include "cuda_common.cuh"

constexpr int DOT_PARTIALS = 1024;  // blocks of the first pass = floats of scratch per dot product
constexpr int DOT_THREADS = 256;    // threads per first-pass block; 8 elements each per grid stride
// scratch each op needs, in floats
constexpr size_t DOT_SCRATCH_FLOATS = DOT_PARTIALS;              // dot_accumulate_cuda
constexpr size_t LAMBDA_MIX_SCRATCH_FLOATS = 2 * DOT_PARTIALS;   // lambda_mix_backward_cuda (two dots)

// out (n) = a[0] x + b[0] x0; out may alias x or x0 (elementwise)
template <bool VEC>
__global__ void __launch_bounds__(256) lambda_mix_forward_kernel(floatX* out, const floatX* x, const floatX* x0, const float* a,
                                                                 const float* b, size_t n) {
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    const float fa = a[0], fb = b[0];
    if (VEC && i0 + 8 <= n) {
        float xv[8], x0v[8];
        load8(xv, x + i0);
        load8(x0v, x0 + i0);
#pragma unroll
        for (int k = 0; k < 8; k++) xv[k] = fa * xv[k] + fb * x0v[k];
        store8(out + i0, xv);
    } else {
        const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
        for (size_t i = i0; i < i1; i++) out[i] = to_floatX(fa * to_float(x[i]) + fb * to_float(x0[i]));
    }
}

// First pass of a dot product: partials[blockIdx.x] = sum over this block's strided elements of x * y.
// T: floatX (activations) or float (the fp32 gradients and parameters, for their norms).
template <bool VEC, typename T>
__global__ void __launch_bounds__(DOT_THREADS) dot_partial_kernel(float* partials, const T* x, const T* y, size_t n) {
    __shared__ float shared[32];
    float acc = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i0 < n; i0 += stride) {
        if (VEC && i0 + 8 <= n) {
            float xv[8], yv[8];
            load8(xv, x + i0);
            load8(yv, y + i0);
#pragma unroll
            for (int k = 0; k < 8; k++) acc += xv[k] * yv[k];
        } else {
            const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
            for (size_t i = i0; i < i1; i++) acc += to_float(x[i]) * to_float(y[i]);
        }
    }
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Second pass: block b (of 1 or 2) adds factor * (sum of partials[b * DOT_PARTIALS ..][0 .. DOT_PARTIALS))
// into out_b[0]. One block of DOT_PARTIALS threads; block_sum's order is fixed.
__global__ void __launch_bounds__(DOT_PARTIALS) dot_finish_kernel(float* out0, float* out1, float factor, const float* partials) {
    __shared__ float shared[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < DOT_PARTIALS; i += blockDim.x) v += partials[(size_t)blockIdx.x * DOT_PARTIALS + i];
    v = block_sum(v, shared);
    if (threadIdx.x == 0) {
        float* out = blockIdx.x == 0 ? out0 : out1;
        out[0] += factor * v;
    }
}

// Backward of out = a x + b x0, fused in one pass over dout, x, x0, dx0: dx0 += b dout, dout *= a, and
// the partials of dout.x (scratch[0, DOT_PARTIALS)) and dout.x0 (scratch[DOT_PARTIALS, 2 DOT_PARTIALS))
// from the incoming dout.
template <bool VEC>
__global__ void __launch_bounds__(DOT_THREADS) lambda_mix_backward_kernel(floatX* dout, floatX* dx0, float* partials,
                                                                          const floatX* x, const floatX* x0, const float* a,
                                                                          const float* b, size_t n) {
    __shared__ float shared[32];
    const float fa = a[0], fb = b[0];
    float acc_a = 0.0f, acc_b = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i0 < n; i0 += stride) {
        if (VEC && i0 + 8 <= n) {
            float g[8], xv[8], x0v[8], d0[8];
            load8(g, dout + i0);
            load8(xv, x + i0);
            load8(x0v, x0 + i0);
            load8(d0, dx0 + i0);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                acc_a += g[k] * xv[k];
                acc_b += g[k] * x0v[k];
                d0[k] += fb * g[k];
                g[k] *= fa;
            }
            store8(dx0 + i0, d0);
            store8(dout + i0, g);
        } else {
            const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
            for (size_t i = i0; i < i1; i++) {
                const float g = to_float(dout[i]);
                acc_a += g * to_float(x[i]);
                acc_b += g * to_float(x0[i]);
                dx0[i] = to_floatX(to_float(dx0[i]) + fb * g);
                dout[i] = to_floatX(g * fa);
            }
        }
    }
    acc_a = block_sum(acc_a, shared);
    acc_b = block_sum(acc_b, shared);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = acc_a;
        partials[DOT_PARTIALS + blockIdx.x] = acc_b;
    }
}

// y (n) += x
template <bool VEC>
__global__ void __launch_bounds__(256) add_inplace_kernel(floatX* y, const floatX* x, size_t n) {
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    if (VEC && i0 + 8 <= n) {
        float yv[8], xv[8];
        load8(yv, y + i0);
        load8(xv, x + i0);
#pragma unroll
        for (int k = 0; k < 8; k++) yv[k] += xv[k];
        store8(y + i0, yv);
    } else {
        const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
        for (size_t i = i0; i < i1; i++) y[i] = to_floatX(to_float(y[i]) + to_float(x[i]));
    }
}

// y (rows, cols; rows y_stride apart) += x (rows, cols), one thread per element: strided rows of a fused
// buffer (the unfused XSA backward's dv term into dv's rows of the q|k|v gradient), off the hot path
__global__ void __launch_bounds__(256) add_rows_inplace_kernel(floatX* y, size_t y_stride, const floatX* x, size_t rows, int cols) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    floatX* yi = y + (i / cols) * y_stride + i % cols;
    *yi = to_floatX(to_float(*yi) + to_float(x[i]));
}

// y (n) += factor * scalar[0] * x
template <bool VEC>
__global__ void __launch_bounds__(256) scaled_add_kernel(floatX* y, const float* scalar, float factor, const floatX* x, size_t n) {
    const size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= n) return;
    const float a = factor * scalar[0];
    if (VEC && i0 + 8 <= n) {
        float yv[8], xv[8];
        load8(yv, y + i0);
        load8(xv, x + i0);
#pragma unroll
        for (int k = 0; k < 8; k++) yv[k] += a * xv[k];
        store8(y + i0, yv);
    } else {
        const size_t i1 = i0 + 8 < n ? i0 + 8 : n;
        for (size_t i = i0; i < i1; i++) y[i] = to_floatX(to_float(y[i]) + a * to_float(x[i]));
    }
}

static inline int residual_grid(size_t n) { return ceil_div((long)((n + 7) / 8), 256); }

// out (n) = a[0] x + b[0] x0
static inline void lambda_mix_forward_cuda(floatX* out, const floatX* x, const floatX* x0, const float* a, const float* b,
                                           size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (aligned16(out) && aligned16(x) && aligned16(x0))
        lambda_mix_forward_kernel<true><<<residual_grid(n), 256, 0, stream>>>(out, x, x0, a, b, n);
    else lambda_mix_forward_kernel<false><<<residual_grid(n), 256, 0, stream>>>(out, x, x0, a, b, n);
    cudaCheckLaunch();
}

// da[0] += dout.x, db[0] += dout.x0, dx0 (n) += b[0] dout, dout (n) *= a[0]; scratch: LAMBDA_MIX_SCRATCH_FLOATS
static inline void lambda_mix_backward_cuda(floatX* dout, floatX* dx0, float* da, float* db, const floatX* x, const floatX* x0,
                                            const float* a, const float* b, size_t n, float* scratch, cudaStream_t stream) {
    if (aligned16(dout) && aligned16(dx0) && aligned16(x) && aligned16(x0))
        lambda_mix_backward_kernel<true><<<DOT_PARTIALS, DOT_THREADS, 0, stream>>>(dout, dx0, scratch, x, x0, a, b, n);
    else lambda_mix_backward_kernel<false><<<DOT_PARTIALS, DOT_THREADS, 0, stream>>>(dout, dx0, scratch, x, x0, a, b, n);
    cudaCheckLaunch();
    dot_finish_kernel<<<2, DOT_PARTIALS, 0, stream>>>(da, db, 1.0f, scratch);
    cudaCheckLaunch();
}

// out[0] += factor * sum(x (n) * y (n)), x and y floatX or float; scratch: DOT_SCRATCH_FLOATS
template <typename T>
static inline void dot_accumulate_cuda(float* out, float factor, const T* x, const T* y, size_t n, float* scratch, cudaStream_t stream) {
    if (aligned16(x) && aligned16(y)) dot_partial_kernel<true, T><<<DOT_PARTIALS, DOT_THREADS, 0, stream>>>(scratch, x, y, n);
    else dot_partial_kernel<false, T><<<DOT_PARTIALS, DOT_THREADS, 0, stream>>>(scratch, x, y, n);
    cudaCheckLaunch();
    dot_finish_kernel<<<1, DOT_PARTIALS, 0, stream>>>(out, out, factor, scratch);
    cudaCheckLaunch();
}

// y (n) += x
static inline void add_inplace_cuda(floatX* y, const floatX* x, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (aligned16(y) && aligned16(x)) add_inplace_kernel<true><<<residual_grid(n), 256, 0, stream>>>(y, x, n);
    else add_inplace_kernel<false><<<residual_grid(n), 256, 0, stream>>>(y, x, n);
    cudaCheckLaunch();
}

// y (rows, cols; rows y_stride apart) += x (rows, cols)
static inline void add_rows_inplace_cuda(floatX* y, size_t y_stride, const floatX* x, size_t rows, int cols, cudaStream_t stream) {
    if (rows * cols == 0) return;
    add_rows_inplace_kernel<<<ceil_div((long)(rows * cols), 256), 256, 0, stream>>>(y, y_stride, x, rows, cols);
    cudaCheckLaunch();
}

// y (n) += factor * scalar[0] * x   (the CPU twin is scaled_add_cpu)
static inline void scaled_add_cuda(floatX* y, const float* scalar, float factor, const floatX* x, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (aligned16(y) && aligned16(x)) scaled_add_kernel<true><<<residual_grid(n), 256, 0, stream>>>(y, scalar, factor, x, n);
    else scaled_add_kernel<false><<<residual_grid(n), 256, 0, stream>>>(y, scalar, factor, x, n);
    cudaCheckLaunch();
}

#endif  // __CUDACC__
