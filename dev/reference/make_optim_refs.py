"""
Generate the optimizer trajectory files dev/reference/data/optim_<name>.safetensors that the C++ tests compare
against: a tiny model (random non-nanochat init, model.random_init), 5 optimizer steps (it = 0..4) of a schedule
with N = 6, each on its own random batch; forward + backward + step in float64 (the truth), stored as float32.

For each file it also runs the same trajectory in float32 from the same float32 initial weights and prints how
far that lands from the truth (the floor an fp32 port can expect), and how far the float64 trajectory stays from
the optimizers' discontinuities (cautious-WD mask flips, AdamW's sign-like first step). Deterministic: same bytes
on every rerun.
    /usr/bin/python3 dev/reference/make_optim_refs.py [NAME ..]      # write the files (or only those named)
    /usr/bin/python3 dev/reference/make_optim_refs.py --robustness   # noise-injection test of the chosen seeds
    /usr/bin/python3 dev/reference/make_optim_refs.py --search 3000 1000   # margins per seed (how seeds were picked)
"""
import os
import sys
from dataclasses import replace

import require_torch  # noqa: F401  (one error line where PyTorch is missing)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import GPT, Config, random_init  # noqa: E402
import make_refs  # noqa: E402
import optim  # noqa: E402
import safetensors_io  # noqa: E402

FORMAT_OPTIM = "xsa-optim-1"
BATCH = 2
STEPS = 5

# Shared schedule / learning rates (N = 6, warmup 2, warmdown round(0.5*6) = 3 iterations, momentum warmup 2):
#   it:       0      1     2     3     4
#   lrm:      0.5    1     1     1     0.68333 (warmdown)
#   momentum: 0.85   0.91  0.97  0.97  0.94667 (warmdown)
BASE = optim.Hyper(num_iterations=6, warmup_steps=2, warmdown_ratio=0.5, final_lr_frac=0.05,
                   momentum_warmup_steps=2, lr_matrix=0.02, lr_lm_head=0.008, lr_wte=0.05, lr_ve=0.025,
                   lr_resid=0.005, lr_x0=0.1, lr_smear=0.05, wd_muon_peak=0.1, lr_matrix_adamw=0.003,
                   wd_matrix_adamw=0.1)

# wd_muon_peak 0.1 (not nanochat's 0.28) and the seeds below keep the trajectories away from the optimizers'
# discontinuities, so that an fp32 port with a few times torch's rounding noise still lands within the C++
# tolerances (README "Numerical conditioning"; --search and --robustness reproduce the selection).
# name -> (model Config kwargs, Hyper, seed). Sizes keep each file under 400 KB. Muon matrix shapes:
#   optim_muon    (C 24, H*D 32): c_q/c_k/c_v (32,24) tall, attn.c_proj (24,32) wide, ve_gate (4,12) wide,
#                 c_fc (96,24) tall, mlp.c_proj (24,96) wide.
#   optim_muon_v2 (C 32, H*D 32, Hkv*D 16): c_q (32,32) and attn.c_proj (32,32) square, c_k/c_v (16,32) wide,
#                 ve_gate (2,12) wide, c_fc (128,32) tall, mlp.c_proj (32,128) wide; smear off, so backout_lambda
#                 is alone in the smear group.
CONFIGS = [
    ("optim_muon",
     dict(vocab_size=100, n_layer=3, n_head=4, n_kv_head=4, head_dim=8, n_embd=24, seq_len=16,
          window_pattern="SSSL", short_window=5, value_embeds=True, smear=True,
          xsa_alpha=1.0, xsa_layers=[0, 1, 2]),
     replace(BASE, optimizer="muon", muon_eq=True, muon_plus=True), 3128),
    ("optim_muon_v2",
     dict(vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=8, n_embd=32, seq_len=16,
          window_pattern="SSL", short_window=6, value_embeds=True, smear=False),
     replace(BASE, optimizer="muon", muon_eq=False, muon_plus=False), 3710),
    ("optim_adamw",
     dict(vocab_size=100, n_layer=3, n_head=2, n_kv_head=2, head_dim=8, n_embd=32, seq_len=24,
          window_pattern="SL", short_window=5, value_embeds=True, smear=True,
          xsa_alpha=0.5, xsa_layers=[1, 2]),
     replace(BASE, optimizer="adamw", muon_eq=False, muon_plus=False), 4127),
    # learnable XSA alpha: the logits (a different one per layer and head) in their own AdamW group
    ("optim_xsa_learn",
     dict(vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, head_dim=8, n_embd=24, seq_len=16,
          window_pattern="SSL", short_window=5, value_embeds=True, smear=True,
          xsa_learnable=True, xsa_layers=[0, 2]),
     replace(BASE, optimizer="muon", muon_eq=True, muon_plus=True, lr_xsa=0.04), 5101),
]

