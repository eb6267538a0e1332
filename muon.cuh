// muon.cuh: Muon as nanochat runs it (dev/docs/optim.md#muon), for one (rows, cols) matrix at a time; a group of
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
//
// CUDA (bottom of this file): a whole group -- K same-shape matrices -- in one call, Polar Express as
// strided-batched bf16 GEMMs over the stack (cuBLASLt, fp32 accumulate), every norm and mean a fixed-order
// block reduction (no atomics):
//   struct MuonScratch;                                       // bf16 stack copies, Gram stacks, statistics
//   muon_scratch_alloc(&scratch, K, rows, cols);              // once per group shape
//   muon_update_cuda(params, grads, momentum, state, &scratch, lr, mu, wd, muon_eq, muon_plus, stream);
//     params, grads: device arrays of K device pointers to the (rows, cols) fp32 matrices;
//     momentum (K, rows, cols) and state (K, normuon_state_size(rows, cols)) fp32, stacked, in place.
// Same steps as the CPU twin; differences, all inside bf16 rounding: the Nesterov update is cast to bf16
// before MuonEq (as nanochat does), MuonEq and the normalisation are applied with one bf16 rounding, the
// Polar Express iterates are bf16, Muon+ is folded into the NorMuon factor. Expected distance from the CPU
// twin: 1.4-3.5e-2 relative on the update (bf16 Polar Express), see dev/cuda/optim_check.cu.
#pragma once

#include <vector>
#include "llmc/common.h"
#include "llmc/matmul.cuh"

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

// ----------------------------------------------------------------------------------------------------
// CUDA backend: one call updates a stack of K same-shape (rows, cols) matrices -- a Muon group,
// or the part of it one rank owns -- with batched bf16 GEMMs for Polar Express.
//
//   MuonScratch s;  muon_scratch_alloc(&s, K, rows, cols);     // once per (K, rows, cols), at start-up
//   muon_update_cuda(params, grads, momentum, state, &s, lr, mu, wd, muon_eq, muon_plus, stream);  // every step
//
//   params     device array of K device pointers, params[k] -> P_k (rows, cols) fp32, updated in place
//   grads      device array of K device pointers, grads[k] -> G_k (rows, cols) fp32 (already averaged)
//              (pointer arrays: the matrices of a group are scattered over the parameter/gradient buffers;
//              the arrays are built and uploaded once by the caller, they never change)
//   momentum   (K, rows, cols) fp32, stacked Nesterov buffers, updated in place
//   state      (K, normuon_state_size(rows, cols)) fp32, stacked NorMuon second moments, updated in place
//   lr, mu, wd the group's scheduled lr (before the shape scale), momentum and weight decay (host floats:
//              the optimizer is not captured in a graph)
//
// Steps, each the CUDA twin of the same step of muon_update_cpu (all reductions in fp32, fixed order,
// no atomics; one block per row or per matrix owns each sum):
//   1. momentum kernel (one block per row): M += (1 - mu)(G - M); X = bf16(G + mu (M - G)); the row's
//      sum of squares of X (the bf16 values, as nanochat computes MuonEq on the bf16 cast);
//   2. prescale kernel (one block per matrix): ||X||_F, MuonEq row scales target / max(||X_r||, 1e-6), the
//      Frobenius norm after MuonEq (sum_r scale_r^2 ||X_r||^2, exact in real arithmetic), and the
//      normalisation 1 / (1.01 ||.||_F + 1e-6) folded into one factor per row;
//   3. rowscale kernel: X = bf16(X * factor_r) -- MuonEq and normalisation with one bf16 rounding
//      (nanochat rounds twice);
//   4. Polar Express: 5 x 3 strided-batched bf16 GEMMs over the K matrices (fp32 accumulate):
//      wide (rows <= cols): A = X X^T; B = c A A + b A (epilogue beta); X' = B X + a X (out of place)
//      tall (rows > cols):  A = X^T X; B = c A A + b A;                X' = X B + a X
//   5. sums of squares of O (bf16) per row (rows >= cols) or per column (rows < cols);
//   6. normuon kernel (one block per matrix): ||O||_F, the Muon+ scale s, v = s^2 ss / R, S += (1-b2)(v - S),
//      step = 1/sqrt(max(S, 1e-10)), the Frobenius restore; one final factor per row or column;
//   7. apply kernel: o = O * factor; cautious weight decay and the update with lr_eff = lr sqrt(max(1, rows/cols)).
// Cost: 15 GEMMs (2 (2 k^2 max) + 2 k^3 flops each step, k = min(rows, cols)) plus ~40 bytes per element.
// The scratch is the only memory Muon needs besides its state: 2 bf16 copies of the stack and 2 bf16
// (k, k) Gram stacks, each matrix starting on a 256-byte boundary.

