/*
sample.cpp: continue a text with a trained model, the tokens printed as they are produced.
    make sample && ./sample -e CHECKPOINT [-p "text"] [-n 128] [-t 0.8] [-k 50] [-s 42]
CHECKPOINT is a checkpoint (DIR/ckpt_STEP.safetensors) or weights exported with --export-safetensors.
The text is encoded with the model's tokenizer (the one its file names, or --tokenizer FILE), BOS first,
then continued with the KV cache (llmc/engine.h: generate) until -n tokens, a BOS (the start of a new
document), or the end of the model's context. Without -p the text is read from stdin. Several -p give
several rows, generated together and printed at the end. Speeds go to stderr.
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main()
#include "../train_gpt.cu"
#include "generation_args.h"
#include "encoder.h"

static void usage() {
    printf("usage: sample -e CHECKPOINT [-p TEXT ...] [-n TOKENS] [-t TEMPERATURE] [-k TOP_K] [-s SEED] [--tokenizer FILE]\n"
           "  -e FILE          checkpoint or exported weights (safetensors with xsa-train configuration metadata)\n"
           "  -p TEXT          the text to continue (repeat for several rows; default: all of stdin)\n"
           "  -n N             new tokens per row, at most (default 128; the model's context ends it earlier)\n"
           "  -t T             temperature; 0 is greedy (default 0.8)\n"
           "  -k K             sample among the K most likely tokens; 0 for all (default 50)\n"
           "  -s SEED          random seed (default 42; row r uses SEED + r)\n"
           "  --tokenizer FILE the model's tokenizer, if not where its file says\n");
}

int main(int argc, char** argv) {
    openmp_short_spin(argv);  // first: it may start the program again (common.h says why)
    GenerationArgs a;
    a.max_new = 128;
    a.sampling.temperature = 0.8f;
    a.sampling.top_k = 50;
    std::vector<std::string> texts;
    parse_options(argc, argv, usage, [&](const std::string& flag, const char* value) {
        if (flag == "-p") texts.push_back(value);
        else return parse_generation_flag(&a, flag, value);
        return true;
    });
    validate_generation_args(a, "sample");
    if (texts.empty()) {  // all of stdin
        std::string text;
        char buf[65536];
        for (size_t n; (n = fread(buf, 1, sizeof buf, stdin)) > 0;) text.append(buf, n);
        if (ferror(stdin)) fail("reading stdin: %s", strerror(errno));
        texts.push_back(text);
    }

    backend_init(nullptr);
    GPT model;
    Tokenizer tok;
    load_model_and_tokenizer(&model, &tok, a.weights, a.tokenizer);
    std::vector<std::vector<int>> prompts;
    for (const std::string& text : texts) {
        std::vector<int> ids = tokenizer_encode(&tok, text);
        ids.insert(ids.begin(), tok.bos_id);
        if ((int)ids.size() >= model.config.seq_len)
            fail("the text has %zu tokens with its BOS; the model's context is %d, so at most %d leave room to continue (shorten it)", ids.size(),
                 model.config.seq_len, model.config.seq_len - 1);
        prompts.push_back(ids);
    }
    const bool stream = prompts.size() == 1;
    if (stream) {
        fwrite(texts[0].data(), 1, texts[0].size(), stdout);
        fflush(stdout);
    }
    GenerateStats stats;
    const std::vector<std::vector<int>> out = generate(&model, prompts, a.max_new, a.sampling, a.seed, {tok.bos_id}, [&](int, int token) {
        if (!stream) return;
        const std::string& piece = tok.pieces[token];
        fwrite(piece.data(), 1, piece.size(), stdout);
        fflush(stdout);
    }, &stats);
    if (stream) printf("\n");
    else
        for (size_t r = 0; r < out.size(); r++) {
            const std::string cont = tokenizer_decode(&tok, out[r].data(), out[r].size());
            printf("--- row %zu\n%s%s\n", r, texts[r].c_str(), cont.c_str());
        }
    fflush(stdout);  // the text before the speeds on a terminal
    long generated = 0;
    for (const std::vector<int>& o : out) generated += (long)o.size();
    fprintf(stderr, "%ld new tokens in %zu row%s on %s: prefill %ld tokens at %.0f tokens/s, decode %ld steps at %.1f tokens/s\n", generated,
            out.size(), out.size() == 1 ? "" : "s", BACKEND_NAME, stats.prefill_tokens, stats.prefill_tokens / (stats.prefill_ms / 1000.0),
            stats.decode_steps, stats.decode_steps > 0 ? (double)stats.decode_steps * out.size() / (stats.decode_ms / 1000.0) : 0.0);
    gpt_free(&model);
    return 0;
}
