// safetensors.h: read and write the safetensors format (https://huggingface.co/docs/safetensors), which
// is how weights travel between xsa-train and PyTorch/nanochat, and how the PyTorch reference hands its
// outputs to our tests.
//
// Layout: u64 little-endian header length N | N bytes of JSON | data buffer.
// JSON: {"__metadata__": {"key": "value", ...}, "name": {"dtype": "F32", "shape": [..],
//        "data_offsets": [begin, end]}, ...}; offsets are relative to the start of the data buffer.
// Only F32 and I32 tensors are used by this project; other dtypes are rejected with a clear message.
// Every file written here carries the checksums of its tensors and of its header (metadata "checksums",
// below), verified by every read; a file without them (from PyTorch, dev/convert_nanochat.py, or written
// before they existed) is read unchecked.
#pragma once

#include <cctype>
#include <map>
#include <new>
#include "common.h"

struct SafeTensor {
    std::string name;
    std::string dtype;           // "F32" or "I32"
    std::vector<int64_t> shape;  // row-major
    size_t begin = 0, end = 0;   // byte offsets into SafetensorsFile::data
    size_t numel() const {
        size_t n = 1;
        for (int64_t d : shape) n *= (size_t)d;
        return n;
    }
};

struct SafetensorsFile {
    std::string path;
    std::map<std::string, std::string> metadata;
    std::vector<SafeTensor> tensors;  // in file order
    std::vector<char> data;

    const SafeTensor* find(const std::string& name) const {
        for (const SafeTensor& t : tensors)
            if (t.name == name) return &t;
        return nullptr;
    }
    // the tensor `name`, which must exist with this dtype and element count, as a typed pointer
    const void* get(const std::string& name, const char* dtype, size_t numel) const {
        const SafeTensor* t = find(name);
        if (t == nullptr) fail("'%s' has no tensor named '%s'", path.c_str(), name.c_str());
        if (t->dtype != dtype) fail("'%s': tensor '%s' has dtype %s, expected %s", path.c_str(), name.c_str(), t->dtype.c_str(), dtype);
        if (t->numel() != numel)
            fail("'%s': tensor '%s' has %zu elements, expected %zu", path.c_str(), name.c_str(), t->numel(), numel);
        return data.data() + t->begin;
    }
    const float* get_f32(const std::string& name, size_t numel) const { return (const float*)get(name, "F32", numel); }
    const int32_t* get_i32(const std::string& name, size_t numel) const { return (const int32_t*)get(name, "I32", numel); }
    std::string meta(const std::string& key) const {
        auto it = metadata.find(key);
        if (it == metadata.end()) fail("'%s' has no metadata key '%s'", path.c_str(), key.c_str());
        return it->second;
    }
};

// ----------------------------------------------------------------------------------------------------
// A small JSON reader: just enough for safetensors headers (objects, strings, integers, arrays).

struct JsonReader {
    const std::string& text;
    size_t pos;
    const char* path;
    const char* holder = "safetensors header";  // what holds the JSON, for the error message