#ifdef __CUDACC__
#include "llmc/cuda_common.cuh"

struct MuonScratch {
    int K = 0, rows = 0, cols = 0;
    long long stride_x = 0;  // elements between matrices of X, Y: rows * cols rounded up to 128 (256 bytes)
    long long stride_a = 0;  // elements between matrices of A, Bm: k * k rounded up to 128
    int ld_stats = 0;        // max(rows, cols): row length of sumsq and factor
    floatX* X = nullptr;     // (K, rows, cols) bf16, the Polar Express iterate
    floatX* Y = nullptr;     // (K, rows, cols) bf16, its ping-pong partner
    floatX* A = nullptr;     // (K, k, k) bf16, Gram matrix
    floatX* Bm = nullptr;    // (K, k, k) bf16, b A + c A^2
    float* sumsq = nullptr;  // (K, ld_stats) fp32, per-row / per-column sums of squares
    float* factor = nullptr; // (K, ld_stats) fp32, per-row / per-column scale factors
};

static inline void muon_scratch_alloc(MuonScratch* s, int K, int rows, int cols) {
    if (K <= 0 || rows <= 0 || cols <= 0) fail("muon_scratch_alloc: bad shape K=%d rows=%d cols=%d", K, rows, cols);
    const long long k = rows < cols ? rows : cols;
    s->K = K;
    s->rows = rows;
    s->cols = cols;
    s->stride_x = ((long long)rows * cols + 127) / 128 * 128;
    s->stride_a = (k * k + 127) / 128 * 128;
    s->ld_stats = rows > cols ? rows : cols;
    cudaCheck(cuda_malloc(&s->X, (size_t)K * s->stride_x * sizeof(floatX)));
    cudaCheck(cuda_malloc(&s->Y, (size_t)K * s->stride_x * sizeof(floatX)));
    cudaCheck(cuda_malloc(&s->A, (size_t)K * s->stride_a * sizeof(floatX)));
    cudaCheck(cuda_malloc(&s->Bm, (size_t)K * s->stride_a * sizeof(floatX)));
    cudaCheck(cuda_malloc(&s->sumsq, (size_t)K * s->ld_stats * sizeof(float)));
    cudaCheck(cuda_malloc(&s->factor, (size_t)K * s->ld_stats * sizeof(float)));
}

static inline void muon_scratch_free(MuonScratch* s) {
    cuda_free(s->X);
    cuda_free(s->Y);
    cuda_free(s->A);
    cuda_free(s->Bm);
    cuda_free(s->sumsq);
    cuda_free(s->factor);
    *s = MuonScratch();
}

static const int MUON_ROW_THREADS = 256;
static const int MUON_MATRIX_THREADS = 1024;

