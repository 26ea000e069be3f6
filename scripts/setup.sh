#!/usr/bin/env bash
# Installs what mnist_mt needs to build and test, from Debian's packages.
# As root: installs whatever is missing. Otherwise: prints the apt-get line and stops.
# Usage: scripts/setup.sh [extra Debian packages...]
set -euo pipefail

packages=(g++ meson ninja-build pkg-config cmake python3 libopenmpi-dev openmpi-bin
          libtbb-dev libdnnl-dev libgtest-dev libbenchmark-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev libcurl4-openssl-dev libssl-dev libpng-dev
          python3-matplotlib dataset-fashion-mnist clang
          python3-torch libopenblas0-pthread "$@")  # PyTorch (CPU) judges the CPU backend: tests/test_torch_steps.sh

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
