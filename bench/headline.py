#!/usr/bin/python3
"""The headline results: a Markdown table of bench/time_to_accuracy.py's committed records
(mnist_mt against PyTorch's best, time to the target accuracy), then one of
bench/compare.py's (mnist_mt against the PyTorch template), a row per run, each with its
machine and date.

    bench/headline.py                          # the README's table, from bench/results/
    bench/headline.py RESULTS.jsonl ...        # any compare.py --json files
    bench/headline.py --check README.md        # exits 1 unless the file holds the table as printed
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from records import read_records

ROOT = Path(__file__).resolve().parent.parent
TIME_TO_ACCURACY = ROOT / "bench" / "results" / "time_to_accuracy.jsonl"
DEFAULT_RESULTS = [ROOT / "bench" / "results" / "compare-fashion.jsonl", ROOT / "bench" / "results" / "compare.jsonl"]
# compare.py's defaults: a flag is shown only when the run differs from them.
DEFAULTS = {"device": "cpu", "lr": 0.01, "momentum": 0.0, "weight_decay": 0.0, "seed": 1,
            "data": "/usr/share/datasets/fashion-mnist"}


def dataset(record):
    return "Fashion-MNIST" if "fashion" in record["data"].lower() else "MNIST"


def flags(record):
    """The bench/compare.py flags that repeat the run (--data named, not its temp path)."""
    out = []
    if record["isa"] != "native":
        out.append(f"--isa {record['isa']}")
    if record.get("device", "cpu") != DEFAULTS["device"]:
        out.append(f"--device {record['device']}")
    out += [f"--ranks {record['ranks']}", f"--batch-size {record['batch_size']}", f"--epochs {record['epochs']}"]
    if record["max_steps"]:
        out.append(f"--max-steps {record['max_steps']}")
    for key in ("lr", "momentum", "weight_decay", "seed"):  # records before weight_decay hold 0
        value = record.get(key, DEFAULTS[key])
        if value != DEFAULTS[key]:
            out.append(f"--{key.replace('_', '-')} {value:g}")
    if record["data"] != DEFAULTS["data"]:
        out.append(f"--data {dataset(record).upper().replace('-', '_')}_DIR")
    if record.get("exchange", "gradients") != "gradients":  # records before --exchange: gradients
        out.append(f"--exchange {record['exchange']}")
    return " ".join(out)


def machine(record):
    """compare.py's machine line without the ISA, which has its own column."""
    parts = [p for p in record["machine"].split(", ") if not (p.endswith(" ISA") or p.startswith("held to "))]
    return ", ".join(parts)


def table(records):
    lines = ["| data set | ISA | `bench/compare.py` flags | mnist_mt images/s | template images/s | ratio "
             "| test accuracy mnist_mt / template | machine | date |",
             "|---|---|---|---:|---:|---:|---|---|---|"]
    for r in records:
        ours, theirs = r["mnist_mt"]["summary"], r["template"]["summary"]
        lines.append(
            f"| {dataset(r)} | {r['isa']} | `{flags(r)}` | {ours['images_per_s']:,.1f} | {theirs['images_per_s']:,.1f} "
            f"| {ours['images_per_s'] / theirs['images_per_s']:.2f}× "
            f"| {100 * ours['test_accuracy']:.2f}% / {100 * theirs['test_accuracy']:.2f}% | {machine(r)} | {r['date']} |")
    return "\n".join(lines) + "\n"


def mean_time(runs):
    return statistics.mean([r["time_to_target_s"] or float("inf") for r in runs])


def time_to_accuracy_table(path):
    """A row per time_to_accuracy.py record that ran mnist_mt and PyTorch: mean times to the
    target over the seeds, PyTorch's best layout."""
    lines = ["| recipe | target | seeds | mnist_mt, s | PyTorch's best, s | speed-up | PyTorch | machine | date |",
             "|---|---:|---:|---:|---:|---:|---|---|---|"]
    for line in path.read_text().splitlines():
        r = json.loads(line)
        theirs = {name: runs for name, runs in r["runs"].items() if name != "mnist_mt"}
        if "mnist_mt" not in r["runs"] or not theirs:
            continue
        best = min(theirs, key=lambda name: mean_time(theirs[name]))
        ours_s, theirs_s = mean_time(r["runs"]["mnist_mt"]), mean_time(theirs[best])
        lines.append(f"| `{r['recipe']}` | {r['target']:.1f}% | {len(r['seeds'])} | {ours_s:.1f} | {theirs_s:.1f} "
                     f"| {theirs_s / ours_s:.1f}× | {r['torch']['torch_version']} from PyPI, {best} "
                     f"| {r['machine']}, {r['cores']} cores | {r['date']} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="*", type=Path, help="compare.py --json files (default: bench/results/)")
    p.add_argument("--check", action="append", type=Path, default=[],
                   help="a file that must hold the table exactly as printed (repeatable)")
    args = p.parse_args()
    text = table([r for path in (args.results or DEFAULT_RESULTS) for r in read_records(path, "bench/headline.py")])
    if not args.results:
        text = time_to_accuracy_table(TIME_TO_ACCURACY) + "\n" + text
    if not args.check:
        sys.stdout.write(text)
        return
    stale = [str(path) for path in args.check if text not in path.read_text()]
    if stale:
        sys.exit(f"bench/headline.py: {', '.join(stale)}: not the table bench/headline.py prints now; paste it in:\n"
                 + text)
    print(f"bench/headline.py: {', '.join(map(str, args.check))} hold the table")


if __name__ == "__main__":
    main()
