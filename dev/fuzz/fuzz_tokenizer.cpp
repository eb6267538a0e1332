// fuzz_tokenizer: a tokenizer file (llmc/tokenizer.h: tokenizer_load). The input is the whole file. An
// accepted tokenizer decodes its sample prompts and every token, as the trainer's samples do, and encodes
// the prompts' text back (fuzz_encoder fuzzes the text instead, with a fixed tokenizer).
#include "dev/fuzz/fuzz_util.h"
#include "chat/encoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FuzzFile file = fuzz_file("tokenizer");
    const std::string& path = fuzz_write(file, data, size);
    Tokenizer tok;
    if (!fuzz_parse(path, [&] { tokenizer_load(&tok, path); })) return 0;
    size_t total = 0;
    for (const std::vector<int>& p : tok.prompts) total += printable(tokenizer_decode(&tok, p.data(), p.size())).size();
    for (int id = 0; id < tok.vocab_size; id++) total += tokenizer_decode(&tok, &id, 1).size() + (size_t)tok.token_bytes[id];
    if (tok.special[tok.bos_id] != 1 || tok.token_bytes[tok.bos_id] != 0) abort();  // what the loader and bpb rely on
    // encoding each prompt's text gives it back (an encoder that refuses the file, e.g. version 1 or its
    // pattern, must say so naming the file)
    for (const std::vector<int>& p : tok.prompts) {
        const std::string text = tokenizer_decode(&tok, p.data() + 1, p.size() - 1);
        std::vector<int> ids;
        if (!fuzz_parse(path, [&] { ids = tokenizer_encode_with_specials(&tok, text); })) break;
        if (tokenizer_decode(&tok, ids.data(), ids.size()) != utf8_replace_invalid(text)) abort();
        total += ids.size();
    }
    g_fuzz_sink = total;
    return 0;
}
