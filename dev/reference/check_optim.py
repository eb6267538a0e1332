"""
Self-checks of the optimizer reference (optim.py) and of the committed trajectory files (about 3 s of CPU):
    /usr/bin/python3 dev/reference/check_optim.py
Exits non-zero on any failure; the last line is "N passed, N failed".
"""
import math
import os
import sys

import require_torch  # noqa: F401  (one error line where PyTorch is missing)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_optim_refs as R  # noqa: E402
import optim  # noqa: E402
import safetensors_io  # noqa: E402
from checks import check, rel, run_checks  # noqa: E402
from model import GPT, Config, random_init  # noqa: E402

torch.set_num_threads(1)


def check_adamw_vs_torch():
    """10 steps on random params with random grads and a changing (scheduled) lr, against torch.optim.AdamW.
    torch's denominator sqrt(v)/sqrt(bias2) + eps equals sqrt(v/bias2) + eps mathematically."""
    g = torch.Generator().manual_seed(11)
    worst = 0.0
    for betas, wd, eps in (((0.8, 0.95), 0.05, 1e-10), ((0.9, 0.999), 0.0, 1e-8), ((0.96, 0.95), 0.3, 1e-10)):
        shapes = [(7, 5), (13,), (1,)]
        ours = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        ref = [torch.nn.Parameter(p.clone()) for p in ours]
        topt = torch.optim.AdamW(ref, lr=1.0, betas=betas, eps=eps, weight_decay=wd)
        states = [{} for _ in ours]
        for step in range(10):
            lr = 0.01 * (1 + 0.3 * math.sin(step))
            grads = [torch.randn(s, generator=g, dtype=torch.float64) * 10 ** (step % 3 - 1) for s in shapes]
            for pg in topt.param_groups:
                pg["lr"] = lr
            for p, gr in zip(ref, grads):
                p.grad = gr.clone()
            topt.step()
            for p, gr, st in zip(ours, grads, states):
                optim.adamw_update(p, gr, st, lr, betas[0], betas[1], eps, wd)
        worst = max(worst, max(rel(p, q.detach()) for p, q in zip(ours, ref)))
    check("adamw: equals torch.optim.AdamW (decoupled WD, 3 beta/wd/eps settings, 10 steps, scheduled lr)",
          worst < 1e-13, f"worst rel err {worst:.1e}")


def check_polar_express():
    g = torch.Generator().manual_seed(12)
    ok, lo, hi = True, 9.0, 0.0
    for shape in ((32, 64), (64, 32), (48, 48), (4, 12)):
        G = torch.randn(shape, generator=g, dtype=torch.float64)
        X = G / (G.norm() * 1.01 + 1e-6)
        s = torch.linalg.svdvals(optim.polar_express(X))
        lo, hi = min(lo, float(s.min())), max(hi, float(s.max()))
        ok &= bool(s.min() >= 0.7 and s.max() <= 1.3)
    check("polar express: singular values in [0.7, 1.3] for random 32x64, 64x32, 48x48, 4x12", ok,
          f"range [{lo:.3f}, {hi:.3f}]")
    G = torch.randn(40, 24, generator=g, dtype=torch.float64)
    X = G / (G.norm() * 1.01 + 1e-6)
    e = rel(optim.polar_express(X.t()).t(), optim.polar_express(X))
    check("polar express: tall branch (X B) == transposed wide branch (B X^T)^T", e < 1e-13, f"rel {e:.1e}")


