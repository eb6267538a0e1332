// tokenizer.h: the tokenizer file written by dev/data/climbmix.py: every token's raw bytes, which ids
// are special, the BOS id, pre-tokenized sample prompts and (version 2) the split pattern. Training only
// decodes and counts bytes for bits-per-byte (the shards are pre-tokenized); sample and chat_cli encode text
// (chat/encoder.h), token for token as tiktoken does with the same ranks and pattern (dev/data/test_encoder.py
// checks it).
//
// File layout (little-endian):
//   int32 header[256]: [0] = 20241201 (magic), [1] = version (1 or 2), [2] = vocab size V, [3] = BOS id,
//                      [4] = number of sample prompts P, [5] = byte length S of the split pattern
//                      (version 2; 0 in version 1), the rest 0
//   S bytes: the split pattern, UTF-8 (version 2 only)
//   V records, in id order: uint8 is_special, uint32 nbytes, nbytes raw bytes
//   P records: uint32 ntokens, ntokens x uint32 token ids (BOS first)
// A normal token's id is its BPE rank (tiktoken's mergeable_ranks: the lower, the earlier the merge); the
// special tokens come after them. A version-1 file does not store the pattern: it still trains, but
// cannot encode (python3 dev/data/climbmix.py --upgrade-tokenizer FILE rewrites it as version 2, ids kept).
#pragma once

#include <string>
#include <vector>
#include "common.h"

static const int TOKENIZER_MAGIC = 20241201;
static const int TOKENIZER_VERSION = 2;  // the newest this build reads (and climbmix.py writes); 1 is read too

// The split patterns the encoder implements (split_next): nanochat's, and GPT-4's as rustbpe and minbpe
// write it, which differs only in taking up to 3 numbers per chunk instead of 2. (tiktoken's cl100k_base
// itself uses another spelling with different whitespace rules, \s++$ first: not supported.)
static const char* const SPLIT_PATTERN_NANOCHAT =
    R"PAT('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)PAT";
static const char* const SPLIT_PATTERN_GPT4 =
    R"PAT('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)PAT";

// A slot of the rank table: a normal token's id (-1: empty) and the high half of its bytes' hash, which
// rules out most other byte strings without reading the token's bytes.
struct RankSlot {
    int32_t id;
    uint32_t tag;
};

struct Tokenizer {
    std::string path;
    int version = 0;
    int vocab_size = 0;
    int bos_id = -1;
    std::vector<std::string> pieces;      // raw bytes of each token
    std::vector<uint8_t> special;         // 1 for special tokens (<|bos|> and the chat tokens)
    std::vector<int> token_bytes;         // bytes a token stands for in bits-per-byte: 0 for specials
    std::vector<int> special_ids;         // the special tokens, in id order
    std::vector<std::vector<int>> prompts;  // sample prompts, BOS first
    // for encoding (version 2 files)
    std::string pattern;                  // the split pattern, as tiktoken's Encoding has it
    int split_digits = 0;                 // numbers per chunk: 2 (nanochat's pattern), 3 (GPT-4's), 0 (another: cannot encode)
    std::vector<RankSlot> rank_table;     // open addressing: the normal tokens, hashed by their bytes
    size_t max_piece = 0;                 // bytes of the longest normal token (longer byte strings need no lookup)
    int byte_rank[256] = {};              // the id of each single byte
};

