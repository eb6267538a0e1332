#!/usr/bin/env python3
"""A study as one command: every (arm, seed) of a study file trained by train_gpt into its own directory,
then the report: each metric's mean and standard deviation per arm over the seeds, and each arm's
difference from the baseline (the first arm) with a 95% confidence interval and a Welch t-test p-value.

    python3 dev/study.py STUDY.json [--out DIR] [--binary ./train_gpt] [--max-runs K] [--report-only]

The study file (JSON; examples in dev/studies/):
    {"name": "...", "base": "train_gpt flags shared by every run",
     "arms": {"baseline": "", "xsa": "-x 1"},          # the first arm is the baseline
     "seeds": [1, 2, 3],
     "arm_seeds": {"xsa": [1, 2]},                      # optional: an arm that runs only some of the seeds
     "concurrent": 8, "gpus_per_run": 1,                # optional: 8 runs side by side, one GPU each (default 1 at a time,
                                                        # every GPU; for one run on all GPUs put --ranks N in "base")
     "note": "optional: what the study is for and how to prepare its data (the report's first paragraph)",
     "sft": "--sft DIR ..."}                            # optional: SFT (+ ChatCORE) of every finished run
Runs go to DIR/ARM/seed_S (DIR defaults to dev/studies/out/NAME). With "sft", each finished run is then
fine-tuned from its last checkpoint by `chat_sft SFT_FLAGS --init-from ... -o DIR/ARM/seed_S/sft` (chat_sft
beside the trainer; dev/docs/chat.md#sft-and-chatcore; ~ in the flags is the home directory), and the report gains its val bpb and ChatCORE.
A run whose metrics.jsonl has its last evaluation is complete and skipped; a run with a checkpoint resumes from it (so give the base flags a
--save-every); any other run directory is started afresh. So a study survives pre-emption (a SIGINT or
SIGTERM reaches the running train_gpt, which checkpoints; rerun the same command) and grows with more
seeds. --max-runs K starts at most K runs (a budget per sitting). The report, DIR/report.md, is rebuilt
from the finished runs alone with --report-only.

Arms may differ only in the flags of ARM_FLAGS (XSA, its layers, the optimizer); the runner sets --seed
and -o itself, and refuses a study whose arms set anything else, and, after the runs, any pair of runs
of one seed whose run lines differ in more than the arms' settings (data, order, schedule, batch).

Standard library only; every bad input ends with one "error:" line and exit code 1.
"""
import argparse
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_runs import CompareError, flatten_settings, load_run, smoothed_losses  # noqa: E402
from plot_run import finish_axes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the flags an arm may set, and the run-line settings they change (everything else must be equal)
XSA_SETTINGS = ["model.xsa_alpha", "model.xsa_layers", "model.xsa_learnable", "optim.lr.xsa_alpha"]
ARM_FLAGS = {"-x": XSA_SETTINGS, "--xsa": XSA_SETTINGS, "--xsa-lr": ["optim.lr.xsa_alpha"],
             "--xsa-layers": ["model.xsa_layers"], "--optimizer": ["optim.*"], "--muon-eq": ["optim.muon_eq"],
             "--muon-plus": ["optim.muon_plus"], "--adamw-matrix-lr": ["optim.*"], "--adamw-matrix-wd": ["optim.matrix_adamw_wd"]}
RUNNER_FLAGS = {"--seed", "-o", "--output", "--resume"}
# settings that may differ between runs whatever the arms: where and how a run was computed
FREE_SETTINGS = {"backend", "device", "xsa_fused"}
CONFIDENCE = 0.95


class StudyError(Exception):
    pass


# ----------------------------------------------------------------------------------------------------
# Statistics (standard library: the t distribution through the regularised incomplete beta function)

