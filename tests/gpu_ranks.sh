#!/bin/sh
# gpu_ranks.sh N BINARY ARGS...: all N ranks of a plan as processes on one
# GPU, e.g.  tests/gpu_ranks.sh 4 build/fsdp4/fsdp4 --check --steps 2
#
# NCCL refuses two ranks of a communicator on one GPU ("Duplicate GPU") only
# when it believes they share a host: each rank gets its own NCCL_HOSTID, so
# NCCL treats every rank as a node of its own and talks over its socket
# transport on loopback. Every NCCL call, communicator split, event and CUDA
# graph of the plan really runs; timings say nothing about NVLink or IB.
# Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK=0,
# MASTER_ADDR, MASTER_PORT). Prints each rank's last line; exits 1 if any
# rank failed (logs kept, path printed), 2 on bad usage.
#
# NCCL_PAT_ENABLE=0 (unless set): with one GPU per "node" NCCL may pick its
# PAT algorithm for a SUM reduce-scatter, whose summation order is not the
# ring's that --check models (runtime/dtype.c); a node of several GPUs, the
# setting this emulates, uses the ring. ncclAvg is never PAT.
# NCCL_ALGO=Ring (unless set): with several one-GPU "nodes" NCCL may also
# pick its tree for a small all-reduce, whose order is not a ring's either
# (dtype.c): hsdp4x2_fp16's 4-replica fp16 SUM all-reduce could then differ
# from what the checker expects in the last bit.
set -u
usage() { echo "usage: $0 N BINARY [ARGS...]  (N ranks of BINARY on GPU 0)" >&2; exit 2; }
[ $# -ge 2 ] || usage
n=$1; shift
case $n in '' | *[!0-9]*) usage ;; esac
[ "$n" -ge 1 ] || usage
# A port of this run's own: rank 0 listens on it, and a previous run's
# socket may linger in TIME_WAIT. Free now and below the kernel's ephemeral
# range (tests/free_port.py), never 20000 + $$ % 20000: that range can hold
# the ephemeral ports NCCL's rank 0 and every outgoing connection bind.
port=${MASTER_PORT:-$(python3 "$(dirname "$0")/free_port.py")}
[ -n "$port" ] || { echo "gpu_ranks.sh: no free port; set MASTER_PORT" >&2; exit 2; }
limit=${GPU_RANKS_TIMEOUT:-600}
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu_ranks.XXXXXX") || exit 2
pids=""
r=0
while [ "$r" -lt "$n" ]; do
  # A rank whose peers died must not wait for them the default 300 s.
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  NCCL_HOSTID=commplan-rank$r NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
  NCCL_PAT_ENABLE=${NCCL_PAT_ENABLE:-0} NCCL_ALGO=${NCCL_ALGO:-Ring} COMMPLAN_INIT_TIMEOUT=${COMMPLAN_INIT_TIMEOUT:-120} \
    timeout -k 10 "$limit" "$@" >"$dir/rank$r.log" 2>&1 &
  pids="$pids $!"
  r=$((r + 1))
done
failed=""
r=0
for p in $pids; do
  wait "$p"
  rc=$?
  [ "$rc" -eq 0 ] || failed="$failed $r(exit $rc)"
  r=$((r + 1))
done
r=0
while [ "$r" -lt "$n" ]; do
  echo "rank $r: $(tail -n 1 "$dir/rank$r.log")"
  r=$((r + 1))
done
if [ -n "$failed" ]; then
  echo "failed ranks:$failed; logs in $dir"
  exit 1
fi
rm -rf "$dir"
