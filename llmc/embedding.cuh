// embedding.cuh: the token-indexed ops: embedding lookups (wte, value embeddings) and their scatter-add
// backward, the smear of the previous token's embedding, and the value-embedding gate.
#pragma once

#include "common.h"

// channels of the current token's normed embedding that drive the smear gate (nanochat: 24)
static const int SMEAR_CHANNELS = 24;
// channels of the normed block input that drive the value-embedding gate (nanochat: 12)
static const int VE_GATE_CHANNELS = 12;

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// ----------------------------------------------------------------------------------------------------
// CPU backend

// out (N, C) = table[idx[n]]   (table (rows, C); ids were validated against the vocab by the caller)
static inline void embedding_forward_cpu(float* out, const int* idx, const float* table, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) memcpy(out + (size_t)n * C, table + (size_t)idx[n] * C, C * sizeof(float));
}

// dtable[idx[n]] += dout[n] for n in order. Threads split the channels, not the tokens, so two tokens
// with the same id never race and the order of the sum is fixed.
static inline void embedding_backward_cpu(float* dtable, const int* idx, const float* dout, size_t N, int C) {
    const int chunk = 64;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += chunk) {
        int c1 = c0 + chunk < C ? c0 + chunk : C;
        for (size_t n = 0; n < N; n++) {
            float* dst = dtable + (size_t)idx[n] * C;
            const float* g = dout + n * C;
            for (int c = c0; c < c1; c++) dst[c] += g[c];
        }
    }
}

// Smear: for t >= 1, out_t = x_t + lambda * sigmoid(w . x_t[0:24]) * x_{t-1}; out_0 = x_0.
// x, out (B, T, C); gate_logit (B, T) keeps w . x_t[0:24] for the backward.
static inline void smear_forward_cpu(float* out, float* gate_logit, const float* x, const float* w, const float* lambda_ptr, int B, int T, int C) {
    const float lambda = lambda_ptr[0];
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            const float* xt = x + n * C;
            float* ot = out + n * C;
            if (t == 0) {
                memcpy(ot, xt, C * sizeof(float));
                gate_logit[n] = 0.0f;
                continue;
            }
            float a = 0.0f;
            for (int c = 0; c < SMEAR_CHANNELS; c++) a += w[c] * xt[c];
            gate_logit[n] = a;
            float g = lambda * sigmoidf(a);
            const float* xp = xt - C;
            for (int c = 0; c < C; c++) ot[c] = xt[c] + g * xp[c];
        }
}

// dx (B, T, C) += dL/dx through the smear; dw (24) and dlambda (1) accumulate. dout (B, T, C).
static inline void smear_backward_cpu(float* dx, float* dw, float* dlambda, const float* dout, const float* x,
                                      const float* gate_logit, const float* w, const float* lambda_ptr, int B, int T, int C) {
    const float lambda = lambda_ptr[0];
    // per token: dL/d(gate) = dout_t . x_{t-1}; the (N x 25) parameter partials are summed serially below
    size_t N = (size_t)B * T;
    std::vector<float> dgate(N, 0.0f);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        if (n % T == 0) continue;
        const float* g = dout + n * C;
        const float* xp = x + (n - 1) * C;
        float acc = 0.0f;
        for (int c = 0; c < C; c++) acc += g[c] * xp[c];
        dgate[n] = acc;
    }
    // dx_t = dout_t + (gate_{t+1} dout_{t+1}) + (da_t w on the first 24 channels)
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        float* dxt = dx + n * C;
        const float* g = dout + n * C;
        for (int c = 0; c < C; c++) dxt[c] += g[c];
        if ((n + 1) % T != 0) {  // the next token in the row smears this one in
            float gate_next = lambda * sigmoidf(gate_logit[n + 1]);
            const float* gn = dout + (n + 1) * C;
            for (int c = 0; c < C; c++) dxt[c] += gate_next * gn[c];
        }
        if (n % T != 0) {
            float sg = sigmoidf(gate_logit[n]);
            float da = dgate[n] * lambda * sg * (1.0f - sg);
            for (int c = 0; c < SMEAR_CHANNELS; c++) dxt[c] += da * w[c];
        }
    }
    double dl = 0.0;
    std::vector<double> dwacc(SMEAR_CHANNELS, 0.0);
    for (size_t n = 0; n < N; n++) {
        if (n % T == 0) continue;
        float sg = sigmoidf(gate_logit[n]);
        dl += (double)dgate[n] * sg;
        float da = dgate[n] * lambda * sg * (1.0f - sg);
        const float* xt = x + n * C;
        for (int c = 0; c < SMEAR_CHANNELS; c++) dwacc[c] += (double)da * xt[c];
    }
    *dlambda += (float)dl;
    for (int c = 0; c < SMEAR_CHANNELS; c++) dw[c] += (float)dwacc[c];
}

// Value-embedding mix (ResFormer style), in place on v (N, Hkv, D; token n's row at v + n * v_stride):
//   gate[n, g] = 3 * sigmoid(h[n, 0:12] . wg[g, :]);  v[n, g, :] += gate[n, g] * table[idx[n]][g, :]
// h (N, C) is the normed block input, wg (Hkv, 12), table (V_pad, Hkv*D) the layer's value embeddings
// (looked up by the raw token id); gate (N, Hkv) is kept for the backward.
static inline void value_embed_forward_cpu(float* v, size_t v_stride, float* gate, const float* h, const float* wg, const float* table,
                                           const int* idx, size_t N, int C, int Hkv, int D) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++)
        for (int g = 0; g < Hkv; g++) {
            float a = 0.0f;
            for (int c = 0; c < VE_GATE_CHANNELS; c++) a += h[(size_t)n * C + c] * wg[g * VE_GATE_CHANNELS + c];
            float gt = 3.0f * sigmoidf(a);
            gate[(size_t)n * Hkv + g] = gt;
            float* vr = v + (size_t)n * v_stride + (size_t)g * D;
            const float* er = table + ((size_t)idx[n] * Hkv + g) * D;
            for (int d = 0; d < D; d++) vr[d] += gt * er[d];
        }
}

