#!/usr/bin/env python3
"""
Generation speed: ./sample (the KV cache of llmc/engine.h) against PyTorch running the same greedy
generation with its own KV cache, side by side on the same model, prompt and thread count.

    python3 dev/bench/bench_generate.py [--depth 12] [--prompt-tokens 512] [--new 128] [--threads 2] [--xsa-alpha 0]

The model: nanochat's shape for --depth (dim 64 x depth, heads of 128, SSSL windows with the short window
T/4, value embeddings, smear; T = 2048) with the reference model's random initialisation (every tensor
nonzero), the vocabulary of --tokenizer (default the embedded corpus's). The prompt: the start of the
embedded corpus's validation text, cut to --prompt-tokens tokens (BOS first). PyTorch side: the reference
model's weights (dev/reference/model.py) run by a KV-cache generator written here (prefill: one forward with
scaled_dot_product_attention; decode: one token at a time over preallocated K/V caches), fp32, inference
mode. Prints both sides' prefill and decode tokens/s, the ratio, and whether the greedy tokens agree.
Needs torch and numpy (the benchmark baseline is a current PyTorch: dev/docs/performance.md).
"""
import argparse
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "dev", "reference"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import xsa_cli  # noqa: E402
import require_torch  # noqa: F401,E402  (one error line where PyTorch is missing)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import safetensors_io  # noqa: E402
from model import GPT, Config, apply_rotary, norm, random_init, rotary_tables  # noqa: E402


