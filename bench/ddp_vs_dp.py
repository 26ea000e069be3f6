#!/usr/bin/python3
"""Runs `mnist_mt --mode ddp` and `--mode dp` side by side, interleaved, on the same data
and settings, and prints a Markdown table: the medians of the runs' training images/s,
the ddp/dp ratio, and dp's milliseconds per step in each phase against ddp's, so that
where dp's extra time goes (broadcast, gather, the update on device 0 alone) shows.

    bench/ddp_vs_dp.py --data DIR [--ranks 2] [--batches 4,64] [--reps 3] [--isa native,avx2] [--build DIR]

Batch 4 runs 3000 steps, larger batches 300, in one epoch. The evaluation after it is
the same in both modes and not part of images/s.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("data_wait", "broadcast", "forward", "gather", "backward", "comm_wait", "optimizer")


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(binary, args, mode, batch, isa):
    steps = 3000 if batch <= 4 else 300
    env = dict(os.environ)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa == "avx2":
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        command = [str(binary), "--cpu", str(args.ranks), "--mode", mode, "--batch-size", str(batch),
                   "--max-steps", str(steps), "--epochs", "1", "--data", args.data, "--metrics", str(metrics)]
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"ddp_vs_dp.py: {shlex.join(command)} exited {done.returncode}: {done.stderr.strip()}")
        epoch = json.loads(metrics.read_text().splitlines()[0])
    prefix = "ONEDNN_MAX_CPU_ISA=AVX2 " if isa == "avx2" else ""
    shown = [os.path.relpath(binary, Path.cwd())] + command[1:-2] + ["--metrics", "FILE"]
    return epoch, prefix + shlex.join(shown)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="MNIST or Fashion-MNIST IDX directory")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batches", default="4,64")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--isa", default="native,avx2")
    parser.add_argument("--build", default=str(ROOT / "build"))
    args = parser.parse_args()
    binary = Path(args.build) / "mnist_mt"
    if not binary.exists():
        sys.exit(f"ddp_vs_dp.py: {binary}: no such binary (build it first, or pass --build)")
    batches = [int(b) for b in args.batches.split(",")]
    isas = args.isa.split(",")
    runs, commands = {}, []
    for _ in range(args.reps):  # interleaved, so drift on a shared machine hits both modes
        for isa in isas:
            for batch in batches:
                for mode in ("ddp", "dp"):
                    epoch, command = run(binary, args, mode, batch, isa)
                    runs.setdefault((isa, batch, mode), []).append(epoch)
                    if command not in commands:
                        commands.append(command)

    def median(isa, batch, mode, pick):
        return statistics.median(pick(e) for e in runs[(isa, batch, mode)])

    lines = [f"**{args.ranks} CPU ranks, --mode ddp against --mode dp, medians of {args.reps} interleaved runs**", "",
             "| ISA | batch | ddp images/s | dp images/s | ddp/dp | ms/step ddp → dp: " +
             ", ".join(PHASES) + " |", "|---|---:|---:|---:|---:|---|"]
    for isa in isas:
        for batch in batches:
            speed = {m: median(isa, batch, m, lambda e: e["images_per_s"]) for m in ("ddp", "dp")}
            phases = []
            for p in PHASES:
                ms = {m: median(isa, batch, m, lambda e: 1e3 * e["phase_seconds"].get(p, 0.0) / e["steps"])
                      for m in ("ddp", "dp")}
                phases.append(f"{p} {ms['ddp']:.2f} → {ms['dp']:.2f}")
            lines.append(f"| {isa} | {batch} | {speed['ddp']:,.1f} | {speed['dp']:,.1f} | "
                         f"{speed['ddp'] / speed['dp']:.3f}× | {'; '.join(phases)} |")
    lines += ["", f"Machine: {cpu_model()}, {os.cpu_count()} cores usable. Date: {datetime.date.today().isoformat()}.",
              "", f"Command: `{shlex.join(['bench/ddp_vs_dp.py'] + sys.argv[1:])}`, which ran:", ""]
    lines += [f"- `{c}`" for c in commands]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
