#!/usr/bin/env python3
"""dev/gpu_check.sh's stage runner (dev/gpu_stage.sh), without a GPU: a stage that hangs is stopped at its
cap and reported, a failing stage is reported with its exit code and last line, the stages after them
still run, no stage runs past the whole budget, and the summary and the log archive are written after
every stage (so whatever ends a GPU call, what ran is there). And gpu_check.sh itself on a machine
without a GPU: the environment stage, then one line saying so, exit 0.

    python3 dev/test/test_gpu_check.py        (or all suites: make test)

Standard library only (and bash, tar, timeout).
"""
import os
import shutil
import subprocess
import sys
import tarfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import REPO  # noqa: E402


class TestStages(xsatest.TempDirTest):
    PREFIX = "xsa_gpu_check_"

    def test_caps_budget_summary(self):
        out, logs = self.path("out"), self.path("logs")
        script = """
            source dev/gpu_stage.sh
            stage hang 2 sleep 60
            stage fail 10 bash -c 'echo starting; echo boom; exit 3'
            stage ok 10 bash -c 'echo "rows so far: $(grep -c "^| [a-z]* | [A-Z]" "$OUT/summary.md")"'
            note measured "a row without a command"
            stage long 100 sleep 100
            stage late 10 echo never
        """
        env = dict(os.environ, OUT=out, LOGS=logs, BUDGET="12", RESERVE="2")
        t0 = time.time()
        proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        elapsed = time.time() - t0
        summary = xsatest.read(os.path.join(out, "summary.md")).decode()
        rows = {line.split("|")[1].strip(): line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| stage")}
        with self.subTest("a hanging stage is stopped at its cap and reported as a timeout"):
            self.assertIn("| TIMEOUT after 2 s (the cap)", rows.get("hang", ""), summary)
        with self.subTest("a failing stage: its exit code and last line; the stages after it still run"):
            self.assertIn("| FAIL (exit 3): boom |", rows.get("fail", ""), summary)
            self.assertIn("| PASS: rows so far: 2 |", rows.get("ok", ""), summary)  # the summary was already written
            self.assertIn("| a row without a command |", rows.get("measured", ""), summary)
        with self.subTest("no stage runs past the budget: the long one is cut at what is left, the next one skipped"):
            self.assertRegex(rows.get("long", ""), r"\| TIMEOUT after [5-8] s \(the cap\)")
            self.assertIn("| SKIPPED: the 12 s budget is spent |", rows.get("late", ""), summary)
            self.assertLess(elapsed, 12 + 5, proc.stdout.decode())
        with self.subTest("every log and the summary in one archive"):
            with tarfile.open(os.path.join(out, "gpu_check_logs.tar.gz")) as tar:
                names = sorted(os.path.basename(n) for n in tar.getnames() if n.endswith((".log", ".md")))
            self.assertEqual(names, ["fail.log", "hang.log", "long.log", "ok.log", "summary.md"])
            self.assertEqual(sorted(os.listdir(out)), ["gpu_check_logs.tar.gz", "summary.md"])

    def test_without_gpu(self):
        if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
            self.skipTest("this machine has nvidia-smi: gpu_check.sh would run the GPU stages")
        env = dict(os.environ, OUT=self.path("out"), PATH="/usr/bin:/bin")  # no nvidia-smi on this PATH
        proc = subprocess.run(["bash", "dev/gpu_check.sh"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        summary = xsatest.read(self.path("out", "summary.md")).decode()
        self.assertEqual(proc.returncode, 0, proc.stdout.decode())
        self.assertIn("| GPU stages | SKIPPED: no GPU on this machine |", summary)
        self.assertRegex(summary, r"\| env \| (PASS|FAIL)")


if __name__ == "__main__":
    unittest.main()