// Backward of the mix given dv (N, Hkv, D; token n's row at dv + n * dv_stride): dve (N, Hkv*D) = gate * dv
// (overwrites; the caller scatters it into the table with embedding_backward), dh[:, 0:12] +=, dwg (Hkv, 12)
// +=. d(3 sigmoid(a))/da = gate (1 - gate/3).
static inline void value_embed_backward_cpu(float* dve, float* dh, float* dwg, const float* dv, size_t dv_stride, const float* gate,
                                            const float* h, const float* wg, const float* table, const int* idx, size_t N, int C, int Hkv,
                                            int D) {
    std::vector<float> da(N * Hkv);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++)
        for (int g = 0; g < Hkv; g++) {
            const float* dvr = dv + (size_t)n * dv_stride + (size_t)g * D;
            float* dver = dve + ((size_t)n * Hkv + g) * D;
            const float* er = table + ((size_t)idx[n] * Hkv + g) * D;
            float gt = gate[(size_t)n * Hkv + g];
            float dgate = 0.0f;
            for (int d = 0; d < D; d++) {
                dgate += dvr[d] * er[d];
                dver[d] = gt * dvr[d];
            }
            float dan = dgate * gt * (1.0f - gt / 3.0f);
            da[(size_t)n * Hkv + g] = dan;
            for (int c = 0; c < VE_GATE_CHANNELS; c++) dh[(size_t)n * C + c] += dan * wg[g * VE_GATE_CHANNELS + c];
        }
    // dwg: a (Hkv x 12) sum over all tokens, in token order
    for (int g = 0; g < Hkv; g++) {
        double acc[VE_GATE_CHANNELS] = {0};
        for (size_t n = 0; n < N; n++)
            for (int c = 0; c < VE_GATE_CHANNELS; c++) acc[c] += (double)da[n * Hkv + g] * h[n * C + c];
        for (int c = 0; c < VE_GATE_CHANNELS; c++) dwg[g * VE_GATE_CHANNELS + c] += (float)acc[c];
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA backend. Tables are fp32 master weights; lookups are cast to bf16. No atomics anywhere: the
// scatter-add of the backward goes through buckets of positions sorted by token id (built on the host
// from the batch's ids), and the parameter gradients that sum over all tokens (smear w and lambda, the
// value-embedding gate weights) go through per-block partials and a fixed-order final pass.
#ifdef __CUDACC__
#include <climits>
#include "cuda_common.cuh"

__device__ __forceinline__ float sigmoid_device(float x) { return 1.0f / (1.0f + expf(-x)); }

// out (N, C) bf16 = table (rows, C) fp32 [idx[n]]; one thread per 8 channels (or per channel, scalar path)
template <bool VEC>
__global__ void __launch_bounds__(256) embedding_forward_kernel(floatX* out, const int* idx, const float* table, size_t N, int C) {
    const int per = VEC ? C / 8 : C;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * per) return;
    const size_t n = i / per;
    const int j = (int)(i % per);
    const float* src = table + (size_t)idx[n] * C;
    if (VEC) {
        float f[8];
        load8(f, src + 8 * j);
        store8(out + n * C + 8 * j, f);
    } else {
        out[n * C + j] = to_floatX(src[j]);
    }
}

// out (N, C) = table[idx[n]]; idx (N) int on the device, already validated against the table's rows
static inline void embedding_forward_cuda(floatX* out, const int* idx, const float* table, size_t N, int C, cudaStream_t stream) {
    if (N == 0 || C == 0) return;
    const bool vec = C % 8 == 0 && aligned16(out) && aligned16(table);
    const size_t total = N * (size_t)(vec ? C / 8 : C);
    if (vec) embedding_forward_kernel<true><<<ceil_div((long)total, 256), 256, 0, stream>>>(out, idx, table, N, C);
    else embedding_forward_kernel<false><<<ceil_div((long)total, 256), 256, 0, stream>>>(out, idx, table, N, C);
    cudaCheckLaunch();
}

// ---- embedding backward: buckets of positions per token id -------------------------------------------
//
// dtable[id] += sum of dout[n] over the positions n with idx[n] == id. The host sorts the positions by id
// (a stable counting sort, so each bucket lists its positions in increasing order) and cuts each bucket
// into chunks of at most EMB_CHUNK positions. Pass 1: one block per chunk (grid-stride), each thread owns
// 8 channels and sums the chunk's rows in position order. A bucket of one chunk (nearly every id) adds
// its sum straight into its table row; the chunks of a heavy bucket (frequent tokens: BOS, "the", ",")
// write fp32 partial rows into scratch, and pass 2 (one block per heavy bucket) sums them in chunk order
// into the table row. Why chunks: a frequent token holds a few percent of a batch's positions (thousands
// of rows), and one block streaming them alone is bound by a single SM's bandwidth (tens of GB/s), about
// ten times the floor of the whole scatter. Every sum has a fixed order given the ids: deterministic.
constexpr int EMB_CHUNK = 32;        // positions per chunk
constexpr int EMB_BWD_GRID = 1024;   // blocks of each pass (grid-stride over chunks / heavy buckets)

