"""
Independent PyTorch reference of the xsa-train model: nanochat's GPT (dev/docs/model.md) with
parameterized Exclusive Self-Attention (dev/docs/model.md#xsa) after attention, before c_proj.

Written from a description of nanochat and XSA only (never from the C++ code), using autograd for
every gradient. Deliberate choices for this project:
  * one dtype for everything (float64 for reference files, float32 for benchmarks); bf16 only in the
    noise-floor estimate (set_bf16_storage), which rounds what the CUDA backend stores in bf16;
  * RMSNorm without weight, eps = float32 machine epsilon (1.1920929e-07), x * rsqrt(mean(x^2) + eps);
  * rotary tables (inv_freq, angles, cos, sin) computed in float32, then converted to the model dtype;
  * XSA: z = y - alpha * (y.v / (v.v + 1e-8)) * v, with v the token's own (post value-embedding) value;
    alpha fixed, or learnable: alpha_h = tanh(a_h) per query head, a = attn.xsa_logit of each XSA layer;
  * attention with explicit causal/sliding-window masks and softmax (T x T is materialised);
  * the attention-similarity diagnostics (similarity_diagnostics) from the q, k, v, y, z a forward records.
Shapes: B batch, T sequence, C n_embd, H query heads, Hkv kv heads, D head_dim, V vocab, Vp padded vocab.
"""
import math
from dataclasses import dataclass, field
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

XSA_EPS = 1e-8
NORM_EPS = torch.finfo(torch.float32).eps  # 1.1920929e-07
ROPE_BASE = 100000


