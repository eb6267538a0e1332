// attention.cuh: causal self-attention with a sliding window and grouped-query heads, flash-style:
// the forward keeps only the log-sum-exp of each softmax row, and the backward recomputes the
// probabilities from it, so no (T, T) matrix is ever stored.
//
// Query token i of query head h attends to keys j with i - window <= j <= i (window + 1 keys, as FA3's
// window_size=(window, 0)), reading kv head h / (H / Hkv). Softmax scale 1/sqrt(D).
#pragma once

#include "common.h"
#include "matmul.cuh"  // gemm_cpu: the blocked CPU attention's tile products

// ----------------------------------------------------------------------------------------------------
// CPU backend. Read first: attention_forward_naive_cpu and attention_backward_naive_cpu, one query row at a
// time (templated on the scalar type so that the tests check the backward by finite differences in double
// precision); then attention_forward_cpu and attention_backward_cpu, the blocked float versions the model
// runs, which do the same arithmetic a tile of query rows at a time with gemm_cpu and are checked against
// the naive ones (test_attention_blocked_vs_naive).

// One query row: yi (D) = softmax(scale qi . k_j) weighted sum of v_j over keys j0..i, where key j is
// at kb + j * stride (and value j at vb + j * stride); scores (>= i + 1) is scratch. Returns the
// softmax's log-sum-exp. Shared by the training forward and generation's forward over the KV cache.
template <typename real>
static inline real attention_row_cpu(real* yi, const real* qi, const real* kb, const real* vb, size_t stride, int j0, int i, int D,
                                     real scale, real* scores) {
    real row_max = -INFINITY;
    for (int j = j0; j <= i; j++) {
        real s = dot_lanes(qi, kb + (size_t)j * stride, D) * scale;
        scores[j] = s;
        row_max = s > row_max ? s : row_max;
    }
    real sum = 0;
    for (int d = 0; d < D; d++) yi[d] = 0;
    for (int j = j0; j <= i; j++) {
        real p = std::exp(scores[j] - row_max);
        sum += p;
        const real* vj = vb + (size_t)j * stride;
        for (int d = 0; d < D; d++) yi[d] += p * vj[d];
    }
    real inv_sum = 1 / sum;
    for (int d = 0; d < D; d++) yi[d] *= inv_sum;
    return row_max + std::log(sum);
}

// q (B, T, H, D), k, v (B, T, Hkv, D) -> y (B, T, H, D), lse (B, H, T)
template <typename real>
static inline void attention_forward_naive_cpu(real* y, real* lse, const real* q, const real* k, const real* v,
                                         int B, int T, int H, int Hkv, int D, int window) {
    const real scale = (real)1 / std::sqrt((real)D);
    const int group = H / Hkv;
    const size_t stride = (size_t)Hkv * D;  // from one position's k (v) to the next
#pragma omp parallel
    {
        std::vector<real> scores(T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const size_t kv_base = (size_t)b * T * stride + (size_t)(h / group) * D;
                for (int i = 0; i < T; i++) {
                    const size_t row = ((size_t)b * T + i) * H + h;
                    lse[((size_t)b * H + h) * T + i] = attention_row_cpu(y + row * D, q + row * D, k + kv_base, v + kv_base, stride,
                                                                         std::max(i - window, 0), i, D, scale, scores.data());
                }
            }
    }
}

// Generation, one new token per row: q (B, H, D; row b at q + b * q_stride) of the tokens at positions
// pos[b] against the KV cache k_cache, v_cache (B, S, Hkv, D), whose row b holds positions 0..pos[b] (the
// new token's own k and v already written) -> y (B, H, D). The keys are those the training forward gives
// query pos[b]: pos - window .. pos.
template <typename real>
static inline void attention_decode_cpu(real* y, const real* q, size_t q_stride, const real* k_cache, const real* v_cache, const int* pos,
                                        int B, int S, int H, int Hkv, int D, int window) {
    const real scale = (real)1 / std::sqrt((real)D);
    const int group = H / Hkv;
    const size_t stride = (size_t)Hkv * D;
#pragma omp parallel
    {
        std::vector<real> scores(S);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const size_t kv_base = (size_t)b * S * stride + (size_t)(h / group) * D, row = (size_t)b * H + h;
                attention_row_cpu(y + row * D, q + b * q_stride + (size_t)h * D, k_cache + kv_base, v_cache + kv_base, stride, std::max(pos[b] - window, 0),
                                  pos[b], D, scale, scores.data());
            }
    }
}

// Given dy = dL/dy (B, T, H, D) and the forward's y and lse, accumulates (+=) dq (B, T, H, D) and
// dk, dv (B, T, Hkv, D). With P the softmax and Delta_i = dy_i . y_i:
//   dS_ij = P_ij (dy_i . v_j - Delta_i);  dq_i += scale sum_j dS_ij k_j;  dk_j += scale dS_ij q_i;
//   dv_j += P_ij dy_i.
// One task per (b, kv head) owns its dk/dv rows and the dq rows of the query heads that read them, so
// there are no races and the summation order is fixed.
template <typename real>
static inline void attention_backward_naive_cpu(real* dq, real* dk, real* dv, const real* dy, const real* q,
                                          const real* k, const real* v, const real* y, const real* lse,
                                          int B, int T, int H, int Hkv, int D, int window) {
    const real scale = (real)1 / std::sqrt((real)D);
    const int group = H / Hkv;
#pragma omp parallel for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kvh = 0; kvh < Hkv; kvh++)
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int i = 0; i < T; i++) {
                        size_t qrow = (((size_t)b * T + i) * H + h) * D;
                        const real* qi = q + qrow;
                        const real* dyi = dy + qrow;
                        const real* yi = y + qrow;
                        real* dqi = dq + qrow;
                        real row_lse = lse[((size_t)b * H + h) * T + i];
                        int j0 = i - window > 0 ? i - window : 0;
                        const real delta = dot_lanes(dyi, yi, D);
                        for (int j = j0; j <= i; j++) {
                            size_t kvrow = (((size_t)b * T + j) * Hkv + kvh) * D;
                            const real* kj = k + kvrow;
                            const real* vj = v + kvrow;
                            const real s = dot_lanes(qi, kj, D), dp = dot_lanes(dyi, vj, D);
                            real p = std::exp(s * scale - row_lse);
                            real ds = p * (dp - delta) * scale;
                            real* dkj = dk + kvrow;
                            real* dvj = dv + kvrow;
                            for (int d = 0; d < D; d++) {
                                dqi[d] += ds * kj[d];
                                dkj[d] += ds * qi[d];
                                dvj[d] += p * dyi[d];
                            }
                        }
                    }
}

// The blocked versions. A task is a tile of ATTN_CPU_TILE query rows i0..i1-1 of one head; the keys any of
// its rows sees are j_lo = max(i0 - window, 0) .. i1 - 1, a strip of nk <= min(T, window + tile) keys. The
// tile's scores against the whole strip are one GEMM (the entries a row must not see are then set to 0
// probability), so a thread holds one (tile, nk) strip of scores, never (T, T); the softmax is exact (two
// passes over the strip, no online rescaling), and the products with V and the gradients are GEMMs too.
// A tile of 64 rows keeps a strip within L2 (64 x 2048 floats = 512 KiB at T 2048) while the GEMMs are
// long enough to run near the micro-kernel's speed; with a short window, the strip's corners outside the
// window (at most a tile's width) are computed and discarded.
static constexpr int ATTN_CPU_TILE = 64;

// The key strip of query rows i0..i1-1: first key j_lo, count nk
static inline void attention_key_strip(int i0, int i1, int window, int* j_lo, int* nk) {
    *j_lo = i0 - window > 0 ? i0 - window : 0;
    *nk = i1 - *j_lo;
}

// floats of one thread's strip buffer: tile rows x the longest strip
static inline size_t attention_strip_floats(int T, int window) {
    return (size_t)ATTN_CPU_TILE * (size_t)std::min((long)T, (long)window + ATTN_CPU_TILE);
}

// q (B, T, H, D), k, v (B, T, Hkv, D), rows `at` apart -> y (B, T, H, D), lse (B, H, T), as
// attention_forward_naive_cpu
static inline void attention_forward_cpu(float* y, float* lse, const float* q, const float* k, const float* v, QKVStrides strides, int B, int T,
                                         int H, int Hkv, int D, int window) {
    const float scale = 1.0f / std::sqrt((float)D);
    const int group = H / Hkv, tiles = (T + ATTN_CPU_TILE - 1) / ATTN_CPU_TILE;
    const size_t q_stride = strides.q, kv_stride = strides.kv, y_stride = (size_t)H * D;  // from one position to the next
#pragma omp parallel
    {
        std::vector<float> strip(attention_strip_floats(T, window));
        float* P = strip.data();
        // dynamic: later tiles see more keys (up to the window), and each task writes only its own rows
#pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int tile = 0; tile < tiles; tile++) {
                    const int i0 = tile * ATTN_CPU_TILE, i1 = std::min(i0 + ATTN_CPU_TILE, T), rows = i1 - i0;
                    int j_lo, nk;
                    attention_key_strip(i0, i1, window, &j_lo, &nk);
                    const float* q_tile = q + ((size_t)b * T + i0) * q_stride + (size_t)h * D;
                    const size_t kv_offset = ((size_t)b * T + j_lo) * kv_stride + (size_t)(h / group) * D;
                    // P (rows, nk) = q_tile (rows, D) @ k_strip^T
                    gemm_cpu(P, q_tile, k + kv_offset, rows, nk, D, (int)q_stride, (int)kv_stride, nk, false, true, false);
                    for (int r = 0; r < rows; r++) {
                        const int i = i0 + r, lo = std::max(i - window, 0) - j_lo, n = i - j_lo + 1 - lo;  // visible: lo .. lo+n-1
                        float* p = P + (size_t)r * nk;
                        for (int j = 0; j < lo; j++) p[j] = 0.0f;
                        for (int j = i - j_lo + 1; j < nk; j++) p[j] = 0.0f;
                        float* visible = p + lo;
                        // rounding is monotone, so the largest scaled score is the scaled largest score
                        const float row_max = max_lanes(visible, n) * scale;
                        for (int j = 0; j < n; j++) visible[j] = expf_simd(visible[j] * scale - row_max);
                        const float sum = sum_lanes(visible, n), inv_sum = 1.0f / sum;
                        for (int j = 0; j < n; j++) visible[j] *= inv_sum;
                        lse[((size_t)b * H + h) * T + i] = row_max + std::log(sum);
                    }
                    // y_tile (rows, D) = P (rows, nk) @ v_strip (nk, D)
                    gemm_cpu(y + ((size_t)b * T + i0) * y_stride + (size_t)h * D, P, v + kv_offset, rows, D, nk, nk, (int)kv_stride,
                             (int)y_stride, false, false, false);
                }
    }
}

