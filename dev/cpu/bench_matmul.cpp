/*
Test and benchmark of the CPU matmul in matmul.cuh.

Build and run (from the repo root):
g++ -O3 -march=native -fopenmp -std=c++17 -I. dev/cpu/bench_matmul.cpp -o /tmp/bench_matmul
/tmp/bench_matmul

1) correctness: forward, both backward gradients (+= semantics) and gemm_cpu with every
   transpose combination and padded strides, against matmul.cuh's plain triple loop
   (gemm_naive_cpu) run in double precision;
   relative error ||got - ref||_2 / ||ref||_2 must be <= 1e-6
2) determinism: results with 1, 2 and 3 OpenMP threads must be bit-identical (memcmp),
   and so must GEMMs called from inside a parallel region
3) benchmark: GFLOP/s of forward and backward at M = 1024 with 2 threads
Exits with 1 on any failure.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <omp.h>
#include "llmc/matmul.cuh"

static const double TOL = 1e-6;
static int failures = 0;

// deterministic uniform(-1, 1) fill (xorshift), so failures are reproducible
static void fill_random(std::vector<float>& v, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < v.size(); i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v[i] = (float)((s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

static void check(const char* what, const float* got, const double* ref, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        diff += d * d;
        norm += ref[i] * ref[i];
    }
    double rel = norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
    bool ok = rel <= TOL; // also false for NaN
    if (!ok) { failures++; }
    printf("  %-22s rel err %.2e %s\n", what, rel, ok ? "ok" : "FAIL");
}

// the floats of a (rows, cols) matrix with row stride ld, as doubles (up to the last element it uses)
static std::vector<double> to_double(const float* X, int rows, int cols, int ld) {
    return std::vector<double>(X, X + (size_t)(rows - 1) * ld + cols);
}

// reference: C (M, N) = C0 + op(A) @ op(B) in double, with the strides of gemm_cpu: matmul.cuh's plain
// triple loop (gemm_naive_cpu) run in double
static std::vector<double> gemm_ref(const float* C0, const float* A, const float* B, int M, int N, int K,
                                    int lda, int ldb, int ldc, bool transA, bool transB) {
    std::vector<double> C((size_t)M * ldc, 0.0);
    if (C0 != nullptr) { C.assign(C0, C0 + C.size()); }
    std::vector<double> a = to_double(A, transA ? K : M, transA ? M : K, lda), b = to_double(B, transB ? N : K, transB ? K : N, ldb);
    gemm_naive_cpu(C.data(), a.data(), b.data(), M, N, K, lda, ldb, ldc, transA, transB, C0 != nullptr);
    return C;
}

struct LinearResult {
    std::vector<float> out, dinp, dweight;
};

// forward and backward of a Linear layer with the given thread count;
// dinp and dweight start from random values to test the += semantics
static LinearResult run_linear(const std::vector<float>& inp, const std::vector<float>& weight,
                               const std::vector<float>& dout, int M, int K, int N, int nthreads) {
    omp_set_num_threads(nthreads);
    LinearResult r;
    r.out.assign((size_t)M * N, NAN); // out is overwritten, never read
    r.dinp.resize((size_t)M * K);
    r.dweight.resize((size_t)N * K);
    fill_random(r.dinp, 4);
    fill_random(r.dweight, 5);
    matmul_forward_cpu(r.out.data(), inp.data(), weight.data(), M, K, N);
    matmul_backward_cpu(r.dinp.data(), r.dweight.data(), dout.data(), inp.data(), weight.data(), M, K, N, GRAD_ACCUMULATE);
    return r;
}

static void test_linear(int M, int K, int N) {
    printf("linear M=%d K=%d N=%d\n", M, K, N);
    std::vector<float> inp((size_t)M * K), weight((size_t)N * K), dout((size_t)M * N);
    fill_random(inp, 1);
    fill_random(weight, 2);
    fill_random(dout, 3);
    LinearResult r1 = run_linear(inp, weight, dout, M, K, N, 1);

    // the same initial gradients as run_linear, for the reference
    std::vector<float> dinp0((size_t)M * K), dweight0((size_t)N * K);
    fill_random(dinp0, 4);
    fill_random(dweight0, 5);
    check("out", r1.out.data(), gemm_ref(nullptr, inp.data(), weight.data(), M, N, K, K, K, N, false, true).data(), r1.out.size());
    check("dinp (+=)", r1.dinp.data(), gemm_ref(dinp0.data(), dout.data(), weight.data(), M, K, N, N, K, K, false, false).data(), r1.dinp.size());
    check("dweight (+=)", r1.dweight.data(), gemm_ref(dweight0.data(), dout.data(), inp.data(), N, K, M, N, K, K, true, false).data(), r1.dweight.size());

    // null gradient pointers are skipped
    std::vector<float> dinp_only = dinp0;
    matmul_backward_cpu(dinp_only.data(), nullptr, dout.data(), inp.data(), weight.data(), M, K, N, GRAD_ACCUMULATE);
    bool null_ok = memcmp(dinp_only.data(), r1.dinp.data(), dinp_only.size() * sizeof(float)) == 0;
    if (!null_ok) { failures++; }
    printf("  %-22s %s\n", "dweight == nullptr", null_ok ? "ok" : "FAIL");

    // GRAD_OVERWRITE never reads dinp: NaN there must not reach the result
    std::vector<float> dinp_over((size_t)M * K, NAN);
    matmul_backward_cpu(dinp_over.data(), nullptr, dout.data(), inp.data(), weight.data(), M, K, N, GRAD_OVERWRITE);
    check("dinp (=)", dinp_over.data(), gemm_ref(nullptr, dout.data(), weight.data(), M, K, N, N, K, K, false, false).data(), dinp_over.size());

    for (int nthreads = 2; nthreads <= 3; nthreads++) {
        LinearResult rt = run_linear(inp, weight, dout, M, K, N, nthreads);
        bool same = memcmp(rt.out.data(), r1.out.data(), rt.out.size() * sizeof(float)) == 0 &&
                    memcmp(rt.dinp.data(), r1.dinp.data(), rt.dinp.size() * sizeof(float)) == 0 &&
                    memcmp(rt.dweight.data(), r1.dweight.data(), rt.dweight.size() * sizeof(float)) == 0;
        if (!same) { failures++; }
        printf("  %d threads vs 1 thread   %s\n", nthreads, same ? "bit-identical" : "FAIL (differs)");
    }
}

// gemm_cpu with padded row strides (elements between rows must be left untouched)
static void test_gemm_strided(int M, int N, int K, bool transA, bool transB, bool accumulate) {
    printf("gemm M=%d N=%d K=%d transA=%d transB=%d accumulate=%d\n", M, N, K, transA, transB, accumulate);
    omp_set_num_threads(2);
    int lda = (transA ? M : K) + 3, ldb = (transB ? K : N) + 5, ldc = N + 7;
    std::vector<float> A((size_t)(transA ? K : M) * lda), B((size_t)(transB ? N : K) * ldb), C((size_t)M * ldc);
    fill_random(A, 6);
    fill_random(B, 7);
    fill_random(C, 8);
    std::vector<double> ref = gemm_ref(accumulate ? C.data() : nullptr, A.data(), B.data(), M, N, K, lda, ldb, ldc, transA, transB);
    for (int i = 0; i < M; i++) {
        for (int j = N; j < ldc; j++) { ref[(size_t)i * ldc + j] = C[(size_t)i * ldc + j]; } // padding unchanged
    }
    gemm_cpu(C.data(), A.data(), B.data(), M, N, K, lda, ldb, ldc, transA, transB, accumulate);
    check("C", C.data(), ref.data(), C.size());
}

// one GEMM per attention head, att[h] (T, T) = q_h (T, hs) @ k_h^T, reading q and k in place from a
// fused qkv (T, 3*C) tensor (row stride 3*C): once from the main thread (the GEMMs use 2 threads),
// once from inside a parallel loop over heads (each GEMM on its calling thread); bits must match
static void test_gemm_nested() {
    int T = 200, NH = 4, hs = 64, C = NH * hs;
    printf("gemm per head, T=%d hs=%d, from inside a parallel region\n", T, hs);
    omp_set_num_threads(2);
    std::vector<float> qkv((size_t)T * 3 * C), att_outside((size_t)NH * T * T), att_inside((size_t)NH * T * T);
    fill_random(qkv, 9);
    for (int h = 0; h < NH; h++) {
        gemm_cpu(att_outside.data() + (size_t)h * T * T, qkv.data() + h * hs, qkv.data() + C + h * hs,
                 T, T, hs, 3 * C, 3 * C, T, false, true, false);
    }
    #pragma omp parallel for
    for (int h = 0; h < NH; h++) {
        gemm_cpu(att_inside.data() + (size_t)h * T * T, qkv.data() + h * hs, qkv.data() + C + h * hs,
                 T, T, hs, 3 * C, 3 * C, T, false, true, false);
    }
    int h = NH - 1;
    check("att, last head", att_outside.data() + (size_t)h * T * T,
          gemm_ref(nullptr, qkv.data() + h * hs, qkv.data() + C + h * hs, T, T, hs, 3 * C, 3 * C, T, false, true).data(),
          (size_t)T * T);
    bool same = memcmp(att_outside.data(), att_inside.data(), att_inside.size() * sizeof(float)) == 0;
    if (!same) { failures++; }
    printf("  inside vs outside      %s\n", same ? "bit-identical" : "FAIL (differs)");
}

static double now_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// best time over repeats, after one warm-up call (which also grows the packing scratch)
template <typename F>
static double best_time(F f, int repeats) {
    f();
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_seconds();
        f();
        double t = now_seconds() - t0;
        best = t < best ? t : best;
    }
    return best;
}

static void bench(int M, int K, int N, int repeats) {
    std::vector<float> inp((size_t)M * K), weight((size_t)N * K), dout((size_t)M * N), out((size_t)M * N);
    std::vector<float> dinp((size_t)M * K, 0.0f), dweight((size_t)N * K, 0.0f);
    fill_random(inp, 1);
    fill_random(weight, 2);
    fill_random(dout, 3);
    double flops = 2.0 * M * N * K;
    double tf = best_time([&] { matmul_forward_cpu(out.data(), inp.data(), weight.data(), M, K, N); }, repeats);
    double tb = best_time([&] { matmul_backward_cpu(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), M, K, N, GRAD_ACCUMULATE); }, repeats);
    printf("| %5d | %5d | %5d | %8.2f | %8.1f | %8.2f | %8.1f |\n",
           M, K, N, tf * 1e3, flops / tf * 1e-9, tb * 1e3, 2.0 * flops / tb * 1e-9);
}

int main() {
    // correctness and thread-count independence
    const int shapes[][3] = { // M, K, N
        {37, 24, 100}, {1, 1, 1}, {64, 12, 4}, {32, 12, 4}, {1024, 256, 768}, {513, 300, 129},
        {200, 1000, 70}, {1030, 16, 4200}, {64, 3072, 96}, {4096, 64, 48},
    };
    for (const auto& s : shapes) { test_linear(s[0], s[1], s[2]); }
    for (int t = 0; t < 8; t++) {
        test_gemm_strided(67, 45, 530, t & 1, (t >> 1) & 1, (t >> 2) & 1);
    }
    test_gemm_nested();
    if (failures > 0) {
        printf("FAILED: %d checks\n", failures);
        return 1;
    }
    printf("all checks passed\n\n");

    // benchmark; backward = dinp and dweight, i.e. twice the flops of forward
    omp_set_num_threads(2);
    printf("benchmark, %d threads, best of 5 (backward computes dinp and dweight)\n", omp_get_max_threads());
    printf("|     M |     K |     N | fwd ms   | fwd GF/s | bwd ms   | bwd GF/s |\n");
    printf("|-------|-------|-------|----------|----------|----------|----------|\n");
    const int bench_shapes[][2] = {{256, 768}, {256, 1024}, {1024, 256}, {256, 8192}}; // K, N
    for (const auto& s : bench_shapes) { bench(1024, s[0], s[1], 5); }
    return 0;
}
