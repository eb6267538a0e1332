#!/usr/bin/env python3
"""The CPU-scale study's corpus: GCIDE, the Collaborative International Dictionary of English (Webster's
1913 with additions; GPL-3.0-or-later, see dev/data/README.md), from Debian's dict-gcide package: about
40 MB of text in 126,000 entries, so about 10M tokens, large enough that a small model trained on a CPU
for hours does not just memorise it (the embedded corpus has 93K tokens).

    python3 dev/data/gcide.py [--out DIR] [--deb FILE] [--vocab-size 8192]

Steps: the .deb (`apt-get download dict-gcide` into DIR, which checks it against Debian's signed index;
or --deb FILE, offline) -> its gcide.dict.dz and gcide.index (read with the standard library: the .deb
is an ar archive holding a tar) -> one document per dictionary entry, in file order, every 50th entry
held out for validation -> a tokenizer trained on the training entries (rustbpe, nanochat's split
pattern and special tokens, as dev/data/climbmix.py does) -> TRAIN_SHARDS training shards and one
validation shard. DIR defaults to ~/.cache/xsa-train/gcide; a finished DIR is reused (delete it to
start again). Then:

    ./train_gpt -i "DIR/train_*.bin" -j "DIR/val_*.bin" --tokenizer DIR/tokenizer.bin --core-every -1 ...

Needs tiktoken and rustbpe (python3 -m pip install -r dev/data/requirements.txt).
"""
import argparse
import gzip
import io
import lzma
import os
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import climbmix  # noqa: E402
import dictd  # noqa: E402
from climbmix import PrepError, log  # noqa: E402

DEFAULT_OUT = os.path.join("~", ".cache", "xsa-train", "gcide")
TRAIN_SHARDS = 4
VAL_EVERY = 50  # entry k (in file order) is validation when k % VAL_EVERY == VAL_EVERY - 1
DICT_MEMBER, INDEX_MEMBER = "usr/share/dictd/gcide.dict.dz", "usr/share/dictd/gcide.index"