// The backward of attention_forward_cpu, as attention_backward_naive_cpu (accumulates into dq, dk, dv). Per
// tile: P recomputed from lse, dP = dy v^T, dS = P (dP - Delta) scale, then dq += dS k, dk += dS^T q,
// dv += P^T dy, all five products GEMMs. One task per (b, kv head) owns its dk/dv rows (every query head
// of its group, every tile in turn), so there are no races and the summation order is fixed.
// q, dq rows `at.q` apart, k, v, dk, dv `at.kv` apart; dy, y (B, T, H, D).
static inline void attention_backward_cpu(float* dq, float* dk, float* dv, const float* dy, const float* q, const float* k,
                                          const float* v, QKVStrides strides, const float* y, const float* lse, int B, int T, int H, int Hkv,
                                          int D, int window) {
    const float scale = 1.0f / std::sqrt((float)D);
    const int group = H / Hkv, tiles = (T + ATTN_CPU_TILE - 1) / ATTN_CPU_TILE;
    const size_t q_stride = strides.q, kv_stride = strides.kv, y_stride = (size_t)H * D;
#pragma omp parallel
    {
        std::vector<float> strips(2 * attention_strip_floats(T, window));
        float* P = strips.data();
        float* dS = P + strips.size() / 2;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int kvh = 0; kvh < Hkv; kvh++)
                for (int h = kvh * group; h < (kvh + 1) * group; h++)
                    for (int tile = 0; tile < tiles; tile++) {
                        const int i0 = tile * ATTN_CPU_TILE, i1 = std::min(i0 + ATTN_CPU_TILE, T), rows = i1 - i0;
                        int j_lo, nk;
                        attention_key_strip(i0, i1, window, &j_lo, &nk);
                        const size_t q_offset = ((size_t)b * T + i0) * q_stride + (size_t)h * D;
                        const size_t y_offset = ((size_t)b * T + i0) * y_stride + (size_t)h * D;  // of dy and y
                        const size_t kv_offset = ((size_t)b * T + j_lo) * kv_stride + (size_t)kvh * D;
                        // scores P (rows, nk) = q_tile @ k_strip^T and dS (rows, nk) = dy_tile @ v_strip^T
                        gemm_cpu(P, q + q_offset, k + kv_offset, rows, nk, D, (int)q_stride, (int)kv_stride, nk, false, true, false);
                        gemm_cpu(dS, dy + y_offset, v + kv_offset, rows, nk, D, (int)y_stride, (int)kv_stride, nk, false, true, false);
                        for (int r = 0; r < rows; r++) {
                            const int i = i0 + r, lo = std::max(i - window, 0) - j_lo, hi = i - j_lo;  // visible: lo .. hi
                            const size_t row = y_offset + (size_t)r * y_stride;
                            const float delta = dot_lanes(dy + row, y + row, D), row_lse = lse[((size_t)b * H + h) * T + i];
                            float* p = P + (size_t)r * nk;
                            float* ds = dS + (size_t)r * nk;
                            for (int j = lo; j <= hi; j++) {
                                p[j] = expf_simd(p[j] * scale - row_lse);
                                ds[j] = p[j] * (ds[j] - delta) * scale;
                            }
                            for (int j = 0; j < lo; j++) p[j] = ds[j] = 0.0f;
                            for (int j = hi + 1; j < nk; j++) p[j] = ds[j] = 0.0f;
                        }
                        // dq_tile (rows, D) += dS @ k_strip; dk_strip (nk, D) += dS^T @ q_tile; dv_strip += P^T @ dy_tile
                        gemm_cpu(dq + q_offset, dS, k + kv_offset, rows, D, nk, nk, (int)kv_stride, (int)q_stride, false, false, true);
                        gemm_cpu(dk + kv_offset, dS, q + q_offset, nk, D, rows, nk, (int)q_stride, (int)kv_stride, true, false, true);
                        gemm_cpu(dv + kv_offset, P, dy + y_offset, nk, D, rows, nk, (int)y_stride, (int)kv_stride, true, false, true);
                    }
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend: flash-attention style kernels (FA2's structure) on the tensor cores, with the XSA
// epilogue and preprocessing fused in.
//
// Tiles. A block is 4 warps (128 threads), or 8 in the variants of 128 rows (attention_forward_variant,
// attention_backward_variant). Every tile is 64 rows (queries or keys) of D bf16 in shared
// memory, each row padded by 8 elements (16 bytes) so that the 8 row addresses of an ldmatrix phase fall
// in 8 different 16-byte bank groups (row stride 144 or 272 bytes, both = 16 mod 128). A warp owns 16
// rows of its block's tile and computes 16 x 64 score tiles with mma.sync m16n8k16 (bf16 in, fp32
// accumulate); the softmax statistics, the running output and the gradient accumulators stay in
// registers in the mma accumulator layout, and the score tile is turned into the A operand of the next
// mma without going through shared memory (FA2's register reuse).
//
// mma.sync m16n8k16 fragments (PTX ISA), g = lane / 4, c = lane % 4:
//   A (16 x 16, row-major), 4 x b32: (row g, cols 2c..2c+1), (row g+8, same), (row g, cols 2c+8..),
//                                    (row g+8, cols 2c+8..)
//   B (16 x 8, "col"),     2 x b32: (rows k 2c..2c+1, col g), (rows k 2c+8..2c+9, col g)
//   C (16 x 8, fp32),      4 x f32: (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1)
// So the C fragments of two adjacent 8-column tiles are, packed to bf16, exactly the A fragment of one
// 16-column k-step. Operands come from shared memory with ldmatrix.x4 (four 8x8 matrices; lane L gives
// the address of row L % 8 of matrix L / 8; matrix m lands in register m):
//   A operand, or B operand read transposed (ldmatrix.trans) from a (k, n) row-major tile:
//       row L % 16, col 8 (L / 16)         -> {a0, a1, a2, a3} or {b0, b1} of n-tiles n, n+1
//   B operand from an (n, k) row-major tile (K for Q K^T): row 8 (L / 16) + L % 8, col 8 ((L / 8) % 2)
//                                          -> {b0, b1} of n-tile n, {b0, b1} of n-tile n+1
//
// Determinism: every output element is written by exactly one thread, after a loop whose order is
// fixed; the backward runs one kernel that owns dK/dV per (batch, kv head, key tile) (looping over the
// query heads of the group and the query tiles that see those keys) and another that owns dQ per
// (batch, head, query tile). Both recompute P from the saved log-sum-exp. No atomics anywhere.
#ifdef __CUDACC__
#include "cuda_common.cuh"
#include "../xsa.cuh"  // XSA_EPS and xsa_backward_kernel (the fused backward's preprocessing)

#define ATT_TILE 64     // rows of every query and key tile but the dK/dV kernel's query tile at D = 128
#define ATT_PAD 8       // bf16 elements of padding per shared-memory row
static const float ATT_LOG2E = 1.4426950408889634f;

// ---- inline PTX: 16-byte async copies, ldmatrix, mma.sync (sm_80+, fine on sm_90) ----

__device__ __forceinline__ void attn_cp_async_16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void attn_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// waits until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void attn_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void attn_ldmatrix_x4(uint32_t r[4], const floatX* smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void attn_ldmatrix_x4_trans(uint32_t r[4], const floatX* smem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
// c (16 x 8 fp32) += a (16 x 16 bf16) b (16 x 8 bf16)
__device__ __forceinline__ void attn_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats -> one b32 of bf16 (lo in the low half: the lower column, as ldmatrix and mma expect)
__device__ __forceinline__ uint32_t attn_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// ---- tile helpers (all threads of the block or of one warp, as named) ----

// Block-wide: starts async copies of rows [0, ROWS) of a (ROWS, D) tile from global (row r at
// src + r * stride) into shared memory (row stride D + ATT_PAD). Rows >= valid are zero-filled
// instead: P is 0 there, but 0 * (uninitialised NaN bits) would still poison P V.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void attn_load_tile(floatX* dst, const floatX* src, size_t stride, int valid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        floatX* d = dst + r * (D + ATT_PAD) + ch * 8;
        if (r < valid) attn_cp_async_16(d, src + r * stride + ch * 8);
        else *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// One warp: writes the warp's 16 accumulator rows acc (16 x D in C layout) times `mul` as bf16 into its
// 16 rows of the shared tile s (row stride D + ATT_PAD); row g gets mul[0], row g + 8 mul[1].
template <int D>
__device__ __forceinline__ void attn_stage_rows(floatX* s, const float (&acc)[D / 8][4], float mul0, float mul1) {
    constexpr int LD = D + ATT_PAD;
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
        *reinterpret_cast<__nv_bfloat162*>(s + g * LD + nt * 8 + 2 * c) = __floats2bfloat162_rn(acc[nt][0] * mul0, acc[nt][1] * mul0);
        *reinterpret_cast<__nv_bfloat162*>(s + (g + 8) * LD + nt * 8 + 2 * c) = __floats2bfloat162_rn(acc[nt][2] * mul1, acc[nt][3] * mul1);
    }
}

// One warp: copies its 16 staged shared rows (row stride D + ATT_PAD) to global rows r < valid (row r at
// dst + r * stride) with 16-byte stores, consecutive lanes on consecutive bytes.
template <int D>
__device__ __forceinline__ void attn_store_rows(floatX* dst, size_t stride, const floatX* s, int valid) {
    constexpr int CHUNKS = D / 8;
    for (int c = threadIdx.x % 32; c < 16 * CHUNKS; c += 32) {
        const int r = c / CHUNKS, ch = c % CHUNKS;
        if (r < valid) *reinterpret_cast<uint4*>(dst + r * stride + ch * 8) = *reinterpret_cast<const uint4*>(s + r * (D + ATT_PAD) + ch * 8);
    }
}

// One warp: the two 16 x N score tiles of a backward step, s = A1 B1^T and t = A2 B2^T over D, fp32. A1, A2: the
// warp's 16 rows; B1, B2: N rows (all bf16 in shared memory, row stride D + ATT_PAD). dq: (Q, K; dY, V); dK/dV:
// (K, Q; V, dY), the transposed tiles.
template <int D, int N>
__device__ __forceinline__ void attn_score_tiles(float (&s)[N / 8][4], float (&t)[N / 8][4], const floatX* a1, const floatX* b1,
                                                 const floatX* a2, const floatX* b2) {
    constexpr int LD = D + ATT_PAD;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = t[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        uint32_t fa1[4], fa2[4];
        attn_ldmatrix_x4(fa1, a1 + (lane % 16) * LD + ks * 16 + (lane / 16) * 8);
        attn_ldmatrix_x4(fa2, a2 + (lane % 16) * LD + ks * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            const int off = (np * 16 + (lane / 16) * 8 + lane % 8) * LD + ks * 16 + ((lane / 8) % 2) * 8;
            uint32_t fb1[4], fb2[4];
            attn_ldmatrix_x4(fb1, b1 + off);
            attn_ldmatrix_x4(fb2, b2 + off);
            attn_mma(s[2 * np], fa1, fb1[0], fb1[1]);
            attn_mma(s[2 * np + 1], fa1, fb1[2], fb1[3]);
            attn_mma(t[2 * np], fa2, fb2[0], fb2[1]);
            attn_mma(t[2 * np + 1], fa2, fb2[2], fb2[3]);
        }
    }
}

// ---- forward ----

// q (B, T, H, D), k, v (B, T, Hkv, D), rows `at` apart; y, z (B, T, H, D); lse (B, H, T). Grid
// (ceil(T / BQ), B H), 2 BQ threads: the
// query tiles of one (b, h) are consecutive blocks, so the blocks resident at once share a few heads' K/V
// in L2 (with (b, h) fastest they would touch every head's: ~256 MB at d24, 32 rows, against ~60 MB of L2).
// A block owns BQ (64 or 128) queries of one head (warp w the 16 rows 16w..16w+15) and walks the 64-key tiles
// that intersect their window, [q0 - window, q0 + BQ - 1], with online softmax; K/V tiles are double-buffered
// with cp.async so the next tile loads while this one is computed. The diagonal tiles come last, so when XSA
// is on (z != nullptr) the token's own value rows are still in shared memory for the epilogue:
// z = y - alpha_h (y.v / (v.v + eps)) v, computed from the bf16-rounded y (as the unfused op would);
// alpha (H) is read only then. MIN_BLOCKS: __launch_bounds__'s blocks per SM (the variants: attention_forward_variant).
// Shared memory: Q (BQ, D + 8), K and V (2, 64, D + 8) bf16: BQ 64: 45 KB (D = 64), 85 KB (D = 128); BQ 128: 54 KB, 102 KB.
template <int D, int BQ, int MIN_BLOCKS>
__global__ void __launch_bounds__(BQ * 2, MIN_BLOCKS) attention_forward_kernel(
        floatX* z, floatX* y, float* lse, const floatX* q, const floatX* k, const floatX* v, QKVStrides strides, int T, int H,
        int Hkv, int window, float scale, const float* alpha) {
    constexpr int BK = ATT_TILE, LD = D + ATT_PAD, THREADS = BQ * 2;  // a warp per 16 query rows
    extern __shared__ __align__(16) unsigned char attn_smem[];
    floatX* Qs = reinterpret_cast<floatX*>(attn_smem);  // (BQ, LD)
    floatX* Ks = Qs + BQ * LD;                           // (2, BK, LD)
    floatX* Vs = Ks + 2 * BK * LD;                       // (2, BK, LD)

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / Hkv);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the last (longest) query tiles of a head start first
    const size_t qstride = strides.q, kvstride = strides.kv, ystride = (size_t)H * D;
    const floatX* qb = q + (size_t)b * T * qstride + (size_t)h * D;  // token i of this (b, h) at qb + i * qstride
    const floatX* kb = k + (size_t)b * T * kvstride + (size_t)kvh * D;
    const floatX* vb = v + (size_t)b * T * kvstride + (size_t)kvh * D;

    // key tiles with a key in [q0 - window, q0 + BQ - 1]; tiles entirely outside the window are skipped.
    // The diagonal tiles (k0 in [q0, q0 + BQ - 1]: one, or two when BQ = 128) come last.
    const int kt_lo = max(0, q0 - window) / BK, kt_hi = (q0 + BQ - 1) / BK;
    attn_load_tile<D, BQ, THREADS>(Qs, qb + q0 * qstride, qstride, T - q0);
    attn_load_tile<D, BK, THREADS>(Ks, kb + (size_t)kt_lo * BK * kvstride, kvstride, T - kt_lo * BK);
    attn_load_tile<D, BK, THREADS>(Vs, vb + (size_t)kt_lo * BK * kvstride, kvstride, T - kt_lo * BK);
    attn_cp_async_commit();

    const float sl2 = scale * ATT_LOG2E;  // exp(scale s) = exp2(sl2 s)
    const int row0 = q0 + warp * 16 + g;   // this thread's query rows: row0 (C regs 0, 1), row0 + 8 (regs 2, 3)
    uint32_t qf[D / 16][4];                // the warp's Q rows as A fragments, one per 16-wide k-step
    float o[D / 8][4];                     // running (unnormalised) output, 16 x D
    float m[2] = {-INFINITY, -INFINITY};   // running max of the raw scores of rows row0, row0 + 8
    float l[2] = {0.0f, 0.0f};             // running sum of exp: this thread's columns only (quad-summed at the end)
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

    for (int kt = kt_lo; kt <= kt_hi; kt++) {
        const int buf = (kt - kt_lo) & 1, k0 = kt * BK;
        if (kt < kt_hi) {  // prefetch the next tile into the other buffer (freed by the barrier ending the last iteration)
            const size_t off = (size_t)(k0 + BK) * kvstride;
            attn_load_tile<D, BK, THREADS>(Ks + (buf ^ 1) * BK * LD, kb + off, kvstride, T - k0 - BK);
            attn_load_tile<D, BK, THREADS>(Vs + (buf ^ 1) * BK * LD, vb + off, kvstride, T - k0 - BK);
            attn_cp_async_commit();
            attn_cp_async_wait<1>();  // this tile (and Q) landed; the prefetch may still be in flight
        } else {
            attn_cp_async_wait<0>();
        }
        __syncthreads();  // every thread's copies into this buffer are visible
        if (kt == kt_lo) {
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++)
                attn_ldmatrix_x4(qf[ks], Qs + (warp * 16 + lane % 16) * LD + ks * 16 + (lane / 16) * 8);
        }
        const floatX* Kt = Ks + buf * BK * LD;
        const floatX* Vt = Vs + buf * BK * LD;

        // s (16 x 64) = Q K^T, raw (unscaled) scores
        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
            for (int np = 0; np < BK / 16; np++) {
                uint32_t kf[4];
                attn_ldmatrix_x4(kf, Kt + (np * 16 + (lane / 16) * 8 + lane % 8) * LD + ks * 16 + ((lane / 8) % 2) * 8);
                attn_mma(s[2 * np], qf[ks], kf[0], kf[1]);
                attn_mma(s[2 * np + 1], qf[ks], kf[2], kf[3]);
            }
        }
        // mask keys outside [i - window, i] (only tiles that straddle the diagonal or the window's edge)
        const int wr0 = q0 + warp * 16;  // the warp's first row
        if (k0 + BK - 1 > wr0 || k0 < wr0 + 15 - window) {
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = row0 + (e / 2) * 8, j = k0 + nt * 8 + 2 * c + e % 2;
                    if (j > i || j < i - window) s[nt][e] = -INFINITY;
                }
        }
        // online softmax: new running max, rescale what was accumulated so far, p = exp(scale (s - max))
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
        float msc[2];  // the max in the exp2 domain; 0 while a row has seen no key (avoids -inf - -inf)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));  // a row lives in the 4 lanes of a quad
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            msc[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * sl2;
            const float corr = exp2f(m[r] * sl2 - msc[r]);  // m = -inf: 0 (nothing accumulated yet)
            m[r] = mx[r];
            l[r] *= corr;
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) {
                o[nt][2 * r] *= corr;
                o[nt][2 * r + 1] *= corr;
            }
        }
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt][e] = exp2f(fmaf(s[nt][e], sl2, -msc[e / 2]));  // masked: exp2(-inf) = 0
                l[e / 2] += s[nt][e];
            }
        // o (16 x D) += P (16 x 64, bf16) V (64 x D)
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            const uint32_t pa[4] = {attn_pack_bf16(s[2 * kk][0], s[2 * kk][1]), attn_pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                    attn_pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    attn_pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t vf[4];
                attn_ldmatrix_x4_trans(vf, Vt + (kk * 16 + lane % 16) * LD + dp * 16 + (lane / 16) * 8);
                attn_mma(o[2 * dp], pa, vf[0], vf[1]);
                attn_mma(o[2 * dp + 1], pa, vf[2], vf[3]);
            }
        }
        __syncthreads();  // all warps are done with this buffer before the next iteration refills it
    }

    // epilogue: complete the row sums over the quad, y = o / l, lse = scale max + log(l)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (c == 0) {
        float* lse_bh = lse + ((size_t)b * H + h) * T;
        if (row0 < T) lse_bh[row0] = m[0] * scale + logf(l[0]);
        if (row0 + 8 < T) lse_bh[row0 + 8] = m[1] * scale + logf(l[1]);
    }
    // y goes through the warp's own 16 rows of Qs (only this warp ever read them) for coalesced stores.
    // Rows >= T may hold l = 0 (inf / NaN): they are never stored.
    floatX* Ys = Qs + warp * 16 * LD;
    attn_stage_rows<D>(Ys, o, 1.0f / l[0], 1.0f / l[1]);
    __syncwarp();
    const int valid = T - (q0 + warp * 16);
    floatX* yw = y + ((size_t)b * T * H + h) * D + (size_t)(q0 + warp * 16) * ystride;
    attn_store_rows<D>(yw, ystride, Ys, valid);
    if (z != nullptr) {
        // XSA: one row at a time, lane holding D / 32 elements; the own value row of token i is row i - k0 of
        // the diagonal tile kt = i / BK, one of the last two loaded (buffer (kt - kt_lo) & 1), both still whole
        const int kt_own = (q0 + warp * 16) / BK;
        const floatX* Vd = Vs + ((kt_own - kt_lo) & 1) * BK * LD + (q0 + warp * 16 - kt_own * BK) * LD;
        floatX* zw = z + ((size_t)b * T * H + h) * D + (size_t)(q0 + warp * 16) * ystride;
        for (int r = 0; r < 16 && r < valid; r++) {
            float2 yy[D / 64], vv[D / 64];
            float sv = 0.0f, nn = 0.0f;
#pragma unroll
            for (int e = 0; e < D / 64; e++) {
                yy[e] = xsa_load2(Ys + r * LD, lane, e);
                vv[e] = xsa_load2(Vd + r * LD, lane, e);
                sv += yy[e].x * vv[e].x + yy[e].y * vv[e].y;
                nn += vv[e].x * vv[e].x + vv[e].y * vv[e].y;
            }
            sv = warp_sum(sv);
            nn = warp_sum(nn);
            const float coef = alpha[h] * (sv / (nn + XSA_EPS));
#pragma unroll
            for (int e = 0; e < D / 64; e++)
                xsa_store2(zw + r * ystride, lane, e, yy[e].x - coef * vv[e].x, yy[e].y - coef * vv[e].y);
        }
    }
}

