#!/usr/bin/env python3
"""A study as one command: every (arm, seed) of a study file, and optionally every depth group, trained by
train_gpt into its own directory; then the report (DIR/report.md) and its plots.

    python3 dev/study.py STUDY.json [--out DIR] [--binary ./train_gpt] [--max-runs K] [--report-only] [--no-plots] [--idle-machine]

The study file (JSON; examples in dev/studies/):
    {"name": "...", "base": "train_gpt flags shared by every run",
     "arms": {"baseline": "", "xsa": "-x 1"},          # the first arm is the baseline
     "seeds": [1, 2, 3],
     "arm_seeds": {"xsa": [1, 2]},                      # optional: an arm that runs only some of the seeds
     "primary": "val_bpb",                              # optional: the pre-declared primary metric (default val_bpb, the final val bpb)
     "vary_data_order": true,                           # optional: each seed S also sets --data-seed S (the data order varies with
                                                        # the seed; both arms of a seed share it); default false: --data-seed 0
     "groups": {"d2": "-d 2", "d4": "-d 4"},            # optional: a depth series: every arm x seed again at each group's flags
     "concurrent": 8, "gpus_per_run": 1,                # optional: 8 runs side by side, one GPU each (default 1 at a time,
                                                        # every GPU; for one run on all GPUs put --ranks N in "base")
     "note": "optional: what the study is for and how to prepare its data (the report's first paragraph)",
     "sft": "--sft DIR ...",                            # optional: SFT (+ ChatCORE) of every finished run
     "core_final": "-c DIR",                            # optional: full CORE of every finished run (eval_core, all items)
     "claims": {"xsa": "xsa", "learnable": "learn"}}    # optional: the XSA study's claims read from the results (learnable optional)
Runs go to DIR/ARM/seed_S (DIR defaults to dev/studies/out/NAME); in a study with "groups", to
DIR/GROUP/ARM/seed_S, each run with the flags base + GROUP's + ARM's. With "sft", each finished run is then
fine-tuned from its last checkpoint by `chat_sft SFT_FLAGS --init-from ... -o RUN_DIR/sft` (chat_sft beside the
trainer; dev/docs/chat.md#sft-and-chatcore; ~ in the flags is the home directory), and the report gains its
val bpb and ChatCORE. With "core_final", each finished run's last checkpoint is then scored on every item of the
CORE task files in DIR by eval_core (beside the trainer: eval_core for train_gpt_cpu, else eval_core_cuda), as
nanochat's base_eval does after training (the trainer's CORE during a run takes nanochat's 500 items per task),
into RUN_DIR/core_final.csv; the report gains "CORE, all items". A run whose metrics.jsonl has its last evaluation is complete and skipped; a run with a
checkpoint resumes from it (so give the base flags a --save-every); any other run directory is started
afresh. So a study survives pre-emption (a SIGINT or SIGTERM reaches the running train_gpt, which
checkpoints; rerun the same command) and grows with more seeds. Runs go seed by seed (every group and arm of
seed 1, then seed 2, ...), so a partial study stays paired. --max-runs K starts at most K runs (a budget per
sitting); `kill -USR1 PID` (the runner's PID) drains it: the running runs finish, no new one starts, then
the report (a sitting that must end by a time, with no run left half done). --report-only rebuilds the
report and plots from the finished runs' metrics.jsonl files alone.

Arms may differ only in the flags of ARM_FLAGS (XSA, its layers, the optimizer); groups may set anything
but those and the runner's own flags (--seed, -o, --resume). The runner refuses a study whose arms set
anything else, and, after the runs, any two runs of one seed (in one group) whose run lines differ in more
than the arms' settings: so the runs of a seed share their initialisation (--seed) and their data and its
order (every data setting of the run line, a data seed included), and the arms are compared PAIRED by seed.

The analysis (per group), the report's sections in order:
  * primary: the pre-declared primary metric (final val bpb unless "primary" names another), paired by
    seed: per seed the difference arm - baseline; their mean, 95% t interval, paired t-test p (df n - 1), and
    how many seeds are worse / better; its p also Holm-adjusted over all the study's arm comparisons (every
    group x non-baseline arm); and the power line: the smallest true mean difference the paired t-test
    detects with 80% power at two-sided 0.05, given the observed sd of the differences and n (exact: the
    noncentral t distribution), absolute and as a % of the baseline's mean;
  * secondary metrics (best val bpb, the train loss over the last 10% of steps, CORE, SFT val bpb and
    ChatCORE where present, the XSA diagnostics), paired the same way, their p Holm-adjusted within each arm's
    comparison (the family: that arm's secondary metrics);
  * per arm unpaired: mean and sd over seeds, and Welch's test against the baseline (secondary: it ignores the
    pairing, and is what a study with unpaired runs would give);
  * with groups, the depth series: the primary effect per group, and per arm the change of the effect from
    the first group to the last, paired by seed (a seed's runs share their data order in every group);
  * with "claims", the XSA study's claims (stable training, bpb improves, the effect depends on depth,
    reduced self-alignment and diagonal behaviour) and the learnable alpha, each read by one rule (verdict): a
    difference supports a claim where its Holm-adjusted p is below 0.05 the claimed way, contradicts it where
    it is below the other way, else the study cannot tell; the depth claim by the least-squares slope of the
    per-seed differences against the number of layers (one t-test, df n - 2), with the seed-level check beside
    it (each seed's own slope, a t-test over the seeds' slopes), which does not take the pairs as independent.
The median ms per step is reported but not tested, and cost.png is not drawn, unless --idle-machine says
every run had its machine to itself (a shared machine's load, not XSA, decides step times).

The plots (in DIR; with groups, the per-group ones are NAME_GROUP.png): primary.png (the primary metric per
seed, each seed's runs joined, and the per-seed differences with their mean and 95% CI; a row per group),
loss.png, loss_diff.png (the paired train-loss difference against step, the lr multiplier on a second axis),
val_bpb.png, diagnostics.png (self weight and cos(y, v) per layer against step), alpha.png (learned alphas per
layer and head against step), depth.png (groups: the primary effect against depth with its 95% CI),
cost.png (--idle-machine only).

Standard library only (the t distribution through the regularised incomplete beta function, checked against
scipy in dev/test_study.py); every bad input ends with one "error:" line and exit code 1.
"""
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsa_cli  # noqa: E402
from compare_runs import CompareError, flatten_settings, load_run, smoothed_losses  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the flags an arm may set, and the run-line settings they change (everything else must be equal)
XSA_SETTINGS = ["model.xsa_alpha", "model.xsa_layers", "model.xsa_learnable", "optim.lr.xsa_alpha"]
ARM_FLAGS = {"-x": XSA_SETTINGS, "--xsa": XSA_SETTINGS, "--xsa-lr": ["optim.lr.xsa_alpha"],
             "--xsa-layers": ["model.xsa_layers"], "--optimizer": ["optim.*"], "--muon-eq": ["optim.muon_eq"],
             "--muon-plus": ["optim.muon_plus"], "--adamw-matrix-lr": ["optim.*"], "--adamw-matrix-wd": ["optim.matrix_adamw_wd"]}
RUNNER_FLAGS = {"--seed", "--data-seed", "-o", "--output", "--resume"}
# settings that may differ between runs whatever the arms: where and how a run was computed
FREE_SETTINGS = {"backend", "device", "xsa_fused"}
CONFIDENCE = 0.95
SIGNIFICANCE = 0.05  # a claim's verdict (claims_section): a Holm-adjusted p below it
POWER, POWER_ALPHA = 0.80, 0.05  # the power line: 80% power, two-sided 0.05
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a directory and a plot-file suffix

# The report's metrics: (key, label, which direction is better: "lower", "higher" or None for a diagnostic,
# which has none). The key is what a study file's "primary" names.
METRICS = [("val_bpb", "final val bpb", "lower"),
           ("best_val_bpb", "best val bpb", "lower"),
           ("train_loss", "train loss, last 10% of steps", "lower"),
           ("core", "CORE", "higher"),
           ("core_final", "CORE, all items (eval_core after the run)", "higher"),
           ("sft_val_bpb", "SFT val bpb", "lower"),
           ("chatcore", "ChatCORE", "higher"),
           ("cos_zv", "cos(z, v) after XSA (mean over layers)", None),
           ("cos_yv", "cos(y, v) before XSA (mean over layers)", None),
           ("self_weight", "self weight (mean over layers)", None),
           ("learned_alpha", "learned alpha (mean over layers and heads)", None),
           ("ms_per_step", "ms per step (median)", "lower")]
LABEL = {k: label for k, label, _ in METRICS}
BETTER = {k: better for k, _, better in METRICS}
NOT_PRIMARY = {"learned_alpha"}  # a baseline without XSA has no alpha: nothing to pair


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


def paired(diffs):
    """The paired t-test of the per-pair differences `diffs` (arm - baseline, one per seed): {"n", "mean",
    "sd", "ci", "p", "df"}, with sd, ci, p None where they cannot be computed (fewer than 2 pairs; ci and p
    also for differences without any spread, where t is not finite)."""
    n = len(diffs)
    out = {"n": n, "mean": statistics.fmean(diffs) if diffs else None, "sd": None, "ci": None, "p": None, "df": n - 1}
    if n < 2:
        return out
    out["sd"] = statistics.stdev(diffs)
    if out["sd"] == 0.0:
        return out
    se = out["sd"] / math.sqrt(n)
    half = t_quantile(0.5 + CONFIDENCE / 2.0, n - 1) * se
    out["ci"] = (out["mean"] - half, out["mean"] + half)
    out["p"] = t_two_sided_p(out["mean"] / se, n - 1)
    return out