HYPER_KEYS = ["num_iterations", "warmup_steps", "warmdown_ratio", "final_lr_frac", "momentum_warmup_steps",
              "lr_matrix", "lr_lm_head", "lr_wte", "lr_ve", "lr_resid", "lr_x0", "lr_smear", "wd_muon_peak",
              "lr_matrix_adamw", "wd_matrix_adamw"]


def metadata(cfg, h):
    meta = make_refs.metadata(cfg, BATCH)
    meta["format_optim"] = FORMAT_OPTIM
    meta["optimizer"] = h.optimizer
    meta["muon_eq"] = "1" if h.muon_eq else "0"
    meta["muon_plus"] = "1" if h.muon_plus else "0"
    meta["steps"] = str(STEPS)
    for k in HYPER_KEYS + (["lr_xsa"] if cfg.xsa_learnable else []):  # lr_xsa: absent in the files made before it
        v = getattr(h, k)
        meta[k] = repr(float(v)) if isinstance(v, float) else str(v)
    return meta


def hyper_from_metadata(meta):
    kw = dict(optimizer=meta["optimizer"], muon_eq=meta["muon_eq"] == "1", muon_plus=meta["muon_plus"] == "1")
    for k in HYPER_KEYS + (["lr_xsa"] if "lr_xsa" in meta else []):
        kw[k] = type(getattr(optim.Hyper, k))(meta[k])
    return optim.Hyper(**kw)


def batches(cfg, seed, steps=STEPS, batch=BATCH):
    g = torch.Generator().manual_seed(seed + 500000)
    idx = torch.randint(0, cfg.vocab_size, (steps, batch, cfg.seq_len), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (steps, batch, cfg.seq_len), generator=g)
    return idx, targets


def trajectory(cfg, init, idx, targets, h, dtype, steps=STEPS, perturb=None):
    """Runs `steps` optimizer steps from the weights `init` (dict name -> tensor) in `dtype`.
    Returns (losses list, final params dict, sched dict of lists, optimizer)."""
    model = GPT(cfg, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])
    opt = optim.MuonAdamW(model, h, perturb=perturb)
    losses, sched = [], {"lrm": [], "momentum": [], "wd": []}
    for it in range(steps):
        model.zero_grad(set_to_none=True)
        _, loss = model(idx[it], targets[it])
        loss.backward()
        opt.step(it)
        losses.append(loss.item())
        for k, v in zip(("lrm", "momentum", "wd"), opt.schedule(it)):
            sched[k].append(v)
    final = {name: p.detach().clone() for name, p in model.named_parameters()}
    return losses, final, sched, opt


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def fp32_agreement(cfg, init, idx, targets, h, losses64, final64, opt64):
    """float32 run of the same trajectory vs the float64 truth: worst per-step loss rel error, worst parameter
    rel L2 after the last step, worst rel L2 of the update (final - initial), cautious-mask disagreements."""
    losses32, final32, _, opt32 = trajectory(cfg, init, idx, targets, h, torch.float32)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses32, losses64))
    par = max((_rel(final32[k], final64[k]), k) for k in final64)
    upd = max((_rel(final32[k].double() - init[k].double(), final64[k] - init[k].double()), k)
              for k in final64)
    flips = sum(int((m32[k].double() != m64[k]).sum()) for m32, m64 in zip(opt32.masks, opt64.masks)
                for k in m64)
    return loss_err, par, upd, flips


TOL_PARAM, TOL_UPDATE = 1e-4, 1e-3  # the C++ tests' tolerances (relative L2 per tensor after the last step)


def margins(opt, init, final):
    """How close the float64 trajectory runs to the optimizer's discontinuities, in units of the rms of the
    quantity an fp32 implementation perturbs (its elementwise noise there is ~3e-6 for the Muon direction O
    and ~6e-7 for the gradient, relative to their rms; see README):
      muon: min |O_ij| / rms(O) over the "critical" mask elements, those whose flip (a jump of
            lr_eff * wd * |P_ij|) would cost at least a quarter of a tolerance (param 1e-4 or update 1e-3);
      adam: min sqrt(v_hat_ij) / rms(g) (see optim.MuonAdamW).
    Returns ((muon, tensor), (adam, tensor))."""
    mu = (float("inf"), "")
    for step in opt.muon_log:
        for k, (m, cost) in step.items():
            f, d = final[k].double(), final[k].double() - init[k].double()
            budget = 0.25 * min(TOL_PARAM * f.norm(), TOL_UPDATE * d.norm())
            crit = m[cost >= budget]
            if crit.numel():
                mu = min(mu, (float(crit.min()), k))
    ad = min((v, k) for step in opt.margin_adam for k, v in step.items())
    return mu, ad


def _setup(cfg_kwargs, seed):
    cfg = Config(**cfg_kwargs)
    init = {k: p.detach().clone() for k, p in random_init(GPT(cfg, dtype=torch.float32), seed).named_parameters()}
    return cfg, init, *batches(cfg, seed)


