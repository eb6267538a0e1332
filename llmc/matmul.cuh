/*
Matrix multiplication: nn.Linear forward/backward and the general GEMM they are built on.

Conventions (as in llm.c): all tensors are row-major fp32, and a Linear weight has the
PyTorch layout (N, K) = (out_features, in_features), so the forward pass is
    out (M, N) = inp (M, K) @ weight^T
where M = B*T is the number of rows (tokens).

Read first: the plain triple loops at the top of the CPU section (matmul_forward_naive_cpu,
matmul_forward_add_naive_cpu, matmul_backward_naive_cpu, and gemm_naive_cpu for the general GEMM):
they say what every CPU function here computes, in a few lines each. Everything after them is
gemm_cpu, the fast BLIS-style kernel the model actually runs, and the matmul_*_cpu wrappers on it;
test_xsa.cu (test_matmul_fast_vs_naive) and dev/cpu/bench_matmul.cpp check it against the loops.

CPU backend properties (of the fast kernel):
- exact fp32: every product and sum is an fp32 FMA or add (mul + add in the portable fallback),
  no reduced-precision tricks, no reliance on -ffast-math
- deterministic: each output element is summed in a fixed order that depends only on K,
  never on the number of OpenMP threads (threads split the output, never the K reduction),
  so results are bit-identical for any thread count and between runs
- no alignment requirements on any pointer, and arbitrary row strides in gemm_cpu
- fast: 380-450 GFLOP/s on 2 Zen 5 cores with AVX-512, 70-85% of FMA peak (dev/cpu/bench_matmul.cpp)
*/
#pragma once

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include "common.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// ----------------------------------------------------------------------------
// CPU

// ---- The readable reference: plain triple loops (as llm.c's matmul_forward_naive) ----
// One running sum per output element, k in increasing order. Templated on the scalar so that the tests
// can run the very same loops in double as exact truth. The model never calls them: strided reads and
// no blocking make them tens of times slower than gemm_cpu below.

// out (M, N) = inp (M, K) @ weight^T:   out[i][j] = sum_k inp[i][k] * weight[j][k]
template <typename real>
static inline void matmul_forward_naive_cpu(real* out, const real* inp, const real* weight, int M, int K, int N) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            real sum = 0;
            for (int k = 0; k < K; k++) sum += inp[(size_t)i * K + k] * weight[(size_t)j * K + k];
            out[(size_t)i * N + j] = sum;
        }
}

// out (M, N) = residual (M, N) + inp (M, K) @ weight^T   (out may be residual)
template <typename real>
static inline void matmul_forward_add_naive_cpu(real* out, const real* inp, const real* weight, const real* residual, int M, int K,
                                                int N) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            real sum = 0;
            for (int k = 0; k < K; k++) sum += inp[(size_t)i * K + k] * weight[(size_t)j * K + k];
            out[(size_t)i * N + j] = residual[(size_t)i * N + j] + sum;
        }
}

// dinp (M, K) = or += dout (M, N) @ weight (N, K):   dinp[i][k] (+)= sum_j dout[i][j] * weight[j][k]   (dinp_write)
// dweight (N, K) += dout^T (N, M) @ inp (M, K):      dweight[j][k] += sum_i dout[i][j] * inp[i][k]
// Either is skipped when its pointer is nullptr.
template <typename real>
static inline void matmul_backward_naive_cpu(real* dinp, real* dweight, const real* dout, const real* inp, const real* weight, int M,
                                             int K, int N, GradWrite dinp_write) {
    if (dinp != nullptr) {
#pragma omp parallel for collapse(2) schedule(static)
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) {
                real sum = 0;
                for (int j = 0; j < N; j++) sum += dout[(size_t)i * N + j] * weight[(size_t)j * K + k];
                real* d = dinp + (size_t)i * K + k;
                *d = dinp_write == GRAD_ACCUMULATE ? *d + sum : sum;
            }
    }
    if (dweight != nullptr) {
#pragma omp parallel for collapse(2) schedule(static)
        for (int j = 0; j < N; j++)
            for (int k = 0; k < K; k++) {
                real sum = 0;
                for (int i = 0; i < M; i++) sum += dout[(size_t)i * N + j] * inp[(size_t)i * K + k];
                dweight[(size_t)j * K + k] += sum;
            }
    }
}

// C (M, N) = or += op(A) (M, K) @ op(B) (K, N), op(X) = X or X^T: the general contract of gemm_cpu (strides
// and transposes as documented there), element (i, p) of op(A) being A[i][p], or A[p][i] when transA.
template <typename real>
static inline void gemm_naive_cpu(real* C, const real* A, const real* B, int M, int N, int K, int lda, int ldb, int ldc, bool transA,
                                  bool transB, bool accumulate) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            real sum = 0;
            for (int p = 0; p < K; p++) {
                real a = transA ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                real b = transB ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                sum += a * b;
            }
            real* c = C + (size_t)i * ldc + j;
            *c = accumulate ? *c + sum : sum;
        }
}

// ---- The fast kernel ----

// GEMM in the BLIS style (Goto's algorithm):
//   for jc over N in steps of GEMM_NC:            B panel (kc, nc) lives in L3
//     for pc over K in steps of GEMM_KC:          pack B[pc:pc+kc, jc:jc+nc] (shared by all threads)
//       for ic over M in blocks of mc (parallel): pack A[ic:ic+mc, pc:pc+kc] (one per thread), lives in L2
//         for jr over nc in steps of NR:          B micro-panel (kc, NR) stays in L2 next to the A block
//           for ir over mc in steps of MR:        micro-kernel: C tile (MR, NR) += Ap (MR, kc) @ Bp (kc, NR)
// The micro-kernel keeps the whole (MR, NR) C tile in vector registers for the full kc loop,
// so each k step is NR/VLEN vector loads of B, MR broadcasts of A, and MR*NR/VLEN FMAs.
// Summation order for C[i][j]: within a K block, a single FMA chain over k starting from 0;
// the block sums are then added to C in order of increasing pc. This order depends only on K
// and GEMM_KC, which is why the thread count (and the mc/nc tiling) never changes the result.

