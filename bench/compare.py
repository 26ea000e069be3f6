#!/usr/bin/python3
"""Runs mnist_mt and the PyTorch template on the same data, devices and settings, one
after the other, and prints a Markdown table: training images/s of each, the ratio,
and the final test accuracy of each, with the machine, the date and the commands.

    bench/compare.py --ranks 2 --batch-size 64 --epochs 1 [--max-steps S] [--build DIR]
    bench/compare.py --isa avx2 ...                # both held to AVX2 (an AVX2-only CPU's speed)
    bench/compare.py --device cuda --ranks 2 ...   # GPUs 0..ranks-1, nccl for the template
    bench/compare.py ... --json bench/results/compare.jsonl   # also keep the results for bench/plot.py
    bench/compare.py --against pypi ...            # the official PyTorch at its best instead
    bench/compare.py --exchange gradients,factors ...   # mnist_mt once per exchange of fc1, the
                                                   # other side once; a table and record each

The template runs on OpenBLAS (Debian's python3-torch otherwise takes the reference
BLAS); the script installs it with scripts/setup.sh and refuses to compare against a
template that loaded another BLAS.

With --against pypi the other side is the official PyTorch from PyPI (installed once into
bench/.venv-torch, as bench/time_to_accuracy.py does) running bench/pytorch/recipe.py, the
network written as a PyTorch user at their best would (data in memory, no DataLoader), in
two layouts: one process of every core at the global batch, and DDP over gloo with
--ranks processes; the better of the two is the one compared, and both are reported.
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "bench" / "pytorch" / "demo.py"
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch is installed for this one
PHASES = ("data_wait", "forward", "backward", "comm_wait", "optimizer")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2, help="devices: CPU ranks or GPUs 0..N-1")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="training steps per epoch, 0 = all")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--build", default=os.path.relpath(ROOT / "build"), help="meson build directory with mnist_mt")
    p.add_argument("--launcher", choices=["spawn", "torchrun"], default="spawn",
                   help="template ranks started by demo.py itself or by torch.distributed.run")
    p.add_argument("--isa", choices=["native", "avx2"], default="native",
                   help="avx2: oneDNN (both programs), OpenBLAS and PyTorch's own kernels held to AVX2")
    p.add_argument("--against", choices=["template", "pypi"], default="template",
                   help="pypi: the official PyTorch at its best (bench/pytorch/recipe.py), CPU only")
    p.add_argument("--torch-python", type=Path, help="with --against pypi: a Python with torch instead of the venv")
    p.add_argument("--exchange", default="gradients",
                   help="mnist_mt's --exchange, or several, comma-separated: mnist_mt runs once with each "
                        "(gradients, factors, auto), the other side once")
    p.add_argument("--out", help="also write the Markdown to this file")
    p.add_argument("--json", help="also append the comparison, with both runs' epochs, to this JSON-lines file "
                   "(bench/plot.py draws it)")
    args = p.parse_args()
    if args.ranks < 1 or args.batch_size < 1 or args.epochs < 1 or args.max_steps < 0:
        p.error("--ranks, --batch-size and --epochs must be positive, --max-steps non-negative")
    if args.against == "pypi" and (args.device != "cpu" or args.max_steps):
        p.error("--against pypi runs on CPUs and whole epochs: no --device cuda, no --max-steps")
    args.exchange = args.exchange.split(",")
    if not args.exchange or any(e not in ("gradients", "factors", "auto") for e in args.exchange) or \
            len(set(args.exchange)) != len(args.exchange):
        p.error("--exchange takes gradients, factors or auto, each at most once, comma-separated")
    return args


def shared_flags(args):
    return ["--data", args.data, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--lr", repr(args.lr), "--momentum", repr(args.momentum),
            "--weight-decay", repr(args.weight_decay), "--seed", str(args.seed),
            "--max-steps", str(args.max_steps)]


def mnist_mt_command(args, exchange, metrics):
    devices = (["--cpu", str(args.ranks)] if args.device == "cpu"
               else ["--gpus", ",".join(str(i) for i in range(args.ranks))])
    return ([str(Path(args.build) / "mnist_mt")] + devices + shared_flags(args) + ["--exchange", exchange] +
            ["--metrics", metrics])


def run_mnist_mt(args, tmp):
    """mnist_mt once per --exchange: (exchange, command, records) each."""
    out = []
    for exchange in args.exchange:
        cmd = mnist_mt_command(args, exchange, str(Path(tmp) / f"mnist_mt_{exchange}.jsonl"))
        out.append((exchange, cmd, run(f"mnist_mt, --exchange {exchange}", cmd, cmd[-1], isa_env(args, False))))
    return out


def template_command(args, metrics):
    flags = shared_flags(args) + ["--device", args.device, "--json", metrics]
    if args.launcher == "spawn":
        return [TORCH_PYTHON, str(TEMPLATE), "--nproc", str(args.ranks)] + flags
    # torch 1.13's launcher mis-parses its default --tee/--redirects (0) on Python 3.11;
    # explicit values that it does parse keep rank output on the console.
    return [TORCH_PYTHON, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={args.ranks}", "--tee", "1", "--redirects", "2", str(TEMPLATE)] + flags


def pypi_commands(args, python, metrics_dir):
    """recipe.py in its two layouts: (name, command, metrics file) each."""
    flags = ["--data", args.data, "--optimizer", "sgd", "--lr", repr(args.lr), "--momentum", repr(args.momentum),
             "--weight-decay", repr(args.weight_decay), "--seed", str(args.seed), "--epochs", str(args.epochs)]
    recipe = [str(python), str(ROOT / "bench" / "pytorch" / "recipe.py")] + flags
    layouts = [("1 process", ["--ranks", "1", "--batch-size", str(args.ranks * args.batch_size)])]
    if args.ranks > 1:
        layouts.append((f"DDP, {args.ranks} processes", ["--ranks", str(args.ranks), "--batch-size", str(args.batch_size)]))
    out = []
    for i, (name, layout) in enumerate(layouts):
        metrics = str(Path(metrics_dir) / f"pytorch{i}.jsonl")
        out.append((name, recipe + layout + ["--metrics", metrics], metrics))
    return out


def isa_env(args, template):
    """The environment variables that hold a program to the chosen instruction set."""
    if args.isa == "native":
        return {}
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}  # PyTorch's convolutions run through oneDNN too
    if template and args.against == "pypi":
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2")  # the PyPI build's MKL
    elif template:
        env.update(OPENBLAS_CORETYPE="Haswell", ATEN_CPU_CAPABILITY="avx2")
    return env


def ensure_template_deps():
    """Debian's PyTorch and OpenBLAS for it (as root installs them, else says how)."""
    setup = ROOT / "scripts" / "setup.sh"
    if subprocess.run([str(setup), "python3-torch", "libopenblas0-pthread"]).returncode != 0:
        sys.exit("bench/compare.py: the template needs python3-torch and libopenblas0-pthread")


