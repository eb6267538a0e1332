/*
bench_cpu_kernels.cpp: how close the CPU backend's kernels come to the machine's limit, at a model's shapes.
  make dev/bench/bench_cpu_kernels
  OMP_NUM_THREADS=2 dev/bench/bench_cpu_kernels DIM HEADS HEAD_DIM SEQ_LEN VOCAB BATCH SHORT_WINDOW [ITERS]
Prints, median of ITERS (default 5) after one warm-up:
  * the FMA peak, measured: every thread runs 12 independent chains of vector FMAs (the width matmul.cuh
    uses) (best of 3 runs of about 0.1 s); GFLOP/s = 2 x lanes x FMAs / s. This is the limit at the clock the cores run at
    now, which a clock read from /proc/cpuinfo (often the nominal one) would not give.
  * each Linear layer of the model at M = BATCH x SEQ_LEN tokens: the forward (inp @ W^T) and the backward
    (dinp and dweight), GFLOP/s and the share of that peak;
  * attention at the short window and at the full one: the blocked forward and backward the model runs and the
    naive loops beside them, GFLOP/s counted on the visible (query, key) pairs only (4 D FLOPs per pair
    forward: q.k and p v; 10 D backward: the scores again, dy.v, and the three products into dq, dk, dv);
  * the softcapped cross-entropy over (M, VOCAB) logits, forward and backward, in ns per logit.
dev/bench/cpu_vs_torch.sh runs it beside PyTorch's kernels at the same shapes (dev/bench/bench_torch_kernels.py).
*/
#include "llmc/attention.cuh"
#include "llmc/loss.cuh"

