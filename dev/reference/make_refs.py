"""
Generate the reference files dev/reference/data/<name>.safetensors that the C++ tests compare against.

For each tiny config: random (non-nanochat) float32 weights from a seeded generator, random idx/targets,
then forward + backward in float64 from those exact weights (the "truth"), stored as float32, with the
per-layer attention-similarity diagnostics of that forward (diag.*) and bf16 tolerances (tol_bf16.*).
Deterministic: rerunning produces the same bytes. Run from anywhere (names: only those configs):
    /usr/bin/python3 dev/reference/make_refs.py [NAME ..]
"""
import os
import sys

import require_torch  # noqa: F401  (one error line where PyTorch is missing)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import GPT, Config, bf16_round, random_init, set_bf16_storage, similarity_diagnostics, XSA_EPS  # noqa: E402
import safetensors_io  # noqa: E402

FORMAT = "xsa-ref-1"
BATCH = 2


def _full(**kw):
    base = dict(vocab_size=100, n_layer=4, n_head=4, n_kv_head=4, head_dim=8, n_embd=24, seq_len=16,
                window_pattern="SSSL", short_window=16, value_embeds=True, smear=True)
    base.update(kw)
    return base


def _window(**kw):
    base = _full(n_layer=3, n_head=2, n_kv_head=2, head_dim=8, n_embd=32, seq_len=24,
                 window_pattern="SL", short_window=5)
    base.update(kw)
    return base


# name -> (Config kwargs, seed). Sizes chosen so that every file stays under ~400 KB. L >= 3 everywhere: with
# L = 2 the backout layer L//2 is the last one and backout_lambda's gradient is ~0 (the final norm is scale
# invariant). Seeds picked so that a float32 run of this model is within ~2e-6 (relative norm) of the float64
# truth on every tensor, i.e. no gradient is dominated by cancellation.
CONFIGS = [
    ("plain", dict(vocab_size=100, n_layer=3, n_head=4, n_kv_head=4, head_dim=8, n_embd=32, seq_len=16,
                   window_pattern="L", short_window=16, value_embeds=False, smear=False), 1006),
    ("full", _full(), 1002),
    ("gqa", _full(n_layer=3, n_head=4, n_kv_head=2, head_dim=16), 1005),
    ("window", _window(), 1004),
    ("xsa_all", _full(xsa_alpha=1.0, xsa_layers=[0, 1, 2, 3]), 1007),
    ("xsa_subset", _window(xsa_alpha=0.5, xsa_layers=[1, 2]), 1008),
    ("xsa_gqa_ve", dict(vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=8, n_embd=24, seq_len=20,
                        window_pattern="SSL", short_window=6, value_embeds=True, smear=True,
                        xsa_alpha=1.0, xsa_layers=[0, 1, 2]), 1011),
    # the CUDA attention kernels take head_dim 64 or 128 only: these two are the CUDA suite's (and the CPU
    # suite checks them too). T not a multiple of the kernels' 64-row tiles, windows cutting through tiles.
    ("gpu_xsa_d64", dict(vocab_size=100, n_layer=3, n_head=2, n_kv_head=1, head_dim=64, n_embd=64, seq_len=80,
                         window_pattern="SSL", short_window=32, value_embeds=True, smear=True,
                         xsa_alpha=1.0, xsa_layers=[0, 2]), 1021),
    ("gpu_xsa_d128", dict(vocab_size=100, n_layer=3, n_head=2, n_kv_head=2, head_dim=128, n_embd=64, seq_len=72,
                          window_pattern="SL", short_window=40, value_embeds=False, smear=False,
                          xsa_alpha=0.5, xsa_layers=[0, 1, 2]), 1025),
    # learnable alpha: a different tanh(a_h) per (layer, head) (random_init draws a in [-1, 1]), GQA so that a
    # kv head's dv sums query heads with different alphas, and a layer without XSA between two with it
    ("xsa_learn", dict(vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=8, n_embd=24, seq_len=20,
                       window_pattern="SSL", short_window=6, value_embeds=True, smear=True,
                       xsa_learnable=True, xsa_layers=[0, 2]), 1031),
    ("gpu_xsa_learn_d64", dict(vocab_size=100, n_layer=3, n_head=4, n_kv_head=2, head_dim=64, n_embd=64, seq_len=80,
                               window_pattern="SSL", short_window=32, value_embeds=True, smear=True,
                               xsa_learnable=True, xsa_layers=[0, 1, 2]), 1033),
    # SFT's loss: targets -1 (ignored) where the mask is 0, as a conversation packs them: row 0 a prompt (ignored)
    # then an answer, row 1 an answer then padding (ignored), and scattered ignored targets in between
    ("sft_masked", _window(), 1041),
]
MASKED = {"sft_masked"}  # configs whose targets get build()'s mask