def check_muon_pieces():
    g = torch.Generator().manual_seed(13)
    # transpose equivariance without MuonEq (rows are not transpose-symmetric): exercises per-row vs per-column
    # NorMuon and both Polar Express branches against each other, over 3 steps of state
    worst, shapes_ok = 0.0, True
    for plus in (False, True):
        st_a, st_b = {}, {}
        for step in range(3):
            G = torch.randn(24, 10, generator=g, dtype=torch.float64)
            Oa = optim.muon_direction(G, st_a, 0.9, False, plus)
            Ob = optim.muon_direction(G.t().contiguous(), st_b, 0.9, False, plus)
            worst = max(worst, rel(Ob.t(), Oa))
        shapes_ok &= st_a["S"].shape == (24, 1) and st_b["S"].shape == (1, 24)
    check("muon: direction(G^T) == direction(G)^T without MuonEq (tall per-row vs wide per-column NorMuon), "
          "S shapes (m,1) / (1,n)", worst < 1e-12 and shapes_ok, f"rel {worst:.1e}")
    # NorMuon restores the Frobenius norm: sqrt(min(m,n)) with Muon+, ||polar output|| without
    errs = []
    for shape in ((24, 10), (10, 24), (16, 16)):
        G = torch.randn(shape, generator=g, dtype=torch.float64)
        for eq in (False, True):
            O = optim.muon_direction(G, {}, 0.85, eq, True)
            errs.append(abs(float(O.norm()) / math.sqrt(min(shape)) - 1))
    check("muon: with Muon+ the final direction has Frobenius norm sqrt(min(m,n)) (MuonEq on/off)",
          max(errs) < 1e-12, f"max rel {max(errs):.1e}")
    # MuonEq: G with unequal row norms gives the same direction as G with every row rescaled to the RMS row
    # norm ||G||_F / sqrt(m) (same Frobenius norm, so the +1e-6 of the normalisation sees the same scale)
    G = torch.randn(6, 20, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, 6, dtype=torch.float64)[:, None]
    Geq = G * (G.norm() / math.sqrt(6) / G.norm(dim=1, keepdim=True))
    e = rel(optim.muon_direction(G, {}, 0.85, True, False), optim.muon_direction(Geq, {}, 0.85, True, False))
    e_off = rel(optim.muon_direction(G, {}, 0.85, False, False), optim.muon_direction(Geq, {}, 0.85, False, False))
    check("muonEq: G and G with rows equilibrated to ||G||_F/sqrt(m) give the same direction (and differ "
          "without MuonEq)", e < 1e-12 and e_off > 1e-2, f"rel {e:.1e} (without MuonEq {e_off:.1e})")
    # update: lr shape scale and cautious mask, on a hand-made case with O known
    P = torch.tensor([[1.0, -2.0], [3.0, -4.0], [0.5, 0.0], [-1.0, 1.0]], dtype=torch.float64)
    O = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 2.0], [-1.0, -1.0]], dtype=torch.float64)
    saved = optim.muon_direction
    optim.muon_direction = lambda *a, **k: O.clone()
    try:
        p = P.clone()
        _, mask, _ = optim.muon_update(p, None, {}, 0.1, 0.9, 0.5, False, False)
    finally:
        optim.muon_direction = saved
    lr_eff = 0.1 * math.sqrt(4 / 2)
    want_mask = torch.tensor([[1, 0], [0, 1], [1, 1], [1, 0]], dtype=torch.float64)
    want = P - lr_eff * O - lr_eff * 0.5 * P * want_mask
    check("muon: cautious WD mask (O*P >= 0, zeros count as agreeing), WD times lr*sqrt(max(1,m/n))",
          torch.equal(mask, want_mask) and rel(p, want) < 1e-15)


def _close(x, want):
    """want: nanochat's printed value; tolerance half a unit of its last printed digit."""
    if want.startswith("~"):
        return abs(x) < 1e-6
    dec = len(want.split(".")[1]) if "." in want else 0
    return abs(x - float(want)) <= 0.5 * 10 ** -dec + 1e-12