def slope_coefficient(xs, ys):
    """The least-squares slope of ys on xs (two distinct xs or more)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def slope(xs, ys):
    """The least-squares line of ys on xs: (slope, its CONFIDENCE interval, the t-test's p-value for slope 0,
    df = n - 2), or None where it cannot be computed (fewer than 3 points, one x, or a perfect fit)."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = slope_coefficient(xs, ys)
    rss = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    if rss == 0.0:
        return None
    se = math.sqrt(rss / (n - 2) / sxx)
    half = t_quantile(0.5 + CONFIDENCE / 2.0, n - 2) * se
    return b, (b - half, b + half), t_two_sided_p(b / se, n - 2), n - 2


def holm(pvalues):
    """Holm's step-down adjustment of one family of p-values: sorted ascending, the j-th (from 0) of m
    becomes max over the first j + 1 of min(1, (m - i) p_(i)). None (not tested) stays None and is not
    counted in the family."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted, running = [None] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))  # max: adjusted p-values keep the order of the raw ones
        adjusted[i] = running
    return adjusted


def normal_cdf(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def paired_power(effect, n, alpha=POWER_ALPHA):
    """The power of the two-sided paired t-test at level alpha with n pairs when the true mean difference is
    `effect` standard deviations of the differences: P(|T| > t_crit), T noncentral t with n - 1 degrees of
    freedom and noncentrality effect * sqrt(n). Exact up to the quadrature: T = (Z + ncp) / W with Z standard
    normal and W = sqrt(chi2_df / df) (the sample sd over the true one), so P(T > c) = E_W[Phi(ncp - c W)]
    and P(T < -c) = E_W[Phi(-ncp - c W)], integrated over W's density by Simpson's rule."""
    df = n - 1
    crit = t_quantile(1.0 - alpha / 2.0, df)
    ncp = effect * math.sqrt(n)
    top = math.sqrt((df + 20.0 * math.sqrt(2.0 * df) + 50.0) / df)  # beyond it W's density is below 1e-12 for any df
    intervals = 4000
    h = top / intervals
    log_norm = math.log(2.0) + (df / 2.0) * math.log(df / 2.0) - math.lgamma(df / 2.0)
    total = 0.0
    for k in range(intervals + 1):
        w = k * h
        if w == 0.0:
            density = math.exp(log_norm) if df == 1 else 0.0  # w^(df-1) at 0
        else:
            density = math.exp(log_norm + (df - 1) * math.log(w) - df * w * w / 2.0)
        value = density * (normal_cdf(ncp - crit * w) + normal_cdf(-ncp - crit * w))
        total += value * (1 if k in (0, intervals) else 4 if k % 2 else 2)
    return total * h / 3.0


_detectable_cache = {}


def detectable_effect(n, power=POWER, alpha=POWER_ALPHA):
    """The smallest true mean difference, in standard deviations of the paired differences, that the
    two-sided paired t-test with n pairs detects with probability `power` at level alpha (bisection on
    paired_power, which grows with the effect); None for fewer than 2 pairs."""
    if n < 2:
        return None
    if (n, power, alpha) not in _detectable_cache:
        lo, hi = 0.0, 1.0
        while paired_power(hi, n, alpha) < power:
            lo, hi = hi, 2.0 * hi
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if paired_power(mid, n, alpha) < power else (lo, mid)
        _detectable_cache[(n, power, alpha)] = 0.5 * (lo + hi)
    return _detectable_cache[(n, power, alpha)]


# ----------------------------------------------------------------------------------------------------
# The study file and the runs

def flag_names(flags):
    """The option names of a string of flags (the words that start with '-' and are not negative numbers)."""
    return [w.split("=", 1)[0] for w in shlex.split(flags) if w.startswith("-") and not re.fullmatch(r"-[0-9.]+", w)]


def split_words(path, where, flags):
    """The words of a string of flags as a shell splits them, or one error naming where the string is (an
    unclosed quote)."""
    try:
        return shlex.split(flags)
    except ValueError as e:
        raise StudyError(f"'{path}': {where} cannot be split into words ({e}): {flags}")


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
    if not GROUP_NAME.fullmatch(study["name"]):  # the default output directory is dev/studies/out/NAME
        raise StudyError(f"'{path}': 'name' must be letters, digits and _.+- (it names the study's default directory), not '{study['name']}'")
    if not study["arms"] or not study["seeds"]:
        raise StudyError(f"'{path}': a study needs at least one arm and one seed")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in study["seeds"]) or len(set(study["seeds"])) != len(study["seeds"]):
        raise StudyError(f"'{path}': seeds must be distinct non-negative integers")
    for arm, flags in study["arms"].items():
        if not isinstance(flags, str) or not arm or "/" in arm or arm.startswith("."):
            raise StudyError(f"'{path}': arm '{arm}' must be a plain name with a string of flags")
        words = split_words(path, f"arm '{arm}'", flags)
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
        if (not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) or
                not set(seeds) <= set(study["seeds"]) or len(set(seeds)) != len(seeds)):
            raise StudyError(f"'{path}': 'arm_seeds' of '{arm}' must be distinct seeds taken from 'seeds' {study['seeds']}")
    if not isinstance(study.get("vary_data_order", False), bool):
        raise StudyError(f"'{path}': 'vary_data_order' must be true or false")
    for key in ("concurrent", "gpus_per_run"):
        if key in study and not (isinstance(study[key], int) and not isinstance(study[key], bool) and study[key] >= 1):
            raise StudyError(f"'{path}': '{key}' must be a whole number >= 1")
    for w in split_words(path, "'base'", study["base"]):
        if w.split("=", 1)[0] in RUNNER_FLAGS:
            raise StudyError(f"'{path}': 'base' sets {w}; the runner sets --seed, --data-seed and the output directory itself")
    if "groups" in study:
        groups = study["groups"]
        if not isinstance(groups, dict) or not groups:
            raise StudyError(f"'{path}': 'groups' must be a non-empty object of group name: train_gpt flags")
        for group, flags in groups.items():
            if not GROUP_NAME.fullmatch(group) or not isinstance(flags, str):
                raise StudyError(f"'{path}': group '{group}' must be a name of letters, digits and _.+- with a string of flags")
            split_words(path, f"group '{group}'", flags)
            for name in flag_names(flags):
                if name in RUNNER_FLAGS:
                    raise StudyError(f"'{path}': group '{group}' sets {name}; the runner sets --seed, --data-seed and the output directory itself")
                if name in ARM_FLAGS:  # else an arm would mean different things in different groups
                    raise StudyError(f"'{path}': group '{group}' sets {name}, an arm's flag; XSA and the optimizer belong in 'arms'")
    if "primary" in study:
        choices = [k for k, _, _ in METRICS if k not in NOT_PRIMARY and ("sft" in study or k not in ("sft_val_bpb", "chatcore"))]
        if study["primary"] not in choices:
            raise StudyError(f"'{path}': 'primary' must be one of {', '.join(choices)} (the default: val_bpb)")
    if "claims" in study:
        claims, baseline = study["claims"], next(iter(study["arms"]))
        if (not isinstance(claims, dict) or "xsa" not in claims or not set(claims) <= {"xsa", "learnable"} or
                any(not isinstance(a, str) or a not in study["arms"] or a == baseline for a in claims.values())):
            raise StudyError(f"'{path}': 'claims' must be an object {{\"xsa\": ARM, \"learnable\": ARM}} (learnable optional) naming "
                             f"arms other than the baseline '{baseline}'")
    if "core_final" in study:
        words = split_words(path, "'core_final'", study["core_final"]) if isinstance(study["core_final"], str) else []
        if "-c" not in words or any(w in ("-e", "-o") for w in words):
            raise StudyError(f"'{path}': 'core_final' must be a string of eval_core flags with -c DIR (the runner sets -e and -o)")
    if "sft" in study:
        words = split_words(path, "'sft'", study["sft"]) if isinstance(study["sft"], str) else []
        if "--sft" not in [w.split("=", 1)[0] for w in words]:
            raise StudyError(f"'{path}': 'sft' must be a string of chat_sft flags with --sft DIR")
        for w in words:
            if w.split("=", 1)[0] in RUNNER_FLAGS | {"--init-from"}:
                raise StudyError(f"'{path}': 'sft' sets {w}; the runner sets --init-from and the output directory itself")
    return study


def groups_of(study):
    """[(group, its flags)] in the study file's order; a study without "groups" is one unnamed group ("", "")
    whose runs lie directly under DIR/ARM/seed_S."""
    return list(study["groups"].items()) if "groups" in study else [("", "")]


def seeds_of(study, arm):
    """The seeds an arm runs (in every group): its 'arm_seeds' entry, or all of 'seeds'."""
    return study.get("arm_seeds", {}).get(arm, study["seeds"])


def run_dir_of(out_dir, group, arm, seed):
    return os.path.join(out_dir, group, arm, f"seed_{seed}")  # join drops the empty group of a study without groups


def run_name(group, arm, seed):
    return f"{group + '/' if group else ''}{arm} seed {seed}"


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


def start_run(binary, study, group, arm, seed, run_dir, slot):
    """Starts one train_gpt run (fresh or resumed) in the background: (process, its log file). A run_dir
    ending in /sft is the SFT stage of the run above it. On a study with 'concurrent' runs, slot s gets GPUs
    s * G .. s * G + G - 1 (G = 'gpus_per_run') as its CUDA_VISIBLE_DEVICES."""
    state = run_state(run_dir)
    sft = os.path.basename(run_dir) == "sft"
    if sft:  # chat_sft, beside the trainer
        argv = [os.path.join(os.path.dirname(binary), "chat_sft")] + [os.path.expanduser(w) for w in shlex.split(study["sft"])]
        if state != "resume":
            argv += ["--init-from", last_checkpoint(os.path.dirname(run_dir))]
    else:  # the group's flags after the base's, so a group may override a base flag (-d)
        words = shlex.split(study["base"]) + shlex.split(dict(groups_of(study))[group]) + shlex.split(study["arms"][arm])
        argv = ([binary] + [os.path.expanduser(w) for w in words] + ["--seed", str(seed)] +
                (["--data-seed", str(seed)] if study.get("vary_data_order") else []))
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
    print(f"study: {'resuming' if state == 'resume' else 'starting'} {run_name(group, arm, seed)}{' SFT' if sft else ''}{where}: "
          f"{shlex.join(argv)}", flush=True)
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    log = open(os.path.join(os.path.dirname(run_dir), "sft.log" if sft else f"seed_{seed}.log"), "a")
    return subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env), log


def core_final_binary(binary):
    """eval_core beside the trainer, built for the same backend."""
    return os.path.join(os.path.dirname(binary), "eval_core" if os.path.basename(binary).endswith("_cpu") else "eval_core_cuda")


def core_final(binary, study, run_dir):
    """Full CORE of a finished run (study key "core_final"): eval_core on its last checkpoint into
    RUN_DIR/core_final.csv (written atomically by eval_core, so a file there is complete)."""
    csv = os.path.join(run_dir, "core_final.csv")
    argv = ([core_final_binary(binary), "-e", last_checkpoint(run_dir)] + [os.path.expanduser(w) for w in shlex.split(study["core_final"])] +
            ["-o", csv])
    print(f"study: full CORE of {run_dir}: {shlex.join(argv)}", flush=True)
    with open(os.path.join(run_dir, "core_final.log"), "w") as log:
        code = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise StudyError(f"eval_core failed on {run_dir} (exit {code}); its output is in {os.path.join(run_dir, 'core_final.log')}")


def read_core_final(run_dir):
    """The CORE row of RUN_DIR/core_final.csv, or None."""
    try:
        with open(os.path.join(run_dir, "core_final.csv")) as f:
            rows = [line.rstrip("\n").split(",") for line in f]
    except OSError:
        return None
    return next((float(r[-1]) for r in rows if r and r[0] == "CORE"), None)


STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)  # what train_gpt answers with a checkpoint and a stop


def run_all(binary, study, todo, max_runs, drain):
    """Runs the (group, arm, seed, run_dir) of todo in order, 'concurrent' at a time (default 1), at most
    max_runs of them (-1: all). A SIGINT or SIGTERM reaches every running train_gpt, which checkpoints; no
    new run starts, and the runner exits with the signal's code once they have stopped. Once drain is
    non-empty (SIGUSR1: see main), no new run starts and the running ones finish."""
    running, stopped = {}, []  # slot -> (process, log, name, run directory)
    forward = lambda sig, frame: (stopped.append(sig), [r[0].send_signal(sig) for r in running.values()])  # noqa: E731
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    failure, started = None, 0
    try:
        while True:
            while todo and not stopped and not drain and failure is None and started != max_runs and len(running) < study.get("concurrent", 1):
                group, arm, seed, run_dir = todo.pop(0)
                slot = min(set(range(study.get("concurrent", 1))) - set(running))
                running[slot] = start_run(binary, study, group, arm, seed, run_dir, slot) + (run_name(group, arm, seed), run_dir)
                started += 1
            if not running:
                break
            pid, status = os.wait()
            slot = next(s for s, r in running.items() if r[0].pid == pid)
            proc, log, name, run_dir = running.pop(slot)
            proc.returncode = os.waitstatus_to_exitcode(status)
            log.close()
            code = proc.returncode
            if code in (129, 130, 143) or -code in STOP_SIGNALS:  # the trainer checkpointed and stopped (or died before its handler)
                print(f"study: {name} stopped by a signal with its checkpoint; rerun the same command to go on", flush=True)
                stopped.append(code)
            elif code == -signal.SIGKILL:  # kill -9 or the out-of-memory killer: no checkpoint then, the periodic ones stay
                print(f"study: {name} was killed (SIGKILL: kill -9, or the kernel short of memory); rerun the same command to go on "
                      "from its last checkpoint", flush=True)
                stopped.append(code)
            elif code != 0 and failure is None:  # an error, or a crash (SIGSEGV, SIGABRT, ...): not a stop to resume blindly
                how = f"died of {signal.Signals(-code).name}" if code < 0 else f"failed (exit {code})"
                failure = StudyError(f"{name} {how}; its output is in {log.name}")
            elif code == 0 and run_state(run_dir) != "done" and failure is None:  # else the study would go on as if it had
                failure = StudyError(f"{name} exited 0 without finishing (no evaluation at its last step in "
                                     f"{os.path.join(run_dir, 'metrics.jsonl')}: is the binary the trainer?); its output is in {log.name}")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if failure:
        raise failure
    if stopped:
        sys.exit(143 if signal.SIGTERM in stopped or 143 in stopped else 130)
    return started


def check_matched(study, runs, group=""):
    """Runs of one seed (in one group) must differ only in what their arms set: then they share their
    initialisation and their data and its order, and the arms can be compared paired by seed. Returns the
    seeds whose pairing cannot be checked (a run without a run line)."""
    allowed = set(FREE_SETTINGS)
    for flags in study["arms"].values():
        for w in shlex.split(flags)[::2]:
            allowed.update(ARM_FLAGS[w.split("=", 1)[0]])
    arms = list(study["arms"])
    unchecked = []
    for seed in study["seeds"]:
        have = [(arm, runs[arm][seed]) for arm in arms if seed in runs[arm]]
        if any(r["run"] is None for _, r in have):
            unchecked.append(seed)
            continue
        for arm, r in have[1:]:
            a, b = flatten_settings(have[0][1]["run"]), flatten_settings(r["run"])
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key) and key not in allowed and not ("optim.*" in allowed and key.startswith("optim.")):
                    raise StudyError(f"{group + ': ' if group else ''}seed {seed}: {have[0][0]} and {arm} differ in {key} "
                                     f"({json.dumps(a.get(key))} vs {json.dumps(b.get(key))}), which their arms do not set: "
                                     "not a matched comparison")
    return unchecked


def shared_order_settings(runs):
    """The run-line settings that fix a run's initialisation and data order (the seed, the data, a data seed
    or shuffle setting where a trainer writes one), as found in these runs: what a pair shares."""
    keys = set()
    for by_seed in runs.values():
        for r in by_seed.values():
            keys.update(k for k in flatten_settings(r["run"] or {}) if re.search(r"seed|data|shuffle|order", k))
    return sorted(keys)


# ----------------------------------------------------------------------------------------------------
# The analysis and the report

def last_alphas(r):
    """A learnable-alpha run's alphas at its last evaluation: {layer: [alpha per head]} ({} for a fixed alpha)."""
    return {int(layer): heads for layer, heads in r["xsa_alpha"][max(r["xsa_alpha"])]["alpha"].items()} if r["xsa_alpha"] else {}


