"""The logged schedules of ./train_gpt_cpu against nanochat's formulas (base_train.py's get_lr_multiplier and
get_muon_momentum, dev/docs/optim.md#schedules), written here in Python doubles as nanochat computes them:
every step's lr_mult and muon_momentum in metrics.jsonl, at the run lengths where 0.65 N ends in .5 (N = 30 mod 40,
where round() goes to the even neighbour: a float ratio lands below the half and rounds down) and at others.
"""
import os
import shlex
import tempfile
import unittest

from xsatest import binary, jsonl, run

TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --eval-every 100000 --eval-tokens 64 --core-every -1 --sample-every -1"


def lr_multiplier(it, n, warmup, warmdown_ratio=0.65, final_lr_frac=0.05):
    warmdown = round(warmdown_ratio * n)
    if it < warmup:
        return (it + 1) / warmup
    elif it <= n - warmdown:
        return 1.0
    progress = (n - it) / warmdown
    return progress * 1.0 + (1 - progress) * final_lr_frac


def muon_momentum(it, n, momentum_warmup, warmdown_ratio=0.65):
    warmdown = round(warmdown_ratio * n)
    start = n - warmdown
    if it < momentum_warmup:
        frac = it / momentum_warmup
        return (1 - frac) * 0.85 + frac * 0.97
    elif it >= start:
        progress = (it - start) / warmdown
        return 0.97 * (1 - progress) + 0.90 * progress
    return 0.97


class Schedules(unittest.TestCase):
    def logged(self, n, extra):
        with tempfile.TemporaryDirectory() as out:
            code, text = run([binary("train_gpt_cpu")] + shlex.split(TINY) + ["-n", str(n), "-o", out] + shlex.split(extra))
            self.assertEqual(code, 0, text[-2000:])
            steps = [m for m in jsonl(os.path.join(out, "metrics.jsonl")) if m["kind"] == "train"]
        self.assertEqual([m["step"] for m in steps], list(range(n)))
        return steps

    def check(self, n, warmup, momentum_warmup, extra=""):
        flags = "--warmup-steps %d --momentum-warmup-steps %d %s" % (warmup, momentum_warmup, extra)
        for m in self.logged(n, flags):
            it = m["step"]
            # both are logged with 8 decimals
            self.assertAlmostEqual(m["lr_mult"], lr_multiplier(it, n, warmup), delta=6e-9, msg="N %d step %d: lr_mult" % (n, it))
            self.assertAlmostEqual(m["muon_momentum"], muon_momentum(it, n, momentum_warmup), delta=6e-9,
                                   msg="N %d step %d: muon_momentum" % (n, it))

    def test_ties(self):
        # 0.65 N = 19.5, 45.5, 71.5, 97.5: Python rounds to 20, 46, 72, 98
        for n in (30, 70, 110, 150):
            with self.subTest(n=n):
                self.check(n, 2, 5)

    def test_other_lengths(self):
        for n in (7, 29, 31, 50, 149):
            with self.subTest(n=n):
                self.check(n, 2, 5)

    def test_defaults(self):
        # nanochat's warmups: 40 lr steps, 400 momentum steps (longer than this run: no momentum warmdown)
        self.check(150, 40, 400)


if __name__ == "__main__":
    unittest.main()
