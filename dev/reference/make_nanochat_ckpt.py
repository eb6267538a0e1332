"""
Write a tiny nanochat checkpoint, as nanochat's checkpoint_manager.save_checkpoint writes one, and the reference loss
of its model, for the tests of dev/convert_nanochat.py (dev/test/test_convert_nanochat.py); then check with PyTorch
that what the converter writes back loads with torch.load(weights_only=True) and equals the original.

    /usr/bin/python3 dev/reference/make_nanochat_ckpt.py [--tiktoken-python PY]      (last line "N passed, N failed")

Written into dev/reference/data/nanochat_ckpt/, laid out as nanochat's base directory ($NANOCHAT_BASE_DIR):
  * base_checkpoints/d3/model_000500.pt: torch.save of the state dict of a 3-layer GPT of nanochat's shapes (n_embd 24,
    2 heads of 12, 1 kv head, sequence_len 256, window_pattern SSSL: layer 0 sees 128 earlier tokens; vocab 4096, the
    embedded corpus's tokenizer, padded to 4096), under nanochat's names and in the order of nanochat's
    GPT.state_dict() (model.py's GPT registers its parameters as nanochat's does), with nanochat's dtypes on a bf16
    GPU: transformer.wte.weight and value_embeds.*.weight bfloat16 (init_weights casts them to COMPUTE_DTYPE), the
    rest float32. Weights: model.random_init (not nanochat's init, whose zeros would hide mistakes), the two
    embedding tables then rounded to bf16 by torch. 3 layers, not 2: with 2 the backout layer (n_layer // 2) is the
    last one, and backout would vanish in the final norm.
  * base_checkpoints/d3/meta_000500.json: json.dump(..., indent=2) of the keys nanochat's base_train writes
    (model_config as asdict(GPTConfig)); the values other than model_config are made up (no training ran).
  * tokenizer/tokenizer.pkl: pickle.dump of the tiktoken Encoding of dev/data/devil/tokenizer.bin (as nanochat's
    RustBPETokenizer.save pickles its Encoding), made by a python that has tiktoken (--tiktoken-python; default
    build/venv's or python3's); kept as it is when none has it. tokenizer/token_bytes.pt: torch.save of the int32
    byte length of every token, 0 for the special ones, as nanochat's scripts/tok_train.py writes it.
  * tokens.bin: a token shard (llm.c layout, uint16) of 257 tokens, BOS + the first 256 other tokens of
    dev/data/devil/val_000000.bin: one row of T + 1 = 257, so that train_gpt's loader makes exactly the row
    inputs = tokens[0:256], targets = tokens[1:257].
  * reference.json: the mean cross-entropy of the model on that row, by model.py in float64 (the truth) and in
    float32, and what it was computed from.

Deterministic: the same bytes on every rerun. The checks after writing (with torch): the original loads with
weights_only=True; `convert_nanochat.py in` then `out` gives a .pt that loads with weights_only=True with the same
names in the same order, the same dtypes and equal tensors, the same meta, and the same float32 loss; the fp32
weights `in` wrote equal the original widened; `out` of an fp32 model rounds the embeddings to bf16 exactly as
torch's .to(torch.bfloat16) does.
"""
import argparse
import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import require_torch  # noqa: F401  (one error line where PyTorch is missing)
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from model import GPT, Config, random_init  # noqa: E402
import safetensors_io  # noqa: E402
from tokenizer_file import TokenizerFile  # noqa: E402

OUT = os.path.join(HERE, "data", "nanochat_ckpt")
TAG, STEP, SEED = "d3", 500, 1031
DEVIL = os.path.join(REPO, "dev", "data", "devil")
CONVERTER = os.path.join(REPO, "dev", "convert_nanochat.py")
# nanochat's GPTConfig fields, in its order (asdict)
MODEL_CONFIG = collections.OrderedDict(sequence_len=256, vocab_size=4096, n_layer=3, n_head=2, n_kv_head=1, n_embd=24,
                                       window_pattern="SSSL")
BF16_NAMES = ("transformer.wte.weight", "value_embeds.")  # cast to COMPUTE_DTYPE by nanochat's init_weights


