// backend.cuh: where the model code meets a backend. train_gpt.cu calls the functions below (no
// suffix); each forwards to the op's CPU twin (g++ build: fp32, OpenMP) or its CUDA version (nvcc
// build: bf16 activations, fp32 master weights, one stream). So the model -- layout, order of ops,
// optimizer grouping -- is written once, and the CPU tests exercise it on every CI run.
#pragma once

#include "../adamw.cuh"
#include "attention.cuh"
#include "common.h"
#include "embedding.cuh"
#include "loss.cuh"
#include "matmul.cuh"
#include "mlp.cuh"
#include "../muon.cuh"
#include "norm.cuh"
#include "residual.cuh"
#include "rotary.cuh"
#include "../xsa.cuh"

#ifdef __CUDACC__
#include "cuda_common.cuh"  // floatX = __nv_bfloat16
static const char* const BACKEND_NAME = "CUDA (bf16 activations, fp32 master weights and optimizer state)";
#else
typedef float floatX;       // the CPU backend computes in fp32 throughout
static const char* const BACKEND_NAME = "CPU (fp32, OpenMP)";
#endif

// ----------------------------------------------------------------------------------------------------
// Backend state and memory. On the CPU, "device" memory is host memory and the copies are memcpy.

#ifdef __CUDACC__
// The batch's ids (inputs, then targets) go through pinned host memory so that their upload is
// asynchronous. Two buffers, used in turn: the host fills one while the copy from the other may still be
// queued behind the previous micro-batch's kernels; it waits only for the copy made two batches ago.
struct BatchStaging {
    int* host[2] = {nullptr, nullptr};  // pinned, `capacity` ints each
    cudaEvent_t copied[2] = {nullptr, nullptr};  // recorded after each buffer's last copy
    size_t capacity = 0;
    int next = 0;                       // the buffer the next batch goes to
};
#endif

// Phase timing, for the benchmark's breakdown of a micro-step (dev/bench/bench_fwdbwd.cu): while `on`,
// backend_phase(name) ends the current phase and starts `name`, and backend_phases_collect() adds each
// phase's time to its name's total. CUDA: events on the stream (graphs must be off: a captured event would
// not time this run); CPU: the wall clock, the CPU ops being synchronous. Off, backend_phase is one branch.
struct PhaseTimer {
    bool on = false;
    std::vector<const char*> names;  // of the marks since the last collect: mark i starts phase names[i]
#ifdef __CUDACC__
    std::vector<cudaEvent_t> marks;  // a pool, grown as needed
#else
    std::vector<double> marks;       // wall_ms()
#endif
    std::vector<std::pair<std::string, double>> totals;  // ms per phase name, in first-seen order
};

struct Backend {
#ifdef __CUDACC__
    cudaStream_t stream = 0;
    float* scratch = nullptr;        // partial sums of the deterministic reductions, attention's backward buffers
    size_t scratch_floats = 0;
    EmbeddingBuckets buckets;        // positions per token id of the current batch (embedding backward)
    BatchStaging staging;            // pinned double buffer of the batch's token ids
#endif
    bool xsa_fused = true;           // CUDA: XSA in attention's epilogue (else its own kernels); CPU: always separate
    bool graphs = true;              // CUDA: replay the training micro-step as a CUDA graph; CPU: no effect
    PhaseTimer phases;
};
static Backend g_backend;

// The time of one span of the stream's work (the optimizer's part of a step): CUDA events around it, or
// the wall clock on the CPU, whose ops are synchronous. Mark 0 starts it, mark 1 ends it.
struct StreamSpan {
#ifdef __CUDACC__
    cudaEvent_t marks[2] = {nullptr, nullptr};
#else
    double marks[2] = {0.0, 0.0};
#endif
};

static inline void stream_span_mark(StreamSpan* s, int which) {
#ifdef __CUDACC__
    if (s->marks[which] == nullptr) cudaCheck(cudaEventCreate(&s->marks[which]));
    cudaCheck(cudaEventRecord(s->marks[which], g_backend.stream));
#else
    s->marks[which] = wall_ms();
#endif
}

// The span's milliseconds, once its end is reached (waits for it).
static inline double stream_span_ms(StreamSpan* s) {
#ifdef __CUDACC__
    float ms = 0.0f;
    cudaCheck(cudaEventSynchronize(s->marks[1]));
    cudaCheck(cudaEventElapsedTime(&ms, s->marks[0], s->marks[1]));
    return ms;
#else
    return s->marks[1] - s->marks[0];
#endif
}

