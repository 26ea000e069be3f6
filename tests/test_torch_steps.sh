#!/usr/bin/env bash
# The CPU backend against PyTorch, step by step: step_trace takes 60 training steps on
# one CPU replica and writes them down; tests/gpu/torch_compare.py repeats them with
# Debian's PyTorch (CPU) from the same weights on the same samples and dropout masks, and
# compares step 0's gradients and the losses. The GPU suite does the same on the GPU.
# Usage: test_torch_steps.sh STEP_TRACE SOURCE_ROOT
set -euo pipefail
step_trace=$1 root=$2
data=/usr/share/datasets/fashion-mnist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$step_trace" --backend cpu --data "$data" --out "$work" --steps 60
/usr/bin/python3 "$root/tests/gpu/torch_compare.py" --trace "$work" --data "$data" --device cpu
