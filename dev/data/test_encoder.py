#!/usr/bin/env python3
"""Tests of the C++ encoder (chat/encoder.h: tokenizer_encode, tokenizer_encode_with_specials), run through
dev/data/bin/tokenize, against tiktoken (the encoder the token shards are written with) token for token:
encode_ordinary(text.decode("utf-8", errors="replace")), and encode(..., allowed_special="all") for --specials.

    python3 dev/data/test_encoder.py        (or all suites: make test, which builds dev/data/bin/tokenize)

Tokenizers: the embedded corpus's (dev/data/devil/tokenizer.bin, vocab 4096); one trained here with rustbpe
at vocab 8192 on the corpus and dev/data/encoder_test.txt (more merges, some of them multilingual); the
same ranks under GPT-4's split pattern (up to 3 digits a chunk); and "chunk vocabularies" holding every short
substring of the texts, under which each chunk of the split up to 16 bytes is one token, so that the token
ids show the split itself (a trained vocabulary hides most split errors on rare characters: their bytes
never merge either way). Texts: the embedded corpus, dev/data/encoder_test.txt (multilingual and
adversarial, whole and line by line), random strings over a tricky alphabet, invalid UTF-8, long runs,
special tokens, and every edge of the Unicode class ranges of chat/unicode_classes.h in several contexts.

The corpus check against the committed shards and the error cases need no package; the rest needs tiktoken
and rustbpe (python3 -m pip install -r dev/data/requirements.txt) and is skipped without them, except where
the environment variable CI is set (there it fails).
"""
import array
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test"))
sys.path.insert(0, HERE)
import climbmix  # noqa: E402  (needs tiktoken only where an Encoding is made)
from xsatest import REPO, binary, check_one_error, needs_packages, read  # noqa: E402

DEVIL = os.path.join(REPO, "dev", "data", "devil")
TEST_TEXT = os.path.join(REPO, "dev", "data", "encoder_test.txt")
UNICODE_HEADER = os.path.join(REPO, "chat", "unicode_classes.h")
GPT4_PATTERN = climbmix.SPLIT_PATTERN.replace(r"\p{N}{1,2}", r"\p{N}{1,3}")
# tiktoken's own cl100k_base pattern: another spelling with other whitespace rules, which the encoder refuses
CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""


