// engine.h: generation (nanochat's engine): a KV cache per layer, the prompt's forward (prefill), then one
// token per row at a time reading the earlier tokens from the cache (decode); sampling; generate() with an
// optional tool that forces tokens in (the calculator of chat generation: chat/tool.h). The trainer's
// greedy samples, ChatCORE, sample and chat_cli all generate through it. Part of train_gpt.cu,
// included after the model's forward (the decode step runs the same ops on the same weights).
#pragma once

// What the earlier tokens of each row leave for the next one: every layer's k (after rotary and QK-norm)
// and v (after the value-embedding mix), and, for the smear, the previous token's normed embedding.
// Windowed layers read only the last window + 1 positions of their cache. One backend allocation.
struct KVCache {
    int B = 0, S = 0;               // rows, and positions each row can hold (<= the model's seq_len)
    std::vector<floatX*> k, v;      // per layer (B, S, Hkv, D)
    floatX* smear_in = nullptr;     // (B, 2, C) smear only: [previous token's normed embedding, this token's]
    floatX* smear_out = nullptr;    // (B, 2, C) smear_forward's output on those pairs
    float* smear_logit = nullptr;   // (B, 2)
    int* pos = nullptr;             // (B) backend memory: the position of each row's next token
    std::vector<int> len;           // the same on the host: tokens in each row's cache
    char* memory = nullptr;
};

static void kv_cache_carve(KVCache* kv, Carver* cv, const GPTConfig& c) {
    const size_t rows = (size_t)kv->B * kv->S * c.n_kv_head * c.head_dim, pairs = (size_t)kv->B * 2;
    kv->k.assign(c.n_layer, nullptr);
    kv->v.assign(c.n_layer, nullptr);
    for (int l = 0; l < c.n_layer; l++) {
        kv->k[l] = cv->take<floatX>(rows);
        kv->v[l] = cv->take<floatX>(rows);
    }
    kv->smear_in = cv->take<floatX>(pairs * c.n_embd);
    kv->smear_out = cv->take<floatX>(pairs * c.n_embd);
    kv->smear_logit = cv->take<float>(pairs);
    kv->pos = cv->take<int>(kv->B);
}

// An empty cache of B rows of S positions (1 <= S <= seq_len: generation stays within the trained context)
static void kv_cache_init(KVCache* kv, GPT* model, int B, int S) {
    const GPTConfig& c = model->config;
    if (B < 1 || S < 1 || S > c.seq_len) fail("KV cache of %d rows x %d positions: need >= 1 row and 1..%d positions (the model's seq_len)", B, S, c.seq_len);
    *kv = KVCache();
    kv->B = B;
    kv->S = S;
    kv->len.assign(B, 0);
    Carver count{nullptr, 0};
    kv_cache_carve(kv, &count, c);
    kv->memory = (char*)backend_malloc(count.used, "KV cache");
    Carver assign{kv->memory, 0};
    kv_cache_carve(kv, &assign, c);
    gpt_ensure_rope(model, S);
}

static void kv_cache_free(KVCache* kv) {
    backend_free(kv->memory);
    *kv = KVCache();
}

// Prefill: runs row `row`'s tokens (T of them, the row's whole sequence so far: a prompt, BOS first)
// through the model as one sequence, and fills the row's cache with them. Leaves the logits of every
// position in acts.logits (T, V).
static void gpt_prefill(GPT* model, KVCache* kv, int row, const int* tokens, int T) {
    const GPTConfig& c = model->config;
    if (row < 0 || row >= kv->B || T < 1 || T > kv->S) fail("prefill of %d tokens into row %d of a %d x %d KV cache", T, row, kv->B, kv->S);
    gpt_forward(model, tokens, nullptr, 1, T);
    const size_t kvd = (size_t)c.n_kv_head * c.head_dim, row_start = (size_t)row * kv->S * kvd;
    const size_t pitch = qkv_fused(c.n_head, c.n_kv_head, c.head_dim).kv * sizeof(floatX);  // of the rows of k and v in acts.qkv
    for (int l = 0; l < c.n_layer; l++) {
        backend_copy_rows(kv->k[l] + row_start, kvd * sizeof(floatX), model->acts.layer[l].k, pitch, kvd * sizeof(floatX), T);
        backend_copy_rows(kv->v[l] + row_start, kvd * sizeof(floatX), model->acts.layer[l].v, pitch, kvd * sizeof(floatX), T);
    }
    if (c.smear) backend_copy(kv->smear_in + (size_t)row * 2 * c.n_embd, model->acts.emb_norm + (size_t)(T - 1) * c.n_embd, c.n_embd * sizeof(floatX));
    kv->len[row] = T;
}