def check_schedules():
    d12 = optim.Hyper(num_iterations=2520, warmup_steps=40, warmdown_ratio=0.65, final_lr_frac=0.05,
                      momentum_warmup_steps=400, wd_muon_peak=0.28)
    # d24 WD peak unrounded (dev/docs/optim.md#learning-rate-scaling: 0.28 * sqrt(2) * D_REF / target_tokens,
    # the ratio cancels) = 0.0597384; the rounded 0.059738 gives 0.0434112 at it 1950, not nanochat's 0.043412
    d24 = optim.Hyper(num_iterations=5568, warmup_steps=40, warmdown_ratio=0.65, final_lr_frac=0.05,
                      momentum_warmup_steps=400, wd_muon_peak=0.28 * math.sqrt(2) * 1321210944 / 8757727488)
    table = [(d12, 0, "0.025", "0.85", "0.28"), (d12, 883, "0.99942", "0.969957", "0.203403"),
             (d12, 1260, "0.780769", "0.953846", "0.14"), (d12, 2519, "0.050580", "0.900043", "~0"),
             (d24, 1950, "0.999737", "0.969981", "0.043412"), (d24, 5567, "0.050263", "0.900019", "~0")]
    bad = []
    for h, it, lrm, mom, wd in table:
        got = (optim.lr_multiplier(it, h), optim.muon_momentum(it, h), optim.muon_weight_decay(it, h))
        if not all(_close(x, w) for x, w in zip(got, (lrm, mom, wd))):
            bad.append(f"N={h.num_iterations} it={it}: {got}")
    edges = (optim.warmdown_iters(d12) == 1638 and optim.warmdown_iters(d24) == 3619
             and optim.lr_multiplier(882, d12) == 1.0 and optim.lr_multiplier(39, d12) == 1.0
             and optim.muon_momentum(881, d12) == 0.97 and optim.muon_momentum(882, d12) == 0.97)
    check("schedules: sanity values (dev/docs/optim.md) for d12 and the d24 speedrun, plateau edges", not bad and edges,
          "; ".join(bad))
    # the tiny schedule of the trajectory files
    h = R.BASE
    got = [(optim.lr_multiplier(i, h), optim.muon_momentum(i, h)) for i in range(5)]
    want = [(0.5, 0.85), (1.0, 0.91), (1.0, 0.97), (1.0, 0.97), (2 / 3 + 0.05 / 3, 0.97 * 2 / 3 + 0.9 / 3)]
    ok = all(abs(a - c) < 1e-15 and abs(b - d) < 1e-15 for (a, b), (c, d) in zip(got, want))
    check("schedules: the files' N=6 schedule covers warmup, plateau and warmdown of lr and momentum", ok)


TINY = dict(vocab_size=50, n_layer=3, n_head=4, n_kv_head=2, head_dim=8, n_embd=24, seq_len=12,
            window_pattern="SL", short_window=4, value_embeds=True, smear=True, xsa_alpha=0.7, xsa_layers=[0, 2])


def check_groups():
    ok = True
    for kw in (TINY, dict(TINY, smear=False, value_embeds=False)):
        m = GPT(Config(**kw), dtype=torch.float64)
        for mode in ("muon", "adamw"):
            groups = optim.param_groups(m, optim.Hyper(optimizer=mode))
            names = {gr["name"]: [k for k, _ in gr["params"]] for gr in groups}
            smear = ["smear_gate.weight", "smear_lambda", "backout_lambda"] if kw["smear"] else ["backout_lambda"]
            ok &= sorted(names["smear"]) == sorted(smear)
            ok &= ("value_embeds" in names) == kw["value_embeds"]
            mat = [gr for gr in groups if gr["name"] == "matrices"][0]
            ok &= mat["kind"] == mode and all(k.startswith("transformer.h.") for k in names["matrices"])
            ok &= len(names["matrices"]) == 3 * 6 + sum(Config(**kw).has_ve(i) for i in range(3))
            if mode == "adamw":
                ok &= mat["betas"] == (0.9, 0.95)
    check("groups: every parameter in one group; smear group (backout alone without smear); all block matrices "
          "(incl. ve_gate) in Muon or, in adamw mode, AdamW (0.9, 0.95)", ok)


