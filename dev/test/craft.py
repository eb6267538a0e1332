#!/usr/bin/env python3
"""Crafts bad (and deliberately odd but valid) input files for the trainer's readers: token shards,
tokenizer files, safetensors weights and checkpoints, CORE task files. dev/test/test_bad_inputs.py builds
its cases from these functions; run as a script it writes a set of the static ones into a directory (seeds
for a fuzzer, or files to try by hand):

    python3 dev/test/craft.py OUTDIR        (writes OUTDIR/<kind>_<what>.bin and an index, README.txt)

The layouts are those of dev/docs/data.md and dev/data/README.md; every integer is little-endian.
Standard library only.
"""
import json
import os
import struct
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARD_MAGIC = 20240520
TOKENIZER_MAGIC = 20241201
# nanochat's split pattern, which a version-2 tokenizer file stores
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"""
                 r"""\s+(?!\S)|\s+""").encode()
CORE_MAGIC = 20241202
DEVIL_TOKENIZER = os.path.join(REPO, "dev/data/devil/tokenizer.bin")
CORE_TASKS = os.path.join(REPO, "dev/data/core_tasks")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


# ----------------------------------------------------------------------------------------------------
# Token shards: int32 header[256] ([0] magic, [1] version, [2] count low 32 bits, [3] high 32 bits), then
# uint16 (version 1) or uint32 (version 2) tokens.

def shard(tokens, version=1, count=None, magic=SHARD_MAGIC):
    """A shard of `tokens`; `count` (default len(tokens)) is what the header claims, any uint64."""
    count = len(tokens) if count is None else count
    header = struct.pack("<4I", magic & 0xFFFFFFFF, version & 0xFFFFFFFF, count & 0xFFFFFFFF, (count >> 32) & 0xFFFFFFFF)
    header += b"\0" * (1024 - len(header))
    return header + struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens)


def documents(bos, n_docs, length=12, vocab=4096, seed=1):
    """n_docs documents of `length` tokens each (BOS first), with ids in [0, vocab) other than BOS."""
    out, x = [], seed
    for _ in range(n_docs):
        out.append(bos)
        for _ in range(length - 1):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            t = x % (vocab - 1)
            out.append(t if t < bos else t + 1)
    return out


# ----------------------------------------------------------------------------------------------------
# Tokenizer files: int32 header[256] ([0] magic, [1] version, [2] V, [3] BOS, [4] prompts P, [5] pattern
# bytes S in version 2), then (version 2) the S bytes of the split pattern, then V records (uint8
# is_special, uint32 nbytes, bytes), then P prompts (uint32 n, n x uint32 ids).

def tokenizer_records_offset(data):
    """Where the token records of a tokenizer file start: after the header and, in version 2, the pattern."""
    version, = struct.unpack_from("<i", data, 4)
    return 1024 + (struct.unpack_from("<i", data, 20)[0] if version >= 2 else 0)


def tokenizer_parse(data):
    """(header ints, [(is_special, bytes)], [prompt ids]) of a tokenizer file."""
    header = list(struct.unpack_from("<256i", data))
    pos, records, prompts = tokenizer_records_offset(data), [], []
    for _ in range(header[2]):
        special, n = struct.unpack_from("<BI", data, pos)
        records.append((special, data[pos + 5:pos + 5 + n]))
        pos += 5 + n
    for _ in range(header[4]):
        n = struct.unpack_from("<I", data, pos)[0]
        prompts.append(list(struct.unpack_from("<%dI" % n, data, pos + 4)))
        pos += 4 + 4 * n
    return header, records, prompts


def tokenizer(records, bos, prompts, magic=TOKENIZER_MAGIC, version=2, vocab=None, n_prompts=None, pattern=SPLIT_PATTERN, pattern_len=None):
    """A tokenizer file (version 1 has no pattern); `vocab`, `n_prompts` and `pattern_len` override what the
    header claims."""
    pattern = pattern if version >= 2 else b""
    header = [0] * 256
    header[:6] = [magic, version, len(records) if vocab is None else vocab, bos, len(prompts) if n_prompts is None else n_prompts,
                  len(pattern) if pattern_len is None else pattern_len]
    out = [struct.pack("<256i", *header), pattern]
    for special, piece in records:
        out.append(struct.pack("<BI", special, len(piece)) + piece)
    for p in prompts:
        out.append(struct.pack("<I%dI" % len(p), len(p), *p))
    return b"".join(out)


def tokenizer_header_only(magic=TOKENIZER_MAGIC, version=1, vocab=4096, bos=4087, n_prompts=0):
    """Just the 1024-byte header (version 1: no pattern): a file that claims `vocab` records and holds none."""
    header = [0] * 256
    header[:5] = [magic, version, vocab, bos, n_prompts]
    return struct.pack("<256i", *header)


# ----------------------------------------------------------------------------------------------------
# Safetensors: u64 header length N, N bytes of JSON, the data buffer.

def st_parse(data):
    """(header as an ordered dict, data buffer) of a safetensors file."""
    n = struct.unpack_from("<Q", data)[0]
    return json.loads(data[8:8 + n].decode("utf-8")), data[8 + n:]


def st_build(header, buf, header_len=None, pad=True, raw_header=None):
    """A safetensors file from a header dict (or raw_header bytes) and a data buffer; header_len
    overrides the length field; pad aligns the data buffer to 8 bytes with spaces, as writers do."""
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text) if header_len is None else header_len) + text + buf


def st_tensor(data, name):
    """The float32 values of tensor `name` (F32) of a safetensors file."""
    header, buf = st_parse(data)
    t = header[name]
    begin, end = t["data_offsets"]
    return list(struct.unpack_from("<%df" % ((end - begin) // 4), buf, begin))


def st_set_values(data, name, index_values):
    """A copy of a safetensors file with elements of F32 tensor `name` replaced: {index: float}."""
    header, buf = st_parse(data)
    begin = header[name]["data_offsets"][0]
    buf = bytearray(buf)
    for i, v in index_values.items():
        struct.pack_into("<f", buf, begin + 4 * i, v)
    return st_build(header, bytes(buf))


def st_edit(data, meta=None, drop_meta=(), tensors=None, drop=(), add=None):
    """A copy of a safetensors file with metadata keys set (meta) or removed (drop_meta), tensor header
    fields changed (tensors: {name: {field: value}}), tensors removed from the header (drop), and extra
    tensors appended (add: [(name, dtype, shape, raw bytes)])."""
    header, buf = st_parse(data)
    m = header.setdefault("__metadata__", {})
    for k in drop_meta:
        m.pop(k, None)
    m.update(meta or {})
    for name, fields in (tensors or {}).items():
        header[name].update(fields)
    for name in drop:
        del header[name]
    for name, dtype, shape, raw in add or []:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(raw)]}
        buf += raw
    return st_build(header, buf)


def i64_pairs(values):
    """int64 values as the I32 (low, high) pairs of a checkpoint's dataloader.state."""
    return b"".join(struct.pack("<q", v) for v in values)


