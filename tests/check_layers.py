#!/usr/bin/env python3
"""Fails when a file under src/ includes a header of a higher layer, or when the two
backends include each other's headers: the arrows of STYLE.md point one way,
cli -> train -> comm -> backends (cpu, cuda) -> model -> data; mpi stands apart."""
import pathlib
import re
import sys

LAYER = {"data": 0, "mpi": 0, "model": 1, "cpu": 2, "cuda": 2, "comm": 3, "train": 4, "cli": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "src"
wrong = []
for path in sorted(root.rglob("*")):
    if path.suffix not in {".cpp", ".hpp", ".cu", ".cuh"}:
        continue
    folder = path.relative_to(root).parts[0]
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = INCLUDE.match(line)
        if not m or m.group(1) not in LAYER or m.group(1) == folder:
            continue
        to = m.group(1)
        if LAYER[to] >= LAYER[folder]:
            wrong.append(f"{path.relative_to(root.parent)}:{number}: {folder} includes {to}/ ({line.strip()})")
print("\n".join(wrong) if wrong else f"layers: every include of {root} points down")
sys.exit(1 if wrong else 0)
