// matmul_check.cu: the cuBLASLt matmuls of matmul.cuh against their CPU twins.
// Build and run (from the repository root, on a GPU machine):
//   nvcc -arch=sm_90 -O3 -std=c++17 -Xcompiler -Wall,-Wextra,-fopenmp,-march=native,-Wno-unused-function -Werror all-warnings -I. dev/cuda/matmul_check.cu -o /tmp/matmul_check -lcublasLt -lgomp && /tmp/matmul_check
// (-Wno-unused-function: common.h's static helpers are unused here, as in the Makefile's LIBFLAGS; -march=native:
// the CPU twins run at speed, so build on the machine that runs it.)
//
// For every shape: random bf16 inputs (fresh per check, never zeros), the forward output poisoned with
// NaN first, the CPU twin run in fp32 on the same bf16 values (sampled rows: the CPU work stays small for
// the lm_head shapes), relative L2 error, determinism (two runs from the same state, identical bits),
// and the median time over repeats with the L2 flushed before each, as TFLOP/s. Then the strided-batched
// GEMM of Muon (every transpose combination, alpha/beta, C != D) and its timing on Muon's group shapes.
// Prints the cuBLASLt plans chosen (algorithm, split-K, reduction scheme), then a table. Exit 1 on failure.
#include "llmc/matmul.cuh"
#include "dev/cuda/check_util.cuh"
#include <functional>

// ---------------------------------------------------------------------------------------------------
// Linear layer forward/backward

struct Shape {
    const char* name;
    int M, K, N;
};

// rows checked on the CPU: all if few, else two blocks of 64 (a random one and the last one)
static std::vector<int> sample_blocks(int n, int block, Rng* rng) {
    std::vector<int> starts;
    if (n <= 2 * block) {
        starts.push_back(0);
    } else {
        int r = (int)(rng_uniform(rng) * (float)(n - 2 * block));
        starts.push_back(r);
        starts.push_back(n - block);
    }
    return starts;
}

