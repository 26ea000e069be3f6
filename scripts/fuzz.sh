#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) and runs
# them side by side for FUZZ_SECONDS (default 60) from the committed seed corpus in
# fuzz/corpus, which each replays first.
# A finding is left in build-fuzz/artifacts/ and fails the script; make it a regression
# case in the normal tests. Usage: scripts/fuzz.sh [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
out=build-fuzz
mkdir -p "$out/artifacts"
cxx=(clang++ -std=c++20 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
     -Iinclude -Isrc -Ifuzz)

build() {  # build NAME SOURCES... [FLAGS...]
  local name=$1
  shift
  "${cxx[@]}" "$@" -o "$out/$name" -lz
}
# The three at once (each compile is one process), then every target at once: a core
# each where there are enough, the wall time FUZZ_SECONDS in any case.
pids=()
build idx_raw fuzz/fuzz_idx.cpp src/data/idx.cpp src/data/gunzip.cpp & pids+=($!)
build idx_gzip fuzz/fuzz_idx.cpp src/data/idx.cpp src/data/gunzip.cpp -DFUZZ_GZIP & pids+=($!)
build checkpoint fuzz/fuzz_checkpoint.cpp src/model/checkpoint.cpp src/base/file_io.cpp & pids+=($!)
built=0
for pid in "${pids[@]}"; do wait "$pid" || built=1; done
[ "$built" -eq 0 ] || { echo "== fuzz: a target failed to build"; exit 1; }

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(idx_raw idx_gzip checkpoint)
declare -A running
for t in "${targets[@]}"; do
  # The committed seeds stay as they are; what the fuzzer adds goes to the build tree.
  mkdir -p "$out/corpus-$t"
  echo "== fuzz $t: ${seconds} s"
  "$out/$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$t-" "$out/corpus-$t" "fuzz/corpus/$t" >"$out/$t.log" 2>&1 &
  running[$t]=$!
done
status=0
for t in "${targets[@]}"; do
  if ! wait "${running[$t]}"; then
    tail -n 40 "$out/$t.log"
    echo "== fuzz $t: FINDING (see $out/artifacts/)"
    status=1
  else
    echo "== fuzz $t: $(grep -E "stat::number_of_executed_units|stat::new_units_added" "$out/$t.log" | tr '\n' ' ')"
  fi
done
exit $status
