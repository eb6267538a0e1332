// sft_loader.h: conversations for SFT (dev/docs/data.md#sft-conversations): the conversation files of dev/data/sft.py
// and nanochat's chat_sft packing of them.
//
// File layout: int32 header[256]: [0] = 20261202 (magic), [1] = 1 (version), [2], [3] = conversations C
// (low, high 32 bits), [4], [5] = tokens N (low, high), [6] = the tokenizer's vocabulary size, [7] its BOS
// id, [8] the max_tokens the conversations were cropped to; then uint64 offsets[C + 1] (conversation c is
// tokens[offsets[c] .. offsets[c + 1])), uint32 tokens[N], uint8 mask[N] (1: the model learns to predict
// this token: the assistant's words, nanochat's render_conversation mask). Each conversation starts with BOS.
//
// Packing (nanochat's sft_data_generator_bos_bestfit), per row of T+1 tokens: keep a buffer of 100
// conversations (refilled one at a time, rank r fetching conversations r, r+W, r+2W, .. and wrapping around
// for another epoch); put in the longest conversation that fits (the first of equal length); when none
// fits, pad the rest of the row with BOS, masked. Nothing is cropped: a conversation longer than a row
// (never at nanochat's T = 2048 with its max_tokens = 2048) is cut to the row's T+1 tokens when fetched.
// inputs = row[0:T], targets = row[1:T+1], with IGNORE_INDEX where the target's mask is 0. The pass ends
// (last_batch) with the batch that takes the file's last conversation (counted as nanochat counts:
// `consumed` starts at the rank and grows by W per conversation), or with batch -n when -n is given.

#pragma once

#include "../dataloader.h"

static const int CONVERSATION_MAGIC = 20261202;

struct ConversationFile : MappedFile {
    uint64_t count = 0, ntokens = 0;
    int vocab_size = 0, bos_id = 0, max_tokens = 0;
    const uint64_t* offsets() const { return (const uint64_t*)((const char*)map + SHARD_HEADER_BYTES); }
    const uint32_t* tokens() const { return (const uint32_t*)(offsets() + count + 1); }
    const uint8_t* mask() const { return (const uint8_t*)(tokens() + ntokens); }
};

// Maps a conversation file and checks its header against the file's size and the tokenizer (vocab_size,
// bos_id). Conversations are checked as they are fetched (conversation_span).
static inline void conversation_file_open(ConversationFile* f, const std::string& path, int vocab_size, int bos_id) {
    int32_t header[SHARD_HEADER_INTS] = {};  // (initialised: nvcc cannot see that mapped_file_open fills it first)
    mapped_file_open(f, path, "conversation file", header, SHARD_HEADER_BYTES, [&](uint64_t file_bytes) {
        if (header[0] != CONVERSATION_MAGIC)
            fail("'%s' is not a conversation file (magic %d, expected %d; dev/data/sft.py writes them)", path.c_str(), header[0], CONVERSATION_MAGIC);
        if (header[1] != 1) fail("conversation file '%s' has version %d; this build reads 1", path.c_str(), header[1]);
        f->count = (uint64_t)(uint32_t)header[2] | ((uint64_t)(uint32_t)header[3] << 32);
        f->ntokens = (uint64_t)(uint32_t)header[4] | ((uint64_t)(uint32_t)header[5] << 32);
        f->vocab_size = header[6];
        f->bos_id = header[7];
        f->max_tokens = header[8];
        const uint64_t body = file_bytes - SHARD_HEADER_BYTES;  // = 8 (C + 1) + 5 N, compared without overflow
        if (f->count == 0) fail("conversation file '%s' holds no conversations", path.c_str());
        if (f->count > body / 8 || f->ntokens > body / 5 || 8 * (f->count + 1) + 5 * f->ntokens != body)
            fail("conversation file '%s' is truncated or corrupt: its header promises %llu conversations of %llu tokens in all, which take %s bytes "
                 "after the 1024-byte header; the file has %llu", path.c_str(), (unsigned long long)f->count, (unsigned long long)f->ntokens,
                 f->count > body / 8 || f->ntokens > body / 5 ? "more" : std::to_string(8 * (f->count + 1) + 5 * f->ntokens).c_str(),
                 (unsigned long long)body);
        if (f->vocab_size != vocab_size || f->bos_id != bos_id)
            fail("conversation file '%s' was written with a tokenizer of %d tokens and BOS %d; this model's has %d and BOS %d (prepare it with the "
                 "model's tokenizer)", path.c_str(), f->vocab_size, f->bos_id, vocab_size, bos_id);
    });
    // the index covers the tokens exactly: the first conversation starts at token 0, the last ends at the last token
    const uint64_t first = f->offsets()[0], last = f->offsets()[f->count];
    if (first != 0 || last != f->ntokens) {
        mapped_file_close(f);  // (the fuzz build's fail() throws: nothing left mapped)
        fail("conversation file '%s' is corrupt: %s %llu, but it holds %llu tokens (its index of %llu conversations does not cover them; "
             "write it again with dev/data/sft.py)", path.c_str(), first != 0 ? "its first conversation starts at token" : "its last conversation ends at token",
             (unsigned long long)(first != 0 ? first : last), (unsigned long long)f->ntokens, (unsigned long long)f->count);
    }
}