static void check_linear(const Shape& s, int repeats, Rng* rng) {
    const int M = s.M, K = s.K, N = s.N;
    const int B = 64;
    floatX* inp = dev_alloc<floatX>((size_t)M * K);
    floatX* weight = dev_alloc<floatX>((size_t)N * K);
    floatX* out = dev_alloc<floatX>((size_t)M * N);
    floatX* dout = dev_alloc<floatX>((size_t)M * N);
    floatX* dinp = dev_alloc<floatX>((size_t)M * K);
    floatX* dinp0 = dev_alloc<floatX>((size_t)M * K);
    float* dweight = dev_alloc<float>((size_t)N * K);
    float* dweight0 = dev_alloc<float>((size_t)N * K);
    fill_random(inp, (size_t)M * K, -1.0f, 1.0f);
    fill_random(weight, (size_t)N * K, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    fill_random(dout, (size_t)M * N, -1.0f, 1.0f);
    fill_random(dinp0, (size_t)M * K, -1.0f, 1.0f);   // gradients accumulate: start from random values
    fill_random(dweight0, (size_t)N * K, -1.0f, 1.0f);
    const std::vector<float> h_inp = download_bf16(inp, (size_t)M * K), h_weight = download_bf16(weight, (size_t)N * K);
    const double flops = 2.0 * M * N * K;
    char name[96];

    // forward: out poisoned with NaN (0xFFFF), every element must be written
    std::vector<unsigned char> bits[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemset(out, 0xff, (size_t)M * N * sizeof(floatX)));
        matmul_forward_cuda(out, inp, weight, M, K, N, 0);
        cudaCheck(cudaDeviceSynchronize());
        bits[run] = download_bytes(out, (size_t)M * N);
    }
    bool det = bits[0] == bits[1];
    std::vector<float> h_out = download_bf16(out, (size_t)M * N);
    double err = all_finite(h_out) ? 0.0 : NAN;
    for (int r0 : sample_blocks(M, B, rng)) {
        int rows = std::min(B, M - r0);
        std::vector<float> ref((size_t)rows * N);
        matmul_forward_cpu(ref.data(), h_inp.data() + (size_t)r0 * K, h_weight.data(), rows, K, N);
        err = std::max(err, rel_err(h_out.data() + (size_t)r0 * N, ref.data(), ref.size()));
    }
    double ms = time_ms([&] { matmul_forward_cuda(out, inp, weight, M, K, N, 0); }, repeats);
    snprintf(name, sizeof name, "%s fwd %dx%dx%d", s.name, M, K, N);
    record(name, err, 1e-2, det, ms, flops / ms * 1e-9, "TFLOP/s");

    // forward with the residual add in the epilogue: out (poisoned) = dout (as a random residual) + inp @ weight^T
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemset(out, 0xff, (size_t)M * N * sizeof(floatX)));
        matmul_forward_add_cuda(out, inp, weight, dout, M, K, N, 0);
        cudaCheck(cudaDeviceSynchronize());
        bits[run] = download_bytes(out, (size_t)M * N);
    }
    det = bits[0] == bits[1];
    h_out = download_bf16(out, (size_t)M * N);
    err = all_finite(h_out) ? 0.0 : NAN;
    for (int r0 : sample_blocks(M, B, rng)) {
        int rows = std::min(B, M - r0);
        std::vector<float> ref((size_t)rows * N);
        std::vector<float> h_residual = download_bf16(dout + (size_t)r0 * N, (size_t)rows * N);
        matmul_forward_add_cpu(ref.data(), h_inp.data() + (size_t)r0 * K, h_weight.data(), h_residual.data(), rows, K, N);
        err = std::max(err, rel_err(h_out.data() + (size_t)r0 * N, ref.data(), ref.size()));
    }
    ms = time_ms([&] { matmul_forward_add_cuda(out, inp, weight, dout, M, K, N, 0); }, repeats);
    snprintf(name, sizeof name, "%s fwd+res %dx%dx%d", s.name, M, K, N);
    record(name, err, 1e-2, det, ms, flops / ms * 1e-9, "TFLOP/s");
    h_out.clear();
    h_out.shrink_to_fit();

    // backward, dinp (M, K) += dout @ weight from random values, and = dout @ weight over NaN poison
    const std::vector<float> h_dinp0 = download_bf16(dinp0, (size_t)M * K);
    for (GradWrite mode : {GRAD_ACCUMULATE, GRAD_OVERWRITE}) {
        const bool acc = mode == GRAD_ACCUMULATE;
        for (int run = 0; run < 2; run++) {
            if (acc) cudaCheck(cudaMemcpy(dinp, dinp0, (size_t)M * K * sizeof(floatX), cudaMemcpyDeviceToDevice));
            else cudaCheck(cudaMemset(dinp, 0xff, (size_t)M * K * sizeof(floatX)));
            matmul_backward_cuda(dinp, nullptr, dout, inp, weight, M, K, N, mode, 0);
            cudaCheck(cudaDeviceSynchronize());
            bits[run] = download_bytes(dinp, (size_t)M * K);
        }
        det = bits[0] == bits[1];
        std::vector<float> h_dinp = download_bf16(dinp, (size_t)M * K);
        err = all_finite(h_dinp) ? 0.0 : NAN;
        for (int r0 : sample_blocks(M, B, rng)) {
            int rows = std::min(B, M - r0);
            std::vector<float> ref((size_t)rows * K, 0.0f);
            if (acc) ref.assign(h_dinp0.begin() + (size_t)r0 * K, h_dinp0.begin() + (size_t)(r0 + rows) * K);
            std::vector<float> h_dout_rows = download_bf16(dout + (size_t)r0 * N, (size_t)rows * N);
            matmul_backward_cpu(ref.data(), nullptr, h_dout_rows.data(), nullptr, h_weight.data(), rows, K, N, GRAD_ACCUMULATE);
            err = std::max(err, rel_err(h_dinp.data() + (size_t)r0 * K, ref.data(), ref.size()));
        }
        ms = time_ms([&] { matmul_backward_cuda(dinp, nullptr, dout, inp, weight, M, K, N, mode, 0); }, repeats);
        snprintf(name, sizeof name, "%s dinp%s %dx%dx%d", s.name, acc ? "+=" : "=", M, K, N);
        record(name, err, 1e-2, det, ms, flops / ms * 1e-9, "TFLOP/s");
    }

    // backward, dweight (N, K) fp32 += dout^T @ inp; the CPU checks row blocks of dweight (column blocks of dout)
    const std::vector<float> h_dweight0 = download_f32(dweight0, (size_t)N * K);
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(dweight, dweight0, (size_t)N * K * sizeof(float), cudaMemcpyDeviceToDevice));
        matmul_backward_cuda(nullptr, dweight, dout, inp, weight, M, K, N, GRAD_ACCUMULATE, 0);
        cudaCheck(cudaDeviceSynchronize());
        bits[run] = download_bytes(dweight, (size_t)N * K);
    }
    det = bits[0] == bits[1];
    std::vector<float> h_dweight = download_f32(dweight, (size_t)N * K);
    err = all_finite(h_dweight) ? 0.0 : NAN;
    for (int n0 : sample_blocks(N, B, rng)) {
        int cols = std::min(B, N - n0);
        std::vector<floatX> block((size_t)M * cols);
        cudaCheck(cudaMemcpy2D(block.data(), cols * sizeof(floatX), dout + n0, (size_t)N * sizeof(floatX), cols * sizeof(floatX),
                               M, cudaMemcpyDeviceToHost));
        std::vector<float> h_dout_cols((size_t)M * cols);
        for (size_t i = 0; i < h_dout_cols.size(); i++) h_dout_cols[i] = __bfloat162float(block[i]);
        std::vector<float> ref(h_dweight0.begin() + (size_t)n0 * K, h_dweight0.begin() + (size_t)(n0 + cols) * K);
        matmul_backward_cpu(nullptr, ref.data(), h_dout_cols.data(), h_inp.data(), nullptr, M, K, cols, GRAD_ACCUMULATE);
        err = std::max(err, rel_err(h_dweight.data() + (size_t)n0 * K, ref.data(), ref.size()));
    }
    ms = time_ms([&] { matmul_backward_cuda(nullptr, dweight, dout, inp, weight, M, K, N, GRAD_ACCUMULATE, 0); }, repeats);
    snprintf(name, sizeof name, "%s dweight %dx%dx%d", s.name, M, K, N);
    record(name, err, 1e-3, det, ms, flops / ms * 1e-9, "TFLOP/s");  // fp32 output: only the fp32 accumulation differs

    for (void* p : {(void*)inp, (void*)weight, (void*)out, (void*)dout, (void*)dinp, (void*)dinp0, (void*)dweight, (void*)dweight0})
        cudaCheck(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------------
// strided-batched bf16 GEMM (Muon)

// D[i] = alpha op(A[i]) @ op(B[i]) + beta C[i] on random data, against gemm_cpu per batch element.
// in_place: C == D. Strides: padded to 128 elements (256 bytes) as MuonScratch does, or (odd) by 8, 16, 24
// elements, so that the matrices of a batch are only 16-byte aligned. Checks the first and the last
// element of the batch; times the call when repeats > 0.
static void check_batched(const char* label, int M, int N, int K, bool transA, bool transB, float alpha, float beta, int batch,
                          bool in_place, bool odd, int repeats) {
    auto pad = [&](long long n, int extra) { return odd ? n + extra : (n + 127) / 128 * 128; };
    const long long sA = pad((long long)M * K, 8), sB = pad((long long)K * N, 16), sC = pad((long long)M * N, 24);
    floatX* A = dev_alloc<floatX>((size_t)batch * sA);
    floatX* B = dev_alloc<floatX>((size_t)batch * sB);
    floatX* C = dev_alloc<floatX>((size_t)batch * sC);
    floatX* D = in_place ? C : dev_alloc<floatX>((size_t)batch * sC);
    floatX* C0 = dev_alloc<floatX>((size_t)batch * sC);
    fill_random(A, (size_t)batch * sA, -1.0f, 1.0f);
    fill_random(B, (size_t)batch * sB, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    fill_random(C0, (size_t)batch * sC, -1.0f, 1.0f);
    std::vector<unsigned char> bits[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(C, C0, (size_t)batch * sC * sizeof(floatX), cudaMemcpyDeviceToDevice));
        if (!in_place) cudaCheck(cudaMemset(D, 0xff, (size_t)batch * sC * sizeof(floatX)));
        gemm_strided_batched_bf16_cuda(D, C, A, B, M, N, K, transA, transB, alpha, beta, batch, sA, sB, sC, 0);
        cudaCheck(cudaDeviceSynchronize());
        bits[run] = download_bytes(D, (size_t)batch * sC);
    }
    bool det = bits[0] == bits[1];
    double err = 0.0;
    for (int b : {0, batch - 1}) {
        std::vector<float> hA = download_bf16(A + b * sA, (size_t)M * K), hB = download_bf16(B + b * sB, (size_t)K * N);
        std::vector<float> hC = download_bf16(C0 + b * sC, (size_t)M * N), hD = download_bf16(D + b * sC, (size_t)M * N);
        std::vector<float> ref((size_t)M * N);
        gemm_cpu(ref.data(), hA.data(), hB.data(), M, N, K, transA ? M : K, transB ? K : N, N, transA, transB, false);
        for (size_t i = 0; i < ref.size(); i++) ref[i] = alpha * ref[i] + beta * hC[i];
        err = std::max(err, all_finite(hD) ? rel_err(hD.data(), ref.data(), ref.size()) : NAN);
    }
    double ms = 0.0, rate = 0.0;
    if (repeats > 0) {
        ms = time_ms([&] { gemm_strided_batched_bf16_cuda(D, C, A, B, M, N, K, transA, transB, alpha, beta, batch, sA, sB, sC, 0); },
                     repeats);
        rate = 2.0 * M * N * K * batch / ms * 1e-9;
    }
    char name[96];
    snprintf(name, sizeof name, "batched %s %dx%dx%d%s%s x%d", label, M, N, K, transA ? " tA" : "", transB ? " tB" : "", batch);
    record(name, err, 1e-2, det, ms, rate, "TFLOP/s");
    cudaCheck(cudaFree(A));
    cudaCheck(cudaFree(B));
    cudaCheck(cudaFree(C));
    cudaCheck(cudaFree(C0));
    if (!in_place) cudaCheck(cudaFree(D));
}

// Every candidate the cuBLASLt heuristic offers for one GEMM of a model-size Linear layer (M tokens, K in,
// N out), timed: the forward, the input gradient and the fp32 weight gradient (accumulated), each with
// every candidate our rules accept (deterministic, within the workspace), the chosen one (the heuristic's
// first) marked. Shows whether keeping the heuristic's pick leaves time on the table.
static void time_candidates(const char* label, int M, int K, int N, int repeats) {
    floatX* inp = dev_alloc<floatX>((size_t)M * K);
    floatX* weight = dev_alloc<floatX>((size_t)N * K);
    floatX* out = dev_alloc<floatX>((size_t)M * N);
    float* dweight = dev_alloc<float>((size_t)N * K);
    fill_random(inp, (size_t)M * K, -1.0f, 1.0f);
    fill_random(weight, (size_t)N * K, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    fill_random(out, (size_t)M * N, -1.0f, 1.0f);
    cudaCheck(cudaMemset(dweight, 0, (size_t)N * K * sizeof(float)));
    const double flops = 2.0 * M * N * K;
    struct Op {
        const char* name;
        std::function<void()> call;
    };
    const Op ops[] = {{"fwd", [&] { matmul_forward_cuda(out, inp, weight, M, K, N, 0); }},
                      {"dinp", [&] { matmul_backward_cuda(inp, nullptr, out, inp, weight, M, K, N, GRAD_OVERWRITE, 0); }},
                      {"dweight", [&] { matmul_backward_cuda(nullptr, dweight, out, inp, weight, M, K, N, GRAD_ACCUMULATE, 0); }}};
    for (const Op& op : ops) {
        op.call();  // makes the plan
        MatmulPlan* plan = g_matmul.last;
        const std::vector<cublasLtMatmulHeuristicResult_t> usable = plan->usable;
        for (size_t i = 0; i < usable.size(); i++) {
            plan->algo = usable[i].algo;
            plan->workspace = usable[i].workspaceSize;
            const double ms = time_ms(op.call, repeats);
            int32_t id = 0, tile = 0, stages = 0, splitk = 1;
            size_t written = 0;
            cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&usable[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written));
            cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&usable[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written));
            cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&usable[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written));
            cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&usable[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written));
            printf("candidate %-12s %-8s %dx%dx%d  #%zu algo %3d tile %3d stages %3d split-K %2d  %8.3f ms %7.1f TFLOP/s%s\n", label, op.name, M,
                   K, N, i, id, tile, stages, splitk, ms, flops / ms * 1e-9, i == 0 ? "  (chosen)" : "");
        }
        plan->algo = usable[0].algo;
        plan->workspace = usable[0].workspaceSize;
    }
    for (void* p : {(void*)inp, (void*)weight, (void*)out, (void*)dweight}) cudaCheck(cudaFree(p));
}