static double median_ms(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// ms of fn(), median of iters runs after one warm-up
template <typename Fn>
static double time_ms(int iters, Fn fn) {
    std::vector<double> ms;
    for (int it = 0; it <= iters; it++) {
        const double t0 = wall_ms();
        fn();
        if (it > 0) ms.push_back(wall_ms() - t0);
    }
    return median_ms(ms);
}

// GFLOP/s of 12 independent FMA chains per thread, the micro-kernel's own vector type and expression; the
// best of 3 runs of about 0.1 s each (the first may run while the cores are still raising their clock)
static double fma_peak_gflops() {
    const long reps = 40000000;
    double best = 0.0;
    for (int run = 0; run < 3; run++) {
        float sink = 0.0f;
        const double t0 = wall_ms();
#pragma omp parallel reduction(+ : sink)
        {
            gemm_vec acc[12], m = gemm_vbroadcast(0.999999f), a = gemm_vbroadcast(1e-7f);
            for (int i = 0; i < 12; i++) acc[i] = gemm_vbroadcast((float)i);
            for (long r = 0; r < reps; r++)
                for (int i = 0; i < 12; i++) acc[i] = gemm_vfma(acc[i], m, a);
            for (int i = 0; i < 12; i++) sink += acc[i][0];
        }
        const double seconds = (wall_ms() - t0) / 1000.0;
        if (sink == 12345.0f) printf("(sink)\n");  // keeps the chains from being optimised away
        best = std::max(best, 2.0 * GEMM_VLEN * 12.0 * (double)reps * num_threads() / seconds / 1e9);
    }
    return best;
}

static std::vector<float> random_floats(size_t n, Rng* rng, float std = 1.0f) {
    std::vector<float> x(n);
    fill_normal(x.data(), n, std, rng);
    return x;
}

int main(int argc, char** argv) {
    if (argc < 8 || argc > 9) fail("usage: %s DIM HEADS HEAD_DIM SEQ_LEN VOCAB BATCH SHORT_WINDOW [ITERS]", argv[0]);
    const int C = parse_int32("DIM", argv[1]), H = parse_int32("HEADS", argv[2]), D = parse_int32("HEAD_DIM", argv[3]);
    const int T = parse_int32("SEQ_LEN", argv[4]), V = parse_int32("VOCAB", argv[5]), B = parse_int32("BATCH", argv[6]);
    const int short_window = parse_int32("SHORT_WINDOW", argv[7]), iters = argc == 9 ? parse_int32("ITERS", argv[8]) : 5;
    if (C < 1 || H < 1 || D < 1 || T < 1 || V < 1 || B < 1 || short_window < 0 || iters < 1) fail("every size must be >= 1 (SHORT_WINDOW >= 0)");
    const int M = B * T, threads = num_threads();
    Rng rng{7};

    const double peak = fma_peak_gflops();
    printf("threads %d, vector width %d floats\n", threads, GEMM_VLEN);
    printf("fma peak GFLOP/s %.1f (measured: %d threads x 12 FMA chains)\n", peak, threads);

    // the Linear layers: name, K (in), N (out)
    struct Linear {
        const char* name;
        int K, N;
    };
    const Linear linears[] = {{"q (k, v: Hkv x D)", C, H * D}, {"attention out", H * D, C}, {"mlp fc", C, 4 * C}, {"mlp proj", 4 * C, C},
                              {"lm_head", C, V}};
    printf("%-20s %6s %6s %6s %12s %12s %8s\n", "linear", "M", "K", "N", "fwd GFLOP/s", "bwd GFLOP/s", "% peak");
    for (const Linear& l : linears) {
        const std::vector<float> inp = random_floats((size_t)M * l.K, &rng), weight = random_floats((size_t)l.N * l.K, &rng, 0.02f);
        const std::vector<float> dout = random_floats((size_t)M * l.N, &rng);
        std::vector<float> out((size_t)M * l.N), dinp((size_t)M * l.K), dweight((size_t)l.N * l.K, 0.0f);
        const double flops = 2.0 * M * l.K * l.N;
        const double fwd = time_ms(iters, [&] { matmul_forward_cpu(out.data(), inp.data(), weight.data(), M, l.K, l.N); });
        const double bwd = time_ms(iters, [&] {
            matmul_backward_cpu(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), M, l.K, l.N, GRAD_OVERWRITE);
        });
        const double fwd_gflops = flops / fwd / 1e6, bwd_gflops = 2.0 * flops / bwd / 1e6;
        printf("%-20s %6d %6d %6d %12.1f %12.1f %7.0f%%\n", l.name, M, l.K, l.N, fwd_gflops, bwd_gflops,
               100.0 * 3.0 * flops / (fwd + bwd) / 1e6 / peak);
    }

    // attention: (B, T, H, D) with Hkv = H, at the short and the full window
    const std::vector<float> q = random_floats((size_t)M * H * D, &rng, 2.0f), k = random_floats(q.size(), &rng);
    const std::vector<float> v = random_floats(q.size(), &rng), dy = random_floats(q.size(), &rng);
    std::vector<float> y(q.size()), lse((size_t)B * H * T), dq(q.size()), dk(q.size()), dv(q.size());
    printf("%-28s %12s %12s %8s\n", "attention (B, T, H, D)", "fwd GFLOP/s", "bwd GFLOP/s", "% peak");
    for (int window : {short_window, T}) {
        double pairs = 0.0;  // visible (query, key) pairs of one (batch row, head)
        for (int i = 0; i < T; i++) pairs += std::min(i, window) + 1;
        const double fwd_flops = 4.0 * D * pairs * B * H, bwd_flops = 2.5 * fwd_flops;
        for (bool naive : {false, true}) {
            const double fwd = time_ms(naive ? 1 : iters, [&] {
                if (naive) attention_forward_naive_cpu(y.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, H, D, window);
                else attention_forward_cpu(y.data(), lse.data(), q.data(), k.data(), v.data(), qkv_separate(H, H, D), B, T, H, H, D, window);
            });
            const double bwd = time_ms(naive ? 1 : iters, [&] {
                if (naive)
                    attention_backward_naive_cpu(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(), v.data(), y.data(), lse.data(),
                                                 B, T, H, H, D, window);
                else
                    attention_backward_cpu(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(), v.data(), qkv_separate(H, H, D), y.data(),
                                           lse.data(), B, T, H, H, D, window);
            });
            char name[64];
            snprintf(name, sizeof name, "%s, window %d", naive ? "naive" : "blocked", window);
            printf("%-28s %12.1f %12.1f %7.0f%%\n", name, fwd_flops / fwd / 1e6, bwd_flops / bwd / 1e6,
                   100.0 * (fwd_flops + bwd_flops) / (fwd + bwd) / 1e6 / peak);
        }
    }

    // the loss over (M, V) logits
    std::vector<float> logits = random_floats((size_t)M * V, &rng, 3.0f), losses(M);
    std::vector<int> targets(M);
    for (int& t : targets) t = (int)(rng_next_u64(&rng) % (uint64_t)V);
    const std::vector<float> raw = logits;
    const double loss_fwd = time_ms(iters, [&] {
        memcpy(logits.data(), raw.data(), raw.size() * sizeof(float));
        softcap_crossentropy_forward_cpu(losses.data(), logits.data(), targets.data(), M, V, 15.0f);
    });
    const double copy = time_ms(iters, [&] { memcpy(logits.data(), raw.data(), raw.size() * sizeof(float)); });
    const float scale = 1.0f / M;
    const double loss_bwd = time_ms(iters, [&] {
        memcpy(logits.data(), raw.data(), raw.size() * sizeof(float));
        softcap_crossentropy_backward_cpu(logits.data(), targets.data(), M, V, 15.0f, &scale);
    });
    printf("softcap cross-entropy (%d x %d logits): forward %.2f ns/logit, backward %.2f ns/logit\n", M, V,
           (loss_fwd - copy) * 1e6 / ((double)M * V), (loss_bwd - copy) * 1e6 / ((double)M * V));
    return 0;
}
