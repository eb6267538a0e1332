#!/usr/bin/env python3
"""The test runner of `make test`, `make test-cuda` and `make test-sanitize`: runs the suites, prints one
PASS / FAIL / SKIP line per check, then a subtotal per suite and one final line,
`N passed, N failed` (`, N skipped` added when some were). Exits 1 if any check failed.

    python3 dev/test/run_tests.py [--jobs N] [--compile CMD] [--cuda BIN] [--emu "TARGET ..."] [--no-python]
                                  [--cpp BIN ...] [--python GLOB] [--sanitizer-logs DIR]

Suites, in this order:
  * --compile CMD: a shell command that builds the CUDA targets (make test-cuda: make cuda_targets); 1 check
  * the C++ suites, ./test_xsa_cpu (the numerics) then ./test_infra_cpu (the infrastructure), or those of --cpp BIN
    (repeatable; --cpp '' leaves them out): each a suite of its own, with its own "N passed, N failed" line
  * every Python suite dev/**/test_*.py (or those of --python GLOB, repeatable) (unittest): one check per test, or per subtest
    where a test has them; run with this interpreter, so `PYTHON=... make test` picks which one
  * --cuda BIN: the CUDA suite, ./test_xsa_cuda on a GPU: its "N passed, N failed" line
  * --emu "TARGET ...": dev/cuda/emu/run.sh TARGET ... (the CUDA code on the CPU emulator): one check per target
  * --sanitizer-logs DIR: one check, that the suites left no sanitizer report in DIR (make test-sanitize
    runs the binaries with ASAN_OPTIONS / UBSAN_OPTIONS log_path=DIR/..., so that a report is seen even
    where a test did not look at the output or exit code); the reports are printed
A suite that crashes or exits non-zero without a failed check counts as one failed check. Ctrl-C, SIGTERM or
SIGHUP stops the suites still running (each runs in a process group of its own, the programs it started
with it) and ends the runner with one line and exit code 130.

--jobs N (default: one per core, at most 4): the C++ and Python suites run N at a time, each suite's lines
printed together when it ends (with --jobs 1, as they come). Most suites leave cores idle (one Python
process, or small runs of the binaries): make test's suites took 130 s with --jobs 2 against 235 s with
--jobs 1 on the 2-core build machine (2026-12-06). A Python suite whose checks measure time (a run stopped
within 1 s of a signal) says so with a line `RUN_ALONE = "why"` at module level, and runs first, when
nothing else does. The suites must not share files: each test works in its own temporary directory.

OMP_WAIT_POLICY=passive unless set: with OpenMP's default spinning, a test binary whose threads share
the cores with another busy process runs 30x slower (the C++ suite, before it was split in two: 150 s
instead of 5 s on 2 cores).

Standard library only.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import xsa_cli  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPP_SUITES = ["./test_xsa_cpu", "./test_infra_cpu"]  # the numerics (test_xsa.cu), the infrastructure (dev/test/test_infra.cu)
TOTAL_LINE = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?\s*$")
RUN_ALONE = re.compile(r"^RUN_ALONE\s*=", re.M)  # the marker of a Python suite that runs when nothing else does
MAX_DEFAULT_JOBS = 4  # past a few, the longest suite (dev/test_study.py, about 45 s) sets the time anyway


def total_line(passed, failed, skipped):
    return "%d passed, %d failed%s" % (passed, failed, ", %d skipped" % skipped if skipped else "")


# ----------------------------------------------------------------------------------------------------
# One Python suite (run in a child process: run_tests.py --unittest FILE)

class CountingResult(unittest.TestResult):
    """Counts checks: a test, or each subtest of a test that has subtests. Prints PASS / FAIL / SKIP lines."""

    def __init__(self):
        super().__init__()
        self.n_passed = self.n_failed = self.n_skipped = 0  # (TestResult's own .skipped is a list)
        self.with_subtests = set()

    @staticmethod
    def name(test):
        if isinstance(test, unittest.TestCase):
            doc = test.shortDescription()
            return doc if doc else test.id()
        return str(test)  # the holder of a setUpClass / module set-up error

    @staticmethod
    def detail(test, err):
        exc_type, exc, tb = err
        if isinstance(exc, AssertionError):
            text = str(exc)
        else:
            text = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip()
        return "\n".join("     " + line for line in text.split("\n"))

    def report(self, verdict, name, detail=None):
        print("%s %s" % (verdict, name))
        if detail:
            print(detail)
        sys.stdout.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        if test.id() not in self.with_subtests:  # else its checks were its subtests
            self.n_passed += 1
            self.report("PASS", self.name(test))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        self.with_subtests.add(test.id())
        message = getattr(subtest, "_message", None)
        name = message if isinstance(message, str) else str(subtest)
        if err is None:
            self.n_passed += 1
            self.report("PASS", name)
        else:
            self.n_failed += 1
            self.report("FAIL", name, self.detail(test, err))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.n_failed += 1
        self.report("FAIL", self.name(test), self.detail(test, err))

    def addError(self, test, err):
        super().addError(test, err)
        self.n_failed += 1
        self.report("FAIL", self.name(test), self.detail(test, err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.n_skipped += 1
        self.report("SKIP", "%s: %s" % (self.name(test), reason))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.n_failed += 1
        self.report("FAIL", "%s: passed, but is marked as an expected failure" % self.name(test))


def run_unittest_file(path):
    """Loads the unittest module at path and runs its tests; prints the checks and the total line."""
    import importlib.util
    os.chdir(REPO)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    result = CountingResult()
    try:
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    except Exception:  # the module does not load: one failed check
        result.n_failed += 1
        result.report("FAIL", "%s does not load" % path, "".join(traceback.format_exc()).rstrip())
    else:
        suite(result)
    print(total_line(result.n_passed, result.n_failed, result.n_skipped))
    return 0 if result.n_failed == 0 else 1


# ----------------------------------------------------------------------------------------------------
# The runner

class Suite:
    def __init__(self, name, argv=None, env=None, alone=False):
        self.name = name
        self.argv, self.env, self.alone = argv, env, alone  # for a counted suite: its command, and whether it runs alone
        self.passed = self.failed = self.skipped = 0
        self.seconds = 0.0
        self.note = ""


RUNNING = set()  # the suites' processes now running, each the leader of its own process group


def stream(argv, shell=False, env=None, out=print):
    """Runs a command in the repository root, in a process group of its own, each line of its stdout and stderr
    given to out as it comes; returns (exit code, the lines)."""
    lines = []
    try:
        p = subprocess.Popen(argv, cwd=REPO, shell=shell, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        out("cannot run %s: %s" % (argv if shell else argv[0], e.strerror))
        return 127, lines
    RUNNING.add(p)  # (left there if an interrupt ends the reading: stop_running ends it)
    for raw in p.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        lines.append(line)
        out(line)
    code = p.wait()
    RUNNING.discard(p)
    return code, lines


def stop_running():
    """Ends every running suite with the programs it started: SIGTERM to each process group, SIGKILL to those
    still there 2 s later."""
    def signal_groups(sig):
        for p in list(RUNNING):
            try:
                os.killpg(p.pid, sig)
            except OSError:  # the group has ended
                pass
    signal_groups(signal.SIGTERM)
    deadline = time.time() + 2
    while any(p.poll() is None for p in list(RUNNING)) and time.time() < deadline:
        time.sleep(0.05)
    signal_groups(signal.SIGKILL)


def interrupt(signum, frame):
    raise KeyboardInterrupt


def counted_suite(suite, out=print):
    """A suite that ends with its own "N passed, N failed[, N skipped]" line (the C++ and Python suites); its
    lines go to out."""
    t0 = time.time()
    code, lines = stream(suite.argv, env=suite.env, out=out)
    totals = [m for m in (TOTAL_LINE.match(line) for line in lines) if m]
    if totals:
        m = totals[-1]
        suite.passed, suite.failed, suite.skipped = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    else:  # it stopped before its total line: the checks it printed, and the crash below
        suite.passed = sum(line.startswith("PASS ") for line in lines)
        suite.failed = sum(line.startswith("FAIL ") for line in lines)
    if code != 0 and suite.failed == 0:  # a crash, or an exit code the checks do not explain
        suite.failed += 1
        suite.note = "exited with code %d%s" % (code, "" if totals else " before its total line")
        out("FAIL %s %s" % (suite.name, suite.note))
    suite.seconds = time.time() - t0


def run_counted_suites(suites, jobs):
    """The suites marked alone (all of them, with jobs 1) one after the other, their lines as they come; then the
    others `jobs` at a time, each one's lines printed together when it ends."""
    alone = [s for s in suites if s.alone or jobs == 1]
    for suite in alone:
        print("== %s%s" % (suite.name, " (alone: its checks measure time)" if jobs > 1 else ""))
        counted_suite(suite)

    def buffered(suite):
        lines = []
        counted_suite(suite, out=lines.append)
        return lines

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        running = {pool.submit(buffered, s): s for s in suites if s not in alone}
        try:
            for done in concurrent.futures.as_completed(running):
                print("== %s" % running[done].name)
                print("\n".join(done.result()))
        except KeyboardInterrupt:  # (before the pool waits for its threads: they end when their suites do)
            for future in running:
                future.cancel()
            stop_running()
            raise