    [[noreturn]] void error(const char* what) const {
        fail("'%s': malformed %s (%s at byte %zu of the JSON)", path, holder, what, pos);
    }
    void skip_space() {
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\r' || text[pos] == '\t')) pos++;
    }
    bool consume(char c) {
        skip_space();
        if (pos < text.size() && text[pos] == c) { pos++; return true; }
        return false;
    }
    void expect(char c) {
        if (!consume(c)) error("unexpected character");
    }
    std::string string_value() {
        expect('"');
        std::string out;
        while (pos < text.size() && text[pos] != '"') {
            char c = text[pos++];
            if (c == '\\') {
                if (pos >= text.size()) error("unterminated escape");
                char e = text[pos++];
                switch (e) {
                    case 'n': out += '\n'; break;
                    case 't': out += '\t'; break;
                    case 'r': out += '\r'; break;
                    case 'b': out += '\b'; break;
                    case 'f': out += '\f'; break;
                    case 'u': {
                        if (pos + 4 > text.size()) error("short \\u escape");
                        unsigned code = 0;
                        for (int i = 0; i < 4; i++) {
                            const char h = text[pos + i];
                            if (!isxdigit((unsigned char)h)) error("bad \\u escape");
                            code = code * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                        }
                        pos += 4;
                        if (code >= 0xD800 && code <= 0xDFFF) error("surrogate \\u escapes are not supported");
                        if (code < 0x80) out += (char)code;  // encode the code point as UTF-8
                        else if (code < 0x800) { out += (char)(0xC0 | (code >> 6)); out += (char)(0x80 | (code & 0x3F)); }
                        else { out += (char)(0xE0 | (code >> 12)); out += (char)(0x80 | ((code >> 6) & 0x3F)); out += (char)(0x80 | (code & 0x3F)); }
                        break;
                    }
                    default: out += e;  // \" \\ \/
                }
            } else {
                out += c;
            }
        }
        if (pos >= text.size()) error("unterminated string");
        pos++;
        return out;
    }
    int64_t integer_value() {
        skip_space();
        size_t start = pos;
        if (pos < text.size() && text[pos] == '-') pos++;
        const size_t digits = pos;
        while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') pos++;
        if (pos == digits) error("expected an integer");
        errno = 0;
        const long long v = strtoll(text.substr(start, pos - start).c_str(), nullptr, 10);
        if (errno == ERANGE) error("integer out of range");
        return v;
    }
    bool at_end() {  // nothing but white space left
        skip_space();
        return pos == text.size();
    }
    std::vector<int64_t> integer_array() {
        std::vector<int64_t> out;
        expect('[');
        if (consume(']')) return out;
        do { out.push_back(integer_value()); } while (consume(','));
        expect(']');
        return out;
    }
};

// ----------------------------------------------------------------------------------------------------
// Checksums. A file written here holds the metadata key "checksums": a JSON object (as a string, as every
// metadata value is) mapping each tensor's name to checksum64 of its raw bytes, and "__header__" to checksum64
// of the header (checksum_header_text: every other metadata key and value, and each tensor's name, dtype and
// shape), each as 16 lowercase hexadecimal digits. safetensors_read verifies them whenever the key is there;
// one that does not match is an error naming the file and the tensor (or the header).
//
// checksum64 is a fast non-cryptographic 64-bit hash, FNV-1a taken a word at a time: 8 lanes starting at FNV's
// offset basis + k; the little-endian 64-bit word i (the last one zero-padded) goes to lane i mod 8 as
// h = (h ^ w) * K; h ^= h >> 32 (K = 0x9E3779B97F4A7C15); then the byte count and the 8 lanes are mixed into one
// value by the same step. About 6-7 GB/s on one core, 8 lanes keeping the multiplier busy (the byte-at-a-time
// FNV-1a of common.h: 0.7 GB/s).
// What it detects: any change confined to one 8-byte word (a flipped bit, a zeroed or torn word), always: each
// step is a bijection of the lane (the odd multiplier and the shift are both invertible) and of the word, so
// one changed word always changes the result. Any other accidental change (several words, a truncated or
// zero-filled range, an edited metadata value such as "step") goes unnoticed with a chance of about 2^-64.
// What it does not: a deliberate forgery. Anyone can recompute the checksums of an edited file (this is not a
// signature), and a value wrong in memory before the file was written is written with a matching checksum.
static const char* const CHECKSUMS_KEY = "checksums";
static const char* const CHECKSUMS_HEADER = "__header__";  // the entry of the header in "checksums"

static inline uint64_t checksum_step(uint64_t h, uint64_t w) {
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

static inline uint64_t checksum64(const void* data, size_t n) {
    const uint8_t* b = (const uint8_t*)data;
    const int LANES = 8;
    uint64_t lane[LANES];
    for (int k = 0; k < LANES; k++) lane[k] = 0xcbf29ce484222325ull + (uint64_t)k;  // FNV's offset basis, plus the lane
    size_t i = 0;
    for (; i + 8 * LANES <= n; i += 8 * LANES)
        for (int k = 0; k < LANES; k++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * k, 8);  // (little-endian: every machine this builds for)
            lane[k] = checksum_step(lane[k], w);
        }
    int k = 0;
    for (; i + 8 <= n; i += 8, k++) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        lane[k] = checksum_step(lane[k], w);
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, b + i, n - i);
        lane[k] = checksum_step(lane[k], w);
    }
    uint64_t h = checksum_step(0xcbf29ce484222325ull, (uint64_t)n);
    for (k = 0; k < LANES; k++) h = checksum_step(h, lane[k]);
    return h;
}

