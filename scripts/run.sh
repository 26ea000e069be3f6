#!/usr/bin/env bash
# Sets up, builds and runs the main job: training on the default data (Fashion-MNIST).
# Arguments go to mnist_mt, e.g. scripts/run.sh --cpu 2 --epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --run  # what building and running needs; the tests' packages: scripts/setup.sh
# Quiet when all goes well; a failed setup or build shows its whole output.
quietly() {
  local log
  log=$(mktemp)
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "mnist_mt: '$*' failed" >&2
    exit 1
  fi
  rm -f "$log"
}
[ -f build/build.ninja ] || quietly meson setup build --buildtype=release
quietly ninja -C build mnist_mt
exec build/mnist_mt "$@"