static inline void stream_span_free(StreamSpan* s) {
#ifdef __CUDACC__
    for (cudaEvent_t& e : s->marks)
        if (e != nullptr) cudaCheck(cudaEventDestroy(e));
#endif
    *s = StreamSpan();
}

static inline void backend_phase(const char* name) {
    PhaseTimer& p = g_backend.phases;
    if (!p.on) return;
    const size_t i = p.names.size();
#ifdef __CUDACC__
    if (i == p.marks.size()) {
        p.marks.push_back(nullptr);
        cudaCheck(cudaEventCreate(&p.marks.back()));
    }
    cudaCheck(cudaEventRecord(p.marks[i], g_backend.stream));
#else
    if (i == p.marks.size()) p.marks.push_back(0.0);
    p.marks[i] = wall_ms();
#endif
    p.names.push_back(name);
}

// Ends the last phase, waits for it, and adds every phase since the last collect to the totals.
static inline void backend_phases_collect() {
    PhaseTimer& p = g_backend.phases;
    if (!p.on || p.names.empty()) return;
    backend_phase("");  // the end mark
#ifdef __CUDACC__
    cudaCheck(cudaEventSynchronize(p.marks[p.names.size() - 1]));
#endif
    for (size_t i = 0; i + 1 < p.names.size(); i++) {
#ifdef __CUDACC__
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, p.marks[i], p.marks[i + 1]));
#else
        const double ms = p.marks[i + 1] - p.marks[i];
#endif
        auto it = std::find_if(p.totals.begin(), p.totals.end(), [&](const std::pair<std::string, double>& t) { return t.first == p.names[i]; });
        if (it == p.totals.end()) p.totals.emplace_back(p.names[i], ms);
        else it->second += ms;
    }
    p.names.clear();
}

// Starts the backend and says which it is on `log` (null: says nothing; sample and chat_cli keep their output
// for the text and name the backend in their own summary lines)
static inline void backend_init(FILE* log = stdout) {
#ifdef __CUDACC__
    cuda_context_init();
    cudaCheck(cudaStreamCreate(&g_backend.stream));
    matmul_cuda_init(g_backend.stream);
    if (log)
        fprintf(log, "backend: %s on %s (compute capability %d.%d, %d SMs, %.1f GiB)\n", BACKEND_NAME, g_cuda.name, g_cuda.cc_major,
                g_cuda.cc_minor, g_cuda.sm_count, g_cuda.memory / 1073741824.0);
#else
    if (log) fprintf(log, "backend: %s, %d thread%s (%s)\n", BACKEND_NAME, num_threads(), num_threads() == 1 ? "" : "s", openmp_wait_text().c_str());
#endif
}

// What the kernels of a model with head_dim D take on this device, one line for the start-up output (CUDA:
// the attention kernels' shared memory, chosen for the GPU's limit); stops if a kernel cannot run here. "" on
// the CPU backend.
static inline std::string backend_kernel_plan(int head_dim) {
#ifdef __CUDACC__
    return attention_kernel_plan(head_dim);
#else
    (void)head_dim;
    return "";
#endif
}

// What runs the model, for the logs: the GPU's name, or the CPU backend's thread count.
static inline std::string backend_device_name() {
#ifdef __CUDACC__
    return g_cuda.name;
#else
    return "CPU, " + std::to_string(num_threads()) + " threads";
#endif
}

// The device's memory: in use (measured) or in total, in bytes; 0 on the CPU backend (host memory is
// neither reported nor planned for).
static inline size_t backend_device_memory_query(bool in_use) {
#ifdef __CUDACC__
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return in_use ? total_bytes - free_bytes : total_bytes;
#else
    (void)in_use;
    return 0;
#endif
}
static inline size_t backend_memory_in_use() { return backend_device_memory_query(true); }

// The memory a run can plan for, in bytes: the device's free memory on CUDA, the host's available memory
// on the CPU (MemAvailable of /proc/meminfo: free memory plus what the kernel can reclaim); 0 if unknown.
static inline double backend_memory_available() {
#ifdef __CUDACC__
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return (double)free_bytes;
#else
    FILE* f = fopen("/proc/meminfo", "r");
    if (!f) return 0.0;
    char line[256];
    double kib = 0.0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024.0;
#endif
}

