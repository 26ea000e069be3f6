#!/usr/bin/env bash
# The CPU backend against PyTorch, step by step: step_trace takes 60 training steps on
# one CPU replica and writes them down; tests/gpu/torch_compare.py repeats them with
# Debian's PyTorch (CPU) from the same weights on the same samples and dropout masks, and
# compares step 0's gradients and the losses. The GPU suite does the same on the GPU.
# With bf16 (--precision bf16: fc1's and fc2's products on bfloat16 operands) PyTorch
# takes 40 steps (two 20-step means; its replays are most of the test's time) twice, with
# the limits measured for each (seeds 1-3, 2026-12-07; tests/gpu/torch_compare.py's
# docstring says what each reference is):
#   rounded   (the same products up to the order of the sums): step 0's gradients within
#             1e-3 normwise (measured 1.3e-4 to 2.1e-4; mnist_mt's float32 products are
#             2.7e-2 to 5.5e-2 from it), the first 10 losses within 2e-4 (measured 1.7e-5
#             to 2.9e-5); later steps part as a rounding to bfloat16 flips;
#   autocast  (torch.autocast, which also rounds fc1's and fc2's outputs to bfloat16):
#             gradients within 5e-2 (measured 1.8e-3 to 2.5e-2), the first 10 losses within
#             5e-3 (measured 1.5e-4 to 6.6e-4);
# and the means of 20 steps within 3% for both, as for float32. A CPU without bf16
# products (neither AVX512_BF16 nor AMX, or oneDNN held below them) skips (exit 77).
# Usage: test_torch_steps.sh STEP_TRACE SOURCE_ROOT [fp32|bf16]
set -euo pipefail
step_trace=$1 root=$2 precision=${3:-fp32}
data=/usr/share/datasets/fashion-mnist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
compare=("/usr/bin/python3" "$root/tests/gpu/torch_compare.py" --trace "$work" --data "$data" --device cpu)
case "$precision" in
  fp32)
    "$step_trace" --backend cpu --data "$data" --out "$work" --steps 60
    "${compare[@]}"
    ;;
  bf16)
    rc=0
    "$step_trace" --backend cpu --data "$data" --out "$work" --steps 40 --precision bf16 2>"$work/stderr" || rc=$?
    cat "$work/stderr" >&2
    if [ "$rc" -eq 2 ] && grep -q "bf16 needs AVX512_BF16 or AMX" "$work/stderr"; then exit 77; fi
    [ "$rc" -eq 0 ] || exit 1
    status=0
    "${compare[@]}" --reference rounded --grad-tol 1e-3 --track-steps 10 --track-tol 2e-4 || status=1
    "${compare[@]}" --reference autocast --grad-tol 5e-2 --track-steps 10 --track-tol 5e-3 || status=1
    exit $status
    ;;
  *) echo "usage: test_torch_steps.sh STEP_TRACE SOURCE_ROOT [fp32|bf16]" >&2; exit 2 ;;
esac