def tokenize(tokenizer, docs, specials=False):
    """The ids dev/data/bin/tokenize gives for each document (bytes), in one --batch run."""
    with tempfile.NamedTemporaryFile(prefix="xsa_encoder_", suffix=".batch") as f:
        f.write(b"".join(struct.pack("<I", len(d)) + d for d in docs))
        f.flush()
        p = subprocess.run([binary("dev/data/bin/tokenize"), tokenizer, f.name, "--batch"] + (["--specials"] if specials else []),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise AssertionError("tokenize %s exited %d: %s" % (tokenizer, p.returncode, p.stderr.decode("utf-8", "replace")[-2000:]))
    lines = p.stdout.decode().split("\n")
    if len(lines) != len(docs) + 1 or lines[-1] != "":
        raise AssertionError("tokenize printed %d lines for %d documents" % (len(lines) - 1, len(docs)))
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def shard_documents(path, bos):
    """The documents of a uint16 token shard as lists of ids (BOS dropped)."""
    data = read(path)
    tokens = array.array("H")
    tokens.frombytes(data[1024:])
    if sys.byteorder != "little":
        tokens.byteswap()
    docs = []
    for t in tokens:
        if t == bos:
            docs.append([])
        else:
            docs[-1].append(t)
    return docs


def file_pieces(path):
    """(token bytes by id, BOS id) of a tokenizer file, read by hand (dev/data/README.md, File formats)."""
    data = read(path)
    version, V, bos = struct.unpack_from("<3i", data, 4)
    pos = 1024 + (struct.unpack_from("<i", data, 20)[0] if version >= 2 else 0)
    pieces = []
    for _ in range(V):
        n = struct.unpack_from("<I", data, pos + 1)[0]
        pieces.append(data[pos + 5:pos + 5 + n])
        pos += 5 + n
    return pieces, bos


def corpus_documents():
    """Every document of the embedded corpus's shards, as (bytes, the shard's ids)."""
    pieces, bos = file_pieces(os.path.join(DEVIL, "tokenizer.bin"))
    out = []
    for name in ("train_000000.bin", "val_000000.bin"):
        for ids in shard_documents(os.path.join(DEVIL, name), bos):
            out.append((b"".join(pieces[i] for i in ids), ids))
    return out


def test_lines():
    """dev/data/encoder_test.txt whole, then line by line (each line with its \\n, the last without)."""
    data = read(TEST_TEXT)
    return [data] + data.splitlines(keepends=True)


def random_strings(n, seed):
    """n strings of up to 24 elements of an alphabet of split traps (apostrophes and the letters after them,
    letters with marks, numbers of several scripts, every kind of space, special token text, emoji parts)."""
    alphabet = ["a", "Z", "\u00e9", "e\u0301", "\u017f", "'", "'", "s", "S", "l", "L", "v", "V", "e", "r", "R", "t", "d", "m", "M", "k", "\u212a",
                "1", "9", "12", "\u2460", "\u0663", "\u216b", "\u00b2", "\U0001e5f1", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u2028",
                "\u3000", "\x0b", "\x0c", "\x85", "\u200b", "\x1c", "!", ".", "(", "-", "<|bos|>", "<|user_end|>", "<|", "|>", "\u65e5", "\u672c",
                "\U0001f44d", "\U0001f3fd", "\u200d", "\ufe0f", "\u0301", "\ufffd", "\x00", "\u03a9", "\u00df", "\U00031350", "\u0e2a\u0e31"]
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(25))).encode("utf-8") for _ in range(n)]


def invalid_utf8(n, seed):
    """n byte strings mixing ASCII, valid multi-byte characters and every kind of ill-formed sequence:
    lone continuation bytes, truncated sequences, overlongs, surrogates, code points past U+10FFFF, C0 C1 F5..FF."""
    parts = [b"a", b" ", b"'s", b"\n", b"1", "\u00e9".encode(), "\u65e5".encode(), "\U0001f44d".encode(), b"<|bos|>",
             b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xdf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xe0\xa0", b"\xe1\x80",
             b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\x9f\xbf", b"\xef\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80",
             b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xe2\x82", b"\xe2\x82\xac"]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.3:  # raw random bytes
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(20))))
        else:
            out.append(b"".join(rng.choice(parts) for _ in range(rng.randrange(16))))
    return out


def long_runs():
    """Chunks of 50k characters (and a 1 MB word): the BPE must not go quadratic, the split must not recurse."""
    return [s.encode("utf-8") for s in [" " * 50000, " " * 50000 + "x", "a" * 50000, "ab" * 25000, "1" * 50000, "\n" * 50000, "\r\n" * 25000,
                                        "\u3000" * 50000, "!" * 50000, "a" * 50000 + " " * 50000 + "b", "\u00e9" * 50000, "the" * 20000,
                                        "abcdefghijklmnopqrstuvwxyz" * 40000]]


def with_specials_texts():
    """Special tokens at the start, the end, adjacent, inside words, after spaces (the text before a special
    token is split on its own: its trailing spaces are a chunk of their own), partial and nested."""
    texts = ["<|bos|>", "<|bos|>hello", "hello<|bos|>", "<|bos|><|bos|>", "a  <|user_start|>  b", "x   <|assistant_end|>\n\n",
             "<|user_start|>What's 2+2?<|user_end|><|assistant_start|>4<|assistant_end|>", "<|bos <|<|bos|>|> <|bos|", "<|python_start|>print('hi')"
             "<|python_end|><|output_start|>hi\n<|output_end|>", "word<|bos|>word", "123<|bos|>456", " \u3000<|bos|>\u3000 ", "'<|bos|>s",
             "\xff<|bos|>"]
    return [t.encode("utf-8", "surrogateescape") for t in texts] + [b"\xff<|bos|>\xfe", b"<|bos\xff|>", b"\xe2\x82<|bos|>\xac"]