def run_metrics(r, with_sft=False):
    """The metrics of one finished run, by METRICS key (None where a run has no such value); with_sft adds
    those of its finished SFT run r["sft"] (None where it has none)."""
    last = max(r["eval"]) if r["eval"] else None
    steps = sorted(r["train"])
    tail = steps[len(steps) - max(1, len(steps) // 10):] if steps else []
    timed = [r["train"][s]["dt_ms"] for s in steps if s > 0]
    diag = r["diag"][max(r["diag"])] if r["diag"] else None
    sft = r.get("sft")
    values = {"val_bpb": r["eval"][last]["val_bpb"] if last is not None else None,
              "best_val_bpb": min(e["val_bpb"] for e in r["eval"].values()) if r["eval"] else None,
              "train_loss": statistics.fmean(r["train"][s]["loss"] for s in tail) if tail else None,
              "core": r["core"][max(r["core"])]["core"] if r["core"] else None,
              "core_final": r.get("core_final"),
              "cos_zv": statistics.fmean(diag["cos_zv"]) if diag else None,
              "cos_yv": statistics.fmean(diag["cos_yv"]) if diag else None,
              "self_weight": statistics.fmean(diag["self_weight"]) if diag else None,
              "learned_alpha": statistics.fmean(a for heads in last_alphas(r).values() for a in heads) if r["xsa_alpha"] else None,
              "ms_per_step": statistics.median(timed) if timed else None}
    if with_sft:
        values["sft_val_bpb"] = sft["eval"][max(sft["eval"])]["val_bpb"] if sft and sft["eval"] else None
        values["chatcore"] = sft["chatcore"][max(sft["chatcore"])].get("chatcore") if sft and sft["chatcore"] else None
    return values


def primary_of(study):
    return study.get("primary", "val_bpb")


def compare_paired(values, arm, base, key):
    """arm against base on one metric, paired by seed: paired()'s fields, and "seeds" (those both have),
    "diffs" (arm - base per seed), "base_mean", "arm_mean" (over those seeds), "worse"/"better" (or, for a
    metric without a better direction, "higher"/"lower": the count of seeds on each side), "detectable" (the
    smallest true difference detectable with POWER, in the metric's units, or None)."""
    seeds = [s for s in sorted(values[arm]) if s in values[base] and values[arm][s][key] is not None and values[base][s][key] is not None]
    diffs = [values[arm][s][key] - values[base][s][key] for s in seeds]
    res = paired(diffs)
    higher, lower = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    res.update(seeds=seeds, diffs=diffs, higher=higher, lower=lower,
               worse=higher if BETTER[key] == "lower" else lower if BETTER[key] == "higher" else None,
               better=lower if BETTER[key] == "lower" else higher if BETTER[key] == "higher" else None,
               base_mean=statistics.fmean(values[base][s][key] for s in seeds) if seeds else None,
               arm_mean=statistics.fmean(values[arm][s][key] for s in seeds) if seeds else None,
               detectable=detectable_effect(len(diffs)) * res["sd"] if res["sd"] else None)
    return res


def tested_metrics(study, idle):
    """The metrics given paired tests: every one with a baseline value to pair with; the step time only
    when the machine was idle (else its differences are the machine's load)."""
    return [k for k, _, _ in METRICS if k not in NOT_PRIMARY and (k != "ms_per_step" or idle) and
            ("sft" in study or k not in ("sft_val_bpb", "chatcore"))]


def analyse(study, runs, idle):
    """{group: {"values": {arm: {seed: metrics}}, "primary": {arm: compare_paired}, "secondary": {arm: {key:
    compare_paired, with "holm"}}}} for every group, the primary's "holm" over every (group, arm)."""
    arms = list(study["arms"])
    base, key = arms[0], primary_of(study)
    out = {}
    for group, _ in groups_of(study):
        values = {arm: {s: run_metrics(r, "sft" in study) for s, r in runs[group][arm].items()} for arm in arms}
        present = [k for k in tested_metrics(study, idle) if k != key and any(v[k] is not None for a in arms for v in values[a].values())]
        secondary = {}
        for arm in arms[1:]:
            secondary[arm] = {k: compare_paired(values, arm, base, k) for k in present}
            for k, p in zip(present, holm([secondary[arm][k]["p"] for k in present])):
                secondary[arm][k]["holm"] = p
        out[group] = {"values": values, "primary": {arm: compare_paired(values, arm, base, key) for arm in arms[1:]},
                      "secondary": secondary}
    for g in out:  # the pairs the study plans for each arm: its seeds that the baseline runs too
        for arm in arms[1:]:
            planned = len(set(seeds_of(study, arm)) & set(seeds_of(study, base)))
            for c in [out[g]["primary"][arm]] + list(out[g]["secondary"][arm].values()):
                c["planned"] = planned
    family = [(g, arm) for g in out for arm in out[g]["primary"]]
    for (g, arm), p in zip(family, holm([out[g]["primary"][arm]["p"] for g, arm in family])):
        out[g]["primary"][arm]["holm"] = p
    return out


def num(x, digits=4, sign=False):
    """x with `digits` decimals (a sign with sign=True), "n/a" for None; never "-0.0000"."""
    if x is None:
        return "n/a"
    text = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return text.replace("-", "+", 1) if sign and float(text) == 0 else text.replace("-", "", 1) if float(text) == 0 else text


def pval(p):
    return "n/a" if p is None else f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def digits_of(key):
    return 1 if key == "ms_per_step" else 4


def interval(c, key):
    return f"[{num(c['ci'][0], digits_of(key), True)}, {num(c['ci'][1], digits_of(key), True)}]" if c["ci"] else "n/a"


def relative(x, base_mean):
    return f"{100.0 * x / abs(base_mean):+.2f}%" if x is not None and base_mean else "n/a"


def sides(c):
    """'worse 5 / better 0 of 5' (or higher / lower for a metric without a better direction), with ' (5 planned)'
    while fewer pairs than the study plans have finished."""
    planned = f" ({c['planned']} planned)" if c.get("planned", c["n"]) > c["n"] else ""
    if c["worse"] is not None:
        return f"worse {c['worse']} / better {c['better']} of {c['n']}{planned}"
    return f"higher {c['higher']} / lower {c['lower']} of {c['n']}{planned}"


def report(study, out_dir, runs, analysis, idle, unchecked):
    arms = list(study["arms"])
    base, key = arms[0], primary_of(study)
    groups = groups_of(study)
    has_groups = "groups" in study
    h = "#" if has_groups else ""  # a study with groups has a section per group, one level down
    finished = "; ".join((f"{g}: " if g else "") + ", ".join(f"{a} {len(runs[g][a])}/{len(seeds_of(study, a))}" for a in arms)
                         for g, _ in groups)
    lines = [f"# Study: {study['name']}", ""] + ([study["note"], ""] if isinstance(study.get("note"), str) else []) + [
             f"Base flags: `{study['base']}`; arms: " + ", ".join(f"**{a}** (`{study['arms'][a] or 'no flags'}`)" for a in arms) +
             f"; seeds {study['seeds']}. Baseline: **{base}**. " +
             ("Groups (every arm and seed at each group's flags, after the base's): " +
              ", ".join(f"**{g}** (`{f or 'no flags'}`)" for g, f in groups) + ". " if has_groups else "") +
             f"Finished runs: {finished}.", ""]
    shared = sorted(set().union(*(shared_order_settings(runs[g]) for g, _ in groups)))
    n_primary = sum(len(a["primary"]) for a in analysis.values())
    lines += ["## How the arms are compared", "",
              "Runs of one seed share their initialisation and their data order: the runner checked that their run lines differ "
              "only in the arms' settings" + (f" (so they share {', '.join(f'`{k}`' for k in shared)})" if shared else "") +
              ". So each arm is compared with the baseline **paired by seed**: per seed the difference arm − baseline, then "
              "the mean difference, its 95% t interval (n − 1 degrees of freedom), the paired t-test's p-value and how many "
              "seeds are worse or better." + same_order_note(runs, shared),
              "",
              f"* Primary metric, one, named by the study file (its \"primary\", to be set before the runs; default the final val bpb): "
              f"**{LABEL[key]}**. Its p-value is given as it is and Holm-adjusted over the study's {n_primary} "
              f"comparison{'s' if n_primary != 1 else ''} of an arm with the baseline{' (every group and arm)' if has_groups else ''}.",
              "* Secondary metrics: p-values Holm-adjusted within each arm's comparison (the family: that arm's secondary metrics).",
              f"* Power: the smallest true mean difference the paired t-test detects with {POWER:.0%} power at two-sided "
              f"{POWER_ALPHA}, given n and the observed sd of the differences, computed exactly from the noncentral t "
              "distribution (not the normal approximation). It takes the observed sd as the true one: with few seeds it "
              "is itself uncertain.",
              "* Unpaired means, sds and Welch's t-test come last: secondary, they ignore the pairing.", ""]
    for g, seeds in unchecked.items():
        lines += [f"**Warning**: {g + ': ' if g else ''}seed(s) {seeds} have runs without a run line: their pairing could not be checked.", ""]

    for group, flags in groups:
        a = analysis[group]
        values = a["values"]
        if has_groups:
            lines += [f"## Group {group} (`{flags or 'no flags'}`)", ""]
        better = f" ({BETTER[key]} is better)" if BETTER[key] else ""
        lines += [f"{h}## Primary: {LABEL[key]}{better}, paired by seed", ""]
        if len(arms) < 2:
            lines += ["One arm: nothing to compare.", ""]
        else:
            lines += [f"| arm | pairs | {base} | arm | difference | 95% CI | relative | paired t p | Holm p ({n_primary}) | seeds |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for arm, c in a["primary"].items():
                lines.append(f"| {arm} | {c['n']} | {num(c['base_mean'])} | {num(c['arm_mean'])} | {num(c['mean'], 4, True)} | "
                             f"{interval(c, key)} | {relative(c['mean'], c['base_mean'])} | {pval(c['p'])} | {pval(c['holm'])} | {sides(c)} |")
            all_seeds = sorted(set().union(*(c["seeds"] for c in a["primary"].values())))
            lines += ["", f"Per seed, arm − {base}:" if all_seeds else f"No seed has finished runs of {base} and another arm."]
            if all_seeds:
                lines += ["", "| seed | " + " | ".join(a["primary"]) + " |", "|---|" + "---|" * len(a["primary"])]
            for s in all_seeds:
                lines.append(f"| {s} | " + " | ".join(num(c["diffs"][c["seeds"].index(s)], 4, True) if s in c["seeds"] else ""
                                                     for c in a["primary"].values()) + " |")
            lines += ["", f"Power ({POWER:.0%}, two-sided {POWER_ALPHA}, exact noncentral t):", ""]
            for arm, c in a["primary"].items():
                if c["detectable"] is None:
                    lines.append(f"* {arm}: n/a ({c['n']} pair{'s' if c['n'] != 1 else ''}" +
                                 (", no spread" if c["n"] > 1 else "") + ")")
                else:
                    lines.append(f"* {arm}: with {c['n']} pairs and an sd of the differences of {num(c['sd'])}, the smallest true "
                                 f"difference detectable is {num(c['detectable'])} ({relative(c['detectable'], c['base_mean']).lstrip('+')} "
                                 f"of the baseline's mean {num(c['base_mean'])}); the observed difference is "
                                 f"{num(c['mean'], 4, True)} ({relative(c['mean'], c['base_mean'])}).")
            lines.append("")

            lines += [f"{h}## Secondary metrics, paired by seed (Holm-adjusted within each arm)", ""]
            rows = [(arm, k, c) for arm, by_key in a["secondary"].items() for k, c in by_key.items() if c["n"]]
            if rows:
                lines += ["| arm | metric | pairs | difference | 95% CI | relative | paired t p | Holm p | seeds |",
                          "|---|---|---|---|---|---|---|---|---|"]
                for arm, k, c in rows:
                    label = LABEL[k] + (f" ({BETTER[k]} is better)" if BETTER[k] else "")
                    lines.append(f"| {arm} | {label} | {c['n']} | {num(c['mean'], digits_of(k), True)} | {interval(c, k)} | "
                                 f"{relative(c['mean'], c['base_mean'])} | {pval(c['p'])} | {pval(c.get('holm'))} | {sides(c)} |")
            else:
                lines.append("No secondary metric has pairs.")
            lines.append("")

        lines += [f"{h}## Per arm, unpaired (mean and sd over seeds; Welch's t-test against the baseline: secondary)", "",
                  "| metric | arm | n | mean | sd | difference from baseline | 95% CI (Welch) | Welch p |", "|---|---|---|---|---|---|---|---|"]
        for k, label, _ in METRICS:
            if not any(v.get(k) is not None for x in arms for v in values[x].values()):
                continue
            base_vals = [v[k] for v in values[base].values() if v.get(k) is not None]
            for arm in arms:
                vals = [v[k] for v in values[arm].values() if v.get(k) is not None]
                if not vals and arm != base:  # an arm without the metric (a fixed alpha has no learned alpha)
                    continue
                d = digits_of(k)
                diff = ci = p = ""
                if arm != base and vals and base_vals and k in tested_metrics(study, idle):
                    diff = num(statistics.fmean(vals) - statistics.fmean(base_vals), d, True)
                    w = welch(base_vals, vals)
                    ci, p = (f"[{num(w[1][0], d, True)}, {num(w[1][1], d, True)}]", pval(w[2])) if w else ("n/a", "n/a")
                lines.append(f"| {label} | {arm} | {len(vals)} | {num(statistics.fmean(vals), d) if vals else 'n/a'} | "
                             f"{num(statistics.stdev(vals), d) if len(vals) > 1 else 'n/a'} | {diff} | {ci} | {p} |")
        lines.append("")
        if not idle:
            lines += ["The ms per step are not compared: nothing records that the machine ran nothing else, and a shared machine's "
                      "load decides step times (--idle-machine, for runs that had their machines to themselves, tests them and draws cost.png).", ""]

    if has_groups and len(arms) > 1:
        lines += [f"## Depth series: {LABEL[key]}, arm − {base} per group", "",
                  f"| arm | group | layers | pairs | difference | 95% CI | relative | paired t p | Holm p ({n_primary}) | seeds |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for arm in arms[1:]:
            for g, _ in groups:
                c = analysis[g]["primary"][arm]
                lines.append(f"| {arm} | {g} | {group_layers(runs[g]) or 'n/a'} | {c['n']} | {num(c['mean'], 4, True)} | {interval(c, key)} | "
                             f"{relative(c['mean'], c['base_mean'])} | {pval(c['p'])} | {pval(c['holm'])} | {sides(c)} |")
        first, last = groups[0][0], groups[-1][0]
        if first != last:
            lines += ["", f"The change of the effect from {first} to {last}, paired by seed (per seed, its difference in {last} minus its "
                      f"difference in {first}: a seed's runs share their data order in every group; the paired t-test over the seeds "
                      "that have both):", ""]
            for arm in arms[1:]:
                c = change_by_seed(analysis[first]["primary"][arm], analysis[last]["primary"][arm])
                lines.append(f"* {arm}: " + (f"{num(c['mean'], 4, True)}, 95% CI [{num(c['ci'][0], 4, True)}, {num(c['ci'][1], 4, True)}], "
                                             f"paired t p {pval(c['p'])}, larger in {c['higher']} / smaller in {c['lower']} of {c['n']} seeds"
                                             if c["ci"] else f"n/a ({c['n']} seed{'s' if c['n'] != 1 else ''} in both groups; needs 2 with some spread)"))
        lines.append("")
    if "claims" in study:
        lines += claims_section(study, runs, analysis)
    path = os.path.join(out_dir, "report.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    return path


def change_by_seed(first, last):
    """The change of a paired effect between two groups, paired by seed: paired() of (last - first) over the
    seeds both compare_paired results `first` and `last` have, with "higher"/"lower" (seeds whose difference
    grew / shrank)."""
    before = dict(zip(first["seeds"], first["diffs"]))
    changes = [d - before[s] for s, d in zip(last["seeds"], last["diffs"]) if s in before]
    out = paired(changes)
    out.update(higher=sum(c > 0 for c in changes), lower=sum(c < 0 for c in changes))
    return out


def depth_points(analysis, runs, groups, arm):
    """Per seed, its primary differences (arm - baseline) with the number of layers of their groups:
    {seed: [(layers, difference)]}, over the groups whose runs say their number of layers."""
    by_seed = {}
    for g in groups:
        layers, c = group_layers(runs[g]), analysis[g]["primary"][arm]
        if layers:
            for s, d in zip(c["seeds"], c["diffs"]):
                by_seed.setdefault(s, []).append((layers, d))
    return by_seed


def verdict(c, claimed_lower):
    """A claim's verdict from a paired comparison c (with its Holm-adjusted "holm"): "supports" where the adjusted
    p is below SIGNIFICANCE and the difference goes the claimed way (lower, or higher), "contradicts" where it
    goes the other way, else "cannot tell"."""
    if c.get("holm") is None or c["holm"] >= SIGNIFICANCE:
        return "cannot tell"
    return "supports" if (c["mean"] < 0) == claimed_lower else "contradicts"


def effect_text(c, key):
    """'+0.0045 (+0.25%), 95% CI [+0.0005, +0.0086], Holm p 0.107, worse 5 / better 0 of 5'"""
    if not c["n"]:
        return "no pairs yet"
    return (f"{num(c['mean'], digits_of(key), True)} ({relative(c['mean'], c['base_mean'])}), 95% CI {interval(c, key)}, "
            f"Holm p {pval(c.get('holm'))}, {sides(c)}")


def claims_section(study, runs, analysis):
    """The report's reading of the XSA study's claims (study["claims"] names the XSA arm and the learnable one),
    each by verdict()'s rule."""
    arms = list(study["arms"])
    base, key = arms[0], primary_of(study)
    xsa, learn = study["claims"]["xsa"], study["claims"].get("learnable")
    groups = [g for g, _ in groups_of(study)]

    def where(g):
        layers = group_layers(runs[g])
        return (f"{g} ({layers} layers)" if layers else g) if g else "the study"

    lines = ["## The study's claims at this scale", "",
             f"Each claim is read from the tables above by study.py's rule (its verdict): a paired difference **supports** "
             f"a claim where its Holm-adjusted p is below {SIGNIFICANCE} and it goes the claimed way, **contradicts** it where "
             f"the adjusted p is below {SIGNIFICANCE} and it goes the other way, and otherwise this study **cannot tell** (the "
             f"power lines above say how small an effect it could have seen). The XSA arm is **{xsa}**"
             + (f", the learnable one **{learn}**." if learn else ".")
             + (" While fewer pairs than planned have finished (\"of n (N planned)\"), a verdict is interim: with 2 pairs the "
                "t-test has 1 degree of freedom and its sd comes from two numbers, so two differences that happen to agree "
                "give a small p." if any(c["n"] < c["planned"] for g in groups for c in analysis[g]["primary"].values()) else ""), ""]
    finished = sum(len(runs[g][a]) for g in groups for a in (xsa, learn) if a)
    loss = "; ".join(f"{where(g)} {effect_text(analysis[g]['secondary'][xsa]['train_loss'], 'train_loss')}" for g in groups
                     if "train_loss" in analysis[g]["secondary"][xsa] and analysis[g]["secondary"][xsa]["train_loss"]["n"])
    lines.append(f"1. *Training is stable under Muon: no divergence, no NaN, loss curves close to the baseline's.* "
                 f"**{'Supports' if finished else 'Cannot tell'}** no divergence: {finished} run{'s' if finished != 1 else ''} with XSA "
                 "finished (train_gpt stops a run at the first non-finite loss, gradient or weight, and the study stops with it)."
                 + (f" The training loss over the last 10% of steps, {xsa} − {base}: {loss}." if loss else ""))
    claim = [f"{where(g)}: no pairs yet" if not analysis[g]["primary"][xsa]["n"] else
             f"{where(g)}: **{verdict(analysis[g]['primary'][xsa], True)}**, {effect_text(analysis[g]['primary'][xsa], key)}"
             + (f"; detectable at 80% power: {num(analysis[g]['primary'][xsa]['detectable'])} "
                f"({relative(analysis[g]['primary'][xsa]['detectable'], analysis[g]['primary'][xsa]['base_mean']).lstrip('+')})"
                if analysis[g]["primary"][xsa]["detectable"] is not None else "") for g in groups]
    lines.append(f"2. *XSA improves held-out {LABEL[key]} (the study: -0.32% at d12, -0.31% at d24).* " + "; ".join(claim) + ".")
    by_seed_points = depth_points(analysis, runs, groups, xsa)
    points = [p for _, pts in sorted(by_seed_points.items()) for p in pts]
    fit = slope([x for x, _ in points], [y for _, y in points])
    depths = sorted({x for x, _ in points})
    slopes = paired([slope_coefficient([x for x, _ in pts], [y for _, y in pts]) for _, pts in sorted(by_seed_points.items())
                     if len({x for x, _ in pts}) > 1])
    by_seed = (f" The same with the seeds as the units, a check that needs no such independence (each seed's own least-squares "
               f"slope over the depths it has, then the t-test of the {slopes['n']} seeds' slopes against 0, df {slopes['n'] - 1}): "
               + (f"{num(slopes['mean'], 4, True)} per layer, 95% CI [{num(slopes['ci'][0], 4, True)}, {num(slopes['ci'][1], 4, True)}], "
                  f"p {pval(slopes['p'])}." if slopes["ci"] else "n/a (needs 2 seeds with pairs at two depths or more, with some spread).")
               if slopes["n"] else "")
    if fit:
        lines.append(f"3. *XSA's effect depends on depth.* **{'Supports' if fit[2] < SIGNIFICANCE else 'Cannot tell'}**: the per-seed "
                     f"{LABEL[key]} differences against the number of layers ({len(points)} pairs at depths "
                     f"{', '.join(map(str, depths))}; least squares, one test, which takes the pairs as independent though a "
                     f"seed's runs at every depth share its data order) change by {num(fit[0], 4, True)} per layer, 95% CI "
                     f"[{num(fit[1][0], 4, True)}, {num(fit[1][1], 4, True)}], p {pval(fit[2])}." + by_seed)
    else:
        lines.append(f"3. *XSA's effect depends on depth.* **Cannot tell**: a slope needs pairs at two depths or more and 3 pairs "
                     f"in all ({len(points)} at depths {', '.join(map(str, depths)) or 'none'})." + by_seed)
    diag = []
    for g in groups:
        sec = analysis[g]["secondary"][xsa]
        parts = [f"{what} **{verdict(sec[k], True)}**, {effect_text(sec[k], k)}" for k, what in
                 (("self_weight", "self weight"), ("cos_yv", "cos(y, v)")) if k in sec]
        if parts:
            diag.append(f"{where(g)}: " + "; ".join(parts))
    lines.append("4. *Attention shows reduced self-alignment and reduced diagonal behaviour under XSA.* The attention's own weight "
                 "on its token (self weight) and the alignment of its output with the token's value before XSA (cos(y, v)), "
                 f"{xsa} − {base} (cos(z, v) after XSA is 0 by construction at alpha 1 and says nothing): "
                 + ("; ".join(diag) if diag else "no diagnostics yet") + ".")
    if learn:
        parts = []
        for g in groups:
            alphas = [v["learned_alpha"] for v in analysis[g]["values"][learn].values() if v.get("learned_alpha") is not None]
            band = paired(alphas)
            a = (f"alpha ends at {num(band['mean'], 3)}" + (f", 95% CI [{num(band['ci'][0], 3)}, {num(band['ci'][1], 3)}]" if band["ci"] else "")
                 + f" (mean over layers and heads, {len(alphas)} seed{'s' if len(alphas) != 1 else ''})") if alphas else "no runs yet"
            c = analysis[g]["primary"][learn]
            parts.append(f"{where(g)}: {a}; {LABEL[key]} **{verdict(c, True)}**, {effect_text(c, key)}" if c["n"] else f"{where(g)}: no pairs yet")
        lines.append(f"5. *A learnable alpha (this project's question, not a claim of the study): where training takes it, and "
                     f"whether it improves {LABEL[key]}.* " + "; ".join(parts) + ".")
    return lines + [""]


def same_order_note(runs, shared):
    """A sentence for a data-order setting (a data seed, a shuffle) that is one value in every run of the
    study: then the seeds vary the initialisation alone, and the spread over seeds says nothing of the data
    order's. "" where there is none (or it varies)."""
    notes = []
    for k in shared:
        if re.search(r"data_seed|data\.seed|shuffle", k):
            found = {json.dumps(flatten_settings(r["run"]).get(k)) for by_arm in runs.values() for by_seed in by_arm.values()
                     for r in by_seed.values() if r["run"]}
            if len(found) == 1:
                notes.append(f"`{k}` is {found.pop()} in every run")
    if not notes:
        return ""
    return (f" ({'; '.join(notes)}: the seeds vary the initialisation only, not the data order, so the spread over seeds is "
            "initialisation noise alone.)")


def group_layers(runs):
    """The number of layers of a group's runs (from their run lines), or None where they do not say or differ."""
    layers = {(r["run"] or {}).get("model", {}).get("n_layer") for by_seed in runs.values() for r in by_seed.values()}
    return layers.pop() if len(layers) == 1 and None not in layers else None


# ----------------------------------------------------------------------------------------------------
# The plots

def mean_band(curves):
    """{step: value} per seed -> (the steps every seed has, the mean there, the half-width of its 95% t
    interval over the seeds there, or None for a single seed)."""
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    mean = [statistics.fmean(c[s] for c in curves) for s in steps]
    if len(curves) < 2:
        return steps, mean, None
    t = t_quantile(0.5 + CONFIDENCE / 2.0, len(curves) - 1)
    return steps, mean, [t * statistics.stdev(c[s] for c in curves) / math.sqrt(len(curves)) for s in steps]


def prefix_steps(*runs):
    """The training steps 0, 1, .. that every run completed (the EMA smoothing runs over consecutive steps)."""
    common = set.intersection(*(set(r["train"]) for r in runs))
    return [s for s in sorted(common) if s < len(common)]


def legend(ax, **kw):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def plot_study(study, out_dir, runs, analysis, idle, plt):
    """The report's PNG files in out_dir; returns [(file name, caption)] in the report's order. The
    baseline is black and drawn last in every plot, so no arm hides it."""
    arms = list(study["arms"])
    base, key = arms[0], primary_of(study)
    groups = [g for g, _ in groups_of(study)]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {base: "black", **{a: palette[k % len(palette)] for k, a in enumerate(arms[1:])}}
    draw_order = arms[1:] + [base]
    seed_color = {s: plt.cm.tab10(k % 10) for k, s in enumerate(study["seeds"])}
    written = []

    def save(fig, stem, group, caption):
        fig.tight_layout()
        name = f"{stem}_{group}.png" if group else f"{stem}.png"
        path = os.path.join(out_dir, name)
        fig.savefig(path + ".tmp", dpi=100, format="png")  # whole files only: a reader never sees a half-written plot
        os.replace(path + ".tmp", path)
        plt.close(fig)
        written.append((name, caption + (f" (group {group})" if group else "")))

    def where(group):
        return f"{group}: " if group else ""

    # primary.png: the primary metric per seed, each seed's runs joined (the pairing), and the differences
    rows = [g for g in groups if any(v[key] is not None for a in arms for v in analysis[g]["values"][a].values())]
    if rows:
        fig, axes = plt.subplots(len(rows), 2, figsize=(12, 4.5 * len(rows)), squeeze=False)
        for (ax, dax), g in zip(axes, rows):
            values = analysis[g]["values"]
            for s in study["seeds"]:
                xs = [i for i, a in enumerate(arms) if s in values[a] and values[a][s][key] is not None]
                ax.plot(xs, [values[arms[i]][s][key] for i in xs], "o-", color=seed_color[s], alpha=0.8, markersize=5, label=f"seed {s}")
            for i, a in enumerate(arms):
                vals = [v[key] for v in values[a].values() if v[key] is not None]
                if vals:
                    ax.plot([i - 0.2, i + 0.2], [statistics.fmean(vals)] * 2, color="black", linewidth=2.5,
                            label="mean over seeds" if i == 0 else None)
            ax.set_xticks(range(len(arms)), arms)
            ax.set(title=f"{where(g)}{LABEL[key]} per seed (lines join a seed's runs)", ylabel=LABEL[key])
            ax.grid(alpha=0.3)
            legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the axes: it hides no seed
            comp = analysis[g]["primary"]
            for i, (a, c) in enumerate(comp.items()):
                for s, d in zip(c["seeds"], c["diffs"]):
                    dax.scatter([i - 0.1], [d], color=seed_color[s], s=25, zorder=3)
                if c["mean"] is not None:
                    err = [[c["mean"] - c["ci"][0]], [c["ci"][1] - c["mean"]]] if c["ci"] else None
                    dax.errorbar([i + 0.15], [c["mean"]], yerr=err, fmt="s", color="black", capsize=5, markersize=6, linewidth=2)  # black: the seeds have the colours
            dax.axhline(0.0, color="black", linewidth=0.8)
            dax.set_xticks(range(len(comp)), list(comp))
            dax.set_xlim(-0.6, max(len(comp), 1) - 0.4)
            dax.set(title=f"{where(g)}arm − {base} per seed (square: mean, 95% CI)", ylabel=f"{LABEL[key]} difference")
            dax.grid(alpha=0.3)
        save(fig, "primary", "", f"{LABEL[key]} per seed with each seed's runs joined; right: the per-seed differences from the "
             "baseline, their mean and 95% CI")

    if "groups" in study and len(arms) > 1:
        plot_depth(study, runs, analysis, plt, color, save)

    for g in groups:
        have = [a for a in draw_order if runs[g][a]]
        if not have:
            continue
        group_runs = runs[g]

        fig, (full, zoom) = plt.subplots(1, 2, figsize=(12, 4.5))
        last_step, tail_values = 0, []
        for a in have:
            curves = []
            for r in group_runs[a].values():
                steps = prefix_steps(r)
                curves.append(smoothed_losses(r["train"], steps))
                full.scatter(steps, [r["train"][s]["loss"] for s in steps], color=color[a], alpha=0.1, s=2)  # raw, under the curves
                for ax in (full, zoom):
                    ax.plot(steps, [curves[-1][s] for s in steps], color=color[a], alpha=0.3, linewidth=0.7)
            steps, mean, _ = mean_band(curves)
            for ax in (full, zoom):
                ax.plot(steps, mean, color=color[a], linewidth=2, linestyle="--" if a == base else "-", zorder=4 if a == base else 3,
                        label=f"{a} (mean of {len(curves)})")
            last_step = max(last_step, steps[-1])
            tail_values += [c[s] for c in curves for s in steps if s >= 0.7 * steps[-1]]
        zoom.set_xlim(0.7 * last_step, last_step)  # where the arms are close: its own y range
        margin = 0.05 * (max(tail_values) - min(tail_values)) + 1e-6
        zoom.set_ylim(min(tail_values) - margin, max(tail_values) + margin)
        full.set_title(f"{where(g)}training loss\n(dots: raw; thin: each seed, EMA 0.9; thick: mean over seeds)", fontsize=10)
        full.set(xlabel="step", ylabel="loss")
        zoom.set_title(f"{where(g)}the last 30% of the steps", fontsize=10)
        zoom.set(xlabel="step")
        for ax in (full, zoom):
            ax.grid(alpha=0.3)
            legend(ax)
        save(fig, "loss", g, "training loss per arm: raw, each seed smoothed, the mean over seeds; right: the last 30% of the steps")

        if any(set(group_runs[a]) & set(group_runs[base]) for a in arms[1:]):
            plot_loss_diff(g, group_runs, arms, color, plt, save, where)

        fig, (bpb, diff) = plt.subplots(1, 2, figsize=(12, 4.5))
        for a in have:
            curves = [{s: e["val_bpb"] for s, e in r["eval"].items()} for r in group_runs[a].values()]
            for c in curves:
                bpb.plot(sorted(c), [c[s] for s in sorted(c)], color=color[a], alpha=0.3, linewidth=0.7)
            steps, mean, _ = mean_band(curves)
            bpb.plot(steps, mean, marker="o", color=color[a], linewidth=2, markersize=3, linestyle="--" if a == base else "-",
                     zorder=4 if a == base else 3, label=f"{a} (mean of {len(curves)})")
            if a == base:
                continue
            seeds = sorted(set(group_runs[a]) & set(group_runs[base]))
            pairs = [{s: group_runs[a][k]["eval"][s]["val_bpb"] - group_runs[base][k]["eval"][s]["val_bpb"]
                      for s in group_runs[a][k]["eval"] if s in group_runs[base][k]["eval"]} for k in seeds]
            if not pairs:
                continue
            steps, mean, half = mean_band(pairs)
            diff.plot(steps, mean, "o-", color=color[a], markersize=3, label=f"{a} − {base} ({len(pairs)} seeds)")
            if half:
                diff.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], color=color[a], alpha=0.2)
        diff.axhline(0.0, color="black", linewidth=0.8)
        bpb.set_title(f"{where(g)}validation bpb (thin: each seed; thick: mean)", fontsize=10)
        bpb.set(xlabel="step", ylabel="bpb")
        diff.set_title(f"{where(g)}arm − {base}, paired by seed (band: 95% CI)", fontsize=10)
        diff.set(xlabel="step", ylabel="bpb difference")
        for ax in (bpb, diff):
            ax.grid(alpha=0.3)
            legend(ax)
        save(fig, "val_bpb", g, "val bpb per arm, and each arm's difference from the baseline paired by seed with its 95% band")

        with_diag = [a for a in arms if group_runs[a] and all(r["diag"] for r in group_runs[a].values())]
        if with_diag:
            plot_diagnostics(g, group_runs, with_diag, plt, save, where)
        learned = [a for a in arms if group_runs[a] and all(r["xsa_alpha"] for r in group_runs[a].values())]
        if learned:
            plot_alphas(g, group_runs, learned, plt, save, where)

        if idle:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for k, a in enumerate(arms):
                medians = [m for m in (run_metrics(r)["ms_per_step"] for r in group_runs[a].values()) if m is not None]
                ax.scatter([k] * len(medians), medians, color=color[a], alpha=0.6)
                if medians:
                    ax.plot([k - 0.25, k + 0.25], [statistics.fmean(medians)] * 2, color=color[a], linewidth=2)
            ax.set_xticks(range(len(arms)), arms)
            ax.set_title(f"{where(g)}median ms per step of each run (bar: mean); idle machines", fontsize=10)
            ax.set(ylabel="ms per step")
            ax.grid(alpha=0.3)
            save(fig, "cost", g, "the median ms per step of each run (--idle-machine: the runs had their machines to themselves)")
    return written


def plot_loss_diff(g, group_runs, arms, color, plt, save, where):
    """The paired training-loss difference arm - baseline against step (each seed's difference, EMA-smoothed
    as the console smooths losses, the mean over seeds with its 95% band; the raw differences' mean as dots),
    with the baseline's learning-rate multiplier on a second axis: where in the schedule an effect appears."""
    base = arms[0]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for a in arms[1:]:
        seeds = sorted(set(group_runs[a]) & set(group_runs[base]))
        if not seeds:
            continue
        smooth, raw = [], []
        for s in seeds:
            ra, rb = group_runs[a][s], group_runs[base][s]
            steps = prefix_steps(ra, rb)
            sa, sb = smoothed_losses(ra["train"], steps), smoothed_losses(rb["train"], steps)
            smooth.append({t: sa[t] - sb[t] for t in steps})
            raw.append({t: ra["train"][t]["loss"] - rb["train"][t]["loss"] for t in steps})
        steps, mean, half = mean_band(smooth)
        rsteps, rmean, _ = mean_band(raw)
        ax.scatter(rsteps, rmean, color=color[a], s=3, alpha=0.3)
        ax.plot(steps, mean, color=color[a], linewidth=1.8, label=f"{a} − {base} ({len(seeds)} seeds)")
        if half:
            ax.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)], color=color[a], alpha=0.2)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_title(f"{where(g)}training loss, arm − {base}, paired by seed\n"
                 "(line: mean of each seed's EMA-0.9 difference, band: 95% CI; dots: raw mean)", fontsize=10)
    ax.set(xlabel="step", ylabel="loss difference (nats)")
    ax.grid(alpha=0.3)
    legend_with_lr(ax, group_runs[base][min(group_runs[base])], below=True)  # (inside, it would hide the curves' ends, what matters most)
    save(fig, "loss_diff", g, "the training loss's difference from the baseline paired by seed, with the learning-rate schedule")


