/*
train_gpt.cu: nanochat's GPT with parameterized Exclusive Self-Attention (XSA), and its trainer.

The same source builds two ways (dev/docs/design.md): with g++ as the CPU backend (fp32, OpenMP), and
with nvcc as the CUDA backend (bf16, cuBLASLt, our kernels). Each op lives in the header named after it
(llmc/, and xsa.cuh, muon.cuh, adamw.cuh here), with its CPU version (the readable statement of the
math) beside its CUDA twin. This file reads top to bottom as the model, then the trainer: configuration,
parameters, activations and their memory plan, forward, backward, optimizer, the training step,
evaluation, command line, run set-up, the loop, main. Five parts of it live in llmc/ headers that it
includes where their section would be (they use the model's types): the sharded optimizer's bookkeeping
(zero.cuh), generation (engine.h), CORE's forwards (core_evaluate.h), checkpoints (checkpoint.h) and the
command line it shares with chat/chat_sft.cu (args.h). chat/ builds nanochat's chat half on this file.

Model (nanochat a825e63 and later; every formula in dev/docs/model.md), per token:
  x = norm(wte[idx]);  x = smear(x);  x0 = x
  for each layer i:
    x = resid_lambdas[i] * x + x0_lambdas[i] * x0
    h = norm(x);  q, k, v = h Wq^T, h Wk^T, h Wv^T;  v += 3 sigmoid(h[:12] Wg^T) * ve_i[idx]  (VE layers)
    q, k = 1.2 norm(rope(q)), 1.2 norm(rope(k));  y = causal windowed attention(q, k, v)
    z = y - alpha_h * proj_v(y)  (XSA layers; alpha_h fixed, or tanh(a_h) learned);  x = x + z Wproj^T
    x = x + relu(norm(x) Wfc^T)^2 Wmlp^T
    if i == L/2: x_half = x
  x = norm(x - backout_lambda * x_half);  logits = 15 tanh(x lm_head^T / 15);  loss = cross-entropy
*/
#include <sys/stat.h>
#include <csignal>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

// the model's ops: each header holds the CPU version (plain fp32 loops: read these for the math) and its CUDA twin
#include "llmc/common.h"       // errors (fail), the seeded RNG, deterministic reductions, GradWrite
#include "llmc/matmul.cuh"     // the Linear layers: out = inp W^T (+ residual), and their backward
#include "llmc/norm.cuh"       // RMSNorm without weights
#include "llmc/rotary.cuh"     // rotary embeddings, and rotary fused with QK-norm
#include "llmc/attention.cuh"  // causal sliding-window GQA attention, flash-style, with fused XSA on CUDA
#include "xsa.cuh"             // Exclusive Self-Attention: z = y - alpha proj_v(y), and its diagnostics
#include "llmc/mlp.cuh"        // ReLU^2
#include "llmc/embedding.cuh"  // token and value embeddings, smear, the value-embedding gate
#include "llmc/residual.cuh"   // the residual lambdas' mix and backout
#include "llmc/loss.cuh"       // logit softcap + cross-entropy
#include "muon.cuh"            // Muon for the matrices: Nesterov momentum, Polar Express, NorMuon, cautious WD
#include "adamw.cuh"           // AdamW for embeddings, lm_head and scalars
#include "llmc/backend.cuh"    // one name per op, dispatched to the CPU or CUDA version; backend memory
// the trainer's infrastructure
#include "dataloader.h"        // token shards, BOS-aligned best-fit packing, resumable loader state
#include "llmc/tokenizer.h"    // the tokenizer file: token bytes, BOS, byte lengths for bits per byte
#include "llmc/safetensors.h"  // weights and checkpoint files
#include "llmc/core.h"         // CORE task files, scoring and aggregation
#include "llmc/ranks.cuh"      // data parallelism: forked or launched ranks, their sums (NCCL / shared memory / MPI), stopping together
#include "llmc/logger.h"       // metrics.jsonl: JSON lines built with escaping, written with checks and flushed; progress lines


// ----------------------------------------------------------------------------------------------------
// Configuration: the model's shapes and switches, checked once; as safetensors metadata

static const float QK_SCALE = 1.2f;     // q and k are multiplied by 1.2 after QK-norm (nanochat a825e63)
static const float SOFTCAP = 15.0f;     // logits = 15 tanh(logits / 15)
static const int VOCAB_PAD = 64;        // wte, lm_head and value-embedding tables get ceil(V/64)*64 rows
static const int MAX_PATTERN = 64;
static const int MAX_VOCAB = 1 << 24, MAX_WIDTH = 1 << 16, MAX_SEQ_LEN = 1 << 24;  // sanity bounds (validate_config)

struct GPTConfig {
    int vocab_size = 32768;   // V: the tokenizer's vocabulary; logits are sliced to it
    int padded_vocab = 32768; // V_pad = ceil(V / 64) * 64 rows in the embedding tables and lm_head
    int n_layer = 12;         // L
    int n_head = 12;          // H query heads
    int n_kv_head = 12;       // Hkv key/value heads (GQA when < H)
    int head_dim = 64;        // D
    int n_embd = 768;         // C, the residual width
    int seq_len = 2048;       // T, the training context (sets the long window and the rotary table)
    std::string window_pattern = "SSSL";  // per layer, tiled: 'S' short window, 'L' long (= T); last layer L
    int short_window = 512;   // keys a token sees besides itself in 'S' layers (nanochat: ceil(T/4/128)*128)
    bool value_embeds = true; // value embeddings on alternating layers ending with the last
    bool smear = true;        // mix the previous token's embedding into the current one
    float xsa_alpha = 0.0f;   // XSA strength in [0, 1] (0 when learnable)
    bool xsa_learnable = false;  // -x learn: alpha = tanh(a) per (layer, head), a a parameter starting at 0
    std::vector<bool> xsa_layer;  // per layer: run the XSA op (alpha 0 on a selected layer is exact too)
};

static inline int padded_vocab_size(int V) { return (int)(((long)V + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD); }
// nanochat's ceil(T/4/128)*128 with real division, = ceil(T/512)*128 (rounding T/4 down first would
// give 128 instead of 256 at T = 514)
static inline int default_short_window(int T) { return (int)(((long)T + 511) / 512 * 128); }

static inline bool layer_has_ve(const GPTConfig& c, int l) { return c.value_embeds && l % 2 == (c.n_layer - 1) % 2; }
static inline bool layer_has_xsa(const GPTConfig& c, int l) { return c.xsa_layer[l]; }
// number of earlier keys a query sees in layer l (the last layer is always full)
static inline int layer_window(const GPTConfig& c, int l) {
    if (l == c.n_layer - 1) return c.seq_len;
    char kind = c.window_pattern[l % c.window_pattern.size()];
    return kind == 'L' ? c.seq_len : c.short_window;
}

// Parses a layer selection for XSA: "all", "none", or a comma list of indices ("3"), ranges ("6-11")
// and the deepest k layers ("last:3"). Fails with a message naming the bad part.
static std::vector<bool> parse_layer_spec(const std::string& spec, int n_layer, const char* file = nullptr) {
    const std::string who = file ? std::string("'") + file + "': metadata xsa_layers" : "--xsa-layers";
    std::vector<bool> on(n_layer, false);
    if (spec == "all") return std::vector<bool>(n_layer, true);
    if (spec == "none" || spec.empty()) return on;
    size_t start = 0;
    while (start <= spec.size()) {
        size_t comma = spec.find(',', start);
        std::string part = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
        char* end = nullptr;
        long lo = -1, hi = -1;
        if (part.rfind("last:", 0) == 0) {
            long k = strtol(part.c_str() + 5, &end, 10);
            if (end == part.c_str() + 5 || *end != '\0' || k < 1 || k > n_layer)
                fail("%s: '%s' must be last:K with 1 <= K <= %d (the depth)", who.c_str(), part.c_str(), n_layer);
            lo = n_layer - k;
            hi = n_layer - 1;
        } else {
            lo = strtol(part.c_str(), &end, 10);
            if (end == part.c_str()) fail("%s: '%s' is not a layer index, a range A-B, last:K, all or none", who.c_str(), part.c_str());
            hi = lo;
            if (*end == '-') {
                const char* second = end + 1;
                hi = strtol(second, &end, 10);
                if (end == second) fail("%s: '%s' is not a range A-B", who.c_str(), part.c_str());
            }
            if (*end != '\0') fail("%s: '%s' is not a layer index, a range A-B, last:K, all or none", who.c_str(), part.c_str());
            if (lo < 0 || hi < lo) fail("%s: '%s' is not a valid layer range", who.c_str(), part.c_str());
            if (hi >= n_layer) fail("%s: layer %ld is past the depth (layers are 0..%d)", who.c_str(), hi, n_layer - 1);
        }
        for (long l = lo; l <= hi; l++) on[l] = true;
    }
    return on;
}

static std::string layer_list(const std::vector<bool>& on) {
    std::string out;
    for (size_t l = 0; l < on.size(); l++)
        if (on[l]) out += (out.empty() ? "" : ",") + std::to_string(l);
    return out.empty() ? "none" : out;
}

// Checks the invariants every op relies on; any violation is a user error.
static void validate_config(const GPTConfig& c, const char* file = nullptr) {
    // the culprit: the flags, or the metadata of the file the configuration was read from
    const std::string where = file ? std::string("'") + file + "': metadata " : "";
    auto name = [&](const char* flag, const char* key) { return file ? key : flag; };
    if (c.n_layer < 1 || c.n_layer > 4096) fail("%s%s must be in [1, 4096], got %d", where.c_str(), name("depth", "n_layer"), c.n_layer);
    if (c.n_head < 1 || c.n_kv_head < 1) fail("%s%s and %s must be >= 1", where.c_str(), name("--heads", "n_head"), name("--kv-heads", "n_kv_head"));
    if (c.n_head % c.n_kv_head != 0)
        fail("%s%s %d is not a multiple of %s %d", where.c_str(), name("--heads", "n_head"), c.n_head, name("--kv-heads", "n_kv_head"), c.n_kv_head);
    if (c.head_dim < 2 || c.head_dim % 2 != 0) fail("%s%s must be even (rotary pairs channels), got %d", where.c_str(), name("--head-dim", "head_dim"), c.head_dim);
#ifdef __CUDACC__
    if (c.head_dim != 64 && c.head_dim != 128)
        fail("%sthe CUDA backend's attention takes %s 64 or 128, got %d", where.c_str(), name("--head-dim", "head_dim"), c.head_dim);
#endif
    if (c.n_embd < SMEAR_CHANNELS)
        fail("%s%s must be >= %d (the smear gate reads 24 channels), got %d", where.c_str(), name("--dim", "n_embd"), SMEAR_CHANNELS, c.n_embd);
    if (c.vocab_size < 2 || c.vocab_size > MAX_VOCAB) fail("%sthe vocabulary must have 2 to %d tokens, got %d", where.c_str(), MAX_VOCAB, c.vocab_size);
    // bounds far past any model this trainer can hold, so that no size computed from them can overflow
    if (c.n_embd > MAX_WIDTH || (long)c.n_head * c.head_dim > MAX_WIDTH || (long)c.n_kv_head * c.head_dim > MAX_WIDTH)
        fail("%s%s, and heads x head dim, must be at most %d, got %d and %ld", where.c_str(), name("--dim", "n_embd"), MAX_WIDTH, c.n_embd,
             (long)c.n_head * c.head_dim);
    if (c.seq_len > MAX_SEQ_LEN) fail("%s%s must be at most %d, got %d", where.c_str(), name("--seq-len", "seq_len"), MAX_SEQ_LEN, c.seq_len);
    if (c.seq_len < 1) fail("%s%s must be >= 1, got %d", where.c_str(), name("--seq-len", "seq_len"), c.seq_len);
    if (c.short_window < 0) fail("%s%s must be >= 0, got %d", where.c_str(), name("--short-window", "short_window"), c.short_window);
    if (c.window_pattern.empty() || c.window_pattern.size() > MAX_PATTERN || c.window_pattern.find_first_not_of("SL") != std::string::npos)
        fail("%s%s must be a string of S and L, got '%s'", where.c_str(), name("--window-pattern", "window_pattern"), c.window_pattern.c_str());
    if (!(c.xsa_alpha >= 0.0f && c.xsa_alpha <= 1.0f)) fail("%s%s must be in [0, 1], got %g", where.c_str(), name("-x (XSA alpha)", "xsa_alpha"), c.xsa_alpha);
    if (c.xsa_learnable && c.xsa_alpha != 0.0f) fail("%sa learnable XSA alpha has no fixed value, got xsa_alpha %g", where.c_str(), c.xsa_alpha);
    if ((int)c.xsa_layer.size() != c.n_layer) fail("internal: XSA layer mask has %zu entries for %d layers", c.xsa_layer.size(), c.n_layer);
}

// The model configuration as safetensors metadata (string values; the PyTorch reference writes the same
// keys), so a weights file says which model it belongs to.
static std::map<std::string, std::string> config_to_metadata(const GPTConfig& c) {
    std::string layers = layer_list(c.xsa_layer);
    char alpha[32];
    snprintf(alpha, sizeof alpha, "%.9g", c.xsa_alpha);
    return {{"vocab_size", std::to_string(c.vocab_size)}, {"n_layer", std::to_string(c.n_layer)},
            {"n_head", std::to_string(c.n_head)}, {"n_kv_head", std::to_string(c.n_kv_head)},
            {"head_dim", std::to_string(c.head_dim)}, {"n_embd", std::to_string(c.n_embd)},
            {"seq_len", std::to_string(c.seq_len)}, {"window_pattern", c.window_pattern},
            {"short_window", std::to_string(c.short_window)}, {"value_embeds", c.value_embeds ? "1" : "0"},
            {"smear", c.smear ? "1" : "0"}, {"xsa_alpha", alpha}, {"xsa_learnable", c.xsa_learnable ? "1" : "0"},
            {"xsa_layers", layers == "none" ? "" : layers}};
}

// Numbers in a file's metadata: anything but a whole number in [lo, hi] (or a finite number) is an error
// that names the file and the key.
static long metadata_int(const SafetensorsFile& file, const char* key, long lo, long hi) {
    const std::string v = file.meta(key);
    char* end = nullptr;
    errno = 0;
    const long x = strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
        fail("'%s': metadata %s = '%s' is not an integer in [%ld, %ld]", file.path.c_str(), key, v.c_str(), lo, hi);
    return x;
}

static double metadata_double(const SafetensorsFile& file, const char* key) {
    const std::string v = file.meta(key);
    char* end = nullptr;
    const double x = strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x)) fail("'%s': metadata %s = '%s' is not a finite number", file.path.c_str(), key, v.c_str());
    return x;
}

static GPTConfig config_from_metadata(const SafetensorsFile& file) {
    auto integer = [&](const char* key) { return (int)metadata_int(file, key, 0, INT_MAX); };
    GPTConfig c;
    c.vocab_size = integer("vocab_size");
    c.padded_vocab = padded_vocab_size(c.vocab_size);
    c.n_head = integer("n_head");
    c.n_kv_head = integer("n_kv_head");
    c.head_dim = integer("head_dim");
    c.n_embd = integer("n_embd");
    c.seq_len = integer("seq_len");
    c.window_pattern = file.meta("window_pattern");
    c.short_window = integer("short_window");
    c.value_embeds = integer("value_embeds") != 0;
    c.smear = integer("smear") != 0;
    c.xsa_alpha = (float)metadata_double(file, "xsa_alpha");
    c.xsa_learnable = file.metadata.count("xsa_learnable") && metadata_int(file, "xsa_learnable", 0, 1) == 1;  // absent in older files
    c.n_layer = (int)metadata_int(file, "n_layer", 1, 4096);
    c.xsa_layer = parse_layer_spec(file.meta("xsa_layers"), c.n_layer, file.path.c_str());
    validate_config(c, file.path.c_str());
    return c;
}

// ----------------------------------------------------------------------------------------------------
// Parameters: one allocation, laid out from a table of named tensors (nanochat's state_dict names, so
// safetensors files map one to one); gradients use the same layout. Each tensor's optimizer group, and
// the counts and FLOPs with nanochat's conventions.

struct ParamTensor {
    std::string name;
    std::vector<int64_t> shape;
    size_t offset, numel;
};

struct LayerWeights {
    float* qkv;          // ((H + 2 Hkv) D, C)  W_qkv: c_q, c_k, c_v, adjacent, as one matrix (the one GEMM of q | k | v)
    float* c_q;          // (H*D, C)
    float* c_k;          // (Hkv*D, C)
    float* c_v;          // (Hkv*D, C)
    float* c_proj;       // (C, H*D)
    float* xsa_logit;    // (H)             learnable XSA layers only: alpha_h = tanh(xsa_logit[h])
    float* ve_gate;      // (Hkv, 12)       VE layers only, else nullptr
    float* c_fc;         // (4C, C)
    float* mlp_proj;     // (C, 4C)
    float* value_embed;  // (V_pad, Hkv*D)  VE layers only, else nullptr
};

struct Weights {
    float* wte;              // (V_pad, C)
    float* lm_head;          // (V_pad, C)
    float* resid_lambdas;    // (L)
    float* x0_lambdas;       // (L)
    float* smear_gate;       // (24)  smear only
    float* smear_lambda;     // (1)   smear only
    float* backout_lambda;   // (1)
    std::vector<LayerWeights> h;
};

static std::vector<ParamTensor> param_table(const GPTConfig& c) {
    std::vector<ParamTensor> t;
    size_t offset = 0;
    auto add = [&](const std::string& name, std::vector<int64_t> shape) {
        size_t numel = 1;
        for (int64_t d : shape) numel *= (size_t)d;
        t.push_back({name, shape, offset, numel});
        offset += numel;
    };
    const int64_t C = c.n_embd, Vp = c.padded_vocab, qdim = (int64_t)c.n_head * c.head_dim, kvdim = (int64_t)c.n_kv_head * c.head_dim;
    add("transformer.wte.weight", {Vp, C});
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = "transformer.h." + std::to_string(l) + ".";
        add(p + "attn.c_q.weight", {qdim, C});
        add(p + "attn.c_k.weight", {kvdim, C});
        add(p + "attn.c_v.weight", {kvdim, C});
        add(p + "attn.c_proj.weight", {C, qdim});
        if (c.xsa_learnable && layer_has_xsa(c, l)) add(p + "attn.xsa_logit", {c.n_head});
        if (layer_has_ve(c, l)) add(p + "attn.ve_gate.weight", {c.n_kv_head, VE_GATE_CHANNELS});
        add(p + "mlp.c_fc.weight", {4 * C, C});
        add(p + "mlp.c_proj.weight", {C, 4 * C});
    }
    add("lm_head.weight", {Vp, C});
    add("resid_lambdas", {c.n_layer});
    add("x0_lambdas", {c.n_layer});
    if (c.smear) {
        add("smear_gate.weight", {1, SMEAR_CHANNELS});
        add("smear_lambda", {1});
    }
    add("backout_lambda", {1});
    for (int l = 0; l < c.n_layer; l++)
        if (layer_has_ve(c, l)) add("value_embeds." + std::to_string(l) + ".weight", {Vp, kvdim});
    return t;
}

