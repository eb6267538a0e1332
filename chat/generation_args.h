// generation_args.h: what sample and chat_cli share, the generation flags (-e, --tokenizer, -n, -t, -k, -s),
// and, with chat_eval, a trained model loaded with its tokenizer. Included after train_gpt.cu (as a library).
#pragma once

// The command line sample and chat_cli share: -e, --tokenizer, -n, -t, -k, -s (their defaults differ).
struct GenerationArgs {
    std::string weights, tokenizer;  // -e, --tokenizer
    int max_new = 128;               // -n
    SamplingOptions sampling;        // -t, -k
    uint64_t seed = 42;              // -s
};

// true if `flag` is one of the shared options (value parsed into a), false if the caller must handle it
static bool parse_generation_flag(GenerationArgs* a, const std::string& flag, const char* value) {
    if (flag == "-e") a->weights = value;
    else if (flag == "--tokenizer") a->tokenizer = value;
    else if (flag == "-n") a->max_new = parse_int32(flag.c_str(), value);
    else if (flag == "-t") a->sampling.temperature = parse_double(flag.c_str(), value);
    else if (flag == "-k") a->sampling.top_k = parse_int32(flag.c_str(), value);
    else if (flag == "-s") {
        const long v = parse_int(flag.c_str(), value);
        if (v < 0) fail("-s must be >= 0, got %ld", v);
        a->seed = (uint64_t)v;
    } else return false;
    return true;
}

static void validate_generation_args(const GenerationArgs& a, const char* program) {
    if (a.weights.empty()) fail("%s needs -e CHECKPOINT (see --help)", program);
    if (a.max_new < 1) fail("-n must be >= 1, got %d", a.max_new);
    if (!(a.sampling.temperature >= 0.0f && a.sampling.temperature <= 100.0f)) fail("-t must be in [0, 100], got %g", a.sampling.temperature);
    if (a.sampling.top_k < 0) fail("-k must be >= 0, got %d", a.sampling.top_k);
}

// For sample, chat_cli and chat_eval: the model in a checkpoint or export (`path`; a run's directory: its latest
// checkpoint), and its tokenizer: `tokenizer_path` if given, else the one the model's file names. The tokenizer
// must be the one the model was trained with (same fingerprint; files written before fingerprints were recorded:
// the same vocabulary size). Returns whether the file says it is a base-training checkpoint (not fine-tuned by
// chat_sft: chat_cli says so).
static bool load_model_and_tokenizer(GPT* model, Tokenizer* tok, std::string path, std::string tokenizer_path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        const std::string latest = latest_checkpoint(path);
        if (latest.empty()) fail("'%s' is a directory without a checkpoint ckpt_*.safetensors (-e takes a weights file or a run's directory)", path.c_str());
        printf("weights: %s (the latest checkpoint in %s)\n", latest.c_str(), path.c_str());
        path = latest;
    }
    SafetensorsFile file = safetensors_read(path);
    const bool recorded = file.metadata.count("tokenizer_fingerprint") > 0;
    if (tokenizer_path.empty()) {
        if (!recorded) fail("'%s' does not name its tokenizer (it was written before models recorded one); pass --tokenizer FILE", path.c_str());
        tokenizer_path = file.meta("tokenizer");
        if (access(tokenizer_path.c_str(), R_OK) != 0)
            fail("'%s' was trained with the tokenizer '%s', which is not readable from here (%s); pass --tokenizer FILE", path.c_str(),
                 tokenizer_path.c_str(), strerror(errno));
    }
    tokenizer_load(tok, tokenizer_path);
    gpt_build(model, config_from_metadata(file));
    if (tok->vocab_size != model->config.vocab_size)
        fail("the tokenizer '%s' has %d tokens, the model in '%s' %d: not the model's tokenizer", tokenizer_path.c_str(), tok->vocab_size, path.c_str(),
             model->config.vocab_size);
    if (recorded && tokenizer_fingerprint(tok) != file.meta("tokenizer_fingerprint"))
        fail("the tokenizer '%s' is not the one the model in '%s' was trained with ('%s': its tokens differ)", tokenizer_path.c_str(), path.c_str(),
             file.meta("tokenizer").c_str());
    gpt_load_weights(model, file);
    model->tokenizer_path = tokenizer_path;
    model->tokenizer_fingerprint = tokenizer_fingerprint(tok);
    return file.metadata.count("optim.sft") && file.meta("optim.sft") == "0";
}
