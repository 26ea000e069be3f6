#!/usr/bin/env python3
"""The GPU suite's time-to-99% line: mnist_mt's --metrics lines and recipe.py's result, side
by side. Prints one line; exits 0 when both runs reached the target, 1 otherwise.

    time_to_99.py --ours tta.jsonl --theirs tta_torch.json
"""
import argparse
import json
import sys


def ours(path):
    """(seconds to the target or None, its step or the steps run, evaluation seconds or the final accuracy)."""
    lines = [json.loads(line) for line in open(path) if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no epoch")
    for epoch in lines:
        if epoch.get("time_to_target_s") is not None:
            return epoch["time_to_target_s"], epoch["target_step"], f"evaluations {epoch['target_eval_seconds']:.3f} s"
    return None, sum(e["steps"] for e in lines), f"final test accuracy {lines[-1]['test_accuracy']:.4f}"


def theirs(path):
    r = json.load(open(path))
    if r["time_to_target_s"] is not None:
        return r["time_to_target_s"], r["target_step"], f"evaluations {r['eval_seconds']:.3f} s", r
    return None, r["steps"], f"final test accuracy {r['final_accuracy']:.4f}", r


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", required=True)
    p.add_argument("--theirs", required=True)
    args = p.parse_args()
    parts, reached = [], []
    try:
        s, step, note = ours(args.ours)
        parts.append(f"mnist_mt {'not reached' if s is None else f'{s:.3f} s'} (step {step}, {note})")
        reached.append(s)
    except (OSError, ValueError, KeyError) as e:
        parts.append(f"mnist_mt: no result ({e})")
        reached.append(None)
    try:
        s, step, note, r = theirs(args.theirs)
        parts.append(f"PyTorch {r['torch_version']} {'not reached' if s is None else f'{s:.3f} s'} "
                     f"(step {step}, {note})")
        reached.append(s)
    except (OSError, ValueError, KeyError) as e:
        parts.append(f"PyTorch: no result ({e})")
        reached.append(None)
    line = "; ".join(parts)
    if all(s is not None for s in reached):
        line += f"; PyTorch's time / mnist_mt's {reached[1] / reached[0]:.2f}x"
    print(line)
    return 0 if all(s is not None for s in reached) else 1


if __name__ == "__main__":
    sys.exit(main())
