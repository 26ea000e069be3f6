#!/usr/bin/env python3
"""Fails when a file under src/ includes a header of a layer it may not use: the arrows
of docs/architecture.md ("Layers") point one way. A private header ("cpu/plan.hpp")
belongs to its folder; a public one ("mnist_mt/loader.hpp") to the folder named in OWNER
below, and a public header missing there fails too, so that the table stays whole. Also
fails for a source file of src/ or include/ longer than MAX_LINES, and where a header is
in the wrong place: a folder's header that another folder of src/ includes belongs in
include/mnist_mt, and a public header that only its own layer includes (tests, fuzz
targets and benchmarks aside, which may include any header) belongs beside its sources.
The same arrows hold for the libraries each folder's meson.build names (LAYER_DEP: the
layers' `*_dep`s and the mpi, curl, crypto and png variables), and libcurl, OpenSSL and
libpng may be linked only by fetch and image, so that the backends and everything below
them link none of them."""
import pathlib
import re
import sys

# Each folder and the folders whose headers it may include (besides its own).
MAY_USE = {
    "base": set(),
    "mpi": {"base"},
    "model": {"base", "mpi"},
    "data": {"base", "model"},
    "image": {"base", "model"},
    "fetch": {"base", "model", "data"},
    "cpu": {"base", "model", "mpi"},
    "cuda": {"base", "model", "mpi"},
    "comm": {"base", "model"},
    "train": {"base", "model", "data", "mpi", "cpu", "cuda", "comm"},
    "infer": {"base", "data", "model", "image", "train"},
    "cli": {"base", "data", "fetch", "image", "mpi", "model", "train", "infer"},
}
# The layer each public header belongs to.
OWNER = {
    "error.hpp": "base", "file_io.hpp": "base", "philox.hpp": "base", "host_device.hpp": "base",
    "version.hpp": "base",
    "dataset.hpp": "data", "sampler.hpp": "data", "loader.hpp": "data", "gunzip.hpp": "data",
    "data_source.hpp": "fetch", "download.hpp": "fetch", "catalog.hpp": "fetch",
    "image.hpp": "image",
    "processes.hpp": "mpi", "local_devices.hpp": "mpi",
    "local_group.hpp": "comm",
    "model.hpp": "model", "batch.hpp": "model", "checkpoint.hpp": "model", "optimizer.hpp": "model",
    "schedule.hpp": "model", "replica.hpp": "model", "device.hpp": "model", "communicator.hpp": "model",
    "backend.hpp": "model",
    "trainer.hpp": "train", "faults.hpp": "train", "evaluate_shard.hpp": "train",
    "numbered_checkpoints.hpp": "train", "test_pass.hpp": "train",
    "evaluate.hpp": "infer", "predict.hpp": "infer",
}
# The Meson variables a folder's meson.build may name only where the layer they belong to
# may be used: each layer's declared dependency, and the external libraries that only one
# layer links (Meson variables are global, so a later folder could name them).
LAYER_DEP = {"base_dep": "base", "mpi": "mpi", "processes_dep": "mpi", "model_dep": "model", "data_dep": "data",
             "image_dep": "image", "fetch_dep": "fetch", "cpu_dep": "cpu", "cuda_dep": "cuda", "comm_dep": "comm",
             "train_dep": "train", "infer_dep": "infer", "curl": "fetch", "crypto": "fetch", "png": "image"}
EXTERNAL = {"curl", "crypto", "png"}  # linked by their layer only, not by the layers above it
DEPENDENCY_OWNER = {"libcurl": "fetch", "libcrypto": "fetch", "libpng": "image"}
MAX_LINES = 400
INCLUDE = re.compile(r'^\s*#\s*include\s+"(?:([a-z_]+)/)?([a-z_0-9]+\.(?:hpp|cuh))"')
QUOTED = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
wrong = []
public = sorted(p.name for p in (root / "include" / "mnist_mt").glob("*.hpp"))
wrong += [f"include/mnist_mt/{name}: no layer in tests/check_layers.py's OWNER" for name in public if name not in OWNER]
wrong += [f"tests/check_layers.py: OWNER names {name}, which include/mnist_mt lacks" for name in OWNER if name not in public]


