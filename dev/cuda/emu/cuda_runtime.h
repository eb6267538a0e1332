// CPU emulator of the part of CUDA that xsa-train uses (runtime API, kernels as fibers, warp collectives).
// One block at a time; its threads are fibers (ucontext) scheduled cooperatively in a random order each
// pass; warp-collective operations exchange through per-warp buffers between two barriers.
// Stream work is DEFERRED: kernels, memsets and async copies go into one FIFO that runs only at the sync
// points CUDA documents (stream/device/event sync, synchronous memcpy, cudaFree, D2H into pageable memory),
// so a host that reads results before synchronising, or rewrites a pinned buffer an async copy still reads,
// sees what a GPU could show it.
// Stream capture records the ops issued to the capturing stream (kernel arguments and cuBLASLt's host
// alpha/beta as they are at capture; copies read their source at replay), a graph launch enqueues them
// again; a synchronising call, an allocation or a free while any stream captures is reported, as is a
// replayed op whose buffer was freed since the capture.
// Built with -fsanitize=address, device allocations are poisoned while host code runs: a host dereference
// of a device pointer is reported like the segfault it is on a GPU.
#pragma once
#include <ucontext.h>
#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>
#include <algorithm>
#include <random>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

using std::max;
using std::min;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __align__(n) alignas(n)
#define __restrict__ __restrict

[[noreturn]] static inline void emu_die(const char* msg) { fprintf(stderr, "EMULATOR: %s\n", msg); fflush(stdout); fflush(stderr); abort(); }
[[noreturn]] static inline void emu_dief(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void emu_dief(const char* fmt, ...) {
    char buf[1024]; va_list ap; va_start(ap, fmt); vsnprintf(buf, sizeof buf, fmt, ap); va_end(ap); emu_die(buf);
}

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
// vector types with CUDA's sizes and alignments (a misaligned vector access is UB: -fsanitize=alignment reports it)
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline int2 make_int2(int a, int b) { return {a, b}; }
static inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }

// ---- bf16 (cuda_bf16.h semantics: conversions round to nearest even, NaN kept) ----
static inline uint16_t emu_f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float emu_bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
struct alignas(2) __nv_bfloat16 {
    unsigned short x_;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : x_(emu_f2bf(f)) {}
    __nv_bfloat16(double f) : x_(emu_f2bf((float)f)) {}
    operator float() const { return emu_bf(x_); }
};
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { __nv_bfloat16 r; r.x_ = emu_f2bf(f); return r; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf(b.x_); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }

// ---- the emulated GPU: EMU_DEVICE=KEY picks a profile (default h200) ----
// The limits the code sizes itself by, per the CUDA programming guide's table of compute capabilities (shared
// memory per block with the opt-in, per SM) and the memory nvidia-smi reports for each card (MiB).
// EMU_BINARY_ARCH="80 90" emulates a binary built for those architectures only (default: any GPU);
// EMU_SMEM_OPTIN=BYTES replaces the profile's opt-in limit (to reach the code that refuses a kernel).
struct EmuProfile { const char* key; const char* name; int major, minor, sms; size_t smem_block_optin, smem_sm, memory_mib; };
static const EmuProfile emu_profiles[] = {
    {"t4", "Tesla T4", 7, 5, 40, 65536, 65536, 15360},
    {"a100", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 166912, 167936, 81920},
    {"rtx3090", "NVIDIA GeForce RTX 3090", 8, 6, 82, 101376, 102400, 24576},
    {"rtx4090", "NVIDIA GeForce RTX 4090", 8, 9, 128, 101376, 102400, 24564},
    {"l40s", "NVIDIA L40S", 8, 9, 142, 101376, 102400, 46068},
    {"h100", "NVIDIA H100 80GB HBM3", 9, 0, 132, 232448, 233472, 81559},
    {"h200", "NVIDIA H200", 9, 0, 132, 232448, 233472, 143771},
    {"b200", "NVIDIA B200", 10, 0, 148, 232448, 233472, 183359},
    {"rtx5090", "NVIDIA GeForce RTX 5090", 12, 0, 170, 101376, 102400, 32607},
};
static const EmuProfile& emu_profile() {
    static const EmuProfile* p = [] {
        const char* key = getenv("EMU_DEVICE") ? getenv("EMU_DEVICE") : "h200";
        for (const EmuProfile& e : emu_profiles)
            if (!strcmp(e.key, key)) return &e;
        emu_dief("EMU_DEVICE=%s: no such profile (t4, a100, rtx3090, rtx4090, l40s, h100, h200, b200, rtx5090)", key);
    }();
    return *p;
}
static size_t emu_smem_optin_limit() {
    return getenv("EMU_SMEM_OPTIN") ? (size_t)strtoull(getenv("EMU_SMEM_OPTIN"), nullptr, 10) : emu_profile().smem_block_optin;
}
static const size_t EMU_CONTEXT_BYTES = 512ull << 20;  // what the CUDA context takes of the card's memory before the program allocates
// whether a binary built for EMU_BINARY_ARCH has code this GPU runs: SASS for sm_XY runs on X.Z with Z >= Y
// (the Makefile also embeds the PTX of its highest architecture, which any newer GPU compiles)
static bool emu_binary_runs_here() {
    const char* archs = getenv("EMU_BINARY_ARCH");
    if (!archs) return true;
    const EmuProfile& d = emu_profile();
    int highest = 0;
    for (const char* s = archs; *s;) {
        char* end;
        const long a = strtol(s, &end, 10);
        if (end == s) { s++; continue; }
        if (a / 10 == d.major && a % 10 <= d.minor) return true;
        highest = std::max(highest, (int)a);
        s = end;
    }
    return highest > 0 && highest <= d.major * 10 + d.minor;  // the PTX, compiled for this newer GPU
}

