/*
Forward+backward tokens/s of the CPU backend on random tokens, for dev/bench/cpu_vs_torch.sh (the
PyTorch side is dev/bench/bench_torch.py with the same flags). Build: make dev/bench/bench_fwdbwd
usage: bench_fwdbwd LAYERS DIM HEADS KV_HEADS HEAD_DIM SEQ_LEN VOCAB BATCH WINDOW_PATTERN SHORT_WINDOW XSA_ALPHA ITERS
Last line: "ours tok/s <float> ms/iter <float>" (median over ITERS after one warm-up pass).
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main()
#include "../../train_gpt.cu"

int main(int argc, char** argv) {
    if (argc != 13) fail("usage: %s LAYERS DIM HEADS KV_HEADS HEAD_DIM SEQ_LEN VOCAB BATCH WINDOW_PATTERN SHORT_WINDOW XSA_ALPHA ITERS", argv[0]);
    GPTConfig c;
    c.n_layer = atoi(argv[1]);
    c.n_embd = atoi(argv[2]);
    c.n_head = atoi(argv[3]);
    c.n_kv_head = atoi(argv[4]);
    c.head_dim = atoi(argv[5]);
    c.seq_len = atoi(argv[6]);
    c.vocab_size = atoi(argv[7]);
    c.padded_vocab = padded_vocab_size(c.vocab_size);
    const int B = atoi(argv[8]);
    c.window_pattern = argv[9];
    c.short_window = atoi(argv[10]);
    c.xsa_alpha = (float)atof(argv[11]);
    c.xsa_layer.assign(c.n_layer, c.xsa_alpha > 0.0f);
    const int iters = atoi(argv[12]);
    if (B < 1 || iters < 1) fail("BATCH and ITERS must be >= 1");
    GPT model;
    gpt_build(&model, c);
    gpt_init_weights(&model, 42);
    Rng rng{43};
    std::vector<int> tokens((size_t)B * c.seq_len + 1);
    for (int& t : tokens) t = (int)(rng_next_u64(&rng) % (uint64_t)c.vocab_size);
    std::vector<double> ms;
    for (int it = 0; it <= iters; it++) {
        double t0 = wall_ms();
        gpt_zero_grad(&model);
        gpt_forward(&model, tokens.data(), tokens.data() + 1, B, c.seq_len);
        gpt_backward(&model, 1.0f);
        if (it > 0) ms.push_back(wall_ms() - t0);  // the first pass pays for page faults
    }
    std::sort(ms.begin(), ms.end());
    double median = ms[ms.size() / 2];
    printf("threads %d, params %zu\n", num_threads(), model.num_params);
    printf("ours tok/s %.1f ms/iter %.3f\n", B * c.seq_len / (median / 1000.0), median);
    gpt_free(&model);
    return 0;
}
