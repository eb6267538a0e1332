#!/usr/bin/env python3
"""Writes the committed seed corpus of the fuzz harnesses, dev/fuzz/corpus/<harness>/ (standard library).

    python3 dev/fuzz/make_seeds.py [--bin DIR]

From the real files (dev/data/devil/, dev/data/core_tasks/, dev/data/chat_tasks/, dev/data/sft_mini_tokens/,
dev/reference/data/: the small ones, or
their headers; dev/data/encoder_test.txt in pieces, the encoder's text), a few crafted ones (edge cases
a parser must take or reject), and what the harnesses
fuzz_checkpoint and fuzz_loader_state derive from a tiny model and loader of their own
(XSA_FUZZ_WRITE_SEEDS=DIR, built in --bin, default dev/fuzz/bin: make fuzz-build builds them).
The inputs of fixed findings (HARNESS/HARNESS-what) are kept. The corpus stays well under 2 MB. Rerun
after a format change; make fuzz also regenerates the derived seeds at every run, so a stale committed one
costs coverage, not correctness.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(REPO, "dev", "fuzz", "corpus")


def read(rel):
    with open(os.path.join(REPO, rel), "rb") as f:
        return f.read()


def write(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def shard(tokens, version=1, count=None):
    count = len(tokens) if count is None else count
    header = struct.pack("<2i2I", 20240520, version, count & 0xFFFFFFFF, count >> 32) + bytes(1008)
    return header + struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens)


# nanochat's split pattern, which a version-2 tokenizer file stores after its header
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"""
                 r"""\s+(?!\S)|\s+""").encode()


def tokenizer(pieces, bos, prompts, version=2, pattern=SPLIT_PATTERN):
    pattern = pattern if version >= 2 else b""
    out = struct.pack("<6i", 20241201, version, len(pieces), bos, len(prompts), len(pattern)) + bytes(1000) + pattern
    for special, raw in pieces:
        out += struct.pack("<BI", special, len(raw)) + raw
    for p in prompts:
        out += struct.pack("<I%dI" % len(p), len(p), *p)
    return out


def core_task(task_type, items, label=b"t", vocab=4096, bos=4087, shots=0, baseline=25.0):
    header = struct.pack("<8i", 20241202, 1, task_type, len(items), shots, vocab, bos, -1) + struct.pack("<f", baseline)
    header += label.ljust(128, b"\0") + bytes(1024 - 36 - 128)
    out = header
    for gold, prompts in items:
        out += struct.pack("<II", len(prompts), gold)
        for tokens, start, end in prompts:
            out += struct.pack("<III%dI" % len(tokens), len(tokens), start, end, *tokens)
    return out


def conversations(convs, masks, vocab=4096, bos=4087):
    """An SFT conversation file (dev/data/README.md): header, offsets, uint32 tokens, uint8 masks."""
    tokens = [t for c in convs for t in c]
    offsets = [0]
    for c in convs:
        offsets.append(offsets[-1] + len(c))
    header = [0] * 256
    header[:9] = [20261202, 1, len(convs), 0, len(tokens), 0, vocab, bos, 2048]
    return (struct.pack("<256i", *header) + struct.pack("<%dQ" % len(offsets), *offsets) + struct.pack("<%dI" % len(tokens), *tokens) +
            bytes(m for mask in masks for m in mask))