def layer_of(folder, header):
    if folder == "mnist_mt":
        return OWNER.get(header)
    return folder


files = [p for p in sorted((root / "src").rglob("*")) if p.suffix in {".cpp", ".hpp", ".cu", ".cuh"}]
files += [p for p in sorted((root / "include" / "mnist_mt").glob("*.hpp"))]
used_elsewhere = set()  # public headers that a file of another layer includes
public_includes = {}    # public header -> the public headers it includes
for path in files:
    rel = path.relative_to(root)
    if (lines := len(path.read_text().splitlines())) > MAX_LINES:
        wrong.append(f"{rel}: {lines} lines, more than {MAX_LINES}: split it where it has a seam")
    folder = OWNER.get(path.name) if rel.parts[0] == "include" else rel.parts[1]
    if folder not in MAY_USE:
        wrong.append(f"{rel}: folder {folder} has no entry in tests/check_layers.py's MAY_USE")
        continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
        quoted = QUOTED.match(line)
        if quoted and not INCLUDE.match(line):
            wrong.append(f"{rel}:{number}: an include this check cannot place ({quoted.group(1)}): "
                         f'write "folder/name.hpp", "mnist_mt/name.hpp" or a header of this folder')
        m = INCLUDE.match(line)
        if not m or m.group(1) is None:
            continue
        if m.group(1) == "mnist_mt" and rel.parts[0] == "include":
            public_includes.setdefault(path.name, set()).add(m.group(2))
        if m.group(1) == "mnist_mt" and OWNER.get(m.group(2)) != folder:
            used_elsewhere.add(m.group(2))
        if m.group(1) != "mnist_mt" and m.group(1) != folder and m.group(1) in MAY_USE:
            wrong.append(f"{rel}:{number}: includes {m.group(1)}'s private header {m.group(2)}: "
                         f"a header that another folder uses belongs in include/mnist_mt")
        to = layer_of(m.group(1), m.group(2))
        if to is None or to == folder or to not in MAY_USE:
            continue
        if to not in MAY_USE[folder]:
            wrong.append(f"{rel}:{number}: {folder} includes a header of {to} ({line.strip()})")
# A public header that a used public header includes is part of that one's interface.
grown = True
while grown:
    reached = {g for h in used_elsewhere for g in public_includes.get(h, ())} - used_elsewhere
    used_elsewhere |= reached
    grown = bool(reached)
for build in sorted((root / "src").glob("*/meson.build")):
    folder, text = build.parent.name, build.read_text()
    code = re.sub(r"'[^']*'", "''", "\n".join(line.split("#")[0] for line in text.splitlines()))
    for name in sorted(set(re.findall(r"\b([a-z_]+)\b", code)) & LAYER_DEP.keys()):
        to = LAYER_DEP[name]
        if to != folder and (name in EXTERNAL or to not in MAY_USE.get(folder, set())):
            wrong.append(f"src/{folder}/meson.build: names {name}, of layer {to}, which {folder} may not link")
    for library in re.findall(r"dependency\('([^']+)'", text):
        if DEPENDENCY_OWNER.get(library, folder) != folder:
            wrong.append(f"src/{folder}/meson.build: links {library}, which only src/{DEPENDENCY_OWNER[library]} may link")
wrong += [f"include/mnist_mt/{name}: only {OWNER[name]} includes it: a private header, beside its sources in src/{OWNER[name]}"
          for name in public if name in OWNER and name not in used_elsewhere]
print("\n".join(wrong) if wrong else
      f"layers: every include in src/ and include/ points to a layer it may use; headers other layers use are "
      f"public, those only their own uses are private; no file over {MAX_LINES} lines")
sys.exit(1 if wrong else 0)