#if defined(__AVX512F__)
// 32 zmm registers: 6x4 = 24 accumulators + 4 B vectors + 1 broadcast, leaving spares.
// 24 independent FMA chains cover the 4-cycle FMA latency on 2 FMA pipes (needs >= 8), and
// per k step there are 10 loads for 24 FMAs, so loads never limit the FMA throughput, even from L2.
// (12x2 has the same register budget; 6x4 measured a few % faster on Zen 5.)
typedef __m512 gemm_vec;
static constexpr int GEMM_VLEN = 16;
static constexpr int GEMM_MR = 6;
static constexpr int GEMM_NV = 4; // vectors per micro-tile row
static inline gemm_vec gemm_vzero() { return _mm512_setzero_ps(); }
static inline gemm_vec gemm_vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void gemm_vstore(float* p, gemm_vec v) { _mm512_storeu_ps(p, v); }
static inline gemm_vec gemm_vbroadcast(float x) { return _mm512_set1_ps(x); }
static inline gemm_vec gemm_vadd(gemm_vec a, gemm_vec b) { return _mm512_add_ps(a, b); }
static inline gemm_vec gemm_vfma(gemm_vec a, gemm_vec b, gemm_vec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
// 16 ymm registers: 6x2 = 12 accumulators + 2 B vectors + 1 broadcast = 15.
typedef __m256 gemm_vec;
static constexpr int GEMM_VLEN = 8;
static constexpr int GEMM_MR = 6;
static constexpr int GEMM_NV = 2; // vectors per micro-tile row
static inline gemm_vec gemm_vzero() { return _mm256_setzero_ps(); }
static inline gemm_vec gemm_vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void gemm_vstore(float* p, gemm_vec v) { _mm256_storeu_ps(p, v); }
static inline gemm_vec gemm_vbroadcast(float x) { return _mm256_set1_ps(x); }
static inline gemm_vec gemm_vadd(gemm_vec a, gemm_vec b) { return _mm256_add_ps(a, b); }
static inline gemm_vec gemm_vfma(gemm_vec a, gemm_vec b, gemm_vec c) { return _mm256_fmadd_ps(a, b, c); }
#else
// Portable fallback (SSE2, NEON, ...): GCC/Clang vector extensions of 16 bytes, the SIMD width
// every such target has natively (wider ones get split and spilled). 6x2 = 12 accumulators fit
// the 16 registers of SSE2. Unaligned-safe loads/stores go through memcpy.
typedef float gemm_vec __attribute__((vector_size(16)));
static constexpr int GEMM_VLEN = 4;
static constexpr int GEMM_MR = 6;
static constexpr int GEMM_NV = 2; // vectors per micro-tile row
static inline gemm_vec gemm_vzero() { return gemm_vec{}; }
static inline gemm_vec gemm_vload(const float* p) { gemm_vec v; __builtin_memcpy(&v, p, sizeof(v)); return v; }
static inline void gemm_vstore(float* p, gemm_vec v) { __builtin_memcpy(p, &v, sizeof(v)); }
static inline gemm_vec gemm_vbroadcast(float x) { return gemm_vec{} + x; }
static inline gemm_vec gemm_vadd(gemm_vec a, gemm_vec b) { return a + b; }
static inline gemm_vec gemm_vfma(gemm_vec a, gemm_vec b, gemm_vec c) { return a * b + c; }
#endif

static constexpr int GEMM_NR = GEMM_NV * GEMM_VLEN;
static constexpr int GEMM_SMALL_M = 4;  // up to this many rows of A, gemm_cpu takes dot products of rows instead (see there)
// KC: long enough that packing and the C load/store per micro-tile are amortised over many FMAs
// (384 divides 768 and 3072, common model widths); the A block (MC, KC) = 576 KiB plus the B
// micro-panel (KC, NR) = 96 KiB (AVX-512) fit the 1 MiB L2 of Zen 4/5. KC is also the length of each
// FMA chain before it is added into C, which keeps fp32 rounding error growth at ~sqrt(KC) instead
// of ~sqrt(K). KC is part of the summation order, so it must never depend on the thread count.
static constexpr int GEMM_KC = 384;
// MC: upper bound on the rows of the packed A block (see KC); the actual mc is chosen per call.
static constexpr int GEMM_MC_MAX = 384;
// NC: the packed B panel (KC, NC) = 6 MiB is shared by all threads and stays in L3.
static constexpr int GEMM_NC = 4096;

// Micro-kernel: C tile (mr, nr) (+)= Ap @ Bp, with Ap (kc, MR) and Bp (kc, NR) packed and
// zero-padded to the full tile, so the arithmetic is the same for edge tiles (only the store
// is clipped to mr <= MR, nr <= NR). ldc: row stride of C.
static inline void gemm_micro_kernel(float* C, int ldc, const float* Ap, const float* Bp,
                                     int kc, int mr, int nr, bool accumulate) {
    gemm_vec acc[GEMM_MR][GEMM_NV];
    for (int i = 0; i < GEMM_MR; i++) {
        for (int v = 0; v < GEMM_NV; v++) { acc[i][v] = gemm_vzero(); }
    }
    for (int p = 0; p < kc; p++) {
        gemm_vec b[GEMM_NV];
        for (int v = 0; v < GEMM_NV; v++) { b[v] = gemm_vload(Bp + p * GEMM_NR + v * GEMM_VLEN); }
        for (int i = 0; i < GEMM_MR; i++) {
            gemm_vec a = gemm_vbroadcast(Ap[p * GEMM_MR + i]);
            for (int v = 0; v < GEMM_NV; v++) { acc[i][v] = gemm_vfma(a, b[v], acc[i][v]); }
        }
    }
    if (mr == GEMM_MR && nr == GEMM_NR) {
        for (int i = 0; i < GEMM_MR; i++) {
            for (int v = 0; v < GEMM_NV; v++) {
                float* c = C + (size_t)i * ldc + v * GEMM_VLEN;
                gemm_vstore(c, accumulate ? gemm_vadd(gemm_vload(c), acc[i][v]) : acc[i][v]);
            }
        }
    } else {
        // edge tile: spill to a local tile and copy the valid part; the scalar add below rounds
        // exactly like the vector add above, so edge and interior elements are treated alike
        float tile[GEMM_MR * GEMM_NR];
        for (int i = 0; i < GEMM_MR; i++) {
            for (int v = 0; v < GEMM_NV; v++) { gemm_vstore(tile + i * GEMM_NR + v * GEMM_VLEN, acc[i][v]); }
        }
        for (int i = 0; i < mr; i++) {
            float* c = C + (size_t)i * ldc;
            for (int j = 0; j < nr; j++) {
                c[j] = accumulate ? c[j] + tile[i * GEMM_NR + j] : tile[i * GEMM_NR + j];
            }
        }
    }
}

// Pack X (rows, cols) into ceil(rows / width) micro-panels, panel r holding X[r*width : r*width+width, :]
// transposed to (cols, width) and zero-padded to width rows: the order the micro-kernel reads them.
// X element (i, p) is at X[i * rs + p * cs], which covers both a row-major matrix and its transpose.
// Packs A blocks (width = MR) and, via B^T, B panels (width = NR).
static inline void gemm_pack(float* dst, const float* X, size_t rs, size_t cs, int rows, int cols, int width) {
    for (int r = 0; r < rows; r += width, dst += (size_t)cols * width) {
        int nrows = rows - r < width ? rows - r : width;
        const float* x = X + r * rs;
        if (cs == 1) {
            // rows of X are contiguous: copy 16 columns (one cache line) of each row at a time, so each
            // line is used up while it is in L1. Walking all rows in lockstep one column at a time
            // would thrash L1 when the row stride is a power of 2 (the rows all map to the same set).
            for (int p0 = 0; p0 < cols; p0 += 16) {
                int p1 = p0 + 16 < cols ? p0 + 16 : cols;
                for (int i = 0; i < width; i++) {
                    for (int p = p0; p < p1; p++) { dst[p * width + i] = i < nrows ? x[i * rs + p] : 0.0f; }
                }
            }
        } else {
            // columns of X are contiguous (X is stored transposed): copy width floats per column
            for (int p = 0; p < cols; p++) {
                for (int i = 0; i < width; i++) { dst[p * width + i] = i < nrows ? x[i * rs + p * cs] : 0.0f; }
            }
        }
    }
}

// Packing scratch of the calling thread: the shared B panel, then one A block per OpenMP thread.
// It only grows, so a training loop stops allocating after its first step; thread_local so that
// concurrent callers never share it; freed when the calling thread exits.
struct GemmScratch {
    float* ptr = nullptr;
    size_t capacity = 0; // in floats
    ~GemmScratch() { free(ptr); }
};

static inline float* gemm_scratch(size_t nfloats) {
    static thread_local GemmScratch scratch;
    if (nfloats > scratch.capacity) {
        free(scratch.ptr);
        size_t bytes = (nfloats * sizeof(float) + 63) / 64 * 64; // aligned_alloc: size multiple of alignment
        scratch.ptr = (float*)aligned_alloc(64, bytes);
        if (scratch.ptr == nullptr) {
            fprintf(stderr, "gemm_scratch: failed to allocate %zu bytes\n", bytes);
            exit(EXIT_FAILURE);
        }
        scratch.capacity = nfloats;
    }
    return scratch.ptr;
}

// C (M, N) (+)= op(A) (M, K) @ op(B) (K, N)
// op(X) = X, or X^T if transX. lda, ldb, ldc are the row strides of A, B, C as stored in memory,
// e.g. A (M, K) row-major has lda >= K, and transA with A stored as (K, M) has lda >= M.
// accumulate: C += op(A) @ op(B), otherwise C = op(A) @ op(B) (C is not read).
// C must not overlap A or B. No alignment requirements.
static inline void gemm_cpu(float* C, const float* A, const float* B, int M, int N, int K,
                            int lda, int ldb, int ldc, bool transA, bool transB, bool accumulate) {
    if (M <= 0 || N <= 0) { return; }
    if (K <= 0) {
        // empty reduction: the product is all zeros
        if (!accumulate) {
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) { C[(size_t)i * ldc + j] = 0.0f; }
            }
        }
        return;
    }
    // A few rows (generation's decode: one per sequence) times op(B) = B^T with B stored (N, K), as the
    // forward's weights are: each output is the dot product of two contiguous rows. Reading each row of B
    // once, the threads splitting the N columns, is all the work; the blocked path below would first copy
    // all of B into panels and then fill only M of the micro-kernel's MR rows.
    if (M <= GEMM_SMALL_M && !transA && transB) {
#pragma omp parallel for schedule(static) if ((double)M * N * K >= 1e6 && !omp_in_parallel())
        for (int j = 0; j < N; j++)
            for (int i = 0; i < M; i++) {
                const float dot = dot_lanes(A + (size_t)i * lda, B + (size_t)j * ldb, K);
                float* c = C + (size_t)i * ldc + j;
                *c = accumulate ? *c + dot : dot;
            }
        return;
    }
    // element strides of op(A) (M, K) and op(B)^T (N, K); packing B^T makes B micro-panels
    // the same (K, width) layout as A micro-panels
    size_t a_rs = transA ? 1 : (size_t)lda, a_cs = transA ? (size_t)lda : 1;
    size_t bt_rs = transB ? (size_t)ldb : 1, bt_cs = transB ? 1 : (size_t)ldb;

    int nthreads = 1;
