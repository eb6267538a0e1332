// sft.h: nanochat's chat_sft, the parts of it that are not the program (chat_sft.cu): its settings, its
// plan and schedules (the lr following the data read), the steps of an epoch, and what its checkpoints
// record of the data. Included after train_gpt.cu (as a library), whose training step and checkpoints take
// the SFT loader through these overloads.
#pragma once

#include "sft_loader.h"

// SFT's settings (nanochat's chat_sft flags and defaults)
struct SftArgs {
    std::string dir;              // --sft: DIR/sft_train.bin and DIR/sft_val.bin
    double init_lr_frac = 0.8;    // every lr x this
    double warmup_ratio = 0.0, warmdown_ratio = 0.5, final_lr_frac = 0.0;  // doubles, as nanochat's Python floats
    bool load_optimizer = true;   // warm-start the optimizer from the base checkpoint's state
    // the base run's, unless given (-1)
    double embedding_lr = -1.0, unembedding_lr = -1.0, matrix_lr = -1.0;
    long total_batch = -1;
    int chatcore_every = 200, chatcore_max_cat = -1, chatcore_max_sample = 24;
    std::string chatcore_dir;     // "": the default for the model's tokenizer (sft_setup)
};

// ----------------------------------------------------------------------------------------------------
// The conversation directory: its tokenizer (sft_meta.json), its targets, and its identity (resuming checks it)

