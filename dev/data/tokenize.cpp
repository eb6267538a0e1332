// tokenize: text -> token ids with a tokenizer file (llmc/tokenizer.h; chat/encoder.h), for the encoder's tests
// (dev/data/test_encoder.py) and benchmark (dev/bench/bench_encode.py). make dev/data/bin/tokenize
//
//   dev/data/bin/tokenize TOKENIZER [FILE|-] [--specials] [--batch] [--bench SECONDS]
//
// Prints the token ids of FILE (default and `-`: standard input) on one line, separated by spaces:
// tokenizer_encode, or with --specials tokenizer_encode_with_specials (the text of a special token becomes
// its id). --batch: FILE is a sequence of documents, each a uint32 little-endian byte count and that many
// bytes, and one line is printed per document. --bench SECONDS: encodes the text (each document) over and
// over for at least SECONDS on one thread and prints the rate instead of the ids. Any bad input: one
// "error: ..." line, exit code 1.
#include <string>
#include <vector>
#include "chat/encoder.h"

static std::string read_all(const std::string& path) {
    std::string data;
    char buf[1 << 16];
    if (path == "-") {
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) data.append(buf, n);
        if (ferror(stdin)) fail("cannot read standard input");
        return data;
    }
    InputFile f(path);
    data.resize(f.size);
    if (f.size) f.read(&data[0], 1, f.size);
    if (!f.at_end()) fail("'%s' grew while being read", path.c_str());
    return data;
}

// The documents of a --batch input: uint32 little-endian byte count, then the bytes, repeated.
static std::vector<std::string> split_batch(const std::string& data, const std::string& path) {
    std::vector<std::string> docs;
    for (size_t p = 0; p < data.size();) {
        uint32_t n;
        if (data.size() - p < 4) fail("'%s': %zu stray bytes after document %zu (--batch expects a uint32 count before each)", path.c_str(),
                                      data.size() - p, docs.size());
        memcpy(&n, data.data() + p, 4);
        p += 4;
        if (n > data.size() - p) fail("'%s': document %zu claims %u bytes, %zu are left (--batch input cut short?)", path.c_str(), docs.size(), n,
                                      data.size() - p);
        docs.push_back(data.substr(p, n));
        p += n;
    }
    return docs;
}

int main(int argc, char** argv) {
    std::string tokenizer_path, input = "-";
    bool specials = false, batch = false, have_input = false;
    double bench_seconds = 0.0;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--specials") specials = true;
        else if (a == "--batch") batch = true;
        else if (a == "--bench") {
            if (i + 1 >= argc) fail("--bench needs a number of seconds");
            bench_seconds = parse_double("--bench", argv[++i]);
            if (bench_seconds <= 0.0) fail("--bench: %s seconds is not positive", argv[i]);
        } else if (a.size() > 1 && a[0] == '-') fail("unknown flag '%s'; usage: tokenize TOKENIZER [FILE|-] [--specials] [--batch] [--bench SECONDS]", a.c_str());
        else if (tokenizer_path.empty()) tokenizer_path = a;
        else if (!have_input) input = a, have_input = true;
        else fail("unexpected argument '%s'; usage: tokenize TOKENIZER [FILE|-] [--specials] [--batch] [--bench SECONDS]", a.c_str());
    }
    if (tokenizer_path.empty()) fail("no tokenizer file; usage: tokenize TOKENIZER [FILE|-] [--specials] [--batch] [--bench SECONDS]");
    Tokenizer tok;
    tokenizer_load(&tok, tokenizer_path);
    const std::string data = read_all(input);
    const std::vector<std::string> docs = batch ? split_batch(data, input) : std::vector<std::string>{data};
    auto encode = [&](const std::string& text) { return specials ? tokenizer_encode_with_specials(&tok, text) : tokenizer_encode(&tok, text); };

    if (bench_seconds > 0.0) {
        size_t bytes = 0, tokens = 0;
        for (const std::string& d : docs) bytes += d.size(), tokens += encode(d).size();  // warm-up, and the token count
        int runs = 0;
        size_t counted = 0;  // the tokens of every run, so that no run can be optimised away
        const double t0 = wall_ms();
        double elapsed = 0.0;
        do {
            for (const std::string& d : docs) counted += encode(d).size();
            runs++;
            elapsed = (wall_ms() - t0) / 1000.0;
        } while (elapsed < bench_seconds);
        if (counted != tokens * runs) fail("the encoder gave %zu tokens in %d runs, not %zu each", counted, runs, tokens);
        printf("%.3f MB/s: %zu bytes (%zu tokens) encoded %d times in %.2f s on one thread\n", (double)bytes * runs / elapsed / 1e6, bytes, tokens, runs,
               elapsed);
        return 0;
    }
    std::string line;
    for (const std::string& d : docs) {
        line.clear();
        for (int id : encode(d)) {
            if (!line.empty()) line += ' ';
            line += std::to_string(id);
        }
        line += '\n';
        if (fwrite(line.data(), 1, line.size(), stdout) != line.size()) fail("cannot write the token ids to standard output");
    }
    if (fflush(stdout) != 0) fail("cannot write the token ids to standard output");
    return 0;
}