// bf16 dense peak of this device in FLOP/s for MFU (nanochat's table, H100/H200), 0 if unknown: then no
// MFU is printed rather than a made-up one.
static inline double backend_peak_flops() {
#ifdef __CUDACC__
    const std::string name = g_cuda.name;
    if (name.find("H200") != std::string::npos) return name.find("NVL") != std::string::npos ? 836e12 : 989e12;
    if (name.find("H100") != std::string::npos) {
        if (name.find("PCIe") != std::string::npos) return 756e12;
        if (name.find("NVL") != std::string::npos) return 835e12;
        return 989e12;
    }
    if (name.find("A100") != std::string::npos) return 312e12;
#endif
    return 0.0;
}

static inline void* backend_malloc(size_t bytes, const char* what) {
#ifdef __CUDACC__
    void* p = nullptr;
    if (cuda_malloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) fail("out of GPU memory allocating %zu bytes for %s", bytes, what);
    return p;
#else
    return malloc_or_fail(bytes, what);
#endif
}

static inline void backend_free(void* p) {
#ifdef __CUDACC__
    cuda_free(p);
#else
    free(p);
#endif
}

static inline void backend_zero(void* p, size_t bytes) {
#ifdef __CUDACC__
    cudaCheck(cudaMemsetAsync(p, 0, bytes, g_backend.stream));
#else
    memset(p, 0, bytes);
#endif
}

// within backend memory
static inline void backend_copy(void* dst, const void* src, size_t bytes) {
#ifdef __CUDACC__
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_backend.stream));
#else
    memcpy(dst, src, bytes);
#endif
}

// within backend memory: `rows` rows of row_bytes, src_pitch bytes apart, to dst, dst_pitch bytes apart
static inline void backend_copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows) {
#ifdef __CUDACC__
    cudaCheck(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, g_backend.stream));
#else
    for (size_t r = 0; r < rows; r++) memcpy((char*)dst + r * dst_pitch, (const char*)src + r * src_pitch, row_bytes);
#endif
}

// host -> backend; the host buffer may be reused as soon as this returns
static inline void backend_upload(void* dst, const void* host_src, size_t bytes) {
#ifdef __CUDACC__
    cudaCheck(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, g_backend.stream));
    cudaCheck(cudaStreamSynchronize(g_backend.stream));
#else
    memcpy(dst, host_src, bytes);
#endif
}

// A batch's token ids, host -> backend: inputs (n) to idx and, if targets is not null, targets (n) to
// d_targets. On CUDA asynchronous through the pinned double buffer: returns before the copy is done, and
// the host arrays may be reused at once.
static inline void backend_upload_batch(int* d_idx, int* d_targets, const int* idx, const int* targets, size_t n) {
#ifdef __CUDACC__
    BatchStaging& st = g_backend.staging;
    if (2 * n > st.capacity) {  // grow both buffers once their copies are done
        for (int k = 0; k < 2; k++) {
            if (st.copied[k] == nullptr) cudaCheck(cudaEventCreateWithFlags(&st.copied[k], cudaEventDisableTiming));
            cudaCheck(cudaEventSynchronize(st.copied[k]));
            if (st.host[k]) cudaCheck(cudaFreeHost(st.host[k]));
            cudaCheck(cudaMallocHost(&st.host[k], 2 * n * sizeof(int)));
        }
        st.capacity = 2 * n;
    }
    const int k = st.next;
    st.next ^= 1;
    cudaCheck(cudaEventSynchronize(st.copied[k]));  // the copy out of this buffer two batches ago
    memcpy(st.host[k], idx, n * sizeof(int));
    cudaCheck(cudaMemcpyAsync(d_idx, st.host[k], n * sizeof(int), cudaMemcpyHostToDevice, g_backend.stream));
    if (targets) {
        memcpy(st.host[k] + n, targets, n * sizeof(int));
        cudaCheck(cudaMemcpyAsync(d_targets, st.host[k] + n, n * sizeof(int), cudaMemcpyHostToDevice, g_backend.stream));
    }
    cudaCheck(cudaEventRecord(st.copied[k], g_backend.stream));
#else
    memcpy(d_idx, idx, n * sizeof(int));
    if (targets) memcpy(d_targets, targets, n * sizeof(int));
#endif
}

// backend -> host, complete when this returns
static inline void backend_download(void* host_dst, const void* src, size_t bytes) {
#ifdef __CUDACC__
    cudaCheck(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, g_backend.stream));
    cudaCheck(cudaStreamSynchronize(g_backend.stream));
#else
    memcpy(host_dst, src, bytes);
#endif
}

