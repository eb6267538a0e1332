"""Faults a long run meets on a shared cluster: pre-emption (SIGTERM), Ctrl-C (SIGINT), kill -9 at any
moment (also while a checkpoint is written), and a second run started into the same directory. What must
hold: the run stops after a whole optimizer step with a checkpoint, and `--resume` then reaches
bit-identically the weights and the metrics lines of an uninterrupted run; nothing written before the
last checkpoint is lost. Standard library only; run with `make test` or `python3 dev/test/test_faults.py`.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402

TINY = ("-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 5 --eval-tokens 256 "
        "--sample-every -1 --core-every -1").split()
TIMING = ("dt_ms", "optimizer_ms", "tok_per_s", "mfu")  # what differs between two runs of the same steps


def metrics_lines(path):
    """metrics.jsonl as parsed lines (strict JSON: no NaN), timing fields removed."""
    lines = []
    with open(path) as f:
        for text in f:
            line = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError("not JSON: " + c)))
            for key in TIMING:
                line.pop(key, None)
            lines.append(line)
    return lines


class Faults(xsatest.TempDirTest):
    PREFIX = "xsa_faults_"

    def setUp(self):
        super().setUp()
        self.rng = random.Random()  # random times, printed in each check so that a failure can be replayed

    def start(self, out, steps, extra=()):
        argv = [xsatest.binary("train_gpt_cpu")] + TINY + ["-n", str(steps), "--export-safetensors",
                                                           os.path.join(out, "final.safetensors")] + list(extra)
        return subprocess.Popen(argv, cwd=xsatest.REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def reference(self, steps):
        """An uninterrupted run: (its directory, its duration in seconds)."""
        out = os.path.join(self.dir, "reference")
        t0 = time.time()
        p = self.start(out, steps, ["-o", out])
        text = p.communicate()[0].decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, text)
        return out, time.time() - t0

    def assert_same_run(self, reference, out, what):
        same_weights = xsatest.read(os.path.join(out, "final.safetensors")) == xsatest.read(os.path.join(reference, "final.safetensors"))
        ref_lines, lines = metrics_lines(os.path.join(reference, "metrics.jsonl")), metrics_lines(os.path.join(out, "metrics.jsonl"))
        self.assertTrue(same_weights, "%s: final weights differ from the uninterrupted run's" % what)
        self.assertEqual(lines, ref_lines, "%s: metrics lines differ from the uninterrupted run's" % what)

    def test_signal_then_resume_is_bit_identical(self):
        steps = 40
        reference, seconds = self.reference(steps)
        for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
            with self.subTest(signal=sig.name):
                out = os.path.join(self.dir, sig.name)
                delay = self.rng.uniform(0.2, 0.6) * seconds
                p = self.start(out, steps, ["-o", out])
                time.sleep(delay)
                p.send_signal(sig)
                text = p.communicate()[0].decode("utf-8", "replace")
                last = text.rstrip("\n").split("\n")[-1]
                self.assertEqual(p.returncode, code, "%s after %.2f s: exit %d (want %d)\n%s" % (sig.name, delay, p.returncode, code, text[-2000:]))
                self.assertTrue(last.startswith("stopped by %s after step " % sig.name) and "resume with: " in last,
                                "%s after %.2f s: last line %r" % (sig.name, delay, last))
                resume = last.split("resume with: ", 1)[1].split()  # the command the run printed, as a user would run it
                resume[0] = xsatest.binary("train_gpt_cpu")
                code2, text2 = xsatest.run(resume)
                self.assertEqual(code2, 0, text2[-2000:])
                self.assert_same_run(reference, out, "%s after %.2f s, then the printed resume command" % (sig.name, delay))

    def test_second_signal_exits_at_once(self):
        # the first SIGTERM arrives during a long optimizer step (128 micro-batches, about 16 s on 2 cores, so
        # that even a machine several times faster is still inside it 1.5 s later): the run goes on to finish
        # the step; a second one 1.5 s later must end it at once, killed by the signal (the step is never
        # finished, so its length costs nothing)
        out = os.path.join(self.dir, "twice")
        p = subprocess.Popen([xsatest.binary("train_gpt_cpu"), "-d", "2", "--dim", "128", "--heads", "2", "-t", "128", "-b", "4",
                              "-B", "65536", "-n", "2", "--eval-tokens", "512", "--sample-every", "-1", "--core-every", "-1", "-o", out],
                             cwd=xsatest.REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        time.sleep(1.5)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        p.communicate()
        self.assertEqual(p.returncode, -signal.SIGTERM, "a second SIGTERM: exit %d (want killed by SIGTERM)" % p.returncode)
        self.assertLess(time.time() - t0, 1.0, "a second SIGTERM took %.1f s to end the run" % (time.time() - t0))

    def test_kill_9_then_resume_is_bit_identical(self):
        # kill -9 at random times, with a checkpoint every step so that some kills land inside a checkpoint
        # write; each time the run goes on from the last good checkpoint (or from scratch if there is none)
        steps = 30
        reference, seconds = self.reference(steps)
        out = os.path.join(self.dir, "killed")
        delays = []
        for _ in range(5):
            has_checkpoint = os.path.isdir(out) and any(n.endswith(".safetensors") and n.startswith("ckpt_") for n in os.listdir(out))
            p = self.start(out, steps, ["--save-every", "1"] + (["--resume", out] if has_checkpoint else ["-o", out]))
            delays.append(round(self.rng.uniform(0.1, 0.5) * seconds, 2))
            time.sleep(delays[-1])
            p.kill()
            p.communicate()
        p = self.start(out, steps, ["--save-every", "1", "--resume", out])
        text = p.communicate()[0].decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, "after kill -9 at %s s: the resumed run failed\n%s" % (delays, text[-2000:]))
        self.assert_same_run(reference, out, "kill -9 at %s s, then --resume" % delays)

    def test_one_run_per_directory(self):
        out = os.path.join(self.dir, "busy")
        first = self.start(out, 400, ["-o", out])
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(out, "metrics.jsonl")) and time.time() < deadline:
            time.sleep(0.05)
        try:
            xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu")] + TINY + ["-n", "5", "-o", out], "another run is using")
        finally:
            first.kill()
            first.communicate()


if __name__ == "__main__":
    unittest.main()