// SHA-256 (FIPS 180-4) of a file's bytes, as hex: sft_meta.json records the tokenizer file's (Python's hashlib.sha256)
static std::string sha256_file_hex(const std::string& path) {
    static const uint32_t K[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
        0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
        0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
        0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
        0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
        0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
    auto block = [&](const uint8_t* p) {
        uint32_t w[64];
        for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3), s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
        for (int i = 0; i < 64; i++) {
            const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
            const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
    };
    InputFile in(path);
    std::vector<uint8_t> buf(1 << 16);
    uint64_t total = 0;
    size_t got = 0;
    for (uint64_t left = in.size; left > 0;) {  // whole 64-byte blocks; the last partial one stays in buf[0, got)
        got = (size_t)std::min<uint64_t>(left, buf.size());
        in.read(buf.data(), 1, got);
        left -= got;
        total += got;
        const size_t whole = left > 0 ? got : got / 64 * 64;
        for (size_t i = 0; i < whole; i += 64) block(buf.data() + i);
        if (left == 0) {
            memmove(buf.data(), buf.data() + whole, got - whole);
            got -= whole;
        }
    }
    uint8_t tail[128] = {};
    memcpy(tail, buf.data(), got);
    tail[got] = 0x80;
    const size_t tail_bytes = got + 9 <= 64 ? 64 : 128;
    for (int i = 0; i < 8; i++) tail[tail_bytes - 1 - i] = (uint8_t)((total * 8) >> (8 * i));
    for (size_t i = 0; i < tail_bytes; i += 64) block(tail + i);
    char hex[65];
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", h[i]);
    return hex;
}

// The string value of `key` in the top-level object of sft.py's sft_meta.json (the first occurrence of "key":
// sft.py writes no such key deeper); false if the key is absent or its value is not a string.
static bool sft_meta_string(const std::string& text, const char* key, std::string* out) {
    const std::string quoted = std::string("\"") + key + "\"";
    size_t p = text.find(quoted);
    if (p == std::string::npos) return false;
    p += quoted.size();
    while (p < text.size() && isspace((unsigned char)text[p])) p++;
    if (p >= text.size() || text[p++] != ':') return false;
    while (p < text.size() && isspace((unsigned char)text[p])) p++;
    if (p >= text.size() || text[p++] != '"') return false;
    out->clear();
    for (; p < text.size() && text[p] != '"'; p++) {
        if (text[p] == '\\' && ++p >= text.size()) return false;
        out->push_back(text[p]);  // (an escape's character as written: the values read here are a path and hex digits)
    }
    return p < text.size();
}

// DIR/sft_meta.json (dev/data/sft.py writes it last) names the tokenizer the conversations were made with and
// its SHA-256: it must be the model's tokenizer file (`tokenizer_path`), the same vocabulary size and BOS not
// being the same tokens. Files made by hand, without sft_meta.json, are checked by the vocabulary size and BOS
// in their headers only (said once).
static void sft_check_meta(const std::string& dir, const std::string& tokenizer_path) {
    const std::string path = dir + "/sft_meta.json";
    if (access(path.c_str(), F_OK) != 0) {
        printf("note: %s has no sft_meta.json (dev/data/sft.py writes it): the conversations' tokenizer is checked by its vocabulary size and BOS "
               "only\n", dir.c_str());
        return;
    }
    InputFile in(path);
    if (in.size > (1u << 24)) fail("'%s' has %llu bytes; more than 16 MiB is not sft.py's sft_meta.json", path.c_str(), (unsigned long long)in.size);
    std::string text(in.size, '\0');
    in.read(&text[0], 1, text.size());
    std::string sha, made_with;
    if (!sft_meta_string(text, "tokenizer_sha256", &sha) || sha.size() != 64 || sha.find_first_not_of("0123456789abcdef") != std::string::npos)
        fail("'%s' has no tokenizer_sha256 (64 hex digits) naming the tokenizer its conversations were made with; write the directory again with "
             "dev/data/sft.py", path.c_str());
    if (!sft_meta_string(text, "tokenizer", &made_with)) made_with = "?";
    const std::string ours = sha256_file_hex(tokenizer_path);
    if (sha != ours)
        fail("'%s' says its conversations were made with the tokenizer '%s' (SHA-256 %.12s..), not the model's '%s' (%.12s..): make them with "
             "the model's tokenizer (python3 dev/data/sft.py --tokenizer %s --out DIR)", path.c_str(), made_with.c_str(), sha.c_str(),
             tokenizer_path.c_str(), ours.c_str(), tokenizer_path.c_str());
}

// A conversation file must hold something to learn from (training: a token of mask 1) or to measure
// (validation: a token of mask 1 that stands for bytes: bits per byte counts bytes; token_bytes from the tokenizer).
static void sft_check_targets(const ConversationFile& f, bool training, const std::vector<int>& token_bytes) {
    const uint8_t* mask = f.mask();
    const uint32_t* tokens = f.tokens();
    for (uint64_t i = 0; i < f.ntokens; i++)
        if (mask[i] == 1 && (training || (tokens[i] < token_bytes.size() && token_bytes[tokens[i]] > 0))) return;
    if (training)
        fail("conversation file '%s' has no trained tokens (every mask is 0): SFT would learn nothing from it; write it again with dev/data/sft.py "
             "(the assistant's tokens are trained)", f.path.c_str());
    fail("conversation file '%s' has no target tokens (no token of mask 1 that stands for text): its val bpb is undefined; write it again with "
         "dev/data/sft.py", f.path.c_str());
}

// The conversations' identity, which checkpoints record (their "data"): a hash of the bytes of sft_train.bin and
// sft_val.bin (the data trained on and the data measured), whatever their directory is called: each file's
// checksum64 (llmc/safetensors.h, the checkpoints' own), the two mixed by FNV-1a behind a tag.
struct SftIdentity {
    Fnv1a fnv;
    SftIdentity() {
        const char tag[] = "xsa-train SFT conversations 3";
        fnv.mix(tag, sizeof tag);
    }
    void mix(const uint8_t* p, size_t n) {
        const uint64_t sum = checksum64(p, n);
        fnv.mix(&sum, sizeof sum);
    }
};

static std::string sft_data_identity(const ConversationFile& train, const ConversationFile& val) {
    SftIdentity id;
    for (const ConversationFile* f : {&train, &val}) id.mix((const uint8_t*)f->map, f->map_bytes);
    return id.fnv.hex();
}

// The identity of the conversation files DIR/sft_train.bin and DIR/sft_val.bin, read as bytes; "" if one cannot be read
static std::string sft_dir_identity(const std::string& dir) {
    SftIdentity id;
    for (const char* name : {"/sft_train.bin", "/sft_val.bin"}) {
        const int fd = open((dir + name).c_str(), O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0) return "";
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            return "";
        }
        void* map = st.st_size > 0 ? mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
        close(fd);
        if (st.st_size > 0 && map == MAP_FAILED) return "";
        id.mix((const uint8_t*)map, (size_t)st.st_size);
        if (map) munmap(map, (size_t)st.st_size);
    }
    return id.fnv.hex();
}

// The fingerprint checkpoints record before the identity above (until 2026-12-05): sft_train.bin's name, header and size
static std::string sft_legacy_fingerprint(const SftLoader* dl) {
    Fnv1a fnv;
    fingerprint_file(&fnv, dl->file.path);
    return fnv.hex();
}

static std::string data_fingerprint(const SftLoader* dl) { return dl->identity.empty() ? sft_legacy_fingerprint(dl) : dl->identity; }

