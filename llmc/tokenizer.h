// tokenizer.h: the tokenizer file written by dev/data/climbmix.py: every token's raw bytes, which ids
// are special, the BOS id, pre-tokenized sample prompts and (version 2) the split pattern. Training only
// decodes and counts bytes for bits-per-byte (the shards are pre-tokenized); sampling and chat encode text,
// token for token as tiktoken does with the same ranks and pattern (dev/data/test_encoder.py checks it).
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

#include <queue>
#include <string>
#include <vector>
#include "common.h"
#include "unicode_classes.h"

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

// ----------------------------------------------------------------------------------------------------
// Encoding: tiktoken's encode_ordinary (tokenizer_encode) and encode(text, allowed_special="all")
// (tokenizer_encode_with_specials) with the file's ranks and split pattern, in three steps:
//   1. invalid UTF-8 is replaced as Python's bytes.decode("utf-8", errors="replace") does (tiktoken takes
//      text, so what it encodes is that replacement), giving valid UTF-8;
//   2. the split pattern cuts the text into chunks (split_next, a hand-written matcher: no regex library);
//   3. byte-level BPE turns each chunk into tokens (bpe_chunk).
// Nothing is cached between calls, so the result depends on the text alone.

// Valid UTF-8 for any bytes: each maximal subpart of an ill-formed sequence (the longest prefix of a
// well-formed sequence, or else one byte) becomes U+FFFD, as Python's decoder does. Well-formed (Unicode
// Table 3-7): no overlongs (C0, C1, E0 80..9F, F0 80..8F), no surrogates (ED A0..BF), nothing past
// U+10FFFF (F4 90.., F5..FF).
static inline std::string utf8_replace_invalid(const std::string& in) {
    const unsigned char* u = (const unsigned char*)in.data();
    const size_t n = in.size();
    std::string out;
    out.reserve(n);
    size_t copied = 0;  // in[0, copied) is in out; well-formed stretches are copied whole
    for (size_t i = 0; i < n;) {
        const unsigned char b = u[i];
        size_t len = 0;                        // the length of a sequence starting with b (0: b starts none)
        unsigned char lo = 0x80, hi = 0xBF;    // the range of its second byte
        if (b < 0x80) len = 1;
        else if (b >= 0xC2 && b <= 0xDF) len = 2;
        else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
        else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
        size_t k = 1;  // bytes of the well-formed prefix
        while (k < len && i + k < n && u[i + k] >= (k == 1 ? lo : 0x80) && u[i + k] <= (k == 1 ? hi : 0xBF)) k++;
        if (len == 0 || k < len) {
            out.append(in, copied, i - copied);
            out += "\xEF\xBF\xBD";
            copied = i + k;
        }
        i += k;
    }
    out.append(in, copied, n - copied);
    return out;
}

// The code point starting at s[0] of valid UTF-8, and its length in bytes.
static inline uint32_t utf8_next(const char* s, size_t* len) {
    const unsigned char* u = (const unsigned char*)s;
    *len = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (*len == 1) return u[0];
    uint32_t cp = u[0] & (0x7F >> *len);  // the lead byte's payload bits
    for (size_t i = 1; i < *len; i++) cp = cp << 6 | (u[i] & 0x3F);
    return cp;
}

// Where the run of code points of class cls starting at s[p] ends (p itself if there is none).
static inline size_t class_run_end(const char* s, size_t n, size_t p, CodePointClass cls) {
    size_t len;
    while (p < n && unicode_class(utf8_next(s + p, &len)) == cls) p += len;
    return p;
}

