// CPU emulation of the part of cuBLASLt that matmul.cuh uses, following NVIDIA's documented semantics
// (cublasLt.h comments, cuBLAS docs), never what the caller seems to intend:
//   D = alpha op(A) op(B) + beta C, column-major (CUBLASLT_ORDER_COL, the default), op(A) m x k, op(B) k x n,
//   C and D m x n; a layout's rows/cols/ld describe the STORED matrix (before op); batch: BATCH_COUNT (int32)
//   matrices STRIDED_BATCH_OFFSET (int64, elements) apart; beta == 0: C is not read; the fp32 accumulator is
//   scaled, added to beta C and rounded once to D's type.
// Anything not implemented (another attribute, type, order, pointer mode) is rejected with emu_die, so it
// cannot pass silently. Attribute buffers must have exactly the documented size.
#pragma once
#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_ARCH_MISMATCH = 8, CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13, CUBLAS_STATUS_INTERNAL_ERROR = 14, CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0, CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1, CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
               CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 } cublasLtMatmulDescAttributes_t;
typedef enum { CUBLASLT_MATRIX_LAYOUT_TYPE = 0, CUBLASLT_MATRIX_LAYOUT_ORDER = 1, CUBLASLT_MATRIX_LAYOUT_ROWS = 2,
               CUBLASLT_MATRIX_LAYOUT_COLS = 3, CUBLASLT_MATRIX_LAYOUT_LD = 4, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
               CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6 } cublasLtMatrixLayoutAttribute_t;
typedef enum { CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
               CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8 } cublasLtMatmulPreferenceAttributes_t;
typedef enum { CUBLASLT_REDUCTION_SCHEME_NONE = 0, CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
               CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
               CUBLASLT_REDUCTION_SCHEME_MASK = 0x7 } cublasLtReductionScheme_t;
typedef enum { CUBLASLT_ALGO_CONFIG_ID = 0, CUBLASLT_ALGO_CONFIG_TILE_ID = 1, CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
               CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,
               CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5, CUBLASLT_ALGO_CONFIG_STAGES_ID = 6 } cublasLtMatmulAlgoConfigAttributes_t;
typedef enum { CUBLASLT_ALGO_CAP_SPLITK_SUPPORT = 0, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK = 1,
               CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT = 4 } cublasLtMatmulAlgoCapAttributes_t;

typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

struct EmuLtHandle { int magic = 0x4c74; };
struct EmuLtDesc { int32_t compute, scale, pointer_mode = 0, transa = CUBLAS_OP_N, transb = CUBLAS_OP_N; };
struct EmuLtLayout { int32_t type; uint64_t rows, cols; int64_t ld; int32_t batch = 1; int64_t stride = 0; };
struct EmuLtPref { uint64_t max_ws = 0; uint32_t mask = CUBLASLT_REDUCTION_SCHEME_MASK; uint32_t align[4] = {256, 256, 256, 256}; };
typedef EmuLtHandle* cublasLtHandle_t;
typedef EmuLtDesc* cublasLtMatmulDesc_t;
typedef EmuLtLayout* cublasLtMatrixLayout_t;
typedef EmuLtPref* cublasLtMatmulPreference_t;

static inline const char* cublasLtGetStatusName(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulator error)"; }
static inline const char* cublasLtGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulator error"; }

