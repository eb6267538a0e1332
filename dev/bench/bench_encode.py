#!/usr/bin/env python3
"""Encoding speed of the C++ encoder (chat/encoder.h, through dev/data/bin/tokenize --bench) against tiktoken's
encode_ordinary, both on one thread, on the same texts with the same tokenizer, measured alternately so that a
machine shared with other work slows both alike:

    make dev/data/bin/tokenize && python3 dev/bench/bench_encode.py [--tokenizer FILE] [--seconds S] [--rounds R]

Texts: the embedded corpus (dev/data/devil/ shards decoded, documents joined by blank lines) repeated to about
10 MB, encoded as one text; dev/data/encoder_test.txt (multilingual and adversarial, 3.7 KB) encoded over and over.
Both encoders are first checked to give the same ids. Each of R rounds times the C++ encoder for S seconds, then
tiktoken for S seconds; the table shows the best round of each (the one least disturbed), the ratio of the two,
the machine (CPU model, cores, load average) and the tiktoken version. Needs tiktoken (dev/data/requirements.txt).
"""
import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
sys.path.insert(0, os.path.join(REPO, "dev", "test"))
import climbmix  # noqa: E402
import test_encoder  # noqa: E402  (the corpus documents)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model  # noqa: E402

TOOL = os.path.join(REPO, "dev", "data", "bin", "tokenize")


def cpp_ids(tokenizer, path):
    out = subprocess.run([TOOL, tokenizer, path], check=True, stdout=subprocess.PIPE).stdout.decode()
    return [int(x) for x in out.split()]


def cpp_rate(tokenizer, path, seconds):
    """MB/s that tokenize --bench reports (its first word)"""
    out = subprocess.run([TOOL, tokenizer, path, "--bench", str(seconds)], check=True, stdout=subprocess.PIPE).stdout.decode()
    return float(out.split()[0])


def tiktoken_rate(enc, text, nbytes, seconds):
    enc.encode_ordinary(text)  # warm-up, as --bench does
    runs, t0 = 0, time.perf_counter()
    while True:
        enc.encode_ordinary(text)
        runs += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return nbytes * runs / elapsed / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "dev", "data", "devil", "tokenizer.bin"))
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating C++ / tiktoken rounds (default %(default)s)")
    ap.add_argument("--mb", type=float, default=10.0, help="size of the repeated corpus text in MB (default %(default)s)")
    args = ap.parse_args()
    if not os.access(TOOL, os.X_OK):
        sys.exit("bench_encode: %s is not built: make dev/data/bin/tokenize" % TOOL)
    enc, _ = climbmix.read_tokenizer(args.tokenizer)
    corpus = b"\n\n".join(d for d, _ in test_encoder.corpus_documents())
    texts = [("embedded corpus x %d" % -(-int(args.mb * 1e6) // len(corpus)), corpus * -(-int(args.mb * 1e6) // len(corpus))),
             ("encoder_test.txt", open(test_encoder.TEST_TEXT, "rb").read())]
    print("machine: %s, %d cores, load average %.2f %.2f %.2f (other work included)" % ((cpu_model(), os.cpu_count()) + os.getloadavg()))
    print("tiktoken %s (Python %s), tokenizer %s (vocab %d); best of %d alternating rounds of %.0f s, one thread each" %
          (importlib.metadata.version("tiktoken"), platform.python_version(), os.path.relpath(args.tokenizer, REPO), enc.n_vocab, args.rounds,
           args.seconds))
    rows = []
    with tempfile.TemporaryDirectory(prefix="xsa_bench_encode_") as d:
        for name, data in texts:
            path = os.path.join(d, "text")
            with open(path, "wb") as f:
                f.write(data)
            text = data.decode("utf-8")
            ids = enc.encode_ordinary(text)
            if cpp_ids(args.tokenizer, path) != ids:
                sys.exit("bench_encode: the C++ encoder and tiktoken give different ids on %s (python3 dev/data/test_encoder.py)" % name)
            cpp, tik = [], []
            for _ in range(args.rounds):
                cpp.append(cpp_rate(args.tokenizer, path, args.seconds))
                tik.append(tiktoken_rate(enc, text, len(data), args.seconds))
            rows.append((name, len(data), len(ids), max(cpp), max(tik)))
    print()
    print("| text | bytes | tokens | C++ MB/s | tiktoken MB/s | C++ / tiktoken |")
    print("|---|---|---|---|---|---|")
    for name, nbytes, ntokens, cpp, tik in rows:
        print("| %s | %s | %s | %.1f | %.1f | %.2f |" % (name, format(nbytes, ","), format(ntokens, ","), cpp, tik, cpp / tik))
    print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