// Scratch of pass 1 in floats for N positions and C channels: the chunks of heavy buckets (> EMB_CHUNK
// positions) number at most 2N / (EMB_CHUNK + 1). Owned and grown by the EmbeddingBuckets.
static inline size_t embedding_backward_scratch_floats(size_t N, int C) { return (2 * N / (EMB_CHUNK + 1) + 1) * (size_t)C; }

// Device layout (ints), one upload per build:
//   [0] num_chunks  [1] num_heavy  [2] offset of the heavy records  [3] offset of the positions
//   chunks from 4:        num_chunks x {id, begin, end, slot}   (begin/end index the positions; slot -1:
//                                                              add into the table, else scratch row)
//   heavy records:        num_heavy x {id, slot_begin, slot_end}
//   positions:            N, grouped by id, in position order within an id
// Heavy buckets' chunks come first, so the long work starts early and the light chunks fill the tail.
struct EmbeddingBuckets {
    size_t N = 0;                 // positions of the last build
    size_t cap_N = 0;             // N the buffers below are sized for
    int num_ids = 0, num_chunks = 0, num_heavy = 0, num_slots = 0;  // of the last build (host copies)
    int* h_buf = nullptr;         // pinned staging of the device layout
    int* d_buf = nullptr;         // the device layout
    // partial rows of heavy buckets' chunks; sized by embedding_backward_cuda, which knows C (mutable:
    // the backward takes the buckets const, growing this cache is not a change of the buckets)
    mutable float* d_scratch = nullptr;
    mutable size_t scratch_floats = 0;
    cudaEvent_t uploaded = nullptr;  // recorded after each upload; waited on before h_buf is rewritten
    bool pending = false;
    cudaStream_t stream = 0;         // of the last build: buffers are freed stream-ordered on it
    std::vector<int> count, start;   // host work, per token id
};

static inline size_t embedding_buckets_layout_ints(size_t N) { return 4 + 4 * N + 3 * (N / (EMB_CHUNK + 1) + 1) + N; }

// Releases everything (at teardown): device buffers stream-ordered after the last work on the build's
// stream, the staging buffer once its upload is done.
static inline void embedding_buckets_free(EmbeddingBuckets* b) {
    if (b->pending) cudaCheck(cudaEventSynchronize(b->uploaded));
    if (b->uploaded) cudaCheck(cudaEventDestroy(b->uploaded));
    if (b->h_buf) cudaCheck(cudaFreeHost(b->h_buf));
    cuda_free_async(b->d_buf, b->stream);
    cuda_free_async(b->d_scratch, b->stream);
    *b = EmbeddingBuckets();
}

// Host work + async upload on `stream`. host_idx (N) are the batch's token ids (>= 0). Call it on the
// stream of the backward that uses it: the upload is stream-ordered after earlier kernels reading the
// previous buckets. Capacity grows with N (stream-ordered allocation, no device-wide sync); the staging
// buffer is reused once the previous upload has finished (a host wait on that copy alone).
static inline void embedding_buckets_build(EmbeddingBuckets* b, const int* host_idx, size_t N, cudaStream_t stream) {
    if (N > (size_t)INT_MAX / 8) fail("embedding_buckets_build: %zu positions are too many for int32 offsets", N);
    if (b->uploaded == nullptr) cudaCheck(cudaEventCreateWithFlags(&b->uploaded, cudaEventDisableTiming));
    if (b->pending) cudaCheck(cudaEventSynchronize(b->uploaded));
    b->pending = false;
    b->stream = stream;
    b->N = N;
    if (N == 0) {  // the backward does nothing
        b->num_ids = b->num_chunks = b->num_heavy = b->num_slots = 0;
        return;
    }
    if (N > b->cap_N) {
        const size_t ints = embedding_buckets_layout_ints(N);
        if (b->h_buf) cudaCheck(cudaFreeHost(b->h_buf));
        cudaCheck(cudaMallocHost(&b->h_buf, ints * sizeof(int)));
        cuda_free_async(b->d_buf, stream);
        cuda_malloc_async(&b->d_buf, ints * sizeof(int), stream);
        b->cap_N = N;
    }
    // counting sort of the ids
    int max_id = -1;
    for (size_t n = 0; n < N; n++) {
        if (host_idx[n] < 0) fail("embedding_buckets_build: token id %d at position %zu is negative", host_idx[n], n);
        max_id = std::max(max_id, host_idx[n]);
    }
    const int ids = max_id + 1;
    b->count.assign(ids, 0);
    b->start.resize(ids + 1);
    for (size_t n = 0; n < N; n++) b->count[host_idx[n]]++;
    int num_ids = 0, num_chunks = 0, num_heavy = 0;
    b->start[0] = 0;
    for (int id = 0; id < ids; id++) {
        const int c = b->count[id];
        b->start[id + 1] = b->start[id] + c;
        num_ids += c > 0;
        num_chunks += (c + EMB_CHUNK - 1) / EMB_CHUNK;
        num_heavy += c > EMB_CHUNK;
    }
    int* h = b->h_buf;
    const int off_heavy = 4 + 4 * num_chunks, off_pos = off_heavy + 3 * num_heavy;
    h[0] = num_chunks, h[1] = num_heavy, h[2] = off_heavy, h[3] = off_pos;
    // positions grouped by id, in position order (count becomes each id's write cursor)
    int* pos = h + off_pos;
    for (int id = 0; id < ids; id++) b->count[id] = b->start[id];
    for (size_t n = 0; n < N; n++) pos[b->count[host_idx[n]]++] = (int)n;
    // chunks: heavy buckets first (with their scratch slots), then the light ones
    int* chunk = h + 4;
    int* heavy = h + off_heavy;
    int slot = 0;
    for (int id = 0; id < ids; id++) {
        const int s0 = b->start[id], s1 = b->start[id + 1];
        if (s1 - s0 <= EMB_CHUNK) continue;
        *heavy++ = id, *heavy++ = slot;
        for (int p = s0; p < s1; p += EMB_CHUNK) {
            *chunk++ = id, *chunk++ = p, *chunk++ = std::min(p + EMB_CHUNK, s1), *chunk++ = slot++;
        }
        *heavy++ = slot;
    }
    for (int id = 0; id < ids; id++) {
        const int s0 = b->start[id], s1 = b->start[id + 1];
        if (s1 == s0 || s1 - s0 > EMB_CHUNK) continue;
        *chunk++ = id, *chunk++ = s0, *chunk++ = s1, *chunk++ = -1;
    }
    b->num_ids = num_ids, b->num_chunks = num_chunks, b->num_heavy = num_heavy, b->num_slots = slot;
    cudaCheck(cudaMemcpyAsync(b->d_buf, h, ((size_t)off_pos + N) * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(b->uploaded, stream));
    b->pending = true;
}

__device__ __forceinline__ void add8(float (&acc)[8], int4 raw) {
    float f[8];
    unpack8(f, raw);
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] += f[k];
}

