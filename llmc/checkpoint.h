// checkpoint.h: checkpoints (nanochat's checkpoint_manager): one safetensors file holding the parameters
// (nanochat's names), the optimizer state in the replicated layout (whatever the ranks' sharding), each
// rank's data-loader state and the loop state, so that --resume continues bit-identically; the optimizer
// settings as metadata (chat/sft.h reads them back); the latest checkpoint of a directory; metrics.jsonl
// cut back on resume; the lock that keeps a second run out of a run's directory.
// Part of train_gpt.cu, included after the optimizer and the training step (it saves and loads GPT,
// Optimizer and the loaders), as llm.c keeps its checkpoint code beside the model.
#pragma once

#include <sys/file.h>  // flock: one run at a time in a directory

// One run at a time in a directory: an exclusive lock on DIR/.lock, held until the process exits (also
// when it is killed), so a second run into the same directory cannot interleave checkpoints and metrics.
static void lock_run_dir(const std::string& dir) {
    const std::string path = dir + "/.lock";
    const int fd = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot write into '%s': %s", dir.c_str(), strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        fail("another run is using '%s' (it holds %s); wait for it to end, or use another -o", dir.c_str(), path.c_str());
}

static const char* CHECKPOINT_FORMAT = "xsa-checkpoint-1";

struct LoopState {
    int step = 0;               // optimizer updates applied
    double smooth_loss = 0.0;   // EMA (beta 0.9) of the training loss, not yet debiased
    double train_ms = 0.0;      // time spent in training steps
    bool evals_done = true;     // the evaluations of `step` ran before the checkpoint (not so when a signal stopped the run)
};

// What the training data was: each shard's file name, size and a hash of its header (FNV-1a), hashed
// together. A checkpoint records it, so that resuming on other data is an error rather than a silent
// change of the data order.
// (SFT records a hash of the bytes of its two conversation files instead: chat/sft.h, sft_data_identity.)
static void fingerprint_file(Fnv1a* fnv, const std::string& path) {
    const size_t slash = path.rfind('/');
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    fnv->mix(name.data(), name.size() + 1);
    FILE* f = fopen_or_fail(path.c_str(), "rb");
    uint8_t header[SHARD_HEADER_INTS * sizeof(int32_t)];
    const size_t got = fread(header, 1, sizeof header, f);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fclose(f);
    fnv->mix(header, got);
    fnv->mix(&size, sizeof size);
}

static uint64_t loader_data_seed(const DataLoader* dl) { return dl->data_seed; }

static std::string data_fingerprint(const DataLoader* dl) {
    Fnv1a fnv;
    for (const Shard& sh : dl->shards) fingerprint_file(&fnv, sh.path);
    return fnv.hex();
}

// The validation data's fingerprint, which a checkpoint records as "val_data": a resumed run evaluating on other
// shards would log val bpb that does not compare with the run's earlier evaluations. Base training: its validation
// shards' (as data_fingerprint); "" (none recorded) for SFT, whose "data" identity covers sft_val.bin already
// (chat/sft.h, sft_data_identity).
static std::string val_data_fingerprint(const DataLoader* val) { return val ? data_fingerprint(val) : ""; }
template <typename Loader>
static std::string val_data_fingerprint(const Loader*) { return ""; }

// The shortest decimal that reads back as the same double (as Python's repr: "0.65", not "0.65000000000000002")
static std::string shortest_decimal(double x) {
    char buf[40];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, nullptr) == x) break;
    }
    return buf;
}

// Whether a checkpoint's setting `have` is this run's `want`. Builds before 2026-12-05 kept the lrs, weight
// decays and ratios as floats and wrote them with "%.9g": such a value is the same setting when it is exactly what they
// wrote for this one. (At warmdown lengths that were ties, N = 30 mod 40, the resumed run then follows the corrected
// schedule from the checkpoint on.)
static bool same_setting(const std::string& have, const std::string& want) {
    if (have == want) return true;
    char* end = nullptr;
    const double w = strtod(want.c_str(), &end);
    if (want.empty() || *end != '\0') return false;
    char old[40];
    snprintf(old, sizeof old, "%.9g", (double)(float)w);
    return have == old;
}

