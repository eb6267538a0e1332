#!/usr/bin/env python3
"""End-to-end tests of SFT (chat_sft, dev/docs/optim.md#sft) on the committed mini mixture
dev/data/sft_mini_tokens (the conversations dev/data/sft.py renders from dev/data/sft_mini with the embedded
tokenizer): a tiny base model trained for a few steps, then fine-tuned for one epoch of conversations. The
masked validation loss falls; ChatCORE runs at the end on the embedded bundle; resumes of the wrong kind are
refused; a stopped run's resume command runs as printed, and a resume on other conversations is refused; exported
weights start a fresh optimizer; bad options and bad conversation files end in one error line. The loss itself (ignored targets, the mean over
the rest) is checked against the PyTorch reference by test_xsa.cu (dev/reference/data/sft_masked), the
packing against a hand-worked example by dev/test/test_infra.cu, and the resume (bit for bit) by
dev/test/test_resume.py.

    python3 dev/test/test_sft_train.py        (or all suites: make test)

Standard library only.
"""
import json
import os
import shlex
import signal
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import binary, check_one_error, read, run  # noqa: E402
import test_e2e  # noqa: E402  (train_gpt, rejects)
from test_e2e import train_gpt  # noqa: E402

MINI = "dev/data/sft_mini_tokens"
# a base model of the embedded tokenizer's vocabulary, rows of 128 tokens: the mini conversations fit
BASE = "-d 1 --dim 32 --heads 2 -t 128 -b 2 -B 512 --warmup-steps 2 --eval-every 5 --eval-tokens 512 --sample-every -1 -x 1"
SFT_EVAL = "--eval-every 5 --eval-tokens 2048"


def chat_sft(args):
    """./chat_sft with `args` split as the shell would: (exit code, output)."""
    return run([binary("chat_sft")] + shlex.split(args))


def rejects(test, args, expect):
    """chat_sft ARGS must exit 1 with one line "error: ...EXPECT..." on stderr."""
    check_one_error(test, [binary("chat_sft")] + shlex.split(args), expect, "chat_sft " + args)


def metric_lines(path, kind):
    out = []
    for line in read(path).decode().split("\n"):
        if line.strip() and json.loads(line)["kind"] == kind:
            out.append(json.loads(line))
    return out


def parse_conversations(data):
    """(header ints, offsets, tokens, mask) of a conversation file's bytes (dev/data/README.md, "SFT conversation file")."""
    header = list(struct.unpack_from("<256i", data, 0))
    count, ntokens = struct.unpack_from("<2Q", data, 8)
    offsets = list(struct.unpack_from("<%dQ" % (count + 1), data, 1024))
    at = 1024 + 8 * (count + 1)
    return header, offsets, list(struct.unpack_from("<%dI" % ntokens, data, at)), list(data[at + 4 * ntokens:at + 5 * ntokens])


def build_conversations(header, offsets, tokens, mask):
    """A conversation file's bytes, its header's counts len(offsets) - 1 conversations and len(tokens) tokens."""
    header = list(header)
    header[2:6] = struct.unpack("<4i", struct.pack("<2Q", len(offsets) - 1, len(tokens)))
    return (struct.pack("<256i", *header) + struct.pack("<%dQ" % len(offsets), *offsets) + struct.pack("<%dI" % len(tokens), *tokens) +
            bytes(mask))


def conversation_dir(path, train=None, val=None, meta=None):
    """A copy of the mini mixture in `path` with sft_train.bin, sft_val.bin or sft_meta.json replaced where given
    (bytes; meta=False: none)."""
    os.makedirs(path)
    for name, data in (("sft_train.bin", train), ("sft_val.bin", val), ("sft_meta.json", meta)):
        if data is None:
            data = read(os.path.join(xsatest.REPO, MINI, name))
        if data is not False:
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)