// ---- device memory registry ----
struct EmuAlloc { size_t bytes; bool pinned; };
static std::map<uintptr_t, EmuAlloc> emu_allocs;  // base -> size: device allocations and pinned host memory
static size_t emu_device_bytes = 0;
static int emu_device_depth = 0;  // > 0 while "device" work runs (device memory unpoisoned)
static const int emu_fill = getenv("EMU_FILL") ? (int)strtol(getenv("EMU_FILL"), nullptr, 0) : 0xFF;  // NaN bytes
// the allocation holding [p, p + n), or nullptr
static inline const std::pair<const uintptr_t, EmuAlloc>* emu_find(const void* p, size_t n = 1) {
    auto it = emu_allocs.upper_bound((uintptr_t)p);
    if (it == emu_allocs.begin()) return nullptr;
    --it;
    if ((uintptr_t)p + n > it->first + it->second.bytes) return nullptr;
    return &*it;
}
static inline bool emu_is_device(const void* p, size_t n = 1) { auto a = emu_find(p, n); return a && !a->second.pinned; }
static inline bool emu_is_pinned(const void* p, size_t n = 1) { auto a = emu_find(p, n); return a && a->second.pinned; }
static inline void emu_poison_all(bool poison) {
#if EMU_ASAN
    for (auto& kv : emu_allocs)
        if (!kv.second.pinned) {
            if (poison) ASAN_POISON_MEMORY_REGION((void*)kv.first, kv.second.bytes);
            else ASAN_UNPOISON_MEMORY_REGION((void*)kv.first, kv.second.bytes);
        }
#else
    (void)poison;
#endif
}
struct EmuDeviceScope {  // device memory readable while alive
    EmuDeviceScope() { if (emu_device_depth++ == 0) emu_poison_all(false); }
    ~EmuDeviceScope() { if (--emu_device_depth == 0) emu_poison_all(true); }
};
static inline void* emu_alloc(size_t bytes, bool pinned) {
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes ? bytes : 1)) emu_die("out of memory");  // exact size: ASan sees overruns
    memset(p, emu_fill, bytes);
    if (emu_find(p)) emu_die("allocation overlaps a live one");
    emu_allocs[(uintptr_t)p] = {bytes ? bytes : 1, pinned};
#if EMU_ASAN
    if (!pinned && emu_device_depth == 0) ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
    if (!pinned) emu_device_bytes += bytes;
    return p;
}
static inline void emu_free(void* p, bool pinned) {
    if (!p) return;
    auto it = emu_allocs.find((uintptr_t)p);
    if (it == emu_allocs.end()) emu_die("free of a pointer that is not an allocation base");
    if (it->second.pinned != pinned) emu_die(pinned ? "cudaFreeHost of device memory" : "cudaFree of pinned host memory");
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, it->second.bytes);
#endif
    if (!pinned) emu_device_bytes -= it->second.bytes;
    emu_allocs.erase(it);
    free(p);
}

// ---- runtime API ----
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorEmu = 1 };
static inline const char* cudaGetErrorString(cudaError_t e) {
    return e == 0 ? "no error" : e == 2 ? "out of memory" : e == 209 ? "no kernel image is available for execution on the device" : "emulator error";
}
typedef std::vector<std::function<void()>> EmuOps;
struct EmuStream { bool capturing = false; EmuOps* rec = nullptr; };
typedef EmuStream* cudaStream_t;
typedef struct EmuEvent { std::chrono::steady_clock::time_point t; bool timing = true, recorded = false, done = false; }* cudaEvent_t;
typedef EmuOps* cudaGraph_t;
typedef EmuOps* cudaGraphExec_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
struct cudaDeviceProp {
    int multiProcessorCount, major, minor;
    size_t sharedMemPerBlockOptin, sharedMemPerBlock, sharedMemPerMultiprocessor, totalGlobalMem;
    char name[256];
};
struct cudaFuncAttributes { int maxThreadsPerBlock, numRegs; size_t sharedSizeBytes; };