template <typename T>
static inline void emu_lt_attr(const void* buf, size_t size, T* dst, const char* what) {
    if (buf == nullptr || size != sizeof(T)) emu_dief("cuBLASLt %s: buffer of %zu bytes, the attribute holds %zu (CUBLAS_STATUS_INVALID_VALUE)", what, size, sizeof(T));
    memcpy(dst, buf, sizeof(T));
}

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { *h = new EmuLtHandle(); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F) emu_die("cuBLASLt: compute type other than CUBLAS_COMPUTE_32F not emulated");
    if (scale != CUDA_R_32F) emu_die("cuBLASLt: scale type other than CUDA_R_32F not emulated");
    *d = new EmuLtDesc(); (*d)->compute = compute; (*d)->scale = scale; return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t size) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: emu_lt_attr(buf, size, &d->transa, "TRANSA"); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: emu_lt_attr(buf, size, &d->transb, "TRANSB"); break;
    default: emu_dief("cuBLASLt: matmul desc attribute %d not emulated", (int)a);
    }
    for (int32_t op : {d->transa, d->transb})
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) emu_dief("cuBLASLt: operation %d not emulated (real types: N and T only)", op);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld) {
    if (type != CUDA_R_16BF && type != CUDA_R_32F) emu_dief("cuBLASLt: layout type %d not emulated", (int)type);
    *l = new EmuLtLayout(); (*l)->type = type; (*l)->rows = rows; (*l)->cols = cols; (*l)->ld = ld; return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void* buf, size_t size) {
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: emu_lt_attr(buf, size, &l->batch, "BATCH_COUNT"); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: emu_lt_attr(buf, size, &l->stride, "STRIDED_BATCH_OFFSET"); break;
    default: emu_dief("cuBLASLt: layout attribute %d not emulated", (int)a);
    }
    if (l->batch < 1) emu_die("cuBLASLt: BATCH_COUNT < 1");
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) { *p = new EmuLtPref(); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void* buf, size_t size) {
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: emu_lt_attr(buf, size, &p->max_ws, "PREF_MAX_WORKSPACE_BYTES"); break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: emu_lt_attr(buf, size, &p->mask, "PREF_REDUCTION_SCHEME_MASK"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: emu_lt_attr(buf, size, &p->align[0], "PREF_MIN_ALIGNMENT_A_BYTES"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: emu_lt_attr(buf, size, &p->align[1], "PREF_MIN_ALIGNMENT_B_BYTES"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: emu_lt_attr(buf, size, &p->align[2], "PREF_MIN_ALIGNMENT_C_BYTES"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: emu_lt_attr(buf, size, &p->align[3], "PREF_MIN_ALIGNMENT_D_BYTES"); break;
    default: emu_dief("cuBLASLt: preference attribute %d not emulated", (int)a);
    }
    if (p->mask & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK) emu_die("cuBLASLt: reduction scheme mask with unknown bits");
    for (uint32_t al : p->align)
        if (al == 0 || (al & (al - 1))) emu_dief("cuBLASLt: alignment preference %u not a power of two", al);
    return CUBLAS_STATUS_SUCCESS;
}

static inline size_t emu_lt_elem(int32_t type) { return type == CUDA_R_32F ? 4 : 2; }
// the problem an algo was chosen for: cublasLtMatmul checks it gets the same one
static inline uint64_t emu_lt_problem_hash(const EmuLtDesc* d, const EmuLtLayout* const ls[4]) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(d->transa); mix(d->transb); mix(d->compute); mix(d->scale);
    for (int i = 0; i < 4; i++) { mix(ls[i]->type); mix(ls[i]->rows); mix(ls[i]->cols); mix(ls[i]->ld); mix(ls[i]->batch); mix(ls[i]->stride); }
    return h;
}
// validates the problem (types, shapes, leading dimensions, batches); returns m, n, k
static inline void emu_lt_validate(const EmuLtDesc* d, const EmuLtLayout* A, const EmuLtLayout* B, const EmuLtLayout* C, const EmuLtLayout* D,
                                   uint64_t* m, uint64_t* n, uint64_t* k) {
    if (A->type != CUDA_R_16BF || B->type != CUDA_R_16BF) emu_die("cuBLASLt: A and B must be CUDA_R_16BF (the only emulated input type)");
    if (C->type != D->type) emu_die("cuBLASLt: C and D types differ (not a supported combination for CUBLAS_COMPUTE_32F with bf16 inputs)");
    const EmuLtLayout* const all[4] = {A, B, C, D};
    for (const EmuLtLayout* l : all) {
        if (l->rows == 0 || l->cols == 0) emu_die("cuBLASLt: a layout with 0 rows or cols");
        if (l->ld < (int64_t)l->rows) emu_dief("cuBLASLt: ld %lld < rows %llu (column-major: ld >= rows)", (long long)l->ld, (unsigned long long)l->rows);
    }
    const uint64_t am = d->transa == CUBLAS_OP_N ? A->rows : A->cols, ak = d->transa == CUBLAS_OP_N ? A->cols : A->rows;
    const uint64_t bk = d->transb == CUBLAS_OP_N ? B->rows : B->cols, bn = d->transb == CUBLAS_OP_N ? B->cols : B->rows;
    if (ak != bk) emu_dief("cuBLASLt: op(A) is %llu x %llu, op(B) %llu x %llu: inner dimensions differ", (unsigned long long)am, (unsigned long long)ak, (unsigned long long)bk, (unsigned long long)bn);
    if (C->rows != am || C->cols != bn || D->rows != am || D->cols != bn)
        emu_dief("cuBLASLt: C %llux%llu / D %llux%llu, op(A) op(B) is %llux%llu", (unsigned long long)C->rows, (unsigned long long)C->cols,
                 (unsigned long long)D->rows, (unsigned long long)D->cols, (unsigned long long)am, (unsigned long long)bn);
    if (A->batch != D->batch || B->batch != D->batch || C->batch != D->batch) emu_die("cuBLASLt: BATCH_COUNT differs between layouts");
    *m = am, *n = bn, *k = ak;
}
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                            cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref,
                                                            int requested, cublasLtMatmulHeuristicResult_t* results, int* returned) {
    if (!h || h->magic != 0x4c74) emu_die("cuBLASLt: bad handle");
    uint64_t m, n, k;
    emu_lt_validate(d, A, B, C, D, &m, &n, &k);
    const EmuLtLayout* const ls[4] = {A, B, C, D};
    // candidates, in an order that tests the caller's filters: split-K schemes first, an in-place-only
    // algorithm, then plain ones. Only those the preferences allow are returned (documented filtering).
    struct Cand { int id, tile, splitk; uint32_t scheme; int oop, stages; size_t ws; };
    const size_t partial = (size_t)m * n * D->batch * 4;
    const Cand cands[] = {
        {21, 18, 2, CUBLASLT_REDUCTION_SCHEME_INPLACE, 1, 8, 0},
        {22, 20, 4, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE, 1, 8, partial * 4 / 2},
        {23, 20, 1, CUBLASLT_REDUCTION_SCHEME_NONE, 0, 8, 0},
        {24, 20, 3, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, 1, 8, partial * 3},
        {25, 24, 1, CUBLASLT_REDUCTION_SCHEME_NONE, 1, 10, 0},
    };
    int r = 0;
    const bool none = getenv("EMU_LT_NO_CANDIDATES") != nullptr;  // a problem the library has no algorithm for
    for (const Cand& c : cands) {
        if (r >= requested || none) break;
        if (c.splitk > 1 && !(c.scheme & pref->mask)) continue;
        if (c.ws > pref->max_ws) continue;
        cublasLtMatmulHeuristicResult_t& res = results[r++];
        memset(&res, 0, sizeof res);
        res.algo.data[0] = 0x454d55414c474fULL;  // "EMUALGO"
        res.algo.data[1] = (uint64_t)c.id | (uint64_t)c.tile << 16 | (uint64_t)c.stages << 32;
        res.algo.data[2] = (uint64_t)c.splitk | (uint64_t)c.scheme << 32;
        res.algo.data[3] = (uint64_t)c.oop;
        res.algo.data[4] = (uint64_t)pref->align[0] | (uint64_t)pref->align[1] << 16 | (uint64_t)pref->align[2] << 32 | (uint64_t)pref->align[3] << 48;
        res.algo.data[5] = emu_lt_problem_hash(d, ls);
        res.algo.data[6] = c.ws;
        res.workspaceSize = c.ws;
        res.state = CUBLAS_STATUS_SUCCESS;
        res.wavesCount = 1.0f;
    }
    *returned = r;
    return r ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
static inline void emu_lt_check_algo(const cublasLtMatmulAlgo_t* a) { if (a->data[0] != 0x454d55414c474fULL) emu_die("cuBLASLt: algo not from cublasLtMatmulAlgoGetHeuristic"); }
static inline cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* a, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf, size_t size, size_t* written) {
    emu_lt_check_algo(a);
    auto put = [&](auto v, const char* what) {
        if (size != sizeof v || !buf) emu_dief("cuBLASLt: config attribute %s: buffer of %zu bytes, the attribute holds %zu", what, size, sizeof v);
        memcpy(buf, &v, sizeof v);
        if (written) *written = sizeof v;
    };
    switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: put((int32_t)(a->data[1] & 0xffff), "ID"); break;
    case CUBLASLT_ALGO_CONFIG_TILE_ID: put((uint32_t)(a->data[1] >> 16 & 0xffff), "TILE_ID"); break;
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: put((uint32_t)(a->data[1] >> 32 & 0xffff), "STAGES_ID"); break;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: put((int32_t)(a->data[2] & 0xffffffff), "SPLITK_NUM"); break;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME: put((uint32_t)(a->data[2] >> 32), "REDUCTION_SCHEME"); break;
    default: emu_dief("cuBLASLt: algo config attribute %d not emulated", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t* a, cublasLtMatmulAlgoCapAttributes_t attr, void* buf, size_t size, size_t* written) {
    emu_lt_check_algo(a);
    switch (attr) {
    case CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT: {
        int32_t v = (int32_t)a->data[3];
        if (size != sizeof v || !buf) emu_dief("cuBLASLt: cap OUT_OF_PLACE_RESULT_SUPPORT: buffer of %zu bytes, the attribute holds 4", size);
        memcpy(buf, &v, 4);
        if (written) *written = 4;
        break;
    }
    default: emu_dief("cuBLASLt: algo cap attribute %d not emulated", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}
static inline float emu_lt_load(const void* p, int32_t type, size_t i) {
    return type == CUDA_R_32F ? ((const float*)p)[i] : emu_bf(((const uint16_t*)p)[i]);
}
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A, cublasLtMatrixLayout_t Al,
                                            const void* B, cublasLtMatrixLayout_t Bl, const void* beta, const void* C, cublasLtMatrixLayout_t Cl,
                                            void* D, cublasLtMatrixLayout_t Dl, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                            size_t workspace_bytes, cudaStream_t stream) {
    if (!h || h->magic != 0x4c74) emu_die("cuBLASLt: bad handle");
    if (!algo) emu_die("cuBLASLt: algo == nullptr (emulated only with an algo from the heuristic)");
    emu_lt_check_algo(algo);
    uint64_t m, n, k;
    emu_lt_validate(d, Al, Bl, Cl, Dl, &m, &n, &k);
    const EmuLtLayout* const ls[4] = {Al, Bl, Cl, Dl};
    if (algo->data[5] != emu_lt_problem_hash(d, ls)) emu_die("cuBLASLt: algo was chosen for another problem (descriptors differ)");
    if (workspace_bytes < algo->data[6]) emu_dief("cuBLASLt: workspace of %zu bytes, the algo needs %llu (CUBLAS_STATUS_INVALID_VALUE)", workspace_bytes, (unsigned long long)algo->data[6]);
    if (workspace_bytes && !emu_is_device(workspace, workspace_bytes)) emu_die("cuBLASLt: workspace is not a device buffer of workspaceSizeInBytes");
    // pointer mode host (the default): alpha and beta are read at the call
    const float al = *(const float*)alpha, be = *(const float*)beta;
    const bool in_place = C == D;
    if (!(algo->data[3]) && !in_place && be != 0.0f) emu_die("cuBLASLt: out-of-place C != D with an algo without CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT");
    if (in_place && (Cl->ld != Dl->ld || Cl->stride != Dl->stride)) emu_die("cuBLASLt: in place (C == D) with different C and D layouts");
    // every matrix inside one device allocation, and as aligned as the heuristic was promised
    const void* ptrs[4] = {A, B, C, D};
    const char* names = "ABCD";
    for (int i = 0; i < 4; i++) {
        if (i == 2 && be == 0.0f) continue;  // beta == 0: C is not read
        const EmuLtLayout* l = ls[i];
        const size_t es = emu_lt_elem(l->type);
        const size_t last = (size_t)(l->batch - 1) * l->stride + (l->cols - 1) * l->ld + l->rows;  // elements spanned
        if (!ptrs[i] || !emu_is_device(ptrs[i], last * es))
            emu_dief("cuBLASLt: matrix %c (%p, %zu bytes spanned) is not inside one device allocation", names[i], ptrs[i], last * es);
        const uint32_t promised = (uint32_t)(algo->data[4] >> (16 * i) & 0xffff);
        uintptr_t addr_bits = (uintptr_t)ptrs[i];
        if (l->batch > 1) addr_bits |= (uintptr_t)(l->stride * es);
        if (addr_bits % promised) emu_dief("cuBLASLt: matrix %c at %p (batch stride %lld) is less aligned than the %u bytes promised to the heuristic",
                                          names[i], ptrs[i], (long long)l->stride, promised);
        if ((uintptr_t)ptrs[i] % es) emu_dief("cuBLASLt: matrix %c misaligned for its type", names[i]);
    }
    // D = alpha op(A) op(B) + beta C per batch, column-major; the accumulator is fp32
    const EmuLtLayout al_ = *Al, bl_ = *Bl, cl_ = *Cl, dl_ = *Dl;
    const int32_t ta = d->transa, tb = d->transb;
    emu_enqueue(stream, [=] {
        std::vector<float> opA(m * k), opB(k * n);  // op(A) row i: opA[i * k + p]; op(B) column j: opB[j * k + p]
        std::vector<float> acc(m * n);
        for (int32_t b = 0; b < dl_.batch; b++) {
            const size_t oa = (size_t)b * al_.stride, ob = (size_t)b * bl_.stride, oc = (size_t)b * cl_.stride, od = (size_t)b * dl_.stride;
            for (uint64_t i = 0; i < m; i++)
                for (uint64_t p = 0; p < k; p++)  // op(A)(i, p) = A(i, p) or A(p, i); A(r, c) at r + c ld
                    opA[i * k + p] = emu_lt_load(A, al_.type, oa + (ta == CUBLAS_OP_N ? i + p * al_.ld : p + i * al_.ld));
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t p = 0; p < k; p++)
                    opB[j * k + p] = emu_lt_load(B, bl_.type, ob + (tb == CUBLAS_OP_N ? p + j * bl_.ld : j + p * bl_.ld));
#pragma omp parallel for collapse(2) if (m * n * k > 100000)
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t i = 0; i < m; i++) {
                    const float* x = &opA[i * k];
                    const float* y = &opB[j * k];
                    float s = 0.0f;
                    for (uint64_t p = 0; p < k; p++) s += x[p] * y[p];
                    acc[i + j * m] = s;
                }
            for (uint64_t j = 0; j < n; j++)
                for (uint64_t i = 0; i < m; i++) {
                    float v = al * acc[i + j * m];
                    if (be != 0.0f) v += be * emu_lt_load(C, cl_.type, oc + i + j * cl_.ld);
                    const size_t di = od + i + j * dl_.ld;
                    if (dl_.type == CUDA_R_32F) ((float*)D)[di] = v;
                    else ((uint16_t*)D)[di] = emu_f2bf(v);
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}
