#!/usr/bin/env python3
"""End-to-end tests of the binaries, ./train_gpt_cpu and ./eval_core (build them first: make test does):
the command line's presets, bad flags and bad files (exit code 1 and one "error:" line), the main job on
the embedded data (metrics.jsonl, checkpoints, a resume with other flags refused), learnable XSA alpha,
--ranks 2 (one rank prints and logs; CORE scored by two ranks identical to eval_core in one process),
CORE task files with a wrong magic, span or gold index, and a bundle built like the real one whose items
have empty answer spans, through dev/data/core.py and eval_core, scored as nanochat scores them. Each test
works in its own temporary directory.
The numerics of --ranks 2 (the update against the same step computed in one process) are checked by
dev/test/test_infra.cu, which has the model to compute that step; resume, bit-identical to the run left
alone, by dev/test/test_resume.py.

    python3 dev/test/test_e2e.py        (or all suites: make test)

Standard library only (the bundle test runs dev/data/core.py, which needs tiktoken: skipped without it).
"""
import csv
import json
import math
import os
import random
import shlex
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import REPO, binary, check_one_error, needs_packages, read, run  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import test_core  # noqa: E402  (its independent reader of CORE task files)

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
               ("-d 12 --threads 1", "backend: CPU (fp32, OpenMP), 1 thread ("),
               ("-d 12", "batch: 4 rows per micro-batch (the default"),  # the CPU default
               ("-d 12 -t 1024 -B 2048", "batch: 2 rows per micro-batch (the default"),  # 4 would not divide the total batch
               # the plan says what the run would warn about: the data, and the embedded corpus read thousands of times over
               ("-d 24 -i dev/data/devil/train_*.bin", "data: 1 training shard (dev/data/devil/train_*.bin)"),
               ("-d 24 -i dev/data/devil/train_*.bin", "warning: this plan reads the 93339 training tokens 39364 times over")]

    def test_presets(self):
        for args, expect in self.PRESETS:
            with self.subTest("train_gpt %s -n 0 prints '%s'" % (args, expect)):
                code, out = train_gpt(args + " -n 0")
                self.assertTrue(code == 0 and expect in out, "exit %d, output:\n%s" % (code, out))


