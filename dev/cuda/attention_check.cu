// nvcc -arch=sm_90 -O3 -std=c++17 -Xcompiler -Wall,-Wextra -Werror all-warnings -I. dev/cuda/attention_check.cu -o attention_check
// (add -Xcompiler -fopenmp to run the CPU twins on all cores; see the note above the includes)
//
// attention_check: the CUDA attention (attention.cuh) and XSA (xsa.cuh) ops against their CPU twins.
//   ./attention_check              checks, then timing at d24-like sizes
//   ./attention_check --no-timing  checks only (--small: the first two shapes only, for compute-sanitizer;
//                                  --head-dim-128: the first shape at head_dim 128 only, for the emulator's device profiles)
// For several shapes (head_dim 64 and 128, GQA 2:1 and 1:1, window < T and full, T not a multiple of the
// 64-row tile, B = 2), on fresh random inputs: the forward (y, lse), the backward (dq, dk, dv), the fused
// XSA forward (z, y, lse) and backward for alpha 0, 0.5, 1, and the unfused XSA ops. The CPU twins run in
// fp32 on the same bf16-rounded inputs; for attention they are the naive one-row loops
// (attention_*_naive_cpu), not the blocked CPU kernels: at window 0 dq and dk are exactly 0 mathematically
// (each token sees only itself, y = v), which the naive loops reproduce bit for bit (dy.v and dy.y by the
// same dot product) and the blocked ones only to rounding noise, against which a relative error means nothing; the comparison is the relative L2 error ||gpu - cpu|| / ||cpu||
// (bf16 tolerance 1e-2; lse, fp32, 1e-4) and the worst row's (5x that; see check_close). Outputs are
// poisoned (NaN bytes) before every run, so an unwritten element fails the check. Identities checked bit-exactly: two runs give the same bits; the
// fused forward's y and lse are the plain forward's; alpha = 0 gives z = y and the plain backward's
// gradients; the forward + backward captured in a CUDA graph replay to the same bits; the unfused
// backward with dy aliasing dz gives the non-aliased bits. Also generation's attention over a KV cache
// (attention_decode_cuda) for the same shapes. Exit code 1 on any failure; a table last.
//
// FLOP convention for the TFLOP/s column: with P = sum_i min(window + 1, i + 1) the (query, key) pairs
// inside the causal window, per (b, h): forward 4 D P (Q K^T and P V, 2 FLOP per multiply-add),
// backward 10 D P (FA2's 2.5x: S, dP, dV, dK, dQ). Our backward recomputes S and dP in both of its
// kernels, so it executes 14 D P; masked halves of diagonal tiles are not counted either.
// common.h has helpers this program does not use
#pragma GCC diagnostic ignored "-Wunused-function"
#ifndef _OPENMP
// Built without -Xcompiler -fopenmp (the build line at the top): the `#pragma omp` of the CPU twins and
// of common.h are "unknown pragma" warnings, and GCC 12's C++ front end does not let #pragma GCC
// diagnostic silence those (GCC bug 53431, fixed in GCC 13). So this GNU line marker makes the headers
// below read as system headers, whose warnings GCC does not report; the marker after them returns to
// this file. With -fopenmp the pragmas are known, nothing is hidden, and the CPU twins run in parallel.
# 1 "attention_check.cu: headers" 3
#endif
#include "llmc/attention.cuh"
#include "xsa.cuh"
#include <algorithm>
#include <vector>
#ifndef _OPENMP
# 37 "dev/cuda/attention_check.cu"
#endif

static int g_failures = 0;
static bool g_quiet_pass = false;

static void report(bool ok, const char* what, const char* detail) {
    if (!ok) g_failures++;
    if (!ok || !g_quiet_pass) printf("%s %-44s %s\n", ok ? "ok  " : "FAIL", what, detail);
}

static double l2(const std::vector<float>& a) {
    double s = 0.0;
    for (float x : a) s += (double)x * x;
    return sqrt(s);
}

// Two measures, both written so that NaN fails:
// * ||gpu - cpu|| / ||cpu|| <= tol over the whole tensor;
// * the worst row (row_len consecutive elements, one token of one head) with ||gpu_r - cpu_r|| over
//   max(||cpu_r||, rms row norm) <= 5 tol: a tile-range error that drops or adds a few (query, key)
//   pairs hides in the global norm but not in the rows it touches (seen with mutated kernels).
// floor > 0 where the reference is a sum of larger terms that may cancel (the error of a bf16
// computation scales with the terms, not with their sum): the norms are taken at least that large.
static void check_close(const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
                        int row_len = 0, double floor = 0.0) {
    const double ref = std::max(l2(cpu), floor);
    double diff = 0.0;
    for (size_t i = 0; i < cpu.size(); i++) diff += ((double)gpu[i] - cpu[i]) * ((double)gpu[i] - cpu[i]);
    const double err = ref > 0.0 ? sqrt(diff) / ref : sqrt(diff);
    double worst = 0.0;
    if (row_len > 0) {
        const size_t rows = cpu.size() / row_len;
        const double rms_row = ref / sqrt((double)rows);
        for (size_t r = 0; r < rows; r++) {
            double d = 0.0, n = 0.0;
            for (size_t i = r * row_len; i < (r + 1) * row_len; i++) {
                d += ((double)gpu[i] - cpu[i]) * ((double)gpu[i] - cpu[i]);
                n += (double)cpu[i] * cpu[i];
            }
            const double den = std::max(sqrt(n), rms_row);
            const double e = den > 0.0 ? sqrt(d) / den : sqrt(d);  // an all-zero reference must be matched exactly
            worst = e > worst || e != e ? e : worst;
        }
    }
    char detail[128];
    if (row_len > 0) snprintf(detail, sizeof detail, "rel L2 %.2e (tol %.0e), worst row %.2e (tol %.0e)", err, tol, worst, 5 * tol);
    else snprintf(detail, sizeof detail, "rel L2 %.2e (tol %.0e)", err, tol);
    report(err <= tol && worst <= 5 * tol, what, detail);
}

// ---- device buffers ----

template <typename Tp>
struct Buf {
    Tp* p = nullptr;
    size_t n = 0;
    explicit Buf(size_t count) : n(count) { cudaCheck(cudaMalloc(&p, (n ? n : 1) * sizeof(Tp))); }
    ~Buf() { cudaFree(p); }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    size_t bytes() const { return n * sizeof(Tp); }
    void poison(cudaStream_t s) { cudaCheck(cudaMemsetAsync(p, 0xFF, bytes(), s)); }  // NaN in bf16 and fp32
};

// fresh random values, rounded to bf16 on the host (the CPU twin's input) and uploaded
static std::vector<float> random_bf16(Buf<floatX>& dst, float std, Rng* rng) {
    std::vector<float> h(dst.n);
    std::vector<floatX> hb(dst.n);
    for (size_t i = 0; i < h.size(); i++) {
        hb[i] = __float2bfloat16_rn(std * rng_normal(rng));
        h[i] = __bfloat162float(hb[i]);
    }
    cudaCheck(cudaMemcpy(dst.p, hb.data(), dst.bytes(), cudaMemcpyHostToDevice));
    return h;
}

