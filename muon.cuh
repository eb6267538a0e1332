// muon.cuh: Muon as nanochat runs it (spec 3.3), for one (rows, cols) matrix at a time; a group of
// same-shape matrices is a loop over this (each matrix is independent, which is what lets the
// distributed version give each rank whole matrices).
//
// Per matrix, with momentum mu, NorMuon beta2 = 0.9:
//   1. Nesterov momentum:   M += (1 - mu)(G - M);  U = G + mu (M - G)
//   2. MuonEq (optional):   every row of U rescaled to the RMS row norm ||U||_F / sqrt(rows)
//   3. normalise:           X = U / (1.01 ||U||_F + 1e-6)
//   4. Polar Express:       5 odd polynomial steps towards the nearest semi-orthogonal matrix
//   5. Muon+ (optional):    O *= sqrt(min(rows, cols)) / ||O||_F
//   6. NorMuon:             per-row (rows >= cols) or per-column second moment S of O, O scaled by
//                           1/sqrt(S) and then back to its Frobenius norm
//   7. update:              lr_eff = lr sqrt(max(1, rows/cols)); cautious weight decay only where the
//                           update and the weight agree in sign: P -= lr_eff O + lr_eff wd P [O P >= 0]
#pragma once

#include <vector>
#include "common.h"
#include "matmul.cuh"

static const float MUON_BETA2 = 0.9f;
static const int POLAR_EXPRESS_STEPS = 5;
// (a, b, c) per step: X <- a X + (b A + c A^2) X, A = X X^T (Amsel et al. 2505.16932, safety 2e-2, cushion 2)
static const float POLAR_EXPRESS_COEFFS[POLAR_EXPRESS_STEPS][3] = {
    {8.156554524902461f, -22.48329292557795f, 15.878769915207462f},
    {4.042929935166739f, -2.808917465908714f, 0.5000178451051316f},
    {3.8916678022926607f, -2.772484153217685f, 0.5060648178503393f},
    {3.285753657755655f, -2.3681294933425376f, 0.46449024233003106f},
    {2.3465413258596377f, -1.7097828382687081f, 0.42323551169305323f},
};

// Number of floats of NorMuon state for a (rows, cols) matrix: one per row if rows >= cols, else per column.
static inline size_t normuon_state_size(int rows, int cols) { return (size_t)(rows >= cols ? rows : cols); }

// ----------------------------------------------------------------------------------------------------
// CPU backend

static inline double frobenius_norm(const float* x, size_t n) { return sqrt(dot_deterministic(x, x, n)); }

// X (rows, cols) in place -> its Polar Express approximation of the orthogonal polar factor.
// Works on the smaller Gram matrix: A = X X^T (wide or square) or A = X^T X (tall), so every GEMM
// is at most (k, k) x (k, max) with k = min(rows, cols).
static inline void polar_express_cpu(float* X, int rows, int cols) {
    const bool tall = rows > cols;
    const int k = tall ? cols : rows;
    const size_t n = (size_t)rows * cols;
    std::vector<float> A((size_t)k * k), AA((size_t)k * k), T(n);
    for (int step = 0; step < POLAR_EXPRESS_STEPS; step++) {
        const float a = POLAR_EXPRESS_COEFFS[step][0], b = POLAR_EXPRESS_COEFFS[step][1], c = POLAR_EXPRESS_COEFFS[step][2];
        if (tall) gemm_cpu(A.data(), X, X, k, k, rows, cols, cols, k, true, false, false);   // X^T X
        else gemm_cpu(A.data(), X, X, k, k, cols, cols, cols, k, false, true, false);        // X X^T
        gemm_cpu(AA.data(), A.data(), A.data(), k, k, k, k, k, k, false, false, false);
        for (size_t i = 0; i < (size_t)k * k; i++) A[i] = b * A[i] + c * AA[i];             // A <- b A + c A^2
        if (tall) gemm_cpu(T.data(), X, A.data(), rows, cols, cols, cols, k, cols, false, false, false);  // X A
        else gemm_cpu(T.data(), A.data(), X, rows, cols, rows, k, cols, cols, false, false, false);       // A X
#pragma omp parallel for schedule(static)
        for (long i = 0; i < (long)n; i++) X[i] = a * X[i] + T[i];
    }
}

