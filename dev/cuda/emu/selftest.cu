// The emulator's own tests. Each negative case is a bug class the emulator must report (an EMULATOR
// line, AddressSanitizer or UBSan; the process dies); the positive cases must pass. run.sh builds this
// with ASan+UBSan and runs every case: selftest CASE.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <string>

__global__ void k_copy(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = in[i];  // one past n: out of bounds when n is the buffer's size
}
__global__ void k_vec(float* out, const float* in) { *reinterpret_cast<float4*>(out) = *reinterpret_cast<const float4*>(in); }
__global__ void k_sync_early(float* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}
__global__ void k_shfl_missing(float* out) {
    if (threadIdx.x % 32 >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void k_shared_uninit(float* out) {
    __shared__ float s[64];
    if (threadIdx.x < 32) s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];  // half never written: NaN
}
__global__ void __launch_bounds__(128) k_bounded(float* out) { out[threadIdx.x] = 0.0f; }
__global__ void k_add(float* out, const float* in) { out[threadIdx.x] += in[threadIdx.x]; }
__global__ void k_to_bf16(__nv_bfloat16* out, const float* in) { out[threadIdx.x] = __float2bfloat16(in[threadIdx.x]); }

// D (4x4 fp32) = A (4x4 bf16) B (4x4 bf16), column-major, no transposes, issued on stream s
struct Gemm4 {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t ab, cd;
    cublasLtMatmulHeuristicResult_t algo;
    Gemm4() {
        cublasLtCreate(&h);
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatrixLayoutCreate(&ab, CUDA_R_16BF, 4, 4, 4);
        cublasLtMatrixLayoutCreate(&cd, CUDA_R_32F, 4, 4, 4);
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        int n = 0;
        cublasLtMatmulAlgoGetHeuristic(h, desc, ab, ab, cd, cd, pref, 1, &algo, &n);
        if (n != 1) emu_die("selftest: no cuBLASLt algorithm");
    }
    void run(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, cudaStream_t s) {
        const float one = 1.0f, zero = 0.0f;
        cublasLtMatmul(h, desc, &one, a, ab, b, ab, &zero, d, cd, d, cd, &algo.algo, nullptr, 0, s);
    }
};

// Capture a memset, an async copy from pinned memory, two kernels and a matmul; replay with new pinned
// contents and with the captured buffers overwritten in between: every replay must redo all of them.
static void graph_replays() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *pinned, *a, *b, *d;
    __nv_bfloat16 *eye, *bb;
    cudaMallocHost(&pinned, 16 * sizeof(float));
    cudaMalloc(&a, 16 * sizeof(float));
    cudaMalloc(&b, 16 * sizeof(float));
    cudaMalloc(&d, 16 * sizeof(float));
    cudaMalloc(&eye, 16 * sizeof(__nv_bfloat16));
    cudaMalloc(&bb, 16 * sizeof(__nv_bfloat16));
    __nv_bfloat16 eye_host[16];
    for (int i = 0; i < 16; i++) eye_host[i] = __float2bfloat16(i % 5 == 0 ? 1.0f : 0.0f);
    cudaMemcpy(eye, eye_host, sizeof eye_host, cudaMemcpyHostToDevice);
    Gemm4 gemm;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaMemsetAsync(b, 0, 16 * sizeof(float), s);
    cudaMemcpyAsync(a, pinned, 16 * sizeof(float), cudaMemcpyHostToDevice, s);
    k_add<<<1, 16, 0, s>>>(b, a);
    k_to_bf16<<<1, 16, 0, s>>>(bb, b);
    gemm.run(d, eye, bb, s);
    cudaStreamEndCapture(s, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 16; i++) pinned[i] = (float)(i + 16 * r);  // exact in bf16
        cudaMemset(b, 0x7f, 16 * sizeof(float));
        cudaMemset(d, 0x7f, 16 * sizeof(float));
        cudaGraphLaunch(exec, s);
        cudaStreamSynchronize(s);
        float hb[16], hd[16];
        cudaMemcpy(hb, b, sizeof hb, cudaMemcpyDeviceToHost);
        cudaMemcpy(hd, d, sizeof hd, cudaMemcpyDeviceToHost);
        for (int i = 0; i < 16; i++)
            if (hb[i] != pinned[i] || hd[i] != pinned[i]) emu_dief("selftest: replay %d, element %d: %g and %g, want %g", r, i, hb[i], hd[i], pinned[i]);
    }
    cudaGraphExecDestroy(exec);
}