static EmuStream emu_default_stream;
static int emu_captures = 0;
static std::deque<std::function<void()>> emu_queue;  // issued, not yet executed (all streams, issue order)

static inline cudaStream_t emu_stream(cudaStream_t s) { return s ? s : &emu_default_stream; }
// a synchronous call: illegal while any stream captures (it would invalidate the capture)
static inline void emu_no_capture(const char* what) {
    if (emu_captures) emu_dief("%s during stream capture", what);
}
// runs everything issued so far (a host synchronisation point)
static inline void emu_flush() {
    EmuDeviceScope dev;
    while (!emu_queue.empty()) {
        auto f = std::move(emu_queue.front());
        emu_queue.pop_front();
        f();
    }
}
// EMU_EAGER=1: every op runs when issued, so a report points at the call that issued it
static const bool emu_eager = getenv("EMU_EAGER") != nullptr;
static inline void emu_enqueue(cudaStream_t s, std::function<void()> f) {
    s = emu_stream(s);
    if (s->capturing) { s->rec->push_back(f); return; }
    if (s == &emu_default_stream && emu_captures) emu_die("work on the legacy default stream while another stream captures");
    emu_queue.push_back(std::move(f));
    if (emu_eager) emu_flush();
}
enum { cudaErrorMemoryAllocationEmu = 2 };
static inline cudaError_t cudaMalloc(void* pp, size_t bytes) {
    emu_no_capture("cudaMalloc");
    if (emu_device_bytes + bytes + EMU_CONTEXT_BYTES > (emu_profile().memory_mib << 20)) return cudaErrorMemoryAllocationEmu;  // out of memory
    *(void**)pp = emu_alloc(bytes, false);
    return 0;
}
template <typename T> static inline cudaError_t cudaMalloc(T** pp, size_t bytes) { return cudaMalloc((void*)pp, bytes); }
static inline cudaError_t cudaMallocHost(void* pp, size_t bytes) {
    emu_no_capture("cudaMallocHost");
    *(void**)pp = emu_alloc(bytes, true);
    return 0;
}
template <typename T> static inline cudaError_t cudaMallocHost(T** pp, size_t bytes) { return cudaMallocHost((void*)pp, bytes); }
// stream-ordered: usable by work issued to the stream after this call (allocating at once satisfies that).
// Captured, it would become a graph memory node (memory owned by the graph, an address per graph): not
// emulated, so refused rather than run with semantics a GPU does not have.
template <typename T> static inline cudaError_t cudaMallocAsync(T** pp, size_t bytes, cudaStream_t s) {
    if (emu_stream(s)->capturing) emu_die("cudaMallocAsync during stream capture (graph memory nodes are not emulated)");
    *(void**)pp = emu_alloc(bytes, false);
    return 0;
}
static inline cudaError_t cudaFree(void* p) {
    emu_no_capture("cudaFree");
    emu_flush();  // cudaFree synchronises the device
    emu_free(p, false);
    return 0;
}
static inline cudaError_t cudaFreeHost(void* p) {
    emu_no_capture("cudaFreeHost");
    emu_flush();
    emu_free(p, true);
    return 0;
}
// stream-ordered free: the memory is released when the stream gets there
static inline cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
    if (p && !emu_is_device(p)) emu_die("cudaFreeAsync of a pointer that is not device memory");
    if (emu_stream(s)->capturing) emu_die("cudaFreeAsync during stream capture (graph memory nodes are not emulated)");
    emu_enqueue(s, [=] { emu_free(p, false); });
    return 0;
}
static inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    *total = emu_profile().memory_mib << 20;
    *free_bytes = *total - EMU_CONTEXT_BYTES - emu_device_bytes;
    return 0;
}
// the pointers of a copy name memory of the kind `k` says, over the whole range copied
static inline void emu_check_copy2(void* d, size_t dn, const void* s, size_t sn, cudaMemcpyKind k) {
    if (dn == 0 && sn == 0) return;
    const bool dev_d = emu_is_device(d, dn), dev_s = emu_is_device(s, sn);
    const bool any_d = emu_find(d) != nullptr, any_s = emu_find(s) != nullptr;  // device or pinned, at least the start
    auto what = [](bool dev, bool any) { return dev ? "device" : any ? "pinned host, or device past its allocation" : "pageable host"; };
    bool ok = false;
    switch (k) {
    case cudaMemcpyHostToDevice: ok = dev_d && !any_s; if (!ok) ok = dev_d && emu_is_pinned(s, sn); break;
    case cudaMemcpyDeviceToHost: ok = dev_s && !any_d; if (!ok) ok = dev_s && emu_is_pinned(d, dn); break;
    case cudaMemcpyDeviceToDevice: ok = dev_s && dev_d; break;
    default: emu_die("cudaMemcpy kind not emulated");
    }
    if (!ok) emu_dief("cudaMemcpy kind %d: dst %p (%zu bytes) is %s, src %p (%zu bytes) is %s", (int)k, d, dn, what(dev_d, any_d), s, sn, what(dev_s, any_s));
}
static inline void emu_check_copy(void* d, const void* s, size_t n, cudaMemcpyKind k) { emu_check_copy2(d, n, s, n, k); }
static inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) {
    emu_no_capture("synchronous cudaMemcpy");
    emu_check_copy(d, s, n, k);
    emu_flush();
    EmuDeviceScope dev;
    memcpy(d, s, n);
    return 0;
}
static inline cudaError_t cudaMemcpy2D(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height, cudaMemcpyKind k) {
    emu_no_capture("synchronous cudaMemcpy2D");
    if (width > dpitch || width > spitch) emu_die("cudaMemcpy2D: width above a pitch");
    if (height == 0 || width == 0) return 0;
    emu_check_copy2(d, (height - 1) * dpitch + width, s, (height - 1) * spitch + width, k);
    emu_flush();
    EmuDeviceScope dev;
    for (size_t r = 0; r < height; r++) memcpy((char*)d + r * dpitch, (const char*)s + r * spitch, width);
    return 0;
}
// documented behaviour: H2D from pageable memory is staged at the call (the buffer may be reused at once);
// from pinned memory the copy reads the buffer when the stream gets there. D2H into pageable memory is
// synchronous; into pinned memory asynchronous.
static inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st = nullptr) {
    emu_check_copy(d, s, n, k);
    if (k == cudaMemcpyHostToDevice && !emu_is_pinned(s, n)) {
        if (emu_stream(st)->capturing) emu_die("cudaMemcpyAsync from pageable host memory during capture");
        std::shared_ptr<std::vector<char>> staged(new std::vector<char>((const char*)s, (const char*)s + n));
        emu_enqueue(st, [=] { memcpy(d, staged->data(), n); });
    } else if (k == cudaMemcpyDeviceToHost && !emu_is_pinned(d, n)) {
        if (emu_stream(st)->capturing) emu_die("cudaMemcpyAsync to pageable host memory during capture");
        emu_enqueue(st, [=] { memcpy(d, s, n); });
        emu_flush();
    } else {
        emu_enqueue(st, [=] { emu_check_copy(d, s, n, k); memcpy(d, s, n); });
    }
    return 0;
}
// device to device only (what the trainer uses it for: rows of the q|k|v buffer into the KV cache)
static inline cudaError_t cudaMemcpy2DAsync(void* d, size_t dpitch, const void* s, size_t spitch, size_t width, size_t height,
                                            cudaMemcpyKind k, cudaStream_t st = nullptr) {
    if (k != cudaMemcpyDeviceToDevice) emu_die("cudaMemcpy2DAsync: only device to device is emulated");
    if (width > dpitch || width > spitch) emu_die("cudaMemcpy2DAsync: width above a pitch");
    if (height == 0 || width == 0) return 0;
    const size_t dn = (height - 1) * dpitch + width, sn = (height - 1) * spitch + width;
    emu_check_copy2(d, dn, s, sn, k);
    emu_enqueue(st, [=] {
        emu_check_copy2(d, dn, s, sn, k);
        for (size_t r = 0; r < height; r++) memcpy((char*)d + r * dpitch, (const char*)s + r * spitch, width);
    });
    return 0;
}
static inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s = nullptr) {
    if (n && !emu_find(p, n)) emu_die("cudaMemsetAsync outside any allocation");
    emu_enqueue(s, [=] {
        if (n && !emu_find(p, n)) emu_die("cudaMemsetAsync (replayed) outside any live allocation");
        memset(p, v, n);
    });
    return 0;
}
static inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    emu_no_capture("cudaMemset");
    return cudaMemsetAsync(p, v, n, nullptr);
}
static std::set<cudaStream_t> emu_streams;
static inline cudaError_t cudaStreamCreate(cudaStream_t* s) { emu_no_capture("cudaStreamCreate"); *s = new EmuStream(); emu_streams.insert(*s); return 0; }
static const unsigned cudaStreamNonBlocking = 1;
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    if (flags & ~cudaStreamNonBlocking) emu_die("cudaStreamCreateWithFlags: flag not emulated");
    return cudaStreamCreate(s);
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!emu_streams.count(s)) emu_die("cudaStreamDestroy of an unknown stream");
    if (s->capturing) emu_die("cudaStreamDestroy of a capturing stream");
    emu_streams.erase(s); delete s; return 0;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { emu_no_capture("cudaStreamSynchronize"); (void)s; emu_flush(); return 0; }
