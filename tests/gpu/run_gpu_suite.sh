#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one run, on a host with NVIDIA GPUs and the CUDA
# libraries (cudart, cuBLAS, cuDNN 9, NCCL) but not this project's build tree.
#
# On the build machine, from the repository root:
#   meson setup build-cuda
#   ninja -C build-cuda mnist_mt tests/test_cuda_replica tests/test_cuda_comm bench/bench_step
#   ../shared/tools/gpu-bundle build-cuda .gpu/bundle build-cuda/mnist_mt \
#       build-cuda/tests/test_cuda_replica build-cuda/tests/test_cuda_comm build-cuda/bench/bench_step
#   mkdir -p .gpu/data && cp /usr/share/datasets/fashion-mnist/*-ubyte.gz .gpu/data/
# On the GPU host, from the repository root (with .gpu/ copied there):
#   OUT=/dir/for/logs tests/gpu/run_gpu_suite.sh [BUNDLE_DIR] [DATA_DIR]
#
# Runs, each under a time limit: the gpu test suite (NCCL collectives over every visible
# GPU; the CUDA replica against the CPU one), one epoch on one GPU next to one epoch on
# one CPU rank with the same settings (accuracy within 1 point), ddp and dp over every
# visible GPU (their accuracies within 1 point), a worker fault on the GPUs (exit 3, no
# hang), and the step benchmark. Writes a log per check, the metrics lines, the gtest
# and benchmark JSON, and summary.txt (GPU model, date, PASS/FAIL per check) to $OUT.
# Exit status: the number of failed checks.
set -u

bundle=${1:-.gpu/bundle}
data=${2:-.gpu/data}
out=${OUT:?set OUT to the directory for the logs}
mkdir -p "$out"
summary=$out/summary.txt
failed=0

[ -x "$bundle/run" ] || { echo "no bundle at $bundle (see the top of $0)" >&2; exit 100; }
[ -d "$data" ] || { echo "no data directory $data (see the top of $0)" >&2; exit 100; }

# check NAME SECONDS PROGRAM [ARGS...]: runs a bundled program, logs it, records the verdict.
check() {
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  if timeout --kill-after=10 "$limit" "$bundle/run" "$@" >"$out/$name.log" 2>&1; then
    status=PASS
  else
    status="FAIL (exit $?)"
    failed=$((failed + 1))
  fi
  printf '%-22s %-16s %5ds\n' "$name" "$status" $((SECONDS - start)) | tee -a "$summary"
}

# verdict NAME CONDITION-TEXT: records a check computed here (0 = pass).
verdict() {
  local name=$1 detail=$2 ok=$3
  if [ "$ok" = 0 ]; then
    printf '%-22s %-16s %s\n' "$name" PASS "$detail" | tee -a "$summary"
  else
    printf '%-22s %-16s %s\n' "$name" FAIL "$detail" | tee -a "$summary"
    failed=$((failed + 1))
  fi
}

# Test accuracy of the last epoch in a metrics file, or "none".
accuracy() {
  grep -o '"test_accuracy": *[0-9.eE+-]*' "$1" 2>/dev/null | tail -n 1 | sed 's/.*: *//' | grep . || echo none
}

# within_point A B: exit 0 when both are numbers less than 0.01 (1 point) apart.
within_point() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "none" || b == "none") exit 1; d = a - b; if (d < 0) d = -d; exit !(d < 0.01) }'
}

if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  gpus=$(awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES")
else
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
[ "$gpus" -ge 1 ] 2>/dev/null || gpus=1
all=$(seq -s, 0 $((gpus - 1)))

{
  echo "date:  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host:  $(uname -n), $(nproc) cores"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu:   /'
  echo "gpus used: $all"
} >"$summary"
cat "$summary"

check test_cuda_comm 180 test_cuda_comm --gtest_output="json:$out/test_cuda_comm.json"
check test_cuda_replica 300 test_cuda_replica --gtest_output="json:$out/test_cuda_replica.json"

# The same settings on one GPU and on one CPU rank: the template's batch, lr and momentum.
train=(--epochs 1 --batch-size 64 --lr 0.01 --momentum 0.9 --seed 1 --data "$data")
check train_1gpu 300 mnist_mt --gpus 0 "${train[@]}" --metrics "$out/train_1gpu.jsonl"
check train_1cpu 420 mnist_mt --cpu 1 "${train[@]}" --metrics "$out/train_1cpu.jsonl"
gpu_acc=$(accuracy "$out/train_1gpu.jsonl") cpu_acc=$(accuracy "$out/train_1cpu.jsonl")
within_point "$gpu_acc" "$cpu_acc"
verdict gpu_matches_cpu "test accuracy: 1 GPU $gpu_acc, 1 CPU rank $cpu_acc" $?

check ddp_all_gpus 300 mnist_mt --gpus "$all" --mode ddp "${train[@]}" --metrics "$out/ddp_all_gpus.jsonl"
check dp_all_gpus 300 mnist_mt --gpus "$all" --mode dp "${train[@]}" --metrics "$out/dp_all_gpus.jsonl"
ddp_acc=$(accuracy "$out/ddp_all_gpus.jsonl") dp_acc=$(accuracy "$out/dp_all_gpus.jsonl")
within_point "$ddp_acc" "$dp_acc"
verdict ddp_matches_dp "test accuracy on $gpus GPU(s): ddp $ddp_acc, dp $dp_acc" $?

# The last rank fails at step 20: the process must name it and exit 3, not hang.
start=$SECONDS
timeout --kill-after=10 120 "$bundle/run" mnist_mt --gpus "$all" "${train[@]}" --max-steps 100 \
  --inject-fault "$((gpus - 1)):20" >"$out/fault_all_gpus.log" 2>&1
code=$?
[ "$code" = 3 ] && grep -q "rank $((gpus - 1))" "$out/fault_all_gpus.log"
verdict fault_all_gpus "exit $code after $((SECONDS - start))s (want 3, naming rank $((gpus - 1)))" $?

check bench_step 420 bench_step --benchmark_filter='step/cuda/' \
  --benchmark_out="$out/bench_step.json" --benchmark_out_format=json

echo "failed checks: $failed" | tee -a "$summary"
exit "$failed"