#ifdef _OPENMP
    // a parallel region costs a few microseconds: not worth it for tiny products; and a caller
    // that is already inside a parallel region (e.g. one GEMM per attention head) has the
    // cores busy, so its GEMMs run on the calling thread
    if ((double)M * N * K >= 1e6 && !omp_in_parallel()) { nthreads = omp_get_max_threads(); }
#endif
    // mc: split M into a multiple of nthreads blocks of about equal size (whole MR tiles),
    // each at most GEMM_MC_MAX rows, so that the static schedule balances the threads
    int mblocks = (M + GEMM_MC_MAX - 1) / GEMM_MC_MAX;
    mblocks = (mblocks + nthreads - 1) / nthreads * nthreads;
    int mtiles = (M + GEMM_MR - 1) / GEMM_MR;
    int mc = (mtiles + mblocks - 1) / mblocks * GEMM_MR;
    mblocks = (M + mc - 1) / mc;

    int kc_max = K < GEMM_KC ? K : GEMM_KC;
    int nc_max = N < GEMM_NC ? N : GEMM_NC;
    size_t b_size = (size_t)kc_max * ((nc_max + GEMM_NR - 1) / GEMM_NR * GEMM_NR);
    size_t a_size = (size_t)kc_max * mc;
    float* scratch = gemm_scratch(b_size + nthreads * a_size);
    float* Bp = scratch;

    #pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        float* Ap = scratch + b_size + omp_get_thread_num() * a_size;
#else
        float* Ap = scratch + b_size;
#endif
        for (int jc = 0; jc < N; jc += GEMM_NC) {
            int nc = N - jc < GEMM_NC ? N - jc : GEMM_NC;
            int npanels = (nc + GEMM_NR - 1) / GEMM_NR;
            for (int pc = 0; pc < K; pc += GEMM_KC) {
                int kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;
                bool acc = accumulate || pc > 0;
                // pack B[pc:pc+kc, jc:jc+nc] as npanels micro-panels (kc, NR), each thread a contiguous
                // range of panels; the implicit barrier at the end of the loop makes all of Bp visible
                #pragma omp for schedule(static)
                for (int t = 0; t < nthreads; t++) {
                    int jp0 = npanels * t / nthreads, jp1 = npanels * (t + 1) / nthreads;
                    int j0 = jc + jp0 * GEMM_NR, j1 = jc + jp1 * GEMM_NR < N ? jc + jp1 * GEMM_NR : N;
                    if (j1 > j0) {
                        gemm_pack(Bp + (size_t)jp0 * GEMM_NR * kc, B + j0 * bt_rs + pc * bt_cs, bt_rs, bt_cs,
                                  j1 - j0, kc, GEMM_NR);
                    }
                }
                // each thread computes whole (mc, nc) blocks of C; the implicit barrier at the
                // end keeps Bp alive until every thread is done with it
                #pragma omp for schedule(static)
                for (int ib = 0; ib < mblocks; ib++) {
                    int ic = ib * mc;
                    int mcb = M - ic < mc ? M - ic : mc;
                    gemm_pack(Ap, A + ic * a_rs + pc * a_cs, a_rs, a_cs, mcb, kc, GEMM_MR);
                    for (int jp = 0; jp < npanels; jp++) {
                        int j = jc + jp * GEMM_NR;
                        int nr = N - j < GEMM_NR ? N - j : GEMM_NR;
                        for (int ir = 0; ir < mcb; ir += GEMM_MR) {
                            int mr = mcb - ir < GEMM_MR ? mcb - ir : GEMM_MR;
                            gemm_micro_kernel(C + (size_t)(ic + ir) * ldc + j, ldc, Ap + (size_t)ir * kc,
                                              Bp + (size_t)jp * GEMM_NR * kc, kc, mr, nr, acc);
                        }
                    }
                }
            }
        }
    }
}