struct ConversationSpan {
    uint64_t index;  // which conversation
    uint64_t start;  // index of its first token
    int length;      // tokens, after the cut to a row
};

// Conversation c as the packer uses it (at most max_length tokens), checked: its offsets in order and in
// the file, BOS first, ids in the vocabulary, mask values 0 or 1 (once, when it is fetched).
static inline ConversationSpan conversation_span(const ConversationFile& f, uint64_t c, int max_length) {
    mapped_file_check(f);
    if (c >= f.count)  // (sft_loader_init refuses fewer conversations than ranks, where a rank's first would be past the end)
        fail("conversation file '%s' holds %llu conversation%s; conversation %llu was asked for (fewer conversations than ranks?)", f.path.c_str(),
             (unsigned long long)f.count, f.count == 1 ? "" : "s", (unsigned long long)c);
    const uint64_t begin = f.offsets()[c], end = f.offsets()[c + 1];
    if (begin >= end || end > f.ntokens || (c == 0 && begin != 0))
        fail("conversation file '%s' is corrupt: conversation %llu spans tokens [%llu, %llu) of %llu", f.path.c_str(), (unsigned long long)c,
             (unsigned long long)begin, (unsigned long long)end, (unsigned long long)f.ntokens);
    const uint32_t* tokens = f.tokens();
    if (tokens[begin] != (uint32_t)f.bos_id)
        fail("conversation file '%s': conversation %llu starts with token %u, not BOS (%d)", f.path.c_str(), (unsigned long long)c, tokens[begin], f.bos_id);
    const int length = (int)std::min<uint64_t>(end - begin, (uint64_t)max_length);
    for (int i = 0; i < length; i++)
        if (tokens[begin + i] >= (uint32_t)f.vocab_size || f.mask()[begin + i] > 1)
            fail("conversation file '%s': conversation %llu has token id %u or mask value %u at position %d (ids must be < %d, masks 0 or 1)",
                 f.path.c_str(), (unsigned long long)c, tokens[begin + i], f.mask()[begin + i], i, f.vocab_size);
    return {c, begin, length};
}

struct SftLoader {
    ConversationFile file;
    int B = 0, T = 0;
    int rank = 0, world = 1;
    int buffer_target = 100;    // conversations kept to choose from (nanochat: 100)
    long num_batches = -1;      // -n: the pass ends after this many batches (training only); -1: after one epoch
    // state (checkpoints): the next conversation to fetch, the conversations taken into rows (from `rank`, W
    // each), the epoch of the fetch position, the batches made, and the buffered conversations
    uint64_t cursor = 0, consumed = 0;
    int64_t epoch = 1, batches = 0;
    std::vector<ConversationSpan> buffer;  // checked when fetched (conversation_span)
    std::string identity;       // the data's identity that checkpoints record (sft.h: sft_data_identity; "": not computed)
    // after each batch
    bool last_batch = false;    // nanochat's last_step: this batch took the last conversation of the pass
    double progress = 0.0;      // batches / num_batches with -n, else consumed / conversations
    std::vector<int> inputs, targets;  // (B, T) of the last batch
    std::vector<int> row;              // (T + 1) scratch
    std::vector<uint8_t> row_mask;     // (T + 1) scratch
};

static inline void dataloader_reset(SftLoader* dl) {
    dl->cursor = dl->consumed = (uint64_t)dl->rank;
    dl->epoch = 1;
    dl->batches = 0;
    dl->buffer.clear();
    dl->last_batch = false;
    dl->progress = 0.0;
}

static inline void sft_loader_init(SftLoader* dl, const std::string& path, int vocab_size, int bos_id, int B, int T, int rank, int world,
                                   long num_batches) {
    *dl = SftLoader();
    conversation_file_open(&dl->file, path, vocab_size, bos_id);
    // rank r takes conversations r, r + W, ..: each rank needs one of its own (checked on every rank, so that all end alike)
    if ((uint64_t)world > dl->file.count) {
        const unsigned long long count = dl->file.count;
        mapped_file_close(&dl->file);
        fail("conversation file '%s' holds %llu conversation%s, fewer than the %d ranks: each rank trains on conversations of its own "
             "(rank r takes r, r + %d, ..); run on at most %llu rank%s", path.c_str(), count, count == 1 ? "" : "s", world, world, count,
             count == 1 ? "" : "s");
    }
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world = world;
    dl->num_batches = num_batches;
    dl->inputs.resize((size_t)B * T);
    dl->targets.resize((size_t)B * T);
    dl->row.resize((size_t)T + 1);
    dl->row_mask.resize((size_t)T + 1);
    dataloader_reset(dl);
}