static std::map<std::string, std::string> optim_to_metadata(const OptimConfig& o) {
    auto num = shortest_decimal;
    std::map<std::string, std::string> m = {
        {"optim.adamw_only", o.adamw_only ? "1" : "0"}, {"optim.muon_eq", o.muon_eq ? "1" : "0"}, {"optim.muon_plus", o.muon_plus ? "1" : "0"},
        {"optim.muon_wd", num(o.muon_wd)}, {"optim.matrix_adamw_wd", num(o.matrix_adamw_wd)},
        {"optim.num_iterations", std::to_string(o.num_iterations)}, {"optim.warmup_steps", std::to_string(o.warmup_steps)},
        {"optim.warmdown_ratio", num(o.warmdown_ratio)}, {"optim.final_lr_frac", num(o.final_lr_frac)},
        {"optim.momentum_warmup_steps", std::to_string(o.momentum_warmup_steps)}, {"optim.sft", o.sft ? "1" : "0"},
        {"optim.warmup_ratio", num(o.warmup_ratio)}, {"optim.given_embedding_lr", num(o.given_embedding_lr)},
        {"optim.given_unembedding_lr", num(o.given_unembedding_lr)}, {"optim.given_matrix_lr", num(o.given_matrix_lr)},
        {"optim.given_xsa_lr", num(o.given_xsa_lr)}, {"optim.total_batch", std::to_string(o.total_batch)}};
    for (int g = 0; g < NUM_GROUPS; g++) m[std::string("optim.lr.") + GROUP_NAMES[g]] = num(o.lr[g]);
    return m;
}

// int64 values as pairs of int32 (low, high), since safetensors here carries only F32 and I32
static std::vector<int32_t> split_int64(const std::vector<int64_t>& v) {
    std::vector<int32_t> out;
    for (int64_t x : v) {
        out.push_back((int32_t)(uint32_t)((uint64_t)x & 0xFFFFFFFFu));
        out.push_back((int32_t)(uint32_t)((uint64_t)x >> 32));
    }
    return out;
}

static std::vector<int64_t> join_int64(const int32_t* v, size_t pairs) {
    std::vector<int64_t> out(pairs);
    for (size_t i = 0; i < pairs; i++) out[i] = (int64_t)((uint64_t)(uint32_t)v[2 * i] | ((uint64_t)(uint32_t)v[2 * i + 1] << 32));
    return out;
}

// The checkpoint tensor holding rank `rank`'s data-loader state.
static std::string loader_state_name(int rank) { return rank == 0 ? "dataloader.state" : "dataloader.state.rank" + std::to_string(rank); }

// Every rank calls it (each contributes its data-loader state); rank 0 writes the file, with the checksums of its
// tensors and header (safetensors_write). Loader: DataLoader (base training) or SftLoader; `val` the validation loader.
template <typename Loader>
static void save_checkpoint(const std::string& path, GPT* model, const Optimizer* opt, const Loader* train, const Loader* val,
                            const LoopState& loop) {
    const std::vector<std::vector<int64_t>> loader_states = ranks_gather(dataloader_state(train));
    const std::vector<float> state = optimizer_full_state(opt, model);  // the whole state, gathered from the ranks' shares
    if (g_ranks.rank != 0) return;
    std::map<std::string, std::string> meta = model_metadata(model);
    for (const auto& kv : optim_to_metadata(opt->config)) meta[kv.first] = kv.second;
    char buf[64];
    meta["format"] = CHECKPOINT_FORMAT;
    meta["step"] = std::to_string(loop.step);
    meta["optimizer_step"] = std::to_string(opt->step);
    meta["batch"] = std::to_string(train->B);  // the rows per micro-batch and the ranks decide the data order
    meta["ranks"] = std::to_string(g_ranks.world);
    meta["data_seed"] = std::to_string(loader_data_seed(train));
    snprintf(buf, sizeof buf, "%.17g", loop.smooth_loss);
    meta["smooth_loss"] = buf;
    snprintf(buf, sizeof buf, "%.17g", loop.train_ms);
    meta["train_ms"] = buf;
    meta["evals_done"] = loop.evals_done ? "1" : "0";
    meta["data"] = data_fingerprint(train);
    const std::string val_data = val_data_fingerprint(val);
    if (!val_data.empty()) meta["val_data"] = val_data;
    const std::string matmul_choices = backend_matmul_choices();  // CUDA: so that a resumed run computes as this one
    if (!matmul_choices.empty()) meta["matmul_choices"] = matmul_choices;
    std::vector<SafeTensorOut> tensors;
    gpt_params_to_host(model);
    check_weights_finite(model, ("at step " + std::to_string(loop.step)).c_str());
    for (const ParamTensor& t : model->table) tensors.push_back({t.name, "F32", t.shape, model->params_host + t.offset});
    if (first_non_finite(state.data(), state.size()) < state.size())
        fail("the optimizer state holds a non-finite value at step %d; no checkpoint written", loop.step);
    tensors.push_back({"optimizer.state", "F32", {(int64_t)state.size()}, state.data()});
    std::vector<std::vector<int32_t>> loaders;
    for (const std::vector<int64_t>& state : loader_states) loaders.push_back(split_int64(state));
    for (size_t r = 0; r < loaders.size(); r++)
        tensors.push_back({loader_state_name((int)r), "I32", {(int64_t)loaders[r].size()}, loaders[r].data()});
    safetensors_write(path, meta, tensors);
}

