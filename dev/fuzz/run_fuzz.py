#!/usr/bin/env python3
"""Runs each fuzz harness of dev/fuzz/ for a bounded time (make fuzz; standard library only).

    python3 dev/fuzz/run_fuzz.py [--seconds S] [--jobs J] [--bin DIR] [HARNESS ...]

Each harness (default: every dev/fuzz/fuzz_*.cpp, built in --bin) runs for S seconds (-max_total_time),
J of them at a time (default: one per core; each harness is one process)
on a fresh working corpus (the new inputs it finds go there, not into the committed seeds of
dev/fuzz/corpus/HARNESS/, which it reads as a second corpus; fuzz_checkpoint and fuzz_loader_state
first regenerate their derived seeds there, so they match the code being fuzzed). A finding (a sanitizer
report, an uncaught exception, a hang over 10 s, a single allocation over 1 GB, a rejection that does not
name the file) stops the harness: its input is saved as dev/fuzz/artifacts/HARNESS-crash-... (rerun it
with `dev/fuzz/bin/HARNESS FILE`) and the log as dev/fuzz/artifacts/HARNESS.log. Prints one line per
harness (executions, per second, libFuzzer's cov: and ft: numbers, corpus size), then
`N passed, N failed`; exits 1 if any harness failed.
"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = os.path.join(REPO, "dev", "fuzz")
DERIVED_SEEDS = {"fuzz_checkpoint", "fuzz_loader_state"}  # harnesses that write seeds with XSA_FUZZ_WRITE_SEEDS
DICTS = {"fuzz_checkpoint": "json.dict", "fuzz_safetensors": "json.dict", "fuzz_encoder": "encoder.dict",
         "fuzz_calculator": "calc.dict"}  # libFuzzer dictionaries (-dict)


def last(pattern, text, default="?"):
    found = re.findall(pattern, text)
    return found[-1] if found else default


def run_one(exe, name, seconds, work, artifacts):
    corpus = os.path.join(work, name)
    os.makedirs(corpus)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=work,  # what a harness leaves there goes with the working directory
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:" + os.environ.get("UBSAN_OPTIONS", ""),
               ASAN_OPTIONS="abort_on_error=0:" + os.environ.get("ASAN_OPTIONS", ""))
    log_path = os.path.join(artifacts, name + ".log")
    with open(log_path, "wb") as log:
        if name in DERIVED_SEEDS:
            p = subprocess.run([exe], env=dict(env, XSA_FUZZ_WRITE_SEEDS=corpus), stdout=log, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                return p.returncode, "deriving its seeds failed", {}
        seeds = os.path.join(FUZZ, "corpus", name)
        argv = [exe, "-max_total_time=%d" % seconds, "-timeout=10", "-rss_limit_mb=2048", "-malloc_limit_mb=1024",
                "-print_final_stats=1", "-artifact_prefix=%s/%s-" % (artifacts, name), corpus]
        if name in DICTS:
            argv.insert(1, "-dict=" + os.path.join(FUZZ, DICTS[name]))
        if os.path.isdir(seeds):
            argv.append(seeds)
        t0 = time.time()
        p = subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        elapsed = time.time() - t0
    text = open(log_path, "rb").read().decode("utf-8", "replace")
    stats = {
        "execs": last(r"stat::number_of_executed_units:\s*(\d+)", text),
        "per_s": last(r"stat::average_exec_per_sec:\s*(\d+)", text),
        "cov": last(r"\bcov: (\d+)", text),
        "ft": last(r"\bft: (\d+)", text),
        "corp": last(r"\bcorp: (\d+/\S+)", text),
        "seconds": "%.0f" % elapsed,
    }
    note = ""
    if p.returncode != 0:
        crash = last(r"Test unit written to (\S+)", text, "")
        summary = last(r"(SUMMARY: .*|ERROR: .*|finding: .*|==\d+== ERROR: .*|terminate called .*|runtime error: .*)", text, "")
        note = "%s%s" % (summary or "exit %d" % p.returncode, "; input: " + os.path.relpath(crash, REPO) if crash else "")
    return p.returncode, note, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="per harness (default 60)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="harnesses at a time (default: one per core)")
    ap.add_argument("--bin", default=os.path.join(FUZZ, "bin"), help="where the built harnesses are (default dev/fuzz/bin)")
    ap.add_argument("harnesses", nargs="*", help="default: every dev/fuzz/fuzz_*.cpp")
    args = ap.parse_args()
    names = args.harnesses or sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(FUZZ, "fuzz_*.cpp")))
    artifacts = os.path.join(FUZZ, "artifacts")
    os.makedirs(artifacts, exist_ok=True)
    passed = failed = 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="xsa_fuzz_") as work:
        runnable = []
        for name in names:
            exe = os.path.join(args.bin, name)
            if os.access(exe, os.X_OK):
                runnable.append((name, exe))
            else:
                print("FAIL %s: %s is not built (make fuzz-build)" % (name, exe))
                failed += 1
        print("== %d harnesses, %d s each, %d at a time" % (len(runnable), args.seconds, args.jobs))
        sys.stdout.flush()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = pool.map(lambda r: run_one(r[1], r[0], args.seconds, work, artifacts), runnable)
            for (name, _), (code, note, s) in zip(runnable, results):  # in order, each as soon as it and those before it end
                ok = code == 0
                passed += ok
                failed += not ok
                line = "%-20s %10s execs %7s/s  cov: %-6s ft: %-6s corp: %s" % (name, s.get("execs", "?"), s.get("per_s", "?"),
                                                                            s.get("cov", "?"), s.get("ft", "?"), s.get("corp", "?"))
                rows.append(("PASS" if ok else "FAIL") + " " + line)
                print(rows[-1] + ("" if ok else "\n     " + note + "\n     log: " + os.path.relpath(os.path.join(artifacts, name + ".log"), REPO)))
                sys.stdout.flush()
    print("== fuzz summary (%d s per harness)" % args.seconds)
    for r in rows:
        print(r)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