// ---- backward ----

// delta (B, H, T) = rowsum(dy * y) in fp32; dy, y (B, T, H, D). One warp per (token, head) row.
template <int D>
__global__ void __launch_bounds__(XSA_THREADS) attention_delta_kernel(float* delta, const floatX* dy, const floatX* y, size_t rows, int T, int H) {
    const int lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // = token * H + head
    if (row >= rows) return;
    float acc = 0.0f;
#pragma unroll
    for (int e = 0; e < D / 64; e++) {
        const float2 a = xsa_load2(dy + row * D, lane, e), bb = xsa_load2(y + row * D, lane, e);
        acc += a.x * bb.x + a.y * bb.y;
    }
    acc = warp_sum(acc);
    const size_t n = row / H, h = row % H, b = n / T, t = n % T;
    if (lane == 0) delta[(b * H + h) * T + t] = acc;
}

// dq (B, T, H, D) = scale sum_j dS_ij k_j with dS = P (dy v^T - delta), P recomputed from lse; q, dq rows
// at.q apart, k, v at.kv; dy (B, T, H, D).
// Grid (ceil(T / BQ), B H), 2 BQ threads (the tiles of one head consecutive, as in the forward); a block
// owns the dq rows of BQ (64 or 128: attention_backward_variant) queries of one head and walks the same key
// tiles as the forward. Warp w: query rows 16w..16w+15; it skips a key tile wholly outside its rows' windows
// (all its P would be 0). Its Q and dY A fragments are re-read from shared memory per k-step (holding them
// would cost 64 more registers at D = 128).
// KV_STAGES 2: K/V double-buffered (the next tile loads while this one is used); 1: one buffer, loaded after
// the previous tile is done with (slower, same arithmetic, so the same dq bit for bit), for GPUs whose block
// cannot have 102 KB of shared memory (sm_86, sm_89, sm_120: 99 KB).
// Shared memory: Q, dY (BQ, D + 8), K, V (KV_STAGES, 64, D + 8) bf16: attention_dq_smem.
template <int D, int BQ, int KV_STAGES>
__global__ void __launch_bounds__(BQ * 2) attention_backward_dq_kernel(
        floatX* dq, const floatX* dy, const floatX* q, const floatX* k, const floatX* v, const float* lse,
        const float* delta, QKVStrides strides, int T, int H, int Hkv, int window, float scale) {
    constexpr int BK = ATT_TILE, LD = D + ATT_PAD, THREADS = BQ * 2;  // a warp per 16 query rows
    extern __shared__ __align__(16) unsigned char attn_smem[];
    floatX* Qs = reinterpret_cast<floatX*>(attn_smem);  // (BQ, LD)
    floatX* dYs = Qs + BQ * LD;                          // (BQ, LD)
    floatX* Ks = dYs + BQ * LD;                          // (KV_STAGES, BK, LD)
    floatX* Vs = Ks + KV_STAGES * BK * LD;               // (KV_STAGES, BK, LD)

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / Hkv);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    const size_t qstride = strides.q, kvstride = strides.kv, ystride = (size_t)H * D;
    const size_t qoff = (size_t)b * T * qstride + (size_t)h * D;  // token i of this (b, h) at qoff + i * qstride
    const size_t yoff = ((size_t)b * T * H + h) * D;              // of dy: yoff + i * ystride
    const floatX* kb = k + (size_t)b * T * kvstride + (size_t)kvh * D;
    const floatX* vb = v + (size_t)b * T * kvstride + (size_t)kvh * D;

    const int kt_lo = max(0, q0 - window) / BK, kt_hi = (q0 + BQ - 1) / BK;
    attn_load_tile<D, BQ, THREADS>(Qs, q + qoff + q0 * qstride, qstride, T - q0);
    attn_load_tile<D, BQ, THREADS>(dYs, dy + yoff + q0 * ystride, ystride, T - q0);
    attn_load_tile<D, BK, THREADS>(Ks, kb + (size_t)kt_lo * BK * kvstride, kvstride, T - kt_lo * BK);
    attn_load_tile<D, BK, THREADS>(Vs, vb + (size_t)kt_lo * BK * kvstride, kvstride, T - kt_lo * BK);
    attn_cp_async_commit();

    const float sl2 = scale * ATT_LOG2E;
    const int row0 = q0 + warp * 16 + g;
    float lse2[2], dlt[2];  // lse in the exp2 domain and delta of rows row0, row0 + 8 (0 past T: never stored)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row0 + 8 * r;
        lse2[r] = i < T ? lse[((size_t)b * H + h) * T + i] * ATT_LOG2E : 0.0f;
        dlt[r] = i < T ? delta[((size_t)b * H + h) * T + i] : 0.0f;
    }
    const floatX* Qw = Qs + warp * 16 * LD;  // the warp's rows
    const floatX* dYw = dYs + warp * 16 * LD;
    float acc[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    for (int kt = kt_lo; kt <= kt_hi; kt++) {
        const int buf = KV_STAGES == 2 ? (kt - kt_lo) & 1 : 0, k0 = kt * BK;
        if (KV_STAGES == 2 && kt < kt_hi) {  // prefetch the next tile into the other buffer
            const size_t off = (size_t)(k0 + BK) * kvstride;
            attn_load_tile<D, BK, THREADS>(Ks + (buf ^ 1) * BK * LD, kb + off, kvstride, T - k0 - BK);
            attn_load_tile<D, BK, THREADS>(Vs + (buf ^ 1) * BK * LD, vb + off, kvstride, T - k0 - BK);
            attn_cp_async_commit();
            attn_cp_async_wait<1>();
        } else if (KV_STAGES == 1 && kt > kt_lo) {  // this tile into the one buffer (the loop's last barrier freed it)
            attn_load_tile<D, BK, THREADS>(Ks, kb + (size_t)k0 * kvstride, kvstride, T - k0);
            attn_load_tile<D, BK, THREADS>(Vs, vb + (size_t)k0 * kvstride, kvstride, T - k0);
            attn_cp_async_commit();
            attn_cp_async_wait<0>();
        } else {
            attn_cp_async_wait<0>();
        }
        __syncthreads();
        const floatX* Kt = Ks + buf * BK * LD;
        const floatX* Vt = Vs + buf * BK * LD;
        // the warp's rows [wr0, wr0 + 15] see keys [wr0 - window, wr0 + 15]: a tile outside adds only zeros
        const int wr0 = q0 + warp * 16;
        if (k0 <= wr0 + 15 && k0 + BK - 1 >= wr0 - window) {
            // s = Q K^T and dp = dY V^T (16 x 64 each)
            float s[BK / 8][4], dp[BK / 8][4];
            attn_score_tiles<D, BK>(s, dp, Qw, Kt, dYw, Vt);
            // dS = P (dP - delta), P = exp(scale s - lse), 0 outside the window (kept in s)
            const bool need_mask = k0 + BK - 1 > wr0 || k0 < wr0 + 15 - window;
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = row0 + (e / 2) * 8, j = k0 + nt * 8 + 2 * c + e % 2;
                    const bool masked = need_mask && (j > i || j < i - window);
                    const float p = masked ? 0.0f : exp2f(fmaf(s[nt][e], sl2, -lse2[e / 2]));
                    s[nt][e] = p * (dp[nt][e] - dlt[e / 2]);
                }
            // acc (16 x D) += dS (16 x 64, bf16) K (64 x D)
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint32_t sa[4] = {attn_pack_bf16(s[2 * kk][0], s[2 * kk][1]), attn_pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                        attn_pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        attn_pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int dp2 = 0; dp2 < D / 16; dp2++) {
                    uint32_t kf[4];
                    attn_ldmatrix_x4_trans(kf, Kt + (kk * 16 + lane % 16) * LD + dp2 * 16 + (lane / 16) * 8);
                    attn_mma(acc[2 * dp2], sa, kf[0], kf[1]);
                    attn_mma(acc[2 * dp2 + 1], sa, kf[2], kf[3]);
                }
            }
        }
        __syncthreads();
    }

    // dq = scale acc, staged in the warp's own Q rows (only this warp read them) for coalesced stores
    floatX* St = Qs + warp * 16 * LD;
    attn_stage_rows<D>(St, acc, scale, scale);
    __syncwarp();
    attn_store_rows<D>(dq + qoff + (size_t)(q0 + warp * 16) * qstride, qstride, St, T - (q0 + warp * 16));
}