// Without a validation loader (tests and tools): nothing recorded of the validation data.
template <typename Loader>
static void save_checkpoint(const std::string& path, GPT* model, const Optimizer* opt, const Loader* train, const LoopState& loop) {
    save_checkpoint(path, model, opt, train, (const Loader*)nullptr, loop);
}

// Rank `rank`'s data-loader state in a checkpoint.
static std::vector<int64_t> checkpoint_loader_state(const SafetensorsFile& f, int rank, const std::string& path) {
    const std::string name = loader_state_name(rank);
    const SafeTensor* ls = f.find(name);
    if (!ls || ls->numel() % 2 != 0) fail("'%s' has no valid %s", path.c_str(), name.c_str());
    return join_int64(f.get_i32(name, ls->numel()), ls->numel() / 2);
}

// A checkpoint of `ranks` ranks resumed on another number: this rank's share of their data-loader states
// (dataloader_restore_resharded). SFT runs resume only on their number of ranks.
static void loader_restore_resharded(DataLoader* train, const SafetensorsFile& f, int ranks, const std::string& path) {
    std::vector<std::vector<int64_t>> states;
    for (int r = 0; r < ranks; r++) states.push_back(checkpoint_loader_state(f, r, path));
    dataloader_restore_resharded(train, states, path.c_str());
    printf("data: %s was written by %d rank%s, this run has %d: the ranks go on from the furthest position in the shards and share "
           "the documents the old ranks had buffered (dev/docs/data.md#ranks-and-epochs)\n", path.c_str(), ranks, ranks == 1 ? "" : "s", g_ranks.world);
}