// Tuning (matmul_choose): a new plan times its candidates and keeps the fastest without touching the call's
// result -- the in-place weight gradient (beta = 1) is timed on a copy, so its D is D0 + dout^T inp once,
// not once per timing run -- and choices go through text (a checkpoint) and ranks (take_chosen) intact.
// The shapes are used nowhere else here, so the plans are new. "rule": the chosen candidate is the fastest,
// or the heuristic's first with none at least MATMUL_TUNE_MARGIN faster.
static void check_tuning() {
    const int M = 300, K = 72, N = 136;
    floatX* inp = dev_alloc<floatX>((size_t)M * K);
    floatX* weight = dev_alloc<floatX>((size_t)N * K);
    floatX* dout = dev_alloc<floatX>((size_t)M * N);
    floatX* out = dev_alloc<floatX>((size_t)M * N);
    float* dweight = dev_alloc<float>((size_t)N * K);
    fill_random(inp, (size_t)M * K, -1.0f, 1.0f);
    fill_random(weight, (size_t)N * K, -0.1f, 0.1f);
    fill_random(dout, (size_t)M * N, -1.0f, 1.0f);
    fill_random(dweight, (size_t)N * K, -1.0f, 1.0f);
    const std::vector<float> h_inp = download_bf16(inp, (size_t)M * K), h_weight = download_bf16(weight, (size_t)N * K);
    const std::vector<float> h_dout = download_bf16(dout, (size_t)M * N), h_dweight0 = download_f32(dweight, (size_t)N * K);
    // the CPU twins: dweight0 + dout^T inp, and dout (as the residual) + inp weight^T
    std::vector<float> ref_dweight = h_dweight0, ref_out((size_t)M * N);
    matmul_backward_cpu(nullptr, ref_dweight.data(), h_dout.data(), h_inp.data(), h_weight.data(), M, K, N, GRAD_OVERWRITE);
    matmul_forward_add_cpu(ref_out.data(), h_inp.data(), h_weight.data(), h_dout.data(), M, K, N);
    auto rule_holds = [](const MatmulPlan& p) {
        if (p.usable.size() < 2) return p.how == MatmulPlan::HEURISTIC;  // nothing to choose between
        if (p.how != MatmulPlan::TUNED || p.tune_ms.size() != p.usable.size()) return false;
        for (float t : p.tune_ms)
            if (t >= 0.0f && t < p.tune_ms[p.chosen] && !(p.chosen == 0 && t >= (1.0f - MATMUL_TUNE_MARGIN) * p.tune_ms[0])) return false;
        return true;
    };

    g_matmul.tune = true;
    matmul_backward_cuda(nullptr, dweight, dout, inp, weight, M, K, N, GRAD_ACCUMULATE, 0);
    MatmulPlan* dweight_plan = g_matmul.last;
    cudaCheck(cudaMemset(out, 0xff, (size_t)M * N * sizeof(floatX)));
    matmul_forward_add_cuda(out, inp, weight, dout, M, K, N, 0);  // out of place: C = dout, D = out (poisoned)
    MatmulPlan* add_plan = g_matmul.last;
    g_matmul.tune = false;
    cudaCheck(cudaDeviceSynchronize());
    printf("tuned: %zu and %zu candidates\n", dweight_plan->usable.size(), add_plan->usable.size());
    record("tune: in-place dweight, D0 + one product", rel_err(download_f32(dweight, (size_t)N * K).data(), ref_dweight.data(), ref_dweight.size()),
           1e-2, rule_holds(*dweight_plan), 0, 0, "");
    record("tune: out-of-place forward + residual", rel_err(download_bf16(out, (size_t)M * N).data(), ref_out.data(), ref_out.size()), 1e-2,
           rule_holds(*add_plan), 0, 0, "");

    if (dweight_plan->usable.size() < 2) {  // the emulator offers 3; a GPU's heuristic may offer one for this shape
        printf("tune: the weight gradient has one candidate: its recorded choice is not checked\n");
        for (void* p : {(void*)inp, (void*)weight, (void*)dout, (void*)out, (void*)dweight}) cudaCheck(cudaFree(p));
        return;
    }
    // a checkpoint's text, with the weight gradient's choice changed to the last candidate, taken by new plans
    const int last = (int)dweight_plan->usable.size() - 1;
    std::string text = matmul_cuda_choices();
    const size_t eq = text.find('=');
    text = text.substr(0, eq + 1) + std::to_string(last) + text.substr(text.find(' ', eq) == std::string::npos ? text.size() : text.find(' ', eq));
    g_matmul.plans.clear();  // forget the plans (their descriptors are not freed: a harness can leak them)
    g_matmul.chosen_keys.clear();
    matmul_cuda_restore_choices(text, "check_tuning");
    fill_random(dweight, (size_t)N * K, -1.0f, 1.0f);
    std::vector<float> ref2 = download_f32(dweight, (size_t)N * K);
    matmul_backward_cpu(nullptr, ref2.data(), h_dout.data(), h_inp.data(), h_weight.data(), M, K, N, GRAD_OVERWRITE);
    matmul_backward_cuda(nullptr, dweight, dout, inp, weight, M, K, N, GRAD_ACCUMULATE, 0);
    const bool recorded = g_matmul.last->how == MatmulPlan::RECORDED && g_matmul.last->chosen == last;
    matmul_forward_add_cuda(out, inp, weight, dout, M, K, N, 0);
    const bool round_trip = matmul_cuda_choices() == text && g_matmul.last->how == MatmulPlan::RECORDED;
    cudaCheck(cudaDeviceSynchronize());
    record("tune: recorded choices taken, text intact", rel_err(download_f32(dweight, (size_t)N * K).data(), ref2.data(), ref2.size()), 1e-2,
           recorded && round_trip, 0, 0, "");
    // rank 0's choices (all candidate 0) taken by this "rank"
    matmul_cuda_take_chosen(std::vector<int64_t>(g_matmul.chosen_keys.size(), 0));
    bool taken = true;
    for (const MatmulKey& key : g_matmul.chosen_keys) taken = taken && g_matmul.plans.at(key).chosen == 0;
    record("tune: rank 0's choices taken", 0.0, 0.0, taken, 0, 0, "");
    for (void* p : {(void*)inp, (void*)weight, (void*)dout, (void*)out, (void*)dweight}) cudaCheck(cudaFree(p));
}