static inline cudaError_t cudaDeviceSynchronize() { emu_no_capture("cudaDeviceSynchronize"); emu_flush(); return 0; }
static inline cudaError_t cudaGetLastError() { return 0; }
// EMU_DEVICES (default 8) devices, all the same host memory: what ranks of a --ranks run select
static int emu_device = 0;
static inline cudaError_t cudaGetDeviceCount(int* n) { *n = getenv("EMU_DEVICES") ? atoi(getenv("EMU_DEVICES")) : 8; return 0; }
static inline cudaError_t cudaSetDevice(int d) {
    int n = 0;
    cudaGetDeviceCount(&n);
    if (d < 0 || d >= n) emu_dief("cudaSetDevice(%d): the emulator has %d devices (EMU_DEVICES)", d, n);
    emu_device = d;
    return 0;
}
static inline cudaError_t cudaGetDevice(int* d) { *d = emu_device; return 0; }
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
    const EmuProfile& d = emu_profile();
    p->multiProcessorCount = d.sms; p->major = d.major; p->minor = d.minor;
    p->sharedMemPerBlockOptin = emu_smem_optin_limit(); p->sharedMemPerBlock = 49152; p->sharedMemPerMultiprocessor = d.smem_sm;
    p->totalGlobalMem = d.memory_mib << 20;
    snprintf(p->name, 256, "%s (CPU emulator)", d.name); return 0;
}
// fails as CUDA does (cudaErrorNoKernelImageForDevice) where the binary holds no code for the GPU (EMU_BINARY_ARCH)
enum { cudaErrorNoKernelImageForDeviceEmu = 209 };
template <typename F>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, F*) {
    if (!emu_binary_runs_here()) return cudaErrorNoKernelImageForDeviceEmu;
    a->maxThreadsPerBlock = 1024; a->numRegs = 0; a->sharedSizeBytes = 0; return 0;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new EmuEvent(); return 0; }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming)) emu_die("cudaEventCreateWithFlags: flag not emulated");
    *e = new EmuEvent(); (*e)->timing = !(flags & cudaEventDisableTiming); return 0;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return 0; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    e->recorded = true; e->done = false;
    emu_enqueue(s, [=] { e->t = std::chrono::steady_clock::now(); e->done = true; });
    return 0;
}
// Every stream's work runs in one queue in issue order, so a wait is met by then if the event was recorded
// before: what is checked is that it was (waiting on an event never recorded is a no-op on a GPU, and so
// most likely a missing record).
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    if (flags != 0) emu_die("cudaStreamWaitEvent: flags not emulated");
    if (!e->recorded) emu_die("cudaStreamWaitEvent on an event never recorded");
    emu_enqueue(s, [=] { if (!e->done) emu_die("cudaStreamWaitEvent: the event's work has not run"); });
    return 0;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) { emu_no_capture("cudaEventSynchronize"); if (e->recorded) emu_flush(); return 0; }
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a->timing || !b->timing) emu_die("cudaEventElapsedTime on an event created with cudaEventDisableTiming");
    if (!a->done || !b->done) emu_die("cudaEventElapsedTime before the events completed (cudaErrorNotReady)");
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count(); return 0;
}
static inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    *status = emu_stream(s)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return 0;
}
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (!s) emu_die("capture on the legacy default stream");
    if (s->capturing) emu_die("stream already capturing");
    s->capturing = true; s->rec = new EmuOps(); emu_captures++; return 0;
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
    if (!s || !s->capturing) emu_die("cudaStreamEndCapture on a stream that is not capturing");
    s->capturing = false; *g = s->rec; s->rec = nullptr; emu_captures--; return 0;
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, int) { *e = new EmuOps(*g); return 0; }
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    EmuOps ops = *e;
    emu_enqueue(s, [ops] { for (auto& f : ops) f(); });
    return 0;
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return 0; }
static inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return 0; }