def run(name, command, metrics, env):
    """Runs `command`, echoing its output to stderr; returns its JSON-lines records."""
    print(f"## {name}: {shlex.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, env={**os.environ, **env})
    if done.returncode != 0:
        sys.exit(f"{name} failed with exit status {done.returncode}: {shlex.join(command)}")
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        sys.exit(f"{name} wrote no metrics to {metrics}")
    return records


def relative(arg):
    return os.path.relpath(arg) if arg.startswith(str(ROOT)) else arg


def summary(records):
    """Images/s over all epochs together, and the last epoch's figures."""
    seconds = sum(r["seconds"] for r in records)
    images = sum(r["images_per_s"] * r["seconds"] for r in records)
    last = records[-1]
    return {"images_per_s": images / seconds, "seconds": seconds, "test_accuracy": last["test_accuracy"],
            "test_loss": last["test_loss"], "train_loss": last["train_loss"]}


def machine(args):
    fields = {}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    model = fields.get("Model name", "unknown CPU")
    try:
        cores = f"{int(fields['Core(s) per socket']) * int(fields['Socket(s)'])} cores"
    except (KeyError, ValueError):
        cores = "cores unknown"
    text = f"{model}, {cores}, {len(os.sched_getaffinity(0))} hardware threads usable"
    text += ", held to AVX2" if args.isa == "avx2" else ", native ISA"
    if args.device == "cuda":
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True).stdout.split("\n")[:args.ranks]
            text += "; GPUs: " + ", ".join(g.strip() for g in gpus if g.strip())
        except OSError:
            pass
    return text


