#!/usr/bin/env python3
"""End-to-end tests of ./sample and ./chat_cli (build them first: make test does) on a model trained here for a
few steps on the embedded corpus: the greedy continuation of sample equals the trainer's own greedy
samples (which come from the same KV-cache generation, but from prompts that tiktoken tokenized when the
tokenizer file was written: so this also checks the C++ encoder on them); streaming and stdin; several
rows; chat_cli's one-shot path; and the bad inputs (exit code 1, one "error:" line): a prompt past the
context, a tokenizer that is not the model's (another vocabulary, or the same size with other tokens), a
model file that does not name its tokenizer, bad flags. The logits themselves are checked against a
full forward by test_xsa.cu (test_kv_cache_generation).

    python3 dev/test/test_generate.py        (or all suites: make test)

Standard library only.
"""
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import binary, check_one_error, read, run  # noqa: E402

TOKENIZER = "dev/data/devil/tokenizer.bin"
# 40 steps of a 2-layer model: enough that the greedy samples are not all one token
TRAIN = ("-d 2 --dim 64 --heads 2 -t 64 -b 4 -B 256 -n 40 --warmup-steps 2 --eval-every 40 --eval-tokens 256 "
         "--sample-every 40 --core-every -1")


def printable(data):
    """train_gpt's printable(): newline as \\n, other bytes below 0x20 and 0x7f as \\xNN, the rest as they are."""
    out = bytearray()
    for c in data:
        if c == 0x0A:
            out += b"\\n"
        elif c < 0x20 or c == 0x7F:
            out += b"\\x%02x" % c
        else:
            out.append(c)
    return bytes(out)


def read_tokenizer_pieces(path):
    """(header bytes, pattern bytes, list of (special, piece), trailing bytes) of a tokenizer file
    (dev/data/README.md: version 2 has the split pattern after the 1024-byte header)."""
    data = read(path)
    magic, version, V, bos, P, pattern_len = struct.unpack_from("<6i", data, 0)
    pos = 1024 + (pattern_len if version == 2 else 0)
    records = []
    for _ in range(V):
        special, n = struct.unpack_from("<BI", data, pos)
        records.append((special, data[pos + 5:pos + 5 + n]))
        pos += 5 + n
    return data[:1024], data[1024:1024 + (pattern_len if version == 2 else 0)], records, data[pos:]


def write_tokenizer_pieces(path, header, pattern, records, tail):
    with open(path, "wb") as f:
        f.write(header + pattern)
        for special, piece in records:
            f.write(struct.pack("<BI", special, len(piece)) + piece)
        f.write(tail)


def strip_tokenizer_metadata(src, dst):
    """A copy of the safetensors file `src` without the tokenizer keys in its metadata (as files written
    before models recorded their tokenizer; nor their checksums, which came later still)."""
    data = read(src)
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    for key in ("tokenizer", "tokenizer_fingerprint", "checksums"):
        header["__metadata__"].pop(key)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + n:])