// Work replayed as a CUDA graph (on the CPU, and with g_backend.graphs off, it just runs). A captured graph
// bakes in its launches' arguments: buffer addresses, which change only when device memory is allocated or
// freed (g_device_memory_epoch counts that), and the scalar arguments (shapes, scales), which the caller
// lists in `key`. When either changed, the work first runs eagerly once, so that one-time set-up (the attention kernels' shared-memory opt-in,
// cuBLASLt's algorithm search, lazily sized scratch) happens outside any capture; the next run with the
// same key is captured, and every later one replays the graph: one launch instead of hundreds.
struct BackendGraph {
    std::vector<uintptr_t> key;
    int runs = 0;                      // runs with this key and these buffers so far
#ifdef __CUDACC__
    uint64_t memory_epoch = 0;         // g_device_memory_epoch after the last run
    cudaGraphExec_t exec = nullptr;
#endif
};

static inline void backend_graph_reset(BackendGraph* g) {
#ifdef __CUDACC__
    if (g->exec) cudaCheck(cudaGraphExecDestroy(g->exec));
#endif
    *g = BackendGraph();
}

// `work` enqueues on g_backend.stream and must not synchronise, allocate or read device memory on the host.
template <typename Work>
static inline void backend_graph_run(BackendGraph* g, const std::vector<uintptr_t>& key, Work work) {
#ifdef __CUDACC__
    if (!g_backend.graphs || cuda_sync_debug()) {  // XSA_CUDA_SYNC synchronises after every launch: no capture
        work();
        return;
    }
    if (key != g->key || g_device_memory_epoch != g->memory_epoch) {
        backend_graph_reset(g);
        g->key = key;
    }
    if (g->runs++ == 0) {
        work();  // may allocate (lazily sized buffers): the capture is then taken with the buffers as they end up
        g->memory_epoch = g_device_memory_epoch;
        return;
    }
    if (g->exec == nullptr) {
        cudaGraph_t graph = nullptr;
        cudaCheck(cudaStreamBeginCapture(g_backend.stream, cudaStreamCaptureModeGlobal));
        work();
        cudaCheck(cudaStreamEndCapture(g_backend.stream, &graph));
        cudaCheck(cudaGraphInstantiate(&g->exec, graph, 0));
        cudaCheck(cudaGraphDestroy(graph));
    }
    cudaCheck(cudaGraphLaunch(g->exec, g_backend.stream));
#else
    (void)g, (void)key;
    work();
#endif
}

// cuBLASLt's algorithm for each GEMM (llmc/matmul.cuh, matmul_choose); the CPU backend has none to choose.
// backend_matmul_tune: new GEMM shapes time cuBLASLt's candidates and keep the fastest (while on);
// backend_matmul_choices / _restore_choices: the choices as text for a checkpoint, and taken back on resume;
// backend_matmul_summary: a line on them ("" if none);
// backend_matmul_chosen / _take_chosen: the choices in the order made, for the ranks to take rank 0's.
static inline void backend_matmul_tune(bool on) {
#ifdef __CUDACC__
    g_matmul.tune = on;
#else
    (void)on;
#endif
}

static inline std::string backend_matmul_choices() {
#ifdef __CUDACC__
    return matmul_cuda_choices();
#else
    return "";
#endif
}

static inline void backend_matmul_restore_choices(const std::string& text, const char* source) {
#ifdef __CUDACC__
    matmul_cuda_restore_choices(text, source);
#else
    (void)text, (void)source;  // a CUDA run's checkpoint resumed on the CPU: nothing to choose
#endif
}

static inline std::string backend_matmul_summary() {
#ifdef __CUDACC__
    return matmul_cuda_choices_summary();
#else
    return "";
#endif
}

static inline std::vector<int64_t> backend_matmul_chosen() {
#ifdef __CUDACC__
    return matmul_cuda_chosen();
#else
    return {};
#endif
}

static inline void backend_matmul_take_chosen(const std::vector<int64_t>& chosen) {
#ifdef __CUDACC__
    matmul_cuda_take_chosen(chosen);
#else
    (void)chosen;
#endif
}

#ifdef __CUDACC__
// Scratch for the reductions and the attention backward of a (B, T) batch (CUDA only): the most any op
// that takes g_backend.scratch needs, each op's size from its own header. The ops run one after another
// on one stream, so they share the buffer.
static inline size_t backend_scratch_floats(size_t tokens, int H, int Hkv, int D) {
    size_t attention = 0;  // every path of attention_xsa_backward (layout: attention_backward_scratch)
    for (AttentionBackwardPath path : {ATTN_BWD_PLAIN, ATTN_BWD_XSA_FUSED, ATTN_BWD_XSA_UNFUSED})
        attention = std::max(attention, attention_backward_scratch(tokens, H, Hkv, D, path).floats);
    return std::max({attention, (size_t)DOT_SCRATCH_FLOATS, (size_t)LAMBDA_MIX_SCRATCH_FLOATS, (size_t)SMEAR_SCRATCH_FLOATS,
                     value_embed_scratch_floats(Hkv)});
}