def safetensors(header_obj=None, data=b"", raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header_obj, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def header_of(rel):
    data = read(rel)
    n = struct.unpack_from("<Q", data)[0]
    return json.loads(data[8:8 + n])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "dev", "fuzz", "bin"), help="where the built harnesses are")
    args = ap.parse_args()
    # the inputs of fixed findings (HARNESS/HARNESS-what, dev/fuzz/README.md) are kept; the rest is rewritten
    findings = {}
    for harness in os.listdir(CORPUS) if os.path.isdir(CORPUS) else []:
        for name in os.listdir(os.path.join(CORPUS, harness)):
            if name.startswith(harness + "-"):
                findings[(harness, name)] = read(os.path.join("dev", "fuzz", "corpus", harness, name))
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    for (harness, name), data in findings.items():
        write(harness, name, data)

    # token shards: the embedded validation shard, the first documents of the training shard, crafted
    bos = struct.unpack_from("<i", read("dev/data/devil/tokenizer.bin"), 12)[0]
    write("fuzz_shard", "devil_val_000000.bin", read("dev/data/devil/val_000000.bin"))
    train = read("dev/data/devil/train_000000.bin")
    head = list(struct.unpack_from("<600H", train, 1024))
    head = head[:max(i for i, t in enumerate(head) if t == bos)]  # whole documents
    write("fuzz_shard", "devil_train_head.bin", shard(head))
    write("fuzz_shard", "v2_long_doc.bin", shard([bos] + list(range(1, 70)) + [bos, 5, bos, 6, 7], version=2))
    write("fuzz_shard", "one_token.bin", shard([bos]))
    # 2^63 + 4 tokens claimed: times 2 bytes, 8 modulo 2^64, the size of the 4 tokens there (must be rejected)
    write("fuzz_shard", "huge_count.bin", shard([bos, 1, 2, 3], count=(1 << 63) + 4))

    # tokenizer files: the embedded corpus's, tiny ones (version 1 without a pattern; version 2 without the
    # 256 bytes, which the encoder needs; version 2 with them, a few merges and a prompt with a special
    # token's text, under nanochat's and GPT-4's patterns), one claiming a huge vocabulary
    write("fuzz_tokenizer", "devil_tokenizer.bin", read("dev/data/devil/tokenizer.bin"))
    tiny = [(0, b"a"), (0, b"b"), (0, b"\xe2\x82"), (1, b"<|bos|>")]
    write("fuzz_tokenizer", "tiny_v1.bin", tokenizer(tiny, 3, [[3, 0, 1], [3, 2]], version=1))
    write("fuzz_tokenizer", "tiny_no_bytes.bin", tokenizer(tiny, 3, [[3, 0, 1], [3, 2]]))
    merges = [b"  ", b"ab", b"'s", b"12", b"\xe2\x82", b"\xe2\x82\xac", b" ab", b"<|", b"|>"]
    small = [(0, bytes([i])) for i in range(256)] + [(0, m) for m in merges] + [(1, b"<|bos|>"), (1, b"<|user_start|>")]
    small_bos = 256 + len(merges)
    prompt = [small_bos] + [ord(c) for c in "ab's 1234 <|bos|> "] + [256 + merges.index(b"\xe2\x82\xac"), 0xff, 0x0a]
    write("fuzz_tokenizer", "small_v2.bin", tokenizer(small, small_bos, [prompt]))
    write("fuzz_tokenizer", "small_v2_gpt4.bin", tokenizer(small, small_bos, [prompt], pattern=SPLIT_PATTERN.replace(b"{1,2}", b"{1,3}")))
    write("fuzz_tokenizer", "huge_vocab.bin", tokenizer(tiny, 3, [])[:8] + struct.pack("<i", 1 << 30) + tokenizer(tiny, 3, [])[12:])

    # text for the encoder: the multilingual and adversarial test text in pieces, special token text,
    # long runs, and ill-formed UTF-8 of every kind
    test_text = read("dev/data/encoder_test.txt")
    for k, start in enumerate(range(0, len(test_text), 512)):
        write("fuzz_encoder", "encoder_test_%d.txt" % k, test_text[start:start + 512])
    write("fuzz_encoder", "specials.txt", b"<|bos|>hi <|user_start|>What's 2+2?<|user_end|><|assistant_start|>4<|assistant_end|>  <|bos")
    write("fuzz_encoder", "runs.txt", b" " * 300 + b"a" * 300 + b"1" * 30 + b"\r\n" * 20 + "\u3000".encode() * 30)
    write("fuzz_encoder", "ill_formed.bin", b"a\x80b\xc0\xafc\xe0\x80\x80d\xed\xa0\x80e\xf4\x90\x80\x80f\xf0\x9f\x91g\xe2\x82h\xff\xfe")

    # calculator expressions: GSM8K's annotations and SpellingBee's count (the two forms it evaluates), floats
    # at the edges of repr, a division by zero, the caps (a 1000-digit int, 100 nested parentheses) and a power
    for k, expr in enumerate([b"48/2", b"1,200*3", b"(12+007.5)*-3//2", b".5 + 5. - 1e5", b"10**400", b"1/0", b"2/3*1e308*10",
                              b"'strawberry'.count('r')", b'"ab ab" .count( "")', b"9" * 1000 + b"//7",
                              b"(" * 100 + b"1" + b")" * 100, b"'x'.join('y').count('x')"]):
        write("fuzz_calculator", "expr_%02d.txt" % k, expr)

    # CORE task files: the embedded bundle's, and a minimal one of each type
    for name in sorted(os.listdir(os.path.join(REPO, "dev/data/core_tasks"))):
        if name.endswith(".bin"):
            write("fuzz_core_task", name, read("dev/data/core_tasks/" + name))
    write("fuzz_core_task", "lm_min.bin", core_task(2, [(0, [([bos, 5, 6], 1, 3)])], label=b"lm", baseline=0.0))
    write("fuzz_core_task", "mc_min.bin", core_task(0, [(1, [([bos, 5, 6], 2, 3), ([bos, 5, 7, 8], 2, 4)])], label=b"mc"))
    write("fuzz_core_task", "schema_min.bin", core_task(1, [(0, [([bos, 9, 6], 2, 3), ([bos, 10, 6], 2, 3)])], label=b"s", baseline=50.0))

    # SFT conversation files: the mini mixture's validation file, and three crafted conversations (one longer
    # than the harness's rows, one of BOS alone)
    write("fuzz_conversations", "sft_val.bin", read("dev/data/sft_mini_tokens/sft_val.bin"))
    write("fuzz_conversations", "three.bin", conversations([[bos, 5, 6, 7], [bos], [bos] + list(range(10, 40))],
                                                            [[0, 0, 1, 1], [0], [0] + [1] * 30]))

    # ChatCORE task files: the mini bundle's
    for name in sorted(os.listdir(os.path.join(REPO, "dev/data/chat_tasks"))):
        if name.endswith(".bin"):
            write("fuzz_chat_task", name, read("dev/data/chat_tasks/" + name))

    # safetensors: a small real file, crafted headers (escapes, empty, zero-size and I32 tensors, metadata only)
    write("fuzz_safetensors", "core_scores.safetensors", read("dev/reference/data/core_scores.safetensors"))
    write("fuzz_safetensors", "empty.safetensors", safetensors({}))
    write("fuzz_safetensors", "escapes.safetensors",
          safetensors(raw_header=b'{"__metadata__":{"k\\u00e9y":"v\\n\\t\\"\\\\\\/\\u20ac"},'
                                 b'"a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},'
                                 b'"b":{"dtype":"I32","shape":[],"data_offsets":[8,12]},'
                                 b'"z":{"dtype":"F32","shape":[0,5],"data_offsets":[12,12]}}', data=bytes(range(16))))
    write("fuzz_safetensors", "bf16.safetensors", safetensors({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, bytes(8)))
    for rel in ["dev/reference/data/plain.safetensors", "dev/reference/data/xsa_gqa_ve.safetensors"]:
        meta = header_of(rel).get("__metadata__", {})
        write("fuzz_safetensors", os.path.basename(rel) + ".meta", safetensors({"__metadata__": meta}))

    # checkpoint headers: metadata only (every configuration the reference files describe; read with the
    # tiny checkpoint's data section behind them), then fuzz_checkpoint's own tiny checkpoint header
    for name in sorted(os.listdir(os.path.join(REPO, "dev/reference/data"))):
        if name.endswith(".safetensors"):
            meta = header_of("dev/reference/data/" + name).get("__metadata__", {})
            if "n_layer" in meta:
                write("fuzz_checkpoint", name + ".meta", json.dumps({"__metadata__": meta}, separators=(",", ":")).encode())

    # what the harnesses derive from their own tiny model and loader
    with tempfile.TemporaryDirectory() as tmp:
        for harness in ["fuzz_checkpoint", "fuzz_loader_state"]:
            exe = os.path.join(args.bin, harness)
            if not os.access(exe, os.X_OK):
                sys.exit("make_seeds: %s is not built (make fuzz-build)" % exe)
            subprocess.run([exe], env=dict(os.environ, XSA_FUZZ_WRITE_SEEDS=tmp, OMP_NUM_THREADS="1"), check=True,
                           stdout=subprocess.DEVNULL)
        for name in sorted(os.listdir(tmp)):
            data = open(os.path.join(tmp, name), "rb").read()
            if name.startswith("state_"):
                write("fuzz_loader_state", name, data)
            elif name.startswith("tiny_checkpoint_header"):  # (without and with its checksums)
                write("fuzz_checkpoint", name, data)
            elif name == "checksummed_small.safetensors":  # a small weights file with checksums
                write("fuzz_safetensors", name, data)
            # (the whole tiny checkpoint, 150 KB, is not kept: its header is the checkpoint seed)

    total = 0
    for root, _, files in os.walk(CORPUS):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print("dev/fuzz/corpus: %d files, %d bytes" % (sum(len(f) for _, _, f in os.walk(CORPUS)), total))
    if total > 2 << 20:
        sys.exit("make_seeds: the corpus is over 2 MB")


if __name__ == "__main__":
    main()