def legend_with_lr(ax, run, below):
    """The run's learning-rate multiplier against step on a second y axis of ax (grey, dotted), to show where in
    the schedule a curve moves (where the run logged it), then one legend for ax's curves and that line: below
    the axes, or in their upper left corner."""
    handles, labels = ax.get_legend_handles_labels()
    top = ax  # the legend goes on the axes drawn last, so that no curve crosses it
    lr = [(s, run["train"][s].get("lr_mult")) for s in sorted(run["train"]) if run["train"][s].get("lr_mult") is not None]
    if lr:
        top = ax.twinx()
        line, = top.plot([s for s, _ in lr], [m for _, m in lr], color="grey", linestyle=":", linewidth=1.5, label="lr multiplier (right)")
        top.set_ylim(0.0, 1.05 * max(m for _, m in lr))
        top.set_ylabel("lr multiplier (x peak)")
        handles, labels = handles + [line], labels + [line.get_label()]
    if handles and below:
        top.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=min(len(handles), 4))
    elif handles:
        top.legend(handles, labels, fontsize=8, loc="upper left")


def layer_colors(plt, layers):
    return [plt.cm.viridis(0.85 * l / max(layers - 1, 1)) for l in range(layers)]  # not viridis' pale yellow end: it vanishes on white


def labelled_layers(layers):
    """The layers that get a legend entry: all up to 8, else about 6 spread over the depth."""
    return set(range(layers)) if layers <= 8 else {round(k * (layers - 1) / 5) for k in range(6)}