static inline void backend_ensure_scratch(size_t floats) {
    if (floats <= g_backend.scratch_floats) return;
    backend_free(g_backend.scratch);
    g_backend.scratch = (float*)backend_malloc(floats * sizeof(float), "scratch");
    g_backend.scratch_floats = floats;
}
#define CUDA_OR_CPU(cuda_call, cpu_call) cuda_call
#else
#define CUDA_OR_CPU(cuda_call, cpu_call) cpu_call
#endif

// ----------------------------------------------------------------------------------------------------
// Ops. Shapes and semantics: the CPU twin in each op's header.

static inline void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, size_t rows, int C, float scale) {
    CUDA_OR_CPU(rmsnorm_forward_cuda(out, rstd, inp, rows, C, scale, g_backend.stream), rmsnorm_forward_cpu(out, rstd, inp, rows, C, scale));
}
static inline void rmsnorm_backward(floatX* dinp, const floatX* dout, const floatX* out, const float* rstd, size_t rows, int C, float scale,
                                    GradWrite dinp_write) {
    CUDA_OR_CPU(rmsnorm_backward_cuda(dinp, dout, out, rstd, rows, C, scale, dinp_write, g_backend.stream),
                rmsnorm_backward_cpu(dinp, dout, out, rstd, rows, C, scale, dinp_write));
}
// x: token n's heads at x + n * stride (rotary.cuh); so are dinp, dout and out
static inline void rotary_rmsnorm_forward(floatX* x, size_t stride, float* rstd, const float* cos_table, const float* sin_table, int B, int T,
                                          int heads, int D, float scale) {
    CUDA_OR_CPU(rotary_rmsnorm_forward_cuda(x, stride, rstd, cos_table, sin_table, B, T, heads, D, scale, g_backend.stream),
                rotary_rmsnorm_forward_cpu(x, stride, rstd, cos_table, sin_table, B, T, heads, D, scale));
}
static inline void rotary_rmsnorm_backward(floatX* dinp, const floatX* dout, const floatX* out, size_t stride, const float* rstd,
                                           const float* cos_table, const float* sin_table, int B, int T, int heads, int D, float scale) {
    CUDA_OR_CPU(rotary_rmsnorm_backward_cuda(dinp, dout, out, stride, rstd, cos_table, sin_table, B, T, heads, D, scale, g_backend.stream),
                rotary_rmsnorm_backward_cpu(dinp, dout, out, stride, rstd, cos_table, sin_table, B, T, heads, D, scale));
}
static inline void relu2_forward(floatX* out, const floatX* inp, size_t n) {
    CUDA_OR_CPU(relu2_forward_cuda(out, inp, n, g_backend.stream), relu2_forward_cpu(out, inp, n));
}
static inline void relu2_backward(floatX* dinp, const floatX* dout, const floatX* inp, size_t n) {
    CUDA_OR_CPU(relu2_backward_cuda(dinp, dout, inp, n, g_backend.stream), relu2_backward_cpu(dinp, dout, inp, n));
}
static inline void lambda_mix_forward(floatX* out, const floatX* x, const floatX* x0, const float* a, const float* b, size_t n) {
    CUDA_OR_CPU(lambda_mix_forward_cuda(out, x, x0, a, b, n, g_backend.stream), lambda_mix_forward_cpu(out, x, x0, a, b, n));
}
static inline void lambda_mix_backward(floatX* dout, floatX* dx0, float* da, float* db, const floatX* x, const floatX* x0, const float* a,
                                       const float* b, size_t n) {
    CUDA_OR_CPU(lambda_mix_backward_cuda(dout, dx0, da, db, x, x0, a, b, n, g_backend.scratch, g_backend.stream),
                lambda_mix_backward_cpu(dout, dx0, da, db, x, x0, a, b, n));
}
template <typename T>  // floatX (activations) or float (gradients and parameters; the same type on the CPU)
static inline void dot_accumulate(float* out, float factor, const T* x, const T* y, size_t n) {
    CUDA_OR_CPU(dot_accumulate_cuda(out, factor, x, y, n, g_backend.scratch, g_backend.stream), dot_accumulate_cpu(out, factor, x, y, n));
}
static inline void add_inplace(floatX* y, const floatX* x, size_t n) {
    CUDA_OR_CPU(add_inplace_cuda(y, x, n, g_backend.stream), add_inplace_cpu(y, x, n));
}
static inline void scaled_add(floatX* y, const float* scalar, float factor, const floatX* x, size_t n) {
    CUDA_OR_CPU(scaled_add_cuda(y, scalar, factor, x, n, g_backend.stream), scaled_add_cpu(y, scalar, factor, x, n));
}
static inline void embedding_forward(floatX* out, const int* idx, const float* table, size_t N, int C) {
    CUDA_OR_CPU(embedding_forward_cuda(out, idx, table, N, C, g_backend.stream), embedding_forward_cpu(out, idx, table, N, C));
}
// The batch's token ids, on the host, before any embedding_backward of the step: the CUDA backend sorts
// the positions by id here, so that its scatter-add needs no atomics, and sizes its scratch for tables of
// up to max_C channels (the widest embedding_backward to come).
static inline void embedding_prepare_backward(const int* host_idx, size_t N, int max_C) {
#ifdef __CUDACC__
    embedding_buckets_build(&g_backend.buckets, host_idx, N, g_backend.stream);
    embedding_backward_reserve(&g_backend.buckets, max_C, g_backend.stream);
#else
    (void)host_idx, (void)N, (void)max_C;  // the CPU scatter-add reads the ids directly
#endif
}
// dtable[idx[n]] += dout[n]; idx (backend memory) is the batch prepared above
static inline void embedding_backward(float* dtable, const int* idx, const floatX* dout, size_t N, int C) {
    CUDA_OR_CPU(((void)idx, (void)N, embedding_backward_cuda(dtable, dout, &g_backend.buckets, C, g_backend.stream)),
                embedding_backward_cpu(dtable, idx, dout, N, C));
}
static inline void smear_forward(floatX* out, float* gate_logit, const floatX* x, const float* w, const float* lambda, int B, int T, int C) {
    CUDA_OR_CPU(smear_forward_cuda(out, gate_logit, x, w, lambda, B, T, C, g_backend.stream), smear_forward_cpu(out, gate_logit, x, w, lambda, B, T, C));
}
static inline void smear_backward(floatX* dx, float* dw, float* dlambda, const floatX* dout, const floatX* x, const float* gate_logit,
                                  const float* w, const float* lambda, int B, int T, int C) {
    CUDA_OR_CPU(smear_backward_cuda(dx, dw, dlambda, dout, x, gate_logit, w, lambda, B, T, C, g_backend.scratch, g_backend.stream),
                smear_backward_cpu(dx, dw, dlambda, dout, x, gate_logit, w, lambda, B, T, C));
}
static inline void value_embed_forward(floatX* v, size_t v_stride, float* gate, const floatX* h, const float* wg, const float* table,
                                       const int* idx, size_t N, int C, int Hkv, int D) {
    CUDA_OR_CPU(value_embed_forward_cuda(v, v_stride, gate, h, wg, table, idx, N, C, Hkv, D, g_backend.stream),
                value_embed_forward_cpu(v, v_stride, gate, h, wg, table, idx, N, C, Hkv, D));
}
static inline void value_embed_backward(floatX* dve, floatX* dh, float* dwg, const floatX* dv, size_t dv_stride, const float* gate,
                                        const floatX* h, const float* wg, const float* table, const int* idx, size_t N, int C, int Hkv, int D) {
    CUDA_OR_CPU(value_embed_backward_cuda(dve, dh, dwg, dv, dv_stride, gate, h, wg, table, idx, N, C, Hkv, D, g_backend.scratch,
                                          g_backend.stream),
                value_embed_backward_cpu(dve, dh, dwg, dv, dv_stride, gate, h, wg, table, idx, N, C, Hkv, D));
}
// weight: the matmul copy of the parameter (bf16 on CUDA, the fp32 master itself on the CPU)
static inline void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, int M, int K, int N) {
    CUDA_OR_CPU(matmul_forward_cuda(out, inp, weight, M, K, N, g_backend.stream), matmul_forward_cpu(out, inp, weight, M, K, N));
}
static inline void xsa_diagnostics(float* out, const floatX* y, const floatX* z, const floatX* v, const floatX* q, const floatX* k,
                                   QKVStrides strides, const float* lse, int B, int T, int H, int Hkv, int D) {
    CUDA_OR_CPU(xsa_diagnostics_cuda(out, y, z, v, q, k, strides, lse, B, T, H, Hkv, D, g_backend.stream),
                xsa_diagnostics_cpu(out, y, z, v, q, k, strides, lse, B, T, H, Hkv, D));
}
static inline void value_direction_sums(float* out, const floatX* v, size_t v_stride, int B, int T, int Hkv, int D) {
    CUDA_OR_CPU(value_direction_sums_cuda(out, v, v_stride, B, T, Hkv, D, g_backend.stream),
                value_direction_sums_cpu(out, v, v_stride, B, T, Hkv, D));
}
static inline void matmul_forward_add(floatX* out, const floatX* inp, const floatX* weight, const floatX* residual, int M, int K, int N) {
    CUDA_OR_CPU(matmul_forward_add_cuda(out, inp, weight, residual, M, K, N, g_backend.stream),
                matmul_forward_add_cpu(out, inp, weight, residual, M, K, N));
}
static inline void matmul_backward(floatX* dinp, float* dweight, const floatX* dout, const floatX* inp, const floatX* weight, int M, int K, int N,
                                   GradWrite dinp_write) {
    CUDA_OR_CPU(matmul_backward_cuda(dinp, dweight, dout, inp, weight, M, K, N, dinp_write, g_backend.stream),
                matmul_backward_cpu(dinp, dweight, dout, inp, weight, M, K, N, dinp_write));
}
static inline void softcap_crossentropy_forward(float* losses, floatX* logits, const int* targets, size_t N, int V, float cap) {
    CUDA_OR_CPU(softcap_crossentropy_forward_cuda(losses, logits, targets, N, V, cap, g_backend.stream),
                softcap_crossentropy_forward_cpu(losses, logits, targets, N, V, cap));
}
static inline void softcap_crossentropy_backward(floatX* logits, const int* targets, size_t N, int V, float cap, const float* scale) {
    CUDA_OR_CPU(softcap_crossentropy_backward_cuda(logits, targets, N, V, cap, scale, g_backend.stream),
                softcap_crossentropy_backward_cpu(logits, targets, N, V, cap, scale));
}
static inline void loss_mean_scale(float* scale, const int* targets, size_t N, float grad_scale) {
    CUDA_OR_CPU(loss_mean_scale_cuda(scale, targets, N, grad_scale, g_backend.stream), loss_mean_scale_cpu(scale, targets, N, grad_scale));
}
static inline void loss_sum_accumulate(float* out, const float* factor, const float* losses, size_t n) {
    CUDA_OR_CPU(loss_sum_accumulate_cuda(out, factor, losses, n, g_backend.stream), loss_sum_accumulate_cpu(out, factor, losses, n));
}
static inline void softcap(floatX* logits, size_t n, float cap) {
    CUDA_OR_CPU(softcap_cuda(logits, n, cap, g_backend.stream), softcap_cpu(logits, n, cap));
}