def _beta_continued_fraction(a, b, x):
    """The continued fraction of the incomplete beta function (modified Lentz), for x < (a + 1) / (a + b + 2)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a, b, x):
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom (df may be fractional: Welch)."""
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p, df):
    """The t value with P(T <= t) = p (p > 0.5), by bisection on the two-sided tail."""
    lo, hi, tail = 0.0, 1e3, 2.0 * (1.0 - p)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > tail else (lo, mid)
    return 0.5 * (lo + hi)


def welch(a, b):
    """Welch's t-test of mean(b) - mean(a): (difference, its CONFIDENCE interval, p-value, df), or None
    where it cannot be computed (fewer than 2 values on a side, or no spread at all)."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0.0:
        return None
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2.0, df) * se
    return diff, (diff - half, diff + half), t_two_sided_p(diff / se, df), df


# ----------------------------------------------------------------------------------------------------
# The study file and the runs

def load_study(path):
    try:
        with open(path, encoding="utf-8") as f:
            study = json.load(f)
    except (OSError, ValueError) as e:
        raise StudyError(f"cannot read the study file '{path}': {e}")
    if not isinstance(study, dict):
        raise StudyError(f"'{path}': the study must be a JSON object")
    for key, kind in (("name", str), ("base", str), ("arms", dict), ("seeds", list)):
        if not isinstance(study.get(key), kind):
            raise StudyError(f"'{path}': '{key}' must be a {kind.__name__}")
    if not study["arms"] or not study["seeds"]:
        raise StudyError(f"'{path}': a study needs at least one arm and one seed")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in study["seeds"]) or len(set(study["seeds"])) != len(study["seeds"]):
        raise StudyError(f"'{path}': seeds must be distinct non-negative integers")
    for arm, flags in study["arms"].items():
        if not isinstance(flags, str) or not arm or "/" in arm or arm.startswith("."):
            raise StudyError(f"'{path}': arm '{arm}' must be a plain name with a string of flags")
        words = shlex.split(flags)
        for w in words[::2]:
            name = w.split("=", 1)[0]
            if name not in ARM_FLAGS:
                raise StudyError(f"'{path}': arm '{arm}' sets {name}; arms may set only {', '.join(sorted(ARM_FLAGS))} "
                                 "(everything else belongs in 'base', the same for every arm)")
    arm_seeds = study.get("arm_seeds", {})
    if not isinstance(arm_seeds, dict):
        raise StudyError(f"'{path}': 'arm_seeds' must be an object of arm: [seeds]")
    for arm, seeds in arm_seeds.items():
        if arm not in study["arms"]:
            raise StudyError(f"'{path}': 'arm_seeds' names '{arm}', which is not an arm")
        if not isinstance(seeds, list) or not seeds or not set(seeds) <= set(study["seeds"]) or len(set(seeds)) != len(seeds):
            raise StudyError(f"'{path}': 'arm_seeds' of '{arm}' must be distinct seeds taken from 'seeds' {study['seeds']}")
    for key in ("concurrent", "gpus_per_run"):
        if key in study and not (isinstance(study[key], int) and not isinstance(study[key], bool) and study[key] >= 1):
            raise StudyError(f"'{path}': '{key}' must be a whole number >= 1")
    for w in shlex.split(study["base"]):
        if w.split("=", 1)[0] in RUNNER_FLAGS:
            raise StudyError(f"'{path}': 'base' sets {w}; the runner sets --seed and the output directory itself")
    if "sft" in study:
        words = shlex.split(study["sft"]) if isinstance(study["sft"], str) else []
        if "--sft" not in [w.split("=", 1)[0] for w in words]:
            raise StudyError(f"'{path}': 'sft' must be a string of chat_sft flags with --sft DIR")
        for w in words:
            if w.split("=", 1)[0] in RUNNER_FLAGS | {"--init-from"}:
                raise StudyError(f"'{path}': 'sft' sets {w}; the runner sets --init-from and the output directory itself")
    return study


def seeds_of(study, arm):
    """The seeds an arm runs: its 'arm_seeds' entry, or all of 'seeds'."""
    return study.get("arm_seeds", {}).get(arm, study["seeds"])


def run_state(run_dir):
    """'done', 'resume' (a checkpoint to continue from) or 'fresh'."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(metrics):
        try:
            run = load_run(run_dir)
            if run["run"] and run["run"]["steps"] in run["eval"]:
                return "done"
        except CompareError:
            pass
    if os.path.isdir(run_dir) and any(n.startswith("ckpt_") and n.endswith(".safetensors") for n in os.listdir(run_dir)):
        return "resume"
    return "fresh"


