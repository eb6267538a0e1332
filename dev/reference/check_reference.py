"""
Self-checks of the PyTorch reference (about 13 s of CPU on the 2-core build machine):
    /usr/bin/python3 dev/reference/check_reference.py
Exits non-zero on any failure; the last line is "N passed, N failed".
"""
import math
import os
import sys

import require_torch  # noqa: F401  (one error line where PyTorch is missing)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402
import make_refs  # noqa: E402
import safetensors_io  # noqa: E402
from checks import check, rel, run_checks  # noqa: E402
from model import GPT, Config  # noqa: E402

torch.set_num_threads(1)


# A config with everything at once: sliding windows shorter than T, GQA, VE, smear, XSA on a subset.
ALL = dict(vocab_size=50, n_layer=3, n_head=4, n_kv_head=2, head_dim=8, n_embd=24, seq_len=10,
           window_pattern="SL", short_window=3, value_embeds=True, smear=True,
           xsa_alpha=0.7, xsa_layers=[0, 2])


def tiny(seed=7, batch=2, **kw):
    return make_refs.build(dict(ALL, **kw), seed, batch)


def check_xsa_op():
    g = torch.Generator().manual_seed(1)
    B, T, H, Hkv, D = 2, 5, 4, 2, 8
    y = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, Hkv, D, generator=g, dtype=torch.float64)
    vs = v.repeat_interleave(H // Hkv, dim=2)
    z = M.xsa(y, v, 1.0)
    # z.v = (y.v) * eps / (v.v + eps) exactly; measured relative to |y||v| (not cos(z, v): z -> 0 when y || v)
    zv = ((z * vs).sum(-1) / (y.norm(dim=-1) * vs.norm(dim=-1))).abs().max().item()
    n0, s0 = (vs * vs).sum(-1), (y * vs).sum(-1)
    exact = rel((z * vs).sum(-1), s0 * M.XSA_EPS / (n0 + M.XSA_EPS))
    check("xsa op: alpha=1 gives z.v ~ 0 (random y, v, GQA)", zv < 1e-6 and exact < 1e-6,
          f"max |z.v| / (|y||v|) = {zv:.1e}; z.v vs the exact eps residue (y.v) eps/(v.v+eps): rel {exact:.1e}")
    check("xsa op: alpha=0 returns y bit-identically", torch.equal(M.xsa(y, v, 0.0), y))
    # the analytic backward (dev/docs/model.md#xsa-backward) vs autograd, incl. the GQA sum over query heads
    # sharing a kv head
    alpha = 0.6
    yy, vv = y.clone().requires_grad_(), v.clone().requires_grad_()
    gz = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    M.xsa(yy, vv, alpha).backward(gz)
    n = (vs * vs).sum(-1, keepdim=True) + M.XSA_EPS
    s = (y * vs).sum(-1, keepdim=True)
    p, u = s / n, (gz * vs).sum(-1, keepdim=True)
    dy = gz - alpha * (u / n) * vs
    dv_h = -alpha * ((u / n) * y + p * gz - 2 * p * (u / n) * vs)
    dv = dv_h.view(B, T, Hkv, H // Hkv, D).sum(3)
    check("xsa op: analytic backward formula == autograd (dL/dy)", rel(yy.grad, dy) < 1e-13, f"{rel(yy.grad, dy):.1e}")
    check("xsa op: analytic backward formula == autograd (dL/dv, GQA-summed)", rel(vv.grad, dv) < 1e-13,
          f"{rel(vv.grad, dv):.1e}")
    ok = torch.autograd.gradcheck(lambda a, b: M.xsa(a, b, alpha), (y.clone().requires_grad_(),
                                  v.clone().requires_grad_()), eps=1e-6, atol=1e-8, rtol=1e-6)
    check("xsa op: finite differences (gradcheck)", ok)


def check_learnable_alpha():
    """-x learn: alpha_h = tanh(xsa_logit[h]). Logits all atanh(0.7) give the fixed-alpha 0.7 model; the
    logits' gradient is the analytic -sum_tokens p u (dev/docs/model.md#learnable-alpha) through tanh', and
    passes gradcheck."""
    fixed = dict(ALL, xsa_alpha=0.7)
    cfg, m_fixed, idx, tgt = tiny(**fixed)
    cfg_l = Config(**dict(fixed, xsa_alpha=0.0, xsa_learnable=True))
    m_learn = GPT(cfg_l)
    with torch.no_grad():
        learn_params = dict(m_learn.named_parameters())
        for name, p in m_fixed.named_parameters():
            learn_params[name].copy_(p)
        for layer in cfg_l.xsa_layers:
            learn_params[f"transformer.h.{layer}.attn.xsa_logit"].fill_(math.atanh(0.7))
    names = sorted(n for n in learn_params if n.endswith("xsa_logit"))
    check("learnable alpha: one logit per head on each XSA layer, nothing else added",
          names == [f"transformer.h.{i}.attn.xsa_logit" for i in cfg_l.xsa_layers] and
          all(learn_params[n].shape == (cfg_l.n_head,) for n in names) and len(learn_params) == len(dict(m_fixed.named_parameters())) + len(names))
    lf, sf = m_fixed(idx, tgt)
    ll, sl = m_learn(idx, tgt)
    check("learnable alpha: logits atanh(0.7) == fixed alpha 0.7", rel(ll, lf) < 1e-14 and abs(float(sl - sf)) < 1e-14, f"logits rel {rel(ll, lf):.1e}")
    # the analytic gradient of one head's alpha: dL/dalpha_h = -sum over tokens of (y.v / n)(g.v), g = dL/dz
    g = torch.Generator().manual_seed(5)
    B, T, H, Hkv, D = 2, 5, 4, 2, 8
    y = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, Hkv, D, generator=g, dtype=torch.float64)
    gz = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    logit = (torch.rand(H, generator=g, dtype=torch.float64) * 2 - 1).requires_grad_()
    M.xsa(y, v, torch.tanh(logit)[:, None]).backward(gz)
    vs = v.repeat_interleave(H // Hkv, dim=2)
    n = (vs * vs).sum(-1) + M.XSA_EPS
    dalpha = -((y * vs).sum(-1) / n * (gz * vs).sum(-1)).sum((0, 1))
    analytic = dalpha * (1 - torch.tanh(logit.detach()) ** 2)
    check("learnable alpha: analytic dL/dlogit (-sum p u times tanh') == autograd", rel(logit.grad, analytic) < 1e-13, f"{rel(logit.grad, analytic):.1e}")
    ok = torch.autograd.gradcheck(lambda a: M.xsa(y, v, torch.tanh(a)[:, None]), (logit.detach().clone().requires_grad_(),),
                                  eps=1e-6, atol=1e-8, rtol=1e-6)
    check("learnable alpha: finite differences of the logits (gradcheck)", ok)


def check_xsa_in_model():
    cfg, m, idx, tgt = tiny(xsa_alpha=1.0, xsa_layers=[0, 1, 2])
    seen = []
    orig = M.xsa

    def spy(y, v, alpha):
        z = orig(y, v, alpha)
        vs = v.repeat_interleave(y.shape[2] // v.shape[2], dim=2)
        cb = ((y * vs).sum(-1) / (y.norm(dim=-1) * vs.norm(dim=-1))).abs().mean().item()
        ca = ((z * vs).sum(-1) / (y.norm(dim=-1) * vs.norm(dim=-1))).abs().max().item()
        seen.append((cb, ca))
        return z
    M.xsa = spy
    try:
        m(idx, tgt)
    finally:
        M.xsa = orig
    worst = max(c for _, c in seen)
    check("xsa in model: alpha=1 gives z.v ~ 0 in every XSA layer", len(seen) == 3 and worst < 1e-6,
          f"mean |cos(y,v)| before {[round(b, 3) for b, _ in seen]}, max |z.v|/(|y||v|) after {worst:.1e}")


def check_alpha0_identity():
    for base in ("ALL", "xsa_all config"):
        kw = dict(ALL) if base == "ALL" else dict(dict((n, k) for n, k, _ in make_refs.CONFIGS)["xsa_all"])
        outs = []
        for layers in ([], list(range(kw["n_layer"]))):
            cfg, m, idx, tgt = make_refs.build(dict(kw, xsa_alpha=0.0, xsa_layers=layers), 3)
            logits, loss = m(idx, tgt)
            loss.backward()
            outs.append((logits.detach(), loss.detach(), [p.grad for p in m.parameters()]))
        (l0, s0, g0), (l1, s1, g1) = outs
        same = torch.equal(l0, l1) and torch.equal(s0, s1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
        check(f"alpha=0 on all layers == no XSA, bit-identical loss, logits and grads ({base})", same,
              f"loss {s0.item():.12f} vs {s1.item():.12f}")


def check_gradcheck_model():
    cfg, m, idx, tgt = tiny(batch=1)
    names = ["transformer.h.0.attn.ve_gate.weight", "transformer.h.2.attn.ve_gate.weight",
             "transformer.h.1.attn.c_v.weight", "transformer.h.2.attn.c_q.weight", "smear_gate.weight",
             "smear_lambda", "resid_lambdas", "x0_lambdas", "backout_lambda"]
    params = dict(m.named_parameters())
    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)

    def f(*ts):
        return torch.nn.utils.stateless.functional_call(m, dict(zip(names, ts)), (idx, tgt))[1]
    ok = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-5)
    check("full model (windows+GQA+VE+smear+XSA 0.7) loss gradcheck w.r.t. " + ", ".join(
        n.replace("transformer.", "") for n in names) + f" ({sum(t.numel() for t in inputs)} elements)", ok)
    # and a few single elements of the big tables by central differences
    logits, loss = m(idx, tgt)
    loss.backward()
    worst = 0.0
    for n, flat in [("transformer.wte.weight", idx[0, 3].item() * cfg.n_embd + 5),
                    ("value_embeds.0.weight", idx[0, 4].item() * 16 + 9),
                    ("lm_head.weight", tgt[0, 2].item() * cfg.n_embd + 1),
                    ("transformer.h.0.mlp.c_fc.weight", 17), ("transformer.h.1.mlp.c_proj.weight", 40),
                    ("transformer.h.1.attn.c_k.weight", 33), ("transformer.h.0.attn.c_proj.weight", 7)]:
        p = params[n]
        with torch.no_grad():
            old = p.view(-1)[flat].item()
            p.view(-1)[flat] = old + 1e-6
            lp = m(idx, tgt)[1].item()
            p.view(-1)[flat] = old - 1e-6
            lm = m(idx, tgt)[1].item()
            p.view(-1)[flat] = old
        fd, an = (lp - lm) / 2e-6, p.grad.view(-1)[flat].item()
        worst = max(worst, abs(fd - an) / max(abs(an), 1e-6))
    check("full model: central differences on single elements of wte, value_embeds, lm_head, c_fc, mlp.c_proj, "
          "c_k, attn.c_proj", worst < 1e-6, f"worst rel err {worst:.1e}")


def check_attention_loops():
    g = torch.Generator().manual_seed(2)
    B, T, H, Hkv, D = 2, 9, 6, 2, 4
    q = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, Hkv, D, generator=g, dtype=torch.float64)
    worst = 0.0
    for w in (0, 1, 3, T):
        y = M.attention(q, k, v, w)
        ref = torch.zeros_like(y)
        for b in range(B):
            for h in range(H):
                kv = h // (H // Hkv)
                for i in range(T):
                    js = [j for j in range(T) if i - w <= j <= i]
                    sc = [sum(q[b, i, h, d] * k[b, j, kv, d] for d in range(D)) / math.sqrt(D) for j in js]
                    mx = max(sc)
                    e = [math.exp(s - mx) for s in sc]
                    for j, ej in zip(js, e):
                        ref[b, i, h] += ej / sum(e) * v[b, j, kv]
        worst = max(worst, rel(y, ref))
    check("attention == scalar-loop attention (windows 0,1,3,T; GQA 6/2)", worst < 1e-13, f"{worst:.1e}")


def check_rotary():
    cos, sin = M.rotary_tables(4, 2, torch.float64)  # D = 2: one pair, inv_freq = 1
    x = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 1, 1, 2).expand(1, 4, 1, 2)
    out = M.apply_rotary(x, cos, sin)[0, 1, 0]
    exp = torch.tensor([math.cos(1.0), -math.sin(1.0)], dtype=torch.float64)
    check("rotary sign convention: (1,0) at t=1 -> (cos 1, -sin 1)", rel(out, exp) < 1e-7, str(out.tolist()))
    D = 16
    cos, sin = M.rotary_tables(12, D, torch.float64)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64).expand(1, 12, 1, D)
    b = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64).expand(1, 12, 1, D)
    ra, rb = M.apply_rotary(a, cos, sin)[0, :, 0], M.apply_rotary(b, cos, sin)[0, :, 0]
    d1, d2 = (ra[7] * rb[4]).sum(), (ra[5] * rb[2]).sum()
    check("rotary: <rot(a,t1), rot(b,t2)> depends only on t1 - t2", abs(d1 - d2) < 1e-6, f"{d1:.9f} {d2:.9f}")
    inv = 1.0 / (100000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    check("rotary: base 1e5 frequencies", abs(inv[1].item() - 100000 ** (-2 / 16)) < 1e-9)


def check_causality():
    cfg, m, idx, tgt = tiny()
    logits = m(idx)[0]
    idx2 = idx.clone()
    idx2[:, 6] = (idx2[:, 6] + 1) % cfg.vocab_size
    l2 = m(idx2)[0]
    before = (logits[:, :6] - l2[:, :6]).abs().max().item()
    after = (logits[:, 6:] - l2[:, 6:]).abs().max().item()
    check("causality: changing token 6 leaves logits 0..5 unchanged and changes 6..", before == 0 and after > 1e-3,
          f"max change before {before:.1e}, after {after:.2f}")


def loop_diagnostics(r, w):
    """similarity_diagnostics by scalar loops over (b, t >= 1, h), the softmax over keys t - w..t written out;
    value_cos over (b, kv head, i != j)."""
    q, k, v, y, z = (r[n].tolist() for n in "qkvyz")
    B, T, H, D = r["q"].shape
    g = H // r["k"].shape[2]

    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))

    def cos(a, b):
        n = math.sqrt(dot(a, a)) * math.sqrt(dot(b, b))
        return dot(a, b) / n if n else 0.0
    sums, count = [0.0, 0.0, 0.0], 0
    for b in range(B):
        for t in range(1, T):
            for h in range(H):
                kv = h // g
                sc = {j: dot(q[b][t][h], k[b][j][kv]) / math.sqrt(D) for j in range(max(0, t - w), t + 1)}
                mx = max(sc.values())
                sums[0] += cos(y[b][t][h], v[b][t][kv])
                sums[1] += cos(z[b][t][h], v[b][t][kv])
                sums[2] += math.exp(sc[t] - mx) / sum(math.exp(x - mx) for x in sc.values())
                count += 1
    pairs = [cos(v[b][i][kv], v[b][j][kv]) for b in range(B) for kv in range(H // g) for i in range(T) for j in range(T) if i != j]
    return dict(zip(("cos_yv", "cos_zv", "self_weight", "value_cos"), [x / count for x in sums] + [sum(pairs) / len(pairs)]))


def recorded(cfg, m, idx):
    """(record, diag) of one float64 forward."""
    record = []
    m(idx, None, record)
    return record, make_refs.diagnostics(cfg, record)


def check_diagnostics_loops():
    cfg, m, idx, tgt = tiny()
    record, diag = recorded(cfg, m, idx)
    worst = max(abs(diag["diag." + n][layer].item() - x) for layer, r in enumerate(record)
                for n, x in loop_diagnostics(r, cfg.window(layer)).items())
    check("diagnostics == scalar-loop cos(y,v), cos(z,v), self weight, value cos (windows 3,T; GQA 4/2; XSA 0.7 on 0,2)",
          len(record) == cfg.n_layer and worst < 1e-12, f"worst abs diff {worst:.1e}")
    # the self weight is the attention matrix's diagonal: attention with one-hot values returns its rows
    worst = 0.0
    for layer, r in enumerate(record):
        B, T, Hkv = r["v"].shape[:3]
        onehot = torch.eye(T, dtype=torch.float64).expand(B, Hkv, T, T).transpose(1, 2)  # v[b,j,kv] = e_j
        a = M.attention(r["q"], r["k"], onehot, cfg.window(layer))  # (B, T, H, T): a[b,t,h,j]
        sw = a.diagonal(dim1=1, dim2=3)[:, :, 1:].mean().item()
        worst = max(worst, abs(sw - diag["diag.self_weight"][layer].item()))
    check("diagnostics: self_weight == mean diagonal of the model's attention matrix", worst < 1e-12,
          f"worst abs diff {worst:.1e}")


def check_diagnostics_properties():
    cfg, m, idx, _ = tiny(xsa_alpha=1.0, xsa_layers=[0, 1, 2])
    _, d = recorded(cfg, m, idx)
    zv, yv = d["diag.cos_zv"].abs().max().item(), d["diag.cos_yv"].abs().min().item()
    check("diagnostics: cos_zv ~ 0 on every layer at XSA alpha = 1 (while |cos_yv| is not)", zv < 1e-6 and yv > 0.05,
          f"cos_yv {[round(x, 3) for x in d['diag.cos_yv'].tolist()]}, max |cos_zv| {zv:.1e}")
    cfg, m, idx, _ = tiny()
    _, d = recorded(cfg, m, idx)
    same = [d["diag.cos_zv"][i].item() == d["diag.cos_yv"][i].item() for i in range(cfg.n_layer)]
    check("diagnostics: cos_zv == cos_yv exactly on the layer without XSA only (XSA 0.7 on 0,2)",
          same == [False, True, False], f"cos_yv {d['diag.cos_yv'].tolist()}, cos_zv {d['diag.cos_zv'].tolist()}")
    ok = bool((d["diag.self_weight"] > 0).all() and (d["diag.self_weight"] <= 1).all())
    ok &= all(bool((d[n].abs() <= 1).all()) for n in ("diag.cos_yv", "diag.cos_zv", "diag.value_cos"))
    check("diagnostics: 0 < self_weight <= 1, |cos_yv|, |cos_zv|, |value_cos| <= 1", ok,
          f"self_weight {[round(x, 3) for x in d['diag.self_weight'].tolist()]}")
    # window 0 (the last layer always has T): each query sees only itself, so a_tt = 1 and y = v
    cfg, m, idx, _ = tiny(n_layer=4, window_pattern="S", short_window=0, xsa_layers=[3])
    _, d = recorded(cfg, m, idx)
    sw, yv = d["diag.self_weight"].tolist(), d["diag.cos_yv"].tolist()
    ok = all(abs(x - 1) < 1e-12 for x in sw[:3] + yv[:3]) and sw[3] < 0.9 and yv[3] < 0.9
    check("diagnostics: window 0 gives self_weight = 1 and cos_yv = 1 (not on the last, full-window layer)", ok,
          f"self_weight {sw}, cos_yv {yv}")


def bf16_run(cfg, m64, idx, tgt, record):
    """One stochastically rounded bf16 run as make_refs.bf16_tolerances does it; (logits, loss, grads, rng state)."""
    gen = torch.Generator().manual_seed(7919)
    m = GPT(cfg, dtype=torch.float32)
    M.set_bf16_storage(True, gen)
    try:
        with torch.no_grad():
            for (n, p), q in zip(m.named_parameters(), m64.parameters()):
                p.copy_(M.bf16_round(q.float()) if n.endswith(make_refs.MATMUL_WEIGHTS) else q)
        logits, loss = m(idx, tgt, record)
        loss.backward()
    finally:
        M.set_bf16_storage(False)
    return logits, loss, [p.grad for p in m.parameters()], gen.get_state()


def check_recorder():
    cfg, m, idx, tgt = tiny()
    record = []
    a, b = bf16_run(cfg, m, idx, tgt, None), bf16_run(cfg, m, idx, tgt, record)
    same = all(torch.equal(x, y) for x, y in zip(a[:2] + (a[3],), b[:2] + (b[3],)))
    same &= all(torch.equal(x, y) for x, y in zip(a[2], b[2]))
    check("recorder: a stochastic bf16 run with it == without it (logits, loss, grads, generator state)", same)
    rounded = all(torch.equal(t, t.to(torch.bfloat16).float()) for r in record for t in r.values())
    check("recorder: in a bf16 run it holds the stored (bf16-representable) q, k, v, y, z", rounded and
          len(record) == cfg.n_layer and all(set(r) == set("qkvyz") for r in record))
    record = []
    m(idx, None, record)
    ok = all(torch.equal(r["y"], M.attention(r["q"], r["k"], r["v"], cfg.window(i))) and
             torch.equal(r["z"], M.xsa(r["y"], r["v"], cfg.xsa_alpha) if i in cfg.xsa_layers else r["y"])
             for i, r in enumerate(record))
    check("recorder: y = attention(q, k, v, window) and z = xsa(y, v) (or y) bit-identically", ok)


def check_files():
    ok_all, worst, worst_diag = True, 0.0, 0.0
    for name, kw, seed in make_refs.CONFIGS:
        path = os.path.join(HERE, "data", name + ".safetensors")
        if not os.path.exists(path):
            check(f"file {name}", False, "missing: run make_refs.py")
            ok_all = False
            continue
        t, meta = safetensors_io.load(path)
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
        cfg = Config(**kw)
        assert meta["format"] == "xsa-ref-1" and int(meta["n_layer"]) == cfg.n_layer
        m = GPT(cfg, dtype=torch.float64)
        with torch.no_grad():
            for pn, p in m.named_parameters():
                p.copy_(torch.from_numpy(t[pn]))
        idx = torch.from_numpy(t["idx"]).long()
        record = []
        logits, loss = m(idx, torch.from_numpy(t["targets"]).long(), record)
        loss.backward()
        diag = make_refs.diagnostics(cfg, record)
        diag_err = max(float((d.float() - torch.from_numpy(t[n])).abs().max()) for n, d in diag.items())
        tols = [t["tol_bf16." + n] for n in diag]
        errs = [rel(logits.float().double(), torch.from_numpy(t["logits"]).double()),
                abs(loss.item() - float(t["loss"][0])) / loss.item()]
        errs += [rel(p.grad, torch.from_numpy(t["grad." + pn]).double()) for pn, p in m.named_parameters()]
        padded = cfg.vocab_padded > cfg.vocab_size
        pad_ok = (not padded) or (t["grad.lm_head.weight"][cfg.vocab_size:] == 0).all()
        # diag.*: the float32 rounding of the recomputed float64 value; cos(z, v) at alpha 1 is ~1e-9, where the
        # summation order of another BLAS build moves it by ~1e-16
        ok = (n + 8) % 8 == 0 and max(errs) < 1e-7 and pad_ok and diag_err <= 1e-12 and len(diag) == 4
        ok &= all(t[n].shape == (cfg.n_layer,) for n in diag) and all(x.shape == (1,) and x[0] > 0 for x in tols)
        worst, worst_diag = max(worst, max(errs)), max(worst_diag, diag_err)
        ok_all &= bool(ok)
    check("files: reload each data/*.safetensors, recompute in float64 from the stored weights, matches the "
          "stored logits/loss/grads and (rounded to float32, within 1e-12) diag.*; tol_bf16.diag.* positive; header "
          "8-byte aligned; padded lm_head rows have zero grad", ok_all,
          f"worst rel err {worst:.1e}, worst diag abs err {worst_diag:.1e}")


def main():
    run_checks(check_xsa_op, check_learnable_alpha, check_xsa_in_model, check_alpha0_identity, check_gradcheck_model,
               check_attention_loops, check_diagnostics_loops, check_diagnostics_properties, check_recorder,
               check_rotary, check_causality, check_files)


if __name__ == "__main__":
    main()