// For printing: bytes that are not valid printable text are shown as \xNN (a token may hold half a
// UTF-8 character), newlines as \n.
static inline std::string printable(const std::string& bytes) {
    std::string out;
    for (size_t i = 0; i < bytes.size(); i++) {
        unsigned char c = (unsigned char)bytes[i];
        if (c == '\n') out += "\\n";
        else if (c >= 0x20 && c != 0x7F) out += (char)c;
        else {
            char buf[8];
            snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    return out;
}

// FNV-1a: the rank table's hash of a byte string
static inline uint64_t tokenizer_hash(const char* s, size_t n) {
    Fnv1a fnv;
    fnv.mix(s, n);
    return fnv.h;
}

// The slot of the rank table that holds the normal token whose bytes are s[0, n) (hash: their hash), or
// else the empty slot where it would go (linear probing; the table is never full).
static inline size_t tokenizer_rank_slot(const Tokenizer* tok, const char* s, size_t n, uint64_t hash) {
    const size_t mask = tok->rank_table.size() - 1;
    for (size_t h = hash & mask;; h = (h + 1) & mask) {
        const RankSlot slot = tok->rank_table[h];
        if (slot.id < 0) return h;
        if (slot.tag == (uint32_t)(hash >> 32) && tok->pieces[slot.id].size() == n && memcmp(tok->pieces[slot.id].data(), s, n) == 0) return h;
    }
}

// The id (= BPE rank) of the normal token whose bytes are s[0, n), or -1 if there is none.
static inline int tokenizer_rank(const Tokenizer* tok, const char* s, size_t n) {
    if (n > tok->max_piece) return -1;
    return tok->rank_table[tokenizer_rank_slot(tok, s, n, tokenizer_hash(s, n))].id;
}

// The encoder's view of a version-2 file: the rank table, which must hold every single byte (byte-level
// BPE starts from them) and each byte string once (else a rank would be ambiguous), and the special
// tokens, none of them empty (an empty one would match everywhere).
static inline void tokenizer_index(Tokenizer* tok) {
    const char* path = tok->path.c_str();
    if (tok->pattern == SPLIT_PATTERN_NANOCHAT) tok->split_digits = 2;
    else if (tok->pattern == SPLIT_PATTERN_GPT4) tok->split_digits = 3;
    size_t slots = 2;
    while (slots < 2 * (size_t)tok->vocab_size) slots *= 2;  // at most half full: short probe runs
    tok->rank_table.assign(slots, RankSlot{-1, 0});
    for (int id = 0; id < tok->vocab_size; id++) {
        const std::string& piece = tok->pieces[id];
        if (tok->special[id]) {
            if (piece.empty()) fail("'%s': special token %d has no bytes", path, id);
            continue;
        }
        if (piece.empty()) fail("'%s': token %d has no bytes; every normal token is a byte string of BPE", path, id);
        tok->max_piece = std::max(tok->max_piece, piece.size());
        const uint64_t hash = tokenizer_hash(piece.data(), piece.size());
        RankSlot& slot = tok->rank_table[tokenizer_rank_slot(tok, piece.data(), piece.size(), hash)];
        if (slot.id >= 0)
            fail("'%s': tokens %d and %d have the same bytes '%.80s'; BPE ranks need each byte string once", path, slot.id, id, printable(piece).c_str());
        slot = RankSlot{id, (uint32_t)(hash >> 32)};
    }
    for (int b = 0; b < 256; b++) {
        const char byte = (char)b;
        tok->byte_rank[b] = tokenizer_rank(tok, &byte, 1);
        if (tok->byte_rank[b] < 0) fail("'%s' has no token for the byte 0x%02x; byte-level BPE needs all 256 single bytes", path, b);
    }
}

static inline void tokenizer_load(Tokenizer* tok, const std::string& path) {
    InputFile f(path);
    int32_t header[256];
    f.read(header, sizeof(int32_t), 256);
    if (header[0] != TOKENIZER_MAGIC)
        fail("'%s' is not an xsa-train tokenizer file (magic %d, expected %d); make it with dev/data/climbmix.py", path.c_str(), header[0],
             TOKENIZER_MAGIC);
    const int version = header[1];
    if (version < 1 || version > TOKENIZER_VERSION)
        fail("'%s' has tokenizer version %d, this build reads versions 1 to %d", path.c_str(), version, TOKENIZER_VERSION);
    const int V = header[2], bos = header[3], P = header[4], S = version >= 2 ? header[5] : 0;
    if (V < 2 || V > (1 << 30)) fail("'%s': vocab size %d is out of range", path.c_str(), V);
    if (version >= 2 && (S < 1 || S > (1 << 16) || (uint64_t)S > f.left()))
        fail("'%s': split pattern of %d bytes; expected 1 to 65536 bytes within the file (truncated or corrupt?)", path.c_str(), S);
    *tok = Tokenizer();
    tok->path = path;
    tok->version = version;
    tok->pattern.resize(S);
    if (S) f.read(&tok->pattern[0], 1, S);
    // every token record takes at least 5 bytes: a vocabulary the file cannot hold is corrupt (and must
    // not size an allocation)
    if ((uint64_t)V * 5 > f.left())
        fail("'%s' is truncated or corrupt: vocab size %d needs at least %llu bytes of token records, the file has %llu after its header",
             path.c_str(), V, (unsigned long long)V * 5, (unsigned long long)f.left());
    if (bos < 0 || bos >= V) fail("'%s': BOS id %d is outside the vocabulary [0, %d)", path.c_str(), bos, V);
    if (P < 0 || P > 1000) fail("'%s': %d sample prompts is out of range", path.c_str(), P);
    tok->vocab_size = V;
    tok->bos_id = bos;
    tok->pieces.resize(V);
    tok->special.resize(V);
    tok->token_bytes.resize(V);
    for (int i = 0; i < V; i++) {
        uint8_t is_special;
        uint32_t nbytes;
        f.read(&is_special, 1, 1);
        f.read(&nbytes, 4, 1);
        if (nbytes > (1u << 20) || nbytes > f.left()) fail("'%s': token %d claims %u bytes; the file is truncated or corrupt", path.c_str(), i, nbytes);
        tok->pieces[i].resize(nbytes);
        if (nbytes) f.read(&tok->pieces[i][0], 1, nbytes);
        tok->special[i] = is_special ? 1 : 0;
        tok->token_bytes[i] = is_special ? 0 : (int)nbytes;
        if (is_special) tok->special_ids.push_back(i);
    }
    if (!tok->special[bos]) fail("'%s': the BOS id %d is not marked special", path.c_str(), bos);
    for (int p = 0; p < P; p++) {
        uint32_t n;
        f.read(&n, 4, 1);
        if (n < 1 || n > (1u << 16) || (uint64_t)n * 4 > f.left()) fail("'%s': sample prompt %d has %u tokens; the file is truncated or corrupt", path.c_str(), p, n);
        std::vector<uint32_t> ids(n);
        f.read(ids.data(), 4, n);
        std::vector<int> prompt(n);
        for (uint32_t i = 0; i < n; i++) {
            if (ids[i] >= (uint32_t)V) fail("'%s': sample prompt %d has token id %u >= vocab %d", path.c_str(), p, ids[i], V);
            prompt[i] = (int)ids[i];
        }
        tok->prompts.push_back(prompt);
    }
    if (!f.at_end()) fail("'%s' has trailing bytes after its prompts; the file is corrupt", path.c_str());
    if (version >= 2) tokenizer_index(tok);
}

// The raw bytes of ids (special tokens decode to their names, e.g. "<|bos|>").
static inline std::string tokenizer_decode(const Tokenizer* tok, const int* ids, size_t n) {
    std::string out;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->vocab_size) fail("token id %d is outside the vocabulary [0, %d) of '%s'", ids[i], tok->vocab_size, tok->path.c_str());
        out += tok->pieces[ids[i]];
    }
    return out;
}

// The id of the special token named name (e.g. "<|bos|>"), or -1 if there is none.
static inline int tokenizer_special_id(const Tokenizer* tok, const char* name) {
    for (int id : tok->special_ids)
        if (tok->pieces[id] == name) return id;
    return -1;
}
