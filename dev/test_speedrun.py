"""dev/speedrun.py end to end, offline, on a CPU: the five stages (data, CORE tasks, SFT data, ChatCORE tasks,
the study with its base runs, SFT + ChatCORE, full CORE and report) on offline fixtures (the parquet files of
dev/data/make_test_parquet.py, the committed mini bundles dev/data/core_bundle, sft_mini and chat_bundle) and a
tiny model (-d 1, dim 32, 4 steps) through --cpu; then the same command again, which must run nothing; --dry-run
before and after, which must print the commands and write nothing; a SIGTERM passed on to the study, which
stops with a checkpoint and resumes on the same command; and bad inputs, each one error line. About 20-40 s on
a 2-core machine. Run with `make test`, or build/venv/bin/python dev/test_speedrun.py (the data stages need
rustbpe, tiktoken, pyarrow and numpy: dev/requirements.txt)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "test"))
import xsatest  # noqa: E402
from xsatest import REPO, binary, check_one_error, needs_packages, run  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # (run_tests.py sets it too: a spinning OpenMP thread on a busy machine is slow)
SPEEDRUN = [sys.executable, "dev/speedrun.py"]
TRAIN = "--dim 32 --heads 2 -t 128 -b 2 -B 256 --warmup-steps 1 --eval-tokens 512 --sample-every -1"
TINY = ["--depth", "1", "--seeds", "1", "--ranks", "1", "--cpu", "--vocab-size", "512",
        "--extra-flags=" + TRAIN + " -n 4 --eval-every 2 --save-every 2",
        "--sft-flags=-n 2 --eval-every 2 --eval-tokens 512 --chatcore-max-cat 4 --chatcore-max-sample 1",
        "--prep-flags", "sft_data=--simple-spelling 20 --spelling-bee 10"]
STAGES = ["data", "core_tasks", "sft_data", "chat_tasks", "study"]


def make_fixtures(directory):
    """The offline sources: DIR/parquet (make_test_parquet.py's three files), DIR/core_bundle, DIR/sft and DIR/chat
    (links to the committed mini bundles)."""
    code, out = run([sys.executable, "dev/data/make_test_parquet.py", os.path.join(directory, "parquet")])
    assert code == 0, out
    for name in os.listdir(os.path.join(directory, "parquet")):
        if not name.endswith(".parquet"):  # (its expected_*.jsonl files)
            os.remove(os.path.join(directory, "parquet", name))
    for link, target in (("core_bundle", "core_bundle"), ("sft", "sft_mini"), ("chat", "chat_bundle")):
        os.symlink(os.path.join(REPO, "dev", "data", target), os.path.join(directory, link))


def snapshot(*roots):
    """{path: (size, mtime_ns)} of every file under the roots."""
    files = {}
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                st = os.stat(os.path.join(d, n))
                files[os.path.join(d, n)] = (st.st_size, st.st_mtime_ns)
    return files


def stage_lines(out, word):
    """The stages of the speedrun's lines that contain `word` ("running", "skipped"), in order."""
    return [l.split()[3].rstrip(":") for l in out.splitlines() if l.startswith("speedrun: stage ") and word in l]


@needs_packages("rustbpe", "tiktoken", "pyarrow", "numpy")
class TestSpeedrun(unittest.TestCase):
    """One sequence, run once for the class: --dry-run on nothing, the speedrun, the same command again,
    --dry-run on the finished study."""

    @classmethod
    def setUpClass(cls):
        for name in ("train_gpt_cpu", "chat_sft", "eval_core"):
            binary(name)
        cls.dir = tempfile.mkdtemp(prefix="xsa_test_speedrun_")
        cls.fixtures, cls.data, cls.out = (os.path.join(cls.dir, n) for n in ("fixtures", "data", "out"))
        os.makedirs(cls.fixtures)
        make_fixtures(cls.fixtures)
        cls.cmd = SPEEDRUN + TINY + ["--offline-fixtures", cls.fixtures, "--data-dir", cls.data, "--out", cls.out]
        cls.dry_before = run(cls.cmd + ["--dry-run"])
        cls.made_by_dry_run = [p for p in (cls.data, cls.out) if os.path.exists(p)]
        t0 = time.time()
        cls.first = run(cls.cmd)
        cls.first_s = time.time() - t0
        cls.after_first = snapshot(cls.data, cls.out)
        cls.second = run(cls.cmd)
        cls.after_second = snapshot(cls.data, cls.out)
        cls.dry_after = run(cls.cmd + ["--dry-run"])
        cls.after_dry = snapshot(cls.data, cls.out)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.data, *parts)

    def test_dry_run_before(self):
        """--dry-run on nothing: every stage to do, its commands, the trainer's plan and estimates; writes nothing"""
        code, out = self.dry_before
        self.assertEqual(code, 0, out)
        for k, stage in enumerate(STAGES, 1):
            self.assertIn(f"stage {k}/5 {stage}: ", out)
        self.assertEqual(out.count(": to do ("), 5, out)
        for command in ("dev/data/climbmix.py --parquet-dir", "--max-per-task 500", "--verify-shard", "dev/data/sft.py --mixture study",
                        "--simple-spelling 20", "dev/data/chat_eval.py --spellingbee", "dev/study.py", "$ ./train_gpt_cpu -d 1 --muon-eq 0",
                        "-x 1.0 --seed 1 -o", "$ ./chat_sft --sft", "--init-from", "$ ./eval_core -e"):
            self.assertIn(command, out)
        for text in ("ESTIMATES", "| memory plan", "| plan: ", "disk", "memory:", "time:"):
            self.assertIn(text, out)
        self.assertEqual(self.made_by_dry_run, [], "--dry-run wrote these")

    def test_stages_ran(self):
        """the speedrun: every stage ran, in order, and left its outputs"""
        code, out = self.first
        self.assertEqual(code, 0, out)
        self.assertEqual(stage_lines(out, "running"), ["data", "core_tasks", "core_tasks", "sft_data", "chat_tasks", "study"], out)
        self.assertIn("speedrun: every stage is done; the report:", out)
        for f in ("tokenizer.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin", "train_000001.bin.rowgroups",
                  "val_000000.bin.rowgroups", "core_tasks_500/index.txt", "core_tasks/index.txt", "sft/sft_train.bin",
                  "sft/sft_val.bin", "sft/sft_meta.json", "chat_tasks/index.txt", "chat_tasks/06_SpellingBee.bin"):
            self.assertTrue(os.path.isfile(self.path(f)), f)
        self.assertEqual(json.loads(xsatest.read(self.path("sft", "sft_meta.json")))["mixture"], "study")
        spec = json.loads(xsatest.read(os.path.join(self.out, "study.json")))
        for flag in ("-d 1 ", "--muon-eq 0 --muon-plus 0", "--ranks 1", "--keep-checkpoints 2",
                     "--core-tasks " + self.path("core_tasks_500")):
            self.assertIn(flag, spec["base"])
        self.assertEqual((spec["arms"], spec["seeds"], spec["core_final"]),
                         ({"baseline": "", "xsa": "-x 1.0"}, [1], "-c " + self.path("core_tasks")))
        self.assertTrue(spec["sft"].startswith("--sft " + self.path("sft") + " --chatcore-tasks " + self.path("chat_tasks")), spec["sft"])
        for arm in ("baseline", "xsa"):
            run_dir = os.path.join(self.out, arm, "seed_1")
            for f in ("metrics.jsonl", "ckpt_000004.safetensors", "core_final.csv", "sft/metrics.jsonl", "sft/ckpt_000002.safetensors"):
                self.assertTrue(os.path.isfile(os.path.join(run_dir, f)), os.path.join(arm, f))
        print(f"\n(the speedrun took {self.first_s:.1f} s)", file=sys.stderr)

    def test_report(self):
        """the report compares both arms, with CORE on all items, SFT val bpb and ChatCORE"""
        report = xsatest.read(os.path.join(self.out, "report.md")).decode()
        for text in ("# Study: speedrun_d1", "**baseline**", "**xsa**", "CORE, all items", "SFT val bpb", "ChatCORE",
                     "Written by dev/speedrun.py"):
            self.assertIn(text, report)

    def test_rerun_runs_nothing(self):
        """the same command again: every stage skipped, no file written or changed"""
        code, out = self.second
        self.assertEqual(code, 0, out)
        self.assertEqual(stage_lines(out, "running"), [], out)
        self.assertEqual(stage_lines(out, "skipped"), ["data", "core_tasks", "core_tasks", "sft_data", "chat_tasks", "study"], out)
        self.assertFalse([l for l in out.splitlines() if not l.startswith("speedrun: ")], out)  # no script, no study.py
        self.assertEqual(self.after_first, self.after_second)

    def test_dry_run_after(self):
        """--dry-run on the finished study: every stage done, nothing to run, nothing written"""
        code, out = self.dry_after
        self.assertEqual(code, 0, out)
        self.assertEqual(out.count(": DONE, skipped ("), 5, out)
        self.assertIn("every stage is done: nothing to run", out)
        self.assertNotIn("study.py writes", out)
        self.assertEqual(self.after_second, self.after_dry)

    def test_failing_stage(self):
        """a stage that fails stops the speedrun: one error line naming the stage, its command and the command to rerun"""
        tmp = tempfile.mkdtemp(prefix="xsa_test_speedrun_", dir=self.dir)
        data, fixtures = os.path.join(tmp, "data"), os.path.join(tmp, "fixtures")
        shutil.copytree(self.data, data)
        shutil.rmtree(os.path.join(data, "sft"))
        os.makedirs(os.path.join(fixtures, "sft"))  # SFT sources without their files
        for name in ("parquet", "core_bundle", "chat"):
            os.symlink(os.path.join(self.fixtures, name), os.path.join(fixtures, name))
        code, err = run(SPEEDRUN + TINY + ["--offline-fixtures", fixtures, "--data-dir", data, "--out", os.path.join(tmp, "out")],
                        want_stdout=False)
        last = err.rstrip("\n").split("\n")[-1]
        self.assertEqual(code, 1, err)
        self.assertTrue(last.startswith("speedrun.py: error: stage 3/5 sft_data failed (exit 1): ") and
                        "dev/data/sft.py --mixture study" in last and "rerun: python3 dev/speedrun.py --depth 1" in last, err)
        self.assertFalse(os.path.exists(os.path.join(tmp, "out")), "the study ran after a failed stage")

    def test_signal(self):
        """SIGTERM during the study reaches the trainer, which checkpoints; the speedrun names the stage and the command
        to rerun, exits 143; the same command resumes the run from its checkpoint and finishes"""
        out_dir = os.path.join(self.dir, "out_signal")
        longer = "--extra-flags=" + TRAIN + " -n 300 --eval-every 100 --save-every 100"
        cmd = (SPEEDRUN + [longer if a.startswith("--extra-flags=") else a for a in TINY] +
               ["--offline-fixtures", self.fixtures, "--data-dir", self.data, "--out", out_dir])
        metrics = os.path.join(out_dir, "baseline", "seed_1", "metrics.jsonl")
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None:  # the trainer is training: its metrics have step lines
                if xsatest.read(metrics).count(b'"kind": "train"') >= 5:
                    break
                time.sleep(0.05)
            p.send_signal(signal.SIGTERM)
            out = p.communicate(timeout=120)[0].decode("utf-8", "replace")
        finally:
            if p.poll() is None:
                p.kill()
        self.assertEqual(p.returncode, 143, out)
        self.assertIn("speedrun: stopped by SIGTERM in stage study; rerun the same command to go on: python3 dev/speedrun.py", out)
        ckpts = [n for n in os.listdir(os.path.dirname(metrics)) if n.startswith("ckpt_")]
        self.assertTrue(ckpts, out)
        code, out = run(cmd)
        self.assertEqual(code, 0, out)
        self.assertIn("study: resuming baseline seed 1", out)
        self.assertTrue(os.path.isfile(os.path.join(out_dir, "report.md")), out)


