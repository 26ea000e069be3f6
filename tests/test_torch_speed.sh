#!/usr/bin/env bash
# The GPU suite's PyTorch timing, tried here on the CPU with Debian's PyTorch:
# tests/gpu/torch_speed.py times the eager step and reports every row it cannot run
# (CUDA graphs and TF32 on a CPU are skipped, torch.compile where torch lacks it is
# unsupported) instead of dropping it; tests/gpu/torch_speed_table.py sets hand-made
# bench_step and torch_speed figures side by side with the right ratios, and
# tests/gpu/op_table.py the per-operation profile.
# Usage: test_torch_speed.sh SOURCE_ROOT
set -euo pipefail
root=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 "$root/tests/gpu/torch_speed.py" --device cpu --steps 3 --warmup 1 --batches 4 --json "$work/x.json"
/usr/bin/python3 - "$work/x.json" <<'PY'
import json, sys
import torch
rows = json.load(open(sys.argv[1]))
by = {(r["mode"], r["tf32"]): r for r in rows}
assert len(rows) == 8 and len(by) == 8, f"want one row per mode and TF32 setting, got {len(rows)}"
eager = by[("eager", False)]
assert eager["status"] == "ok" and eager["us_per_step"] > 0 and eager["steps"] == 3, eager
for r in rows:
    if r is eager:
        continue
    assert r["us_per_step"] is None, r
    if r["mode"].startswith("compile") and not hasattr(torch, "compile"):
        assert r["status"].startswith("unsupported: ") and "torch.compile" in r["status"], r
    elif r["tf32"] or r["mode"] in ("graph", "compile-reduce-overhead"):
        assert r["status"].startswith("skipped: "), r
for key in ("matmul_allow_tf32", "cudnn_allow_tf32"):
    assert key in eager["defaults"], eager["defaults"]
print(f"torch_speed: eager {eager['us_per_step']} us/step; " + "; ".join(sorted({r["status"] for r in rows})))
PY

# No time left: every row is skipped and says so, and the run fails (nothing timed).
if /usr/bin/python3 "$root/tests/gpu/torch_speed.py" --device cpu --steps 3 --warmup 1 --batches 4 --modes eager \
    --tf32 off --budget-s 0 --json "$work/late.json" >/dev/null; then
  echo "torch_speed with no budget exited 0" >&2; exit 1
fi
grep -q '"status": "skipped: budget' "$work/late.json"

# The table: bench_step's rows as Google Benchmark writes them (only ddp on one device is
# mnist_mt's figure; a failed row gives no number), PyTorch's as torch_speed.py does.
cat >"$work/bench_step.json" <<'EOF'
{"context": {"host_name": "fixture"}, "benchmarks": [
 {"name": "step/cuda/ddp/devices:1/batch:4/iterations:1/manual_time", "run_name": "step/cuda/ddp/devices:1/batch:4/iterations:1/manual_time", "us/step": 200.0, "graph_nodes": 21, "replayed_us": 150.25, "planned_input": 1},
 {"name": "step/cuda/dp/devices:1/batch:4/iterations:1/manual_time", "run_name": "step/cuda/dp/devices:1/batch:4/iterations:1/manual_time", "us/step": 999.0},
 {"name": "step/cuda_eager/ddp/devices:1/batch:4/iterations:1/manual_time", "run_name": "step/cuda_eager/ddp/devices:1/batch:4/iterations:1/manual_time", "us/step": 250.0, "planned_input": 1},
 {"name": "step/cuda_tf32/ddp/devices:1/batch:4/iterations:1/manual_time", "run_name": "step/cuda_tf32/ddp/devices:1/batch:4/iterations:1/manual_time", "us/step": 175.0, "planned_input": 1},
 {"name": "step/cuda_copied/ddp/devices:1/batch:4/iterations:1/manual_time", "run_name": "step/cuda_copied/ddp/devices:1/batch:4/iterations:1/manual_time", "us/step": 230.0},
 {"name": "step/cuda/ddp/devices:2/batch:4/iterations:1/manual_time", "run_name": "step/cuda/ddp/devices:2/batch:4/iterations:1/manual_time", "us/step": 777.0},
 {"name": "step/cuda/ddp/devices:1/batch:64/iterations:1/manual_time", "run_name": "step/cuda/ddp/devices:1/batch:64/iterations:1/manual_time", "us/step": 500.0, "planned_input": 1},
 {"name": "step/cuda/ddp/devices:1/batch:256/iterations:1/manual_time", "run_name": "step/cuda/ddp/devices:1/batch:256/iterations:1/manual_time", "error_occurred": true, "error_message": "out of memory"}
]}
EOF
cat >"$work/torch_speed.json" <<'EOF'
[{"mode": "eager", "batch": 4, "tf32": false, "us_per_step": 300.0, "compile_s": null, "status": "ok", "torch_version": "2.0", "cuda_version": "12.1", "gpu": "Fixture GPU"},
 {"mode": "eager", "batch": 4, "tf32": true, "us_per_step": 280.0, "compile_s": null, "status": "ok"},
 {"mode": "graph", "batch": 4, "tf32": false, "us_per_step": 100.0, "compile_s": 0.5, "status": "ok"},
 {"mode": "compile", "batch": 64, "tf32": false, "us_per_step": null, "compile_s": null, "status": "failed: RuntimeError: no compiler"},
 {"mode": "compile-reduce-overhead", "batch": 64, "tf32": false, "us_per_step": null, "compile_s": null, "status": "skipped: budget"}]