def unicode_edges():
    """A line per code point at an edge of a range of chat/unicode_classes.h (first - 1, first, last, last + 1), in
    the contexts that tell its class: after a letter, between digits, doubled before a letter, after an apostrophe."""
    cps = set()
    for first, last in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+), CP_", read(UNICODE_HEADER).decode()):
        first, last = int(first, 16), int(last, 16)
        cps.update([first - 1, first, last, last + 1])
    lines = []
    for cp in sorted(cps):
        if 0 <= cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF:
            c = chr(cp)
            lines.append(("a%sb 1%s2 %s%sx'%s %s\n" % (c, c, c, c, c, c)).encode("utf-8"))
    return lines


class Tok:
    """A tokenizer file and, where tiktoken is there, its Encoding."""

    def __init__(self, path, enc=None):
        self.path, self.enc = path, enc

    def reference(self, doc, specials):
        text = doc.decode("utf-8", "replace")
        return self.enc.encode(text, allowed_special="all") if specials else self.enc.encode_ordinary(text)


def chunk_vocabulary(docs, maxlen=16):
    """Mergeable ranks holding the 256 bytes and every substring of 2..maxlen bytes of the (replacement-decoded)
    documents, except the special tokens' text: every chunk of the split up to maxlen bytes is one token."""
    ranks = {bytes([b]): b for b in range(256)}
    specials = set(s.encode() for s in climbmix.SPECIAL_TOKENS)
    for d in docs:
        d = d.decode("utf-8", "replace").encode("utf-8")
        for i in range(len(d)):
            for j in range(i + 2, min(len(d), i + maxlen) + 1):
                s = d[i:j]
                if s not in ranks and s not in specials:
                    ranks[s] = len(ranks)
    return ranks


def sparse_vocabulary(docs):
    """Mergeable ranks holding the 256 bytes, every pair of bytes of the documents, and their words of 4 or more
    bytes (with and without a space in front): a word is one token when it is a chunk of its own, but BPE from
    its bytes stops at pairs (no part of 3 bytes is a token), so the chunk-is-a-token rule shows."""
    ranks = {bytes([b]): b for b in range(256)}
    for d in docs:
        d = d.decode("utf-8", "replace").encode("utf-8")
        for i in range(len(d) - 1):
            ranks.setdefault(d[i:i + 2], len(ranks))
        for w in d.split():
            for s in (w, b" " + w):
                if len(s) >= 4:
                    ranks.setdefault(s, len(ranks))
    return ranks


class Fixture:
    """The tokenizers, made once: devil, trained (vocab 8192), gpt4 (trained ranks, GPT-4's pattern)."""
    dir = None

    @classmethod
    def get(cls):
        if cls.dir is None:
            cls.dir = tempfile.mkdtemp(prefix="xsa_encoder_")
            enc, _ = climbmix.read_tokenizer(os.path.join(DEVIL, "tokenizer.bin"))
            cls.devil = Tok(os.path.join(DEVIL, "tokenizer.bin"), enc)
            texts = [d.decode("utf-8") for d, _ in corpus_documents()] + read(TEST_TEXT).decode("utf-8").split("\n")
            trained = climbmix.train_tokenizer(iter(texts), 8192)
            cls.trained = cls.write("trained.bin", trained)
            specials = climbmix.special_ids(trained)
            ranks = {trained.decode_single_token_bytes(i): i for i in range(trained.n_vocab) if i not in specials}
            cls.gpt4 = cls.write("gpt4.bin", climbmix.make_encoding(ranks, GPT4_PATTERN))
        return cls

    @classmethod
    def write(cls, name, enc):
        path = os.path.join(cls.dir, name)
        climbmix.write_tokenizer(path, enc, [])
        return Tok(path, enc)

    @classmethod
    def vocabulary_tokenizer(cls, name, ranks):
        return cls.write(name, climbmix.make_encoding(ranks))


