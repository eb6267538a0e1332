// xsa.cuh: Exclusive Self-Attention (Zhai 2026; dev/docs/model.md#xsa). After attention and before
// c_proj, each query head's output y_i loses (a fraction alpha_h of) its component along the token's own
// value vector v_i (of the kv head that the query head reads, after the value-embedding mix):
//     z_i = y_i - alpha_h * (y_i . v_i) / (v_i . v_i + eps) * v_i
// alpha has one entry per query head: a fixed alpha (-x 0.5) fills them all; a learnable one (-x learn)
// is alpha_h = tanh(a_h) of a per-head logit a trained with the model (dev/docs/model.md#learnable-alpha).
// alpha = 0 gives z = y exactly (y - 0 * ...), so the op may run with alpha = 0 and stay bit-identical.
#pragma once

#include "llmc/common.h"

// Added to v.v so that an all-zero value vector gives z = y instead of 0/0 (modded-nanogpt clamps at 1e-8).
static const float XSA_EPS = 1e-8f;

// ----------------------------------------------------------------------------------------------------
// CPU backend (templated on the scalar type so the tests can check the backward by finite differences
// in double precision; the model uses float)

// y (B*T, H, D), v (B*T, Hkv, D; token n's row at v + n * v_stride), alpha (H) -> z (B*T, H, D)
template <typename real>
static inline void xsa_forward_cpu(real* z, const real* y, const real* v, size_t v_stride, size_t tokens, int H, int Hkv, int D,
                                   const real* alpha) {
    const int group = H / Hkv;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)tokens; n++)
        for (int h = 0; h < H; h++) {
            const real* yi = y + ((size_t)n * H + h) * D;
            const real* vi = v + (size_t)n * v_stride + (size_t)(h / group) * D;
            real* zi = z + ((size_t)n * H + h) * D;
            real coef = alpha[h] * (dot_lanes(yi, vi, D) / (dot_lanes(vi, vi, D) + (real)XSA_EPS));
            for (int d = 0; d < D; d++) zi[d] = yi[d] - coef * vi[d];
        }
}

// With g = dL/dz, n = v.v + eps, p = (y.v) / n, u = g.v, per (token, query head h):
//   dy = g - alpha_h (u / n) v                                (overwrites dy)
//   dv += -alpha_h ((u / n) y + p g - 2 p (u / n) v)          (accumulated over the query heads of a kv head)
//   dalpha = -p u                                             (this token's share of dL/dalpha_h; only if dalpha)
// dz, y, dy (B*T, H, D); v, dv (B*T, Hkv, D; token n's rows at + n * kv_stride); alpha (H); dalpha (B*T, H)
// or nullptr (fixed alpha). dy may alias dz (each row is read before it is written).
template <typename real>
static inline void xsa_backward_cpu(real* dy, real* dv, real* dalpha, const real* dz, const real* y, const real* v, size_t kv_stride,
                                    size_t tokens, int H, int Hkv, int D, const real* alpha) {
    const int group = H / Hkv;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)tokens; n++)
        for (int kvh = 0; kvh < Hkv; kvh++) {
            const real* vi = v + (size_t)n * kv_stride + (size_t)kvh * D;
            real* dvi = dv + (size_t)n * kv_stride + (size_t)kvh * D;
            real nrm = dot_lanes(vi, vi, D) + (real)XSA_EPS;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                const real* yi = y + ((size_t)n * H + h) * D;
                const real* gi = dz + ((size_t)n * H + h) * D;
                real* dyi = dy + ((size_t)n * H + h) * D;
                real u = dot_lanes(gi, vi, D), p = dot_lanes(yi, vi, D) / nrm, un = u / nrm;
                if (dalpha) dalpha[(size_t)n * H + h] = -p * u;
                for (int d = 0; d < D; d++) {
                    real g = gi[d];
                    dvi[d] += -alpha[h] * (un * yi[d] + p * g - 2 * p * un * vi[d]);
                    dyi[d] = g - alpha[h] * un * vi[d];
                }
            }
        }
}

// Learnable alpha (dev/docs/model.md#learnable-alpha): alpha_h = tanh(a_h), so a = 0 starts as the
// baseline and |alpha| stays below 1. alpha, logit (H).
template <typename real>
static inline void xsa_alpha_from_logit_cpu(real* alpha, const real* logit, int H) {
    for (int h = 0; h < H; h++) alpha[h] = std::tanh(logit[h]);
}

