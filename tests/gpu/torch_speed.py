#!/usr/bin/env python3
"""The template's training step timed in PyTorch: µs per step, set beside bench_step's.

A step: zero_grad(set_to_none=True), forward in train mode (dropout on), nll_loss (mean),
backward, SGD (lr 0.01, momentum 0.9). The input is made once on the device: random uint8
images normalised with MNIST's mean and std, random labels 0..9.
Modes:
  eager                    the step as the template writes it
  compile                  torch.compile of forward + loss (AOTAutograd compiles the
                           backward); the SGD step eager, as users write it
  compile-reduce-overhead  the same with mode="reduce-overhead" (CUDA graphs)
  graph                    PyTorch's documented whole-network capture: warm-up on a side
                           stream, grads set to None, forward + loss + backward + step
                           captured as one torch.cuda.CUDAGraph on static tensors; each
                           replay writes the grads afresh, so it needs no zero_grad
Each row (mode, batch, TF32) builds a fresh seeded model and optimizer, runs --warmup
steps (compilation or capture among them: compile_s), then --steps steps between one pair
of CUDA events, synchronised at the end: us_per_step = elapsed / steps (the host clock on
CPU). TF32 sets torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
both; PyTorch's defaults are recorded in every row.
Rows run eager and graph first, the compile modes last; within each, TF32 off before on,
batches in --batches order. A row that would not end within --budget-s (counted from the
start, estimated from the last row of its mode) is skipped and says so. The JSON list is
rewritten after every row, unreached rows marked, so a run killed from outside keeps what
it finished and shows where it stopped. Exit 1 when an eager or graph row failed or no
row ran (compile rows may fail on some installs: recorded, not fatal); 2 on bad arguments.

  torch_speed.py [--device cuda|cpu] [--json FILE] [--steps 200] [--warmup 20]
                 [--batches 64,4,256] [--modes eager,graph,compile,compile-reduce-overhead]
                 [--tf32 off,on] [--budget-s 130]
"""
import time

START = time.monotonic()  # the budget counts PyTorch's import too

import argparse
import collections
import gc
import importlib
import inspect
import json
import os
import sys

import torch
import torch.nn.functional as F

MODES = ("eager", "graph", "compile", "compile-reduce-overhead")
MEAN, STD = 0.1307, 0.3081
LR, MOMENTUM = 0.01, 0.9
# Seconds a row of a mode not yet seen is expected to take: compilation dominates.
FIRST_ROW_GUESS_S = {"eager": 5.0, "graph": 5.0, "compile": 30.0, "compile-reduce-overhead": 30.0}


