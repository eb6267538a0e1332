#!/usr/bin/env python3
"""The Python that runs `make test`'s suites: prints its path on stdout, and on stderr one line saying
which it is and why.

    python3 dev/test/python_env.py        (the Makefile's test targets run it; it always exits 0)

In order:
  1. this interpreter, if it imports every package of dev/requirements.txt (a machine set up by hand);
  2. else build/venv/bin/python, a virtual environment of this interpreter with dev/requirements.txt
     installed by pip: made on the first run (about a minute with a fast link to the package index),
     reused while its stamp (the requirements' hash) matches, made anew when dev/requirements.txt changes;
  3. else (no venv module, or the package index cannot be reached) this interpreter, with one line
     saying why: the tests that need a package then skip, each saying so (in CI they fail instead).
XSA_TEST_VENV=0 skips 2 (this interpreter as it is); XSA_TEST_VENV=force takes 2 even where 1 would do
(CI: it proves that dev/requirements.txt names everything the tests import). Its tests
(dev/test/test_python_env.py) point XSA_TEST_REQUIREMENTS and XSA_TEST_VENV_DIR elsewhere. Standard library only.
"""
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS = os.environ.get("XSA_TEST_REQUIREMENTS") or os.path.join(REPO, "dev", "requirements.txt")
VENV = os.environ.get("XSA_TEST_VENV_DIR") or os.path.join(REPO, "build", "venv")
PIP_SECONDS = 900  # the whole install; pip's own --timeout bounds each connection


def requirement_files(path):
    """path and every file it includes with -r, in order."""
    files = [path]
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*-r\s+(\S+)", line)
            if m:
                files += requirement_files(os.path.join(os.path.dirname(path), m.group(1)))
    return files


def modules(path):
    """The import names of the packages the requirement files name (here each is its distribution's name)."""
    names = []
    for file in requirement_files(path):
        with open(file) as f:
            for line in f:
                m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*[=<>~!]", line.split("#")[0])
                if m:
                    names.append(m.group(1).replace("-", "_").lower())
    return names


def stamp():
    """A hash of the requirement files' text: the venv is made anew when it changes."""
    h = hashlib.sha256()
    for file in requirement_files(REQUIREMENTS):
        with open(file, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def missing(python, names):
    """The names that `python` cannot import (all of them if it does not run)."""
    script = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))"
    try:
        p = subprocess.run([python, "-c", script] + names, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return names
    return p.stdout.decode().split() if p.returncode == 0 else names


def say(text):
    print("python: " + text, file=sys.stderr, flush=True)


def make_venv(names):
    """build/venv with the requirements installed, or None (having said why)."""
    python = os.path.join(VENV, "bin", "python")
    stamp_file = os.path.join(VENV, "requirements-" + stamp())
    if os.path.exists(stamp_file) and not missing(python, names):
        say("%s (the venv of dev/requirements.txt)" % python)
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    say("making %s and installing %s into it with pip (once; later runs reuse it)" % (VENV, REQUIREMENTS))
    p = subprocess.run([sys.executable, "-m", "venv", VENV], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        last = (p.stdout.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        say("cannot make a virtual environment with %s -m venv (%s; on Debian: apt-get install python3-venv)" % (sys.executable, last))
        shutil.rmtree(VENV, ignore_errors=True)
        return None
    cmd = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--timeout", "20", "--retries", "2", "-r", REQUIREMENTS]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=PIP_SECONDS)
        out, code = p.stdout.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired:
        out, code = "no answer in %d s" % PIP_SECONDS, -1
    if code != 0:
        last = (out.strip().splitlines() or ["?"])[-1]
        say("pip could not install %s (%s)" % (REQUIREMENTS, last[:300]))
        shutil.rmtree(VENV, ignore_errors=True)
        return None
    open(stamp_file, "w").close()
    say("%s (the venv of dev/requirements.txt)" % python)
    return python


def main():
    names = modules(REQUIREMENTS)
    absent = missing(sys.executable, names)
    python = sys.executable
    mode = os.environ.get("XSA_TEST_VENV", "1")
    if not absent and mode != "force":
        say("%s (it has every package of dev/requirements.txt)" % python)
    elif mode == "0":
        say("%s as it is (XSA_TEST_VENV=0); without %s the tests that need them skip" % (python, ", ".join(absent)))
    else:
        python = make_venv(names) or python
        if python == sys.executable and absent:
            say("%s, without %s: the tests that need them skip, each saying so" % (python, ", ".join(absent)))
    print(python)


if __name__ == "__main__":
    main()
