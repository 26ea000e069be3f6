#!/usr/bin/python3
"""The PyTorch DistributedDataParallel MNIST template that mnist_mt replaces.

The network, DistributedSampler, DistributedDataParallel and SGD exactly as the
template uses them; only the data source differs: torchvision is not needed, the
IDX files (raw or .gz) are read here with numpy, and every sample is turned into a
tensor and normalised on the fly as torchvision's ToTensor + Normalize do.

Run it as users do, one process per rank:
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node=2 demo.py --epochs 1
    /usr/bin/python3 -m torch.distributed.launch --nproc_per_node=2 demo.py
(torch 1.13's launchers on Python 3.11 fail on their own default --tee/--redirects;
add `--tee 1 --redirects 2` before demo.py), or let it start its own ranks:
    /usr/bin/python3 demo.py --nproc 2
CPU ranks use gloo with one thread each; GPU ranks (--device cuda) use nccl.
"""
import argparse
import gzip
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.1307, 0.3081


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def find_idx(path):
    """`path` itself or `path`.gz, whichever exists."""
    for candidate in (Path(path), Path(str(path) + ".gz")):
        if candidate.exists():
            return candidate
    sys.exit(f"{path}: no such file (raw or .gz)")


def read_idx(path, magic):
    """Returns the array of an IDX file."""
    candidate = find_idx(path)
    opener = gzip.open if candidate.suffix == ".gz" else open
    with opener(candidate, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        sys.exit(f"{candidate}: magic {found:#010x}, expected {magic:#010x}")
    dims = magic & 0xFF
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims)
    if data.size != int(np.prod(shape)):
        sys.exit(f"{candidate}: {data.size} bytes of data, header says {shape}")
    return data.reshape(shape)


class IdxMnist(Dataset):
    """torchvision.datasets.MNIST with ToTensor + Normalize, over our IDX files."""

    def __init__(self, root, train):
        prefix = "train" if train else "t10k"
        self.images = read_idx(Path(root) / f"{prefix}-images-idx3-ubyte", 0x00000803)
        self.labels = read_idx(Path(root) / f"{prefix}-labels-idx1-ubyte", 0x00000801)
        if len(self.images) != len(self.labels):
            sys.exit(f"{root}: {len(self.images)} {prefix} images but {len(self.labels)} labels")

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        image = torch.from_numpy(self.images[i].astype(np.float32) / 255.0).unsqueeze(0)
        return (image - MEAN) / STD, int(self.labels[i])


def loaded_blas():
    """The BLAS library this process runs with: Debian's python3-torch takes libblas.so.3,
    which its alternatives point at the reference BLAS or at OpenBLAS."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libblas" in line or "openblas" in line})
    except OSError:
        return "unknown"
    if any("openblas" in p for p in paths):
        return "OpenBLAS"
    return "reference BLAS" if paths else "no BLAS loaded"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="directory of the four IDX files")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="training steps per epoch, 0 = all")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks to start here when not run under a launcher")
    p.add_argument("--json", help="write one JSON object per epoch to this file (rank 0)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="set by torch.distributed.launch without --use_env")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "test_batch_size", "nproc"):
        if getattr(args, name) < (0 if name == "epochs" else 1):
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is out of range")
    if not args.lr >= 0:
        p.error(f"--lr: {args.lr} is not a non-negative number")
    return args


def train_epoch(model, loader, sampler, optimizer, epoch, args, device):
    """One epoch; returns (mean train loss, images all ranks trained on, seconds)."""
    model.train()
    sampler.set_epoch(epoch)
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # sum of losses, samples
    dist.barrier()
    start = time.perf_counter()
    for step, (data, target) in enumerate(loader):
        if args.max_steps and step >= args.max_steps:
            break
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
        loss_sum[0] += loss.detach().double() * len(target)
        loss_sum[1] += len(target)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    seconds = time.perf_counter() - start
    dist.all_reduce(loss_sum)
    samples = loss_sum[1].item()
    return loss_sum[0].item() / max(samples, 1), samples, seconds


def evaluate(model, test_set, args, device):
    """Every rank tests its own shard; the sums are all-reduced, each sample counted once."""
    model.eval()
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = torch.utils.data.Subset(test_set, range(rank, len(test_set), world))
    loader = DataLoader(shard, batch_size=args.test_batch_size, num_workers=args.workers)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, samples
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            sums[0] += F.nll_loss(output, target, reduction="sum").double()
            sums[1] += (output.argmax(dim=1) == target).sum().double()
            sums[2] += len(target)
    dist.all_reduce(sums)
    loss, correct, samples = sums.tolist()
    return loss / samples, correct / samples


def run(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    torch.manual_seed(args.seed)

    train_set, test_set = IdxMnist(args.data, True), IdxMnist(args.data, False)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, pin_memory=device.type == "cuda")
    model = Net().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)

    out = open(args.json, "w") if args.json and rank == 0 else None
    for epoch in range(args.epochs):
        train_loss, images, seconds = train_epoch(model, loader, sampler, optimizer, epoch, args, device)
        test_loss, test_accuracy = evaluate(model, test_set, args, device)
        record = {"epoch": epoch, "train_loss": train_loss, "test_loss": test_loss,
                  "test_accuracy": test_accuracy, "images_per_s": images / seconds,
                  "seconds": seconds, "steps": int(images) // (args.batch_size * world),
                  "world": world, "batch_size": args.batch_size, "device": device.type,
                  "blas": loaded_blas()}
        if rank == 0:
            print(f"epoch {epoch}: train loss {train_loss:.4f}, {images / seconds:.1f} images/s "
                  f"({world} ranks, {seconds:.2f} s), test loss {test_loss:.4f}, "
                  f"test accuracy {100 * test_accuracy:.2f}%", flush=True)
            if out:
                out.write(json.dumps(record) + "\n")
                out.flush()
    if out:
        out.close()


def worker(rank, args, world, port):
    """A rank started by --nproc: the environment a launcher would have set."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    main_rank(args)


def main_rank(args):
    if args.device == "cpu":
        torch.set_num_threads(1)  # one core per rank, as mnist_mt's CPU devices
    elif not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device available to this PyTorch")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        run(args)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for name in IDX_FILES:  # a missing file is reported once, before any rank starts
        find_idx(Path(args.data) / name)
    if "RANK" in os.environ:
        main_rank(args)
    else:
        mp.spawn(worker, args=(args, args.nproc, free_port()), nprocs=args.nproc)


if __name__ == "__main__":
    main()