def search(first, count):
    """Seed search: prints the discontinuity margins of the float64 trajectory of every config per seed."""
    for name, kw, h, _ in CONFIGS:
        for seed in range(first, first + count):
            cfg, init, idx, targets = _setup(kw, seed)
            _, final, _, opt = trajectory(cfg, init, idx, targets, h, torch.float64)
            (mu, muk), (ad, adk) = margins(opt, init, final)
            print(f"{name} seed {seed}: muon {mu:.1e} {muk}  adam {ad:.1e} {adk}", flush=True)


# Noise injection: Gaussian noise of sigma_g * rms(g) on every nonzero gradient element and sigma_o * rms(O) on
# every Muon direction element. A torch float32 run has elementwise noise of median ~4e-7 rms (g) and ~2e-6 rms
# (O); the levels below are ~1.5x, 5x and 10x that.
NOISE_LEVELS = [(1e-6, 3e-6), (3e-6, 1e-5), (6e-6, 2e-5)]


def robustness(name, kw, h, seed, draws=6):
    """Worst (error / tolerance) over parameters, updates and draws, per noise level: how much rounding noise an
    fp32 implementation may have before the trajectory's discontinuities (cautious mask, Adam sign at t=1)
    make it fail the C++ tolerances (param 1e-4, update 1e-3)."""
    cfg, init, idx, targets = _setup(kw, seed)
    _, f0, _, _ = trajectory(cfg, init, idx, targets, h, torch.float64)
    out = []
    for sg, so in NOISE_LEVELS:
        worst = 0.0
        for d in range(draws):
            gen = torch.Generator().manual_seed(d)

            def perturb(t, kind, gen=gen, sg=sg, so=so):
                n = torch.randn(t.shape, generator=gen, dtype=t.dtype)
                s = so if kind == "direction" else sg
                return torch.where(t != 0, t + s * t.pow(2).mean().sqrt() * n, t)

            _, f1, _, _ = trajectory(cfg, init, idx, targets, h, torch.float64, perturb=perturb)
            for k in f0:
                p0, p1, i = f0[k], f1[k], init[k].double()
                worst = max(worst, _rel(p1, p0) / TOL_PARAM, _rel(p1 - i, p0 - i) / TOL_UPDATE)
        out.append(worst)
    return out


def make(name, cfg_kwargs, h, seed, outdir):
    cfg = Config(**cfg_kwargs)
    model = random_init(GPT(cfg, dtype=torch.float32), seed)
    init = {k: p.detach().clone() for k, p in model.named_parameters()}
    idx, targets = batches(cfg, seed)
    losses, final, sched, opt = trajectory(cfg, init, idx, targets, h, torch.float64)
    f32 = lambda t: torch.as_tensor(t).detach().to(torch.float32).contiguous()  # noqa: E731
    tensors = {"idx": idx.to(torch.int32), "targets": targets.to(torch.int32)}
    for k, p in init.items():
        tensors[k] = f32(p)
    tensors["losses"] = f32(torch.tensor(losses, dtype=torch.float64))
    for k, p in final.items():
        tensors["final." + k] = f32(p)
    for k in ("lrm", "momentum", "wd"):
        tensors["sched." + k] = f32(torch.tensor(sched[k], dtype=torch.float64))
    path = os.path.join(outdir, name + ".safetensors")
    safetensors_io.save(path, tensors, metadata(cfg, h))
    return path, losses, fp32_agreement(cfg, init, idx, targets, h, losses, final, opt), margins(opt, init, final)


def main():
    torch.set_num_threads(1)
    if len(sys.argv) == 4 and sys.argv[1] == "--search":
        return search(int(sys.argv[2]), int(sys.argv[3]))
    if len(sys.argv) == 2 and sys.argv[1] == "--robustness":
        for name, kw, h, seed in CONFIGS:
            w = robustness(name, kw, h, seed)
            print(f"{name}: worst error / tolerance under injected noise " +
                  ", ".join(f"(g {sg:.0e}, O {so:.0e}): {x:.2f}" for (sg, so), x in zip(NOISE_LEVELS, w)))
        return
    outdir = os.path.join(HERE, "data")
    os.makedirs(outdir, exist_ok=True)
    only = sys.argv[1:]  # names of CONFIGS to (re)write; all by default
    unknown = set(only) - {name for name, _, _, _ in CONFIGS}
    if unknown:
        sys.exit(f"error: no trajectory config named {', '.join(sorted(unknown))}")
    for name, kw, h, seed in CONFIGS:
        if only and name not in only:
            continue
        path, losses, agree, marg = make(name, kw, h, seed, outdir)
        (lerr, (perr, pname), (uerr, uname), flips), ((mu, _), (ad, _)) = agree, marg
        print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes, losses "
              f"{' '.join('%.4f' % x for x in losses)}; fp32 run vs truth: loss {lerr:.1e}, "
              f"worst param {perr:.1e} {pname}, worst update {uerr:.1e} {uname}, cautious-mask flips {flips}; "
              f"margins: muon {mu:.1e}, adam {ad:.1e})")


if __name__ == "__main__":
    main()
