#!/usr/bin/env bash
# Sets up, builds and runs the tests. Two tiers:
#   scripts/test.sh           every test (CI's command): a release build (with the CUDA
#                             backend compiled and linked when the toolkit is present; its
#                             GPU tests skip without a GPU) running every test; an
#                             ASan+UBSan build (-Og), without the benchmarks, running once
#                             every CPU test in which compiled code runs; a ThreadSanitizer
#                             build of only the tests of the concurrent code (streams,
#                             communicators, local group, loader, trainer) running those;
#                             then the fuzz targets (scripts/fuzz.sh: the committed corpus
#                             replayed, then FUZZ_SECONDS, 20 here, of fuzzing, the targets
#                             side by side); each sanitizer build compiles, at the lowest
#                             CPU priority, while the build before it runs its tests;
#                             prints each part's time and the ten slowest tests.
#   scripts/test.sh --quick   the release build's 'quick' suite: every test but the slow
#                             reliability, MPI and repeated ones, for the inner loop.
# Ends with one line: "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
scripts/setup.sh || exit 1

passed=0 failed=0 skipped=0
# build DIR MESON_ARGS [TARGET...]: configures DIR and builds it (the targets alone when
# named); prints its time, or why it failed and returns 1.
build() {
  local dir=$1 setup_args=$2
  shift 2
  local start=$SECONDS
  echo "== $dir: meson setup $setup_args"
  if [ -f "$dir/build.ninja" ]; then
    # --reconfigure reads meson_options.txt anew, so an option added since is known.
    meson setup --reconfigure "$dir" $setup_args >/dev/null || { echo "== $dir: meson setup failed"; return 1; }
  else
    meson setup "$dir" $setup_args >/dev/null || { echo "== $dir: meson setup failed"; return 1; }
  fi
  ninja -C "$dir" "$@" || { echo "== $dir: build failed"; return 1; }
  echo "== $dir: configured and built in $((SECONDS - start)) s"
}

# behind DIR MESON_ARGS [TARGET...]: builds DIR in the background at the lowest CPU
# priority, its output in DIR.log, while the tests in front take what CPU they need: a
# test suite leaves a third of two cores idle (waits on children, sockets, timers), which
# the next build fills. await DIR prints that build's outcome and returns its status.
# Each build runs in a process group of its own (set -m), which the script kills, ninja
# and compilers with it, should it end before awaiting the build (a failure, Ctrl-C, a
# timeout's TERM).
declare -A behind_pid
behind() {
  local dir=$1
  set -m
  ( renice -n 19 -p "$BASHPID" >/dev/null; build "$@" ) >"$dir.log" 2>&1 &
  behind_pid[$dir]=$!
  set +m
}
stop_behind() {
  local pid
  for pid in "${behind_pid[@]}"; do kill -- "-$pid" 2>/dev/null; done
}
trap stop_behind EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
await() {
  local dir=$1
  if wait "${behind_pid[$dir]}"; then
    grep "^== $dir: configured and built" "$dir.log" || true
    return 0
  else
    tail -n 60 "$dir.log"
    failed=$((failed + 1))
    return 1
  fi
}

# tests DIR TEST_ARGS: runs DIR's tests and adds their outcomes to the counts.
tests() {
  local dir=$1 test_args=$2
  local start=$SECONDS
  rm -f "$dir/meson-logs/testlog.json"
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 $test_args
  echo "== $dir: tests ran in $((SECONDS - start)) s"
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

# The ten slowest tests of the builds run, from meson's logs.
slowest() {
  python3 - "$@" <<'PY'
import json, sys
rows = []
for path in sys.argv[1:]:
    try:
        for line in open(path):
            r = json.loads(line)
            rows.append((r["duration"], path.split("/")[0], r["name"], r["result"]))
    except FileNotFoundError:
        pass
print("== the ten slowest tests")
for duration, build, name, result in sorted(rows, reverse=True)[:10]:
    print(f"{duration:8.1f} s  {build:10s} {name} ({result})")
PY
}

# MPI is required here (setup.sh installs Open MPI), so that the multi-process tests run.
release="--buildtype=release -Dcuda=auto -Dmpi=enabled"
if [ "$quick" -eq 1 ]; then
  if build build "$release"; then tests build "--suite quick"; else failed=$((failed + 1)); fi
  slowest build/meson-logs/testlog.json
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
  exit
fi
# Sanitizer builds: line tables only (-g1: stacks with file and line, a third of -g's
# compile time), no CUDA, no benchmarks. ASan+UBSan at -Og, which compiles four times
# faster than -O2 under UBSan; the CPU kernels stay at -O2 there (src/cpu/meson.build),
# so that its training runs keep their pace. ThreadSanitizer at -O2.
sanitizer="--buildtype=custom -Ddebug=false -Dcpp_args=-g1 -Dcuda=disabled -Dmpi=enabled -Dbenchmarks=disabled -Db_lundef=false"
asan="$sanitizer -Doptimization=g -Db_sanitize=address,undefined"
tsan="$sanitizer -Doptimization=2 -Db_sanitize=thread"
# The tests whose code runs on several threads at once, in process.
concurrent=(test_stream test_communicator test_local_group test_local_group_x50_1 test_local_group_x50_2 test_loader
            test_trainer test_trainer_ranks)
# What those run: test_local_group_x50_* are test_local_group again, test_trainer_ranks a
# part of test_trainer.
binaries=(tests/test_stream tests/test_communicator tests/test_local_group tests/test_loader tests/test_trainer)

# The release build, then its tests (every test) with the ASan build behind them, then
# the ASan tests (every test in which compiled code runs, once: the 100-fold repeat runs
# in the others) with the ThreadSanitizer build behind them, then the ThreadSanitizer
# tests (the concurrent code's).
release_built=0
build build "$release" && release_built=1
behind build-asan "$asan"
if [ "$release_built" -eq 1 ]; then tests build ""; else failed=$((failed + 1)); fi
asan_built=0
await build-asan && asan_built=1
behind build-tsan "$tsan" "${binaries[@]}"
[ "$asan_built" -eq 1 ] && tests build-asan "--timeout-multiplier 4 --no-suite python --no-suite repeated"
await build-tsan && tests build-tsan "--timeout-multiplier 6 ${concurrent[*]}"

# Every libFuzzer target: its committed corpus replayed, then 20 s of fuzzing, all at
# once; counts as one.
echo "== fuzz"
start=$SECONDS
if FUZZ_SECONDS=${FUZZ_SECONDS:-20} scripts/fuzz.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
echo "== fuzz: built and ran in $((SECONDS - start)) s"

slowest build/meson-logs/testlog.json build-asan/meson-logs/testlog.json build-tsan/meson-logs/testlog.json
echo "== all of it in $SECONDS s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
