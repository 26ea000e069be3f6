#!/usr/bin/env bash
# The README's PyTorch snippet, run exactly as written on a checkpoint mnist_mt just saved
# (20 steps of Adam on Debian's Fashion-MNIST, so the file holds exp_avg.* and exp_avg_sq.*):
# PyTorch (Debian's python3-torch) must load it into the template's Net, and its
# probability for the digit `mnist_mt predict` names must be mnist_mt's within 1e-3 for
# ten test images.
# Usage: test_checkpoint_in_torch.sh MNIST_MT SOURCE_ROOT
set -euo pipefail
exe=$(realpath "$1") root=$2
data=/usr/share/datasets/fashion-mnist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

"$exe" --cpu 1 --dataset fashion-mnist --data "$data" --max-steps 20 --optimizer adam \
  --save mnist.safetensors >train.log
indices=(0 1 2 3 4 5 6 7 8 9)
"$exe" predict --cpu 1 --load mnist.safetensors --dataset fashion-mnist --data "$data" \
  "${indices[@]/#/--index=}" >predict.txt

/usr/bin/python3 - "$root/README.md" "$data" predict.txt <<'PY'
import gzip
import re
import sys

import numpy as np
import torch

readme, data, predictions = sys.argv[1:]
# The snippet: the python block after the README's marker.
text = open(readme).read()
marker = "<!-- tests/test_checkpoint_in_torch.sh runs this snippet -->"
assert text.count(marker) == 1, f"{readme}: want the marker once: {marker}"
snippet = re.search(r"```python\n(.*?)```", text[text.index(marker):], re.S).group(1)
scope = {}
exec(compile(snippet, "README.md snippet", "exec"), scope)

# The checkpoint holds the optimizer's state, which the snippet must have left out to load it.
tensors = scope["load_safetensors"]("mnist.safetensors")
keys = set(tensors)
state = ("exp_avg.", "exp_avg_sq.")
assert all(any(k.startswith(p) for k in keys) for p in state), sorted(keys)
try:  # where the safetensors package is installed, its reader gives the same dict
    from safetensors.torch import load_file
except ImportError:
    load_file = None
if load_file is not None:
    theirs = load_file("mnist.safetensors")
    assert set(theirs) == keys and all(torch.equal(theirs[k], tensors[k]) for k in keys)
assert set(scope["model"].state_dict()) == {k for k in keys if not k.startswith(state)}

with gzip.open(f"{data}/t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 28, 28)
worst, seen = 0.0, 0
for line in open(predictions):
    if line.startswith("mnist_mt: "):  # the line naming the data set
        continue
    seen += 1
    m = re.fullmatch(r"test image (\d+): (\d) \(probability ([0-9.]+)\), label \d\n", line)
    assert m, f"unexpected predict line: {line!r}"
    index, digit, theirs = int(m[1]), int(m[2]), float(m[3])
    ours = scope["predict"](torch.from_numpy(images[index:index + 1].copy()))[0, digit].item()
    worst = max(worst, abs(ours - theirs))
    assert abs(ours - theirs) < 1e-3, f"test image {index}: PyTorch {ours:.4f}, mnist_mt {theirs:.4f} for digit {digit}"
assert seen == 10, f"{predictions}: {seen} predictions, want 10"
print(f"test_checkpoint_in_torch: the README's snippet loads the checkpoint; probabilities within {worst:.1e}")
PY