// Where the chunk starting at s[p] (p < n) ends: the first match at p of the split pattern
//   '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
// with D = digits, its alternatives tried in order as the backtracking engine of tiktoken (fancy-regex)
// does. Some alternative matches at every position, so the chunks tile the text. s[0, n) is valid UTF-8;
// n is the end of the text or of the stretch between two special tokens, which tiktoken splits on its own
// (so (?!\S) sees its end as the end of the text).
static inline size_t split_next(const char* s, size_t n, size_t p, int digits) {
    size_t len0, len1 = 0;
    const uint32_t c0 = utf8_next(s + p, &len0);
    const size_t p1 = p + len0;
    const uint32_t c1 = p1 < n ? utf8_next(s + p1, &len1) : 0;
    const CodePointClass k0 = unicode_class(c0);
    const bool letter1 = p1 < n && unicode_class(c1) == CP_LETTER, other1 = p1 < n && unicode_class(c1) == CP_OTHER;
    // '(?i:[sdmt]|ll|ve|re): case-insensitive as Unicode simple case folding, under which U+017F LATIN
    // SMALL LETTER LONG S is an s (no other character folds to one of these letters). c | 0x20 is the
    // lower case of an ASCII letter and equals one only for its two cases.
    if (c0 == '\'' && p1 < n) {
        const uint32_t l1 = c1 | 0x20;
        if (l1 == 's' || l1 == 'd' || l1 == 'm' || l1 == 't' || c1 == 0x17F) return p1 + len1;
        const size_t p2 = p1 + len1;
        if (p2 < n) {
            size_t len2;
            const uint32_t l2 = utf8_next(s + p2, &len2) | 0x20;
            if ((l1 == 'l' && l2 == 'l') || (l1 == 'v' && l2 == 'e') || (l1 == 'r' && l2 == 'e')) return p2 + len2;
        }
    }
    // [^\r\n\p{L}\p{N}]?+\p{L}+ (the ?+ is possessive: a leading character of that kind is taken, never
    // given back, so it must be followed by a letter)
    if (k0 == CP_LETTER) return class_run_end(s, n, p, CP_LETTER);
    if (letter1 && c0 != '\r' && c0 != '\n' && k0 != CP_NUMBER) return class_run_end(s, n, p1, CP_LETTER);
    // \p{N}{1,D}
    if (k0 == CP_NUMBER) {
        size_t q = p1, len;
        for (int d = 1; d < digits && q < n && unicode_class(utf8_next(s + q, &len)) == CP_NUMBER; d++) q += len;
        return q;
    }
    // ` ?[^\s\p{L}\p{N}]++[\r\n]*` ("other": neither space, letter nor number)
    if (k0 == CP_OTHER || (c0 == ' ' && other1)) {
        size_t q = class_run_end(s, n, k0 == CP_OTHER ? p : p1, CP_OTHER);
        while (q < n && (s[q] == '\r' || s[q] == '\n')) q++;
        return q;
    }
    // c0 is whitespace (every other class matched above): the last three alternatives, on the run of
    // whitespace from p
    size_t q = p, last = p, newline_end = 0;  // run end, start of its last character, end of its last \r or \n
    while (q < n) {
        size_t len;
        const uint32_t c = utf8_next(s + q, &len);
        if (unicode_class(c) != CP_SPACE) break;
        last = q;
        q += len;
        if (c == '\r' || c == '\n') newline_end = q;
    }
    if (newline_end) return newline_end;  // \s*[\r\n]: up to and including the run's last line break
    if (q == n || last == p) return q;    // \s+(?!\S) at the end of the text; \s+ for a single character
    return last;                          // \s+(?!\S): the run but its last character, which goes with what follows
}