// d_logit[h] += (1 - alpha_h^2) * sum_n dalpha[n, h]: the per-token shares of xsa_backward summed over the
// tokens in order (in double), through tanh's derivative. d_logit, alpha (H); dalpha (tokens, H).
template <typename real>
static inline void xsa_alpha_backward_cpu(real* d_logit, const real* dalpha, const real* alpha, size_t tokens, int H) {
    for (int h = 0; h < H; h++) {
        double sum = 0.0;
        for (size_t n = 0; n < tokens; n++) sum += (double)dalpha[n * H + h];
        d_logit[h] += (real)((1.0 - (double)alpha[h] * alpha[h]) * sum);
    }
}

// ----------------------------------------------------------------------------------------------------
// Diagnostics (dev/docs/model.md#xsa-diagnostics): how much each head's output points along the
// token's own value, before and after XSA, and how much attention a token pays itself. Per token n (b, t):
//   out[n][0] = sum_h cos(y[n,h], v[n,h/g]),  out[n][1] = sum_h cos(z[n,h], v[n,h/g]),
//   out[n][2] = sum_h a_tt(h) = sum_h exp(q[n,h].k[n,h/g] / sqrt(D) - lse[b,h,t])   (the diagonal of softmax)
// with g = H / Hkv and cos(a, b) = a.b / (|a| |b|), 0 when |a| |b| = 0. The caller averages over heads and
// over tokens t >= 1 (at t = 0, y = v). y, z (B*T, H, D); q (B*T, H, D), k, v (B*T, Hkv, D), rows `at`
// apart, of the same layer, the forward's saved activations; lse (B, H, T); out (B*T, 3).

static inline float cosine_of(double ab, double aa, double bb) { return aa * bb > 0.0 ? (float)(ab / sqrt(aa * bb)) : 0.0f; }

static inline void xsa_diagnostics_cpu(float* out, const float* y, const float* z, const float* v, const float* q, const float* k,
                                       QKVStrides strides, const float* lse, int B, int T, int H, int Hkv, int D) {
    const int group = H / Hkv;
    const double scale = 1.0 / sqrt((double)D);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)B * T; n++) {
        const long b = n / T, t = n % T;
        double sums[3] = {0.0, 0.0, 0.0};
        for (int h = 0; h < H; h++) {
            const float* yr = y + ((size_t)n * H + h) * D;
            const float* zr = z + ((size_t)n * H + h) * D;
            const float* qr = q + (size_t)n * strides.q + (size_t)h * D;
            const float* vr = v + (size_t)n * strides.kv + (size_t)(h / group) * D;
            const float* kr = k + (size_t)n * strides.kv + (size_t)(h / group) * D;
            double yv = 0, yy = 0, zv = 0, zz = 0, vv = 0, qk = 0;
            for (int d = 0; d < D; d++) {
                yv += (double)yr[d] * vr[d], yy += (double)yr[d] * yr[d];
                zv += (double)zr[d] * vr[d], zz += (double)zr[d] * zr[d];
                vv += (double)vr[d] * vr[d], qk += (double)qr[d] * kr[d];
            }
            sums[0] += cosine_of(yv, yy, vv);
            sums[1] += cosine_of(zv, zz, vv);
            sums[2] += exp(qk * scale - lse[((size_t)b * H + h) * T + t]);
        }
        for (int c = 0; c < 3; c++) out[(size_t)n * 3 + c] = (float)sums[c];
    }
}

