#!/usr/bin/env python3
"""PyTorch takes the steps that step_trace wrote down, and the two are compared.

The template's network and SGD, from step_trace's initial weights, on the same samples
with the same dropout masks (applied as mask * 1/(1-p), which is what dropout does), on
the device given, with TF32 off (but for a tf32 trace, below). Checks step 0's gradients tensor by tensor (normwise,
within --grad-tol) and the loss curve: the first --track-steps steps each within
--track-tol (relative), and the mean of every --window steps within --window-tol. Step
by step the two runs separate as any two roundings of SGD do (measured on one CPU:
1e-8 at step 0, 1e-5 by step 30, 1e-3 by step 40, percents later), so past the first
steps only the curve's course can agree, not each step.
With a trace of `--precision bf16` (fc1's and fc2's products on bfloat16 operands, float32
sums and outputs), PyTorch takes the steps with the same products: --reference rounded
(the default) rounds each operand of fc1 and fc2, forward and backward, to bfloat16 and
multiplies in float32, which is exact (the product of two bfloat16 values fits a float32):
the same arithmetic up to the order of the sums; --reference autocast runs fc1 and fc2
under torch.autocast("cpu", torch.bfloat16) as a PyTorch user would, which also rounds
their outputs to bfloat16 and so needs looser limits (tests/test_torch_steps.sh states them).
With a trace of `--precision tf32` (a GPU's cuDNN convolutions and cuBLAS products on TF32
tensor cores; mnist_mt's own kernels, conv1 and fc2 with the loss, stay float32), PyTorch
takes the steps with TF32 allowed for its convolutions and matrix products alike
(torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32): the same setting,
not the same arithmetic, so the limits are TF32's (the GPU suite gives them).
Prints one line per check and writes --json; exit 0 when all pass, 1 when not, 2 on
bad input.

  torch_compare.py --trace DIR --data DIR [--device cuda|cpu] [--reference rounded|autocast]
                   [--json FILE]
"""
import argparse
import gzip
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

NAMES = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
         "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
MEAN, STD = 0.1307, 0.3081


