#!/usr/bin/env python3
"""Tests of dev/test/python_env.py, the choice of the Python that runs make test's suites: a requirement
this interpreter has needs no venv; one it lacks, with the package index unreachable, gives this
interpreter and one line saying why (exit 0: the tests that need it then skip); XSA_TEST_VENV=0 never
makes a venv. Each case uses its own requirements file and venv directory; the index is a closed local
port, so nothing is downloaded.

    python3 dev/test/test_python_env.py        (or all suites: make test)

Standard library only.
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsatest  # noqa: E402

SCRIPT = os.path.join(xsatest.REPO, "dev", "test", "python_env.py")


class TestPythonEnv(xsatest.TempDirTest):
    PREFIX = "xsa_pyenv_"

    def choose(self, requirement, **env):
        req = self.path("requirements.txt")
        with open(req, "w") as f:
            f.write("# a comment\n%s\n" % requirement)
        env = dict({k: v for k, v in os.environ.items() if k != "XSA_TEST_VENV"}, XSA_TEST_REQUIREMENTS=req, XSA_TEST_VENV_DIR=self.path("venv"), PIP_INDEX_URL="http://127.0.0.1:9/simple",
                   PIP_NO_CACHE_DIR="1", **env)
        p = subprocess.run([sys.executable, SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=600)
        return p.returncode, p.stdout.decode().strip(), p.stderr.decode()

    def test_present(self):
        """a requirement this interpreter imports (unittest is one): this interpreter, no venv made"""
        code, python, err = self.choose("unittest==0")
        self.assertTrue(code == 0 and python == sys.executable and "it has every package" in err and not os.path.exists(self.path("venv")),
                        (code, python, err))

    def test_index_unreachable(self):
        """a requirement it lacks and no package index: this interpreter, exit 0, one line naming the pip failure, no venv left"""
        code, python, err = self.choose("xsa-no-such-package==1.0")
        self.assertTrue(code == 0 and python == sys.executable and "pip could not install" in err and "xsa_no_such_package" in err and
                        not os.path.exists(self.path("venv")), (code, python, err))

    def test_no_venv_wanted(self):
        """XSA_TEST_VENV=0: this interpreter as it is, saying what it lacks"""
        code, python, err = self.choose("xsa-no-such-package==1.0", XSA_TEST_VENV="0")
        self.assertTrue(code == 0 and python == sys.executable and "XSA_TEST_VENV=0" in err and not os.path.exists(self.path("venv")),
                        (code, python, err))


if __name__ == "__main__":
    unittest.main()