@dataclass
class Config:
    vocab_size: int = 100          # V
    n_layer: int = 2               # L
    n_head: int = 4                # H
    n_kv_head: int = 4             # Hkv
    head_dim: int = 8              # D
    n_embd: int = 32               # C (need not equal H*D)
    seq_len: int = 16              # T
    window_pattern: str = "L"      # tiled over layers; last layer always long
    short_window: int = 16         # window of 'S' layers (query i sees keys i-w..i)
    value_embeds: bool = False
    smear: bool = False
    xsa_alpha: float = 0.0
    xsa_learnable: bool = False    # alpha = tanh(xsa_logit) per (layer, head) instead of xsa_alpha
    xsa_layers: List[int] = field(default_factory=list)
    softcap: float = 15.0

    @property
    def vocab_padded(self):
        return ((self.vocab_size + 63) // 64) * 64

    def has_ve(self, i):
        return self.value_embeds and (i % 2 == (self.n_layer - 1) % 2)

    def window(self, i):
        if i == self.n_layer - 1:
            return self.seq_len
        c = self.window_pattern[i % len(self.window_pattern)]
        assert c in "SL", f"bad window pattern char {c!r}"
        return self.seq_len if c == "L" else self.short_window


def _bf16_round(x):
    """x rounded to a bf16 value, kept in x's dtype: to nearest, or stochastically when a generator is set
    (random low bits added to the fp32 pattern, then truncated: a magnitude rounds up with probability
    equal to its distance from the lower bf16 value)."""
    if _bf16_generator is None:
        return x.to(torch.bfloat16).to(x.dtype)
    bits = x.to(torch.float32).view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=_bf16_generator, dtype=torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(x.dtype)


class _Bf16Round(torch.autograd.Function):
    """A value stored in bf16: rounds the tensor, and its gradient on the way back."""

    @staticmethod
    def forward(ctx, x):
        return _bf16_round(x)

    @staticmethod
    def backward(ctx, g):
        return _bf16_round(g)


_bf16_storage = False
_bf16_generator = None


def set_bf16_storage(on, generator=None):
    """On: store() rounds activations (and, through autograd, their gradients) to bf16 where the CUDA
    backend keeps them in bf16 -- to nearest, or stochastically with `generator`. make_refs.py uses it to
    measure the error a bf16 implementation of this model must expect, per tensor, against the float64 truth."""
    global _bf16_storage, _bf16_generator
    _bf16_storage = on
    _bf16_generator = generator if on else None


def bf16_round(x):
    """x rounded to bf16 as the storage currently does (for weights copied into a bf16 run)."""
    return _bf16_round(x)


def store(x):
    return _Bf16Round.apply(x) if _bf16_storage else x


def norm(x):
    """RMSNorm over the last dim, no weight, in x's dtype."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + NORM_EPS)


def rotary_tables(T, D, dtype):
    """cos, sin of shape (T, D/2), computed in float32 then converted to dtype."""
    channel = torch.arange(0, D, 2, dtype=torch.float32)
    inv_freq = 1.0 / (ROPE_BASE ** (channel / D))
    t = torch.arange(T, dtype=torch.float32)
    ang = torch.outer(t, inv_freq)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rotary(x, cos, sin):
    """x (B, T, nh, D); half-split layout, rotation by -theta:
    out1 = x1*cos + x2*sin; out2 = -x1*sin + x2*cos."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


def window_mask(T, w):
    """(T, T) bool, True where query i may attend key j: i - w <= j <= i."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return (j <= i) & (i - j <= w)


def attention(q, k, v, w):
    """q (B, T, H, D), k/v (B, T, Hkv, D) -> y (B, T, H, D). Causal, window w, scale 1/sqrt(D).
    GQA: query head h reads kv head h // (H // Hkv)."""
    B, T, H, D = q.shape
    g = H // k.shape[2]
    kr = k.repeat_interleave(g, dim=2).transpose(1, 2)  # (B, H, T, D)
    vr = v.repeat_interleave(g, dim=2).transpose(1, 2)
    qt = q.transpose(1, 2)
    att = (qt @ kr.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
    att = att.masked_fill(~window_mask(T, w), float("-inf"))
    att = torch.softmax(att, dim=-1)
    return (att @ vr).transpose(1, 2)  # (B, T, H, D)


def xsa(y, v, alpha):
    """y (B, T, H, D) attention output, v (B, T, Hkv, D) values attention consumed, alpha a number or (H, 1).
    z = y - alpha * (y.v / (v.v + eps)) * v, v = own value of kv head h // (H // Hkv)."""
    g = y.shape[2] // v.shape[2]
    vs = v.repeat_interleave(g, dim=2)  # (B, T, H, D)
    s = (y * vs).sum(dim=-1, keepdim=True)
    n = (vs * vs).sum(dim=-1, keepdim=True) + XSA_EPS
    return y - alpha * (s / n) * vs


def _cos(a, b):
    """cos(a, b) over the last dim, 0 where |a||b| == 0 (there a.b == 0 too, so dividing by 1 gives it)."""
    n = a.norm(dim=-1) * b.norm(dim=-1)
    return (a * b).sum(-1) / n.masked_fill(n == 0, 1.0)


def similarity_diagnostics(q, k, v, y, z, w):
    """One layer's attention-similarity statistics (dev/docs/model.md#xsa-diagnostics), in float64,
    from what attention and XSA saw: q (B, T, H, D), k/v (B, T, Hkv, D), y/z (B, T, H, D) before/after XSA,
    window w. Means over batch, heads and positions t >= 1 (at t = 0 the only key is the token itself, y = v):
    cos(y, v) and cos(z, v) with the token's own value, and the softmax weight a query puts on its own key.
    And value_cos, the baseline cos(y, v) is read against: the mean cos(v_i, v_j) over the pairs of different
    positions i != j (all T of them) of a row and kv head, averaged over rows and kv heads."""
    q, k, v, y, z = (t.detach().double() for t in (q, k, v, y, z))
    T, H, D = q.shape[1:]
    g = H // k.shape[2]
    ks, vs = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)  # (B, T, H, D): own kv head
    s = torch.einsum("bihd,bjhd->bhij", q, ks) / math.sqrt(D)
    s = s.masked_fill(~window_mask(T, w), float("-inf"))
    self_weight = (s.diagonal(dim1=-2, dim2=-1) - torch.logsumexp(s, dim=-1)).exp()  # (B, H, T)
    pair_cos = _cos(v[:, :, None], v[:, None, :])  # (B, T, T, Hkv): cos(v_i, v_j)
    off_diagonal = ~torch.eye(T, dtype=torch.bool)[None, :, :, None].expand_as(pair_cos)
    return dict(cos_yv=float(_cos(y, vs)[:, 1:].mean()), cos_zv=float(_cos(z, vs)[:, 1:].mean()),
                self_weight=float(self_weight[:, :, 1:].mean()), value_cos=float(pair_cos[off_diagonal].mean()))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        C, H, Hkv, D = cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        assert H % Hkv == 0 and D % 2 == 0
        self.cfg, self.layer = cfg, i
        self.c_q = nn.Linear(C, H * D, bias=False)
        self.c_k = nn.Linear(C, Hkv * D, bias=False)
        self.c_v = nn.Linear(C, Hkv * D, bias=False)
        self.c_proj = nn.Linear(H * D, C, bias=False)
        if cfg.has_ve(i):
            self.ve_gate = nn.Linear(12, Hkv, bias=False)  # weight (Hkv, 12)
        if cfg.xsa_learnable and i in cfg.xsa_layers:
            self.xsa_logit = nn.Parameter(torch.zeros(H))  # alpha_h = tanh(xsa_logit[h]); 0 = the baseline

    def forward(self, h, ve, cos, sin, record=None):
        cfg = self.cfg
        B, T, _ = h.shape
        H, Hkv, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        q = store(self.c_q(h)).view(B, T, H, D)
        k = store(self.c_k(h)).view(B, T, Hkv, D)
        v = store(self.c_v(h)).view(B, T, Hkv, D)
        if ve is not None:
            gate = 3.0 * torch.sigmoid(F.linear(h[..., :12], self.ve_gate.weight))  # (B, T, Hkv)
            v = store(v + gate[..., None] * ve.view(B, T, Hkv, D))
        q = store(apply_rotary(q, cos, sin))
        k = store(apply_rotary(k, cos, sin))
        q = store(norm(q) * 1.2)
        k = store(norm(k) * 1.2)
        y = store(attention(q, k, v, cfg.window(self.layer)))
        if self.layer in cfg.xsa_layers:
            alpha = torch.tanh(self.xsa_logit)[:, None] if cfg.xsa_learnable else cfg.xsa_alpha
            z = store(xsa(y, v, alpha))
        else:
            z = y
        if record is not None:
            record.append({n: t.detach() for n, t in dict(q=q, k=k, v=v, y=y, z=z).items()})
        return store(self.c_proj(z.reshape(B, T, H * D)))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg.n_embd
        self.c_fc = nn.Linear(C, 4 * C, bias=False)
        self.c_proj = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        return store(self.c_proj(store(F.relu(store(self.c_fc(x))).square())))


class Block(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        self.attn = CausalSelfAttention(cfg, i)
        self.mlp = MLP(cfg)

    def forward(self, x, ve, cos, sin, record=None):
        x = store(x + self.attn(store(norm(x)), ve, cos, sin, record))
        x = store(x + self.mlp(store(norm(x))))
        return x


class GPT(nn.Module):
    def __init__(self, cfg, dtype=torch.float64):
        super().__init__()
        assert cfg.n_embd >= 24, "smear gate and ve gate read the first 24 / 12 channels"
        for i in cfg.xsa_layers:
            assert 0 <= i < cfg.n_layer, f"xsa layer {i} out of range"
        self.cfg = cfg
        L, C, Vp = cfg.n_layer, cfg.n_embd, cfg.vocab_padded
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(Vp, C),
            h=nn.ModuleList([Block(cfg, i) for i in range(L)]),
        ))
        self.lm_head = nn.Linear(C, Vp, bias=False)
        self.resid_lambdas = nn.Parameter(torch.ones(L))
        self.x0_lambdas = nn.Parameter(torch.zeros(L))
        if cfg.smear:
            self.smear_gate = nn.Linear(24, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.backout_lambda = nn.Parameter(torch.zeros(1))
        if cfg.value_embeds:
            kv = cfg.n_kv_head * cfg.head_dim
            self.value_embeds = nn.ModuleDict(
                {str(i): nn.Embedding(Vp, kv) for i in range(L) if cfg.has_ve(i)})
        self.to(dtype)
        self.dtype = dtype

    def forward(self, idx, targets=None, record=None):
        """record: an optional list; each attention layer appends {q, k, v, y, z}, the tensors attention and
        XSA consumed and produced (after store(), so bf16-rounded in a bf16 run), for similarity_diagnostics."""
        cfg = self.cfg
        B, T = idx.shape
        cos, sin = rotary_tables(T, cfg.head_dim, self.dtype)
        x = store(norm(store(self.transformer.wte(idx))))
        if cfg.smear and T > 1:
            # gate_t from the current token's normed embedding, times the unsmeared previous one
            gate = self.smear_lambda * torch.sigmoid(F.linear(x[:, 1:, :24], self.smear_gate.weight))
            x = store(torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1))
        x0 = x
        x_backout = None
        for i, block in enumerate(self.transformer.h):
            x = store(self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0)
            ve = store(self.value_embeds[str(i)](idx)) if cfg.has_ve(i) else None
            x = block(x, ve, cos, sin, record)
            if i == cfg.n_layer // 2:
                x_backout = x
        x = store(x - self.backout_lambda * x_backout)
        x = store(norm(x))
        logits = store(self.lm_head(x)[..., :cfg.vocab_size])
        logits = store(cfg.softcap * torch.tanh(logits / cfg.softcap))
        loss = None
        if targets is not None:
            # target -1 = no prediction (SFT's masked positions), nanochat's ignore_index; the mean is over the rest
            loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1), ignore_index=-1)
        return logits, loss


