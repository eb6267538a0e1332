#!/usr/bin/env python3
"""Tests of dev/compare_runs.py: two hand-made runs whose table entries are worked out by hand below, a
run with another seed (flagged as not matched), two real runs of ./train_gpt_cpu with and without XSA
(its "run" line names what differs; build it first: make test does), and bad input (one "error:" line,
exit code 1). Each test works in its own temporary directory.

    python3 dev/test_compare_runs.py        (or all suites: make test)

Standard library only.
"""
import os
import shlex
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test"))
import xsatest  # noqa: E402
from xsatest import binary, check_one_error, run  # noqa: E402

COMPARE = [sys.executable, "dev/compare_runs.py"]
TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 3 --eval-tokens 256 --sample-every -1"


def hand_made_run(alpha, layers, seed, loss, dt_ms, bpb_mid, bpb_end, cos_yv, cos_zv, core):
    """metrics.jsonl of a 5-step run: the run line, evals at 0, (3,) 5, train lines, diagnostics, CORE."""
    s = ('{"step": 0, "kind": "run", "batch": 2, "steps": 5, "seed": %d, "device": "dev%d", '
         '"model": {"n_layer": 2, "xsa_alpha": %s, "xsa_layers": "%s"}, "optim": {"optim.muon_eq": 1}}\n' % (seed, seed, alpha, layers))
    s += '{"step": 0, "kind": "eval", "val_bpb": 2.0, "eval_tokens": 64}\n'
    mfu = [0.1, 0.40, 0.42, 0.39, 0.41]
    for i in range(5):
        s += ('{"step": %d, "kind": "train", "loss": %.4f, "lr_mult": 1.0, "dt_ms": %.1f, "tok_per_s": %.1f, "mfu": %.2f}\n' %
              (i, loss[i], dt_ms[i], 128 / (dt_ms[i] / 1000.0), mfu[i]))
        if i == 2 and bpb_mid > 0:
            s += '{"step": 3, "kind": "eval", "val_bpb": %.4f, "eval_tokens": 64}\n' % bpb_mid
    s += ('{"step": 5, "kind": "eval", "val_bpb": %.4f, "eval_tokens": 64}\n'
          '{"step": 5, "kind": "diag", "cos_yv": %s, "cos_zv": %s, "self_weight": [0.1, 0.2], "value_cos": [0.01, 0.03]}\n'
          '{"step": 5, "kind": "core", "core": %.4f, "centered": {"t1": 0.2, "t2": %.4f}}\n' % (bpb_end, cos_yv, cos_zv, core, 2 * core - 0.2))
    return s


class TempDirTest(xsatest.TempDirTest):
    PREFIX = "xsa_compare_"