def ar_members(data):
    """{name: bytes} of an ar archive (the container of a .deb)."""
    if data[:8] != b"!<arch>\n":
        raise PrepError("not a .deb (no ar archive signature)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise PrepError("not a .deb (a bad ar member header)")
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return members


def dictionary_files(deb_path):
    """(gcide.dict text as bytes, gcide.index text) from the package file."""
    try:
        with open(deb_path, "rb") as f:
            members = ar_members(f.read())
    except OSError as e:
        raise PrepError(f"cannot read {deb_path}: {e.strerror}")
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise PrepError(f"{deb_path}: no data.tar member")
    raw = members[name]
    if name.endswith(".xz"):
        raw = lzma.decompress(raw)
    elif name.endswith(".gz"):
        raw = gzip.decompress(raw)
    elif name != "data.tar":
        raise PrepError(f"{deb_path}: {name} is compressed in a way this script does not read")
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        files = {m.name.lstrip("./"): m for m in tar.getmembers()}
        if DICT_MEMBER not in files or INDEX_MEMBER not in files:
            raise PrepError(f"{deb_path}: no {DICT_MEMBER} and {INDEX_MEMBER}: not the dict-gcide package")
        dict_dz = tar.extractfile(files[DICT_MEMBER]).read()
        index = tar.extractfile(files[INDEX_MEMBER]).read().decode("utf-8", "replace")
    return gzip.decompress(dict_dz), index  # dictzip is gzip with an index in an extra field


def entries(text, index):
    """The dictionary's entries in file order (dictd.entries; GCIDE holds a few bytes that are not UTF-8,
    decoded as U+FFFD, and 9 entries that start with whitespace, stripped)."""
    try:
        return [e.lstrip() for e in dictd.entries(text, index, "gcide.index", errors="replace")]
    except dictd.DictdError as e:
        raise PrepError(str(e))


def get_deb(out):
    """The dict-gcide package in `out`, downloaded with apt-get if it is not there yet."""
    have = sorted(n for n in os.listdir(out) if n.startswith("dict-gcide_") and n.endswith(".deb"))
    if not have:
        log("downloading Debian's dict-gcide with apt-get download (about 15 MB)")
        try:
            p = subprocess.run(["apt-get", "download", "dict-gcide"], cwd=out, capture_output=True, text=True)
        except OSError as e:
            raise PrepError(f"cannot run apt-get ({e.strerror}): on a machine without apt, download dict-gcide's .deb "
                            "from packages.debian.org and give it with --deb")
        have = sorted(n for n in os.listdir(out) if n.startswith("dict-gcide_") and n.endswith(".deb"))
        if p.returncode != 0 or not have:
            raise PrepError(f"apt-get download dict-gcide failed: {' '.join(p.stderr.split())[-300:]} "
                            "(apt-get update first, or give the .deb with --deb)")
    return os.path.join(out, have[-1])


def run(args):
    out = os.path.expanduser(args.out)
    os.makedirs(out, exist_ok=True)
    deb = args.deb or get_deb(out)
    text, index = dictionary_files(deb)
    docs = entries(text, index)
    train = [d for k, d in enumerate(docs) if k % VAL_EVERY != VAL_EVERY - 1]
    val = [d for k, d in enumerate(docs) if k % VAL_EVERY == VAL_EVERY - 1]
    if len(train) < TRAIN_SHARDS or not val:
        raise PrepError(f"{deb}: {len(docs)} entries, too few for {TRAIN_SHARDS} training shards and a validation shard")
    log(f"{os.path.basename(deb)}: {len(docs):,} entries, {sum(map(len, docs)) / 1e6:.1f}M characters; "
        f"{len(train):,} for training, {len(val):,} (every {VAL_EVERY}th) for validation")
    tok_path = os.path.join(out, "tokenizer.bin")
    if os.path.exists(tok_path):
        enc, _ = climbmix.read_tokenizer(tok_path)
        if enc.n_vocab != args.vocab_size:
            raise PrepError(f"{tok_path} exists with vocab size {enc.n_vocab}, not {args.vocab_size}; delete {out} to start again")
        log(f"reusing {tok_path} (vocab {enc.n_vocab})")
    else:
        enc = climbmix.train_tokenizer(climbmix.tokenizer_training_texts(iter(train)), args.vocab_size)
        climbmix.write_tokenizer(tok_path, enc)
        log(f"wrote {tok_path}: vocab {enc.n_vocab}, trained on the training entries")
    per_shard = (len(train) + TRAIN_SHARDS - 1) // TRAIN_SHARDS
    jobs = [(os.path.join(out, f"train_{i:06d}.bin"), train[i * per_shard:(i + 1) * per_shard]) for i in range(TRAIN_SHARDS)]
    jobs.append((os.path.join(out, "val_000000.bin"), val))
    with climbmix.Encoder(enc, args.workers) as encoder:
        for path, shard_docs in jobs:
            if climbmix.read_shard_header(path) is None:
                climbmix.write_token_shard(path, iter(shard_docs), encoder)
        encoder.close()
    total = sum(climbmix.read_shard_header(p)[1] for p, _ in jobs[:-1])
    log(f"done: {TRAIN_SHARDS} training shards ({total:,} tokens) and a validation shard in {out}")


def main(argv=None):
    p = argparse.ArgumentParser(description="GCIDE (Debian's dict-gcide) as token shards for xsa-train's CPU-scale study.")
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (default %(default)s)")
    p.add_argument("--deb", help="the dict-gcide .deb to read (default: apt-get download it into --out)")
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary incl. the 9 special tokens (default %(default)s)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="encoding processes (default %(default)s)")
    args = p.parse_args(argv)
    if args.vocab_size < climbmix.MIN_VOCAB:
        p.exit(1, f"gcide.py: error: --vocab-size must be at least {climbmix.MIN_VOCAB}\n")
    climbmix.run_cli("gcide.py", run, args, PrepError)


if __name__ == "__main__":
    main()
