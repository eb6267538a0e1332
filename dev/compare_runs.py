#!/usr/bin/env python3
"""Compare training runs side by side: the study's table, from each run's DIR/metrics.jsonl.

    python3 dev/compare_runs.py d12_base d12_xsa [more runs ...] [--layers]

The first run is the baseline; every other run is compared with it. Printed:
  * what differs between the runs' settings (the "run" line train_gpt writes first), and a warning when
    anything besides XSA differs (then the runs did not see the same data, model or schedule);
  * validation bits per byte at the last evaluation step all runs reached, and the best over the run;
  * the training loss: the mean raw loss over the last 10% of the steps all runs completed, and the
    largest gap between the baseline's and each run's loss curves (debiased EMA, beta 0.9, as the console);
  * CORE at the last CORE evaluation all runs reached, and per task (centered accuracy);
  * the attention diagnostics (dev/docs/model.md#xsa-diagnostics) at the last common evaluation: means
    over layers, and with --layers one row per layer;
  * cost: time per step and tokens/s (median, p10-p90, over the timed steps: step 0 pays for allocations
    and graph capture and is left out), MFU, and each run's step-time overhead against the baseline,
    given only when both runs' step times are steady (p10-p90 spread within 10% of the median; a wider
    spread means a shared or throttled machine, and the overhead is then said to be untrustworthy).
Each run is one seed: the table says so, with the noise one run shows (the step-to-step loss noise over
the last 10% of the steps, and the step-time spread). Seed-to-seed differences need several runs per arm.

Standard library only. Every bad input ends with one "error:" line and exit code 1.
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsa_cli  # noqa: E402


class CompareError(Exception):
    pass


# The fields this script reads, per kind of line (dev/docs/data.md#metricsjsonl).
REQUIRED_KEYS = {"run": ("steps",), "train": ("loss", "dt_ms", "tok_per_s"), "eval": ("val_bpb",),
                 "diag": ("cos_yv", "cos_zv", "self_weight", "value_cos"), "core": ("core", "centered"), "xsa_alpha": ("alpha",)}


def load_run(path):
    """DIR or DIR/metrics.jsonl -> {"name", "run", "train", "eval", "diag", "core", "xsa_alpha", "chatcore"}: the run line,
    and each kind's records by step."""
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise CompareError(f"'{path}' is neither a run directory with metrics.jsonl nor a metrics file")
    name = os.path.basename(os.path.normpath(path if os.path.isdir(path) else os.path.dirname(path) or "."))
    run = {"name": name, "file": file, "run": None, "train": {}, "eval": {}, "diag": {}, "core": {}, "xsa_alpha": {}, "chatcore": {}}
    try:
        with open(file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as e:
        raise CompareError(f"'{file}' is not a metrics file (not UTF-8 text: byte {e.start})")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise CompareError(f"'{file}' line {n} is not a JSON line ({e})")
        if not isinstance(rec, dict):
            raise CompareError(f"'{file}' line {n} is not a metrics record (a JSON {type(rec).__name__}, not an object)")
        try:
            step, kind = int(rec["step"]), rec["kind"]
            for key in REQUIRED_KEYS.get(kind, ()):
                rec[key]  # noqa: B018  (a KeyError names the missing field)
        except (ValueError, KeyError, TypeError) as e:
            raise CompareError(f"'{file}' line {n} is not a metrics record (missing or bad {e})")
        if kind == "run":
            run["run"] = rec
        elif kind in ("train", "eval", "diag", "core", "xsa_alpha", "chatcore"):
            run[kind][step] = rec  # a resumed run rewrites lines after its checkpoint: the last one wins
        # other kinds: written by a newer train_gpt; nothing here reads them
    if not run["train"] and not run["eval"]:
        raise CompareError(f"'{file}' has no train or eval lines")
    return run


def flatten_settings(rec):
    """The run line as flat "key": value pairs (model.* and optim.* for the nested objects). "argv" (the command
    line, recorded for --resume DIR alone) is left out: what it sets is in the other settings."""
    flat = {}
    for key, value in rec.items():
        if key in ("step", "kind", "argv"):
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                flat[f"{key}.{k.split('optim.', 1)[-1]}"] = v
        else:
            flat[key] = value
    return flat


# Settings that may differ between the runs of a comparison without breaking it: XSA itself, and how it
# was computed or where it ran.
EXPECTED_DIFFERENCES = {"model.xsa_alpha", "model.xsa_layers", "model.xsa_learnable", "optim.lr.xsa_alpha", "xsa_fused", "backend", "device"}


def setting_differences(runs):
    """(lines describing each differing setting, the keys that differ and should not)."""
    flats = [flatten_settings(r["run"]) if r["run"] else None for r in runs]
    if any(f is None for f in flats):
        missing = ", ".join(r["name"] for r, f in zip(runs, flats) if f is None)
        return [f"settings unknown for {missing} (no run line: written by train_gpt before it logged one)"], []
    lines, unexpected = [], []
    for key in sorted(set().union(*flats)):
        values = [f.get(key, "(absent)") for f in flats]
        if all(v == values[0] for v in values):
            continue
        lines.append(f"  {key}: " + " | ".join(f"{r['name']} {json.dumps(v)}" for r, v in zip(runs, values)))
        if key not in EXPECTED_DIFFERENCES:
            unexpected.append(key)
    return lines, unexpected


def common_last(runs, kind):
    """The last step at which every run has a `kind` line, or None."""
    steps = set(runs[0][kind])
    for r in runs[1:]:
        steps &= set(r[kind])
    return max(steps) if steps else None


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default), q in [0, 1]."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def smoothed_losses(train, steps):
    """Debiased EMA (beta 0.9) of the raw losses at `steps` (consecutive from 0), as train_gpt prints."""
    ema, out = 0.0, {}
    for k, s in enumerate(steps):
        ema = 0.9 * ema + 0.1 * train[s]["loss"]
        out[s] = ema / (1.0 - 0.9 ** (k + 1))
    return out