// Pass 1: for each chunk {id, begin, end, slot}: row = sum over positions[begin, end) of dout (N, C) rows,
// in order; slot < 0: dtable[id] += row, else scratch[slot] = row. Block: threads over channels.
template <bool VEC>
__global__ void __launch_bounds__(1024) embedding_backward_chunks_kernel(float* dtable, float* scratch, const floatX* dout,
                                                                         const int* buf, int C) {
    const int num_chunks = buf[0];
    const int* pos = buf + buf[3];
    const int per = VEC ? C / 8 : C;
    for (int ch = blockIdx.x; ch < num_chunks; ch += gridDim.x) {
        const int4 rec = *reinterpret_cast<const int4*>(buf + 4 + 4 * (size_t)ch);  // {id, begin, end, slot}
        float* dst = rec.w < 0 ? dtable + (size_t)rec.x * C : scratch + (size_t)rec.w * C;
        for (int j = threadIdx.x; j < per; j += blockDim.x) {
            if (VEC) {
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                int p = rec.y;
                for (; p + 4 <= rec.z; p += 4) {  // four rows in flight, added in position order
                    const int4 r0 = ld16(dout + (size_t)pos[p] * C + 8 * j), r1 = ld16(dout + (size_t)pos[p + 1] * C + 8 * j);
                    const int4 r2 = ld16(dout + (size_t)pos[p + 2] * C + 8 * j), r3 = ld16(dout + (size_t)pos[p + 3] * C + 8 * j);
                    add8(acc, r0);
                    add8(acc, r1);
                    add8(acc, r2);
                    add8(acc, r3);
                }
                for (; p < rec.z; p++) add8(acc, ld16(dout + (size_t)pos[p] * C + 8 * j));
                if (rec.w < 0) {
                    float t[8];
                    load8(t, dst + 8 * j);
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[k] += t[k];
                }
                store8(dst + 8 * j, acc);
            } else {
                float acc = 0.0f;
                for (int p = rec.y; p < rec.z; p++) acc += to_float(dout[(size_t)pos[p] * C + j]);
                dst[j] = rec.w < 0 ? dst[j] + acc : acc;
            }
        }
    }
}

// Pass 2: for each heavy bucket {id, slot_begin, slot_end}: dtable[id] += sum of its scratch rows in order.
template <bool VEC>
__global__ void __launch_bounds__(1024) embedding_backward_heavy_kernel(float* dtable, const float* scratch, const int* buf, int C) {
    const int num_heavy = buf[1];
    const int* heavy = buf + buf[2];
    const int per = VEC ? C / 8 : C;
    for (int hb = blockIdx.x; hb < num_heavy; hb += gridDim.x) {
        const int id = heavy[3 * hb], s0 = heavy[3 * hb + 1], s1 = heavy[3 * hb + 2];
        float* dst = dtable + (size_t)id * C;
        for (int j = threadIdx.x; j < per; j += blockDim.x) {
            if (VEC) {
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t[8];
                for (int s = s0; s < s1; s++) {
                    load8(t, scratch + (size_t)s * C + 8 * j);
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[k] += t[k];
                }
                load8(t, dst + 8 * j);
#pragma unroll
                for (int k = 0; k < 8; k++) t[k] += acc[k];
                store8(dst + 8 * j, t);
            } else {
                float acc = 0.0f;
                for (int s = s0; s < s1; s++) acc += scratch[(size_t)s * C + j];
                dst[j] += acc;
            }
        }
    }
}

// Sizes the scratch of embedding_backward_cuda for tables up to C channels at the buckets' capacity
// (stream-ordered allocation). Called with the widest table right after each build, so that no backward
// allocates: an allocation would change the address a captured CUDA graph holds.
static inline void embedding_backward_reserve(const EmbeddingBuckets* b, int C, cudaStream_t stream) {
    const size_t need = embedding_backward_scratch_floats(b->cap_N, C);
    if (need <= b->scratch_floats) return;
    cuda_free_async(b->d_scratch, stream);
    cuda_malloc_async(&b->d_scratch, need * sizeof(float), stream);
    b->scratch_floats = need;
}

