// fuzz_encoder: any bytes as text through the encoder (chat/encoder.h: tokenizer_encode and
// tokenizer_encode_with_specials) with the embedded corpus's tokenizer. Every id must be in the vocabulary
// (and no special one without specials); decoding must give the text back with its invalid UTF-8 replaced
// by U+FFFD, checked against a decoder of this harness's own, written from the table of well-formed byte
// sequences; and encoding that replaced text must give the same ids.
#include "dev/fuzz/fuzz_util.h"
#include "chat/encoder.h"

// Unicode's Table 3-7, the well-formed UTF-8 byte sequences: byte k of a sequence of `len` bytes lies in
// [lo[k], hi[k]].
struct WellFormed {
    int len;
    unsigned char lo[4], hi[4];
};
static const WellFormed WELL_FORMED[] = {
    {1, {0x00}, {0x7F}},
    {2, {0xC2, 0x80}, {0xDF, 0xBF}},
    {3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
    {3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},
    {3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
    {3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},
    {4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
    {4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
    {4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
};

// text with each maximal subpart of an ill-formed sequence (the longest prefix of a row above that the
// bytes match, at least one byte) replaced by U+FFFD
static std::string replace_ill_formed(const std::string& text) {
    const unsigned char* u = (const unsigned char*)text.data();
    std::string out;
    for (size_t i = 0; i < text.size();) {
        int longest = 0;
        bool whole = false;
        for (const WellFormed& w : WELL_FORMED) {
            int k = 0;
            while (k < w.len && i + k < text.size() && u[i + k] >= w.lo[k] && u[i + k] <= w.hi[k]) k++;
            longest = std::max(longest, k);
            whole |= k == w.len;
        }
        if (whole) out.append(text, i, longest);
        else out += "\xEF\xBF\xBD";
        i += std::max(longest, 1);
    }
    return out;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const Tokenizer tok = [] {
        Tokenizer t;
        tokenizer_load(&t, "dev/data/devil/tokenizer.bin");
        if (tokenizer_special_id(&t, "<|bos|>") != t.bos_id || tokenizer_special_id(&t, "<|nope|>") != -1) abort();
        return t;
    }();
    const std::string text((const char*)data, size), want = replace_ill_formed(text);
    for (int with_specials = 0; with_specials < 2; with_specials++) {
        auto encode = [&](const std::string& s) { return with_specials ? tokenizer_encode_with_specials(&tok, s) : tokenizer_encode(&tok, s); };
        const std::vector<int> ids = encode(text);
        for (int id : ids)
            if (id < 0 || id >= tok.vocab_size || (!with_specials && tok.special[id])) {
                fprintf(stderr, "finding: id %d (vocab %d, specials %d)\n", id, tok.vocab_size, with_specials);
                abort();
            }
        if (tokenizer_decode(&tok, ids.data(), ids.size()) != want) {
            fprintf(stderr, "finding: decode(encode(text)) is not the text with U+FFFD for its ill-formed UTF-8 (specials %d)\n", with_specials);
            abort();
        }
        if (encode(want) != ids) {
            fprintf(stderr, "finding: the replaced text encodes to other ids than the text (specials %d)\n", with_specials);
            abort();
        }
        g_fuzz_sink = ids.size();
    }
    return 0;
}
