// check_util.cuh: what the dev/cuda/*_check.cu harnesses share (random device data, downloads, relative
// error, timing with the L2 flushed, the result table). Included by the harnesses only, never by the trainer.
#pragma once
#include <algorithm>
#include <string>
#include <vector>
#include "llmc/cuda_common.cuh"

// uniform in [lo, hi) from a hash of (seed, index): fresh data per check without a host RNG pass
__device__ __forceinline__ float check_hash_uniform(uint64_t seed, size_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}
template <typename T>
__global__ void check_fill_kernel(T* p, size_t n, uint64_t seed, float lo, float hi) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float u = lo + (hi - lo) * check_hash_uniform(seed, i);
        if (u == 0.0f) u = 0.5f * hi;  // never an exact zero
        p[i] = (T)u;
    }
}
static uint64_t g_seed = 1234;
template <typename T>
static void fill_random(T* p, size_t n, float lo, float hi) {
    check_fill_kernel<T><<<ceil_div((long)n, 256), 256>>>(p, n, g_seed++ * 0x2545F4914F6CDD1Dull, lo, hi);
    cudaCheckLaunch();
}
template <typename T>
static T* dev_alloc(size_t n) {
    T* p;
    cudaCheck(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    return p;
}
static std::vector<float> download_bf16(const floatX* d, size_t n) {
    std::vector<floatX> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}
static std::vector<float> download_f32(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
template <typename T>
static std::vector<unsigned char> download_bytes(const T* d, size_t n) {
    std::vector<unsigned char> h(n * sizeof(T));
    cudaCheck(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
    return h;
}
// ||a - ref|| / ||ref||; NaN anywhere gives NaN (which fails every `err <= tol`)
static double rel_err(const float* a, const float* ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0.0 ? sqrt(den) : 1.0);
}
static bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

static void* g_flush = nullptr;
static const size_t FLUSH_BYTES = 256ull << 20;  // > L2 (50-60 MB on H100/H200)
static void check_init() {
    cuda_context_init();
    printf("device: %s, %d SMs\n", g_cuda.name, g_cuda.sm_count);
    cudaCheck(cudaMalloc(&g_flush, FLUSH_BYTES));
}
// median milliseconds of f() over `repeats`, after 2 warm-ups; before each timed run prepare() (untimed,
// e.g. restoring an input that f overwrites) and an L2 flush
template <typename P, typename F>
static double time_ms(P prepare, F f, int repeats) {
    for (int i = 0; i < 2; i++) {
        prepare();
        f();
    }
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    std::vector<float> ms(repeats);
    for (int r = 0; r < repeats; r++) {
        prepare();
        cudaCheck(cudaMemsetAsync(g_flush, r & 0xff, FLUSH_BYTES, 0));
        cudaCheck(cudaEventRecord(start, 0));
        f();
        cudaCheck(cudaEventRecord(stop, 0));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[r], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[repeats / 2];
}
template <typename F>
static double time_ms(F f, int repeats) {
    return time_ms([] {}, f, repeats);
}

struct ResultRow {
    std::string name;
    double err, tol;
    bool det;
    double ms, rate;
    const char* unit;
};
static std::vector<ResultRow> g_rows;
static int g_failures = 0;
// one check: its relative error against its tolerance, determinism, time and rate (unit: "TFLOP/s", "GB/s")
static void record(const std::string& name, double err, double tol, bool det, double ms, double rate, const char* unit) {
    bool ok = err <= tol && det;  // NaN err fails
    if (!ok) g_failures++;
    g_rows.push_back({name, err, tol, det, ms, rate, unit});
    printf("%-40s rel err %.2e (tol %.0e) %s %s  %8.3f ms %8.1f %s\n", name.c_str(), err, tol,
           det ? "deterministic" : "NOT DETERMINISTIC", ok ? "ok" : "FAIL", ms, rate, unit);
    fflush(stdout);
}
// the short table, last; returns the exit code
static int print_table() {
    printf("\n%-40s %9s %7s %5s %9s %10s\n", "check", "rel err", "tol", "det", "ms", "rate");
    for (const ResultRow& r : g_rows)
        printf("%-40s %9.2e %7.0e %5s %9.3f %10.1f %s%s\n", r.name.c_str(), r.err, r.tol, r.det ? "yes" : "NO", r.ms, r.rate,
               r.unit, r.err <= r.tol && r.det ? "" : "  FAIL");
    printf("%d checks, %d failed\n", (int)g_rows.size(), g_failures);
    return g_failures ? 1 : 0;
}

