#!/usr/bin/env python3
"""The test runner itself (dev/test/run_tests.py) on made-up suites: with --jobs 2 two suites run at the same
time, a suite marked RUN_ALONE runs while nothing else does, each suite's lines come out together (not
interleaved), the totals are the sums of the suites' own, a C++ suite that crashes before its total line
counts its printed checks and one failed check for the crash, --jobs 1 runs one suite at a time, and SIGINT or
SIGTERM to the runner stops the running suites with the programs they started (exit 130, one line). Standard
library only.

    python3 dev/test/test_run_tests.py        (or all suites: make test)
"""
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402

RUNNER = os.path.join(xsatest.REPO, "dev", "test", "run_tests.py")

# A Python suite of two tests that each write the time they ran and whether they saw the partner suite run
# ("start end seen") to WINDOWS/<suite>.<test>: each test marks WINDOWS/started.<suite>, then waits up to
# $XSA_TEST_RENDEZVOUS seconds for started.<partner> (so two suites running at once see each other however
# loaded the machine is; a suite without a partner waits for none). {alone} is empty or a RUN_ALONE line.
PY_SUITE = '''import os, time, unittest
{alone}
WINDOWS = {windows!r}
class T(unittest.TestCase):
    def record(self, name):
        t0 = time.time()
        open(os.path.join(WINDOWS, "started.{suite}"), "w").close()
        partner = os.path.join(WINDOWS, "started.{partner}")
        deadline = t0 + float(os.environ.get("XSA_TEST_RENDEZVOUS", "0")) * {has_partner}
        while not os.path.exists(partner) and time.time() < deadline:
            time.sleep(0.01)
        seen = os.path.exists(partner)
        time.sleep(0.3)
        with open(os.path.join(WINDOWS, "{suite}." + name), "w") as f:
            f.write("%r %r %d" % (t0, time.time(), seen))
    def test_a(self):
        """{suite} a"""
        self.record("a")
    def test_b(self):
        """{suite} b"""
        self.record("b")
        self.assertTrue({b_passes}, "{suite} b fails on purpose")
'''

# A Python suite whose test starts a program that would run a minute, writes its pid to PIDS/<suite>, and waits
HANGING_SUITE = '''import os, subprocess, time, unittest
class T(unittest.TestCase):
    def test_hang(self):
        child = subprocess.Popen(["sleep", "60"])
        with open(os.path.join({pids!r}, "{suite}.tmp"), "w") as f:
            f.write(str(child.pid))
        os.rename(os.path.join({pids!r}, "{suite}.tmp"), os.path.join({pids!r}, "{suite}"))
        time.sleep(60)
'''

# A C++ suite stand-in: prints two checks and dies by a signal before its total line
CRASHING_CPP = "#!/bin/sh\necho 'PASS first'\necho 'PASS second'\nkill -SEGV $$\n"


