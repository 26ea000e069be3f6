#!/usr/bin/python3
"""Writes tests/golden/optimizers.safetensors, torch.optim's answers that
tests/test_optimizer.cpp and tests/test_cpu_replica.cpp compare mnist_mt's optimizers and
schedules against.

Regenerate (deterministic) with Debian's python3-torch 1.13:
    /usr/bin/python3 tests/golden/gen_optimizers.py
It writes:
  rule.p0, rule.grads       COUNT float32 parameters and STEPS float32 gradients of them
  rule.<case>.step1, .step20  the parameters after 1 and STEPS updates of torch.optim's
                            optimizer of <case> (CASES below), in float32 as PyTorch runs it
  rule.<case>.<state name>  its state buffers after STEPS updates
  schedule.<case>.lr, .momentum  float64: the learning rate (and momentum or beta1) each of
                            SCHEDULE_STEPS updates ran with, from torch.optim.lr_scheduler
  net.<case>.<param>        the network's parameters after NET_STEPS updates from
                            torch_init.safetensors on golden.safetensors' batch (dropout
                            off), in float64; fc1.weight every 29th element
The metadata holds each case's settings as JSON.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "bench" / "pytorch"))
from demo import Net  # noqa: E402
from gen_golden import BATCH, BATCH_SEED, FC1_STRIDE, TORCH_SEED, f32, normalise, sampled, write_safetensors  # noqa: E402

COUNT = 4099  # no multiple of a vector width
STEPS = 20
SCHEDULE_STEPS_PER_EPOCH = 5
SCHEDULE_EPOCHS = 6
NET_STEPS = 20

# name -> (optimizer, keyword arguments as torch.optim takes them)
CASES = {
    "sgd": ("sgd", {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    "sgd_nesterov": ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    "sgd_plain": ("sgd", {"lr": 0.05}),
    "adam": ("adam", {"lr": 1e-3, "weight_decay": 1e-2}),
    "adam_low_beta": ("adam", {"lr": 1e-2, "betas": (0.3, 0.99), "eps": 1e-6}),
    "adamw": ("adamw", {"lr": 1e-3, "weight_decay": 1e-2}),
    "adadelta": ("adadelta", {"lr": 1.0, "rho": 0.9, "eps": 1e-6, "weight_decay": 1e-4}),
    # Rates at which 20 steps on one batch stay smooth: larger ones move ReLU and max-pool
    # decisions, which turns float32's rounding into differences of percents.
    "net_sgd_nesterov": ("sgd", {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}),
    "net_adam": ("adam", {"lr": 1e-4, "weight_decay": 1e-4}),
    "net_adamw": ("adamw", {"lr": 1e-4}),
    "net_adadelta": ("adadelta", {"lr": 0.1}),
}
STATE = {"sgd": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"], "adamw": ["exp_avg", "exp_avg_sq"],
         "adadelta": ["square_avg", "acc_delta"]}
CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
           "adadelta": torch.optim.Adadelta}

# name -> (optimizer case, schedule, settings); every schedule runs
# SCHEDULE_EPOCHS x SCHEDULE_STEPS_PER_EPOCH updates.
SCHEDULES = {
    "step": ("sgd", "step", {"step_size": 2, "gamma": 0.7}),
    "onecycle_sgd": ("sgd", "onecycle", {"max_lr": 0.05}),
    "onecycle_adam": ("adam", "onecycle", {"max_lr": 1e-3}),
    "onecycle_adadelta": ("adadelta", "onecycle", {"max_lr": 1.0}),
    "cosine": ("adamw", "cosine", {}),
    "warmup": ("sgd", "warmup", {"warmup": 7}),
}

# Network cases: (optimizer case, schedule or None)
NET_CASES = {"sgd_nesterov": ("net_sgd_nesterov", None), "adam": ("net_adam", None), "adamw": ("net_adamw", None),
             "adadelta": ("net_adadelta", None), "adamw_onecycle": ("net_adamw", "onecycle")}


def make_optimizer(case, params):
    kind, kwargs = CASES[case]
    return CLASSES[kind](params, **kwargs)


def rule_fixtures():
    rng = np.random.Generator(np.random.PCG64(29))
    p0 = rng.uniform(-1, 1, COUNT).astype(np.float32)
    grads = rng.normal(0, 0.1, (STEPS, COUNT)).astype(np.float32)
    out = {"rule.p0": p0, "rule.grads": grads}
    for case, (kind, _) in CASES.items():
        p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
        opt = make_optimizer(case, [p])
        for step in range(STEPS):
            p.grad = torch.from_numpy(grads[step].copy())
            opt.step()
            if step == 0:
                out[f"rule.{case}.step1"] = p.detach().numpy().copy()
        out[f"rule.{case}.step{STEPS}"] = p.detach().numpy().copy()
        for name in STATE[kind]:
            buffer = opt.state[p].get(name)
            if buffer is not None:
                out[f"rule.{case}.{name}"] = buffer.numpy().copy()
    return out


def make_scheduler(schedule, settings, opt, total):
    if schedule == "step":
        return torch.optim.lr_scheduler.StepLR(opt, **settings), "epoch"
    if schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, total_steps=total,
                                                   cycle_momentum=not isinstance(opt, torch.optim.Adadelta),
                                                   **settings), "step"
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total), "step"
    n = settings["warmup"]
    return torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / n, end_factor=1.0, total_iters=n - 1), "step"


def schedule_fixtures():
    out = {}
    total = SCHEDULE_STEPS_PER_EPOCH * SCHEDULE_EPOCHS
    for name, (case, schedule, settings) in SCHEDULES.items():
        p = torch.nn.Parameter(torch.zeros(3))
        opt = make_optimizer(case, [p])
        scheduler, every = make_scheduler(schedule, settings, opt, total)
        lrs, momenta = [], []
        for step in range(total):
            group = opt.param_groups[0]
            lrs.append(group["lr"])
            momenta.append(group["betas"][0] if "betas" in group else group.get("momentum", 0.0))
            p.grad = torch.ones(3)
            opt.step()
            if every == "step" or (step + 1) % SCHEDULE_STEPS_PER_EPOCH == 0:
                scheduler.step()
        out[f"schedule.{name}.lr"] = np.array(lrs, np.float64)
        out[f"schedule.{name}.momentum"] = np.array(momenta, np.float64)
    return out


def net_fixtures():
    torch.manual_seed(TORCH_SEED)  # torch_init.safetensors' weights, as gen_golden.py makes them
    init = {name: f32(p) for name, p in Net().named_parameters()}
    gen = torch.Generator().manual_seed(BATCH_SEED)
    images = torch.randint(0, 256, (BATCH, 28 * 28), generator=gen, dtype=torch.uint8).numpy()
    labels = torch.randint(0, 10, (BATCH,), generator=gen).numpy().astype(np.uint8)
    x = torch.from_numpy(normalise(images)).to(torch.float64).reshape(BATCH, 1, 28, 28)
    y = torch.from_numpy(labels.astype(np.int64))
    out = {}
    for name, (case, schedule) in NET_CASES.items():
        model = Net().to(torch.float64)
        model.load_state_dict({k: torch.from_numpy(v).to(torch.float64) for k, v in init.items()})
        model.eval()  # dropout off; autograd still gives the training gradients
        kind, kwargs = CASES[case]
        opt = CLASSES[kind](model.parameters(), **kwargs)
        scheduler = None
        if schedule == "onecycle":
            scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=kwargs["lr"], total_steps=NET_STEPS)
        for _ in range(NET_STEPS):
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
            if scheduler is not None:
                scheduler.step()
        for pname, p in model.named_parameters():
            out[f"net.{name}.{pname}"] = sampled(pname, p.detach().to(torch.float32).numpy().copy())
    return out


def main():
    torch.set_num_threads(1)
    tensors = {}
    tensors.update(rule_fixtures())
    tensors.update(schedule_fixtures())
    tensors.update(net_fixtures())
    metadata = {"count": str(COUNT), "steps": str(STEPS), "net_steps": str(NET_STEPS),
                "fc1_weight_stride": str(FC1_STRIDE),
                "schedule_steps_per_epoch": str(SCHEDULE_STEPS_PER_EPOCH),
                "schedule_epochs": str(SCHEDULE_EPOCHS), "torch_version": torch.__version__,
                "cases": json.dumps(CASES), "schedules": json.dumps(SCHEDULES), "net_cases": json.dumps(NET_CASES)}
    write_safetensors(HERE / "optimizers.safetensors", tensors, metadata)


if __name__ == "__main__":
    main()
