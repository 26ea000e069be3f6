#!/usr/bin/env bash
# Sets up, builds and runs every test three times: a release build (with the CUDA
# backend compiled and linked when the toolkit is present; its GPU tests skip without a
# GPU), an ASan+UBSan build (all CPU tests) and a ThreadSanitizer build (the
# multi-threaded tests: data, train), then the fuzz targets (scripts/fuzz.sh). Ends
# with one line: "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

passed=0 failed=0 skipped=0
# suite DIR MESON_ARGS TEST_ARGS
suite() {
  local dir=$1 setup_args=$2 test_args=$3
  echo "== $dir: meson setup $setup_args"
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" $setup_args >/dev/null || { failed=$((failed + 1)); return; }
  else
    meson setup "$dir" $setup_args >/dev/null || { failed=$((failed + 1)); return; }
  fi
  ninja -C "$dir" || { echo "== $dir: build failed"; failed=$((failed + 1)); return; }
  rm -f "$dir/meson-logs/testlog.json"
  meson test -C "$dir" --print-errorlogs --num-processes 2 $test_args
  local counts
  counts=$(python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
try:
    for line in open(sys.argv[1]):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"): p += 1
        elif r == "SKIP": s += 1
        else: f += 1
except FileNotFoundError:
    f += 1
print(p, f, s)
PY
)
  read -r p f s <<<"$counts"
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

# MPI is required here (setup.sh installs Open MPI), so that the multi-process tests run.
suite build "--buildtype=release -Dcuda=auto -Dmpi=enabled" ""
suite build-asan "--buildtype=debugoptimized -Dcuda=disabled -Dmpi=enabled -Db_sanitize=address,undefined -Db_lundef=false" \
  "--timeout-multiplier 4"
suite build-tsan "--buildtype=debugoptimized -Dcuda=disabled -Dmpi=enabled -Db_sanitize=thread -Db_lundef=false" \
  "--timeout-multiplier 6 --suite data --suite train"

# Every libFuzzer target for FUZZ_SECONDS (60) from the committed seeds: counts as one.
echo "== fuzz"
if scripts/fuzz.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