def st_loader_state(data, name="dataloader.state"):
    """The int64 values of a checkpoint's data-loader state."""
    header, buf = st_parse(data)
    begin, end = header[name]["data_offsets"]
    return list(struct.unpack_from("<%dq" % ((end - begin) // 8), buf, begin))


def st_replace_tensor(data, name, dtype, shape, raw):
    """A copy with tensor `name` replaced by new contents (moved to the end of the data buffer)."""
    header, buf = st_parse(data)
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(raw)]}
    return st_build(header, buf + raw)


# ----------------------------------------------------------------------------------------------------
# CORE task files: int32 header[256] ([0] magic, [1] version, [2] type, [3] items, [4] shots, [5] vocab,
# [6] BOS, [7] max_per_task, [8] baseline float32 bits, bytes 36..163 the label); then per item uint32
# prompts P, uint32 gold, P x (uint32 ntokens, span_start, span_end, ntokens ids).

def core_set(data, offset, value, fmt="<I"):
    """A copy with the integer at byte `offset` replaced."""
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt):]


def core_set_label(data, label):
    """A copy with the task label (bytes, up to 127) replaced."""
    assert len(label) < 128
    return data[:36] + label + b"\0" * (128 - len(label)) + data[164:]


def core_items(data):
    """[(item offset, [prompt offsets])] of a task file."""
    n_items = struct.unpack_from("<i", data, 12)[0]
    pos, out = 1024, []
    for _ in range(n_items):
        n_prompts = struct.unpack_from("<I", data, pos)[0]
        start, prompts = pos, []
        pos += 8
        for _ in range(n_prompts):
            prompts.append(pos)
            pos += 12 + 4 * struct.unpack_from("<I", data, pos)[0]
        out.append((start, prompts))
    return out


