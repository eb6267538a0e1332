#!/usr/bin/env python3
"""
Score CORE task files (written by dev/data/core.py) with the PyTorch reference model, as nanochat's
core_eval.py scores them (dev/docs/evaluation.md#scoring), in float64.

    /usr/bin/python3 dev/reference/score_core.py --weights MODEL.safetensors [--tasks dev/data/core_tasks]
        [--out scores.json] [--max-per-task K]

MODEL.safetensors: weights under nanochat's parameter names (fp32) with the config in the metadata (keys
vocab_size, n_layer, n_head, n_kv_head, head_dim, n_embd, seq_len, window_pattern, short_window,
value_embeds, smear, xsa_alpha, xsa_layers; xsa_learnable optional, default 0; softcap optional, default
15), e.g. what train_gpt --export-safetensors writes, or a file of dev/reference/data/.

Per item, all its prompts form one batch, right-padded with BOS, and run through one forward pass (softcapped
logits). Per position: cross-entropy against the next token and the argmax prediction (the last column has
no target: NaN). Multiple choice / schema: score of option i = mean CE over positions start-1 .. end-2 (which
predict tokens start .. end-1), taken with Python slice semantics like nanochat (an empty span gives NaN,
start = 0 included: -1 is the last column); prediction = means.index(min(means)) as in nanochat, the first
option with the smallest score, except that a NaN first option is the prediction (Python's min() keeps its
first element unless a later one is smaller, never true with a NaN) and a later NaN option never is;
correct iff it equals gold. Language modeling: correct iff the argmax at positions start-1 .. end-2
equals tokens start .. end-1. Accuracy per task; centered = (acc - 0.01 rb) / (1 - 0.01 rb); CORE = the mean
of the centered accuracies.

Prompts longer than seq_len run at full length: layers with window T = seq_len ('L' and the last layer)
become sliding windows of seq_len, as in nanochat (model.py's masks and rotary tables take any T). Like
nanochat (rotary cache of 10 * seq_len rows), longer prompts are an error.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import require_torch  # noqa: F401  (one error line where PyTorch is missing)
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402
from model import GPT, Config  # noqa: E402

CORE_MAGIC = 20241202
CORE_VERSION = 1
HEADER_INTS = 256
TYPE_NAMES = {0: "multiple_choice", 1: "schema", 2: "language_modeling"}
ROTARY_FACTOR = 10  # nanochat precomputes rotary tables for 10 * sequence_len positions
DEFAULT_TASKS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "dev", "data", "core_tasks")


class ScoreError(Exception):
    pass


# -----------------------------------------------------------------------------
# Task files (format: dev/data/README.md, "CORE task files")

def read_task_file(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 * HEADER_INTS:
        raise ScoreError(f"{path}: shorter than the {4 * HEADER_INTS}-byte header")
    h = struct.unpack_from(f"<{HEADER_INTS}i", data, 0)
    if h[0] != CORE_MAGIC or h[1] != CORE_VERSION:
        raise ScoreError(f"{path}: not a CORE task file (magic {h[0]} version {h[1]})")
    if h[2] not in TYPE_NAMES:
        raise ScoreError(f"{path}: unknown task type {h[2]}")
    rb = struct.unpack_from("<f", data, 32)[0]
    label = data[36:36 + 128].split(b"\0", 1)[0].decode("utf-8")
    if any(h[41:]):
        raise ScoreError(f"{path}: nonzero reserved header fields")
    task = dict(file=os.path.basename(path), label=label, type=TYPE_NAMES[h[2]], n_items=h[3], shots=h[4],
                vocab_size=h[5], bos=h[6], max_per_task=h[7], random_baseline=float(rb), items=[])
    pos = 4 * HEADER_INTS
    try:
        for _ in range(h[3]):
            n, gold = struct.unpack_from("<II", data, pos)
            pos += 8
            prompts = []
            for _ in range(n):
                nt, s, e = struct.unpack_from("<III", data, pos)
                pos += 12
                toks = np.frombuffer(data, dtype="<u4", count=nt, offset=pos).astype(np.int64)
                pos += 4 * nt
                if not (s <= e <= nt):
                    raise ScoreError(f"{path}: span [{s}, {e}) outside a {nt}-token prompt")
                prompts.append((toks, s, e))
            if n == 0 or gold >= n:
                raise ScoreError(f"{path}: item with {n} prompts and gold {gold}")
            if task["type"] == "language_modeling" and (n != 1 or gold != 0):
                raise ScoreError(f"{path}: language_modeling item with {n} prompts, gold {gold}")
            task["items"].append((prompts, gold))
    except (struct.error, ValueError):
        raise ScoreError(f"{path}: truncated")
    if pos != len(data):
        raise ScoreError(f"{path}: {len(data) - pos} bytes after the last item")
    return task


def list_task_files(d):
    index = os.path.join(d, "index.txt")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            names = [line.split()[0] for line in f if line.strip()]
    else:
        names = sorted(n for n in os.listdir(d) if n.endswith(".bin"))
    if not names:
        raise ScoreError(f"{d}: no task files")
    return [os.path.join(d, n) for n in names]


# -----------------------------------------------------------------------------
# Model

def load_model(path, dtype):
    tensors, meta = safetensors_io.load(path)
    need = ["vocab_size", "n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "seq_len", "window_pattern",
            "short_window", "value_embeds", "smear", "xsa_alpha", "xsa_layers"]
    missing = [k for k in need if k not in meta]
    if missing:
        raise ScoreError(f"{path}: metadata lacks {', '.join(missing)}")
    layers = [x.strip() for x in meta["xsa_layers"].split(",") if x.strip()]
    cfg = Config(vocab_size=int(meta["vocab_size"]), n_layer=int(meta["n_layer"]), n_head=int(meta["n_head"]),
                 n_kv_head=int(meta["n_kv_head"]), head_dim=int(meta["head_dim"]), n_embd=int(meta["n_embd"]),
                 seq_len=int(meta["seq_len"]), window_pattern=meta["window_pattern"],
                 short_window=int(meta["short_window"]), value_embeds=meta["value_embeds"] == "1",
                 smear=meta["smear"] == "1", xsa_alpha=float(meta["xsa_alpha"]),
                 xsa_learnable=meta.get("xsa_learnable", "0") == "1",  # absent in files from before -x learn
                 xsa_layers=[int(x) for x in layers], softcap=float(meta.get("softcap", "15")))
    model = GPT(cfg, dtype=dtype)
    names = dict(model.named_parameters())
    absent = [n for n in names if n not in tensors]
    if absent:
        raise ScoreError(f"{path}: missing parameters {', '.join(absent)}")
    with torch.no_grad():
        for n, p in names.items():
            t = tensors[n]
            if tuple(t.shape) != tuple(p.shape):
                raise ScoreError(f"{path}: {n} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(t)).to(dtype))
    model.eval()
    return model, cfg


# -----------------------------------------------------------------------------
# Scoring

@torch.no_grad()
def forward_item(model, prompts, bos):
    """(B, T) ids right-padded with BOS -> (ids, losses (B, T) with NaN in the last column, argmax (B, T))."""
    T = max(len(t) for t, _, _ in prompts)
    ids = torch.full((len(prompts), T), bos, dtype=torch.long)
    for i, (t, _, _) in enumerate(prompts):
        ids[i, :len(t)] = torch.from_numpy(t)
    logits, _ = model(ids)
    B, T, V = logits.shape
    targets = torch.roll(ids, shifts=-1, dims=1)
    losses = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)
    losses[:, -1] = float("nan")
    return ids, losses, logits.argmax(dim=-1)


def score_task(model, cfg, task, max_items):
    if task["vocab_size"] != cfg.vocab_size:
        raise ScoreError(f"{task['file']}: tokenized for vocab {task['vocab_size']}, the model has "
                         f"{cfg.vocab_size}")
    items = task["items"][:max_items] if max_items > 0 else task["items"]
    limit = ROTARY_FACTOR * cfg.seq_len
    out = []
    for k, (prompts, gold) in enumerate(items):
        longest = max(len(t) for t, _, _ in prompts)
        if longest > limit:
            raise ScoreError(f"{task['file']}: item {k} has a {longest}-token prompt, over {limit} = "
                             f"{ROTARY_FACTOR} x seq_len (nanochat's rotary limit)")
        if max(int(t.max()) for t, _, _ in prompts) >= cfg.vocab_size:
            raise ScoreError(f"{task['file']}: item {k} has a token id >= vocab {cfg.vocab_size}")
        ids, losses, preds = forward_item(model, prompts, task["bos"])
        if task["type"] == "language_modeling":
            _, s, e = prompts[0]
            ok = bool(torch.equal(preds[0, s - 1:e - 1], ids[0, s:e]))
            out.append(dict(correct=int(ok)))
        else:
            means = [losses[i, s - 1:e - 1].mean().item() for i, (_, s, e) in enumerate(prompts)]
            pred = means.index(min(means))
            out.append(dict(correct=int(pred == gold), gold=gold, pred=pred,
                            losses=[m if math.isfinite(m) else None for m in means]))
    acc = sum(r["correct"] for r in out) / len(out) if out else float("nan")
    rb = 0.01 * task["random_baseline"]
    centered = (acc - rb) / (1.0 - rb)
    return dict(file=task["file"], label=task["label"], type=task["type"], shots=task["shots"],
                random_baseline=task["random_baseline"], n_items=len(out), accuracy=acc, centered=centered,
                items=out)


def main(argv=None):
    p = argparse.ArgumentParser(description="Score CORE task files with the PyTorch reference model.")
    p.add_argument("--weights", required=True, help="safetensors file (nanochat names, config in metadata)")
    p.add_argument("--tasks", default=DEFAULT_TASKS,
                   help="directory of task files from dev/data/core.py (default dev/data/core_tasks)")
    p.add_argument("--out", default=None, help="write the scores as JSON to this file")
    p.add_argument("--max-per-task", type=int, default=-1, help="score the first K items of each task (-1 = all)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="model dtype (default float64: the truth; float32 for a quick look)")
    args = p.parse_args(argv)
    try:
        t0 = time.time()
        dtype = torch.float64 if args.dtype == "float64" else torch.float32
        model, cfg = load_model(args.weights, dtype)
        tasks = [read_task_file(f) for f in list_task_files(args.tasks)]
        results = [score_task(model, cfg, t, args.max_per_task) for t in tasks]
    except (ScoreError, OSError, ValueError) as e:
        print(f"score_core.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)
    core = sum(r["centered"] for r in results) / len(results)
    print(f"{'task':<34} {'type':<18} {'shots':>5} {'items':>5} {'accuracy':>9} {'baseline':>8} {'centered':>9}")
    for r in results:
        print(f"{r['label']:<34} {r['type']:<18} {r['shots']:>5} {r['n_items']:>5} {r['accuracy']:>9.4f} "
              f"{r['random_baseline']:>7g}% {r['centered']:>9.4f}")
    print(f"CORE {core:.6f} ({len(results)} tasks, {args.dtype}, {time.time() - t0:.1f}s)")
    if args.out:
        doc = dict(weights=os.path.basename(args.weights), dtype=args.dtype, max_per_task=args.max_per_task,
                   config=dict(vars(cfg)), core=core, tasks=results)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