static inline void dataloader_free(SftLoader* dl) {
    mapped_file_close(&dl->file);
    *dl = SftLoader();
}

// last_batch and progress after the batches made so far: the pass ends with batch -n (given) or with the
// batch that brings `consumed` to the number of conversations
static inline void sft_loader_pass_state(SftLoader* dl) {
    const uint64_t count = dl->file.count;
    dl->last_batch = (dl->num_batches > 0 && dl->batches >= dl->num_batches) || dl->consumed >= count;
    dl->progress = dl->num_batches > 0 ? (double)dl->batches / dl->num_batches : (double)dl->consumed / count;
}

// Packs the next B rows into dl->inputs and dl->targets (B, T), and updates last_batch and progress.
static inline void dataloader_next_batch(SftLoader* dl) {
    const ConversationFile& f = dl->file;
    const int capacity = dl->T + 1;
    for (int b = 0; b < dl->B; b++) {
        int filled = 0;
        while (filled < capacity) {
            while ((int)dl->buffer.size() < dl->buffer_target) {
                dl->buffer.push_back(conversation_span(f, dl->cursor, capacity));
                dl->cursor += (uint64_t)dl->world;
                if (dl->cursor >= f.count) {
                    dl->cursor %= f.count;
                    dl->epoch++;
                }
            }
            const int remaining = capacity - filled;
            int best = -1, best_length = 0;
            for (int i = 0; i < (int)dl->buffer.size(); i++) {
                const int length = dl->buffer[i].length;
                if (length <= remaining && length > best_length) best = i, best_length = length;
            }
            if (best < 0) {  // none fits: pad, masked
                std::fill(dl->row.begin() + filled, dl->row.end(), f.bos_id);
                std::fill(dl->row_mask.begin() + filled, dl->row_mask.end(), 0);
                break;
            }
            const ConversationSpan span = dl->buffer[best];
            mapped_file_check(f);
            dl->buffer.erase(dl->buffer.begin() + best);
            dl->consumed += (uint64_t)dl->world;
            for (int i = 0; i < span.length; i++) {
                dl->row[filled + i] = (int)f.tokens()[span.start + i];
                dl->row_mask[filled + i] = f.mask()[span.start + i];
            }
            filled += span.length;
        }
        for (int t = 0; t < dl->T; t++) {
            dl->inputs[(size_t)b * dl->T + t] = dl->row[t];
            dl->targets[(size_t)b * dl->T + t] = dl->row_mask[t + 1] ? dl->row[t + 1] : IGNORE_INDEX;
        }
    }
    dl->batches++;
    sft_loader_pass_state(dl);
}

// The state as integers, for checkpoints: cursor, consumed, epoch, batches, then the buffered conversations.
static inline std::vector<int64_t> dataloader_state(const SftLoader* dl) {
    std::vector<int64_t> s = {(int64_t)dl->cursor, (int64_t)dl->consumed, dl->epoch, dl->batches, (int64_t)dl->buffer.size()};
    for (const ConversationSpan& c : dl->buffer) s.push_back((int64_t)c.index);
    return s;
}

// Restores a state from a checkpoint (`source` names it), checked against the file; last_batch and
// progress are those of the batch the state was saved after.
static inline void dataloader_restore(SftLoader* dl, const std::vector<int64_t>& s, const char* source) {
    auto bad = [&](const char* what) {
        fail("%s: the SFT loader state does not match '%s' (%s; a different conversation file?)", source, dl->file.path.c_str(), what);
    };
    const int64_t count = (int64_t)dl->file.count;
    if (s.size() < 5 || s[4] < 0 || s.size() != 5 + (size_t)s[4]) bad("wrong length");
    if (s[0] < 0 || s[0] >= count || s[1] < 0 || s[2] < 1 || s[3] < 0) bad("position out of range");
    std::vector<ConversationSpan> buffer;
    for (size_t i = 5; i < s.size(); i++) {
        if (s[i] < 0 || s[i] >= count) bad("a buffered conversation is out of range");
        buffer.push_back(conversation_span(dl->file, (uint64_t)s[i], dl->T + 1));
    }
    dl->cursor = (uint64_t)s[0];
    dl->consumed = (uint64_t)s[1];
    dl->epoch = s[2];
    dl->batches = s[3];
    dl->buffer = buffer;
    sft_loader_pass_state(dl);
}
