#!/usr/bin/env python3
"""Plots of one or several training runs, overlaid, from each run's DIR/metrics.jsonl.

    python3 dev/plot_run.py DIR [DIR ...] [--out PLOTS_DIR]

Writes PNG files into PLOTS_DIR (default: DIR/plots of the first run):
  * loss.png: the training loss per step, raw (thin) and smoothed as the console prints it (debiased EMA,
    beta 0.9), and the validation bits per byte at each evaluation;
  * schedule.png: the learning-rate multiplier and the gradient norm per step;
  * speed.png: tokens per second per step (step 0, which pays for allocations, left out);
  * diagnostics.png: the attention diagnostics (dev/docs/model.md#xsa-diagnostics) per layer at the last
    evaluation: cos(y, v) before XSA, cos(z, v) after, the attention's weight on the token itself, and the
    mean cosine between values.
Runs are read with dev/compare_runs.py's loader (the same checks, the same errors). Needs matplotlib
(python3 -m pip install -r dev/requirements.txt); it draws with the Agg backend, no display needed.
Every bad input ends with one "error:" line and exit code 1.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import xsa_cli  # noqa: E402
from compare_runs import CompareError, load_run, smoothed_losses  # noqa: E402

DIAGNOSTICS = [("cos_yv", "cos(y, v) before XSA"), ("cos_zv", "cos(z, v) after XSA"), ("self_weight", "attention weight on itself"),
               ("value_cos", "cos(v_i, v_j), i != j")]


def finish_axes(*axes):
    """The style every plot here shares: a light grid and the legend."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()


def plot_runs(runs, out_dir, plt):
    """The PNG files of `runs` (compare_runs.load_run records) in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path + ".tmp", dpi=110, format="png")  # whole files only: a reader never sees a half-written plot
        os.replace(path + ".tmp", path)
        plt.close(fig)
        written.append(path)

    fig, (ax_loss, ax_bpb) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, r in enumerate(runs):
        c = colors[k % len(colors)]
        steps = sorted(r["train"])
        if steps:
            ax_loss.plot(steps, [r["train"][s]["loss"] for s in steps], color=c, alpha=0.25, linewidth=0.8)
            prefix = [s for s in steps if s < len(steps)]  # the smoothing runs over consecutive steps from 0
            smooth = smoothed_losses(r["train"], prefix)
            ax_loss.plot(prefix, [smooth[s] for s in prefix], color=c, label=r["name"])
        evals = sorted(r["eval"])
        if evals:
            ax_bpb.plot(evals, [r["eval"][s]["val_bpb"] for s in evals], "o-", color=c, label=r["name"], markersize=3)
    ax_loss.set(title="training loss (thin: raw; thick: smoothed)", xlabel="step", ylabel="loss (nats per token)")
    ax_bpb.set(title="validation bits per byte", xlabel="step", ylabel="bpb")
    finish_axes(ax_loss, ax_bpb)
    save(fig, "loss.png")

    fig, (ax_lr, ax_norm) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, r in enumerate(runs):
        steps = sorted(r["train"])
        c = colors[k % len(colors)]
        ax_lr.plot(steps, [r["train"][s].get("lr_mult") for s in steps], color=c, label=r["name"])
        norms = [(s, r["train"][s].get("grad_norm")) for s in steps if r["train"][s].get("grad_norm") is not None]
        ax_norm.plot([s for s, _ in norms], [n for _, n in norms], color=c, label=r["name"], linewidth=0.8)
    ax_lr.set(title="learning-rate multiplier", xlabel="step", ylabel="x peak lr")
    ax_norm.set(title="gradient norm (L2, all parameters)", xlabel="step", ylabel="norm")
    finish_axes(ax_lr, ax_norm)
    save(fig, "schedule.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, r in enumerate(runs):
        steps = [s for s in sorted(r["train"]) if s > 0]
        ax.plot(steps, [r["train"][s]["tok_per_s"] for s in steps], color=colors[k % len(colors)], label=r["name"], linewidth=0.8)
    ax.set(title="throughput (step 0 left out)", xlabel="step", ylabel="tokens / s")
    ax.set_ylim(bottom=0)
    finish_axes(ax)
    save(fig, "speed.png")

    with_diag = [r for r in runs if r["diag"]]
    if with_diag:
        fig, axes = plt.subplots(2, 2, figsize=(12, 8))
        for k, r in enumerate(runs):
            if not r["diag"]:
                continue
            step = max(r["diag"])
            for ax, (key, label) in zip(axes.flat, DIAGNOSTICS):
                values = r["diag"][step][key]
                ax.plot(range(len(values)), values, "o-", color=colors[k % len(colors)], label=f"{r['name']} (step {step})", markersize=3)
        for ax, (key, label) in zip(axes.flat, DIAGNOSTICS):
            ax.set(title=label, xlabel="layer")
            ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
            finish_axes(ax)
        save(fig, "diagnostics.png")
    return written


def main(argv=None):
    p = xsa_cli.ArgumentParser(description="Plot train_gpt runs (metrics.jsonl), overlaid.")
    p.add_argument("runs", nargs="+", help="run directories (-o DIR of train_gpt) or metrics.jsonl files")
    p.add_argument("--out", help="directory for the PNG files (default: DIR/plots of the first run)")
    args = p.parse_args(argv)
    try:
        import matplotlib
    except ModuleNotFoundError:
        print(f"plot_run.py: error: needs the Python package 'matplotlib', which {sys.executable} cannot import: "
              f"{sys.executable} -m pip install -r dev/requirements.txt", file=sys.stderr)
        sys.exit(1)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    try:
        runs = [load_run(path) for path in args.runs]
        first = args.runs[0] if os.path.isdir(args.runs[0]) else os.path.dirname(os.path.abspath(args.runs[0]))
        for path in plot_runs(runs, args.out or os.path.join(first, "plots"), plt):
            print(path)
    except (CompareError, OSError) as e:
        print(f"plot_run.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
