"""dev/study.py: its statistics (t distribution, Welch, the paired t-test, Holm, the power line) against
scipy and against cases computed by hand; the report's paired analysis on made-up runs (with and without
depth groups) and on the committed CPU-scale study; the plots; the runner on a tiny study (every run trained
once, skipped when complete, resumed from a checkpoint bit-identically, --max-runs, drained by SIGUSR1,
groups), and its refusals (arms that set more than XSA or the optimizer, a base that sets the seed, bad
groups, runs that are not matched). Run with `make test` (or build/venv/bin/python dev/test_study.py: scipy
and matplotlib come with dev/requirements.txt; without them those tests are skipped, and fail in CI)."""
import io
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test"))
import study  # noqa: E402
import xsatest  # noqa: E402
from xsatest import binary, check_one_error, needs_packages, run  # noqa: E402

STUDY = [sys.executable, "dev/study.py"]
BASE = ("-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 -n 6 --warmup-steps 2 --eval-every 3 --eval-tokens 256 --sample-every -1 "
        "--core-every -1 --save-every 3")
COMMITTED = os.path.join(xsatest.REPO, "dev", "results", "gcide_cpu")


def png_size(path):
    """(width, height) from a PNG file's IHDR chunk, or None if it is not a whole PNG header."""
    data = xsatest.read(path)
    return struct.unpack(">II", data[16:24]) if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 24 else None


def section(report, heading):
    """The text of a report's section from its heading line (any level) to the next heading."""
    m = re.search(r"^#+ " + re.escape(heading) + r".*?$(.*?)(?=^#|\Z)", report, re.M | re.S)
    return m.group(1) if m else ""


def row(text, *first_cells):
    """The cells of the first table row of `text` that starts with first_cells."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[:len(first_cells)] == list(first_cells):
            return cells
    return None


def write_run(run_dir, seed, final_bpb, alpha=0.0, learnable=False, layers=2, steps=20, loss_shift=0.0, ms=10.0):
    """A finished run's metrics.jsonl as train_gpt writes it (the lines study.py reads), with final val bpb
    `final_bpb`: made-up runs whose statistics are known."""
    rng = random.Random(seed * 1000 + int(alpha * 100) + layers)
    lines = [{"step": 0, "kind": "run", "backend": "CPU", "device": "CPU", "ranks": 1, "steps": steps, "seed": seed, "data_seed": 0,
              "train_data": "train_*.bin", "val_data": "val_*.bin",
              "model": {"n_layer": layers, "xsa_alpha": alpha, "xsa_learnable": int(learnable), "xsa_layers": "all"},
              "optim": {"optim.lr.matrices": 0.02, "optim.lr.xsa_alpha": 0.005}}]
    for s in range(steps):
        lr = min(1.0, (s + 1) / 4) * (1.0 if s < steps // 2 else (steps - s) / (steps - steps // 2))
        lines.append({"step": s, "kind": "train", "loss": 5.0 - 0.1 * s + loss_shift + 0.01 * rng.random(), "grad_norm": 1.0,
                      "lr_mult": lr, "dt_ms": ms + rng.random(), "tok_per_s": 1000.0, "mfu": None})
    for k, s in enumerate((0, steps // 2, steps)):
        lines.append({"step": s, "kind": "eval", "val_bpb": final_bpb + (2 - k) * 0.5})
        lines.append({"step": s, "kind": "diag", "cos_yv": [0.4 + 0.1 * l + 0.01 * k for l in range(layers)],
                      "cos_zv": [(0.4 + 0.1 * l) * (1 - alpha) for l in range(layers)],
                      "self_weight": [0.05 + 0.01 * l + alpha * 0.02 for l in range(layers)], "value_cos": [0.1] * layers})
        if learnable:
            lines.append({"step": s, "kind": "xsa_alpha", "alpha": {str(l): [0.05 * k * (l + 1), 0.04 * k * (l + 1)] for l in range(layers)}})
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))


def holm_by_definition(pvalues, alpha):
    """Holm's step-down procedure at level alpha, from its definition: the hypotheses by ascending p; reject
    the k-th (from 0) of m while its p <= alpha / (m - k), stop at the first that is not. The rejected
    indices."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = set()
    for k, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - k):
            break
        rejected.add(i)
    return rejected


class TestStatisticsByHand(unittest.TestCase):
    """Cases whose answers are worked out here from closed forms, without scipy: they run everywhere."""

    def test_paired_by_hand(self):
        # baseline 1.0 2.0 3.0 4.0, arm 1.2 2.1 3.3 4.2: differences 0.2 0.1 0.3 0.2, mean 0.2; squared deviations
        # 0 + 0.01 + 0.01 + 0 = 0.02, variance 0.02 / 3, sd 0.08165, se sd / 2 = 0.040825, t = 0.2 / se = sqrt(24), df 3.
        r = study.paired([a - b for a, b in zip([1.2, 2.1, 3.3, 4.2], [1.0, 2.0, 3.0, 4.0])])
        self.assertAlmostEqual(r["mean"], 0.2, delta=1e-12)
        self.assertAlmostEqual(r["sd"], math.sqrt(0.02 / 3), delta=1e-12)
        # Student's t with 3 df has the CDF 1/2 + (x / (1 + x^2) + atan x) / pi, x = t / sqrt 3 = sqrt 8: x / 9 = 0.3142697,
        # atan x = 1.2309594, so the two-sided p is 1 - 2 / pi * 1.5452291 = 0.0162766
        x = math.sqrt(24) / math.sqrt(3)
        p = 1.0 - 2.0 / math.pi * (x / (1 + x * x) + math.atan(x))
        self.assertAlmostEqual(p, 0.0162766, delta=1e-7)
        self.assertAlmostEqual(r["p"], p, delta=1e-12)
        # the 97.5% quantile of t with 3 df (tables: 3.182446), so the interval 0.2 -+ 3.182446 * 0.040825 = [0.070077, 0.329923]
        self.assertAlmostEqual(study.t_quantile(0.975, 3), 3.1824463052842638, delta=1e-9)
        half = 3.1824463052842638 * math.sqrt(0.02 / 3) / 2
        self.assertAlmostEqual(r["ci"][0], 0.2 - half, delta=1e-9)
        self.assertAlmostEqual(r["ci"][1], 0.2 + half, delta=1e-9)
        self.assertAlmostEqual(r["ci"][0], 0.070077, delta=1e-6)

    def test_small_df_closed_forms(self):
        for t in (0.3, 1.0, 2.5, 9.0):
            with self.subTest("df 1 (Cauchy): p = 1 - 2 atan(t) / pi, t %g" % t):
                self.assertAlmostEqual(study.t_two_sided_p(t, 1), 1 - 2 * math.atan(t) / math.pi, delta=1e-12)
            with self.subTest("df 2: p = 1 - t / sqrt(2 + t^2), t %g" % t):
                self.assertAlmostEqual(study.t_two_sided_p(t, 2), 1 - t / math.sqrt(2 + t * t), delta=1e-12)
        # two pairs, differences 1 and 3: mean 2, sd sqrt 2, se 1, t 2 with 1 df; the 97.5% quantile is tan(0.475 pi) = 12.7062
        r = study.paired([1.0, 3.0])
        self.assertAlmostEqual(r["p"], 1 - 2 * math.atan(2.0) / math.pi, delta=1e-12)
        self.assertAlmostEqual(r["ci"][1], 2.0 + math.tan(0.475 * math.pi), delta=1e-8)

    def test_degenerate(self):
        self.assertEqual((study.paired([0.5])["sd"], study.paired([0.5])["p"]), (None, None))  # one pair: no spread
        self.assertEqual(study.paired([0.5, 0.5])["p"], None)  # no spread: t is not finite
        self.assertIsNone(study.welch([1.0], [2.0, 3.0]))
        self.assertIsNone(study.detectable_effect(1))

    def test_holm_by_hand(self):
        # sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to the 0.06 before it)
        self.assertEqual([round(p, 12) for p in study.holm([0.01, 0.04, 0.03, 0.005])], [0.03, 0.06, 0.06, 0.02])
        self.assertEqual(study.holm([0.2, None, 0.6]), [0.4, None, 0.6])  # None: not tested, not in the family
        self.assertEqual(study.holm([0.5, 0.7]), [1.0, 1.0])  # capped at 1
        self.assertEqual(study.holm([]), [])

    def test_holm_against_its_definition(self):
        """The adjusted p-value of a hypothesis is the smallest level at which Holm's procedure rejects it."""
        rng = random.Random(7)
        for case in range(200):
            m = rng.randint(1, 8)
            pvalues = [rng.random() ** rng.choice((1, 3, 6)) for _ in range(m)]
            adjusted = study.holm(pvalues)
            for i, adj in enumerate(adjusted):
                with self.subTest("case %d, hypothesis %d of %s" % (case, i, pvalues)):
                    self.assertNotIn(i, holm_by_definition(pvalues, adj * (1 - 1e-9)))
                    if adj < 1.0:  # (capped at 1: rejected at no level below 1)
                        self.assertIn(i, holm_by_definition(pvalues, adj * (1 + 1e-9)))