// dk (B, T, Hkv, D) = scale sum_{h in group, i} dS_ij q_i;  dv = sum_{h, i} P_ij dy_i (+ dv_extra, fp32
// (B, T, Hkv, D), when XSA is fused: its self-position term); q rows at.q apart, k, v, dk, dv at.kv; dy
// (B, T, H, D). Grid (ceil(T / BK), B Hkv), 2 BK threads.
// A block owns BK (64 or 128: attention_backward_variant) keys of one kv head (warp w: keys 16w..16w+15) and
// visits, in a fixed order, every query head of the group and every query tile of BQ rows that sees those
// keys ([k0, k0 + BK - 1 + window]): s^T = K Q^T, dp^T = V dY^T (keys x queries), P^T from lse, dS^T = P^T
// (dp^T - delta); dv += P^T dY, dk += dS^T Q. A warp skips a query tile none of whose queries sees its keys
// (all its P would be 0), so each key adds the same nonzero terms in the same order whatever BK is. Q, dY,
// lse and delta are double-buffered. BQ = 32 at D = 128 keeps the two 16 x D fp32 accumulators plus both
// score tiles within the register file (64 + 64 + 16 + 16 per thread).
// Shared memory: K, V (BK, D + 8), Q, dY (2, BQ, D + 8) bf16, lse, delta (2, BQ) fp32: attention_dkdv_smem.
template <int D, int BK>
__global__ void __launch_bounds__(BK * 2) attention_backward_dkdv_kernel(
        floatX* dk, floatX* dv, const floatX* dy, const floatX* q, const floatX* k, const floatX* v,
        const float* lse, const float* delta, const float* dv_extra, QKVStrides strides, int T, int H, int Hkv, int window,
        float scale) {
    constexpr int BQ = D == 64 ? 64 : 32, LD = D + ATT_PAD, THREADS = BK * 2;  // a warp per 16 keys
    extern __shared__ __align__(16) unsigned char attn_smem[];
    floatX* Ks = reinterpret_cast<floatX*>(attn_smem);  // (BK, LD)
    floatX* Vs = Ks + BK * LD;                           // (BK, LD)
    floatX* Qs = Vs + BK * LD;                           // (2, BQ, LD)
    floatX* dYs = Qs + 2 * BQ * LD;                      // (2, BQ, LD)
    float* Ls = reinterpret_cast<float*>(dYs + 2 * BQ * LD);  // (2, BQ) lse in the exp2 domain
    float* Ds = Ls + 2 * BQ;                                  // (2, BQ) delta

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
    const int b = blockIdx.y / Hkv, kvh = blockIdx.y % Hkv, group = H / Hkv;
    const int k0 = blockIdx.x * BK;  // the first key tiles see the most queries: they start first
    const size_t qstride = strides.q, kvstride = strides.kv, ystride = (size_t)H * D;
    const size_t kvoff = ((size_t)b * T + k0) * kvstride + (size_t)kvh * D;  // this block's first key

    const int qt_lo = k0 / BQ, qt_hi = min(T - 1, k0 + BK - 1 + window) / BQ;
    const int nq = qt_hi - qt_lo + 1, iters = group * nq;  // iteration it: head kvh group + it / nq, tile qt_lo + it % nq
    // starts the loads of iteration it into buffer buf: Q and dY rows async, lse and delta by plain stores
    auto load_iter = [&](int it, int buf) {
        const int h = kvh * group + it / nq, i0 = (qt_lo + it % nq) * BQ;
        const size_t qoff = ((size_t)b * T + i0) * qstride + (size_t)h * D, yoff = ((size_t)b * T + i0) * ystride + (size_t)h * D;
        attn_load_tile<D, BQ, THREADS>(Qs + buf * BQ * LD, q + qoff, qstride, T - i0);
        attn_load_tile<D, BQ, THREADS>(dYs + buf * BQ * LD, dy + yoff, ystride, T - i0);
        for (int r = threadIdx.x; r < BQ; r += THREADS) {
            const size_t idx = ((size_t)b * H + h) * T + i0 + r;
            Ls[buf * BQ + r] = i0 + r < T ? lse[idx] * ATT_LOG2E : 0.0f;
            Ds[buf * BQ + r] = i0 + r < T ? delta[idx] : 0.0f;
        }
    };
    attn_load_tile<D, BK, THREADS>(Ks, k + kvoff, kvstride, T - k0);
    attn_load_tile<D, BK, THREADS>(Vs, v + kvoff, kvstride, T - k0);
    load_iter(0, 0);
    attn_cp_async_commit();

    const float sl2 = scale * ATT_LOG2E;
    const int kw0 = k0 + warp * 16, key0 = kw0 + g;  // this thread's key rows: key0 (C regs 0, 1), key0 + 8 (regs 2, 3)
    const floatX* Kw = Ks + warp * 16 * LD;  // the warp's key rows (A operands)
    const floatX* Vw = Vs + warp * 16 * LD;
    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[nt][e] = dva[nt][e] = 0.0f;

    for (int it = 0; it < iters; it++) {
        const int buf = it & 1, i0 = (qt_lo + it % nq) * BQ;
        if (it + 1 < iters) {
            load_iter(it + 1, buf ^ 1);
            attn_cp_async_commit();
            attn_cp_async_wait<1>();
        } else {
            attn_cp_async_wait<0>();
        }
        __syncthreads();
        const floatX* Qt = Qs + buf * BQ * LD;
        const floatX* dYt = dYs + buf * BQ * LD;
        const float* Lt = Ls + buf * BQ;
        const float* Dt = Ds + buf * BQ;
        // the warp's keys [kw0, kw0 + 15] are seen by queries [kw0, kw0 + 15 + window] below T
        if (kw0 < T && i0 + BQ - 1 >= kw0 && i0 <= kw0 + 15 + window) {
            // st = K Q^T and dpt = V dY^T (16 keys x BQ queries each)
            float st[BQ / 8][4], dpt[BQ / 8][4];
            attn_score_tiles<D, BQ>(st, dpt, Kw, Qt, Vw, dYt);
            // P^T into st, dS^T into dpt; key j sees query i iff i < T and i - window <= j <= i
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = nt * 8 + 2 * c + e % 2, i = i0 + col, j = key0 + (e / 2) * 8;
                    const bool ok = i < T && j <= i && j >= i - window;
                    const float p = ok ? exp2f(fmaf(st[nt][e], sl2, -Lt[col])) : 0.0f;
                    st[nt][e] = p;
                    dpt[nt][e] = p * (dpt[nt][e] - Dt[col]);
                }
            // dva (16 x D) += P^T (16 x BQ, bf16) dY (BQ x D);  dka += dS^T Q
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                const uint32_t pa[4] = {attn_pack_bf16(st[2 * kk][0], st[2 * kk][1]), attn_pack_bf16(st[2 * kk][2], st[2 * kk][3]),
                                        attn_pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                        attn_pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
                const uint32_t sa[4] = {attn_pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]), attn_pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                                        attn_pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                        attn_pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
                for (int dp2 = 0; dp2 < D / 16; dp2++) {
                    const int off = (kk * 16 + lane % 16) * LD + dp2 * 16 + (lane / 16) * 8;
                    uint32_t df[4], qf[4];
                    attn_ldmatrix_x4_trans(df, dYt + off);
                    attn_ldmatrix_x4_trans(qf, Qt + off);
                    attn_mma(dva[2 * dp2], pa, df[0], df[1]);
                    attn_mma(dva[2 * dp2 + 1], pa, df[2], df[3]);
                    attn_mma(dka[2 * dp2], sa, qf[0], qf[1]);
                    attn_mma(dka[2 * dp2 + 1], sa, qf[2], qf[3]);
                }
            }
        }
        __syncthreads();
    }

    // XSA's self-position dv term, fp32, added before the single rounding to bf16
    if (dv_extra != nullptr) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int j = key0 + 8 * r;
            if (j >= T) continue;
            const float* ex = dv_extra + (((size_t)b * T + j) * Hkv + kvh) * D;
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) {
                const float2 add = *reinterpret_cast<const float2*>(ex + nt * 8 + 2 * c);
                dva[nt][2 * r] += add.x;
                dva[nt][2 * r + 1] += add.y;
            }
        }
    }
    // dk, dv staged in the warp's own K and V rows (only this warp read them), then coalesced stores
    floatX* Kst = Ks + warp * 16 * LD;
    floatX* Vst = Vs + warp * 16 * LD;
    attn_stage_rows<D>(Kst, dka, scale, scale);
    attn_stage_rows<D>(Vst, dva, 1.0f, 1.0f);
    __syncwarp();
    const size_t woff = kvoff + (size_t)(warp * 16) * kvstride;
    attn_store_rows<D>(dk + woff, kvstride, Kst, T - (k0 + warp * 16));
    attn_store_rows<D>(dv + woff, kvstride, Vst, T - (k0 + warp * 16));
}