class TestSft(xsatest.TempDirTest):
    PREFIX = "xsa_sft_"

    def setUp(self):
        super().setUp()
        code, out = train_gpt(BASE + " -n 4 -o %s --export-safetensors %s" % (self.q("base"), self.q("base", "weights.safetensors")))
        self.assertEqual(code, 0, "the base run failed:\n" + out)
        self.base = self.path("base", "ckpt_000004.safetensors")

    def test_run_lowers_loss_and_resumes(self):
        """chat_sft --sft MINI --init-from BASE_CHECKPOINT: one epoch, the masked val bpb falls, the optimizer
        warm-started, XSA as the base run's; resumes of the wrong kind refused"""
        a = self.path("a")
        code, out = chat_sft("--sft %s %s --init-from %s -o %s" % (MINI, SFT_EVAL, self.base, self.q("a")))
        evals = metric_lines(os.path.join(a, "metrics.jsonl"), "eval")
        steps = len(metric_lines(os.path.join(a, "metrics.jsonl"), "train"))
        chatcore = metric_lines(os.path.join(a, "metrics.jsonl"), "chatcore")
        with self.subTest("ChatCORE on the embedded bundle at the end (the default for the embedded tokenizer): a metrics line with "
                          "ChatCORE and the five accuracies, and chatcore_STEP.csv"):
            ok = (len(chatcore) == 1 and chatcore[0]["step"] == steps and "chatcore" in chatcore[0] and len(chatcore[0]["accuracy"]) == 5 and
                  os.path.exists(os.path.join(a, "chatcore_%06d.csv" % steps)))
            self.assertTrue(ok, "chatcore lines %s; output:\n%s" % (chatcore, out[-3000:]))
        with self.subTest("exit 0, optimizer state loaded, XSA alpha 1 from the base run, one epoch of steps, val bpb at the end "
                          "below step 0's by > 10%"):
            ok = (code == 0 and "weights and optimizer state" in out and "XSA: alpha 1 on layers 0" in out and "(one epoch)" in out and
                  steps >= 10 and len(evals) >= 3 and evals[-1]["val_bpb"] < 0.9 * evals[0]["val_bpb"])
            self.assertTrue(ok, "exit %d, %d steps, val bpb %s; output:\n%s" % (code, steps, [e["val_bpb"] for e in evals], out[-3000:]))
        test_e2e.rejects(self, "--resume %s" % self.q("a"), "resume with the same model and optimizer flags")  # an SFT run resumed by train_gpt
        rejects(self, "--sft %s --resume %s" % (MINI, self.q("base")), "is a checkpoint of base training")

    def test_ranks(self):
        """chat_sft --ranks 2: each rank packs its own stride of the conversations; the step count (the first rank to finish
        an epoch), the lr (the largest progress) and the update agree over the ranks (train_gpt checks the weights)"""
        code, out = chat_sft("--sft %s --init-from %s --ranks 2 %s --chatcore-every -1" % (MINI, self.base, SFT_EVAL))
        self.assertTrue(code == 0 and "(one epoch)" in out and "val bpb" in out, "exit %d; output:\n%s" % (code, out[-3000:]))

    def test_exported_weights(self):
        """--init-from exported weights: the total batch must be given (-B), and the optimizer starts fresh, with a warning"""
        weights = self.path("base", "weights.safetensors")
        rejects(self, "--sft %s --init-from %s -n 2" % (MINI, weights), "give SFT's with -B")
        code, out = chat_sft("--sft %s --init-from %s -n 2 -B 512 %s" % (MINI, weights, SFT_EVAL))
        self.assertTrue(code == 0 and "holds no optimizer state" in out and "2 steps (-n)" in out, "exit %d; output:\n%s" % (code, out[-3000:]))

    def test_bad_options_and_files(self):
        """bad options and conversation files: exit 1, one error line"""
        sft = "--sft %s --init-from %s" % (MINI, self.base)
        rejects(self, "--sft " + MINI, "chat_sft needs --init-from")
        rejects(self, "--init-from " + self.base, "chat_sft needs --sft DIR")
        rejects(self, sft + " -d 2", "unknown option '-d'")  # the model and its training settings come from the base run
        rejects(self, sft + " -x 0.5", "unknown option '-x'")
        test_e2e.rejects(self, "--init-lr-frac 0.5", "unknown option '--init-lr-frac'")  # SFT's options are chat_sft's alone
        rejects(self, sft + " --init-lr-frac 0", "--init-lr-frac must be > 0")
        rejects(self, sft + " --matrix-lr -1", "--matrix-lr must be >= 0")  # -1 is the unset value inside: never taken from a user
        rejects(self, "--sft %s --init-from %s" % (self.q("missing"), self.base), "cannot open conversation file")
        good = read(os.path.join(xsatest.REPO, MINI, "sft_train.bin"))
        val = read(os.path.join(xsatest.REPO, MINI, "sft_val.bin"))
        cases = {
            "magic": (struct.pack("<i", 20240520) + good[4:], "is not a conversation file"),
            "truncated": (good[:-7], "is truncated or corrupt"),
            "vocab": (good[:24] + struct.pack("<i", 50000) + good[28:], "was written with a tokenizer of 50000 tokens"),
            "bos": (good[:1024 + 8 * 161] + struct.pack("<I", 7) + good[1024 + 8 * 161 + 4:], "starts with token 7, not BOS"),
        }
        for name, (data, expect) in cases.items():
            os.makedirs(self.path(name))
            with open(self.path(name, "sft_train.bin"), "wb") as f:
                f.write(data)
            with open(self.path(name, "sft_val.bin"), "wb") as f:
                f.write(val)
            rejects(self, "--sft %s --init-from %s" % (self.q(name), self.base), expect)

    def test_bad_conversation_dirs(self):
        """conversation directories chat_sft must refuse, each with one error line naming the file at fault: made with
        another tokenizer (sft_meta.json's SHA-256), a training file with no trained token, a validation file with no
        target, tokens after the last conversation, fewer conversations than ranks, a malformed sft_meta.json"""
        train = read(os.path.join(xsatest.REPO, MINI, "sft_train.bin"))
        val = read(os.path.join(xsatest.REPO, MINI, "sft_val.bin"))
        meta = json.loads(read(os.path.join(xsatest.REPO, MINI, "sft_meta.json")))
        h, o, t, m = parse_conversations(train)
        hv, ov, tv, mv = parse_conversations(val)
        other = dict(meta, tokenizer="other/tokenizer.bin", tokenizer_sha256="0" * 64)
        cases = {
            "other_tokenizer": (dict(meta=json.dumps(other).encode()),
                                "sft_meta.json' says its conversations were made with the tokenizer 'other/tokenizer.bin'"),
            "bad_meta": (dict(meta=b'{"tokenizer": "x", "tokenizer_sha256": 12}'), "sft_meta.json' has no tokenizer_sha256"),
            "untrained": (dict(train=build_conversations(h, o, t, [0] * len(m))), "sft_train.bin' has no trained tokens"),
            "no_targets": (dict(val=build_conversations(hv, ov, tv, [0] * len(mv))), "sft_val.bin' has no target tokens"),
            "trailing": (dict(train=build_conversations(h, o, t + t[:5], m + m[:5])),
                         "sft_train.bin' is corrupt: its last conversation ends at token 15212, but it holds 15217 tokens"),
        }
        for name, (files, expect) in cases.items():
            conversation_dir(self.path(name), **files)
            rejects(self, "--sft %s --init-from %s --chatcore-every -1" % (self.q(name), self.base), expect)
        # a file of one conversation on 2 ranks: rank 1 has none to train on (not a corrupt file)
        conversation_dir(self.path("one"), train=build_conversations(h, o[:2], t[:o[1]], m[:o[1]]))
        rejects(self, "--sft %s --init-from %s --chatcore-every -1 --ranks 2" % (self.q("one"), self.base),
                "sft_train.bin' holds 1 conversation, fewer than the 2 ranks")
        # without sft_meta.json (hand-made files): accepted, with a note that the tokenizer is checked by its size only
        conversation_dir(self.path("no_meta"), meta=False)
        code, out = chat_sft("--sft %s --init-from %s -n 0 --chatcore-every -1" % (self.q("no_meta"), self.base))
        self.assertTrue(code == 0, "exit %d; output:\n%s" % (code, out[-3000:]))

    def test_stop_and_resume(self):
        """a stopped SFT run prints a resume command that runs as printed; a resume on another conversation directory
        (other tokens with the same counts, another validation file) is refused naming both directories, one with a copy
        of the run's conversations accepted"""
        run_dir = self.path("run")
        p = subprocess.Popen([binary("chat_sft"), "--sft", MINI, "--init-from", self.base, "--chatcore-every", "-1", "--eval-every", "1000",
                              "-o", run_dir], cwd=xsatest.REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out = b""
            for line in p.stdout:
                out += line
                if line.startswith(b"step 1/"):
                    p.send_signal(signal.SIGTERM)
                    break
            out += p.communicate(timeout=60)[0]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        out = out.decode("utf-8", "replace")
        last = out.rstrip("\n").split("\n")[-1]
        self.assertTrue(p.returncode == 143 and "resume with: " in last, "exit %s, last line %r\n%s" % (p.returncode, last, out[-3000:]))
        command = shlex.split(last.split("resume with: ", 1)[1])
        with self.subTest("the printed command, run as printed, resumes the run to its end"):
            code, resumed = run([binary("chat_sft")] + command[1:])
            self.assertTrue(code == 0 and "resumed from" in resumed and "(one epoch)" in resumed,
                            "the printed command %s: exit %d\n%s" % (command, code, resumed[-3000:]))
        train = read(os.path.join(xsatest.REPO, MINI, "sft_train.bin"))
        h, o, t, m = parse_conversations(train)
        t[5], t[6] = t[6], t[5]  # the same header and size, other tokens
        hv, ov, tv, mv = parse_conversations(read(os.path.join(xsatest.REPO, MINI, "sft_val.bin")))
        conversation_dir(self.path("swapped"), train=build_conversations(h, o, t, m))
        conversation_dir(self.path("other_val"), val=build_conversations(hv, ov[:10], tv[:ov[9]], mv[:ov[9]]))
        for name in ("swapped", "other_val"):
            rejects(self, "--sft %s --chatcore-every -1 --eval-every 1000 --resume %s" % (self.q(name), shlex.quote(run_dir)),
                    "was trained on the conversations of '%s', not those of '%s'" % (MINI, self.path(name)))
        conversation_dir(self.path("copy"))
        code, again = chat_sft("--sft %s --chatcore-every -1 --eval-every 1000 --resume %s" % (self.q("copy"), shlex.quote(run_dir)))
        self.assertTrue(code == 0 and "resumed from" in again, "a copy of the run's conversations: exit %d\n%s" % (code, again[-3000:]))

if __name__ == "__main__":
    unittest.main()