// Points `w` at the tensors of a buffer laid out by param_table (called for parameters and gradients).
static void point_weights(Weights* w, float* base, const GPTConfig& c, const std::vector<ParamTensor>& table) {
    auto tensor = [&](const std::string& name) -> float* {
        for (const ParamTensor& t : table)
            if (t.name == name) return base + t.offset;
        return nullptr;
    };
    w->wte = tensor("transformer.wte.weight");
    w->lm_head = tensor("lm_head.weight");
    w->resid_lambdas = tensor("resid_lambdas");
    w->x0_lambdas = tensor("x0_lambdas");
    w->smear_gate = tensor("smear_gate.weight");
    w->smear_lambda = tensor("smear_lambda");
    w->backout_lambda = tensor("backout_lambda");
    w->h.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = "transformer.h." + std::to_string(l) + ".";
        LayerWeights& lw = w->h[l];
        lw.qkv = lw.c_q = tensor(p + "attn.c_q.weight");
        lw.c_k = tensor(p + "attn.c_k.weight");
        lw.c_v = tensor(p + "attn.c_v.weight");
        // one GEMM multiplies by the three at once (block_forward_qkv): param_table adds them in a row
        if (lw.c_k != lw.c_q + (size_t)c.n_head * c.head_dim * c.n_embd || lw.c_v != lw.c_k + (size_t)c.n_kv_head * c.head_dim * c.n_embd)
            fail("internal: layer %d's c_q, c_k, c_v are not adjacent", l);
        lw.c_proj = tensor(p + "attn.c_proj.weight");
        lw.xsa_logit = tensor(p + "attn.xsa_logit");
        lw.ve_gate = tensor(p + "attn.ve_gate.weight");
        lw.c_fc = tensor(p + "mlp.c_fc.weight");
        lw.mlp_proj = tensor(p + "mlp.c_proj.weight");
        lw.value_embed = tensor("value_embeds." + std::to_string(l) + ".weight");
    }
}

enum ParamGroup { GROUP_LM_HEAD, GROUP_WTE, GROUP_VE, GROUP_RESID, GROUP_X0, GROUP_SMEAR, GROUP_XSA, GROUP_MATRIX, NUM_GROUPS };
static const char* const GROUP_NAMES[NUM_GROUPS] = {"lm_head", "wte", "value_embeds", "resid_lambdas", "x0_lambdas",
                                                    "smear/backout", "xsa_alpha", "matrices"};

static bool is_xsa_logit(const std::string& name) {
    const std::string suffix = ".attn.xsa_logit";
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

static ParamGroup param_group(const std::string& name) {
    if (is_xsa_logit(name)) return GROUP_XSA;
    if (name == "lm_head.weight") return GROUP_LM_HEAD;
    if (name == "transformer.wte.weight") return GROUP_WTE;
    if (name.rfind("value_embeds.", 0) == 0) return GROUP_VE;
    if (name == "resid_lambdas") return GROUP_RESID;
    if (name == "x0_lambdas") return GROUP_X0;
    if (name.rfind("transformer.h.", 0) == 0) return GROUP_MATRIX;
    return GROUP_SMEAR;  // smear_gate.weight, smear_lambda, backout_lambda
}

// Parameter counts with nanochat's conventions (dev/docs/model.md#parameter-counts)
struct ParamCounts {
    size_t wte, value_embeds, lm_head, transformer_matrices, scalars, total;
    size_t scaling;  // transformer_matrices + lm_head: what the training horizon is computed from
    size_t matmul;   // weights of every linear layer: transformer_matrices + lm_head + smear_gate
};

static ParamCounts count_params(const GPTConfig& config) {
    ParamCounts pc{};
    for (const ParamTensor& t : param_table(config)) {
        if (t.name == "transformer.wte.weight") pc.wte += t.numel;
        else if (t.name == "lm_head.weight") pc.lm_head += t.numel;
        else if (t.name.rfind("value_embeds.", 0) == 0) pc.value_embeds += t.numel;
        else if (t.name.rfind("transformer.h.", 0) == 0 && !is_xsa_logit(t.name)) pc.transformer_matrices += t.numel;
        else pc.scalars += t.numel;
        pc.total += t.numel;
    }
    pc.scaling = pc.transformer_matrices + pc.lm_head;
    pc.matmul = pc.scaling + (config.smear ? SMEAR_CHANNELS : 0);
    return pc;
}

// The buckets of the overlapped gradient reduction, in the order the backward finishes them: 0 lm_head and
// backout_lambda (the backward's first gradients), 1 + (n_layer - 1 - l) layer l's matrices and value
// embedding (done when its backward is), n_layer + 1 the rest (wte, the lambdas, smear: done at the end).
static int gradient_bucket(const std::string& name, int n_layer) {
    if (name == "lm_head.weight" || name == "backout_lambda") return 0;
    for (const char* prefix : {"transformer.h.", "value_embeds."})
        if (name.rfind(prefix, 0) == 0) return 1 + (n_layer - 1 - atoi(name.c_str() + strlen(prefix)));
    return n_layer + 1;
}

// Who updates what when the ranks share the optimizer's work and state (nanochat's ZeRO-2 MuonAdamW; one
// rank: everything): the layout, the gradient buckets of the overlapped reduction, the state gathered for
// a checkpoint and dealt out on resume
#include "llmc/zero.cuh"

// Training FLOPs per token: 6 * matmul params + 12 * H * D * min(window, T) per layer (causality not halved)
static double flops_per_token(const GPTConfig& c) {
    double attention = 0.0;
    for (int l = 0; l < c.n_layer; l++) {
        int window = layer_window(c, l) < c.seq_len ? layer_window(c, l) : c.seq_len;
        attention += 12.0 * c.n_head * c.head_dim * window;
    }
    return 6.0 * (double)count_params(c).matmul + attention;
}

// ----------------------------------------------------------------------------------------------------
// Activations and the memory plan: everything the backward needs for a (B, T) batch, in one allocation,
// laid out by running the same carve-out twice: once to count, once to hand out pointers.

struct LayerActs {
    floatX* x_mix;    // (N, C)      block input after the lambda mix
    float* rstd1;    // (N)
    floatX* h;        // (N, C)      norm(x_mix)
    floatX* qkv;      // (N, (H + 2 Hkv) D)  token n's q | k | v in one row (one GEMM's output); q, k, v point into
                      //             it, their rows qkv_fused(H, Hkv, D) apart
    floatX* q;        // (N, H, D)   in qkv: after rotary, QK-norm and the 1.2 scale
    floatX* k;        // (N, Hkv, D) in qkv: likewise
    floatX* v;        // (N, Hkv, D) in qkv: after the value-embedding mix
    float* q_rstd;   // (N, H)
    float* k_rstd;   // (N, Hkv)
    float* ve_gate;  // (N, Hkv)    3 sigmoid(...), VE layers only
    floatX* y;        // (N, H, D)   attention output
    float* lse;      // (B, H, T)   softmax log-sum-exp per query row
    floatX* z;        // (N, H, D)   after XSA; == y on layers without XSA
    floatX* x_attn;   // (N, C)      x_mix + attention branch
    float* rstd2;    // (N)
    floatX* h2;       // (N, C)      norm(x_attn)
    floatX* fc;       // (N, 4C)     MLP pre-activation
    floatX* act;      // (N, 4C)     relu(fc)^2
    floatX* x_out;    // (N, C)      x_attn + MLP branch
};

struct Acts {
    int* idx;           // (N)
    int* targets;       // (N)     next-token ids, or IGNORE_INDEX: no prediction (SFT's masked positions)
    floatX* emb_norm;    // (N, C)  norm(wte[idx])
    float* emb_rstd;    // (N)
    float* smear_logit; // (N)     smear only
    floatX* x0;          // (N, C)  smear(emb_norm); == emb_norm without smear
    std::vector<LayerActs> layer;
    floatX* x_backout;   // (N, C)  x - backout_lambda * x_out[L/2]
    float* rstd_f;      // (N)
    floatX* x_final;     // (N, C)  norm(x_backout)
    floatX* logits;      // (N, V)  softcapped logits; turned into their gradient by the backward
    float* losses;      // (N)     0 where the target is ignored
    float* loss_scale;  // (1)     grad_scale / targets not ignored (loss_mean_scale), set by the backward
    // backward scratch (shared by all layers); d_q, d_k, d_v in d_qkv (N, (H + 2 Hkv) D), laid out as qkv
    floatX *d_res, *d_x0, *d_backout, *d_h, *d_qkv, *d_q, *d_k, *d_v, *d_z, *d_fc, *d_ve;
    float* d_xsa_alpha;  // (N, H)  per-token shares of dL/dalpha; learnable XSA only
};

// Hands out typed, 256-byte aligned pieces of one allocation; with base == nullptr it only counts bytes.
struct Carver {
    char* base;
    size_t used;
    template <typename T>
    T* take(size_t n) {
        T* p = base ? (T*)(base + used) : nullptr;
        used += (n * sizeof(T) + 255) / 256 * 256;
        return p;
    }
};

static void carve_acts(Acts* a, Carver* cv, const GPTConfig& c, int B, int T) {
    size_t N = (size_t)B * T, C = c.n_embd, qd = (size_t)c.n_head * c.head_dim, kvd = (size_t)c.n_kv_head * c.head_dim;
    auto within = [](floatX* piece, size_t offset) { return piece ? piece + offset : nullptr; };  // null while only counting
    a->idx = cv->take<int>(N);
    a->targets = cv->take<int>(N);
    a->emb_norm = cv->take<floatX>(N * C);
    a->emb_rstd = cv->take<float>(N);
    a->smear_logit = c.smear ? cv->take<float>(N) : nullptr;
    a->x0 = c.smear ? cv->take<floatX>(N * C) : a->emb_norm;
    a->layer.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; l++) {
        LayerActs& la = a->layer[l];
        la.x_mix = cv->take<floatX>(N * C);
        la.rstd1 = cv->take<float>(N);
        la.h = cv->take<floatX>(N * C);
        la.qkv = cv->take<floatX>(N * (qd + 2 * kvd));
        la.q = la.qkv;
        la.k = within(la.qkv, qd);
        la.v = within(la.qkv, qd + kvd);
        la.q_rstd = cv->take<float>(N * c.n_head);
        la.k_rstd = cv->take<float>(N * c.n_kv_head);
        la.ve_gate = layer_has_ve(c, l) ? cv->take<float>(N * c.n_kv_head) : nullptr;
        la.y = cv->take<floatX>(N * qd);
        la.lse = cv->take<float>(N * c.n_head);
        la.z = layer_has_xsa(c, l) ? cv->take<floatX>(N * qd) : la.y;
        la.x_attn = cv->take<floatX>(N * C);
        la.rstd2 = cv->take<float>(N);
        la.h2 = cv->take<floatX>(N * C);
        la.fc = cv->take<floatX>(N * 4 * C);
        la.act = cv->take<floatX>(N * 4 * C);
        la.x_out = cv->take<floatX>(N * C);
    }
    a->x_backout = cv->take<floatX>(N * C);
    a->rstd_f = cv->take<float>(N);
    a->x_final = cv->take<floatX>(N * C);
    a->logits = cv->take<floatX>(N * c.vocab_size);
    a->losses = cv->take<float>(N);
    a->loss_scale = cv->take<float>(1);
    a->d_res = cv->take<floatX>(N * C);
    a->d_x0 = cv->take<floatX>(N * C);
    a->d_backout = cv->take<floatX>(N * C);
    a->d_h = cv->take<floatX>(N * C);
    a->d_qkv = cv->take<floatX>(N * (qd + 2 * kvd));
    a->d_q = a->d_qkv;
    a->d_k = within(a->d_qkv, qd);
    a->d_v = within(a->d_qkv, qd + kvd);
    a->d_z = cv->take<floatX>(N * qd);
    a->d_fc = cv->take<floatX>(N * 4 * C);
    a->d_ve = cv->take<floatX>(N * kvd);
    a->d_xsa_alpha = c.xsa_learnable ? cv->take<float>(N * c.n_head) : nullptr;
}

// What the backend allocates for a model and a (B, seq_len) micro-batch, in bytes: fp32 masters and
// gradients, the matmuls' bf16 copy (CUDA), optimizer state (AdamW: 2 floats per parameter; Muon: 1 per
// parameter + 1 per row or column) and the activations.
struct MemoryPlan {
    double params, grads, matmul_copy, optimizer, acts;
    double total() const { return params + grads + matmul_copy + optimizer + acts; }
};

static MemoryPlan memory_plan(const GPTConfig& c, int B, int optimizer_shards) {
    const ParamCounts pc = count_params(c);
    Acts layout;
    Carver count{nullptr, 0};
    carve_acts(&layout, &count, c, B, c.seq_len);
    // Muon's, as printed (--optimizer adamw keeps 2 floats per matrix element, not about 1); sharded: rank
    // 0's share, the largest
    const size_t optimizer_floats = optimizer_layout(param_table(c), false, optimizer_shards, 0).state_floats;
    const double matmul_copy = sizeof(floatX) == sizeof(float) ? 0.0 : pc.total * (double)sizeof(floatX);
    return {pc.total * 4.0, pc.total * 4.0, matmul_copy, optimizer_floats * 4.0, (double)count.used};
}

// Whether a plan of `bytes` per process fits in `available` bytes (backend_memory_available; 0: unknown,
// taken as fitting): at most 85% of it, the rest left for what the plan does not count (CUDA: scratch,
// cuBLASLt's workspace, the context; CPU: the program, the loader, the OS). The CPU's ranks share one
// machine's memory; each CUDA rank has its own GPU.
static bool plan_fits(double bytes, double available) {
    const double processes = sizeof(floatX) == sizeof(float) ? (double)g_ranks.world : 1.0;  // the CPU backend: fp32 throughout
    return available <= 0.0 || bytes * processes <= 0.85 * available;
}

// The micro-batch rows when -b is not given: the largest of 32 (nanochat's device batch), 16, .., 1 on
// CUDA, of 4, 2, 1 on the CPU, that divides the total batch and whose memory plan fits (plan_fits). The
// plan counts XSA's buffers (a learnable alpha's too) on every layer whether XSA is on or not, so a baseline
// and its XSA runs get the same rows, hence the same data order and validation set. Otherwise 1 (which
// memory_problem may refuse).
static int default_batch(const GPTConfig& c, long total_batch, double available, int optimizer_shards) {
    GPTConfig with_xsa = c;
    with_xsa.xsa_layer.assign(c.n_layer, true);
    with_xsa.xsa_learnable = true;
    with_xsa.xsa_alpha = 0.0f;
    for (int B = sizeof(floatX) == sizeof(float) ? 4 : 32; B > 1; B /= 2)
        if (total_batch % ((long)B * c.seq_len) == 0 && plan_fits(memory_plan(with_xsa, B, optimizer_shards).total(), available)) return B;
    return 1;
}

// What is wrong with a micro-batch whose memory plan does not fit ("" if it fits), with the largest one
// that fits and still divides the total batch: said before anything is allocated.
static std::string memory_problem(const GPTConfig& c, int B, long total_batch, double available, int optimizer_shards) {
    const double need = memory_plan(c, B, optimizer_shards).total(), GiB = 1073741824.0;
    if (plan_fits(need, available)) return "";
    const bool cpu = sizeof(floatX) == sizeof(float);
    char what[400];
    snprintf(what, sizeof what, "%d rows per micro-batch need %.1f GiB of memory%s, more than 85%% of the %.1f GiB %s", B, need / GiB,
             cpu && g_ranks.world > 1 ? (" x " + std::to_string(g_ranks.world) + " ranks").c_str() : "", available / GiB,
             cpu ? "the machine has available" : "the GPU has free");
    char fix[160];
    snprintf(fix, sizeof fix, ", and even -b 1 needs %.1f GiB: a smaller model (-d) or a machine with more memory", memory_plan(c, 1, optimizer_shards).total() / GiB);
    for (int b = B - 1; b >= 1; b--)
        if (total_batch % ((long)b * c.seq_len * g_ranks.world) == 0 && plan_fits(memory_plan(c, b, optimizer_shards).total(), available)) {
            snprintf(fix, sizeof fix, "; -b %d fits (%.1f GiB)", b, memory_plan(c, b, optimizer_shards).total() / GiB);
            break;
        }
    return std::string(what) + fix;
}

// ----------------------------------------------------------------------------------------------------
// The model: parameters, activations and the rotary tables in backend memory; initialisation and weights files

static const int STEP_SUMS = 3;  // GPT::step_sums

struct GPT {
    GPTConfig config;
    std::vector<ParamTensor> table;
    size_t num_params = 0;
    float* params = nullptr;       // fp32 master weights (backend memory)
    float* grads = nullptr;        // accumulated by gpt_backward, cleared by gpt_zero_grad (backend memory)
    floatX* params_mm = nullptr;   // what the matmuls read: a bf16 copy on CUDA, the masters themselves on the CPU
    float* params_host = nullptr;  // host copy for initialisation and files (the masters themselves on the CPU)
    float* grads_host = nullptr;   // host copy of the gradients, filled by gpt_grads_to_host (likewise)
    Weights w, g;                  // views of params and grads
    Weights w_host;                // view of params_host
    int B = 0, T = 0;              // batch shape the activations are laid out for
    char* act_memory = nullptr;    // backend memory
    size_t act_bytes = 0;          // allocated capacity
    Acts acts;
    float* rope_cos = nullptr;     // (T, D/2) backend memory
    float* rope_sin = nullptr;
    int rope_T = 0;
    std::vector<float> losses_host;  // per-token losses of the last gpt_forward, for the mean
    float* xsa_alpha = nullptr;      // (L, H) backend memory: the XSA strength of each layer and query head (a row is read
                                     // on XSA layers only): -x's value, or tanh of the layer's xsa_logit (gpt_refresh_derived_weights)
    float* step_sums = nullptr;      // (3) backend memory, one training step's: [0] the mean loss (summed by the micro-steps),
                                     // [1] the squared norm of the gradient, [2] that of the updated parameters (train_step)
    BackendGraph micro_step_graph;   // the training micro-step (forward, loss, backward) as a CUDA graph
    std::string tokenizer_path, tokenizer_fingerprint;  // the tokenizer of its ids, if known (model_metadata)
#ifdef __CUDACC__
    // the overlapped gradient reduction: while `marking`, the backward records grad_marks[i] on the stream
    // once gradient bucket i is final (gradient_bucket)
    std::vector<cudaEvent_t> grad_marks;
    bool marking = false;
#endif
};

// Says that gradient bucket `bucket` is final (the overlapped reduction may start on it): CUDA, while marking.
static void gpt_mark_gradients(GPT* model, int bucket) {
#ifdef __CUDACC__
    if (model->marking) cudaCheck(cudaEventRecord(model->grad_marks[bucket], g_backend.stream));
#else
    (void)model, (void)bucket;
#endif
}

static void gpt_build(GPT* model, const GPTConfig& config) {
    validate_config(config);
    model->config = config;
    model->table = param_table(config);
    model->num_params = model->table.back().offset + model->table.back().numel;
    const size_t bytes = model->num_params * sizeof(float);
    model->params = (float*)backend_malloc(bytes, "parameters");
    model->grads = (float*)backend_malloc(bytes, "gradients");
    backend_zero(model->params, bytes);
    backend_zero(model->grads, bytes);
    model->step_sums = (float*)backend_malloc(STEP_SUMS * sizeof(float), "step sums");
    const std::vector<float> fixed_alpha((size_t)config.n_layer * config.n_head, config.xsa_alpha);
    model->xsa_alpha = (float*)backend_malloc(fixed_alpha.size() * sizeof(float), "XSA alphas");
    backend_upload(model->xsa_alpha, fixed_alpha.data(), fixed_alpha.size() * sizeof(float));  // a learnable alpha: replaced from the logits
#ifdef __CUDACC__
    model->params_mm = (floatX*)backend_malloc(model->num_params * sizeof(floatX), "bf16 weights");
    model->params_host = (float*)calloc(model->num_params, sizeof(float));
    model->grads_host = (float*)calloc(model->num_params, sizeof(float));
    if (!model->params_host || !model->grads_host) fail("out of host memory for %zu parameters", model->num_params);
#else
    model->params_mm = model->params;
    model->params_host = model->params;
    model->grads_host = model->grads;
#endif
    point_weights(&model->w, model->params, config, model->table);
    point_weights(&model->g, model->grads, config, model->table);
    point_weights(&model->w_host, model->params_host, config, model->table);
}

