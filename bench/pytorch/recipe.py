#!/usr/bin/python3
"""The MNIST network trained to a target test accuracy by PyTorch at its best on CPU.

The network of demo.py, written as a PyTorch user who wants the time to accuracy would
write it: the whole data set loaded once into memory as normalised tensors, every core
given to one process (torch.set_num_threads), no DataLoader, a torch.Generator shuffling
each epoch, the test set evaluated in batches of 1000 under no_grad. The optimizer and
schedule flags are mnist_mt's (`mnist_mt train --help`), with torch.optim's semantics:

    recipe.py --data DIR --recipe pytorch-example --epochs 2
    recipe.py --data DIR --recipe fast --target-accuracy 99 --seed 3
    recipe.py --data DIR --optimizer adamw --lr 3e-3 --lr-schedule onecycle --batch-size 256 \
              --epochs 2 --target-accuracy 99 --eval-every 100
    recipe.py --data DIR --recipe fast --ranks 2      # DDP over gloo, one process per rank
    recipe.py --data DIR --recipe fast --device cuda  # one GPU: data, model and steps on it

--batch-size is per rank, as in mnist_mt (one process is one rank); a recipe's batch is the
global batch. The last partial batch of an epoch is dropped, as mnist_mt drops it, so
OneCycle and cosine see the same step count.
With --device cuda (one process) the data sets are moved to the GPU once, as tensors, and
TF32 is off (torch.backends.cudnn.allow_tf32 and cuda.matmul.allow_tf32), matching
mnist_mt's default --precision fp32; every clock read waits for the GPU first.
The test set is evaluated every --eval-every steps and at each epoch's end; with
--target-accuracy the run stops at the first evaluation that reaches it. The result is one
JSON object on stdout; progress goes to stderr.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from demo import DEFAULT_DATA, IDX_FILES, MEAN, STD, Net, find_idx, free_port, read_idx
from recipes import DEFAULTS, OPTIMIZER_DEFAULTS, RECIPES

TEST_BATCH = 1000


def betas(text):
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not B1,B2")
    return b1, b2


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="directory of the four IDX files")
    p.add_argument("--recipe", choices=sorted(RECIPES), help="a named set of the flags below")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_DEFAULTS))
    p.add_argument("--lr", type=float, help="learning rate (OneCycle: max_lr)")
    p.add_argument("--momentum", type=float, help="SGD momentum")
    p.add_argument("--nesterov", action="store_true", default=None, help="SGD Nesterov momentum")
    p.add_argument("--weight-decay", type=float, help="default 0, AdamW 0.01")
    p.add_argument("--betas", type=betas, help="Adam/AdamW B1,B2")
    p.add_argument("--eps", type=float, help="Adam/AdamW/Adadelta epsilon")
    p.add_argument("--rho", type=float, help="Adadelta rho")
    p.add_argument("--lr-schedule", choices=["constant", "step", "onecycle", "cosine"])
    p.add_argument("--lr-step", type=int, help="StepLR step_size in epochs")
    p.add_argument("--gamma", type=float, help="StepLR gamma")
    p.add_argument("--warmup", type=int, help="linear warm-up steps: lr factor (k+1)/N at step k < N")
    p.add_argument("--batch-size", type=int, help="per rank")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--target-accuracy", type=float, help="percent: stop at the first evaluation reaching it")
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: each epoch only)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="threads in all, shared out between the ranks, at least one a rank (default: every usable core)")
    p.add_argument("--ranks", type=int, default=1, help="processes, DDP over gloo when more than one")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: one process on the current GPU, the data on it, TF32 off")
    p.add_argument("--metrics", help="write one JSON line per epoch to this file")
    p.add_argument("--result", help="also write the result (the JSON object printed last) to this file")
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error(f"--ranks: {args.ranks} is out of range (at least 1)")
    if args.device == "cuda" and args.ranks != 1:
        p.error("--device cuda runs one process: give --ranks 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this PyTorch sees no CUDA device")
    recipe = dict(RECIPES.get(args.recipe, {}))
    if args.optimizer and args.optimizer != recipe.get("optimizer", args.optimizer):
        for name in ("lr", "momentum", "nesterov", "weight_decay"):  # the recipe's rates are its optimizer's
            recipe.pop(name, None)
    settings = {**DEFAULTS, **recipe}
    if args.batch_size is None and not settings.pop("batch_per_rank", False):
        if settings["batch_size"] % args.ranks:
            p.error(f"the global batch {settings['batch_size']} does not divide into {args.ranks} ranks")
        settings["batch_size"] //= args.ranks
    settings.pop("batch_per_rank", None)
    for name, value in settings.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name, value in OPTIMIZER_DEFAULTS[args.optimizer].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("batch_size", "epochs", "lr_step", "ranks", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is out of range (at least 1)")
    if args.threads > args.ranks and args.threads % args.ranks:
        p.error(f"--threads {args.threads} is not a multiple of --ranks {args.ranks}")
    # More ranks than threads (4 processes on 2 cores): one thread each, as a user would set
    # OMP_NUM_THREADS=1 for them.
    args.threads_per_rank = max(1, args.threads // args.ranks)
    if args.warmup < 0 or args.eval_every < 0:
        p.error("--warmup and --eval-every take a count of steps (0 or more)")
    return args


def load(root, train):
    """Images as normalised float32 N×1×28×28 and labels as int64, in memory once."""
    prefix = "train" if train else "t10k"
    images = read_idx(Path(root) / f"{prefix}-images-idx3-ubyte", 0x00000803)
    labels = read_idx(Path(root) / f"{prefix}-labels-idx1-ubyte", 0x00000801)
    x = torch.from_numpy(images.copy()).float().div_(255).sub_(MEAN).div_(STD)
    return x.unsqueeze(1).contiguous(), torch.from_numpy(labels.astype("int64"))


def make_optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                               weight_decay=args.weight_decay)
    if args.optimizer in ("adam", "adamw"):
        cls = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
        return cls(params, lr=args.lr, betas=args.betas, eps=args.eps, weight_decay=args.weight_decay)
    return torch.optim.Adadelta(params, lr=args.lr, rho=args.rho, eps=args.eps, weight_decay=args.weight_decay)


def make_schedule(args, optimizer, total_steps):
    """(scheduler or None, whether it steps per batch rather than per epoch)."""
    if args.lr_schedule == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.lr_step, gamma=args.gamma), False
    if args.lr_schedule == "onecycle":
        # Adadelta has neither momentum nor beta1 to cycle.
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=total_steps,
                                                   cycle_momentum=args.optimizer != "adadelta"), True
    if args.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps, eta_min=0.0), True
    return None, False


def synchronize(device):
    """Waits for the device's queued work, so that a clock read covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate(model, test_x, test_y, rank, world):
    """(test loss, accuracy) over all 10,000 images, each rank testing every world-th batch."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=test_x.device)  # loss, correct, samples
    with torch.no_grad():
        for start in range(rank * TEST_BATCH, len(test_y), world * TEST_BATCH):
            x, y = test_x[start:start + TEST_BATCH], test_y[start:start + TEST_BATCH]
            out = model(x)
            sums[0] += F.nll_loss(out, y, reduction="sum").double()
            sums[1] += (out.argmax(dim=1) == y).sum().double()
            sums[2] += len(y)
    if world > 1:
        dist.all_reduce(sums)
    model.train()
    loss, correct, samples = sums.tolist()
    return loss / samples, correct / samples


def torch_build(device):
    """The PyTorch that ran, the CPU libraries it was built with and the GPU it ran on."""
    config = torch.__config__.show()
    libs = [line.strip(" -") for line in config.splitlines()
            if "Math Kernel Library" in line or "MKL-DNN" in line or "oneDNN" in line or "OpenBLAS" in line]
    blas = next((part.split("=", 1)[1] for part in config.replace(",", "\n").split()
                 if part.startswith("BLAS_INFO=")), "unknown")
    return {"torch_version": torch.__version__, "torch_blas": blas, "torch_libraries": libs,
            "mkl": torch.backends.mkl.is_available(), "mkldnn": torch.backends.mkldnn.is_available(),
            "cpu_capability": getattr(torch.backends, "cpu", None) and torch.backends.cpu.get_cpu_capability(),
            "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cuda": torch.version.cuda if device.type == "cuda" else None}


class Watch:
    """The test-set evaluations of a run, timed from its first step, and the first that
    reaches the target."""

    def __init__(self, test, target, rank, world):
        self.test, self.target, self.rank, self.world = test, target, rank, world
        self.evals, self.seconds, self.reached = [], 0.0, None
        self.start = time.perf_counter()

    def evaluate(self, model, step, steps_per_epoch):
        """Evaluates after `step`; returns the seconds it took."""
        synchronize(self.test[0].device)  # the training steps before are not evaluation's
        began = time.perf_counter()
        loss, accuracy = evaluate(model, *self.test, self.rank, self.world)
        now = time.perf_counter()
        self.seconds += now - began
        self.evals.append({"step": step, "epoch": step / steps_per_epoch, "test_accuracy": accuracy,
                           "test_loss": loss, "elapsed_s": now - self.start})
        if self.rank == 0:
            print(f"step {step} (epoch {step / steps_per_epoch:.2f}): test accuracy {100 * accuracy:.2f}%, "
                  f"{now - self.start:.1f} s", file=sys.stderr, flush=True)
        if self.target is not None and self.reached is None and accuracy >= self.target:
            self.reached = dict(self.evals[-1], eval_seconds=self.seconds)
        return now - began


def train_step(model, optimizer, x, y, step, warmup):
    """One update; during the warm-up at `warmup`'s fraction of the scheduled rate."""
    factor = (step + 1) / warmup if step < warmup else 1.0
    scheduled = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] *= factor
    optimizer.zero_grad(set_to_none=True)
    loss = F.nll_loss(model(x), y)
    loss.backward()
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, scheduled):
        g["lr"] = lr  # the schedulers step from the scheduled rate
    return loss.detach()