// Attention, followed on XSA layers by the projection: z = y - alpha_h proj_v(y), alpha (H) per query head in
// backend memory. q, k, v: rows `at` apart (QKVStrides). On CUDA the projection is fused into attention's
// epilogue unless g_backend.xsa_fused is off; the CPU always runs the two ops.
static inline void attention_xsa_forward(floatX* z, floatX* y, float* lse, const floatX* q, const floatX* k, const floatX* v, QKVStrides strides,
                                         int B, int T, int H, int Hkv, int D, int window, const float* alpha) {
    const bool xsa = alpha != nullptr;
#ifdef __CUDACC__
    if (xsa && g_backend.xsa_fused) {
        attention_forward_xsa_cuda(z, y, lse, q, k, v, strides, B, T, H, Hkv, D, window, alpha, g_backend.stream);
        return;
    }
    attention_forward_cuda(y, lse, q, k, v, strides, B, T, H, Hkv, D, window, g_backend.stream);
    if (xsa) xsa_forward_cuda(z, y, v, strides.kv, (size_t)B * T, H, Hkv, D, alpha, g_backend.stream);
#else
    attention_forward_cpu(y, lse, q, k, v, strides, B, T, H, Hkv, D, window);
    if (xsa) xsa_forward_cpu(z, y, v, strides.kv, (size_t)B * T, H, Hkv, D, alpha);
#endif
}

