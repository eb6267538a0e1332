// common.h: what every file of xsa-train shares: error handling that names the culprit and exits 1,
// checked file I/O, a seeded RNG of our own, and deterministic reductions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// A target that is no prediction (PyTorch's and nanochat's ignore_index): SFT's masked positions (loss.cuh)
static const int IGNORE_INDEX = -1;

// ----------------------------------------------------------------------------------------------------
// Errors. Every bad input ends here: one message on stderr, exit code 1, never a crash.

static char g_fail_prefix[32] = "";  // "rank R: " once several ranks train (ranks.cuh)

#ifdef XSA_FUZZ
// The fuzz harnesses (dev/fuzz/) are built with -DXSA_FUZZ: there a rejected input must not end the
// process, so fail() throws this instead of exiting, and the harness catches it. Normal builds never
// throw from fail().
struct FuzzReject {
    char msg[2048];
};
#endif

[[noreturn]] __attribute__((format(printf, 1, 2))) static inline void fail(const char* fmt, ...) {
    char msg[2048];
    va_list args;
    va_start(args, fmt);
    vsnprintf(msg, sizeof msg, fmt, args);
    va_end(args);
#ifdef XSA_FUZZ
    FuzzReject r;
    memcpy(r.msg, msg, sizeof msg);
    throw r;
#else
    fprintf(stderr, "error: %s%s\n", g_fail_prefix, msg);  // one write, so that ranks failing together do not interleave
    exit(1);
#endif
}

// Files mapped into memory that another process could truncate (token shards, conversation files, the rendezvous
// file of launched ranks): a read or write of a page the file lost raises SIGBUS. The handler names the file
// whose mapping holds the faulting address in one `error:` line and exits 1; a SIGBUS anywhere else keeps its
// previous action.
struct FileMapping {
    const char* begin;
    size_t bytes;
    const char* what;  // "shard", "conversation file", "rendezvous file": how the error names it
    char* path;        // malloc'ed: read by the signal handler
};
static std::vector<FileMapping>& g_file_mappings = *new std::vector<FileMapping>;  // never destroyed: the handler may run during exit
static struct sigaction g_sigbus_previous;

static inline void file_mapping_sigbus_handler(int sig, siginfo_t* info, void* context) {
    const char* addr = (const char*)info->si_addr;
    for (const FileMapping& m : g_file_mappings) {
        if (addr >= m.begin && addr < m.begin + m.bytes) {
            // one line, async-signal-safe: write(2) and _exit only
            char line[4096] = "error: ";
            size_t n = strlen(line);
            const char* parts[] = {g_fail_prefix, m.what, " '", m.path, "' was truncated while this run read it (a ", m.what,
                                   " must not change during a run)\n"};
            for (const char* part : parts)
                for (const char* c = part; *c && n < sizeof line - 2; c++) line[n++] = *c;
            if (line[n - 1] != '\n') line[n++] = '\n';
            for (size_t done = 0; done < n;) {
                const ssize_t w = write(2, line + done, n - done);
                if (w <= 0) break;
                done += (size_t)w;
            }
            _exit(1);
        }
    }
    // not ours: the previous action, on the faulting access again
    sigaction(SIGBUS, &g_sigbus_previous, nullptr);
    (void)sig;
    (void)context;
}

static inline void file_mapping_register(const void* begin, size_t bytes, const char* what, const std::string& path) {
    static bool installed = false;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = file_mapping_sigbus_handler;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &g_sigbus_previous);
        installed = true;
    }
    char* copy = strdup(path.c_str());
    if (!copy) fail("out of memory opening %s '%s'", what, path.c_str());
    g_file_mappings.push_back({(const char*)begin, bytes, what, copy});
}

static inline void file_mapping_unregister(const void* begin) {
    for (size_t i = 0; i < g_file_mappings.size(); i++)
        if (g_file_mappings[i].begin == (const char*)begin) {
            free(g_file_mappings[i].path);
            g_file_mappings.erase(g_file_mappings.begin() + i);
            return;
        }
}

