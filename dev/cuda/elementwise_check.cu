// elementwise_check.cu: the CUDA elementwise ops (norm, rotary, mlp, residual, embedding headers) against
// their CPU twins. Build and run (from the repository root, on a GPU machine):
//   nvcc -arch=sm_90 -O3 -std=c++17 -Xcompiler -Wall,-Wextra,-fopenmp -Werror all-warnings -I. dev/cuda/elementwise_check.cu -o /tmp/elementwise_check && /tmp/elementwise_check
// Flags: --reps N (timed repeats, default 20), --time 0|1 (timing on/off), --tol-scale X (multiplies every
// tolerance; for experiments only).
//
// Per check: random inputs (fresh per check, never zeros) made on the device and read back, so the CPU twin
// runs in fp32 on exactly the bf16 values the kernel sees; outputs that the op overwrites are poisoned
// (all bits set: NaN in bf16 and fp32) before each run, outputs it accumulates into start from random
// values; relative L2 error against the CPU twin; determinism (two runs from the same state, identical
// bits); median time over repeats with the L2 flushed, as GB/s of the bytes the op must move (each input
// read once, each output written once). Tolerances: 1e-2 for bf16 outputs and for scalar reductions over
// all tokens (fp32 on the GPU against double on the CPU, with heavy cancellation on random data); 1e-4 for
// fp32 outputs computed from the same inputs in a different order (rstd, gates, table gradients), which
// get a row of their own (indented, untimed) under the op's row.
// Shapes: the model's (16384 tokens, C 768..1536, head_dim 64/128, QK-norm rows = tokens x heads) plus
// odd ones that take the scalar paths and tails. Exit 1 on any failure; the table comes last.
#include "llmc/norm.cuh"
#include "llmc/rotary.cuh"
#include "llmc/mlp.cuh"
#include "llmc/residual.cuh"
#include "llmc/embedding.cuh"
#include "dev/cuda/check_util.cuh"

static int g_reps = 20;
static bool g_time = true;
static float g_tol_scale = 1.0f;
static const double TOL_BF16 = 1e-2, TOL_F32 = 1e-4;

// ---------------------------------------------------------------------------------------------------
// helpers