@needs_packages("scipy")
class TestStatistics(unittest.TestCase):
    def test_t_distribution(self):
        from scipy import stats
        for t, df in ((0.5, 3), (2.0, 10), (2.571, 5), (4.3, 2.7), (1.0, 1), (12.0, 30.5), (0.01, 4)):
            with self.subTest("two-sided p of t %g, df %g" % (t, df)):
                self.assertAlmostEqual(study.t_two_sided_p(t, df), 2 * stats.t.sf(t, df), delta=1e-10)
        for df in (1, 2, 3, 4, 5.5, 9, 30, 200):
            for q in (0.8, 0.9, 0.975, 0.995):
                with self.subTest("t.ppf(%g, %g)" % (q, df)):
                    self.assertAlmostEqual(study.t_quantile(q, df), stats.t.ppf(q, df), delta=1e-8 * max(1.0, stats.t.ppf(q, df)))

    def test_welch(self):
        from scipy import stats
        samples = (([4.10, 4.12, 4.09, 4.11, 4.13], [4.05, 4.08, 4.04, 4.07]), ([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]),
                   ([0.31, 0.29], [0.27, 0.30, 0.26]))
        for a, b in samples:
            with self.subTest("Welch %s vs %s" % (a, b)):
                diff, (lo, hi), p, df = study.welch(a, b)
                ref = stats.ttest_ind(b, a, equal_var=False)
                ci = ref.confidence_interval(0.95)
                self.assertAlmostEqual(p, ref.pvalue, delta=1e-10)
                self.assertAlmostEqual(df, ref.df, delta=1e-9)
                self.assertAlmostEqual(lo, ci.low, delta=1e-8)
                self.assertAlmostEqual(hi, ci.high, delta=1e-8)

    def test_paired_against_ttest_rel(self):
        from scipy import stats
        rng = random.Random(3)
        cases = [([1.0, 2.0, 3.0, 4.0], [1.2, 2.1, 3.3, 4.2]), ([1.8142, 1.8076, 1.8036, 1.8019, 1.8070], [1.8152, 1.8117, 1.8093, 1.8043, 1.8164]),
                 ([0.5, 0.7], [0.6, 0.65]), ([3.0, 3.1, 2.9], [2.0, 2.2, 1.7])]
        for _ in range(40):  # random pairs: a shared per-seed level (what pairing removes), an effect, noise
            n = rng.randint(2, 12)
            level = [rng.gauss(1.8, 0.01) for _ in range(n)]
            effect, noise = rng.choice((0.0, 0.002, -0.01)), rng.choice((0.001, 0.004))
            cases.append((level, [x + effect + rng.gauss(0, noise) for x in level]))
        for base, arm in cases:
            with self.subTest("paired %s vs %s" % (base, arm)):
                r = study.paired([a - b for a, b in zip(arm, base)])
                ref = stats.ttest_rel(arm, base)
                ci = ref.confidence_interval(0.95)
                self.assertAlmostEqual(r["p"], ref.pvalue, delta=1e-10)
                self.assertEqual(r["df"], ref.df)
                self.assertAlmostEqual(r["ci"][0], ci.low, delta=1e-9)
                self.assertAlmostEqual(r["ci"][1], ci.high, delta=1e-9)

    def test_slope_against_linregress(self):
        from scipy import stats
        rng = random.Random(5)
        cases = [([2, 2, 3, 3, 4, 4], [0.007, 0.005, 0.016, 0.012, 0.020, 0.025]), ([1.0, 2.0, 3.0], [0.5, 0.4, 0.9])]
        for _ in range(20):
            xs = [rng.choice((2, 3, 4, 6)) for _ in range(rng.randint(3, 15))]
            if len(set(xs)) > 1:
                cases.append((xs, [0.001 * x + rng.gauss(0, 0.003) for x in xs]))
        for xs, ys in cases:
            with self.subTest("slope of %s on %s" % (ys, xs)):
                b, (lo, hi), p, df = study.slope(xs, ys)
                ref = stats.linregress(xs, ys)
                half = stats.t.ppf(0.975, len(xs) - 2) * ref.stderr
                self.assertAlmostEqual(b, ref.slope, delta=1e-12)
                self.assertAlmostEqual(p, ref.pvalue, delta=1e-10)
                self.assertEqual(df, len(xs) - 2)
                self.assertAlmostEqual(lo, ref.slope - half, delta=1e-9)
                self.assertAlmostEqual(hi, ref.slope + half, delta=1e-9)
        self.assertIsNone(study.slope([1, 2], [0.1, 0.2]))          # 2 points: no residual degrees of freedom
        self.assertIsNone(study.slope([3, 3, 3], [0.1, 0.2, 0.3]))  # one depth
        self.assertIsNone(study.slope([1, 2, 3], [1.0, 2.0, 3.0]))  # a perfect fit: no spread to test against

    def test_power_against_noncentral_t(self):
        from scipy import stats
        for n in (2, 3, 5, 8, 20):
            crit = stats.t.ppf(0.975, n - 1)
            for effect in (0.0, 0.5, 1.0, 2.0):
                ncp = effect * math.sqrt(n)
                ref = stats.nct.sf(crit, n - 1, ncp) + stats.nct.cdf(-crit, n - 1, ncp)
                with self.subTest("power, n %d, effect %g sd" % (n, effect)):
                    self.assertAlmostEqual(study.paired_power(effect, n), ref, delta=1e-8)
        for n in (3, 4, 5, 10, 30):  # (scipy's nct is not finite for n 2 at the effect it needs, 11.5 sd)
            d = study.detectable_effect(n)
            ncp, crit = d * math.sqrt(n), stats.t.ppf(0.975, n - 1)
            with self.subTest("detectable effect for n %d: %g sd has 80%% power" % (n, d)):
                self.assertAlmostEqual(stats.nct.sf(crit, n - 1, ncp) + stats.nct.cdf(-crit, n - 1, ncp), 0.8, delta=1e-7)
        # the approximation (t_0.975 + t_0.8) / sqrt(n) is close but not it: 1.6625 against 1.6820 at n 5
        self.assertAlmostEqual(study.detectable_effect(5), 1.681997, delta=1e-5)