def plot_diagnostics(g, group_runs, arms, plt, save, where):
    """Self weight and cos(y, v) against step, per layer (the mean over seeds) and their mean over layers;
    a column per arm, a row per diagnostic, shared y per row so arms compare at a glance."""
    rows = [("self_weight", "attention weight on itself"), ("cos_yv", "cos(y, v) before XSA")]
    fig, axes = plt.subplots(len(rows), len(arms), figsize=(4.2 * len(arms) + 0.5, 7.5), squeeze=False, sharey="row", sharex=True)
    for col, a in enumerate(arms):
        by_seed = list(group_runs[a].values())
        steps = sorted(set.intersection(*(set(r["diag"]) for r in by_seed)))
        layers = min(len(r["diag"][s]["cos_yv"]) for r in by_seed for s in steps)
        colors = layer_colors(plt, layers)
        for row, (k, label) in enumerate(rows):
            ax = axes[row][col]
            per_layer = [[statistics.fmean(r["diag"][s][k][l] for r in by_seed) for s in steps] for l in range(layers)]
            for l in range(layers):
                ax.plot(steps, per_layer[l], "o-", color=colors[l], markersize=2.5, linewidth=1.2,
                        label=f"layer {l}" if l in labelled_layers(layers) else None)
            ax.plot(steps, [statistics.fmean(v[j] for v in per_layer) for j in range(len(steps))], color="black", linestyle="--",
                    linewidth=2, label="mean over layers")
            ax.set_title(f"{where(g)}{a}: {label}\n(mean of {len(by_seed)} seed{'s' if len(by_seed) > 1 else ''})", fontsize=10)
            ax.grid(alpha=0.3)
            if row == len(rows) - 1:
                ax.set_xlabel("step")
            if col == 0:
                ax.set_ylabel(label)
                legend(ax, fontsize=7)
    save(fig, "diagnostics", g, "self weight and cos(y, v) per layer against step, the mean over seeds")