static std::map<const void*, int> emu_smem_optin;
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F* f, cudaFuncAttribute, int bytes) {
    if ((size_t)bytes > emu_smem_optin_limit())
        emu_dief("cudaFuncSetAttribute: %d bytes of dynamic shared memory, above the %zu a block of the %s may have", bytes,
                 emu_smem_optin_limit(), emu_profile().name);
    emu_smem_optin[(const void*)f] = bytes; return 0;
}

// ---- execution model ----
struct EmuBarrier { int need = 0, count = 0; long gen = 0; };
struct CpOp { void* dst; const void* src; };
struct EmuFiber {
    ucontext_t ctx;
    char* stack = nullptr;
    unsigned tid = 0;
    bool done = false;
    int sync_predicate = 0;                   // this thread's argument to the current __syncthreads_count
    std::vector<CpOp> open;
    std::vector<std::vector<CpOp>> groups;
};
struct EmuWarp {
    int lanes = 32;                           // threads of the block in this warp (the last may be partial)
    unsigned exited = 0;                      // lanes that returned
    std::map<unsigned, EmuBarrier> bars;      // one per participating mask
    uint32_t xa[32][4], xb[32][2];
    const void* addr[32];
    uint64_t xv[32];
};
static const size_t EMU_STACK = (getenv("EMU_STACK_KB") ? atoi(getenv("EMU_STACK_KB")) : 256) * 1024;
static std::vector<EmuFiber> emu_fibers;
static std::vector<EmuWarp> emu_warps;
static EmuBarrier emu_block_bar;
static std::vector<unsigned char> emu_smem;
static size_t emu_smem_bytes = 0;
static EmuFiber* emu_cur = nullptr;
static ucontext_t emu_sched;
static long emu_progress = 0;
static long emu_block_serial = 0;  // distinct per block run: static __shared__ arrays are re-poisoned per block
static std::function<void()> emu_thunk;
static std::mt19937 emu_rng(12345);
static unsigned emu_nthreads = 0;

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static const int warpSize = 32;

