"""
Independent PyTorch reference of nanochat's optimizers (dev/docs/optim.md), written from a description of
nanochat only (never from the C++ code): Muon (Polar Express, optional MuonEq / Muon+, NorMuon, cautious
weight decay) for every block matrix plus AdamW for the rest ("muon" mode), or AdamW for everything
("adamw" mode).

Everything runs in the parameters' dtype (float64 for the reference truth, float32 to measure the fp32 floor);
there are no bf16 casts anywhere. Hyperparameters are explicit inputs (`Hyper`), not derived from the model
size, so that a trajectory file can carry them. Single process: no sharding (nanochat's sharding of the
optimizer over ranks does not change the math).
"""
import math
from dataclasses import dataclass

import torch

# Polar Express coefficient triples (a, b, c), dev/docs/optim.md#polar-express (Amsel et al. 2505.16932, 5 iterations).
POLAR_EXPRESS_COEFFS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
MUON_BETA2 = 0.9         # NorMuon second-moment decay
ADAMW_EPS = 1e-10        # every AdamW group
MOMENTUM_START, MOMENTUM_PEAK, MOMENTUM_FINAL = 0.85, 0.97, 0.90
MATRIX_ADAMW_BETAS = (0.9, 0.95)  # "adamw" mode: block matrices


@dataclass
class Hyper:
    optimizer: str = "muon"          # "muon" (Muon + AdamW) or "adamw" (AdamW only)
    muon_eq: bool = True             # MuonEq row equilibration (dev/docs/optim.md#muon, step 2; nanochat HEAD only)
    muon_plus: bool = True           # Muon+ renormalisation (dev/docs/optim.md#muon, step 5; nanochat HEAD only)
    num_iterations: int = 6          # N
    warmup_steps: int = 2
    warmdown_ratio: float = 0.5
    final_lr_frac: float = 0.05
    momentum_warmup_steps: int = 2   # nanochat: 400
    lr_matrix: float = 0.02          # Muon (before the sqrt(max(1, m/n)) shape scale)
    lr_lm_head: float = 0.008
    lr_wte: float = 0.05
    lr_ve: float = 0.025
    lr_resid: float = 0.005
    lr_x0: float = 0.1
    lr_smear: float = 0.05           # smear_gate, smear_lambda, backout_lambda
    lr_xsa: float = 0.04             # learnable XSA logits (not in nanochat; modded-nanogpt's Adam settings for scalars)
    wd_muon_peak: float = 0.28       # Muon cautious WD, cosine schedule
    lr_matrix_adamw: float = 0.003   # "adamw" mode: block matrices
    wd_matrix_adamw: float = 0.1     # "adamw" mode: block matrices (constant)


# ----------------------------------------------------------------------------------------------------------
# Schedules (dev/docs/optim.md#schedules), indexed by the optimizer step it = 0..N-1

def warmdown_iters(h):
    return round(h.warmdown_ratio * h.num_iterations)  # Python round: half to even


def lr_multiplier(it, h):
    N, W = h.num_iterations, warmdown_iters(h)
    if it < h.warmup_steps:
        return (it + 1) / h.warmup_steps
    if it <= N - W:
        return 1.0
    p = (N - it) / W
    return p + (1 - p) * h.final_lr_frac


def muon_momentum(it, h):
    N, W = h.num_iterations, warmdown_iters(h)
    if it < h.momentum_warmup_steps:
        return MOMENTUM_START + (MOMENTUM_PEAK - MOMENTUM_START) * it / h.momentum_warmup_steps
    if it >= N - W:
        p = (it - (N - W)) / W
        return MOMENTUM_PEAK * (1 - p) + MOMENTUM_FINAL * p
    return MOMENTUM_PEAK


def muon_weight_decay(it, h):
    return h.wd_muon_peak * 0.5 * (1 + math.cos(math.pi * it / h.num_iterations))


# ----------------------------------------------------------------------------------------------------------
# Per-parameter updates. All operate in place on p (a tensor, not requiring grad) and a state dict.

def adamw_update(p, g, state, lr, beta1, beta2, eps, wd):
    """dev/docs/optim.md#adamw. state: {'t', 'm', 'v'} (created on first call)."""
    if not state:
        state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
    state["t"] += 1
    t, m, v = state["t"], state["m"], state["v"]
    p.mul_(1 - lr * wd)
    m.add_((1 - beta1) * (g - m))
    v.add_((1 - beta2) * (g * g - v))
    bias1 = 1 - beta1 ** t
    bias2 = 1 - beta2 ** t
    p.sub_((lr / bias1) * m / ((v / bias2).sqrt() + eps))


