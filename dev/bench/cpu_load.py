#!/usr/bin/env python3
"""The CPU backend on a shared machine: the quick start's configuration (-d 4 -t 256 -b 8 -B 4096) run alone and
beside N CPU-bound processes, for each OpenMP wait policy asked for, with the slowdown set against the share of
the CPU the run gets:

    make train_gpt && python3 dev/bench/cpu_load.py [--steps 20] [--busy 0,2,5] [--policies default,GOMP_SPINCOUNT=300000]

The share: with C cores, a run of T threads beside N busy processes gets T x min(1, C / (N + T)) cores where it had
min(T, C) alone (the kernel shares the cores fairly between runnable threads), so in proportion it should take
min(T, C) / (T x min(1, C / (N + T))) times as long. The table gives the measured slowdown (the run's training time
against the same policy's alone), that expected one, and their ratio: near 1 when the run degrades in proportion to
the CPU it gets; far above 1 when its threads spin at barriers while the thread they wait for has no core.

A policy is `default` (the binary's own choice: no OpenMP wait variable set) or VAR=VALUE settings joined by '+'
(e.g. OMP_WAIT_POLICY=active, GOMP_SPINCOUNT=300000: libgomp's own default spin before it sleeps). The busy
processes are Python loops. Run it on an otherwise quiet machine: other work counts as load the table does not see.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dev/: xsa_cli.py
import xsa_cli  # noqa: E402
BINARY = os.path.join(REPO, "train_gpt_cpu")
QUICK_START = ["-d", "4", "-t", "256", "-b", "8", "-B", "4096", "--eval-every", "100000", "--core-every", "-1", "--sample-every", "-1"]
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(policy):
    """The environment of a run under `policy` (see the module's text)."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES}
    if policy != "default":
        for setting in policy.split("+"):
            name, sep, value = setting.partition("=")
            if not sep or not name:
                sys.exit("error: policy '%s': give 'default' or VAR=VALUE settings joined by '+'" % policy)
            env[name] = value
    return env


def train(steps, threads, policy):
    """Training time in seconds of one quick-start run of `steps` steps (the trainer's own 'training time')."""
    with tempfile.TemporaryDirectory(prefix="xsa_cpu_load_") as out:
        p = subprocess.run([BINARY] + QUICK_START + ["-n", str(steps), "--threads", str(threads), "-o", os.path.join(out, "run")],
                           cwd=REPO, env=policy_env(policy), stdin=subprocess.DEVNULL, capture_output=True, text=True)
    m = re.search(r"training time ([0-9.]+) s", p.stdout)
    if p.returncode != 0 or not m:
        sys.exit("error: the run failed (exit %d):\n%s%s" % (p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
    return float(m.group(1))


def beside_busy(n, run):
    """run() with n CPU-bound processes running beside it."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.2 if n else 0)
        return run()
    finally:
        for p in busy:
            p.kill()
            p.wait()


def main():
    ap = xsa_cli.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (20)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="the run's OpenMP threads (default: the cores)")
    ap.add_argument("--busy", default="0,2,5", help="numbers of busy processes beside the run, comma-separated (0,2,5)")
    ap.add_argument("--policies", default="default,GOMP_SPINCOUNT=300000", help="wait policies, comma-separated (see the text)")
    a = ap.parse_args()
    if not os.path.exists(BINARY):
        sys.exit("error: %s not found: run `make train_gpt` first" % BINARY)
    busy_counts = [int(n) for n in a.busy.split(",")]
    if 0 not in busy_counts:
        busy_counts.insert(0, 0)  # the baseline of every slowdown
    cores, T = os.cpu_count(), a.threads
    print("machine: %s, %d cores, load average %s; %s; %d steps, %d threads" %
          (cpu_model(), cores, " ".join("%.2f" % x for x in os.getloadavg()), os.path.relpath(BINARY, REPO), a.steps, T))
    print("| policy | busy processes | training time (s) | slowdown | in proportion to the CPU share | ratio |")
    print("|---|---|---|---|---|---|")
    for policy in a.policies.split(","):
        alone = None
        for n in busy_counts:
            seconds = beside_busy(n, lambda: train(a.steps, T, policy))
            alone = seconds if n == 0 else alone
            share = min(T, cores) / (T * min(1.0, cores / (n + T)))
            slowdown = seconds / alone
            print("| %s | %d | %.1f | %.2fx | %.2fx | %.2f |" % (policy, n, seconds, slowdown, share, slowdown / share), flush=True)


if __name__ == "__main__":
    main()