// out (M, N) = inp (M, K) @ weight^T, with weight (N, K)
static inline void matmul_forward_cpu(float* out, const float* inp, const float* weight, int M, int K, int N) {
    gemm_cpu(out, inp, weight, M, N, K, K, K, N, false, true, false);
}

// out (M, N) = residual (M, N) + inp (M, K) @ weight^T: a residual branch's output projection and its add
static inline void matmul_forward_add_cpu(float* out, const float* inp, const float* weight, const float* residual, int M, int K, int N) {
    if (out != residual) memcpy(out, residual, (size_t)M * N * sizeof(float));
    gemm_cpu(out, inp, weight, M, N, K, K, K, N, false, true, true);
}

// dinp (M, K) = or += dout (M, N) @ weight (N, K)     (dinp_write; skipped if dinp == nullptr)
// dweight (N, K) += dout^T (N, M) @ inp (M, K)        (skipped if dweight == nullptr)
// inp (M, K), weight (N, K); dweight always accumulates, as parameter gradients do across micro-steps
static inline void matmul_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp,
                                       const float* weight, int M, int K, int N, GradWrite dinp_write) {
    if (dinp != nullptr) { gemm_cpu(dinp, dout, weight, M, K, N, N, K, K, false, false, dinp_write == GRAD_ACCUMULATE); }
    if (dweight != nullptr) { gemm_cpu(dweight, dout, inp, N, K, M, N, K, K, true, false, true); }
}

// ----------------------------------------------------------------------------
// CUDA (API in dev/cuda/API.md)
//
// Every GEMM of the CUDA backend goes through cuBLASLt with bf16 operands, fp32 accumulation (compute
// type CUBLAS_COMPUTE_32F, fp32 alpha/beta), and a bf16 or fp32 result. All matrices are row-major, as
// on the CPU side; cuBLASLt is column-major, so a row-major (R, C) matrix is handed over as the
// column-major (C, R) matrix with the same bytes, and the product is computed transposed:
//   D (M, N) = op(A) (M, K) @ op(B) (K, N)   <=>   D^T (N, M) = op(B)^T (N, K) @ op(A)^T (K, M)
// i.e. cuBLASLt's first operand is our B and its second our A, with m = N, n = M, k = K.
//
// Plans (matmul descriptor, the A/B/C/D layouts and the algorithm: the heuristic's first candidate, or the
// fastest when tuning, see matmul_choose) are cached per key = (M, N, K, transposes, output dtype, batch count
// and strides, C == D, the alignment of every pointer, the allowed reduction schemes). Building a plan
// costs a heuristic query (tens of us); after the first step every call is a map lookup plus
// cublasLtMatmul, and nothing is allocated.
//
// Determinism. cuBLAS documents run-to-run bitwise reproducibility for a given toolkit, architecture and
// SM count when the caller owns the workspace and one stream is active (we own the workspace; every
// matmul must be issued on one stream at a time, since the plans share it). On top of that we restrict the
// algorithms to split-K reduction schemes that never use atomics and keep fp32 partials:
//   CUBLASLT_REDUCTION_SCHEME_NONE          the K reduction of every output runs in one sequence
//                                           (no split-K at all);
//   CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE  split-K with fp32 partials in our workspace, summed in a
//                                           separate, fixed-order step (deterministic, fp32).
// Excluded: INPLACE (partials added into the output in its own type, bf16 for dinp, serialised by
// counters) and OUTPUT_TYPE (bf16 partials): both round partial sums to the output type. Every plan is
// checked after the heuristic (CUBLASLT_ALGO_CONFIG_SPLITK_NUM and _REDUCTION_SCHEME read back from the
// chosen algorithm); matmul_cuda_print_plans() lists what was chosen. A problem with no candidate left runs on
// matmul_fallback_kernel (below), with a note. g_matmul_reduction_mask can be set
// to CUBLASLT_REDUCTION_SCHEME_NONE alone to forbid split-K entirely (it is part of the key).

#ifdef __CUDACC__
#include <cublasLt.h>
#include <map>
#include <array>
#include <algorithm>
#include <string>
#include <vector>
#include "cuda_common.cuh"

#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)
static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        fail("cuBLASLt error at %s:%d: %s (%s)", file, line, cublasLtGetStatusName(status), cublasLtGetStatusString(status));
}

static const size_t MATMUL_WORKSPACE_BYTES = 32ull << 20;  // 32 MiB: what cuBLAS recommends for Hopper
static uint32_t g_matmul_reduction_mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;

struct MatmulPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_cd = nullptr;  // cuBLASLt's A, B, C=D
    cublasLtMatmulAlgo_t algo;
    size_t workspace = 0;
    // the candidate it runs (matmul_plan_take), for matmul_cuda_print_plans
    int chosen = 0, algo_id = 0, tile_id = 0, splitk = 1, stages_id = 0;
    uint32_t reduction = 0;
    float waves = 0.0f;
    // every candidate of the heuristic that our rules accept, best first: what matmul_choose and
    // dev/cuda/matmul_check.cu time one by one
    std::vector<cublasLtMatmulHeuristicResult_t> usable;
    // how the candidate was chosen, and (tuned) each usable candidate's ms, -1 where cuBLASLt refused it
    enum { HEURISTIC, TUNED, RECORDED } how = HEURISTIC;
    std::vector<float> tune_ms;
    bool fallback = false;  // no usable candidate: matmul_fallback_kernel runs it
};

// key: M, N, K, transA, transB, D fp32, batch, strideA, strideB, strideCD, C == D, alignA, alignB, alignCD, mask
typedef std::array<long long, 15> MatmulKey;

struct MatmulState {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    std::map<MatmulKey, MatmulPlan> plans;
    MatmulPlan* last = nullptr;  // the plan of the latest matmul_lt call (for the harness)
    bool tune = false;                   // new plans time their candidates (matmul_choose)
    std::map<MatmulKey, int> recorded;   // choices to take again (matmul_cuda_restore_choices)
    std::vector<MatmulKey> chosen_keys;  // the plans tuned or recorded, in the order they were made
    cudaEvent_t tune_events[2] = {nullptr, nullptr};
};
static MatmulState g_matmul;

// Creates the cuBLASLt handle and the workspace; once, before any other matmul call.
static inline void matmul_cuda_init(cudaStream_t stream) {
    (void)stream;  // the workspace is plain device memory; nothing is enqueued
    if (g_matmul.handle != nullptr) return;
    cublasCheck(cublasLtCreate(&g_matmul.handle));
    cudaCheck(cuda_malloc(&g_matmul.workspace, MATMUL_WORKSPACE_BYTES));
}

// Largest power of two (at most 256) dividing the address of every matrix of a strided batch, in bytes:
// the heuristic is told the true alignment, so it never picks a kernel that needs more.
static inline long long matmul_alignment(const void* p, long long stride_elems, int elem_bytes, int batch) {
    unsigned long long a = (unsigned long long)(uintptr_t)p | 256ull;
    if (batch > 1) a |= (unsigned long long)stride_elems * (unsigned long long)elem_bytes;
    return (long long)(a & (~a + 1));  // lowest set bit
}

