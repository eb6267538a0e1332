#!/usr/bin/env python3
"""
Write a tiny, deterministic ClimbMix-like parquet dataset for tests:

  OUTDIR/shard_00000.parquet   train, 300 documents, row groups of 128
  OUTDIR/shard_00001.parquet   train, 300 documents, row groups of 128
  OUTDIR/shard_06542.parquet   val (last by name), 200 documents, row groups of 128
  OUTDIR/expected.jsonl        the val documents in order, one JSON string per line (UTF-8,
                               ensure_ascii=False: the only escapes are \\" \\\\ \\n \\r \\t and \\u00XX
                               for other control characters)
  OUTDIR/expected_train.jsonl  the same for the train documents (both train files, in order)

The documents are short varied English text with accents, CJK, emoji, digits, tabs, CRLF, and a few edge
cases: an empty document, one that contains the literal text "<|bos|>" (encode_ordinary must not treat
it as special), and one longer than 10,000 characters (cropped for tokenizer training only).

Usage: python3 dev/data/make_test_parquet.py OUTDIR
Then:  python3 dev/data/climbmix.py --parquet-dir OUTDIR --out OUTDIR/out --vocab-size 512 \\
           --tokenizer-chars 200000 --workers 2
"""

import json
import os
import random
import sys

WORDS = (
    "the of and to in is was for that with as on by at from his her they this which be or an "
    "had not are but were have one all their there been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three river mountain library engine theorem garden window "
    "weather history science music market village ocean language kitchen bicycle telescope"
).split()

UNICODE_WORDS = [
    "café", "naïve", "résumé", "façade", "jalapeño", "Zürich", "São Paulo", "Ångström", "Øresund",
    "crème brûlée", "Dvořák", "Łódź", "Straße", "smörgåsbord", "niño", "coöperate",
    "東京", "北京大学", "日本語", "漢字", "こんにちは", "ありがとう", "한국어", "서울",
    "Привет", "мир", "Ελληνικά", "λόγος", "עברית", "العربية", "हिन्दी", "ไทย",
    "😀", "🚀", "🌍", "👍🏽", "🎉", "❤️", "👨‍👩‍👧", "🇫🇷", "∑", "∞", "≈", "€", "£", "¥", "°C", "½",
]

PUNCT = [".", ",", ";", ":", "!", "?", " -", " (", ")", "\"", "'s", "'re", "'ll", "n't", "..."]


def make_sentence(rng):
    n = rng.randint(4, 18)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.12:
            out.append(rng.choice(UNICODE_WORDS))
        elif r < 0.22:
            k = rng.choice([1, 2, 3, 4, 6, 10])
            out.append(str(rng.randrange(10 ** k)))
        elif r < 0.25:
            out.append(f"{rng.randint(0, 99)}.{rng.randint(0, 99):02d}%")
        else:
            out.append(rng.choice(WORDS))
    s = " ".join(out)
    s = s[0].upper() + s[1:]
    if rng.random() < 0.3:
        i = rng.randrange(len(s))
        s = s[:i] + rng.choice(PUNCT) + s[i:]
    return s + rng.choice([".", ".", ".", "!", "?"])


def make_doc(rng):
    paras = []
    for _ in range(rng.randint(1, 4)):
        paras.append(" ".join(make_sentence(rng) for _ in range(rng.randint(1, 5))))
    sep = rng.choice(["\n\n", "\n", "\r\n", "\n\n\t"])
    doc = sep.join(paras)
    if rng.random() < 0.1:
        doc = "  " + doc + "   "
    return doc


def make_docs(rng, n, specials=()):
    docs = [make_doc(rng) for _ in range(n)]
    for pos, text in specials:
        docs[pos] = text
    return docs


def write_parquet(path, docs, row_group_size=128):
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"text": pa.array(docs, type=pa.string())})
    tmp = path + ".tmp"
    pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
    os.replace(tmp, path)


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print("usage: make_test_parquet.py OUTDIR", file=sys.stderr)
        sys.exit(1)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    rng = random.Random(20240520)
    long_doc = " ".join(make_sentence(rng) for _ in range(200))  # > 10,000 characters
    assert len(long_doc) > 10_000
    train0 = make_docs(rng, 300, [(0, ""), (7, "A literal <|bos|> and <|user_start|> inside a document."),
                                  (150, long_doc)])
    train1 = make_docs(rng, 300, [(299, "Ends the training data: 1234567890 ½ 😀")])
    val = make_docs(rng, 200, [(3, ""), (10, "Val text with <|bos|> in it, 3.14159 and 東京 🚀."),
                               (11, "x"), (199, "Last val document.\n")])
    write_parquet(os.path.join(outdir, "shard_00000.parquet"), train0)
    write_parquet(os.path.join(outdir, "shard_00001.parquet"), train1)
    write_parquet(os.path.join(outdir, "shard_06542.parquet"), val)
    write_jsonl(os.path.join(outdir, "expected.jsonl"), val)
    write_jsonl(os.path.join(outdir, "expected_train.jsonl"), train0 + train1)
    nchars = sum(len(d) for d in train0 + train1)
    print(f"wrote 3 parquet files to {outdir}: train {len(train0) + len(train1)} docs "
          f"({nchars:,} chars), val {len(val)} docs")


if __name__ == "__main__":
    main()
