#!/usr/bin/env python3
"""End-to-end tests of the binaries, ./train_gpt_cpu and ./eval_core (build them first: make test does):
the command line's presets, bad flags and bad files (exit code 1 and one "error:" line), the main job on
the embedded data (metrics.jsonl, checkpoints, a resume with other flags refused), learnable XSA alpha,
--ranks 2 (one rank prints and logs; CORE scored by two ranks identical to eval_core in one process), and
CORE task files with a wrong magic, span or gold index. Each test works in its own temporary directory.
The numerics of --ranks 2 (the update against the same step computed in one process) are checked by
dev/test/test_infra.cu, which has the model to compute that step; resume, bit-identical to the run left
alone, by dev/test/test_resume.py.

    python3 dev/test/test_e2e.py        (or all suites: make test)

Standard library only.
"""
import json
import math
import os
import shlex
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import REPO, binary, check_one_error, read, run  # noqa: E402

# a model small enough for a few steps in about a second (2 micro-batches of 2 rows x 32 tokens per step)
TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 3 --eval-tokens 256 --sample-every -1"
SHARD_MAGIC = 20240520


def train_gpt(args, want_stdout=True):
    """./train_gpt_cpu with `args` split as the shell would: (exit code, output)."""
    return run([binary("train_gpt_cpu")] + shlex.split(args), want_stdout)


def rejects(test, args, expect):
    """train_gpt ARGS must exit 1 with one line "error: ...EXPECT..." on stderr."""
    check_one_error(test, [binary("train_gpt_cpu")] + shlex.split(args), expect, "train_gpt " + args)


def write_shard(path, tokens, version):
    """A token shard (dev/data/README.md): 256 int32 of header, then uint16 (version 1) or uint32 tokens."""
    header = [0] * 256
    header[0], header[1], header[2] = SHARD_MAGIC, version, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens))


class TempDirTest(xsatest.TempDirTest):
    PREFIX = "xsa_e2e_"


class TestPresets(unittest.TestCase):
    # the study's presets: -d 12 = 768 dim / 12 heads, -d 24 = 1024 dim / 16 heads (head_dim 64)
    PRESETS = [("-d 12", "depth 12, dim 768, heads 12 (kv 12) x 64"),
               ("-d 24", "depth 24, dim 1024, heads 16 (kv 16) x 64"),
               ("-d 24 --head-dim 128", "depth 24, dim 1536, heads 12 (kv 12) x 128"),
               ("-d 6", "depth 6, dim 384, heads 6 (kv 6) x 64"),
               ("-d 12 -x 1 --xsa-layers last:3", "XSA: alpha 1 on layers 9,10,11"),
               ("-d 12 -x learn --xsa-layers 0-1", "XSA: learnable alpha = tanh(a) per head, a starting at 0, on layers 0,1"),
               ("-d 12", "batch: 4 rows per micro-batch (the default"),  # the CPU default
               ("-d 12 -t 1024 -B 2048", "batch: 2 rows per micro-batch (the default")]  # 4 would not divide the total batch

    def test_presets(self):
        for args, expect in self.PRESETS:
            with self.subTest("train_gpt %s -n 0 prints '%s'" % (args, expect)):
                code, out = train_gpt(args + " -n 0")
                self.assertTrue(code == 0 and expect in out, "exit %d, output:\n%s" % (code, out))


class TestBadFlags(unittest.TestCase):
    BAD = [("--bogus 1", "unknown option"),
           ("-x 1.5", "alpha"),
           ("-x -0.1", "alpha"),
           ("-x learned", "-x (XSA alpha) must be a number in [0, 1] or learn, got 'learned'"),
           ("-x learn --xsa-lr -1", "learning rates and weight decays must be >= 0"),
           ("-d 12 -x 1 --xsa-layers 12", "past the depth"),
           ("-d 12 -x 1 --xsa-layers last:13", "last:K"),
           ("--dim 100 --heads 3", "not divisible"),
           ("--heads 12 --kv-heads 5", "multiple of --kv-heads"),
           ("-d", "needs a value"),
           ("-t 4294967328", "out of range"),  # would wrap to 32 as an int
           ("--seed -1", "--seed must be >= 0"),
           ("-d twelve", "integer"),
           ("--window-pattern SXL", "window-pattern")]

    def test_bad_flags(self):
        for args, expect in self.BAD:
            rejects(self, args, expect)


