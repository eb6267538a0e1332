#!/usr/bin/env python3
"""The Python tools' command line (dev/xsa_cli.py): every tool a user runs ends a bad flag with one line,
"PROG: error: ... (see --help)", and exit code 1, as the C++ programs do; and no tool builds an argparse
parser of its own that would print its usage and exit with 2. Standard library only (the tools parse their
flags before they import anything heavy; the PyTorch benchmarks, which import torch first, are left to the
static check).

    python3 dev/test/test_cli.py        (or all suites: make test)
"""
import glob
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402
from xsatest import check_one_error  # noqa: E402

# the tools, each with the arguments it needs before the bad flag
TOOLS = [("dev/study.py", ["dev/studies/tiny.json"]), ("dev/compare_runs.py", ["a", "b"]), ("dev/plot_run.py", ["a"]),
         ("dev/speedrun.py", ["--depth", "4"]), ("dev/convert_nanochat.py", ["in", "dir", "-o", "out"]),
         ("dev/data/climbmix.py", []), ("dev/data/core.py", ["--bundle-zip", "--tokenizer", "t", "--out", "o"]),
         ("dev/data/sft.py", ["--tokenizer", "t", "--out", "o"]), ("dev/data/chat_eval.py", ["--tokenizer", "t", "--out", "o"]),
         ("dev/data/gcide.py", []), ("dev/bench/cpu_load.py", []), ("dev/bench/torch_gpu.py", []), ("dev/test/run_tests.py", [])]

# argparse parsers that may stay plain: helpers the tests and the build call, never a user
INTERNAL = {"dev/fuzz/make_seeds.py", "dev/fuzz/run_fuzz.py", "dev/reference/score_core.py", "dev/reference/score_chat.py",
            "dev/reference/make_nanochat_ckpt.py", "dev/data/make_devil.py", "dev/data/make_unicode_classes.py",
            "dev/cuda/arch_check.py", "dev/bench/bench_encode.py"}


class TestBadFlag(unittest.TestCase):
    def test_unknown_flag(self):
        for tool, args in TOOLS:
            check_one_error(self, [sys.executable, os.path.join(xsatest.REPO, tool)] + args + ["--bogus"],
                            "%s: error: unrecognized arguments: --bogus (see --help)" % os.path.basename(tool), what=tool, anywhere=True)

    def test_no_plain_parsers(self):
        """Every tool outside INTERNAL builds its parser with xsa_cli (a plain argparse parser exits 2 with its usage)."""
        plain = []
        for path in glob.glob(os.path.join(xsatest.REPO, "dev", "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, xsatest.REPO)
            if rel not in INTERNAL and not os.path.basename(rel).startswith("test_"):
                with open(path, encoding="utf-8") as f:
                    if re.search(r"\bargparse\.ArgumentParser\(", f.read()):
                        plain.append(rel)
        self.assertEqual(plain, [], "these build a plain argparse parser; use xsa_cli.ArgumentParser")


if __name__ == "__main__":
    unittest.main()
