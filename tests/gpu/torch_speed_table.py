#!/usr/bin/env python3
"""mnist_mt's and PyTorch's µs per training step on one GPU, side by side, as a Markdown table.

Reads bench_step's Google Benchmark JSON (the rows step/cuda/ddp/devices:1/batch:B, the
step replayed as a CUDA graph, step/cuda_eager/..., enqueued call by call, and
step/cuda_tf32/..., replayed with --tf32, and step/cuda_copied/..., replayed with
--no-device-data, which a note sets beside the held data's; counter us/step) and
torch_speed.py's JSON list.
One line per batch and precision: fp32 is TF32 off, tf32 on (mnist_mt's eager cell stays
empty there: bench_step has no eager TF32 row). ratio = PyTorch / mnist_mt (graph, as
mnist_mt runs by default): above 1, mnist_mt is faster. A note gives the nodes of
mnist_mt's replayed step (bench_step's graph_nodes counter) and its device time
(replayed_us) at each batch. A PyTorch row that did not run
shows the first word of its status. A missing or unreadable input leaves its cells empty
and says why.

  torch_speed_table.py --bench-step bench_step.json --torch torch_speed.json
"""
import argparse
import json
import re
import sys

TORCH_MODES = ("eager", "graph", "compile", "compile-reduce-overhead")
MNIST_ROW = re.compile(r"^step/(cuda|cuda_eager|cuda_tf32|cuda_copied)/ddp/devices:1/batch:(\d+)(/|$)")
EMPTY = "—"


def load(path, what, notes):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        notes.append(f"no {what} figures: {path}: {e}")
        return None


def mnist_rows(report, notes):
    """{(label, batch): us per step} from bench_step's rows that ran,
    [(batch, graph nodes, device us per step)] of its replayed rows that report them, and
    whether every row that ran took its input from the data set held on the GPU (None:
    no row ran)."""
    out, graphs, planned = {}, [], []
    for b in (report or {}).get("benchmarks", []):
        m = MNIST_ROW.match(b.get("run_name", b.get("name", "")))
        if not m:
            continue
        if b.get("error_occurred"):
            notes.append(f"mnist_mt {m.group(1)} batch {m.group(2)}: {b.get('error_message', 'error')}")
        elif isinstance(b.get("us/step"), (int, float)):
            out[(m.group(1), int(m.group(2)))] = float(b["us/step"])
            if m.group(1) != "cuda_copied":  # --no-device-data: copied on purpose
                planned.append(b.get("planned_input") == 1)
            if m.group(1) == "cuda" and isinstance(b.get("graph_nodes"), (int, float)):
                graphs.append((int(m.group(2)), int(b["graph_nodes"]), b.get("replayed_us")))
    return out, sorted(graphs), (all(planned) if planned else None)


def cell(value):
    return EMPTY if value is None else f"{value:,.1f}"


def ratio(num, den):
    return f"{num / den:.2f}" if num is not None and den else EMPTY


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-step", required=True)
    ap.add_argument("--torch", required=True)
    args = ap.parse_args()

    notes = []
    mnist, graphs, planned = mnist_rows(load(args.bench_step, "mnist_mt", notes), notes)
    torch_rows = load(args.torch, "PyTorch", notes) or []
    by_key = {(r["mode"], r["batch"], bool(r["tf32"])): r for r in torch_rows}
    batches = sorted({b for _, b in mnist} | {r["batch"] for r in torch_rows})
    first = torch_rows[0] if torch_rows else {}
    print(f"µs per training step on {first.get('gpu') or 'the GPU'}: mnist_mt (bench_step) and "
          f"PyTorch {first.get('torch_version', '?')} (CUDA {first.get('cuda_version', '?')}); "
          f"ratio = PyTorch / mnist_mt graph, above 1: mnist_mt faster")
    modes = [m for m in TORCH_MODES if any(r["mode"] == m for r in torch_rows)]
    print("| batch | precision | mnist_mt graph | mnist_mt eager | " +
          " | ".join(f"torch {m} | ratio" for m in modes) + " |")
    print("|---:|---|---:|---:|" + "---:|---:|" * len(modes))
    compile_times = []
    for batch in batches:
        for tf32 in (False, True):
            ours = mnist.get(("cuda_tf32" if tf32 else "cuda", batch))
            ours_eager = None if tf32 else mnist.get(("cuda_eager", batch))
            if ours is None and ours_eager is None and not any((m, batch, tf32) in by_key for m in modes):
                continue
            cells = [str(batch), "tf32" if tf32 else "fp32", cell(ours), cell(ours_eager)]
            for mode in modes:
                r = by_key.get((mode, batch, tf32))
                us = r.get("us_per_step") if r and r.get("status") == "ok" else None
                shown = cell(us) if us is not None else (r["status"].split(":")[0] if r else EMPTY)
                cells += [shown, ratio(us, ours)]
                if r and r.get("compile_s") is not None and mode != "eager":
                    compile_times.append(f"{mode} {batch}/{cells[1]} {r['compile_s']:.1f} s")
            print("| " + " | ".join(cells) + " |")
    if planned is True:
        notes.append("mnist_mt: the trainer's whole step, its rows gathered on the GPU from the data set held there "
                     "(planned_input); PyTorch: the input already on the GPU")
    elif planned is False:
        notes.append("mnist_mt: the trainer's whole step, its input copied from host memory (no planned_input on "
                     "every row); PyTorch: the input already on the GPU")
    if graphs:
        notes.append("mnist_mt's replayed step: " + ", ".join(
            f"batch {b} {n} graph nodes" + (f", {us:,.1f} µs on the device" if isinstance(us, (int, float)) else "")
            for b, n, us in graphs))
    copied = [(b, us) for (label, b), us in sorted(mnist.items()) if label == "cuda_copied"]
    if copied:
        notes.append("mnist_mt with each batch copied from the host (--no-device-data), replayed: " + ", ".join(
            f"batch {b} {cell(us)} µs" + (f" (held on the GPU: {cell(mnist[('cuda', b)])} µs)"
                                           if ("cuda", b) in mnist else "") for b, us in copied))
    if not any(label == "cuda_tf32" for label, _ in mnist):
        notes.append("no mnist_mt TF32 row: the tf32 lines' mnist_mt cells and ratios are empty")
    if compile_times:
        notes.append("compile or capture, apart from the timing: " + ", ".join(compile_times))
    for r in torch_rows:
        if r.get("status", "").startswith("failed"):
            notes.append(f"torch {r['mode']} batch {r['batch']} {'tf32' if r['tf32'] else 'fp32'}: {r['status']}")
    for n in notes:
        print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