def check_loss_decreases():
    cfg = Config(**TINY)
    g = torch.Generator().manual_seed(99)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
    tg = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)
    for mode in ("muon", "adamw"):
        h = optim.Hyper(optimizer=mode, num_iterations=30, warmup_steps=3, warmdown_ratio=0.5,
                        momentum_warmup_steps=10, lr_matrix_adamw=0.01)
        model = random_init(GPT(cfg, dtype=torch.float64), 5)
        opt = optim.MuonAdamW(model, h)
        losses = []
        for it in range(30):
            model.zero_grad(set_to_none=True)
            loss = model(idx, tg)[1]
            loss.backward()
            opt.step(it)
            losses.append(loss.item())
        ok = losses[-1] < 0.5 * losses[0] and max(losses[20:]) < min(losses[:5])
        check(f"training: loss decreases over 30 steps on a fixed batch ({mode})", ok,
              f"{losses[0]:.3f} -> {losses[10]:.3f} -> {losses[-1]:.3f}")


META_KEYS = ["format", "vocab_size", "n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "seq_len", "batch",
             "window_pattern", "short_window", "value_embeds", "smear", "xsa_alpha", "xsa_layers", "softcap",
             "xsa_eps", "format_optim", "optimizer", "muon_eq", "muon_plus", "steps"] + R.HYPER_KEYS


def check_files():
    for name, kw, h, seed in R.CONFIGS:
        path = os.path.join(HERE, "data", name + ".safetensors")
        if not os.path.exists(path):
            check(f"file {name}", False, "missing (run make_optim_refs.py)")
            continue
        t, meta = safetensors_io.load(path)
        cfg = Config(**kw)
        hm = R.hyper_from_metadata(meta)
        errs = []
        ok = all(k in meta for k in META_KEYS) and meta["format_optim"] == "xsa-optim-1" and hm == h
        ok &= meta == R.metadata(cfg, h) and os.path.getsize(path) < 400 * 1024
        init = {k: torch.from_numpy(t[k]) for k, _ in GPT(cfg).named_parameters()}
        idx, tg = torch.from_numpy(t["idx"]).long(), torch.from_numpy(t["targets"]).long()
        ok &= tuple(idx.shape) == (5, 2, cfg.seq_len) and int(idx.max()) < cfg.vocab_size
        losses, final, sched, opt = R.trajectory(cfg, init, idx, tg, hm, torch.float64)
        errs.append(rel(torch.tensor(losses), torch.from_numpy(t["losses"])))
        errs += [rel(final[k], torch.from_numpy(t["final." + k])) for k in init]
        errs += [rel(torch.tensor(sched[k]), torch.from_numpy(t["sched." + k])) for k in sched]
        shapes = [tuple(p.shape) for gr in opt.groups if gr["kind"] == "muon" for _, p in gr["params"]]
        both = h.optimizer != "muon" or (any(a > b for a, b in shapes) and any(a < b for a, b in shapes))
        moved = min(rel(final[k], init[k].double()) for k in init)
        ok &= max(errs) < 1e-7 and both and moved > 1e-3
        check(f"file {name}: metadata complete, trajectory recomputed in float64 from the stored weights, batches "
              f"and hyperparameters matches losses/final/sched; tall and wide Muon matrices; every tensor moved",
              ok, f"worst rel err {max(errs):.1e}, smallest relative move {moved:.1e}, "
                  f"{os.path.getsize(path)} bytes")
        lerr, (perr, _), (uerr, _), flips = R.fp32_agreement(cfg, init, idx, tg, hm, losses, final, opt)
        check(f"file {name}: a float32 run stays 10x inside the C++ tolerances (loss 1e-6, params 1e-5, updates "
              f"1e-4) with no cautious-mask flip", lerr < 1e-6 and perr < 1e-5 and uerr < 1e-4 and flips == 0,
              f"loss {lerr:.1e}, params {perr:.1e}, updates {uerr:.1e}, flips {flips}")


def main():
    run_checks(check_adamw_vs_torch, check_polar_express, check_muon_pieces, check_schedules, check_groups,
               check_loss_decreases, check_files)


if __name__ == "__main__":
    main()
