#!/bin/sh
# tests/emu_check.sh PLAN...: the GPU path (runtime/gpu.c, gpu_run.c, the
# launch and rendezvous code, the copy kernels) on the emulated CUDA
# runtime and NCCL (tests/emu/, docs/emulator.md), as users run it: every
# rank a process with torchrun's variables (and, where torchrun is
# installed, under torchrun itself).
#
#   1. every PLAN, all ranks, --check eager and --check --graph, seeds
#      $EMU_SEEDS (default 1 2 3): exact, and the emulator's summary of
#      every rank must say 0 races, 0 rule violations, 0 mismatches;
#   2. seeded faults the emulator must catch (COMMPLAN_EMU_FAULT):
#      drop one wait, reuse an event before its wait, swap two ops on one
#      communicator, shift a kernel's output by one element, allocate inside
#      a capture. A dropped or reused wait the emulator finds vacuous (its
#      work was already ordered, e.g. by --check's host synchronisation)
#      changes nothing and is not counted as seeded;
#   3. torchrun launches (its store, then COMMPLAN_ID_FILE), if installed.
#
# Expert-parallel plans (ep > 1) run --check eager only: --graph is refused
# by design (their all-to-alls' split sizes are read back to the host every
# step), and step 1 checks that every rank refuses it with its one line.
# EMU_ASAN_PLANS, EMU_FAULT_PLANS, EMU_LIB_PLANS: set and empty runs none.
#
# Binaries: build/emu/<plan>/<plan> (make emu-build). Prints "ok"/"FAIL"
# lines and a closing "emu: ..." line; exits 1 if anything failed.
set -u
cd "$(dirname "$0")/.." || exit 2
LUA=${LUA:-lua5.4}
SEEDS=${EMU_SEEDS:-1 2 3}
# COMMPLAN_TEST_TIER=quick (make test): --graph's refusal (expert-parallel
# or CPU-offload plans) checked on the first plan of each kind only (one
# refusal in the runtime, the same line for every such plan), the seeded
# faults at two offsets each that fire on every fault plan (drop_wait's 3
# and 50 are vacuous on some), the split calls on four of the library
# plans; every plan's --check runs as in the full matrix. Run by hand
# (make test-emu) or make test-full: all of them.
quick=0
[ "${COMMPLAN_TEST_TIER:-full}" = quick ] && quick=1
seen_ep=0 seen_offload=0
FAULT_PLANS=${EMU_FAULT_PLANS-fsdp4 hsdp2x2 llama_tiny_tp}
dir=$(mktemp -d "${TMPDIR:-/tmp}/emu_check.XXXXXX") || exit 2
pass=0
fail=0
runs=0
ops=0
ok() { pass=$((pass + 1)); echo "  ok    $1"; }
bad() { fail=$((fail + 1)); echo "  FAIL  $1"; [ -n "${2:-}" ] && sed 's/^/        | /' "$2" | grep -v 'summary\|mismatch: ' | head -n 8; }

plan_file() {
  if [ -f "plans/$1.lua" ]; then echo "plans/$1.lua"
  elif [ -f "tests/plans/$1.lua" ]; then echo "tests/plans/$1.lua"
  elif [ -f "tests/ep/plans/$1.lua" ]; then echo "tests/ep/plans/$1.lua"
  else echo "tests/pp/plans/$1.lua"; fi
}
world() { $LUA -e "print(dofile('$(plan_file "$1")').world_size)"; }
# Expert parallel (ep > 1): the plan has all-to-alls, which --graph refuses
# by design (their split sizes are read back to the host every step).
expert_parallel() { [ "$($LUA -e "print((dofile('$(plan_file "$1")').parallel or {}).ep or 1)")" -gt 1 ]; }
# CPU offload (fsdp.cpu_offload or a unit's): --graph is refused as FSDP2
# refuses it (a later reduction's D2H is waited for by the host, which adds).
offloads() {
  [ "$($LUA -e "local p = dofile('$(plan_file "$1")'); local o = (p.fsdp or {}).cpu_offload
    for _, u in ipairs((p.model or {}).units or {}) do o = o or u.cpu_offload end; print(o and 1 or 0)")" = 1 ]
}