static void poison(void* p, size_t bytes) { cudaCheck(cudaMemset(p, 0xFF, bytes)); }
template <typename T>
static void copy_dev(T* dst, const T* src, size_t n) {
    cudaCheck(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice));
}
static float* upload_f32(const std::vector<float>& h) {
    float* d = dev_alloc<float>(h.size());
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static int* upload_int(const std::vector<int>& h) {
    int* d = dev_alloc<int>(h.size());
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
// a random bf16 device buffer and its values on the host
static floatX* rand_bf16(size_t n, float lo, float hi, std::vector<float>* host) {
    floatX* d = dev_alloc<floatX>(n);
    fill_random(d, n, lo, hi);
    if (host) *host = download_bf16(d, n);
    return d;
}
static float* rand_f32(size_t n, float lo, float hi, std::vector<float>* host) {
    float* d = dev_alloc<float>(n);
    fill_random(d, n, lo, hi);
    if (host) *host = download_f32(d, n);
    return d;
}

// the bytes of the op's outputs, to compare two runs
struct OutBuf {
    const void* p;
    size_t bytes;
};
static std::vector<unsigned char> snapshot(const std::vector<OutBuf>& outs) {
    std::vector<unsigned char> all;
    for (const OutBuf& o : outs) {
        std::vector<unsigned char> b = download_bytes((const unsigned char*)o.p, o.bytes);
        all.insert(all.end(), b.begin(), b.end());
    }
    return all;
}
// reset(); op(); snapshot; reset(); op(); snapshot: identical bits? The device keeps the second run's outputs.
template <typename R, typename F>
static bool run_twice(R reset, F op, const std::vector<OutBuf>& outs) {
    reset();
    op();
    cudaCheck(cudaDeviceSynchronize());
    std::vector<unsigned char> a = snapshot(outs);
    reset();
    op();
    cudaCheck(cudaDeviceSynchronize());
    return a == snapshot(outs);
}

static double rel_err_v(const std::vector<float>& a, const std::vector<float>& ref) {
    if (a.size() != ref.size() || !all_finite(a)) return NAN;
    return rel_err(a.data(), ref.data(), a.size());
}
static double worst(double a, double b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); }

template <typename R, typename F>
static double timed(R prepare, F op) {
    return g_time ? time_ms(prepare, op, g_reps) : NAN;
}
static void report(const std::string& name, double err, double tol, bool det, double ms, double bytes) {
    record(name, err, tol * g_tol_scale, det, ms, bytes / (ms * 1e6), "GB/s");
}
// a second output of the op just reported, with its own tolerance (no timing of its own)
static void report_also(const std::string& name, double err, double tol, bool det) {
    record(name, err, tol * g_tol_scale, det, NAN, NAN, "GB/s");
}

// ---------------------------------------------------------------------------------------------------
// norm.cuh

static void check_rmsnorm(const char* tag, size_t rows, int C, float scale, bool in_place) {
    const size_t n = rows * C;
    std::vector<float> x_h, dout_h, dinp_h;
    floatX* x = rand_bf16(n, -2.0f, 2.0f, &x_h);
    floatX* x_saved = dev_alloc<floatX>(n);
    copy_dev(x_saved, x, n);
    floatX* out = in_place ? x : dev_alloc<floatX>(n);
    float* rstd = dev_alloc<float>(rows);
    auto reset = [&] {
        if (in_place) copy_dev(x, x_saved, n);
        else poison(out, n * sizeof(floatX));
        poison(rstd, rows * sizeof(float));
    };
    auto fwd = [&] { rmsnorm_forward_cuda(out, rstd, x, rows, C, scale, 0); };
    bool det = run_twice(reset, fwd, {{out, n * sizeof(floatX)}, {rstd, rows * sizeof(float)}});
    std::vector<float> out_g = download_bf16(out, n), rstd_g = download_f32(rstd, rows);
    std::vector<float> out_c(n), rstd_c(rows);
    rmsnorm_forward_cpu(out_c.data(), rstd_c.data(), x_h.data(), rows, C, scale);
    double ms = timed([&] { if (in_place) copy_dev(x, x_saved, n); }, fwd);
    report(std::string("rmsnorm fwd ") + tag, rel_err_v(out_g, out_c), TOL_BF16, det, ms, 2.0 * n * sizeof(floatX) + rows * 4.0);
    report_also(std::string("  rstd"), rel_err_v(rstd_g, rstd_c), TOL_F32, det);

    // backward on the forward's (bf16) output and rstd: dinp += from random values, dinp = over NaN poison
    floatX* dout = rand_bf16(n, -1.0f, 1.0f, &dout_h);
    floatX* dinp = rand_bf16(n, -1.0f, 1.0f, &dinp_h);
    floatX* dinp0 = dev_alloc<floatX>(n);
    copy_dev(dinp0, dinp, n);
    for (GradWrite mode : {GRAD_ACCUMULATE, GRAD_OVERWRITE}) {
        const bool acc = mode == GRAD_ACCUMULATE;
        auto bwd = [&] { rmsnorm_backward_cuda(dinp, dout, out, rstd, rows, C, scale, mode, 0); };
        auto reset = [&] {
            if (acc) copy_dev(dinp, dinp0, n);
            else poison(dinp, n * sizeof(floatX));
        };
        det = run_twice(reset, bwd, {{dinp, n * sizeof(floatX)}});
        std::vector<float> dinp_g = download_bf16(dinp, n);
        std::vector<float> dinp_c = acc ? dinp_h : std::vector<float>(n, NAN);  // the CPU twin must not read it either
        rmsnorm_backward_cpu(dinp_c.data(), dout_h.data(), out_g.data(), rstd_g.data(), rows, C, scale, mode);
        double err = rel_err_v(dinp_g, dinp_c);
        ms = timed([] {}, bwd);
        report(std::string("rmsnorm bwd ") + (acc ? "+= " : "= ") + tag, err, TOL_BF16, det, ms,
               (acc ? 4.0 : 3.0) * n * sizeof(floatX) + rows * 4.0);
    }
    for (void* p : {(void*)x, (void*)x_saved, (void*)rstd, (void*)dout, (void*)dinp, (void*)dinp0}) cudaCheck(cudaFree(p));
    if (!in_place) cudaCheck(cudaFree(out));
}

// ---------------------------------------------------------------------------------------------------
// rotary.cuh

static void check_rotary(const char* tag, int B, int T, int heads, int D) {
    const size_t n = (size_t)B * T * heads * D;
    std::vector<float> cos_h((size_t)T * (D / 2)), sin_h((size_t)T * (D / 2));
    rotary_tables(cos_h.data(), sin_h.data(), T, D);
    float* cos_d = upload_f32(cos_h);
    float* sin_d = upload_f32(sin_h);
    for (int backward = 0; backward < 2; backward++) {
        std::vector<float> x_h;
        floatX* x = rand_bf16(n, -2.0f, 2.0f, &x_h);
        floatX* x0 = dev_alloc<floatX>(n);
        copy_dev(x0, x, n);
        auto op = [&] {
            if (backward) rotary_backward_cuda(x, cos_d, sin_d, B, T, heads, D, 0);
            else rotary_forward_cuda(x, cos_d, sin_d, B, T, heads, D, 0);
        };
        bool det = run_twice([&] { copy_dev(x, x0, n); }, op, {{x, n * sizeof(floatX)}});
        std::vector<float> x_g = download_bf16(x, n);
        if (backward) rotary_backward_cpu(x_h.data(), cos_h.data(), sin_h.data(), B, T, heads, D);
        else rotary_forward_cpu(x_h.data(), cos_h.data(), sin_h.data(), B, T, heads, D);
        double err = rel_err_v(x_g, x_h);
        double ms = timed([] {}, op);
        report(std::string(backward ? "rotary bwd " : "rotary fwd ") + tag, err, TOL_BF16, det, ms,
               2.0 * n * sizeof(floatX) + 2.0 * cos_h.size() * sizeof(float));
        cudaCheck(cudaFree(x));
        cudaCheck(cudaFree(x0));
    }
    cudaCheck(cudaFree(cos_d));
    cudaCheck(cudaFree(sin_d));
}

// rotary + QK-norm: forward in place (x poisoned between runs by a restore), backward into poisoned dinp,
// both against the CPU twin (rotary, then rmsnorm) on the bf16 values the kernels saw
static void check_rotary_rmsnorm(const char* tag, int B, int T, int heads, int D, float scale) {
    const size_t rows = (size_t)B * T * heads, n = rows * D;
    std::vector<float> cos_h((size_t)T * (D / 2)), sin_h((size_t)T * (D / 2));
    rotary_tables(cos_h.data(), sin_h.data(), T, D);
    float* cos_d = upload_f32(cos_h);
    float* sin_d = upload_f32(sin_h);
    std::vector<float> x_h, dout_h;
    floatX* x = rand_bf16(n, -2.0f, 2.0f, &x_h);
    floatX* x0 = dev_alloc<floatX>(n);
    copy_dev(x0, x, n);
    float* rstd = dev_alloc<float>(rows);
    auto fwd = [&] { rotary_rmsnorm_forward_cuda(x, (size_t)heads * D, rstd, cos_d, sin_d, B, T, heads, D, scale, 0); };
    auto reset = [&] {
        copy_dev(x, x0, n);
        poison(rstd, rows * sizeof(float));
    };
    bool det = run_twice(reset, fwd, {{x, n * sizeof(floatX)}, {rstd, rows * sizeof(float)}});
    std::vector<float> out_g = download_bf16(x, n), rstd_g = download_f32(rstd, rows);
    std::vector<float> rstd_c(rows);
    rotary_rmsnorm_forward_cpu(x_h.data(), (size_t)heads * D, rstd_c.data(), cos_h.data(), sin_h.data(), B, T, heads, D, scale);
    double ms = timed([&] { copy_dev(x, x0, n); }, fwd);
    const double table_bytes = 2.0 * cos_h.size() * sizeof(float);
    report(std::string("rotary+qknorm fwd ") + tag, rel_err_v(out_g, x_h), TOL_BF16, det, ms, 2.0 * n * sizeof(floatX) + rows * 4.0 + table_bytes);
    // the fused kernel normalises the rotated vector in fp32, as the CPU does; the unfused fallback reads
    // it back rounded to bf16, so its rstd carries bf16 rounding
    const bool fused = rotary_rmsnorm_fused_ok(D, (size_t)heads * D, x, x, x, cos_d, sin_d);
    report_also("  rstd", rel_err_v(rstd_g, rstd_c), fused ? TOL_F32 : TOL_BF16, det);

    // backward on the forward's (bf16) output and rstd
    floatX* dout = rand_bf16(n, -1.0f, 1.0f, &dout_h);
    floatX* dinp = dev_alloc<floatX>(n);
    auto bwd = [&] { rotary_rmsnorm_backward_cuda(dinp, dout, x, (size_t)heads * D, rstd, cos_d, sin_d, B, T, heads, D, scale, 0); };
    det = run_twice([&] { poison(dinp, n * sizeof(floatX)); }, bwd, {{dinp, n * sizeof(floatX)}});
    std::vector<float> dinp_g = download_bf16(dinp, n), dinp_c(n, NAN);  // NaN: the CPU twin must overwrite too
    rotary_rmsnorm_backward_cpu(dinp_c.data(), dout_h.data(), out_g.data(), (size_t)heads * D, rstd_g.data(), cos_h.data(), sin_h.data(), B, T, heads, D, scale);
    ms = timed([] {}, bwd);
    report(std::string("rotary+qknorm bwd ") + tag, rel_err_v(dinp_g, dinp_c), TOL_BF16, det, ms, 3.0 * n * sizeof(floatX) + rows * 4.0 + table_bytes);
    for (void* p : {(void*)x, (void*)x0, (void*)rstd, (void*)dout, (void*)dinp, (void*)cos_d, (void*)sin_d}) cudaCheck(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------------
// mlp.cuh. `offset` elements shift every pointer off 16-byte alignment (scalar path).

static void check_relu2(const char* tag, size_t n, int offset, bool alias) {
    std::vector<float> x_h, g_h;
    floatX* xb = rand_bf16(n + offset, -2.0f, 2.0f, nullptr);
    floatX* gb = rand_bf16(n + offset, -1.0f, 1.0f, nullptr);
    floatX* ob = dev_alloc<floatX>(n + offset);
    floatX *x = xb + offset, *g = gb + offset, *out = ob + offset;
    x_h = download_bf16(x, n);
    g_h = download_bf16(g, n);
    auto fwd = [&] { relu2_forward_cuda(out, x, n, 0); };
    bool det = run_twice([&] { poison(out, n * sizeof(floatX)); }, fwd, {{out, n * sizeof(floatX)}});
    std::vector<float> out_g = download_bf16(out, n), out_c(n);
    relu2_forward_cpu(out_c.data(), x_h.data(), n);
    double ms = timed([] {}, fwd);
    report(std::string("relu2 fwd ") + tag, rel_err_v(out_g, out_c), TOL_BF16, det, ms, 2.0 * n * sizeof(floatX));

    // backward: dinp = dout * 2 relu(x), into `out` or in place over a copy of dout (as the model calls it)
    floatX* gw = dev_alloc<floatX>(n);
    floatX* dinp = alias ? gw : out;
    auto reset = [&] {
        copy_dev(gw, g, n);
        if (!alias) poison(out, n * sizeof(floatX));
    };
    auto bwd = [&] { relu2_backward_cuda(dinp, alias ? gw : g, x, n, 0); };
    det = run_twice(reset, bwd, {{dinp, n * sizeof(floatX)}});
    std::vector<float> d_g = download_bf16(dinp, n), d_c(n);
    relu2_backward_cpu(d_c.data(), g_h.data(), x_h.data(), n);
    ms = timed(reset, bwd);
    report(std::string("relu2 bwd ") + tag + (alias ? " in place" : ""), rel_err_v(d_g, d_c), TOL_BF16, det, ms,
           3.0 * n * sizeof(floatX));
    for (void* p : {(void*)xb, (void*)gb, (void*)ob, (void*)gw}) cudaCheck(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------------
// residual.cuh

static void check_residual(const char* tag, size_t n, int offset) {
    const size_t bf = n * sizeof(floatX);
    float* scratch = dev_alloc<float>(LAMBDA_MIX_SCRATCH_FLOATS);
    std::vector<float> ab_h;
    float* ab = rand_f32(2, 0.8f, 1.2f, &ab_h);  // a, b near 1: repeated in-place timing runs stay in range
    std::vector<float> bufs[5];
    floatX* base[5];
    floatX* p[5];  // x, x0, dout, dx0, y
    for (int i = 0; i < 5; i++) {
        base[i] = rand_bf16(n + offset, -1.0f, 1.0f, nullptr);
        p[i] = base[i] + offset;
        bufs[i] = download_bf16(p[i], n);
    }
    floatX *x = p[0], *x0 = p[1], *dout = p[2], *dx0 = p[3], *y = p[4];
    floatX* out = dev_alloc<floatX>(n + offset) + offset;
    floatX* saved = dev_alloc<floatX>(3 * n);  // dout, dx0, y before the ops that change them
    copy_dev(saved, dout, n);
    copy_dev(saved + n, dx0, n);
    copy_dev(saved + 2 * n, y, n);

    // lambda_mix forward
    auto fwd = [&] { lambda_mix_forward_cuda(out, x, x0, ab, ab + 1, n, 0); };
    bool det = run_twice([&] { poison(out, bf); }, fwd, {{out, bf}});
    std::vector<float> out_g = download_bf16(out, n), out_c(n);
    lambda_mix_forward_cpu(out_c.data(), bufs[0].data(), bufs[1].data(), &ab_h[0], &ab_h[1], n);
    double ms = timed([] {}, fwd);
    report(std::string("lambda_mix fwd ") + tag, rel_err_v(out_g, out_c), TOL_BF16, det, ms, 3.0 * bf);

    // lambda_mix backward: dout, dx0 in place; da, db accumulate
    std::vector<float> dadb_h;
    float* dadb = rand_f32(2, -1.0f, 1.0f, &dadb_h);
    float* dadb0 = dev_alloc<float>(2);
    copy_dev(dadb0, dadb, 2);
    auto reset = [&] {
        copy_dev(dout, saved, n);
        copy_dev(dx0, saved + n, n);
        copy_dev(dadb, dadb0, 2);
    };
    auto bwd = [&] { lambda_mix_backward_cuda(dout, dx0, dadb, dadb + 1, x, x0, ab, ab + 1, n, scratch, 0); };
    det = run_twice(reset, bwd, {{dout, bf}, {dx0, bf}, {dadb, 2 * sizeof(float)}});
    std::vector<float> dout_g = download_bf16(dout, n), dx0_g = download_bf16(dx0, n), dadb_g = download_f32(dadb, 2);
    std::vector<float> dout_c = bufs[2], dx0_c = bufs[3], dadb_c = dadb_h;
    lambda_mix_backward_cpu(dout_c.data(), dx0_c.data(), &dadb_c[0], &dadb_c[1], bufs[0].data(), bufs[1].data(), &ab_h[0],
                            &ab_h[1], n);
    double err = worst(worst(rel_err_v(dout_g, dout_c), rel_err_v(dx0_g, dx0_c)),
                       worst(rel_err(&dadb_g[0], &dadb_c[0], 1), rel_err(&dadb_g[1], &dadb_c[1], 1)));
    ms = timed(reset, bwd);
    report(std::string("lambda_mix bwd ") + tag, err, TOL_BF16, det, ms, 6.0 * bf);

    // dot_accumulate: out[0] += -1 * x.x0
    auto dot = [&] { dot_accumulate_cuda(dadb, -1.0f, x, x0, n, scratch, 0); };
    det = run_twice([&] { copy_dev(dadb, dadb0, 2); }, dot, {{dadb, sizeof(float)}});
    float dot_g = download_f32(dadb, 1)[0];
    float dot_c = dadb_h[0];
    dot_accumulate_cpu(&dot_c, -1.0f, bufs[0].data(), bufs[1].data(), n);
    ms = timed([] {}, dot);
    report(std::string("dot_accumulate ") + tag, rel_err(&dot_g, &dot_c, 1), TOL_BF16, det, ms, 2.0 * bf);

    // add_inplace, scaled_add (y += factor * scalar[0] * x)
    for (int scaled = 0; scaled < 2; scaled++) {
        auto op = [&] {
            if (scaled) scaled_add_cuda(y, ab, -0.5f, x, n, 0);
            else add_inplace_cuda(y, x, n, 0);
        };
        det = run_twice([&] { copy_dev(y, saved + 2 * n, n); }, op, {{y, bf}});
        std::vector<float> y_g = download_bf16(y, n), y_c = bufs[4];
        if (scaled) scaled_add_cpu(y_c.data(), &ab_h[0], -0.5f, bufs[0].data(), n);
        else add_inplace_cpu(y_c.data(), bufs[0].data(), n);
        ms = timed([&] { copy_dev(y, saved + 2 * n, n); }, op);
        report(std::string(scaled ? "scaled_add " : "add_inplace ") + tag, rel_err_v(y_g, y_c), TOL_BF16, det, ms, 3.0 * bf);
    }
    for (int i = 0; i < 5; i++) cudaCheck(cudaFree(base[i]));
    for (void* q : {(void*)(out - offset), (void*)saved, (void*)scratch, (void*)ab, (void*)dadb, (void*)dadb0}) cudaCheck(cudaFree(q));
}

// ---------------------------------------------------------------------------------------------------
// embedding.cuh

// token ids with a heavy head (as text has): id = V u^3 puts ~3% of the positions on id 0 for V = 32768,
// plus a "BOS" (id 1) every 1024 positions; so some buckets take the chunked two-pass path.
static std::vector<int> skewed_ids(size_t N, int V, Rng* rng) {
    std::vector<int> idx(N);
    for (size_t n = 0; n < N; n++) {
        float u = rng_uniform(rng);
        idx[n] = std::min(V - 1, (int)((float)V * u * u * u));
        if (n % 1024 == 0) idx[n] = 1 % V;
    }
    return idx;
}

static void check_embedding(const char* tag, size_t N, int C, int V, Rng* rng) {
    const size_t n = N * C;
    std::vector<int> idx_h = skewed_ids(N, V, rng);
    int* idx = upload_int(idx_h);
    std::vector<float> table_h;
    float* table = rand_f32((size_t)V * C, -1.0f, 1.0f, &table_h);
    floatX* out = dev_alloc<floatX>(n);
    auto fwd = [&] { embedding_forward_cuda(out, idx, table, N, C, 0); };
    bool det = run_twice([&] { poison(out, n * sizeof(floatX)); }, fwd, {{out, n * sizeof(floatX)}});
    std::vector<float> out_g = download_bf16(out, n), out_c(n);
    embedding_forward_cpu(out_c.data(), idx_h.data(), table_h.data(), N, C);
    double ms = timed([] {}, fwd);
    report(std::string("embedding fwd ") + tag, rel_err_v(out_g, out_c), TOL_BF16, det, ms, n * (4.0 + 2.0) + N * 4.0);

    // backward: dtable (fp32, random start) += scatter of dout by the buckets
    std::vector<float> dout_h;
    floatX* dout = rand_bf16(n, -1.0f, 1.0f, &dout_h);
    float* dtable0 = table;  // reuse the table buffer as the starting gradient
    float* dtable = dev_alloc<float>((size_t)V * C);
    EmbeddingBuckets buckets;
    double t0 = wall_ms();
    embedding_buckets_build(&buckets, idx_h.data(), N, 0);
    cudaCheck(cudaDeviceSynchronize());
    double build_ms = wall_ms() - t0;
    printf("  buckets (N %zu): %d ids, %d chunks, %d heavy ids, %d scratch rows; build + upload %.2f ms (host)\n", N,
           buckets.num_ids, buckets.num_chunks, buckets.num_heavy, buckets.num_slots, build_ms);
    auto bwd = [&] { embedding_backward_cuda(dtable, dout, &buckets, C, 0); };
    auto reset = [&] {
        copy_dev(dtable, dtable0, (size_t)V * C);
        embedding_buckets_build(&buckets, idx_h.data(), N, 0);  // rebuilt: exercises the buffer reuse
    };
    det = run_twice(reset, bwd, {{dtable, (size_t)V * C * sizeof(float)}});
    std::vector<float> dt_g = download_f32(dtable, (size_t)V * C), dt_c = table_h;
    embedding_backward_cpu(dt_c.data(), idx_h.data(), dout_h.data(), N, C);
    ms = timed([] {}, bwd);
    report(std::string("embedding bwd ") + tag, rel_err_v(dt_g, dt_c), TOL_F32, det, ms,
           n * 2.0 + 2.0 * buckets.num_ids * C * 4.0 + N * 4.0);
    embedding_buckets_free(&buckets);
    for (void* p : {(void*)idx, (void*)table, (void*)out, (void*)dout, (void*)dtable}) cudaCheck(cudaFree(p));
}

static void check_smear(const char* tag, int B, int T, int C) {
    const size_t N = (size_t)B * T, n = N * C;
    std::vector<float> x_h, w_h, lam_h;
    floatX* x = rand_bf16(n, -1.0f, 1.0f, &x_h);
    float* w = rand_f32(SMEAR_CHANNELS, -0.5f, 0.5f, &w_h);
    float* lam = rand_f32(1, 0.3f, 0.9f, &lam_h);
    floatX* out = dev_alloc<floatX>(n);
    float* logit = dev_alloc<float>(N);
    auto fwd = [&] { smear_forward_cuda(out, logit, x, w, lam, B, T, C, 0); };
    auto reset = [&] {
        poison(out, n * sizeof(floatX));
        poison(logit, N * sizeof(float));
    };
    bool det = run_twice(reset, fwd, {{out, n * sizeof(floatX)}, {logit, N * sizeof(float)}});
    std::vector<float> out_g = download_bf16(out, n), logit_g = download_f32(logit, N), out_c(n), logit_c(N);
    smear_forward_cpu(out_c.data(), logit_c.data(), x_h.data(), w_h.data(), &lam_h[0], B, T, C);
    double ms = timed([] {}, fwd);
    report(std::string("smear fwd ") + tag, rel_err_v(out_g, out_c), TOL_BF16, det, ms, 2.0 * n * sizeof(floatX) + N * 4.0);
    report_also("  gate_logit", rel_err_v(logit_g, logit_c), TOL_F32, det);

    // backward with the forward's gate logits; dx, dw, dlambda accumulate
    std::vector<float> dout_h, dx_h, dwl_h;
    floatX* dout = rand_bf16(n, -1.0f, 1.0f, &dout_h);
    floatX* dx = rand_bf16(n, -1.0f, 1.0f, &dx_h);
    floatX* dx0 = dev_alloc<floatX>(n);
    copy_dev(dx0, dx, n);
    float* dwl = rand_f32(SMEAR_PARAMS, -1.0f, 1.0f, &dwl_h);  // dw (24), dlambda (1)
    float* dwl0 = dev_alloc<float>(SMEAR_PARAMS);
    copy_dev(dwl0, dwl, SMEAR_PARAMS);
    float* scratch = dev_alloc<float>(SMEAR_SCRATCH_FLOATS);
    auto bwd = [&] { smear_backward_cuda(dx, dwl, dwl + SMEAR_CHANNELS, dout, x, logit, w, lam, B, T, C, scratch, 0); };
    auto reset_b = [&] {
        copy_dev(dx, dx0, n);
        copy_dev(dwl, dwl0, SMEAR_PARAMS);
    };
    det = run_twice(reset_b, bwd, {{dx, n * sizeof(floatX)}, {dwl, SMEAR_PARAMS * sizeof(float)}});
    std::vector<float> dx_g = download_bf16(dx, n), dwl_g = download_f32(dwl, SMEAR_PARAMS), dx_c = dx_h, dwl_c = dwl_h;
    smear_backward_cpu(dx_c.data(), dwl_c.data(), &dwl_c[SMEAR_CHANNELS], dout_h.data(), x_h.data(), logit_g.data(), w_h.data(),
                       &lam_h[0], B, T, C);
    double err = worst(rel_err_v(dx_g, dx_c), worst(rel_err(dwl_g.data(), dwl_c.data(), SMEAR_CHANNELS),
                                             rel_err(&dwl_g[SMEAR_CHANNELS], &dwl_c[SMEAR_CHANNELS], 1)));
    ms = timed([] {}, bwd);
    report(std::string("smear bwd ") + tag, err, TOL_BF16, det, ms, 4.0 * n * sizeof(floatX) + N * 4.0);
    for (void* p : {(void*)x, (void*)w, (void*)lam, (void*)out, (void*)logit, (void*)dout, (void*)dx, (void*)dx0, (void*)dwl,
                    (void*)dwl0, (void*)scratch})
        cudaCheck(cudaFree(p));
}

static void check_value_embed(const char* tag, size_t N, int C, int Hkv, int D, int V, Rng* rng) {
    const int kvd = Hkv * D, HK = Hkv * VE_GATE_CHANNELS;
    const size_t nv = N * kvd, nh = N * C;
    std::vector<int> idx_h = skewed_ids(N, V, rng);
    int* idx = upload_int(idx_h);
    std::vector<float> table_h, h_h, wg_h, v_h;
    float* table = rand_f32((size_t)V * kvd, -1.0f, 1.0f, &table_h);
    floatX* h = rand_bf16(nh, -1.0f, 1.0f, &h_h);
    float* wg = rand_f32(HK, -0.5f, 0.5f, &wg_h);
    floatX* v = rand_bf16(nv, -1.0f, 1.0f, &v_h);
    floatX* v0 = dev_alloc<floatX>(nv);
    copy_dev(v0, v, nv);
    float* gate = dev_alloc<float>(N * Hkv);
    auto fwd = [&] { value_embed_forward_cuda(v, (size_t)Hkv * D, gate, h, wg, table, idx, N, C, Hkv, D, 0); };
    auto reset = [&] {
        copy_dev(v, v0, nv);
        poison(gate, N * Hkv * sizeof(float));
    };
    bool det = run_twice(reset, fwd, {{v, nv * sizeof(floatX)}, {gate, N * Hkv * sizeof(float)}});
    std::vector<float> v_g = download_bf16(v, nv), gate_g = download_f32(gate, N * Hkv);
    std::vector<float> v_c = v_h, gate_c(N * Hkv);
    value_embed_forward_cpu(v_c.data(), (size_t)Hkv * D, gate_c.data(), h_h.data(), wg_h.data(), table_h.data(), idx_h.data(), N, C, Hkv, D);
    double ms = timed([&] { copy_dev(v, v0, nv); }, fwd);
    report(std::string("value_embed fwd ") + tag, rel_err_v(v_g, v_c), TOL_BF16, det, ms, nv * (2.0 * 2 + 4.0) + N * Hkv * 4.0 + N * 4.0);
    report_also("  gate", rel_err_v(gate_g, gate_c), TOL_F32, det);

    // backward: dve overwritten (poisoned), dh (small random start: the update dominates) and dwg accumulate
    std::vector<float> dv_h, dh_h, dwg_h;
    floatX* dv = rand_bf16(nv, -1.0f, 1.0f, &dv_h);
    floatX* dve = dev_alloc<floatX>(nv);
    floatX* dh = rand_bf16(nh, -0.01f, 0.01f, &dh_h);
    floatX* dh0 = dev_alloc<floatX>(nh);
    copy_dev(dh0, dh, nh);
    float* dwg = rand_f32(HK, -1.0f, 1.0f, &dwg_h);
    float* dwg0 = dev_alloc<float>(HK);
    copy_dev(dwg0, dwg, HK);
    float* scratch = dev_alloc<float>(value_embed_scratch_floats(Hkv));
    auto bwd = [&] { value_embed_backward_cuda(dve, dh, dwg, dv, (size_t)Hkv * D, gate, h, wg, table, idx, N, C, Hkv, D, scratch, 0); };
    auto reset_b = [&] {
        poison(dve, nv * sizeof(floatX));
        copy_dev(dh, dh0, nh);
        copy_dev(dwg, dwg0, HK);
    };
    det = run_twice(reset_b, bwd, {{dve, nv * sizeof(floatX)}, {dh, nh * sizeof(floatX)}, {dwg, HK * sizeof(float)}});
    std::vector<float> dve_g = download_bf16(dve, nv), dh_g = download_bf16(dh, nh), dwg_g = download_f32(dwg, HK);
    std::vector<float> dve_c(nv), dh_c = dh_h, dwg_c = dwg_h;
    value_embed_backward_cpu(dve_c.data(), dh_c.data(), dwg_c.data(), dv_h.data(), (size_t)Hkv * D, gate_g.data(), h_h.data(), wg_h.data(),
                             table_h.data(), idx_h.data(), N, C, Hkv, D);
    // dh: the first 12 channels against the CPU; every other channel must be untouched (bit-identical)
    std::vector<float> dh12_g, dh12_c;
    bool untouched = true;
    for (size_t i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            if (c < VE_GATE_CHANNELS) {
                dh12_g.push_back(dh_g[i * C + c]);
                dh12_c.push_back(dh_c[i * C + c]);
            } else if (dh_g[i * C + c] != dh_h[i * C + c]) {
                untouched = false;
            }
        }
    double err = worst(worst(rel_err_v(dve_g, dve_c), rel_err_v(dh12_g, dh12_c)), rel_err_v(dwg_g, dwg_c));
    if (!untouched) err = NAN;
    ms = timed([] {}, bwd);
    report(std::string("value_embed bwd ") + tag, err, TOL_BF16, det, ms, nv * (2.0 + 4.0 + 2.0) + N * Hkv * 4.0 + N * 4.0);
    for (void* p : {(void*)idx, (void*)table, (void*)h, (void*)wg, (void*)v, (void*)v0, (void*)gate, (void*)dv, (void*)dve,
                    (void*)dh, (void*)dh0, (void*)dwg, (void*)dwg0, (void*)scratch})
        cudaCheck(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------------

int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) fail("flag %s expects a value (flags: --reps N, --time 0|1, --tol-scale X)", argv[i]);
        if (!strcmp(argv[i], "--reps")) g_reps = std::max(1, parse_int32(argv[i], argv[i + 1]));
        else if (!strcmp(argv[i], "--time")) g_time = parse_bool(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--tol-scale")) g_tol_scale = parse_double(argv[i], argv[i + 1]);
        else fail("unknown flag %s (flags: --reps N, --time 0|1, --tol-scale X)", argv[i]);
        i++;
    }
    check_init();
    Rng rng = {42};
    const size_t tokens = 16384;

    // QK-norm: rows = tokens x heads, C = head_dim; residual stream: rows = tokens, C = model dim
    check_rmsnorm("qk 393216x64 x1.2", tokens * 24, 64, 1.2f, true);
    check_rmsnorm("qk 196608x128 x1.2", tokens * 12, 128, 1.2f, true);
    check_rmsnorm("16384x768", tokens, 768, 1.0f, false);
    check_rmsnorm("16384x768 in place", tokens, 768, 1.0f, true);
    check_rmsnorm("16384x1536", tokens, 1536, 1.0f, false);
    check_rmsnorm("1000x100 scalar", 1000, 100, 1.0f, false);
    check_rmsnorm("300x2504 scalar", 300, 2504, 1.0f, false);

    check_rotary("8x2048x12x64", 8, 2048, 12, 64);
    check_rotary("8x2048x6x128", 8, 2048, 6, 128);
    check_rotary("3x37x5x6 scalar", 3, 37, 5, 6);
    check_rotary_rmsnorm("8x2048x12x64 x1.2", 8, 2048, 12, 64, 1.2f);
    check_rotary_rmsnorm("8x2048x6x128 x1.2", 8, 2048, 6, 128, 1.2f);
    check_rotary_rmsnorm("3x37x5x32 unfused", 3, 37, 5, 32, 1.2f);

    check_relu2("16384x3072", tokens * 3072, 0, false);
    check_relu2("16384x3072", tokens * 3072, 0, true);
    check_relu2("1001 tail", 1001, 0, false);
    check_relu2("999 unaligned", 999, 1, true);

    check_residual("16384x768", tokens * 768, 0);
    check_residual("1001 tail", 1001, 0);
    check_residual("4099 unaligned", 4099, 3);

    check_embedding("16384x768", tokens, 768, 32768, &rng);
    check_embedding("65536x512", 4 * tokens, 512, 32768, &rng);
    check_embedding("500x100 scalar", 500, 100, 97, &rng);

    check_smear("8x2048x768", 8, 2048, 768);
    check_smear("8x2048x1536", 8, 2048, 1536);
    check_smear("3x17x100 scalar", 3, 17, 100);

    check_value_embed("16384 6x128", tokens, 768, 6, 128, 32768, &rng);
    check_value_embed("16384 12x64", tokens, 768, 12, 64, 32768, &rng);
    check_value_embed("100 3x24", 100, 40, 3, 24, 50, &rng);
    check_value_embed("100 5x20 scalar", 100, 40, 5, 20, 50, &rng);

    return print_table();
}
