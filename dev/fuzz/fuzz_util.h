// fuzz_util.h: what the libFuzzer harnesses of dev/fuzz/ share (dev/fuzz/README.md).
//
// The parsers read files by path, so each input is written to an in-memory file (memfd) that they open as
// /proc/self/fd/N. They are built with -DXSA_FUZZ, where fail() throws FuzzReject instead of exiting
// (llmc/common.h): a rejected input is the expected outcome, not a finding. A finding is anything else:
// a sanitizer report (ASan: out-of-bounds, use-after-free, leaks; UBSan: overflow, misalignment, bad
// shifts, ...), an uncaught exception (std::bad_alloc from an allocation a file sized, std::stoi's
// exceptions), an allocation over -malloc_limit_mb, a hang, or a rejection message that does not name
// the file (fuzz_reject_names).
#pragma once

#ifndef XSA_FUZZ
#error "build the harnesses with -DXSA_FUZZ (make fuzz), so that fail() throws instead of exiting"
#endif

#include <sys/mman.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/common.h"

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

// Writes `data` as the seed file DIR/NAME (the harnesses that derive their seeds from the real files
// write them when run with XSA_FUZZ_WRITE_SEEDS=DIR; dev/fuzz/make_seeds.sh).
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