def last_checkpoint(run_dir):
    """The checkpoint of a run's highest step."""
    ckpts = [n for n in os.listdir(run_dir) if n.startswith("ckpt_") and n.endswith(".safetensors") and n[5:-12].isdigit()]
    if not ckpts:
        raise StudyError(f"{run_dir} is finished but holds no checkpoint to fine-tune (give 'base' an -o-compatible --save-every)")
    return os.path.join(run_dir, max(ckpts, key=lambda n: int(n[5:-12])))


def start_run(binary, study, arm, seed, run_dir, slot):
    """Starts one train_gpt run (fresh or resumed) in the background: (process, its log file). A run_dir
    ending in /sft is the SFT stage of the run above it. On a study with 'concurrent' runs, slot s gets GPUs
    s * G .. s * G + G - 1 (G = 'gpus_per_run') as its CUDA_VISIBLE_DEVICES."""
    state = run_state(run_dir)
    sft = os.path.basename(run_dir) == "sft"
    if sft:  # chat_sft, beside the trainer
        argv = [os.path.join(os.path.dirname(binary), "chat_sft")] + [os.path.expanduser(w) for w in shlex.split(study["sft"])]
        if state != "resume":
            argv += ["--init-from", last_checkpoint(os.path.dirname(run_dir))]
    else:
        argv = [binary] + shlex.split(study["base"]) + shlex.split(study["arms"][arm]) + ["--seed", str(seed)]
    if state == "resume":
        argv += ["--resume", run_dir]
    else:
        if os.path.isdir(run_dir):
            for name in os.listdir(run_dir):  # a run that never reached a checkpoint: start it again
                if os.path.isfile(os.path.join(run_dir, name)):
                    os.remove(os.path.join(run_dir, name))
        argv += ["-o", run_dir]
    env = dict(os.environ)
    where = ""
    if study.get("concurrent", 1) > 1 or "gpus_per_run" in study:
        per_run = study.get("gpus_per_run", 1)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(slot * per_run + g) for g in range(per_run))
        where = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})"
    print(f"study: {'resuming' if state == 'resume' else 'starting'} {arm} seed {seed}{' SFT' if sft else ''}{where}: {shlex.join(argv)}",
          flush=True)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    log = open(os.path.join(os.path.dirname(run_dir), "sft.log" if sft else f"seed_{seed}.log"), "a")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env), log


def run_all(binary, study, todo, max_runs):
    """Runs the (arm, seed, run_dir) of todo in order, 'concurrent' at a time (default 1), at most max_runs
    of them (-1: all). A SIGINT or SIGTERM reaches every running train_gpt, which checkpoints; no new run
    starts, and the runner exits with the signal's code once they have stopped."""
    running, stopped = {}, []  # slot -> (process, log, arm, seed)
    forward = lambda sig, frame: (stopped.append(sig), [r[0].send_signal(sig) for r in running.values()])  # noqa: E731
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    failure, started = None, 0
    try:
        while True:
            while todo and not stopped and failure is None and started != max_runs and len(running) < study.get("concurrent", 1):
                arm, seed, run_dir = todo.pop(0)
                slot = min(set(range(study.get("concurrent", 1))) - set(running))
                running[slot] = start_run(binary, study, arm, seed, run_dir, slot) + (arm, seed)
                started += 1
            if not running:
                break
            pid, status = os.wait()
            slot = next(s for s, r in running.items() if r[0].pid == pid)
            proc, log, arm, seed = running.pop(slot)
            proc.returncode = os.waitstatus_to_exitcode(status)
            log.close()
            code = proc.returncode
            if code in (130, 143) or code < 0:
                print(f"study: {arm} seed {seed} stopped by a signal with its checkpoint; rerun the same command to go on", flush=True)
                stopped.append(code)
            elif code != 0 and failure is None:
                failure = StudyError(f"{arm} seed {seed} failed (exit {code}); its output is in {log.name}")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if failure:
        raise failure
    if stopped:
        sys.exit(143 if signal.SIGTERM in stopped or 143 in stopped else 130)
    return started