def plot_alphas(g, group_runs, arms, plt, save, where):
    """The learned alphas against step: per layer the mean over heads (thick) and each head (thin, the
    same colour), the means over seeds; with the learning-rate multiplier (alpha's lr follows it too), so
    that an alpha that stops moving as the lr decays is not read as one that found its value."""
    fig, axes = plt.subplots(1, len(arms), figsize=(6 * len(arms), 4.5), squeeze=False)
    for a, ax in zip(arms, axes[0]):
        by_seed = list(group_runs[a].values())
        steps = sorted(set.intersection(*(set(r["xsa_alpha"]) for r in by_seed)))
        per = [{s: {int(l): h for l, h in r["xsa_alpha"][s]["alpha"].items()} for s in steps} for r in by_seed]
        layers = sorted(set.intersection(*(set(p[s]) for p in per for s in steps)))
        colors = layer_colors(plt, len(layers))
        for i, l in enumerate(layers):
            heads = min(len(p[s][l]) for p in per for s in steps)
            head_means = [[statistics.fmean(p[s][l][h] for p in per) for s in steps] for h in range(heads)]
            for h in range(heads):
                ax.plot(steps, head_means[h], color=colors[i], linewidth=0.7, alpha=0.6)
            ax.plot(steps, [statistics.fmean(hm[j] for hm in head_means) for j in range(len(steps))], "o-", color=colors[i],
                    linewidth=2.2, markersize=3, label=f"layer {l}" if i in labelled_layers(len(layers)) else None)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_title(f"{where(g)}{a}: learned alpha (mean of {len(by_seed)} seed{'s' if len(by_seed) > 1 else ''})\n"
                     "thick: mean over heads; thin: each head", fontsize=10)
        ax.set(xlabel="step", ylabel="alpha")
        ax.grid(alpha=0.3)
        legend_with_lr(ax, by_seed[0], below=False)
    save(fig, "alpha", g, "the learned alphas against step, per layer and head, with the learning-rate schedule")