// Makes the plan run its usable candidate i, and reads back what that candidate is.
static inline void matmul_plan_take(MatmulPlan* plan, int i) {
    const cublasLtMatmulHeuristicResult_t& r = plan->usable[i];
    plan->chosen = i;
    plan->algo = r.algo;
    plan->workspace = r.workspaceSize;
    plan->waves = r.wavesCount;
    int32_t splitk = 1;
    uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    size_t written = 0;
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_ID, &plan->algo_id, sizeof(plan->algo_id), &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &plan->tile_id, sizeof(plan->tile_id), &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &plan->stages_id, sizeof(plan->stages_id), &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written));
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &written));
    plan->splitk = splitk;
    plan->reduction = splitk > 1 ? scheme : (uint32_t)CUBLASLT_REDUCTION_SCHEME_NONE;
}

static inline MatmulPlan& matmul_plan(const MatmulKey& key, int M, int N, int K, bool transA, bool transB, bool d_fp32,
                                      int batch, long long strideA, long long strideB, long long strideCD, bool in_place,
                                      uint32_t alignA, uint32_t alignB, uint32_t alignCD, bool* made) {
    auto it = g_matmul.plans.find(key);
    *made = it == g_matmul.plans.end();
    if (!*made) return it->second;
    if (g_matmul.handle == nullptr) fail("matmul: matmul_cuda_init was not called");

    MatmulPlan plan;
    cublasCheck(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLASLt's first operand is our B (op = transB), its second our A (op = transA); see the top comment
    cublasOperation_t op_first = transB ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    // column-major views: our B stored (K, N) row-major = (N, K) col-major, ld N; transposed: (N, K) = (K, N), ld K
    if (!transB) cublasCheck(cublasLtMatrixLayoutCreate(&plan.layout_a, CUDA_R_16BF, N, K, N));
    else cublasCheck(cublasLtMatrixLayoutCreate(&plan.layout_a, CUDA_R_16BF, K, N, K));
    // our A stored (M, K) row-major = (K, M) col-major, ld K; transposed: stored (K, M) = (M, K), ld M
    if (!transA) cublasCheck(cublasLtMatrixLayoutCreate(&plan.layout_b, CUDA_R_16BF, K, M, K));
    else cublasCheck(cublasLtMatrixLayoutCreate(&plan.layout_b, CUDA_R_16BF, M, K, M));
    // D (M, N) row-major = (N, M) col-major, ld N; C has the same layout (and type) as D
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.layout_cd, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
    if (batch > 1) {
        int32_t b = batch;
        cublasLtMatrixLayout_t layouts[3] = {plan.layout_a, plan.layout_b, plan.layout_cd};
        long long strides[3] = {strideB, strideA, strideCD};
        for (int i = 0; i < 3; i++) {
            int64_t s = strides[i];
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof(s)));
        }
    }

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = MATMUL_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t mask = g_matmul_reduction_mask;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
    // cuBLASLt's A is our B, its B our A
    uint32_t al_a = alignB, al_b = alignA, al_c = alignCD, al_d = alignCD;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));

    const int REQUESTED = 8;
    cublasLtMatmulHeuristicResult_t results[REQUESTED];
    int returned = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_matmul.handle, plan.desc, plan.layout_a, plan.layout_b, plan.layout_cd,
                                                       plan.layout_cd, pref, REQUESTED, results, &returned);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(st);
    // heuristic order is best first; keep those that are deterministic by our rules (the mask should
    // already guarantee it: this re-check turns a library surprise into an error instead of silent atomics)
    for (int i = 0; i < returned; i++) {
        if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > MATMUL_WORKSPACE_BYTES) continue;
        int32_t splitk = 1;
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
        size_t written = 0;
        cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written));
        cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &written));
        if (splitk > 1 && (scheme == CUBLASLT_REDUCTION_SCHEME_NONE || (scheme & ~mask) != 0)) continue;
        if (!in_place) {  // D != C needs an algorithm that supports an out-of-place result
            int32_t oop = 0;
            cublasCheck(cublasLtMatmulAlgoCapGetAttribute(&results[i].algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT, &oop, sizeof(oop), &written));
            if (!oop) continue;
        }
        plan.usable.push_back(results[i]);
    }
    plan.fallback = plan.usable.empty();
    if (plan.fallback)  // once per shape: the plan is cached
        printf("note: cuBLASLt offers no deterministic algorithm for the GEMM M=%d N=%d K=%d transA=%d transB=%d out=%s batch=%d "
               "(alignment A %u B %u C/D %u bytes, %d candidates); it runs on matmul_fallback_kernel (deterministic, slower)\n", M, N, K,
               (int)transA, (int)transB, d_fp32 ? "fp32" : "bf16", batch, alignA, alignB, alignCD, returned);
    else
        matmul_plan_take(&plan, 0);
    return g_matmul.plans.emplace(key, plan).first->second;
}

// Which usable candidate a new plan runs. cuBLASLt's heuristic ranks its candidates with a model of the
// GPU, not by measurement, and at some shapes a later one is faster (dev/cuda/matmul_check.cu times them all
// at the model's shapes). With g_matmul.tune on (train_gpt turns it on for its first micro-step:
// --matmul-tune), a new plan times every usable candidate on the call's own operands -- one warm-up run,
// then the median of MATMUL_TUNE_RUNS -- and keeps the fastest; the heuristic's first stays unless another is
// at least MATMUL_TUNE_MARGIN faster, so that noise does not pick between equals. A GEMM that reads its
// output (in place, beta != 0) is timed on a copy of it, so the call's result is untouched. Only usable
// candidates compete, so every choice keeps the determinism rules above.
// A choice is an index into the heuristic's list, which is the same for the same GPU, shape and library:
// checkpoints record the choices (matmul_cuda_choices) and a resumed run takes them again
// (matmul_cuda_restore_choices), so it goes on bit-identically; the ranks of a run all take rank 0's
// (matmul_cuda_chosen / matmul_cuda_take_chosen). Two fresh runs may choose differently where candidates
// are close, and then differ in the GEMMs' rounding: --matmul-tune 0 keeps the heuristic's first.
static const int MATMUL_TUNE_RUNS = 5;
static const float MATMUL_TUNE_MARGIN = 0.02f;