# launch N LOG BIN ARGS...: N rank processes with torchrun's variables; the
# logs are LOG.<rank>; returns the number of ranks that failed.
launch() {
  n=$1 log=$2; shift 2
  port=$(python3 tests/free_port.py) || return "$n"
  r=0 pids=""
  while [ "$r" -lt "$n" ]; do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      COMMPLAN_INIT_TIMEOUT=${COMMPLAN_INIT_TIMEOUT:-60} timeout -k 5 120 "$@" >"$log.$r" 2>&1 &
    pids="$pids $!"
    r=$((r + 1))
  done
  failed=0 r=0
  for pid in $pids; do
    wait "$pid"
    rc=$?
    echo "$rc" >"$log.$r.rc"
    [ "$rc" = 0 ] || failed=$((failed + 1))
    r=$((r + 1))
  done
  return "$failed"
}

# A rank that crashed (a signal) or hung (timeout's 124) is never a catch:
# a failing rank must end with an error of its own.
crashed() {
  n=$1 log=$2 r=0
  while [ "$r" -lt "$n" ]; do
    rc=$(cat "$log.$r.rc")
    [ "$rc" -lt 124 ] || { echo "rank $r exit $rc"; return 0; }
    r=$((r + 1))
  done
  return 1
}

# The emulator's own verdict on every rank: its summary line, no findings.
clean_summaries() {
  n=$1 log=$2 r=0
  while [ "$r" -lt "$n" ]; do
    line=$(grep 'commplan-emu: rank [0-9]*: summary:' "$log.$r") || return 1
    case $line in *" 0 races, 0 rule violations, 0 NCCL mismatches or deadlocks, 0 illegal accesses"*) ;; *) return 1 ;; esac
    o=$(echo "$line" | sed -n 's/.*summary: seed [0-9]*, \([0-9]*\) stream ops.*/\1/p')
    ops=$((ops + ${o:-0}))
    r=$((r + 1))
  done
}

echo "== the emulator's own semantics (tests/emu/emu_selftest.c)"
if build/emu/emu_selftest >"$dir/selftest" 2>&1; then
  ok "emulator self-test: $(sed -n 's/^emu selftest: //p' "$dir/selftest"): races, legacy-stream order, capture rules, graph edges"
else bad "emulator self-test" "$dir/selftest"; fi

echo "== the GPU path on the emulator: every plan, all ranks, --check eager and --graph, seeds $SEEDS"
for p in "$@"; do
  bin=build/emu/$p/$p
  [ -x "$bin" ] || { bad "$p: $bin is not built (make emu-build)"; continue; }
  n=$(world "$p")
  plan_ok=1
  modes="eager graph"
  if [ "$quick" = 1 ] && expert_parallel "$p" && [ "$seen_ep" = 1 ]; then
    modes=eager # (quick tier: --graph's refusal checked on the first expert-parallel plan)
  elif [ "$quick" = 1 ] && offloads "$p" && [ "$seen_offload" = 1 ]; then
    modes=eager # (quick tier: --graph's refusal checked on the first CPU-offload plan)
  elif expert_parallel "$p"; then
    # --graph must be refused on every rank with its one line, no hang.
    modes=eager
    seen_ep=1
    log=$dir/$p.graph
    runs=$((runs + 1))
    launch "$n" "$log" "$bin" --check --steps 2 --graph
    failed_ranks=$?
    refused=$(cat "$log".*[0-9] | grep -c -- "--graph: plan $p has expert-parallel all-to-alls")
    if [ "$failed_ranks" = "$n" ] && [ "$refused" = "$n" ] && ! crashed "$n" "$log" >/dev/null; then
      ok "$p --graph: not run, refused on all $n ranks with its one line as designed (expert all-to-alls' run-time split sizes)"
    else
      plan_ok=0
      bad "$p ($n ranks) --graph: not refused on every rank ($refused of $n said so)" "$log.0"
    fi
  elif offloads "$p"; then
    modes=eager
    seen_offload=1
    log=$dir/$p.graph
    runs=$((runs + 1))
    launch "$n" "$log" "$bin" --check --steps 2 --graph
    failed_ranks=$?
    refused=$(cat "$log".*[0-9] | grep -c -- "offloads unit .* to the CPU (cpu_offload): a CUDA graph cannot capture")
    if [ "$failed_ranks" = "$n" ] && [ "$refused" = "$n" ] && ! crashed "$n" "$log" >/dev/null; then
      ok "$p --graph: not run, refused on all $n ranks with its one line as FSDP2 refuses it (CPU offload's host copies)"
    else
      plan_ok=0
      bad "$p ($n ranks) --graph: not refused on every rank ($refused of $n said so)" "$log.0"
    fi
  fi
  for mode in $modes; do
    flags="--check --steps 2"
    [ "$mode" = graph ] && flags="$flags --graph"
    for seed in $SEEDS; do
      log=$dir/$p.$mode.$seed
      runs=$((runs + 1))
      # shellcheck disable=SC2086
      if ! { COMMPLAN_EMU_SEED=$seed launch "$n" "$log" "$bin" $flags && clean_summaries "$n" "$log"; }; then
        plan_ok=0
        bad "$p ($n ranks) --check $mode seed $seed" "$log.0"
      fi
    done
  done
  [ "$plan_ok" = 1 ] && ok "$p: $n ranks, --check $(echo "$modes" | sed 's/ / and --/'), seeds $(echo "$SEEDS" | tr ' ' ','): exact, 0 races"