@needs_packages("scipy")
class TestReport(xsatest.TempDirTest):
    PREFIX = "xsa_study_report_"

    def report_only(self, spec, *extra):
        self.write("study.json", json.dumps(spec))
        code, out = run(STUDY + [self.path("study.json"), "--out", self.path("out"), "--report-only", "--no-plots"] + list(extra))
        self.assertEqual(code, 0, out)
        return xsatest.read(self.path("out", "report.md")).decode()

    def test_paired_report_matches_scipy(self):
        from scipy import stats
        base = {1: 1.80, 2: 1.81, 3: 1.79, 4: 1.82}
        diffs = {"xsa": {1: 0.004, 2: 0.006, 3: 0.001, 4: 0.005}, "half": {1: -0.002, 2: 0.001, 3: -0.003}}
        for s, b in base.items():
            write_run(self.path("out", "baseline", f"seed_{s}"), s, b)
            write_run(self.path("out", "xsa", f"seed_{s}"), s, b + diffs["xsa"][s], alpha=1.0, loss_shift=0.01)
            if s in diffs["half"]:
                write_run(self.path("out", "half", f"seed_{s}"), s, b + diffs["half"][s], alpha=0.5)
        report = self.report_only({"name": "t", "base": "", "arms": {"baseline": "", "xsa": "-x 1", "half": "-x 0.5"},
                                   "seeds": [1, 2, 3, 4], "arm_seeds": {"half": [1, 2, 3]}})
        primary = section(report, "Primary: final val bpb")
        pvalues = {}
        for arm in ("xsa", "half"):
            seeds = sorted(diffs[arm])
            ref = stats.ttest_rel([base[s] + diffs[arm][s] for s in seeds], [base[s] for s in seeds])
            ci = ref.confidence_interval(0.95)
            pvalues[arm] = ref.pvalue
            cells = row(primary, arm)
            mean = sum(diffs[arm].values()) / len(seeds)
            worse = sum(d > 0 for d in diffs[arm].values())
            with self.subTest("%s: the primary row is scipy's ttest_rel" % arm):
                self.assertEqual(cells[1:2] + cells[4:6], [str(len(seeds)), "%+.4f" % mean, "[%+.4f, %+.4f]" % (ci.low, ci.high)], primary)
                self.assertEqual(cells[7], "%.3g" % ref.pvalue)
                self.assertEqual(cells[9], "worse %d / better %d of %d" % (worse, len(seeds) - worse, len(seeds)))
            with self.subTest("%s: the per-seed differences" % arm):
                for s in seeds:
                    self.assertIn("%+.4f" % diffs[arm][s], row(primary, str(s)))
        order = sorted(pvalues, key=pvalues.get)
        holm = {order[0]: min(1, 2 * pvalues[order[0]])}
        holm[order[1]] = max(holm[order[0]], pvalues[order[1]])
        with self.subTest("the primary p Holm-adjusted over the 2 comparisons"):
            self.assertIn("Holm p (2)", primary)
            for arm in pvalues:
                self.assertEqual(row(primary, arm)[8], "%.3g" % holm[arm])
        with self.subTest("the power line: exact noncentral t, the detectable effect from the differences' sd"):
            sd = stats.tstd(list(diffs["xsa"].values()))
            self.assertIn("the smallest true difference detectable is %.4f" % (study.detectable_effect(4) * sd), primary)
            self.assertIn("exact noncentral t", primary)
        with self.subTest("secondary metrics paired, Holm within the arm; ms per step not among them"):
            secondary = section(report, "Secondary metrics")
            names = ["best val bpb (lower is better)", "train loss, last 10% of steps (lower is better)"]
            ps = [float(row(secondary, "xsa", n)[6]) for n in names]
            holms = [float(row(secondary, "xsa", n)[7]) for n in names]
            for h, ref in zip(holms, study.holm(ps)):  # (from the report's rounded p-values: to their precision)
                self.assertAlmostEqual(h, ref, delta=0.01 * ref)
            # the same self weight in every seed: no spread, no test, not in the Holm family
            self.assertEqual(row(secondary, "xsa", "self weight (mean over layers)")[6:8], ["n/a", "n/a"], secondary)
            self.assertNotIn("ms per step", secondary)
        with self.subTest("the unpaired Welch numbers, secondary"):
            unpaired = section(report, "Per arm, unpaired")
            ref = stats.ttest_ind([base[s] + diffs["xsa"][s] for s in base], list(base.values()), equal_var=False)
            self.assertEqual(row(unpaired, "final val bpb", "xsa")[7], "%.3g" % ref.pvalue)
        with self.subTest("the shared data order is named, and that the seeds do not vary it"):
            self.assertIn("`data_seed` is 0 in every run", report)

    def test_primary_named_by_the_study(self):
        for s in (1, 2, 3):
            write_run(self.path("out", "baseline", f"seed_{s}"), s, 1.8)
            write_run(self.path("out", "xsa", f"seed_{s}"), s, 1.8, alpha=1.0, loss_shift=0.02 * s)
        report = self.report_only({"name": "t", "base": "", "arms": {"baseline": "", "xsa": "-x 1"}, "seeds": [1, 2, 3],
                                   "primary": "train_loss"})
        self.assertIn("## Primary: train loss, last 10% of steps (lower is better), paired by seed", report)
        self.assertIn("| xsa | final val bpb (lower is better) | 3 |", section(report, "Secondary metrics"))

    def test_groups(self):
        from scipy import stats
        effect = {"d1": {1: 0.001, 2: 0.002, 3: 0.0}, "d3": {1: -0.004, 2: -0.006, 3: -0.003}}
        for g, layers in (("d1", 1), ("d3", 3)):
            for s in (1, 2, 3):
                write_run(self.path("out", g, "baseline", f"seed_{s}"), s, 1.8 + 0.01 * s, layers=layers)
                write_run(self.path("out", g, "xsa", f"seed_{s}"), s, 1.8 + 0.01 * s + effect[g][s], alpha=1.0, layers=layers)
        report = self.report_only({"name": "t", "base": "", "arms": {"baseline": "", "xsa": "-x 1"}, "seeds": [1, 2, 3],
                                   "groups": {"d1": "-d 1", "d3": "-d 3"}})
        self.assertIn("Finished runs: d1: baseline 3/3, xsa 3/3; d3: baseline 3/3, xsa 3/3.", report)
        depth = section(report, "Depth series")
        for g, layers in (("d1", 1), ("d3", 3)):
            ref = stats.ttest_rel([1.8 + 0.01 * s + effect[g][s] for s in (1, 2, 3)], [1.8 + 0.01 * s for s in (1, 2, 3)])
            ci = ref.confidence_interval(0.95)
            with self.subTest("group %s: its own section and its row of the depth series" % g):
                self.assertIn("## Group %s (`-d %d`)" % (g, layers), report)
                self.assertEqual(row(depth, "xsa", g)[2:6], [str(layers), "3", "%+.4f" % (sum(effect[g].values()) / 3),
                                                             "[%+.4f, %+.4f]" % (ci.low, ci.high)])
        with self.subTest("the change from the first group to the last, paired by seed: scipy's ttest_rel"):
            ref = stats.ttest_rel(list(effect["d3"].values()), list(effect["d1"].values()))
            ci = ref.confidence_interval(0.95)
            mean = sum(effect["d3"][s] - effect["d1"][s] for s in (1, 2, 3)) / 3
            self.assertIn("* xsa: %+.4f, 95%% CI [%+.4f, %+.4f], paired t p %s, larger in 0 / smaller in 3 of 3 seeds"
                          % (mean, ci.low, ci.high, study.pval(ref.pvalue)), depth)
        with self.subTest("the primary's Holm family: every group and arm"):
            self.assertIn("Holm p (2)", report)

    def test_depth_change_pairs_seeds(self):
        """The change of the effect between groups pairs a seed with itself, not the k-th finished run of one group
        with the k-th of the other: seeds 1-3 at d1, 2-4 at d3, so seeds 2 and 3 are the pairs."""
        from scipy import stats
        effect = {"d1": {1: 0.009, 2: 0.001, 3: 0.004}, "d3": {2: -0.002, 3: 0.0082, 4: -0.020}}
        for g, layers in (("d1", 1), ("d3", 3)):
            for s, e in effect[g].items():
                write_run(self.path("out", g, "baseline", f"seed_{s}"), s, 1.8 + 0.01 * s, layers=layers)
                write_run(self.path("out", g, "xsa", f"seed_{s}"), s, 1.8 + 0.01 * s + e, alpha=1.0, layers=layers)
        spec = {"name": "t", "base": "", "arms": {"baseline": "", "xsa": "-x 1"}, "seeds": [1, 2, 3, 4],
                "groups": {"d1": "-d 1", "d3": "-d 3"}, "claims": {"xsa": "xsa"}}
        report = self.report_only(spec)
        ref = stats.ttest_rel([effect["d3"][s] for s in (2, 3)], [effect["d1"][s] for s in (2, 3)])
        ci = ref.confidence_interval(0.95)
        self.assertIn("* xsa: %+.4f, 95%% CI [%+.4f, %+.4f], paired t p %s, larger in 1 / smaller in 1 of 2 seeds"
                      % ((effect["d3"][2] - effect["d1"][2] + effect["d3"][3] - effect["d1"][3]) / 2, ci.low, ci.high,
                         study.pval(ref.pvalue)), section(report, "Depth series"))
        with self.subTest("fewer pairs than planned: the count says so, and the claims call their verdicts interim"):
            self.assertEqual(row(section(report, "Depth series"), "xsa", "d3")[-1], "worse 1 / better 2 of 3 (4 planned)")
            self.assertIn("While fewer pairs than planned have finished", section(report, "The study's claims"))
        with self.subTest("the depth claim's seed-level check: seeds 2 and 3, each with its own slope"):
            slopes = [(effect["d3"][s] - effect["d1"][s]) / 2 for s in (2, 3)]
            ref = stats.ttest_1samp(slopes, 0.0)
            ci = ref.confidence_interval(0.95)
            self.assertIn("then the t-test of the 2 seeds' slopes against 0, df 1): %+.4f per layer, 95%% CI [%+.4f, %+.4f], p %s."
                          % (sum(slopes) / 2, ci.low, ci.high, study.pval(ref.pvalue)), section(report, "The study's claims"))

    def test_claims(self):
        """The claims section: each verdict by its rule (Holm p < 0.05 the claimed way supports, the other way
        contradicts, else cannot tell), the depth slope as scipy's linregress, the learned alpha's end, the finished runs."""
        from scipy import stats
        effect = {"d1": [0.010, 0.011, 0.009, 0.012], "d3": [-0.010, -0.011, -0.012, -0.009]}
        learn = {"d1": [0.003, -0.004, 0.001, 0.0], "d3": [-0.002, 0.002, -0.001, 0.003]}
        for g, layers in (("d1", 1), ("d3", 3)):
            for s in (1, 2, 3, 4):
                b = 1.8 + 0.01 * s
                write_run(self.path("out", g, "baseline", f"seed_{s}"), s, b, layers=layers)
                write_run(self.path("out", g, "xsa", f"seed_{s}"), s, b + effect[g][s - 1], alpha=1.0, layers=layers)
                write_run(self.path("out", g, "learn", f"seed_{s}"), s, b + learn[g][s - 1], learnable=True, layers=layers)
        spec = {"name": "t", "base": "", "arms": {"baseline": "", "xsa": "-x 1", "learn": "-x learn"}, "seeds": [1, 2, 3, 4],
                "groups": {"d1": "-d 1", "d3": "-d 3"}, "claims": {"xsa": "xsa", "learnable": "learn"}}
        claims = section(self.report_only(spec), "The study's claims at this scale")
        items = {m.group(1): m.group(2) for m in re.finditer(r"^(\d)\. (.*)$", claims, re.M)}
        self.assertEqual(sorted(items), ["1", "2", "3", "4", "5"], claims)
        pvalues = [stats.ttest_rel([1.8 + 0.01 * s + effect[g][s - 1] for s in (1, 2, 3, 4)], [1.8 + 0.01 * s for s in (1, 2, 3, 4)]).pvalue
                   for g in ("d1", "d3")]
        pvalues += [stats.ttest_rel([1.8 + 0.01 * s + learn[g][s - 1] for s in (1, 2, 3, 4)], [1.8 + 0.01 * s for s in (1, 2, 3, 4)]).pvalue
                    for g in ("d1", "d3")]
        adjusted = study.holm(pvalues)  # the primary's family: both groups, both arms
        self.assertLess(max(adjusted[:2]), 0.05)
        self.assertGreater(min(adjusted[2:]), 0.05)
        with self.subTest("bpb: worse at d1 contradicts, better at d3 supports, each with its Holm p"):
            self.assertRegex(items["2"], r"d1 \(1 layers\): \*\*contradicts\*\*, \+0\.0105 .*Holm p %s" % re.escape(study.pval(adjusted[0])))
            self.assertRegex(items["2"], r"d3 \(3 layers\): \*\*supports\*\*, -0\.0105 .*Holm p %s" % re.escape(study.pval(adjusted[1])))
        with self.subTest("depth: the per-seed differences against the layers, scipy's linregress"):
            xs, ys = [1] * 4 + [3] * 4, effect["d1"] + effect["d3"]
            ref = stats.linregress(xs, ys)
            half = stats.t.ppf(0.975, 6) * ref.stderr
            self.assertIn("**Supports**: the per-seed final val bpb differences against the number of layers (8 pairs at depths 1, 3; "
                          "least squares, one test, which takes the pairs as independent though a seed's runs at every depth share its "
                          "data order) change by %+.4f per layer, 95%% CI [%+.4f, %+.4f], p %s."
                          % (ref.slope, ref.slope - half, ref.slope + half, study.pval(ref.pvalue)), items["3"])
        with self.subTest("depth, the seeds as the units: each seed's own slope (numpy's polyfit), scipy's ttest_1samp over them"):
            import numpy
            slopes = [numpy.polyfit([1, 3], [effect["d1"][s], effect["d3"][s]], 1)[0] for s in range(4)]
            ref = stats.ttest_1samp(slopes, 0.0)
            ci = ref.confidence_interval(0.95)
            self.assertIn("The same with the seeds as the units, a check that needs no such independence (each seed's own least-squares "
                          "slope over the depths it has, then the t-test of the 4 seeds' slopes against 0, df 3): %+.4f per layer, "
                          "95%% CI [%+.4f, %+.4f], p %s." % (numpy.mean(slopes), ci.low, ci.high, study.pval(ref.pvalue)), items["3"])
        with self.subTest("the learnable arm: cannot tell, and where alpha ends (layers x heads, every seed alike)"):
            end = {1: (0.1 + 0.08) / 2, 3: sum(0.1 * (l + 1) + 0.08 * (l + 1) for l in range(3)) / 6}
            for g, layers in (("d1", 1), ("d3", 3)):
                self.assertRegex(items["5"], r"%s \(%d layers\): alpha ends at %.3f \(mean over layers and heads, 4 seeds\); "
                                 r"final val bpb \*\*cannot tell\*\*" % (g, layers, end[layers]))
        with self.subTest("diagnostics without spread (the same in every seed): cannot tell"):
            self.assertIn("self weight **cannot tell**, +0.0200", items["4"])
        with self.subTest("stability: the XSA runs that finished"):
            self.assertIn("**Supports** no divergence: 16 runs with XSA finished", items["1"])
        with self.subTest("the verdict rule itself"):
            for c, lower, want in (({"holm": 0.01, "mean": -1.0}, True, "supports"), ({"holm": 0.01, "mean": 1.0}, True, "contradicts"),
                                   ({"holm": 0.01, "mean": 1.0}, False, "supports"), ({"holm": 0.05, "mean": -1.0}, True, "cannot tell"),
                                   ({"holm": None, "mean": -1.0}, True, "cannot tell")):
                self.assertEqual(study.verdict(c, lower), want, c)

    def test_committed_study(self):
        """The committed CPU-scale study read paired: alpha 1 worse by +0.0045 bpb, 95% CI [+0.0005, +0.0086], p 0.036, 5 of 5 seeds."""
        out = self.path("gcide_cpu")
        shutil.copytree(COMMITTED, out, ignore=shutil.ignore_patterns("*.png", "*.md"))
        code, text = run(STUDY + [os.path.join(xsatest.REPO, "dev", "studies", "gcide_cpu.json"), "--out", out, "--report-only", "--no-plots"])
        self.assertEqual(code, 0, text)
        report = xsatest.read(os.path.join(out, "report.md")).decode()
        cells = row(section(report, "Primary: final val bpb"), "xsa_1")
        self.assertEqual(cells[1:], ["5", "1.8068", "1.8114", "+0.0045", "[+0.0005, +0.0086]", "+0.25%", "0.0356", "0.107",
                                     "worse 5 / better 0 of 5"])
        self.assertEqual(row(section(report, "Per arm, unpaired"), "final val bpb", "xsa_1")[5:], ["+0.0045", "[-0.0025, +0.0115]", "0.176"])

    def committed_at_head(self, *paths):
        """The committed files at HEAD (a study running here adds runs to the work tree), extracted into a temporary
        directory, whose path is returned."""
        tar = subprocess.run(["git", "-C", xsatest.REPO, "archive", "HEAD"] + list(paths), capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(self.path("head"), **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))  # (Python 3.11.4+)
        return self.path("head")

    def test_committed_depth_study_rebuilds(self):
        """The committed depth series (dev/results/gcide_depth at HEAD) rebuilt from its committed metrics.jsonl files
        alone by today's study.py: its report.md as committed, up to the plots (not drawn here). Fails when the
        analysis changes and the report was not written again."""
        head = self.committed_at_head("dev/results/gcide_depth", "dev/studies/gcide_depth.json")
        out = os.path.join(head, "dev", "results", "gcide_depth")
        want = xsatest.read(os.path.join(out, "report.md")).decode().split("## Plots\n")[0]
        code, text = run(STUDY + [os.path.join(head, "dev", "studies", "gcide_depth.json"), "--out", out, "--report-only",
                                  "--no-plots"])
        self.assertEqual(code, 0, text)
        self.assertEqual(xsatest.read(os.path.join(out, "report.md")).decode(), want)

    def test_committed_depth_study_readmes_match_report(self):
        """What the depth series' README and the top README copy by hand from its report.md (at HEAD) is what the
        report says: the run count, and the per-seed table of final val bpb differences and end alphas. Fails when
        runs were added and the READMEs were not brought along."""
        head = self.committed_at_head("dev/results/gcide_depth/README.md", "dev/results/gcide_depth/report.md", "README.md")
        readme = xsatest.read(os.path.join(head, "dev", "results", "gcide_depth", "README.md")).decode()
        report = xsatest.read(os.path.join(head, "dev", "results", "gcide_depth", "report.md")).decode()
        finished = [tuple(map(int, c)) for c in re.findall(r" (\d+)/(\d+)", re.search(r"^.*Finished runs: (.*)$", report, re.M).group(1))]
        count = "%d of %d runs" % (sum(f for f, _ in finished), sum(p for _, p in finished))
        self.assertIn(count, readme.splitlines()[0])
        top = xsatest.read(os.path.join(head, "README.md")).decode()
        self.assertEqual(re.findall(r"\d+ of %d runs" % sum(p for _, p in finished), top), [count])
        header = row(readme, "depth")
        self.assertIsNotNone(header, "the README's per-seed table")
        columns, arm = [], None  # per column: (arm, seed) of a difference, or ("alpha", None) for the end alpha
        for cell in header[1:]:
            if cell.startswith("learnable alpha at the end"):
                columns.append(("alpha", None))
                continue
            if "," in cell:  # "alpha 1, seed 1" starts an arm's columns, "seed 2" goes on with it
                arm = {"alpha 1": "xsa_1", "learnable alpha": "xsa_learn"}[cell.split(",")[0]]
            columns.append((arm, int(re.fullmatch(r"(?:.*, )?seed (\d+)", cell).group(1))))
        groups = re.split(r"^## Group ", report, flags=re.M)[1:]
        self.assertEqual(len(groups), 3)
        for text in groups:
            group = text.split()[0]
            with self.subTest(group=group):
                per_seed = section(text, "Primary: final val bpb").split("Per seed, arm")[1]
                want = {}
                for line in per_seed.splitlines()[4:]:
                    if not line.startswith("|"):
                        break
                    cells = [c.strip() for c in line.strip("|").split("|")]
                    want.update({("xsa_1", int(cells[0])): cells[1], ("xsa_learn", int(cells[0])): cells[2]})
                cells = row(readme, group)
                self.assertIsNotNone(cells, group)
                for (col_arm, seed), cell in zip(columns, cells[1:]):
                    if col_arm == "alpha":
                        alpha = row(section(text, "Per arm, unpaired"), "learned alpha (mean over layers and heads)", "xsa_learn")
                        self.assertEqual(cell, "%.2f (seeds 1-%s)" % (float(alpha[3]), alpha[2]))
                    elif want.get((col_arm, seed), ""):  # more digits in the README (-0.00004) round to the report's
                        self.assertTrue(cell and round(float(cell), 4) == float(want[col_arm, seed]), (col_arm, seed, cell))
                    else:
                        self.assertEqual(cell, "", (col_arm, seed))
                self.assertEqual(len(cells), len(header))
                shown = {(a, s) for a, s in columns if a != "alpha"}
                self.assertFalse({k for k, v in want.items() if v} - shown, "per-seed results the README's table has no column for")

