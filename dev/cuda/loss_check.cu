// loss_check.cu: the fused softcap + cross-entropy kernels of loss.cuh against their CPU twins.
// Build and run (from the repository root, on a GPU machine):
//   nvcc -arch=sm_90 -O3 -std=c++17 -Xcompiler -Wall,-Wextra,-fopenmp,-march=native,-Wno-unused-function -Werror all-warnings -I. dev/cuda/loss_check.cu -o /tmp/loss_check -lgomp && /tmp/loss_check
//
// Per (N, V), V up to 65536 and odd (rows then start at every alignment): random raw bf16 logits, some
// beyond the cap; every 7th target IGNORE_INDEX (loss 0, gradient row 0); losses poisoned with NaN first.
//   forward:  losses vs the CPU twin on the same bf16 raw values (both fp32 math: tight tolerance), the
//             capped logits (bf16 vs fp32: bf16 tolerance);
//   scale:    loss_mean_scale (grad_scale / targets not ignored) equal to the CPU twin's, bit for bit;
//   backward: on the GPU's capped logits, vs the CPU twin run on the same (bf16) capped values;
//   softcap:  the inference kernel, aligned and at an odd offset.
// Determinism: two runs from the same input, identical bits. Time: median, L2 flushed, as GB/s of the
// minimum traffic (the forward and the backward each read and write the logits once).
#include "llmc/loss.cuh"
#include "dev/cuda/check_util.cuh"