def train(args, rank, world):
    """The run; returns its result (rank 0's is reported)."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    model = Net().to(device)
    (train_x, train_y), test = load(args.data, True), load(args.data, False)
    train_x, train_y, test = train_x.to(device), train_y.to(device), tuple(t.to(device) for t in test)
    if world > 1:
        model = DistributedDataParallel(model)
    torch.manual_seed(args.seed + 1000003 * rank)  # each rank its own dropout masks
    optimizer = make_optimizer(args, model.parameters())
    global_batch = args.batch_size * world
    steps_per_epoch = len(train_y) // global_batch
    schedule, per_batch = make_schedule(args, optimizer, steps_per_epoch * args.epochs)
    shuffle = torch.Generator().manual_seed(args.seed)
    metrics = open(args.metrics, "w") if args.metrics and rank == 0 else None
    if device.type == "cuda":
        # Set-up, as mnist_mt's replicas do before their clock starts: the kernels loaded by
        # one forward and backward on zeros (the weights stay as they are).
        F.nll_loss(model(torch.zeros_like(train_x[:args.batch_size])), train_y[:args.batch_size]).backward()
        optimizer.zero_grad(set_to_none=True)
    if world > 1:
        dist.barrier()
    synchronize(device)
    watch = Watch(test, None if args.target_accuracy is None else args.target_accuracy / 100, rank, world)
    step, train_seconds = 0, 0.0
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_y), generator=shuffle).to(device)
        loss_sum, epoch_start, epoch_eval = 0.0, time.perf_counter(), 0.0
        for k in range(steps_per_epoch):
            idx = order[k * global_batch + rank * args.batch_size:][:args.batch_size]
            loss_sum += train_step(model, optimizer, train_x[idx], train_y[idx], step, args.warmup)
            if per_batch:
                schedule.step()
            step += 1
            if (args.eval_every and step % args.eval_every == 0) or k == steps_per_epoch - 1:
                epoch_eval += watch.evaluate(model, step, steps_per_epoch)
                if watch.reached:
                    break
        if schedule is not None and not per_batch:
            schedule.step()
        synchronize(device)
        seconds = time.perf_counter() - epoch_start - epoch_eval
        train_seconds += seconds
        taken = step - epoch * steps_per_epoch
        if metrics:
            metrics.write(json.dumps({"epoch": epoch, "steps": taken, "train_loss": float(loss_sum) / taken,
                                      "test_loss": watch.evals[-1]["test_loss"],
                                      "test_accuracy": watch.evals[-1]["test_accuracy"],
                                      "images_per_s": taken * global_batch / seconds, "seconds": seconds,
                                      "eval_seconds": epoch_eval}) + "\n")
            metrics.flush()
        if watch.reached:
            break
    if metrics:
        metrics.close()
    reached = watch.reached or {}
    return {
        "time_to_target_s": reached.get("elapsed_s"), "target_step": reached.get("step"),
        "target_accuracy": watch.target, "eval_seconds": reached.get("eval_seconds", watch.seconds),
        "seconds": time.perf_counter() - watch.start,
        "final_accuracy": watch.evals[-1]["test_accuracy"], "final_test_loss": watch.evals[-1]["test_loss"],
        "steps": step, "steps_per_epoch": steps_per_epoch, "global_batch": global_batch,
        "images_per_s": step * global_batch / train_seconds,
        "layout": (f"DDP over gloo, {world} processes x {args.threads_per_rank} threads" if world > 1
                   else f"1 process on {torch.cuda.get_device_name(device)}" if device.type == "cuda"
                   else f"1 process x {args.threads} threads"),
        "ranks": world, "threads": world * args.threads_per_rank, "evals": watch.evals,
        "settings": {k: getattr(args, k) for k in ("recipe", "optimizer", "lr", "momentum", "nesterov",
                                                   "weight_decay", "betas", "eps", "rho", "lr_schedule",
                                                   "lr_step", "gamma", "warmup", "batch_size", "epochs",
                                                   "seed", "eval_every")},
        **torch_build(device),
    }


def rank_main(rank, args, port, queue):
    torch.set_num_threads(args.threads_per_rank)
    if args.ranks > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    try:
        result = train(args, rank, args.ranks)
    finally:
        if args.ranks > 1:
            dist.destroy_process_group()
    if rank == 0 and queue is not None:
        queue.put(result)
    return result


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for name in IDX_FILES:
        find_idx(Path(args.data) / name)
    if args.ranks == 1:
        result = rank_main(0, args, None, None)
    else:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(rank_main, args=(args, free_port(), queue), nprocs=args.ranks, start_method="spawn")
        result = queue.get()
    print(json.dumps(result), flush=True)
    if args.result:
        Path(args.result).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