static void gpt_free(GPT* model) {
    backend_free(model->params);
    backend_free(model->grads);
    backend_free(model->act_memory);
    backend_free(model->rope_cos);
    backend_free(model->rope_sin);
    backend_free(model->step_sums);
    backend_free(model->xsa_alpha);
    backend_graph_reset(&model->micro_step_graph);
#ifdef __CUDACC__
    for (cudaEvent_t e : model->grad_marks) cudaCheck(cudaEventDestroy(e));
    backend_free(model->params_mm);
    free(model->params_host);
    free(model->grads_host);
#endif
    *model = GPT();
}

// The copy of a weight that the matmuls read: params_mm's (bf16 on CUDA; on the CPU the master itself)
static const floatX* matmul_weight(const GPT* model, const float* master) { return model->params_mm + (master - model->params); }

// After the masters changed (optimizer step, loading): refresh what is computed from them: the matmuls'
// bf16 copy (CUDA; on the CPU the matmuls read the masters) and a learnable XSA alpha, tanh of its logits.
static void gpt_refresh_derived_weights(GPT* model) {
#ifdef __CUDACC__
    cast_to_bf16_cuda(model->params_mm, model->params, model->num_params, g_backend.stream);
#endif
    const GPTConfig& c = model->config;
    for (int l = 0; l < c.n_layer; l++)
        if (model->w.h[l].xsa_logit) xsa_alpha_from_logit(model->xsa_alpha + (size_t)l * c.n_head, model->w.h[l].xsa_logit, c.n_head);
}

// params_host -> the backend (after initialisation or loading)
static void gpt_params_to_backend(GPT* model) {
    if (model->params_host != model->params) backend_upload(model->params, model->params_host, model->num_params * sizeof(float));
    gpt_refresh_derived_weights(model);
}

// the backend -> params_host (before writing a file)
static void gpt_params_to_host(const GPT* model) {
    if (model->params_host != model->params) backend_download(model->params_host, model->params, model->num_params * sizeof(float));
}

[[maybe_unused]] static const float* gpt_grads_to_host(const GPT* model) {  // for the tests
    if (model->grads_host != model->grads) backend_download(model->grads_host, model->grads, model->num_params * sizeof(float));
    return model->grads_host;
}

// nanochat's initialisation (dev/docs/model.md#initialisation) with our own seeded RNG, in nanochat's draw order.
static void gpt_init_weights(GPT* model, uint64_t seed) {
    const GPTConfig& c = model->config;
    Rng rng{seed};
    Weights& w = model->w_host;
    const int C = c.n_embd, L = c.n_layer, Vp = c.padded_vocab;
    const size_t qd = (size_t)c.n_head * c.head_dim, kvd = (size_t)c.n_kv_head * c.head_dim;
    const float s = sqrtf(3.0f) / sqrtf((float)C);  // uniform bound with the std of N(0, 1/C)
    fill_normal(w.wte, (size_t)Vp * C, 0.8f, &rng);
    fill_normal(w.lm_head, (size_t)Vp * C, 0.001f, &rng);
    for (int l = 0; l < L; l++) {
        LayerWeights& lw = w.h[l];
        fill_uniform(lw.c_q, qd * C, -s, s, &rng);
        fill_uniform(lw.c_k, kvd * C, -s, s, &rng);
        fill_uniform(lw.c_v, kvd * C, -s, s, &rng);
        fill_uniform(lw.c_fc, (size_t)4 * C * C, -0.4f * s, 0.4f * s, &rng);
        memset(lw.c_proj, 0, (size_t)C * qd * sizeof(float));
        if (lw.xsa_logit) memset(lw.xsa_logit, 0, (size_t)c.n_head * sizeof(float));  // alpha = tanh(0) = 0: the baseline at step 0
        memset(lw.mlp_proj, 0, (size_t)C * 4 * C * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        float frac = (float)l / (float)(L > 1 ? L - 1 : 1);
        w.resid_lambdas[l] = 1.15f - 0.10f * frac;
        w.x0_lambdas[l] = 0.20f - 0.15f * frac;
    }
    if (c.smear) {
        fill_uniform(w.smear_gate, SMEAR_CHANNELS, 0.0f, 0.02f, &rng);
        w.smear_lambda[0] = 0.0f;
    }
    w.backout_lambda[0] = 0.2f;
    for (int l = 0; l < L; l++)
        if (w.h[l].value_embed) fill_uniform(w.h[l].value_embed, (size_t)Vp * kvd, -s, s, &rng);
    for (int l = 0; l < L; l++)
        if (w.h[l].ve_gate) fill_uniform(w.h[l].ve_gate, (size_t)c.n_kv_head * VE_GATE_CHANNELS, 0.0f, 0.02f, &rng);
    gpt_params_to_backend(model);
}

// A checkpoint or weights file never holds a non-finite value: names the first tensor that would.
static void check_weights_finite(const GPT* model, const char* when) {
    for (const ParamTensor& t : model->table) {
        const size_t i = first_non_finite(model->params_host + t.offset, t.numel);
        if (i < t.numel) fail("the weights hold a non-finite value (%g) in %s[%zu] %s; nothing written", model->params_host[t.offset + i], t.name.c_str(), i, when);
    }
}

// Copies every parameter from a safetensors file with nanochat's names; shapes must match exactly.
static void gpt_load_weights(GPT* model, const SafetensorsFile& file) {
    for (const ParamTensor& t : model->table) {
        const SafeTensor* st = file.find(t.name);
        if (!st) fail("'%s' has no tensor '%s' (needed by this model configuration)", file.path.c_str(), t.name.c_str());
        if (st->shape != t.shape) {
            std::string want, got;
            for (int64_t d : t.shape) want += std::to_string(d) + " ";
            for (int64_t d : st->shape) got += std::to_string(d) + " ";
            fail("'%s': tensor '%s' has shape [ %s], the model expects [ %s]", file.path.c_str(), t.name.c_str(), got.c_str(), want.c_str());
        }
        const float* values = file.get_f32(t.name, t.numel);
        const size_t i = first_non_finite(values, t.numel);
        if (i < t.numel) fail("'%s': tensor '%s' holds a non-finite value (%g at index %zu)", file.path.c_str(), t.name.c_str(), values[i], i);
        memcpy(model->params_host + t.offset, values, t.numel * sizeof(float));
    }
    gpt_params_to_backend(model);
}

// What a tokenizer maps ids to: every token's bytes and special flag (not the file's version or sample
// prompts), hashed. Model files record it, so that sample, chat_cli, chat_eval and chat_sft can check a
// tokenizer against them.
static std::string tokenizer_fingerprint(const Tokenizer* tok) {
    Fnv1a fnv;
    for (int i = 0; i < tok->vocab_size; i++) {
        const uint32_t n = (uint32_t)tok->pieces[i].size();
        fnv.mix(&tok->special[i], 1);
        fnv.mix(&n, sizeof n);
        fnv.mix(tok->pieces[i].data(), n);
    }
    return fnv.hex();
}

// The metadata of the model's files (checkpoints and exports): its configuration and, when known, the
// tokenizer its ids belong to (the path the run was given, and its fingerprint).
static std::map<std::string, std::string> model_metadata(const GPT* model) {
    std::map<std::string, std::string> meta = config_to_metadata(model->config);
    if (!model->tokenizer_fingerprint.empty()) {
        meta["tokenizer"] = model->tokenizer_path;
        meta["tokenizer_fingerprint"] = model->tokenizer_fingerprint;
    }
    return meta;
}

// Writes every parameter under its nanochat name, with the configuration as metadata.
static void gpt_save_weights(const GPT* model, const std::string& path) {
    gpt_params_to_host(model);
    check_weights_finite(model, ("for '" + path + "'").c_str());
    std::vector<SafeTensorOut> tensors;
    for (const ParamTensor& t : model->table) tensors.push_back({t.name, "F32", t.shape, model->params_host + t.offset});
    safetensors_write(path, model_metadata(model), tensors);
}

static void gpt_zero_grad(GPT* model) { backend_zero(model->grads, model->num_params * sizeof(float)); }

// The rotary tables (backend memory) for positions 0..T-1, grown when a longer sequence comes
static void gpt_ensure_rope(GPT* model, int T) {
    if (T <= model->rope_T) return;  // the tables for T positions serve every shorter sequence too
    const int D = model->config.head_dim;
    std::vector<float> cos_table((size_t)T * D / 2), sin_table((size_t)T * D / 2);
    rotary_tables(cos_table.data(), sin_table.data(), T, D);
    backend_free(model->rope_cos);
    backend_free(model->rope_sin);
    model->rope_cos = (float*)backend_malloc(cos_table.size() * sizeof(float), "rotary tables");
    model->rope_sin = (float*)backend_malloc(sin_table.size() * sizeof(float), "rotary tables");
    backend_upload(model->rope_cos, cos_table.data(), cos_table.size() * sizeof(float));
    backend_upload(model->rope_sin, sin_table.data(), sin_table.size() * sizeof(float));
    model->rope_T = T;
}

// Lays the activations out for a (B, T) batch, growing the allocation only when it is too small, so
// that sampling (1 row) and evaluation reuse the training batch's memory.
static void gpt_ensure_acts(GPT* model, int B, int T) {
    if (model->act_memory && model->B == B && model->T == T) return;
    const GPTConfig& c = model->config;
    // longer inputs than the training length (CORE prompts) run as nanochat runs them: the long windows
    // become sliding windows of seq_len, up to nanochat's rotary table of 10 x seq_len
    if (T > 10 * c.seq_len) fail("sequence of %d tokens is longer than 10 x --seq-len = %d", T, 10 * c.seq_len);
    Carver count{nullptr, 0};
    carve_acts(&model->acts, &count, c, B, T);
    if (count.used > model->act_bytes) {
        backend_free(model->act_memory);
        model->act_bytes = count.used;
        model->act_memory = (char*)backend_malloc(count.used, "activations");
    }
    Carver assign{model->act_memory, 0};
    carve_acts(&model->acts, &assign, c, B, T);
    model->B = B;
    model->T = T;
    model->losses_host.resize((size_t)B * T);
#ifdef __CUDACC__
    backend_ensure_scratch(backend_scratch_floats((size_t)B * T, c.n_head, c.n_kv_head, c.head_dim));
#endif
    gpt_ensure_rope(model, T);
}

// Makes idx (B, T) and targets (B, T; null for inference) the batch of the next forward: checks the ids,
// lays the activations out, uploads the ids (asynchronously on CUDA) and prepares the embedding backward.
static void gpt_set_batch(GPT* model, const int* idx, const int* targets, int B, int T) {
    const GPTConfig& c = model->config;
    const int V = c.vocab_size;
    const size_t N = (size_t)B * T;
    for (size_t n = 0; n < N; n++) {
        if (idx[n] < 0 || idx[n] >= V) fail("input token id %d at position %zu is outside the vocabulary [0, %d)", idx[n], n, V);
        if (targets && (targets[n] < IGNORE_INDEX || targets[n] >= V))
            fail("target token id %d at position %zu is outside the vocabulary [0, %d) (and not %d, ignored)", targets[n], n, V, IGNORE_INDEX);
    }
    gpt_ensure_acts(model, B, T);
    backend_upload_batch(model->acts.idx, model->acts.targets, idx, targets, N);
    embedding_prepare_backward(idx, N, std::max(c.n_embd, c.n_kv_head * c.head_dim));  // wte or the value embeddings
}

// ----------------------------------------------------------------------------------------------------
// Forward

// Layer l's XSA strengths (H, backend memory), or null on a layer without XSA
static const float* layer_alpha(const GPT* model, int l) {
    return layer_has_xsa(model->config, l) ? model->xsa_alpha + (size_t)l * model->config.n_head : nullptr;
}

// The forward is written in three pieces that generation's decode step (gpt_decode_step, llmc/engine.h)
// shares: a layer's attention inputs, a layer's attention output and MLP, and the head. Each works on the
// first N tokens of the activations (acts), laid out for the batch set last.

// Layer l up to attention: x_mix = the lambda mix of x and x0, h = norm(x_mix), q | k | v = h W_qkv^T (one
// GEMM: N = (H + 2 Hkv) D reads h once), the value embeddings mixed into v (VE layers). q, k before rotary.
static void block_forward_qkv(GPT* model, int l, const floatX* x, size_t N) {
    const GPTConfig& c = model->config;
    Acts& a = model->acts;
    const LayerWeights& lw = model->w.h[l];
    LayerActs& la = a.layer[l];
    const int C = c.n_embd;
    const QKVStrides strides = qkv_fused(c.n_head, c.n_kv_head, c.head_dim);
    backend_phase("forward: lambda mix, norm, q k v, value embeds, rotary + QK-norm");
    lambda_mix_forward(la.x_mix, x, a.x0, &model->w.resid_lambdas[l], &model->w.x0_lambdas[l], N * C);
    rmsnorm_forward(la.h, la.rstd1, la.x_mix, N, C, 1.0f);
    matmul_forward(la.qkv, la.h, matmul_weight(model, lw.qkv), N, C, (int)strides.q);
    if (layer_has_ve(c, l))
        value_embed_forward(la.v, strides.kv, la.ve_gate, la.h, lw.ve_gate, lw.value_embed, a.idx, N, C, c.n_kv_head, c.head_dim);
}

// Layer l after attention: x_attn = x_mix + z W_proj^T, then the MLP branch: x_out = x_attn + MLP(norm(x_attn)).
static void block_forward_output_mlp(GPT* model, int l, size_t N) {
    const GPTConfig& c = model->config;
    const LayerWeights& lw = model->w.h[l];
    LayerActs& la = model->acts.layer[l];
    const int C = c.n_embd, qd = c.n_head * c.head_dim;
    backend_phase("forward: attention output projection");
    matmul_forward_add(la.x_attn, la.z, matmul_weight(model, lw.c_proj), la.x_mix, N, qd, C);
    backend_phase("forward: norm, MLP");
    rmsnorm_forward(la.h2, la.rstd2, la.x_attn, N, C, 1.0f);
    matmul_forward(la.fc, la.h2, matmul_weight(model, lw.c_fc), N, C, 4 * C);
    relu2_forward(la.act, la.fc, N * 4 * C);
    matmul_forward_add(la.x_out, la.act, matmul_weight(model, lw.mlp_proj), la.x_attn, N, 4 * C, C);
}

// After the last layer (its output x): backout, final norm, lm_head (only the first V rows: padded rows
// never reach a logit), softcap, and with targets the loss.
static void gpt_forward_head(GPT* model, const floatX* x, size_t N, bool with_targets) {
    const GPTConfig& c = model->config;
    Acts& a = model->acts;
    const int C = c.n_embd, V = c.vocab_size;
    backend_phase("forward: backout, norm, lm_head, loss");
    backend_copy(a.x_backout, x, N * C * sizeof(floatX));
    scaled_add(a.x_backout, model->w.backout_lambda, -1.0f, a.layer[c.n_layer / 2].x_out, N * C);
    rmsnorm_forward(a.x_final, a.rstd_f, a.x_backout, N, C, 1.0f);
    matmul_forward(a.logits, a.x_final, matmul_weight(model, model->w.lm_head), N, C, V);
    if (with_targets) softcap_crossentropy_forward(a.losses, a.logits, a.targets, N, V, SOFTCAP);
    else softcap(a.logits, N * V, SOFTCAP);
}

// The forward of the batch set last, enqueued on the backend (no host work: a CUDA graph can hold it).
// Leaves every activation the backward needs; with targets, the per-token losses in acts.losses and the
// softcapped logits in acts.logits (B*T, V); without, the softcapped logits.
static void gpt_forward_pass(GPT* model, bool with_targets) {
    const GPTConfig& c = model->config;
    Acts& a = model->acts;
    const Weights& w = model->w;
    const int B = model->B, T = model->T;
    const size_t N = (size_t)B * T;
    const int C = c.n_embd, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    const QKVStrides strides = qkv_fused(H, Hkv, D);

    // embedding, norm, smear (backend_phase: the benchmark's breakdown of the step; nothing otherwise)
    backend_phase("forward: embedding, norm, smear");
    embedding_forward(a.emb_norm, a.idx, w.wte, N, C);
    rmsnorm_forward(a.emb_norm, a.emb_rstd, a.emb_norm, N, C, 1.0f);
    if (c.smear) smear_forward(a.x0, a.smear_logit, a.emb_norm, w.smear_gate, w.smear_lambda, B, T, C);

    const floatX* x = a.x0;
    for (int l = 0; l < c.n_layer; l++) {
        LayerActs& la = a.layer[l];
        block_forward_qkv(model, l, x, N);
        rotary_rmsnorm_forward(la.q, strides.q, la.q_rstd, model->rope_cos, model->rope_sin, B, T, H, D, QK_SCALE);
        rotary_rmsnorm_forward(la.k, strides.kv, la.k_rstd, model->rope_cos, model->rope_sin, B, T, Hkv, D, QK_SCALE);
        backend_phase("forward: attention (+ XSA)");
        attention_xsa_forward(la.z, la.y, la.lse, la.q, la.k, la.v, strides, B, T, H, Hkv, D, layer_window(c, l), layer_alpha(model, l));
        block_forward_output_mlp(model, l, N);
        x = la.x_out;
    }
    gpt_forward_head(model, x, N, with_targets);
}

// Runs the model on idx (B, T): gpt_set_batch, then gpt_forward_pass. With targets, returns the mean loss
// over the targets not ignored (0 if all are) and leaves the per-token losses in model->losses_host (a
// synchronisation on CUDA); else NAN.
static float gpt_forward(GPT* model, const int* idx, const int* targets, int B, int T) {
    gpt_set_batch(model, idx, targets, B, T);
    gpt_forward_pass(model, targets != nullptr);
    if (!targets) return NAN;
    const size_t N = (size_t)B * T;
    backend_download(model->losses_host.data(), model->acts.losses, N * sizeof(float));
    double sum = 0.0;
    size_t count = 0;
    for (size_t n = 0; n < N; n++) {
        sum += model->losses_host[n];
        count += targets[n] != IGNORE_INDEX;
    }
    return (float)(sum / (double)std::max<size_t>(count, 1));
}

// ----------------------------------------------------------------------------------------------------
// Backward

// Accumulates into model->grads the gradient of grad_scale * (mean loss of the last forward, over the targets
// not ignored). Use grad_scale = 1 / accumulation_steps to average micro-batches. Consumes acts.logits; leaves
// grad_scale / (targets not ignored) in acts.loss_scale.
static void gpt_backward(GPT* model, float grad_scale) {
    const GPTConfig& c = model->config;
    Acts& a = model->acts;
    const Weights& w = model->w;
    Weights& g = model->g;
    const int B = model->B, T = model->T;
    const size_t N = (size_t)B * T;
    const int C = c.n_embd, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim, V = c.vocab_size;
    const int qd = H * D, kvd = Hkv * D;
    const QKVStrides strides = qkv_fused(H, Hkv, D);
    const int backout_layer = c.n_layer / 2;

    // loss -> logits -> final norm -> backout
    backend_phase("backward: loss, lm_head, norm, backout");
    loss_mean_scale(a.loss_scale, a.targets, N, grad_scale);
    softcap_crossentropy_backward(a.logits, a.targets, N, V, SOFTCAP, a.loss_scale);
    matmul_backward(a.d_h, g.lm_head, a.logits, a.x_final, matmul_weight(model, w.lm_head), N, C, V, GRAD_OVERWRITE);
    rmsnorm_backward(a.d_backout, a.d_h, a.x_final, a.rstd_f, N, C, 1.0f, GRAD_OVERWRITE);
    dot_accumulate(g.backout_lambda, -1.0f, a.d_backout, a.layer[backout_layer].x_out, N * C);
    backend_copy(a.d_res, a.d_backout, N * C * sizeof(floatX));
    backend_zero(a.d_x0, N * C * sizeof(floatX));  // every layer's lambda mix adds to it
    gpt_mark_gradients(model, gradient_bucket("lm_head.weight", c.n_layer));

    for (int l = c.n_layer - 1; l >= 0; l--) {
        const LayerWeights& lw = w.h[l];
        LayerWeights& lg = g.h[l];
        LayerActs& la = a.layer[l];
        // d_res holds dL/d(x_out of layer l); the backout also read this layer's output
        if (l == backout_layer) scaled_add(a.d_res, w.backout_lambda, -1.0f, a.d_backout, N * C);

        // MLP branch: x_out = x_attn + relu(h2 Wfc^T)^2 Wmlp^T
        backend_phase("backward: MLP, norm");
        matmul_backward(a.d_fc, lg.mlp_proj, a.d_res, la.act, matmul_weight(model, lw.mlp_proj), N, 4 * C, C, GRAD_OVERWRITE);
        relu2_backward(a.d_fc, a.d_fc, la.fc, N * 4 * C);
        matmul_backward(a.d_h, lg.c_fc, a.d_fc, la.h2, matmul_weight(model, lw.c_fc), N, C, 4 * C, GRAD_OVERWRITE);
        rmsnorm_backward(a.d_res, a.d_h, la.h2, la.rstd2, N, C, 1.0f, GRAD_ACCUMULATE);  // d_res: dL/dx_attn

        // attention branch: x_attn = x_mix + z Wproj^T
        backend_phase("backward: attention output projection");
        matmul_backward(a.d_z, lg.c_proj, a.d_res, la.z, matmul_weight(model, lw.c_proj), N, qd, C, GRAD_OVERWRITE);
        backend_phase("backward: attention (+ XSA)");
        attention_xsa_backward(a.d_q, a.d_k, a.d_v, lg.xsa_logit ? a.d_xsa_alpha : nullptr, a.d_z, la.q, la.k, la.v, strides, la.y, la.lse, B,
                               T, H, Hkv, D, layer_window(c, l), layer_alpha(model, l));
        if (lg.xsa_logit) xsa_alpha_backward(lg.xsa_logit, a.d_xsa_alpha, layer_alpha(model, l), N, H);
        backend_phase("backward: rotary + QK-norm, q k v, value embeds, norm, lambda mix");
        // in place: d_q, d_k become the gradients of the rotary's inputs, so d_qkv is that of h W_qkv^T
        rotary_rmsnorm_backward(a.d_q, a.d_q, la.q, strides.q, la.q_rstd, model->rope_cos, model->rope_sin, B, T, H, D, QK_SCALE);
        rotary_rmsnorm_backward(a.d_k, a.d_k, la.k, strides.kv, la.k_rstd, model->rope_cos, model->rope_sin, B, T, Hkv, D, QK_SCALE);
        matmul_backward(a.d_h, lg.qkv, a.d_qkv, la.h, matmul_weight(model, lw.qkv), N, C, qd + 2 * kvd, GRAD_OVERWRITE);
        if (layer_has_ve(c, l)) {  // after the matmul: it adds the gate's gradient to d_h[:, :12]
            value_embed_backward(a.d_ve, a.d_h, lg.ve_gate, a.d_v, strides.kv, la.ve_gate, la.h, lw.ve_gate, lw.value_embed, a.idx, N, C, Hkv, D);
            embedding_backward(lg.value_embed, a.idx, a.d_ve, N, kvd);
        }
        rmsnorm_backward(a.d_res, a.d_h, la.h, la.rstd1, N, C, 1.0f, GRAD_ACCUMULATE);  // d_res: dL/dx_mix

        // x_mix = resid_lambda * x_in + x0_lambda * x0; afterwards d_res: dL/dx_in
        const floatX* x_in = l == 0 ? a.x0 : a.layer[l - 1].x_out;
        lambda_mix_backward(a.d_res, a.d_x0, &g.resid_lambdas[l], &g.x0_lambdas[l], x_in, a.x0, &w.resid_lambdas[l], &w.x0_lambdas[l], N * C);
        gpt_mark_gradients(model, gradient_bucket("transformer.h." + std::to_string(l) + ".", c.n_layer));
    }
    add_inplace(a.d_x0, a.d_res, N * C);  // layer 0 reads x0 as its input too

    // smear, embedding norm, wte
    backend_phase("backward: smear, norm, embedding");
    floatX* d_emb_norm = a.d_x0;
    if (c.smear) {
        backend_zero(a.d_res, N * C * sizeof(floatX));
        smear_backward(a.d_res, g.smear_gate, g.smear_lambda, a.d_x0, a.emb_norm, a.smear_logit, w.smear_gate, w.smear_lambda, B, T, C);
        d_emb_norm = a.d_res;
    }
    rmsnorm_backward(a.d_h, d_emb_norm, a.emb_norm, a.emb_rstd, N, C, 1.0f, GRAD_OVERWRITE);
    embedding_backward(g.wte, a.idx, a.d_h, N, C);
}

// ----------------------------------------------------------------------------------------------------
// Optimizer: nanochat's MuonAdamW. Muon for every block matrix, AdamW for embeddings, lm_head and
// scalars, each AdamW group with its own lr, betas and weight decay; --optimizer adamw trains the block
// matrices with AdamW too (the original XSA paper's setting). Then the schedules and the training plan.

// AdamW settings per group (dev/docs/optim.md#parameter-groups); the matrix column applies in --optimizer adamw mode only
// (the XSA logits' group, not in nanochat: modded-nanogpt's Adam settings for scalars, no weight decay)
static const float ADAM_BETA1[NUM_GROUPS] = {0.8f, 0.8f, 0.8f, 0.8f, 0.96f, 0.8f, 0.8f, 0.9f};
static const float ADAM_BETA2[NUM_GROUPS] = {0.96f, 0.995f, 0.995f, 0.95f, 0.95f, 0.95f, 0.95f, 0.95f};
static const float ADAM_WD[NUM_GROUPS] = {0.01f, 0.001f, 0.01f, 0.05f, 0.0f, 0.0f, 0.0f, -1.0f /* --adamw-matrix-wd */};
static const float ADAM_EPS = 1e-10f;

struct OptimConfig {
    bool adamw_only = false;      // --optimizer adamw
    bool muon_eq = true;          // MuonEq row equilibration (nanochat HEAD; off in March-June 2026)
    bool muon_plus = true;        // Muon+ renormalisation (likewise)
    // The lrs, weight decays and ratios are doubles, as the Python floats nanochat computes its schedules with (a float
    // ratio can round another way: 0.65f * 150 = 97.4999 gives a warmdown of 97 steps, round(0.65 * 150) = 98); each
    // update's values become fp32 only when applied, as nanochat's fp32 step tensors are filled.
    double lr[NUM_GROUPS] = {};   // peak learning rate of each group (after the batch and width scaling)
    double muon_wd = 0.0;         // peak of Muon's cosine-scheduled cautious weight decay
    float matrix_adamw_wd = 0.1f; // constant AdamW weight decay of the matrices in --optimizer adamw mode
    // schedules (dev/docs/optim.md#schedules)
    int num_iterations = 1;
    int warmup_steps = 40;
    double warmdown_ratio = 0.65;
    double final_lr_frac = 0.05;
    int momentum_warmup_steps = 400;
    // SFT (dev/docs/optim.md#sft): the lr multiplier follows the fraction of the data read, from warmup_ratio
    // of it to the warmdown over the last warmdown_ratio; Muon's weight decay is muon_wd throughout
    bool sft = false;
    double warmup_ratio = 0.0;
    // what an SFT run inherits from this run (nanochat's chat_sft reads the base run's command line): the
    // lrs as given, before the batch scaling, and the total batch
    double given_embedding_lr = 0.0, given_unembedding_lr = 0.0, given_matrix_lr = 0.0, given_xsa_lr = 0.0;
    long total_batch = 0;
};

// The warmdown's length: Python's round(warmdown_ratio * N), half to even (nearbyint in the default rounding mode)
static int warmdown_steps(const OptimConfig& o) { return (int)nearbyint(o.warmdown_ratio * o.num_iterations); }

// lr multiplier at update `it` of N: linear warmup, flat, then linear warmdown to final_lr_frac. Each
// expression is nanochat's, operation for operation, so that the doubles agree to the last bit.
static double lr_multiplier(const OptimConfig& o, int it) {
    const int N = o.num_iterations, W = warmdown_steps(o);
    if (it < o.warmup_steps) return (double)(it + 1) / o.warmup_steps;
    if (it <= N - W) return 1.0;
    const double p = (double)(N - it) / W;
    return p * 1.0 + (1.0 - p) * o.final_lr_frac;
}

// Muon momentum: 0.85 -> 0.97 over the momentum warmup, then 0.97 -> 0.90 across the lr warmdown.
static double muon_momentum(const OptimConfig& o, int it) {
    const int N = o.num_iterations, W = warmdown_steps(o);
    if (it < o.momentum_warmup_steps) {
        const double frac = (double)it / o.momentum_warmup_steps;
        return (1.0 - frac) * 0.85 + frac * 0.97;
    }
    if (it >= N - W) {
        const double p = (double)(it - (N - W)) / W;
        return 0.97 * (1.0 - p) + 0.90 * p;
    }
    return 0.97;
}

// Muon weight decay: cosine from the peak at it = 0 to 0 at it = N.
static double muon_weight_decay(const OptimConfig& o, int it) {
    return o.muon_wd * 0.5 * (1.0 + cos(M_PI * it / o.num_iterations));
}

// The scheduled values of one update: the lr multiplier, Muon's momentum and weight decay
struct UpdateSchedule {
    double lrm, momentum, muon_wd;
};

// base training's schedules at update `it`
static UpdateSchedule base_schedule(const OptimConfig& o, int it) { return {lr_multiplier(o, it), muon_momentum(o, it), muon_weight_decay(o, it)}; }

// the schedules of a step on token shards: base training's (train_step; SFT's: chat/sft.h)
static UpdateSchedule update_schedule(const OptimConfig& o, const DataLoader*, int it) { return base_schedule(o, it); }

// A Muon group: every block matrix of one shape (nanochat's groups), with its momentum and NorMuon state
// stacked, (K, rows, cols) and (K, rows or cols), so the CUDA backend updates the group in one go. Sharded,
// the matrices of the group this rank updates.
struct MuonStack {
    int rows = 0, cols = 0;
    std::vector<size_t> tensors;  // indices into model->table, in table order
    float* momentum = nullptr;    // (K, rows, cols), inside Optimizer::state
    float* second = nullptr;      // (K, normuon_state_size(rows, cols)), likewise
#ifdef __CUDACC__
    float** params = nullptr;     // device arrays of the K parameter and gradient pointers
    float** grads = nullptr;
    MuonScratch scratch;
#endif
};

struct Optimizer {
    OptimConfig config;
    OptimizerLayout layout;           // who updates what (one rank: everything)
    int shards = 1;                   // the ranks sharing the work
    std::vector<ParamGroup> group;    // per parameter tensor (model->table order)
    std::vector<float*> m, v;         // per tensor: the AdamW moments of its elements this rank updates, or its slices of its Muon stack
    std::vector<MuonStack> stacks;
    float* state = nullptr;           // backend memory behind m, v and the stacks: this rank's share
    std::vector<RankRange> norm_spans; // the gradient this rank adds into the gradient norm (its own, and rank 0 the replicated)
    StreamSpan timer;                 // a step's gradient sums, update and gathering of the parameters
    // the overlapped gradient reduction (CUDA, several ranks; optimizer_overlap_reduction): the gradient in the
    // buckets of gradient_bucket, each reduced on a second stream once the last micro-step's backward has
    // finished it, while the backward goes on
    bool overlap = false;
    std::vector<std::vector<RankRange>> buckets;  // what each bucket sums, and for which rank
#ifdef __CUDACC__
    cudaStream_t comm = nullptr;
    cudaEvent_t backward_done = nullptr, reduced = nullptr;
#endif
    std::vector<float> work;          // CPU Muon scratch, the size of the largest matrix
    int step = 0;                     // updates applied so far
};

static bool uses_muon(const Optimizer* opt, size_t i) { return opt->layout.muon[i]; }

// The optimizer, its work and state shared by `shards` ranks (1: every rank does all of it).
static void optimizer_init(Optimizer* opt, const GPT* model, const OptimConfig& config, int shards = 1) {
    opt->config = config;
    opt->shards = shards;
    opt->layout = optimizer_layout(model->table, config.adamw_only, shards, shards > 1 ? g_ranks.rank : 0);
    const OptimizerLayout& L = opt->layout;
    const size_t n = model->table.size();
    opt->group.resize(n);
    for (size_t i = 0; i < n; i++) opt->group[i] = param_group(model->table[i].name);
    opt->state = (float*)backend_malloc(std::max<size_t>(L.state_floats, 1) * sizeof(float), "optimizer state");
    backend_zero(opt->state, L.state_floats * sizeof(float));
    opt->m.assign(n, nullptr);
    opt->v.assign(n, nullptr);
    for (size_t i = 0; i < n; i++)
        if (L.own_end[i] > L.own_begin[i]) {
            opt->m[i] = opt->state + L.state_m[i];
            opt->v[i] = opt->state + L.state_v[i];
        }
    size_t largest = 0;
    for (const std::vector<size_t>& group : L.groups) {
        MuonStack st;
        st.rows = (int)model->table[group[0]].shape[0];
        st.cols = (int)model->table[group[0]].shape[1];
        for (size_t i : group)
            if (opt->m[i]) st.tensors.push_back(i);
        if (st.tensors.empty()) continue;  // none of this group is this rank's
        st.momentum = opt->m[st.tensors[0]];
        st.second = opt->v[st.tensors[0]];
        largest = std::max(largest, model->table[group[0]].numel);
#ifdef __CUDACC__
        const size_t K = st.tensors.size();
        std::vector<float*> p(K), g(K);
        for (size_t k = 0; k < K; k++) {
            p[k] = model->params + model->table[st.tensors[k]].offset;
            g[k] = model->grads + model->table[st.tensors[k]].offset;
        }
        st.params = (float**)backend_malloc(K * sizeof(float*), "Muon pointers");
        st.grads = (float**)backend_malloc(K * sizeof(float*), "Muon pointers");
        backend_upload(st.params, p.data(), K * sizeof(float*));
        backend_upload(st.grads, g.data(), K * sizeof(float*));
        muon_scratch_alloc(&st.scratch, (int)K, st.rows, st.cols);
#endif
        opt->stacks.push_back(st);
    }
    opt->norm_spans.clear();
    for (const RankRange& r : L.owners)
        if (r.owner == g_ranks.rank || (r.owner < 0 && g_ranks.rank == 0) || shards == 1) {
            if (!opt->norm_spans.empty() && opt->norm_spans.back().end == r.begin) opt->norm_spans.back().end = r.end;
            else opt->norm_spans.push_back({r.begin, r.end, g_ranks.rank});
        }
    opt->work.assign(largest, 0.0f);
    opt->step = 0;
}

// Turns on the overlapped gradient reduction (CUDA with several ranks; elsewhere nothing to overlap).
static void optimizer_overlap_reduction(Optimizer* opt, GPT* model) {
#ifdef __CUDACC__
    if (g_ranks.world == 1) return;
    const int L = model->config.n_layer;
    opt->buckets = zero_gradient_buckets(opt->layout, model->table, L, opt->shards);
    model->grad_marks.assign(L + 1, nullptr);
    for (cudaEvent_t& e : model->grad_marks) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&opt->backward_done, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&opt->reduced, cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithFlags(&opt->comm, cudaStreamNonBlocking));
    opt->overlap = true;
#else
    (void)opt, (void)model;
#endif
}

