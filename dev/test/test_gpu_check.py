#!/usr/bin/env python3
"""dev/gpu_check.sh's stage runner (dev/gpu_stage.sh), without a GPU: a stage that hangs is stopped at its
cap and reported, a failing stage is reported with its exit code and last line, the stages after them
still run, no stage runs past the whole budget, and the summary and the log archive are written after
every stage (so whatever ends a GPU call, what ran is there). GPU_CHECK_ONLY selects stages by glob (the
set-up always runs) and the summary names what did not pass as the next GPU_CHECK_ONLY; a stage killed at
its cap keeps the lines it printed (line buffering); the GPU sampler's min/median/max row. The library
search of dev/gpu/find_libs.sh on fake trees (stub libraries and binaries that link them, a fake python3
and ldconfig on PATH): found in the toolkit, in the Python environment's nvidia packages, in the loader
cache, the order between them, missing (one line). And gpu_check.sh itself on a machine without a GPU
(the environment stage, then one line saying so, exit 0), and with a fake nvidia-smi that hangs: each
call costs its timeout, not the budget.

    python3 dev/test/test_gpu_check.py        (or all suites: make test)

Standard library only (and bash, tar, timeout; a C compiler for the library tests, skipped without one).
"""
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
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


def write_exe(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def summary_rows(summary):
    return {line.split("|")[1].strip(): line.split("|")[2].strip() for line in summary.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}


class TestSelection(xsatest.TempDirTest):
    PREFIX = "xsa_gpu_check_"

    def run_stages(self, script, **env):
        env = dict(os.environ, OUT=self.path("out"), LOGS=self.path("logs"), **env)
        # run from a folder holding files the patterns would match as globs: they must match stage names only
        os.makedirs(self.path("cwd", "bench_file"), exist_ok=True)
        proc = subprocess.run(["bash", "-c", "source %s/dev/gpu_stage.sh\n%s" % (REPO, script)], cwd=self.path("cwd"), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        return proc, xsatest.read(self.path("out", "summary.md")).decode()

    def test_only_and_rerun_line(self):
        script = """
            stage setup 10 true
            stage harness_a 10 true
            stage bench_d24 10 false
            stage bench_d12 10 true
            stage timing_x 10 bash -c 'exit 2'
            stage other 10 false
            gpu_stage_selected other timing_x && echo "selected: one of them"
            gpu_stage_selected other harness_a || echo "selected: neither"
        """
        proc, summary = self.run_stages(script, GPU_CHECK_ONLY="bench_* timing_?", GPU_STAGE_ALWAYS="setup")
        out = proc.stdout.decode()
        rows = summary_rows(summary)
        with self.subTest("only the stages the patterns match, and the set-up"):
            self.assertEqual(sorted(rows), ["bench_d12", "bench_d24", "setup", "timing_x"], summary)
            self.assertIn("== harness_a: not selected", out)
            self.assertIn("selected: one of them", out)
            self.assertIn("selected: neither", out)
            self.assertIn("only the stages matching GPU_CHECK_ONLY='bench_* timing_?' (and the set-up: setup)", summary)
        with self.subTest("the summary's last line: what did not pass, as the next GPU_CHECK_ONLY"):
            self.assertEqual(summary.rstrip().splitlines()[-1],
                             "rerun what did not pass: GPU_CHECK_ONLY='bench_d24 timing_x' bash dev/gpu_check.sh")
        proc, summary = self.run_stages("stage a 10 true")
        self.assertEqual(summary.rstrip().splitlines()[-1], "every stage that ran passed")

    def test_killed_stage_keeps_its_lines(self):
        # sed writes through C stdio: block-buffered into a file, lost when it is killed, unless line-buffered
        proc, summary = self.run_stages("stage killed 1 bash -c '{ echo started; sleep 60; } | sed -n p'")
        self.assertIn("TIMEOUT after 1 s (the cap): started", summary_rows(summary).get("killed", ""), proc.stdout.decode())
        self.assertEqual(xsatest.read(self.path("logs", "killed.log")).decode(), "started\n")

    def test_gpu_samples(self):
        write_exe(self.path("bin", "nvidia-smi"), """#!/bin/bash
echo "$*" > "$(dirname "$0")/args"
printf '%s\\n' "2026/12/05 10:00:00.000, 1980, 3201, 650.25, 55" "2026/12/05 10:00:00.500, 1410, 3201, [N/A], 61" \\
    "2026/12/05 10:00:01.000, 1755, 2619, 700.00, 58" "2026/12/05 10:00:01.500, 1980, 3201, 120.50, 57"
exec sleep 60
""")
        t0 = time.time()
        proc, summary = self.run_stages("gpu_sample_start clocks; sleep 0.5; gpu_sample_stop clocks; gpu_sample_stop never_started",
                                        PATH=self.path("bin") + ":/usr/bin:/bin")
        rows = summary_rows(summary)
        self.assertEqual(rows.get("clocks"), "SM MHz 1410/1867.5/1980, memory MHz 2619/3201/3201, power W 120.5/650.25/700, "
                         "temperature C 55/57.5/61 (min/median/max of 4 samples every 0.5 s)", summary)
        self.assertEqual(rows.get("never_started"), "not sampled: no time was left")
        self.assertIn("--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 500",
                      xsatest.read(self.path("bin", "args")).decode())
        self.assertLess(time.time() - t0, 10, "the sampler was stopped, not waited for")
        proc, summary = self.run_stages("gpu_sample_start c; gpu_sample_stop c", PATH="/usr/bin:/bin")
        if not shutil.which("nvidia-smi", path="/usr/bin:/bin"):
            self.assertEqual(summary_rows(summary).get("c"), "not sampled: no nvidia-smi")


STUB_LIB = "int %s(void) { return 0; }\n"
MAIN = "%s\nint main(void) { return %s; }\n"
BLAS, NCCL = "libxsafakeblas.so.13", "libxsafakenccl.so.2"  # not the real names: this machine's loader may have those


class TestLibraries(unittest.TestCase):
    """dev/gpu/find_libs.sh on fake trees: stub libraries and binaries linked to them (real ELF files, so the
    real ldd resolves them), a fake python3 printing its nvidia package folders, a fake ldconfig -p."""

    @classmethod
    def setUpClass(cls):
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise unittest.SkipTest("no C compiler")
        cls.build = tempfile.mkdtemp(prefix="xsa_gpu_libs_")
        b = cls.build

        def run(*args):
            subprocess.run([cc, *args], cwd=b, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        for lib, fn in ((BLAS, "blas_fn"), (NCCL, "nccl_fn")):
            with open(os.path.join(b, fn + ".c"), "w") as f:
                f.write(STUB_LIB % fn)
            run("-shared", "-fPIC", "-Wl,-soname," + lib, fn + ".c", "-o", lib)
        with open(os.path.join(b, "one.c"), "w") as f:
            f.write(MAIN % ("int blas_fn(void);", "blas_fn()"))
        with open(os.path.join(b, "multi.c"), "w") as f:
            f.write(MAIN % ("int blas_fn(void); int nccl_fn(void);", "blas_fn() + nccl_fn()"))
        run("one.c", "-o", "train_gpt_cuda", "-L.", "-l:" + BLAS)
        run("multi.c", "-o", "train_gpt_cuda_nccl", "-L.", "-l:" + BLAS, "-l:" + NCCL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.build, ignore_errors=True)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="xsa_gpu_libs_")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.bin = os.path.join(self.dir, "bin")
        self.cache_lines = []
        self.python_lines = []

    def put(self, folder, lib):
        """the stub library `lib` in `folder` (under the test's directory); returns the folder"""
        folder = os.path.join(self.dir, folder)
        os.makedirs(folder, exist_ok=True)
        shutil.copy(os.path.join(self.build, lib), folder)
        return folder

    def find(self, *args, ld_library_path=None):
        # ldconfig -p's format: a count, then "\tNAME (FLAGS) => PATH" lines; the python prints its folders, one a line
        write_exe(os.path.join(self.bin, "ldconfig"), "#!/bin/sh\necho '%d libs found in cache'\n%s" % (
            len(self.cache_lines), "".join("printf '\\t%%s\\n' '%s'\n" % line for line in self.cache_lines)))
        write_exe(os.path.join(self.bin, "python3"), "#!/bin/sh\n%s" % "".join("echo '%s'\n" % line for line in self.python_lines))
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "GPU_CHECK_PYTHON")}
        env.update(PATH=self.bin + ":/usr/bin:/bin", GPU_LIBS_TOOLKITS=os.path.join(self.dir, "cuda") + " " + os.path.join(self.dir, "cuda-13.0"),
                   GPU_LIBS_DRIVER_DIRS="", GPU_LIBS_PROBES=BLAS + " " + NCCL)
        if ld_library_path:
            env["LD_LIBRARY_PATH"] = ld_library_path
        envfile = os.path.join(self.dir, "libs.env")
        proc = subprocess.run(["bash", os.path.join(REPO, "dev/gpu/find_libs.sh"), "--out", envfile, *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        log = proc.stdout.decode()
        sourced = subprocess.run(["bash", "-c", 'source "$1"; echo "${LD_LIBRARY_PATH-<unset>}|$GPU_LIBS_FOUND|$GPU_LIBS_MISSING|$GPU_LIBS_OPTIONAL_OK"',
                                  "-", envfile], stdout=subprocess.PIPE, timeout=30).stdout.decode().strip().split("|")
        return proc.returncode, log, log.rstrip().splitlines()[-1], sourced

    def binary(self, name="train_gpt_cuda"):
        return os.path.join(self.build, name)

    def test_toolkit(self):
        lib64 = self.put("cuda-13.0/lib64", BLAS)
        code, log, verdict, (ld_path, found, missing, optional_ok) = self.find(self.binary())
        self.assertEqual(code, 0, log)
        self.assertEqual(ld_path, lib64, log)
        self.assertEqual((found, missing), (BLAS, NCCL))
        self.assertIn("%s => %s/%s" % (BLAS, lib64, BLAS), log)  # ldd with the new LD_LIBRARY_PATH
        self.assertTrue(verdict.startswith("libraries: every binary finds what it links (1 binaries); found: %s (toolkit); not found: %s;"
                                           % (BLAS, NCCL)), verdict)

    def test_python_packages(self):
        site = os.path.join(self.dir, "venv/lib/python3.12/site-packages")
        cu13 = self.put(os.path.join(site, "nvidia/cu13/lib"), BLAS)  # CUDA 13's wheels: one nvidia/cu13/lib
        nccl = self.put(os.path.join(site, "nvidia/nccl/lib"), NCCL)  # NCCL's own
        self.python_lines = [os.path.join(site, "nvidia"), os.path.join(site, "torch/lib")]
        code, log, verdict, (ld_path, found, missing, optional_ok) = self.find(self.binary(), "--optional", self.binary("train_gpt_cuda_nccl"),
                                                                               ld_library_path="/opt/kept")
        self.assertEqual(code, 0, log)
        self.assertEqual(ld_path, cu13 + ":" + nccl + ":/opt/kept", log)  # what was there stays, behind
        self.assertEqual((found, missing, optional_ok), (BLAS + " " + NCCL, "", self.binary("train_gpt_cuda_nccl")))
        self.assertIn("found: %s (python3's packages), %s (python3's packages);" % (BLAS, NCCL), verdict)

    def test_order_cache_toolkit_python(self):
        site = os.path.join(self.dir, "site-packages")
        self.put(os.path.join(site, "nvidia/cu13/lib"), BLAS)
        self.put(os.path.join(site, "nvidia/nccl/lib"), NCCL)
        self.python_lines = [os.path.join(site, "nvidia")]
        lib64 = self.put("cuda/lib64", BLAS)
        self.cache_lines = ["%s (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/%s" % (NCCL, NCCL)]
        code, log, verdict, (ld_path, found, missing, _) = self.find(self.binary())
        self.assertEqual(code, 0, log)
        self.assertEqual(ld_path, lib64, log)  # the toolkit's before python's; the cache's needs no folder
        self.assertIn("%s: /usr/lib/x86_64-linux-gnu/%s (from the loader cache (ldconfig -p))" % (NCCL, NCCL), log)
        self.assertIn("found: %s (toolkit), %s (loader cache);" % (BLAS, NCCL), verdict)

    def test_missing(self):
        os.makedirs(os.path.join(self.dir, "cuda/lib64"))
        open(os.path.join(self.dir, "cuda/lib64", "libxsafakeblas.so.12"), "w").close()  # another version: not the library
        code, log, verdict, (ld_path, found, missing, _) = self.find(self.binary(), self.binary("train_gpt_cuda_nccl"))
        self.assertEqual(code, 1, log)
        self.assertEqual(ld_path, "<unset>")
        self.assertEqual(missing, BLAS + " " + NCCL)
        self.assertEqual(verdict, "MISSING %s (needed by train_gpt_cuda train_gpt_cuda_nccl); %s (needed by train_gpt_cuda_nccl): not in the "
                         "loader cache, the toolkit (%s/cuda %s/cuda-13.0: lib64, lib), the driver's folders, nor python3's nvidia packages "
                         "(it has none)" % (BLAS, NCCL, self.dir, self.dir))

    def test_missing_nccl_only_for_the_optional_binary(self):
        self.put("cuda/lib64", BLAS)
        code, log, verdict, (_, found, missing, optional_ok) = self.find(self.binary(), "--optional", self.binary("train_gpt_cuda_nccl"))
        self.assertEqual(code, 0, log)
        self.assertEqual((found, missing, optional_ok), (BLAS, NCCL, ""))
        self.assertIn("not found: %s; not used: train_gpt_cuda_nccl (%s missing);" % (NCCL, NCCL), verdict)

    def test_default_probes(self):
        text = xsatest.read(os.path.join(REPO, "dev/gpu/find_libs.sh")).decode()
        self.assertIn("GPU_LIBS_PROBES-libcublasLt.so.13 libnccl.so.2 libcuda.so.1", text)


class TestGpuCheckFakeGpu(xsatest.TempDirTest):
    PREFIX = "xsa_gpu_check_"

    def test_hanging_nvidia_smi_and_only(self):
        # an nvidia-smi that answers the device query but hangs on everything else (-q, -L, ...): each call is
        # cut at GPU_CHECK_SMI_TIMEOUT; GPU_CHECK_ONLY matching nothing runs the set-up alone
        write_exe(self.path("bin", "nvidia-smi"), """#!/bin/bash
case "$*" in *--query-gpu=name,*) echo "NVIDIA H200, 580.159.04, 9.0, 143771 MiB, 1980 MHz, 700.00 W, Disabled, Enabled"; exit 0 ;; esac
exec sleep 60
""")
        env = dict(os.environ, OUT=self.path("out"), PATH=self.path("bin") + ":/usr/bin:/bin", GPU_CHECK_SMI_TIMEOUT="0.3",
                   GPU_CHECK_ONLY="no_such_stage", GPU_CHECK_SKIP_BUILD="1", GPU_CHECK_BIN=self.path("no_bin"))
        t0 = time.time()
        proc = subprocess.run(["bash", "dev/gpu_check.sh"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        elapsed = time.time() - t0
        out = proc.stdout.decode()
        summary = xsatest.read(self.path("out", "summary.md")).decode()
        rows = summary_rows(summary)
        self.assertEqual(proc.returncode, 0, out)
        self.assertLess(elapsed, 20, out)  # 4 hanging calls of 0.3 s each, not 60 s each
        self.assertEqual(rows.get("device"), "NVIDIA H200, 580.159.04, 9.0, 143771 MiB, 1980 MHz, 700.00 W, Disabled, Enabled", summary)
        self.assertEqual(sorted(rows), ["binaries", "device", "env", "libraries", "versions"], summary)
        self.assertIn("== harness_attention: not selected", out)
        self.assertIn("== train_d4_learn: not selected", out)


if __name__ == "__main__":
    unittest.main()