static inline void emu_yield() { swapcontext(&emu_cur->ctx, &emu_sched); }
static inline void emu_barrier(EmuBarrier& b) {
    const long gen = b.gen;
    emu_progress++;
    if (++b.count == b.need) { b.count = 0; b.gen++; return; }
    while (b.gen == gen) emu_yield();
}
static inline void __syncthreads() { emu_barrier(emu_block_bar); }
// a block barrier that returns how many of the block's threads passed a nonzero predicate
static inline int __syncthreads_count(int predicate) {
    emu_cur->sync_predicate = predicate != 0;
    emu_barrier(emu_block_bar);
    int count = 0;
    for (unsigned i = 0; i < emu_nthreads; i++) count += emu_fibers[i].sync_predicate;
    emu_barrier(emu_block_bar);  // every thread has counted before any sets its predicate again
    return count;
}
static inline unsigned emu_tid() { return emu_cur->tid; }
static inline int emu_lane() { return emu_tid() % 32; }
static inline EmuWarp& emu_warp() { return emu_warps[emu_tid() / 32]; }
// the barrier of the lanes in `mask`; every lane of the mask must exist and take part
static inline EmuBarrier& emu_warp_bar(unsigned mask, const char* what) {
    EmuWarp& w = emu_warp();
    const unsigned present = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1u;
    if (!(mask >> emu_lane() & 1u)) emu_dief("%s: calling lane %d not in mask %08x", what, emu_lane(), mask);
    if (mask & ~present) emu_dief("%s: mask %08x names lanes that do not exist (warp of %d threads)", what, mask, w.lanes);
    if (mask & w.exited) emu_dief("%s: mask %08x names lanes that already exited (%08x)", what, mask, w.exited);
    EmuBarrier& b = w.bars[mask];
    b.need = __builtin_popcount(mask);
    return b;
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_barrier(emu_warp_bar(mask, "__syncwarp")); }
template <typename T>
static inline T emu_shfl(unsigned mask, T v, int src, const char* what) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    EmuWarp& w = emu_warp(); const int lane = emu_lane();
    EmuBarrier& b = emu_warp_bar(mask, what);
    memcpy(&w.xv[lane], &v, sizeof(T));
    emu_barrier(b);
    T r = v;  // a source lane outside the warp width returns the caller's own value
    if (src >= 0 && src < 32) {
        if (!(mask >> src & 1u)) emu_dief("%s: lane %d reads lane %d outside mask %08x (undefined)", what, lane, src, mask);
        memcpy(&r, &w.xv[src], sizeof(T));
    }
    emu_barrier(b);
    return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int x, int width = 32) {
    const int lane = emu_lane();
    int src = lane ^ x;
    if (src / width != lane / width) src = lane;  // outside the lane's segment: own value
    return emu_shfl(m, v, src, "__shfl_xor_sync");
}
template <typename T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int width = 32) {
    const int lane = emu_lane();
    int src = lane + (int)d;
    if (src / width != lane / width) src = lane;
    return emu_shfl(m, v, src, "__shfl_down_sync");
}
template <typename T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int width = 32) {
    const int lane = emu_lane();
    int src = lane - (int)d;
    if (src < lane / width * width) src = lane;
    return emu_shfl(m, v, src, "__shfl_up_sync");
}
template <typename T> static inline T __shfl_sync(unsigned m, T v, int s, int width = 32) {
    const int lane = emu_lane();
    return emu_shfl(m, v, lane / width * width + s % width, "__shfl_sync");
}
template <typename T> static inline T __ldg(const T* p) { return *p; }
static inline unsigned __cvta_generic_to_shared(const void* p) { return (unsigned)((const unsigned char*)p - emu_smem.data()); }