// One Muon step for the matrix P (rows, cols) with gradient G, momentum buffer M (rows, cols) and
// NorMuon state S (normuon_state_size). `work` is scratch of rows*cols floats.
static inline void muon_update_cpu(float* P, const float* G, float* M, float* S, float* work, int rows, int cols, float lr,
                                   float momentum, float wd, bool muon_eq, bool muon_plus) {
    const size_t n = (size_t)rows * cols;
    float* X = work;
    // 1. Nesterov momentum
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) {
        M[i] += (1.0f - momentum) * (G[i] - M[i]);
        X[i] = G[i] + momentum * (M[i] - G[i]);
    }
    // 2. MuonEq: equal row norms
    if (muon_eq) {
        float target = (float)(frobenius_norm(X, n) / sqrt((double)rows));
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++) {
            float* row = X + (size_t)r * cols;
            double ss = 0.0;
            for (int j = 0; j < cols; j++) ss += (double)row[j] * row[j];
            float scale = target / fmaxf((float)sqrt(ss), 1e-6f);
            for (int j = 0; j < cols; j++) row[j] *= scale;
        }
    }
    // 3. Frobenius normalisation (the 1.01 keeps the spectrum safely inside Polar Express's interval)
    float inv = 1.0f / ((float)frobenius_norm(X, n) * 1.01f + 1e-6f);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)n; i++) X[i] *= inv;
    // 4. orthogonalise
    polar_express_cpu(X, rows, cols);
    // 5. Muon+: Frobenius norm sqrt(min(rows, cols)), that of an exactly semi-orthogonal matrix
    if (muon_plus) {
        float scale = sqrtf((float)(rows < cols ? rows : cols)) / fmaxf((float)frobenius_norm(X, n), 1e-6f);
#pragma omp parallel for schedule(static)
        for (long i = 0; i < (long)n; i++) X[i] *= scale;
    }
    // 6. NorMuon: v = mean of O^2 along the reduced dimension (columns for per-row state, rows otherwise)
    const bool per_row = rows >= cols;
    const int ns = per_row ? rows : cols, reduced = per_row ? cols : rows;
    std::vector<double> mean_sq(ns, 0.0);
    if (per_row) {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++) {
            double ss = 0.0;
            for (int j = 0; j < cols; j++) ss += (double)X[(size_t)r * cols + j] * X[(size_t)r * cols + j];
            mean_sq[r] = ss / cols;
        }
    } else {
        for (int r = 0; r < rows; r++)  // row order: a fixed summation order for every column
            for (int j = 0; j < cols; j++) mean_sq[j] += (double)X[(size_t)r * cols + j] * X[(size_t)r * cols + j];
        for (int j = 0; j < cols; j++) mean_sq[j] /= rows;
    }
    double sum_v = 0.0, sum_scaled = 0.0;
    std::vector<float> step(ns);
    for (int i = 0; i < ns; i++) {
        float v = (float)mean_sq[i];
        S[i] += (1.0f - MUON_BETA2) * (v - S[i]);
        step[i] = 1.0f / sqrtf(fmaxf(S[i], 1e-10f));
        sum_v += v;
        sum_scaled += (double)v * reduced * step[i] * step[i];
    }
    float norm_before = (float)sqrt(sum_v * reduced);
    float norm_after = (float)sqrt(sum_scaled);
    float restore = norm_before / fmaxf(norm_after, 1e-10f);
    // 7. shape-scaled lr, cautious weight decay, update
    const float lr_eff = lr * sqrtf(fmaxf(1.0f, (float)rows / (float)cols));
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            size_t i = (size_t)r * cols + j;
            float o = X[i] * (per_row ? step[r] : step[j]) * restore;
            float p = P[i];
            float decay = (o * p >= 0.0f) ? lr_eff * wd * p : 0.0f;
            P[i] = p - (lr_eff * o + decay);
        }
}

// CUDA backend: stacked matrices with batched bf16 GEMMs come with issue #6.