// Decode: the forward of one new token per row (tokens (B), row b's at position kv->len[b]), reading the
// earlier tokens from the cache and appending this one's to it. The ops and weights of gpt_forward_pass on
// the same values; only the smear, the rotary and attention take the earlier tokens from the cache. Leaves
// the softcapped logits (B, V) in acts.logits. Every row must have room for one more token.
static void gpt_decode_step(GPT* model, KVCache* kv, const int* tokens) {
    const GPTConfig& c = model->config;
    const int B = kv->B, S = kv->S, C = c.n_embd, H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
    const size_t kvd = (size_t)Hkv * D, half = D / 2;
    const QKVStrides strides = qkv_fused(H, Hkv, D);
    for (int b = 0; b < B; b++)
        if (kv->len[b] < 1 || kv->len[b] >= S) fail("decode step on row %d holding %d of %d positions (prefill it first; it must not be full)", b, kv->len[b], S);
    gpt_set_batch(model, tokens, nullptr, B, 1);
    backend_upload(kv->pos, kv->len.data(), B * sizeof(int));
    Acts& a = model->acts;
    const Weights& w = model->w;
    embedding_forward(a.emb_norm, a.idx, w.wte, B, C);
    rmsnorm_forward(a.emb_norm, a.emb_rstd, a.emb_norm, B, C, 1.0f);
    if (c.smear) {  // the smear of each row's pair (previous token, this token); the pair's second output is x0
        for (int b = 0; b < B; b++) backend_copy(kv->smear_in + ((size_t)2 * b + 1) * C, a.emb_norm + (size_t)b * C, C * sizeof(floatX));
        smear_forward(kv->smear_out, kv->smear_logit, kv->smear_in, w.smear_gate, w.smear_lambda, B, 2, C);
        for (int b = 0; b < B; b++) {
            backend_copy(a.x0 + (size_t)b * C, kv->smear_out + ((size_t)2 * b + 1) * C, C * sizeof(floatX));
            backend_copy(kv->smear_in + (size_t)2 * b * C, a.emb_norm + (size_t)b * C, C * sizeof(floatX));  // the next step's previous token
        }
    }
    const floatX* x = a.x0;
    for (int l = 0; l < c.n_layer; l++) {
        LayerActs& la = a.layer[l];
        block_forward_qkv(model, l, x, B);
        for (int b = 0; b < B; b++) {  // rotary at each row's own position: the tables from that position on
            const size_t p = (size_t)kv->len[b];
            rotary_rmsnorm_forward(la.q + b * strides.q, strides.q, la.q_rstd + (size_t)b * H, model->rope_cos + p * half, model->rope_sin + p * half, 1, 1,
                                   H, D, QK_SCALE);
            rotary_rmsnorm_forward(la.k + b * strides.kv, strides.kv, la.k_rstd + (size_t)b * Hkv, model->rope_cos + p * half, model->rope_sin + p * half, 1,
                                   1, Hkv, D, QK_SCALE);
            backend_copy(kv->k[l] + ((size_t)b * S + p) * kvd, la.k + b * strides.kv, kvd * sizeof(floatX));
            backend_copy(kv->v[l] + ((size_t)b * S + p) * kvd, la.v + b * strides.kv, kvd * sizeof(floatX));
        }
        attention_decode_xsa_forward(la.z, la.y, la.q, kv->k[l], kv->v[l], la.v, strides, kv->pos, B, S, H, Hkv, D, layer_window(c, l),
                                     layer_alpha(model, l));
        block_forward_output_mlp(model, l, B);
        x = la.x_out;
    }
    gpt_forward_head(model, x, B, false);
    for (int b = 0; b < B; b++) kv->len[b]++;
}

// Row `row` of the last forward's softcapped logits, as floats on the host (V of them)
static void gpt_logits_row(const GPT* model, size_t row, float* out) {
    const int V = model->config.vocab_size;
    std::vector<floatX> logits(V);
    backend_download(logits.data(), model->acts.logits + row * V, V * sizeof(floatX));
    for (int v = 0; v < V; v++) out[v] = (float)logits[v];
}

struct SamplingOptions {
    float temperature = 0.0f;  // 0: greedy (the first maximum on ties)
    int top_k = 0;             // sample among the k most likely tokens; 0: all
};

// A token drawn from logits (V): greedy at temperature 0, else from softmax(logits / temperature)
// restricted to the top_k largest (ties at the k-th value: the lower ids), with one uniform draw of rng.
static int sample_token(const float* logits, int V, const SamplingOptions& opt, Rng* rng) {
    if (opt.temperature <= 0.0f) return (int)(std::max_element(logits, logits + V) - logits);
    std::vector<int> ids(V);
    for (int v = 0; v < V; v++) ids[v] = v;
    const int k = opt.top_k > 0 && opt.top_k < V ? opt.top_k : V;
    auto higher = [&](int x, int y) { return logits[x] > logits[y] || (logits[x] == logits[y] && x < y); };
    if (k < V) std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
    double max_logit = -INFINITY, total = 0.0;
    for (int i = 0; i < k; i++) max_logit = std::max(max_logit, (double)logits[ids[i]]);
    std::vector<double> weight(k);
    for (int i = 0; i < k; i++) total += weight[i] = exp(((double)logits[ids[i]] - max_logit) / opt.temperature);
    double u = (double)rng_uniform(rng) * total;
    for (int i = 0; i < k; i++) {
        if (u < weight[i]) return ids[i];
        u -= weight[i];
    }
    return ids[k - 1];  // u landed on the rounding error at the top
}

