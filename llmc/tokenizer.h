// tokenizer.h: the tokenizer file written by dev/data/climbmix.py: every token's raw bytes, which ids
// are special, the BOS id, and pre-tokenized sample prompts. Training never encodes text (the shards
// are pre-tokenized), so this side only decodes and counts bytes for bits-per-byte.
//
// File layout (little-endian):
//   int32 header[256]: [0] = 20241201 (magic), [1] = 1 (version), [2] = vocab size V, [3] = BOS id,
//                      [4] = number of sample prompts P, the rest 0
//   V records, in id order: uint8 is_special, uint32 nbytes, nbytes raw bytes
//   P records: uint32 ntokens, ntokens x uint32 token ids (BOS first)
#pragma once

#include <string>
#include <vector>
#include "common.h"

static const int TOKENIZER_MAGIC = 20241201;
static const int TOKENIZER_VERSION = 1;

struct Tokenizer {
    std::string path;
    int vocab_size = 0;
    int bos_id = -1;
    std::vector<std::string> pieces;      // raw bytes of each token
    std::vector<uint8_t> special;         // 1 for special tokens (<|bos|> and the chat tokens)
    std::vector<int> token_bytes;         // bytes a token stands for in bits-per-byte: 0 for specials
    std::vector<std::vector<int>> prompts;  // sample prompts, BOS first
};

static inline void tokenizer_load(Tokenizer* tok, const std::string& path) {
    InputFile f(path);
    int32_t header[256];
    f.read(header, sizeof(int32_t), 256);
    if (header[0] != TOKENIZER_MAGIC)
        fail("'%s' is not an xsa-train tokenizer file (magic %d, expected %d); make it with dev/data/climbmix.py", path.c_str(), header[0],
             TOKENIZER_MAGIC);
    if (header[1] != TOKENIZER_VERSION) fail("'%s' has tokenizer version %d, this build reads version %d", path.c_str(), header[1], TOKENIZER_VERSION);
    const int V = header[2], bos = header[3], P = header[4];
    if (V < 2 || V > (1 << 30)) fail("'%s': vocab size %d is out of range", path.c_str(), V);
    // every token record takes at least 5 bytes: a vocabulary the file cannot hold is corrupt (and must
    // not size an allocation)
    if ((uint64_t)V * 5 > f.left())
        fail("'%s' is truncated or corrupt: vocab size %d needs at least %llu bytes of token records, the file has %llu after its header",
             path.c_str(), V, (unsigned long long)V * 5, (unsigned long long)f.left());
    if (bos < 0 || bos >= V) fail("'%s': BOS id %d is outside the vocabulary [0, %d)", path.c_str(), bos, V);
    if (P < 0 || P > 1000) fail("'%s': %d sample prompts is out of range", path.c_str(), P);
    *tok = Tokenizer();
    tok->path = path;
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