def reference_config():
    mc = MODEL_CONFIG
    T = mc["sequence_len"]
    return Config(vocab_size=mc["vocab_size"], n_layer=mc["n_layer"], n_head=mc["n_head"], n_kv_head=mc["n_kv_head"],
                  head_dim=mc["n_embd"] // mc["n_head"], n_embd=mc["n_embd"], seq_len=T, window_pattern=mc["window_pattern"],
                  short_window=-(-T // 4 // 128) * 128, value_embeds=True, smear=True)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack_from("<256i", data, 0)
    assert header[0] == 20240520 and header[1] == 1, path
    return list(struct.unpack_from(f"<{header[2]}H", data, 1024))


def write_shard(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens))


def nanochat_state_dict():
    """The state dict nanochat's base_train would save for these weights: GPT.state_dict() (an OrderedDict with
    torch's _metadata), the embedding tables in bf16."""
    model = GPT(reference_config(), dtype=torch.float32)
    random_init(model, SEED)
    sd32 = model.state_dict()
    sd = model.state_dict()
    for name in sd:
        if name.startswith(BF16_NAMES):
            sd[name] = sd[name].to(torch.bfloat16)
    return sd, sd32


def loss_of(sd, dtype, tokens):
    model = GPT(reference_config(), dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)  # nanochat's names and shapes, all of them
    idx = torch.tensor([tokens[:-1]], dtype=torch.long)
    targets = torch.tensor([tokens[1:]], dtype=torch.long)
    with torch.no_grad():
        _, loss = model(idx, targets)
    return float(loss)


def tiktoken_python(choice):
    candidates = [choice] if choice else [os.path.join(REPO, "build", "venv", "bin", "python3"), "python3"]
    for py in candidates:
        try:
            if subprocess.run([py, "-c", "import tiktoken"], capture_output=True).returncode == 0:
                return py
        except OSError:
            pass
    return None


def write_tokenizer(tok_dir, choice):
    os.makedirs(tok_dir, exist_ok=True)
    tok = TokenizerFile(os.path.join(DEVIL, "tokenizer.bin"))
    lengths = [0 if i in tok.special_ids else len(p) for i, p in enumerate(tok.pieces)]
    with open(os.path.join(tok_dir, "token_bytes.pt"), "wb") as f:  # scripts/tok_train.py
        torch.save(torch.tensor(lengths, dtype=torch.int32, device="cpu"), f)
    pkl = os.path.join(tok_dir, "tokenizer.pkl")
    py = tiktoken_python(choice)
    if py is None:
        if not os.path.exists(pkl):
            sys.exit("make_nanochat_ckpt.py: error: no python with tiktoken found for tokenizer.pkl: pass --tiktoken-python "
                     "PY (e.g. build/venv/bin/python3 after make test)")
        print(f"kept {pkl} (no python with tiktoken found)")
        return
    code = ("import pickle, sys; sys.path.insert(0, sys.argv[1]); import climbmix\n"
            "enc, _ = climbmix.read_tokenizer(sys.argv[2])\n"
            "with open(sys.argv[3], 'wb') as f: pickle.dump(enc, f)\n")  # nanochat's RustBPETokenizer.save
    subprocess.run([py, "-c", code, os.path.join(REPO, "dev", "data"), os.path.join(DEVIL, "tokenizer.bin"), pkl], check=True)
    print(f"wrote {pkl} with {py}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiktoken-python", help="a python with tiktoken, for tokenizer.pkl")
    args = p.parse_args()
    torch.manual_seed(0)
    ckpt = os.path.join(OUT, "base_checkpoints", TAG)
    os.makedirs(ckpt, exist_ok=True)

    sd, sd32 = nanochat_state_dict()
    model_path = os.path.join(ckpt, f"model_{STEP:06d}.pt")
    torch.save(sd, model_path)  # nanochat's save_checkpoint: torch.save(model_data, model_path)
    meta = {"step": STEP, "val_bpb": None, "model_config": dict(MODEL_CONFIG),
            "user_config": {"run": "dummy", "depth": 3, "aspect_ratio": 8, "head_dim": 12, "max_seq_len": 256,
                            "window_pattern": "SSSL", "note": "not trained: random weights (dev/reference/make_nanochat_ckpt.py)"},
            "device_batch_size": 1, "max_seq_len": 256, "total_batch_size": 256,
            "dataloader_state_dict": {"pq_idx": 0, "rg_idx": 0, "epoch": 1},
            "loop_state": {"min_val_bpb": None, "smooth_train_loss": None, "total_training_time": 0.0}}
    meta_path = os.path.join(ckpt, f"meta_{STEP:06d}.json")
    with open(meta_path, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    write_tokenizer(os.path.join(OUT, "tokenizer"), args.tiktoken_python)

    bos = TokenizerFile(os.path.join(DEVIL, "tokenizer.bin")).special["<|bos|>"]
    tokens = [bos] + [t for t in read_shard(os.path.join(DEVIL, "val_000000.bin")) if t != bos][:MODEL_CONFIG["sequence_len"]]
    write_shard(os.path.join(OUT, "tokens.bin"), tokens)
    loss64, loss32 = loss_of(sd, torch.float64, tokens), loss_of(sd, torch.float32, tokens)
    reference = {"checkpoint": f"base_checkpoints/{TAG}", "step": STEP, "tokens": "tokens.bin",
                 "tokenizer": "dev/data/devil/tokenizer.bin", "seed": SEED,
                 "loss_float64": loss64, "loss_float32": loss32,
                 "what": "mean cross-entropy of the model on inputs tokens[0:256], targets tokens[1:257] (B = 1), "
                         "dev/reference/model.py on the checkpoint's weights (bf16 tables widened exactly)"}
    with open(os.path.join(OUT, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, indent=2)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(OUT) for n in ns)
    print(f"wrote {OUT}: {size:,} bytes; loss float64 {loss64!r}, float32 {loss32!r} (relative {abs(loss32 / loss64 - 1):.2e})")
    sys.exit(check(sd, sd32, meta, tokens, loss32))


def check(sd, sd32, meta, tokens, loss32):
    passed = failed = 0

    def expect(ok, what):
        nonlocal passed, failed
        print(("PASS " if ok else "FAIL ") + what)
        passed, failed = passed + bool(ok), failed + (not ok)

    def convert(*argv):
        r = subprocess.run([sys.executable, CONVERTER, *argv], capture_output=True, text=True)
        expect(r.returncode == 0, "convert_nanochat.py " + " ".join(os.path.basename(a) for a in argv)
               + ("" if r.returncode == 0 else ": " + r.stderr.strip()))
        return r.returncode == 0

    ckpt = os.path.join(OUT, "base_checkpoints", TAG)
    original = torch.load(os.path.join(ckpt, f"model_{STEP:06d}.pt"), weights_only=True)
    expect(list(original) == list(sd), "the original loads with weights_only=True, names in the saved order")
    tmp = tempfile.mkdtemp(prefix="nanochat_ckpt_")
    try:
        st, back = os.path.join(tmp, "model.safetensors"), os.path.join(tmp, "back")
        if convert("in", ckpt, "-o", st, "--tokenizer", "none") and convert("out", st, "-o", back):
            tensors, _ = safetensors_io.load(st)
            expect(all(torch.equal(torch.from_numpy(tensors[k]), v.float()) for k, v in sd.items()) and len(tensors) == len(sd),
                   "`in`: every tensor in fp32, equal to the original widened")
            path = os.path.join(back, f"model_{STEP:06d}.pt")
            loaded = torch.load(path, weights_only=True)
            expect(list(loaded) == list(sd), "`out`: loads with weights_only=True, the same names in the same order")
            expect(all(loaded[k].dtype == v.dtype for k, v in sd.items()), "`out`: the same dtypes (bf16 tables, fp32 rest)")
            expect(all(torch.equal(loaded[k], v) for k, v in sd.items()), "`out`: every tensor equal to the original")
            with open(os.path.join(back, f"meta_{STEP:06d}.json"), encoding="utf-8") as f:
                expect(json.load(f) == meta, "`out`: the same meta")
            expect(loss_of(loaded, torch.float32, tokens) == loss32, "`out`: the same float32 loss, bit for bit")
            # an fp32 model (no record of nanochat's dtypes): the tables rounded to bf16 as torch rounds them
            _, metadata = safetensors_io.load(st)
            plain = {k: v for k, v in metadata.items() if not k.startswith("nanochat.") and not k.startswith("tokenizer")}
            fp32 = os.path.join(tmp, "fp32.safetensors")
            safetensors_io.save(fp32, {k: v.numpy() for k, v in sd32.items()}, plain)
            if convert("out", fp32, "-o", os.path.join(tmp, "fp32")):
                rounded = torch.load(os.path.join(tmp, "fp32", "model_000000.pt"), weights_only=True)
                want = {k: (v.to(torch.bfloat16) if k.startswith(BF16_NAMES) else v) for k, v in sd32.items()}
                expect(all(rounded[k].dtype == v.dtype and torch.equal(rounded[k], v) for k, v in want.items()),
                       "`out` of fp32 weights: the tables equal torch's .to(torch.bfloat16), the rest exact")
                changed = sum(int((v.to(torch.bfloat16).float() != v).sum()) for k, v in sd32.items() if k.startswith(BF16_NAMES))
                expect(changed > 1000, f"(that rounding changed {changed} values, so the check above has teeth)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tb = torch.load(os.path.join(OUT, "tokenizer", "token_bytes.pt"), weights_only=True)
    expect(tb.dtype == torch.int32 and tb.shape == (4096,), "token_bytes.pt loads with weights_only=True: int32 (4096,)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    main()