def loss_noise(train, steps):
    """The loss's noise from step to step over `steps`: the standard deviation of the changes between
    consecutive steps over sqrt 2 (the slow trend cancels in the changes); None for fewer than 3 steps."""
    if len(steps) < 3:
        return None
    return statistics.stdev(train[b]["loss"] - train[a]["loss"] for a, b in zip(steps, steps[1:])) / math.sqrt(2.0)


STEADY_SPREAD = 0.10  # the p10-p90 spread of step times, over their median, above which a machine was not steady


def fmt(x, digits):
    if x is None:
        return "n/a"
    text = f"{x:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.0000"


def rel(x, base):
    if x is None or base is None or base == 0:
        return ""
    return f"{100.0 * (x - base) / abs(base):+.2f}%"


class Table:
    """Rows of (label, value per run); prints the baseline's value, then each run's with its change."""

    def __init__(self, runs):
        self.runs = runs
        self.rows = []

    def add(self, label, values, digits=4, relative=True):
        self.rows.append((label, values, digits, relative))

    def print(self):
        if not self.rows:
            return
        width = max(len(label) for label, *_ in self.rows) + 2
        cells = []
        for label, values, digits, relative in self.rows:
            base = values[0]
            row = [fmt(base, digits)]
            for v in values[1:]:
                change = ""
                if v is not None and base is not None:
                    change = f" ({v - base:+.{digits}f}" + (f", {rel(v, base)})" if relative and rel(v, base) else ")")
                row.append(fmt(v, digits) + change)
            cells.append((label, row))
        col = [max(len(self.runs[i]["name"]), *(len(r[i]) for _, r in cells)) + 2 for i in range(len(self.runs))]
        print("".ljust(width) + "".join(r["name"].ljust(w) for r, w in zip(self.runs, col)).rstrip())
        for label, row in cells:
            print(label.ljust(width) + "".join(c.ljust(w) for c, w in zip(row, col)).rstrip())
        self.rows = []