static inline std::string checksum_hex(uint64_t h) {
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    return buf;
}

// What the header's checksum covers: each metadata key and value but "checksums" (in the byte order of the keys),
// then each tensor's name, dtype and shape (in the byte order of the names, not the file's: a tool may reorder
// them), every string followed by a NUL byte, a shape as comma-separated decimals: "key\0value\0...name\0F32\02,3\0".
// Not the data offsets, which depend on the writer's layout (the tensors' own checksums cover their bytes).
template <typename Tensor>
static std::string checksum_header_text(const std::map<std::string, std::string>& metadata, const std::vector<Tensor>& tensors) {
    std::string text;
    for (const auto& kv : metadata) {
        if (kv.first == CHECKSUMS_KEY) continue;
        text += kv.first;
        text += '\0';
        text += kv.second;
        text += '\0';
    }
    std::vector<const Tensor*> sorted;
    for (const Tensor& t : tensors) sorted.push_back(&t);
    std::sort(sorted.begin(), sorted.end(), [](const Tensor* a, const Tensor* b) { return a->name < b->name; });
    for (const Tensor* t : sorted) {
        text += t->name;
        text += '\0';
        text += t->dtype;
        text += '\0';
        for (size_t d = 0; d < t->shape.size(); d++) text += (d ? "," : "") + std::to_string(t->shape[d]);
        text += '\0';
    }
    return text;
}

// checksum64 of each of n byte ranges, in parallel over them (the hashes of one writer or reader: tensors of a few
// bytes to GB)
static std::vector<uint64_t> checksums_of(const std::vector<const void*>& data, const std::vector<size_t>& bytes) {
    std::vector<uint64_t> sums(data.size());
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (long i = 0; i < (long)data.size(); i++) sums[i] = checksum64(data[i], bytes[i]);
    return sums;
}

// The checks of a file's "checksums" (nothing to check without the key): the header's first, then every tensor's.
static void safetensors_verify(const SafetensorsFile& file) {
    const auto it = file.metadata.find(CHECKSUMS_KEY);
    if (it == file.metadata.end()) return;
    const char* path = file.path.c_str();
    std::map<std::string, uint64_t> sums;
    JsonReader json{it->second, 0, path, "metadata 'checksums'"};
    json.expect('{');
    if (!json.consume('}')) {
        do {
            const std::string name = json.string_value();
            json.expect(':');
            const std::string hex = json.string_value();
            if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
                json.error("a checksum that is not 16 lowercase hexadecimal digits");
            if (!sums.emplace(name, strtoull(hex.c_str(), nullptr, 16)).second) json.error("a name given twice");
        } while (json.consume(','));
        json.expect('}');
    }
    if (!json.at_end()) json.error("bytes after the JSON object");
    const auto header = sums.find(CHECKSUMS_HEADER);
    if (header == sums.end()) fail("'%s': its metadata 'checksums' has no entry %s", path, CHECKSUMS_HEADER);
    const std::string header_text = checksum_header_text(file.metadata, file.tensors);
    if (checksum64(header_text.data(), header_text.size()) != header->second)
        fail("'%s': its metadata does not match its checksum (the file was changed after it was written: a metadata value such as "
             "\"step\" edited, or a tensor's name, dtype or shape; or the file is corrupt): use another copy of it%s", path,
             file.metadata.count("optimizer_step") ? ", or an earlier checkpoint" : "");
    if (sums.size() != file.tensors.size() + 1)
        for (const auto& kv : sums)
            if (kv.first != CHECKSUMS_HEADER && file.find(kv.first) == nullptr)
                fail("'%s': its metadata 'checksums' names a tensor '%s' that the file does not hold", path, kv.first.c_str());
    std::vector<const void*> data;
    std::vector<size_t> bytes;
    for (const SafeTensor& t : file.tensors) {
        if (sums.count(t.name) == 0) fail("'%s': tensor '%s' has no checksum in the metadata 'checksums'", path, t.name.c_str());
        data.push_back(file.data.data() + t.begin);
        bytes.push_back(t.end - t.begin);
    }
    const std::vector<uint64_t> got = checksums_of(data, bytes);
    for (size_t i = 0; i < file.tensors.size(); i++)
        if (got[i] != sums[file.tensors[i].name])
            fail("'%s': tensor '%s' does not match its checksum (the file is corrupt: its bytes changed after it was written, on a disk, "
                 "in a copy or by an edit): use another copy of it%s", path, file.tensors[i].name.c_str(),
                 file.metadata.count("optimizer_step") ? ", or an earlier checkpoint" : "");
}