// Restores a checkpoint into a model and optimizer built from the same configuration (checked); its checksums, where
// it has them, are verified as it is read (safetensors_read). `val`: the run's validation loader.
// allow_other_data: resuming on training or validation data other than the checkpoint's is intended (--allow-other-data 1).
template <typename Loader>
static void load_checkpoint(const std::string& path, GPT* model, Optimizer* opt, Loader* train, const Loader* val, LoopState* loop,
                            bool allow_other_data) {
    SafetensorsFile f = safetensors_read(path);
    if (f.metadata.count("format") == 0 || f.meta("format") != CHECKPOINT_FORMAT)
        fail("'%s' is not an xsa-train checkpoint (format '%s', expected '%s')", path.c_str(),
             f.metadata.count("format") ? f.meta("format").c_str() : "none", CHECKPOINT_FORMAT);
    // settings newer than the checkpoint format: a checkpoint from before them lacks them, and implies a value
    // (nullptr: none to compare; the learnable alpha's lr matters only to a learnable alpha, which such a
    // checkpoint cannot hold: xsa_learnable says so)
    static const std::map<std::string, const char*> added_later = {
        {"xsa_learnable", "0"}, {"optim.lr.xsa_alpha", nullptr}, {"optim.sft", "0"}, {"optim.warmup_ratio", nullptr},
        {"optim.given_embedding_lr", nullptr}, {"optim.given_unembedding_lr", nullptr}, {"optim.given_matrix_lr", nullptr},
        {"optim.given_xsa_lr", nullptr}, {"optim.total_batch", nullptr}};
    std::map<std::string, std::string> want = config_to_metadata(model->config);
    for (const auto& kv : optim_to_metadata(opt->config)) want[kv.first] = kv.second;
    for (const auto& kv : want) {
        const auto implied = added_later.find(kv.first);
        if (f.metadata.count(kv.first) == 0 && implied != added_later.end() && implied->second == nullptr) continue;
        const std::string have = f.metadata.count(kv.first) ? f.meta(kv.first) : implied != added_later.end() ? implied->second : "(missing)";
        if (!same_setting(have, kv.second))
            fail("'%s' was written with %s = %s, but this run has %s = %s; resume with the same model and optimizer flags", path.c_str(),
                 kv.first.c_str(), have.c_str(), kv.first.c_str(), kv.second.c_str());
    }
    const int ranks = (int)metadata_int(f, "ranks", 1, MAX_RANKS);
    if (metadata_int(f, "batch", 1, INT_MAX) != train->B)
        fail("'%s' was written with %s rows per micro-batch, this run has %d; resume with -b %s (the rows decide the data order)",
             path.c_str(), f.meta("batch").c_str(), train->B, f.meta("batch").c_str());
    const std::string data_seed = f.metadata.count("data_seed") ? f.meta("data_seed") : "0";  // (before --data-seed: 0)
    if (data_seed != std::to_string(loader_data_seed(train)))
        fail("'%s' was written with --data-seed %s, this run has %llu; resume with --data-seed %s (it decides the data order)", path.c_str(),
             data_seed.c_str(), (unsigned long long)loader_data_seed(train), data_seed.c_str());
    if (f.metadata.count("tokenizer_fingerprint") && !model->tokenizer_fingerprint.empty() &&
        f.meta("tokenizer_fingerprint") != model->tokenizer_fingerprint)  // the same vocabulary size is not the same tokenizer
        fail("'%s' was trained with the tokenizer '%s' (fingerprint %s); this run's '%s' has other tokens (%s): resume with --tokenizer %s",
             path.c_str(), f.metadata.count("tokenizer") ? f.meta("tokenizer").c_str() : "?", f.meta("tokenizer_fingerprint").c_str(),
             model->tokenizer_path.c_str(), model->tokenizer_fingerprint.c_str(), f.metadata.count("tokenizer") ? f.meta("tokenizer").c_str() : "FILE");
    const std::string data = data_fingerprint(train);
    if (f.meta("data") != data && !allow_other_data)
        fail("'%s' was trained on other data (fingerprint %s; these shards give %s): resume on the same shards, or add "
             "--allow-other-data 1 if the change is intended", path.c_str(), f.meta("data").c_str(), data.c_str());
    const std::string val_data = val_data_fingerprint(val);  // (checkpoints from before it was recorded: not compared)
    if (f.metadata.count("val_data") && !val_data.empty() && f.meta("val_data") != val_data && !allow_other_data)
        fail("'%s' was evaluated on other validation data (fingerprint %s; these validation shards, -j, give %s): its val bpb would not "
             "compare with the run's earlier evaluations; resume with the same -j shards, or add --allow-other-data 1 if the change is "
             "intended", path.c_str(), f.meta("val_data").c_str(), val_data.c_str());
    gpt_load_weights(model, f);
    optimizer_load_state(opt, model, f, path);
    loop->step = (int)metadata_int(f, "step", 0, INT_MAX);
    // a checkpoint named for its step (ckpt_<step>.safetensors) must hold that step: --resume takes the highest name
    const size_t slash = path.rfind('/');
    const std::string name = path.substr(slash == std::string::npos ? 0 : slash + 1);
    if (name.rfind("ckpt_", 0) == 0 && name.size() > 17 && name.compare(name.size() - 12, 12, ".safetensors") == 0) {
        const std::string digits = name.substr(5, name.size() - 17);
        if (digits.find_first_not_of("0123456789") == std::string::npos && atol(digits.c_str()) != loop->step)
            fail("'%s' is named for step %ld but holds step %d (renamed, or its metadata edited?)", path.c_str(), atol(digits.c_str()), loop->step);
    }
    opt->step = (int)metadata_int(f, "optimizer_step", loop->step, INT_MAX);  // one update per step, after SFT's base run's
    if (ranks == g_ranks.world) dataloader_restore(train, checkpoint_loader_state(f, g_ranks.rank, path), path.c_str());
    else loader_restore_resharded(train, f, ranks, path);
    loop->smooth_loss = metadata_double(f, "smooth_loss");
    loop->train_ms = metadata_double(f, "train_ms");
    loop->evals_done = metadata_int(f, "evals_done", 0, 1) == 1;
    if (f.metadata.count("matmul_choices")) backend_matmul_restore_choices(f.meta("matmul_choices"), path.c_str());
}