// The baseline cos(y, v) is read against: the mean cos(v_i, v_j) over pairs of different positions i != j
// of a row and kv head. With u_t = v_t / |v_t| (0 for a zero vector), sum_{i != j} u_i.u_j = |sum_t u_t|^2 -
// sum_t |u_t|^2, so one pass over the positions gives it: out (B, Hkv, D + 1) = (sum_t u_t, sum_t |u_t|^2)
// over the T positions of row b, kv head g. v (B*T, Hkv, D), token n's row at v + n * v_stride.
static inline void value_direction_sums_cpu(float* out, const float* v, size_t v_stride, int B, int T, int Hkv, int D) {
#pragma omp parallel for schedule(static)
    for (long bg = 0; bg < (long)B * Hkv; bg++) {
        const long b = bg / Hkv, g = bg % Hkv;
        std::vector<double> sum(D + 1, 0.0);
        for (int t = 0; t < T; t++) {
            const float* vr = v + ((size_t)b * T + t) * v_stride + (size_t)g * D;
            double vv = 0.0;
            for (int d = 0; d < D; d++) vv += (double)vr[d] * vr[d];
            if (vv == 0.0) continue;
            const double inv = 1.0 / sqrt(vv);
            for (int d = 0; d < D; d++) sum[d] += vr[d] * inv;
            sum[D] += 1.0;
        }
        for (int d = 0; d <= D; d++) out[(size_t)bg * (D + 1) + d] = (float)sum[d];
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend. The unfused op: one warp per row, each lane holding D/32 elements as bf16 pairs, the dot
// products in fp32 reduced by warp_sum (fixed butterfly order, so deterministic). attention.cuh fuses the
// forward into the attention epilogue and reuses xsa_backward_kernel as the backward's preprocessing.
#ifdef __CUDACC__
#include "llmc/cuda_common.cuh"

// a lane's e-th pair of a row: elements 2 lane + 64 e and the next one, e < D / 64 (a warp reads 128
// contiguous bytes per e)
__device__ __forceinline__ float2 xsa_load2(const floatX* row, int lane, int e) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + 2 * lane + 64 * e));
}
__device__ __forceinline__ void xsa_store2(floatX* row, int lane, int e, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(row + 2 * lane + 64 * e) = __floats2bfloat162_rn(a, b);
}

// z, y (tokens, H, D); v (tokens, Hkv, D), rows v_stride apart; alpha (H). One warp per (token, head);
// blockDim.x a multiple of 32.
static const int XSA_THREADS = 256;  // the block of every XSA kernel (one warp per row: 8 rows per block)

template <int D>
__global__ void __launch_bounds__(XSA_THREADS) xsa_forward_kernel(floatX* z, const floatX* y, const floatX* v, size_t v_stride, size_t tokens, int H, int Hkv,
                                   const float* alpha) {
    constexpr int E = D / 64;  // bf16 pairs per lane
    const int lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // = token * H + head
    if (row >= tokens * H) return;  // whole warps leave together
    const size_t n = row / H;
    const int h = (int)(row % H), kvh = h / (H / Hkv);
    const floatX* yr = y + row * D;
    const floatX* vr = v + n * v_stride + (size_t)kvh * D;
    float2 yy[E], vv[E];
    float s = 0.0f, nn = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) {
        yy[e] = xsa_load2(yr, lane, e);
        vv[e] = xsa_load2(vr, lane, e);
        s += yy[e].x * vv[e].x + yy[e].y * vv[e].y;
        nn += vv[e].x * vv[e].x + vv[e].y * vv[e].y;
    }
    s = warp_sum(s);
    nn = warp_sum(nn);
    const float coef = alpha[h] * (s / (nn + XSA_EPS));
#pragma unroll
    for (int e = 0; e < E; e++) xsa_store2(z + row * D, lane, e, yy[e].x - coef * vv[e].x, yy[e].y - coef * vv[e].y);
}