def polar_express(X, steps=5):
    """X already Frobenius-normalised. Wide or square (m <= n): A = X X^T, X = a X + (b A + c A A) X;
    tall (m > n): A = X^T X, X = a X + X (b A + c A A)."""
    tall = X.shape[0] > X.shape[1]
    for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
        if tall:
            A = X.t() @ X
            B = b * A + c * (A @ A)
            X = a * X + X @ B
        else:
            A = X @ X.t()
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    return X


def muon_direction(g, state, momentum, muon_eq, muon_plus, beta2=MUON_BETA2):
    """dev/docs/optim.md#muon steps 1-6: the orthogonalised, variance-reduced update O for one (m, n) matrix gradient g.
    state: {'M' momentum buffer (m, n), 'S' NorMuon second moment (m, 1) if m >= n else (1, n)}."""
    m, n = g.shape
    red = 1 if m >= n else 0  # per row (reduce over columns) if m >= n, else per column
    if not state:
        state.update(M=torch.zeros_like(g),
                     S=torch.zeros((m, 1) if red == 1 else (1, n), dtype=g.dtype))
    M, S = state["M"], state["S"]
    # 1. Nesterov momentum
    M.add_((1 - momentum) * (g - M))
    X = (1 - momentum) * g + momentum * M
    # 3. MuonEq: every row rescaled to the RMS row norm ||X||_F / sqrt(m)
    if muon_eq:
        target = X.norm() / math.sqrt(m)
        X = X * (target / X.norm(dim=1, keepdim=True).clamp_min(1e-6))
    # 4. normalise, 5. Polar Express
    X = X / (X.norm() * 1.01 + 1e-6)
    O = polar_express(X)
    # 6. Muon+
    if muon_plus:
        O = O * (math.sqrt(min(m, n)) / O.norm().clamp_min(1e-6))
    # 7. NorMuon
    R = O.shape[red]
    v = (O * O).mean(dim=red, keepdim=True)
    o_norm = (v.sum() * R).sqrt()
    S.add_((1 - beta2) * (v - S))
    step = 1.0 / S.clamp_min(1e-10).sqrt()
    os_norm = (v * R * step * step).sum().sqrt()
    return O * (step * (o_norm / os_norm.clamp_min(1e-10)))


def muon_update(p, g, state, lr, momentum, wd, muon_eq, muon_plus, beta2=MUON_BETA2, perturb=None):
    """dev/docs/optim.md#muon: direction, then step 7: shape lr scale, cautious weight decay + update.
    perturb: optional function applied to the direction O (noise-injection diagnostics only).
    Returns (O, mask, lr_eff * wd * |P|) for diagnostics (the last: what a flip of each mask element costs)."""
    O = muon_direction(g, state, momentum, muon_eq, muon_plus, beta2)
    if perturb is not None:
        O = perturb(O)
    m, n = p.shape
    lr_eff = lr * math.sqrt(max(1.0, m / n))
    mask = (O * p >= 0).to(p.dtype)
    flip_cost = lr_eff * wd * p.abs()
    p.sub_(lr_eff * O + lr_eff * wd * p * mask)
    return O, mask, flip_cost


# ----------------------------------------------------------------------------------------------------------
# Parameter groups (dev/docs/optim.md#parameter-groups) and the combined optimizer

