// norm.cuh: RMSNorm without a learnable weight, as nanochat uses everywhere (token embedding, block
// inputs, QK-norm per head, final norm): out = scale * x / sqrt(mean(x^2) + eps), eps = fp32 epsilon.
#pragma once

#include "common.h"

// torch.finfo(torch.float32).eps: the eps F.rms_norm uses when none is given (dev/docs/model.md#rmsnorm)
static const float RMSNORM_EPS = 1.1920929e-07f;

// ----------------------------------------------------------------------------------------------------
// CPU backend

// out (rows, C) = scale * inp * rstd; rstd (rows) = 1 / sqrt(mean(inp^2) + eps), kept for the backward.
// `rows` is B*T for the residual stream, or B*T*heads with C = head_dim for QK-norm.
// One row: y (C) = scale * x * rstd (y may be x); returns rstd
static inline float rmsnorm_row_forward_cpu(float* y, const float* x, int C, float scale) {
    const float s = 1.0f / sqrtf(dot_lanes(x, x, C) / C + RMSNORM_EPS);
    for (int i = 0; i < C; i++) y[i] = scale * (x[i] * s);
    return s;
}

static inline void rmsnorm_forward_cpu(float* out, float* rstd, const float* inp, size_t rows, int C, float scale) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++) rstd[r] = rmsnorm_row_forward_cpu(out + (size_t)r * C, inp + (size_t)r * C, C, scale);
}

// dinp (rows, C) = or += scale * rstd * (dout - xhat * mean(dout * xhat)) (dinp_write), with xhat =
// out / scale the unit-RMS input. Using the saved output instead of the input keeps one buffer fewer
// alive between the passes.
// One row: dx (C) = or += (accumulate) the above, given g = dout, y = out (C) and the row's rstd; dx may be g
// (each element is read before it is written)
static inline void rmsnorm_row_backward_cpu(float* dx, const float* g, const float* y, float rstd, int C, float scale, bool accumulate) {
    const float inv_scale = 1.0f / scale;
    float dot = 0.0f;  // sum_i g_i * xhat_i
    for (int i = 0; i < C; i++) dot += g[i] * (y[i] * inv_scale);
    const float mean_dot = dot / C, s = scale * rstd;
    for (int i = 0; i < C; i++) dx[i] = (accumulate ? dx[i] : 0.0f) + s * (g[i] - (y[i] * inv_scale) * mean_dot);
}

static inline void rmsnorm_backward_cpu(float* dinp, const float* dout, const float* out, const float* rstd,
                                        size_t rows, int C, float scale, GradWrite dinp_write) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)rows; r++)
        rmsnorm_row_backward_cpu(dinp + (size_t)r * C, dout + (size_t)r * C, out + (size_t)r * C, rstd[r], C, scale,
                                 dinp_write == GRAD_ACCUMULATE);
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend (bf16 activations, fp32 statistics). One group of G lanes owns a row: G = 8 or 16 for
// QK-norm rows (head_dim 64 / 128 = 8 / 16 vectors of 8 bf16, so a warp normalises 4 / 2 rows at once
// and no lane idles), G = 32 (one warp) for the residual stream's C = 768..2048, each lane keeping its
// up to MAXV 16-byte vectors in registers between the two passes (the row is read from memory once).
// Other shapes (C % 8 != 0, C > 2048, unaligned pointers) take a scalar kernel, one warp per row, that
// re-reads the row for its second pass.
#ifdef __CUDACC__
#include "cuda_common.cuh"

// out (rows, C) = scale * inp * rstd; rstd (rows) fp32. out may == inp: every element is read (pass 1)
// before it is written (pass 2) by the same lane.
template <int G, int MAXV>
__global__ void __launch_bounds__(256) rmsnorm_forward_vec_kernel(floatX* out, float* rstd, const floatX* inp,
                                                                  size_t rows, int C, float scale) {
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    if (row >= rows) return;  // the whole group leaves together
    const int lane = threadIdx.x % G, nvec = C / 8;
    const floatX* x = inp + row * C;
    int4 cache[MAXV];
    float sumsq = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
        const int v = lane + k * G;
        cache[k] = make_int4(0, 0, 0, 0);
        if (v < nvec) {
            cache[k] = ld16(x + 8 * v);
            float f[8];
            unpack8(f, cache[k]);
#pragma unroll
            for (int i = 0; i < 8; i++) sumsq += f[i] * f[i];
        }
    }
    sumsq = group_sum<G>(sumsq);
    const float s = 1.0f / sqrtf(sumsq / C + RMSNORM_EPS);
    floatX* y = out + row * C;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
        const int v = lane + k * G;
        if (v < nvec) {
            float f[8];
            unpack8(f, cache[k]);
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = scale * (f[i] * s);
            store8(y + 8 * v, f);
        }
    }
    if (lane == 0) rstd[row] = s;
}