@needs_packages("matplotlib")
class TestStudyPlots(xsatest.TempDirTest):
    PREFIX = "xsa_study_plots_"

    def check_pngs(self, out, sizes):
        report = xsatest.read(os.path.join(out, "report.md")).decode()
        for name, size in sizes.items():
            with self.subTest("%s: a whole PNG of %dx%d pixels, linked from the report" % (name, *size)):
                self.assertEqual(png_size(os.path.join(out, name)), size)
                self.assertIn("![%s](%s)" % (name, name), report)
        self.assertFalse([n for n in os.listdir(out) if n.endswith(".tmp")])

    def test_plots(self):
        self.write("study.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": "", "xsa": "-x 1", "learn": "-x learn"},
                                             "seeds": [1, 2], "arm_seeds": {"learn": [2]}}))
        code, out = run(STUDY + [self.path("study.json"), "--binary", binary("train_gpt_cpu"), "--out", self.path("out")])
        self.assertEqual(code, 0, out)
        report = xsatest.read(self.path("out", "report.md")).decode()
        with self.subTest("arm_seeds: the learnable arm ran seed 2 only; its learned alpha is a metric of the report"):
            self.assertEqual(out.count("study: starting"), 5, out)
            self.assertIn("Finished runs: baseline 2/2, xsa 2/2, learn 1/1", report)
            self.assertRegex(report, r"\| learned alpha \(mean over layers and heads\) \| learn \| 1 \| -?0\.\d{4} \|")
        # figure size (inches) x 100 dpi, as plot_study draws them; no cost.png on a machine not said to be idle
        self.check_pngs(self.path("out"), {"primary.png": (1200, 450), "loss.png": (1200, 450), "loss_diff.png": (1000, 450),
                                           "val_bpb.png": (1200, 450), "diagnostics.png": (1310, 750), "alpha.png": (600, 450)})
        self.assertFalse(os.path.exists(self.path("out", "cost.png")))
        code, out = run(STUDY + [self.path("study.json"), "--out", self.path("out"), "--report-only", "--idle-machine"])
        with self.subTest("--idle-machine: the step time is compared, and cost.png drawn"):
            self.assertEqual(code, 0, out)
            self.check_pngs(self.path("out"), {"cost.png": (700, 450)})
            self.assertIn("| xsa | ms per step (median) (lower is better) | 2 |", xsatest.read(self.path("out", "report.md")).decode())

    def test_group_plots(self):
        for g, layers in (("small", 1), ("big", 3)):
            for s in (1, 2):
                write_run(self.path("out", g, "baseline", f"seed_{s}"), s, 1.8 + 0.01 * s, layers=layers)
                write_run(self.path("out", g, "learn", f"seed_{s}"), s, 1.8 + 0.01 * s - 0.001 * layers, alpha=0.1, learnable=True, layers=layers)
        self.write("study.json", json.dumps({"name": "t", "base": "", "arms": {"baseline": "", "learn": "-x learn"}, "seeds": [1, 2],
                                             "groups": {"small": "-d 1", "big": "-d 3"}}))
        code, out = run(STUDY + [self.path("study.json"), "--out", self.path("out"), "--report-only"])
        self.assertEqual(code, 0, out)
        sizes = {"primary.png": (1200, 900), "depth.png": (750, 450)}
        for g in ("small", "big"):
            sizes.update({f"loss_{g}.png": (1200, 450), f"loss_diff_{g}.png": (1000, 450), f"val_bpb_{g}.png": (1200, 450),
                          f"diagnostics_{g}.png": (890, 750), f"alpha_{g}.png": (600, 450)})
        self.check_pngs(self.path("out"), sizes)