static inline FILE* fopen_or_fail(const char* path, const char* mode) {
    struct stat st;  // a FIFO or a device would block or never end: refused before it is opened
    if (mode[0] == 'r' && stat(path, &st) == 0 && !S_ISREG(st.st_mode)) fail("'%s' is not a regular file", path);
    FILE* f = fopen(path, mode);
    if (f == nullptr) fail("cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    return f;
}

static inline void fread_or_fail(void* dst, size_t size, size_t count, FILE* f, const char* path) {
    if (fread(dst, size, count, f) != count) fail("'%s' is truncated or unreadable", path);
}

// An input file opened for reading, closed when it goes out of scope (so a parser that rejects it leaves
// nothing open where fail() throws: the fuzz build), with its size: the parsers bound every count and
// allocation a file claims by what the file can hold.
struct InputFile {
    std::string path;
    FILE* f = nullptr;
    uint64_t size = 0;
    explicit InputFile(const std::string& p) : path(p) {
        f = fopen_or_fail(path.c_str(), "rb");
        struct stat st;
        if (fstat(fileno(f), &st) != 0) fail("cannot stat '%s': %s", path.c_str(), strerror(errno));
        if (!S_ISREG(st.st_mode)) fail("'%s' is not a regular file", path.c_str());
        size = (uint64_t)st.st_size;
    }
    ~InputFile() {
        if (f) fclose(f);
    }
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;
    void read(void* dst, size_t size, size_t count) { fread_or_fail(dst, size, count, f, path.c_str()); }
    bool at_end() {
        char extra;
        return fread(&extra, 1, 1, f) == 0;
    }
    uint64_t left() { return size - std::min<uint64_t>(size, (uint64_t)ftello(f)); }  // bytes not yet read
};

// Files a run writes (checkpoints, weights, CSVs, the rewritten metrics log) go to PATH.tmp first, which is
// flushed, fsync'ed and closed with every step checked, then renamed over PATH, and the directory is
// fsync'ed: a crash, kill -9 or full disk leaves the old file or the new one, never a torn one; an error
// removes PATH.tmp, then says what failed.
struct AtomicFile {
    std::string path, tmp;
    FILE* f = nullptr;
};

static inline void atomic_fail(AtomicFile* a, const char* what) {
    const int err = errno;
    if (a->f) fclose(a->f);
    unlink(a->tmp.c_str());
    fail("cannot %s '%s': %s", what, a->path.c_str(), strerror(err));
}

static inline AtomicFile atomic_open(const std::string& path) {
    AtomicFile a{path, path + "." + std::to_string(getpid()) + ".tmp", nullptr};  // one per process: two writers never share one
    a.f = fopen(a.tmp.c_str(), "wb");
    if (a.f == nullptr) fail("cannot write '%s': %s", a.tmp.c_str(), strerror(errno));
    return a;
}

static inline void atomic_write(AtomicFile* a, const void* data, size_t bytes) {
    if (fwrite(data, 1, bytes, a->f) != bytes) atomic_fail(a, "write");
}

static inline void atomic_commit(AtomicFile* a) {
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) atomic_fail(a, "write");
    FILE* f = a->f;
    a->f = nullptr;
    if (fclose(f) != 0) atomic_fail(a, "write");
    if (rename(a->tmp.c_str(), a->path.c_str()) != 0) atomic_fail(a, "replace");
    const size_t slash = a->path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : a->path.substr(0, slash);
    const int fd = open(dir.c_str(), O_RDONLY);
    if (fd >= 0) {  // the rename itself survives a crash once its directory is on disk
        fsync(fd);
        close(fd);
    }
}

// The index of the first NaN or infinity in x (n if none).
static inline size_t first_non_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(x[i])) return i;
    return n;
}

static inline void* malloc_or_fail(size_t bytes, const char* what) {
    void* p = malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) fail("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

// Command-line values: a malformed number is a user error like any other.
static long parse_int(const char* flag, const char* value) {
    char* end = nullptr;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (end == value || *end != '\0' || errno != 0) fail("%s expects an integer, got '%s'", flag, value);
    return v;
}

// Counts and shapes: an int, so a value past its range is an error rather than a wrapped number.
static int parse_int32(const char* flag, const char* value) {
    long v = parse_int(flag, value);
    if (v < INT_MIN || v > INT_MAX) fail("%s: %s is out of range", flag, value);
    return (int)v;
}

// A number as Python reads it (a double): the schedules compute with it as nanochat does in Python.
static double parse_double(const char* flag, const char* value) {
    char* end = nullptr;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || !std::isfinite(v)) fail("%s expects a number, got '%s'", flag, value);
    return v;
}

static bool parse_bool(const char* flag, const char* value) {
    if (!strcmp(value, "1")) return true;
    if (!strcmp(value, "0")) return false;
    fail("%s expects 0 or 1, got '%s'", flag, value);
}

// The command line of the small programs (eval_core, sample, chat_cli, chat_eval), where every option takes a value:
// -h / --help prints usage() and exits 0; handle(flag, value) returns false for an unknown option.
template <typename Handler>
static void parse_options(int argc, char** argv, void (*usage)(), Handler handle) {
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            usage();
            exit(0);
        }
        if (flag.empty() || flag[0] != '-') fail("'%s' is not an option (options start with -, each followed by its value; see --help)", flag.c_str());
        if (i + 1 >= argc) fail("option %s needs a value (see --help)", flag.c_str());
        if (!handle(flag, argv[++i])) fail("unknown option '%s' (see --help)", flag.c_str());
    }
}

