#!/bin/sh
# Faults on a GPU machine (make test-gpu): each must exit 2 with a one-line
# message naming the rank, the failing call or limit, and a hint; never hang.
#   tests/gpu_faults.sh   (after make PLAN=single.lua, PLAN=fsdp4.lua and
#                          PLAN=tests/plans/too_big.lua OUT=build/gen/too_big)
fail=0
# expect NAME TEXT CMD...: rc 2 and TEXT in the output, within 120 s.
expect() {
  name=$1 text=$2; shift 2
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [ "$rc" = 2 ] && printf '%s' "$out" | grep -qF -- "$text"; then echo "  ok    $name"
  else echo "  FAIL  $name (rc $rc): $out"; fail=1; fi
}
ngpu=$(nvidia-smi -L | wc -l)
expect "LOCAL_RANK beyond the visible GPUs" "only $ngpu GPU(s) are visible" \
  env RANK=0 WORLD_SIZE=1 LOCAL_RANK="$ngpu" MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 build/single/single
expect "out of GPU memory (a 120 GB parameter)" "needs more memory than this GPU has" \
  build/too_big/too_big --iters 1 --warmup 0
expect "a missing peer times out instead of hanging" "did not finish within 5 s" \
  env COMMPLAN_INIT_TIMEOUT=5 RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29532 \
  build/fsdp4/fsdp4 --iters 1
exit $fail