EOF
/usr/bin/python3 "$root/tests/gpu/torch_speed_table.py" --bench-step "$work/bench_step.json" --torch "$work/torch_speed.json" \
  | tee "$work/table.txt"
expect() { grep -qxF -- "$1" "$work/table.txt" || { echo "missing line: $1" >&2; exit 1; }; }
expect '| 4 | fp32 | 200.0 | 250.0 | 300.0 | 1.50 | 100.0 | 0.50 | — | — | — | — |'
expect '| 4 | tf32 | 175.0 | — | 280.0 | 1.60 | — | — | — | — | — | — |'
expect '| 64 | fp32 | 500.0 | — | — | — | — | — | failed | — | skipped | — |'
expect '- mnist_mt cuda batch 256: out of memory'
expect '- torch compile batch 64 fp32: failed: RuntimeError: no compiler'
expect "- mnist_mt's replayed step: batch 4 21 graph nodes, 150.2 µs on the device"
expect "- mnist_mt: the trainer's whole step, its rows gathered on the GPU from the data set held there (planned_input); PyTorch: the input already on the GPU"
expect "- mnist_mt with each batch copied from the host (--no-device-data), replayed: batch 4 230.0 µs (held on the GPU: 200.0 µs)"
[ "$(grep -c '^| 256 ' "$work/table.txt")" = 0 ]  # no figure from either side: no line

# An input missing (bench_step failed on the GPU host): PyTorch's cells stay, the reason is said.
/usr/bin/python3 "$root/tests/gpu/torch_speed_table.py" --bench-step "$work/none.json" --torch "$work/torch_speed.json" \
  >"$work/table.txt"
expect '| 4 | fp32 | — | — | 300.0 | — | 100.0 | — | — | — | — | — |'
grep -q '^- no mnist_mt figures: .*none.json' "$work/table.txt"
! grep -q 'input copied\|rows gathered' "$work/table.txt"  # no mnist_mt row: nothing said of its input
# A row that copied its input (no planned_input): the note says so.
sed 's/, "planned_input": 1}/}/' "$work/bench_step.json" >"$work/copied.json"
/usr/bin/python3 "$root/tests/gpu/torch_speed_table.py" --bench-step "$work/copied.json" --torch "$work/torch_speed.json" \
  >"$work/table.txt"
grep -q '^- mnist_mt: .*its input copied from host memory' "$work/table.txt"
# The per-operation table (op_table.py) from bench_step's op/cuda/ rows, as Google
# Benchmark writes them (repetitions of a row, the least shown, aggregates left out; ns
# and µs units),
# with the replayed step's device time and nodes; a failed row is named.
cat >"$work/ops.json" <<'EOF'
{"context": {}, "benchmarks": [
 {"name": "op/cuda/conv1_forward/batch:4/iterations:1/repeats:3/manual_time", "run_name": "op/cuda/conv1_forward/batch:4/iterations:1/repeats:3/manual_time", "real_time": 3.5, "time_unit": "us"},
 {"name": "op/cuda/conv1_forward/batch:4/iterations:1/repeats:3/manual_time", "run_name": "op/cuda/conv1_forward/batch:4/iterations:1/repeats:3/manual_time", "real_time": 3000.0, "time_unit": "ns"},
 {"name": "op/cuda/conv1_forward/batch:4/iterations:1/repeats:3/manual_time_mean", "run_name": "op/cuda/conv1_forward/batch:4/iterations:1/repeats:3/manual_time", "aggregate_name": "mean", "real_time": 1.0, "time_unit": "us"},
 {"name": "op/cuda/conv1_forward/batch:64/iterations:1/repeats:3/manual_time", "run_name": "op/cuda/conv1_forward/batch:64/iterations:1/repeats:3/manual_time", "real_time": 9.25, "time_unit": "us"},
 {"name": "op/cuda/guard/batch:4/iterations:1/repeats:3/manual_time", "run_name": "op/cuda/guard/batch:4/iterations:1/repeats:3/manual_time", "real_time": 5.0, "time_unit": "us"},
 {"name": "op/cuda/guard/batch:64/iterations:1/repeats:3/manual_time", "run_name": "op/cuda/guard/batch:64/iterations:1/repeats:3/manual_time", "error_occurred": true, "error_message": "boom"},
 {"name": "step/cuda/ddp/devices:1/batch:4/iterations:1/manual_time", "run_name": "step/cuda/ddp/devices:1/batch:4/iterations:1/manual_time", "us/step": 90.0, "graph_nodes": 17, "replayed_us": 60.5}
]}
EOF
/usr/bin/python3 "$root/tests/gpu/op_table.py" --bench-step "$work/ops.json" | tee "$work/ops.txt"
expect_op() { grep -qxF -- "$1" "$work/ops.txt" || { echo "missing line: $1" >&2; exit 1; }; }
expect_op '| conv1_forward | 3.0 | 9.2 |'
expect_op '| guard | 5.0 | — |'
expect_op '| sum of the operations | 8.0 | 9.2 (1 missing) |'
expect_op '| the replayed step on the device (replayed_us) | 60.5 | — |'
expect_op "| its graph's nodes | 17 | — |"
expect_op '- guard batch 64: boom'
echo "test_torch_speed: pass"