// ---- generation: one new query per row against the KV cache ----

// y (B, H, D) = attention of q (B, H, D; row b at q + b q_stride), the new tokens at positions pos[b] (device memory), over the
// cache k_cache, v_cache (B, S, Hkv, D): attention_decode_cpu. Grid B*H, DECODE_THREADS threads. Each
// generated token reads the whole (windowed) cache once for ~4 FLOPs per bf16 element, so the kernel is
// bound by that read and stays simple: online softmax over chunks of DECODE_THREADS keys, one key per
// thread (an fp32 dot product of the bf16 key with q, kept in shared memory), then each thread adds the
// chunk's p_j v_j into its own output channels d = tid, tid + DECODE_THREADS, ...
static const int DECODE_THREADS = 128;
template <int D>
__global__ void __launch_bounds__(DECODE_THREADS) attention_decode_kernel(floatX* y, const floatX* q, size_t q_stride, const floatX* k_cache,
                                                                          const floatX* v_cache, const int* pos, int S, int H, int Hkv,
                                                                          int window, float scale) {
    constexpr int PER_THREAD = (D + DECODE_THREADS - 1) / DECODE_THREADS;
    __shared__ float q_row[D];
    __shared__ float p[DECODE_THREADS];
    __shared__ float reduce[32];
    const int b = blockIdx.x / H, h = blockIdx.x % H, tid = threadIdx.x;
    const int i = pos[b], j0 = max(i - window, 0);
    const size_t stride = (size_t)Hkv * D, base = (size_t)b * S * stride + (size_t)(h / (H / Hkv)) * D;
    const floatX* qi = q + (size_t)b * q_stride + (size_t)h * D;
    for (int d = tid; d < D; d += DECODE_THREADS) q_row[d] = to_float(qi[d]);
    __syncthreads();
    float acc[PER_THREAD] = {};
    float row_max = -INFINITY, sum = 0.0f;
    for (int c0 = j0; c0 <= i; c0 += DECODE_THREADS) {
        const int j = c0 + tid;
        float s = -INFINITY;
        if (j <= i) {
            const floatX* kj = k_cache + base + (size_t)j * stride;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += q_row[d] * to_float(kj[d]);
            s = dot * scale;
        }
        const float new_max = fmaxf(row_max, block_max(s, reduce));  // finite: key c0 <= i is in every chunk
        const float pj = j <= i ? expf(s - new_max) : 0.0f;
        const float rescale = expf(row_max - new_max);                // 0 for the first chunk (row_max = -inf)
        sum = sum * rescale + block_sum(pj, reduce);
        p[tid] = pj;
        __syncthreads();
        const int keys = min(DECODE_THREADS, i - c0 + 1);
#pragma unroll
        for (int e = 0; e < PER_THREAD; e++) {
            const int d = tid + e * DECODE_THREADS;
            if (d >= D) break;
            float a = acc[e] * rescale;
            for (int jj = 0; jj < keys; jj++) a += p[jj] * to_float(v_cache[base + (size_t)(c0 + jj) * stride + d]);
            acc[e] = a;
        }
        __syncthreads();  // p is rewritten by the next chunk
        row_max = new_max;
    }
    floatX* yi = y + ((size_t)b * H + h) * D;
#pragma unroll
    for (int e = 0; e < PER_THREAD; e++)
        if (tid + e * DECODE_THREADS < D) yi[tid + e * DECODE_THREADS] = to_floatX(acc[e] / sum);
}