def param_groups(model, h):
    """List of groups {kind, name, params: [(name, p)], lr, betas, wd} in nanochat's order. In "muon" mode
    every transformer.h.* parameter goes to one Muon group (nanochat groups by shape, which does not change
    per-matrix math); in "adamw" mode those go to an AdamW group with betas (0.9, 0.95)."""
    named = dict(model.named_parameters())
    sel = lambda pred: [(k, p) for k, p in named.items() if pred(k)]  # noqa: E731
    groups = [
        dict(kind="adamw", name="lm_head", params=sel(lambda k: k == "lm_head.weight"),
             lr=h.lr_lm_head, betas=(0.8, 0.96), wd=0.01),
        dict(kind="adamw", name="wte", params=sel(lambda k: k == "transformer.wte.weight"),
             lr=h.lr_wte, betas=(0.8, 0.995), wd=0.001),
        dict(kind="adamw", name="value_embeds", params=sel(lambda k: k.startswith("value_embeds.")),
             lr=h.lr_ve, betas=(0.8, 0.995), wd=0.01),
        dict(kind="adamw", name="resid_lambdas", params=sel(lambda k: k == "resid_lambdas"),
             lr=h.lr_resid, betas=(0.8, 0.95), wd=0.05),
        dict(kind="adamw", name="x0_lambdas", params=sel(lambda k: k == "x0_lambdas"),
             lr=h.lr_x0, betas=(0.96, 0.95), wd=0.0),
        dict(kind="adamw", name="smear", params=sel(
            lambda k: k in ("smear_gate.weight", "smear_lambda", "backout_lambda")),
             lr=h.lr_smear, betas=(0.8, 0.95), wd=0.0),
        dict(kind="adamw", name="xsa_alpha", params=sel(lambda k: k.endswith(".attn.xsa_logit")),
             lr=h.lr_xsa, betas=(0.8, 0.95), wd=0.0),
    ]
    blocks = sel(lambda k: k.startswith("transformer.h.") and not k.endswith(".attn.xsa_logit"))
    if h.optimizer == "muon":
        groups.append(dict(kind="muon", name="matrices", params=blocks, lr=h.lr_matrix, betas=None, wd=None))
    elif h.optimizer == "adamw":
        groups.append(dict(kind="adamw", name="matrices", params=blocks, lr=h.lr_matrix_adamw,
                           betas=MATRIX_ADAMW_BETAS, wd=h.wd_matrix_adamw))
    else:
        raise ValueError(f"unknown optimizer {h.optimizer!r}")
    groups = [gr for gr in groups if gr["params"]]
    seen = [k for gr in groups for k, _ in gr["params"]]
    assert sorted(seen) == sorted(named), "every parameter in exactly one group"
    for gr in groups:
        if gr["kind"] == "muon":
            assert all(p.dim() == 2 for _, p in gr["params"])
    return groups


class MuonAdamW:
    """step(it) applies the schedules of step it (lr x lrm(it) on every group, Muon momentum(it) and
    wd(it)) using the .grad of every parameter, then leaves the grads alone.

    Diagnostics of how close the trajectory runs to the optimizer's discontinuities (per step):
      masks[it][name]        Muon cautious-WD mask;
      muon_log[it][name]     (|O| / rms(O), lr_eff * wd * |P|) elementwise: how far each element is from
                             flipping its mask (in units of the update's rms) and what a flip would cost;
      margin_adam[it][name]  min over elements with v > 0 of sqrt(v_hat_ij) / rms(g): the update
                             m_hat / sqrt(v_hat) moves by ~ noise(g) / sqrt(v_hat) (at t = 1 it is sign(g)).
    perturb: optional function (t, kind) -> t, kind "grad" for every gradient and "direction" for every Muon
    direction O, to emulate the rounding noise of another implementation (diagnostics only; None for the
    reference)."""

    def __init__(self, model, h, perturb=None):
        self.h = h
        self.perturb = perturb
        self.groups = param_groups(model, h)
        self.state = {}
        self.masks, self.muon_log, self.margin_adam = [], [], []

    def schedule(self, it):
        return lr_multiplier(it, self.h), muon_momentum(it, self.h), muon_weight_decay(it, self.h)

    @torch.no_grad()
    def step(self, it):
        h = self.h
        lrm, mom, wd = self.schedule(it)
        masks, mmu, mad = {}, {}, {}
        for gr in self.groups:
            lr = gr["lr"] * lrm
            for name, p in gr["params"]:
                st = self.state.setdefault(name, {})
                g = p.grad if self.perturb is None else self.perturb(p.grad, "grad")
                if gr["kind"] == "adamw":
                    b1, b2 = gr["betas"]
                    adamw_update(p.data, g, st, lr, b1, b2, ADAMW_EPS, gr["wd"])
                    v = st["v"][st["v"] > 0]
                    rms = g.pow(2).mean().sqrt()
                    if v.numel() and rms > 0:
                        mad[name] = float((v / (1 - b2 ** st["t"])).sqrt().min() / rms)
                else:
                    pert = None if self.perturb is None else (lambda t: self.perturb(t, "direction"))
                    O, masks[name], cost = muon_update(p.data, g, st, lr, mom, wd, h.muon_eq, h.muon_plus,
                                                       perturb=pert)
                    mmu[name] = (O.abs() / O.pow(2).mean().sqrt(), cost)
        self.masks.append(masks)
        self.muon_log.append(mmu)
        self.margin_adam.append(mad)