class Net(torch.nn.Module):
    """The template's network."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = torch.nn.Dropout(0.25)
        self.dropout2 = torch.nn.Dropout(0.5)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)


def listed(kind, choices=None, convert=str):
    def parse(text):
        items = [convert(t) for t in text.split(",") if t]
        bad = [t for t in items if choices is not None and t not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"{kind}: {text!r}; choose among {', '.join(choices)}")
        return items
    return parse


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be 1 or more")
    return value


def one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def why_not(mode, tf32, device):
    """The reason a row cannot run on this install and device, or None."""
    if mode.startswith("compile") and not hasattr(torch, "compile"):
        return f"unsupported: torch {torch.__version__} has no torch.compile"
    if mode == "graph" and not hasattr(torch.cuda, "CUDAGraph"):
        return f"unsupported: torch {torch.__version__} has no torch.cuda.CUDAGraph"
    if device.type != "cuda" and tf32:
        return "skipped: TF32 is a CUDA setting"
    if device.type != "cuda" and mode in ("graph", "compile-reduce-overhead"):
        return "skipped: CUDA graphs need a CUDA device"
    return None


def make_optimizer(net, mode):
    """SGD, capturable when captured and the installed SGD has the argument (SGD keeps no
    step count on the device, so PyTorch's whole-network capture example needs none)."""
    kwargs = {}
    if mode == "graph" and "capturable" in inspect.signature(torch.optim.SGD).parameters:
        kwargs["capturable"] = True
    return torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, **kwargs), kwargs


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(step, steps, device):
    """Seconds per step: one event pair around the loop on CUDA, the host clock on CPU."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3 / steps
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def run_row(row, args, device):
    """Fills row: us_per_step, warmup_s, compile_s, optimizer."""
    mode, batch = row["mode"], row["batch"]
    torch.backends.cuda.matmul.allow_tf32 = row["tf32"]
    torch.backends.cudnn.allow_tf32 = row["tf32"]
    if mode.startswith("compile"):
        importlib.import_module("torch._dynamo").reset()  # each row compiles afresh, never against the recompile limit
    torch.manual_seed(args.seed)
    net = Net().to(device).train()
    opt, kwargs = make_optimizer(net, mode)
    row["optimizer"] = f"SGD(lr={LR}, momentum={MOMENTUM}" + "".join(f", {k}={v}" for k, v in kwargs.items()) + ")"
    images = torch.randint(0, 256, (batch, 1, 28, 28), device=device, dtype=torch.uint8)
    x = (images.float() / 255.0 - MEAN) / STD
    y = torch.randint(0, 10, (batch,), device=device)

    def loss_of(x, y):
        return F.nll_loss(net(x), y)

    forward = loss_of
    if mode == "compile":
        forward = torch.compile(loss_of)
    elif mode == "compile-reduce-overhead":
        forward = torch.compile(loss_of, mode="reduce-overhead")
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def step():
        if mode == "compile-reduce-overhead" and mark_step is not None:
            mark_step()
        opt.zero_grad(set_to_none=True)
        forward(x, y).backward()
        opt.step()

    t = time.perf_counter()
    if mode == "graph":
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(args.warmup):  # momentum buffers exist before capture
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        opt.zero_grad(set_to_none=True)  # the captured backward allocates the grads in the graph's pool
        graph = torch.cuda.CUDAGraph()
        captured = time.perf_counter()
        with torch.cuda.graph(graph):
            loss_of(x, y).backward()
            opt.step()
        synchronize(device)
        row["compile_s"] = round(time.perf_counter() - captured, 3)
        step = graph.replay
        step()
    else:
        for _ in range(args.warmup):
            step()
    synchronize(device)
    row["warmup_s"] = round(time.perf_counter() - t, 3)
    if mode.startswith("compile"):
        row["compile_s"] = row["warmup_s"]
    seconds = timed_loop(step, args.steps, device)
    row["us_per_step"] = round(seconds * 1e6, 2)
    row["images_per_s"] = round(batch / seconds, 1)


def write(path, rows):
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    ap.add_argument("--steps", type=positive, default=200)
    ap.add_argument("--warmup", type=positive, default=20, help="steps before timing (1 at least: SGD's momentum buffers)")
    ap.add_argument("--batches", type=listed("--batches", convert=positive), default=[64, 4, 256])
    ap.add_argument("--modes", type=listed("--modes", MODES), default=list(MODES))
    ap.add_argument("--tf32", type=listed("--tf32", ("off", "on")), default=["off", "on"])
    ap.add_argument("--budget-s", type=float, default=130.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"torch_speed: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    defaults = {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                "cudnn_benchmark": torch.backends.cudnn.benchmark}
    common = {"steps": args.steps, "warmup": args.warmup, "torch_version": torch.__version__,
              "cuda_version": torch.version.cuda, "device": str(device),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "defaults": defaults}
    order = lambda r: (r["mode"].startswith("compile"), args.tf32.index("on" if r["tf32"] else "off"),
                       args.batches.index(r["batch"]), args.modes.index(r["mode"]))
    rows = sorted(({"mode": m, "batch": b, "tf32": t == "on", "us_per_step": None, "images_per_s": None,
                    "warmup_s": None, "compile_s": None, "status": "not reached: the run was cut short", **common}
                   for m in args.modes for b in dict.fromkeys(args.batches) for t in dict.fromkeys(args.tf32)),
                  key=order)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {device} ({common['gpu'] or 'CPU'}); "
          f"defaults {defaults}; {args.steps} steps after {args.warmup}, budget {args.budget_s:g} s")
    last_took = {}
    for row in rows:
        label = f"{row['mode']:<24} batch {row['batch']:>4}  TF32 {'on ' if row['tf32'] else 'off'}"
        spent = time.monotonic() - START
        expect = last_took.get(row["mode"], FIRST_ROW_GUESS_S[row["mode"]])
        row["status"] = why_not(row["mode"], row["tf32"], device)
        if row["status"] is None and spent + expect > args.budget_s:
            row["status"] = f"skipped: budget ({spent:.0f} s of {args.budget_s:g} s spent, a row takes ~{expect:.0f} s)"
        if row["status"] is not None:
            print(f"{label}  {row['status']}", flush=True)
            write(args.json, rows)
            continue
        row["status"] = "running: did not finish (killed from outside?)"
        write(args.json, rows)
        began = time.monotonic()
        try:
            run_row(row, args, device)
            row["status"] = "ok"
            print(f"{label}  {row['us_per_step']:>10.1f} us/step  {row['images_per_s']:>10.0f} images/s  "
                  f"warm-up {row['warmup_s']:.2f} s" +
                  (f", compile/capture {row['compile_s']:.2f} s" if row["compile_s"] is not None else ""), flush=True)
        except Exception as e:  # a mode this install cannot run: recorded, the others go on
            row["status"] = f"failed: {one_line(e)}"
            print(f"{label}  {row['status']}", flush=True)
        last_took[row["mode"]] = time.monotonic() - began
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write(args.json, rows)
    counts = collections.Counter(r["status"].split(":")[0] for r in rows)
    print(f"{len(rows)} rows: " + ", ".join(f"{n} {s}" for s, n in counts.items()) +
          f", in {time.monotonic() - START:.0f} s")
    hard = [r for r in rows if r["mode"] in ("eager", "graph") and r["status"].startswith("failed")]
    return 1 if hard or not counts["ok"] else 0


if __name__ == "__main__":
    sys.exit(main())