// ---- launchers ----

static inline void attention_check_shape(int B, int T, int H, int Hkv, int D, int window, const char* who) {
    if (D != 64 && D != 128) fail("%s: head_dim %d is not supported (64 or 128)", who, D);
    if (Hkv <= 0 || H % Hkv != 0) fail("%s: %d query heads are not a multiple of %d kv heads", who, H, Hkv);
    if (T <= 0 || window < 0) fail("%s: T = %d, window = %d", who, T, window);
    if ((long)B * H > 65535) fail("%s: B x H = %ld is past the grid's 65535 blocks in y", who, (long)B * H);
}

// the tiles are loaded with 16-byte copies: every row of q, k, v (dq, dk, dv) starts 16-byte aligned
static inline void attention_check_strides(QKVStrides strides) {
    if (strides.q % 8 != 0 || strides.kv % 8 != 0) fail("attention: row strides %zu and %zu are not multiples of 8 elements", strides.q, strides.kv);
}

// Dynamic shared memory of each kernel (bytes). What a block may have (cudaDevAttrMaxSharedMemoryPerBlockOptin):
// 227 KB on sm_90 and sm_100, 163 KB on sm_80, 99 KB on sm_86, sm_89 and sm_120. At D = 128 the forward needs
// 85 KB (102 KB with 128 rows), dK/dV 68.5 KB (102.5 KB with 128 keys), dq 102 KB with K/V double-buffered and
// 68 KB with one buffer (136 KB with 128 rows); at D = 64 the kernels of 64 rows or keys are under 55 KB and
// those of 128 under 73 KB.
static inline int attention_forward_smem(int D, int bq) { return (bq + 4 * ATT_TILE) * (D + ATT_PAD) * (int)sizeof(floatX); }
static inline int attention_dq_smem(int D, int bq, int kv_stages) {
    return (2 * bq + 2 * kv_stages * ATT_TILE) * (D + ATT_PAD) * (int)sizeof(floatX);
}
static inline int attention_dkdv_smem(int D, int bk) {
    const int bq = D == 64 ? 64 : 32;
    return (2 * bk + 4 * bq) * (D + ATT_PAD) * (int)sizeof(floatX) + 4 * bq * (int)sizeof(float);
}

// The 64-row dq kernel's K/V buffers on this GPU: 2 (the faster) where a block can have that much shared memory, else 1
static inline int attention_dq_stages(int D) { return (size_t)attention_dq_smem(D, ATT_TILE, 2) <= g_cuda.shared_per_block_optin ? 2 : 1; }

// Stops, before any launch, if a kernel needs more shared memory per block than this GPU offers
static inline void attention_check_smem(const char* kernel, int D, int bytes) {
    if ((size_t)bytes > g_cuda.shared_per_block_optin)
        fail("%s (compute capability %d.%d) offers %zu bytes of shared memory per block; the attention kernel %s at head_dim %d "
             "needs %d: use --head-dim 64 or another GPU", g_cuda.name, g_cuda.cc_major, g_cuda.cc_minor, g_cuda.shared_per_block_optin,
             kernel, D, bytes);
}

// The kernels' variants, to be timed against each other on a GPU (dev/cuda/attention_check.cu, gpu_check's
// timing_attention). Every query row and every key does the same arithmetic in each (a tile a larger block
// visits outside a warp's window adds only zeros for it), so they give the same bits and differ only in speed.
// Forward: 64 query rows and 4 warps per block (the kernel as first written); the same at a launch bound of 128
// threads and 4 blocks per SM, so that the compiler keeps to 4 resident blocks' registers; 128 rows and 8 warps
// (each K/V tile loaded once for twice the rows).
enum AttentionForwardVariant { ATTN_FWD_64, ATTN_FWD_64_OCC4, ATTN_FWD_128, ATTN_FWD_VARIANTS };
static const char* const ATTN_FWD_NAMES[ATTN_FWD_VARIANTS] = {"64 rows", "64 rows, 4 blocks/SM", "128 rows"};
static inline int attention_forward_rows(AttentionForwardVariant v) { return v == ATTN_FWD_128 ? 128 : 64; }
// Whether variant v runs at head_dim D on this GPU: its shared memory fits, and 4 blocks per SM only at D = 64 (at
// D = 128 four blocks of 85 KB exceed every GPU's shared memory per SM: the bound would only cost registers)
static inline bool attention_forward_available(int D, AttentionForwardVariant v) {
    return (size_t)attention_forward_smem(D, attention_forward_rows(v)) <= g_cuda.shared_per_block_optin && !(v == ATTN_FWD_64_OCC4 && D != 64);
}
// Backward: the dq kernel with 64 or 128 query rows per block (4 or 8 warps; 128 rows: each K/V tile loaded once
// for twice the rows, K/V always double-buffered), the dK/dV kernel with 64 or 128 keys (each Q/dY tile loaded
// once for twice the keys), in the four combinations.
enum AttentionBackwardVariant { ATTN_BWD_64_64, ATTN_BWD_128_64, ATTN_BWD_64_128, ATTN_BWD_128_128, ATTN_BWD_VARIANTS };
static const char* const ATTN_BWD_NAMES[ATTN_BWD_VARIANTS] = {"dq 64 rows, dK/dV 64 keys", "dq 128 rows, dK/dV 64 keys",
                                                              "dq 64 rows, dK/dV 128 keys", "dq 128 rows, dK/dV 128 keys"};
static inline int attention_dq_rows(AttentionBackwardVariant v) { return v == ATTN_BWD_128_64 || v == ATTN_BWD_128_128 ? 128 : 64; }
static inline int attention_dkdv_keys(AttentionBackwardVariant v) { return v == ATTN_BWD_64_128 || v == ATTN_BWD_128_128 ? 128 : 64; }
static inline int attention_dq_variant_smem(int D, AttentionBackwardVariant v) {
    return attention_dq_rows(v) == 128 ? attention_dq_smem(D, 128, 2) : attention_dq_smem(D, ATT_TILE, attention_dq_stages(D));
}
static inline bool attention_backward_available(int D, AttentionBackwardVariant v) {
    return (size_t)std::max(attention_dq_variant_smem(D, v), attention_dkdv_smem(D, attention_dkdv_keys(v))) <= g_cuda.shared_per_block_optin;
}

