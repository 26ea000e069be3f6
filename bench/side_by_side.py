#!/usr/bin/python3
"""Runs mnist_mt builds and modes side by side, interleaved, on the same data and settings,
and prints a Markdown table: the medians of the runs' training images/s, each variant's
ratio to the first, its exposed communication, and its milliseconds per step in each phase.

    bench/side_by_side.py --data DIR --modes ddp,dp                 # ddp against dp
    bench/side_by_side.py --data DIR --builds base=OLD/build,now=build   # a build against another
    bench/side_by_side.py --data DIR --layouts threads,processes    # 1 process x N ranks against N x 1
    bench/side_by_side.py --data DIR --builds pinned=build,unpinned=build --flags unpinned=--no-pin
    [--ranks 2] [--batches 4,64] [--reps 3] [--isa native,avx2] [--btl self,tcp]

A variant is a (build, mode, layout) triple; with several of each, every triple runs. The
processes layout runs `--ranks` processes of one rank each under Open MPI's mpirun, over
--btl on the loopback interface, and adds the gradient allreduce's busbw measured both
ways by bench_allreduce (in the same interleaved rounds). Batch 4
runs 3000 steps, larger batches 300, in one epoch; the evaluation after it is not part of
images/s. Exposed communication is the compute stream's wait for the comm stream before
the update (`comm_wait`), as a share of the epoch's time.
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


def named_builds(text):
    builds = []
    for item in text.split(","):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(f"--builds: {item!r} is not NAME=DIR")
        binary = Path(path) / "mnist_mt"
        if not binary.exists():
            raise argparse.ArgumentTypeError(f"--builds: {binary}: no such binary (build it first)")
        builds.append((name, binary))
    return builds


def build_flags(text):
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--flags: {text!r} is not NAME=FLAGS")
    return name, shlex.split(flags)


def mpirun(args, processes):
    """Open MPI's mpirun over args.btl on 127.0.0.1 (the CI's setting)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return (["mpirun"] + root + ["--oversubscribe", "--bind-to", "none", "--mca", "btl", args.btl,
                                 "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                                 "-np", str(processes)])


def isa_env(isa):
    env = dict(os.environ)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa == "avx2":
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    return env


def run(binary, flags, args, mode, layout, batch, isa):
    steps = 3000 if batch <= 4 else 300
    env = isa_env(isa)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        launch, ranks = ([], args.ranks) if layout == "threads" else (mpirun(args, args.ranks), 1)
        command = launch + [str(binary), "--cpu", str(ranks), "--mode", mode, "--batch-size", str(batch),
                            "--max-steps", str(steps), "--epochs", "1", "--data", args.data] + flags + [
                                "--metrics", str(metrics)]
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"side_by_side.py: {shlex.join(command)} exited {done.returncode}: {done.stderr.strip()}")
        epoch = json.loads(metrics.read_text().splitlines()[0])
    prefix = "ONEDNN_MAX_CPU_ISA=AVX2 " if isa == "avx2" else ""
    shown = launch + [os.path.relpath(binary, Path.cwd())] + command[len(launch) + 1:-2] + ["--metrics", "FILE"]
    return epoch, prefix + shlex.join(shown)


def busbw(binary, args, layout):
    """The gradient allreduce's busbw (GB/s) among args.ranks ranks: threads of one process
    or one rank per process."""
    bench = binary.parent / "bench" / "bench_allreduce"
    if layout == "threads":
        command = [str(bench), f"--benchmark_filter=^allreduce/cpu/ranks:{args.ranks}/gradient"]
    else:
        command = mpirun(args, args.ranks) + [str(bench), "--benchmark_filter=gradient"]
    done = subprocess.run(command + ["--benchmark_format=json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"side_by_side.py: {shlex.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    rows = json.loads(done.stdout)["benchmarks"]
    if len(rows) != 1:
        sys.exit(f"side_by_side.py: {shlex.join(command)} gave {len(rows)} results, not 1")
    return rows[0]["busbw"] / 1e9, shlex.join([os.path.relpath(c, Path.cwd()) if c == str(bench) else c
                                               for c in command])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="MNIST or Fashion-MNIST IDX directory")
    parser.add_argument("--builds", type=named_builds, default=None,
                        help="NAME=DIR,... meson build directories with mnist_mt (default: now=build)")
    parser.add_argument("--flags", type=build_flags, action="append", default=[],
                        help="NAME=FLAGS: more flags for mnist_mt's runs of the build named NAME, once per "
                             "NAME (not bench_allreduce's busbw)")
    parser.add_argument("--modes", default="ddp", help="ddp, dp or ddp,dp")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batches", default="4,64")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--isa", default="native,avx2")
    parser.add_argument("--layouts", default="threads", help="threads, processes or threads,processes")
    parser.add_argument("--btl", default="self,tcp", help="Open MPI's transports for the processes layout")
    args = parser.parse_args()
    builds = args.builds or named_builds(f"now={ROOT / 'build'}")
    flags = {}
    for name, extra in args.flags:
        if name in flags:
            sys.exit(f"side_by_side.py: --flags: {name!r} is given twice (put all its flags in one)")
        flags[name] = extra
    if len({name for name, _ in builds}) != len(builds):
        sys.exit("side_by_side.py: --builds: a name is used twice")
    for name in flags:
        if name not in {n for n, _ in builds}:
            sys.exit(f"side_by_side.py: --flags: no build is named {name!r}")
    modes = args.modes.split(",")
    if any(m not in ("ddp", "dp") for m in modes):
        sys.exit(f"side_by_side.py: --modes: {args.modes!r} is not a list of ddp and dp")
    layouts = args.layouts.split(",")
    if any(l not in ("threads", "processes") for l in layouts):
        sys.exit(f"side_by_side.py: --layouts: {args.layouts!r} is not a list of threads and processes")
    if "processes" in layouts and "dp" in modes:
        sys.exit("side_by_side.py: --modes dp runs in one process: it has no processes layout")
    def label(name, mode, layout):  # what tells the variants apart
        return " ".join(([name] if len(builds) > 1 else []) +
                        ([mode] if len(modes) > 1 or (len(builds) == 1 and len(layouts) == 1) else []) +
                        ([f"1 process x {args.ranks}" if layout == "threads" else f"{args.ranks} processes x 1"]
                         if len(layouts) > 1 else []))

    variants = [(label(name, mode, layout), binary, flags.get(name, []), mode, layout)
                for name, binary in builds for mode in modes for layout in layouts]
    batches = [int(b) for b in args.batches.split(",")]
    isas = args.isa.split(",")
    runs, commands, bandwidth = {}, [], {}
    for _ in range(args.reps):  # interleaved, so drift on a shared machine hits every variant
        for isa in isas:
            for batch in batches:
                for label, binary, extra, mode, layout in variants:
                    epoch, command = run(binary, extra, args, mode, layout, batch, isa)
                    runs.setdefault((isa, batch, label), []).append(epoch)
                    if command not in commands:
                        commands.append(command)
        if len(layouts) > 1:
            for label, binary, _, _, layout in variants:
                gbps, command = busbw(binary, args, layout)
                bandwidth.setdefault(label, []).append(gbps)
                if command not in commands:
                    commands.append(command)

    def median(isa, batch, label, pick):
        return statistics.median(pick(e) for e in runs[(isa, batch, label)])

    first = variants[0][0]
    lines = [f"**{args.ranks} CPU ranks, medians of {args.reps} interleaved runs**", "",
             "| ISA | batch | variant | images/s | ratio to " + first + " | exposed comm | ms/step: " +
             ", ".join(PHASES) + " |", "|---|---:|---|---:|---:|---:|---|"]
    for isa in isas:
        for batch in batches:
            base = median(isa, batch, first, lambda e: e["images_per_s"])
            for label, *_ in variants:
                speed = median(isa, batch, label, lambda e: e["images_per_s"])
                comm = median(isa, batch, label, lambda e: 100 * e["phase_seconds"]["comm_wait"] / e["seconds"])
                phases = "; ".join(
                    f"{p} {median(isa, batch, label, lambda e: 1e3 * e['phase_seconds'].get(p, 0.0) / e['steps']):.3f}"
                    for p in PHASES)
                lines.append(f"| {isa} | {batch} | {label} | {speed:,.1f} | {speed / base:.3f}× | {comm:.1f}% | "
                             f"{phases} |")
    if bandwidth:
        lines += ["", f"Gradient allreduce ({args.ranks} ranks, bench_allreduce, medians; Open MPI btl {args.btl}):", "",
                  "| variant | busbw (GB/s) |", "|---|---:|"]
        lines += [f"| {label} | {statistics.median(values):.3f} |" for label, values in bandwidth.items()]
    lines += ["", f"Machine: {cpu_model()}, {len(os.sched_getaffinity(0))} cores usable. "
              f"Date: {datetime.date.today().isoformat()}.",
              "", f"Command: `{shlex.join(['bench/side_by_side.py'] + sys.argv[1:])}`, which ran:", ""]
    lines += [f"- `{c}`" for c in commands]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