done

echo "== NCCL's arithmetic on the emulator against a recording of FSDP2 on NCCL (tests/oracle/nccl)"
if [ -x build/emu/fsdp3/fsdp3 ]; then
  log=$dir/oracle
  rm -rf "$dir/oracle.dump"
  if launch 3 "$log" build/emu/fsdp3/fsdp3 --check --pattern oracle --dump "$dir/oracle.dump" &&
     $LUA tests/oracle_check.lua tests/oracle/nccl "$dir/oracle.dump" fsdp3 >"$log.cmp" 2>&1; then
    ok "fsdp3: emulated --check --pattern oracle --dump, 3 ranks, equals FSDP2-on-NCCL's recording byte for byte"
  else bad "fsdp3 emulated --dump vs tests/oracle/nccl" "$log.cmp"; fi
fi

# No sanitizer report on any rank's log.
sanitizer_clean() {
  n=$1 log=$2 r=0
  while [ "$r" -lt "$n" ]; do
    ! grep -q 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:' "$log.$r" || return 1
    r=$((r + 1))
  done
}

# Expert parallelism's all-to-alls through the GPU path (ncclSend / ncclRecv
# groups, the counts read back to the host): hand-written tables
# (tests/emu/a2a_plan.c), plain and under ASan+UBSan: --check exact for
# every seed; one row past capacity refused on every rank (the line from
# the rank that routed it, no hang, no crash); --graph refused.
echo "== expert all-to-alls on the emulator (tests/emu/a2a_plan.c: ep 4, bf16, two micro-steps, backward)"
for bin in build/emu/a2a_ep4/a2a_ep4 build/emu-asan/a2a_ep4/a2a_ep4; do
  [ -x "$bin" ] || { bad "$bin is not built (make emu-build)"; continue; }
  a2a_ok=1
  for seed in $SEEDS; do
    log=$dir/a2a.$seed.$(echo "$bin" | tr / _)
    runs=$((runs + 1))
    if ! { COMMPLAN_EMU_SEED=$seed launch 4 "$log" "$bin" --check --steps 3 && clean_summaries 4 "$log" &&
           sanitizer_clean 4 "$log" && [ "$(cat "$log".*[0-9] | grep -c "counts and rows exact")" = 4 ]; }; then
      a2a_ok=0
      bad "$bin --check seed $seed" "$log.0"
    fi
  done
  [ "$a2a_ok" = 1 ] && ok "$bin: 4 ranks, --check, seeds $(echo "$SEEDS" | tr ' ' ','): every count and row exact, 0 races"
  log=$dir/a2a.over.$(echo "$bin" | tr / _)
  COMMPLAN_A2A_OVERFLOW=1 launch 4 "$log" "$bin" --check --steps 2
  if [ "$?" = 4 ] && ! crashed 4 "$log" >/dev/null && sanitizer_clean 4 "$log" &&
     grep -q "rank 1: op 0 (a2a_counts of unit moe, micro-step 0): 7 tokens for ep member 1 (rank 1, experts 2..3) exceed its capacity of 6 rows" "$log.1" &&
     grep -q "ep member 1 (rank 1) refused its expert counts" "$log.0"; then
    ok "$bin: one row past capacity refused on all 4 ranks (its line from rank 1), no hang"
  else bad "$bin: a count past capacity not refused as it should be" "$log.1"; fi
  log=$dir/a2a.graph.$(echo "$bin" | tr / _)
  launch 4 "$log" "$bin" --check --graph
  if [ "$?" = 4 ] && grep -q -- "--graph: plan a2a_ep4 has expert-parallel all-to-alls" "$log.0"; then
    ok "$bin: --graph refused with one line (run-time split sizes)"
  else bad "$bin: --graph not refused" "$log.0"; fi