// ----------------------------------------------------------------------------------------------------
// RNG: splitmix64 (a full-period 64-bit generator with a tiny state that fits in a checkpoint).
// Initialisation only needs uniform and normal draws; we never try to match torch's bit stream.

// FNV-1a, 64 bits: fingerprints of files and tokenizers recorded in checkpoints (not a cryptographic hash)
struct Fnv1a {
    uint64_t h = 1469598103934665603ull;
    void mix(const void* p, size_t n) {
        for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t*)p)[i]) * 1099511628211ull;
    }
    std::string hex() const {
        char buf[17];
        snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
        return buf;
    }
};

struct Rng {
    uint64_t state;
};

static inline uint64_t rng_next_u64(Rng* rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// uniform in [0, 1) with 24 random bits, exactly representable as a float
static inline float rng_uniform(Rng* rng) { return (float)(rng_next_u64(rng) >> 40) * (1.0f / 16777216.0f); }

// standard normal by Box-Muller (one draw per call; the second value is discarded for simplicity)
static inline float rng_normal(Rng* rng) {
    double u1 = ((double)(rng_next_u64(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
    double u2 = (double)(rng_next_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static inline void fill_uniform(float* dst, size_t n, float lo, float hi, Rng* rng) {
    for (size_t i = 0; i < n; i++) dst[i] = lo + (hi - lo) * rng_uniform(rng);
}

static inline void fill_normal(float* dst, size_t n, float std, Rng* rng) {
    for (size_t i = 0; i < n; i++) dst[i] = std * rng_normal(rng);
}

// ----------------------------------------------------------------------------------------------------
// How a backward op writes the gradient of its input. The first op that reaches a gradient buffer in a
// backward pass overwrites it: no memset beforehand and no read of stale values; every later op that
// contributes to the same buffer (a tensor read by several ops) adds to it.

enum GradWrite { GRAD_OVERWRITE, GRAD_ACCUMULATE };

// ----------------------------------------------------------------------------------------------------
// Where token n's rows of q, k, v (and of their gradients dq, dk, dv) start: q + n * q, k and v + n * kv.
// Separate buffers: {H D, Hkv D} (qkv_separate); the model's one (tokens, (H + 2 Hkv) D) buffer, which one
// GEMM fills with q | k | v per token: that width for both (qkv_fused). Attention's outputs y, z and their
// gradients stay (tokens, H, D).
struct QKVStrides {
    size_t q, kv;
};
static inline QKVStrides qkv_separate(int H, int Hkv, int D) { return {(size_t)H * D, (size_t)Hkv * D}; }
static inline QKVStrides qkv_fused(int H, int Hkv, int D) { return {(size_t)(H + 2 * Hkv) * D, (size_t)(H + 2 * Hkv) * D}; }

// ----------------------------------------------------------------------------------------------------
// Deterministic reductions. Sums over many elements are split into fixed-size blocks (independent of
// the thread count), each block summed in order in double, then the block sums added in order. So the
// result is bit-identical for any number of OpenMP threads and between runs.

static const int REDUCE_BLOCK = 4096;

// sum_i a[i] * b[i] over n elements
static inline double dot_deterministic(const float* a, const float* b, size_t n) {
    size_t nblocks = (n + REDUCE_BLOCK - 1) / REDUCE_BLOCK;
    std::vector<double> partial(nblocks);
#pragma omp parallel for schedule(static)
    for (long blk = 0; blk < (long)nblocks; blk++) {
        size_t lo = (size_t)blk * REDUCE_BLOCK, hi = std::min(n, lo + REDUCE_BLOCK);
        double acc = 0.0;
        for (size_t i = lo; i < hi; i++) acc += (double)a[i] * (double)b[i];
        partial[blk] = acc;
    }
    double total = 0.0;
    for (size_t blk = 0; blk < nblocks; blk++) total += partial[blk];
    return total;
}

// sum_i a[i] * b[i] over n elements with 16 independent partial sums: without -ffast-math a single
// running sum is a chain of dependent FMAs the compiler may not reorder, while 16 lanes vectorise into
// one wide FMA per step. The summation order is fixed, so results stay deterministic.
template <typename real>
static inline real dot_lanes(const real* a, const real* b, int n) {
    real acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i % 16] += a[i] * b[i];
    real sum = 0;
    for (int l = 0; l < 16; l++) sum += acc[l];
    return sum;
}

// e^x in fp32 as plain arithmetic, so that a loop over it vectorises (a call to std::exp does not, short of
// -ffast-math): x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, Cody-Waite, so r is exact), e^r by its
// Taylor polynomial of degree 7 (truncation < 6e-9 relative), times 2^n built in the exponent bits as
// 2^(n/2) 2^(n - n/2), both normal for every n from -150 to 128. Within 2 ulp of std::exp wherever e^x is a
// normal float (test_exp_tanh_simd); subnormal results lose their precision as floats do; 0 below -104,
// +inf above 88.72, NaN for NaN.
static inline float expf_simd(float x) {
    const float x_lo = -104.0f, x_hi = 88.7228394f;                  // e^-104 < 2^-150 rounds to 0; ln(FLT_MAX)
    const float xc = x > x_lo ? (x < x_hi ? x : x_hi) : x_lo;         // NaN -> x_lo, put right below
    const float round_magic = 12582912.0f;                           // 1.5 * 2^23: adding it rounds to an integer
    const float n = (xc * 1.44269504f + round_magic) - round_magic;  // round(x / ln2)
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;   // ln2 = 0.693359375 - 2.12194440e-4
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t ni = (int32_t)n, half = ni / 2;
    const int32_t bits1 = (half + 127) << 23, bits2 = (ni - half + 127) << 23;
    float scale1, scale2;
    memcpy(&scale1, &bits1, sizeof(float));
    memcpy(&scale2, &bits2, sizeof(float));
    float e = p * scale1 * scale2;
    e = x > x_lo ? e : 0.0f;
    e = x < x_hi ? e : INFINITY;
    return x == x ? e : x;
}

// tanh(x) in fp32, vectorisable like expf_simd: for |x| >= 0.4, (1 - e) / (1 + e) with e = e^(-2|x|) (no
// cancellation there: 1 - e >= 0.55); below, its Taylor series to x^13 (truncation < 4e-9 relative), where
// 1 - e would cancel. Within 3 ulp of std::tanh (test_exp_tanh_simd); NaN for NaN.
static inline float tanhf_simd(float x) {
    const float a = std::fabs(x), x2 = x * x;
    const float e = expf_simd(-2.0f * a);
    const float large = std::copysign((1.0f - e) / (1.0f + e), x);
    float p = 21844.0f / 6081075.0f;  // Taylor coefficients of tanh, x^13 down to x^3
    p = p * x2 - 1382.0f / 155925.0f;
    p = p * x2 + 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    const float small = x * (1.0f + x2 * p);  // not x + x x2 p, which turns -0 into +0
    return a < 0.4f ? small : large;  // NaN: a < 0.4 is false, and large is NaN
}

// max_i x[i] and sum_i x[i] over n floats as 16 independent lanes, like dot_lanes: they vectorise, in a
// fixed order. max_lanes skips NaN (the comparisons are false) and gives -inf for n = 0.
static inline float max_lanes(const float* x, int n) {
    float lanes[16];
    for (int l = 0; l < 16; l++) lanes[l] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = x[i + l] > lanes[l] ? x[i + l] : lanes[l];
    for (; i < n; i++) lanes[i % 16] = x[i] > lanes[i % 16] ? x[i] : lanes[i % 16];
    float m = -INFINITY;
    for (int l = 0; l < 16; l++) m = lanes[l] > m ? lanes[l] : m;
    return m;
}

static inline float sum_lanes(const float* x, int n) {
    float lanes[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += x[i + l];
    for (; i < n; i++) lanes[i % 16] += x[i];
    float sum = 0;
    for (int l = 0; l < 16; l++) sum += lanes[l];
    return sum;
}

static inline int num_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// How OpenMP's threads wait at a barrier for the slowest of them. libgomp spins 300,000 times before it sleeps;
// on a machine shared with other CPU-bound work a spinning thread holds a core that the thread it waits for
// needs, and the quick start ran 12x slower beside 5 busy processes where its share of the CPU was 3.5x
// (dev/bench/cpu_load.py; dev/docs/reliability.md has the table). Spinning 3,000 times keeps a quiet machine's
// speed (within the runs' noise, a few percent) and slows in proportion to the CPU share (4.6x there, 1.3 times the
// share); sleeping at once (OMP_WAIT_POLICY=passive) cost 7-18% on the quiet machine. libgomp reads its settings
// once, as it loads, before main: so the program starts itself again with
// GOMP_SPINCOUNT set, the first thing it does, unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT (theirs
// apply). A binary that cannot be started again goes on with libgomp's default. The CPU backend only: a CUDA
// build's threads barely use OpenMP, and its tools (compute-sanitizer, Nsight) need not meet a restart.
static const char* const OPENMP_SPIN_COUNT = "3000";
static inline void openmp_short_spin(char** argv) {
#if defined(_OPENMP) && !defined(__CUDACC__)
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    setenv("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT, 1);
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT");  // (not started again: libgomp's default applies, and openmp_wait_text says so)
#else
    (void)argv;
#endif
}

// How the threads wait, as set when the program started (for the backend line).
static inline std::string openmp_wait_text() {
    for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
        if (const char* value = getenv(name)) return std::string(name) + "=" + value;
    return "libgomp's default wait";
}

// wall-clock milliseconds since an arbitrary start, for timing steps
static inline double wall_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