static inline unsigned char* emu_dyn_smem() { return emu_smem.data(); }
// static __shared__ arrays live in `static` storage: NaN bytes at the first touch of each block
static std::unordered_map<const void*, long> emu_static_smem;
static inline void emu_shared_poison(void* p, size_t n) {
    long& serial = emu_static_smem[p];
    if (serial != emu_block_serial) { memset(p, 0xFF, n); serial = emu_block_serial; }
}
static inline void emu_check_launch_bounds(unsigned max_threads) {
    if (blockDim.x * blockDim.y * blockDim.z > max_threads)
        emu_dief("block of %u threads above __launch_bounds__(%u): the launch fails", blockDim.x * blockDim.y * blockDim.z, max_threads);
}
static inline void emu_check_smem(const void* p, size_t n, const char* what) {
    const unsigned char* c = (const unsigned char*)p;
    if (c < emu_smem.data() || c + n > emu_smem.data() + emu_smem_bytes) { fprintf(stderr, "%s: %p outside dynamic smem [%p, +%zu)\n", what, p, (void*)emu_smem.data(), emu_smem_bytes); emu_die("smem out of range"); }
    if (((uintptr_t)(c - emu_smem.data())) % 16 != 0) emu_die("smem address not 16-byte aligned");
}
static inline void emu_cp_async_16(void* dst, const void* src) {
    emu_check_smem(dst, 16, "cp.async dst");
    if ((uintptr_t)src % 16) emu_die("cp.async src not 16-byte aligned");
    static const bool eager = getenv("EMU_CP_EAGER") != nullptr;
    if (eager) memcpy(dst, src, 16);  // lands at once: a missing barrier before refilling a buffer shows
    else emu_cur->open.push_back({dst, src});  // lands at the wait: reading before waiting shows
}
static inline void emu_cp_async_commit() { emu_cur->groups.push_back(emu_cur->open); emu_cur->open.clear(); }
static inline void emu_cp_async_wait(int n) {
    while ((int)emu_cur->groups.size() > n) {
        for (const CpOp& op : emu_cur->groups.front()) memcpy(op.dst, op.src, 16);
        emu_cur->groups.erase(emu_cur->groups.begin());
    }
}
static inline void emu_ldmatrix_x4(uint32_t r[4], const void* p, bool trans) {
    EmuWarp& w = emu_warp(); const int lane = emu_lane();
    EmuBarrier& b = emu_warp_bar(0xffffffffu, "ldmatrix");
    emu_check_smem(p, 16, "ldmatrix row");
    w.addr[lane] = p; emu_barrier(b);
    for (int m = 0; m < 4; m++) {
        uint16_t lo, hi;
        if (!trans) {
            const uint16_t* row = (const uint16_t*)w.addr[m * 8 + lane / 4];
            lo = row[2 * (lane % 4)], hi = row[2 * (lane % 4) + 1];
        } else {
            lo = ((const uint16_t*)w.addr[m * 8 + 2 * (lane % 4)])[lane / 4];
            hi = ((const uint16_t*)w.addr[m * 8 + 2 * (lane % 4) + 1])[lane / 4];
        }
        r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    emu_barrier(b);
}
static inline void emu_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    EmuWarp& w = emu_warp(); const int lane = emu_lane(), g = lane / 4, t = lane % 4;
    EmuBarrier& bar = emu_warp_bar(0xffffffffu, "mma.sync");
    for (int i = 0; i < 4; i++) w.xa[lane][i] = a[i];
    w.xb[lane][0] = b0, w.xb[lane][1] = b1;
    emu_barrier(bar);
    auto A = [&](int row, int k) {
        const uint32_t reg = w.xa[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)];
        return emu_bf((uint16_t)(k % 2 ? reg >> 16 : reg & 0xffff));
    };
    auto B = [&](int k, int n) {
        const uint32_t reg = w.xb[n * 4 + (k % 8) / 2][k / 8];
        return emu_bf((uint16_t)(k % 2 ? reg >> 16 : reg & 0xffff));
    };
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float s = 0.0f;
        for (int k = 0; k < 16; k++) s += A(row, k) * B(k, col);
        c[e] += s;
    }
    emu_barrier(bar);
}

static void emu_entry() {
    emu_thunk();
    if (!emu_cur->groups.empty() || !emu_cur->open.empty()) emu_die("thread exited with cp.async groups pending");
    emu_cur->done = true;
    emu_warps[emu_cur->tid / 32].exited |= 1u << (emu_cur->tid % 32);
}