// --resume: the checkpoint `source` must have been trained on these conversations (DIR of --sft, `dir`): the same
// identity, or for a checkpoint written before identities the same legacy fingerprint (then train->identity is
// set to it, for load_checkpoint's comparison; the caller restores it). The run's own directory, from its
// recorded arguments, is named in the message.
static void sft_check_resume_data(const std::string& source, const std::string& resume_dir, const std::string& dir, SftLoader* train) {
    SafetensorsFile file = safetensors_read(source);
    const std::string recorded = file.metadata.count("data") ? file.meta("data") : "";
    if (recorded == train->identity) return;
    if (recorded == sft_legacy_fingerprint(train)) {
        train->identity = recorded;
        return;
    }
    // the directory the run started on (its recorded --sft), named where its files are still the checkpoint's
    const std::string ran_on = flag_value(recorded_arguments(resume_dir, "chat_sft"), "--sft");
    if (!ran_on.empty() && sft_dir_identity(ran_on) == recorded)
        fail("'%s' was trained on the conversations of '%s', not those of '%s' (their sft_train.bin or sft_val.bin differ): resume with --sft %s, "
             "or add --allow-other-data 1 if the change is intended", source.c_str(), ran_on.c_str(), dir.c_str(), ran_on.c_str());
    fail("'%s' was trained on other conversations than those of '%s' (its data identity %s; these sft_train.bin and sft_val.bin give %s): "
         "resume with --sft and the directory it was trained on, or add --allow-other-data 1 if the change is intended", source.c_str(),
         dir.c_str(), recorded.c_str(), train->identity.c_str());
}

// ----------------------------------------------------------------------------------------------------
// Rank counts and the epoch

static uint64_t loader_data_seed(const SftLoader*) { return 0; }  // SFT's order is nanochat's

static void loader_restore_resharded(SftLoader*, const SafetensorsFile&, int ranks, const std::string& path) {
    fail("'%s' was written by %d ranks, this run has %d; an SFT run resumes only on its number of ranks: --ranks %d", path.c_str(), ranks,
         g_ranks.world, ranks);
}

// The steps of one SFT epoch. nanochat draws each batch one ahead and stops before the step after the one
// whose draw took the last conversation: with L the batch that took it, after ceil((L - 1) / accum) steps.
// Counted by packing a copy of the loader to the end (which also checks every conversation of the epoch);
// with several ranks, the fewest of any rank (nanochat stops all ranks when the first is done).
static int sft_epoch_steps(const SftLoader* train, int accum) {
    SftLoader probe = *train;  // shares the file's mapping, which outlives it
    while (!probe.last_batch) dataloader_next_batch(&probe);
    const long steps = (probe.batches - 1 + accum - 1) / accum;
    long fewest = steps;
    for (const std::vector<int64_t>& r : ranks_gather({steps})) fewest = std::min<long>(fewest, r[0]);
    if (fewest > INT_MAX) fail("one epoch of '%s' is %ld steps; set -n", train->file.path.c_str(), fewest);
    return (int)fewest;
}

// The data read at an update, as nanochat's lr schedule sees it: after the step's batches and the next
// one (drawn ahead), capped at 1 (nanochat's can pass 1 by a few conversations on the last step and make
// its lr slightly negative); the largest over the ranks, so that every rank applies the same update.
static double sft_progress(const SftLoader* train) {
    SftLoader ahead = *train;
    dataloader_next_batch(&ahead);
    std::vector<double> progress(g_ranks.world, 0.0);
    progress[g_ranks.rank] = std::min(1.0, ahead.progress);
    ranks_sum_doubles(progress.data(), progress.size());
    return *std::max_element(progress.begin(), progress.end());
}

// ----------------------------------------------------------------------------------------------------
// The plan and the schedules

// SFT's (nanochat's chat_sft) at update `it`, when `progress` of the data has been read (the fraction of the
// conversations taken, or of the -n steps): lr multiplier linear warmup, flat, linear warmdown to
// final_lr_frac; Muon momentum 0.85 -> 0.95 over the first 300 updates; Muon weight decay constant.
static UpdateSchedule sft_schedule(const OptimConfig& o, int it, double progress) {
    double lrm = 1.0;
    if (progress < o.warmup_ratio) lrm = (progress + 1e-8) / o.warmup_ratio;
    else if (progress > 1.0 - o.warmdown_ratio) {
        const double decay = (progress - (1.0 - o.warmdown_ratio)) / o.warmdown_ratio;
        lrm = (1.0 - decay) * 1.0 + decay * o.final_lr_frac;
    }
    const double frac = std::min(it / 300.0, 1.0);
    return {lrm, (1.0 - frac) * 0.85 + frac * 0.95, o.muon_wd};
}