done

ASAN_PLANS=${EMU_ASAN_PLANS-fsdp4 llama_tiny_tp hsdp3x2_arlast ep2_mixtral_hsdp hsdp2x2_offload}
echo "== the GPU path under ASan+UBSan on the emulator (build/emu-asan)"
for p in $ASAN_PLANS; do
  bin=build/emu-asan/$p/$p
  [ -x "$bin" ] || { bad "$p: $bin is not built (make emu-build)"; continue; }
  n=$(world "$p")
  plan_ok=1
  asan_modes="eager graph" asan_said="eager and --graph"
  expert_parallel "$p" && asan_modes=eager asan_said="eager (--graph is refused with all-to-alls)"
  offloads "$p" && asan_modes=eager asan_said="eager (--graph is refused with CPU offload)"
  for m in $asan_modes; do
    mode=""
    [ "$m" = graph ] && mode=--graph
    log=$dir/asan.$p${mode#--}
    # shellcheck disable=SC2086
    if ! { launch "$n" "$log" "$bin" --check --steps 2 $mode && clean_summaries "$n" "$log" && sanitizer_clean "$n" "$log"; }; then
      plan_ok=0
      bad "$p under ASan+UBSan --check ${mode:-eager}" "$log.0"
    fi
  done
  [ "$plan_ok" = 1 ] && ok "$p under ASan+UBSan: $n ranks, --check $asan_said: exact, no sanitizer report, no leak"
done
# A failed step's teardown (communicators aborted, queued host functions
# drained before their state is freed) under ASan: a failing rank, no report.
if [ -x build/emu-asan/fsdp4/fsdp4 ]; then
  log=$dir/asan.fault
  if ! COMMPLAN_EMU_FAULT=alloc_in_capture:6 COMMPLAN_EMU_DEADLOCK_S=2 launch 4 "$log" build/emu-asan/fsdp4/fsdp4 \
       --check --steps 2 --graph --timeout 10 && ! crashed 4 "$log" >/dev/null && sanitizer_clean 4 "$log"; then
    ok "fsdp4 under ASan+UBSan: a capture broken on rank 0, every rank fails with its own error, no sanitizer report"
  else bad "fsdp4 under ASan+UBSan: a failed step's teardown" "$log.0"; fi
fi

# (the Makefile's one list, which emu-build builds: make print-emu-lib-plans)
LIB_PLANS=${EMU_LIB_PLANS-$(${MAKE:-make} -s print-emu-lib-plans)}
echo "== the GPU library (cp_gpu_unshard, _reshard, _reduce_grads) driven in the plan's order around the caller's compute"
for p in $LIB_PLANS; do
  bin=build/emu/$p/library_run
  [ -x "$bin" ] || { bad "$p: $bin is not built (make emu-build)"; continue; }
  n=$(world "$p")
  log=$dir/library.$p
  if launch "$n" "$log" "$bin" 2 && clean_summaries "$n" "$log"; then
    ok "$p: library calls around the caller's forward and backward kernels, $n ranks, 2 steps: 0 races"
  else bad "$p: library mode on the emulator" "$log.0"; fi
done

# The split calls (cp_gpu_unshard_issue / _wait, cp_gpu_reduce_issue /
# _wait) as the bridge makes them (tests/emu/library_run.c split): no fork
# from or join into the caller's stream, only the plan's waits order the
# prefetched all-gathers and the reduce-scatters left in flight against
# the caller's compute; the race detector must find nothing. A wrong order
# (the next unit's all-gather issued before this unit's copy-out) is
# refused on every rank with the one line.
echo "== the split calls (issue / wait) in the plan's order around the caller's compute"
split_plans=$LIB_PLANS
[ "$quick" = 1 ] && [ -z "${EMU_LIB_PLANS+set}" ] && split_plans="fsdp4 hsdp2x2 llama_tiny_tp hsdp2x2_offload"
for p in $split_plans; do
  bin=build/emu/$p/library_run
  [ -x "$bin" ] || continue
  n=$(world "$p")
  log=$dir/split.$p
  if launch "$n" "$log" "$bin" 2 split && clean_summaries "$n" "$log"; then
    ok "$p: split calls (prefetched all-gathers, reductions in flight) around the caller's kernels, $n ranks, 2 steps: 0 races"
  else bad "$p: split calls on the emulator" "$log.0"; fi
done
if [ -x build/emu-asan/fsdp4/library_run ]; then
  log=$dir/split_asan.fsdp4
  if launch 4 "$log" build/emu-asan/fsdp4/library_run 2 split && clean_summaries 4 "$log" && sanitizer_clean 4 "$log"; then
    ok "fsdp4 under ASan+UBSan: split calls, 4 ranks, 2 steps: 0 races, no sanitizer report"
  else bad "fsdp4 under ASan+UBSan: split calls" "$log.0"; fi
fi
if [ -x build/emu/fsdp4/library_run ]; then
  log=$dir/split_early.fsdp4
  if ! launch 4 "$log" build/emu/fsdp4/library_run 2 split-early && ! crashed 4 "$log" >/dev/null &&
     grep -q "cp_gpu_unshard_issue(.*) would write its all-gather buffer over the all-gather buffer of unit .*, gathered by its unshard's issue and not yet copied out" "$log.0" &&
     grep -q "not yet copied out" "$log.3"; then
    ok "fsdp4: a prefetch issued before the previous unit's copy-out is refused on every rank with one line"
  else bad "fsdp4: split calls out of order" "$log.0"; fi
fi

# A pipeline plan's library calls are refused on every rank with the one
# line (its sends and receives are the binary's), never a hang.
if [ -x build/emu/pp_tiny/library_run ]; then
  log=$dir/library.pp_tiny
  if ! launch 4 "$log" build/emu/pp_tiny/library_run 2 && grep -q "is a pipeline plan (pp 2): the library calls" "$log.0" &&
     grep -q "is a pipeline plan (pp 2): the library calls" "$log.3"; then
    ok "pp_tiny: the library calls on a pipeline plan are refused on every rank with one line"
  else bad "pp_tiny: library calls on a pipeline plan" "$log.0"; fi
fi

# Expert parallelism through the library (tests/lib/ep_library.c): unshard,
# reshard, reduce and cp_gpu_exchange_tokens in the plan's order with the
# caller's rows written and read back, every row and count checked, on
# every EP test plan (one under ASan+UBSan), 0 races.
for p in ${EMU_EP_LIB_PLANS-ep2_mixtral ep4_mixtral_efsdp1 ep2_dsv3_shard1 ep2_mixtral_hsdp ep2_mixtral_ac ep4_dsv3_tp2}; do
  for tree in emu emu-asan; do
    bin=build/$tree/$p/ep_library
    [ "$tree" = emu-asan ] && [ ! -x "$bin" ] && continue
    [ -x "$bin" ] || { bad "$p: $bin is not built (make emu-build)"; continue; }
    n=$(world "$p")
    log=$dir/eplib.$tree.$p
    # (an activation-checkpointing plan must have run its recompute's exchanges)
    recompute="(0 recomputed"
    case $p in *_ac) recompute="([1-9][0-9]* recomputed" ;; esac
    if launch "$n" "$log" "$bin" 2 && clean_summaries "$n" "$log" && grep -q "every row and count exact" "$log.$((n - 1))" &&
       grep -q "$recompute counts exchanges)" "$log.$((n - 1))" &&
       { [ "$tree" = emu ] || sanitizer_clean "$n" "$log"; }; then
      ok "$p${tree#emu}: the library's token exchanges around the caller's rows, $n ranks, 2 steps: every row and count exact, 0 races"
    else bad "$p${tree#emu}: the library's token exchanges" "$log.0"; fi
  done