def tearDownModule():
    if Fixture.dir:
        shutil.rmtree(Fixture.dir, ignore_errors=True)


def show(tok, ids):
    return [tok.enc.decode_single_token_bytes(i) if tok.enc else i for i in ids]


class Compare(unittest.TestCase):
    def compare(self, what, tok, docs, specials=False):
        """The C++ ids of every document must be tiktoken's; the first mismatch is shown token by token."""
        with self.subTest(what):
            got = tokenize(tok.path, docs, specials)
            want = [tok.reference(d, specials) for d in docs]
            bad = [i for i in range(len(docs)) if got[i] != want[i]]
            if bad:
                i = bad[0]
                k = next((j for j in range(min(len(got[i]), len(want[i]))) if got[i][j] != want[i][j]), min(len(got[i]), len(want[i])))
                self.fail("%d of %d documents differ; the first, #%d (%d bytes): %r\n     from token %d, C++: %r\n     tiktoken:      %r" %
                          (len(bad), len(docs), i, len(docs[i]), docs[i][:300], k, show(tok, got[i][k:k + 12]), show(tok, want[i][k:k + 12])))


@needs_packages("tiktoken", "rustbpe")
class TestAgainstTiktoken(Compare):
    @classmethod
    def setUpClass(cls):
        cls.fx = Fixture.get()
        cls.toks = [("devil", cls.fx.devil), ("trained 8192", cls.fx.trained), ("gpt4 pattern", cls.fx.gpt4)]

    def test_corpus(self):
        """encoder = tiktoken on the embedded corpus, document by document"""
        docs = [d for d, _ in corpus_documents()]
        for name, tok in self.toks:
            self.compare("encoder = tiktoken: the embedded corpus's %d documents, tokenizer %s" % (len(docs), name), tok, docs)

    def test_test_text(self):
        """encoder = tiktoken on dev/data/encoder_test.txt, whole and line by line, with and without specials"""
        docs = test_lines()
        for name, tok in self.toks:
            for specials in (False, True):
                self.compare("encoder = tiktoken: encoder_test.txt (%d texts), tokenizer %s%s" % (len(docs), name, ", --specials" if specials else ""),
                             tok, docs, specials)

    def test_random_strings(self):
        """encoder = tiktoken on 3000 random strings over a tricky alphabet"""
        docs = random_strings(3000, seed=1)
        for name, tok in self.toks:
            for specials in (False, True):
                self.compare("encoder = tiktoken: 3000 random strings, tokenizer %s%s" % (name, ", --specials" if specials else ""), tok, docs, specials)

    def test_invalid_utf8(self):
        """encoder = tiktoken on the replacement-decoded text of 2000 strings of invalid UTF-8"""
        docs = invalid_utf8(2000, seed=2)
        for name, tok in self.toks:
            self.compare("encoder = tiktoken: 2000 byte strings with invalid UTF-8 (tiktoken on errors='replace'), tokenizer %s" % name, tok, docs)

    def test_long_runs(self):
        """encoder = tiktoken on chunks of 50k spaces, letters, digits, newlines, and a 1 MB word"""
        for name, tok in self.toks[:2]:
            self.compare("encoder = tiktoken: runs of 50k characters and a 1 MB word, tokenizer %s" % name, tok, long_runs())

    def test_specials(self):
        """encoder = tiktoken with special tokens in the text"""
        docs = with_specials_texts()
        for name, tok in self.toks:
            for specials in (False, True):
                self.compare("encoder = tiktoken: special token text %s, tokenizer %s" % ("as special tokens (--specials)" if specials else "as ordinary text",
                                                                                         name), tok, docs, specials)

    def test_split_itself(self):
        """the split = tiktoken's, seen through chunk vocabularies (every chunk up to 16 bytes is one token)"""
        sets = [("encoder_test.txt line by line", test_lines()[1:]), ("500 random strings", random_strings(500, seed=3)),
                ("500 strings of invalid UTF-8", invalid_utf8(500, seed=4))]
        edges = unicode_edges()
        for k in range(0, len(edges), 400):  # a vocabulary per 400 lines stays small
            sets.append(("the edges of the Unicode class ranges, lines %d-%d of %d" % (k, min(k + 400, len(edges)), len(edges)), edges[k:k + 400]))
        for what, docs in sets:
            tok = Fixture.vocabulary_tokenizer("chunks.bin", chunk_vocabulary(docs))
            self.compare("split = tiktoken's (chunk vocabulary of %d tokens): %s" % (tok.enc.n_vocab, what), tok, docs)
            if what.startswith("encoder_test"):
                self.compare("split = tiktoken's (chunk vocabulary): %s, --specials" % what, tok, docs, True)

    def test_whole_chunk_tokens(self):
        """a chunk that is a token is that token, even where BPE from its bytes cannot reach it (sparse vocabulary)"""
        docs = test_lines() + [d for d, _ in corpus_documents()[:200]]
        tok = Fixture.vocabulary_tokenizer("sparse.bin", sparse_vocabulary(docs))
        self.compare("encoder = tiktoken: sparse vocabulary of %d tokens (byte pairs and whole words), encoder_test.txt and 200 corpus "
                     "documents" % tok.enc.n_vocab, tok, docs)


