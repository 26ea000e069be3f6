#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) and runs
# each for FUZZ_SECONDS (default 60) from the committed seed corpus in fuzz/corpus.
# A finding is left in build-fuzz/artifacts/ and fails the script; make it a regression
# case in the normal tests. Usage: scripts/fuzz.sh [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
out=build-fuzz
mkdir -p "$out/artifacts"
cxx=(clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
     -Iinclude -Isrc -Ifuzz)

build() {  # build NAME SOURCES... [FLAGS...]
  local name=$1
  shift
  "${cxx[@]}" "$@" -o "$out/$name" -lz
}
build idx_raw fuzz/fuzz_idx.cpp src/data/idx.cpp src/data/gunzip.cpp
build idx_gzip fuzz/fuzz_idx.cpp src/data/idx.cpp src/data/gunzip.cpp -DFUZZ_GZIP
build checkpoint fuzz/fuzz_checkpoint.cpp src/model/checkpoint.cpp src/base/file_io.cpp

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(idx_raw idx_gzip checkpoint)
status=0
for t in "${targets[@]}"; do
  # The committed seeds stay as they are; what the fuzzer adds goes to the build tree.
  mkdir -p "$out/corpus-$t"
  echo "== fuzz $t: ${seconds} s"
  if ! "$out/$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/artifacts/$t-" "$out/corpus-$t" "fuzz/corpus/$t" >"$out/$t.log" 2>&1; then
    tail -n 40 "$out/$t.log"
    echo "== fuzz $t: FINDING (see $out/artifacts/)"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$out/$t.log" | tr '\n' ' '
    echo
  fi
done
exit $status