done

# docs/example.c as users copy it (the GPU session of 2026-11-26 found it
# reducing before resharding, which the library refuses): it must run.
log=$dir/library.example
if [ ! -x build/emu/single/example ]; then bad "docs/example.c: build/emu/single/example is not built (make emu-build)"
elif launch 1 "$log" build/emu/single/example && grep -q 'step done' "$log.0"; then
  ok "docs/example.c (plan single) runs its step in the library's order"
else bad "docs/example.c on the emulator" "$log.0"; fi

# fault_run NAME PLAN K FLAGS: 0 caught, 1 missed, 2 vacuous, 3 never reached, 4 a rank crashed or hung.
fault_run() {
  name=$1 p=$2 k=$3; shift 3
  n=$(world "$p")
  log=$dir/fault.$name.$p.$k
  # shellcheck disable=SC2086
  COMMPLAN_EMU_FAULT=$name:$k COMMPLAN_EMU_DEADLOCK_S=2 launch "$n" "$log" "build/emu/$p/$p" --check --steps 2 \
    --timeout 10 "$@"
  failed=$?
  grep -q 'seeded fault fired' "$log.0" || return 3
  crashed "$n" "$log" >"$log.crash" && return 4
  if grep -q 'seeded fault fired, vacuous' "$log.0" && [ "$failed" = 0 ]; then return 2; fi
  [ "$failed" -gt 0 ] && return 0
  return 1
}