class TestWaitPolicy(unittest.TestCase):
    """OpenMP's threads spin briefly at barriers, then sleep (llmc/common.h, openmp_short_spin: the run slows in proportion
    to its CPU share on a shared machine): without OMP_WAIT_POLICY or GOMP_SPINCOUNT the program starts itself again
    with GOMP_SPINCOUNT=3000, in the environment libgomp reads as it loads (the process's initial environment,
    /proc/PID/environ, which setenv alone does not change); a policy the user set is kept as given."""

    def start(self, env):
        env = dict({k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}, **env)
        p = subprocess.Popen([binary("train_gpt_cpu")] + shlex.split(TINY) + ["-n", "100000", "--eval-every", "100000"], cwd=xsatest.REPO,
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        backend = next((line.decode("utf-8", "replace") for line in p.stdout if line.startswith(b"backend: ")), "(no backend line)")
        with open("/proc/%d/environ" % p.pid, "rb") as f:
            environ = f.read().split(b"\0")
        return backend, environ

    def test_short_spin_by_default(self):
        backend, environ = self.start({})
        self.assertIn("(GOMP_SPINCOUNT=3000)", backend)
        self.assertIn(b"GOMP_SPINCOUNT=3000", environ, "the program was not started again with GOMP_SPINCOUNT set")

    def test_user_policy_kept(self):
        for name, value in (("OMP_WAIT_POLICY", "active"), ("GOMP_SPINCOUNT", "100")):
            with self.subTest("%s=%s" % (name, value)):
                backend, environ = self.start({name: value})
                self.assertIn("(%s=%s)" % (name, value), backend)
                self.assertNotIn(b"GOMP_SPINCOUNT=3000", environ)


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
        rejects(self, TINY + " -n 6 -x 1 --matrix-lr 0.03 --resume " + self.q("a"), "these flags given here differ: --matrix-lr 0.03 (the run's: 0.02)")
        # and so is another micro-batch (it changes which documents each step sees)
        rejects(self, TINY + " -n 6 -x 1 -b 1 --resume " + self.q("a"), "these flags given here differ: -b 1 (the run's: 2)")
        # a directory without -o
        rejects(self, TINY + " " + self.q("a"), "is not an option (options start with -; every option takes a value, e.g. -o")
        # and another data order
        rejects(self, TINY + " -n 6 -x 1 --data-seed 3 --resume " + self.q("a"), "these flags given here differ: --data-seed 3 (the run's: 0)")

    def test_thread_count_changes_nothing(self):
        # the reductions have a fixed order, so --threads 1 and --threads 2 give the same run bit for bit (a model
        # large enough that the kernels split their work over the threads)
        flags = "-d 2 --dim 128 --heads 2 -t 64 -b 4 -B 512 -n 4 --warmup-steps 2 --eval-every 2 --eval-tokens 512 --sample-every -1 --core-every -1"
        runs = {}
        for threads in (1, 2):
            out = self.path("threads_%d" % threads)
            code, text = train_gpt(flags + " --threads %d -o %s" % (threads, shlex.quote(out)))
            self.assertEqual(code, 0, text)
            lines = [json.loads(l) for l in read(os.path.join(out, "metrics.jsonl")).decode().splitlines()]
            data = read(os.path.join(out, "ckpt_000004.safetensors"))
            header = struct.unpack_from("<Q", data, 0)[0]
            runs[threads] = ([(m["step"], m["kind"], m.get("loss"), m.get("grad_norm"), m.get("val_bpb")) for m in lines if m["kind"] in ("train", "eval")],
                             data[8 + header:])
        with self.subTest("--threads 1 and --threads 2: the same losses, grad norms and val bpb, the same final weights and state"):
            self.assertEqual(runs[1][0], runs[2][0])
            self.assertTrue(len(runs[1][0]) == 7 and runs[1][1] == runs[2][1], "weights or optimizer state differ")

    def test_output_directory_protected(self):
        """train_gpt -o DIR into an earlier run's DIR: one error naming its files and --resume / --overwrite 1, nothing
        changed; --overwrite 1 deletes them first (the new run's metrics alone, no old checkpoint left); --resume on a
        missing directory or one without a checkpoint: one error at once"""
        d = self.path("o")
        flags = TINY + " --core-every -1 -n 4 --save-every 2"
        code, out = train_gpt(flags + " -o " + self.q("o"))
        self.assertEqual(code, 0, out)
        before = {f: read(os.path.join(d, f)) for f in os.listdir(d) if not f.startswith(".")}
        rejects(self, TINY + " --core-every -1 -n 3 -o " + self.q("o"), "holds another run's files")
        code, out = train_gpt(TINY + " --core-every -1 -n 3 -o " + self.q("o"), want_stdout=False)
        self.assertTrue("--resume " + d in out and "--overwrite 1" in out and "metrics.jsonl" in out, out)
        self.assertEqual({f: read(os.path.join(d, f)) for f in os.listdir(d) if not f.startswith(".")}, before, "a refused run changed DIR")
        code, out = train_gpt(TINY + " --core-every -1 -n 3 -o " + self.q("o") + " --overwrite 1")
        self.assertEqual(code, 0, out)
        self.assertEqual(sorted(f for f in os.listdir(d) if not f.startswith(".")), ["ckpt_000003.safetensors", "metrics.jsonl"])
        self.assertEqual(read(os.path.join(d, "metrics.jsonl")).decode().count('"kind": "run"'), 1)
        rejects(self, TINY + " --resume " + self.q("missing"), "--resume: '%s' is not a directory" % self.path("missing"))
        os.makedirs(self.path("empty"))
        rejects(self, TINY + " --resume " + self.q("empty"), "--resume: no checkpoint ckpt_*.safetensors in")

    def test_keep_checkpoints(self):
        """train_gpt --save-every 2 --keep-checkpoints 2 -n 6: only ckpt 4 and 6 are left, and --resume takes the latest"""
        d = self.path("k")
        code, out = train_gpt(TINY + " --core-every -1 -n 6 --save-every 2 --keep-checkpoints 2 -o " + self.q("k"))
        self.assertEqual(code, 0, out)
        self.assertEqual(sorted(f for f in os.listdir(d) if f.startswith("ckpt_")), ["ckpt_000004.safetensors", "ckpt_000006.safetensors"])
        code, out = train_gpt(TINY + " --core-every -1 -n 6 --save-every 2 --keep-checkpoints 2 --resume " + self.q("k"))
        self.assertTrue(code == 0 and "resumed from" in out and "ckpt_000006.safetensors" in out, out)


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
        rejects(self, flags.replace("-x learn", "-x 1") + " --resume " + self.q("a"), "these flags given here differ: -x 1 (the run's: learn)")


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
             ("a gold index past the options", 1024 + 4, 7, "gold index"),
             # prompt 0 has 19 tokens and span [15, 19): an empty span before the prompt's end is none core.py writes
             ("an empty answer span inside the prompt", 1024 + 16, 15, "answer span")]

    def test_bad_task_files(self):
        good = read(os.path.join(REPO, "dev/data/core_tasks/01_completion_zeroshot.bin"))
        for what, offset, value, expect in self.CASES:
            d = self.path(what.replace(" ", "_"))
            os.mkdir(d)
            with open(os.path.join(d, "01_bad.bin"), "wb") as f:
                f.write(good[:offset] + struct.pack("<I", value) + good[offset + 4:])
            check_one_error(self, [binary("eval_core"), "-e", "dev/reference/data/core_model.safetensors", "-c", d], expect,
                            "eval_core on a task file with " + what)