// Which variant a GPU runs: the fastest measured on it (dev/gpu_results.md), by compute capability (major) and
// head_dim, the first row of the kernel's table that matches; 0 matches any. No GPU has timed the variants yet,
// so each table holds only its catch-all row: the kernels as first written, everywhere. XSA_ATTN_FORWARD=0|1|2
// and XSA_ATTN_BACKWARD=0|1|2|3 pick one on every GPU (for timing). A variant not available here falls back to
// the first.
struct AttentionVariantChoice {
    int cc_major, head_dim, variant;
};
static const AttentionVariantChoice ATTN_FWD_CHOICES[] = {{0, 0, ATTN_FWD_64}};
static const AttentionVariantChoice ATTN_BWD_CHOICES[] = {{0, 0, ATTN_BWD_64_64}};
template <size_t N>
static inline int attention_variant_choice(const char* env, int variants, const AttentionVariantChoice (&table)[N], int D) {
    if (const char* s = getenv(env)) {
        const int i = parse_int32(env, s);
        if (i < 0 || i >= variants) fail("%s=%d: the variants are 0 to %d", env, i, variants - 1);
        return i;
    }
    for (const AttentionVariantChoice& c : table)
        if ((c.cc_major == 0 || c.cc_major == g_cuda.cc_major) && (c.head_dim == 0 || c.head_dim == D)) return c.variant;
    return 0;
}
static inline AttentionForwardVariant attention_forward_variant(int D) {
    const auto v = (AttentionForwardVariant)attention_variant_choice("XSA_ATTN_FORWARD", ATTN_FWD_VARIANTS, ATTN_FWD_CHOICES, D);
    return attention_forward_available(D, v) ? v : ATTN_FWD_64;
}
static inline AttentionBackwardVariant attention_backward_variant(int D) {
    const auto v = (AttentionBackwardVariant)attention_variant_choice("XSA_ATTN_BACKWARD", ATTN_BWD_VARIANTS, ATTN_BWD_CHOICES, D);
    return attention_backward_available(D, v) ? v : ATTN_BWD_64_64;
}

// What the attention kernels of head_dim D take on this GPU, for the start-up lines; stops if one does not fit
static inline std::string attention_kernel_plan(int D) {
    const AttentionForwardVariant fv = attention_forward_variant(D);
    const AttentionBackwardVariant bv = attention_backward_variant(D);
    const int fwd = attention_forward_smem(D, attention_forward_rows(fv)), dq = attention_dq_variant_smem(D, bv);
    const int dkdv = attention_dkdv_smem(D, attention_dkdv_keys(bv));
    const bool double_buffered = attention_dq_rows(bv) == 128 || attention_dq_stages(D) == 2;
    attention_check_smem("forward", D, fwd);
    attention_check_smem("dq", D, dq);
    attention_check_smem("dK/dV", D, dkdv);
    char s[256];
    snprintf(s, sizeof s,
             "attention kernels (head_dim %d): shared memory per block forward %d (%s), dq %d (%d rows, K/V %s), dK/dV %d (%d keys) bytes, of %zu",
             D, fwd, ATTN_FWD_NAMES[fv], dq, attention_dq_rows(bv), double_buffered ? "double-buffered" : "single-buffered", dkdv,
             attention_dkdv_keys(bv), g_cuda.shared_per_block_optin);
    return s;
}

// The backward's scratch: one float buffer, regions at fixed offsets, each rounded up to 16 bytes (so all
// start 16-byte aligned when the buffer does):
//   [delta | dy | dv_extra | dv_xsa]
//   delta     (B, H, T) fp32        rowsum(dy * y)                           every path
//   dy        (B, T, H, D) bf16     dL/dz turned into dL/dy by the fused     attention_backward_xsa_cuda
//                                   XSA preprocessing
//   dv_extra  (B, T, Hkv, D) fp32   XSA's self-position dv term (fused)      attention_backward_xsa_cuda
//   dv_xsa    (B, T, Hkv, D) bf16   XSA's dv term on the unfused path, kept  backend.cuh: xsa_backward_cuda,
//                                   past what attention_backward_cuda uses   attention_backward_cuda, add
// A path uses a prefix of the buffer; `floats` is where its last region ends. This function is the one place
// the layout is written: the size, the host wrappers below and backend.cuh all take their offsets from it.
enum AttentionBackwardPath { ATTN_BWD_PLAIN, ATTN_BWD_XSA_FUSED, ATTN_BWD_XSA_UNFUSED };
struct AttentionBackwardScratch {
    size_t delta, dy, dv_extra, dv_xsa;  // offsets, in floats from the start of the scratch
    size_t floats;                       // what the path needs
};
static inline AttentionBackwardScratch attention_backward_scratch(size_t tokens, int H, int Hkv, int D, AttentionBackwardPath path) {
    auto floats_of = [](size_t bytes) { return (bytes + 15) / 16 * 4; };  // a region of `bytes`, in whole 16-byte units
    AttentionBackwardScratch s;
    s.delta = 0;
    s.dy = s.delta + floats_of(tokens * H * sizeof(float));
    s.dv_extra = s.dy + floats_of(tokens * H * D * sizeof(floatX));
    s.dv_xsa = s.dv_extra + floats_of(tokens * Hkv * D * sizeof(float));
    const size_t end = s.dv_xsa + floats_of(tokens * Hkv * D * sizeof(floatX));
    s.floats = path == ATTN_BWD_PLAIN ? s.dy : path == ATTN_BWD_XSA_FUSED ? s.dv_xsa : end;
    return s;
}

// Scratch of attention_backward_cuda (xsa false) or attention_backward_xsa_cuda (xsa true), in floats
static inline size_t attention_backward_scratch_floats(int B, int T, int H, int Hkv, int D, bool xsa) {
    return attention_backward_scratch((size_t)B * T, H, Hkv, D, xsa ? ATTN_BWD_XSA_FUSED : ATTN_BWD_PLAIN).floats;
}

