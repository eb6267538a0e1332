// safetensors.h: read and write the safetensors format (https://huggingface.co/docs/safetensors), which
// is how weights travel between xsa-train and PyTorch/nanochat, and how the PyTorch reference hands its
// outputs to our tests.
//
// Layout: u64 little-endian header length N | N bytes of JSON | data buffer.
// JSON: {"__metadata__": {"key": "value", ...}, "name": {"dtype": "F32", "shape": [..],
//        "data_offsets": [begin, end]}, ...}; offsets are relative to the start of the data buffer.
// Only F32 and I32 tensors are used by this project; other dtypes are rejected with a clear message.
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

    [[noreturn]] void error(const char* what) const {
        fail("'%s': malformed safetensors header (%s at byte %zu of the JSON)", path, what, pos);
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

// Writes to `path`.tmp and renames, so an interrupted write never leaves a torn file behind.
static inline void safetensors_write(const std::string& path, const std::map<std::string, std::string>& metadata,
                                     const std::vector<SafeTensorOut>& tensors) {
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