def compare(runs, per_layer):
    print("runs: " + ", ".join(f"{r['name']} ({r['file']})" for r in runs))
    print(f"baseline: {runs[0]['name']}; changes are against it (absolute, then relative)")
    lines, unexpected = setting_differences(runs)
    print("settings that differ:" + ("" if lines else " none"))
    for line in lines:
        print(line)
    if unexpected:
        print("WARNING: not a matched comparison: " + ", ".join(unexpected) + " differ(s); the runs saw different "
              "models, data or schedules, so differences below are not XSA's alone")
    table = Table(runs)

    print("\nnote: one run per arm (one seed each): the differences below are single-run, and seed-to-seed noise is not "
          "measured here; the within-run noise is shown (loss noise, step-time spread). Several seeds per arm tell effects from noise.")
    print("\n== quality")
    step = common_last(runs, "eval")
    if step is not None:
        table.add(f"val bpb at step {step} (last common)", [r["eval"][step]["val_bpb"] for r in runs], 4)
    best = [min((e["val_bpb"] for e in r["eval"].values()), default=None) for r in runs]
    table.add("best val bpb (any step)", best, 4)
    core_step = common_last(runs, "core")
    if core_step is not None:
        table.add(f"CORE at step {core_step}", [r["core"][core_step]["core"] for r in runs], 4)
        tasks = list(runs[0]["core"][core_step]["centered"])
        for t in tasks:
            table.add(f"  {t} (centered)", [r["core"][core_step]["centered"].get(t) for r in runs], 4, relative=False)
    table.print()

    print("\n== training loss")
    common = set(runs[0]["train"])
    for r in runs[1:]:
        common &= set(r["train"])
    steps = [s for s in sorted(common) if s < len(common)]  # the prefix 0, 1, .. all runs completed
    if not steps:
        print("no common training steps")
    else:
        tail = steps[len(steps) - max(1, len(steps) // 10):]
        table.add(f"mean loss, steps {tail[0]}-{tail[-1]} (raw)", [statistics.fmean(r["train"][s]["loss"] for s in tail) for r in runs], 4)
        curves = [smoothed_losses(r["train"], steps) for r in runs]
        gap = [0.0] + [max(abs(c[s] - curves[0][s]) for s in steps) for c in curves[1:]]
        table.add(f"max |smoothed loss - baseline's|, steps 0-{steps[-1]}", gap, 4, relative=False)
        table.add(f"loss noise, steps {tail[0]}-{tail[-1]} (sd of step-to-step changes / sqrt 2)", [loss_noise(r["train"], tail) for r in runs],
                  4, relative=False)
        table.print()
    finished = [f"{r['name']} {max(r['train']) + 1 if r['train'] else 0}" + (f"/{r['run']['steps']}" if r["run"] else "") for r in runs]
    print("steps done: " + ", ".join(finished))

    if step is not None and all(step in r["diag"] for r in runs):
        print(f"\n== attention diagnostics at step {step} (means over layers; dev/docs/model.md#xsa-diagnostics)")
        series = [("cos_yv", "cos(y, v) before XSA"), ("cos_zv", "cos(z, v) after XSA"), ("self_weight", "self weight"),
                  ("value_cos", "cos(v_i, v_j), i != j")]
        for key, label in series:
            table.add(label, [statistics.fmean(r["diag"][step][key]) for r in runs], 4, relative=False)
        table.print()
        if per_layer:
            layers = min(len(r["diag"][step]["cos_yv"]) for r in runs)
            for key, label in series:
                print(f"\n{label}, per layer")
                for l in range(layers):
                    table.add(f"  layer {l}", [r["diag"][step][key][l] for r in runs], 4, relative=False)
                table.print()

    print("\n== cost (median over timed steps, step 0 excluded; p10-p90 in brackets)")
    ms, tok, mfu, spread, steady = [], [], [], [], []
    for r in runs:
        timed = sorted(t["dt_ms"] for s, t in r["train"].items() if s > 0)
        if not timed:
            ms.append(None), tok.append(None), mfu.append(None), spread.append(""), steady.append(None)
            continue
        ms.append(statistics.median(timed))
        p10, p90 = percentile(timed, 0.1), percentile(timed, 0.9)
        spread.append(f"[{p10:.1f}-{p90:.1f}] ({100.0 * (p90 - p10) / ms[-1]:.1f}% of the median)")
        steady.append((p90 - p10) / ms[-1] if ms[-1] > 0 else None)
        tok.append(statistics.median(t["tok_per_s"] for s, t in r["train"].items() if s > 0))
        m = [t["mfu"] for s, t in r["train"].items() if s > 0 and t.get("mfu") is not None]
        mfu.append(100.0 * statistics.median(m) if m else None)
    table.add("ms per step", ms, 1)
    table.add("tokens/s", tok, 0)
    table.add("MFU %", mfu, 1, relative=False)
    table.print()
    print("ms per step p10-p90: " + ", ".join(f"{r['name']} {s}" for r, s in zip(runs, spread)))
    if ms[0] is not None:
        for r, m, st in zip(runs[1:], ms[1:], steady[1:]):
            if m is None:
                continue
            unsteady = [(name, x) for name, x in ((runs[0]["name"], steady[0]), (r["name"], st)) if x is None or x > STEADY_SPREAD]
            if unsteady:
                why = ", ".join(f"{name} {'n/a' if x is None else f'{100.0 * x:.1f}%'}" for name, x in unsteady)
                print(f"step-time overhead of {r['name']}: not trustworthy: the step times spread by more than "
                      f"{100.0 * STEADY_SPREAD:.0f}% of their median (p10-p90: {why}), so the machine was not steady (shared, "
                      "throttled); time both runs on a machine to themselves")
            else:
                print(f"step-time overhead of {r['name']}: {100.0 * (m / ms[0] - 1.0):+.2f}% against {runs[0]['name']}")


def main(argv=None):
    p = xsa_cli.ArgumentParser(description="Compare train_gpt runs (metrics.jsonl) against the first one.")
    p.add_argument("runs", nargs="+", help="run directories (-o DIR of train_gpt) or metrics.jsonl files; the first is the baseline")
    p.add_argument("--layers", action="store_true", help="also print the attention diagnostics per layer")
    args = p.parse_args(argv)
    try:
        if len(args.runs) < 2:
            raise CompareError("give at least two runs: the baseline first, then the runs to compare with it")
        compare([load_run(path) for path in args.runs], args.layers)
    except CompareError as e:
        print(f"compare_runs.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        print(f"compare_runs.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
