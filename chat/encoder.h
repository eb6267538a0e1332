// encoder.h: text -> token ids with the tokenizer file's ranks and split pattern (llmc/tokenizer.h loads
// them), token for token as tiktoken encodes (dev/data/test_encoder.py checks it). Training never encodes
// text (its shards and sample prompts are pre-tokenized); sample, chat_cli and the calculator tool do.
#pragma once

#include <queue>
#include <string>
#include <vector>
#include "../llmc/tokenizer.h"
#include "unicode_classes.h"

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