class TestRunAndResume(TempDirTest):
    """The main job on the embedded data: metrics.jsonl, checkpoints; a resume with other flags refused. (Resume
    itself, bit-identical to the uninterrupted run: test_resume.py.)"""

    def test_run_and_resume(self):
        a = self.path("a")
        flags = TINY + " -n 6 --save-every 3 -x 1"
        code_a, out = train_gpt(flags + " -o %s" % self.q("a"))
        metrics_a = read(os.path.join(a, "metrics.jsonl")).decode()
        checkpoints = read(os.path.join(a, "ckpt_000003.safetensors")) != b"" and read(os.path.join(a, "ckpt_000006.safetensors")) != b""
        train_lines, eval_lines = metrics_a.count('"kind": "train"'), metrics_a.count('"kind": "eval"')
        keys = (metrics_a.startswith('{"step": 0, "kind": "run", ') and metrics_a.count('"xsa_alpha": 1,') == 1 and metrics_a.count('"n_layer": 1,') == 1 and
                metrics_a.count('{"step": 0, "kind": "eval", "val_bpb": ') == 1 and metrics_a.count('"lr_mult": ') == 6 and
                metrics_a.count('"dt_ms": ') == 6 and metrics_a.count('"grad_norm": ') == 6 and metrics_a.count('"tok_per_s": ') == 6 and metrics_a.count('"mfu": ') == 6 and
                metrics_a.count('{"step": 5, "kind": "train"') == 1 and metrics_a.count('{"step": 6, "kind": "eval"') == 1)
        with self.subTest("train_gpt --sample-every -1 prints no samples, not even at the end"):
            self.assertNotIn("samples at step", out)
        with self.subTest("train_gpt -n 6 --save-every 3 -o DIR: exit 0, checkpoints at 3 and 6, metrics.jsonl 6 train lines "
                          "(steps 0..5) and 3 eval lines (0, 3, 6) with their keys"):
            self.assertTrue(code_a == 0 and checkpoints and train_lines == 6 and eval_lines == 3 and keys,
                            "exit %d, checkpoints %s, %d train lines, %d eval lines, keys %s; output:\n%s" %
                            (code_a, "written" if checkpoints else "MISSING", train_lines, eval_lines, "ok" if keys else "WRONG", out))
        # resuming with another optimizer setting is refused
        rejects(self, TINY + " -n 6 -x 1 --matrix-lr 0.03 --resume " + self.q("a"), "resume with the same model and optimizer flags")
        # and so is another micro-batch (it changes which documents each step sees)
        rejects(self, TINY + " -n 6 -x 1 -b 1 --resume " + self.q("a"), "resume with -b 2")


class TestLearnableAlpha(TempDirTest):
    """-x learn end to end: the learned alphas logged per layer and head at each evaluation (0 at step 0,
    moved by the end), the logits in the export with xsa_learnable = 1, and a resume as a fixed alpha
    refused. (Its resume, bit-identical: test_resume.py.)"""

    def test_learn_run_and_resume(self):
        a = self.path("a")
        flags = TINY.replace("-d 1", "-d 2") + " -n 6 --save-every 3 -x learn --xsa-layers 1"
        code, out = train_gpt(flags + " -o %s --export-safetensors %s" % (self.q("a"), self.q("a", "final.safetensors")))
        self.assertEqual(code, 0, out)
        metrics = [json.loads(l) for l in read(os.path.join(a, "metrics.jsonl")).decode().splitlines()]
        alphas = {r["step"]: r["alpha"] for r in metrics if r["kind"] == "xsa_alpha"}
        with self.subTest("an xsa_alpha line per evaluation: layer 1 only, one alpha per head, 0 at step 0, moved by step 6"):
            self.assertEqual(sorted(alphas), [0, 3, 6], metrics)
            self.assertTrue(all(list(v) == ["1"] and len(v["1"]) == 2 for v in alphas.values()), alphas)
            self.assertEqual(alphas[0]["1"], [0.0, 0.0])
            self.assertTrue(all(0 < abs(x) < 1 for x in alphas[6]["1"]), alphas)
            self.assertRegex(out, r"step 6/6 \| learned XSA alpha, mean over heads: 1: -?0\.\d{4}\n")
        with self.subTest("the run line says learnable; the export holds layer 1's logits (tanh of them = the logged alphas)"):
            run_line = metrics[0]
            self.assertTrue(run_line["model"]["xsa_learnable"] == 1 and run_line["model"]["xsa_alpha"] == 0, run_line)
            data = read(os.path.join(a, "final.safetensors"))
            header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
            self.assertEqual(header["__metadata__"]["xsa_learnable"], "1")
            self.assertEqual([k for k in header if "xsa_logit" in k], ["transformer.h.1.attn.xsa_logit"])
            start, end = header["transformer.h.1.attn.xsa_logit"]["data_offsets"]
            base = 8 + struct.unpack("<Q", data[:8])[0]
            logits = struct.unpack("<2f", data[base + start:base + end])
            self.assertTrue(all(abs(math.tanh(x) - y) < 1e-6 for x, y in zip(logits, alphas[6]["1"])), (logits, alphas[6]))
        rejects(self, flags.replace("-x learn", "-x 1") + " --resume " + self.q("a"), "resume with the same model and optimizer flags")