def fail_input(message):
    print(f"torch_compare: {message}", file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    """The F32 tensors of a safetensors file, by name (torch.frombuffer: no numpy needed)."""
    try:
        blob = open(path, "rb").read()
    except OSError as e:
        fail_input(f"{path}: {e.strerror}")
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    data = blob[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"])
    missing = [n for n in NAMES if n not in out]
    if missing:
        fail_input(f"{path}: no tensor {missing[0]}")
    return out


def read_idx(directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                blob = f.read()
            dims = blob[3]
            shape = struct.unpack(">" + "I" * dims, blob[4:4 + 4 * dims])
            return torch.frombuffer(bytearray(blob[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)
    fail_input(f"{directory}: no {stem} (raw or .gz)")


def bf16(t):
    """t rounded to bfloat16 (nearest even), as float32."""
    return t.to(torch.bfloat16).to(torch.float32)


class RoundedLinear(torch.autograd.Function):
    """x W^T + b with x, W and the output gradient rounded to bfloat16, float32 arithmetic."""

    @staticmethod
    def forward(ctx, x, w, b):
        x, w = bf16(x), bf16(w)
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = bf16(g)
        return g @ w, g.t() @ x, g.sum(0)


class Net(torch.nn.Module):
    """The template's network, its dropouts given as masks; fc1's and fc2's products as
    `products` says: "fp32", "rounded" or "autocast" (the module docstring)."""

    def __init__(self, products="fp32"):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)
        self.products = products

    def linear(self, layer, x):
        if self.products == "rounded":
            return RoundedLinear.apply(x, layer.weight, layer.bias)
        if self.products == "autocast":
            with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
                return layer(x).float()
        return layer(x)

    def forward(self, x, keep1, keep2, p1, p2):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1) * keep1 * (1.0 / (1.0 - p1))
        x = F.relu(self.linear(self.fc1, x)) * keep2 * (1.0 / (1.0 - p2))
        return F.log_softmax(self.linear(self.fc2, x), dim=1)


def normwise(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reference", choices=["rounded", "autocast"], default="rounded",
                    help="with a bf16 trace: PyTorch's products (the module docstring)")
    ap.add_argument("--json")
    ap.add_argument("--grad-tol", type=float, default=1e-4)
    ap.add_argument("--track-steps", type=int, default=20)
    ap.add_argument("--track-tol", type=float, default=1e-4)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--window-tol", type=float, default=0.03)
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    device = torch.device(args.device)

    try:
        trace = json.load(open(os.path.join(args.trace, "trace.json")))
    except (OSError, ValueError) as e:
        fail_input(f"{args.trace}/trace.json: {e}")
    steps, batch, flat, hidden = trace["steps"], trace["batch"], trace["flat"], trace["hidden"]
    p1, p2 = trace["dropout"]
    images = read_idx(args.data, "train-images-idx3-ubyte")
    labels = read_idx(args.data, "train-labels-idx1-ubyte").long()
    masks = open(os.path.join(args.trace, "masks.bin"), "rb").read()
    if len(masks) != steps * batch * (flat + hidden):
        fail_input(f"{args.trace}/masks.bin: {len(masks)} bytes, the trace needs {steps * batch * (flat + hidden)}")
    masks = torch.frombuffer(bytearray(masks), dtype=torch.uint8).reshape(steps, batch, flat + hidden)

    precision = trace.get("precision", "fp32")
    if precision not in ("fp32", "tf32", "bf16"):
        fail_input(f"{args.trace}/trace.json: precision {precision!r}, not fp32, tf32 or bf16")
    if precision == "tf32":
        if device.type != "cuda":
            fail_input(f"{args.trace}/trace.json: a tf32 trace is compared on a GPU (--device cuda)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    products = args.reference if precision == "bf16" else "fp32"
    net = Net(products).to(device)
    init = read_safetensors(os.path.join(args.trace, "init.safetensors"))
    ours_grads = read_safetensors(os.path.join(args.trace, "grads.safetensors"))
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(init[name])
    opt = torch.optim.SGD(net.parameters(), lr=trace["lr"], momentum=trace["momentum"])

    grad_diffs, losses = {}, []
    for step in range(steps):
        idx = torch.tensor(trace["indices"][step], dtype=torch.long)
        x = ((images[idx].float() / 255.0 - MEAN) / STD).unsqueeze(1).to(device)
        y = labels[idx].to(device)
        m = masks[step].to(device).float()
        opt.zero_grad()
        loss = F.nll_loss(net(x, m[:, :flat], m[:, flat:], p1, p2), y)
        loss.backward()
        if step == 0:
            for name, p in net.named_parameters():
                grad_diffs[name] = normwise(ours_grads[name].to(device), p.grad)
        losses.append(loss.item())
        opt.step()

    ours = trace["losses"]
    step_diffs = [abs(a - b) / abs(b) for a, b in zip(ours, losses)]
    track = step_diffs[:args.track_steps]
    windows = []
    for w in range(0, steps, args.window):
        a, b = ours[w:w + args.window], losses[w:w + args.window]
        windows.append(abs(sum(a) - sum(b)) / abs(sum(b)))
    worst_grad = max(grad_diffs, key=grad_diffs.get)
    grads_ok = grad_diffs[worst_grad] <= args.grad_tol
    track_ok = max(track) <= args.track_tol
    curve_ok = max(windows) <= args.window_tol
    verdict = lambda ok: "PASS" if ok else "FAIL"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {device} ({name}), mnist_mt backend {trace['backend']}, "
          f"{steps} steps of {batch}, products {precision}" + (f" (PyTorch's: {products})" if precision != "fp32" else ""))
    print(f"step 0 gradients: worst {worst_grad} {grad_diffs[worst_grad]:.2e} normwise "
          f"(limit {args.grad_tol:g}): {verdict(grads_ok)}")
    print(f"first {len(track)} steps' losses: worst {max(track):.2e} relative (limit {args.track_tol:g}): "
          f"{verdict(track_ok)}")
    print(f"loss curve, means of {args.window} steps: worst {max(windows):.2e} relative (limit {args.window_tol:g}); "
          f"last step {ours[-1]:.4f} vs {losses[-1]:.4f}: {verdict(curve_ok)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": str(device), "precision": precision,
                       "products": products, "grad_relative": grad_diffs,
                       "losses_mnist_mt": ours, "losses_torch": losses, "window_relative": windows,
                       "grads_pass": grads_ok, "track_pass": track_ok, "curve_pass": curve_ok}, f)
    return 0 if grads_ok and track_ok and curve_ok else 1


if __name__ == "__main__":
    sys.exit(main())