// step 1. grid (rows, K), MUON_ROW_THREADS. grads[k] (rows, cols), M (K, rows, cols) fp32;
// X (K, stride_x) bf16 = the Nesterov update; sumsq[k * ld + r] = sum_c X^2 (bf16 values, fp32 sum)
__global__ void __launch_bounds__(MUON_ROW_THREADS) muon_momentum_kernel(const float* const* grads, float* M, floatX* X, float* sumsq, int rows, int cols,
                                     long long stride_x, int ld, float mu) {
    __shared__ float shared[32];
    const int r = blockIdx.x, k = blockIdx.y;
    const float* g = grads[k] + (size_t)r * cols;
    float* m = M + ((size_t)k * rows + r) * cols;
    floatX* x = X + k * stride_x + (size_t)r * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float gi = __ldg(g + c);  // g comes from a pointer array: tell the compiler it is read-only global memory
        float mi = m[c] + (1.0f - mu) * (gi - m[c]);
        m[c] = mi;
        floatX xb = to_floatX(gi + mu * (mi - gi));
        x[c] = xb;
        float xf = to_float(xb);
        ss += xf * xf;
    }
    ss = block_sum(ss, shared);
    if (threadIdx.x == 0) sumsq[(size_t)k * ld + r] = ss;
}

// step 2. grid K, MUON_MATRIX_THREADS. factor[k * ld + r] = (MuonEq scale_r) / (1.01 ||X'||_F + 1e-6)
__global__ void __launch_bounds__(MUON_MATRIX_THREADS) muon_prescale_kernel(const float* sumsq, float* factor, int rows, int ld, bool muon_eq) {
    __shared__ float shared[32];
    const float* ss = sumsq + (size_t)blockIdx.x * ld;
    float* f = factor + (size_t)blockIdx.x * ld;
    float part = 0.0f;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) part += ss[r];
    float frob2 = block_sum(part, shared);
    if (muon_eq) {
        // every row rescaled to the RMS row norm; the norm after that, from the scales (no second pass)
        const float target = sqrtf(frob2) / sqrtf((float)rows);
        part = 0.0f;
        for (int r = threadIdx.x; r < rows; r += blockDim.x) {
            float scale = target / fmaxf(sqrtf(ss[r]), 1e-6f);
            f[r] = scale;
            part += scale * scale * ss[r];
        }
        frob2 = block_sum(part, shared);
    }
    const float inv = 1.0f / (sqrtf(frob2) * 1.01f + 1e-6f);
    for (int r = threadIdx.x; r < rows; r += blockDim.x) f[r] = (muon_eq ? f[r] : 1.0f) * inv;  // same r as above
}

// step 3. grid (rows, K), MUON_ROW_THREADS. X[k, r, :] *= factor[k * ld + r] (one bf16 rounding)
__global__ void __launch_bounds__(MUON_ROW_THREADS) muon_rowscale_kernel(floatX* X, const float* factor, int cols, long long stride_x, int ld) {
    const int r = blockIdx.x, k = blockIdx.y;
    floatX* x = X + k * stride_x + (size_t)r * cols;
    const float f = factor[(size_t)k * ld + r];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) x[c] = to_floatX(to_float(x[c]) * f);
}

// step 5, per row (rows >= cols). grid (rows, K), MUON_ROW_THREADS. sumsq[k * ld + r] = sum_c O^2
__global__ void __launch_bounds__(MUON_ROW_THREADS) muon_row_sumsq_kernel(const floatX* O, float* sumsq, int cols, long long stride_x, int ld) {
    __shared__ float shared[32];
    const int r = blockIdx.x, k = blockIdx.y;
    const floatX* o = O + k * stride_x + (size_t)r * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = to_float(o[c]);
        ss += v * v;
    }
    ss = block_sum(ss, shared);
    if (threadIdx.x == 0) sumsq[(size_t)k * ld + r] = ss;
}