def compile_suite(suite, command):
    code, _ = stream(command, shell=True)
    ok = code == 0
    suite.passed, suite.failed = int(ok), int(not ok)
    print("%s every CUDA target compiles (%s)%s" % ("PASS" if ok else "FAIL", command, "" if ok else ": exit %d" % code))


def emu_suite(suite, targets):
    """dev/cuda/emu/run.sh: one check per target, from its closing summary ("NAME PASS|FAIL ...")."""
    code, lines = stream(["dev/cuda/emu/run.sh"] + targets)
    verdicts = {}
    if "== emu summary" in "\n".join(lines):
        for line in lines[max(i for i, l in enumerate(lines) if l.startswith("== emu summary")) + 1:]:
            m = re.match(r"^(\S+)\s+(PASS|FAIL)\s", line)
            if m:
                verdicts[m.group(1)] = m.group(2)
    for t in targets:
        ok = verdicts.get(t) == "PASS"
        suite.passed += ok
        suite.failed += not ok
        print("%s emulator target %s%s" % ("PASS" if ok else "FAIL", t, "" if t in verdicts else " (no result: run.sh exited %d)" % code))
    if code != 0 and suite.failed == 0:
        suite.failed += 1
        suite.note = "run.sh exited with code %d" % code
        print("FAIL %s %s" % (suite.name, suite.note))


