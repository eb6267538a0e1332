"""
PyTorch's kernels at the shapes of dev/bench/bench_cpu_kernels.cpp, with the same arguments and the same
tables, so that dev/bench/cpu_vs_torch.sh prints the two side by side:
    python dev/bench/bench_torch_kernels.py DIM HEADS HEAD_DIM SEQ_LEN VOCAB BATCH SHORT_WINDOW [ITERS]
  * Linear layers: forward x @ W^T (F.linear), backward dx = dy @ W and dW = dy^T @ x (what autograd runs);
  * attention: F.scaled_dot_product_attention forward, and forward + backward through autograd (the
    backward's time is the difference), causal or with the window's boolean mask; GFLOP/s on the visible
    pairs, as ours;
  * the softcapped cross-entropy: 15 tanh(x / 15), then F.cross_entropy, forward and backward.
Threads: torch.set_num_threads(OMP_NUM_THREADS, default 1). Medians of ITERS (default 5) after one warm-up.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import require_torch  # noqa: F401,E402  (one error line where PyTorch is missing)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from model import window_mask  # noqa: E402


def time_ms(iters, fn):
    ms = []
    for it in range(iters + 1):
        t0 = time.perf_counter()
        fn()
        if it > 0:
            ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    if len(sys.argv) not in (8, 9):
        sys.exit(f"usage: {sys.argv[0]} DIM HEADS HEAD_DIM SEQ_LEN VOCAB BATCH SHORT_WINDOW [ITERS]")
    C, H, D, T, V, B, short_window = (int(x) for x in sys.argv[1:8])
    iters = int(sys.argv[8]) if len(sys.argv) == 9 else 5
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_grad_enabled(False)
    M = B * T
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'linear':20s} {'M':>6s} {'K':>6s} {'N':>6s} {'fwd GFLOP/s':>12s} {'bwd GFLOP/s':>12s}")
    for name, K, N in (("q (k, v: Hkv x D)", C, H * D), ("attention out", H * D, C), ("mlp fc", C, 4 * C),
                       ("mlp proj", 4 * C, C), ("lm_head", C, V)):
        x, w, dy = torch.randn(M, K), torch.randn(N, K) * 0.02, torch.randn(M, N)
        flops = 2.0 * M * K * N
        fwd = time_ms(iters, lambda: F.linear(x, w))
        bwd = time_ms(iters, lambda: (dy @ w, dy.t() @ x))
        print(f"{name:20s} {M:6d} {K:6d} {N:6d} {flops / fwd / 1e6:12.1f} {2 * flops / bwd / 1e6:12.1f}")

    print(f"{'attention (B, T, H, D)':28s} {'fwd GFLOP/s':>12s} {'bwd GFLOP/s':>12s}")
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    q *= 2.0
    dy = torch.randn(B, H, T, D)
    for window in (short_window, T):
        pairs = sum(min(i, window) + 1 for i in range(T))
        fwd_flops = 4.0 * D * pairs * B * H
        mask = {} if window >= T - 1 else dict(attn_mask=window_mask(T, window))
        causal = dict(is_causal=True) if not mask else {}

        def forward():
            return F.scaled_dot_product_attention(q, k, v, **mask, **causal)

        def forward_backward():
            with torch.enable_grad():
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                y = F.scaled_dot_product_attention(qg, kg, vg, **mask, **causal)
                y.backward(dy)

        fwd = time_ms(iters, forward)
        fwd_bwd = time_ms(iters, forward_backward)
        print(f"{'sdpa, window ' + str(window):28s} {fwd_flops / fwd / 1e6:12.1f} {2.5 * fwd_flops / (fwd_bwd - fwd) / 1e6:12.1f}")

    logits, targets = torch.randn(M, V) * 3.0, torch.randint(0, V, (M,))

    def loss_forward():
        return F.cross_entropy(15.0 * torch.tanh(logits / 15.0), targets)

    def loss_forward_backward():
        with torch.enable_grad():
            x = logits.detach().requires_grad_()
            F.cross_entropy(15.0 * torch.tanh(x / 15.0), targets).backward()

    fwd = time_ms(iters, loss_forward)
    fwd_bwd = time_ms(iters, loss_forward_backward)
    print(f"softcap cross-entropy ({M} x {V} logits): forward {fwd * 1e6 / (M * V):.2f} ns/logit, "
          f"backward {(fwd_bwd - fwd) * 1e6 / (M * V):.2f} ns/logit")


if __name__ == "__main__":
    main()
