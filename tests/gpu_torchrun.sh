#!/bin/sh
# torchrun launches a 4-rank plan on the one lent GPU (issue 7, item 2): every
# rank a process with its own NCCL_HOSTID, NCCL over sockets on lo (see
# ../shared/gpu/README.md). Two runs, one per channel that torchrun can use
# for NCCL's unique id:
#   1. torchrun's own store (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT),
#      the default: before runtime/rendezvous.c, rank 0 died with
#      "bind failed: Address already in use" on MASTER_PORT;
#   2. COMMPLAN_ID_FILE in a scratch directory, job id TORCHELASTIC_RUN_ID.
# Exits non-zero if any rank fails; prints "SKIP torchrun: ..." and exits 0
# where torchrun or a GPU is missing.
#   tests/gpu_torchrun.sh   (from the repository root; builds build/fsdp4/fsdp4 if needed)
set -u
cd "$(dirname "$0")/.." || exit 1

if command -v torchrun >/dev/null 2>&1; then torchrun=torchrun
elif python3 -c 'import torch.distributed.run' >/dev/null 2>&1; then torchrun="python3 -m torch.distributed.run"
else echo "SKIP torchrun: no torchrun and no python3 -m torch.distributed.run (install PyTorch)"; exit 0; fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP torchrun: no NVIDIA GPU on this machine"; exit 0
fi
if [ ! -x build/fsdp4/fsdp4 ]; then
  make --no-print-directory -s PLAN=fsdp4.lua >/dev/null || { echo "FAIL torchrun: make PLAN=fsdp4.lua failed"; exit 1; }
fi

ranks=4
fail=0
dir=$(mktemp -d) || exit 1
# run NAME ENV...: torchrun --standalone with ENV added; every rank must pass --check.
run() {
  name=$1; shift
  log="$dir/$name.log"
  # Each rank sets its own NCCL_HOSTID so NCCL lets all ranks share GPU 0;
  # $torchrun may be two words, and $RANK is for the rank's own shell.
  # shellcheck disable=SC2086,SC2016
  env COMMPLAN_INIT_TIMEOUT=120 "$@" timeout 300 $torchrun --standalone --nproc-per-node "$ranks" --no-python \
    sh -c 'LOCAL_RANK=0 NCCL_HOSTID=h$RANK NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 exec "$0" "$@"' \
    build/fsdp4/fsdp4 --check --steps 2 >"$log" 2>&1
  rc=$?
  passed=$(grep -c 'rank [0-9]*: --check passed' "$log")
  if [ "$rc" = 0 ] && [ "$passed" = "$ranks" ]; then
    echo "  ok    torchrun --no-python, $ranks ranks on one GPU, NCCL id via $name"
  else
    echo "  FAIL  torchrun --no-python, $ranks ranks on one GPU, NCCL id via $name (exit $rc, $passed of $ranks ranks passed; log $log):"
    grep -E 'commplan|Error|error|failed' "$log" | tail -n 12 | sed 's/^/        | /'
    fail=1
  fi
}
run "torchrun's store"
run "COMMPLAN_ID_FILE" COMMPLAN_ID_FILE="$dir/nccl.id"
[ "$fail" = 0 ] && rm -rf "$dir"
exit $fail