// the same for any C and alignment: one warp per row, scalar accesses, the row re-read in pass 2
__global__ void __launch_bounds__(256) rmsnorm_forward_scalar_kernel(floatX* out, float* rstd, const floatX* inp,
                                                                     size_t rows, int C, float scale) {
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= rows) return;
    const int lane = threadIdx.x % 32;
    const floatX* x = inp + row * C;
    float sumsq = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float f = to_float(x[i]);
        sumsq += f * f;
    }
    sumsq = warp_sum(sumsq);
    const float s = 1.0f / sqrtf(sumsq / C + RMSNORM_EPS);
    floatX* y = out + row * C;
    for (int i = lane; i < C; i += 32) y[i] = to_floatX(scale * (to_float(x[i]) * s));
    if (lane == 0) rstd[row] = s;
}

// dinp (rows, C) = or += (ACCUMULATE) scale * rstd * (dout - xhat * mean(dout * xhat)), xhat = out / scale;
// dout, out (rows, C) cached in registers between the dot pass and the update pass.
template <int G, int MAXV, bool ACCUMULATE>
__global__ void __launch_bounds__(256) rmsnorm_backward_vec_kernel(floatX* dinp, const floatX* dout, const floatX* out,
                                                                   const float* rstd, size_t rows, int C, float scale) {
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    if (row >= rows) return;
    const int lane = threadIdx.x % G, nvec = C / 8;
    const floatX* g = dout + row * C;
    const floatX* y = out + row * C;
    const float inv_scale = 1.0f / scale;
    int4 gc[MAXV], yc[MAXV];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
        const int v = lane + k * G;
        gc[k] = make_int4(0, 0, 0, 0);
        yc[k] = make_int4(0, 0, 0, 0);
        if (v < nvec) {
            gc[k] = ld16(g + 8 * v);
            yc[k] = ld16(y + 8 * v);
            float gf[8], yf[8];
            unpack8(gf, gc[k]);
            unpack8(yf, yc[k]);
#pragma unroll
            for (int i = 0; i < 8; i++) dot += gf[i] * (yf[i] * inv_scale);
        }
    }
    dot = group_sum<G>(dot);
    const float mean_dot = dot / C, s = scale * rstd[row];
    floatX* dx = dinp + row * C;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
        const int v = lane + k * G;
        if (v < nvec) {
            float gf[8], yf[8], d[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            unpack8(gf, gc[k]);
            unpack8(yf, yc[k]);
            if (ACCUMULATE) load8(d, dx + 8 * v);
#pragma unroll
            for (int i = 0; i < 8; i++) d[i] += s * (gf[i] - (yf[i] * inv_scale) * mean_dot);
            store8(dx + 8 * v, d);
        }
    }
}

__global__ void __launch_bounds__(256) rmsnorm_backward_scalar_kernel(floatX* dinp, const floatX* dout, const floatX* out,
                                                                      const float* rstd, size_t rows, int C, float scale,
                                                                      bool accumulate) {
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= rows) return;
    const int lane = threadIdx.x % 32;
    const floatX* g = dout + row * C;
    const floatX* y = out + row * C;
    const float inv_scale = 1.0f / scale;
    float dot = 0.0f;
    for (int i = lane; i < C; i += 32) dot += to_float(g[i]) * (to_float(y[i]) * inv_scale);
    dot = warp_sum(dot);
    const float mean_dot = dot / C, s = scale * rstd[row];
    floatX* dx = dinp + row * C;
    for (int i = lane; i < C; i += 32)
        dx[i] = to_floatX((accumulate ? to_float(dx[i]) : 0.0f) + s * (to_float(g[i]) - (to_float(y[i]) * inv_scale) * mean_dot));
}