class TestRoundTrip(unittest.TestCase):
    """Needs no package: the committed shards were written by tiktoken, so re-encoding their text must give them back."""

    def test_corpus_shards(self):
        """encoder = the committed shards of the embedded corpus (written by tiktoken), document by document"""
        docs = corpus_documents()
        got = tokenize(os.path.join(DEVIL, "tokenizer.bin"), [d for d, _ in docs])
        bad = [i for i, (d, ids) in enumerate(docs) if got[i] != ids]
        self.assertFalse(bad, "%d of %d documents encode to other tokens than the shards hold; the first: %r" % (len(bad), len(docs), docs[bad[0]][0][:200] if bad else ""))

    def test_decode_encode(self):
        """decode(encode(x)) = x with invalid UTF-8 replaced by U+FFFD, as Python's errors='replace' does"""
        pieces, _ = file_pieces(os.path.join(DEVIL, "tokenizer.bin"))
        docs = invalid_utf8(2000, seed=5) + random_strings(1000, seed=6) + test_lines()
        for specials in (False, True):
            got = tokenize(os.path.join(DEVIL, "tokenizer.bin"), docs, specials)
            bad = [i for i, d in enumerate(docs) if b"".join(pieces[t] for t in got[i]) != d.decode("utf-8", "replace").encode("utf-8")]
            with self.subTest("decode(encode(x)) = x.decode('utf-8', 'replace'), %d texts%s" % (len(docs), ", --specials" if specials else "")):
                self.assertFalse(bad, "%d texts differ; the first: %r" % (len(bad), docs[bad[0]] if bad else b""))