class TestRunner(xsatest.TempDirTest):
    PREFIX = "xsa_study_"

    def study_file(self, arms, base=BASE, seeds=(1, 2), **extra):
        self.write("study.json", json.dumps({"name": "t", "base": base, "arms": arms, "seeds": list(seeds), **extra}))
        return self.path("study.json")

    def run_study(self, *extra):
        return run(STUDY + [self.path("study.json"), "--binary", binary("train_gpt_cpu"), "--out", self.path("out")] + list(extra))

    def losses(self, run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [(r["step"], r["loss"]) for r in map(json.loads, f) if r["kind"] == "train"]

    def test_runs_skip_resume_report(self):
        self.study_file({"baseline": "", "xsa": "-x 1"})
        code, out = self.run_study("--max-runs", "3")
        with self.subTest("--max-runs 3: three runs, seed by seed, then a report of the finished ones"):
            self.assertEqual(code, 0, out)
            self.assertEqual([l.split(":")[1].strip() for l in out.splitlines() if l.startswith("study: starting")],
                             ["starting baseline seed 1", "starting xsa seed 1", "starting baseline seed 2"])
        code, out = self.run_study()
        with self.subTest("rerun: only the missing run runs"):
            self.assertTrue(code == 0 and out.count("study: starting") == 1 and "starting xsa seed 2" in out, out)
        report = xsatest.read(self.path("out", "report.md")).decode()
        with self.subTest("the report: the paired primary with a CI and a p-value, the secondary metrics, the unpaired table"):
            self.assertIn("Finished runs: baseline 2/2, xsa 2/2", report)
            self.assertEqual(row(section(report, "Primary: final val bpb"), "xsa")[1], "2")
            self.assertEqual(row(section(report, "Primary: final val bpb"), "xsa")[5].count("["), 1, report)
            secondary = [l for l in section(report, "Secondary metrics").splitlines() if l.startswith("| xsa |")]
            self.assertEqual(len(secondary), 5, report)  # best val bpb, train loss, 3 diagnostics; no CORE (--core-every -1)
        # an interrupted run: the state a SIGTERM after step 3 leaves (the step-3 checkpoint, metrics up to it)
        d = self.path("out", "xsa", "seed_2")
        full = self.losses(d)
        os.remove(os.path.join(d, "ckpt_000006.safetensors"))
        with open(os.path.join(d, "metrics.jsonl")) as f:
            kept = [l for l in f if json.loads(l)["step"] <= 3 and not (json.loads(l)["step"] == 3 and json.loads(l)["kind"] == "train")]
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.writelines(kept)
        code, out = self.run_study()
        with self.subTest("a run with a checkpoint resumes from it, bit-identically"):
            runs = [l for l in out.splitlines() if l.startswith(("study: starting", "study: resuming"))]  # (not the report's lines,
            self.assertTrue(code == 0 and len(runs) == 1 and "study: resuming xsa seed 2" in runs[0], out)   # whose number depends on matplotlib)
            self.assertEqual(self.losses(d), full)
        code, out = self.run_study("--report-only")
        self.assertTrue(code == 0 and "study: starting" not in out, out)

    def test_groups(self):
        # (3 steps, not 6: four runs of a test that needs no resume)
        self.study_file({"baseline": "", "xsa": "-x 1"}, base=BASE.replace("-d 1 ", "").replace("-n 6", "-n 3"), seeds=(7,),
                        groups={"g1": "-d 1", "g2": "-d 2"}, vary_data_order=True)
        code, out = self.run_study()
        starts = [l.split(":")[1].strip() for l in out.splitlines() if l.startswith("study: starting")]
        with self.subTest("groups: every arm x seed at each group's flags, seed by seed, into DIR/GROUP/ARM/seed_S"):
            self.assertEqual(code, 0, out)
            self.assertEqual(starts, ["starting g1/baseline seed 7", "starting g1/xsa seed 7", "starting g2/baseline seed 7",
                                      "starting g2/xsa seed 7"])
            for g, layers in (("g1", 1), ("g2", 2)):
                for arm in ("baseline", "xsa"):
                    run_line = xsatest.jsonl(self.path("out", g, arm, "seed_7", "metrics.jsonl"))[0]
                    self.assertEqual(run_line["model"]["n_layer"], layers)
                    self.assertEqual((run_line["seed"], run_line["data_seed"]), (7, 7))  # "vary_data_order": --data-seed S with --seed S
        report = xsatest.read(self.path("out", "report.md")).decode()
        with self.subTest("the report: a section per group and the depth series (one seed: no interval)"):
            self.assertTrue("## Group g1 (`-d 1`)" in report and "## Group g2 (`-d 2`)" in report, report)
            self.assertEqual(row(section(report, "Depth series"), "xsa", "g2")[2:4], ["2", "1"], report)
        code, out = self.run_study()
        self.assertTrue(code == 0 and "study: starting" not in out, out)

    def test_core_final(self):
        self.study_file({"baseline": "", "xsa": "-x 1"}, seeds=(1,), core_final="-c dev/data/core_tasks")
        code, out = self.run_study()
        with self.subTest("core_final: eval_core on every finished run's last checkpoint into core_final.csv, in the report"):
            self.assertEqual(code, 0, out)
            self.assertEqual(out.count("study: full CORE of"), 2, out)
            for arm in ("baseline", "xsa"):
                csv = xsatest.read(self.path("out", arm, "seed_1", "core_final.csv")).decode()
                self.assertTrue(csv.startswith("label,type,items,") and "\nCORE,,,,," in csv, csv)
            self.assertIn("CORE, all items", xsatest.read(self.path("out", "report.md")).decode())
        code, out = self.run_study()
        self.assertTrue(code == 0 and "study: full CORE of" not in out, out)

    def test_concurrent(self):
        self.study_file({"baseline": "", "xsa": "-x 1"}, seeds=(1,))
        code, out = self.run_study()
        self.assertEqual(code, 0, out)
        sequential = {arm: self.losses(self.path("out", arm, "seed_1")) for arm in ("baseline", "xsa")}
        with open(self.path("study.json")) as f:
            spec = json.load(f)
        spec["concurrent"] = 2
        self.write("study.json", json.dumps(spec))
        code, out = run(STUDY + [self.path("study.json"), "--binary", binary("train_gpt_cpu"), "--out", self.path("side")])
        with self.subTest("concurrent 2: both runs start at once, each on its own GPU slot, with the sequential runs' losses"):
            self.assertEqual(code, 0, out)
            starts = [l for l in out.splitlines() if l.startswith("study: starting")]
            self.assertTrue(len(starts) == 2 and "baseline seed 1 (CUDA_VISIBLE_DEVICES=0)" in starts[0] and
                            "xsa seed 1 (CUDA_VISIBLE_DEVICES=1)" in starts[1], out)
            for arm in ("baseline", "xsa"):
                self.assertEqual(self.losses(self.path("side", arm, "seed_1")), sequential[arm])
        spec["concurrent"] = 0
        self.write("study.json", json.dumps(spec))
        check_one_error(self, STUDY + [self.path("study.json")], "'concurrent' must be a whole number >= 1", anywhere=True)

    def test_drain(self):
        """SIGUSR1 to the runner: the running run finishes, no new one starts, the report is written, exit 0; a rerun
        goes on. The trainer is held at its start (a stand-in waits for a file, then runs the real trainer), so the
        signal always comes while the first run runs."""
        self.study_file({"baseline": "", "xsa": "-x 1"}, seeds=(1,))
        self.write("held_trainer", "#!/bin/sh\nwhile [ ! -e '%s' ]; do sleep 0.05; done\nexec '%s' \"$@\"\n"
                   % (self.path("go"), binary("train_gpt_cpu")))
        os.chmod(self.path("held_trainer"), 0o755)
        argv = STUDY + [self.path("study.json"), "--binary", self.path("held_trainer"), "--out", self.path("out"), "--no-plots"]
        proc = subprocess.Popen(argv, cwd=xsatest.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGUSR1)
        proc.send_signal(signal.SIGUSR1)  # (a second one changes nothing)
        self.write("go", "")
        out = first + proc.stdout.read()
        code = proc.wait()
        with self.subTest("drained: the running run finishes, the next does not start, the report of the finished run"):
            self.assertTrue(code == 0 and first.startswith("study: starting baseline seed 1") and out.count("study: starting") == 1, out)
            self.assertEqual(out.count("study: SIGUSR1: no new run starts; the running ones finish, then the report"), 1, out)
            self.assertEqual(study.run_state(self.path("out", "baseline", "seed_1")), "done")
            self.assertIn("Finished runs: baseline 1/1, xsa 0/1", xsatest.read(self.path("out", "report.md")).decode())
        code, out = run(argv)
        with self.subTest("rerun: the run the drain left"):
            self.assertTrue(code == 0 and [l.split(":")[1].strip() for l in out.splitlines() if l.startswith("study: starting")] ==
                            ["starting xsa seed 1"], out)

    def test_sft_stage(self):
        sft = "--sft dev/data/sft_mini_tokens -n 3 --eval-every 3 --eval-tokens 1024 --chatcore-max-cat 4 --chatcore-max-sample 1"
        self.write("study.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": "", "xsa": "-x 1"}, "seeds": [1], "sft": sft}))
        code, out = self.run_study()
        starts = [l.split(":")[1].strip() for l in out.splitlines() if l.startswith("study: starting")]
        with self.subTest("'sft': each finished run is then fine-tuned from its last checkpoint into its sft/ directory"):
            self.assertTrue(code == 0 and starts == ["starting baseline seed 1", "starting xsa seed 1", "starting baseline seed 1 SFT",
                                                     "starting xsa seed 1 SFT"] and "--init-from" in out and
                            os.path.exists(self.path("out", "xsa", "seed_1", "sft", "ckpt_000003.safetensors")), out)
        report = xsatest.read(self.path("out", "report.md")).decode()
        with self.subTest("the report has the SFT val bpb and ChatCORE of every arm"):
            unpaired = section(report, "Per arm, unpaired")
            for metric in ("SFT val bpb", "ChatCORE"):
                self.assertTrue(row(unpaired, metric, "baseline")[2] == "1" and row(unpaired, metric, "xsa")[2] == "1", report)
        code, out = self.run_study()
        with self.subTest("rerun: nothing left to run"):
            self.assertTrue(code == 0 and "study: starting" not in out and "study: resuming" not in out, out)
        self.write("study.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": ""}, "seeds": [1], "sft": "-n 3"}))
        check_one_error(self, STUDY + [self.path("study.json")], "'sft' must be a string of chat_sft flags with --sft DIR", anywhere=True)
        self.write("study.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": ""}, "seeds": [1], "sft": sft + " --init-from x"}))
        check_one_error(self, STUDY + [self.path("study.json")], "'sft' sets --init-from", anywhere=True)

    def test_committed_study_files(self):
        for path in sorted(os.listdir(os.path.join(xsatest.REPO, "dev", "studies"))):
            if path.endswith(".json"):
                with self.subTest("dev/studies/%s is a valid study file" % path):
                    study.load_study(os.path.join(xsatest.REPO, "dev", "studies", path))

    def test_trainer_killed_crashed_or_not_a_trainer(self):
        """A run that crashes (SIGSEGV) fails the study with one error naming the signal and its log; one killed by
        SIGKILL (kill -9, the out-of-memory killer) stops it with a line saying to rerun, no error; one that exits 0
        without its last evaluation (not the trainer) is an error, not a finished run; stand-in trainers."""
        self.study_file({"baseline": ""}, seeds=(1,))
        for name, script in (("crashed", "kill -SEGV $$"), ("killed", "kill -KILL $$"), ("not_a_trainer", "exit 0")):
            self.write(name, "#!/bin/sh\necho starting\n%s\n" % script)
            os.chmod(self.path(name), 0o755)
        check_one_error(self, STUDY + [self.path("study.json"), "--binary", self.path("crashed"), "--out", self.path("out")],
                        "baseline seed 1 died of SIGSEGV; its output is in %s" % self.path("out", "baseline", "seed_1.log"), anywhere=True)
        code, out = run(STUDY + [self.path("study.json"), "--binary", self.path("killed"), "--out", self.path("out")])
        self.assertEqual(code, 130, out)
        self.assertIn("study: baseline seed 1 was killed (SIGKILL: kill -9, or the kernel short of memory); rerun the same command to go "
                      "on from its last checkpoint", out)
        self.assertNotIn("error", out)
        check_one_error(self, STUDY + [self.path("study.json"), "--binary", self.path("not_a_trainer"), "--out", self.path("out")],
                        "baseline seed 1 exited 0 without finishing (no evaluation at its last step in %s: is the binary the trainer?)"
                        % self.path("out", "baseline", "seed_1", "metrics.jsonl"), anywhere=True)

    def test_refusals(self):
        self.study_file({"baseline": "", "longer": "-n 8"})
        check_one_error(self, STUDY + [self.path("study.json")], "arm 'longer' sets -n; arms may set only", anywhere=True)
        self.study_file({"baseline": ""}, base=BASE + " --seed 3")
        check_one_error(self, STUDY + [self.path("study.json")], "'base' sets --seed", anywhere=True)
        refusals = [({"arm_seeds": {"baseline": [2]}, "seeds": [1]}, "'arm_seeds' of 'baseline' must be distinct seeds taken from 'seeds' [1]"),
                    ({"groups": {"d2": "-d 2 -x 1"}}, "group 'd2' sets -x, an arm's flag"),
                    ({"groups": {"d2": "-d 2 --seed=4"}}, "group 'd2' sets --seed; the runner sets"),
                    ({"core_final": "--max 5"}, "'core_final' must be a string of eval_core flags with -c DIR"),
                    ({"groups": {"a/b": "-d 2"}}, "group 'a/b' must be a name of letters"),
                    ({"groups": {}}, "'groups' must be a non-empty object"),
                    ({"primary": "loss"}, "'primary' must be one of val_bpb, best_val_bpb, train_loss, core, core_final, cos_zv"),
                    ({"primary": "chatcore"}, "'primary' must be one of"),
                    ({"claims": {"xsa": "baseline"}}, "'claims' must be an object"),
                    ({"claims": {"learnable": "x"}}, "'claims' must be an object"),
                    ({"claims": {"xsa": ["baseline"]}}, "'claims' must be an object"),
                    ({"name": "../elsewhere"}, "'name' must be letters, digits and _.+- (it names the study's default directory), not '../elsewhere'"),
                    ({"arm_seeds": {"baseline": [[1]]}}, "'arm_seeds' of 'baseline' must be distinct seeds"),
                    ({"base": BASE + " -o 'x"}, "'base' cannot be split into words (No closing quotation)"),
                    ({"arms": {"baseline": "-x \"1"}}, "arm 'baseline' cannot be split into words (No closing quotation)"),
                    ({"groups": {"d2": "-d '2"}}, "group 'd2' cannot be split into words (No closing quotation)"),
                    ({"core_final": "-c 'x"}, "'core_final' cannot be split into words"),
                    ({"sft": "--sft 'x"}, "'sft' cannot be split into words")]
        for extra, expect in refusals:
            self.write("bad.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": ""}, "seeds": [1, 2], **extra}))  # extra wins
            check_one_error(self, STUDY + [self.path("bad.json")], expect, anywhere=True)
        check_one_error(self, STUDY + [self.path("study.json"), "--max-runs", "-2"], "--max-runs must be 0 or more (or -1: all), not -2",
                        anywhere=True)
        check_one_error(self, STUDY + [self.path("study.json"), "--max-runs", "x"],
                        "study.py: error: argument --max-runs: invalid int value: 'x' (see --help)", anywhere=True)
        self.write("bad.json", "{not json")
        check_one_error(self, STUDY + [self.path("bad.json")], "cannot read the study file", anywhere=True)
        # runs of one seed that differ in more than their arms set: a run line edited after the fact
        self.study_file({"baseline": "", "xsa": "-x 1"}, seeds=(1,))
        code, out = self.run_study()
        self.assertEqual(code, 0, out)
        path = self.path("out", "xsa", "seed_1", "metrics.jsonl")
        with open(path) as f:
            lines = f.readlines()
        first = json.loads(lines[0])
        first["total_batch"] = 256
        with open(path, "w") as f:
            f.writelines([json.dumps(first) + "\n"] + lines[1:])
        check_one_error(self, STUDY + [self.path("study.json"), "--out", self.path("out"), "--report-only"],
                        "seed 1: baseline and xsa differ in total_batch (128 vs 256), which their arms do not set", anywhere=True)
        first["total_batch"], first["data_seed"] = 128, 5  # a data order of its own: not a pair
        with open(path, "w") as f:
            f.writelines([json.dumps(first) + "\n"] + lines[1:])
        check_one_error(self, STUDY + [self.path("study.json"), "--out", self.path("out"), "--report-only"],
                        "seed 1: baseline and xsa differ in data_seed (0 vs 5)", anywhere=True)


if __name__ == "__main__":
    unittest.main()