// Generation's attention: the new token of each row (q (B, H, D), at position pos[b], pos in backend
// memory) over the KV cache (B, S, Hkv, D) -> y (B, H, D); then on XSA layers (alpha non-null) z = y -
// alpha_h proj_v(y) with the new tokens' own values v (B, Hkv, D), the op the training forward uses unfused.
// q and v: rows `at` apart.
static inline void attention_decode_xsa_forward(floatX* z, floatX* y, const floatX* q, const floatX* k_cache, const floatX* v_cache,
                                                const floatX* v, QKVStrides strides, const int* pos, int B, int S, int H, int Hkv, int D,
                                                int window, const float* alpha) {
    CUDA_OR_CPU(attention_decode_cuda(y, q, strides.q, k_cache, v_cache, pos, B, S, H, Hkv, D, window, g_backend.stream),
                attention_decode_cpu(y, q, strides.q, k_cache, v_cache, pos, B, S, H, Hkv, D, window));
    if (alpha)
        CUDA_OR_CPU(xsa_forward_cuda(z, y, v, strides.kv, (size_t)B, H, Hkv, D, alpha, g_backend.stream),
                    xsa_forward_cpu(z, y, v, strides.kv, (size_t)B, H, Hkv, D, alpha));
}

// Given dz = dL/dz (dL/dy on layers without XSA: alpha null), writes dq, dk, dv (=), and with a learnable
// alpha the per-token shares of dL/dalpha into dalpha (B*T, H) (null for a fixed alpha). dz may be overwritten.
// q, k, v, dq, dk, dv: rows `at` apart.
static inline void attention_xsa_backward(floatX* dq, floatX* dk, floatX* dv, float* dalpha, floatX* dz, const floatX* q, const floatX* k,
                                          const floatX* v, QKVStrides strides, const floatX* y, const float* lse, int B, int T, int H, int Hkv,
                                          int D, int window, const float* alpha) {
    const size_t tokens = (size_t)B * T;
    const bool xsa = alpha != nullptr;
#ifdef __CUDACC__
    if (xsa && g_backend.xsa_fused) {
        attention_backward_xsa_cuda(dq, dk, dv, dz, q, k, v, strides, y, lse, B, T, H, Hkv, D, window, alpha, dalpha, g_backend.scratch,
                                    g_backend.stream);
        return;
    }
    if (!xsa) {
        attention_backward_cuda(dq, dk, dv, dz, q, k, v, strides, y, lse, B, T, H, Hkv, D, window, g_backend.scratch, g_backend.stream);
        return;
    }
    // unfused: XSA's own self-position dv term goes to its region of the scratch, past what the attention
    // backward uses (see attention_backward_scratch), since the attention backward overwrites dv
    floatX* dv_xsa = (floatX*)(g_backend.scratch + attention_backward_scratch(tokens, H, Hkv, D, ATTN_BWD_XSA_UNFUSED).dv_xsa);
    backend_zero(dv_xsa, tokens * Hkv * D * sizeof(floatX));
    xsa_backward_cuda(dz, dv_xsa, (size_t)Hkv * D, dalpha, dz, y, v, strides.kv, tokens, H, Hkv, D, alpha, g_backend.stream);
    attention_backward_cuda(dq, dk, dv, dz, q, k, v, strides, y, lse, B, T, H, Hkv, D, window, g_backend.scratch, g_backend.stream);
    add_rows_inplace_cuda(dv, strides.kv, dv_xsa, tokens, Hkv * D, g_backend.stream);
#else
    for (size_t n = 0; n < tokens; n++) {  // the CPU ops accumulate
        memset(dq + n * strides.q, 0, (size_t)H * D * sizeof(float));
        memset(dk + n * strides.kv, 0, (size_t)Hkv * D * sizeof(float));
        memset(dv + n * strides.kv, 0, (size_t)Hkv * D * sizeof(float));
    }
    if (xsa) xsa_backward_cpu(dz, dv, dalpha, dz, y, v, strides.kv, tokens, H, Hkv, D, alpha);  // dz becomes dL/dy; dv gets XSA's term
    attention_backward_cpu(dq, dk, dv, dz, q, k, v, strides, y, lse, B, T, H, Hkv, D, window);
#endif
}

// Learnable alpha: alpha (H) = tanh(logit), and d_logit (H) += dalpha's per-token shares (tokens, H) summed,
// through tanh's derivative (xsa.cuh).
static inline void xsa_alpha_from_logit(float* alpha, const float* logit, int H) {
    CUDA_OR_CPU(xsa_alpha_from_logit_cuda(alpha, logit, H, g_backend.stream), xsa_alpha_from_logit_cpu(alpha, logit, H));
}
static inline void xsa_alpha_backward(float* d_logit, const float* dalpha, const float* alpha, size_t tokens, int H) {
    CUDA_OR_CPU(xsa_alpha_backward_cuda(d_logit, dalpha, alpha, tokens, H, g_backend.stream),
                xsa_alpha_backward_cpu(d_logit, dalpha, alpha, tokens, H));
}
