// attention.cuh: causal self-attention with a sliding window and grouped-query heads, flash-style:
// the forward keeps only the log-sum-exp of each softmax row, and the backward recomputes the
// probabilities from it, so no (T, T) matrix is ever stored.
//
// Query token i of query head h attends to keys j with i - window <= j <= i (window + 1 keys, as FA3's
// window_size=(window, 0)), reading kv head h / (H / Hkv). Softmax scale 1/sqrt(D).
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend (templated on the scalar type so the tests can check the backward by finite differences
// in double precision; the model uses float)

// q (B, T, H, D), k, v (B, T, Hkv, D) -> y (B, T, H, D), lse (B, H, T)
template <typename real>
static inline void attention_forward_cpu(real* y, real* lse, const real* q, const real* k, const real* v,
                                         int B, int T, int H, int Hkv, int D, int window) {
    const real scale = (real)1 / std::sqrt((real)D);
    const int group = H / Hkv;
#pragma omp parallel
    {
        std::vector<real> scores(T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kvh = h / group;
                for (int i = 0; i < T; i++) {
                    const real* qi = q + (((size_t)b * T + i) * H + h) * D;
                    real* yi = y + (((size_t)b * T + i) * H + h) * D;
                    int j0 = i - window > 0 ? i - window : 0;
                    real row_max = -INFINITY;
                    for (int j = j0; j <= i; j++) {
                        const real* kj = k + (((size_t)b * T + j) * Hkv + kvh) * D;
                        real s = 0;
                        for (int d = 0; d < D; d++) s += qi[d] * kj[d];
                        s *= scale;
                        scores[j] = s;
                        row_max = s > row_max ? s : row_max;
                    }
                    real sum = 0;
                    for (int d = 0; d < D; d++) yi[d] = 0;
                    for (int j = j0; j <= i; j++) {
                        real p = std::exp(scores[j] - row_max);
                        sum += p;
                        const real* vj = v + (((size_t)b * T + j) * Hkv + kvh) * D;
                        for (int d = 0; d < D; d++) yi[d] += p * vj[d];
                    }
                    real inv_sum = 1 / sum;
                    for (int d = 0; d < D; d++) yi[d] *= inv_sum;
                    lse[((size_t)b * H + h) * T + i] = row_max + std::log(sum);
                }
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
static inline void attention_backward_cpu(real* dq, real* dk, real* dv, const real* dy, const real* q,
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
                        real delta = 0;
                        for (int d = 0; d < D; d++) delta += dyi[d] * yi[d];
                        for (int j = j0; j <= i; j++) {
                            size_t kvrow = (((size_t)b * T + j) * Hkv + kvh) * D;
                            const real* kj = k + kvrow;
                            const real* vj = v + kvrow;
                            real s = 0, dp = 0;
                            for (int d = 0; d < D; d++) {
                                s += qi[d] * kj[d];
                                dp += dyi[d] * vj[d];
                            }
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

// CUDA backend: flash-style kernels with the XSA epilogue fused come with issue #6.