echo "== seeded faults the emulator must catch (plans: ${FAULT_PLANS:-none})"
seeded=0
caught=0
vacuous=0
[ -n "$FAULT_PLANS" ] || echo "  SKIP  seeded faults: EMU_FAULT_PLANS is empty"
fault_specs="drop_wait:3 10 19 35 50|reuse_event:5 13 19|swap_coll:2 5|shift_kernel:1 9|alloc_in_capture:1 6"
[ "$quick" = 1 ] && fault_specs="drop_wait:10 35|reuse_event:5 19|swap_coll:2 5|shift_kernel:1 9|alloc_in_capture:1 6"
IFS='|' # (the plans in "$@" are done with: the fault specs take their place)
# shellcheck disable=SC2086
set -- $fault_specs
unset IFS
[ -z "$FAULT_PLANS" ] || for spec in "$@"; do
  name=${spec%%:*}
  ks=${spec#*:}
  flags=""
  [ "$name" = alloc_in_capture ] && flags="--graph"
  c=0 s=0 v=0 missed=""
  for p in $FAULT_PLANS; do
    [ -x "build/emu/$p/$p" ] || continue
    for k in $ks; do
      # shellcheck disable=SC2086
      fault_run "$name" "$p" "$k" $flags
      case $? in
        0) c=$((c + 1)); s=$((s + 1)) ;;
        1) s=$((s + 1)); missed="$missed $p:$k" ;;
        2) v=$((v + 1)) ;;
        4) s=$((s + 1)); missed="$missed $p:$k($(cat "$dir/fault.$name.$p.$k.crash"))" ;;
      esac
    done
  done
  seeded=$((seeded + s)); caught=$((caught + c)); vacuous=$((vacuous + v))
  if [ "$s" -gt 0 ] && [ "$c" = "$s" ]; then
    ok "$name: caught $c of $s seeded$([ "$v" -gt 0 ] && echo " ($v vacuous seeds changed nothing)")"
  else
    bad "$name: caught $c of $s seeded; missed:${missed:- (none seeded)}"
  fi
done