def check_matched(study, runs):
    """Runs of one seed must differ only in what their arms set."""
    allowed = set(FREE_SETTINGS)
    for flags in study["arms"].values():
        for w in shlex.split(flags)[::2]:
            allowed.update(ARM_FLAGS[w.split("=", 1)[0]])
    arms = list(study["arms"])
    for seed in study["seeds"]:
        have = [(arm, runs[arm][seed]) for arm in arms if seed in runs[arm]]
        for arm, r in have[1:]:
            a, b = flatten_settings(have[0][1]["run"] or {}), flatten_settings(r["run"] or {})
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key) and key not in allowed and not ("optim.*" in allowed and key.startswith("optim.")):
                    raise StudyError(f"seed {seed}: {have[0][0]} and {arm} differ in {key} ({json.dumps(a.get(key))} vs "
                                     f"{json.dumps(b.get(key))}), which their arms do not set: not a matched comparison")


# ----------------------------------------------------------------------------------------------------
# The report

def last_alphas(r):
    """A learnable-alpha run's alphas at its last evaluation: {layer: [alpha per head]} ({} for a fixed alpha)."""
    return {int(layer): heads for layer, heads in r["xsa_alpha"][max(r["xsa_alpha"])]["alpha"].items()} if r["xsa_alpha"] else {}