def core_truncate_items(data, n):
    """A valid copy holding only the first n items (the header's count set to n)."""
    items = core_items(data)
    end = items[n][0] if n < len(items) else len(data)
    return core_set(data[:end], 12, n, "<i")


# ----------------------------------------------------------------------------------------------------
# The static set, for the command line

def static_files():
    """(name, bytes, what) of every bad file that needs no trained model."""
    tok = read(DEVIL_TOKENIZER)
    header, records, prompts = tokenizer_parse(tok)
    V, bos = header[2], header[3]
    good = shard(documents(bos, 40), 1)
    core = read(os.path.join(CORE_TASKS, "01_completion_zeroshot.bin"))
    item0 = core_items(core)[0]
    files = [
        ("shard_magic.bin", b"\x01" + good[1:], "a token shard with a wrong magic"),
        ("shard_version.bin", good[:4] + b"\x07" + good[5:], "a token shard of version 7"),
        ("shard_count_2e63.bin", shard([], 1, count=1 << 63), "a shard header claiming 2^63 tokens, no tokens"),
        ("shard_count_2e62_v2.bin", shard([], 2, count=1 << 62), "a version-2 shard header claiming 2^62 tokens"),
        ("shard_truncated.bin", good[:-3], "a shard shorter than its header promises"),
        ("shard_trailing.bin", good + b"\0\0", "a shard longer than its header promises"),
        ("shard_vocab.bin", shard([bos, 5, V, 7], 1), "a token id = vocab"),
        ("shard_nobos.bin", shard([5, 6, bos, 7], 1), "a shard whose first token is not BOS"),
        ("tokenizer_magic.bin", b"\0" + tok[1:], "a tokenizer file with a wrong magic"),
        ("tokenizer_vocab_2e30.bin", tokenizer_header_only(vocab=1 << 30, bos=0), "a tokenizer header claiming 2^30 tokens"),
        ("tokenizer_truncated.bin", tok[:tokenizer_records_offset(tok) + 5 * 100 + 3], "a tokenizer file cut inside a record"),
        ("tokenizer_bos_range.bin", tokenizer(records, V, prompts), "BOS id = vocab size"),
        ("st_header_len.bin", struct.pack("<Q", (1 << 64) - 1) + b"{}", "a safetensors header length of 2^64-1"),
        ("st_bad_json.bin", st_build(None, b"", raw_header=b'{"a": {"dtype": "F32", "shape": [1], '), "an unterminated JSON header"),
        ("core_magic.bin", core_set(core, 0, 12345), "a CORE task file with a wrong magic"),
        ("core_span.bin", core_set(core, item0[1][0] + 8, 500), "an answer span past its prompt"),
        ("core_gold.bin", core_set(core, item0[0] + 4, 7), "a gold index past the options"),
        ("core_truncated.bin", core[:len(core) - 10], "a CORE task file cut inside its last item"),
    ]
    return files


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip())
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lines = []
    for name, data, what in static_files():
        write(os.path.join(out, name), data)
        lines.append("%-28s %s" % (name, what))
    write(os.path.join(out, "README.txt"), ("\n".join(lines) + "\n").encode())
    print("wrote %d files to %s" % (len(lines), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