static std::vector<float> download(const Buf<floatX>& src) {
    std::vector<floatX> hb(src.n);
    cudaCheck(cudaMemcpy(hb.data(), src.p, src.bytes(), cudaMemcpyDeviceToHost));
    std::vector<float> h(src.n);
    for (size_t i = 0; i < h.size(); i++) h[i] = __bfloat162float(hb[i]);
    return h;
}
static std::vector<float> download(const Buf<float>& src) {
    std::vector<float> h(src.n);
    cudaCheck(cudaMemcpy(h.data(), src.p, src.bytes(), cudaMemcpyDeviceToHost));
    return h;
}
static void upload(Buf<floatX>& dst, const std::vector<float>& h) {
    std::vector<floatX> hb(h.size());
    for (size_t i = 0; i < h.size(); i++) hb[i] = __float2bfloat16_rn(h[i]);
    cudaCheck(cudaMemcpy(dst.p, hb.data(), dst.bytes(), cudaMemcpyHostToDevice));
}

template <typename Tp>
static bool same_bits(const Buf<Tp>& a, const Buf<Tp>& b) {
    std::vector<unsigned char> ha(a.bytes()), hb(b.bytes());
    cudaCheck(cudaMemcpy(ha.data(), a.p, a.bytes(), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hb.data(), b.p, b.bytes(), cudaMemcpyDeviceToHost));
    return a.bytes() == b.bytes() && memcmp(ha.data(), hb.data(), ha.size()) == 0;
}

static void check_bits(const char* what, bool same) { report(same, what, same ? "identical bits" : "bits differ"); }

// ---- correctness ----

struct Shape {
    int B, T, H, Hkv, D, window;
    float qstd = 1.5f;  // scores ~ N(0, qstd^2 1.5^2): 1.5 a peaked softmax, 0.1 a nearly flat one
};