def run_metrics(r, sft=None):
    """The metrics of one finished run and, in a study with an SFT stage, of its finished SFT run `sft`
    (None where a run has no such value)."""
    last = max(r["eval"]) if r["eval"] else None
    steps = sorted(r["train"])
    tail = steps[len(steps) - max(1, len(steps) // 10):] if steps else []
    timed = [r["train"][s]["dt_ms"] for s in steps if s > 0]
    core_step = max(r["core"]) if r["core"] else None
    return {"final val bpb": r["eval"][last]["val_bpb"] if last is not None else None,
            "best val bpb": min(e["val_bpb"] for e in r["eval"].values()) if r["eval"] else None,
            "CORE": r["core"][core_step]["core"] if core_step is not None else None,
            "train loss, last 10% of steps": statistics.fmean(r["train"][s]["loss"] for s in tail) if tail else None,
            "cos(z, v) after XSA (mean over layers)": statistics.fmean(r["diag"][max(r["diag"])]["cos_zv"]) if r["diag"] else None,
            "learned alpha (mean over layers and heads)": statistics.fmean(a for heads in last_alphas(r).values() for a in heads)
            if r["xsa_alpha"] else None,
            "ms per step (median)": statistics.median(timed) if timed else None,
            **({"SFT val bpb": sft["eval"][max(sft["eval"])]["val_bpb"] if sft and sft["eval"] else None,
                "ChatCORE": sft["chatcore"][max(sft["chatcore"])].get("chatcore") if sft and sft["chatcore"] else None}
               if sft is not None else {})}


def report(study, out_dir, runs):
    arms = list(study["arms"])
    base = arms[0]
    values = {arm: [run_metrics(runs[arm][s], runs[arm][s].get("sft", {}) if "sft" in study else None) for s in sorted(runs[arm])]
              for arm in arms}
    lines = [f"# Study: {study['name']}", ""] + ([study["note"], ""] if isinstance(study.get("note"), str) else []) + [
             f"Base flags: `{study['base']}`; arms: " + ", ".join(f"**{a}** (`{study['arms'][a] or 'no flags'}`)" for a in arms) +
             f"; seeds {study['seeds']}. Baseline: **{base}**. Finished runs: " +
             ", ".join(f"{a} {len(runs[a])}/{len(seeds_of(study, a))}" for a in arms) + ".", ""]
    if any(len(runs[a]) < 2 for a in arms):
        lines += ["With fewer than 2 seeds in an arm no spread, interval or test can be given for it: its numbers are single runs.", ""]
    metrics = list(dict.fromkeys(m for vals in values.values() for v in vals for m in v))  # run_metrics' names, in order
    for metric in metrics:
        lines += [f"## {metric}", "", "| arm | n | mean | sd | difference from baseline | 95% CI | Welch p |", "|---|---|---|---|---|---|---|"]
        base_vals = [v[metric] for v in values[base] if v[metric] is not None]
        for arm in arms:
            vals = [v[metric] for v in values[arm] if v[metric] is not None]
            mean = f"{statistics.fmean(vals):.4f}" if vals else "n/a"
            sd = f"{statistics.stdev(vals):.4f}" if len(vals) > 1 else "n/a"
            diff = ci = p = ""
            if arm != base and vals and base_vals:
                diff = f"{statistics.fmean(vals) - statistics.fmean(base_vals):+.4f}"
                w = welch(base_vals, vals)
                ci, p = (f"[{w[1][0]:+.4f}, {w[1][1]:+.4f}]", f"{w[2]:.3g}") if w else ("n/a (needs 2+ seeds per arm)", "n/a")
            lines.append(f"| {arm} | {len(vals)} | {mean} | {sd} | {diff} | {ci} | {p} |")
        lines.append("")
    path = os.path.join(out_dir, "report.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(path + ".tmp", path)
    return path


def plot_study(study, out_dir, runs, plt):
    """The report's PNG files in out_dir: per arm, every seed thin and the mean over seeds thick; each
    arm's difference from the baseline paired by seed with its 95% band; diagnostics per layer; cost.
    Returns the file names written."""
    arms = [a for a in study["arms"] if runs[a]]
    base = list(study["arms"])[0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {a: colors[k % len(colors)] for k, a in enumerate(study["arms"])}
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path + ".tmp", dpi=100, format="png")
        os.replace(path + ".tmp", path)
        plt.close(fig)
        written.append(name)

    def mean_curve(curves):  # {step: value} per seed -> the steps all seeds have, and the mean there
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        return steps, [statistics.fmean(c[s] for c in curves) for s in steps]

    fig, (full, zoom) = plt.subplots(1, 2, figsize=(12, 4.5))
    last_steps, tail_values = 0, []
    for a in arms:
        curves = []
        for r in runs[a].values():
            steps = [s for s in sorted(r["train"]) if s < len(r["train"])]
            curves.append(smoothed_losses(r["train"], steps))
            full.scatter(steps, [r["train"][s]["loss"] for s in steps], color=color[a], alpha=0.15, s=2)  # raw, under the curves
            for ax in (full, zoom):
                ax.plot(steps, [curves[-1][s] for s in steps], color=color[a], alpha=0.3, linewidth=0.7)
        steps, mean = mean_curve(curves)
        for ax in (full, zoom):
            ax.plot(steps, mean, color=color[a], linewidth=2, label=f"{a} (mean of {len(curves)})")
        last_steps = max(last_steps, steps[-1])
        tail_values += [c[s] for c in curves for s in steps if s >= 0.7 * steps[-1]]
    zoom.set_xlim(0.7 * last_steps, last_steps)  # where the arms are close: its own y range
    margin = 0.05 * (max(tail_values) - min(tail_values)) + 1e-6
    zoom.set_ylim(min(tail_values) - margin, max(tail_values) + margin)
    full.set(title="training loss (dots: raw; thin: seeds smoothed, debiased EMA 0.9; thick: mean)", xlabel="step", ylabel="loss")
    zoom.set(title="the last 30% of the steps", xlabel="step")
    finish_axes(full, zoom)
    save(fig, "loss.png")

    fig, (bpb, diff) = plt.subplots(1, 2, figsize=(12, 4.5))
    for a in arms:
        curves = [{s: e["val_bpb"] for s, e in r["eval"].items()} for r in runs[a].values()]
        for c in curves:
            bpb.plot(sorted(c), [c[s] for s in sorted(c)], color=color[a], alpha=0.3, linewidth=0.7)
        steps, mean = mean_curve(curves)
        bpb.plot(steps, mean, "o-", color=color[a], linewidth=2, markersize=3, label=f"{a} (mean of {len(curves)})")
        if a == base:
            continue
        seeds = sorted(set(runs[a]) & set(runs[base]))
        pairs = [{s: runs[a][k]["eval"][s]["val_bpb"] - runs[base][k]["eval"][s]["val_bpb"]
                  for s in runs[a][k]["eval"] if s in runs[base][k]["eval"]} for k in seeds]
        if not pairs:
            continue
        steps, mean = mean_curve(pairs)
        diff.plot(steps, mean, "o-", color=color[a], markersize=3, label=f"{a} - {base} ({len(pairs)} seeds, paired)")
        if len(pairs) > 1:
            half = [t_quantile(0.975, len(pairs) - 1) * statistics.stdev(p[s] for p in pairs) / math.sqrt(len(pairs)) for s in steps]
            diff.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], color=color[a], alpha=0.2)
    diff.axhline(0.0, color="black", linewidth=0.8)
    bpb.set(title="validation bits per byte (thin: seeds)", xlabel="step", ylabel="bpb")
    diff.set(title="difference from the baseline (band: 95% CI over seeds)", xlabel="step", ylabel="bpb difference")
    finish_axes(bpb, diff)
    save(fig, "val_bpb.png")

    with_diag = [a for a in arms if all(r["diag"] for r in runs[a].values())]
    if with_diag:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        for key, label, ax in zip(("cos_yv", "cos_zv", "self_weight"), ("cos(y, v) before XSA", "cos(z, v) after XSA", "self weight"), axes):
            for a in with_diag:
                per_seed = [r["diag"][max(r["diag"])][key] for r in runs[a].values()]
                layers = range(min(len(v) for v in per_seed))
                ax.plot(layers, [statistics.fmean(v[l] for v in per_seed) for l in layers], "o-", color=color[a], label=a, markersize=3)
            ax.set(title=label + " at the last evaluation (mean over seeds)", xlabel="layer")
            ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
            finish_axes(ax)
        save(fig, "diagnostics.png")

    learned = [a for a in arms if all(r["xsa_alpha"] for r in runs[a].values())]
    if learned:  # heat map per arm: layers x heads, the mean over seeds at the last evaluation
        fig, axes = plt.subplots(1, len(learned), figsize=(6 * len(learned), 4.5), squeeze=False)
        for a, ax in zip(learned, axes[0]):
            per_seed = [last_alphas(r) for r in runs[a].values()]
            layers = sorted(set.intersection(*(set(p) for p in per_seed)))
            heads = min(len(p[l]) for p in per_seed for l in layers)
            grid = [[statistics.fmean(p[l][h] for p in per_seed) for h in range(heads)] for l in layers]
            image = ax.imshow(grid, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto")
            for i, row in enumerate(grid):
                for h, value in enumerate(row):
                    ax.text(h, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
            ax.set_yticks(range(len(layers)), [str(l) for l in layers])
            ax.set_xticks(range(heads))
            seeds = f"{len(per_seed)} seed{'s' if len(per_seed) > 1 else ''}"
            ax.set(title=f"{a}: learned alpha at the last evaluation\n(mean of {seeds})", xlabel="head", ylabel="layer")
            fig.colorbar(image, ax=ax)
        save(fig, "alpha.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, a in enumerate(arms):
        medians = [run_metrics(r)["ms per step (median)"] for r in runs[a].values()]
        medians = [m for m in medians if m is not None]
        ax.scatter([k] * len(medians), medians, color=color[a], alpha=0.6)
        if medians:
            ax.plot([k - 0.25, k + 0.25], [statistics.fmean(medians)] * 2, color=color[a], linewidth=2)
    ax.set_xticks(range(len(arms)), arms)
    ax.set(title="cost: median ms per step of each run (bar: mean)", ylabel="ms per step")
    ax.grid(alpha=0.3)
    save(fig, "cost.png")
    return written


def main(argv=None):
    p = argparse.ArgumentParser(description="Run a study (arms x seeds of train_gpt) and write its report.")
    p.add_argument("study", help="the study file (JSON)")
    p.add_argument("--out", help="the study's directory (default dev/studies/out/NAME)")
    p.add_argument("--binary", default="./train_gpt", help="the trainer (default ./train_gpt, as make train_gpt builds it)")
    p.add_argument("--max-runs", type=int, default=-1, help="run at most K runs this time, then write the report (default: all)")
    p.add_argument("--report-only", action="store_true", help="no runs: the report from the finished runs")
    args = p.parse_args(argv)
    try:
        study = load_study(args.study)
        out_dir = args.out or os.path.join(REPO, "dev", "studies", "out", study["name"])
        binary = os.path.abspath(args.binary)
        if not args.report_only and not os.access(binary, os.X_OK):
            raise StudyError(f"'{args.binary}' is not an executable trainer (make train_gpt builds ./train_gpt)")
        sft_binary = os.path.join(os.path.dirname(binary), "chat_sft")
        if not args.report_only and "sft" in study and not os.access(sft_binary, os.X_OK):
            raise StudyError(f"the study has an SFT stage: '{sft_binary}' (beside the trainer) must be built (make chat_sft)")
        # seed-major: every arm of a seed before the next seed, so a partial study stays matched
        todo = [(arm, seed, os.path.join(out_dir, arm, f"seed_{seed}")) for seed in study["seeds"]
                for arm in study["arms"] if seed in seeds_of(study, arm)]
        if not args.report_only:
            started = run_all(binary, study, [t for t in todo if run_state(t[2]) != "done"], args.max_runs)
            if "sft" in study and started != args.max_runs:  # then each finished run's SFT stage
                sft_todo = [(arm, seed, os.path.join(d, "sft")) for arm, seed, d in todo
                            if run_state(d) == "done" and run_state(os.path.join(d, "sft")) != "done"]
                run_all(binary, study, sft_todo, args.max_runs - started if args.max_runs >= 0 else -1)
        runs = {arm: {} for arm in study["arms"]}
        for arm in study["arms"]:
            for seed in seeds_of(study, arm):
                run_dir = os.path.join(out_dir, arm, f"seed_{seed}")
                if run_state(run_dir) == "done":
                    runs[arm][seed] = load_run(run_dir)
                    if run_state(os.path.join(run_dir, "sft")) == "done":
                        runs[arm][seed]["sft"] = load_run(os.path.join(run_dir, "sft"))
        check_matched(study, runs)
        path = report(study, out_dir, runs)
        if any(runs.values()):
            try:
                import matplotlib
                matplotlib.use("Agg")
                import matplotlib.pyplot as plt
                plots = plot_study(study, out_dir, runs, plt)
                with open(path, "a") as f:
                    f.write("\n## Plots\n\n" + "\n".join(f"![{name}]({name})" for name in plots) + "\n")
            except ModuleNotFoundError:
                print(f"study: no plots: matplotlib is not importable by {sys.executable} "
                      f"({sys.executable} -m pip install -r dev/requirements.txt)")
        print(f"study: {path}")
    except (StudyError, CompareError, OSError) as e:
        print(f"study.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
