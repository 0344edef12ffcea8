#!/bin/bash
# fsdp.symm_mem on a lent GPU, in one short call (a few minutes): the
# symmetric window allocated with ncclMemAlloc and registered with
# ncclCommWindowRegister (runtime/gpu.c) on real NCCL, every rank's
# reduced gradients exact, eager and --graph; then torch's own
# set_symm_mem_for_comm() on NCCL for one rank, its allocations held to the
# plan's window (tests/live/symm_sizes.py --nccl).
#   OUT=build/gpu-symm bash bench/gpu_symm.sh        (about 3 minutes)
# Every result is one line of $OUT/summary.txt; logs beside it.
#
# What one GPU can and cannot show: the plans' ranks run as processes on the
# one device under tests/gpu_ranks.sh, each its own NCCL "host" (NCCL_HOSTID),
# so NCCL talks over sockets; its symmetric kernels need every member's
# window mapped on one node (NVLink / CUMEM P2P), and across hosts it may
# refuse the registration or run the collective its usual way. Either is
# recorded (NCCL_DEBUG=INFO's lines on windows are kept); the offsets'
# agreement itself is the generator's proof (gen/symm.lua) and the
# emulator's check (tests/emu_check.sh), which need no GPU.
set -u
OUT=${OUT:-build/gpu-symm}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
. bench/nccl_home.sh
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
say "nccl: $(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH)' "${NCCL_HOME:-/usr/local/cuda}/include/nccl.h" 2>/dev/null | awk '{printf "%s.", $3}')"
PLANS=${PLANS:-symm_fsdp4 symm_hsdp2x2 symm_ep2 symm_hsdp_tp}
t0=$(date +%s)
# shellcheck disable=SC2086 # (a list of plan names)
printf '%s\n' $PLANS | xargs -P 4 -I{} make -s PLAN=tests/plans/{}.lua OUT=build/gen/{} >"$OUT/build.log" 2>&1
say "build: rc $? in $(( $(date +%s) - t0 )) s"
for p in $PLANS; do
  n=$(lua5.4 -e "print(dofile('tests/plans/$p.lua').world_size)")
  for mode in eager graph; do
    flags="--check --steps 3"
    [ "$mode" = graph ] && flags="$flags --graph"
    [ "$mode" = graph ] && [ "$p" = symm_ep2 ] && continue # all-to-alls: --graph refused by design
    log=$OUT/$p.$mode.log
    # shellcheck disable=SC2086 # (the flags, split)
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG,ALLOC timeout -k 5 120 tests/gpu_ranks.sh "$n" "build/$p/$p" $flags \
      >"$log" 2>&1
    rc=$?
    win=$(grep -ciE 'window|symmetric' "$log")
    say "$p $mode: rc $rc, $(grep -c -- '--check passed' "$log") of $n ranks exact, $win NCCL lines on windows$(
      [ $rc = 0 ] || echo "; first error: $(grep -m1 -iE 'error|failed' "$log" | cut -c1-200)")"
  done
done
# torch's own: FSDP2's set_symm_mem_for_comm() on NCCL, one rank (one GPU), its
# SymmMemAllGather / SymmMemReduceScatter allocations against the plan's window
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  lua5.4 gen/commplan.lua tests/plans/symm_fsdp4.lua "$OUT/plan_fsdp4" >/dev/null 2>&1
  timeout -k 5 180 python3 tests/live/symm_sizes.py --nccl "$OUT/plan_fsdp4" >"$OUT/torch_nccl.log" 2>&1
  say "torch set_symm_mem_for_comm on NCCL (1 rank): rc $? -- $(head -n 2 "$OUT/torch_nccl.log" | tr '\n' ' ' | cut -c1-300)"
else
  say "torch: no CUDA torch here; skipped"
fi
say "done in $(( $(date +%s) - t0 )) s"
