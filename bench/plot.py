#!/usr/bin/python3
"""Pictures of runs: per-epoch curves from --metrics JSON lines, and a bar chart of
bench/compare.py's results (mnist_mt against the PyTorch template per configuration).

    bench/plot.py curves OUT.png RUN.jsonl[=LABEL] ...   # several runs overlaid
    bench/plot.py bars OUT.png COMPARE.jsonl              # from compare.py --json
    bench/plot.py readme                                  # the README's pictures, from bench/results/

Curves: train and test loss, test accuracy and training images/s per epoch. Uses
Debian's python3-matplotlib (scripts/setup.sh installs it).
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from records import read_records  # noqa: E402

PROG = "bench/plot.py"

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PICTURES = ROOT / "docs"


def curves(out, runs):
    """runs: [(label, [epoch records])]."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    loss, accuracy, speed = axes
    for label, records in runs:
        # The template counts epochs from 0, mnist_mt from 1: both are drawn from 1.
        shift = 1 if records[0]["epoch"] == 0 else 0
        epochs = [r["epoch"] + shift for r in records]
        line, = loss.plot(epochs, [r["train_loss"] for r in records], marker="o", label=f"{label}: train")
        loss.plot(epochs, [r["test_loss"] for r in records], marker="s", linestyle="--", color=line.get_color(),
                  label=f"{label}: test")
        accuracy.plot(epochs, [100 * r["test_accuracy"] for r in records], marker="o", label=label)
        speed.plot(epochs, [r["images_per_s"] for r in records], marker="o", label=label)
    for ax, title, unit in ((loss, "loss (mean NLL)", ""), (accuracy, "test accuracy", "%"),
                            (speed, "training images/s (all ranks)", "")):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if unit:
            ax.set_ylabel(unit)
        ax.xaxis.get_major_locator().set_params(integer=True)
    speed.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def config_label(c):
    steps = f", {c['max_steps']} steps" if c.get("max_steps") else ""
    return f"{c['isa']}, {c['ranks']} {c['device']} ranks\nbatch {c['batch_size']}{steps}"


def bars(out, comparisons):
    fig, ax = plt.subplots(figsize=(2.2 + 2.2 * len(comparisons), 4))
    xs = range(len(comparisons))
    ours = [c["mnist_mt"]["summary"]["images_per_s"] for c in comparisons]
    theirs = [c["template"]["summary"]["images_per_s"] for c in comparisons]
    width = 0.38
    ax.bar([x - width / 2 for x in xs], ours, width, label="mnist_mt")
    ax.bar([x + width / 2 for x in xs], theirs, width, label="PyTorch template")
    for x, a, b in zip(xs, ours, theirs):
        ax.annotate(f"{a / b:.2f}×", (x - width / 2, a), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(xs), [config_label(c) for c in comparisons], fontsize=8)
    ax.set_ylabel("training images/s (all ranks)")
    ax.set_title("mnist_mt against the PyTorch template")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def readme():
    """The README's pictures: bench/results/compare.jsonl, made by the commands in the README."""
    comparisons = read_records(RESULTS / "compare.jsonl", PROG)
    PICTURES.mkdir(exist_ok=True)
    bars(PICTURES / "compare.png", comparisons)
    full = [c for c in comparisons if not c["max_steps"] and c["epochs"] > 1]
    if full:
        c = full[0]
        curves(PICTURES / "curves.png", [("mnist_mt", c["mnist_mt"]["epochs"]), ("template", c["template"]["epochs"])])
    print(f"wrote {', '.join(str(p.relative_to(ROOT)) for p in sorted(PICTURES.glob('*.png')))}")


def run_arg(text):
    path, _, label = text.partition("=")
    return label or Path(path).stem, read_records(path, PROG)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("curves", help="per-epoch curves of --metrics files")
    c.add_argument("out")
    c.add_argument("runs", nargs="+", help="RUN.jsonl or RUN.jsonl=LABEL")
    b = sub.add_parser("bars", help="images/s of bench/compare.py --json results")
    b.add_argument("out")
    b.add_argument("results")
    sub.add_parser("readme", help="regenerate docs/*.png from bench/results/")
    args = p.parse_args()
    if args.what == "curves":
        curves(args.out, [run_arg(r) for r in args.runs])
    elif args.what == "bars":
        bars(args.out, read_records(args.results, PROG))
    else:
        readme()


if __name__ == "__main__":
    main()