def read_tokenizer_pieces(path):
    """The bytes of every token of a tokenizer file (dev/data/README.md), and the BOS id."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, V, bos = struct.unpack_from("<4i", data, 0)
    pos = 1024 + (struct.unpack_from("<i", data, 20)[0] if version == 2 else 0)
    pieces = []
    for _ in range(V):
        _, n = struct.unpack_from("<BI", data, pos)
        pieces.append(data[pos + 5:pos + 5 + n])
        pos += 5 + n
    return pieces, bos


def shard_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    _, version, n = struct.unpack_from("<3i", data, 0)
    return list(struct.unpack_from("<%d%s" % (n, "H" if version == 1 else "I"), data, 1024))


def metadata(cfg, tokenizer):
    return {"vocab_size": str(cfg.vocab_size), "n_layer": str(cfg.n_layer), "n_head": str(cfg.n_head),
            "n_kv_head": str(cfg.n_kv_head), "head_dim": str(cfg.head_dim), "n_embd": str(cfg.n_embd),
            "seq_len": str(cfg.seq_len), "window_pattern": cfg.window_pattern, "short_window": str(cfg.short_window),
            "value_embeds": "1", "smear": "1", "xsa_alpha": repr(cfg.xsa_alpha), "xsa_learnable": "0",
            "xsa_layers": ",".join(str(i) for i in cfg.xsa_layers), "tokenizer": tokenizer}


class TorchGenerator:
    """Greedy generation with a KV cache for one row, on the reference model's modules and weights."""

    def __init__(self, model, max_len):
        self.m, self.cfg = model, model.cfg
        c = self.cfg
        self.cos, self.sin = rotary_tables(max_len, c.head_dim, torch.float32)
        self.K = torch.zeros(c.n_layer, max_len, c.n_kv_head, c.head_dim)
        self.V = torch.zeros_like(self.K)
        self.len = 0
        self.prev = None  # the previous token's normed embedding (smear)

    def _attention(self, i, q, pos0, T):
        """q (T, H, D) of positions pos0..pos0+T-1 over the cache -> y (T, H, D), window of layer i."""
        c = self.cfg
        w, end = c.window(i), pos0 + T
        start = max(0, pos0 - w)
        k = self.K[i, start:end].transpose(0, 1)  # (Hkv, n, D)
        v = self.V[i, start:end].transpose(0, 1)
        g = c.n_head // c.n_kv_head
        if g > 1:
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        qi = torch.arange(pos0, end)[:, None]
        kj = torch.arange(start, end)[None, :]
        mask = (kj <= qi) & (qi - kj <= w)
        return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)

    def step(self, tokens):
        """Runs tokens (a list) at positions self.len.. ; returns the last position's softcapped logits."""
        m, c = self.m, self.cfg
        T, pos0 = len(tokens), self.len
        idx = torch.tensor(tokens)
        H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
        e = norm(m.transformer.wte(idx))  # (T, C)
        prev = torch.cat([self.prev[None], e[:-1]]) if self.prev is not None else torch.cat([e[:1] * 0, e[:-1]])
        gate = m.smear_lambda * torch.sigmoid(F.linear(e[:, :24], m.smear_gate.weight))
        if self.prev is None:
            gate = torch.cat([gate[:1] * 0, gate[1:]])  # position 0 has no previous token
        x = e + gate * prev
        self.prev = e[-1]
        x0, xb = x, None
        cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]
        for i, block in enumerate(m.transformer.h):
            a = block.attn
            x = m.resid_lambdas[i] * x + m.x0_lambdas[i] * x0
            h = norm(x)
            q, k, v = a.c_q(h).view(T, H, D), a.c_k(h).view(T, Hkv, D), a.c_v(h).view(T, Hkv, D)
            if c.has_ve(i):
                ve = m.value_embeds[str(i)](idx).view(T, Hkv, D)
                v = v + 3.0 * torch.sigmoid(F.linear(h[:, :12], a.ve_gate.weight))[..., None] * ve
            q = norm(apply_rotary(q[None], cos, sin)[0]) * 1.2
            k = norm(apply_rotary(k[None], cos, sin)[0]) * 1.2
            self.K[i, pos0:pos0 + T], self.V[i, pos0:pos0 + T] = k, v
            y = self._attention(i, q, pos0, T)
            if i in c.xsa_layers:
                vs = v.repeat_interleave(H // Hkv, 1)
                y = y - c.xsa_alpha * ((y * vs).sum(-1, keepdim=True) / ((vs * vs).sum(-1, keepdim=True) + 1e-8)) * vs
            x = x + a.c_proj(y.reshape(T, H * D))
            x = x + block.mlp(norm(x))
            if i == c.n_layer // 2:
                xb = x
        x = norm(x[-1] - m.backout_lambda * xb[-1])
        logits = m.lm_head(x)[:c.vocab_size]
        self.len += T
        return c.softcap * torch.tanh(logits / c.softcap)


def main():
    ap = xsa_cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--xsa-alpha", type=float, default=0.0)
    ap.add_argument("--tokenizer", default="dev/data/devil/tokenizer.bin")
    ap.add_argument("--val", default="dev/data/devil/val_000000.bin")
    ap.add_argument("--sample", default="./sample", help="the sample binary (default ./sample: make sample)")
    a = ap.parse_args()
    os.chdir(REPO)
    torch.set_num_threads(a.threads)
    pieces, bos = read_tokenizer_pieces(a.tokenizer)
    dim = 64 * a.depth
    cfg = Config(vocab_size=len(pieces), n_layer=a.depth, n_head=dim // 128, n_kv_head=dim // 128, head_dim=128, n_embd=dim,
                 seq_len=2048, window_pattern="SSSL", short_window=512, value_embeds=True, smear=True, xsa_alpha=a.xsa_alpha,
                 xsa_layers=list(range(a.depth)) if a.xsa_alpha else [])
    model = random_init(GPT(cfg, dtype=torch.float32), 1234).eval()
    # the prompt: the validation text's first tokens as text (valid UTF-8), which both sides encode with the
    # C++ encoder (sample does; dev/data/bin/tokenize gives PyTorch the same ids)
    text = b"".join(pieces[t] for t in [t for t in shard_tokens(a.val) if t != bos][:a.prompt_tokens - 1])
    text = text.decode("utf-8", "ignore").encode()
    p = subprocess.run([os.path.join(REPO, "dev", "data", "bin", "tokenize"), a.tokenizer, "-"], input=text, stdout=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit("bench_generate.py: error: dev/data/bin/tokenize failed (make dev/data/bin/tokenize)")
    ids = [int(t) for t in p.stdout.split()]

    with tempfile.TemporaryDirectory(prefix="xsa_bench_generate_") as tmp:
        weights = os.path.join(tmp, "model.safetensors")
        safetensors_io.save(weights, {n: p for n, p in model.named_parameters()}, metadata(cfg, a.tokenizer))
        cmd = [a.sample, "-e", weights, "--tokenizer", a.tokenizer, "-t", "0", "-n", str(a.new), "-p", text.decode()]
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        if p.returncode != 0:
            sys.exit("bench_generate.py: error: %s failed: %s" % (a.sample, p.stderr.decode(errors="replace").strip()))
        ours_text = p.stdout.rstrip(b"\n")
        m = re.search(r"prefill (\d+) tokens at ([\d.]+) tokens/s, decode (\d+) steps at ([\d.]+) tokens/s", p.stderr.decode())
        prompt_len, ours_prefill, ours_decode = int(m.group(1)), float(m.group(2)), float(m.group(4))

    with torch.inference_mode():
        prompt = [bos] + ids
        gen = TorchGenerator(model, len(prompt) + a.new)
        t0 = time.perf_counter()
        logits = gen.step(prompt)
        t_prefill = time.perf_counter() - t0
        out = [int(torch.argmax(logits))]
        t0 = time.perf_counter()
        while len(out) < a.new and out[-1] != bos:
            logits = gen.step([out[-1]])
            out.append(int(torch.argmax(logits)))
        t_decode = time.perf_counter() - t0
    if out[-1] == bos:
        out.pop()
    torch_text = text + b"".join(pieces[t] for t in out)
    torch_prefill, torch_decode = len(prompt) / t_prefill, (len(out) - 1) / t_decode

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    params = sum(p.numel() for p in model.parameters())
    print(f"model: d{a.depth} (dim {dim}, {dim // 128} heads of 128, vocab {cfg.vocab_size}, {params / 1e6:.1f}M parameters), "
          f"XSA alpha {a.xsa_alpha}; prompt {prompt_len} tokens, {a.new} new tokens, greedy, batch 1")
    print(f"machine: {cpu}, {a.threads} threads; torch {torch.__version__}")
    print(f"{'':10s} {'ours':>12s} {'torch':>12s} {'ratio':>8s}")
    print(f"{'prefill':10s} {ours_prefill:12.1f} {torch_prefill:12.1f} {ours_prefill / torch_prefill:7.2f}x   tokens/s")
    print(f"{'decode':10s} {ours_decode:12.2f} {torch_decode:12.2f} {ours_decode / torch_decode:7.2f}x   tokens/s")
    same = ours_text == torch_text
    where = next((i for i in range(min(len(ours_text), len(torch_text))) if ours_text[i] != torch_text[i]), None)
    print("greedy text: %s" % ("identical" if same else "differs from byte %s of %d" % (where, len(torch_text))))


if __name__ == "__main__":
    main()