class TestHandMadeRuns(TempDirTest):
    LOSS_A, LOSS_B = [4.0, 3.0, 2.0, 1.5, 1.25], [4.0, 3.0, 2.1, 1.5, 1.20]
    DT_A, DT_B = [500, 100, 102, 98, 101], [400, 101, 103, 99, 102]

    def setUp(self):
        super().setUp()
        self.write("base/metrics.jsonl", hand_made_run("0", "", 42, self.LOSS_A, self.DT_A, 0.8400, 0.8484, "[0.30, 0.50]", "[0.30, 0.50]", 0.1602))
        self.xsa = hand_made_run("1", "0,1", 42, self.LOSS_B, self.DT_B, -1, 0.8457, "[0.20, 0.40]", "[0.0, 0.0]", 0.1508)
        self.write("xsa/metrics.jsonl", self.xsa)
        self.write("other_seed/metrics.jsonl",
                   hand_made_run("1", "0,1", 43, self.LOSS_B, self.DT_B, -1, 0.8457, "[0.20, 0.40]", "[0.0, 0.0]", 0.1508))

    def test_table_by_hand(self):
        """compare_runs.py on hand-made runs: exit 0, every hand-worked entry printed"""
        code, out = run(COMPARE + [self.path("base"), self.path("xsa")])
        # by hand: bpb 0.8457 - 0.8484 = -0.0027, / 0.8484 = -0.32%; best of the baseline is its step-3 0.8400, so +0.0057 = +0.68%;
        # CORE -0.0094 / 0.1602 = -5.87%; mean loss over the last 10% of 5 steps = step 4 alone: 1.20 vs 1.25 = -4.00%;
        # smoothed (debiased EMA 0.9) curves differ most at step 2: 0.804 / 0.271 - 0.794 / 0.271 = 0.0369;
        # median ms over steps 1-4 (step 0 left out): 100.5 and 101.5, +1.00% (with step 0: 101 and 102, +0.99%);
        # MFU median of 0.40 0.42 0.39 0.41 = 40.5%; diagnostics: means 0.4 -> 0.3 and 0.4 -> 0.0;
        # step times 98 100 101 102: p10 98 + 0.3 x 2 = 98.6, p90 101 + 0.7 x 1 = 101.7, spread 3.1 / 100.5 = 3.1% (steady);
        # the xsa run's 99 101 102 103: 99.6-102.7, 3.1 / 101.5 = 3.1%.
        expected = ['model.xsa_alpha: base 0 | xsa 1', 'model.xsa_layers: base "" | xsa "0,1"',
                    "val bpb at step 5 (last common)  0.8484  0.8457 (-0.0027, -0.32%)",
                    "best val bpb (any step)          0.8400  0.8457 (+0.0057, +0.68%)", "CORE at step 5", "0.1602  0.1508 (-0.0094, -5.87%)",
                    "t2 (centered)", "0.1204  0.1016 (-0.0188)", "1.2500  1.2000 (-0.0500, -4.00%)",
                    "max |smoothed loss - baseline's|, steps 0-4  0.0000  0.0369", "cos(y, v) before XSA   0.4000  0.3000 (-0.1000)",
                    "cos(z, v) after XSA    0.4000  0.0000 (-0.4000)", "ms per step  100.5  101.5 (+1.0, +1.00%)", "MFU %        40.5   40.5",
                    "step-time overhead of xsa: +1.00% against base", "steps done: base 5/5, xsa 5/5",
                    "base [98.6-101.7] (3.1% of the median), xsa [99.6-102.7] (3.1% of the median)",
                    "note: one run per arm (one seed each): the differences below are single-run"]
        flat = " ".join(out.split())  # column widths follow the longest label: compare with single spaces
        missing = [e for e in expected if " ".join(e.split()) not in flat]
        self.assertTrue(code == 0 and not missing and "WARNING" not in out, "exit %d, MISSING: %s; output:\n%s" % (code, missing, out))

    def test_unsteady_step_times(self):
        """compare_runs.py: a run whose step times spread by more than 10% of their median gets no overhead figure"""
        # steps 1-4: 100 130 98 101 -> sorted 98 100 101 130: p10 98.6, p90 101 + 0.7 x 29 = 121.3, (121.3 - 98.6) / 100.5 = 22.6%
        self.write("unsteady/metrics.jsonl", hand_made_run("1", "0,1", 42, self.LOSS_B, [400, 100, 130, 98, 101], -1, 0.8457,
                                                           "[0.20, 0.40]", "[0.0, 0.0]", 0.1508))
        code, out = run(COMPARE + [self.path("base"), self.path("unsteady")])
        self.assertTrue(code == 0 and "step-time overhead of unsteady: not trustworthy: the step times spread by more than 10% of their "
                        "median (p10-p90: unsteady 22.6%)" in out and "overhead of unsteady: +" not in out, "exit %d, output:\n%s" % (code, out))

    def test_loss_noise_by_hand(self):
        """compare_runs.py: the loss noise over the last 10% of 30 steps, worked out by hand"""
        # steps 27, 28, 29 (the last 3 of 30): losses 2.0, 2.2, 1.9 -> changes +0.2, -0.3: mean -0.05, sd sqrt(0.125) = 0.35355,
        # / sqrt 2 = 0.25; the baseline: 2.0, 2.0, 2.0 -> 0
        flat, bumpy = [3.0] * 27 + [2.0, 2.0, 2.0], [3.0] * 27 + [2.0, 2.2, 1.9]
        for name, losses in (("flat", flat), ("bumpy", bumpy)):
            lines = ['{"step": 0, "kind": "run", "steps": 30, "seed": 1}']
            lines += ['{"step": %d, "kind": "train", "loss": %.1f, "dt_ms": 100.0, "tok_per_s": 1.0}' % (i, l) for i, l in enumerate(losses)]
            self.write(name + "/metrics.jsonl", "\n".join(lines) + "\n")
        code, out = run(COMPARE + [self.path("flat"), self.path("bumpy")])
        self.assertTrue(code == 0 and "loss noise, steps 27-29 (sd of step-to-step changes / sqrt 2) 0.0000 0.2500" in " ".join(out.split()),
                        "exit %d, output:\n%s" % (code, out))

    def test_other_seed(self):
        """compare_runs.py: runs with another seed are flagged as not matched (device differences are not)"""
        code, out = run(COMPARE + [self.path("base"), self.path("other_seed")])
        self.assertTrue(code == 0 and "WARNING: not a matched comparison: seed differ" in out and "device:" in out,
                        "exit %d, output:\n%s" % (code, out))

    def test_bad_input(self):
        self.write("bad.jsonl", self.xsa[:self.xsa.find('"val_bpb"')] + "\n")
        self.write("no_field.jsonl", '{"step": 0, "kind": "eval", "eval_tokens": 64}\n')
        self.write("list.jsonl", '{"step": 0, "kind": "train", "loss": 1.0, "dt_ms": 1.0, "tok_per_s": 1.0}\n[1, 2]\n')
        with open(self.path("latin1.jsonl"), "wb") as f:
            f.write(b'{"step": 0, "kind": "run", "name": "caf\xe9"}\n')
        bad = [([self.path("base")], "at least two runs"),
               ([self.path("base"), self.path("nowhere")], "neither a run directory"),
               ([self.path("base"), self.path("bad.jsonl")], "line 2 is not a JSON line"),
               ([self.path("base"), self.path("list.jsonl")], "line 2 is not a metrics record (a JSON list, not an object)"),
               ([self.path("base"), self.path("latin1.jsonl")], "is not a metrics file (not UTF-8 text: byte 39)"),
               ([self.path("base"), self.path("no_field.jsonl")], "'val_bpb'"),
               ([self.path("base"), self.path("base"), "--bogus"], "compare_runs.py: error: unrecognized arguments: --bogus (see --help)")]
        for args, expect in bad:
            check_one_error(self, COMPARE + args, expect, "compare_runs.py " + " ".join(os.path.basename(a) for a in args), anywhere=True)


class TestRealRuns(TempDirTest):
    def test_xsa_off_and_on(self):
        """compare_runs.py on train_gpt runs with and without XSA: only the XSA settings differ, CORE and diagnostics compared"""
        flags = shlex.split(TINY + " -n 3 --core-every 3 --core-max-per-task 4")
        code_a, out_a = run([binary("train_gpt_cpu")] + flags + ["-o", self.path("real_base")])
        code_b, out_b = run([binary("train_gpt_cpu")] + flags + ["-x", "1", "-o", self.path("real_xsa")])
        self.assertTrue(code_a == 0 and code_b == 0, "train_gpt exit %d and %d:\n%s\n%s" % (code_a, code_b, out_a, out_b))
        code, out = run(COMPARE + [self.path("real_base"), self.path("real_xsa")])
        self.assertTrue(code == 0 and 'settings that differ:\n  model.xsa_alpha: real_base 0 | real_xsa 1\n  model.xsa_layers: ' in out and
                        "WARNING" not in out and "CORE at step 3" in out and "cos(z, v) after XSA" in out, "exit %d, output:\n%s" % (code, out))


if __name__ == "__main__":
    unittest.main()