class TestSpeedrunErrors(unittest.TestCase):
    """Bad inputs: one "error:" line, exit code 1, nothing run."""

    def test_bad_flags(self):
        """bad flags and values: one error line each"""
        tmp = tempfile.mkdtemp(prefix="xsa_test_speedrun_")
        self.addCleanup(shutil.rmtree, tmp, True)
        where = ["--data-dir", os.path.join(tmp, "data"), "--out", os.path.join(tmp, "out")]
        cases = [([], "the following arguments are required: --depth"),
                 (["--depth", "x"], "argument --depth: invalid int value: 'x'"),
                 (["--depth", "0"], "--depth must be >= 1"),
                 (["--depth", "24", "--seeds", "1,1"], "--seeds must be distinct"),
                 (["--depth", "24", "--seeds", "a"], "--seeds must be comma-separated whole numbers"),
                 (["--depth", "24", "--xsa", "2"], "--xsa must be an alpha in (0, 1] or learn"),
                 (["--depth", "24", "--ranks", "0"], "--ranks must be >= 1"),
                 (["--depth", "24", "--num-shards", "0"], "--num-shards must be in 1..6542"),
                 (["--depth", "24", "--vocab-size", "100"], "--vocab-size must be >= 266"),
                 (["--depth", "24", "--bogus"], "unrecognized arguments: --bogus"),
                 (["--depth", "24", "--extra-flags=-x 0.5"], "--extra-flags sets -x, which the speedrun sets itself"),
                 (["--depth", "24", "--extra-flags=--seed 3"], "--extra-flags sets --seed"),
                 (["--depth", "24", "--extra-flags=--tokenizer t.bin"], "--extra-flags sets --tokenizer"),
                 (["--depth", "24", "--extra-flags=-n 0"], "--extra-flags sets -n 0: the runs need at least 1 step"),
                 (["--depth", "24", "--sft-flags=--init-from x"], "--sft-flags sets --init-from"),
                 (["--depth", "24", "--prep-flags", "tokenizer=--x"], "--prep-flags takes STAGE=FLAGS"),
                 (["--depth", "24", "--offline-fixtures", os.path.join(tmp, "none")], "no such directory"),
                 (["--depth", "24", "--offline-fixtures", tmp, "--num-shards", "3"], "--num-shards with --offline-fixtures"),
                 (["--depth", "24", "--offline-fixtures", tmp], "no parquet/ in it")]
        if os.access(os.path.join(REPO, "train_gpt_cpu"), os.X_OK):  # the trainer's own refusal of a flag, from its plan
            cases.append((["--depth", "1", "--cpu", "--ranks", "1", "--dry-run", "--extra-flags=--bogus 3"],
                          "the trainer refuses the study's flags (./train_gpt_cpu ... -n 0): error: unknown option '--bogus'"))
        if not os.path.exists(os.path.join(REPO, "train_gpt")):  # (where it is built, this would start the study's downloads)
            cases.append((["--depth", "24"], "not built: ./train_gpt"))
        for args, expect in cases:
            check_one_error(self, SPEEDRUN + args + where, expect, anywhere=True)
        self.assertFalse(os.path.exists(os.path.join(tmp, "data")) or os.path.exists(os.path.join(tmp, "out")))

    def test_other_study_in_out(self):
        """an --out that holds a study file of other settings is refused (a study grows only by seeds)"""
        tmp = tempfile.mkdtemp(prefix="xsa_test_speedrun_")
        self.addCleanup(shutil.rmtree, tmp, True)
        os.makedirs(os.path.join(tmp, "out"))
        with open(os.path.join(tmp, "out", "study.json"), "w") as f:
            json.dump({"name": "speedrun_d24", "base": "-d 24", "arms": {"baseline": "", "xsa": "-x 1.0"}, "seeds": [1]}, f)
        where = ["--data-dir", os.path.join(tmp, "data"), "--out", os.path.join(tmp, "out")]
        check_one_error(self, SPEEDRUN + ["--depth", "24", "--dry-run"] + where, "is another study ('base' was", anywhere=True)

    def test_dry_run_d24(self):
        """--dry-run --depth 24 --ranks 8 with nothing prepared: README's 120 shards, the downloads, the six runs with their
        SFT and full CORE, the trainer's d24 plan and the estimates from it"""
        if not os.access(os.path.join(REPO, "train_gpt_cpu"), os.X_OK):
            self.skipTest("./train_gpt_cpu is not built (make train_gpt_cpu)")
        tmp = tempfile.mkdtemp(prefix="xsa_test_speedrun_")
        self.addCleanup(shutil.rmtree, tmp, True)
        code, out = run(SPEEDRUN + ["--depth", "24", "--ranks", "8", "--cpu", "--dry-run", "--data-dir", os.path.join(tmp, "data"),
                                    "--out", os.path.join(tmp, "out")])
        self.assertEqual(code, 0, out)
        for text in ("dev/data/climbmix.py --num-shards 120 --data-dir", "core.py --bundle-zip", "| model: depth 24, dim 1024",
                     "vocab 32768", "| plan: 3840 steps x 1048576 tokens", "disk (estimate): 12.1 GB of parquet",
                     "--ranks 8 --save-every 500 --keep-checkpoints 2", "-x 1.0 --seed 3 -o", "ckpt_003840.safetensors",
                     "to do: data, core_tasks, sft_data, chat_tasks, study"):
            self.assertIn(text, out)
        self.assertEqual(out.count("$ ./train_gpt_cpu -d 24"), 6, out)
        self.assertEqual(os.listdir(tmp), [])


if __name__ == "__main__":
    unittest.main()