static void optimizer_free(Optimizer* opt) {
#ifdef __CUDACC__
    for (MuonStack& st : opt->stacks) {
        backend_free(st.params);
        backend_free(st.grads);
        muon_scratch_free(&st.scratch);
    }
    if (opt->overlap) {
        cudaCheck(cudaEventDestroy(opt->backward_done));
        cudaCheck(cudaEventDestroy(opt->reduced));
        cudaCheck(cudaStreamDestroy(opt->comm));
    }
#endif
    backend_free(opt->state);
    stream_span_free(&opt->timer);
    *opt = Optimizer();
}

// The ranks' gradients summed where this rank needs them: all of them (one rank updates everything), or
// the parts it updates (sharded: the other parts keep this rank's own gradient). Overlapped (CUDA), the
// backward of the last micro-step has just been enqueued with its marks: each bucket's reduction is
// enqueued on the second stream behind its mark, and the main stream waits for the last.
static void optimizer_reduce_gradients(const Optimizer* opt, GPT* model) {
#ifdef __CUDACC__
    if (opt->overlap) {
        cudaCheck(cudaEventRecord(opt->backward_done, g_backend.stream));
        for (size_t b = 0; b < opt->buckets.size(); b++) {
            cudaCheck(cudaStreamWaitEvent(opt->comm, b < model->grad_marks.size() ? model->grad_marks[b] : opt->backward_done, 0));
            ranks_exchange_floats_on(model->grads, opt->buckets[b], RANKS_REDUCE, opt->comm);
        }
        cudaCheck(cudaEventRecord(opt->reduced, opt->comm));
        cudaCheck(cudaStreamWaitEvent(g_backend.stream, opt->reduced, 0));
        return;
    }
#endif
    if (opt->shards == 1) ranks_sum_floats(model->grads, model->num_params);
    else ranks_exchange_floats(model->grads, opt->layout.owners, RANKS_REDUCE);
}

// out[0] = the squared L2 norm of the summed gradient over every parameter, on every rank (sharded: each
// rank adds its parts, then the ranks' partial sums are summed).
static void gradient_sum_squares(const Optimizer* opt, const GPT* model, float* out) {
    backend_zero(out, sizeof(float));
    for (const RankRange& r : opt->norm_spans) dot_accumulate(out, 1.0f, model->grads + r.begin, model->grads + r.begin, r.end - r.begin);
    if (opt->shards > 1) ranks_sum_floats(out, 1);
}

// Applies update number opt->step to every parameter from the accumulated gradients, with the schedules'
// values `s` (AdamW's bias correction counts opt->step + 1 updates). Sharded, each rank updates its parts and
// then takes the others' from their ranks.
static void optimizer_step(Optimizer* opt, GPT* model, const UpdateSchedule& s) {
    const OptimConfig& c = opt->config;
    const OptimizerLayout& L = opt->layout;
    const int it = opt->step;
    // fp32 from here on, as nanochat fills its step tensors: each group's lr = (initial lr x lrm) rounded once
    const float momentum = (float)s.momentum, wd = (float)s.muon_wd;
    for (size_t i = 0; i < model->table.size(); i++) {
        if (uses_muon(opt, i) || L.own_end[i] == L.own_begin[i]) continue;
        const ParamTensor& t = model->table[i];
        const ParamGroup grp = opt->group[i];
        const float lr = (float)(c.lr[grp] * s.lrm), group_wd = grp == GROUP_MATRIX ? c.matrix_adamw_wd : ADAM_WD[grp];
        float* p = model->params + t.offset + L.own_begin[i];
        const float* g = model->grads + t.offset + L.own_begin[i];
        const size_t n = L.own_end[i] - L.own_begin[i];
        CUDA_OR_CPU(adamw_update_cuda(p, g, opt->m[i], opt->v[i], n, lr, ADAM_BETA1[grp], ADAM_BETA2[grp], ADAM_EPS, group_wd, it + 1,
                                      g_backend.stream),
                    adamw_update_cpu(p, g, opt->m[i], opt->v[i], n, lr, ADAM_BETA1[grp], ADAM_BETA2[grp], ADAM_EPS, group_wd, it + 1));
    }
    const float lr = (float)(c.lr[GROUP_MATRIX] * s.lrm);
    for (MuonStack& st : opt->stacks) {
#ifdef __CUDACC__
        muon_update_cuda(st.params, st.grads, st.momentum, st.second, &st.scratch, lr, momentum, wd, c.muon_eq, c.muon_plus, g_backend.stream);
#else
        for (size_t i : st.tensors) {
            const ParamTensor& t = model->table[i];
            muon_update_cpu(model->params + t.offset, model->grads + t.offset, opt->m[i], opt->v[i], opt->work.data(), st.rows, st.cols, lr,
                            momentum, wd, c.muon_eq, c.muon_plus);
        }
#endif
    }
    if (opt->shards > 1) ranks_exchange_floats(model->params, L.owners, RANKS_BROADCAST);
    gpt_refresh_derived_weights(model);
    opt->step++;
}