// The schedules of an SFT step (train_gpt.cu's run_train_step calls it with the loader it trains on)
static UpdateSchedule update_schedule(const OptimConfig& o, const SftLoader* train, int step) { return sft_schedule(o, step, sft_progress(train)); }

// The optimizer settings a checkpoint was written with (optim.* metadata). Exported weights have none: then
// nanochat's defaults (Muon with MuonEq and Muon+, base_train's lrs) and no total batch (0).
static OptimConfig checkpoint_optim_config(const SafetensorsFile& f) {
    OptimConfig o;
    OptimArgs defaults;
    o.given_embedding_lr = defaults.embedding_lr;
    o.given_unembedding_lr = defaults.unembedding_lr;
    o.given_matrix_lr = defaults.matrix_lr;
    o.given_xsa_lr = defaults.xsa_lr;
    if (f.metadata.count("optim.muon_eq") == 0) return o;
    auto flag = [&](const char* key) { return metadata_int(f, key, 0, 1) == 1; };
    auto number = [&](const char* key, double* out) {
        if (f.metadata.count(key)) *out = metadata_double(f, key);
    };
    o.adamw_only = flag("optim.adamw_only");
    o.muon_eq = flag("optim.muon_eq");
    o.muon_plus = flag("optim.muon_plus");
    o.sft = f.metadata.count("optim.sft") && flag("optim.sft");
    o.muon_wd = metadata_double(f, "optim.muon_wd");
    o.num_iterations = (int)metadata_int(f, "optim.num_iterations", 0, INT_MAX);
    number("optim.given_embedding_lr", &o.given_embedding_lr);
    number("optim.given_unembedding_lr", &o.given_unembedding_lr);
    number("optim.given_matrix_lr", &o.given_matrix_lr);
    number("optim.given_xsa_lr", &o.given_xsa_lr);
    if (f.metadata.count("optim.total_batch")) o.total_batch = metadata_int(f, "optim.total_batch", 0, LONG_MAX);
    return o;
}

// SFT's plan (nanochat's chat_sft): the base run's optimizer (`base`: Muon variant or AdamW mode) with the
// lrs its command line gave (unless given here), each x init_lr_frac and scaled by the width rule only
// (nanochat's setup_optimizer, without the batch scaling); the scalar and smear lrs at their flags'
// defaults (nanochat's setup_optimizer defaults: chat_sft does not inherit them); the base run's total
// batch; Muon's weight decay `muon_wd` throughout; num_iterations is set once the data is counted.
static TrainingPlan plan_sft(const GPTConfig& model, const OptimConfig& base, const OptimArgs& flags, const SftArgs& a, double muon_wd) {
    TrainingPlan plan = {};
    OptimConfig& o = plan.optim;
    o.adamw_only = base.adamw_only;
    o.muon_eq = base.muon_eq;
    o.muon_plus = base.muon_plus;
    o.sft = true;
    o.given_embedding_lr = a.embedding_lr >= 0.0 ? a.embedding_lr : base.given_embedding_lr;
    o.given_unembedding_lr = a.unembedding_lr >= 0.0 ? a.unembedding_lr : base.given_unembedding_lr;
    o.given_matrix_lr = a.matrix_lr >= 0.0 ? a.matrix_lr : base.given_matrix_lr;
    o.given_xsa_lr = base.given_xsa_lr;
    plan.total_batch = o.total_batch = a.total_batch > 0 ? a.total_batch : base.total_batch;
    if (plan.total_batch <= 0) fail("the base model's file does not say its total batch (exported weights); give SFT's with -B");
    plan.batch_lr_scale = 1.0;
    plan.dmodel_lr_scale = pow((double)model.n_embd / 768.0, -0.5);
    set_group_lrs(&o, o.given_unembedding_lr, o.given_embedding_lr, flags.scalar_lr, flags.smear_lr, o.given_xsa_lr, o.given_matrix_lr,
                  plan.batch_lr_scale, plan.dmodel_lr_scale, a.init_lr_frac);
    o.muon_wd = muon_wd;
    o.matrix_adamw_wd = flags.adamw_matrix_wd;
    o.warmup_steps = 0;
    o.warmup_ratio = a.warmup_ratio;
    o.warmdown_ratio = a.warmdown_ratio;
    o.final_lr_frac = a.final_lr_frac;
    return plan;
}

