// embedding.cuh: the token-indexed ops: embedding lookups (wte, value embeddings) and their scatter-add
// backward, the smear of the previous token's embedding, and the value-embedding gate.
#pragma once

#include "common.h"

// channels of the current token's normed embedding that drive the smear gate (nanochat: 24)
static const int SMEAR_CHANNELS = 24;
// channels of the normed block input that drive the value-embedding gate (nanochat: 12)
static const int VE_GATE_CHANNELS = 12;

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ----------------------------------------------------------------------------------------------------
// CPU backend

// out (N, C) = table[idx[n]]   (table (rows, C); ids were validated against the vocab by the caller)
static inline void embedding_forward_cpu(float* out, const int* idx, const float* table, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) memcpy(out + (size_t)n * C, table + (size_t)idx[n] * C, C * sizeof(float));
}

// dtable[idx[n]] += dout[n] for n in order. Threads split the channels, not the tokens, so two tokens
// with the same id never race and the order of the sum is fixed.
static inline void embedding_backward_cpu(float* dtable, const int* idx, const float* dout, size_t N, int C) {
    const int chunk = 64;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += chunk) {
        int c1 = c0 + chunk < C ? c0 + chunk : C;
        for (size_t n = 0; n < N; n++) {
            float* dst = dtable + (size_t)idx[n] * C;
            const float* g = dout + n * C;
            for (int c = c0; c < c1; c++) dst[c] += g[c];
        }
    }
}

// Smear: for t >= 1, out_t = x_t + lambda * sigmoid(w . x_t[0:24]) * x_{t-1}; out_0 = x_0.
// x, out (B, T, C); gate_logit (B, T) keeps w . x_t[0:24] for the backward.
static inline void smear_forward_cpu(float* out, float* gate_logit, const float* x, const float* w, float lambda, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            const float* xt = x + n * C;
            float* ot = out + n * C;
            if (t == 0) {
                memcpy(ot, xt, C * sizeof(float));
                gate_logit[n] = 0.0f;
                continue;
            }
            float a = 0.0f;
            for (int c = 0; c < SMEAR_CHANNELS; c++) a += w[c] * xt[c];
            gate_logit[n] = a;
            float g = lambda * sigmoidf(a);
            const float* xp = xt - C;
            for (int c = 0; c < C; c++) ot[c] = xt[c] + g * xp[c];
        }
}

// dx (B, T, C) += dL/dx through the smear; dw (24) and dlambda (1) accumulate. dout (B, T, C).
static inline void smear_backward_cpu(float* dx, float* dw, float* dlambda, const float* dout, const float* x,
                                      const float* gate_logit, const float* w, float lambda, int B, int T, int C) {
    // per token: dL/d(gate) = dout_t . x_{t-1}; the (N x 25) parameter partials are summed serially below
    size_t N = (size_t)B * T;
    std::vector<float> dgate(N, 0.0f);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        if (n % T == 0) continue;
        const float* g = dout + n * C;
        const float* xp = x + (n - 1) * C;
        float acc = 0.0f;
        for (int c = 0; c < C; c++) acc += g[c] * xp[c];
        dgate[n] = acc;
    }
    // dx_t = dout_t + (gate_{t+1} dout_{t+1}) + (da_t w on the first 24 channels)
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        float* dxt = dx + n * C;
        const float* g = dout + n * C;
        for (int c = 0; c < C; c++) dxt[c] += g[c];
        if ((n + 1) % T != 0) {  // the next token in the row smears this one in
            float gate_next = lambda * sigmoidf(gate_logit[n + 1]);
            const float* gn = dout + (n + 1) * C;
            for (int c = 0; c < C; c++) dxt[c] += gate_next * gn[c];
        }
        if (n % T != 0) {
            float sg = sigmoidf(gate_logit[n]);
            float da = dgate[n] * lambda * sg * (1.0f - sg);
            for (int c = 0; c < SMEAR_CHANNELS; c++) dxt[c] += da * w[c];
        }
    }
    double dl = 0.0;
    std::vector<double> dwacc(SMEAR_CHANNELS, 0.0);
    for (size_t n = 0; n < N; n++) {
        if (n % T == 0) continue;
        float sg = sigmoidf(gate_logit[n]);
        dl += (double)dgate[n] * sg;
        float da = dgate[n] * lambda * sg * (1.0f - sg);
        const float* xt = x + n * C;
        for (int c = 0; c < SMEAR_CHANNELS; c++) dwacc[c] += (double)da * xt[c];
    }
    *dlambda += (float)dl;
    for (int c = 0; c < SMEAR_CHANNELS; c++) dw[c] += (float)dwacc[c];
}

// Value-embedding mix (ResFormer style), in place on v (N, Hkv, D):
//   gate[n, g] = 3 * sigmoid(h[n, 0:12] . wg[g, :]);  v[n, g, :] += gate[n, g] * ve[n, g, :]
// h (N, C) is the normed block input, wg (Hkv, 12), ve (N, Hkv*D) the looked-up table rows; gate (N, Hkv).
static inline void value_embed_forward_cpu(float* v, float* gate, const float* h, const float* wg, const float* ve,
                                           size_t N, int C, int Hkv, int D) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++)
        for (int g = 0; g < Hkv; g++) {
            float a = 0.0f;
            for (int c = 0; c < VE_GATE_CHANNELS; c++) a += h[(size_t)n * C + c] * wg[g * VE_GATE_CHANNELS + c];
            float gt = 3.0f * sigmoidf(a);
            gate[(size_t)n * Hkv + g] = gt;
            float* vr = v + ((size_t)n * Hkv + g) * D;
            const float* er = ve + ((size_t)n * Hkv + g) * D;
            for (int d = 0; d < D; d++) vr[d] += gt * er[d];
        }
}

// Backward of the mix given dv (N, Hkv, D): dve (N, Hkv*D) = gate * dv (overwrites), dh[:, 0:12] +=,
// dwg (Hkv, 12) +=. d(3 sigmoid(a))/da = gate * (1 - gate / 3).
static inline void value_embed_backward_cpu(float* dve, float* dh, float* dwg, const float* dv, const float* gate,
                                            const float* h, const float* wg, const float* ve, size_t N, int C, int Hkv, int D) {
    std::vector<float> da(N * Hkv);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++)
        for (int g = 0; g < Hkv; g++) {
            size_t row = ((size_t)n * Hkv + g) * D;
            float gt = gate[(size_t)n * Hkv + g];
            float dgate = 0.0f;
            for (int d = 0; d < D; d++) {
                dgate += dv[row + d] * ve[row + d];
                dve[row + d] = gt * dv[row + d];
            }
            float dan = dgate * gt * (1.0f - gt / 3.0f);
            da[(size_t)n * Hkv + g] = dan;
            for (int c = 0; c < VE_GATE_CHANNELS; c++) dh[(size_t)n * C + c] += dan * wg[g * VE_GATE_CHANNELS + c];
        }
    // dwg: a (Hkv x 12) sum over all tokens, in token order
    for (int g = 0; g < Hkv; g++) {
        double acc[VE_GATE_CHANNELS] = {0};
        for (size_t n = 0; n < N; n++)
            for (int c = 0; c < VE_GATE_CHANNELS; c++) acc[c] += (double)da[n * Hkv + g] * h[n * C + c];
        for (int c = 0; c < VE_GATE_CHANNELS; c++) dwg[g * VE_GATE_CHANNELS + c] += (float)acc[c];
    }
}

// CUDA backend: the twins of these functions come with issue #6.