// One warp per (token, kv head): it owns that dv row and visits the query heads of the group in order, so
// the sum over the group needs no atomics. With g = dz, n = v.v + eps, p = (y.v) / n, u = g.v:
//   dy = g - alpha_h (u / n) v;   extra = -sum_h alpha_h ((u / n) y + p g - 2 p (u / n) v);   dalpha = -p u
// FUSED = false (the unfused op): dy (bf16) =, dv (bf16) += extra (added in fp32, rounded once).
// FUSED = true (attention_backward_xsa_cuda's preprocessing): dy =, dv_extra (fp32, (tokens, Hkv, D)) =
//   extra, and delta (B, H, T) = rowsum(dy * y) of the bf16-rounded dy the attention matmuls will read.
// dz, y, dy (tokens, H, D); v, dv (tokens, Hkv, D), rows v_stride, dv_stride apart; alpha (H); dalpha
// (tokens, H) fp32, written only when not null (learnable alpha); tokens = B T. dy may alias dz: each lane
// reads its elements of a row before it writes them, and no other lane touches them.
template <int D, bool FUSED>
__global__ void __launch_bounds__(XSA_THREADS) xsa_backward_kernel(floatX* dy, floatX* dv, size_t dv_stride, float* dv_extra, float* delta, float* dalpha,
                                    const floatX* dz, const floatX* y, const floatX* v, size_t v_stride, size_t tokens, int T,
                                    int H, int Hkv, const float* alpha) {
    constexpr int E = D / 64;
    const int lane = threadIdx.x % 32;
    const size_t w = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // = token * Hkv + kv head
    if (w >= tokens * Hkv) return;
    const size_t n = w / Hkv;
    const int kvh = (int)(w % Hkv), group = H / Hkv;
    const floatX* vr = v + n * v_stride + (size_t)kvh * D;
    float2 vv[E], ext[E];
    float nn = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) {
        vv[e] = xsa_load2(vr, lane, e);
        nn += vv[e].x * vv[e].x + vv[e].y * vv[e].y;
        ext[e] = make_float2(0.0f, 0.0f);
    }
    const float nrm = warp_sum(nn) + XSA_EPS;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        const size_t row = (n * H + h) * D;
        float2 yy[E], gg[E];
        float s = 0.0f, u = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            yy[e] = xsa_load2(y + row, lane, e);
            gg[e] = xsa_load2(dz + row, lane, e);
            s += yy[e].x * vv[e].x + yy[e].y * vv[e].y;
            u += gg[e].x * vv[e].x + gg[e].y * vv[e].y;
        }
        const float u_sum = warp_sum(u), p = warp_sum(s) / nrm, un = u_sum / nrm, a = alpha[h];
        if (dalpha && lane == 0) dalpha[n * H + h] = -p * u_sum;
        float dl = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const __nv_bfloat162 d2 = __floats2bfloat162_rn(gg[e].x - a * un * vv[e].x, gg[e].y - a * un * vv[e].y);
            *reinterpret_cast<__nv_bfloat162*>(dy + row + 2 * lane + 64 * e) = d2;
            const float2 df = __bfloat1622float2(d2);
            dl += df.x * yy[e].x + df.y * yy[e].y;
            ext[e].x += -a * (un * yy[e].x + p * gg[e].x - 2.0f * p * un * vv[e].x);
            ext[e].y += -a * (un * yy[e].y + p * gg[e].y - 2.0f * p * un * vv[e].y);
        }
        if (FUSED) {
            dl = warp_sum(dl);
            const size_t b = n / T, t = n % T;
            if (lane == 0) delta[(b * H + h) * T + t] = dl;
        }
    }
    floatX* dvr = FUSED ? nullptr : dv + n * dv_stride + (size_t)kvh * D;
#pragma unroll
    for (int e = 0; e < E; e++) {
        if (FUSED) {
            *reinterpret_cast<float2*>(dv_extra + w * D + 2 * lane + 64 * e) = ext[e];
        } else {
            const float2 old = xsa_load2(dvr, lane, e);
            xsa_store2(dvr, lane, e, old.x + ext[e].x, old.y + ext[e].y);
        }
    }
}

// The diagnostics (see the CPU twin): one block of XSA_DIAG_WARPS warps per token; warp w takes heads w,
// w + XSA_DIAG_WARPS, .. in order, lanes stride over D; warp 0 then adds the warps' sums in order.
// Deterministic, fp32. out (B*T, 3); q, k, v rows `at` apart.
constexpr int XSA_DIAG_WARPS = 8;
__global__ void __launch_bounds__(XSA_DIAG_WARPS * 32) xsa_diagnostics_kernel(float* out, const floatX* y, const floatX* z, const floatX* v,
                                                                             const floatX* q, const floatX* k, QKVStrides strides,
                                                                             const float* lse, int T, int H, int Hkv, int D) {
    __shared__ float partial[XSA_DIAG_WARPS][3];
    const size_t n = blockIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = H / Hkv;
    const size_t b = n / T, t = n % T;
    const float scale = 1.0f / sqrtf((float)D);
    float sums[3] = {0.0f, 0.0f, 0.0f};
    for (int h = warp; h < H; h += XSA_DIAG_WARPS) {
        const size_t row = (n * H + h) * D, q_row = n * strides.q + (size_t)h * D, kv_row = n * strides.kv + (size_t)(h / group) * D;
        float yv = 0.0f, yy = 0.0f, zv = 0.0f, zz = 0.0f, vv = 0.0f, qk = 0.0f;
        for (int d = lane; d < D; d += 32) {
            const float yd = to_float(y[row + d]), zd = to_float(z[row + d]), vd = to_float(v[kv_row + d]);
            yv += yd * vd, yy += yd * yd, zv += zd * vd, zz += zd * zd, vv += vd * vd;
            qk += to_float(q[q_row + d]) * to_float(k[kv_row + d]);
        }
        yv = warp_sum(yv), yy = warp_sum(yy), zv = warp_sum(zv), zz = warp_sum(zz), vv = warp_sum(vv), qk = warp_sum(qk);
        sums[0] += yy * vv > 0.0f ? yv / sqrtf(yy * vv) : 0.0f;
        sums[1] += zz * vv > 0.0f ? zv / sqrtf(zz * vv) : 0.0f;
        sums[2] += expf(qk * scale - lse[(b * H + h) * T + t]);
    }
    if (lane == 0)
        for (int c = 0; c < 3; c++) partial[warp][c] = sums[c];
    __syncthreads();
    if (threadIdx.x < 3) {
        float s = 0.0f;
        for (int w = 0; w < XSA_DIAG_WARPS; w++) s += partial[w][threadIdx.x];
        out[n * 3 + threadIdx.x] = s;
    }
}