// step 5, per column (rows < cols). grid (ceil(cols / 32), K), block (32, MUON_COL_SPLIT): thread (tx, ty)
// sums rows ty, ty + SPLIT, ... of column c (coalesced across tx); the SPLIT partials are then added in
// order of ty. sumsq[k * ld + c] = sum_r O^2
static const int MUON_COL_SPLIT = 16;
__global__ void __launch_bounds__(32 * MUON_COL_SPLIT) muon_col_sumsq_kernel(const floatX* O, float* sumsq, int rows, int cols, long long stride_x, int ld) {
    __shared__ float part[MUON_COL_SPLIT][33];
    const int k = blockIdx.y, c = blockIdx.x * 32 + threadIdx.x;
    const floatX* o = O + k * stride_x;
    float ss = 0.0f;
    if (c < cols)
        for (int r = threadIdx.y; r < rows; r += MUON_COL_SPLIT) {
            float v = to_float(o[(size_t)r * cols + c]);
            ss += v * v;
        }
    part[threadIdx.y][threadIdx.x] = ss;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = 0.0f;
        for (int i = 0; i < MUON_COL_SPLIT; i++) total += part[i][threadIdx.x];
        sumsq[(size_t)k * ld + c] = total;
    }
}

// step 6. grid K, MUON_MATRIX_THREADS. ns = rows or cols entries (per row if rows >= cols), R = the reduced
// length. Reads sumsq, updates state (K, ns) and writes factor[k * ld + i] = s step_i restore.
__global__ void __launch_bounds__(MUON_MATRIX_THREADS) muon_normuon_kernel(const float* sumsq, float* state, float* factor, int rows, int cols, int ld,
                                    bool muon_plus, float beta2) {
    __shared__ float shared[32];
    const bool per_row = rows >= cols;
    const int ns = per_row ? rows : cols, reduced = per_row ? cols : rows;
    const float* ss = sumsq + (size_t)blockIdx.x * ld;
    float* S = state + (size_t)blockIdx.x * ns;
    float* f = factor + (size_t)blockIdx.x * ld;
    float part = 0.0f;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) part += ss[i];
    const float frob2 = block_sum(part, shared);
    // Muon+: O *= sqrt(min(rows, cols)) / max(||O||_F, 1e-6), folded into the factor and into v
    const float s = muon_plus ? sqrtf((float)(rows < cols ? rows : cols)) / fmaxf(sqrtf(frob2), 1e-6f) : 1.0f;
    float part_v = 0.0f, part_scaled = 0.0f;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) {
        float v = s * s * ss[i] / (float)reduced;
        float Si = S[i] + (1.0f - beta2) * (v - S[i]);
        S[i] = Si;
        float step = 1.0f / sqrtf(fmaxf(Si, 1e-10f));
        f[i] = step;
        part_v += v;
        part_scaled += v * (float)reduced * step * step;
    }
    const float sum_v = block_sum(part_v, shared);
    const float sum_scaled = block_sum(part_scaled, shared);
    const float restore = sqrtf(sum_v * (float)reduced) / fmaxf(sqrtf(sum_scaled), 1e-10f);
    for (int i = threadIdx.x; i < ns; i += blockDim.x) f[i] *= s * restore;  // same i as above
}

// step 7. grid (rows, K), MUON_ROW_THREADS. params[k] (rows, cols) fp32 updated from O (bf16) and the
// per-row or per-column factor: o = O f; P -= lr_eff o + lr_eff wd P [o P >= 0]
__global__ void __launch_bounds__(MUON_ROW_THREADS) muon_apply_kernel(float* const* params, const floatX* O, const float* factor, int cols, long long stride_x,
                                  int ld, bool per_row, float lr_eff, float wd) {
    const int r = blockIdx.x, k = blockIdx.y;
    float* p = params[k] + (size_t)r * cols;
    const floatX* o_row = O + k * stride_x + (size_t)r * cols;
    const float* f = factor + (size_t)k * ld;
    const float f_row = per_row ? f[r] : 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float o = to_float(o_row[c]) * (per_row ? f_row : f[c]);
        float pv = p[c];
        float decay = (o * pv >= 0.0f) ? lr_eff * wd * pv : 0.0f;
        p[c] = pv - (lr_eff * o + decay);
    }
}

