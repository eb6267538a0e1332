#!/usr/bin/env python3
"""dev/bench/torch_gpu.py, the PyTorch baseline of the GPU benchmark, on the CPU at its tiny shape (--tiny:
2 layers, dim 128, T 128, fp32): the output's format, every number positive and consistent (tok/s = rows x T
/ seconds per micro-step, TFLOP/s and MFU from the FLOPs per token), the FLOPs per token counted as
train_gpt.cu counts them, a run that overruns its cap reported as such, and --compare's table.

    python3 dev/bench/test_torch_gpu.py        (or all suites: make test)

The tiny run needs an interpreter that imports torch (xsatest.torch_python: /usr/bin/python3 with Debian's
python3-torch, this one, or python3 on the PATH); those tests skip only when none does, saying so, and fail in
CI (.ci/run installs python3-torch). The FLOP counts and --compare need no torch. About 5-10 s on a 2-core
machine.
"""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/test")
import xsatest  # noqa: E402
from xsatest import REPO  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpu  # noqa: E402  (standard library at import: torch only in its children)

SCRIPT = os.path.join(REPO, "dev", "bench", "torch_gpu.py")
PYTHON, TRIED = xsatest.torch_python()
NEEDS_TORCH = xsatest.needs_torch(PYTHON, TRIED)


def run_tiny(*extra):
    """(exit code, output, the torch_gpu_json object or None) of torch_gpu.py --tiny on one thread."""
    p = subprocess.run([PYTHON, SCRIPT, "--tiny", "--threads", "1", *extra], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode(errors="replace")
    lines = [line for line in out.splitlines() if line.startswith(torch_gpu.JSON_TAG)]
    return p.returncode, out, json.loads(lines[-1][len(torch_gpu.JSON_TAG):]) if lines else None


class TestFlops(unittest.TestCase):
    def test_flops_per_token_as_train_gpt(self):
        """FLOPs per token as train_gpt.cu's flops_per_token: nanochat's d12 and d24 (heads of 128: test_xsa.cu's
        values), this project's d24 (performance.md's 2.2775e9: 6 x 335.5M + 264M), the tiny shape by hand."""
        def count(layers, dim, heads, head_dim):
            return torch_gpu.flop_count(dict(layers=layers, dim=dim, heads=heads, head_dim=head_dim, seq_len=2048,
                                             vocab=32768, short_window=512))[2]
        self.assertEqual(count(12, 768, 6, 128), 759696048)
        self.assertEqual(count(24, 1536, 12, 128), 4775225616)
        self.assertEqual(torch_gpu.flop_count(torch_gpu.shape("d24")), (335546648, 264241152, 2277521040))
        self.assertEqual(torch_gpu.windows(torch_gpu.shape("d12")), [512, 512, 512, 2048] * 3)
        # tiny: 2 layers of 4 x 128 x 128 + 8 x 128^2, ve_gate 12 x 2 on layer 1, lm_head 512 x 128, smear 24;
        # attention 12 x 2 x 64 x (32 + 128)
        self.assertEqual(torch_gpu.flop_count(torch_gpu.shape("tiny")),
                         (2 * (4 * 128 * 128 + 8 * 128 * 128) + 24 + 512 * 128 + 24, 12 * 2 * 64 * 160,
                          6 * 458800 + 245760))


@NEEDS_TORCH
class TestTiny(unittest.TestCase):
    def test_tiny_run(self):
        """--tiny on the CPU: header (torch, CUDA, device), one line per run, the JSON line; tok/s = rows x T /
        seconds per micro-step, TFLOP/s and MFU from the counted FLOPs; the line and the JSON agree."""
        code, out, report = run_tiny()
        self.assertEqual(code, 0, out)
        self.assertRegex(out, r"(?m)^torch \S+, CUDA \S+, python \S+, CPU$")
        self.assertIn("the optimizer excluded", out)
        self.assertRegex(out, r"(?m)^device: cpu \(1 threads\); [0-9.]+ s in all$")
        self.assertIsNotNone(report, out)
        self.assertTrue(report["complete"])
        self.assertEqual(report["device"], "cpu (1 threads)")
        self.assertEqual(len(report["runs"]), 1, out)
        r = report["runs"][0]
        self.assertEqual((r["config"], r["mode"], r["rows"], r["T"], r["dtype"]), ("tiny", "eager", 2, 128, "fp32"))
        self.assertEqual(r["flops_per_token"], 2998560)
        for key in ("ms", "ms_min", "tok_s", "tflops", "mfu", "loss", "first_step_s", "params"):
            self.assertGreater(r[key], 0, key)
        self.assertLessEqual(r["ms_min"], r["ms"])
        self.assertAlmostEqual(r["tok_s"], r["rows"] * r["T"] / (r["ms"] / 1e3), delta=1e-9 * r["tok_s"])
        self.assertAlmostEqual(r["tflops"], r["tok_s"] * r["flops_per_token"] / 1e12, delta=1e-9 * r["tflops"])
        self.assertAlmostEqual(r["mfu"], r["tflops"] / report["peak_tflops"], delta=1e-9 * r["mfu"])
        m = re.search(r"(?m)^tiny eager +\((\w+)\): rows 2 x 128 \| ([0-9.]+) ms per micro-step \(min [0-9.]+\) \| ([0-9,.]+) tok/s", out)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(1), r["attention"])
        self.assertEqual(m.group(2), "%.2f" % r["ms"])
        self.assertEqual(m.group(3), "{:,.1f}".format(r["tok_s"]))
        if r["attention"] != "reference":  # torch >= 2.0: SDPA, checked against the reference attention
            self.assertLess(r["check"]["rel"], 1e-4, out)
        self.assertEqual(report["best"]["tiny"]["tok_s"], r["tok_s"])
        self.assertEqual([s["mode"] for s in report["skipped"]], ["compile"])  # on the CPU: eager only, said so
        self.assertRegex(out, r"(?m)^tiny compile: .*; eager only$")
        self.assertEqual(out.rstrip("\n").split("\n")[-1], "PyTorch best: tiny {:,.0f} tok/s, {:.1f} ms per micro-step of 2 rows, "
                         "MFU {:.1f}% (eager, {})".format(r["tok_s"], r["ms"], 100 * r["mfu"], r["attention"]))

    def test_over_the_cap(self):
        """A run past its cap is stopped and reported; the JSON still comes, the exit code is 1 (nothing ran)."""
        code, out, report = run_tiny("--eager-timeout", "0.05")
        self.assertEqual(code, 1, out)
        self.assertIn("tiny eager (", out)
        self.assertEqual(report["runs"], [], out)
        self.assertEqual(report["skipped"][0]["why"], "timed out after 0.05 s")
        self.assertTrue(out.endswith("PyTorch best: nothing ran\n"), out)


