/*
Matrix multiplication: nn.Linear forward/backward and the general GEMM they are built on.

Conventions (as in llm.c): all tensors are row-major fp32, and a Linear weight has the
PyTorch layout (N, K) = (out_features, in_features), so the forward pass is
    out (M, N) = inp (M, K) @ weight^T
where M = B*T is the number of rows (tokens).

CPU backend properties:
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
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// ----------------------------------------------------------------------------
// CPU

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

// dinp (M, K) += dout (M, N) @ weight (N, K)          (skipped if dinp == nullptr)
// dweight (N, K) += dout^T (N, M) @ inp (M, K)        (skipped if dweight == nullptr)
// inp (M, K), weight (N, K); gradients accumulate (+=), as for parameters shared across uses
static inline void matmul_backward_cpu(float* dinp, float* dweight, const float* dout, const float* inp,
                                       const float* weight, int M, int K, int N) {
    if (dinp != nullptr) { gemm_cpu(dinp, dout, weight, M, K, N, N, K, K, false, false, true); }
    if (dweight != nullptr) { gemm_cpu(dweight, dout, inp, N, K, M, N, K, K, true, false, true); }
}

// CUDA backend: see issue #6