// One update's time in ms, for the estimate, without changing the run: each Muon shape's update timed on copies of
// one of its tensors (x the tensors of that shape this rank updates), AdamW on copies of its largest tensor
// (memory-bound: x the elements this rank updates over that tensor's). The ranks' sums and gathers are not
// counted. CPU backend; on CUDA 0 (an update is a few ms there against seconds of micro-steps: not timed).
static double optimizer_estimate_ms(const Optimizer* opt, const GPT* model) {
#ifdef __CUDACC__
    (void)opt, (void)model;
    return 0.0;
#else
    const OptimConfig& c = opt->config;
    const OptimizerLayout& L = opt->layout;
    double ms = 0.0;
    std::vector<float> work(opt->work.size());
    for (const MuonStack& st : opt->stacks) {
        const ParamTensor& t = model->table[st.tensors[0]];
        std::vector<float> p(model->params + t.offset, model->params + t.offset + t.numel), m(t.numel, 0.0f);
        std::vector<float> s(normuon_state_size(st.rows, st.cols), 0.0f);
        const double t0 = wall_ms();
        muon_update_cpu(p.data(), model->grads + t.offset, m.data(), s.data(), work.data(), st.rows, st.cols, 0.01f, 0.95f, 0.0f,
                        c.muon_eq, c.muon_plus);
        ms += (wall_ms() - t0) * st.tensors.size();
    }
    size_t largest = 0, n = 0, elements = 0;  // of the AdamW tensors this rank updates: the largest, its part, all parts
    for (size_t i = 0; i < model->table.size(); i++) {
        const size_t part = uses_muon(opt, i) ? 0 : L.own_end[i] - L.own_begin[i];
        elements += part;
        if (part > n) largest = i, n = part;
    }
    if (n > 0) {
        const size_t at = model->table[largest].offset + L.own_begin[largest];
        std::vector<float> p(model->params + at, model->params + at + n), m(n, 0.0f), v(n, 0.0f);
        const double t0 = wall_ms();
        adamw_update_cpu(p.data(), model->grads + at, m.data(), v.data(), n, 0.01f, 0.9f, 0.95f, 1e-10f, 0.0f, 1);
        ms += (wall_ms() - t0) * (double)elements / (double)n;
    }
    return ms;
#endif
}

// The whole optimizer state in the checkpoints' layout, on rank 0 (zero_gather_state); every rank calls it.
static std::vector<float> optimizer_full_state(const Optimizer* opt, GPT* model) {
    return zero_gather_state(opt->layout, model->table, opt->m, opt->v, model->grads, opt->shards);
}

// Loads this rank's part of a whole optimizer state (checkpoint layout) read from `source`.
static void optimizer_load_state(Optimizer* opt, const GPT* model, const SafetensorsFile& f, const std::string& source) {
    const float* full = f.get_f32("optimizer.state", opt->layout.full_state_floats);
    if (first_non_finite(full, opt->layout.full_state_floats) < opt->layout.full_state_floats)
        fail("'%s': optimizer.state holds a non-finite value", source.c_str());
    zero_scatter_state(opt->layout, model->table, opt->m, opt->v, full);
}

// The training plan (dev/docs/optim.md#the-training-plan): the horizon from the param:data ratio, the batch
// size from the Power Lines rule, and the lr / weight-decay transfer from the d12 reference. The base
// values are nanochat's defaults.
struct OptimArgs {
    std::string optimizer = "muon";
    bool muon_eq = true, muon_plus = true;
    double embedding_lr = 0.3, unembedding_lr = 0.008, matrix_lr = 0.02, scalar_lr = 0.5, smear_lr = 0.2;
    double xsa_lr = 0.04;         // learnable XSA alpha (not in nanochat: modded-nanogpt's Adam lr for scalars)
    double weight_decay = 0.28;   // Muon, at the d12 reference; transferred by the T_epoch rule
    double adamw_matrix_lr = 0.003, adamw_matrix_wd = 0.1;
    double param_data_ratio = 12.0;
    long total_batch = -1;        // tokens per update; -1 = the Power Lines rule
    int num_iterations = -1;      // -1 = target tokens / batch
    int warmup_steps = 40;
    double warmdown_ratio = 0.65, final_lr_frac = 0.05;
    int momentum_warmup_steps = 400;
};

struct TrainingPlan {
    double target_tokens;   // ratio x scaling params
    double reference_tokens; // the same for the d12 reference model
    long total_batch;       // tokens per optimizer update
    int num_iterations;
    double batch_lr_scale;  // sqrt(B / 2^19), on every lr but the smear group's
    double dmodel_lr_scale; // (C / 768)^-0.5, on the embedding, value-embedding and lm_head lrs
    OptimConfig optim;
};

static const double REFERENCE_BATCH = 524288.0;  // 2^19 tokens, nanochat's d12 batch

// nanochat measures the horizon and LR transfer against its d12 model built with the same settings
static GPTConfig reference_d12(const GPTConfig& c) {
    GPTConfig r = c;
    r.n_layer = 12;
    r.n_embd = (768 + c.head_dim - 1) / c.head_dim * c.head_dim;
    r.n_head = r.n_kv_head = r.n_embd / c.head_dim;
    r.xsa_layer.assign(12, false);
    return r;
}

// Each group's peak lr from the lr flags' values (dev/docs/optim.md#learning-rate-scaling): all x
// batch_scale but the smear group's, the embeddings' and lm_head's x width_scale, value embeddings at half
// the embedding lr, resid_lambdas at 1% of the scalar lr; everything x factor (SFT's init_lr_frac).
static void set_group_lrs(OptimConfig* o, double unembedding, double embedding, double scalar, double smear, double xsa, double matrix,
                          double batch_scale, double width_scale, double factor) {
    const double b = batch_scale, d = width_scale, f = factor;
    o->lr[GROUP_LM_HEAD] = unembedding * b * d * f;
    o->lr[GROUP_WTE] = embedding * b * d * f;
    o->lr[GROUP_VE] = embedding * b * d * 0.5 * f;
    o->lr[GROUP_RESID] = scalar * b * 0.01 * f;
    o->lr[GROUP_X0] = scalar * b * f;
    o->lr[GROUP_SMEAR] = smear * f;
    o->lr[GROUP_XSA] = xsa * b * f;
    o->lr[GROUP_MATRIX] = matrix * b * f;
}

static TrainingPlan plan_training(const GPTConfig& model, const OptimArgs& a) {
    TrainingPlan plan;
    plan.target_tokens = floor(a.param_data_ratio * (double)count_params(model).scaling);
    plan.reference_tokens = a.param_data_ratio * (double)count_params(reference_d12(model)).scaling;
    plan.total_batch = a.total_batch > 0 ? a.total_batch
                                         : (long)exp2(nearbyint(log2(REFERENCE_BATCH * pow(plan.target_tokens / plan.reference_tokens, 0.383))));
    const double horizon = plan.target_tokens / (double)plan.total_batch;
    if (a.num_iterations <= 0 && horizon > INT_MAX)
        fail("the horizon rule gives %.3g steps (--param-data-ratio %g); set a smaller ratio or -n", horizon, a.param_data_ratio);
    plan.num_iterations = a.num_iterations > 0 ? a.num_iterations : (int)((long long)plan.target_tokens / plan.total_batch);  // nanochat's //
    plan.batch_lr_scale = sqrt((double)plan.total_batch / REFERENCE_BATCH);
    plan.dmodel_lr_scale = pow((double)model.n_embd / 768.0, -0.5);
    const double b = plan.batch_lr_scale, d = plan.dmodel_lr_scale;
    OptimConfig& o = plan.optim;
    o.adamw_only = a.optimizer == "adamw";
    o.muon_eq = a.muon_eq;
    o.muon_plus = a.muon_plus;
    set_group_lrs(&o, a.unembedding_lr, a.embedding_lr, a.scalar_lr, a.smear_lr, a.xsa_lr, o.adamw_only ? a.adamw_matrix_lr : a.matrix_lr, b, d, 1.0);
    o.muon_wd = a.weight_decay * b * (plan.reference_tokens / plan.target_tokens);
    o.matrix_adamw_wd = (float)a.adamw_matrix_wd;
    o.num_iterations = plan.num_iterations;
    o.warmup_steps = a.warmup_steps;
    o.warmdown_ratio = a.warmdown_ratio;
    o.final_lr_frac = a.final_lr_frac;
    o.momentum_warmup_steps = a.momentum_warmup_steps;
    o.given_embedding_lr = a.embedding_lr;
    o.given_unembedding_lr = a.unembedding_lr;
    o.given_matrix_lr = o.adamw_only ? a.adamw_matrix_lr : a.matrix_lr;
    o.given_xsa_lr = a.xsa_lr;
    o.total_batch = plan.total_batch;
    return plan;
}

// ----------------------------------------------------------------------------------------------------
// The training step: micro-batches, the ranks' gradient sum, the update

// One micro-step of training on idx/targets (B, T): forward, the backward accumulating grad_scale * the mean
// loss's gradient into model->grads, and the loss added into model->step_sums[0] as grad_scale * mean (the
// means over the targets not ignored).
// Nothing waits for the device: on CUDA the host goes on to the next batch while this one runs, replayed
// as one CUDA graph after its first run (backend_graph_run). With mark_gradients (CUDA: the last micro-step
// of a step whose gradient reduction overlaps the backward) it runs uncaptured, marking each gradient
// bucket as the backward finishes it (gpt_mark_gradients).
static void gpt_train_micro_step(GPT* model, const int* idx, const int* targets, int B, int T, float grad_scale, bool mark_gradients = false) {
    gpt_set_batch(model, idx, targets, B, T);
    const Acts& a = model->acts;
    const size_t N = (size_t)B * T;
    auto work = [&] {
        gpt_forward_pass(model, true);
        gpt_backward(model, grad_scale);
        loss_sum_accumulate(model->step_sums, a.loss_scale, a.losses, N);
    };
#ifdef __CUDACC__
    if (mark_gradients) {  // not captured: the marks are events another stream waits on
        model->marking = true;
        work();
        model->marking = false;
        return;
    }
#else
    (void)mark_gradients;
#endif
    // the scalar arguments the launches bake in (buffer addresses are tracked by backend_graph_run itself)
    uint32_t scale_bits;
    memcpy(&scale_bits, &grad_scale, sizeof scale_bits);
    const std::vector<uintptr_t> key = {(uintptr_t)B, (uintptr_t)T, (uintptr_t)g_backend.xsa_fused, scale_bits};
    backend_graph_run(&model->micro_step_graph, key, work);
}

// A step's loss, gradient and updated parameters must be finite: a non-finite value would otherwise train
// on silently (a NaN gradient turns every weight it reaches into NaN) until a checkpoint scan or the next
// loss sees it. The squared norms come from one reduction each (sum_squares); only when one is not finite
// are the values read back, to name the first non-finite one. A squared norm can also overflow fp32 with
// every value finite (values above ~1e19): then the run goes on, with an infinite gradient norm shown.
// (Sharded, a rank holds the summed gradient of its own parts only: the rank whose part has the
// non-finite value names it and fails, and the others are stopped as after any rank's failure.)
// Returns what is wrong ("" if nothing), for train_step to stop with.
static std::string step_non_finite(const GPT* model, int step, const float* sums) {
    char what[320];
    if (!std::isfinite(sums[0])) {
        snprintf(what, sizeof what, "the loss is %f at step %d", sums[0], step);
        return what;
    }
    const struct { float sumsq; const char* what; float* values; } checks[] = {{sums[1], "the gradient has", model->grads},
                                                                               {sums[2], "the updated parameters have", model->params}};
    for (const auto& c : checks) {
        if (std::isfinite(c.sumsq)) continue;
        std::vector<float> host(model->num_params);
        backend_download(host.data(), c.values, model->num_params * sizeof(float));
        for (const ParamTensor& t : model->table) {
            const size_t i = first_non_finite(host.data() + t.offset, t.numel);
            if (i == t.numel) continue;
            snprintf(what, sizeof what, "step %d: %s a non-finite value (%g) in %s[%zu]", step, c.what, host[t.offset + i], t.name.c_str(), i);
            return what;
        }
    }
    return "";
}

// out[0] = sum of x[i]^2 over n fp32 values (deterministic)
static void sum_squares(float* out, const float* x, size_t n) {
    backend_zero(out, sizeof(float));
    dot_accumulate(out, 1.0f, x, x, n);
}

struct StepResult {
    double loss;          // the mean training loss of the step's micro-batches (before the update)
    double grad_norm;     // the L2 norm of the gradient of that mean loss, over every parameter
    double lrm;           // the update's lr multiplier
    double momentum;      // and Muon's momentum
    double optimizer_ms;  // the ranks' gradient sums, the update and the gathering of the parameters
};

// One optimizer step: the gradient of the mean loss over `accum` micro-batches on every rank (summed over
// the ranks: each micro-batch weighs 1 / (accum x ranks)), then the update, the same on every rank, with
// the schedules' values at update `it` of the run, taken once the micro-batches are drawn (update_schedule:
// base training's, above, depend on `it` alone; SFT's, in chat/sft.h, on the data read so far too).
// Stops the run if the loss, the gradient or the updated parameters are not finite. Reading the step's
// sums is its only wait for the device. Loader: DataLoader (base training) or SftLoader.
template <typename Loader>
static StepResult train_step(GPT* model, Optimizer* opt, Loader* train, int accum, int it) {
    gpt_zero_grad(model);
    backend_zero(model->step_sums, sizeof(float));
    const float grad_scale = 1.0f / (float)(accum * g_ranks.world);
    for (int micro = 0; micro < accum; micro++) {
        dataloader_next_batch(train);
        gpt_train_micro_step(model, train->inputs.data(), train->targets.data(), train->B, train->T, grad_scale, opt->overlap && micro == accum - 1);
    }
    stream_span_mark(&opt->timer, 0);
    optimizer_reduce_gradients(opt, model);
    ranks_sum_floats(model->step_sums, 1);
    gradient_sum_squares(opt, model, model->step_sums + 1);
    const int step = opt->step;
    const UpdateSchedule s = update_schedule(opt->config, train, it);
    optimizer_step(opt, model, s);
    stream_span_mark(&opt->timer, 1);
    sum_squares(model->step_sums + 2, model->params, model->num_params);
    float sums[STEP_SUMS];
    backend_download(sums, model->step_sums, sizeof sums);
    const std::string non_finite = step_non_finite(model, step, sums);
    if (!non_finite.empty()) fail("%s; stopping (the last checkpoint, if any, is intact)", non_finite.c_str());
    return {sums[0], sqrt((double)sums[1]), s.lrm, s.momentum, stream_span_ms(&opt->timer)};
}


// Several ranks must hold the same weights (they apply the same summed gradients with deterministic
// kernels); a rank that drifted would silently train a different model. Compares a hash of every rank's
// parameters with rank 0's.
static void ranks_check_identical(GPT* model, int step) {
    if (g_ranks.world == 1) return;
    gpt_params_to_host(model);
    const uint32_t* words = (const uint32_t*)model->params_host;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the fp32 words
    for (size_t i = 0; i < model->num_params; i++) hash = (hash ^ words[i]) * 1099511628211ull;
    std::vector<std::vector<int64_t>> all = ranks_gather({(int64_t)(hash & 0xffffffffu), (int64_t)(hash >> 32)});
    for (int r = 1; r < g_ranks.world; r++)
        if (all[r] != all[0]) {
            if (g_ranks.rank != 0) exit(1);  // rank 0 says it, once
            fail("at step %d rank %d's weights differ from rank 0's: the ranks no longer train one model", step, r);
        }
}

// ----------------------------------------------------------------------------------------------------
// Generation (llmc/engine.h, nanochat's engine; dev/docs/evaluation.md#generation): a KV cache per layer,
// the prompt's forward (prefill), then one token per row at a time reading the cache (decode); sampling

#include "llmc/engine.h"

// ----------------------------------------------------------------------------------------------------
// Evaluation: bits per byte, the XSA diagnostics, greedy samples, CORE (dev/docs/evaluation.md)

// Adds one batch's per-token losses (nats) to the bpb sums. Targets that stand for no bytes (special
// tokens such as BOS) and ignored ones count in neither sum.
static void bpb_accumulate(double* nats, double* bytes, const float* losses, const int* targets, size_t n, const std::vector<int>& token_bytes) {
    for (size_t i = 0; i < n; i++) {
        if (targets[i] == IGNORE_INDEX) continue;
        int b = token_bytes[targets[i]];
        if (b > 0) {
            *nats += losses[i];
            *bytes += b;
        }
    }
}

// The attention similarity diagnostics (dev/docs/model.md#xsa-diagnostics), per layer, from the activations of the last forward:
// the mean over heads and tokens t >= 1 of cos(y, v) (attention output and the token's own value, before
// XSA), cos(z, v) (after XSA; equal to cos(y, v) on layers without it) and the attention weight a token puts
// on itself; and value_cos, the mean cos(v_i, v_j) over pairs of different positions of a row and kv head,
// the level cos(y, v) would have if y were an unrelated mix of values. The kernels leave sums per token
// and per (row, kv head); the host adds them in double. Empty when T = 1.
struct Diagnostics {
    std::vector<double> cos_yv, cos_zv, self_weight, value_cos;
};

static Diagnostics gpt_diagnostics(const GPT* model) {
    const GPTConfig& c = model->config;
    const int B = model->B, T = model->T, H = c.n_head;
    Diagnostics d;
    if (T < 2) return d;
    const size_t N = (size_t)B * T;
    const int Hkv = c.n_kv_head, D = c.head_dim;
    const size_t value_floats = (size_t)B * Hkv * (D + 1);
    float* sums = (float*)backend_malloc(std::max(N * 3, value_floats) * sizeof(float), "diagnostics");
    std::vector<float> host(std::max(N * 3, value_floats));
    for (int l = 0; l < c.n_layer; l++) {
        const LayerActs& la = model->acts.layer[l];
        xsa_diagnostics(sums, la.y, la.z, la.v, la.q, la.k, qkv_fused(H, Hkv, D), la.lse, B, T, H, Hkv, D);
        backend_download(host.data(), sums, N * 3 * sizeof(float));
        double total[3] = {0.0, 0.0, 0.0};
        for (size_t n = 0; n < N; n++)
            if (n % T != 0)
                for (int k = 0; k < 3; k++) total[k] += host[n * 3 + k];
        const double count = (double)B * (T - 1) * H;
        d.cos_yv.push_back(total[0] / count);
        d.cos_zv.push_back(total[1] / count);
        d.self_weight.push_back(total[2] / count);
        // sum over pairs i != j of u_i.u_j = |sum u|^2 - sum |u|^2, per (row, kv head), over T (T - 1) pairs
        value_direction_sums(sums, la.v, qkv_fused(H, Hkv, D).kv, B, T, Hkv, D);
        backend_download(host.data(), sums, value_floats * sizeof(float));
        double pairs = 0.0;
        for (size_t bg = 0; bg < (size_t)B * Hkv; bg++) {
            const float* s = host.data() + bg * (D + 1);
            double norm2 = 0.0;
            for (int k = 0; k < D; k++) norm2 += (double)s[k] * s[k];
            pairs += norm2 - s[D];
        }
        d.value_cos.push_back(pairs / ((double)B * Hkv * T * (T - 1)));
    }
    backend_free(sums);
    return d;
}