static void check_shape(const Shape& s, Rng* rng, cudaStream_t st) {
    const int B = s.B, T = s.T, H = s.H, Hkv = s.Hkv, D = s.D, W = s.window;
    const QKVStrides sep = qkv_separate(H, Hkv, D);  // q, k, v in three buffers
    const size_t tokens = (size_t)B * T, nq = tokens * H * D, nkv = tokens * Hkv * D, nl = (size_t)B * H * T;
    printf("-- B %d T %d H %d Hkv %d D %d window %d q std %.1f\n", B, T, H, Hkv, D, W, s.qstd);
    char name[128];
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)

    Buf<floatX> q(nq), k(nkv), v(nkv), dy(nq), y(nq), y2(nq), z(nq), z2(nq);
    Buf<float> lse(nl), lse2(nl);
    Buf<floatX> dq(nq), dk(nkv), dv(nkv), dq2(nq), dk2(nkv), dv2(nkv), dq0(nq), dk0(nkv), dv0(nkv);
    Buf<float> scratch(attention_backward_scratch_floats(B, T, H, Hkv, D, true));
    std::vector<float> hq = random_bf16(q, s.qstd, rng), hk = random_bf16(k, 1.5f, rng), hv = random_bf16(v, 1.0f, rng);
    std::vector<float> hdy = random_bf16(dy, 1.0f, rng);

    // plain forward
    std::vector<float> cy(nq), clse(nl);
    attention_forward_naive_cpu(cy.data(), clse.data(), hq.data(), hk.data(), hv.data(), B, T, H, Hkv, D, W);
    y.poison(st), lse.poison(st);
    attention_forward_cuda(y.p, lse.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, st);
    check_close("forward y", download(y), cy, 1e-2, D);
    check_close("forward lse", download(lse), clse, 1e-4, 1);  // fp32: errors ~1e-7
    y2.poison(st), lse2.poison(st);
    attention_forward_cuda(y2.p, lse2.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, st);
    check_bits("forward deterministic (y, lse)", same_bits(y, y2) && same_bits(lse, lse2));
    // every forward variant (attention_forward_variant) gives the bits of the one this GPU runs, plain and with XSA
    // (alpha differing per head: the own value rows of a 128-row block come from either diagonal tile)
    std::vector<float> ramp(H);
    for (int h = 0; h < H; h++) ramp[h] = 0.3f + 0.6f * h / std::max(H - 1, 1);
    Buf<float> ramp_dev(H);
    cudaCheck(cudaMemcpy(ramp_dev.p, ramp.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    {
        z.poison(st), y2.poison(st), lse2.poison(st);
        attention_forward_xsa_cuda(z.p, y2.p, lse2.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, ramp_dev.p, st);
        for (int vi = 0; vi < ATTN_FWD_VARIANTS; vi++) {
            const AttentionForwardVariant var = (AttentionForwardVariant)vi;
            if (!attention_forward_available(D, var)) {
                printf("(forward variant %s: not at head_dim %d on this GPU, %zu bytes of shared memory per block)\n", ATTN_FWD_NAMES[vi], D,
                       g_cuda.shared_per_block_optin);
                continue;
            }
            Buf<floatX> yv(nq), zv(nq), yz(nq);
            Buf<float> lv(nl), lz(nl);
            yv.poison(st), lv.poison(st), zv.poison(st), yz.poison(st), lz.poison(st);
            attention_forward_cuda(yv.p, lv.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, st, var);
            attention_forward_xsa_cuda(zv.p, yz.p, lz.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, ramp_dev.p, st, var);
            check_bits(NAME("forward variant %s = as used here (y, lse; xsa z, y, lse)", ATTN_FWD_NAMES[vi]),
                       same_bits(y, yv) && same_bits(lse, lv) && same_bits(z, zv) && same_bits(y2, yz) && same_bits(lse2, lz));
        }
    }

    // plain backward, with the GPU's y and lse (as training would); the CPU twin accumulates: zeros first
    const std::vector<float> gy = download(y), glse = download(lse);
    std::vector<float> cdq(nq, 0.0f), cdk(nkv, 0.0f), cdv(nkv, 0.0f);
    attention_backward_naive_cpu(cdq.data(), cdk.data(), cdv.data(), hdy.data(), hq.data(), hk.data(), hv.data(), gy.data(),
                           glse.data(), B, T, H, Hkv, D, W);
    dq.poison(st), dk.poison(st), dv.poison(st), scratch.poison(st);
    attention_backward_cuda(dq.p, dk.p, dv.p, dy.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, scratch.p, st);
    check_close("backward dq", download(dq), cdq, 1e-2, D);
    check_close("backward dk", download(dk), cdk, 1e-2, D);
    check_close("backward dv", download(dv), cdv, 1e-2, D);
    dq2.poison(st), dk2.poison(st), dv2.poison(st), scratch.poison(st);
    attention_backward_cuda(dq2.p, dk2.p, dv2.p, dy.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, scratch.p, st);
    check_bits("backward deterministic (dq, dk, dv)", same_bits(dq, dq2) && same_bits(dk, dk2) && same_bits(dv, dv2));
    {
        const int other = 3 - attention_dq_stages(D);  // the K/V buffering this GPU does not use, where it can run
        const float* delta = scratch.p + attention_backward_scratch(tokens, H, Hkv, D, ATTN_BWD_PLAIN).delta;
        if ((size_t)attention_dq_smem(D, ATT_TILE, other) <= g_cuda.shared_per_block_optin) {
            dq2.poison(st);
            const int w = std::min(W, T);  // as attention_backward_cuda clamps it
            if (D == 64 && other == 1) attention_dq_launch<64, 64, 1>(dq2.p, dy.p, q.p, k.p, v.p, sep, lse.p, delta, B, T, H, Hkv, w, st);
            if (D == 64 && other == 2) attention_dq_launch<64, 64, 2>(dq2.p, dy.p, q.p, k.p, v.p, sep, lse.p, delta, B, T, H, Hkv, w, st);
            if (D == 128 && other == 1) attention_dq_launch<128, 64, 1>(dq2.p, dy.p, q.p, k.p, v.p, sep, lse.p, delta, B, T, H, Hkv, w, st);
            if (D == 128 && other == 2) attention_dq_launch<128, 64, 2>(dq2.p, dy.p, q.p, k.p, v.p, sep, lse.p, delta, B, T, H, Hkv, w, st);
            check_bits(NAME("dq with K/V %s-buffered = as used here (%s)", other == 1 ? "single" : "double",
                            attention_dq_stages(D) == 1 ? "single" : "double"), same_bits(dq, dq2));
        } else {
            printf("(dq with K/V double-buffered: needs %d bytes of shared memory per block, this GPU offers %zu)\n",
                   attention_dq_smem(D, ATT_TILE, other), g_cuda.shared_per_block_optin);
        }
    }
    // every other backward variant (attention_backward_variant) gives the bits of the one this GPU runs, plain
    // and with fused XSA (alpha differing per head: its self-position dv term goes through each dK/dV block size)
    {
        const AttentionBackwardVariant used = attention_backward_variant_for(D, ATTN_BWD_VARIANTS);
        Buf<floatX> xdq(nq), xdk(nkv), xdv(nkv);
        bool reference = false;  // the XSA backward of the variant used, run once another variant is to be compared
        for (int vi = 0; vi < ATTN_BWD_VARIANTS; vi++) {
            const AttentionBackwardVariant var = (AttentionBackwardVariant)vi;
            if (var == used) continue;
            if (!attention_backward_available(D, var)) {
                printf("(backward variant %s: not at head_dim %d on this GPU, %zu bytes of shared memory per block)\n", ATTN_BWD_NAMES[vi], D,
                       g_cuda.shared_per_block_optin);
                continue;
            }
            if (!reference) {
                xdq.poison(st), xdk.poison(st), xdv.poison(st), scratch.poison(st);
                attention_backward_xsa_cuda(xdq.p, xdk.p, xdv.p, dy.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, ramp_dev.p, nullptr,
                                            scratch.p, st);
                reference = true;
            }
            bool same = true;
            for (bool xsa : {false, true}) {
                dq2.poison(st), dk2.poison(st), dv2.poison(st), scratch.poison(st);
                if (xsa)
                    attention_backward_xsa_cuda(dq2.p, dk2.p, dv2.p, dy.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, ramp_dev.p,
                                                nullptr, scratch.p, st, var);
                else attention_backward_cuda(dq2.p, dk2.p, dv2.p, dy.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, scratch.p, st, var);
                same = same && same_bits(xsa ? xdq : dq, dq2) && same_bits(xsa ? xdk : dk, dk2) && same_bits(xsa ? xdv : dv, dv2);
            }
            check_bits(NAME("backward variant %s = as used here (dq, dk, dv; xsa dq, dk, dv)", ATTN_BWD_NAMES[vi]), same);
        }
    }

    // the model's layout: q | k | v of a token in one row of one buffer (qkv_fused), and dq | dk | dv
    // likewise; plain and with fused XSA (alpha 0.5), the same bits as on separate buffers
    {
        const QKVStrides at = qkv_fused(H, Hkv, D);
        const size_t pitch = at.q * sizeof(floatX), koff = (size_t)H * D, voff = (size_t)(H + Hkv) * D;
        Buf<floatX> qkv(tokens * at.q), dqkv(tokens * at.q), sq(nq), sk(nkv), sv(nkv);
        auto to_rows = [&](floatX* dst, const Buf<floatX>& src, size_t width) {  // (tokens, width) into the fused rows
            cudaCheck(cudaMemcpy2D(dst, pitch, src.p, width * sizeof(floatX), width * sizeof(floatX), tokens, cudaMemcpyDeviceToDevice));
        };
        auto from_rows = [&](Buf<floatX>& dst, const floatX* src, size_t width) {
            cudaCheck(cudaMemcpy2D(dst.p, width * sizeof(floatX), src, pitch, width * sizeof(floatX), tokens, cudaMemcpyDeviceToDevice));
        };
        to_rows(qkv.p, q, nq / tokens), to_rows(qkv.p + koff, k, nkv / tokens), to_rows(qkv.p + voff, v, nkv / tokens);
        const floatX *fq = qkv.p, *fk = qkv.p + koff, *fv = qkv.p + voff;
        bool same = true;
        y2.poison(st), lse2.poison(st), dqkv.poison(st), scratch.poison(st);
        attention_forward_cuda(y2.p, lse2.p, fq, fk, fv, at, B, T, H, Hkv, D, W, st);
        attention_backward_cuda(dqkv.p, dqkv.p + koff, dqkv.p + voff, dy.p, fq, fk, fv, at, y.p, lse.p, B, T, H, Hkv, D, W, scratch.p, st);
        from_rows(sq, dqkv.p, nq / tokens), from_rows(sk, dqkv.p + koff, nkv / tokens), from_rows(sv, dqkv.p + voff, nkv / tokens);
        same = same_bits(y, y2) && same_bits(lse, lse2) && same_bits(dq, sq) && same_bits(dk, sk) && same_bits(dv, sv);
        Buf<float> half(H);
        cudaCheck(cudaMemcpy(half.p, std::vector<float>(H, 0.5f).data(), H * sizeof(float), cudaMemcpyHostToDevice));
        std::vector<std::vector<unsigned char>> outs;  // z, y, dq, dk, dv of the separate run, then of the fused one
        for (bool fused : {false, true}) {
            const QKVStrides lay = fused ? at : sep;
            const floatX *xq = fused ? fq : q.p, *xk = fused ? fk : k.p, *xv = fused ? fv : v.p;
            floatX *xdq = fused ? dqkv.p : dq2.p, *xdk = fused ? dqkv.p + koff : dk2.p, *xdv = fused ? dqkv.p + voff : dv2.p;
            Buf<floatX> dz(nq);
            cudaCheck(cudaMemcpy(dz.p, dy.p, dy.bytes(), cudaMemcpyDeviceToDevice));
            z.poison(st), y2.poison(st), lse2.poison(st), dqkv.poison(st), scratch.poison(st);
            dq2.poison(st), dk2.poison(st), dv2.poison(st);
            attention_forward_xsa_cuda(z.p, y2.p, lse2.p, xq, xk, xv, lay, B, T, H, Hkv, D, W, half.p, st);
            attention_backward_xsa_cuda(xdq, xdk, xdv, dz.p, xq, xk, xv, lay, y2.p, lse2.p, B, T, H, Hkv, D, W, half.p, nullptr, scratch.p,
                                        st);
            if (fused)
                from_rows(dq2, dqkv.p, nq / tokens), from_rows(dk2, dqkv.p + koff, nkv / tokens), from_rows(dv2, dqkv.p + voff, nkv / tokens);
            for (const Buf<floatX>* b : {&z, &y2, &dq2, &dk2, &dv2}) {
                outs.emplace_back(b->bytes());
                cudaCheck(cudaMemcpy(outs.back().data(), b->p, b->bytes(), cudaMemcpyDeviceToHost));
            }
        }
        for (int i = 0; i < 5; i++) same = same && outs[i] == outs[i + 5];
        check_bits("q|k|v in one buffer (the model's layout) = separate buffers: forward, backward, and with XSA 0.5", same);
    }

    // fused XSA: one alpha for every head (0, 0.5, 1), then a learnable-style alpha that differs per head
    // (tanh of spread logits), whose backward also writes the per-token shares of dL/dalpha
    const float alphas[4] = {0.0f, 0.5f, 1.0f, -1.0f /* per head */};
    for (float alpha : alphas) {
        const bool per_head = alpha < 0.0f;
        std::vector<float> halpha(H, alpha), logit(H);
        for (int h = 0; h < H; h++) logit[h] = -0.8f + 2.0f * h / std::max(H - 1, 1);  // alpha from -0.66 to 0.83
        if (per_head) xsa_alpha_from_logit_cpu(halpha.data(), logit.data(), H);
        Buf<float> alpha_dev(H), logit_dev(H), shares(tokens * H), shares2(tokens * H), dlogit(H);
        cudaCheck(cudaMemcpy(logit_dev.p, logit.data(), H * sizeof(float), cudaMemcpyHostToDevice));
        if (per_head) {
            alpha_dev.poison(st);
            xsa_alpha_from_logit_cuda(alpha_dev.p, logit_dev.p, H, st);
            check_close("xsa per-head alpha = tanh(logit)", download(alpha_dev), halpha, 1e-6);
        } else {
            cudaCheck(cudaMemcpy(alpha_dev.p, halpha.data(), H * sizeof(float), cudaMemcpyHostToDevice));
        }
        char tag[32];
        if (per_head) snprintf(tag, sizeof tag, "xsa per-head");
        else snprintf(tag, sizeof tag, "xsa %.1f", alpha);
        float* dalpha = per_head ? shares.p : nullptr;  // only a learnable alpha needs its gradient
        std::vector<float> cz(nq);
        xsa_forward_cpu(cz.data(), cy.data(), hv.data(), (size_t)Hkv * D, tokens, H, Hkv, D, halpha.data());
        z.poison(st), y2.poison(st), lse2.poison(st);
        attention_forward_xsa_cuda(z.p, y2.p, lse2.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, alpha_dev.p, st);
        check_close(NAME("%s forward z", tag), download(z), cz, 1e-2, D);
        check_bits(NAME("%s forward y, lse == plain forward", tag), same_bits(y, y2) && same_bits(lse, lse2));
        if (alpha == 0.0f) check_bits("xsa 0.0 forward z == y", same_bits(z, y));
        // the fused epilogue against the unfused op on the same bf16 y
        z2.poison(st);
        xsa_forward_cuda(z2.p, y.p, v.p, (size_t)Hkv * D, tokens, H, Hkv, D, alpha_dev.p, st);
        check_close(NAME("%s fused z vs unfused op", tag), download(z), download(z2), 1e-6);
        y2.poison(st), lse2.poison(st), z2.poison(st);
        attention_forward_xsa_cuda(z2.p, y2.p, lse2.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, alpha_dev.p, st);
        check_bits(NAME("%s forward deterministic", tag), same_bits(z, z2) && same_bits(y, y2) && same_bits(lse, lse2));

        // backward: dz fresh; CPU: xsa_backward (dy =, its dv term) and attention backward (+=, the rest).
        // The two dv parts can cancel (window 0, alpha 1: y = v and dv = 0 exactly), so dv's error is
        // measured against the larger of ||dv|| and ||attention part||.
        Buf<floatX> dz(nq);
        std::vector<float> hdz = random_bf16(dz, 1.0f, rng);
        std::vector<float> cdy2(nq), cdv_xsa(nkv, 0.0f), cshares(tokens * H), cdlogit(H, 0.0f);
        std::fill(cdq.begin(), cdq.end(), 0.0f), std::fill(cdk.begin(), cdk.end(), 0.0f), std::fill(cdv.begin(), cdv.end(), 0.0f);
        xsa_backward_cpu(cdy2.data(), cdv_xsa.data(), per_head ? cshares.data() : nullptr, hdz.data(), gy.data(), hv.data(), (size_t)Hkv * D, tokens, H, Hkv,
                         D, halpha.data());
        attention_backward_naive_cpu(cdq.data(), cdk.data(), cdv.data(), cdy2.data(), hq.data(), hk.data(), hv.data(), gy.data(),
                               glse.data(), B, T, H, Hkv, D, W);
        const double dv_attention_norm = l2(cdv);
        for (size_t i = 0; i < nkv; i++) cdv[i] += cdv_xsa[i];
        dq.poison(st), dk.poison(st), dv.poison(st), scratch.poison(st), shares.poison(st);
        attention_backward_xsa_cuda(dq.p, dk.p, dv.p, dz.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, alpha_dev.p, dalpha, scratch.p, st);
        check_close(NAME("%s backward dq", tag), download(dq), cdq, 1e-2, D);
        check_close(NAME("%s backward dk", tag), download(dk), cdk, 1e-2, D);
        check_close(NAME("%s backward dv", tag), download(dv), cdv, 1e-2, D, dv_attention_norm);
        if (per_head) {
            // the shares come from fp32 dot products of the same bf16 inputs; their sum through tanh' into
            // the logits' gradient (+= onto a start value) in a fixed order
            check_close("xsa per-head backward dL/dalpha shares", download(shares), cshares, 1e-4, H);
            const std::vector<float> start = {0.25f, -0.5f, 1.0f, 0.0f, 0.125f, 2.0f, -1.0f, 0.5f};
            std::vector<float> hstart(H);
            for (int h = 0; h < H; h++) hstart[h] = start[h % start.size()];
            cdlogit = hstart;
            xsa_alpha_backward_cpu(cdlogit.data(), cshares.data(), halpha.data(), tokens, H);
            cudaCheck(cudaMemcpy(dlogit.p, hstart.data(), H * sizeof(float), cudaMemcpyHostToDevice));
            xsa_alpha_backward_cuda(dlogit.p, shares.p, alpha_dev.p, tokens, H, st);
            check_close("xsa per-head dL/dlogit (+=)", download(dlogit), cdlogit, 1e-4);
        }
        dq2.poison(st), dk2.poison(st), dv2.poison(st), scratch.poison(st), shares2.poison(st);
        attention_backward_xsa_cuda(dq2.p, dk2.p, dv2.p, dz.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, alpha_dev.p,
                                    per_head ? shares2.p : nullptr, scratch.p, st);
        check_bits(NAME("%s backward deterministic", tag), same_bits(dq, dq2) && same_bits(dk, dk2) && same_bits(dv, dv2) &&
                                                            (!per_head || same_bits(shares, shares2)));
        if (alpha == 0.0f) {
            dq0.poison(st), dk0.poison(st), dv0.poison(st), scratch.poison(st);
            attention_backward_cuda(dq0.p, dk0.p, dv0.p, dz.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, scratch.p, st);
            check_bits("xsa 0.0 backward == plain backward", same_bits(dq, dq0) && same_bits(dk, dk0) && same_bits(dv, dv0));
        }

        // unfused XSA on fresh y, v, dz; dv starts from small random values (the op accumulates)
        Buf<floatX> uy(nq), uv(nkv), udz(nq), udy(nq), udv(nkv), uz(nq), udv2(nkv);
        std::vector<float> huy = random_bf16(uy, 1.0f, rng), huv = random_bf16(uv, 1.0f, rng);
        std::vector<float> hudz = random_bf16(udz, 1.0f, rng), hudv = random_bf16(udv, 0.1f, rng);
        std::vector<float> cuz(nq), cudy(nq), cudv = hudv;
        xsa_forward_cpu(cuz.data(), huy.data(), huv.data(), (size_t)Hkv * D, tokens, H, Hkv, D, halpha.data());
        xsa_backward_cpu(cudy.data(), cudv.data(), per_head ? cshares.data() : nullptr, hudz.data(), huy.data(), huv.data(), (size_t)Hkv * D, tokens, H,
                         Hkv, D, halpha.data());
        uz.poison(st);
        xsa_forward_cuda(uz.p, uy.p, uv.p, (size_t)Hkv * D, tokens, H, Hkv, D, alpha_dev.p, st);
        check_close(NAME("%s unfused forward z", tag), download(uz), cuz, 1e-2, D);
        udy.poison(st), shares.poison(st);
        xsa_backward_cuda(udy.p, udv.p, (size_t)Hkv * D, dalpha, udz.p, uy.p, uv.p, (size_t)Hkv * D, tokens, H, Hkv, D, alpha_dev.p, st);
        check_close(NAME("%s unfused backward dy", tag), download(udy), cudy, 1e-2, D);
        check_close(NAME("%s unfused backward dv (+=)", tag), download(udv), cudv, 1e-2, D);
        if (per_head) check_close("xsa per-head unfused backward dL/dalpha shares", download(shares), cshares, 1e-4, H);
        // in place (dy aliasing dz), dv from the same start: the same bits
        upload(udv2, hudv);
        xsa_backward_cuda(udz.p, udv2.p, (size_t)Hkv * D, per_head ? shares2.p : nullptr, udz.p, uy.p, uv.p, (size_t)Hkv * D, tokens, H, Hkv, D, alpha_dev.p, st);
        check_bits(NAME("%s unfused backward in place (dy = dz)", tag), same_bits(udz, udy) && same_bits(udv2, udv) &&
                                                                       (!per_head || same_bits(shares, shares2)));
    }

    // the diagnostics on the fused forward's y, z, lse (alpha 0.5) against the CPU twin on the same values:
    // the same bf16 inputs, fp32 sums against double, so only the summation order differs
    Buf<float> alpha_half(H), alpha_one(H);
    cudaCheck(cudaMemcpy(alpha_half.p, std::vector<float>(H, 0.5f).data(), H * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(alpha_one.p, std::vector<float>(H, 1.0f).data(), H * sizeof(float), cudaMemcpyHostToDevice));
    {
        attention_forward_xsa_cuda(z.p, y.p, lse.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, alpha_half.p, st);
        Buf<float> diag(tokens * 3), diag2(tokens * 3);
        std::vector<float> cdiag(tokens * 3);
        const std::vector<float> gz = download(z), gy05 = download(y), glse05 = download(lse);
        xsa_diagnostics_cpu(cdiag.data(), gy05.data(), gz.data(), hv.data(), hq.data(), hk.data(), sep, glse05.data(), B, T, H, Hkv, D);
        diag.poison(st);
        xsa_diagnostics_cuda(diag.p, y.p, z.p, v.p, q.p, k.p, sep, lse.p, B, T, H, Hkv, D, st);
        check_close("diagnostics (cos yv, cos zv, self weight)", download(diag), cdiag, 1e-4, 3);
        diag2.poison(st);
        xsa_diagnostics_cuda(diag2.p, y.p, z.p, v.p, q.p, k.p, sep, lse.p, B, T, H, Hkv, D, st);
        check_bits("diagnostics deterministic", same_bits(diag, diag2));
        // the value direction sums: per (row, kv head), sum of unit values and their count
        Buf<float> vsum((size_t)B * Hkv * (D + 1));
        std::vector<float> cvsum(vsum.n);
        value_direction_sums_cpu(cvsum.data(), hv.data(), (size_t)Hkv * D, B, T, Hkv, D);
        vsum.poison(st);
        value_direction_sums_cuda(vsum.p, v.p, (size_t)Hkv * D, B, T, Hkv, D, st);
        check_close("value direction sums", download(vsum), cvsum, 1e-4, D + 1);
    }

    // the fused forward + backward captured in a CUDA graph (no host sync, no allocation inside) replays
    // to the bits of the direct calls (the last alpha, 1: z, y, lse and dq, dk, dv of the last direct run);
    // not under XSA_CUDA_SYNC, which synchronises after every launch (a capture cannot)
    if (cuda_sync_debug()) {
        printf("skip graph replay == direct calls (XSA_CUDA_SYNC: no capture)\n");
    } else {
        Buf<floatX> dz(nq);
        random_bf16(dz, 1.0f, rng);
        attention_forward_xsa_cuda(z.p, y.p, lse.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, alpha_one.p, st);
        attention_backward_xsa_cuda(dq.p, dk.p, dv.p, dz.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, alpha_one.p, nullptr, scratch.p, st);
        z2.poison(st), y2.poison(st), lse2.poison(st), dq2.poison(st), dk2.poison(st), dv2.poison(st), scratch.poison(st);
        cudaCheck(cudaStreamSynchronize(st));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        cudaCheck(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        attention_forward_xsa_cuda(z2.p, y2.p, lse2.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, alpha_one.p, st);
        attention_backward_xsa_cuda(dq2.p, dk2.p, dv2.p, dz.p, q.p, k.p, v.p, sep, y2.p, lse2.p, B, T, H, Hkv, D, W, alpha_one.p, nullptr, scratch.p, st);
        cudaCheck(cudaStreamEndCapture(st, &graph));
        cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
        cudaCheck(cudaGraphLaunch(exec, st));
        cudaCheck(cudaStreamSynchronize(st));
        check_bits("graph replay == direct calls", same_bits(z, z2) && same_bits(y, y2) && same_bits(lse, lse2) &&
                                                       same_bits(dq, dq2) && same_bits(dk, dk2) && same_bits(dv, dv2));
        cudaCheck(cudaGraphExecDestroy(exec));
        cudaCheck(cudaGraphDestroy(graph));
    }
    cudaCheck(cudaStreamSynchronize(st));
#undef NAME
}

// Generation's attention (attention_decode_cuda): one query per row at position pos[b] over a KV cache of
// S = T positions, against attention_decode_cpu. Three rows, at positions T - 1, 0 and a random one; the
// cache entries a row must not read (after pos[b], and before its window) hold NaN, so reading one fails.
static void check_decode(const Shape& s, Rng* rng, cudaStream_t st) {
    const int B = 3, S = s.T, H = s.H, Hkv = s.Hkv, D = s.D, W = s.window;
    const size_t nq = (size_t)B * H * D, nkv = (size_t)B * S * Hkv * D;
    Buf<floatX> q(nq), kc(nkv), vc(nkv), y(nq);
    Buf<int> pos(B);
    std::vector<float> hq = random_bf16(q, s.qstd, rng), hk = random_bf16(kc, 1.5f, rng), hv = random_bf16(vc, 1.0f, rng);
    const std::vector<int> hpos = {S - 1, 0, (int)(rng_next_u64(rng) % S)};
    for (int b = 0; b < B; b++)
        for (int j = 0; j < S; j++)
            if (j > hpos[b] || j < hpos[b] - W)
                for (size_t e = ((size_t)b * S + j) * Hkv * D; e < ((size_t)b * S + j + 1) * Hkv * D; e++) hk[e] = hv[e] = NAN;
    upload(kc, hk);
    upload(vc, hv);
    cudaCheck(cudaMemcpy(pos.p, hpos.data(), B * sizeof(int), cudaMemcpyHostToDevice));
    std::vector<float> want(nq);
    attention_decode_cpu(want.data(), hq.data(), (size_t)H * D, hk.data(), hv.data(), hpos.data(), B, S, H, Hkv, D, W);
    y.poison(st);
    attention_decode_cuda(y.p, q.p, (size_t)H * D, kc.p, vc.p, pos.p, B, S, H, Hkv, D, W, st);
    cudaCheck(cudaStreamSynchronize(st));
    char name[96];
    snprintf(name, sizeof name, "decode y (positions %d, %d, %d)", hpos[0], hpos[1], hpos[2]);
    check_close(name, download(y), want, 1e-2, D);
}

// The real shapes (T 2048, a short and a full window, head_dim 64 and 128, B 2), where the CPU twins would
// take minutes: the fused XSA forward and backward (alphas that differ per head, as -x learn's) on the GPU,
// then a double-precision reference of the sampled rows only, from the same bf16 inputs and the GPU's own
// y and lse (as the backward uses them): query rows (y, lse, z, dq, the dL/dalpha shares) and key rows
// (dk, dv: every query of the window that sees the key, summed over the kv head's query heads).
static void check_real_shape(const Shape& s, Rng* rng, cudaStream_t st) {
    const int B = s.B, T = s.T, H = s.H, Hkv = s.Hkv, D = s.D, W = std::min(s.window, s.T), group = H / Hkv;
    const QKVStrides sep = qkv_separate(H, Hkv, D);  // q, k, v in three buffers
    const size_t tokens = (size_t)B * T, nq = tokens * H * D, nkv = tokens * Hkv * D, nl = (size_t)B * H * T;
    printf("-- real shape, sampled rows: B %d T %d H %d Hkv %d D %d window %d\n", B, T, H, Hkv, D, W);
    char name[128];
    Buf<floatX> q(nq), k(nkv), v(nkv), y(nq), z(nq), dz(nq), dq(nq), dk(nkv), dv(nkv);
    Buf<float> lse(nl), alpha(H), shares(tokens * H), scratch(attention_backward_scratch_floats(B, T, H, Hkv, D, true));
    const std::vector<float> hq = random_bf16(q, s.qstd, rng), hk = random_bf16(k, 1.5f, rng), hv = random_bf16(v, 1.0f, rng);
    const std::vector<float> hdz = random_bf16(dz, 1.0f, rng);
    std::vector<float> halpha(H);
    for (int h = 0; h < H; h++) halpha[h] = tanhf(-0.8f + 2.0f * h / std::max(H - 1, 1));
    cudaCheck(cudaMemcpy(alpha.p, halpha.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    y.poison(st), z.poison(st), lse.poison(st), dq.poison(st), dk.poison(st), dv.poison(st), shares.poison(st);
    attention_forward_xsa_cuda(z.p, y.p, lse.p, q.p, k.p, v.p, sep, B, T, H, Hkv, D, W, alpha.p, st);
    attention_backward_xsa_cuda(dq.p, dk.p, dv.p, dz.p, q.p, k.p, v.p, sep, y.p, lse.p, B, T, H, Hkv, D, W, alpha.p, shares.p, scratch.p, st);
    const std::vector<float> gy = download(y), gz = download(z), glse = download(lse), gdq = download(dq), gdk = download(dk), gdv = download(dv);
    const std::vector<float> gshares = download(shares);
    const double scale = 1.0 / sqrt((double)D);
    auto at = [&](const std::vector<float>& t, int b, int i, int heads, int h) { return &t[(((size_t)b * T + i) * heads + h) * D]; };
    auto dot = [&](const float* a, const float* b) { double d = 0.0; for (int c = 0; c < D; c++) d += (double)a[c] * b[c]; return d; };
    // per (b, i, h): dy = dz - alpha (u / n) v from the GPU's y (the backward's first step), delta = dy . y,
    // and the self-position dv term; computed on demand for the queries a sampled row needs
    auto dy_of = [&](int b, int i, int h, std::vector<double>& dy) {
        const float* vi = at(hv, b, i, Hkv, h / group);
        const float* g = at(hdz, b, i, H, h);
        const double un = dot(g, vi) / (dot(vi, vi) + XSA_EPS);
        dy.resize(D);
        for (int c = 0; c < D; c++) dy[c] = g[c] - halpha[h] * un * vi[c];
    };
    auto weight = [&](int b, int i, int j, int h) {  // softmax weight of key j for query i, from the GPU's lse
        return exp(dot(at(hq, b, i, H, h), at(hk, b, j, Hkv, h / group)) * scale - glse[((size_t)b * H + h) * T + i]);
    };
    // sampled positions: the edges (0, the window, the last) and random ones
    std::vector<int> pos = {0, 1, W - 1 >= 0 ? W - 1 : 0, std::min(W, T - 1), std::min(W + 1, T - 1), T - 1};
    while (pos.size() < 24) pos.push_back((int)(rng_next_u64(rng) % (uint64_t)T));
    std::vector<float> ry, cy, rz, cz, rlse, clse, rdq, cdq, rsh, csh, rdk, cdk, rdv, cdv;
    std::vector<double> dy;
    for (size_t n = 0; n < pos.size(); n++) {
        const int b = (int)(n % B), i = pos[n], h = (int)(rng_next_u64(rng) % (uint64_t)H), g = h / group;
        // query row (b, i, h): y, lse, z, dq, the dL/dalpha share
        const int j0 = std::max(0, i - W);
        double m = -INFINITY, sum = 0.0;
        for (int j = j0; j <= i; j++) m = std::max(m, dot(at(hq, b, i, H, h), at(hk, b, j, Hkv, g)) * scale);
        std::vector<double> yrow(D, 0.0);
        for (int j = j0; j <= i; j++) {
            const double p = exp(dot(at(hq, b, i, H, h), at(hk, b, j, Hkv, g)) * scale - m);
            sum += p;
            for (int c = 0; c < D; c++) yrow[c] += p * at(hv, b, j, Hkv, g)[c];
        }
        rlse.push_back(glse[((size_t)b * H + h) * T + i]), clse.push_back((float)(m + log(sum)));
        const float* gyi = at(gy, b, i, H, h);
        const float* vi = at(hv, b, i, Hkv, g);
        const double nn = dot(vi, vi) + XSA_EPS, coef = halpha[h] * dot(gyi, vi) / nn;
        dy_of(b, i, h, dy);
        const double delta = [&] { double d = 0.0; for (int c = 0; c < D; c++) d += dy[c] * gyi[c]; return d; }();
        std::vector<double> dqrow(D, 0.0);
        for (int j = j0; j <= i; j++) {
            const double ds = weight(b, i, j, h) * ([&] { double d = 0.0; for (int c = 0; c < D; c++) d += dy[c] * at(hv, b, j, Hkv, g)[c]; return d; }() - delta);
            for (int c = 0; c < D; c++) dqrow[c] += ds * scale * at(hk, b, j, Hkv, g)[c];
        }
        for (int c = 0; c < D; c++) {
            ry.push_back(gyi[c]), cy.push_back((float)(yrow[c] / sum));
            rz.push_back(at(gz, b, i, H, h)[c]), cz.push_back((float)(gyi[c] - coef * vi[c]));
            rdq.push_back(at(gdq, b, i, H, h)[c]), cdq.push_back((float)dqrow[c]);
        }
        rsh.push_back(gshares[((size_t)b * T + i) * H + h]), csh.push_back((float)(-dot(gyi, vi) / nn * dot(at(hdz, b, i, H, h), vi)));
        // key row (b, j = i, g): dk and dv over the queries i2 in [j, j + W] of every query head of the group
        const int j = i;
        std::vector<double> dkrow(D, 0.0), dvrow(D, 0.0);
        for (int h2 = g * group; h2 < (g + 1) * group; h2++) {
            for (int i2 = j; i2 <= std::min(T - 1, j + W); i2++) {
                dy_of(b, i2, h2, dy);
                const float* y2 = at(gy, b, i2, H, h2);
                double delta2 = 0.0, dpv = 0.0;
                for (int c = 0; c < D; c++) delta2 += dy[c] * y2[c], dpv += dy[c] * at(hv, b, j, Hkv, g)[c];
                const double p = weight(b, i2, j, h2), ds = p * (dpv - delta2);
                for (int c = 0; c < D; c++) {
                    dkrow[c] += ds * scale * at(hq, b, i2, H, h2)[c];
                    dvrow[c] += p * dy[c];
                }
            }
            // XSA's own term at the key's position: -alpha ((u / n) y + p g - 2 p (u / n) v)
            const float* yj = at(gy, b, j, H, h2);
            const float* gj = at(hdz, b, j, H, h2);
            const float* vj = at(hv, b, j, Hkv, g);
            const double n2 = dot(vj, vj) + XSA_EPS, un = dot(gj, vj) / n2, p = dot(yj, vj) / n2;
            for (int c = 0; c < D; c++) dvrow[c] += -halpha[h2] * (un * yj[c] + p * gj[c] - 2.0 * p * un * vj[c]);
        }
        for (int c = 0; c < D; c++) {
            rdk.push_back(at(gdk, b, j, Hkv, g)[c]), cdk.push_back((float)dkrow[c]);
            rdv.push_back(at(gdv, b, j, Hkv, g)[c]), cdv.push_back((float)dvrow[c]);
        }
    }
    snprintf(name, sizeof name, "T %d w %d D %d: y (sampled rows)", T, W, D);
    check_close(name, ry, cy, 1e-2, D);
    snprintf(name, sizeof name, "T %d w %d D %d: lse", T, W, D);
    check_close(name, rlse, clse, 1e-4);
    snprintf(name, sizeof name, "T %d w %d D %d: z (per-head alpha)", T, W, D);
    check_close(name, rz, cz, 1e-2, D);
    snprintf(name, sizeof name, "T %d w %d D %d: dq", T, W, D);
    check_close(name, rdq, cdq, 1e-2, D);
    snprintf(name, sizeof name, "T %d w %d D %d: dk", T, W, D);
    check_close(name, rdk, cdk, 1e-2, D);
    snprintf(name, sizeof name, "T %d w %d D %d: dv", T, W, D);
    check_close(name, rdv, cdv, 1e-2, D);
    snprintf(name, sizeof name, "T %d w %d D %d: dL/dalpha shares", T, W, D);
    check_close(name, rsh, csh, 1e-4);
}

// ---- timing ----

struct Row {
    char shape[64], op[48];
    double ms, rate;
    const char* unit;
    int head_dim, weight;             // the shape's head_dim; its layers in the SSSL pattern: 3 short-window, 1 long
    int fwd_variant, bwd_variant;     // the kernel variant the row times, or -1
};

// median time (ms) of `reps` runs of fn, each after a write of 256 MB that evicts the L2
template <typename F>
static double time_median(F fn, Buf<unsigned char>& flush, cudaStream_t st, int reps = 21) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++) fn();  // warm-up (module load, shared-memory attributes)
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaMemsetAsync(flush.p, i & 0xFF, flush.bytes(), st));
        cudaCheck(cudaEventRecord(start, st));
        fn();
        cudaCheck(cudaEventRecord(stop, st));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

static void time_shape(const Shape& s, Rng* rng, cudaStream_t st, Buf<unsigned char>& flush, std::vector<Row>& rows) {
    const int B = s.B, T = s.T, H = s.H, Hkv = s.Hkv, D = s.D, W = s.window;
    const size_t tokens = (size_t)B * T, nq = tokens * H * D, nkv = tokens * Hkv * D, nl = (size_t)B * H * T;
    // the model's layout: q | k | v of a token in one row of qkv, and so their gradients (qkv_fused)
    const QKVStrides at = qkv_fused(H, Hkv, D);
    Buf<floatX> qkv(tokens * at.q), dqkv(tokens * at.q), dz(nq), y(nq), z(nq), dy(nq);
    Buf<float> lse(nl), scratch(attention_backward_scratch_floats(B, T, H, Hkv, D, true));
    random_bf16(qkv, 1.5f, rng), random_bf16(dz, 1.0f, rng);
    const floatX *q = qkv.p, *k = qkv.p + H * D, *v = qkv.p + (H + Hkv) * D;
    floatX *dq = dqkv.p, *dk = dqkv.p + H * D, *dv = dqkv.p + (H + Hkv) * D;
    double pairs = 0.0;  // (query, key) pairs inside the causal window, per (b, h)
    for (int i = 0; i < T; i++) pairs += std::min(W + 1, i + 1);
    const double fwd_flop = 4.0 * D * pairs * B * H, bwd_flop = 10.0 * D * pairs * B * H;
    const double xsa_fwd_bytes = 2.0 * (2.0 * nq + nkv), xsa_bwd_bytes = 2.0 * (3.0 * nq + 3.0 * nkv);
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d H%d/%d D%d w%d", B, T, H, Hkv, D, W);

    Buf<float> alpha(H);
    cudaCheck(cudaMemcpy(alpha.p, std::vector<float>(H, 0.5f).data(), H * sizeof(float), cudaMemcpyHostToDevice));
    attention_forward_xsa_cuda(z.p, y.p, lse.p, q, k, v, at, B, T, H, Hkv, D, W, alpha.p, st);  // y, lse for the backward
    auto add = [&](const char* op, double ms, double amount, bool flop, int fwd_variant = -1, int bwd_variant = -1) {
        Row r;
        snprintf(r.shape, sizeof r.shape, "%s", shape);
        snprintf(r.op, sizeof r.op, "%s", op);
        r.ms = ms;
        r.rate = amount / (ms * 1e-3) / (flop ? 1e12 : 1e9);
        r.unit = flop ? "TFLOP/s" : "GB/s";
        r.head_dim = D, r.weight = W < T ? 3 : 1, r.fwd_variant = fwd_variant, r.bwd_variant = bwd_variant;
        rows.push_back(r);
    };
    add("forward", time_median([&] { attention_forward_cuda(y.p, lse.p, q, k, v, at, B, T, H, Hkv, D, W, st); }, flush, st), fwd_flop, true);
    for (int vi = 0; vi < ATTN_FWD_VARIANTS; vi++) {  // each forward variant: the fastest goes into ATTN_FWD_CHOICES
        const AttentionForwardVariant var = (AttentionForwardVariant)vi;
        if (!attention_forward_available(D, var)) continue;
        char op[48];
        snprintf(op, sizeof op, "fwd xsa %s", ATTN_FWD_NAMES[vi]);
        add(op, time_median([&] { attention_forward_xsa_cuda(z.p, y.p, lse.p, q, k, v, at, B, T, H, Hkv, D, W, alpha.p, st, var); }, flush, st),
            fwd_flop, true, vi);
    }
    add("forward xsa", time_median([&] { attention_forward_xsa_cuda(z.p, y.p, lse.p, q, k, v, at, B, T, H, Hkv, D, W, alpha.p, st); }, flush, st), fwd_flop, true);
    add("backward", time_median([&] { attention_backward_cuda(dq, dk, dv, dz.p, q, k, v, at, y.p, lse.p, B, T, H, Hkv, D, W, scratch.p, st); }, flush, st), bwd_flop, true);
    for (int vi = 0; vi < ATTN_BWD_VARIANTS; vi++) {  // each backward variant: the fastest goes into ATTN_BWD_CHOICES
        const AttentionBackwardVariant var = (AttentionBackwardVariant)vi;
        if (!attention_backward_available(D, var)) continue;
        char op[48];
        snprintf(op, sizeof op, "bwd xsa %s", ATTN_BWD_NAMES[vi]);
        add(op, time_median([&] { attention_backward_xsa_cuda(dq, dk, dv, dz.p, q, k, v, at, y.p, lse.p, B, T, H, Hkv, D, W, alpha.p, nullptr, scratch.p, st, var); }, flush, st),
            bwd_flop, true, -1, vi);
    }
    add("backward xsa", time_median([&] { attention_backward_xsa_cuda(dq, dk, dv, dz.p, q, k, v, at, y.p, lse.p, B, T, H, Hkv, D, W, alpha.p, nullptr, scratch.p, st); }, flush, st), bwd_flop, true);
    add("xsa unfused fwd", time_median([&] { xsa_forward_cuda(z.p, y.p, v, at.kv, tokens, H, Hkv, D, alpha.p, st); }, flush, st), xsa_fwd_bytes, false);
    add("xsa unfused bwd", time_median([&] { xsa_backward_cuda(dy.p, dv, at.kv, nullptr, dz.p, y.p, v, at.kv, tokens, H, Hkv, D, alpha.p, st); }, flush, st), xsa_bwd_bytes, false);
}

int main(int argc, char** argv) {
    bool timing = true, small = false, only_d128 = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-timing")) timing = false;
        else if (!strcmp(argv[i], "--quiet")) g_quiet_pass = true;  // print failures only
        else if (!strcmp(argv[i], "--small")) small = true;         // the first two shapes only (for the sanitizers)
        else if (!strcmp(argv[i], "--head-dim-128")) only_d128 = true;  // the first shape at D 128 only (the emulator's device profiles)
        else fail("usage: %s [--no-timing] [--quiet] [--small | --head-dim-128]", argv[0]);
    }
    cuda_context_init();
    printf("attention_check on %s (%d SMs)\n", g_cuda.name, g_cuda.sm_count);
    cudaStream_t st;
    cudaCheck(cudaStreamCreate(&st));
    Rng rng = {20260610ull};

    const Shape shapes[] = {
        {2, 100, 4, 2, 64, 100},       // full window, T < 2 tiles and not a multiple of 64, GQA 2:1
        {2, 200, 4, 2, 64, 37},        // window < tile, tiles outside the window skipped
        {2, 200, 4, 2, 64, 65, 0.1f},  // window = 1 mod 64 (and 32): every tile-range bound is exact;
                                       // flat softmax, so the boundary keys carry weight
        {2, 130, 2, 2, 128, 130},      // D 128, full
        {2, 257, 4, 2, 128, 70},       // D 128, window, one row in the last tile
        {2, 200, 2, 1, 128, 65, 0.1f}, // D 128, tile-range bounds, GQA 2:1
        {1, 300, 2, 1, 64, 0},         // window 0: every token sees only itself (GQA 2:1)
        {1, 512, 2, 1, 64, 128},       // T and window multiples of the tile
    };
    for (const Shape& s : shapes) {
        if ((small && &s > &shapes[1]) || (only_d128 && &s != &shapes[3])) continue;
        check_shape(s, &rng, st);
        check_decode(s, &rng, st);
    }
    const Shape real[] = {
        {2, 2048, 16, 16, 64, 512}, {2, 2048, 16, 16, 64, 2048},    // d24: a short-window and a long-window layer
        {2, 2048, 12, 12, 128, 512}, {2, 2048, 12, 12, 128, 2048},  // nanochat's head_dim 128
    };
    if (!small && !only_d128)
        for (const Shape& s : real) check_real_shape(s, &rng, st);

    std::vector<Row> rows;
    if (timing) {
        Buf<unsigned char> flush((size_t)256 << 20);
        const Shape timed[] = {  // the training batch, 32 rows: K/V of all heads far exceed the 50-60 MB L2
            {32, 2048, 16, 16, 64, 2048},  // d24 (dim 1024, 16 heads of 64), long-window layer
            {32, 2048, 16, 16, 64, 512},   // d24 short-window layer (T / 4)
            {32, 2048, 12, 12, 128, 2048}, // nanochat's d24 shape (1536 / 12 heads of 128)
        };
        for (const Shape& s : timed) time_shape(s, &rng, st, flush, rows);
    }
    cudaCheck(cudaStreamDestroy(st));

    printf("\n%-28s %-36s %10s %12s\n", "shape", "op", "ms", "rate");
    for (const Row& r : rows) printf("%-28s %-36s %10.3f %8.1f %s\n", r.shape, r.op, r.ms, r.rate, r.unit);
    // the rows of ATTN_FWD_CHOICES and ATTN_BWD_CHOICES these timings call for: per head_dim, the variant of least
    // time over the timed shapes, a short-window shape counted 3 times (the SSSL pattern's layers)
    for (int D : {64, 128}) {
        auto fastest = [&](bool forward, const char* const* names, int variants) {
            std::vector<double> ms(variants, 0.0);
            std::vector<int> shapes(variants, 0);
            int most = 0;
            for (const Row& r : rows) {
                const int v = forward ? r.fwd_variant : r.bwd_variant;
                if (r.head_dim != D || v < 0) continue;
                ms[v] += r.weight * r.ms, shapes[v]++;
                most = std::max(most, shapes[v]);
            }
            int best = -1;
            for (int v = 0; v < variants; v++)
                if (shapes[v] == most && most > 0 && (best < 0 || ms[v] < ms[best])) best = v;
            if (best >= 0)
                printf("fastest at head_dim %d: %s variant %d (%s), %.3f ms weighted, against %.3f for variant 0\n", D,
                       forward ? "forward" : "backward", best, names[best], ms[best], ms[0]);
        };
        fastest(true, ATTN_FWD_NAMES, ATTN_FWD_VARIANTS);
        fastest(false, ATTN_BWD_NAMES, ATTN_BWD_VARIANTS);
    }
    printf("%s: %d failed checks\n", g_failures ? "FAIL" : "PASS", g_failures);
    return g_failures ? 1 : 0;
}