// dtable (rows, C) fp32 += scatter of dout (N, C) by the ids of the last build (b->N == N). Grids depend on
// N only and the kernels read the counts from the uploaded layout, so the launch can be graph-captured
// once the scratch exists (embedding_backward_reserve; a table wider than reserved grows it here).
static inline void embedding_backward_cuda(float* dtable, const floatX* dout, const EmbeddingBuckets* b, int C, cudaStream_t stream) {
    if (b->N == 0 || C == 0) return;
    embedding_backward_reserve(b, C, stream);
    const bool vec = C % 8 == 0 && aligned16(dtable) && aligned16(dout);
    const int per = vec ? C / 8 : C;
    const int block = std::min(1024, (per + 31) / 32 * 32);
    const int grid1 = (int)std::min<size_t>(EMB_BWD_GRID, b->N);
    const int grid2 = (int)std::min<size_t>(EMB_BWD_GRID, b->N / (EMB_CHUNK + 1) + 1);
    if (vec) {
        embedding_backward_chunks_kernel<true><<<grid1, block, 0, stream>>>(dtable, b->d_scratch, dout, b->d_buf, C);
        cudaCheckLaunch();
        embedding_backward_heavy_kernel<true><<<grid2, block, 0, stream>>>(dtable, b->d_scratch, b->d_buf, C);
    } else {
        embedding_backward_chunks_kernel<false><<<grid1, block, 0, stream>>>(dtable, b->d_scratch, dout, b->d_buf, C);
        cudaCheckLaunch();
        embedding_backward_heavy_kernel<false><<<grid2, block, 0, stream>>>(dtable, b->d_scratch, b->d_buf, C);
    }
    cudaCheckLaunch();
}

// ---- final pass shared by the smear and value-embedding backward ---------------------------------------
// partials (P, J) row-major, one row per first-pass block. Block j (of J) sums column j over the P rows
// in a fixed tree (strided per thread, then block_sum) and adds it into out_a[j] (j < na) or
// out_b[j - na]. 256 threads.
__global__ void __launch_bounds__(256) partials_finish_kernel(float* out_a, int na, float* out_b, const float* partials, int P, int J) {
    __shared__ float shared[32];
    const int j = blockIdx.x;
    float v = 0.0f;
    for (int p = threadIdx.x; p < P; p += blockDim.x) v += partials[(size_t)p * J + j];
    v = block_sum(v, shared);
    if (threadIdx.x == 0) {
        if (j < na) out_a[j] += v;
        else out_b[j - na] += v;
    }
}

// ---- smear ---------------------------------------------------------------------------------------------
constexpr int SMEAR_WARPS = 8;        // rows (tokens) in flight per block, one warp each
constexpr int SMEAR_PARTIALS = 512;   // most blocks of the backward = rows of its partials
constexpr int SMEAR_PARAMS = SMEAR_CHANNELS + 1;  // dw (24) and dlambda, summed over all tokens
// scratch of smear_backward_cuda, in floats (a constant: the grid is capped at SMEAR_PARTIALS blocks)
constexpr size_t SMEAR_SCRATCH_FLOATS = (size_t)SMEAR_PARTIALS * SMEAR_PARAMS;

// out (B*T, C): out_t = x_t + lambda sigmoid(w . x_t[0:24]) x_{t-1} for t >= 1, out_0 = x_0; gate_logit (B*T)
// fp32 (0 at t = 0). One warp per token. out must not alias x: row t reads x row t-1, which the warp of
// token t-1 would already have overwritten.
template <bool VEC>
__global__ void __launch_bounds__(SMEAR_WARPS * 32) smear_forward_kernel(floatX* out, float* gate_logit, const floatX* x,
                                                                         const float* w, const float* lambda, size_t N, int T, int C) {
    const size_t n = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (n >= N) return;  // warp-uniform
    const int lane = threadIdx.x % 32;
    const floatX* xt = x + n * C;
    const floatX* xp = xt - C;  // used only for t >= 1
    floatX* ot = out + n * C;
    const bool first = n % T == 0;
    float a = 0.0f, g = 0.0f;
    if (!first) {
        a = warp_sum(lane < SMEAR_CHANNELS ? w[lane] * to_float(xt[lane]) : 0.0f);
        g = lambda[0] * sigmoid_device(a);
    }
    if (VEC) {
        for (int j = lane; j < C / 8; j += 32) {
            float f[8], p[8];
            load8(f, xt + 8 * j);
            if (!first) {
                load8(p, xp + 8 * j);
#pragma unroll
                for (int k = 0; k < 8; k++) f[k] += g * p[k];
            }
            store8(ot + 8 * j, f);
        }
    } else {
        for (int c = lane; c < C; c += 32) ot[c] = first ? xt[c] : to_floatX(to_float(xt[c]) + g * to_float(xp[c]));
    }
    if (lane == 0) gate_logit[n] = a;
}