static inline SafetensorsFile safetensors_read(const std::string& path) {
    SafetensorsFile file;
    file.path = path;
    InputFile f(path);
    const uint64_t file_size = f.size;
    uint64_t header_len = 0;
    if (file_size < 8) fail("'%s' is not a safetensors file (only %llu bytes)", path.c_str(), (unsigned long long)file_size);
    f.read(&header_len, 8, 1);
    if (header_len > file_size - 8 || header_len > (100u << 20))
        fail("'%s' is not a safetensors file (header length %llu does not fit the file)", path.c_str(), (unsigned long long)header_len);
    std::string header(header_len, '\0');
    if (header_len > 0) f.read(&header[0], 1, header_len);
    const size_t data_len = (size_t)(file_size - 8 - header_len);
    try {
        file.data.resize(data_len);
    } catch (const std::bad_alloc&) {
        fail("out of memory reading '%s' (%zu bytes of tensor data)", path.c_str(), data_len);
    }
    if (data_len > 0) f.read(file.data.data(), 1, data_len);

    JsonReader json{header, 0, path.c_str()};
    json.expect('{');
    if (!json.consume('}')) {
        do {
            std::string key = json.string_value();
            json.expect(':');
            if (key == "__metadata__") {
                json.expect('{');
                if (!json.consume('}')) {
                    do {
                        std::string k = json.string_value();
                        json.expect(':');
                        if (file.metadata.count(k)) fail("'%s': metadata key '%s' appears twice in the safetensors header", path.c_str(), k.c_str());
                        file.metadata[k] = json.string_value();
                    } while (json.consume(','));
                    json.expect('}');
                }
                continue;
            }
            if (file.find(key)) fail("'%s': tensor '%s' appears twice in the safetensors header", path.c_str(), key.c_str());
            SafeTensor t;
            t.name = key;
            bool have_offsets = false;
            json.expect('{');
            do {
                std::string field = json.string_value();
                json.expect(':');
                if (field == "dtype") t.dtype = json.string_value();
                else if (field == "shape") t.shape = json.integer_array();
                else if (field == "data_offsets") {
                    std::vector<int64_t> off = json.integer_array();
                    if (off.size() != 2 || off[0] < 0 || off[1] < off[0]) json.error("bad data_offsets");
                    t.begin = (size_t)off[0];
                    t.end = (size_t)off[1];
                    have_offsets = true;
                } else json.error("unknown tensor field");
            } while (json.consume(','));
            json.expect('}');
            if (!have_offsets) json.error("tensor without data_offsets");
            if (t.dtype != "F32" && t.dtype != "I32")
                fail("'%s': tensor '%s' has dtype %s; xsa-train reads only F32 and I32 (convert bf16 weights to fp32 first)",
                     path.c_str(), t.name.c_str(), t.dtype.c_str());
            uint64_t bytes = 4;  // the tensor's size, checked against the data as it is multiplied up (no wrap)
            for (int64_t d : t.shape) {
                if (d < 0) fail("'%s': tensor '%s' has a negative dimension", path.c_str(), t.name.c_str());
                if (d > 0 && bytes > data_len / (uint64_t)d) bytes = UINT64_MAX;
                else bytes *= (uint64_t)d;
            }
            if (t.begin % 4 != 0)  // the data buffer is read as 4-byte elements
                fail("'%s': tensor '%s' starts at data offset %zu, not a multiple of 4", path.c_str(), t.name.c_str(), t.begin);
            if (t.end > data_len || t.end - t.begin != bytes)
                fail("'%s': tensor '%s' has data_offsets [%zu, %zu] that do not match its shape or the file size (%zu data bytes)",
                     path.c_str(), t.name.c_str(), t.begin, t.end, data_len);
            file.tensors.push_back(t);
        } while (json.consume(','));
        json.expect('}');
    }
    if (!json.at_end()) json.error("bytes after the JSON object");
    safetensors_verify(file);
    return file;
}