// Milliseconds of the GEMM with candidate `cand` (the median of MATMUL_TUNE_RUNS after a warm-up run), or -1
// if cuBLASLt refuses to run it.
static inline float matmul_time_candidate(const MatmulPlan& plan, const cublasLtMatmulHeuristicResult_t& cand, void* D, const void* C,
                                          const floatX* A, const floatX* B, float alpha, float beta, cudaStream_t stream) {
    if (g_matmul.tune_events[0] == nullptr)
        for (cudaEvent_t& e : g_matmul.tune_events) cudaCheck(cudaEventCreate(&e));
    std::vector<float> ms;
    for (int run = 0; run <= MATMUL_TUNE_RUNS; run++) {
        cudaCheck(cudaEventRecord(g_matmul.tune_events[0], stream));
        if (cublasLtMatmul(g_matmul.handle, plan.desc, &alpha, B, plan.layout_a, A, plan.layout_b, &beta, C, plan.layout_cd, D,
                           plan.layout_cd, &cand.algo, g_matmul.workspace, cand.workspaceSize, stream) != CUBLAS_STATUS_SUCCESS)
            return -1.0f;
        cudaCheck(cudaEventRecord(g_matmul.tune_events[1], stream));
        cudaCheck(cudaEventSynchronize(g_matmul.tune_events[1]));
        float t = 0.0f;
        cudaCheck(cudaEventElapsedTime(&t, g_matmul.tune_events[0], g_matmul.tune_events[1]));
        if (run > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// A new plan's choice: recorded, tuned, or the heuristic's first (see above). d_bytes: D's size in bytes.
static inline void matmul_choose(MatmulPlan* plan, const MatmulKey& key, void* D, const void* C, const floatX* A, const floatX* B,
                                 float alpha, float beta, size_t d_bytes, cudaStream_t stream) {
    if (plan->fallback) return;  // no candidate to choose from (a recorded choice cannot name one here either)
    const auto rec = g_matmul.recorded.find(key);
    if (rec != g_matmul.recorded.end()) {
        if (rec->second < (int)plan->usable.size()) {
            matmul_plan_take(plan, rec->second);
            plan->how = MatmulPlan::RECORDED;
            g_matmul.chosen_keys.push_back(key);
            return;
        }
        printf("warning: matmul M=%lld N=%lld K=%lld: the recorded choice is candidate #%d, but cuBLASLt offers %zu here (another "
                "GPU or library?); %s, so the run may differ from the recorded one in the last bits\n", key[0], key[1], key[2], rec->second,
                plan->usable.size(), g_matmul.tune ? "tuning again" : "taking the heuristic's first");
    }
    if (!g_matmul.tune || plan->usable.size() < 2) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;  // nothing can be timed inside a capture
    void* scratch = nullptr;
    if (C == D && beta != 0.0f) {  // time on a copy of D: the runs would otherwise add into it
        if (cuda_malloc(&scratch, d_bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // clears the failed allocation's error; the plan keeps the heuristic's first
            printf("warning: matmul M=%lld N=%lld K=%lld not tuned: no device memory for a %.1f MiB copy of its output\n", key[0],
                    key[1], key[2], d_bytes / 1048576.0);
            return;
        }
        cudaCheck(cudaMemcpyAsync(scratch, D, d_bytes, cudaMemcpyDeviceToDevice, stream));
        D = scratch;
        C = scratch;
    }
    plan->tune_ms.clear();
    int best = 0;
    for (size_t i = 0; i < plan->usable.size(); i++) {
        plan->tune_ms.push_back(matmul_time_candidate(*plan, plan->usable[i], D, C, A, B, alpha, beta, stream));
        const float t = plan->tune_ms.back(), t_best = plan->tune_ms[best];
        if (t >= 0.0f && (t_best < 0.0f || t < (best == 0 ? (1.0f - MATMUL_TUNE_MARGIN) * t_best : t_best))) best = (int)i;
    }
    cuda_free(scratch);
    matmul_plan_take(plan, best);
    plan->how = MatmulPlan::TUNED;
    g_matmul.chosen_keys.push_back(key);
}

// The GEMM of a plan for which cuBLASLt offers no deterministic algorithm (none at all, none out of place, or
// only split-K schemes our rules exclude: tiny or oddly aligned problems such as Muon's 6 x 12 ve_gate group),
// under matmul_lt's contract below. Its CPU twin is matmul.cuh's CPU GEMM (dev/cuda/matmul_check.cu checks it
// against it, on the emulator with a heuristic that offers nothing). One block of 16 x 16 threads per 16 x 16
// tile of D[b]; op(A) and op(B) pass through shared memory 16 columns (rows) of K at a time; each output sums
// its K products in ascending order in fp32 and is rounded once: deterministic, run to run and across GPUs.
// Far slower than cuBLASLt for large problems; the plan says when it is taken.
// grid (ceil(N / 16), ceil(M / 16), batch), block 256.
static const int MATMUL_FALLBACK_TILE = 16;
template <typename OutT>
__global__ void __launch_bounds__(MATMUL_FALLBACK_TILE * MATMUL_FALLBACK_TILE)
    matmul_fallback_kernel(OutT* D, const OutT* C, const floatX* A, const floatX* B, int M, int N, int K, bool transA, bool transB,
                           float alpha, float beta, long long strideA, long long strideB, long long strideCD) {
    constexpr int T = MATMUL_FALLBACK_TILE;
    __shared__ float a_tile[T][T + 1], b_tile[T][T + 1];  // op(A) rows x K slice, K slice x op(B) columns (+1: no bank conflicts)
    const int tx = threadIdx.x % T, ty = threadIdx.x / T;
    const int row = blockIdx.y * T + ty, col = blockIdx.x * T + tx;
    const size_t b = blockIdx.z;
    A += b * strideA;
    B += b * strideB;
    D += b * strideCD;
    C += b * strideCD;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += T) {
        const int ak = k0 + tx, bk = k0 + ty;  // op(A)[row][ak] and op(B)[bk][col]; A stored (M, K) or (K, M), B (K, N) or (N, K)
        a_tile[ty][tx] = row < M && ak < K ? to_float(transA ? A[(size_t)ak * M + row] : A[(size_t)row * K + ak]) : 0.0f;
        b_tile[ty][tx] = bk < K && col < N ? to_float(transB ? B[(size_t)col * K + bk] : B[(size_t)bk * N + col]) : 0.0f;
        __syncthreads();
        const int kend = min(T, K - k0);
        for (int k = 0; k < kend; k++) acc = fmaf(a_tile[ty][k], b_tile[k][tx], acc);
        __syncthreads();
    }
    if (row >= M || col >= N) return;
    const size_t at = (size_t)row * N + col;
    const float out = beta != 0.0f ? alpha * acc + beta * to_float(C[at]) : alpha * acc;
    if constexpr (sizeof(OutT) == sizeof(float)) D[at] = out;
    else D[at] = to_floatX(out);
}

// The one GEMM of the CUDA backend, row-major, strided-batched:
//   D[i] (M, N) = alpha op(A[i]) (M, K) @ op(B[i]) (K, N) + beta C[i],   i < batch
// A stored (M, K), or (K, M) if transA; B stored (K, N), or (N, K) if transB; C and D stored (M, N), packed
// (leading dimension = stored columns). A, B bf16; C, D bf16 or fp32 (d_fp32). C may be D (in place) or
// nullptr when beta == 0 (C is then not read). Strides are in elements between consecutive matrices.
static inline void matmul_lt(void* D, bool d_fp32, const void* C, const floatX* A, const floatX* B, int M, int N, int K,
                             bool transA, bool transB, float alpha, float beta, int batch, long long strideA,
                             long long strideB, long long strideCD, cudaStream_t stream) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    if (K <= 0) fail("matmul: K = %d (an empty reduction is not supported)", K);
    if (C == nullptr || beta == 0.0f) C = D;
    const bool in_place = C == D;
    const int d_bytes = d_fp32 ? 4 : 2;
    long long alA = matmul_alignment(A, strideA, 2, batch), alB = matmul_alignment(B, strideB, 2, batch);
    long long alCD = std::min(matmul_alignment(D, strideCD, d_bytes, batch), matmul_alignment(C, strideCD, d_bytes, batch));
    if (batch == 1) strideA = strideB = strideCD = 0;  // not part of the problem
    MatmulKey key = {M, N, K, transA, transB, d_fp32, batch, strideA, strideB, strideCD, in_place, alA, alB, alCD,
                     (long long)g_matmul_reduction_mask};
    bool made = false;
    MatmulPlan& plan = matmul_plan(key, M, N, K, transA, transB, d_fp32, batch, strideA, strideB, strideCD, in_place,
                                   (uint32_t)alA, (uint32_t)alB, (uint32_t)alCD, &made);
    if (made) matmul_choose(&plan, key, D, C, A, B, alpha, beta, ((size_t)(batch - 1) * strideCD + (size_t)M * N) * d_bytes, stream);
    g_matmul.last = &plan;
    if (plan.fallback) {
        if (ceil_div(M, MATMUL_FALLBACK_TILE) > 65535 || batch > 65535)  // the grid's y and z limits
            fail("matmul: cuBLASLt offers no deterministic algorithm for M=%d N=%d K=%d batch=%d, and the fallback kernel takes at most "
                 "%d rows and 65535 matrices", M, N, K, batch, 65535 * MATMUL_FALLBACK_TILE);
        const dim3 grid(ceil_div(N, MATMUL_FALLBACK_TILE), ceil_div(M, MATMUL_FALLBACK_TILE), batch);
        const int threads = MATMUL_FALLBACK_TILE * MATMUL_FALLBACK_TILE;
        if (d_fp32)
            matmul_fallback_kernel<float><<<grid, threads, 0, stream>>>((float*)D, (const float*)C, A, B, M, N, K, transA, transB, alpha, beta,
                                                                 strideA, strideB, strideCD);
        else
            matmul_fallback_kernel<floatX><<<grid, threads, 0, stream>>>((floatX*)D, (const floatX*)C, A, B, M, N, K, transA, transB, alpha, beta,
                                                                 strideA, strideB, strideCD);
        cudaCheckLaunch();
    } else {
        cublasCheck(cublasLtMatmul(g_matmul.handle, plan.desc, &alpha, B, plan.layout_a, A, plan.layout_b, &beta, C,
                                   plan.layout_cd, D, plan.layout_cd, &plan.algo, g_matmul.workspace, plan.workspace, stream));
    }
    if (cuda_sync_debug()) {  // name the matmul: its shape and layout
        char what[160];
        snprintf(what, sizeof what, "cuBLASLt matmul M %d N %d K %d transA %d transB %d batch %d%s", M, N, K, (int)transA, (int)transB, batch,
                 d_fp32 ? " fp32 out" : "");
        cuda_check_launch(what, __FILE__, __LINE__);
    }
}

// out (M, N) bf16 = inp (M, K) @ weight^T, weight (N, K); out is only written
static inline void matmul_forward_cuda(floatX* out, const floatX* inp, const floatX* weight, int M, int K, int N, cudaStream_t stream) {
    matmul_lt(out, false, nullptr, inp, weight, M, N, K, false, true, 1.0f, 0.0f, 1, 0, 0, 0, stream);
}

// out (M, N) bf16 = residual (M, N) + inp (M, K) @ weight^T: the add happens in the GEMM epilogue (beta = 1,
// C = residual, D = out), in fp32 before the one rounding, instead of a separate kernel reading both again
static inline void matmul_forward_add_cuda(floatX* out, const floatX* inp, const floatX* weight, const floatX* residual, int M, int K,
                                           int N, cudaStream_t stream) {
    matmul_lt(out, false, residual, inp, weight, M, N, K, false, true, 1.0f, 1.0f, 1, 0, 0, 0, stream);
}

// dinp (M, K) bf16 = or += dout (M, N) @ weight (N, K)       (dinp_write; skipped if dinp == nullptr)
// dweight (N, K) fp32 += dout^T (N, M) @ inp (M, K)          (skipped if dweight == nullptr)
// Accumulation happens inside the GEMM epilogue (beta = 1): the old value is read, added in fp32, and
// written once (rounded to bf16 for dinp). GRAD_OVERWRITE is beta = 0: the old dinp is never read.
static inline void matmul_backward_cuda(floatX* dinp, float* dweight, const floatX* dout, const floatX* inp, const floatX* weight,
                                        int M, int K, int N, GradWrite dinp_write, cudaStream_t stream) {
    const float dinp_beta = dinp_write == GRAD_ACCUMULATE ? 1.0f : 0.0f;
    if (dinp != nullptr) matmul_lt(dinp, false, dinp, dout, weight, M, K, N, false, false, 1.0f, dinp_beta, 1, 0, 0, 0, stream);
    if (dweight != nullptr) matmul_lt(dweight, true, dweight, dout, inp, N, K, M, true, false, 1.0f, 1.0f, 1, 0, 0, 0, stream);
}

// Strided-batched bf16 GEMM for Muon's Polar Express (row-major, see matmul_lt for the full contract):
//   D[i] (M, N) = alpha op(A[i]) (M, K) @ op(B[i]) (K, N) + beta C[i],   i < batch,   all bf16, fp32 accumulate
// One cuBLASLt call over the whole batch (layout attributes BATCH_COUNT and STRIDED_BATCH_OFFSET), so a
// Muon group of K matrices costs one launch per product instead of K. C may equal D, differ from D (an
// out-of-place epilogue, used for X <- a X + B X), or be nullptr when beta == 0.
static inline void gemm_strided_batched_bf16_cuda(floatX* D, const floatX* C, const floatX* A, const floatX* B, int M, int N,
                                                  int K, bool transA, bool transB, float alpha, float beta, int batch,
                                                  long long strideA, long long strideB, long long strideCD, cudaStream_t stream) {
    matmul_lt(D, false, C, A, B, M, N, K, transA, transB, alpha, beta, batch, strideA, strideB, strideCD, stream);
}

// One line per cached plan: the problem and what cuBLASLt chose for it (algorithm, tile, split-K, reduction),
// and how: the heuristic's first, tuned (with every candidate's ms, the chosen one marked *), or recorded.
static inline void matmul_cuda_print_plans(FILE* f) {
    for (const auto& kv : g_matmul.plans) {
        const MatmulKey& k = kv.first;
        const MatmulPlan& p = kv.second;
        if (p.fallback) {
            fprintf(f, "  M=%-6lld N=%-6lld K=%-6lld tA=%lld tB=%lld out=%s batch=%-3lld %s align=%lld/%lld/%lld | no cuBLASLt candidate: "
                    "matmul_fallback_kernel\n", k[0], k[1], k[2], k[3], k[4], k[5] ? "fp32" : "bf16", k[6], k[10] ? "in-place" : "out-of-place",
                    k[11], k[12], k[13]);
            continue;
        }
        fprintf(f, "  M=%-6lld N=%-6lld K=%-6lld tA=%lld tB=%lld out=%s batch=%-3lld %s align=%lld/%lld/%lld | #%d of %zu: algo %d tile %d "
                "stages %d splitK %d reduction %s waves %.2f ws %zu | %s",
                k[0], k[1], k[2], k[3], k[4], k[5] ? "fp32" : "bf16", k[6], k[10] ? "in-place" : "out-of-place", k[11], k[12],
                k[13], p.chosen, p.usable.size(), p.algo_id, p.tile_id, p.stages_id, p.splitk,
                p.reduction == CUBLASLT_REDUCTION_SCHEME_NONE ? "none" : p.reduction == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? "fp32-ws" : "other",
                p.waves, p.workspace, p.how == MatmulPlan::TUNED ? "tuned, ms:" : p.how == MatmulPlan::RECORDED ? "recorded" : "heuristic's first");
        for (size_t i = 0; i < p.tune_ms.size(); i++) fprintf(f, " %.3f%s", p.tune_ms[i], (int)i == p.chosen ? "*" : "");
        fprintf(f, "\n");
    }
}

// The choices of the plans tuned or recorded so far, as text for a checkpoint: "KEY=INDEX" per plan, the
// key's 15 numbers joined by commas, plans separated by spaces.
static inline std::string matmul_cuda_choices() {
    std::string text;
    for (const MatmulKey& key : g_matmul.chosen_keys) {
        if (!text.empty()) text += ' ';
        for (size_t i = 0; i < key.size(); i++) text += (i ? "," : "") + std::to_string(key[i]);
        text += "=" + std::to_string(g_matmul.plans.at(key).chosen);
    }
    return text;
}

// Takes choices written by matmul_cuda_choices (from `source`, for the error): each plan made from now on
// with a recorded key runs the recorded candidate, untimed.
static inline void matmul_cuda_restore_choices(const std::string& text, const char* source) {
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find(' ', pos);
        if (end == std::string::npos) end = text.size();
        const std::string item = text.substr(pos, end - pos);
        MatmulKey key;
        long long index = -1;
        size_t at = 0;
        bool ok = true;
        for (size_t i = 0; i <= key.size() && ok; i++) {
            char* stop = nullptr;
            const long long v = strtoll(item.c_str() + at, &stop, 10);
            const char want = i + 1 < key.size() ? ',' : i + 1 == key.size() ? '=' : '\0';
            ok = stop != item.c_str() + at && *stop == want;
            if (i < key.size()) key[i] = v;
            else index = v;
            at = stop - item.c_str() + 1;
        }
        if (!ok || index < 0 || index >= 64) fail("%s: matmul_choices: '%s' is not KEY=INDEX with 15 numbers in KEY", source, item.c_str());
        g_matmul.recorded[key] = (int)index;
        pos = end + 1;
    }
}

// One line on the plans tuned or recorded so far: how many, how many run another candidate than the
// heuristic's first, and the time of the tuned GEMMs (one call each) with the heuristic's first and chosen.
static inline std::string matmul_cuda_choices_summary() {
    int tuned = 0, recorded = 0, other = 0;
    double first_ms = 0.0, chosen_ms = 0.0;
    for (const MatmulKey& key : g_matmul.chosen_keys) {
        const MatmulPlan& p = g_matmul.plans.at(key);
        other += p.chosen != 0;
        if (p.how == MatmulPlan::RECORDED) {
            recorded++;
        } else if (p.tune_ms[0] >= 0.0f) {  // a first candidate that cuBLASLt refused has no time to compare
            tuned++;
            first_ms += p.tune_ms[0];
            chosen_ms += p.tune_ms[p.chosen];
        }
    }
    if (tuned + recorded == 0) return "";
    char buf[256];
    snprintf(buf, sizeof buf, "cuBLASLt: %d GEMM shapes tuned (%.3f ms with the heuristic's first candidates, %.3f ms as chosen), %d "
             "taken from the checkpoint; %d run another candidate than the heuristic's first", tuned, first_ms, chosen_ms, recorded, other);
    return buf;
}

// The chosen candidate of each plan tuned or recorded so far, in the order they were made (the same order
// on every rank: the ranks run the same code): rank 0's go to the others with matmul_cuda_take_chosen.
static inline std::vector<int64_t> matmul_cuda_chosen() {
    std::vector<int64_t> chosen;
    for (const MatmulKey& key : g_matmul.chosen_keys) chosen.push_back(g_matmul.plans.at(key).chosen);
    return chosen;
}

static inline void matmul_cuda_take_chosen(const std::vector<int64_t>& chosen) {
    if (chosen.size() != g_matmul.chosen_keys.size())
        fail("matmul: rank 0 tuned %zu GEMMs, this rank %zu: the ranks ran different GEMMs", chosen.size(), g_matmul.chosen_keys.size());
    for (size_t i = 0; i < chosen.size(); i++) {
        MatmulPlan& plan = g_matmul.plans.at(g_matmul.chosen_keys[i]);
        if (chosen[i] >= (int64_t)plan.usable.size())
            fail("matmul: rank 0 chose cuBLASLt's candidate #%lld for M=%lld N=%lld K=%lld, which offers this rank only %zu: the ranks' "
                 "GPUs or libraries differ", (long long)chosen[i], g_matmul.chosen_keys[i][0], g_matmul.chosen_keys[i][1],
                 g_matmul.chosen_keys[i][2], plan.usable.size());
        matmul_plan_take(&plan, (int)chosen[i]);
    }
}

// out (n) bf16 = in (n) fp32, round to nearest even: parameters (fp32 master) -> matmul operands.
// Each thread converts 8 consecutive elements: two 16-byte loads and one 16-byte store when both
// pointers are 16-byte aligned (vec), element by element otherwise and at the tail.
static const int CAST_THREADS = 256;
__global__ void __launch_bounds__(CAST_THREADS) cast_to_bf16_kernel(floatX* out, const float* in, size_t n, bool vec) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    if (vec && i + 8 <= n) {
        float4 a = *reinterpret_cast<const float4*>(in + i), b = *reinterpret_cast<const float4*>(in + i + 4);
        __align__(16) floatX o[8] = {to_floatX(a.x), to_floatX(a.y), to_floatX(a.z), to_floatX(a.w),
                                     to_floatX(b.x), to_floatX(b.y), to_floatX(b.z), to_floatX(b.w)};
        *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(o);
    } else {
        size_t end = i + 8 < n ? i + 8 : n;
        for (size_t j = i; j < end; j++) out[j] = to_floatX(in[j]);
    }
}

static inline void cast_to_bf16_cuda(floatX* out, const float* in, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    bool vec = ((uintptr_t)out % 16 == 0) && ((uintptr_t)in % 16 == 0);
    cast_to_bf16_kernel<<<ceil_div((long)ceil_div((long)n, 8), CAST_THREADS), CAST_THREADS, 0, stream>>>(out, in, n, vec);
    cudaCheckLaunch();
}
#endif  // __CUDACC__
