#!/usr/bin/env python3
"""mnist_mt's per-operation profile on one GPU, as a Markdown table.

Reads bench_step's Google Benchmark JSON: the rows op/cuda/<operation>/batch:B (each
operation of a replica's training step timed on its own, real_time in µs per call) and,
for comparison, the replayed step's device time (step/cuda/ddp/devices:1/batch:B, counter
replayed_us) and its graph nodes. One line per operation in the step's order, one column
per batch; a last line sums the operations. A missing or unreadable input, or a row that
failed, is named in a note.

  op_table.py --bench-step bench_step.json
"""
import argparse
import json
import re
import sys

OP_ROW = re.compile(r"^op/cuda/([a-z0-9_]+)/batch:(\d+)(/|$)")
STEP_ROW = re.compile(r"^step/cuda/ddp/devices:1/batch:(\d+)(/|$)")
EMPTY = "—"


def micros(b):
    """A row's time per call in µs, from real_time in its time_unit."""
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(b.get("time_unit", "us"))
    t = b.get("real_time")
    return None if scale is None or not isinstance(t, (int, float)) else t * scale


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-step", required=True)
    args = ap.parse_args()
    notes = []
    try:
        with open(args.bench_step) as f:
            rows = json.load(f).get("benchmarks", [])
    except (OSError, ValueError) as e:
        print(f"- no per-operation figures: {args.bench_step}: {e}")
        return 0
    ops, order, batches, steps = {}, [], set(), {}
    for b in rows:
        name = b.get("run_name", b.get("name", ""))
        if b.get("aggregate_name"):
            continue
        m = OP_ROW.match(name)
        if m:
            op, batch = m.group(1), int(m.group(2))
            if op not in order:
                order.append(op)
            batches.add(batch)
            if b.get("error_occurred"):
                note = f"{op} batch {batch}: {b.get('error_message', 'error')}"
                if note not in notes:  # once, not once a repetition
                    notes.append(note)
            elif micros(b) is not None:
                ops.setdefault((op, batch), []).append(micros(b))
            continue
        m = STEP_ROW.match(name)
        if m and not b.get("error_occurred"):
            steps[int(m.group(1))] = (b.get("replayed_us"), b.get("graph_nodes"))
    if not order:
        print(f"- no op/cuda/ rows in {args.bench_step}")
        return 0
    cols = sorted(batches)
    # The least of a row's repetitions: the operation's cost without the machine's noise.
    best = {k: min(v) for k, v in ops.items()}
    print("µs per call of each operation of mnist_mt's training step on the GPU (bench_step op/cuda/, "
          "the least of its repetitions)")
    print("| operation | " + " | ".join(f"batch {b}" for b in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for op in order:
        cells = [f"{best[(op, b)]:,.1f}" if (op, b) in best else EMPTY for b in cols]
        print(f"| {op} | " + " | ".join(cells) + " |")
    def total(b):
        have = [best[(op, b)] for op in order if (op, b) in best]
        missing = len(order) - len(have)
        return f"{sum(have):,.1f}" + (f" ({missing} missing)" if missing else "")
    print("| sum of the operations | " + " | ".join(total(b) for b in cols) + " |")
    replayed = [steps.get(b, (None, None)) for b in cols]
    print("| the replayed step on the device (replayed_us) | " +
          " | ".join(f"{r:,.1f}" if isinstance(r, (int, float)) else EMPTY for r, _ in replayed) + " |")
    print("| its graph's nodes | " +
          " | ".join(str(int(n)) if isinstance(n, (int, float)) else EMPTY for _, n in replayed) + " |")
    for n in notes:
        print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