static double mean_of(const std::vector<double>& v) {
    double s = 0.0;
    for (double x : v) s += x;
    return v.empty() ? NAN : s / v.size();
}

// bpb = total nats / (ln 2 * total bytes) over the first `steps` batches of a fresh pass over the
// validation data (DataLoader or SftLoader: there the targets not ignored). Every rank packs the same
// batches (val is a single-rank loader) and runs the forward of every world-th one, so the value does not
// depend on the number of ranks. With diag, also the diagnostics of the first batch (rank 0's).
template <typename Loader>
static double evaluate_bpb(GPT* model, Loader* val, const Tokenizer* tok, int steps, Diagnostics* diag) {
    dataloader_reset(val);
    double sums[2] = {0.0, 0.0};  // nats, bytes
    Progress progress = progress_start("val bpb", "batches", steps);
    for (int s = 0; s < steps; s++) {
        dataloader_next_batch(val);
        progress_update(&progress, s);
        if (s % g_ranks.world != g_ranks.rank) continue;
        gpt_forward(model, val->inputs.data(), val->targets.data(), val->B, val->T);
        if (s == 0 && diag) *diag = gpt_diagnostics(model);
        bpb_accumulate(&sums[0], &sums[1], model->losses_host.data(), val->targets.data(), (size_t)val->B * val->T, tok->token_bytes);
    }
    ranks_sum_doubles(sums, 2);
    if (sums[1] == 0.0) fail("the validation batches hold no byte-bearing tokens; bits per byte is undefined");
    return sums[0] / (log(2.0) * sums[1]);
}