// Without a validation loader (tests and tools): the validation data is not compared.
template <typename Loader>
static void load_checkpoint(const std::string& path, GPT* model, Optimizer* opt, Loader* train, LoopState* loop, bool allow_other_data) {
    load_checkpoint(path, model, opt, train, (const Loader*)nullptr, loop, allow_other_data);
}

// The checkpoints in dir, by step: only names exactly ckpt_<digits>.safetensors count (not ckpt_best.safetensors,
// nor a .tmp left by a crash), ordered by their number (999999 < 1000000).
static std::vector<std::pair<long, std::string>> run_checkpoints(const std::string& dir) {
    std::vector<std::pair<long, std::string>> found;
    for (const std::string& name : matching_files(dir + "/ckpt_*.safetensors")) {
        const size_t start = name.rfind("/ckpt_") + 6, end = name.size() - strlen(".safetensors");
        const std::string digits = name.substr(start, end - start);
        if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
        found.push_back({atol(digits.c_str()), name});
    }
    std::sort(found.begin(), found.end());
    return found;
}

// The checkpoint with the highest step in dir ("" if none).
static std::string latest_checkpoint(const std::string& dir) {
    const std::vector<std::pair<long, std::string>> found = run_checkpoints(dir);
    return found.empty() ? "" : found.back().second;
}

// --keep-checkpoints: deletes all but the `keep` latest checkpoints in dir (called after a new one is written, so
// the latest is always whole).
static void remove_old_checkpoints(const std::string& dir, int keep) {
    const std::vector<std::pair<long, std::string>> found = run_checkpoints(dir);
    for (size_t i = 0; i + keep < found.size(); i++)
        if (unlink(found[i].second.c_str()) != 0) fprintf(stderr, "warning: could not delete old checkpoint %s: %s\n", found[i].second.c_str(), strerror(errno));
}

static std::string checkpoint_path(const std::string& dir, int step) {
    char name[64];
    snprintf(name, sizeof name, "/ckpt_%06d.safetensors", step);
    return dir + name;
}

// On resume, metrics.jsonl keeps what the run had logged up to the checkpoint: train lines of earlier
// steps, eval and core lines up to the checkpoint's step; lines the interrupted run wrote later are dropped.
static void truncate_metrics(const std::string& path, int resume_step) {
    std::ifstream f(path);
    if (!f) return;
    std::string kept, line;
    while (std::getline(f, line)) {
        if (f.eof()) break;  // no newline: a line torn by a kill, written after the checkpoint
        size_t s = line.find("\"step\": ");
        if (s == std::string::npos) continue;
        int step = atoi(line.c_str() + s + 8);
        bool train = line.find("\"kind\": \"train\"") != std::string::npos;  // eval and core lines at the checkpoint's step stay
        if (step < resume_step || (!train && step == resume_step)) kept += line + "\n";
    }
    AtomicFile out = atomic_open(path);  // a failure leaves the log as it was
    atomic_write(&out, kept.data(), kept.size());
    atomic_commit(&out);
}

