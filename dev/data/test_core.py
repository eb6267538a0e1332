#!/usr/bin/env python3
"""Tests of dev/data/core.py: offline on the small bundle dev/data/core_bundle with the embedded tokenizer,
it reproduces the committed task files dev/data/core_tasks byte for byte. (Those files' contents are
checked against prompts and spans worked out by hand, and scored, by dev/test/test_infra.cu.)

    python3 dev/data/test_core.py        (or all suites: make test)

Needs tiktoken (python3 -m pip install -r dev/data/requirements.txt): without it the test is skipped,
except where the environment variable CI is set (there it fails).
"""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
from xsatest import REPO, needs_packages, read, run  # noqa: E402

TASK_FILES = ["01_completion_zeroshot.bin", "02_devil_lm.bin", "03_devil_definitions.bin", "04_devil_schema.bin", "index.txt"]


@needs_packages("tiktoken")
class TestCoreOffline(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_core_py_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_reproduces_committed_tasks(self):
        """dev/data/core.py offline on dev/data/core_bundle: output identical to the committed dev/data/core_tasks"""
        out_dir = os.path.join(self.dir, "out")
        code, out = run([sys.executable, "dev/data/core.py", "--bundle", "dev/data/core_bundle", "--tokenizer", "dev/data/devil/tokenizer.bin",
                         "--out", out_dir])
        differ = [name for name in TASK_FILES
                  if read(os.path.join(out_dir, name)) == b"" or read(os.path.join(out_dir, name)) != read(os.path.join(REPO, "dev/data/core_tasks", name))]
        self.assertTrue(code == 0 and not differ, "exit %d, files missing or different: %s\n%s" % (code, differ, out[-3000:]))


if __name__ == "__main__":
    unittest.main()