class TestGenerate(xsatest.TempDirTest):
    PREFIX = "xsa_generate_"

    @classmethod
    def setUpClass(cls):
        cls.model_dir = tempfile.mkdtemp(prefix=cls.PREFIX)
        cls.model = os.path.join(cls.model_dir, "model.safetensors")
        code, cls.train_out = run([binary("train_gpt_cpu")] + shlex.split(TRAIN) + ["--export-safetensors", cls.model, "-o", cls.model_dir])
        if code != 0:
            shutil.rmtree(cls.model_dir, ignore_errors=True)
            raise AssertionError("training the test model failed (exit %d):\n%s" % (code, cls.train_out))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.model_dir, ignore_errors=True)

    def sample(self, *args, stdin=None):
        """./sample -e MODEL ARGS: (exit code, stdout) with stderr kept apart."""
        p = subprocess.run([binary("sample"), "-e", self.model] + list(args), cwd=xsatest.REPO, input=stdin,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return p.returncode, p.stdout, p.stderr.decode(errors="replace")

    def test_greedy_matches_trainer(self):
        """sample -t 0 -n 16 on each of the trainer's prompts = the trainer's greedy sample at the last step
        (cut at the first <|bos|>, where sample stops)"""
        samples = self.train_out.split("samples at step 40 (greedy, 16 tokens):\n")[1].split("\n")
        checked = 0
        for line in samples:
            if not line.startswith("  ") or "|" not in line:
                break
            prompt, cont = line[2:].split("|", 1)
            with self.subTest(prompt=prompt):
                code, out, err = self.sample("-p", prompt, "-n", "16", "-t", "0")
                want = cont.encode().split(b"<|bos|>")[0]
                self.assertEqual(code, 0, err)
                self.assertTrue(out.startswith(prompt.encode()), out)
                self.assertEqual(printable(out[len(prompt.encode()):].rstrip(b"\n")), want)
                self.assertIn("tokens/s", err)
            checked += 1
        self.assertEqual(checked, 7, "the trainer printed %d samples:\n%s" % (checked, self.train_out))

    def test_stdin_rows_and_chat(self):
        """an empty text from stdin (BOS only) works; two -p rows print two rows; sampling is seeded;
        chat_cli -p answers once"""
        code, out, err = self.sample("-n", "8", stdin=b"")
        with self.subTest("empty stdin: exit 0"):
            self.assertEqual(code, 0, err)
        code, out, err = self.sample("-p", "The", "-p", "A much longer text to continue", "-n", "6", "-t", "0")
        with self.subTest("two -p: two rows"):
            self.assertTrue(code == 0 and out.count(b"--- row ") == 2 and b"\nA much longer text to continue" in out, out + err.encode())
        runs = [self.sample("-p", "The", "-n", "12", "-t", "1", "-s", s)[1] for s in ("3", "3", "4")]
        with self.subTest("-s: the same seed gives the same text"):
            self.assertEqual(runs[0], runs[1])
            self.assertNotEqual(runs[0], b"")
        code, out, err = self.sample("-p", "The", "-n", "12", "-t", "1", "-s", "3")
        ckpt = os.path.join(self.model_dir, "ckpt_000040.safetensors")
        code_ckpt, out_ckpt = run([binary("sample"), "-e", ckpt, "-p", "The", "-n", "12", "-t", "1", "-s", "3"], want_stdout=True)
        with self.subTest("the checkpoint gives the export's text"):
            self.assertTrue(code == 0 and code_ckpt == 0 and out_ckpt.startswith(out.decode().rstrip("\n")), out_ckpt)
        code_dir, out_dir = run([binary("sample"), "-e", self.model_dir, "-p", "The", "-n", "12", "-t", "1", "-s", "3"], want_stdout=True)
        with self.subTest("-e a run's directory: its latest checkpoint, said so"):
            self.assertTrue(code_dir == 0 and "weights: %s (the latest checkpoint in" % ckpt in out_dir and out.decode().rstrip("\n") in out_dir, out_dir)
        code, out_base = run([binary("chat_cli"), "-e", ckpt, "-p", "Hello", "-n", "4"])
        with self.subTest("chat_cli on a base-training checkpoint: a note that it needs chat_sft"):
            self.assertTrue(code == 0 and "note: this is a base model" in out_base and "./chat_sft --init-from" in out_base, out_base)
        code, out = run([binary("chat_cli"), "-e", self.model, "-p", "Hello", "-n", "8"])
        with self.subTest("chat -p: exit 0 and a speed line"):
            self.assertTrue(code == 0 and "tokens/s" in out, out)
        p = subprocess.run([binary("chat_cli"), "-e", self.model, "-n", "6"], cwd=xsatest.REPO, input=b"Hello\nclear\nWho are you?\nquit\nnot read\n",
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = p.stdout.decode(errors="replace")
        with self.subTest("chat on stdin: two answers around a 'clear', stops at 'quit'"):
            self.assertTrue(p.returncode == 0 and out.count("Assistant: ") == 2 and "(conversation cleared)" in out and out.count("User: ") == 4, out)

    def test_bad_inputs(self):
        """sample and chat_cli: one error line and exit 1 for each bad input"""
        sample, chat = binary("sample"), binary("chat_cli")
        check_one_error(self, [sample, "-e", self.model, "-p", "word " * 100], "the model's context is 64")
        check_one_error(self, [sample, "-p", "x"], "needs -e CHECKPOINT")
        check_one_error(self, [sample, self.model], "is not an option (options start with -")
        check_one_error(self, [sample, "-e", self.path()], "is a directory without a checkpoint")
        check_one_error(self, [sample, "-e", self.model, "-n", "0"], "-n must be >= 1")
        check_one_error(self, [sample, "-e", self.model, "-t", "-1"], "-t must be in [0, 100]")
        check_one_error(self, [sample, "-e", self.model, "-k", "x"], "-k expects an integer")
        check_one_error(self, [sample, "-e", self.path("missing.safetensors")], "missing.safetensors")
        check_one_error(self, [chat, "-e", self.model, "--bad", "1"], "unknown option '--bad'")
        # a tokenizer with the same vocabulary but two tokens swapped
        header, pattern, records, tail = read_tokenizer_pieces(os.path.join(xsatest.REPO, TOKENIZER))
        records[300], records[301] = records[301], records[300]
        other = self.path("other_tokenizer.bin")
        write_tokenizer_pieces(other, header, pattern, records, tail)
        check_one_error(self, [sample, "-e", self.model, "--tokenizer", other], "is not the one the model")
        # a tokenizer with another vocabulary size
        small = self.path("small_tokenizer.bin")
        write_tokenizer_pieces(small, header[:8] + struct.pack("<i", len(records) - 1) + header[12:16] + struct.pack("<i", 0) + header[20:], pattern,
                               records[:-1], b"")  # the last special token and the sample prompts dropped
        check_one_error(self, [sample, "-e", self.model, "--tokenizer", small], "not the model's tokenizer")
        # a model file that does not name its tokenizer: --tokenizer needed
        unnamed = self.path("unnamed.safetensors")
        strip_tokenizer_metadata(self.model, unnamed)
        check_one_error(self, [sample, "-e", unnamed, "-p", "x"], "pass --tokenizer FILE")
        code, out = run([sample, "-e", unnamed, "--tokenizer", TOKENIZER, "-p", "x", "-n", "2"])
        with self.subTest("a model file that does not name its tokenizer, with --tokenizer: exit 0"):
            self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