@needs_packages("tiktoken")
class TestCoreEmptySpans(TempDirTest):
    """A bundle built like the real one (PIQA, ARC-Easy: 10-shot, the "\\nAnswer: " delimiter) whose items have options
    nanochat scores as NaN, through dev/data/core.py and eval_core. nanochat's core_eval.py scores option i as
    losses[i, start-1:end-1].mean() (NaN for an empty slice) and predicts mean_losses.index(min(mean_losses)); every
    item below is one that rule gets right or wrong whatever the model's losses (a NaN first option is predicted, a
    later NaN option never), so the expected accuracies come from the rule applied to the spans of the task files
    with random losses."""

    # the PIQA shape: the shorter solution is a token prefix of the longer; (shorter one first, gold, how many)
    PIQA = [(True, 0, 5), (True, 1, 2), (False, 0, 3), (False, 1, 2)]
    # the ARC shape: one choice is a token prefix of the three others; (its index, gold, how many)
    ARC = [(0, 0, 5), (0, 3, 3), (2, 2, 4)]
    WORDS = ["heat", "light", "sound", "water", "air", "soil"]

    def items(self):
        piqa, arc = [], []
        for short_first, gold, count in self.PIQA:
            for _ in range(count):
                k = len(piqa)
                sols = ["P = a + b1 + b2 + c", "P = a + b1 + b2 + c x b1"]
                piqa.append({"query": "Question: Trapezoid %d has sides a, b1, b2 and c. Find its perimeter P." % k,
                             "choices": sols if short_first else sols[::-1], "gold": gold})
        for at, gold, count in self.ARC:
            for _ in range(count):
                k = len(arc)
                base = self.WORDS[k % len(self.WORDS)]
                choices = [base + " and " + w for w in self.WORDS if w != base][:3]
                choices.insert(at, base)
                arc.append({"query": "Question: What does experiment %d need?" % k, "choices": choices, "gold": gold})
        copa = [{"query": "The man lied, so", "choices": ["he was caught.", "he was caught."], "gold": g} for g in (0, 0, 1)]
        winograd = [{"context_options": ["The man lied because he", "The man lied because he"], "continuation": "was afraid.", "gold": g}
                    for g in (0, 1, 1)]
        return [("piqa", "commonsense_reasoning/piqa.jsonl", "multiple_choice", 10, "\\nAnswer: ", 50, piqa),
                ("arc_easy", "world_knowledge/arc_easy.jsonl", "multiple_choice", 10, "\\nAnswer: ", 25, arc),
                ("copa", "commonsense_reasoning/copa.jsonl", "multiple_choice", 0, None, 50, copa),
                ("winograd", "language_understanding/winograd_wsc.jsonl", "schema", 0, None, 50, winograd)]

    def write_bundle(self, tasks):
        yaml, meta = ["icl_tasks:"], ["Eval Task,Random baseline"]
        for label, uri, ttype, shots, delim, rb, items in tasks:
            yaml += ["-", "  label: " + label, "  dataset_uri: " + uri, "  num_fewshot: [%d]" % shots, "  icl_task_type: " + ttype]
            if delim is not None:
                yaml.append('  continuation_delimiter: "%s"' % delim)
            meta.append("%s,%g" % (label, rb))
            self.write("bundle/eval_data/" + uri, "".join(json.dumps(item) + "\n" for item in items))
        self.write("bundle/core.yaml", "\n".join(yaml) + "\n")
        self.write("bundle/eval_meta_data.csv", "\n".join(meta) + "\n")

    @staticmethod
    def nanochat_correct(path, rng):
        """Per item of a task file, whether nanochat's rule gets it right: the same for 20 draws of random losses."""
        out = []
        for gold, prompts in test_core.read_items(path):
            spans = [(len(tokens), s, e) for tokens, s, e in prompts]
            T = max(nt for nt, _, _ in spans)
            verdicts = set()
            for _ in range(20):
                means = []
                for _, s, e in spans:
                    losses = [rng.uniform(0.1, 10.0) for _ in range(T)]
                    losses[-1] = float("nan")  # forward_model: no target after the last position
                    span = losses[s - 1:e - 1]  # Python's slice, as nanochat's on the tensor: empty -> mean NaN
                    means.append(sum(span) / len(span) if span else float("nan"))
                verdicts.add(means.index(min(means)) == gold)
            assert len(verdicts) == 1, "%s: an item whose verdict depends on the losses: %s" % (path, spans)
            out.append(verdicts.pop())
        return out

    def test_bundle_with_empty_spans(self):
        """a bundle built like the real one, with empty answer spans (PIQA, ARC-Easy, identical choices and schema options): core.py counts them, eval_core scores as nanochat"""
        tasks = self.items()
        self.write_bundle(tasks)
        code, out = run([sys.executable, "dev/data/core.py", "--bundle", self.path("bundle"), "--tokenizer", "dev/data/devil/tokenizer.bin",
                         "--out", self.path("tasks")])
        counts = [line for line in out.splitlines() if "empty answer span" in line]
        self.assertEqual(counts, ["%s: %d items have an option with an empty answer span (scored as nanochat: NaN loss)" % (t[0], len(t[6]))
                                  for t in tasks], out)
        rng = random.Random(0)
        want = {}
        for k, (label, _, _, _, _, rb, _) in enumerate(tasks):
            correct = self.nanochat_correct(self.path("tasks", "%02d_%s.bin" % (k + 1, label)), rng)
            acc = sum(correct) / len(correct)
            want[label] = (len(correct), acc, (acc - 0.01 * rb) / (1 - 0.01 * rb))
        # by hand: PIQA and copa predict option 0 always (a NaN first option, or the only other one); ARC-Easy gets the
        # 5 items with the prefix choice first and gold 0; winograd predicts 0 with gold 0 once
        self.assertEqual({label: w[1] for label, w in want.items()}, {"piqa": 8 / 12, "arc_easy": 5 / 12, "copa": 2 / 3, "winograd": 1 / 3})
        code, out = run([binary("eval_core"), "-e", "dev/reference/data/core_model.safetensors", "-c", self.path("tasks"), "-o", self.path("core.csv")])
        self.assertEqual(code, 0, out)
        rows = {r["label"]: r for r in csv.DictReader(read(self.path("core.csv")).decode().splitlines())}
        got = {label: (int(r["items"]), float(r["accuracy"]), float(r["centered"])) for label, r in rows.items() if label != "CORE"}
        self.assertEqual(set(got), set(want), out)
        for label in want:
            self.assertTrue(got[label][0] == want[label][0] and all(abs(a - b) < 1e-6 for a, b in zip(got[label][1:], want[label][1:])),
                            "%s: eval_core items, accuracy, centered %s, nanochat's rule %s" % (label, got[label], want[label]))
        core = sum(w[2] for w in want.values()) / len(want)
        self.assertAlmostEqual(float(rows["CORE"]["centered"]), core, places=6)


if __name__ == "__main__":
    unittest.main()