class TestCompare(xsatest.TempDirTest):
    def test_table(self):
        """--compare: ours (bench_fwdbwd_cuda's log) beside the PyTorch runs of the JSON line, the ratio against the
        fastest; a config without a run or a log says so."""
        run = dict(config="d24", mode="eager", attention="sdpa", rows=16, T=2048, ms=500.0, tok_s=65536.0, mfu=0.15,
                   flops_per_token=2277521040)
        fast = dict(run, mode="compile", attention="flex", rows=16, ms=250.0, tok_s=131072.0, mfu=0.30)
        report = dict(torch="2.11.0", cuda="12.8", device="NVIDIA H200", dtype="bf16", timed="forward + backward",
                      peak_tflops=989.0, runs=[run, fast], complete=True,
                      skipped=[dict(config="d12", mode="compile", attention="flex", why="timed out after 240 s")])
        torch_log = self.path("torch.log")
        with open(torch_log, "w") as f:
            f.write("torch 2.11.0 ...\n" + torch_gpu.JSON_TAG + json.dumps(report) + "\n")
        ours = self.path("bench_d24.log")
        with open(ours, "w") as f:
            f.write("params 772000000, batch 32 x 2048\nflops/token 2.2775e+09 (nanochat's: 6 x matmul params + attention)\n"
                    "ours tok/s 262144.0 ms/iter 250.000\n")
        p = subprocess.run([sys.executable, SCRIPT, "--compare", torch_log, "d24=" + ours, "d12=" + self.path("missing.log")],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("PyTorch 2.11.0 (CUDA 12.8) on NVIDIA H200", out)
        self.assertIn("| d24 | 32, 250.0 ms, 262,144, 60.4% | 16, 500.0 ms, 65,536, 15.0% (sdpa) | "
                      "16, 250.0 ms, 131,072, 30.0% (flex) | 2.00x (against compile) |", out)
        self.assertIn("| d12 | - (no 'ours tok/s' in %s) | - (not run) | - (timed out after 240 s) | - |" % self.path("missing.log"), out)


if __name__ == "__main__":
    unittest.main()
