// xsa.cuh: Exclusive Self-Attention (Zhai 2026; ../shared/spec/xsa.md). After attention and before
// c_proj, each query head's output y_i loses (a fraction alpha of) its component along the token's own
// value vector v_i (of the kv head that the query head reads, after the value-embedding mix):
//     z_i = y_i - alpha * (y_i . v_i) / (v_i . v_i + eps) * v_i
// alpha = 0 gives z = y exactly (y - 0 * ...), so the op may run with alpha = 0 and stay bit-identical.
#pragma once

#include "common.h"

// Added to v.v so that an all-zero value vector gives z = y instead of 0/0 (modded-nanogpt clamps at 1e-8).
static const float XSA_EPS = 1e-8f;

// ----------------------------------------------------------------------------------------------------
// CPU backend (templated on the scalar type so the tests can check the backward by finite differences
// in double precision; the model uses float)

// y (B*T, H, D), v (B*T, Hkv, D) -> z (B*T, H, D)
template <typename real>
static inline void xsa_forward_cpu(real* z, const real* y, const real* v, size_t tokens, int H, int Hkv, int D, real alpha) {
    const int group = H / Hkv;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)tokens; n++)
        for (int h = 0; h < H; h++) {
            const real* yi = y + ((size_t)n * H + h) * D;
            const real* vi = v + ((size_t)n * Hkv + h / group) * D;
            real* zi = z + ((size_t)n * H + h) * D;
            real s = 0, vv = 0;
            for (int d = 0; d < D; d++) {
                s += yi[d] * vi[d];
                vv += vi[d] * vi[d];
            }
            real coef = alpha * (s / (vv + (real)XSA_EPS));
            for (int d = 0; d < D; d++) zi[d] = yi[d] - coef * vi[d];
        }
}

// With g = dL/dz, n = v.v + eps, p = (y.v) / n, u = g.v:
//   dy = g - alpha (u / n) v                                  (overwrites dy)
//   dv += -alpha ((u / n) y + p g - 2 p (u / n) v)            (accumulated over the query heads of a kv head)
// dz, y, dy (B*T, H, D); v, dv (B*T, Hkv, D). dy may alias dz (each row is read before it is written).
template <typename real>
static inline void xsa_backward_cpu(real* dy, real* dv, const real* dz, const real* y, const real* v,
                                    size_t tokens, int H, int Hkv, int D, real alpha) {
    const int group = H / Hkv;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)tokens; n++)
        for (int kvh = 0; kvh < Hkv; kvh++) {
            const real* vi = v + ((size_t)n * Hkv + kvh) * D;
            real* dvi = dv + ((size_t)n * Hkv + kvh) * D;
            real vv = 0;
            for (int d = 0; d < D; d++) vv += vi[d] * vi[d];
            real nrm = vv + (real)XSA_EPS;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                const real* yi = y + ((size_t)n * H + h) * D;
                const real* gi = dz + ((size_t)n * H + h) * D;
                real* dyi = dy + ((size_t)n * H + h) * D;
                real s = 0, u = 0;
                for (int d = 0; d < D; d++) {
                    s += yi[d] * vi[d];
                    u += gi[d] * vi[d];
                }
                real p = s / nrm, un = u / nrm;
                for (int d = 0; d < D; d++) {
                    real g = gi[d];
                    dvi[d] += -alpha * (un * yi[d] + p * g - 2 * p * un * vi[d]);
                    dyi[d] = g - alpha * un * vi[d];
                }
            }
        }
}

// CUDA backend: the unfused twin and the version fused into attention come with issue #6.
