"""What the self-check scripts share: PASS/FAIL lines, the relative L2 error, the closing line."""
import sys

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")


def rel(a, b):
    """||a - b|| / ||b|| of two tensors, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def finish():
    """Prints "N passed, N failed" and exits non-zero on any failure."""
    npass = sum(RESULTS)
    print(f"{npass} passed, {len(RESULTS) - npass} failed")
    sys.exit(0 if npass == len(RESULTS) else 1)


def run_checks(*checks):
    """Runs each check function (a crash is a failure, not a pass), then finish()."""
    for fn in checks:
        try:
            fn()
        except Exception as e:
            check(fn.__name__, False, f"{type(e).__name__}: {e}")
    finish()