static void check_loss(int N, int V, int repeats, Rng* rng) {
    const size_t n = (size_t)N * V;
    const float cap = 15.0f, grad_scale = 0.5f;
    floatX* logits = dev_alloc<floatX>(n);
    floatX* backup = dev_alloc<floatX>(n);
    float* losses = dev_alloc<float>(N);
    int* targets = dev_alloc<int>(N);
    float* scale = dev_alloc<float>(1);
    fill_random(backup, n, -40.0f, 40.0f);  // raw logits, many beyond the cap of 15
    std::vector<int> h_targets(N);
    for (int i = 0; i < N; i++) h_targets[i] = i % 7 == 3 ? IGNORE_INDEX : std::min(V - 1, (int)(rng_uniform(rng) * (float)V));
    cudaCheck(cudaMemcpy(targets, h_targets.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    const std::vector<float> raw = download_bf16(backup, n);
    char name[96];

    // forward
    std::vector<unsigned char> bits[2], loss_bits[2];
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(logits, backup, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
        cudaCheck(cudaMemset(losses, 0xff, N * sizeof(float)));  // NaN
        softcap_crossentropy_forward_cuda(losses, logits, targets, N, V, cap, 0);
        cudaCheck(cudaDeviceSynchronize());
        bits[run] = download_bytes(logits, n);
        loss_bits[run] = download_bytes(losses, N);
    }
    bool det = bits[0] == bits[1] && loss_bits[0] == loss_bits[1];
    std::vector<float> ref_logits = raw, ref_losses(N);
    softcap_crossentropy_forward_cpu(ref_losses.data(), ref_logits.data(), h_targets.data(), N, V, cap);
    const std::vector<float> h_losses = download_f32(losses, N), capped = download_bf16(logits, n);
    double ms = time_ms([&] { cudaCheck(cudaMemcpy(logits, backup, n * sizeof(floatX), cudaMemcpyDeviceToDevice)); },
                        [&] { softcap_crossentropy_forward_cuda(losses, logits, targets, N, V, cap, 0); }, repeats);
    const double gb = 2.0 * n * sizeof(floatX) * 1e-9;
    snprintf(name, sizeof name, "fwd loss N=%d V=%d", N, V);
    record(name, rel_err(h_losses.data(), ref_losses.data(), N), 1e-5, det, ms, gb / ms * 1e3, "GB/s");
    snprintf(name, sizeof name, "fwd capped logits N=%d V=%d", N, V);
    record(name, all_finite(capped) ? rel_err(capped.data(), ref_logits.data(), n) : NAN, 1e-2, det, ms, gb / ms * 1e3, "GB/s");

    // the mean's scale
    float ref_scale, h_scale;
    loss_mean_scale_cpu(&ref_scale, h_targets.data(), N, grad_scale);
    loss_mean_scale_cuda(scale, targets, N, grad_scale, 0);
    cudaCheck(cudaMemcpy(&h_scale, scale, sizeof(float), cudaMemcpyDeviceToHost));
    snprintf(name, sizeof name, "loss mean scale N=%d", N);
    record(name, h_scale == ref_scale ? 0.0 : 1.0, 0.0, true, NAN, NAN, "");

    // backward, from the GPU's capped logits (kept in `backup` for the reruns)
    cudaCheck(cudaMemcpy(backup, logits, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
    for (int run = 0; run < 2; run++) {
        cudaCheck(cudaMemcpy(logits, backup, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
        softcap_crossentropy_backward_cuda(logits, targets, N, V, cap, scale, 0);
        cudaCheck(cudaDeviceSynchronize());
        bits[run] = download_bytes(logits, n);
    }
    det = bits[0] == bits[1];
    std::vector<float> ref_grad = capped;
    softcap_crossentropy_backward_cpu(ref_grad.data(), h_targets.data(), N, V, cap, &ref_scale);
    const std::vector<float> grad = download_bf16(logits, n);
    ms = time_ms([&] { cudaCheck(cudaMemcpy(logits, backup, n * sizeof(floatX), cudaMemcpyDeviceToDevice)); },
                 [&] { softcap_crossentropy_backward_cuda(logits, targets, N, V, cap, scale, 0); }, repeats);
    snprintf(name, sizeof name, "bwd N=%d V=%d", N, V);
    record(name, all_finite(grad) ? rel_err(grad.data(), ref_grad.data(), n) : NAN, 1e-2, det, ms, gb / ms * 1e3, "GB/s");

    // softcap (inference): whole buffer (aligned), then from an odd offset (unaligned path)
    fill_random(backup, n, -40.0f, 40.0f);
    const std::vector<float> raw2 = download_bf16(backup, n);
    for (int offset = 0; offset < 2 && (size_t)offset < n; offset++) {
        const size_t m = n - offset;
        for (int run = 0; run < 2; run++) {
            cudaCheck(cudaMemcpy(logits, backup, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
            softcap_cuda(logits + offset, m, cap, 0);
            cudaCheck(cudaDeviceSynchronize());
            bits[run] = download_bytes(logits, n);
        }
        det = bits[0] == bits[1];
        std::vector<float> ref(m);
        for (size_t i = 0; i < m; i++) ref[i] = cap * tanhf(raw2[offset + i] / cap);
        const std::vector<float> out = download_bf16(logits + offset, m);
        ms = time_ms([&] { cudaCheck(cudaMemcpy(logits, backup, n * sizeof(floatX), cudaMemcpyDeviceToDevice)); },
                     [&] { softcap_cuda(logits + offset, m, cap, 0); }, repeats);
        snprintf(name, sizeof name, "softcap n=%zu%s", m, offset ? " (offset 1)" : "");
        record(name, all_finite(out) ? rel_err(out.data(), ref.data(), m) : NAN, 1e-2, det, ms,
               2.0 * m * sizeof(floatX) * 1e-9 / ms * 1e3, "GB/s");
    }
    for (void* p : {(void*)logits, (void*)backup, (void*)losses, (void*)targets, (void*)scale}) cudaCheck(cudaFree(p));
}

int main(int argc, char** argv) {
    int repeats = 20;
    if (argc > 1) repeats = parse_int32("repeats", argv[1]);
    check_init();
    Rng rng = {7};
    // (N, V): nanochat's vocabulary, the largest supported, GPT-2's odd one, tiny and odd ones
    const int shapes[][2] = {{8192, 32768}, {2048, 65536}, {2048, 50257}, {333, 1001}, {64, 7}, {16, 1}};
    for (const auto& s : shapes) check_loss(s[0], s[1], repeats, &rng);
    return print_table();
}
