// fuzz_util.h: what the libFuzzer harnesses of dev/fuzz/ share (dev/fuzz/README.md).
//
// The parsers read files by path, so each input is written to an in-memory file (memfd) that they open as
// /proc/self/fd/N. They are built with -DXSA_FUZZ, where fail() throws FuzzReject instead of exiting
// (llmc/common.h): a rejected input is the expected outcome, not a finding. A finding is anything else:
// a sanitizer report (ASan: out-of-bounds, use-after-free, leaks; UBSan: overflow, misalignment, bad
// shifts, ...), an uncaught exception (std::bad_alloc from an allocation a file sized, std::stoi's
// exceptions), an allocation over -malloc_limit_mb, a hang, or a rejection message that does not name
// the file (fuzz_parse).
#pragma once

#ifndef XSA_FUZZ
#error "build the harnesses with -DXSA_FUZZ (make fuzz), so that fail() throws instead of exiting"
#endif

#include <sys/mman.h>
#include <unistd.h>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/common.h"

// Where the harnesses put what they read, so that the compiler cannot drop the reads (and ASan sees them).
static volatile uint64_t g_fuzz_sink;

// An in-memory file and the path the parsers open it by.
struct FuzzFile {
    int fd = -1;
    std::string path;
};

static inline FuzzFile fuzz_file(const char* name) {
    FuzzFile f;
    f.fd = memfd_create(name, 0);
    if (f.fd < 0) {
        perror("memfd_create");
        abort();
    }
    f.path = "/proc/self/fd/" + std::to_string(f.fd);
    return f;
}

// Replaces the file's contents with data[0, size).
static inline const std::string& fuzz_write(const FuzzFile& f, const void* data, size_t size) {
    if (ftruncate(f.fd, 0) != 0 || (size > 0 && pwrite(f.fd, data, size, 0) != (ssize_t)size)) {
        perror("fuzz_write");
        abort();
    }
    return f.path;
}

// Runs fn, which parses the file at `path`; a rejection (FuzzReject) is fine if its message names the
// file (`name`: what the message must contain, by default the path): every bad input must end in one
// `error:` line naming the culprit. Anything else thrown is not caught: libFuzzer reports it.
template <typename Fn>
static inline bool fuzz_parse(const std::string& name, Fn fn) {
    try {
        fn();
        return true;
    } catch (const FuzzReject& r) {
        if (getenv("XSA_FUZZ_VERBOSE")) fprintf(stderr, "rejected: %s\n", r.msg);
        if (strstr(r.msg, name.c_str()) == nullptr) {
            fprintf(stderr, "finding: the rejection message does not name '%s': error: %s\n", name.c_str(), r.msg);
            abort();
        }
        return false;
    }
}

// Structure-aware mutations of a safetensors JSON header (fuzz_safetensors, fuzz_checkpoint use them from
// LLVMFuzzerCustomMutator, for a third of their mutations; libFuzzer's byte-level ones do the rest). They
// make the changes byte-level mutation almost never makes in one step: a tensor's data_offsets moved by one
// amount (its length kept: past the data, overlapping, misaligned), a string value (metadata) or a number
// (shape, offsets) replaced by a value at the edge of a range. Returns false if the header has nothing to
// change.
static inline bool fuzz_mutate_json(std::string* json, unsigned seed) {
    static const char* const strings[] = {"2147483647", "2147483585", "2147483648", "4294967296", "-1", "0", "1", "-2147483648",
                                          "9223372036854775807", "1e309", "nan", "inf", "-0", "", " 1", "1e3", "0x10", "99999999999999999999"};
    static const char* const numbers[] = {"0", "1", "3", "4", "4294967295", "4294967296", "2147483648", "9223372036854775807",
                                          "4611686018427387904", "18446744073709551615", "1073741824", "-1"};
    std::vector<size_t> at;  // where the chosen kind of value starts
    const unsigned kind = seed % 3;
    seed /= 3;
    if (kind == 0) {  // shift a data_offsets pair
        for (size_t p = json->find("\"data_offsets\""); p != std::string::npos; p = json->find("\"data_offsets\"", p + 1)) at.push_back(p);
        if (at.empty()) return false;
        const size_t open = json->find('[', at[seed % at.size()]), comma = json->find(',', open), close = json->find(']', open);
        if (open == std::string::npos || comma == std::string::npos || close == std::string::npos || comma > close) return false;
        const long long a = atoll(json->c_str() + open + 1), b = atoll(json->c_str() + comma + 1);
        static const long long deltas[] = {1, 2, 4, 8, 64, 4096, -1, -4, -8, 1LL << 32, 1LL << 62};
        const long long d = deltas[(seed / 7) % (sizeof deltas / sizeof *deltas)];
        const unsigned long long a2 = (unsigned long long)a + (unsigned long long)d, b2 = (unsigned long long)b + (unsigned long long)d;  // may wrap
        json->replace(open, close + 1 - open, "[" + std::to_string(a2) + "," + std::to_string(b2) + "]");
        return true;
    }
    if (kind == 1) {  // a string value: "key":"value" -> "key":"edge"
        for (size_t p = json->find("\":\""); p != std::string::npos; p = json->find("\":\"", p + 1)) at.push_back(p + 3);
        if (at.empty()) return false;
        const size_t begin = at[seed % at.size()], end = json->find('"', begin);
        if (end == std::string::npos) return false;
        json->replace(begin, end - begin, strings[(seed / 5) % (sizeof strings / sizeof *strings)]);
        return true;
    }
    for (size_t p = 0; p < json->size(); p++)  // a number inside [...]
        if (((*json)[p] == '[' || (*json)[p] == ',') && p + 1 < json->size() && isdigit((unsigned char)(*json)[p + 1])) at.push_back(p + 1);
    if (at.empty()) return false;
    const size_t begin = at[seed % at.size()];
    size_t end = begin;
    while (end < json->size() && isdigit((unsigned char)(*json)[end])) end++;
    json->replace(begin, end - begin, numbers[(seed / 5) % (sizeof numbers / sizeof *numbers)]);
    return true;
}

// Writes `data` as the seed file DIR/NAME (the harnesses that derive their seeds from the real files
// write them when run with XSA_FUZZ_WRITE_SEEDS=DIR; dev/fuzz/make_seeds.py).
static inline void fuzz_write_seed(const std::string& dir, const std::string& name, const void* data, size_t size) {
    const std::string path = dir + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(path.c_str());
        exit(1);
    }
    printf("wrote %s (%zu bytes)\n", path.c_str(), size);
}

// The whole of a file (for harnesses that start from a real one).
static inline std::vector<uint8_t> fuzz_read_all(const std::string& path) {
    std::vector<uint8_t> out;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        perror(path.c_str());
        exit(1);
    }
    uint8_t buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
    fclose(f);
    return out;
}
