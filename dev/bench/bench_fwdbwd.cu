/*
bench_fwdbwd.cu: tokens/s of one training step on random tokens, for either backend (the same source
built with g++ or nvcc). The CPU build feeds dev/bench/cpu_vs_torch.sh (PyTorch: bench_torch.py with the
same model); the CUDA build feeds dev/gpu_check.sh.
  make dev/bench/bench_fwdbwd        (CPU)      make dev/bench/bench_fwdbwd_cuda    (CUDA)
usage: bench_fwdbwd LAYERS DIM HEADS KV_HEADS HEAD_DIM SEQ_LEN VOCAB BATCH WINDOW_PATTERN SHORT_WINDOW XSA_ALPHA ITERS [XSA_FUSED [GRAPHS [PHASES]]]
The forward+backward is the trainer's own micro-step (gpt_train_micro_step: a CUDA graph after the first
two runs unless GRAPHS is 0; its cuBLASLt algorithms tuned in the first run, as train_gpt does). Prints its rate ("ours tok/s ... ms/iter ...", median over ITERS after two
warm-up iterations), the FLOPs per token it is counted with, the forward alone, the optimizer step, and the rate and MFU (nanochat FLOPs, where
the GPU's peak is known) of a whole training step as train_gpt runs it: the plan's total batch (nanochat's
Power Lines rule, as train_gpt picks it) as micro-steps of BATCH x SEQ_LEN, then one optimizer step.
Then the memory in use. With PHASES 1, last, where a micro-step's time goes: ITERS more micro-steps run
eagerly with phase timing on (backend_phase marks in the model: CUDA events, or the wall clock on the
CPU), and a table gives each phase's ms per micro-step (summed over layers) and share.
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main()
#include "../../train_gpt.cu"

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void synchronize() {
#ifdef __CUDACC__
    cudaCheck(cudaStreamSynchronize(g_backend.stream));
#endif
}

int main(int argc, char** argv) {
    if (argc < 13 || argc > 16)
        fail("usage: %s LAYERS DIM HEADS KV_HEADS HEAD_DIM SEQ_LEN VOCAB BATCH WINDOW_PATTERN SHORT_WINDOW XSA_ALPHA ITERS [XSA_FUSED [GRAPHS "
             "[PHASES]]]", argv[0]);
    backend_init();
    GPTConfig c;
    c.n_layer = parse_int32("LAYERS", argv[1]);
    c.n_embd = parse_int32("DIM", argv[2]);
    c.n_head = parse_int32("HEADS", argv[3]);
    c.n_kv_head = parse_int32("KV_HEADS", argv[4]);
    c.head_dim = parse_int32("HEAD_DIM", argv[5]);
    c.seq_len = parse_int32("SEQ_LEN", argv[6]);
    c.vocab_size = parse_int32("VOCAB", argv[7]);
    c.padded_vocab = padded_vocab_size(c.vocab_size);
    const int B = parse_int32("BATCH", argv[8]);
    c.window_pattern = argv[9];
    c.short_window = parse_int32("SHORT_WINDOW", argv[10]);
    c.xsa_alpha = parse_double("XSA_ALPHA", argv[11]);
    c.xsa_layer.assign(c.n_layer, c.xsa_alpha > 0.0f);
    const int iters = parse_int32("ITERS", argv[12]);
    if (argc >= 14) g_backend.xsa_fused = parse_bool("XSA_FUSED", argv[13]);
    if (argc >= 15) g_backend.graphs = parse_bool("GRAPHS", argv[14]);
    const bool phases = argc == 16 && parse_bool("PHASES", argv[15]);
    if (B < 1 || iters < 1) fail("BATCH and ITERS must be >= 1");
    GPT model;
    gpt_build(&model, c);
    gpt_init_weights(&model, 42);
    OptimArgs optim_args;
    optim_args.num_iterations = iters + 2;
    const TrainingPlan plan = plan_training(c, optim_args);
    const long micro_tokens = (long)B * c.seq_len;
    const long accum = std::max(1L, plan.total_batch / micro_tokens);  // train_gpt requires a multiple
    Optimizer opt;
    optimizer_init(&opt, &model, plan.optim);
    Rng rng{43};
    std::vector<int> tokens((size_t)B * c.seq_len + 1);
    for (int& t : tokens) t = (int)(rng_next_u64(&rng) % (uint64_t)c.vocab_size);
    std::vector<double> fwdbwd_ms, fwd_ms, update_ms;
    for (int it = 0; it < iters + 2; it++) {
        double t0 = wall_ms();
        gpt_zero_grad(&model);
        backend_matmul_tune(it == 0);  // as train_gpt's first micro-step (--matmul-tune 1, its default)
        gpt_train_micro_step(&model, tokens.data(), tokens.data() + 1, B, c.seq_len, 1.0f);
        backend_matmul_tune(false);
        synchronize();
        double t1 = wall_ms();
        optimizer_step(&opt, &model, base_schedule(opt.config, opt.step));
        synchronize();
        double t2 = wall_ms();
        gpt_set_batch(&model, tokens.data(), tokens.data() + 1, B, c.seq_len);
        gpt_forward_pass(&model, true);
        synchronize();
        double t3 = wall_ms();
        if (it > 1) {  // the first passes pay for allocations, cuBLASLt's algorithm search and the graph capture
            fwdbwd_ms.push_back(t1 - t0);
            update_ms.push_back(t2 - t1);
            fwd_ms.push_back(t3 - t2);
        }
    }
    const double fb = median(fwdbwd_ms), up = median(update_ms), step_ms = accum * fb + up;
    const double step_tok_s = (double)accum * micro_tokens / (step_ms / 1000.0), peak = backend_peak_flops();
    printf("params %zu, batch %d x %d\n", model.num_params, B, c.seq_len);
    const std::string matmul_summary = backend_matmul_summary();
    if (!matmul_summary.empty()) printf("%s\n", matmul_summary.c_str());
    printf("flops/token %.4e (nanochat's: 6 x matmul params + attention)\n", flops_per_token(c));
    printf("ours tok/s %.1f ms/iter %.3f\n", micro_tokens / (fb / 1000.0), fb);
    printf("forward ms %.3f (of the micro-step's %.3f)\n", median(fwd_ms), fb);
    printf("optimizer step ms %.3f\n", up);
    printf("training step: %ld micro-steps (total batch %ld) + optimizer = %.1f ms\n", accum, accum * micro_tokens, step_ms);
    printf("step tok/s %.1f", step_tok_s);
    if (peak > 0) printf(" MFU %.1f%%", 100.0 * step_tok_s * flops_per_token(c) / peak);
    printf("\n");
    if (backend_memory_in_use() > 0) printf("device memory in use GiB %.2f\n", backend_memory_in_use() / 1073741824.0);
    if (phases) {
        g_backend.graphs = false;  // an event inside a replayed graph would not time this run
        g_backend.phases.on = true;
        for (int it = 0; it < iters; it++) {
            gpt_zero_grad(&model);
            gpt_train_micro_step(&model, tokens.data(), tokens.data() + 1, B, c.seq_len, 1.0f);
            backend_phases_collect();
        }
        double total = 0.0;
        for (const auto& t : g_backend.phases.totals) total += t.second;
        printf("phases of a micro-step (eager launches, mean over %d; ms summed over layers):\n", iters);
        for (const auto& t : g_backend.phases.totals)
            printf("  %-72s %9.3f ms %5.1f%%\n", t.first.c_str(), t.second / iters, 100.0 * t.second / total);
        printf("  %-72s %9.3f ms\n", "total", total / iters);
    }
    optimizer_free(&opt);
    gpt_free(&model);
    return 0;
}