def table(args, exchange, ours, theirs, commands, other=""):
    """The Markdown report; `other`, with --against pypi: the PyTorch side's name and its
    other layout's line."""
    a, b = summary(ours), summary(theirs)
    rows = [
        ("training images/s (all ranks)", f"{a['images_per_s']:.1f}", f"{b['images_per_s']:.1f}",
         f"{a['images_per_s'] / b['images_per_s']:.2f}×"),
        ("final test accuracy", f"{100 * a['test_accuracy']:.2f}%", f"{100 * b['test_accuracy']:.2f}%",
         f"{100 * (a['test_accuracy'] - b['test_accuracy']):+.2f} points"),
        ("final test loss", f"{a['test_loss']:.4f}", f"{b['test_loss']:.4f}", ""),
        ("final train loss", f"{a['train_loss']:.4f}", f"{b['train_loss']:.4f}", ""),
        ("training seconds", f"{a['seconds']:.2f}", f"{b['seconds']:.2f}", ""),
    ]
    backend = "gloo" if args.device == "cpu" else "nccl"
    if args.device == "cpu":
        backend += ", " + theirs[-1].get("blas", "BLAS unknown")
    head = f"PyTorch template ({backend}) | mnist_mt / template" if not other else \
        f"{other.splitlines()[0]} | mnist_mt / PyTorch"
    lines = [
        f"**{args.ranks} {args.device.upper()} ranks, batch {args.batch_size} per rank, "
        f"{args.epochs} epoch(s)" + (f", {args.max_steps} steps per epoch" if args.max_steps else "") +
        f", lr {args.lr}, momentum {args.momentum}, weight decay {args.weight_decay}, seed {args.seed}, "
        f"mnist_mt --exchange {exchange}**",
        "",
        f"| | mnist_mt | {head} |",
        "|---|---:|---:|---:|",
    ] + [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |" for r in rows]
    if other:
        lines += ["", other.splitlines()[1]]
    phases = [sum(r.get("phase_seconds", {}).get(p, 0.0) for r in ours) for p in PHASES]
    if any(phases):
        lines += ["", "mnist_mt rank 0, seconds per phase over the run (share of training time):", "",
                  "| " + " | ".join(PHASES) + " |", "|" + "---:|" * len(PHASES),
                  "| " + " | ".join(f"{s:.2f} ({100 * s / a['seconds']:.0f}%)" for s in phases) + " |"]
    lines += ["", f"Machine: {machine(args)}. Date: {datetime.date.today().isoformat()}.", "",
              f"Command: `{shlex.join(['bench/compare.py'] + sys.argv[1:])}`, which ran:", ""]
    lines += [f"- `{shlex.join(c)}`" for c in commands]
    return "\n".join(lines) + "\n"


def shown_commands(args, runs):
    """The commands as a reader would repeat them: without the temporary metrics files,
    with paths relative to the working directory, after the variables they ran with.
    `runs`: (whether it is the PyTorch side, command) each."""
    return [[f"{k}={v}" for k, v in isa_env(args, pytorch).items()] + [relative(a) for a in c[:-2]]
            for pytorch, c in runs]


def emit(args, exchange, report, shown, ours, record):
    """Prints the report and appends `record` (with the fields every comparison has) to
    --json; returns the report."""
    print(report, end="")
    if args.json:
        record = {"isa": args.isa, "device": args.device, "ranks": args.ranks, "batch_size": args.batch_size,
                  "exchange": exchange,
                  "epochs": args.epochs, "lr": args.lr, "momentum": args.momentum, "seed": args.seed,
                  "data": args.data, "date": datetime.date.today().isoformat(), "machine": machine(args),
                  "commands": [shlex.join(c) for c in shown], "mnist_mt": {"summary": summary(ours), "epochs": ours},
                  **record}
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")
    return report


def write_out(args, reports):
    """--out: the run's reports, one after another."""
    if args.out:
        Path(args.out).write_text("\n".join(reports))


def main_pypi(args):
    """--against pypi: mnist_mt, then recipe.py in both layouts; the better one is compared."""
    from time_to_accuracy import torch_python  # installs the PyPI build into bench/.venv-torch once
    python, note = torch_python(args)
    if note:
        sys.exit(f"bench/compare.py: {note}; --against pypi compares with the official build only")
    version = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="mnist_mt_compare.") as tmp:
        mnist_mt_runs = run_mnist_mt(args, tmp)
        sides = [(name, cmd, run(f"PyTorch, {name}", cmd, metrics, isa_env(args, True)))
                 for name, cmd, metrics in pypi_commands(args, python, tmp)]
    best = max(sides, key=lambda side: summary(side[2])["images_per_s"])
    others = "; ".join(f"{name} {summary(records)['images_per_s']:.1f} images/s" for name, _, records in sides)
    other = f"PyTorch {version} (PyPI), {best[0]}\nPyTorch's layouts: {others}; the better is compared."
    reports = []
    for exchange, ours_cmd, ours in mnist_mt_runs:
        shown = shown_commands(args, [(False, ours_cmd)] + [(True, cmd) for _, cmd, _ in sides])
        reports.append(emit(args, exchange, table(args, exchange, ours, best[2], shown, other), shown, ours,
                            {"torch_version": version,
                             "pytorch": {name: {"summary": summary(records), "epochs": records}
                                         for name, _, records in sides},
                             "pytorch_best": best[0]}))
    write_out(args, reports)


def main():
    args = parse_args()
    if args.against == "pypi":
        main_pypi(args)
        return
    if args.device == "cpu":
        ensure_template_deps()
    with tempfile.TemporaryDirectory(prefix="mnist_mt_compare.") as tmp:
        mnist_mt_runs = run_mnist_mt(args, tmp)
        theirs_cmd = template_command(args, str(Path(tmp) / "template.jsonl"))
        theirs = run("template", theirs_cmd, theirs_cmd[-1], isa_env(args, True))
    if args.device == "cpu" and theirs[-1].get("blas") != "OpenBLAS":
        sys.exit(f"bench/compare.py: the template ran with {theirs[-1].get('blas', 'an unknown BLAS')}, not "
                 "OpenBLAS: point Debian's libblas.so.3 alternative at OpenBLAS")
    reports = []
    for exchange, ours_cmd, ours in mnist_mt_runs:
        shown = shown_commands(args, [(False, ours_cmd), (True, theirs_cmd)])
        reports.append(emit(args, exchange, table(args, exchange, ours, theirs, shown), shown, ours,
                            {"max_steps": args.max_steps, "template": {"summary": summary(theirs), "epochs": theirs}}))
    write_out(args, reports)


if __name__ == "__main__":
    main()
