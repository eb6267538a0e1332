"""dev/study.py: its statistics against scipy on fixed numbers; the runner on a tiny study (every run
trained once, skipped when complete, resumed from a checkpoint bit-identically, --max-runs), and its
refusals (arms that set more than XSA or the optimizer, a base that sets the seed, runs that are not
matched). Run with `make test`."""
import json
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test"))
import study  # noqa: E402
import xsatest  # noqa: E402
from xsatest import binary, check_one_error, needs_packages, run  # noqa: E402

STUDY = [sys.executable, "dev/study.py"]
BASE = ("-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 -n 6 --warmup-steps 2 --eval-every 3 --eval-tokens 256 --sample-every -1 "
        "--core-every -1 --save-every 3")


@needs_packages("scipy")
class TestStatistics(unittest.TestCase):
    def test_against_scipy(self):
        from scipy import stats
        for t, df in ((0.5, 3), (2.0, 10), (2.571, 5), (4.3, 2.7), (1.0, 1), (12.0, 30.5)):
            with self.subTest("two-sided p of t %g, df %g" % (t, df)):
                self.assertAlmostEqual(study.t_two_sided_p(t, df), 2 * stats.t.sf(t, df), delta=1e-10)
            with self.subTest("97.5%% quantile, df %g" % df):
                self.assertAlmostEqual(study.t_quantile(0.975, df), stats.t.ppf(0.975, df), delta=1e-8)
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
        self.assertIsNone(study.welch([1.0], [2.0, 3.0]))


@needs_packages("matplotlib")
class TestStudyPlots(xsatest.TempDirTest):
    PREFIX = "xsa_study_plots_"

    def test_plots(self):
        self.write("study.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": "", "xsa": "-x 1", "learn": "-x learn"},
                                             "seeds": [1, 2], "arm_seeds": {"learn": [2]}}))
        code, out = run(STUDY + [self.path("study.json"), "--binary", binary("train_gpt_cpu"), "--out", self.path("out")])
        self.assertEqual(code, 0, out)
        report = xsatest.read(self.path("out", "report.md")).decode()
        with self.subTest("arm_seeds: the learnable arm ran seed 2 only; its learned alpha is a metric of the report"):
            self.assertEqual(out.count("study: starting"), 5, out)
            self.assertIn("Finished runs: baseline 2/2, xsa 2/2, learn 1/1", report)
            self.assertRegex(report, r"## learned alpha \(mean over layers and heads\)\n\n.*\n.*\n\| baseline \| 0 \| n/a .*\n.*\n\| learn \| 1 \| -?0\.\d{4} ")
        # figure size (inches) x 100 dpi, as plot_study draws them
        for name, size in (("loss.png", (1200, 450)), ("val_bpb.png", (1200, 450)), ("diagnostics.png", (1500, 450)), ("alpha.png", (600, 450)),
                           ("cost.png", (700, 450))):
            with self.subTest("%s: a whole PNG of %dx%d pixels, linked from the report" % (name, *size)):
                data = xsatest.read(self.path("out", name))
                self.assertTrue(data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == size, name)
                self.assertIn("![%s](%s)" % (name, name), xsatest.read(self.path("out", "report.md")).decode())


class TestRunner(xsatest.TempDirTest):
    PREFIX = "xsa_study_"

    def study_file(self, arms, base=BASE, seeds=(1, 2)):
        self.write("study.json", json.dumps({"name": "t", "base": base, "arms": arms, "seeds": list(seeds)}))
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
        with self.subTest("the report: every metric, n per arm, a CI and a p-value for xsa"):
            self.assertIn("Finished runs: baseline 2/2, xsa 2/2", report)
            rows = [l for l in report.splitlines() if l.startswith("| xsa | 2 |")]
            self.assertEqual(len(rows), 5, report)  # no CORE here (--core-every -1): 5 of the 6 metrics
            self.assertTrue(all(l.count("[") == 1 for l in rows[:4]), report)
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
            for metric in ("SFT val bpb", "ChatCORE"):
                section = report.split("## " + metric + "\n", 1)[-1].split("\n## ", 1)[0]
                self.assertTrue("| baseline | 1 |" in section and "| xsa | 1 |" in section, report)
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

    def test_refusals(self):
        self.study_file({"baseline": "", "longer": "-n 8"})
        check_one_error(self, STUDY + [self.path("study.json")], "arm 'longer' sets -n; arms may set only", anywhere=True)
        self.study_file({"baseline": ""}, base=BASE + " --seed 3")
        check_one_error(self, STUDY + [self.path("study.json")], "'base' sets --seed", anywhere=True)
        self.write("bad.json", json.dumps({"name": "t", "base": BASE, "arms": {"baseline": ""}, "seeds": [1], "arm_seeds": {"baseline": [2]}}))
        check_one_error(self, STUDY + [self.path("bad.json")], "'arm_seeds' of 'baseline' must be distinct seeds taken from 'seeds' [1]", anywhere=True)
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


if __name__ == "__main__":
    unittest.main()