int main(int argc, char** argv) {
    std::string c = argc > 1 ? argv[1] : "";
    float *a, *b;
    cudaMalloc(&a, 64 * sizeof(float));
    cudaMalloc(&b, 64 * sizeof(float));
    cudaMemset(a, 0, 64 * sizeof(float));
    cudaMemset(b, 0, 64 * sizeof(float));
    float host[64] = {0};
    if (c == "oob") k_copy<<<1, 128>>>(a, b, 64);
    else if (c == "misaligned") k_vec<<<1, 32>>>(a + 1, b);
    else if (c == "host_ptr_arg") k_copy<<<1, 32>>>(a, host, 16);
    else if (c == "host_deref") printf("%f\n", a[3]);
    else if (c == "block_1025") k_copy<<<1, 1025>>>(a, b, 0);
    else if (c == "grid_y") k_copy<<<dim3(1, 65536), 32>>>(a, b, 0);
    else if (c == "grid_0") k_copy<<<0, 32>>>(a, b, 0);
    else if (c == "smem_48k") k_copy<<<1, 32, 64 * 1024>>>(a, b, 0);
    else if (c == "sync_early") k_sync_early<<<1, 64>>>(a);
    else if (c == "shfl_missing") k_shfl_missing<<<1, 32>>>(a);
    else if (c == "launch_bounds") k_bounded<<<1, 256>>>(a);
    else if (c == "shared_uninit") {
        k_shared_uninit<<<1, 64>>>(a);
        cudaMemcpy(host, a, sizeof host, cudaMemcpyDeviceToHost);
        if (std::isnan(host[40])) emu_die("uninitialised shared memory read as NaN (the expected report)");
    } else if (c == "read_before_sync") {
        float* pinned;
        cudaMallocHost(&pinned, 64 * sizeof(float));
        cudaStream_t s;
        cudaStreamCreate(&s);
        k_copy<<<1, 32, 0, s>>>(b, b, 15);
        cudaMemsetAsync(a, 0x3f, 64 * sizeof(float), s);
        cudaMemcpyAsync(pinned, a, 64 * sizeof(float), cudaMemcpyDeviceToHost, s);
        if (pinned[0] != 0.74901962f) emu_die("pinned result read before cudaStreamSynchronize is stale (the expected report)");
    } else if (c == "capture_sync" || c == "capture_malloc" || c == "capture_malloc_async") {
        cudaStream_t s;
        cudaStreamCreate(&s);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        float* p;
        if (c == "capture_sync") cudaDeviceSynchronize();
        else if (c == "capture_malloc") cudaMalloc(&p, 16);
        else cudaMallocAsync(&p, 16, s);
    } else if (c == "graph_stale") {  // a graph replayed after a buffer it bakes in was freed
        cudaStream_t s;
        cudaStreamCreate(&s);
        cudaGraph_t g;
        cudaGraphExec_t e;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        k_copy<<<1, 32, 0, s>>>(a, b, 15);
        cudaStreamEndCapture(s, &g);
        cudaGraphInstantiate(&e, g, 0);
        cudaFree(b);
        cudaGraphLaunch(e, s);
        cudaStreamSynchronize(s);
    } else if (c == "memcpy_kind") cudaMemcpy(a, host, 16, cudaMemcpyDeviceToHost);
    else if (c == "lt_attr_size") {
        cublasLtMatmulDesc_t d;
        cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        int64_t op = CUBLAS_OP_T;  // the attribute is an int32
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op);
    } else if (c == "lt_shape") {
        cublasLtHandle_t h;
        cublasLtCreate(&h);
        cublasLtMatmulDesc_t d;
        cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatrixLayout_t la, lb, lc;
        cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 4, 8, 4);  // A 4x8
        cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, 4, 2, 4);  // B 4x2: inner dimensions 8 and 4
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, 4, 2, 4);
        cublasLtMatmulPreference_t p;
        cublasLtMatmulPreferenceCreate(&p);
        cublasLtMatmulHeuristicResult_t r;
        int n;
        cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, p, 1, &r, &n);
    } else if (c == "ok") {
        k_copy<<<1, 64>>>(a, b, 63);
        cudaDeviceSynchronize();
        return 0;
    } else if (c == "graph") {
        graph_replays();
        return 0;
    } else {
        printf("unknown case %s\n", c.c_str());
        return 2;
    }
    cudaDeviceSynchronize();
    printf("NOT DETECTED: %s\n", c.c_str());
    return 0;
}
