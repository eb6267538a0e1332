"""
PyTorch on the same GPU: the baseline for dev/bench/bench_fwdbwd_cuda (dev/gpu_check.sh's bench stages).
Times one training micro-step -- zero_grad, forward with the loss, backward; the optimizer EXCLUDED, as in
bench_fwdbwd's "ours tok/s ... ms/iter" line -- of the PyTorch reference model (dev/reference/model.py) at this
project's d12 and d24 shapes, in bf16 autocast (fp32 weights and gradients), eager and under torch.compile:

    python3 dev/bench/torch_gpu.py                        # d24 then d12, 32 rows x 2048, eager then compiled
    python3 dev/bench/torch_gpu.py --configs d12 --rows 16 --compile off
    python3 dev/bench/torch_gpu.py --tiny                 # 2 layers, dim 128, T 128 on the CPU in fp32 (its test)
    python3 dev/bench/torch_gpu.py --compare TORCH_LOG d24=BENCH_D24_LOG d12=BENCH_D12_LOG   # ours / PyTorch table

The model is the reference's GPT (value embeddings, smear, backout, softcap, the SSSL windows, QK-norm,
rotary; XSA with --xsa-alpha) with two things replaced by what a PyTorch user would write, the math kept:
  * attention: F.scaled_dot_product_attention, is_causal where the window covers the sequence, else the
    window's boolean mask (nanochat's own fallback without flash-attn 3); under torch.compile the windowed
    layers use flex_attention with the same sliding-window mask (its kernels skip the masked blocks), the
    full layers SDPA. Each run first checks, on one row without gradients, that its loss equals the
    reference attention's (materialised scores);
  * the rotary tables (computed in float32 as the reference does) are made once, on the device, in the
    autocast dtype (nanochat keeps them in bf16), instead of on the CPU in every forward.
Each (config, mode) runs in a child process: a compile that hangs costs its cap (--compile-timeout) and the
rest still runs; a size that runs out of memory is retried with half the rows (the compiled run starts from
the rows the eager one fit). Weights: PyTorch's default initialisation made on the device with generic
lambdas (the reference's random_init draws on the CPU: seconds per child at d24); on the CPU random_init.
FLOPs per token as train_gpt.cu's flops_per_token (nanochat's): 6 x the weights of every linear layer
(lm_head padded, ve_gate, smear_gate) + 12 x heads x head_dim x min(window, T) per layer; MFU against
--peak-tflops (989: H100/H200 bf16 dense).

Output: a header (torch, CUDA, device), one line per run, and last one line
    torch_gpu_json {...}
with every run (ms per micro-step, tok/s = rows x T / seconds, MFU, memory, compile seconds) and what was
skipped and why. --compare reads that line and bench_fwdbwd_cuda's logs and prints a markdown table with
ours / PyTorch (standard library only: it needs no torch).
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import xsa_cli  # noqa: E402

# name: layers, dim, heads (= kv heads), head_dim, T, vocab, short window (None: nanochat's ceil(T/4/128)*128)
PRESETS = {
    "d12": dict(layers=12, dim=768, heads=12, head_dim=64, seq_len=2048, vocab=32768, short_window=None),
    "d24": dict(layers=24, dim=1024, heads=16, head_dim=64, seq_len=2048, vocab=32768, short_window=None),
    "tiny": dict(layers=2, dim=128, heads=2, head_dim=64, seq_len=128, vocab=512, short_window=32),
}
JSON_TAG = "torch_gpu_json "
CHILD_TAG = "torch_gpu_child "
OOM_EXIT = 3
SMEAR_CHANNELS = 24


def default_short_window(T):
    return (T + 511) // 512 * 128


def shape(name, args=None):
    """The model shape of a preset, with --seq-len / --short-window applied."""
    s = dict(PRESETS[name])
    if args is not None and args.seq_len:
        s["seq_len"] = args.seq_len
    if args is not None and args.short_window:
        s["short_window"] = args.short_window
    if s["short_window"] is None:
        s["short_window"] = default_short_window(s["seq_len"])
    return s


def windows(s):
    """Keys a query sees besides itself, per layer: SSSL tiled, the last layer long (reference Config.window)."""
    L, T = s["layers"], s["seq_len"]
    return [T if (i == L - 1 or "SSSL"[i % 4] == "L") else s["short_window"] for i in range(L)]


def flop_count(s):
    """(matmul weights, attention FLOPs per token, FLOPs per token): train_gpt.cu's flops_per_token."""
    L, C, H, D, T = s["layers"], s["dim"], s["heads"], s["head_dim"], s["seq_len"]
    Vp = (s["vocab"] + 63) // 64 * 64
    n_ve = sum(1 for i in range(L) if i % 2 == (L - 1) % 2)  # value embeddings (and ve_gate) on these layers
    matmul = L * (C * H * D * 3 + H * D * C + 8 * C * C) + n_ve * 12 * H + Vp * C + SMEAR_CHANNELS
    attention = sum(12 * H * D * min(w, T) for w in windows(s))
    return matmul, attention, 6 * matmul + attention