# Issue 41 (fsdp.symm_mem): the symmetric window. symm_fsdp4's --check runs
# above register it; here every rank must say it registered the plan's
# window on the fsdp communicator, and a rank whose buffers sit 256 bytes
# later in its window than its peers' (the shift_window fault, rank 0: a
# rank-dependent offset) must be caught by the offset check on every rank.
echo "== the symmetric window (fsdp.symm_mem): registered alike, offsets checked"
for p in symm_fsdp4 symm_ep2; do
  [ -x "build/emu/$p/$p" ] || { echo "  SKIP  symmetric window: build/emu/$p/$p is not built (make emu-build)"; continue; }
  # the window's bytes and the communicators it is registered on (gen/symm.lua's families)
  facts=$($LUA -e "package.path='./?.lua;'..package.path
    local q = require('gen.plan').from_file('$(plan_file $p)')
    print(q.arena.symm.window_bytes, #q.symm.families, table.concat(q.symm.families, '+'))")
  want=${facts%%	*} rest=${facts#*	}
  nfam=${rest%%	*} fams=${rest#*	}
  log=$dir/symm.$p
  launch 4 "$log" "build/emu/$p/$p" --check --steps 2 --timeout 10
  rc=$?
  regs=$(cat "$log".[0-3] | grep -c "symmetric window of $want bytes registered on split")
  if [ "$rc" = 0 ] && [ "$regs" = $((4 * nfam)) ]; then
    ok "$p: every rank registers the plan's $want-byte symmetric window on its $fams communicators, --check exact"
  else bad "$p: exit $rc, $regs of $((4 * nfam)) registrations of a $want-byte window ($fams)" "$log.0"; fi
done
p=symm_fsdp4
if [ -x "build/emu/$p/$p" ]; then
  fault_run shift_window "$p" 1 # (on rank 0: fault_run reads rank 0's log for the firing)
  frc=$?
  found=$(cat "$dir/fault.shift_window.$p.1".[0-3] | grep -c "SYMMETRIC: .*need the same offset on every member")
  if [ "$frc" = 0 ] && [ "$found" -ge 4 ]; then
    ok "$p: a rank-dependent window offset (shift_window on rank 0) caught by the offset check on all 4 ranks"
  else bad "$p: shift_window on rank 0 (fault_run $frc, $found SYMMETRIC findings)" "$dir/fault.shift_window.$p.1.0"; fi
fi

echo "== torchrun launches of the emulated binary"
torchrun=${TORCHRUN:-$(command -v torchrun || true)}
if [ -z "$torchrun" ] || [ ! -x "$torchrun" ]; then
  echo "  SKIP  torchrun launch: no torchrun (make torch-env installs one)"
else
  # fsdp4 through both NCCL-id channels; a pipeline plan (its ncclSend /
  # ncclRecv groups on the pp communicator) through torchrun's store
  for launch_case in store:fsdp4 idfile:fsdp4 store:pp_tiny; do
    channel=${launch_case%%:*} p=${launch_case#*:}
    [ -x "build/emu/$p/$p" ] || { bad "torchrun $p: build/emu/$p/$p is not built (make emu-build)"; continue; }
    log=$dir/torchrun.$channel.$p.log
    extra=""
    [ "$channel" = idfile ] && extra="COMMPLAN_ID_FILE=$dir/ids/job"
    mkdir -p "$dir/ids"
    # shellcheck disable=SC2086
    env $extra COMMPLAN_INIT_TIMEOUT=60 timeout -k 5 180 "$torchrun" --standalone --nproc-per-node 4 --no-python \
      "build/emu/$p/$p" --check --steps 2 --graph >"$log" 2>&1
    rc=$?
    passed=$(grep -c 'rank [0-9]*: --check passed' "$log")
    clean=$(grep -c ' 0 races, 0 rule violations, 0 NCCL mismatches or deadlocks, 0 illegal accesses' "$log")
    if [ "$rc" = 0 ] && [ "$passed" = 4 ] && [ "$clean" = 4 ]; then
      ok "torchrun --nproc-per-node 4 $p --check --graph (NCCL id through $channel): 4 ranks exact, 0 races"
    else bad "torchrun $p through $channel (exit $rc, $passed of 4 passed)" "$log"; fi
  done
fi

[ "$quick" = 1 ] && echo "quick tier: --graph refused on the first expert-parallel and CPU-offload plan, seeded faults at 2 offsets each, split calls on $split_plans; make test-full refuses --graph on every such plan, seeds every offset (drop_wait 3 10 19 35 50, reuse_event 5 13 19) and splits on every library plan"
echo "emu: $pass passed, $fail failed; $runs plan runs ($ops stream ops), seeded faults caught $caught of $seeded ($vacuous vacuous seeds not counted)"
[ "$fail" = 0 ] && rm -rf "$dir"
[ "$fail" = 0 ]
