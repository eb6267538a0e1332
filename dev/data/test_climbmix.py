#!/usr/bin/env python3
"""Tests of dev/data/climbmix.py offline, on the parquet files dev/data/make_test_parquet.py writes: the
tokenizer file and the token shards it writes decode back to every document exactly. The files are read
here by a reader written from dev/data/README.md ("File formats"), not with climbmix.py's own code.

    python3 dev/data/test_climbmix.py        (or all suites: make test)

Needs pyarrow, tiktoken and rustbpe (python3 -m pip install -r dev/data/requirements.txt): without them the
tests are skipped, except where the environment variable CI is set (there they fail).
"""
import json
import os
import shutil
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from xsatest import needs_packages, read, run  # noqa: E402

TOKENIZER_MAGIC, SHARD_MAGIC = 20241201, 20240520
# nanochat's split pattern (its tokenizer.py), which version 2 stores
NANOCHAT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""


def read_tokenizer(path):
    """tokenizer.bin -> (pieces: the bytes of every token, special: 0/1 per token, bos id, prompts: lists of ids,
    split pattern: bytes); raises AssertionError where the file breaks the format (version 2)."""
    data = read(path)
    magic, version, V, bos, P, S = struct.unpack_from("<6i", data, 0)
    assert magic == TOKENIZER_MAGIC and version == 2, "%s: magic %d version %d" % (path, magic, version)
    assert 0 <= bos < V, "%s: BOS id %d outside [0, %d)" % (path, bos, V)
    pattern = data[1024:1024 + S]
    pos, pieces, special, prompts = 1024 + S, [], [], []
    for _ in range(V):
        is_special, n = struct.unpack_from("<BI", data, pos)
        pieces.append(data[pos + 5:pos + 5 + n])
        special.append(is_special)
        assert len(pieces[-1]) == n, "%s: truncated" % path
        pos += 5 + n
    for _ in range(P):
        (n,) = struct.unpack_from("<I", data, pos)
        ids = list(struct.unpack_from("<%dI" % n, data, pos + 4))
        assert all(i < V for i in ids), "%s: a prompt token id >= vocab %d" % (path, V)
        prompts.append(ids)
        pos += 4 + 4 * n
    assert pos == len(data), "%s: %d bytes after the prompts" % (path, len(data) - pos)
    assert special[bos], "%s: the BOS id is not special" % path
    return pieces, special, bos, prompts, pattern


def shard_documents(path, pieces, bos):
    """Every document of a token shard (BOS excluded), decoded to bytes; None if the shard breaks a rule
    (header, size, the first token not BOS, an id >= vocab)."""
    data = read(path)
    if len(data) < 1024:
        return None
    magic, version, lo, hi = struct.unpack_from("<iiII", data, 0)
    width = {1: 2, 2: 4}.get(version)
    n = lo | hi << 32
    if magic != SHARD_MAGIC or width is None or n == 0 or len(data) != 1024 + n * width:
        return None
    tokens = struct.unpack_from("<%d%s" % (n, "H" if width == 2 else "I"), data, 1024)
    if tokens[0] != bos:
        return None
    docs = []
    for t in tokens:
        if t >= len(pieces):
            return None
        if t == bos:
            docs.append([])
        else:
            docs[-1].append(pieces[t])
    return [b"".join(d) for d in docs]


def jsonl_strings(path):
    """The JSON strings of a .jsonl file, one per non-empty line, as UTF-8 bytes."""
    return [json.loads(line.decode("utf-8")).encode("utf-8") for line in read(path).split(b"\n") if line]


@needs_packages("pyarrow", "tiktoken", "rustbpe")
class TestClimbmixOffline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="xsa_climbmix_")
        code, out = run([sys.executable, "dev/data/make_test_parquet.py", cls.dir])
        if code == 0:
            code, out = run([sys.executable, "dev/data/climbmix.py", "--parquet-dir", cls.dir, "--out", os.path.join(cls.dir, "out"),
                             "--vocab-size", "512", "--tokenizer-chars", "200000", "--workers", "2"])
        if code != 0:
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise AssertionError("dev/data/climbmix.py offline run failed (exit %d):\n%s" % (code, out[-3000:]))
        cls.pieces, cls.special, cls.bos, cls.prompts, cls.pattern = read_tokenizer(os.path.join(cls.dir, "out", "tokenizer.bin"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_tokenizer(self):
        """climbmix.py tokenizer: version 2 with nanochat's split pattern, vocab 512, 9 special tokens, BOS '<|bos|>', 7 prompts decoding to nanochat's"""
        first = b"".join(self.pieces[t] for t in self.prompts[0][1:]) if self.prompts else b""
        self.assertTrue(len(self.pieces) == 512 and sum(self.special) == 9 and self.pieces[self.bos] == b"<|bos|>" and
                        len(self.prompts) == 7 and first == b"The capital of France is" and self.pattern == NANOCHAT_PATTERN.encode(),
                        "vocab %d (512), %d special tokens (9), BOS %r, %d prompts, the first %r, split pattern %r" %
                        (len(self.pieces), sum(self.special), self.pieces[self.bos], len(self.prompts), first, self.pattern))

    def test_shards(self):
        """climbmix.py shards: BOS before every document, ids < vocab, the val and train documents decode to the parquet text exactly"""
        out = os.path.join(self.dir, "out")
        val = shard_documents(os.path.join(out, "val_000000.bin"), self.pieces, self.bos)
        train0 = shard_documents(os.path.join(out, "train_000000.bin"), self.pieces, self.bos)
        train1 = shard_documents(os.path.join(out, "train_000001.bin"), self.pieces, self.bos)
        want_val, want_train = jsonl_strings(os.path.join(self.dir, "expected.jsonl")), jsonl_strings(os.path.join(self.dir, "expected_train.jsonl"))
        ok = val is not None and train0 is not None and train1 is not None
        self.assertTrue(ok and want_val and val == want_val and train0 + train1 == want_train,
                        "shards %s; %s val and %s train documents against %d and %d expected" %
                        ("readable" if ok else "BROKEN", len(val) if val is not None else "-",
                         len(train0) + len(train1) if ok else "-", len(want_val), len(want_train)))


class TestMissingPackage(unittest.TestCase):
    """Without a package of requirements.txt: one error line naming it and the pip command, not a traceback."""

    def test_without_pyarrow(self):
        d = tempfile.mkdtemp(prefix="xsa_climbmix_nopkg_")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        for name in ("a.parquet", "b.parquet"):
            open(os.path.join(d, name), "wb").close()
        # pyarrow made unimportable in this interpreter (None in sys.modules), then the script run as __main__
        script = ("import sys, runpy; sys.modules['pyarrow'] = None; sys.argv = ['climbmix.py', '--parquet-dir', %r, '--out', %r]; "
                  "runpy.run_path('dev/data/climbmix.py', run_name='__main__')" % (d, os.path.join(d, "out")))
        code, err = run([sys.executable, "-c", script], want_stdout=False)
        self.assertTrue(code == 1 and err.count("\n") == 1 and err.startswith("climbmix.py: error: needs the Python package 'pyarrow'") and
                        "-m pip install -r dev/data/requirements.txt" in err and "Traceback" not in err, "exit %d: %s" % (code, err))


if __name__ == "__main__":
    unittest.main()
