"""Helpers shared by the Python test suites (dev/test/test_*.py, dev/test_*.py, dev/data/test_*.py). Standard
library only.

The suites run the binaries and scripts from the repository root, each test in its own temporary
directory; run them all with `make test` (dev/test/run_tests.py), or one with `python3 FILE`.
"""
import importlib
import json
import os
import select
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS = "make test installs dev/requirements.txt into build/venv when it can reach the package index (dev/test/python_env.py)"


def run(argv, want_stdout=True, stdin=subprocess.DEVNULL):
    """Runs argv in the repository root: (exit code, stdout and stderr together), or (exit code, stderr
    alone) with want_stdout=False. A program that cannot start fails the test with its reason."""
    try:
        p = subprocess.run(argv, cwd=REPO, stdin=stdin, stdout=subprocess.PIPE if want_stdout else subprocess.DEVNULL,
                           stderr=subprocess.STDOUT if want_stdout else subprocess.PIPE)
    except OSError as e:
        raise AssertionError("cannot run %s: %s (build it with make)" % (argv[0], e.strerror))
    out = p.stdout if want_stdout else p.stderr
    return p.returncode, out.decode("utf-8", "replace")


def read_until(p, wanted, seconds=60):
    """Reads a started process's output (p.stdout, a pipe) line by line as it comes until each of `wanted` (name ->
    predicate of a line) matched a line, the output ended or `seconds` passed; returns (the lines, name -> seconds
    from the start to its line). The rest stays in the pipe (p.communicate() reads it)."""
    lines, seen, buffered = [], {}, b""
    start = time.time()
    while len(seen) < len(wanted) and time.time() - start < seconds:
        ready, _, _ = select.select([p.stdout], [], [], 0.1)
        if not ready:
            continue
        chunk = os.read(p.stdout.fileno(), 65536)
        if not chunk:
            break
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            line = line.decode("utf-8", "replace")
            lines.append(line)
            for name, match in wanted.items():
                if name not in seen and match(line):
                    seen[name] = time.time() - start
    return lines, seen


def binary(name):
    """./NAME in the repository root, or in $XSA_BIN_DIR where that is set (make test-sanitize: the
    sanitizer builds in build/sanitize/); fails the test if it is not built."""
    path = os.path.join(REPO, os.environ.get("XSA_BIN_DIR", ""), name)
    if not os.access(path, os.X_OK):
        raise AssertionError("%s is not built: run `make %s` (make test builds it)" % (path, name))
    return path


def read(path):
    """A file's bytes, or b"" if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def jsonl(path):
    """The objects of a JSON-lines file (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def token_pieces(path):
    """(the bytes of every token, the BOS id) of a version-2 tokenizer file (dev/data/README.md), read
    independently of the code under test."""
    data = read(path)
    magic, version, V, bos, _, S = struct.unpack_from("<6i", data, 0)
    assert magic == 20241201 and version == 2, "%s: magic %d version %d" % (path, magic, version)
    pos, pieces = 1024 + S, []
    for _ in range(V):
        _, n = struct.unpack_from("<BI", data, pos)
        pieces.append(data[pos + 5:pos + 5 + n])
        pos += 5 + n
    return pieces, bos


def copy_jsonl(src, dst, names, edit=None, drop=None):
    """Copies the JSON-lines files NAME.jsonl of `names` from src to dst (made), leaving out `drop` and applying
    edit = (name, function of the rows) to that one: a source directory with one thing changed."""
    os.makedirs(dst, exist_ok=True)
    for name in names:
        if name == drop:
            continue
        rows = jsonl(os.path.join(src, name + ".jsonl"))
        if edit and name == edit[0]:
            edit[1](rows)
        with open(os.path.join(dst, name + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def check_one_error(test, argv, expect, what=None, anywhere=False):
    """The program must exit with code 1 and print exactly one line on stderr: "error: ...", containing
    `expect` ("...error: ..." with anywhere=True). Checked as a subtest of `test`, named after the command."""
    what = what or " ".join(os.path.basename(a) if i == 0 else (a if a else "''") for i, a in enumerate(argv))
    with test.subTest("%s -> exit 1, one line '%serror: ...%s...'" % (what, "..." if anywhere else "", expect)):
        code, err = run(argv, want_stdout=False)
        lines = err.count("\n")
        text = err.rstrip("\n")
        ok = code == 1 and lines == 1 and ("error:" in text if anywhere else text.startswith("error: ")) and expect in text
        test.assertTrue(ok, "exit %d, %d line(s): %s\n     expected exit 1 and one line containing '%s'" %
                        (code, lines, text or "(nothing)", expect))


def in_ci():
    """CI services set CI (GitHub Actions, GitLab: CI=true); .ci/run does too."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def needs_packages(*names):
    """Class decorator for tests that need packages of dev/requirements.txt: must_run_in_ci with the command
    that installs the ones that cannot be imported."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return must_run_in_ci(missing and "needs %s (not importable by %s): %s" % (", ".join(missing), sys.executable,
                                                                               REQUIREMENTS))


def must_run_in_ci(missing):
    """Class decorator for tests that need something this machine may lack: when `missing` (why they cannot run,
    with what installs it) is set, they are skipped saying so, except in CI (the environment variable CI set),
    where they must run: there every test of the class fails with that reason. Falsy `missing`: they run."""
    def decorate(cls):
        if not missing:
            return cls
        if not in_ci():
            return unittest.skip(missing)(cls)

        def failing(test):
            def fail(self):
                self.fail("CI is set, so these tests must run; " + missing)
            fail.__doc__ = test.__doc__
            return fail
        cls.setUpClass = cls.tearDownClass = classmethod(lambda c: None)
        for name in unittest.defaultTestLoader.getTestCaseNames(cls):
            setattr(cls, name, failing(getattr(cls, name)))
        return cls
    return decorate


def torch_python():
    """(the first interpreter that imports torch, or None; the ones tried): /usr/bin/python3 (Debian's
    python3-torch, which the PyTorch reference is written for), this one, python3 on the PATH. The suites' own
    venv has no torch (dev/requirements.txt leaves it out), so those that need it run it in a child."""
    tried = []
    for py in ("/usr/bin/python3", sys.executable, shutil.which("python3")):
        if not py or py in tried or not os.access(py, os.X_OK):
            continue
        tried.append(py)
        try:
            p = subprocess.run([py, "-c", "import torch"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if p.returncode == 0:
            return py, tried
    return None, tried


def needs_torch(python, tried):
    """Class decorator for the suites that run torch_python()'s interpreter: must_run_in_ci without one."""
    return must_run_in_ci(not python and "no interpreter here imports torch (tried %s): apt-get install python3-torch"
                          % ", ".join(tried))


class TempDirTest(unittest.TestCase):
    """Each test in its own temporary directory, self.dir, removed afterwards."""
    PREFIX = "xsa_test_"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.PREFIX)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def q(self, *names):
        """self.path(...) quoted for an argument string"""
        return shlex.quote(self.path(*names))

    def write(self, name, text):
        """A text file in self.dir (its directories made)."""
        os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
        with open(self.path(name), "w") as f:
            f.write(text)