// One Muon step for the K matrices described by s (see the top of this section for every argument).
static inline void muon_update_cuda(float* const* params, const float* const* grads, float* momentum, float* state,
                                    MuonScratch* s, float lr, float mu, float wd, bool muon_eq, bool muon_plus,
                                    cudaStream_t stream) {
    const int K = s->K, rows = s->rows, cols = s->cols, ld = s->ld_stats;
    const bool tall = rows > cols, per_row = rows >= cols;
    const int k = tall ? cols : rows;
    const dim3 row_grid(rows, K);

    // 1-3. momentum, bf16 cast, MuonEq and Frobenius normalisation
    muon_momentum_kernel<<<row_grid, MUON_ROW_THREADS, 0, stream>>>(grads, momentum, s->X, s->sumsq, rows, cols, s->stride_x, ld, mu);
    cudaCheckLaunch();
    muon_prescale_kernel<<<K, MUON_MATRIX_THREADS, 0, stream>>>(s->sumsq, s->factor, rows, ld, muon_eq);
    cudaCheckLaunch();
    muon_rowscale_kernel<<<row_grid, MUON_ROW_THREADS, 0, stream>>>(s->X, s->factor, cols, s->stride_x, ld);
    cudaCheckLaunch();

    // 4. Polar Express on the stack, ping-ponging between X and Y
    floatX* X = s->X;
    floatX* Y = s->Y;
    const long long sx = s->stride_x, sa = s->stride_a;
    for (int step = 0; step < POLAR_EXPRESS_STEPS; step++) {
        const float a = POLAR_EXPRESS_COEFFS[step][0], b = POLAR_EXPRESS_COEFFS[step][1], c = POLAR_EXPRESS_COEFFS[step][2];
        if (tall) gemm_strided_batched_bf16_cuda(s->A, nullptr, X, X, k, k, rows, true, false, 1.0f, 0.0f, K, sx, sx, sa, stream);   // X^T X
        else gemm_strided_batched_bf16_cuda(s->A, nullptr, X, X, k, k, cols, false, true, 1.0f, 0.0f, K, sx, sx, sa, stream);       // X X^T
        gemm_strided_batched_bf16_cuda(s->Bm, s->A, s->A, s->A, k, k, k, false, false, c, b, K, sa, sa, sa, stream);  // c A A + b A
        if (tall) gemm_strided_batched_bf16_cuda(Y, X, X, s->Bm, rows, cols, k, false, false, 1.0f, a, K, sx, sa, sx, stream);  // X B + a X
        else gemm_strided_batched_bf16_cuda(Y, X, s->Bm, X, rows, cols, k, false, false, 1.0f, a, K, sa, sx, sx, stream);       // B X + a X
        floatX* t = X;
        X = Y;
        Y = t;
    }
    const floatX* O = X;

    // 5-6. statistics of O, Muon+ and NorMuon folded into one factor per row or column
    if (per_row) muon_row_sumsq_kernel<<<row_grid, MUON_ROW_THREADS, 0, stream>>>(O, s->sumsq, cols, sx, ld);
    else muon_col_sumsq_kernel<<<dim3(ceil_div(cols, 32), K), dim3(32, MUON_COL_SPLIT), 0, stream>>>(O, s->sumsq, rows, cols, sx, ld);
    cudaCheckLaunch();
    muon_normuon_kernel<<<K, MUON_MATRIX_THREADS, 0, stream>>>(s->sumsq, state, s->factor, rows, cols, ld, muon_plus, MUON_BETA2);
    cudaCheckLaunch();

    // 7. shape-scaled lr, cautious weight decay, update
    const float lr_eff = lr * sqrtf(fmaxf(1.0f, (float)rows / (float)cols));
    muon_apply_kernel<<<row_grid, MUON_ROW_THREADS, 0, stream>>>(params, O, s->factor, cols, sx, ld, per_row, lr_eff, wd);
    cudaCheckLaunch();
}
#endif  // __CUDACC__