// --fallback: the GEMMs where cuBLASLt offers no deterministic algorithm run matmul_fallback_kernel. Run where the
// heuristic offers none (the emulator's EMU_LT_NO_CANDIDATES=1), it checks that kernel against the CPU twins on
// the small shapes it is for (odd sizes, one row, ve_gate, every transpose, alpha/beta, in place, unaligned
// batches, Muon's ve_gate group) and that every plan took it.
static int check_fallback(Rng* rng) {
    const Shape shapes[] = {{"odd", 1000, 37, 53}, {"odd", 257, 129, 65}, {"one row", 1, 64, 8}, {"ve_gate", 2048, 12, 6}};
    for (const Shape& s : shapes) check_linear(s, 1, rng);
    for (int t = 0; t < 4; t++) check_batched("combo", 96, 80, 112, t & 1, t & 2, 0.7f, -0.3f, 3, false, true, 0);
    check_batched("in-place", 37, 53, 29, false, true, 1.5f, 0.5f, 2, true, true, 0);
    check_batched("ve_gate gram", 6, 6, 12, false, true, 1.0f, 0.0f, 6, false, false, 0);
    check_batched("ve_gate update", 6, 12, 6, false, false, 1.0f, 8.16f, 6, false, false, 0);
    int fallback = 0;
    for (const auto& kv : g_matmul.plans) fallback += kv.second.fallback;
    char name[96];
    snprintf(name, sizeof name, "%d of %zu plans on the fallback kernel", fallback, g_matmul.plans.size());
    record(name, fallback == (int)g_matmul.plans.size() && fallback > 0 ? 0.0 : 1.0, 0.0, true, 0.0, 0.0, "");
    matmul_cuda_print_plans(stdout);
    return print_table();
}

