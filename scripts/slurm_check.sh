#!/usr/bin/env bash
# Runs mnist_mt under srun on a one-node Slurm cluster that it sets up here and takes down
# again, and checks what the README says of srun:
#   1. `srun -n 2 mnist_mt --cpu 1` trains the very bytes of `mnist_mt --cpu 2`;
#   2. an injected fault in one task ends the step with exit 3 and one line naming rank and host;
#   3. a stopped task (SIGSTOP) ends every task within --timeout and a few seconds, naming it;
#   4. a killed task (SIGKILL) ends the others within a few seconds.
# Needs root (it starts munged, slurmctld and slurmd) and installs Debian's Slurm when it is
# missing. Not part of scripts/test.sh: it starts daemons. Prints "N passed, N failed".
#
#   scripts/slurm_check.sh [--binary build/mnist_mt] [--data DIR]
set -uo pipefail
cd "$(dirname "$0")/.."

binary=build/mnist_mt
data=/usr/share/datasets/fashion-mnist
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    *) echo "slurm_check.sh: unknown argument '$1' (--binary FILE, --data DIR)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "slurm_check.sh: needs root, to start munged, slurmctld and slurmd" >&2; exit 2; }
[ -x "$binary" ] || { echo "slurm_check.sh: --binary $binary: not an executable (build it first)" >&2; exit 2; }
[ -d "$data" ] || { echo "slurm_check.sh: --data $data: no such directory" >&2; exit 2; }
binary=$(realpath "$binary")

if ! command -v slurmd >/dev/null || ! command -v srun >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null ||
    { echo "slurm_check.sh: cannot install Slurm" >&2; exit 2; }
fi

work=$(mktemp -d /tmp/mnist_mt_slurm.XXXXXX)
host=$(hostname -s)
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=mnistmt
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$work/ctld
SlurmdSpoolDir=$work/slurmd
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=pmix
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
mkdir -p "$work/ctld" "$work/slurmd"

munge_pid=""
stop_all() {
  local pids=()
  for pid_file in "$work/slurmd.pid" "$work/slurmctld.pid"; do
    [ -f "$pid_file" ] && pids+=("$(cat "$pid_file")")
  done
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 100); do  # until they are gone (they still write into $work)
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$munge_pid" ] && kill "$munge_pid" 2>/dev/null
  rm -rf "$work"
}
trap stop_all EXIT

if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
  munged --force --pid-file="$work/munged.pid" 2>/dev/null || { echo "slurm_check.sh: munged did not start" >&2; exit 2; }
  munge_pid=$(cat "$work/munged.pid" 2>/dev/null)
fi
slurmctld || { echo "slurm_check.sh: slurmctld did not start ($work/slurmctld.log)" >&2; exit 2; }
slurmd || { echo "slurm_check.sh: slurmd did not start ($work/slurmd.log)" >&2; exit 2; }
for _ in $(seq 100); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %t 2>/dev/null | grep -q idle || { echo "slurm_check.sh: the node never came up" >&2; exit 2; }
echo "== Slurm $(sinfo -V | cut -d' ' -f2), one node ($host, $(nproc) CPUs), srun --mpi=pmix"

passed=0 failed=0
check() {  # check NAME CONDITION-STATUS DETAIL
  if [ "$2" -eq 0 ]; then
    echo "PASS $1: $3"; passed=$((passed + 1))
  else
    echo "FAIL $1: $3"; failed=$((failed + 1))
  fi
}
train=(--batch-size 32 --epochs 1 --max-steps 20 --data "$data")

# 1. The same world in one process and in two tasks.
timeout 300 srun -n 2 "$binary" --cpu 1 "${train[@]}" --save "$work/tasks.safetensors" >"$work/1.out" 2>"$work/1.err"
rc=$?
timeout 300 "$binary" --cpu 2 "${train[@]}" --save "$work/threads.safetensors" >/dev/null 2>&1
cmp -s "$work/tasks.safetensors" "$work/threads.safetensors"
check "2 tasks x 1 rank = 1 process x 2 ranks" $((rc + $?)) "srun exit $rc; checkpoints $(cmp -s "$work/tasks.safetensors" "$work/threads.safetensors" && echo identical || echo differ)"

seconds_since() { echo "$(date +%s.%N) - $1" | bc; }

# 2. A fault in task 1 at step 25.
begin=$(date +%s.%N)
timeout 120 srun -n 2 "$binary" --cpu 1 --batch-size 32 --epochs 1 --max-steps 200 --data "$data" --timeout 5 \
  --inject-fault 1:25 >/dev/null 2>"$work/2.err"
rc=$?
took=$(seconds_since "$begin")
line=$(grep -m1 "^mnist_mt: error:" "$work/2.err")
[ $rc -eq 3 ] && [ "$line" = "mnist_mt: error: rank 1 (host $host) failed at step 25: injected fault" ]
check "fault in one task" $? "exit $rc after ${took%.*} s: $line"

# 3 and 4. Task 1 stopped, then killed, while both train (batch 4: many short steps).
signal_task() {  # signal_task SIGNAL ERRFILE: prints the exit status and the seconds until every task was gone
  timeout 120 srun -n 2 "$binary" --cpu 1 --batch-size 4 --epochs 1 --max-steps 3000 --data "$data" --timeout 5 \
    >/dev/null 2>"$2" &
  local srun_pid=$! victim=""
  for _ in $(seq 200); do
    for p in $(pgrep -f "^$binary "); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=1" && victim=$p
    done
    [ -n "$victim" ] && break
    sleep 0.05
  done
  if [ -z "$victim" ]; then  # never started: nothing to signal
    kill "$srun_pid" 2>/dev/null
    wait "$srun_pid"
    echo "-1 none"
    return
  fi
  sleep 2  # training
  local begin; begin=$(date +%s.%N)
  kill "-$1" "$victim"
  wait "$srun_pid"
  local rc=$?
  for _ in $(seq 200); do  # 10 s at most
    pgrep -f "^$binary " >/dev/null || break
    sleep 0.05
  done
  echo "$rc $(seconds_since "$begin")"
  kill -CONT "$victim" 2>/dev/null
  pkill -KILL -f "^$binary " 2>/dev/null  # whatever is left, after the time was taken
}
read -r rc took < <(signal_task STOP "$work/3.err")
line=$(grep -m1 "^mnist_mt: error:" "$work/3.err")
[ "$took" != none ] && [ "$rc" -ne 0 ] && [ "$(echo "$took < 5 + 3" | bc)" -eq 1 ] &&
  [[ $line == "mnist_mt: error: process 1 (host $host, rank 1) sent nothing for "*" s (timeout 5 s): it failed or stopped"* ]]
check "SIGSTOP of task 1 (--timeout 5)" $? "srun exit $rc, every task gone ${took:0:4} s after the signal: $line"

read -r rc took < <(signal_task KILL "$work/4.err")
line=$(grep -m1 "task 1" "$work/4.err")
[ "$took" != none ] && [ "$rc" -eq 137 ] && [ "$(echo "$took < 5" | bc)" -eq 1 ] &&
  [[ $line == "srun: error: $host: task 1: Killed" ]]
check "SIGKILL of task 1" $? "srun exit $rc, every task gone ${took:0:4} s after the signal: $line"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