class TestBadData(TempDirTest):
    """Bad token shards and tokenizer files: one message, exit code 1."""

    def test_bad_data(self):
        # the BOS id of the default tokenizer the commands below use (header int32 [3], dev/data/README.md)
        bos = struct.unpack_from("<i", read(os.path.join(REPO, "dev/data/devil/tokenizer.bin")), 12)[0]
        write_shard(self.path("good.bin"), [bos, 5, 6, 7, bos, 8, 9], 1)
        base = TINY + " -n 1 -j " + self.q("good.bin")
        good = read(self.path("good.bin"))

        def write(name, data):
            with open(self.path(name), "wb") as f:
                f.write(data)
        write("magic.bin", b"\x01" + good[1:])
        rejects(self, base + " -i " + self.q("magic.bin"), "is not a token shard")
        write("version.bin", good[:4] + b"\x07" + good[5:])
        rejects(self, base + " -i " + self.q("version.bin"), "has version 7")
        write("short.bin", good[:-3])  # the header promises more tokens
        rejects(self, base + " -i " + self.q("short.bin"), "truncated")
        write_shard(self.path("vocab.bin"), [bos, 5, 60000, 7], 1)  # a token of another tokenizer
        rejects(self, base + " -i " + self.q("vocab.bin"), ">= vocab")
        write_shard(self.path("nobos.bin"), [5, 6, bos, 7], 1)
        rejects(self, base + " -i " + self.q("nobos.bin"), "not BOS")
        rejects(self, base + " -i " + self.q("nothing_*.bin"), "no training shard files match")
        rejects(self, base + " -i ''", "option -i needs a value, got an empty one")
        rejects(self, base + " --tokenizer " + self.q("good.bin"), "is not an xsa-train tokenizer file")
        rejects(self, base + " --tokenizer " + self.q("absent.bin"), "cannot open")


class TestRanks(TempDirTest):
    """--ranks 2 on the CPU backend (two forked processes): one rank prints and logs; the ranks score
    alternate CORE items, and eval_core scoring them all in one process on the same weights agrees exactly;
    set-up errors. (The update against the same step computed in one process: test_infra.cu.)"""

    def test_ranks(self):
        # -b 2 -B 128 -t 32: 1 micro-batch per rank
        flags = TINY + " -n 1 --core-every 1 --core-max-per-task 8 -x 1 --ranks 2"
        code, out = train_gpt(flags + " -o %s --export-safetensors %s" % (shlex.quote(self.dir), self.q("final.safetensors")))
        metrics = read(self.path("metrics.jsonl")).decode()
        with self.subTest("train_gpt --ranks 2 (CPU, 2 processes): one rank prints and logs"):
            self.assertTrue(code == 0 and out.count("step 1/1 (") == 1 and metrics.count('"kind": "train"') == 1 and
                            metrics.count('"ranks": 2') == 1, "exit %d, output:\n%s\nmetrics.jsonl:\n%s" % (code, out, metrics))
        with self.subTest("CORE on 2 ranks = eval_core in one process on the same weights (identical CSV)"):
            eval_code, eval_out = run([binary("eval_core"), "-e", self.path("final.safetensors"), "-c", "dev/data/core_tasks", "-m", "8",
                                       "-o", self.path("one.csv")])
            ranks_csv, one_csv = read(self.path("core_000001.csv")), read(self.path("one.csv"))
            self.assertTrue(eval_code == 0 and ranks_csv != b"" and ranks_csv == one_csv,
                            "eval_core exit %d, CSV %s\n%s" % (eval_code, "identical" if ranks_csv == one_csv else "DIFFERENT", eval_out))
        # a set-up error every rank meets is said once; one only rank 1 meets is said by rank 1
        rejects(self, TINY + " -n 1 --ranks 2 --tokenizer /nonexistent", "cannot open")
        rejects(self, TINY + " -n 1 --ranks 2 -i dev/data/devil/val_000000.bin", "rank 1: rank 1 of 2 gets no documents")
        rejects(self, TINY + " -n 1 --ranks 0", "--ranks must be in [1, 64]")


class TestCoreBadFile(TempDirTest):
    """A corrupted copy of a CORE task file: eval_core ends with one message and exit code 1."""
    # (what, byte offset, uint32 written there, expected in the message); item 0 starts after the 1024-byte header
    CASES = [("a wrong magic", 0, 12345, "is not a CORE task file"),
             ("an answer span past the prompt", 1024 + 16, 500, "answer span"),  # item 0, prompt 0: span_end
             ("a gold index past the options", 1024 + 4, 7, "gold index")]

    def test_bad_task_files(self):
        good = read(os.path.join(REPO, "dev/data/core_tasks/01_completion_zeroshot.bin"))
        for what, offset, value, expect in self.CASES:
            d = self.path(what.replace(" ", "_"))
            os.mkdir(d)
            with open(os.path.join(d, "01_bad.bin"), "wb") as f:
                f.write(good[:offset] + struct.pack("<I", value) + good[offset + 4:])
            check_one_error(self, [binary("eval_core"), "-e", "dev/reference/data/core_model.safetensors", "-c", d], expect,
                            "eval_core on a task file with " + what)


if __name__ == "__main__":
    unittest.main()