def plot_depth(study, runs, analysis, plt, color, save):
    """The primary effect (arm - baseline, mean over seeds) per group with its 95% CI, against the groups'
    depths where every group has a distinct number of layers, else against the groups in order."""
    arms = list(study["arms"])
    base, key = arms[0], primary_of(study)
    groups = [g for g, _ in groups_of(study)]
    layers = [group_layers(runs[g]) for g in groups]
    numeric = None not in layers and len(set(layers)) == len(layers)
    xs = layers if numeric else list(range(len(groups)))
    span = (max(xs) - min(xs)) if len(xs) > 1 else 1
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for k, a in enumerate(arms[1:]):
        shift = (k - (len(arms) - 2) / 2.0) * 0.02 * span  # side by side, not on top of each other
        pts = [(x + shift, analysis[g]["primary"][a]) for x, g in zip(xs, groups) if analysis[g]["primary"][a]["mean"] is not None]
        if not pts:
            continue
        ax.plot([x for x, _ in pts], [c["mean"] for _, c in pts], "o-", color=color[a], label=a, linewidth=1.2)
        for x, c in pts:
            if c["ci"]:
                ax.errorbar([x], [c["mean"]], yerr=[[c["mean"] - c["ci"][0]], [c["ci"][1] - c["mean"]]], color=color[a], capsize=4)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(xs, [f"{g}\n({n} layers)" if n else g for g, n in zip(groups, layers)])
    ax.set_title(f"{LABEL[key]}: arm − {base} against depth\n(mean over seeds, 95% CI, paired by seed)", fontsize=10)
    ax.set(xlabel="depth (layers)" if numeric else "group", ylabel=f"{LABEL[key]} difference")
    ax.grid(alpha=0.3)
    legend(ax)
    save(fig, "depth", "", f"the primary metric's paired effect against depth, with its 95% CI")