// Launch helpers: 256 threads = 256 / G rows per block.
template <int G, int MAXV>
static inline void rmsnorm_forward_launch(floatX* out, float* rstd, const floatX* inp, size_t rows, int C, float scale,
                                          cudaStream_t stream) {
    rmsnorm_forward_vec_kernel<G, MAXV><<<ceil_div((long)rows * G, 256), 256, 0, stream>>>(out, rstd, inp, rows, C, scale);
}
template <int G, int MAXV>
static inline void rmsnorm_backward_launch(floatX* dinp, const floatX* dout, const floatX* out, const float* rstd,
                                           size_t rows, int C, float scale, GradWrite dinp_write, cudaStream_t stream) {
    const int grid = ceil_div((long)rows * G, 256);
    if (dinp_write == GRAD_ACCUMULATE)
        rmsnorm_backward_vec_kernel<G, MAXV, true><<<grid, 256, 0, stream>>>(dinp, dout, out, rstd, rows, C, scale);
    else rmsnorm_backward_vec_kernel<G, MAXV, false><<<grid, 256, 0, stream>>>(dinp, dout, out, rstd, rows, C, scale);
}

// the vector kernels need C % 8 == 0, 16-byte aligned rows and C <= 2048 (8 vectors per lane)
static inline bool rmsnorm_vec_ok(int C, const void* a, const void* b, const void* c) {
    return C % 8 == 0 && C / 8 <= 256 && aligned16(a) && aligned16(b) && aligned16(c);
}

// out (rows, C), rstd (rows) = rmsnorm(inp (rows, C)) * scale; out may == inp
static inline void rmsnorm_forward_cuda(floatX* out, float* rstd, const floatX* inp, size_t rows, int C, float scale,
                                        cudaStream_t stream) {
    if (rows == 0) return;
    const int nvec = C / 8;
    if (!rmsnorm_vec_ok(C, out, inp, inp)) {
        rmsnorm_forward_scalar_kernel<<<ceil_div((long)rows * 32, 256), 256, 0, stream>>>(out, rstd, inp, rows, C, scale);
    } else if (nvec <= 8) {
        rmsnorm_forward_launch<8, 1>(out, rstd, inp, rows, C, scale, stream);   // C <= 64 (QK-norm, head_dim 64)
    } else if (nvec <= 16) {
        rmsnorm_forward_launch<16, 1>(out, rstd, inp, rows, C, scale, stream);  // C <= 128 (head_dim 128)
    } else if (nvec <= 32) {
        rmsnorm_forward_launch<32, 1>(out, rstd, inp, rows, C, scale, stream);
    } else if (nvec <= 64) {
        rmsnorm_forward_launch<32, 2>(out, rstd, inp, rows, C, scale, stream);
    } else if (nvec <= 96) {
        rmsnorm_forward_launch<32, 3>(out, rstd, inp, rows, C, scale, stream);  // C = 768
    } else if (nvec <= 128) {
        rmsnorm_forward_launch<32, 4>(out, rstd, inp, rows, C, scale, stream);  // C = 1024
    } else if (nvec <= 192) {
        rmsnorm_forward_launch<32, 6>(out, rstd, inp, rows, C, scale, stream);  // C = 1536
    } else {
        rmsnorm_forward_launch<32, 8>(out, rstd, inp, rows, C, scale, stream);  // C <= 2048
    }
    cudaCheckLaunch();
}

// dinp (rows, C) = or += (dinp_write) the gradient through the norm, given dout, out (rows, C) and rstd (rows)
// of the forward
static inline void rmsnorm_backward_cuda(floatX* dinp, const floatX* dout, const floatX* out, const float* rstd,
                                         size_t rows, int C, float scale, GradWrite dinp_write,
                                         cudaStream_t stream) {
    if (rows == 0) return;
    const int nvec = C / 8;
    if (!rmsnorm_vec_ok(C, dinp, dout, out)) {
        const bool accumulate = dinp_write == GRAD_ACCUMULATE;
        rmsnorm_backward_scalar_kernel<<<ceil_div((long)rows * 32, 256), 256, 0, stream>>>(dinp, dout, out, rstd, rows, C, scale, accumulate);
    } else if (nvec <= 8) {
        rmsnorm_backward_launch<8, 1>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else if (nvec <= 16) {
        rmsnorm_backward_launch<16, 1>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else if (nvec <= 32) {
        rmsnorm_backward_launch<32, 1>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else if (nvec <= 64) {
        rmsnorm_backward_launch<32, 2>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else if (nvec <= 96) {
        rmsnorm_backward_launch<32, 3>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else if (nvec <= 128) {
        rmsnorm_backward_launch<32, 4>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else if (nvec <= 192) {
        rmsnorm_backward_launch<32, 6>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    } else {
        rmsnorm_backward_launch<32, 8>(dinp, dout, out, rstd, rows, C, scale, dinp_write, stream);
    }
    cudaCheckLaunch();
}

#endif  // __CUDACC__