def main():
    ap = xsa_cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unittest", metavar="FILE", help=argparse.SUPPRESS)  # internal: one Python suite
    ap.add_argument("--jobs", metavar="N", type=int, default=min(len(os.sched_getaffinity(0)), MAX_DEFAULT_JOBS),
                    help="run N suites at a time (default: one per core, at most %d)" % MAX_DEFAULT_JOBS)
    ap.add_argument("--cpp", metavar="BIN", action="append",
                    help="a C++ suite, repeatable (default ./test_xsa_cpu and ./test_infra_cpu); '' leaves them out")
    ap.add_argument("--no-python", action="store_true", help="leave out the Python suites")
    ap.add_argument("--python", metavar="GLOB", action="append",
                    help="the Python suites (default dev/**/test_*.py); may be given several times")
    ap.add_argument("--sanitizer-logs", metavar="DIR", help="one check: no sanitizer report files in DIR after the suites")
    ap.add_argument("--compile", metavar="CMD", help="shell command that compiles the CUDA targets, counted as one check")
    ap.add_argument("--cuda", metavar="BIN", help="the CUDA suite binary (./test_xsa_cuda), on a GPU machine")
    ap.add_argument("--emu", metavar="TARGETS", help="emulator targets of dev/cuda/emu/run.sh, space-separated")
    args = ap.parse_args()
    if args.unittest:
        return run_unittest_file(args.unittest)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1, not %d" % args.jobs)

    sys.stdout.reconfigure(line_buffering=True) if hasattr(sys.stdout, "reconfigure") else None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    try:
        return run_suites(args)
    except KeyboardInterrupt:
        stop_running()
        print("run_tests: interrupted; the suites that were running are stopped")
        return 130


def run_suites(args):
    """The suites of the command line, then the summary; 0 if every check passed, else 1."""
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # for every suite (see above)
    # train_gpt's default data is the ClimbMix cache when one exists (~/.cache/xsa-train/climbmix): the
    # suites expect the embedded corpus whatever this machine holds (dev/test/test_defaults.py sets its own)
    os.environ["XSA_DATA_DIR"] = "none"
    suites = []

    def start(name):
        suite = Suite(name)
        suites.append(suite)
        print("== %s" % name)
        return suite, time.time()

    if args.compile:
        suite, t0 = start("CUDA targets compile")
        compile_suite(suite, args.compile)
        suite.seconds = time.time() - t0
    counted = [Suite("C++ suite %s" % binary, [binary]) for binary in filter(None, args.cpp or CPP_SUITES)]
    if not args.no_python:
        files = sorted(set(f for g in args.python or ["dev/**/test_*.py"] for f in glob.glob(os.path.join(REPO, g), recursive=True)))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")  # no __pycache__ in the tree
        for path in files:
            with open(path, encoding="utf-8") as f:
                alone = bool(RUN_ALONE.search(f.read()))
            counted.append(Suite(os.path.relpath(path, REPO), [sys.executable, os.path.abspath(__file__), "--unittest", path], env, alone))
    suites += counted
    run_counted_suites(counted, args.jobs)
    if args.cuda:
        suite, _ = start("CUDA suite %s" % args.cuda)
        suite.argv = [args.cuda]
        counted_suite(suite)
    if args.emu:
        suite, t0 = start("CUDA emulator: %s" % args.emu)
        emu_suite(suite, args.emu.split())
        suite.seconds = time.time() - t0

    if args.sanitizer_logs:
        suite, t0 = start("sanitizer reports in %s" % args.sanitizer_logs)
        reports = sorted(glob.glob(os.path.join(args.sanitizer_logs, "*")))
        for path in reports:
            print("---- %s" % os.path.relpath(path, REPO))
            with open(path, "rb") as f:
                print(f.read().decode("utf-8", "replace").rstrip())
        suite.passed, suite.failed = int(not reports), int(bool(reports))
        print("%s no sanitizer reports%s" % ("PASS" if not reports else "FAIL", "" if not reports else ": %d, above" % len(reports)))
        suite.seconds = time.time() - t0

    passed, failed, skipped = (sum(getattr(s, k) for s in suites) for k in ("passed", "failed", "skipped"))
    print("== summary")
    width = max(len(s.name) for s in suites) if suites else 0
    for s in suites:
        print("%-*s  %-32s %6.1f s%s" % (width, s.name, total_line(s.passed, s.failed, s.skipped), s.seconds,
                                         "  (" + s.note + ")" if s.note else ""))
    if skipped:
        print("skipped: the SKIP lines above say why")
    print(total_line(passed, failed, skipped))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