int main(int argc, char** argv) {
    int repeats = 20;
    const bool fallback = argc > 1 && std::string(argv[argc - 1]) == "--fallback";
    if (argc > 1 + fallback) repeats = parse_int32("repeats", argv[1]);
    check_init();
    matmul_cuda_init(0);
    Rng rng = {42};
    if (fallback) return check_fallback(&rng);

    // (name, M = tokens, K = in, N = out): d12 / d24 (head_dim 64), nanochat's head_dim 128 d24, odd shapes;
    // qkv: the one GEMM of q | k | v, attn: the attention output projection c_proj
    const Shape shapes[] = {
        {"d12 qkv", 16384, 768, 2304},    {"d12 attn", 16384, 768, 768},    {"d12 fc", 16384, 768, 3072},
        {"d12 proj", 16384, 3072, 768},   {"d12 lm_head", 16384, 768, 32768}, {"d24 qkv", 16384, 1024, 3072},
        {"d24 attn", 16384, 1024, 1024}, {"d24 fc", 16384, 1024, 4096},
        {"d24 proj", 16384, 4096, 1024},  {"d24 lm_head", 16384, 1024, 32768}, {"hd128 attn", 16384, 1536, 1536},
        {"hd128 fc", 16384, 1536, 6144},  {"hd128 proj", 16384, 6144, 1536}, {"odd", 1000, 37, 53},
        {"odd", 257, 129, 65},            {"one row", 1, 64, 8},            {"ve_gate", 16384, 12, 6},
    };
    for (const Shape& s : shapes) check_linear(s, repeats, &rng);

    // every transpose combination, alpha/beta, out of place and in place, odd sizes and unpacked strides
    for (int t = 0; t < 4; t++) check_batched("combo", 96, 80, 112, t & 1, t & 2, 0.7f, -0.3f, 3, false, true, 0);
    check_batched("in-place", 37, 53, 29, false, true, 1.5f, 0.5f, 2, true, true, 0);
    // Muon's Polar Express products on the group shapes (X (r, c), k = min(r, c)): Gram, A^2, update
    struct MuonShape {
        const char* name;
        int rows, cols, count;
    };
    const MuonShape muon[] = {{"d12 sq", 768, 768, 48},     {"d12 wide", 768, 3072, 12}, {"d12 tall", 3072, 768, 12},
                              {"d24 sq", 1536, 1536, 96},   {"d24 wide", 1536, 6144, 24}, {"d24 tall", 6144, 1536, 24},
                              {"ve_gate", 6, 12, 6}};
    for (const MuonShape& m : muon) {
        const bool tall = m.rows > m.cols;
        const int k = std::min(m.rows, m.cols), n = std::max(m.rows, m.cols);
        char label[64];
        snprintf(label, sizeof label, "%s gram", m.name);  // X X^T, or X^T X (tall)
        check_batched(label, k, k, n, tall, !tall, 1.0f, 0.0f, m.count, false, false, repeats);
        snprintf(label, sizeof label, "%s A^2", m.name);   // c A A + b A
        check_batched(label, k, k, k, false, false, 15.88f, -22.48f, m.count, false, false, repeats);
        snprintf(label, sizeof label, "%s update", m.name);  // B X + a X, or X B + a X (tall)
        if (tall) check_batched(label, n, k, k, false, false, 1.0f, 8.16f, m.count, false, false, repeats);
        else check_batched(label, k, n, k, false, false, 1.0f, 8.16f, m.count, false, false, repeats);
    }

    check_tuning();

    if (repeats > 0) {  // the heuristic's candidates at d24's real shapes: 32 rows x 2048 tokens per micro-step
        printf("\ncuBLASLt candidates at the model's shapes, %d repeats each:\n", repeats);
        time_candidates("d24 qkv", 65536, 1024, 3072, repeats);
        time_candidates("d24 attn", 65536, 1024, 1024, repeats);
        time_candidates("d24 fc", 65536, 1024, 4096, repeats);
        time_candidates("d24 proj", 65536, 4096, 1024, repeats);
        time_candidates("d24 lm_head", 65536, 1024, 32768, repeats);
    }
    printf("\ncuBLASLt plans (reduction: none = no split-K, fp32-ws = split-K with fp32 partials in our workspace):\n");
    matmul_cuda_print_plans(stdout);
    return print_table();
}