// dx (B*T, C) += dout_t + gate_{t+1} dout_{t+1} + [t >= 1] da_t w (first 24 channels), with
// dgate_t = dout_t . x_{t-1}, sg = sigmoid(gate_logit_t), da_t = dgate_t lambda sg (1 - sg). Per token the
// warp also accumulates da_t x_t[c] (lane c < 24) and dgate_t sg (lane 24); the block's 8 warps are added
// in warp order into partials[blockIdx.x] (25 floats). Rows are dealt to warps by a fixed grid stride.
template <bool VEC>
__global__ void __launch_bounds__(SMEAR_WARPS * 32) smear_backward_kernel(floatX* dx, float* partials, const floatX* dout,
                                                                          const floatX* x, const float* gate_logit, const float* w,
                                                                          const float* lambda, size_t N, int T, int C) {
    __shared__ float part[SMEAR_WARPS][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float lam = lambda[0];
    float pacc = 0.0f;  // lane c < 24: dw[c]; lane 24: dlambda
    for (size_t n = (size_t)blockIdx.x * SMEAR_WARPS + warp; n < N; n += (size_t)gridDim.x * SMEAR_WARPS) {
        const int t = (int)(n % T);
        const floatX* g = dout + n * C;
        const floatX* xt = x + n * C;
        const floatX* gn = g + C;  // dout_{t+1}, used only when t + 1 < T
        floatX* d = dx + n * C;
        float dgate = 0.0f;
        if (t > 0) {
            const floatX* xp = xt - C;
            float acc = 0.0f;
            if (VEC) {
                for (int j = lane; j < C / 8; j += 32) {
                    float gv[8], pv[8];
                    load8(gv, g + 8 * j);
                    load8(pv, xp + 8 * j);
#pragma unroll
                    for (int k = 0; k < 8; k++) acc += gv[k] * pv[k];
                }
            } else {
                for (int c = lane; c < C; c += 32) acc += to_float(g[c]) * to_float(xp[c]);
            }
            dgate = warp_sum(acc);
        }
        const float sg = t > 0 ? sigmoid_device(gate_logit[n]) : 0.0f;
        const float da = dgate * lam * sg * (1.0f - sg);
        const bool has_next = t + 1 < T;
        const float gate_next = has_next ? lam * sigmoid_device(gate_logit[n + 1]) : 0.0f;
        if (VEC) {
            for (int j = lane; j < C / 8; j += 32) {
                float dv[8], gv[8], nv[8];
                load8(dv, d + 8 * j);
                load8(gv, g + 8 * j);
#pragma unroll
                for (int k = 0; k < 8; k++) dv[k] += gv[k];
                if (has_next) {
                    load8(nv, gn + 8 * j);
#pragma unroll
                    for (int k = 0; k < 8; k++) dv[k] += gate_next * nv[k];
                }
                if (t > 0 && 8 * j < SMEAR_CHANNELS) {
#pragma unroll
                    for (int k = 0; k < 8; k++)
                        if (8 * j + k < SMEAR_CHANNELS) dv[k] += da * w[8 * j + k];
                }
                store8(d + 8 * j, dv);
            }
        } else {
            for (int c = lane; c < C; c += 32) {
                float v = to_float(d[c]) + to_float(g[c]);
                if (has_next) v += gate_next * to_float(gn[c]);
                if (t > 0 && c < SMEAR_CHANNELS) v += da * w[c];
                d[c] = to_floatX(v);
            }
        }
        if (t > 0) {
            if (lane < SMEAR_CHANNELS) pacc += da * to_float(xt[lane]);
            else if (lane == SMEAR_CHANNELS) pacc += dgate * sg;
        }
    }
    part[warp][lane] = pacc;
    __syncthreads();
    if (threadIdx.x < SMEAR_PARAMS) {
        float s = 0.0f;
        for (int k = 0; k < SMEAR_WARPS; k++) s += part[k][threadIdx.x];
        partials[(size_t)blockIdx.x * SMEAR_PARAMS + threadIdx.x] = s;
    }
}

static inline bool smear_vec_ok(int C, const void* a, const void* b) { return C % 8 == 0 && aligned16(a) && aligned16(b); }

// out (B, T, C), gate_logit (B, T) = smear(x (B, T, C)); w (24), lambda (1) fp32 on the device
static inline void smear_forward_cuda(floatX* out, float* gate_logit, const floatX* x, const float* w, const float* lambda,
                                      int B, int T, int C, cudaStream_t stream) {
    const size_t N = (size_t)B * T;
    if (N == 0) return;
    const int grid = ceil_div((long)N, SMEAR_WARPS);
    if (smear_vec_ok(C, out, x)) smear_forward_kernel<true><<<grid, SMEAR_WARPS * 32, 0, stream>>>(out, gate_logit, x, w, lambda, N, T, C);
    else smear_forward_kernel<false><<<grid, SMEAR_WARPS * 32, 0, stream>>>(out, gate_logit, x, w, lambda, N, T, C);
    cudaCheckLaunch();
}

// dx (B, T, C) +=, dw (24) +=, dlambda (1) += through the smear; scratch: SMEAR_SCRATCH_FLOATS floats
static inline void smear_backward_cuda(floatX* dx, float* dw, float* dlambda, const floatX* dout, const floatX* x,
                                       const float* gate_logit, const float* w, const float* lambda, int B, int T, int C,
                                       float* scratch, cudaStream_t stream) {
    const size_t N = (size_t)B * T;
    if (N == 0) return;
    const int grid = (int)std::min<size_t>(SMEAR_PARTIALS, (N + SMEAR_WARPS - 1) / SMEAR_WARPS);
    if (smear_vec_ok(C, dx, dout) && aligned16(x))
        smear_backward_kernel<true><<<grid, SMEAR_WARPS * 32, 0, stream>>>(dx, scratch, dout, x, gate_logit, w, lambda, N, T, C);
    else smear_backward_kernel<false><<<grid, SMEAR_WARPS * 32, 0, stream>>>(dx, scratch, dout, x, gate_logit, w, lambda, N, T, C);
    cudaCheckLaunch();
    partials_finish_kernel<<<SMEAR_PARAMS, 256, 0, stream>>>(dw, SMEAR_CHANNELS, dlambda, scratch, grid, SMEAR_PARAMS);
    cudaCheckLaunch();
}

// ---- value embeddings ----------------------------------------------------------------------------------
// A (token n, kv head g) pair owns the D-row v[n, g, :]; a group of G lanes works on it (G = 8 / 16 for
// D = 64 / 128: one 16-byte vector per lane), so a warp covers 4 / 2 pairs.
constexpr int VE_TILE = 16;        // tokens per tile of the backward
constexpr int VE_THREADS = 256;
constexpr int VE_PARTIALS = 512;   // most blocks of the backward = rows of its partials
// scratch of value_embed_backward_cuda, in floats: one row of Hkv*12 dwg partials per block
static inline size_t value_embed_scratch_floats(int Hkv) { return (size_t)VE_PARTIALS * Hkv * VE_GATE_CHANNELS; }

static inline int ve_group(int per) { return per <= 8 ? 8 : per <= 16 ? 16 : 32; }

// v (N, Hkv, D; rows v_stride apart) += gate * table[idx[n]] (row segment g); gate (N, Hkv) = 3 sigmoid(h[n,
// 0:12] . wg[g, :])
template <int G, bool VEC>
__global__ void __launch_bounds__(256) value_embed_forward_kernel(floatX* v, size_t v_stride, float* gate, const floatX* h, const float* wg,
                                                                  const float* table, const int* idx, size_t N, int C, int Hkv, int D) {
    const size_t p = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
    if (p >= N * Hkv) return;
    const int lane = threadIdx.x % G;
    const size_t n = p / Hkv;
    const int g = (int)(p % Hkv);
    float a = 0.0f;  // every lane of the group computes the 12-term dot (same order as the CPU twin)
    for (int c = 0; c < VE_GATE_CHANNELS; c++) a += to_float(h[n * C + c]) * wg[g * VE_GATE_CHANNELS + c];
    const float gt = 3.0f * sigmoid_device(a);
    if (lane == 0) gate[p] = gt;
    const float* e = table + (size_t)idx[n] * Hkv * D + (size_t)g * D;
    floatX* vr = v + n * v_stride + (size_t)g * D;
    if (VEC) {
        for (int j = lane; j < D / 8; j += G) {
            float vv[8], ev[8];
            load8(vv, vr + 8 * j);
            load8(ev, e + 8 * j);
#pragma unroll
            for (int k = 0; k < 8; k++) vv[k] += gt * ev[k];
            store8(vr + 8 * j, vv);
        }
    } else {
        for (int d = lane; d < D; d += G) vr[d] = to_floatX(to_float(vr[d]) + gt * e[d]);
    }
}

// Backward over tiles of VE_TILE tokens (grid-stride, fixed grid). Per pair (n, g): dgate = dv . ve (group
// sum), dve = gate dv, da = dgate gate (1 - gate / 3) into shared memory; then per token dh[n, 0:12] +=
// sum_g da[n, g] wg[g, :] (g in order), and per block the dwg (Hkv, 12) partial += sum over the tile's tokens
// of da[n, g] h[n, :] (tokens in order; thread j owns entry j). Shared: VE_TILE*Hkv + Hkv*12 floats. dv rows
// dv_stride apart.
template <int G, bool VEC>
__global__ void __launch_bounds__(VE_THREADS) value_embed_backward_kernel(floatX* dve, floatX* dh, float* partials, const floatX* dv,
                                                                          size_t dv_stride, const float* gate, const floatX* h, const float* wg,
                                                                          const float* table, const int* idx, size_t N, int C,
                                                                          int Hkv, int D) {
    extern __shared__ float smem[];
    float* da_s = smem;                     // (VE_TILE, Hkv)
    float* acc_s = smem + VE_TILE * Hkv;    // (Hkv, 12)
    const int HK = Hkv * VE_GATE_CHANNELS;
    for (int j = threadIdx.x; j < HK; j += blockDim.x) acc_s[j] = 0.0f;
    const int groups = blockDim.x / G, grp = threadIdx.x / G, lane = threadIdx.x % G;
    const size_t ntiles = (N + VE_TILE - 1) / VE_TILE;
    for (size_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const size_t n0 = tile * VE_TILE;
        const int nt = N - n0 < (size_t)VE_TILE ? (int)(N - n0) : VE_TILE, np = nt * Hkv;
        for (int q = grp; q < np; q += groups) {  // uniform within a group, as group_sum needs
            const size_t p = n0 * Hkv + q, n = p / Hkv;
            const int g = (int)(p % Hkv);
            const float gt = gate[p];
            const float* e = table + (size_t)idx[n] * Hkv * D + (size_t)g * D;
            const floatX* dvr = dv + n * dv_stride + (size_t)g * D;
            floatX* dver = dve + p * D;
            float dg = 0.0f;
            if (VEC) {
                for (int j = lane; j < D / 8; j += G) {
                    float gv[8], ev[8];
                    load8(gv, dvr + 8 * j);
                    load8(ev, e + 8 * j);
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        dg += gv[k] * ev[k];
                        gv[k] *= gt;
                    }
                    store8(dver + 8 * j, gv);
                }
            } else {
                for (int d = lane; d < D; d += G) {
                    const float gv = to_float(dvr[d]);
                    dg += gv * e[d];
                    dver[d] = to_floatX(gt * gv);
                }
            }
            dg = group_sum<G>(dg);
            if (lane == 0) da_s[q] = dg * gt * (1.0f - gt / 3.0f);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nt * VE_GATE_CHANNELS; i += blockDim.x) {
            const int nl = i / VE_GATE_CHANNELS, c = i % VE_GATE_CHANNELS;
            float s = 0.0f;
            for (int g = 0; g < Hkv; g++) s += da_s[nl * Hkv + g] * wg[g * VE_GATE_CHANNELS + c];
            floatX* dst = dh + (n0 + nl) * C + c;
            *dst = to_floatX(to_float(*dst) + s);
        }
        for (int j = threadIdx.x; j < HK; j += blockDim.x) {
            const int g = j / VE_GATE_CHANNELS, c = j % VE_GATE_CHANNELS;
            float s = acc_s[j];
            for (int nl = 0; nl < nt; nl++) s += da_s[nl * Hkv + g] * to_float(h[(n0 + nl) * C + c]);
            acc_s[j] = s;
        }
        __syncthreads();  // da_s is rewritten by the next tile
    }
    for (int j = threadIdx.x; j < HK; j += blockDim.x) partials[(size_t)blockIdx.x * HK + j] = acc_s[j];
}