def describe(name, s, xsa_alpha):
    matmul, attention, f = flop_count(s)
    return (f"{name}: {s['layers']} layers, dim {s['dim']}, {s['heads']} heads x {s['head_dim']}, T {s['seq_len']}, "
            f"vocab {s['vocab']}, SSSL windows (short {s['short_window']}), value embeddings, smear, "
            f"{'XSA alpha %g on every layer' % xsa_alpha if xsa_alpha else 'XSA off'}; "
            f"{f:.4e} FLOPs/token (6 x {matmul:,} matmul weights + {attention:,} attention)")


# ------------------------------------------------------------------------------------------------------
# The child: one (config, mode, rows) measurement; prints progress on stderr, its result on stdout

def child(spec):
    try:  # Linux: die with the parent (a parent killed outright must not leave a compile running on the GPU)
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    import require_torch  # noqa: F401  (one error line where PyTorch is missing)
    import torch
    import torch.nn.functional as F
    import model as reference
    from model import GPT, Config, random_init

    dev = torch.device(spec["device"])
    if dev.type == "cpu":
        torch.set_num_threads(spec["threads"])
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    s = spec["shape"]
    T, rows = s["seq_len"], spec["rows"]
    amp = spec["dtype"] == "bf16"
    amp_dtype = torch.bfloat16
    table_dtype = amp_dtype if amp else torch.float32
    xsa_layers = list(range(s["layers"])) if spec["xsa_alpha"] else []
    cfg = Config(vocab_size=s["vocab"], n_layer=s["layers"], n_head=s["heads"], n_kv_head=s["heads"],
                 head_dim=s["head_dim"], n_embd=s["dim"], seq_len=T, window_pattern="SSSL",
                 short_window=s["short_window"], value_embeds=True, smear=True, xsa_alpha=spec["xsa_alpha"],
                 xsa_layers=xsa_layers)
    out = dict(config=spec["name"], mode=spec["mode"], rows=rows, T=T, dtype="bf16 autocast" if amp else "fp32",
               torch=torch.__version__, cuda=torch.version.cuda,
               device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (%d threads)" % torch.get_num_threads())

    def log(text):
        print(f"  [{spec['name']} {spec['mode']} rows {rows}] {text}", file=sys.stderr, flush=True)

    # ---- the model, on the device
    t0 = time.perf_counter()
    if dev.type == "cpu":
        model = random_init(GPT(cfg, dtype=torch.float32), spec["seed"])
    else:
        with torch.device(dev):
            model = GPT(cfg, dtype=torch.float32)
        with torch.no_grad():  # every path live (the default init leaves these at 0 or 1)
            L = cfg.n_layer
            ramp = torch.arange(L, dtype=torch.float32, device=dev) / max(L - 1, 1)
            model.resid_lambdas.copy_(1.15 - 0.10 * ramp)
            model.x0_lambdas.copy_(0.20 - 0.15 * ramp)
            model.backout_lambda.fill_(0.3)
            model.smear_lambda.fill_(0.7)
            for block in model.transformer.h:
                if hasattr(block.attn, "xsa_logit"):
                    block.attn.xsa_logit.uniform_(-1.0, 1.0)
    matmul = sum(p.numel() for n, p in model.named_parameters()
                 if p.dim() == 2 and not n.startswith(("transformer.wte", "value_embeds")))
    want_matmul, attention_flops, flops_per_token = flop_count(s)
    assert matmul == want_matmul, f"matmul weights of the model {matmul} != counted {want_matmul}"
    out.update(params=sum(p.numel() for p in model.parameters()), flops_per_token=flops_per_token)
    log(f"model built in {time.perf_counter() - t0:.1f} s: {out['params']:,} parameters")

    # ---- the fast paths: rotary tables on the device, SDPA / flex attention
    cos, sin = reference.rotary_tables(T, cfg.head_dim, torch.float32)
    cos, sin = cos.to(dev, table_dtype), sin.to(dev, table_dtype)

    def rotary_tables(T_, D_, dtype_):
        assert (T_, D_) == (T, cfg.head_dim)
        return cos, sin

    reference.rotary_tables = rotary_tables  # GPT.forward looks both up in the module at each call
    reference_attention = reference.attention
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    masks = {w: reference.window_mask(T, w).to(dev) for w in set(windows(s)) if w < T - 1}
    block_masks = {}

    def cast(*ts):  # SDPA and flex want one dtype: q, k in bf16 from the linears and rotary, v in fp32 after the value embedding
        return [t.to(amp_dtype) for t in ts] if amp else list(ts)

    def sdpa_attention(q, k, v, w):
        """The reference's attention(q, k, v, w) with F.scaled_dot_product_attention: (B, T, H, D) in and out."""
        qt, kt, vt = cast(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        if w >= T - 1:
            y = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=masks[w])
        return y.transpose(1, 2)

    def flex_attention_(q, k, v, w):
        """Windowed layers with flex_attention (the same mask as a block mask), full layers with SDPA."""
        if w >= T - 1:
            return sdpa_attention(q, k, v, w)
        qt, kt, vt = cast(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return flex_attention(qt, kt, vt, block_mask=block_masks[w]).transpose(1, 2)

    attention = spec["attention"]
    if attention == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        for w in masks:
            def mask_mod(b, h, q_idx, kv_idx, w=w):
                return (kv_idx <= q_idx) & (q_idx - kv_idx <= w)
            block_masks[w] = create_block_mask(mask_mod, None, None, T, T, device=str(dev))
    chosen = dict(sdpa=sdpa_attention, flex=flex_attention_, reference=reference_attention)[attention]
    if attention in ("sdpa", "flex") and not has_sdpa:
        raise SystemExit(f"error: torch {torch.__version__} has no F.scaled_dot_product_attention (use --attention reference)")
    out["attention"] = attention

    def autocast():
        return torch.autocast(device_type=dev.type, dtype=amp_dtype, enabled=amp)

    g = torch.Generator(device=dev).manual_seed(spec["seed"] + 1)
    idx = torch.randint(0, cfg.vocab_size, (rows, T), generator=g, device=dev)
    targets = torch.randint(0, cfg.vocab_size, (rows, T), generator=g, device=dev)

    # ---- the same loss as the reference attention, on one row, no gradients
    if attention != "reference":
        with torch.no_grad(), autocast():
            reference.attention = reference_attention
            want = model(idx[:1], targets[:1])[1].item()
            reference.attention = chosen
            got = model(idx[:1], targets[:1])[1].item()
        rel = abs(got - want) / abs(want)
        tol = 1e-2 if amp else 1e-4
        out["check"] = dict(loss=got, reference_loss=want, rel=rel, tol=tol)
        log(f"loss with {attention} {got:.6f}, with the reference attention {want:.6f} (relative difference {rel:.1e}, tolerance {tol:g})")
        if not rel <= tol:
            raise SystemExit(f"error: the loss with {attention} attention {got:.6f} != the reference attention's {want:.6f}")
    reference.attention = chosen

    def loss_of(idx, targets):  # the loss alone: under torch.compile the logits need not be an output
        return model(idx, targets)[1]

    fwd = torch.compile(loss_of, dynamic=False) if spec["mode"] == "compile" else loss_of

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def step():
        model.zero_grad(set_to_none=True)
        with autocast():
            loss = fwd(idx, targets)
        loss.backward()
        return loss

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    try:
        for it in range(spec["warmup"] + spec["iters"]):
            sync()
            t0 = time.perf_counter()
            loss = step()
            sync()
            dt = time.perf_counter() - t0
            if it == 0:
                out["first_step_s"] = dt  # under torch.compile: the compilation (forward and backward) and one step
                log(f"first step {dt:.2f} s{' (compiles)' if spec['mode'] == 'compile' else ''}")
            if it >= spec["warmup"]:
                times.append(dt)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one; so is the message of older versions
        if "out of memory" not in str(e):
            raise
        out.update(oom=True, error=str(e).split("\n")[0][:300])
        print(CHILD_TAG + json.dumps(out), flush=True)
        sys.exit(OOM_EXIT)
    sec = statistics.median(times)
    tok_s = rows * T / sec
    out.update(loss=loss.item(), iters=len(times), warmup=spec["warmup"], ms=sec * 1e3, ms_min=min(times) * 1e3,
               tok_s=tok_s, tflops=tok_s * flops_per_token / 1e12,
               mfu=tok_s * flops_per_token / (spec["peak_tflops"] * 1e12))
    if dev.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    print(CHILD_TAG + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------------------
# The parent: runs the children, prints the lines and the JSON

class Interrupted(Exception):
    pass


def run_child(spec, timeout):
    """(result dict or None, why-not text). The child runs in its own session: a timeout kills it and its
    compile workers."""
    argv = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    env = dict(os.environ)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=None, env=env, start_new_session=True)
    try:
        stdout, _ = p.communicate(timeout=timeout)
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        if isinstance(e, subprocess.TimeoutExpired):
            return None, f"timed out after {timeout:g} s"
        raise
    result = None
    for line in stdout.decode(errors="replace").splitlines():
        if line.startswith(CHILD_TAG):
            result = json.loads(line[len(CHILD_TAG):])
    if p.returncode == OOM_EXIT and result:
        return result, "out of memory"
    if p.returncode != 0 or result is None:
        return None, f"failed (exit {p.returncode}; its error is above)"
    return result, ""


def fmt_run(r, peak):
    text = (f"{r['config']} {r['mode']:7s} ({r['attention']}): rows {r['rows']} x {r['T']} | {r['ms']:.2f} ms per micro-step "
            f"(min {r['ms_min']:.2f}) | {r['tok_s']:,.1f} tok/s | {r['tflops']:.3g} TFLOP/s, MFU {100 * r['mfu']:.1f}% of {peak:g} "
            f"| loss {r['loss']:.4f}")
    if "peak_mem_gib" in r:
        text += f" | peak memory {r['peak_mem_gib']:.1f} GiB"
    if r["mode"] == "compile":
        text += f" | first step (compile) {r['first_step_s']:.1f} s"
    if r.get("rows_tried"):
        text += " | out of memory at rows " + ", ".join(str(x) for x in r["rows_tried"])
    return text


def parent(args):
    import require_torch  # noqa: F401
    import torch
    t_start = time.time()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    names = [n for n in args.configs.split(",") if n]
    for n in names:
        if n not in PRESETS:
            sys.exit(f"error: unknown config {n!r} (d12, d24, tiny)")
    has_compile = hasattr(torch, "compile")
    compile_on = args.compile == "on" or (args.compile == "auto" and device == "cuda")
    eager_attention = args.attention or ("sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "reference")
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
        has_flex = True
    except ImportError:
        has_flex = False
    compile_attention = args.compile_attention or ("flex" if has_flex else eager_attention)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        where = (f"device {props.name} (compute capability {props.major}.{props.minor}, {props.total_memory / 2**30:.1f} GiB, "
                 f"{torch.cuda.device_count()} visible), cuDNN {torch.backends.cudnn.version()}")
    else:
        where = "CPU"
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, python {sys.version.split()[0]}, {where}", flush=True)
    print(f"timed: one micro-step = zero_grad + forward (with the loss) + backward, the optimizer excluded; "
          f"median of {args.iters} after {args.warmup} warm-up; {args.dtype} {'autocast (fp32 weights)' if args.dtype == 'bf16' else ''}", flush=True)
    for n in names:
        print(describe(n, shape(n, args), args.xsa_alpha), flush=True)

    report = dict(torch=torch.__version__, cuda=torch.version.cuda, device=None, dtype=args.dtype,
                  timed="forward + backward (zero_grad, loss), optimizer excluded", peak_tflops=args.peak_tflops,
                  xsa_alpha=args.xsa_alpha, runs=[], skipped=[], complete=False)

    def left():
        return args.budget - (time.time() - t_start) if args.budget else float("inf")

    def measure(name, mode, rows, attention, cap):
        """Runs the child, halving rows on out-of-memory; the result (with rows_tried) or None."""
        tried = []
        while rows >= 1:
            if left() - 5 < 10:
                report["skipped"].append(dict(config=name, mode=mode, attention=attention, why="the --budget is spent"))
                print(f"{name} {mode}: skipped, the {args.budget:g} s budget is spent", flush=True)
                return None
            spec = dict(name=name, mode=mode, rows=rows, shape=shape(name, args), device=device, dtype=args.dtype,
                        attention=attention, xsa_alpha=args.xsa_alpha, iters=args.iters, warmup=args.warmup,
                        peak_tflops=args.peak_tflops, seed=args.seed, threads=args.threads)
            result, why = run_child(spec, min(cap, left() - 5))
            if why == "out of memory":
                tried.append(rows)
                print(f"{name} {mode}: out of memory at rows {rows}{', trying %d' % (rows // 2) if rows > 1 else ''}", flush=True)
                rows //= 2
                continue
            if result is None:
                report["skipped"].append(dict(config=name, mode=mode, attention=attention, why=why))
                print(f"{name} {mode} ({attention}): {why}", flush=True)
                return None
            result["rows_tried"] = tried
            report["device"] = report["device"] or result["device"]
            report["runs"].append(result)
            print(fmt_run(result, args.peak_tflops), flush=True)
            return result
        report["skipped"].append(dict(config=name, mode=mode, attention=attention, why="out of memory at rows " + ", ".join(map(str, tried))))
        return None

    def on_term(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGTERM, on_term)
    try:
        eager_rows = {}
        for n in names:
            r = measure(n, "eager", args.rows, eager_attention, args.eager_timeout)
            eager_rows[n] = r["rows"] if r else args.rows
        for n in names:
            if not compile_on or not has_compile:
                why = f"torch {torch.__version__} has no torch.compile" if not has_compile else "off (--compile off, or auto on the CPU)"
                report["skipped"].append(dict(config=n, mode="compile", attention=compile_attention, why=why))
                print(f"{n} compile: {why}; eager only", flush=True)
                continue
            r = measure(n, "compile", eager_rows[n], compile_attention, args.compile_timeout)
            failed = report["skipped"] and report["skipped"][-1]["config"] == n and report["skipped"][-1]["why"].startswith("failed")
            if r is None and failed and compile_attention == "flex" and eager_attention != "flex":
                print(f"{n} compile: again with {eager_attention} attention in every layer", flush=True)
                r = measure(n, "compile", eager_rows[n], eager_attention, args.compile_timeout)
            if r is None:
                print(f"{n}: no torch.compile result, eager only", flush=True)
        report["complete"] = True
    except (Interrupted, KeyboardInterrupt):
        report["skipped"].append(dict(config="*", mode="*", why="interrupted (SIGTERM or Ctrl-C): the runs after the last one listed"))
        print("interrupted: reporting what ran", flush=True)
    best = {}
    for r in report["runs"]:
        if r["config"] not in best or r["tok_s"] > best[r["config"]]["tok_s"]:
            best[r["config"]] = dict(mode=r["mode"], attention=r["attention"], rows=r["rows"], ms=r["ms"], tok_s=r["tok_s"], mfu=r["mfu"])
    report["best"] = best
    print(f"device: {report['device'] or 'unknown (no run finished)'}; {time.time() - t_start:.1f} s in all", flush=True)
    print(JSON_TAG + json.dumps(report, sort_keys=True), flush=True)
    # last, one short line (gpu_check's summary row shows a stage's last line)
    print("PyTorch best: " + ("; ".join(f"{n} {b['tok_s']:,.0f} tok/s, {b['ms']:.1f} ms per micro-step of {b['rows']} rows, "
                                        f"MFU {100 * b['mfu']:.1f}% ({b['mode']}, {b['attention']})" for n, b in best.items())
                              or "nothing ran"), flush=True)
    return 0 if report["runs"] else 1


# ------------------------------------------------------------------------------------------------------
# --compare: the table for gpu_check's summary (standard library only)

def compare(torch_log, pairs):
    report = None
    try:
        with open(torch_log, errors="replace") as f:
            for line in f:
                if line.startswith(JSON_TAG):
                    report = json.loads(line[len(JSON_TAG):])
    except OSError as e:
        print(f"PyTorch baseline: no log ({e.strerror}: {torch_log})")
        return 1
    if report is None:
        print(f"PyTorch baseline: no '{JSON_TAG.strip()}' line in {torch_log} (the stage did not finish)")
        return 1
    peak = report["peak_tflops"]
    print(f"PyTorch {report['torch']} (CUDA {report['cuda']}) on {report['device']}, {report['dtype']}: "
          f"{report['timed']}; ours: bench_fwdbwd_cuda's micro-step (ours tok/s), the same work. "
          f"MFU of the micro-step against {peak:g} TFLOP/s"
          f"{'' if report.get('complete') else ' (the PyTorch stage was interrupted: what ran)'}")
    print()
    print("| config | ours: rows, ms per micro-step, tok/s, MFU | PyTorch eager | PyTorch compiled | ours / best PyTorch (tok/s) |")
    print("|---|---|---|---|---|")
    runs = {(r["config"], r["mode"]): r for r in report["runs"]}
    skipped = {(s["config"], s["mode"]): s["why"] for s in report["skipped"]}
    for pair in pairs:
        name, _, log = pair.partition("=")
        ours = None
        try:
            with open(log, errors="replace") as f:
                text = f.read()
            m = re.search(r"^ours tok/s ([0-9.]+) ms/iter ([0-9.]+)", text, re.M)
            b = re.search(r"^params \d+, batch (\d+) x (\d+)", text, re.M)
            fl = re.search(r"^flops/token ([0-9.e+]+)", text, re.M)
            if m and b and fl:
                ours = dict(tok_s=float(m.group(1)), ms=float(m.group(2)), rows=int(b.group(1)), flops=float(fl.group(1)))
        except OSError:
            pass

        def cell(mode):
            r = runs.get((name, mode))
            if r is None:
                return "- (" + skipped.get((name, mode), skipped.get(("*", "*"), "not run")) + ")"
            warn = ""
            if ours and abs(r["flops_per_token"] - ours["flops"]) > 1e-3 * ours["flops"]:
                warn = f" (FLOPs/token {r['flops_per_token']:.4e} != ours {ours['flops']:.4e}: not the same model)"
            return f"{r['rows']}, {r['ms']:.1f} ms, {r['tok_s']:,.0f}, {100 * r['mfu']:.1f}% ({r['attention']}){warn}"
        best = max((r for r in report["runs"] if r["config"] == name), key=lambda r: r["tok_s"], default=None)
        ours_cell = (f"{ours['rows']}, {ours['ms']:.1f} ms, {ours['tok_s']:,.0f}, {100 * ours['tok_s'] * ours['flops'] / (peak * 1e12):.1f}%"
                     if ours else f"- (no 'ours tok/s' in {log})")
        ratio = f"{ours['tok_s'] / best['tok_s']:.2f}x (against {best['mode']})" if ours and best else "-"
        print(f"| {name} | {ours_cell} | {cell('eager')} | {cell('compile')} | {ratio} |")
    return 0


def main():
    ap = xsa_cli.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=None, help="comma list of d12, d24, tiny (default d24,d12; --tiny: tiny)")
    ap.add_argument("--rows", type=int, default=None, help="rows per micro-step (default 32: train_gpt's default on an H200; --tiny: 2)")
    ap.add_argument("--seq-len", type=int, default=None, help="T instead of the preset's")
    ap.add_argument("--short-window", type=int, default=None, help="the S layers' window (default nanochat's ceil(T/4/128)*128)")
    ap.add_argument("--xsa-alpha", type=float, default=0.0, help="XSA with this fixed alpha on every layer (default 0: off)")
    ap.add_argument("--device", default=None, help="cuda, cpu or auto (default auto: cuda where available; --tiny: cpu)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="bf16 autocast (default) or fp32 (--tiny's default)")
    ap.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="torch.compile runs (auto: on CUDA only)")
    ap.add_argument("--attention", choices=["sdpa", "flex", "reference"], default=None,
                    help="eager attention (default sdpa; the reference's own where torch has no SDPA)")
    ap.add_argument("--compile-attention", choices=["sdpa", "flex", "reference"], default=None,
                    help="attention under torch.compile (default flex for the windowed layers where torch has it, else as eager)")
    ap.add_argument("--compile-timeout", type=float, default=240.0, help="cap in seconds on each compiled run, compilation included (240)")
    ap.add_argument("--eager-timeout", type=float, default=120.0, help="cap in seconds on each eager run (120)")
    ap.add_argument("--budget", type=float, default=0.0, help="seconds for everything: no run starts past it, each is capped to what is left (0: none)")
    ap.add_argument("--iters", type=int, default=None, help="timed micro-steps (median of; default 10, --tiny 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed micro-steps first (default 3, --tiny 1)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the MFU's peak (989: H100/H200 SXM bf16 dense)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (CPU runs only; default 2)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tiny", action="store_true", help="2 layers, dim 128, 2 heads of 64, T 128, vocab 512, short window 32, 2 rows, CPU fp32")
    ap.add_argument("--compare", nargs="+", metavar=("TORCH_LOG", "NAME=OURS_LOG"),
                    help="print the ours / PyTorch table from this script's log and bench_fwdbwd_cuda's logs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.compare:
        return compare(args.compare[0], args.compare[1:])
    t = args.tiny
    args.configs = args.configs or ("tiny" if t else "d24,d12")
    args.rows = args.rows or (2 if t else 32)
    args.device = args.device or ("cpu" if t else "auto")
    args.dtype = args.dtype or ("fp32" if t else "bf16")
    args.iters = args.iters if args.iters is not None else (3 if t else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if t else 3)
    if args.rows < 1 or args.iters < 1 or args.warmup < 0 or args.peak_tflops <= 0 or args.threads < 1:
        ap.error("need --rows >= 1, --iters >= 1, --warmup >= 0, --peak-tflops > 0, --threads >= 1")
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