// forward: y (B, T, H, D), lse (B, H, T); z (B, T, H, D) = XSA of y when z != nullptr; with forward variant
// (BQ, MIN_BLOCKS) (attention_forward_variant)
template <int D, int BQ, int MIN_BLOCKS>
static void attention_forward_launch_variant(floatX* z, floatX* y, float* lse, const floatX* q, const floatX* k, const floatX* v,
                                             QKVStrides strides, int B, int T, int H, int Hkv, int window, const float* alpha,
                                             cudaStream_t stream) {
    attention_check_strides(strides);
    const int smem = attention_forward_smem(D, BQ);
    static bool once = [&] {  // > 48 KB of dynamic shared memory must be opted into, once per kernel
        attention_check_smem("forward", D, smem);
        cudaCheck(cudaFuncSetAttribute(attention_forward_kernel<D, BQ, MIN_BLOCKS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)once;
    const dim3 grid(ceil_div(T, BQ), B * H);
    attention_forward_kernel<D, BQ, MIN_BLOCKS><<<grid, BQ * 2, smem, stream>>>(z, y, lse, q, k, v, strides, T, H, Hkv, window,
                                                                              1.0f / sqrtf((float)D), alpha);
    cudaCheckLaunch();
}

template <int D>
static void attention_forward_launch(floatX* z, floatX* y, float* lse, const floatX* q, const floatX* k, const floatX* v,
                                     QKVStrides strides, int B, int T, int H, int Hkv, int window, const float* alpha,
                                     cudaStream_t stream, AttentionForwardVariant variant) {
    if (variant == ATTN_FWD_128) attention_forward_launch_variant<D, 128, 1>(z, y, lse, q, k, v, strides, B, T, H, Hkv, window, alpha, stream);
    else if (variant == ATTN_FWD_64_OCC4 && D == 64)  // (not instantiated at D = 128: attention_forward_available)
        attention_forward_launch_variant<D, 64, D == 64 ? 4 : 1>(z, y, lse, q, k, v, strides, B, T, H, Hkv, window, alpha, stream);
    else attention_forward_launch_variant<D, 64, 1>(z, y, lse, q, k, v, strides, B, T, H, Hkv, window, alpha, stream);
}

// dq (B, T, H, D) from dy and delta (B, H, T), with the dq kernel of BQ rows and KV_STAGES K/V buffers
template <int D, int BQ, int KV_STAGES>
static void attention_dq_launch(floatX* dq, const floatX* dy, const floatX* q, const floatX* k, const floatX* v, QKVStrides strides,
                                const float* lse, const float* delta, int B, int T, int H, int Hkv, int window, cudaStream_t stream) {
    const int smem = attention_dq_smem(D, BQ, KV_STAGES);
    static bool once = [&] {
        attention_check_smem("dq", D, smem);
        cudaCheck(cudaFuncSetAttribute(attention_backward_dq_kernel<D, BQ, KV_STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)once;
    attention_backward_dq_kernel<D, BQ, KV_STAGES><<<dim3(ceil_div(T, BQ), B * H), BQ * 2, smem, stream>>>(
        dq, dy, q, k, v, lse, delta, strides, T, H, Hkv, window, 1.0f / sqrtf((float)D));
    cudaCheckLaunch();
}

// dk, dv (B, T, Hkv, D) from dy and delta (B, H, T), with the dK/dV kernel of BK keys
template <int D, int BK>
static void attention_dkdv_launch(floatX* dk, floatX* dv, const floatX* dy, const floatX* q, const floatX* k, const floatX* v,
                                  QKVStrides strides, const float* lse, const float* delta, const float* dv_extra, int B, int T, int H,
                                  int Hkv, int window, cudaStream_t stream) {
    const int smem = attention_dkdv_smem(D, BK);
    static bool once = [&] {
        attention_check_smem("dK/dV", D, smem);
        cudaCheck(cudaFuncSetAttribute(attention_backward_dkdv_kernel<D, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)once;
    attention_backward_dkdv_kernel<D, BK><<<dim3(ceil_div(T, BK), B * Hkv), BK * 2, smem, stream>>>(
        dk, dv, dy, q, k, v, lse, delta, dv_extra, strides, T, H, Hkv, window, 1.0f / sqrtf((float)D));
    cudaCheckLaunch();
}

// backward given dy (B, T, H, D) and delta (B, H, T): dq, dk, dv, with backward variant `variant`
template <int D>
static void attention_backward_launch(floatX* dq, floatX* dk, floatX* dv, const floatX* dy, const floatX* q,
                                      const floatX* k, const floatX* v, QKVStrides strides, const float* lse, const float* delta,
                                      const float* dv_extra, int B, int T, int H, int Hkv, int window,
                                      cudaStream_t stream, AttentionBackwardVariant variant) {
    attention_check_strides(strides);
    if (attention_dkdv_keys(variant) == 128)
        attention_dkdv_launch<D, 128>(dk, dv, dy, q, k, v, strides, lse, delta, dv_extra, B, T, H, Hkv, window, stream);
    else attention_dkdv_launch<D, 64>(dk, dv, dy, q, k, v, strides, lse, delta, dv_extra, B, T, H, Hkv, window, stream);
    if (attention_dq_rows(variant) == 128) attention_dq_launch<D, 128, 2>(dq, dy, q, k, v, strides, lse, delta, B, T, H, Hkv, window, stream);
    else if (attention_dq_stages(D) == 2) attention_dq_launch<D, 64, 2>(dq, dy, q, k, v, strides, lse, delta, B, T, H, Hkv, window, stream);
    else attention_dq_launch<D, 64, 1>(dq, dy, q, k, v, strides, lse, delta, B, T, H, Hkv, window, stream);
}

// The variants this GPU runs at head_dim D (attention_forward_variant, attention_backward_variant, looked up
// once), unless `variant` names one
static inline AttentionForwardVariant attention_forward_variant_for(int D, AttentionForwardVariant variant) {
    static const AttentionForwardVariant chosen[2] = {attention_forward_variant(64), attention_forward_variant(128)};
    return variant != ATTN_FWD_VARIANTS ? variant : chosen[D == 128];
}
static inline AttentionBackwardVariant attention_backward_variant_for(int D, AttentionBackwardVariant variant) {
    static const AttentionBackwardVariant chosen[2] = {attention_backward_variant(64), attention_backward_variant(128)};
    return variant != ATTN_BWD_VARIANTS ? variant : chosen[D == 128];
}

// q (B, T, H, D), k, v (B, T, Hkv, D), rows `at` apart; y (B, T, H, D); lse (B, H, T). Pointers and strides
// 16-byte aligned. variant: the forward kernel's (ATTN_FWD_VARIANTS: this GPU's; attention_check times each).
static inline void attention_forward_cuda(floatX* y, float* lse, const floatX* q, const floatX* k, const floatX* v, QKVStrides strides,
                                          int B, int T, int H, int Hkv, int D, int window, cudaStream_t stream,
                                          AttentionForwardVariant variant = ATTN_FWD_VARIANTS) {
    attention_check_shape(B, T, H, Hkv, D, window, "attention_forward_cuda");
    window = std::min(window, T);  // a window past T changes nothing, and keeps k0 + window from overflowing
    variant = attention_forward_variant_for(D, variant);
    if (D == 64) attention_forward_launch<64>(nullptr, y, lse, q, k, v, strides, B, T, H, Hkv, window, nullptr, stream, variant);
    else attention_forward_launch<128>(nullptr, y, lse, q, k, v, strides, B, T, H, Hkv, window, nullptr, stream, variant);
}

// as attention_forward_cuda, plus z (B, T, H, D) = y - alpha proj_v(y) with the token's own v (y kept);
// alpha (H) in device memory
static inline void attention_forward_xsa_cuda(floatX* z, floatX* y, float* lse, const floatX* q, const floatX* k,
                                              const floatX* v, QKVStrides strides, int B, int T, int H, int Hkv, int D, int window,
                                              const float* alpha, cudaStream_t stream, AttentionForwardVariant variant = ATTN_FWD_VARIANTS) {
    attention_check_shape(B, T, H, Hkv, D, window, "attention_forward_xsa_cuda");
    window = std::min(window, T);
    variant = attention_forward_variant_for(D, variant);
    if (D == 64) attention_forward_launch<64>(z, y, lse, q, k, v, strides, B, T, H, Hkv, window, alpha, stream, variant);
    else attention_forward_launch<128>(z, y, lse, q, k, v, strides, B, T, H, Hkv, window, alpha, stream, variant);
}

// Generation: y (B, H, D) from q (B, H, D; rows q_stride apart) at positions pos (B, device) over k_cache, v_cache
// (B, S, Hkv, D)
static inline void attention_decode_cuda(floatX* y, const floatX* q, size_t q_stride, const floatX* k_cache, const floatX* v_cache,
                                         const int* pos, int B, int S, int H, int Hkv, int D, int window, cudaStream_t stream) {
    attention_check_shape(B, S, H, Hkv, D, window, "attention_decode_cuda");
    const float scale = 1.0f / sqrtf((float)D);
    if (D == 64)
        attention_decode_kernel<64><<<B * H, DECODE_THREADS, 0, stream>>>(y, q, q_stride, k_cache, v_cache, pos, S, H, Hkv, window, scale);
    else attention_decode_kernel<128><<<B * H, DECODE_THREADS, 0, stream>>>(y, q, q_stride, k_cache, v_cache, pos, S, H, Hkv, window, scale);
    cudaCheckLaunch();
}

// dy, y (B, T, H, D); q (B, T, H, D), k, v (B, T, Hkv, D), rows `at` apart; lse (B, H, T) -> dq (B, T, H,
// D), dk, dv (B, T, Hkv, D), rows `at` apart, all OVERWRITTEN. scratch: attention_backward_scratch_floats(B,
// T, H, Hkv, D, false) floats. variant: the backward kernels' (ATTN_BWD_VARIANTS: this GPU's; attention_check times each).
static inline void attention_backward_cuda(floatX* dq, floatX* dk, floatX* dv, const floatX* dy, const floatX* q,
                                           const floatX* k, const floatX* v, QKVStrides strides, const floatX* y, const float* lse,
                                           int B, int T, int H, int Hkv, int D, int window, float* scratch,
                                           cudaStream_t stream, AttentionBackwardVariant variant = ATTN_BWD_VARIANTS) {
    attention_check_shape(B, T, H, Hkv, D, window, "attention_backward_cuda");
    window = std::min(window, T);
    variant = attention_backward_variant_for(D, variant);
    float* delta = scratch + attention_backward_scratch((size_t)B * T, H, Hkv, D, ATTN_BWD_PLAIN).delta;
    const size_t rows = (size_t)B * T * H;
    const int grid = ceil_div((long)rows, XSA_THREADS / 32);
    if (D == 64) {
        attention_delta_kernel<64><<<grid, XSA_THREADS, 0, stream>>>(delta, dy, y, rows, T, H);
        cudaCheckLaunch();
        attention_backward_launch<64>(dq, dk, dv, dy, q, k, v, strides, lse, delta, nullptr, B, T, H, Hkv, window, stream, variant);
    } else {
        attention_delta_kernel<128><<<grid, XSA_THREADS, 0, stream>>>(delta, dy, y, rows, T, H);
        cudaCheckLaunch();
        attention_backward_launch<128>(dq, dk, dv, dy, q, k, v, strides, lse, delta, nullptr, B, T, H, Hkv, window, stream, variant);
    }
}

// The fused XSA backward: dz (B, T, H, D) is dL/dz; y the attention output the forward kept. The
// preprocessing (xsa_backward_kernel, one warp per (token, kv head)) writes dy = dz - alpha_h (u/n) v to
// scratch (bf16), delta = rowsum(dy y), the XSA self-position dv term (fp32), and, when dalpha is not null
// (learnable alpha), the per-token shares of dL/dalpha (B*T, H); the dK/dV kernel adds the dv term to its
// accumulator before rounding. alpha (H) in device memory. dq, dk, dv OVERWRITTEN; q, k, v, dq, dk, dv rows
// `at` apart. scratch: attention_backward_scratch_floats(B, T, H, Hkv, D, true) floats. variant: as attention_backward_cuda's.
static inline void attention_backward_xsa_cuda(floatX* dq, floatX* dk, floatX* dv, const floatX* dz, const floatX* q,
                                               const floatX* k, const floatX* v, QKVStrides strides, const floatX* y, const float* lse,
                                               int B, int T, int H, int Hkv, int D, int window, const float* alpha,
                                               float* dalpha, float* scratch, cudaStream_t stream,
                                               AttentionBackwardVariant variant = ATTN_BWD_VARIANTS) {
    attention_check_shape(B, T, H, Hkv, D, window, "attention_backward_xsa_cuda");
    window = std::min(window, T);
    variant = attention_backward_variant_for(D, variant);
    const size_t tokens = (size_t)B * T;
    const AttentionBackwardScratch s = attention_backward_scratch(tokens, H, Hkv, D, ATTN_BWD_XSA_FUSED);
    floatX* dy = reinterpret_cast<floatX*>(scratch + s.dy);
    float* dv_extra = scratch + s.dv_extra;
    float* delta = scratch + s.delta;
    const int grid = ceil_div((long)(tokens * Hkv), XSA_THREADS / 32);
    if (D == 64) {
        xsa_backward_kernel<64, true><<<grid, XSA_THREADS, 0, stream>>>(dy, nullptr, 0, dv_extra, delta, dalpha, dz, y, v, strides.kv, tokens, T, H, Hkv,
                                                                  alpha);
        cudaCheckLaunch();
        attention_backward_launch<64>(dq, dk, dv, dy, q, k, v, strides, lse, delta, dv_extra, B, T, H, Hkv, window, stream, variant);
    } else {
        xsa_backward_kernel<128, true><<<grid, XSA_THREADS, 0, stream>>>(dy, nullptr, 0, dv_extra, delta, dalpha, dz, y, v, strides.kv, tokens, T, H, Hkv,
                                                                  alpha);
        cudaCheckLaunch();
        attention_backward_launch<128>(dq, dk, dv, dy, q, k, v, strides, lse, delta, dv_extra, B, T, H, Hkv, window, stream, variant);
    }
}

#endif  // __CUDACC__