template <int G, bool VEC>
static inline void value_embed_forward_launch(floatX* v, size_t v_stride, float* gate, const floatX* h, const float* wg, const float* table,
                                              const int* idx, size_t N, int C, int Hkv, int D, cudaStream_t stream) {
    value_embed_forward_kernel<G, VEC><<<ceil_div((long)(N * Hkv) * G, 256), 256, 0, stream>>>(v, v_stride, gate, h, wg, table, idx, N, C, Hkv,
                                                                                                D);
}

template <int G, bool VEC>
static inline void value_embed_backward_launch(int grid, floatX* dve, floatX* dh, float* partials, const floatX* dv, size_t dv_stride,
                                               const float* gate, const floatX* h, const float* wg, const float* table, const int* idx,
                                               size_t N, int C, int Hkv, int D, cudaStream_t stream) {
    const size_t smem = (size_t)(VE_TILE * Hkv + Hkv * VE_GATE_CHANNELS) * sizeof(float);
    value_embed_backward_kernel<G, VEC><<<grid, VE_THREADS, smem, stream>>>(dve, dh, partials, dv, dv_stride, gate, h, wg, table, idx, N, C,
                                                                            Hkv, D);
}

// 16-byte vectors: D and the row stride multiples of 8 elements, both buffers 16-byte aligned
static inline bool ve_vec_ok(int D, size_t stride, const void* a, const void* b) {
    return D % 8 == 0 && stride % 8 == 0 && aligned16(a) && aligned16(b);
}