def metadata(cfg, batch):
    return {
        "format": FORMAT,
        "vocab_size": str(cfg.vocab_size),
        "n_layer": str(cfg.n_layer),
        "n_head": str(cfg.n_head),
        "n_kv_head": str(cfg.n_kv_head),
        "head_dim": str(cfg.head_dim),
        "n_embd": str(cfg.n_embd),
        "seq_len": str(cfg.seq_len),
        "batch": str(batch),
        "window_pattern": cfg.window_pattern,
        "short_window": str(cfg.short_window),
        "value_embeds": "1" if cfg.value_embeds else "0",
        "smear": "1" if cfg.smear else "0",
        "xsa_alpha": repr(float(cfg.xsa_alpha)),
        "xsa_layers": ",".join(str(i) for i in cfg.xsa_layers),
        "softcap": "%g" % cfg.softcap,
        "xsa_eps": repr(XSA_EPS),
    } | ({"xsa_learnable": "1"} if cfg.xsa_learnable else {})  # absent means fixed (the files made before it existed)


def build(cfg_kwargs, seed, batch=BATCH, masked=False):
    """Returns (cfg, model in float64 with float32-representable weights, idx, targets)."""
    cfg = Config(**cfg_kwargs)
    model = random_init(GPT(cfg, dtype=torch.float64), seed)
    g = torch.Generator().manual_seed(seed + 500000)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
    if masked:
        T = cfg.seq_len
        ignore = torch.rand((batch, T), generator=g) < 0.25
        ignore[0, : T // 3] = True
        ignore[-1, 2 * T // 3:] = True
        targets[ignore] = -1
    return cfg, model, idx, targets


def diagnostics(cfg, record):
    """diag.<name> -> float64 (n_layer,) from the per-layer tensors a forward recorded."""
    rows = [similarity_diagnostics(**r, w=cfg.window(layer)) for layer, r in enumerate(record)]
    return {"diag." + n: torch.tensor([r[n] for r in rows], dtype=torch.float64) for n in rows[0]}


def make(name, cfg_kwargs, seed, outdir):
    cfg, model, idx, targets = build(cfg_kwargs, seed, masked=name in MASKED)
    model.zero_grad(set_to_none=True)
    record = []
    logits, loss = model(idx, targets, record)
    loss.backward()
    diag = diagnostics(cfg, record)
    f32 = lambda t: t.detach().to(torch.float32).contiguous()  # noqa: E731
    tensors = {"idx": idx.to(torch.int32), "targets": targets.to(torch.int32)}
    params = list(model.named_parameters())
    for pname, p in params:
        tensors[pname] = f32(p)
    tensors["logits"] = f32(logits)
    tensors["loss"] = f32(loss.reshape(1))
    for pname, p in params:
        tensors["grad." + pname] = f32(p.grad)
    tensors.update({n: f32(d) for n, d in diag.items()})
    tensors.update(bf16_tolerances(cfg, model, idx, targets, logits, loss, diag))
    path = os.path.join(outdir, name + ".safetensors")
    safetensors_io.save(path, tensors, metadata(cfg, idx.shape[0]))
    return path, float(loss), fp32_noise(cfg, model, idx, targets, logits)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def fp32_noise(cfg, model64, idx, targets, logits64):
    """Worst relative error (per-tensor norm) of the same model run in float32 against the float64 truth:
    the floor any fp32 implementation can expect. Informational; not stored."""
    m = GPT(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p, q in zip(m.parameters(), model64.parameters()):
            p.copy_(q)
    logits, loss = m(idx, targets)
    loss.backward()
    worst = max((_rel(p.grad, q.grad), n) for (n, p), q in zip(m.named_parameters(), model64.parameters()))
    return _rel(logits, logits64), worst


# the matrices the CUDA backend multiplies from a bf16 copy (params_mm); other parameters stay fp32 there
MATMUL_WEIGHTS = ("c_q.weight", "c_k.weight", "c_v.weight", "c_proj.weight", "c_fc.weight", "lm_head.weight")
BF16_SAMPLES = 8    # stochastically rounded runs per reference
BF16_SIGMAS = 4.0   # tolerance = mean + 4 standard deviations of their errors


def bf16_tolerances(cfg, model64, idx, targets, logits64, loss64, diag64):
    """How far a correct bf16 implementation of this model may land from the float64 truth, per output and
    per gradient tensor, stored as tol_bf16.* for the CUDA suite (which uses the larger of this and its
    fixed tolerance). Measured, not assumed: BF16_SAMPLES runs of the model in float32 with the matmul
    weights and every activation (and its gradient) rounded to bf16 where the CUDA backend stores them
    (model.store), stochastically, so that each run is a fresh draw of the rounding errors; the tolerance
    is their mean + BF16_SIGMAS standard deviations. Matrices' errors barely vary between draws (~2e-2);
    the scalar lambdas' gradients are sums with heavy cancellation whose errors vary by their own size.
    The diagnostics' error is absolute (cosines can be near 0), the worst over layers, computed from the
    recorded bf16 q, k, v, y, z; recording draws nothing, so the other tolerances are unchanged by it."""
    errors = {}
    for sample in range(BF16_SAMPLES):
        gen = torch.Generator().manual_seed(7919 * (sample + 1))
        m = GPT(cfg, dtype=torch.float32)
        set_bf16_storage(True, gen)
        try:
            with torch.no_grad():
                for (n, p), q in zip(m.named_parameters(), model64.parameters()):
                    p.copy_(bf16_round(q.to(torch.float32)) if n.endswith(MATMUL_WEIGHTS) else q)
            record = []
            logits, loss = m(idx, targets, record)
            loss.backward()
        finally:
            set_bf16_storage(False)
        errors.setdefault("loss", []).append(abs(float(loss) - float(loss64)) / abs(float(loss64)))
        errors.setdefault("logits", []).append(_rel(logits, logits64))
        for (n, p), q in zip(m.named_parameters(), model64.parameters()):
            errors.setdefault("grad." + n, []).append(_rel(p.grad, q.grad))
        for n, d in diagnostics(cfg, record).items():
            errors.setdefault(n, []).append(float((d - diag64[n]).abs().max()))
    out = {}
    for k, e in errors.items():
        e = torch.tensor(e, dtype=torch.float64)
        out["tol_bf16." + k] = torch.tensor([float(e.mean() + BF16_SIGMAS * e.std())], dtype=torch.float32)
    return out


def main():
    torch.set_num_threads(1)  # fixed reduction order -> same bytes on every rerun
    outdir = os.path.join(HERE, "data")
    os.makedirs(outdir, exist_ok=True)
    only = sys.argv[1:]  # names of CONFIGS to (re)write; all by default
    unknown = set(only) - {name for name, _, _ in CONFIGS}
    if unknown:
        sys.exit(f"error: no reference config named {', '.join(sorted(unknown))}")
    for name, kw, seed in CONFIGS:
        if only and name not in only:
            continue
        path, loss, (lrel, (grel, gname)) = make(name, kw, seed, outdir)
        ref = safetensors_io.load(path)[0]
        loosest = max((float(t[0]), k[len("tol_bf16.grad."):]) for k, t in ref.items() if k.startswith("tol_bf16.grad."))
        print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes, loss {loss:.6f}; "
              f"fp32 run vs truth: logits {lrel:.1e}, worst grad {grel:.1e} {gname}; bf16 tolerances: logits "
              f"{float(ref['tol_bf16.logits'][0]):.1e}, loosest grad {loosest[0]:.1e} {loosest[1]})")
        for n in ("diag.cos_yv", "diag.cos_zv", "diag.self_weight", "diag.value_cos"):
            print(f"    {n} per layer {' '.join(f'{x:+.4f}' for x in ref[n])} (bf16 tolerance "
                  f"{float(ref['tol_bf16.' + n][0]):.1e})")


if __name__ == "__main__":
    main()