def random_init(model, seed):
    """Deliberately *not* nanochat's init (whose zeros would hide bugs): every tensor nonzero and generic.
    Values are drawn in float32 from a seeded torch.Generator, in named_parameters() order, then copied
    into the model dtype (exactly representable in float64)."""
    cfg = model.cfg
    L, C = cfg.n_layer, cfg.n_embd
    g = torch.Generator().manual_seed(seed)

    def unif(shape, s):
        return (torch.rand(shape, generator=g, dtype=torch.float32) * 2.0 - 1.0) * s

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    ramp = torch.arange(L, dtype=torch.float32) / max(L - 1, 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name == "transformer.wte.weight":
                w = normal(shape, 1.0)
            elif name == "lm_head.weight":
                w = normal(shape, 2.0 / math.sqrt(C))
            elif name.startswith("value_embeds."):
                w = unif(shape, 1.0)
            elif name.endswith("ve_gate.weight"):
                w = unif(shape, 0.5)
            elif name == "smear_gate.weight":
                w = unif(shape, 0.3)
            elif name == "resid_lambdas":
                w = 1.15 - 0.10 * ramp + unif(shape, 0.05)
            elif name == "x0_lambdas":
                w = 0.20 - 0.15 * ramp + unif(shape, 0.02)
            elif name == "smear_lambda":
                w = torch.full(shape, 0.7)
            elif name == "backout_lambda":
                w = torch.full(shape, 0.3)
            elif name.endswith("attn.xsa_logit"):
                w = unif(shape, 1.0)  # alpha = tanh(a) within (-0.77, 0.77), a different value per head
            elif name.startswith("transformer.h.") and p.dim() == 2:
                w = unif(shape, math.sqrt(3.0 / shape[1]))
            else:
                raise KeyError(f"no init rule for {name}")
            p.copy_(w.to(torch.float32))
    return model