def alive(pid):
    """Whether process pid runs (a zombie, ended but not yet reaped, does not count)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Runner(xsatest.TempDirTest):
    PREFIX = "xsa_run_tests_"

    def setUp(self):
        super().setUp()
        os.makedirs(self.path("windows"))
        for suite, partner, alone, b_passes in (("test_p", "test_q", "", True), ("test_q", "test_p", "", False),
                                                ("test_alone", "none", 'RUN_ALONE = "timing"', True)):  # (first by name: without its marker it would run beside test_p)
            with open(self.path(suite + ".py"), "w") as f:
                f.write(PY_SUITE.format(alone=alone, windows=self.path("windows"), suite=suite, partner=partner, has_partner=int(partner != "none"),
                                        b_passes=b_passes))
        with open(self.path("crash.sh"), "w") as f:
            f.write(CRASHING_CPP)
        os.chmod(self.path("crash.sh"), 0o755)

    def run_runner(self, jobs, rendezvous):
        p = subprocess.run([sys.executable, RUNNER, "--cpp", self.path("crash.sh"), "--python", self.path("test_*.py"), "--jobs", jobs],
                           cwd=xsatest.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, XSA_TEST_RENDEZVOUS=rendezvous))
        return p.returncode, p.stdout.decode()

    def windows(self):
        """suite -> (its first test's start, its last test's end, whether a test of it saw its partner run)"""
        spans = {}
        for name in os.listdir(self.path("windows")):
            if not name.startswith("started."):
                with open(self.path("windows", name)) as f:
                    t0, t1, seen = f.read().split()
                suite = name.split(".")[0]
                lo, hi, saw = spans.get(suite, (float(t0), float(t1), False))
                spans[suite] = (min(lo, float(t0)), max(hi, float(t1)), saw or seen == "1")
            os.remove(self.path("windows", name))
        return spans

    @staticmethod
    def overlap(a, b):
        return a[0] < b[1] and b[0] < a[1]

    def test_jobs(self):
        code, out = self.run_runner("2", "30")
        spans = self.windows()
        with self.subTest("--jobs 2: the totals are the suites' sums; the crash is one more failed check; exit code 1"):
            self.assertEqual(code, 1, out)
            # crash.sh: 2 passed + the crash; test_p 2 passed; test_q 1 passed, 1 failed; test_alone 2 passed
            self.assertEqual(out.rstrip().split("\n")[-1], "7 passed, 2 failed", out)
            self.assertRegex(out, r"FAIL C\+\+ suite \S*crash.sh exited with code -11 before its total line")
        with self.subTest("--jobs 2: two suites run at the same time, the RUN_ALONE one while nothing else runs"):
            self.assertEqual(sorted(spans), ["test_alone", "test_p", "test_q"], out)
            self.assertTrue(spans["test_p"][2] and spans["test_q"][2], (spans, out))
            self.assertFalse(self.overlap(spans["test_alone"], spans["test_p"]) or self.overlap(spans["test_alone"], spans["test_q"]), (spans, out))
        with self.subTest("--jobs 2: each suite's lines together, under its own header"):
            blocks = re.split(r"^== ", out, flags=re.M)
            for suite in ("test_p", "test_q", "test_alone"):
                block = [b for b in blocks if b.startswith(self.path(suite + ".py")) or b.startswith(os.path.relpath(self.path(suite + ".py"), xsatest.REPO))]
                self.assertEqual(len(block), 1, out)
                self.assertEqual(re.findall(r"^(?:PASS|FAIL) (\S+) ", block[0], flags=re.M), [suite, suite], out)
        code, out = self.run_runner("1", "0")
        spans = self.windows()
        with self.subTest("--jobs 1: the same totals, one suite at a time"):
            self.assertEqual((code, out.rstrip().split("\n")[-1]), (1, "7 passed, 2 failed"), out)
            self.assertFalse(self.overlap(spans["test_p"], spans["test_q"]), (spans, out))

    def test_interrupted(self):
        os.makedirs(self.path("pids"))
        os.makedirs(self.path("hang"))
        for suite in ("test_h1", "test_h2"):
            with open(self.path("hang", suite + ".py"), "w") as f:
                f.write(HANGING_SUITE.format(pids=self.path("pids"), suite=suite))
        written = lambda: [n for n in os.listdir(self.path("pids")) if not n.endswith(".tmp")]  # noqa: E731
        for jobs, sig in (("2", signal.SIGINT), ("1", signal.SIGTERM)):
            with self.subTest("--jobs %s, %s to the runner alone: the running suites and their programs stopped, one line, exit 130" % (jobs, sig.name)):
                for name in os.listdir(self.path("pids")):
                    os.remove(self.path("pids", name))
                # (SIGINT as a terminal's Ctrl-C finds it: a runner started in the background, as CI may start these tests,
                # inherits SIGINT ignored and rightly keeps ignoring it)
                p = subprocess.Popen([sys.executable, RUNNER, "--cpp", "", "--python", self.path("hang", "test_*.py"), "--jobs", jobs],
                                     cwd=xsatest.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
                self.addCleanup(p.kill)
                deadline = time.time() + 30
                while len(written()) < int(jobs) and time.time() < deadline:
                    time.sleep(0.05)
                children = [int(xsatest.read(self.path("pids", name))) for name in written()]
                self.assertEqual(len(children), int(jobs))
                t0 = time.time()
                p.send_signal(sig)
                out = p.communicate(timeout=30)[0].decode()
                self.assertEqual((p.returncode, out.rstrip().split("\n")[-1]), (130, "run_tests: interrupted; the suites that were running are stopped"), out)
                self.assertLess(time.time() - t0, 10, out)
                deadline = time.time() + 5
                while any(alive(pid) for pid in children) and time.time() < deadline:
                    time.sleep(0.05)
                self.assertEqual([pid for pid in children if alive(pid)], [], "programs the suites started, still running")

    def test_cuda_suite(self):
        """--cuda BIN (make test-cuda on a GPU machine): its checks and total line counted, a crash after them one more failure"""
        for script, want in (("echo 'PASS a'; echo 'PASS b'; echo '2 passed, 0 failed'", (0, "2 passed, 0 failed")),
                             ("echo 'PASS a'; kill -SEGV $$", (1, "1 passed, 1 failed"))):
            with open(self.path("cuda.sh"), "w") as f:
                f.write("#!/bin/sh\n" + script + "\n")
            os.chmod(self.path("cuda.sh"), 0o755)
            p = subprocess.run([sys.executable, RUNNER, "--cpp", "", "--no-python", "--cuda", self.path("cuda.sh")], cwd=xsatest.REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out = p.stdout.decode()
            self.assertEqual((p.returncode, out.rstrip().split("\n")[-1]), want, out)

    def test_bad_jobs(self):
        for bad in ("0", "two"):
            with self.subTest("--jobs %s: one error line, exit code 1" % bad):
                p = subprocess.run([sys.executable, RUNNER, "--jobs", bad], cwd=xsatest.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                self.assertEqual((p.returncode, p.stdout), (1, b""), p.stderr)
                self.assertEqual(len(p.stderr.decode().strip().split("\n")), 1, p.stderr)
                self.assertTrue(p.stderr.startswith(b"run_tests.py: error: ") and b"--jobs" in p.stderr, p.stderr)


if __name__ == "__main__":
    unittest.main()