// v (N, Hkv, D; rows v_stride apart) += 3 sigmoid(h[:, :12] . wg[g]) table[idx[n]]; gate (N, Hkv) fp32 kept
// for the backward. h (N, C) bf16, wg (Hkv, 12) and table (rows, Hkv*D) fp32, idx (N) on the device.
static inline void value_embed_forward_cuda(floatX* v, size_t v_stride, float* gate, const floatX* h, const float* wg, const float* table,
                                            const int* idx, size_t N, int C, int Hkv, int D, cudaStream_t stream) {
    if (N == 0 || Hkv == 0) return;
    if (ve_vec_ok(D, v_stride, v, table)) {
        const int G = ve_group(D / 8);
        if (G == 8) value_embed_forward_launch<8, true>(v, v_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
        else if (G == 16) value_embed_forward_launch<16, true>(v, v_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
        else value_embed_forward_launch<32, true>(v, v_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
    } else {
        value_embed_forward_launch<32, false>(v, v_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
    }
    cudaCheckLaunch();
}

// dve (N, Hkv*D) = gate dv (overwrites; dv rows dv_stride apart), dh (N, C)[:, :12] +=, dwg (Hkv, 12) +=;
// scratch: value_embed_scratch_floats(Hkv) floats. Then embedding_backward_cuda(table grad, dve, buckets, Hkv*D).
static inline void value_embed_backward_cuda(floatX* dve, floatX* dh, float* dwg, const floatX* dv, size_t dv_stride, const float* gate,
                                             const floatX* h, const float* wg, const float* table, const int* idx, size_t N,
                                             int C, int Hkv, int D, float* scratch, cudaStream_t stream) {
    if (N == 0 || Hkv == 0) return;
    const int grid = (int)std::min<size_t>(VE_PARTIALS, (N + VE_TILE - 1) / VE_TILE);
    if (ve_vec_ok(D, dv_stride, dve, dv) && aligned16(table)) {
        const int G = ve_group(D / 8);
        if (G == 8) value_embed_backward_launch<8, true>(grid, dve, dh, scratch, dv, dv_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
        else if (G == 16)
            value_embed_backward_launch<16, true>(grid, dve, dh, scratch, dv, dv_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
        else value_embed_backward_launch<32, true>(grid, dve, dh, scratch, dv, dv_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
    } else {
        value_embed_backward_launch<32, false>(grid, dve, dh, scratch, dv, dv_stride, gate, h, wg, table, idx, N, C, Hkv, D, stream);
    }
    cudaCheckLaunch();
    const int HK = Hkv * VE_GATE_CHANNELS;
    partials_finish_kernel<<<HK, 256, 0, stream>>>(dwg, HK, nullptr, scratch, grid, HK);
    cudaCheckLaunch();
}

#endif  // __CUDACC__
