#!/usr/bin/env bash
# Installs what mnist_mt needs to build and test, from Debian's packages.
# As root: installs whatever is missing. Otherwise: prints the apt-get line and stops.
# Usage: scripts/setup.sh [--run] [extra Debian packages...]
#   --run: only what building and running mnist_mt needs (scripts/run.sh), not the
#          tests' and benchmarks' packages (Google Test and Benchmark, PyTorch, clang, ...)
set -euo pipefail

run_only=false
if [ "${1:-}" = "--run" ]; then
  run_only=true
  shift
fi
packages=(g++ meson ninja-build pkg-config cmake libtbb-dev libdnnl-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev libcurl4-openssl-dev libssl-dev libpng-dev
          dataset-fashion-mnist)
if ! $run_only; then
  packages+=(python3 libopenmpi-dev openmpi-bin libgtest-dev libbenchmark-dev
             python3-matplotlib clang
             python3-torch libopenblas0-pthread)  # PyTorch (CPU) judges the CPU backend: tests/test_torch_steps.sh
fi
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "mnist_mt: missing packages; install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "mnist_mt: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