// The top token of row `row` of the last forward's logits (first maximum on ties).
static int gpt_argmax(const GPT* model, size_t row) {
    std::vector<float> logits(model->config.vocab_size);
    gpt_logits_row(model, row, logits.data());
    return (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

static void print_samples(GPT* model, const Tokenizer* tok, int step) {
    printf("samples at step %d (greedy, 16 tokens):\n", step);
    const std::vector<std::vector<int>> out = generate(model, tok->prompts, 16, SamplingOptions(), 0, {}, [](int, int) {});
    for (size_t p = 0; p < out.size(); p++) {
        const std::vector<int>& prompt = tok->prompts[p];
        std::string text = tokenizer_decode(tok, prompt.data() + 1, prompt.size() - 1);  // skip the BOS
        std::string cont = tokenizer_decode(tok, out[p].data(), out[p].size());
        printf("  %s|%s\n", printable(text).c_str(), printable(cont).c_str());
    }
}

// CORE (llmc/core_evaluate.h): the batched forwards whose per-position losses and predictions
// llmc/core.h scores
#include "llmc/core_evaluate.h"

// ----------------------------------------------------------------------------------------------------
// Checkpoints (llmc/checkpoint.h, nanochat's checkpoint_manager): the parameters, the optimizer state, the
// data-loader state and the loop state in one safetensors file, so that --resume continues bit-identically

#include "llmc/checkpoint.h"

// ----------------------------------------------------------------------------------------------------
// Command line: the trainer's options; what it shares with chat/chat_sft.cu (Args, the output, ranks and
// debugging options, the parser) is llmc/args.h

#include "llmc/args.h"

static const char* const USAGE =
        "usage: train_gpt [options]   (every option takes a value: -d 12, --depth 12 or --depth=12)\n"
        "\n"
        "Model\n"
        "  -d, --depth N          layers; presets: 12 = 768 dim / 12 heads, 24 = 1024 dim / 16 heads,\n"
        "                         other depths: dim = 64*N rounded up to a multiple of head_dim (default 12)\n"
        "  --dim N                residual width (overrides the preset)\n"
        "  --heads N              query heads (default dim / head_dim)\n"
        "  --kv-heads N           key/value heads, GQA when < heads (default heads)\n"
        "  --head-dim N           channels per head (default 64; 128 gives nanochat's own shapes)\n"
        "  -t, --seq-len N        sequence length T (default 2048)\n"
        "  --seed N               initialisation seed (default 42)\n"
        "  --init-from FILE       start from the weights of a safetensors file (nanochat names) instead\n"
        "XSA\n"
        "  -x, --xsa ALPHA        XSA strength in [0, 1] (default 0 = standard attention), or learn: one alpha\n"
        "                         per layer and head, tanh of a parameter that starts at 0 (the baseline)\n"
        "  --xsa-layers SPEC      all | none | comma list of L, A-B, last:K (default all)\n"
        "  --xsa-lr F             with -x learn: AdamW lr of the alpha logits (0.04, batch-scaled; no weight decay)\n"
        "Optimizer (nanochat's MuonAdamW; lrs are the d12 values, scaled by the batch and width rules)\n"
        "  --optimizer muon|adamw Muon for block matrices + AdamW for the rest (default), or AdamW for all\n"
        "  --muon-eq 0|1          MuonEq row equilibration (default 1; 0 with --muon-plus 0 = the March-June\n"
        "                         2026 optimizer the study ran)\n"
        "  --muon-plus 0|1        Muon+ Frobenius renormalisation after Polar Express (default 1)\n"
        "  --matrix-lr F          Muon lr (0.02)\n"
        "  --embedding-lr F       AdamW lr of wte (0.3; value embeddings get half)\n"
        "  --unembedding-lr F     AdamW lr of lm_head (0.008)\n"
        "  --weight-decay F       Muon cautious weight decay at d12 (0.28; cosine schedule, transferred by data size)\n"
        "  --adamw-matrix-lr F    with --optimizer adamw: matrix lr (0.003, batch-scaled; betas 0.9/0.95)\n"
        "Batch and schedule\n"
        "  -b, --batch N          rows per micro-batch (default: CUDA the largest of 32, 16, .., 1 rows that\n"
        "                         divides the total batch and fits in 85% of the GPU's memory; CPU 4)\n"
        "  -B, --total-batch N    tokens per optimizer step, a multiple of batch x seq-len x ranks (default:\n"
        "                         nanochat's rule, 2^19 at d12, scaled with model size)\n"
        "  -n, --steps N          optimizer steps (default: param-data-ratio x scaling params / total batch;\n"
        "                         0 = print the model and the plan, then exit)\n"
        "  --param-data-ratio F   training tokens per scaling parameter: the horizon and the WD transfer (12)\n"
        "  --warmup-steps N       linear lr warmup (40)\n"
        "  --warmdown-ratio F     fraction of steps in the final linear lr warmdown (0.65)\n"
        "  --final-lr-frac F      lr multiplier at the end of the warmdown (0.05)\n"
        "Data (default: the ClimbMix shards that dev/data/climbmix.py wrote into ~/.cache/xsa-train/climbmix\n"
        "(or $XSA_DATA_DIR, which must hold them; none: the embedded corpus) when they are there, else the embedded\n"
        "Devil's Dictionary corpus, dev/data/devil/)\n"
        "  -i, --train PATTERN    training shards, a glob (default dev/data/devil/train_*.bin)\n"
        "  -j, --val PATTERN      validation shards, a glob (default dev/data/devil/val_*.bin)\n"
        "  --tokenizer FILE       tokenizer file; it sets the vocabulary (default dev/data/devil/tokenizer.bin)\n"
        "  --data-seed N          visit each shard's row groups in an order shuffled by N (default 0: in order, as\n"
        "                         nanochat); a study varies it with --seed to vary the data order too\n"
        "Evaluation\n"
        "  --eval-every N         validation bits per byte every N steps, and at step 0 and the end (250)\n"
        "  --eval-tokens N        tokens per validation pass (80 x 524288, capped at one pass over the val shards)\n"
        "  --sample-every N       greedy samples from the tokenizer's prompts every N steps and at the end\n"
        "                         (2000; -1 = never)\n"
        "  --core-every N         CORE every N steps and at the end (2000; -1 = never)\n"
        "  --core-max-per-task N  items per CORE task during training (500; -1 = all)\n"
        "  --core-tasks DIR       task files from dev/data/core.py, tokenized with this run's tokenizer\n"
        "                         (default dev/data/core_tasks, the small bundle for the embedded corpus)\n";

// The trainer's rarely set options: ablations of nanochat's design, the finer lrs and schedules. --help
// prints them after the shared options, in the group args.h's RUN_USAGE_MORE ends.
static const char* const USAGE_MORE =
        "Ablations, finer settings and debugging (rarely set; the defaults are nanochat's)\n"
        "  --window-pattern S     per-layer windows, tiled: S short, L long; last layer always L (default SSSL)\n"
        "  --short-window N       keys before the query in S layers (default ceil(T/4/128)*128)\n"
        "  --value-embeds 0|1     value embeddings on alternating layers (default 1)\n"
        "  --smear 0|1            smear the previous token's embedding (default 1)\n"
        "  --scalar-lr F          AdamW lr of x0_lambdas (0.5; resid_lambdas get 1%)\n"
        "  --smear-lr F           AdamW lr of smear gate/lambda and backout lambda (0.2, not batch-scaled)\n"
        "  --adamw-matrix-wd F    with --optimizer adamw: matrix weight decay (0.1)\n"
        "  --momentum-warmup-steps N  Muon momentum 0.85 -> 0.97 over N steps (400)\n";

// report: print what the parse finds worth saying (not when parsing a resumed run's recorded arguments)
static Args parse_args(const std::vector<std::string>& words, bool report = true) {
    std::vector<char*> argv_words = {(char*)"train_gpt"};
    for (const std::string& w : words) argv_words.push_back((char*)w.c_str());
    const int argc = (int)argv_words.size();
    char** argv = argv_words.data();
    Args args;
    int depth = 12, dim = -1, heads = -1, kv_heads = -1, head_dim = -1, seq_len = 2048, short_window = -1;
    std::string pattern = "SSSL", xsa_layers = "all";
    bool value_embeds = true, smear = true;
    float alpha = 0.0f;
    bool learnable = false;
    bool data_given = false, core_given = false, xsa_layers_given = false;
    OptimArgs& o = args.optim;
    parse_command_line(argc, argv, std::string(USAGE) + RUN_USAGE + USAGE_MORE + RUN_USAGE_MORE, [&](const std::string& flag, const char* value) {
        const char* f = flag.c_str();
        if (flag == "-d" || flag == "--depth") depth = parse_int32(f, value);
        else if (flag == "--dim") dim = parse_int32(f, value);
        else if (flag == "--heads") heads = parse_int32(f, value);
        else if (flag == "--kv-heads") kv_heads = parse_int32(f, value);
        else if (flag == "--head-dim") head_dim = parse_int32(f, value);
        else if (flag == "-t" || flag == "--seq-len") seq_len = parse_int32(f, value);
        else if (flag == "--window-pattern") pattern = value;
        else if (flag == "--short-window") short_window = (int)at_least(f, parse_int32(f, value), 0);
        else if (flag == "--value-embeds") value_embeds = parse_bool(f, value);
        else if (flag == "--smear") smear = parse_bool(f, value);
        else if (flag == "-x" || flag == "--xsa") {
            learnable = !strcmp(value, "learn");
            char* end = nullptr;
            alpha = learnable ? 0.0f : strtof(value, &end);
            if (!learnable && (end == value || *end != '\0' || !(alpha >= 0.0f && alpha <= 1.0f)))
                fail("-x (XSA alpha) must be a number in [0, 1] or learn, got '%s'", value);
        }
        else if (flag == "--xsa-layers") xsa_layers = value, xsa_layers_given = true;
        else if (flag == "--optimizer") o.optimizer = value;
        else if (flag == "--muon-eq") o.muon_eq = parse_bool(f, value);
        else if (flag == "--muon-plus") o.muon_plus = parse_bool(f, value);
        else if (flag == "--matrix-lr") o.matrix_lr = parse_double(f, value);
        else if (flag == "--embedding-lr") o.embedding_lr = parse_double(f, value);
        else if (flag == "--unembedding-lr") o.unembedding_lr = parse_double(f, value);
        else if (flag == "--scalar-lr") o.scalar_lr = parse_double(f, value);
        else if (flag == "--smear-lr") o.smear_lr = parse_double(f, value);
        else if (flag == "--xsa-lr") o.xsa_lr = parse_double(f, value);
        else if (flag == "--weight-decay") o.weight_decay = parse_double(f, value);
        else if (flag == "--adamw-matrix-lr") o.adamw_matrix_lr = parse_double(f, value);
        else if (flag == "--adamw-matrix-wd") o.adamw_matrix_wd = parse_double(f, value);
        else if (flag == "--warmup-steps") o.warmup_steps = parse_int32(f, value);
        else if (flag == "--warmdown-ratio") o.warmdown_ratio = parse_double(f, value);
        else if (flag == "--final-lr-frac") o.final_lr_frac = parse_double(f, value);
        else if (flag == "--momentum-warmup-steps") o.momentum_warmup_steps = parse_int32(f, value);
        else if (flag == "--param-data-ratio") o.param_data_ratio = parse_double(f, value);
        else if (flag == "-i" || flag == "--train") args.train_pattern = value, data_given = true;
        else if (flag == "-j" || flag == "--val") args.val_pattern = value, data_given = true;
        else if (flag == "--seed") args.seed = (uint64_t)at_least(f, parse_int(f, value), 0);
        else if (flag == "--data-seed") args.data_seed = (uint64_t)at_least(f, parse_int(f, value), 0);
        else if (flag == "--sample-every") args.sample_every = parse_int32(f, value);
        else if (flag == "--core-every") args.core_every = parse_int32(f, value);
        else if (flag == "--core-max-per-task") args.core_max_per_task = parse_int32(f, value);
        else if (flag == "--core-tasks") args.core_dir = value, core_given = true;
        else if (parse_run_flag(&args, flag, value)) data_given |= flag == "--tokenizer";
        else return false;
        return true;
    });
    check_run_args(args);
    if (depth < 1 || depth > 1024) fail("--depth must be in [1, 1024], got %d", depth);
    if (args.sample_every < 1 && args.sample_every != -1) fail("--sample-every must be >= 1 or -1, got %d", args.sample_every);
    if (args.core_every < 1 && args.core_every != -1) fail("--core-every must be >= 1 or -1, got %d", args.core_every);
    if (args.core_max_per_task < 1 && args.core_max_per_task != -1) fail("--core-max-per-task must be >= 1 or -1, got %d", args.core_max_per_task);
    for (int v : {dim, heads, kv_heads, head_dim})
        if (v != -1 && v < 1) fail("--dim, --heads, --kv-heads and --head-dim must be positive");
    if (o.optimizer != "muon" && o.optimizer != "adamw") fail("--optimizer must be muon or adamw, got '%s'", o.optimizer.c_str());
    for (double lr : {o.matrix_lr, o.embedding_lr, o.unembedding_lr, o.scalar_lr, o.smear_lr, o.xsa_lr, o.adamw_matrix_lr, o.weight_decay, o.adamw_matrix_wd})
        if (lr < 0.0) fail("learning rates and weight decays must be >= 0");
    if (o.warmup_steps < 0 || o.momentum_warmup_steps < 1) fail("--warmup-steps must be >= 0 and --momentum-warmup-steps >= 1");
    if (!(o.warmdown_ratio >= 0.0 && o.warmdown_ratio <= 1.0)) fail("--warmdown-ratio must be in [0, 1], got %g", o.warmdown_ratio);
    if (!(o.final_lr_frac >= 0.0 && o.final_lr_frac <= 1.0)) fail("--final-lr-frac must be in [0, 1], got %g", o.final_lr_frac);
    if (!(o.param_data_ratio > 0.0)) fail("--param-data-ratio must be > 0, got %g", o.param_data_ratio);

    // shapes: the study's presets, nanochat's aspect-ratio rule otherwise, then the explicit overrides
    GPTConfig& c = args.config;
    c.n_layer = depth;
    int hd = head_dim > 0 ? head_dim : 64;
    if (dim < 0) dim = (depth == 24 && hd == 64) ? 1024 : (64 * depth + hd - 1) / hd * hd;
    if (heads < 0) {
        if (dim % hd != 0) fail("--dim %d is not divisible by --head-dim %d", dim, hd);
        heads = dim / hd;
    } else if (head_dim < 0) {
        if (dim % heads != 0) fail("--dim %d is not divisible by --heads %d", dim, heads);
        hd = dim / heads;
    }
    c.n_embd = dim;
    c.n_head = heads;
    c.head_dim = hd;
    c.n_kv_head = kv_heads > 0 ? kv_heads : heads;
    c.seq_len = seq_len;
    c.window_pattern = pattern;
    c.short_window = short_window >= 0 ? short_window : default_short_window(seq_len);
    c.value_embeds = value_embeds;
    c.smear = smear;
    c.xsa_alpha = alpha;
    c.xsa_learnable = learnable;
    c.xsa_layer = parse_layer_spec(xsa_layers, depth);
    // a fixed alpha = 0 is standard attention: skip the op rather than run it as a no-op
    if (alpha == 0.0f && !learnable) c.xsa_layer.assign(depth, false);
    if (alpha == 0.0f && !learnable && xsa_layers_given && report)
        printf("warning: --xsa-layers %s without -x: alpha is 0, so no layer uses XSA (-x 1 for full XSA on them)\n", xsa_layers.c_str());
    validate_config(c);  // the vocabulary comes from the tokenizer later; the rest is checked now
    if (!data_given) default_data(&args, core_given, report);
    return args;
}

// The settings a resumed run shares with the run it continues, by the flag that sets each (the others, such as
// the evaluation cadence, --save-every or --ranks, may change on resume).
struct RunSetting {
    const char* flag;
    std::string (*value)(const Args&);
};
static const RunSetting RUN_SETTINGS[] = {
    {"-d", [](const Args& a) { return std::to_string(a.config.n_layer); }},
    {"--dim", [](const Args& a) { return std::to_string(a.config.n_embd); }},
    {"--heads", [](const Args& a) { return std::to_string(a.config.n_head); }},
    {"--kv-heads", [](const Args& a) { return std::to_string(a.config.n_kv_head); }},
    {"--head-dim", [](const Args& a) { return std::to_string(a.config.head_dim); }},
    {"-t", [](const Args& a) { return std::to_string(a.config.seq_len); }},
    {"--window-pattern", [](const Args& a) { return a.config.window_pattern; }},
    {"--short-window", [](const Args& a) { return std::to_string(a.config.short_window); }},
    {"--value-embeds", [](const Args& a) { return std::to_string(a.config.value_embeds); }},
    {"--smear", [](const Args& a) { return std::to_string(a.config.smear); }},
    {"-x", [](const Args& a) { return a.config.xsa_learnable ? std::string("learn") : shortest_decimal(a.config.xsa_alpha); }},
    {"--xsa-layers", [](const Args& a) { return layer_list(a.config.xsa_layer); }},
    {"--optimizer", [](const Args& a) { return a.optim.optimizer; }},
    {"--muon-eq", [](const Args& a) { return std::to_string(a.optim.muon_eq); }},
    {"--muon-plus", [](const Args& a) { return std::to_string(a.optim.muon_plus); }},
    {"--matrix-lr", [](const Args& a) { return shortest_decimal(a.optim.matrix_lr); }},
    {"--embedding-lr", [](const Args& a) { return shortest_decimal(a.optim.embedding_lr); }},
    {"--unembedding-lr", [](const Args& a) { return shortest_decimal(a.optim.unembedding_lr); }},
    {"--scalar-lr", [](const Args& a) { return shortest_decimal(a.optim.scalar_lr); }},
    {"--smear-lr", [](const Args& a) { return shortest_decimal(a.optim.smear_lr); }},
    {"--xsa-lr", [](const Args& a) { return shortest_decimal(a.optim.xsa_lr); }},
    {"--weight-decay", [](const Args& a) { return shortest_decimal(a.optim.weight_decay); }},
    {"--adamw-matrix-lr", [](const Args& a) { return shortest_decimal(a.optim.adamw_matrix_lr); }},
    {"--adamw-matrix-wd", [](const Args& a) { return shortest_decimal(a.optim.adamw_matrix_wd); }},
    {"--warmup-steps", [](const Args& a) { return std::to_string(a.optim.warmup_steps); }},
    {"--warmdown-ratio", [](const Args& a) { return shortest_decimal(a.optim.warmdown_ratio); }},
    {"--final-lr-frac", [](const Args& a) { return shortest_decimal(a.optim.final_lr_frac); }},
    {"--momentum-warmup-steps", [](const Args& a) { return std::to_string(a.optim.momentum_warmup_steps); }},
    {"--param-data-ratio", [](const Args& a) { return shortest_decimal(a.optim.param_data_ratio); }},
    {"-B", [](const Args& a) { return std::to_string(a.optim.total_batch); }},
    {"-n", [](const Args& a) { return std::to_string(a.steps); }},
    {"-b", [](const Args& a) { return std::to_string(a.batch); }},
    {"--seed", [](const Args& a) { return std::to_string(a.seed); }},
    {"--data-seed", [](const Args& a) { return std::to_string(a.data_seed); }},
    {"--tokenizer", [](const Args& a) { return a.tokenizer_path; }},
    {"-i", [](const Args& a) { return a.allow_other_data ? std::string("(any)") : a.train_pattern; }},
    {"-j", [](const Args& a) { return a.allow_other_data ? std::string("(any)") : a.val_pattern; }},  // (val bpb compares with the run's)
};

// The command line's arguments, after those the run recorded when this is a --resume of a run that recorded them
// (recorded_arguments); then a flag given here that sets a run setting (RUN_SETTINGS) to another value is refused,
// every one named in one error.
static Args parse_run_arguments(int argc, char** argv, std::vector<std::string>* recorded_words) {
    const std::vector<std::string> given = argument_words(argc, argv);
    const std::string resume = flag_value(given, "--resume");
    const std::vector<std::string> recorded = resume.empty() ? std::vector<std::string>() : recorded_arguments(resume, "train_gpt");
    std::vector<std::string> words = recorded;
    words.insert(words.end(), given.begin(), given.end());
    const Args args = parse_args(words);
    *recorded_words = without_outputs(words);
    if (recorded.empty()) return args;
    std::vector<std::string> as_recorded = recorded;  // (as the run was resumed, without this command line's other flags)
    as_recorded.insert(as_recorded.end(), {"--resume", resume});
    const Args was = parse_args(as_recorded, false);
    std::string conflicts;
    for (const RunSetting& s : RUN_SETTINGS)
        if (s.value(args) != s.value(was)) conflicts += (conflicts.empty() ? "" : ", ") + std::string(s.flag) + " " + s.value(args) + " (the run's: " + s.value(was) + ")";
    if (!conflicts.empty())
        fail("--resume %s takes the run's own settings from its metrics.jsonl; these flags given here differ: %s. Leave them out, or "
             "start a new run with -o", resume.c_str(), conflicts.c_str());
    return args;
}

// ----------------------------------------------------------------------------------------------------
// main: set-up, the training loop, logging

// The model summary, from the configuration alone (nothing is allocated yet, so -n 0 can show the size
// of any model on any machine).
static void print_model(const GPTConfig& c, int B, double available, int optimizer_shards) {
    ParamCounts pc = count_params(c);
    printf("model: depth %d, dim %d, heads %d (kv %d) x %d, vocab %d (padded %d), T %d\n", c.n_layer, c.n_embd, c.n_head,
           c.n_kv_head, c.head_dim, c.vocab_size, c.padded_vocab, c.seq_len);
    std::string windows;
    for (int l = 0; l < c.n_layer; l++) windows += (l ? "," : "") + std::to_string(layer_window(c, l));
    printf("windows: %s | value embeddings %s | smear %s\n", windows.c_str(), c.value_embeds ? "on" : "off", c.smear ? "on" : "off");
    if (c.xsa_learnable) printf("XSA: learnable alpha = tanh(a) per head, a starting at 0, on layers %s\n", layer_list(c.xsa_layer).c_str());
    else printf("XSA: alpha %g on layers %s\n", c.xsa_alpha, layer_list(c.xsa_layer).c_str());
    printf("parameters: wte %zu | value_embeds %zu | lm_head %zu | transformer matrices %zu | scalars %zu | total %zu\n",
           pc.wte, pc.value_embeds, pc.lm_head, pc.transformer_matrices, pc.scalars, pc.total);
    printf("scaling parameters (matrices + lm_head): %zu | FLOPs/token (6N + attention): %.4e\n", pc.scaling, flops_per_token(c));
    const MemoryPlan m = memory_plan(c, B, optimizer_shards);
    const double MiB = 1 << 20;
    char sharded[96] = "";
    if (optimizer_shards > 1)
        snprintf(sharded, sizeof sharded, ", sharded over %d ranks: the largest share of %.1f MiB", optimizer_shards,
                 memory_plan(c, B, 1).optimizer / MiB);
    printf("memory plan%s: parameters %.1f MiB, gradients %.1f MiB, bf16 copy %.1f MiB, optimizer state %.1f MiB (Muon%s), "
           "activations for B=%d %.1f MiB; total %.1f MiB (%s: %.1f MiB)\n", g_ranks.world > 1 ? " per rank" : "", m.params / MiB,
           m.grads / MiB, m.matmul_copy / MiB, m.optimizer / MiB, sharded, B, m.acts / MiB, m.total() / MiB,
           sizeof(floatX) == sizeof(float) ? "available on this machine" : "free on the GPU", available / MiB);
}

static void print_plan(const TrainingPlan& plan, int accum) {
    const OptimConfig& o = plan.optim;
    printf("plan: %d steps x %ld tokens (%d micro-batches%s); horizon rule: %.4g tokens = ratio x scaling params\n", o.num_iterations,
           plan.total_batch, accum, g_ranks.world > 1 ? (" on each of " + std::to_string(g_ranks.world) + " ranks").c_str() : "",
           plan.target_tokens);
    printf("optimizer: %s | lr scale batch %.6f, width %.6f | warmup %d, warmdown %.2f to %.3f\n",
           o.adamw_only ? "AdamW for all parameters" : (o.muon_eq || o.muon_plus ? "Muon (+MuonEq/Muon+ as set) + AdamW" : "Muon + AdamW"),
           plan.batch_lr_scale, plan.dmodel_lr_scale, o.warmup_steps, o.warmdown_ratio, o.final_lr_frac);
    std::string lrs;
    for (int g = 0; g < NUM_GROUPS; g++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s%s %.6g", g ? ", " : "", GROUP_NAMES[g], o.lr[g]);
        lrs += buf;
    }
    printf("peak lrs: %s | %s %.6g\n", lrs.c_str(), o.adamw_only ? "matrix wd" : "Muon wd", o.adamw_only ? o.matrix_adamw_wd : o.muon_wd);
    if (!o.adamw_only) printf("Muon: MuonEq %s, Muon+ %s\n", o.muon_eq ? "on" : "off", o.muon_plus ? "on" : "off");
}

// Everything a training run holds: set up by run_setup_*, driven by run_train. Loader: DataLoader (base
// training) or SftLoader (chat/sft_loader.h: chat/chat_sft.cu drives the same loop).
template <typename Loader>
struct Run {
    std::vector<std::string> argv;  // the command line, for the resume command a stopped run prints
    Args args;
    Tokenizer tok;
    TrainingPlan plan;
    int B = 0, T = 0;         // rows per micro-batch, sequence length
    int accum = 0;            // micro-batches per rank per step
    int num_steps = 0;
    int eval_steps = 0;       // validation batches per evaluation
    Loader train, val;
    std::vector<CoreTask> core_tasks;
    GPT model;
    Optimizer opt;
    LoopState loop;
    std::string out_dir;      // -o, or the --resume directory; "" = nothing written
    MetricsLog metrics;       // DIR/metrics.jsonl on rank 0
    double flops_per_step = 0.0, peak_flops = 0.0;
    std::vector<double> step_ms;  // every timed step of this process (not its first: it pays for page faults)
    double step_ms_sum = 0.0;     // their sum (loop.train_ms also counts the steps before a resume)
    std::vector<double> optimizer_ms;  // the optimizer's part of each (StepResult::optimizer_ms)
    double start_ms = 0.0;        // when this process started training (the elapsed time in the step lines)
    double estimate_step_ms = 0.0;  // run_estimate's, until steps are timed (what a stop request says it waits for)
    std::string last_checkpoint;    // the latest checkpoint of the run, "" if none yet
    std::vector<std::string> recorded_words;  // the arguments the run line records (all but the output options)
    std::string program = "train_gpt";        // whose arguments they are (chat_sft's are not train_gpt's)
};

// The first line of DIR/metrics.jsonl: what was run (model, optimizer, batch, data, seed, device), so a
// comparison of two runs (dev/compare_runs.py) can tell whether they differ only where they should.
template <typename Loader>
static JsonLine run_line(const Run<Loader>& run) {
    const Args& a = run.args;
    JsonLine line;
    line.num("step", 0LL).str("kind", "run").str("backend", BACKEND_NAME).str("device", backend_device_name());
    line.num("ranks", (long long)g_ranks.world).num("batch", (long long)run.B).num("total_batch", (long long)run.plan.total_batch);
    line.num("steps", (long long)run.num_steps).num("seed", (long long)a.seed).num("data_seed", (long long)a.data_seed);
    line.str("train_data", a.train_pattern).str("val_data", a.val_pattern).str("tokenizer", a.tokenizer_path);
    line.num("eval_tokens", (long long)run.eval_steps * run.B * run.T).num("xsa_fused", (long long)a.xsa_fused);  // as evaluated
    return line.raw("model", json_object(config_to_metadata(a.config), {"window_pattern", "xsa_layers"}))
        .raw("optim", json_object(optim_to_metadata(run.plan.optim), {}))
        .str("program", run.program).raw("argv", json_words(run.recorded_words));  // last: recorded_arguments finds them there
}

// The micro-batch (-b, or the default for this model and device), the micro-batches per step and the step
// count of the plan; prints the model; refuses a micro-batch that does not fit (-n 0 only warns).
template <typename Loader>
static void run_setup_batch(Run<Loader>* run) {
    const Args& a = run->args;
    const GPTConfig& c = a.config;
    const int world = g_ranks.world;
    run->T = c.seq_len;
    const double available = backend_memory_available();
    run->B = a.batch > 0 ? a.batch : default_batch(c, run->plan.total_batch / world, available, optimizer_shards(a));
    if (a.batch < 0) printf("batch: %d rows per micro-batch (the default for this model and device; -b to set)\n", run->B);
    if (world > 1 && a.batch < 0)  // each rank sized it from its own GPU's memory
        for (const std::vector<int64_t>& b : ranks_gather({run->B}))
            if (b[0] != run->B) fail("the ranks' GPUs fit different batches (%d and %lld rows by default); set -b", run->B, (long long)b[0]);
    const long micro_tokens = (long)run->B * run->T;
    if (run->plan.total_batch % (micro_tokens * world) != 0)
        fail("the total batch of %ld tokens is not a multiple of batch x seq-len x ranks = %d x %d x %d (set -B or -b)",
             run->plan.total_batch, run->B, run->T, world);
    const long accum = run->plan.total_batch / (micro_tokens * world);
    if (accum > 1000000) fail("the total batch of %ld tokens would take %ld micro-batches per step (at most 1000000); set -B", run->plan.total_batch, accum);
    run->accum = (int)accum;
    run->num_steps = run->plan.num_iterations;
    print_model(c, run->B, available, optimizer_shards(a));
    const std::string kernels = backend_kernel_plan(c.head_dim);
    if (!kernels.empty()) printf("%s\n", kernels.c_str());
    const std::string memory = memory_problem(c, run->B, run->plan.total_batch, available, optimizer_shards(a));
    if (!memory.empty() && a.steps == 0) printf("warning: %s\n", memory.c_str());  // -n 0 shows the plan whatever it needs
    else if (!memory.empty()) fail("%s", memory.c_str());
}

// Tokenizer, shapes, the training plan and the micro-batch; prints the model and the plan.
static void run_setup_plan(Run<DataLoader>* run) {
    Args& a = run->args;
    GPTConfig& c = a.config;
    tokenizer_load(&run->tok, a.tokenizer_path);
    expand_pattern(a.train_pattern, "training shard");  // a mistyped glob is an error even with -n 0
    expand_pattern(a.val_pattern, "validation shard");
    c.vocab_size = run->tok.vocab_size;
    c.padded_vocab = padded_vocab_size(c.vocab_size);
    validate_config(c);
    OptimArgs optim_args = a.optim;
    optim_args.num_iterations = a.steps;  // -1: the horizon rule
    run->plan = plan_training(c, optim_args);
    run_setup_batch(run);
    print_plan(run->plan, run->accum);
    if (a.steps != 0 && run->num_steps < 1)
        fail("the plan has no steps: %.0f target tokens < one batch of %ld tokens (set -n or -B)", run->plan.target_tokens, run->plan.total_batch);
}

// The training and validation loaders, with what the plan means for the data (-n 0 stops after this: the
// plan shows what the run would warn about).
static void run_open_data(Run<DataLoader>* run) {
    const Args& a = run->args;
    const Tokenizer& tok = run->tok;
    const int world = g_ranks.world;
    dataloader_init(&run->train, a.train_pattern, "training shard", tok.vocab_size, tok.bos_id, run->B, run->T, g_ranks.rank, world);
    run->train.data_seed = a.data_seed;
    dataloader_init(&run->val, a.val_pattern, "validation shard", tok.vocab_size, tok.bos_id, run->B, run->T, 0, 1);  // evaluate_bpb splits it
    uint64_t val_tokens = 0;
    for (const Shard& s : run->val.shards) val_tokens += s.ntokens;
    const long micro_tokens = (long)run->B * run->T;
    run->eval_steps = (int)std::max<long>(1, std::min<long>(a.eval_tokens, (long)val_tokens) / micro_tokens);
    const size_t ntrain = run->train.shards.size(), nval = run->val.shards.size();
    printf("data: %zu training shard%s (%s), %zu validation shard%s (%llu tokens; %d batches per evaluation%s)\n", ntrain,
           ntrain == 1 ? "" : "s", a.train_pattern.c_str(), nval, nval == 1 ? "" : "s", (unsigned long long)val_tokens, run->eval_steps,
           world > 1 ? ", shared by the ranks" : "");
    uint64_t train_tokens = 0;
    for (const Shard& s : run->train.shards) train_tokens += s.ntokens;
    const double epochs = (double)run->num_steps * run->plan.total_batch / std::max<double>(1.0, (double)train_tokens);
    if (epochs > 10.0)
        printf("warning: this plan reads the %llu training tokens %.0f times over (the model will memorise them)%s\n",
               (unsigned long long)train_tokens, epochs,
               a.train_pattern == "dev/data/devil/train_*.bin"
                   ? "; for real data: python3 -m pip install -r dev/data/requirements.txt && python3 dev/data/climbmix.py (then ./train_gpt finds it)"
                   : "");
    size_t without_row_groups = 0;
    for (const Shard& s : run->train.shards) without_row_groups += !s.groups_from_file;
    if (world > 1 && without_row_groups > 0)
        printf("note: %zu of the %zu training shards have no row-group file (SHARD%s, written by dev/data/climbmix.py): the ranks stride "
               "over 128-document chunks of them, not over parquet row groups as nanochat's (dev/docs/data.md#ranks-and-epochs)\n",
               without_row_groups, run->train.shards.size(), ROWGROUP_SUFFIX);
}

// The loaders and the CORE tasks.
static void run_setup_data(Run<DataLoader>* run) {
    run_open_data(run);
    const Args& a = run->args;
    const Tokenizer& tok = run->tok;
    if (a.core_every < 0) return;
    run->core_tasks = core_tasks_load(a.core_dir, tok.vocab_size, tok.bos_id);
    for (const CoreTask& t : run->core_tasks)  // few-shot examples come from core.py's truncation, not ours
        if (t.shots > 0 && a.core_max_per_task > 0 && a.core_max_per_task < (int)t.items.size() && t.max_per_task != a.core_max_per_task)
            printf("warning: %s was made with core.py --max-per-task %d; its few-shot examples match nanochat's only for "
                   "--core-max-per-task %d (regenerate with --max-per-task %d to match)\n",
                   t.path.c_str(), t.max_per_task, t.max_per_task, a.core_max_per_task);
    printf("CORE: %zu tasks from %s, up to %d items each, every %d steps and at the end\n", run->core_tasks.size(), a.core_dir.c_str(),
           a.core_max_per_task, a.core_every);
}

// DIR/metrics.jsonl on rank 0 (with -o or --resume): started anew, or cut back to the checkpoint on resume.
template <typename Loader>
static void run_open_metrics(Run<Loader>* run) {
    if (run->out_dir.empty() || g_ranks.rank != 0) return;
    lock_run_dir(run->out_dir);
    const std::string path = run->out_dir + "/metrics.jsonl";
    if (run->args.overwrite)  // under the lock, before this run writes anything (check_outputs refused them otherwise)
        for (const std::string& f : run_files(run->out_dir))
            if (unlink(f.c_str()) != 0 && errno != ENOENT) fail("--overwrite: cannot delete '%s': %s", f.c_str(), strerror(errno));
    if (run->args.resume_dir.empty() || run->args.new_log) {  // (--new-log 1: check_resume_log found none to continue)
        metrics_open(&run->metrics, path, false);
        metrics_write(&run->metrics, run_line(*run));
        if (run->args.new_log)
            printf("metrics: a new %s from step %d on (--new-log 1): the lines of the steps before are lost\n", path.c_str(), run->loop.step);
    } else {
        truncate_metrics(path, run->loop.step);
        metrics_open(&run->metrics, path, true);
    }
}

// The model and optimizer: initialised, or resumed from a checkpoint, or started from a weights file; and
// the metrics log (started anew, or cut back to the checkpoint on resume).
static void run_setup_model(Run<DataLoader>* run) {
    const Args& a = run->args;
    const GPTConfig& c = a.config;
    gpt_build(&run->model, c);
    gpt_init_weights(&run->model, a.seed);
    run->model.tokenizer_path = a.tokenizer_path;
    run->model.tokenizer_fingerprint = tokenizer_fingerprint(&run->tok);
    optimizer_init(&run->opt, &run->model, run->plan.optim, optimizer_shards(a));
    if (a.overlap_reduce) optimizer_overlap_reduction(&run->opt, &run->model);
    run->out_dir = !a.output_dir.empty() ? a.output_dir : a.resume_dir;
    if (!a.resume_dir.empty()) {
        if (!a.init_from.empty()) fail("--resume and --init-from exclude each other");
        std::string ckpt = latest_checkpoint(a.resume_dir);
        if (ckpt.empty()) fail("--resume: no checkpoint ckpt_*.safetensors in '%s'", a.resume_dir.c_str());
        load_checkpoint(ckpt, &run->model, &run->opt, &run->train, &run->val, &run->loop, a.allow_other_data);
        printf("resumed from %s at step %d\n", ckpt.c_str(), run->loop.step);
        run->last_checkpoint = ckpt;
        if (run->loop.step > run->num_steps) fail("'%s' is at step %d, past the %d steps of this run", ckpt.c_str(), run->loop.step, run->num_steps);
    } else if (!a.init_from.empty()) {
        SafetensorsFile file = safetensors_read(a.init_from);
        if (file.metadata.count("n_layer")) {  // our own exports say which model they hold; XSA settings may differ
            std::map<std::string, std::string> have = config_to_metadata(config_from_metadata(file)), want = config_to_metadata(c);
            for (const auto& kv : want)
                if (kv.first != "xsa_alpha" && kv.first != "xsa_layers" && have[kv.first] != kv.second)
                    fail("'%s' holds a model with %s = %s, this run has %s", a.init_from.c_str(), kv.first.c_str(), have[kv.first].c_str(),
                         kv.second.c_str());
        }
        gpt_load_weights(&run->model, file);
        printf("weights loaded from %s\n", a.init_from.c_str());
    }
    run_open_metrics(run);
}

// Before training: one micro-step timed on a batch of BOS tokens, the second of two (on CUDA the first pays for
// cuBLASLt's set-up -- with --matmul-tune, the timing of its candidates; every rank then takes rank 0's
// choices -- and the second for the graph capture; on the CPU the first pays for page faults, and is the one
// timed when it took 10 s or more) gives rank 0's estimate of a step (x the micro-batches, + the optimizer
// update on the CPU, optimizer_estimate_ms; the ranks' sums are not counted), of the run's remaining steps, and
// of its bpb evaluations (forward only: about a third of a micro-step per batch). CORE is not counted. Warns
// when the run would take more than a day. Every rank runs it. Nothing of the run changes: train_step
// clears the gradients and the step's sums, and the grad scale is the run's own, so a captured graph is reused.
template <typename Loader>
static void run_estimate(Run<Loader>* run) {
    const int first = run->loop.step, n = run->num_steps, every = run->args.eval_every;
    if (first >= n) return;
    std::vector<int> bos((size_t)run->B * run->T, run->tok.bos_id);
    const float grad_scale = 1.0f / (float)(run->accum * g_ranks.world);
    double micro_ms = 0.0;
    for (int i = 0; i < 2; i++) {
        const double t0 = wall_ms();
        backend_matmul_tune(i == 0 && run->args.matmul_tune);
        gpt_train_micro_step(&run->model, bos.data(), bos.data(), run->B, run->T, grad_scale);
        backend_matmul_tune(false);
        float sum;
        backend_download(&sum, run->model.step_sums, sizeof sum);  // waits for the device
        micro_ms = wall_ms() - t0;
        if (i == 0 && g_ranks.world > 1) backend_matmul_take_chosen(ranks_gather(backend_matmul_chosen())[0]);
        // (at the quick start's size the CPU's first micro-step takes about 25% longer than the next)
        if (sizeof(floatX) == sizeof(float) && ranks_gather({(int64_t)(micro_ms >= 10000.0)})[0][0]) break;
    }
    if (g_ranks.rank != 0) return;
    const double update_ms = optimizer_estimate_ms(&run->opt, &run->model);
    const std::string matmul_summary = backend_matmul_summary();
    if (!matmul_summary.empty()) printf("%s\n", matmul_summary.c_str());
    int evals = 0;  // the bpb evaluations still to run: every `every` steps and at the last
    for (int step = first; step <= n; step++) evals += step == n || step % every == 0;
    const double step_s = (run->accum * micro_ms + update_ms) / 1000.0, train_s = (n - first) * step_s;
    run->estimate_step_ms = 1000.0 * step_s;
    const double eval_s = evals * ceil((double)run->eval_steps / g_ranks.world) * micro_ms / 3000.0;
    auto duration = [](double sec) {
        char buf[32];
        if (sec < 1) snprintf(buf, sizeof buf, "%.0f ms", sec * 1000);
        else if (sec < 120) snprintf(buf, sizeof buf, "%.1f s", sec);
        else if (sec < 7200) snprintf(buf, sizeof buf, "%.1f min", sec / 60);
        else if (sec < 172800) snprintf(buf, sizeof buf, "%.1f h", sec / 3600);
        else snprintf(buf, sizeof buf, "%.1f days", sec / 86400);
        return std::string(buf);
    };
    char update[64] = "";
    if (update_ms > 0.0) snprintf(update, sizeof update, " + the update %.1f ms", update_ms);
    printf("estimate (one micro-step timed: %.1f ms x %d per step%s): %s per step, %s for the %d steps %s, + %s for %d val bpb evaluations\n",
           micro_ms, run->accum, update, duration(step_s).c_str(), duration(train_s).c_str(), n - first, first > 0 ? "left" : "of the run",
           duration(eval_s).c_str(), evals);
    if (train_s + eval_s > 86400.0)
        printf("warning: this run would take about %s on this backend (%s); a GPU, a smaller model (-d) or fewer steps (-n) would "
               "shorten it\n", duration(train_s + eval_s).c_str(), backend_device_name().c_str());
}

// A learnable XSA alpha: each layer's mean over heads printed, every (layer, head) logged as
// {"kind": "xsa_alpha", "alpha": {"LAYER": [alpha per head], ..}}.
template <typename Loader>
static void log_learned_alpha(Run<Loader>* run, int step) {
    const GPTConfig& c = run->args.config;
    std::vector<float> alpha((size_t)c.n_layer * c.n_head);
    backend_download(alpha.data(), run->model.xsa_alpha, alpha.size() * sizeof(float));
    JsonLine layers;
    std::string means;
    for (int l = 0; l < c.n_layer; l++) {
        if (!layer_has_xsa(c, l)) continue;
        const std::vector<double> heads(alpha.begin() + (size_t)l * c.n_head, alpha.begin() + (size_t)(l + 1) * c.n_head);
        layers.array(std::to_string(l).c_str(), heads, "%.6f");
        char buf[48];
        snprintf(buf, sizeof buf, "%s%d: %.4f", means.empty() ? "" : ", ", l, mean_of(heads));
        means += buf;
    }
    printf("step %d/%d | learned XSA alpha, mean over heads: %s\n", step, run->num_steps, means.c_str());
    metrics_write(&run->metrics, JsonLine().num("step", (long long)step).str("kind", "xsa_alpha").raw("alpha", layers.text()));
}

// Validation bits per byte and the attention diagnostics: printed and logged.
template <typename Loader>
static void run_evaluate(Run<Loader>* run, int step) {
    const double t0 = wall_ms();
    Diagnostics diag;
    const double bpb = evaluate_bpb(&run->model, &run->val, &run->tok, run->eval_steps, &diag);
    ranks_check_identical(&run->model, step);
    if (!std::isfinite(bpb)) fail("val bpb is %f at step %d; stopping (the last checkpoint, if any, is intact)", bpb, step);
    printf("step %d/%d | val bpb %.6f | %.1f s\n", step, run->num_steps, bpb, (wall_ms() - t0) / 1000.0);
    const long eval_tokens = (long)run->eval_steps * run->B * run->T;
    metrics_write(&run->metrics, JsonLine().num("step", (long long)step).str("kind", "eval").num("val_bpb", bpb, "%.8f").num("eval_tokens", (long long)eval_tokens));
    const GPTConfig& c = run->args.config;
    if (c.xsa_learnable) log_learned_alpha(run, step);
    if (diag.cos_yv.empty()) return;
    char after_xsa[64] = "";
    if (std::count(c.xsa_layer.begin(), c.xsa_layer.end(), true) > 0)
        snprintf(after_xsa, sizeof after_xsa, " -> cos(z, v) %.4f after XSA", mean_of(diag.cos_zv));
    printf("step %d/%d | layer means: cos(y, v) %.4f%s | cos(v_i, v_j) %.4f | self weight %.4f\n", step, run->num_steps, mean_of(diag.cos_yv),
           after_xsa, mean_of(diag.value_cos), mean_of(diag.self_weight));
    metrics_write(&run->metrics, JsonLine().num("step", (long long)step).str("kind", "diag").array("cos_yv", diag.cos_yv, "%.6f")
                                     .array("cos_zv", diag.cos_zv, "%.6f").array("self_weight", diag.self_weight, "%.6f")
                                     .array("value_cos", diag.value_cos, "%.6f"));
}

// CORE: the task table, the value, a metrics line and DIR/core_STEP.csv.
template <typename Loader>
static void run_core(Run<Loader>* run, int step) {
    const double t0 = wall_ms();
    CoreResult core = core_evaluate(&run->model, run->core_tasks, run->args.core_max_per_task);
    core_print(core);
    if (!std::isfinite(core.core)) fail("CORE is %f at step %d; stopping (the last checkpoint, if any, is intact)", core.core, step);
    printf("step %d/%d | CORE %.6f | %.1f s\n", step, run->num_steps, core.core, (wall_ms() - t0) / 1000.0);
    if (run->metrics.fd < 0) return;
    JsonLine centered;
    for (const CoreTaskResult& t : core.tasks) centered.num(t.label.c_str(), t.centered, "%.8f");
    metrics_write(&run->metrics, JsonLine().num("step", (long long)step).str("kind", "core").num("core", core.core, "%.8f").raw("centered", centered.text()));
    char name[64];
    snprintf(name, sizeof name, "/core_%06d.csv", step);
    core_write_csv(core, run->out_dir + name);
}

// The mean time of this process's timed steps, or `untimed` before there are any. Only this process's: after a
// resume, the steps before it ran at another time, maybe on another machine.
template <typename Loader>
static double mean_step_ms(const Run<Loader>* run, double untimed) {
    return run->step_ms.empty() ? untimed : run->step_ms_sum / run->step_ms.size();
}

// One optimizer step, with its console line and metrics line. `first`: the first step of this process,
// left out of the timings.
template <typename Loader>
static void run_train_step(Run<Loader>* run, int step, bool first) {
    LoopState& loop = run->loop;
    const double t0 = wall_ms();
    const StepResult result = train_step(&run->model, &run->opt, &run->train, run->accum, step);
    const double loss = result.loss, lrm = result.lrm;
    const double dt = wall_ms() - t0;
    loop.step = step + 1;
    loop.smooth_loss = 0.9 * loop.smooth_loss + 0.1 * loss;
    if (!first) {
        loop.train_ms += dt;
        run->step_ms.push_back(dt);
        run->step_ms_sum += dt;
        run->optimizer_ms.push_back(result.optimizer_ms);
    }
    const int n = run->num_steps;
    const double tok_per_s = (double)run->plan.total_batch / (dt / 1000.0);
    const double eta_min = (n - step - 1) * mean_step_ms(run, dt) / 60000.0, elapsed_min = (wall_ms() - run->start_ms) / 60000.0;
    const double flops_per_s = run->flops_per_step / (dt / 1000.0);
    const double mfu = run->peak_flops > 0 ? flops_per_s / run->peak_flops : NAN;  // a CPU, or an unknown GPU: no MFU, not a made-up one
    char mfu_text[32] = "n/a";
    if (std::isfinite(mfu)) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100.0 * mfu);
    printf("step %d/%d (%.1f%%) | loss %.6f (smoothed) | grad norm %.4f | lrm %.4f | %.1f ms | %.0f tok/s | MFU %s | %.2f TFLOP/s | %.1f min, "
           "ETA %.1f min\n",
           step + 1, n, 100.0 * (step + 1) / n, loop.smooth_loss / (1.0 - pow(0.9, step + 1)), result.grad_norm, lrm, dt, tok_per_s, mfu_text,
           flops_per_s / 1e12, elapsed_min, eta_min);
    if (first && backend_memory_in_use() > 0)
        printf("device memory in use after the first step: %.2f GiB (measured)\n", backend_memory_in_use() / 1073741824.0);
    metrics_write(&run->metrics, JsonLine().num("step", (long long)step).str("kind", "train").num("loss", loss, "%.8f").num("grad_norm", result.grad_norm, "%.6g").num("lr_mult", lrm, "%.8f")
                                     .num("muon_momentum", result.momentum, "%.8f")
                                     .num("dt_ms", dt, "%.3f").num("optimizer_ms", result.optimizer_ms, "%.3f").num("tok_per_s", tok_per_s, "%.1f")
                                     .num("mfu", mfu, "%.6f"));
}

// A checkpoint at the current step (every rank takes part; rank 0 writes it), with the metrics on disk.
template <typename Loader>
static void run_checkpoint(Run<Loader>* run) {
    const std::string path = checkpoint_path(run->out_dir, run->loop.step);
    save_checkpoint(path, &run->model, &run->opt, &run->train, &run->val, run->loop);
    metrics_sync(&run->metrics);
    printf("checkpoint %s\n", path.c_str());
    run->last_checkpoint = path;
    if (run->args.keep_checkpoints > 0 && g_ranks.rank == 0) remove_old_checkpoints(run->out_dir, run->args.keep_checkpoints);
}

// The end of a run stopped by SIGINT, SIGTERM or SIGHUP, after a step: a checkpoint (there is -o: without, nothing to save), one line saying
// where it stopped and how to go on, and the exit code of the signal (130, 143, 129).
template <typename Loader>
[[noreturn]] static void run_stop(Run<Loader>* run, int sig) {
    // (only with -o: without, there is nothing to save and the request ended the run at once, on_stop_signal)
    run->loop.evals_done = false;  // the evaluations of this step are still to run, on resume
    run_checkpoint(run);
    std::string resume = run->argv[0];  // the same command, its output directory given as --resume
    for (size_t i = 1; i < run->argv.size(); i++) {
        const std::string& w = run->argv[i];
        if (is_output_option(w)) {
            i++;
            continue;
        }
        if (w.rfind("--", 0) == 0 && w.find('=') != std::string::npos && is_output_option(w.substr(0, w.find('=')))) continue;
        resume += " " + (w.find_first_of(" '\"$*?") == std::string::npos ? w : "'" + w + "'");
    }
    const std::string saved = std::string("resume with: ") + (g_ranks.launched ? "(every rank, started as this one was) " : "") + resume +
                              " --resume " + run->out_dir;
    metrics_close(&run->metrics);
    if (g_ranks.rank == 0)
        printf("stopped by %s after step %d/%d; %s\n", sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM", run->loop.step, run->num_steps,
               saved.c_str());
    exit(128 + sig);
}

// The end of a run: throughput, the exported weights, files closed, memory freed.
template <typename Loader>
static void run_finish(Run<Loader>* run) {
    if (!run->step_ms.empty()) {
        auto median = [](std::vector<double> ms) {
            std::sort(ms.begin(), ms.end());
            return ms[ms.size() / 2];
        };
        const double step_ms = median(run->step_ms);
        printf("training: %.0f tok/s (median over %zu steps, %.1f ms per step, of which the optimizer %.1f ms: gradient sums, update%s); "
               "training time %.1f s\n", run->plan.total_batch / (step_ms / 1000.0), run->step_ms.size(), step_ms, median(run->optimizer_ms),
               run->opt.shards > 1 ? (", gathering; sharded over " + std::to_string(run->opt.shards) + " ranks").c_str() : "",
               run->loop.train_ms / 1000.0);
    }
    if (!run->args.export_path.empty() && g_ranks.rank == 0) {
        gpt_save_weights(&run->model, run->args.export_path);
        printf("weights written to %s\n", run->args.export_path.c_str());
    }
    metrics_close(&run->metrics);
    dataloader_free(&run->train);
    dataloader_free(&run->val);
    optimizer_free(&run->opt);
    gpt_free(&run->model);
}

// Before any set-up: the command line's outputs checked, the stop signals caught, the ranks started (from
// here on this process is one of them), the backend initialised with the command line's switches.
template <typename Loader>
static void run_begin(Run<Loader>* run, int argc, char** argv) {
    run->argv.assign(argv, argv + argc);
    const Args& a = run->args;
    check_outputs(a);
    install_stop_handlers();  // inherited by the ranks; their supervisor passes the signals on to them
    ranks_launch(a.ranks, a.rendezvous);  // forks or joins the ranks, if several
#ifdef _OPENMP
    if (a.threads > 0) omp_set_num_threads(a.threads);  // per rank, after ranks_launch shared the cores among them
#endif
    backend_init();
    g_backend.xsa_fused = a.xsa_fused;
    g_backend.graphs = a.cuda_graphs;
    g_progress_every_ms = a.progress_every * 1000.0;
}

// What a stop request prints at once (on_stop_signal), before step `step`: with -o, the run finishes that step and
// writes a checkpoint; without, there is nothing to save and the request ends the run at once.
template <typename Loader>
static void run_stop_texts(Run<Loader>* run, int step) {
    if (run->out_dir.empty()) return;  // g_stop_at_once stays set
    const double ms = mean_step_ms(run, run->estimate_step_ms);
    char about[64] = "";
    if (ms > 0) snprintf(about, sizeof about, ", about %.0f s", ms / 1000.0);
    stop_texts_set("stop requested: finishing step " + std::to_string(step + 1) + " of " + std::to_string(run->num_steps) + about +
                       ", then a checkpoint into " + run->out_dir + "; stop again (a second or more later) to end at once",
                   "stopped at once during step " + std::to_string(step + 1) + "; " +
                       (run->last_checkpoint.empty() ? "no checkpoint was written yet" : "the last checkpoint, " + run->last_checkpoint + ", is intact"));
    g_stop_at_once = 0;
}

// The run, once set up: the estimate, then the loop of evaluations, samples, checkpoints and steps, then the
// end. evaluate_more(step, last): the program's own evaluations after the shared ones (chat_sft: ChatCORE).
template <typename Loader, typename Evaluate>
static void run_train(Run<Loader>* run, Evaluate evaluate_more) {
    const Args& a = run->args;
    run_estimate(run);
    run->flops_per_step = flops_per_token(a.config) * (double)run->plan.total_batch;
    run->peak_flops = backend_peak_flops() * g_ranks.world;  // MFU of all the ranks' GPUs together
    ranks_setup_done();

    const int first_step = run->loop.step;
    run->start_ms = wall_ms();
    for (int step = first_step;; step++) {
        const bool last = step == run->num_steps;
        auto due = [&](int every) { return last || (every > 0 && step % every == 0); };
        // a resumed run did the evaluations, samples and checkpoint of its first step before it stopped
        // (unless a signal stopped it right after the step's update)
        if (!(step == first_step && !a.resume_dir.empty() && run->loop.evals_done)) {
            run->loop.evals_done = true;  // as the step's checkpoint, if any, will record
            if (due(a.eval_every)) run_evaluate(run, step);
            if (step > 0 && !run->core_tasks.empty() && due(a.core_every)) run_core(run, step);
            if (step > 0) evaluate_more(step, last);
            if (step > 0 && g_ranks.rank == 0 && a.sample_every > 0 && due(a.sample_every)) print_samples(&run->model, &run->tok, step);
            if (step > 0 && !run->out_dir.empty() && due(a.save_every)) run_checkpoint(run);
        }
        if (last) break;
        run_stop_texts(run, step);
        run_train_step(run, step, step == first_step);
        if (const int sig = stop_requested()) run_stop(run, sig);
    }
    run_finish(run);
}

#ifndef TRAIN_GPT_NO_MAIN  // chat/chat_sft.cu, the tests and tools use this file as a library: everything but main()
int main(int argc, char** argv) {
    openmp_short_spin(argv);  // first: it may start the program again (common.h says why)
    setvbuf(stdout, nullptr, _IOLBF, 0);  // every line reaches a pipe or log file as it is printed
    Run<DataLoader> run;
    run.args = parse_run_arguments(argc, argv, &run.recorded_words);
    run_begin(&run, argc, argv);
    run_setup_plan(&run);
    if (run.args.steps == 0) {  // -n 0: the model, the plan and what it means for the data only
        run_open_data(&run);
        return 0;
    }
    run_setup_data(&run);
    run_setup_model(&run);
    run_train(&run, [](int, bool) {});
    return 0;
}

#endif  // TRAIN_GPT_NO_MAIN
