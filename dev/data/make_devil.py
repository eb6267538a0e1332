#!/usr/bin/env python3
"""
Build the embedded default corpus dev/data/devil/: Ambrose Bierce's "The Devil's Dictionary" (public
domain), from the Debian package dict-devil (a dictd database: devil.dict.dz, gzip-compatible, and
devil.index).

  * one document per dictionary entry, in the order of the entries in devil.dict (alphabetical);
    the dictd header entries (00-database-*) are dropped, aliases (index lines pointing at the same
    text) are kept once; each entry's trailing whitespace is stripped
  * the last 10% of the entries are validation, the rest train
  * tokenizer trained exactly as dev/data/climbmix.py does (rustbpe, nanochat's split pattern and 9
    special tokens), vocab 4096, on all train documents (each cropped to 10,000 characters)
  * writes tokenizer.bin, train_000000.bin, val_000000.bin and README.md; same bytes on every run

Usage: apt-get install dict-devil && python3 dev/data/make_devil.py
"""

import argparse
import gzip
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import climbmix  # noqa: E402
import dictd  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def read_entries(index_path, dict_path):
    """The dictionary's entries as strings, in file order, without the 00-database-* entries."""
    with open(index_path, encoding="utf-8") as f:
        index = f.read()
    with gzip.open(dict_path, "rb") as f:  # dictzip is gzip with an extra header field
        data = f.read()
    try:
        return dictd.entries(data, index, index_path)
    except dictd.DictdError as e:
        raise climbmix.PrepError(str(e))


def package_version(name="dict-devil"):
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None
    except OSError:
        return None


README = """# The Devil's Dictionary: embedded default corpus

Ambrose Bierce, *The Devil's Dictionary* (1881-1906; "Copyright 1911 by Albert and Charles Boni,
Inc. A Public Domain Text, Copyright Expired"), as packaged by Debian in `dict-devil` version
{version} (`/usr/share/dictd/devil.dict.dz` and `devil.index`, from the Internet Wiretap 1st Online
Edition, 1993). License: the text is in the public domain (see the package's
`/usr/share/doc/dict-devil/copyright`).

Made by `python3 dev/data/make_devil.py` (deterministic: a rerun writes the same bytes):

* One document per dictionary entry ("ABASEMENT, n.  A decent and customary ..."), in the order of
  the entries in `devil.dict` (alphabetical). The dictd header entries (`00-database-*`, which hold
  the preface and the URL) are dropped; index lines that point at the same text (aliases such as
  BABE/BABY) give one document; trailing whitespace of each entry is stripped.
* {n_docs} documents: the first {n_train} are train, the last {n_val} (the last 10%) validation.
* Tokenizer trained as `dev/data/climbmix.py` trains nanochat's (rustbpe {rustbpe}, nanochat's split
  pattern, the 9 special tokens after the mergeable tokens) with vocab {vocab} (BOS = {bos}), on
  all train documents (each cropped to 10,000 characters); tokenized with tiktoken {tiktoken}.
  The sample prompts in `tokenizer.bin` are nanochat's 7.
* Every document is encoded with `encode_ordinary` and a BOS token in front.

| file | documents | characters | UTF-8 bytes | tokens (incl. one BOS per document) | bytes/token (without BOS) |
|---|---|---|---|---|---|
| `train_000000.bin` | {n_train} | {train_chars} | {train_bytes} | {train_tokens} | {train_bpt} |
| `val_000000.bin` | {n_val} | {val_chars} | {val_bytes} | {val_tokens} | {val_bpt} |

`tokenizer.bin` and the token shards use the formats described in `dev/data/README.md`.
"""


def main():
    p = argparse.ArgumentParser(description="Build dev/data/devil/ from the Debian package dict-devil.")
    p.add_argument("--index", default="/usr/share/dictd/devil.index")
    p.add_argument("--dict", default="/usr/share/dictd/devil.dict.dz")
    p.add_argument("--out", default=os.path.join(HERE, "devil"))
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--package-version", default=None, help="default: asked from dpkg-query")
    args = p.parse_args()
    try:
        for path in (args.index, args.dict):
            if not os.path.exists(path):
                raise climbmix.PrepError(f"{path}: not found (apt-get install dict-devil)")
        version = args.package_version or package_version()
        if version is None:
            raise climbmix.PrepError("cannot ask dpkg-query for the dict-devil version; pass --package-version")
        entries = read_entries(args.index, args.dict)
        n_val = round(len(entries) * args.val_fraction)
        if not 0 < n_val < len(entries):
            raise climbmix.PrepError(f"--val-fraction {args.val_fraction} leaves no train or no val documents")
        train, val = entries[:-n_val], entries[-n_val:]
        print(f"{len(entries)} entries: {len(train)} train, {len(val)} val")

        os.makedirs(args.out, exist_ok=True)
        texts = climbmix.tokenizer_training_texts(iter(train), max_chars=sum(len(t) for t in train) + 1)
        enc = climbmix.train_tokenizer(texts, args.vocab_size)
        climbmix.write_tokenizer(os.path.join(args.out, "tokenizer.bin"), enc, climbmix.DEFAULT_PROMPTS)
        stats = {}
        with climbmix.Encoder(enc, workers=1) as encoder:
            for split, docs in (("train", train), ("val", val)):
                path = os.path.join(args.out, f"{split}_000000.bin")
                ndocs, ntokens, nbytes = climbmix.write_token_shard(path, iter(docs), encoder)
                stats[split] = dict(docs=ndocs, chars=sum(len(d) for d in docs), bytes=nbytes,
                                    tokens=ntokens, bpt=nbytes / (ntokens - ndocs))
        import importlib.metadata as md
        readme = README.format(
            version=version, n_docs=len(entries), n_train=len(train), n_val=len(val),
            rustbpe=md.version("rustbpe"), tiktoken=md.version("tiktoken"), vocab=enc.n_vocab,
            bos=climbmix.bos_id(enc),
            **{f"{s}_{k}": (f"{v:.3f}" if k == "bpt" else f"{v:,}") for s in stats for k, v in stats[s].items()
               if k != "docs"})
        climbmix.write_atomic(os.path.join(args.out, "README.md"), readme.encode("utf-8"))
        print(f"wrote {args.out}: tokenizer.bin, train_000000.bin, val_000000.bin, README.md")
    except climbmix.PrepError as e:
        print(f"make_devil.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