// One tensor to write: a name, "F32" or "I32", a shape, and 4-byte elements at `data`.
struct SafeTensorOut {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    const void* data;
};

static inline std::string json_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\') { out += '\\'; out += c; }
        else if (c == '\n') out += "\\n";
        else if ((unsigned char)c < 0x20) { char buf[8]; snprintf(buf, sizeof buf, "\\u%04x", c); out += buf; }
        else out += c;
    }
    return out;
}

// Writes to `path`.tmp and renames, so an interrupted write never leaves a torn file behind. With `checksums`
// (always, but in tests and tools that write a file as older writers did) the metadata gets the key "checksums"
// (above); a "checksums" among the given metadata is replaced.
static inline void safetensors_write(const std::string& path, const std::map<std::string, std::string>& given_metadata,
                                     const std::vector<SafeTensorOut>& tensors, bool checksums = true) {
    std::map<std::string, std::string> metadata = given_metadata;
    metadata.erase(CHECKSUMS_KEY);
    if (checksums) {
        const std::string header_text = checksum_header_text(metadata, tensors);
        std::vector<const void*> data;
        std::vector<size_t> bytes;
        for (const SafeTensorOut& t : tensors) {
            size_t numel = 1;
            for (int64_t d : t.shape) numel *= (size_t)d;
            data.push_back(t.data);
            bytes.push_back(4 * numel);
        }
        const std::vector<uint64_t> sums = checksums_of(data, bytes);
        std::string json = "{\"" + std::string(CHECKSUMS_HEADER) + "\":\"" + checksum_hex(checksum64(header_text.data(), header_text.size())) + "\"";
        for (size_t i = 0; i < tensors.size(); i++) json += ",\"" + json_escape(tensors[i].name) + "\":\"" + checksum_hex(sums[i]) + "\"";
        metadata[CHECKSUMS_KEY] = json + "}";
    }
    std::string header = "{\"__metadata__\":{";
    bool first = true;
    for (const auto& kv : metadata) {
        header += (first ? "" : ",") + ("\"" + json_escape(kv.first) + "\":\"" + json_escape(kv.second) + "\"");
        first = false;
    }
    header += "}";
    size_t offset = 0;
    for (const SafeTensorOut& t : tensors) {
        size_t numel = 1;
        std::string shape;
        for (size_t i = 0; i < t.shape.size(); i++) {
            numel *= (size_t)t.shape[i];
            shape += (i ? "," : "") + std::to_string(t.shape[i]);
        }
        header += ",\"" + json_escape(t.name) + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape +
                  "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + numel * 4) + "]}";
        offset += numel * 4;
    }
    header += "}";
    while ((8 + header.size()) % 8 != 0) header += ' ';  // align the data buffer to 8 bytes
    AtomicFile f = atomic_open(path);
    const uint64_t header_len = header.size();
    atomic_write(&f, &header_len, 8);
    atomic_write(&f, header.data(), header.size());
    for (const SafeTensorOut& t : tensors) {
        size_t numel = 1;
        for (int64_t d : t.shape) numel *= (size_t)d;
        atomic_write(&f, t.data, 4 * numel);
    }
    atomic_commit(&f);
}