static inline void xsa_diagnostics_cuda(float* out, const floatX* y, const floatX* z, const floatX* v, const floatX* q, const floatX* k,
                                        QKVStrides strides, const float* lse, int B, int T, int H, int Hkv, int D, cudaStream_t stream) {
    if ((long)B * T == 0) return;
    xsa_diagnostics_kernel<<<B * T, XSA_DIAG_WARPS * 32, 0, stream>>>(out, y, z, v, q, k, strides, lse, T, H, Hkv, D);
    cudaCheckLaunch();
}

// The value direction sums (see the CPU twin): one warp per (row, kv head), lanes holding D / 32 channels
// of the running sum, the positions visited in order (deterministic). out (B, Hkv, D + 1); v rows v_stride apart.
constexpr int VALUE_SUMS_MAX_D = 128;
__global__ void __launch_bounds__(256) value_direction_sums_kernel(float* out, const floatX* v, size_t v_stride, int B, int T, int Hkv,
                                                                   int D) {
    const size_t bg = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (bg >= (size_t)B * Hkv) return;  // whole warps leave together
    const int lane = threadIdx.x % 32;
    const size_t b = bg / Hkv, g = bg % Hkv;
    float sum[VALUE_SUMS_MAX_D / 32] = {0.0f, 0.0f, 0.0f, 0.0f}, count = 0.0f;
    for (int t = 0; t < T; t++) {
        const floatX* vr = v + (b * T + t) * v_stride + g * D;
        float x[VALUE_SUMS_MAX_D / 32], vv = 0.0f;
#pragma unroll
        for (int e = 0; e < VALUE_SUMS_MAX_D / 32; e++) {
            const int d = lane + 32 * e;
            x[e] = d < D ? to_float(vr[d]) : 0.0f;
            vv += x[e] * x[e];
        }
        vv = warp_sum(vv);
        if (vv == 0.0f) continue;
        const float inv = 1.0f / sqrtf(vv);
#pragma unroll
        for (int e = 0; e < VALUE_SUMS_MAX_D / 32; e++) sum[e] += x[e] * inv;
        count += 1.0f;
    }
    float* o = out + bg * (D + 1);
#pragma unroll
    for (int e = 0; e < VALUE_SUMS_MAX_D / 32; e++)
        if (lane + 32 * e < D) o[lane + 32 * e] = sum[e];
    if (lane == 0) o[D] = count;
}

static inline void value_direction_sums_cuda(float* out, const floatX* v, size_t v_stride, int B, int T, int Hkv, int D,
                                             cudaStream_t stream) {
    if (D > VALUE_SUMS_MAX_D) fail("value_direction_sums_cuda: head_dim %d > %d", D, VALUE_SUMS_MAX_D);
    const int grid = ceil_div((long)B * Hkv * 32, 256);
    if (grid == 0) return;
    value_direction_sums_kernel<<<grid, 256, 0, stream>>>(out, v, v_stride, B, T, Hkv, D);
    cudaCheckLaunch();
}

static inline void xsa_check_shape(int H, int Hkv, int D, const char* who) {
    if (D != 64 && D != 128) fail("%s: head_dim %d is not supported (64 or 128)", who, D);
    if (Hkv <= 0 || H % Hkv != 0) fail("%s: %d query heads are not a multiple of %d kv heads", who, H, Hkv);
}