struct GenerateStats {
    long prefill_tokens = 0, decode_steps = 0;  // prompt tokens run; decode steps (each runs one token per row)
    double prefill_ms = 0.0, decode_ms = 0.0;   // wall time of each, including the logits' download
};

// A tool that generation consults (nanochat's Engine has one, the calculator: chat/tool.h): it sees each
// row's tokens (tool_step) and may queue tokens to force in as that row's next ones (Row::forced, the
// next one last). NoTool: plain generation.
struct NoTool {
    struct Row {
        std::vector<int> forced;
    };
};
static inline void tool_step(const NoTool&, NoTool::Row*, int) {}

// Continues each prompt (BOS first, shorter than seq_len; all rows at once after their prefills) until it
// produces a token of `stop`, or max_new tokens, or prompt + new tokens fill the context (seq_len).
// Returns the new tokens of each row (a stop token not included); on_token(row, token), if given, sees
// each as it is produced. Row b draws from its own RNG stream (seed + b), so a row's output does not
// depend on the others.

template <typename OnToken, typename Tool = const NoTool>
static std::vector<std::vector<int>> generate(GPT* model, const std::vector<std::vector<int>>& prompts, int max_new,
                                              const SamplingOptions& opt, uint64_t seed, const std::vector<int>& stop, OnToken on_token,
                                              GenerateStats* stats = nullptr, Tool* tool = nullptr) {
    GenerateStats local;
    GenerateStats& st = stats ? *stats : local;
    const int B = (int)prompts.size(), V = model->config.vocab_size;
    if (B == 0) return {};
    size_t longest = 0;
    for (const std::vector<int>& p : prompts) longest = std::max(longest, p.size());
    const int S = (int)std::min<size_t>(longest + (size_t)std::max(max_new, 0), model->config.seq_len);
    KVCache kv;
    kv_cache_init(&kv, model, B, std::max(S, 1));
    std::vector<std::vector<int>> out(B);
    std::vector<int> next(B);
    std::vector<char> done(B, 0);
    std::vector<Rng> rng(B);
    std::vector<float> logits(V);
    std::vector<typename Tool::Row> tool_rows(B);
    auto take = [&](int b) {  // the logits of row b are in `logits`: draw its next token (or the tool's)
        std::vector<int>& forced = tool_rows[b].forced;
        if (!forced.empty()) {
            next[b] = forced.back();
            forced.pop_back();
        } else {
            next[b] = sample_token(logits.data(), V, opt, &rng[b]);
        }
        if (tool) tool_step(*tool, &tool_rows[b], next[b]);
        if (std::find(stop.begin(), stop.end(), next[b]) != stop.end()) done[b] = 1;
        else {
            out[b].push_back(next[b]);
            on_token(b, next[b]);
        }
        if ((int)out[b].size() >= max_new || kv.len[b] + 1 >= S) done[b] = 1;  // the sequence (len + the new token) fills S
    };
    for (int b = 0; b < B; b++) {
        rng[b] = Rng{seed + (uint64_t)b};
        if (prompts[b].empty() || (int)prompts[b].size() >= model->config.seq_len)
            fail("prompt %zu has %zu tokens; it needs 1 to %d (the model's context of %d, less one for a new token)", (size_t)b, prompts[b].size(),
                 model->config.seq_len - 1, model->config.seq_len);
        if (max_new < 1) {
            done[b] = 1;
            continue;
        }
        const double t0 = wall_ms();
        gpt_prefill(model, &kv, b, prompts[b].data(), (int)prompts[b].size());
        gpt_logits_row(model, prompts[b].size() - 1, logits.data());  // (waits for the device)
        st.prefill_ms += wall_ms() - t0;
        st.prefill_tokens += (long)prompts[b].size();
        take(b);
    }
    while (std::find(done.begin(), done.end(), 0) != done.end()) {
        for (int b = 0; b < B; b++)
            if (done[b] && kv.len[b] >= S) kv.len[b] = S - 1;  // a finished, full row keeps stepping (its output is ignored)
        const double t0 = wall_ms();
        gpt_decode_step(model, &kv, next.data());
        for (int b = 0; b < B; b++) {
            if (done[b]) continue;
            gpt_logits_row(model, b, logits.data());
            take(b);
        }
        st.decode_ms += wall_ms() - t0;
        st.decode_steps++;
    }
    kv_cache_free(&kv);
    return out;
}