// A candidate merge: the part starting at byte `start` with its right neighbour, which ends at `stop`,
// making token `rank`.
struct BpeMerge {
    int rank;
    size_t start, stop;
    bool operator>(const BpeMerge& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
};

// The working memory of bpe_chunk, reused from chunk to chunk of one encode call.
struct BpeWork {
    std::vector<size_t> end, prev;  // the part starting at byte i ends at end[i] (0: i is inside a part) and follows the part at prev[i]
    std::vector<int> id;            // the token of the part starting at byte i
    std::priority_queue<BpeMerge, std::vector<BpeMerge>, std::greater<BpeMerge>> heap;
};

// Appends the tokens of the chunk s[0, n) to out, as tiktoken's byte_pair_encode: a chunk that is a token
// is that token; otherwise, starting from single bytes, merge the adjacent pair whose joined bytes are the
// token of lowest rank (the leftmost of equals) until no adjacent pair is a token. The candidates wait in
// a heap by (rank, start) and are checked when they come out (a part may have grown since): O(n log n)
// for a chunk of n bytes, so a 1 MB word or 100k spaces take no longer than their size demands.
static inline void bpe_chunk(const Tokenizer* tok, const char* s, size_t n, BpeWork* w, std::vector<int>* out) {
    const int whole = tokenizer_rank(tok, s, n);
    if (whole >= 0) {
        out->push_back(whole);
        return;
    }
    w->end.resize(n);
    w->prev.resize(n);
    w->id.resize(n);
    for (size_t i = 0; i < n; i++) w->end[i] = i + 1, w->prev[i] = i - 1, w->id[i] = tok->byte_rank[(unsigned char)s[i]];
    auto candidate = [&](size_t start, size_t stop) {
        const int rank = tokenizer_rank(tok, s + start, stop - start);
        if (rank >= 0) w->heap.push({rank, start, stop});
    };
    for (size_t i = 0; i + 1 < n; i++) candidate(i, i + 2);
    while (!w->heap.empty()) {
        const BpeMerge m = w->heap.top();
        w->heap.pop();
        const size_t mid = w->end[m.start];
        if (mid == 0 || mid >= n || w->end[mid] != m.stop) continue;  // a part of this pair has changed since
        w->end[m.start] = m.stop;
        w->end[mid] = 0;
        w->id[m.start] = m.rank;
        if (m.stop < n) w->prev[m.stop] = m.start, candidate(m.start, w->end[m.stop]);
        if (m.start > 0) candidate(w->prev[m.start], m.stop);
    }
    for (size_t i = 0; i < n; i = w->end[i]) out->push_back(w->id[i]);
}

// Appends the tokens of the text s[p, n) without special tokens.
static inline void tokenizer_encode_range(const Tokenizer* tok, const char* s, size_t p, size_t n, BpeWork* w, std::vector<int>* out) {
    while (p < n) {
        const size_t q = split_next(s, n, p, tok->split_digits);
        bpe_chunk(tok, s + p, q - p, w, out);
        p = q;
    }
}

static inline std::vector<int> tokenizer_encode_text(const Tokenizer* tok, const std::string& text, bool with_specials) {
    const char* path = tok->path.c_str();
    if (tok->version < 2)
        fail("'%s' is a version-1 tokenizer file, which lacks the split pattern that encoding needs; rewrite it as version 2 (same token ids, "
             "so its shards stay valid): python3 dev/data/climbmix.py --upgrade-tokenizer %s", path, path);
    if (tok->split_digits == 0)
        fail("'%s': this encoder implements nanochat's split pattern and GPT-4's (\\p{N}{1,3}), not the file's '%.200s'", path,
             printable(tok->pattern).c_str());
    const std::string clean = utf8_replace_invalid(text);
    const char* s = clean.data();
    std::vector<int> out;
    BpeWork w;
    // With specials: the text between special tokens is encoded on its own, as tiktoken does. next[k] is
    // where special token k occurs next (npos: nowhere after start); each is searched again only once
    // passed, so finding them all costs O(text x specials). Two starting at one place (which nanochat's
    // never do) go to the longer; tiktoken's choice there depends on a hash map's order.
    const size_t nspecial = with_specials ? tok->special_ids.size() : 0;
    std::vector<size_t> next(nspecial);
    for (size_t k = 0; k < nspecial; k++) next[k] = clean.find(tok->pieces[tok->special_ids[k]]);
    size_t start = 0;
    for (;;) {
        size_t at = clean.size();
        int found = -1;
        for (size_t k = 0; k < nspecial; k++) {
            const std::string& piece = tok->pieces[tok->special_ids[k]];
            if (next[k] < start) next[k] = clean.find(piece, start);
            if (next[k] < at || (next[k] == at && found >= 0 && piece.size() > tok->pieces[found].size())) at = next[k], found = tok->special_ids[k];
        }
        tokenizer_encode_range(tok, s, start, at, &w, &out);
        if (found < 0) return out;
        out.push_back(found);
        start = at + tok->pieces[found].size();
    }
}

// The token ids of text (any bytes): tiktoken's encode_ordinary, special-token text being ordinary text.
static inline std::vector<int> tokenizer_encode(const Tokenizer* tok, const std::string& text) { return tokenizer_encode_text(tok, text, false); }

// The token ids of text with every special token's text (e.g. "<|assistant_start|>") as its id: tiktoken's
// encode(text, allowed_special="all").
static inline std::vector<int> tokenizer_encode_with_specials(const Tokenizer* tok, const std::string& text) {
    return tokenizer_encode_text(tok, text, true);
}

// The id of the special token named name (e.g. "<|bos|>"), or -1 if there is none.
static inline int tokenizer_special_id(const Tokenizer* tok, const char* name) {
    for (int id : tok->special_ids)
        if (tok->pieces[id] == name) return id;
    return -1;
}