def main(argv=None):
    p = xsa_cli.ArgumentParser(description="Run a study (arms x seeds of train_gpt, per group) and write its report.")
    p.add_argument("study", help="the study file (JSON)")
    p.add_argument("--out", help="the study's directory (default dev/studies/out/NAME)")
    p.add_argument("--binary", default="./train_gpt", help="the trainer (default ./train_gpt, as make train_gpt builds it)")
    p.add_argument("--max-runs", type=int, default=-1, help="run at most K runs this time, then write the report (default: all)")
    p.add_argument("--report-only", action="store_true", help="no runs: the report from the finished runs")
    p.add_argument("--no-plots", action="store_true", help="write report.md only (no matplotlib, quicker)")
    p.add_argument("--idle-machine", action="store_true",
                   help="every run had its machine to itself: compare the ms per step as a cost and draw cost.png")
    args = p.parse_args(argv)
    if args.max_runs < -1:
        p.error(f"--max-runs must be 0 or more (or -1: all), not {args.max_runs}")
    try:
        study = load_study(args.study)
        out_dir = args.out or os.path.join(REPO, "dev", "studies", "out", study["name"])
        if args.report_only and not os.path.isdir(out_dir):
            raise StudyError(f"'{out_dir}' is not a study's directory (--report-only reads the runs under it; --out DIR names another)")
        binary = os.path.abspath(args.binary)
        if not args.report_only and not os.access(binary, os.X_OK):
            raise StudyError(f"'{args.binary}' is not an executable trainer (make train_gpt builds ./train_gpt)")
        sft_binary = os.path.join(os.path.dirname(binary), "chat_sft")
        if not args.report_only and "sft" in study and not os.access(sft_binary, os.X_OK):
            raise StudyError(f"the study has an SFT stage: '{sft_binary}' (beside the trainer) must be built (make chat_sft)")
        if not args.report_only and "core_final" in study and not os.access(core_final_binary(binary), os.X_OK):
            raise StudyError(f"the study has a full CORE stage: '{core_final_binary(binary)}' (beside the trainer) must be built "
                             f"(make {os.path.basename(core_final_binary(binary))})")
        # seed-major: every group and arm of a seed before the next seed, so a partial study stays paired
        todo = [(g, arm, seed, run_dir_of(out_dir, g, arm, seed)) for seed in study["seeds"] for g, _ in groups_of(study)
                for arm in study["arms"] if seed in seeds_of(study, arm)]
        if not args.report_only:
            # SIGUSR1 drains: the running runs finish, none starts after them, then the report (a sitting that
            # ends at a time: no run is left half done, which matters where checkpoints do not outlive the machine)
            drain = []

            def start_draining(sig, frame):
                if not drain:
                    print("study: SIGUSR1: no new run starts; the running ones finish, then the report (rerun the same "
                          "command to go on)", flush=True)
                drain.append(sig)
            signal.signal(signal.SIGUSR1, start_draining)
            started = run_all(binary, study, [t for t in todo if run_state(t[3]) != "done"], args.max_runs, drain)
            if "sft" in study and started != args.max_runs:  # then each finished run's SFT stage
                sft_todo = [(g, arm, seed, os.path.join(d, "sft")) for g, arm, seed, d in todo
                            if run_state(d) == "done" and run_state(os.path.join(d, "sft")) != "done"]
                run_all(binary, study, sft_todo, args.max_runs - started if args.max_runs >= 0 else -1, drain)
            if "core_final" in study and not drain:  # every finished run without its full CORE (the runs have stopped: no GPU is shared)
                for g, arm, seed, d in todo:
                    if run_state(d) == "done" and read_core_final(d) is None:
                        core_final(binary, study, d)
        os.makedirs(out_dir, exist_ok=True)  # (a study whose first sitting ran nothing: --max-runs 0)
        runs = {g: {arm: {} for arm in study["arms"]} for g, _ in groups_of(study)}
        for g, arm, seed, run_dir in todo:
            if run_state(run_dir) == "done":
                runs[g][arm][seed] = load_run(run_dir)
                runs[g][arm][seed]["core_final"] = read_core_final(run_dir)
                if run_state(os.path.join(run_dir, "sft")) == "done":
                    runs[g][arm][seed]["sft"] = load_run(os.path.join(run_dir, "sft"))
        unchecked = {g: s for g, _ in groups_of(study) if (s := check_matched(study, runs[g], g))}
        analysis = analyse(study, runs, args.idle_machine)
        path = report(study, out_dir, runs, analysis, args.idle_machine, unchecked)
        if not args.no_plots and any(r for by_arm in runs.values() for r in by_arm.values()):
            try:
                import matplotlib
                matplotlib.use("Agg")
                import matplotlib.pyplot as plt
                plots = plot_study(study, out_dir, runs, analysis, args.idle_machine, plt)
                with open(path, "a") as f:
                    f.write("## Plots\n\n" + "\n\n".join(f"{caption}:\n\n![{name}]({name})" for name, caption in plots) + "\n")
            except ModuleNotFoundError:
                print(f"study: no plots: matplotlib is not importable by {sys.executable} "
                      f"({sys.executable} -m pip install -r dev/requirements.txt)")
        print(f"study: {path}")
    except (StudyError, CompareError, OSError) as e:
        print(f"study.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