// z, y (tokens, H, D); v (tokens, Hkv, D), rows v_stride apart; alpha (H, device) -> z = y - alpha proj_v(y)
static inline void xsa_forward_cuda(floatX* z, const floatX* y, const floatX* v, size_t v_stride, size_t tokens, int H, int Hkv, int D,
                                    const float* alpha, cudaStream_t stream) {
    xsa_check_shape(H, Hkv, D, "xsa_forward_cuda");
    const int block = XSA_THREADS, grid = ceil_div((long)(tokens * H), block / 32);
    if (grid == 0) return;
    if (D == 64) xsa_forward_kernel<64><<<grid, block, 0, stream>>>(z, y, v, v_stride, tokens, H, Hkv, alpha);
    else xsa_forward_kernel<128><<<grid, block, 0, stream>>>(z, y, v, v_stride, tokens, H, Hkv, alpha);
    cudaCheckLaunch();
}

// dz, y, dy (tokens, H, D); v, dv (tokens, Hkv, D), rows v_stride, dv_stride apart; alpha (H); dalpha
// (tokens, H) or nullptr: dy = (may alias dz), dv += the XSA term, dalpha = the per-token shares of dL/dalpha
static inline void xsa_backward_cuda(floatX* dy, floatX* dv, size_t dv_stride, float* dalpha, const floatX* dz, const floatX* y,
                                     const floatX* v, size_t v_stride, size_t tokens, int H, int Hkv, int D, const float* alpha,
                                     cudaStream_t stream) {
    xsa_check_shape(H, Hkv, D, "xsa_backward_cuda");
    const int block = XSA_THREADS, grid = ceil_div((long)(tokens * Hkv), block / 32);
    if (grid == 0) return;
    // T only places delta, which the unfused op does not write: pass 1
    if (D == 64)
        xsa_backward_kernel<64, false><<<grid, block, 0, stream>>>(dy, dv, dv_stride, nullptr, nullptr, dalpha, dz, y, v, v_stride, tokens, 1, H,
                                                                   Hkv, alpha);
    else
        xsa_backward_kernel<128, false><<<grid, block, 0, stream>>>(dy, dv, dv_stride, nullptr, nullptr, dalpha, dz, y, v, v_stride, tokens, 1,
                                                                    H, Hkv, alpha);
    cudaCheckLaunch();
}

// Learnable alpha (see the CPU twins). alpha, logit (H), one thread per head.
__global__ void __launch_bounds__(XSA_THREADS) xsa_alpha_from_logit_kernel(float* alpha, const float* logit, int H) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) alpha[h] = tanhf(logit[h]);
}

static inline void xsa_alpha_from_logit_cuda(float* alpha, const float* logit, int H, cudaStream_t stream) {
    xsa_alpha_from_logit_kernel<<<ceil_div(H, XSA_THREADS), XSA_THREADS, 0, stream>>>(alpha, logit, H);
    cudaCheckLaunch();
}

// d_logit[h] += (1 - alpha_h^2) sum_n dalpha[n, h]: one block per head; thread i sums tokens i, i + 256, ..
// in order, then block_sum (fixed order): deterministic. d_logit, alpha (H); dalpha (tokens, H).
constexpr int XSA_ALPHA_THREADS = 256;
__global__ void __launch_bounds__(XSA_ALPHA_THREADS) xsa_alpha_backward_kernel(float* d_logit, const float* dalpha, const float* alpha,
                                                                               size_t tokens, int H) {
    __shared__ float shared[32];
    const int h = blockIdx.x;
    float sum = 0.0f;
    for (size_t n = threadIdx.x; n < tokens; n += XSA_ALPHA_THREADS) sum += dalpha[n * H + h];
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) d_logit[h] += (1.0f - alpha[h] * alpha[h]) * sum;
}

static inline void xsa_alpha_backward_cuda(float* d_logit, const float* dalpha, const float* alpha, size_t tokens, int H, cudaStream_t stream) {
    if (H == 0) return;
    xsa_alpha_backward_kernel<<<H, XSA_ALPHA_THREADS, 0, stream>>>(d_logit, dalpha, alpha, tokens, H);
    cudaCheckLaunch();
}

#endif  // __CUDACC__
