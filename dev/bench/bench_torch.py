"""
PyTorch (CPU, float32) timing of forward + backward of the reference model (dev/reference/model.py),
to compare with the CPU backend on the same model, threads and batch:
    /usr/bin/python3 dev/bench/bench_torch.py --threads 2
--attention sdpa replaces the reference's attention (which materialises the (T, T) scores with an explicit
mask, for clarity) with torch's fused F.scaled_dot_product_attention, as a PyTorch user would write it:
is_causal where the window covers the sequence, else the window's boolean mask. --compile also wraps the
model in torch.compile (the default inductor backend; its compile time is in the warm-up iterations).
Last line: "torch tok/s <float> ms/iter <float>" (median over --iters timed iterations).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import xsa_cli  # noqa: E402
import require_torch  # noqa: F401,E402  (one error line where PyTorch is missing)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import model as reference  # noqa: E402
from model import GPT, Config, random_init  # noqa: E402


def sdpa_attention(q, k, v, w):
    """The reference's attention(q, k, v, w) through F.scaled_dot_product_attention (same contract)."""
    T, H = q.shape[1], q.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, D)
    gqa = dict(enable_gqa=True) if k.shape[2] != H else {}
    if w >= T - 1:
        y = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **gqa)
    else:
        y = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=reference.window_mask(T, w), **gqa)
    return y.transpose(1, 2)


def main():
    ap = xsa_cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--window-pattern", default="L")
    ap.add_argument("--short-window", type=int, default=None, help="default: seq_len")
    ap.add_argument("--value-embeds", type=int, default=1)
    ap.add_argument("--smear", type=int, default=1)
    ap.add_argument("--xsa-alpha", type=float, default=0.0)
    ap.add_argument("--xsa-layers", default="auto",
                    help="'auto' (all layers if alpha != 0, else none), 'all', 'none' or a list like 1,3")
    ap.add_argument("--attention", choices=["reference", "sdpa"], default="reference")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if a.iters < 1 or a.warmup < 0 or a.threads < 1:
        ap.error("need --iters >= 1, --warmup >= 0, --threads >= 1")

    if a.xsa_layers == "auto":
        xsa_layers = list(range(a.layers)) if a.xsa_alpha != 0 else []
    elif a.xsa_layers == "all":
        xsa_layers = list(range(a.layers))
    elif a.xsa_layers == "none":
        xsa_layers = []
    else:
        xsa_layers = [int(s) for s in a.xsa_layers.split(",") if s]

    torch.set_num_threads(a.threads)
    cfg = Config(vocab_size=a.vocab, n_layer=a.layers, n_head=a.heads, n_kv_head=a.kv_heads,
                 head_dim=a.head_dim, n_embd=a.dim, seq_len=a.seq_len, window_pattern=a.window_pattern,
                 short_window=a.seq_len if a.short_window is None else a.short_window,
                 value_embeds=bool(a.value_embeds), smear=bool(a.smear),
                 xsa_alpha=a.xsa_alpha, xsa_layers=xsa_layers)
    model = random_init(GPT(cfg, dtype=torch.float32), a.seed)
    g = torch.Generator().manual_seed(a.seed + 1)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g)
    if a.attention == "sdpa":
        # the same model: the loss on this batch must agree with the reference attention's to fp32 rounding
        with torch.no_grad():
            want = model(idx, targets)[1].item()
            reference.attention = sdpa_attention  # CausalSelfAttention.forward looks it up in the module
            got = model(idx, targets)[1].item()
        if abs(got - want) > 1e-4 * abs(want):
            sys.exit(f"error: loss with F.scaled_dot_product_attention {got:.6f} != reference {want:.6f}")
    step = torch.compile(model) if a.compile else model
    nparams = sum(p.numel() for p in model.parameters())
    print(f"config: {cfg}")
    print(f"params {nparams:,}, threads {torch.get_num_threads()}, torch {torch.__version__}, attention {a.attention}"
          f"{', torch.compile' if a.compile else ''}")

    times = []
    for it in range(a.warmup + a.iters):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        _, loss = step(idx, targets)
        loss.backward()
        dt = time.perf_counter() - t0
        if it >= a.warmup:
            times.append(dt)
    ms = statistics.median(times) * 1e3
    print(f"loss {loss.item():.4f}, iters {a.iters}, ms/iter min {min(times) * 1e3:.2f} "
          f"mean {statistics.mean(times) * 1e3:.2f} median {ms:.2f}")
    print(f"torch tok/s {a.batch * a.seq_len / (ms / 1e3):.1f} ms/iter {ms:.3f}")


if __name__ == "__main__":
    main()
