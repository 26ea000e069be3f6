#!/usr/bin/env bash
# Sets up, builds and runs the main job: training on the default data (Fashion-MNIST).
# Arguments go to mnist_mt, e.g. scripts/run.sh --cpu 2 --epochs 1
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build mnist_mt >/dev/null
exec build/mnist_mt "$@"