static long emu_blocks_run = 0, emu_launches = 0;
static void emu_run_grid(const std::function<void()>& fn, dim3 grid, dim3 block, size_t smem) {
    const unsigned nt = block.x * block.y * block.z;
    if ((int)emu_fibers.size() < (int)nt) emu_fibers.resize(nt);
    for (unsigned i = 0; i < nt; i++) if (!emu_fibers[i].stack) emu_fibers[i].stack = (char*)malloc(EMU_STACK);
    gridDim = grid; blockDim = block; emu_nthreads = nt;
    emu_thunk = fn;
    emu_launches++;
    for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
        blockIdx = {bx, by, bz};
        emu_block_serial++;
        emu_smem_bytes = smem;
        emu_smem.assign(smem + 16, 0xFF);  // NaN bytes: reading what nothing wrote shows up
        emu_block_bar = EmuBarrier(); emu_block_bar.need = nt;
        emu_warps.assign((nt + 31) / 32, EmuWarp());
        emu_warps.back().lanes = nt - 32 * (emu_warps.size() - 1);
        for (unsigned i = 0; i < nt; i++) {
            EmuFiber& f = emu_fibers[i];
            f.tid = i; f.done = false; f.open.clear(); f.groups.clear();
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack; f.ctx.uc_stack.ss_size = EMU_STACK; f.ctx.uc_link = &emu_sched;
            makecontext(&f.ctx, emu_entry, 0);
        }
        std::vector<unsigned> order(nt);
        for (unsigned i = 0; i < nt; i++) order[i] = i;
        int alive = nt, idle_passes = 0;
        static const double skew = getenv("EMU_SKEW") ? atof(getenv("EMU_SKEW")) : 0.0;
        std::vector<char> frozen((nt + 31) / 32, 0);
        while (alive > 0) {
            const long before = emu_progress; int finished = 0;
            std::shuffle(order.begin(), order.end(), emu_rng);  // a different interleaving every pass
            // skew: whole warps sit out a pass at random, so warps drift apart as on hardware
            for (auto& fz : frozen) fz = skew > 0 && std::uniform_real_distribution<double>(0, 1)(emu_rng) < skew;
            for (unsigned i : order) {
                EmuFiber& f = emu_fibers[i];
                if (f.done || frozen[i / 32]) continue;
                emu_cur = &f;
                threadIdx = {f.tid % block.x, f.tid / block.x % block.y, f.tid / (block.x * block.y)};
                swapcontext(&emu_sched, &f.ctx);
                if (f.done) { alive--; finished++; }
            }
            idle_passes = (finished == 0 && emu_progress == before) ? idle_passes + 1 : 0;
            if (alive > 0 && idle_passes > 200) {
                emu_dief("deadlock in a block of %u threads: %d threads wait at barriers that cannot complete "
                         "(__syncthreads after some threads returned, or a warp collective missing lanes)", nt, alive);
            }
        }
        emu_blocks_run++;
    }
    emu_cur = nullptr;
}
struct EmuCfg { dim3 grid, block; size_t smem; cudaStream_t stream; };
static inline EmuCfg emu_cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) { return {g, b, s, st}; }
template <typename T>
static inline void emu_check_arg(const T& a, int i, const char* kname) {
    if constexpr (std::is_pointer<T>::value) {
        if (a != nullptr && !emu_find((const void*)a)) emu_dief("kernel %s: argument %d (%p) is not device memory", kname, i, (const void*)a);
    }
}
template <typename... KArgs, typename... Args>
static inline void emu_launch_(const char* kname, void (*k)(KArgs...), EmuCfg c, Args... args) {
    static_assert(sizeof...(KArgs) == sizeof...(Args), "kernel argument count");
    std::tuple<KArgs...> targs(static_cast<KArgs>(args)...);
    const dim3 grid = c.grid, block = c.block;
    const unsigned nt = block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) emu_dief("kernel %s: empty grid (%u, %u, %u): invalid configuration", kname, grid.x, grid.y, grid.z);
    if (block.x == 0 || block.y == 0 || block.z == 0) emu_dief("kernel %s: empty block", kname);
    if (block.x > 1024 || block.y > 1024 || block.z > 64 || (unsigned long)block.x * block.y * block.z > 1024)
        emu_dief("kernel %s: block (%u, %u, %u) above the limits (1024 threads; x, y <= 1024, z <= 64)", kname, block.x, block.y, block.z);
    if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) emu_dief("kernel %s: grid (%u, %u, %u) above the limits", kname, grid.x, grid.y, grid.z);
    if (c.smem > 48 * 1024) {
        auto it = emu_smem_optin.find((const void*)k);
        if (it == emu_smem_optin.end() || (size_t)it->second < c.smem) emu_dief("kernel %s: dynamic smem %zu > 48 KB without cudaFuncSetAttribute", kname, c.smem);
    }
    (void)nt;
    std::apply([&](const auto&... a) { int i = 0; (emu_check_arg(a, i++, kname), ...); }, targs);
    std::function<void()> fn = [=] { std::apply(k, targs); };
    const size_t smem = c.smem;
    // checked again when the launch runs: a graph replayed after a buffer it bakes in was freed
    emu_enqueue(c.stream, [=] {
        std::apply([&](const auto&... a) { int i = 0; (emu_check_arg(a, i++, kname), ...); }, targs);
        emu_run_grid(fn, grid, block, smem);
    });
}