class TestErrors(unittest.TestCase):
    """Bad tokenizer files and arguments: one "error: ..." line naming the culprit, exit code 1."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_encoder_err_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.devil = read(os.path.join(DEVIL, "tokenizer.bin"))
        self.text = os.path.join(self.dir, "text.txt")
        with open(self.text, "wb") as f:
            f.write(b"hello world")

    def with_pattern(self, name, version, pattern):
        """the devil tokenizer with another version / split pattern (header[1], header[5] and the pattern bytes)"""
        old = struct.unpack_from("<i", self.devil, 20)[0]
        header = bytearray(self.devil[:1024])
        struct.pack_into("<i", header, 4, version)
        struct.pack_into("<i", header, 20, len(pattern))
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(bytes(header) + pattern + self.devil[1024 + old:])
        return path

    def test_version1(self):
        """a version-1 file loads, but encoding it -> one error naming the file and the command that rewrites it"""
        v1 = self.with_pattern("v1.bin", 1, b"")
        check_one_error(self, [binary("dev/data/bin/tokenize"), v1, self.text], "--upgrade-tokenizer " + v1)

    def test_unsupported_pattern(self):
        """a split pattern other than nanochat's and GPT-4's (tiktoken's cl100k_base spelling) -> one error naming the file"""
        p = self.with_pattern("cl100k.bin", 2, CL100K_PATTERN.encode())
        check_one_error(self, [binary("dev/data/bin/tokenize"), p, self.text], p + "': this encoder implements")

    def test_usage(self):
        """tokenize: no tokenizer, an unknown flag, a missing text file, --bench 0, a cut --batch input -> one error each"""
        tool, tok = binary("dev/data/bin/tokenize"), os.path.join(DEVIL, "tokenizer.bin")
        cut = os.path.join(self.dir, "cut.batch")
        with open(cut, "wb") as f:
            f.write(struct.pack("<I", 100) + b"short")
        check_one_error(self, [tool], "no tokenizer file")
        check_one_error(self, [tool, tok, "--frobnicate"], "unknown flag '--frobnicate'")
        check_one_error(self, [tool, tok, os.path.join(self.dir, "missing.txt")], "missing.txt")
        check_one_error(self, [tool, tok, self.text, "--bench", "0"], "--bench")
        check_one_error(self, [tool, tok, cut, "--batch"], "cut.batch': document 0 claims 100 bytes")


@needs_packages("tiktoken")
class TestTokenizerFile(unittest.TestCase):
    """climbmix.py's side of version 2: reading both versions, --upgrade-tokenizer."""

    def test_upgrade(self):
        """climbmix.py --upgrade-tokenizer on a version-1 file: version 2 with nanochat's pattern, token records and prompts byte-identical"""
        d = tempfile.mkdtemp(prefix="xsa_encoder_up_")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        v2 = read(os.path.join(DEVIL, "tokenizer.bin"))
        S = struct.unpack_from("<i", v2, 20)[0]
        v1 = v2[:4] + struct.pack("<i", 1) + v2[8:20] + struct.pack("<i", 0) + v2[24:1024] + v2[1024 + S:]
        path = os.path.join(d, "tokenizer.bin")
        with open(path, "wb") as f:
            f.write(v1)
        enc1, prompts1 = climbmix.read_tokenizer(path)
        p = subprocess.run([sys.executable, "dev/data/climbmix.py", "--upgrade-tokenizer", path], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        up = read(path)
        enc2, prompts2 = climbmix.read_tokenizer(path)
        self.assertTrue(p.returncode == 0 and up == v2 and enc1._pat_str == enc2._pat_str == climbmix.SPLIT_PATTERN and prompts1 == prompts2 and
                        enc1._mergeable_ranks == enc2._mergeable_ranks,
                        "exit %d (%s); the upgraded file %s the committed version-2 file" % (p.returncode, p.stdout.decode()[-500:], "equals" if up == v2 else "DIFFERS FROM"))

    def test_read_gpt4_pattern(self):
        """a version-2 file keeps its split pattern: read_tokenizer gives the Encoding it was written from"""
        fx = Fixture.get()
        enc, _ = climbmix.read_tokenizer(fx.gpt4.path)
        self.assertEqual(enc._pat_str, GPT4_PATTERN)


@needs_packages("unicodedata2")
class TestUnicodeTables(unittest.TestCase):
    def test_header_current(self):
        """chat/unicode_classes.h is what dev/data/make_unicode_classes.py writes (Unicode 16.0.0, tiktoken 0.14.0's)"""
        p = subprocess.run([sys.executable, "dev/data/make_unicode_classes.py", "--check"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = p.stdout.decode()
        self.assertTrue(p.returncode == 0 and "warning" not in out, "exit %d: %s" % (p.returncode, out))


if __name__ == "__main__":
    unittest.main()
