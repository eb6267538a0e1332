"""What a user sees of a run: output that reaches a pipe as it is printed, the estimate of the run's time
before training (and the warning past a day), the memory plan checked against the machine (a plan that
does not fit is refused with a -b that fits), progress lines while evaluations run, the step line's
fields, the ETA of a resumed run (from its own steps), and the messages that help with a mistyped command. Standard library only; run with `make test`.
"""
import os
import re
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import read_until  # noqa: E402

TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --eval-tokens 256 --sample-every -1 --core-every -1".split()
# a micro-batch of 100000 rows of 4096 tokens: about 8 TB of activations, more than any machine has
HUGE = "-d 1 --dim 32 --heads 2 -t 4096 -b 100000 -B 409600000".split()


def train(*args):
    return xsatest.run([xsatest.binary("train_gpt_cpu")] + list(args))


def start_train(*args):
    return subprocess.Popen([xsatest.binary("train_gpt_cpu")] + list(args), cwd=xsatest.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


class LiveRun(unittest.TestCase):
    """A run that would take days, read through a pipe while it runs, then stopped with SIGTERM."""

    def test_pipe_estimate_steps_and_stop(self):
        p = start_train(*TINY, "-n", "100000000", "--eval-every", "100000")
        self.addCleanup(p.kill)
        lines, seen = read_until(p, {"first line": lambda l: True, "estimate": lambda l: l.startswith("estimate (one micro-step timed: "),
                                     "warning past a day": lambda l: l.startswith("warning: this run would take about ") and "days" in l,
                                     "step 3": lambda l: l.startswith("step 3/100000000 ")})
        p.send_signal(signal.SIGTERM)
        rest = p.communicate(timeout=60)[0].decode("utf-8", "replace")
        transcript = "\n".join(lines[-20:]) + "\n" + rest
        with self.subTest("a run piped to another process: its first line arrives within 10 s, while it runs"):
            self.assertLess(seen.get("first line", 1e9), 10.0, transcript)
        with self.subTest("the estimate before the first step: per micro-step, the update, per step, for the run, and the evaluations"):
            estimate = [l for l in lines if l.startswith("estimate (")]
            m = estimate and re.match(r"estimate \(one micro-step timed: ([\d.]+) ms x 2 per step \+ the update ([\d.]+) ms\): ([\d.]+) (ms|s) "
                                      r"per step, [\d.]+ days for the 100000000 steps of the run, \+ [\d.]+ \w+ for 1001 val bpb "
                                      r"evaluations$", estimate[0])
            self.assertTrue(m, transcript)
            micro, update, per_step = float(m.group(1)), float(m.group(2)), float(m.group(3)) * (1000 if m.group(4) == "s" else 1)
            self.assertGreater(update, 0.0, transcript)  # the optimizer's update is part of a step (CPU backend)
            self.assertAlmostEqual(per_step, 2 * micro + update, delta=0.05 * (2 * micro + update) + 1, msg=transcript)
            first_step = next((i for i, l in enumerate(lines) if l.startswith("step 1/")), len(lines))
            self.assertLess(lines.index(estimate[0]), first_step, transcript)
        with self.subTest("a run of more than a day on this backend: a warning naming the backend"):
            self.assertIn("warning past a day", seen, transcript)
            self.assertTrue(any("(CPU, " in l for l in lines if l.startswith("warning: this run would take")), transcript)
        with self.subTest("step lines as they happen, with loss, grad norm, lr multiplier, time, tok/s, elapsed and ETA"):
            self.assertIn("step 3", seen, transcript)
            step = [l for l in lines if l.startswith("step 3/")][0]
            self.assertTrue(re.match(r"step 3/100000000 \(0\.0%\) \| loss [\d.]+ \(smoothed\) \| grad norm [\d.]+ \| lrm [\d.]+ \| [\d.]+ ms \| "
                                     r"\d+ tok/s \| MFU n/a \| [\d.]+ TFLOP/s \| [\d.]+ min, ETA [\d.]+ min$", step), step)
        with self.subTest("SIGTERM without -o (nothing to save): exit 143 at once, with a line saying so"):
            self.assertEqual(p.returncode, 143, transcript)
            self.assertIn("stopped at once: nothing to save (no -o", rest)


class ResumedRun(xsatest.TempDirTest):
    PREFIX = "xsa_user_output_"
    STEP_LINE = re.compile(r"^step (\d+)/(\d+) .*\| ([\d.]+) ms \| .* min, ETA ([\d.]+) min$")

    def test_eta_after_resume(self):
        """a run resumed at step 100: the ETA of its step lines is the steps left times the mean of this process's timed
        steps (the first of a process is not timed), not of the training time before the resume too (7 times too long)"""
        out = self.path("run")
        first = start_train(*TINY, "--dim", "64", "-n", "50000", "--eval-every", "100000", "-o", out)
        self.addCleanup(first.kill)
        lines, seen = read_until(first, {"step 100": lambda l: l.startswith("step 100/")})
        first.send_signal(signal.SIGTERM)
        lines += first.communicate(timeout=60)[0].decode("utf-8", "replace").split("\n")
        self.assertIn("step 100", seen, "\n".join(lines[-20:]))
        resumed = start_train("--resume", out)
        self.addCleanup(resumed.kill)
        step_lines = []
        lines, seen = read_until(resumed, {"15 steps": lambda l: bool(self.STEP_LINE.match(l) and step_lines.append(l) is None and len(step_lines) >= 15)})
        resumed.send_signal(signal.SIGTERM)
        resumed.communicate(timeout=60)
        steps = [tuple(float(x) for x in m.groups()) for m in map(self.STEP_LINE.match, lines) if m]
        self.assertGreaterEqual(len(steps), 15, "\n".join(lines[-20:]))
        self.assertGreater(steps[0][0], 100, "\n".join(lines[-20:]))  # it went on after the checkpoint, not from the start
        for i, (step, total, _, eta) in enumerate(steps[1:], 1):
            timed = [ms for _, _, ms, _ in steps[1:i + 1]]
            want = (total - step) * sum(timed) / len(timed) / 60000.0
            self.assertLess(abs(eta - want), 0.15 * want + 0.06, "step %d: ETA %.1f min, want %.2f min\n%s" % (step, eta, want, "\n".join(lines[-20:])))


class Memory(unittest.TestCase):
    def test_plan_too_large_is_refused_with_a_batch_that_fits(self):
        code, err = xsatest.run([xsatest.binary("train_gpt_cpu")] + HUGE + ["-n", "1"], want_stdout=False)
        m = re.match(r"error: 100000 rows per micro-batch need ([\d.]+) GiB of memory, more than 85% of the ([\d.]+) GiB the machine "
                     r"has available; -b (\d+) fits \(([\d.]+) GiB\)\n$", err)
        with self.subTest("-b 100000 of 4096 tokens: exit 1, one error line with the memory needed and had, and a -b that fits"):
            self.assertTrue(code == 1 and m, "exit %d: %s" % (code, err))
        if not m:
            return
        suggested = m.group(3)
        with self.subTest("the suggested -b %s divides the total batch and fits: its plan prints without a warning" % suggested):
            code, out = train(*(HUGE[:-4] + ["-b", suggested, "-B", "409600000", "-n", "0"]))
            self.assertTrue(code == 0 and "warning" not in out and "memory plan:" in out, "exit %d:\n%s" % (code, out[-1500:]))
        with self.subTest("-n 0 shows the plan that does not fit, with a warning instead of the error"):
            code, out = train(*(HUGE + ["-n", "0"]))
            self.assertTrue(code == 0 and "warning: 100000 rows per micro-batch need" in out and "-b %s fits" % suggested in out,
                            "exit %d:\n%s" % (code, out[-1500:]))


class Progress(unittest.TestCase):
    def test_progress_lines_during_evaluations(self):
        code, out = train(*(TINY[:-2] + ["-n", "1", "--eval-tokens", "100000", "--core-every", "1", "--core-max-per-task", "-1",
                                         "--progress-every", "0.001"]))
        self.assertEqual(code, 0, out[-2000:])
        bpb = re.findall(r"^val bpb: (\d+)/(\d+) batches \((\d+)%\) in [\d.]+ s, ETA [\d.]+ s$", out, re.M)
        core = re.findall(r"^CORE: (\d+)/(\d+) items \((\d+)%\) in [\d.]+ s, ETA [\d.]+ s$", out, re.M)
        with self.subTest("val bpb: a start line with the batches, then done/total, %, elapsed and ETA lines"):
            self.assertIn("val bpb: 300 batches", out)
            self.assertTrue(len(bpb) >= 10 and all(b[1] == "300" and 0 < int(b[0]) < 300 for b in bpb), out[-2000:])
        with self.subTest("CORE: a start line with the items, then done/total, %, elapsed and ETA lines"):
            self.assertTrue(re.search(r"^CORE: \d+ items$", out, re.M), out[-2000:])
            self.assertTrue(len(core) >= 5, out[-2000:])
        with self.subTest("the default, every 30 s: a short evaluation prints no progress line"):
            code, out = train(*(TINY + ["-n", "1"]))
            self.assertTrue(code == 0 and not re.search(r"^val bpb: \d+/", out, re.M), out[-2000:])


class HelpfulErrors(unittest.TestCase):
    def test_unknown_option_suggests_the_nearest(self):
        for flag, near in (("--eval-evry", "--eval-every"), ("--resum", "--resume"), ("-X", "-x"), ("--xsa-layer", "--xsa-layers")):
            xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu"), flag, "1"], "unknown option '%s'; did you mean %s?" % (flag, near))
        xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu"), "--bogus", "1"], "unknown option '--bogus' (see --help)")

    def test_xsa_layers_without_alpha_warns(self):
        code, out = train(*(TINY + ["--xsa-layers", "0", "-n", "0"]))
        self.assertTrue(code == 0 and "warning: --xsa-layers 0 without -x: alpha is 0, so no layer uses XSA" in out, out)
        code, out = train(*(TINY + ["--xsa-layers", "0", "-x", "1", "-n", "0"]))
        self.assertTrue(code == 0 and "warning: --xsa-layers" not in out, out)

    def test_data_glob_matching_nothing_with_n0(self):
        xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu")] + TINY + ["-i", "no_such_*.bin", "-n", "0"],
                                "no training shard files match 'no_such_*.bin'")
        xsatest.check_one_error(self, [xsatest.binary("train_gpt_cpu")] + TINY + ["-j", "no_such_*.bin", "-n", "0"],
                                "no validation shard files match 'no_such_*.bin'")


if __name__ == "__main__":
    unittest.main()
