#!/bin/bash
# shared/gpu/CHECKS.md in one time-boxed call on a lent GPU machine: the
# short lease (15 minutes of device time, start included) needs the checks
# ordered by what only a GPU can say, run side by side where they do not
# time each other, and every log kept under $OUT as it is written, so a
# call cut off at its limit still says what ran.
#   OUT=build/gpu-checks bash bench/gpu_checks.sh [DEADLINE_S]
# SECTIONS picks some (default all), ONLY_PLANS the plans of ranks.
# Sections (each one line in $OUT/summary.txt):
#   build        every small, TP and kernel plan, test_kernels, single, fsdp4
#   kernels      device kernels against the host reference (test_kernels)
#   ranks        every plan (pipeline plans first), all ranks on the GPU, --check eager and --graph
#                (expert-parallel plans, EP_PLANS: eager only),
#                GPU_RUNS runs (in the background, 4 plans at a time)
#   oracle       fsdp3 GPU --dump against the FSDP2-on-NCCL recording
#   torchrun     torch's torchrun launching a plan binary
#   faults       single --check/--graph, library example, fault exits
#   sanitizer    compute-sanitizer memcheck/racecheck/synccheck, hsdp2x3_bf16 all ranks
#   train        20 AdamW steps against fully_shard on NCCL (train_compare.py)
#   enqueue      host time per llama70b step (--standin), eager and graph, and its --trace
#   bench        copy kernels against PyTorch's ops (alone on the GPU)
#   eplib        the GPU library's token exchanges (tests/lib/ep_library.c) on every EP plan, all ranks
set -u
OUT=${OUT:-build/gpu-checks}
deadline=$(( $(date +%s) + ${1:-540} ))
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $(( deadline - $(date +%s) )); }
. bench/nccl_home.sh
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "nccl: $(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH)' "${NCCL_HOME:-/usr/local/cuda}/include/nccl.h" 2>/dev/null | awk '{printf "%s.", $3}') torch: $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)"

# ---- build: the runtime once, then every plan's own make side by side ----
t0=$(date +%s)
BIG_PLANS=" $(make -s --no-print-directory print-big-plans) "  # (the Makefile's one list of real-model plans)
GPU_PLANS=$(for f in plans/*.lua; do b=$(basename "$f" .lua); case $BIG_PLANS in *" $b "*) ;; *) echo "$b" ;; esac; done)
# tests/plans: the kernel-coverage plan and the TP plans the live checks use
KERNEL_PLANS=${KERNEL_PLANS:-kernels_all_dtypes fsdp2_tp2 llama_tiny_tp_rec}
# tests/pp/plans: the pipeline plans (ncclSend / ncclRecv in groups)
PP_PLANS=${PP_PLANS:-pp_tiny pp_tiny_tp pp_tiny_zbv pp_tiny_lbfs pp_tiny_gpipe pp_tiny_izb pp_tiny_dpv}
# tests/ep/plans: the expert-parallel plans (experts units over their own
# efsdp communicator, ncclSend / ncclRecv all-to-alls): eager only, --graph
# is refused for plans with all-to-alls
EP_PLANS=${EP_PLANS:-ep2_mixtral ep4_mixtral_efsdp1 ep2_dsv3_shard1 ep2_mixtral_hsdp ep2_mixtral_ac ep4_dsv3_tp2 ep1_mixtral_tp2_hsdp ep4_qwen3moe_tp2_hsdp ep2_mixtral_tp4}
GPU_PLANS=${ONLY_PLANS:-$GPU_PLANS}
{
  make -s PLAN=single.lua && make -s -j16 build/tests/test_kernels &&
  printf '%s\n' $GPU_PLANS | xargs -P 8 -I{} make -s PLAN={}.lua &&
  printf '%s\n' $KERNEL_PLANS fsdp3 too_big | xargs -P 4 -I{} make -s PLAN=tests/plans/{}.lua OUT=build/gen/{} &&
  { [ -z "$PP_PLANS" ] || printf '%s\n' $PP_PLANS | xargs -P 4 -I{} make -s PLAN=tests/pp/plans/{}.lua OUT=build/gen/{}; } &&
  { [ -z "$EP_PLANS" ] || printf '%s\n' $EP_PLANS | xargs -P 4 -I{} make -s PLAN=tests/ep/plans/{}.lua OUT=build/gen/{}; } &&
  make -s build/example/example
} >"$OUT/build.log" 2>&1
brc=$?
say "build: rc $brc in $(( $(date +%s) - t0 )) s"
[ $brc = 0 ] || { tail -n 30 "$OUT/build.log"; exit 1; }

# ---- ranks (background): every plan, all ranks on the GPU ----
ranks_job() {
  port=21000
  jobs=$OUT/ranks.jobs
  : >"$jobs"
  for run in $(seq "${GPU_RUNS:-3}"); do
    for p in $PP_PLANS $EP_PLANS $GPU_PLANS $KERNEL_PLANS; do
      f=plans/$p.lua; [ -f "$f" ] || f=tests/plans/$p.lua; [ -f "$f" ] || f=tests/pp/plans/$p.lua
      [ -f "$f" ] || f=tests/ep/plans/$p.lua
      n=$(lua5.4 -e "print(dofile('$f').world_size)")
      modes="eager --graph"
      case " $EP_PLANS " in *" $p "*) modes=eager ;; esac # all-to-alls: --graph is refused by design
      # CPU offload (issue 39): --graph is refused as FSDP2 refuses it; eager runs the pinned
      # and pageable cudaMemcpyAsync H2D / D2H copies against real streams
      case $p in *_offload) modes=eager ;; esac
      for mode in $modes; do
        port=$((port + 7))
        echo "$run $p $n $mode $port" >>"$jobs"
      done
    done
  done
  # one plan run per line of $jobs; a result line per run, logs of failures kept
  xargs -P 4 -L 1 sh -c '
    run=$0 p=$1 n=$2 mode=$3 port=$4 out='"$OUT"'
    m=$mode; [ "$m" = eager ] && m=
    log=$out/ranks-$p-$mode-$run.log
    if MASTER_PORT=$port TMPDIR=build GPU_RANKS_TIMEOUT=120 tests/gpu_ranks.sh "$n" "build/$p/$p" --check --steps 2 $m >"$log" 2>&1
    then echo "ok   $p $n ranks $mode run $run"; rm -f "$log"
    else echo "FAIL $p $n ranks $mode run $run (log $log)"; fi' <"$jobs" >"$OUT/ranks.txt" 2>&1
  pass=$(grep -c '^ok' "$OUT/ranks.txt"); fail=$(grep -c '^FAIL' "$OUT/ranks.txt")
  # fsdp3: the GPU's dump against FSDP2 on NCCL, byte for byte
  rm -rf build/gpu-oracle/fsdp3
  if MASTER_PORT=22990 TMPDIR=build tests/gpu_ranks.sh 3 build/fsdp3/fsdp3 --check --pattern oracle --dump build/gpu-oracle/fsdp3 >"$OUT/oracle.log" 2>&1 &&
     lua5.4 tests/oracle_check.lua tests/oracle/nccl build/gpu-oracle/fsdp3 fsdp3 >>"$OUT/oracle.log" 2>&1
  then o=ok; else o=FAIL; fi
  tests/gpu_torchrun.sh >"$OUT/torchrun.log" 2>&1; trc=$?
  echo "ranks: $pass passed, $fail failed; oracle fsdp3: $o; torchrun: rc $trc $(grep -c '^  ok' "$OUT/torchrun.log") ok" >"$OUT/ranks.done"
}
want() { case " ${SECTIONS:-ranks eplib kernels faults sanitizer train enqueue bench} " in *" $1 "*) return 0 ;; esac; return 1; }
if want ranks; then ranks_job & ranks_pid=$!; else ranks_pid=; fi

# ---- foreground: the library's token exchanges, kernels, faults, sanitizer, train ----
want eplib && {
  ep_ok=0 ep_bad=0
  for p in $EP_PLANS; do
    n=$(lua5.4 -e "print(dofile('tests/ep/plans/$p.lua').world_size)")
    log=$OUT/eplib-$p.log
    if make -s "build/$p/ep_library" >"$log" 2>&1 &&
       MASTER_PORT=$((24000 + 11 * (ep_ok + ep_bad))) TMPDIR=build GPU_RANKS_TIMEOUT=60 tests/gpu_ranks.sh "$n" "build/$p/ep_library" 2 >>"$log" 2>&1 &&
       [ "$(grep -c 'every row and count exact' "$log")" -ge "$n" ]
    then ep_ok=$((ep_ok + 1)); echo "ok   $p $n ranks: $(grep -m 1 'every row' "$log")" >>"$OUT/eplib.txt"; rm -f "$log"
    else ep_bad=$((ep_bad + 1)); echo "FAIL $p $n ranks (log $log)" >>"$OUT/eplib.txt"; fi
  done
  say "eplib: $ep_ok passed, $ep_bad failed (the library's token exchanges, every row and count checked on every rank)"
}
want kernels && { timeout 120 build/tests/test_kernels >"$OUT/kernels.log" 2>&1
say "kernels: rc $? $(tail -n 1 "$OUT/kernels.log")"; }
want faults && {
  make -s PLAN=fsdp4.lua >/dev/null && # gpu_faults.sh's missing-peer case runs it, whatever ONLY_PLANS says
  timeout 60 build/single/single --check --steps 3 && timeout 60 build/single/single --warmup 3 --iters 20 --graph &&
  timeout 60 build/example/example && tests/gpu_faults.sh
} >"$OUT/faults.log" 2>&1
fr=$?; want faults && say "faults: rc $fr $(grep -c '^  ok' "$OUT/faults.log") ok, $(grep -c 'FAIL' "$OUT/faults.log") FAIL"
want sanitizer && for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
  budget=$(( $(left) - 170 )); [ $budget -gt 150 ] && budget=150
  [ $budget -gt 40 ] || { say "sanitizer $tool: SKIP (time)"; continue; }
  MASTER_PORT=$((23000 + ${#tool})) TMPDIR=build GPU_RANKS_TIMEOUT=$budget COMMPLAN_INIT_TIMEOUT=$budget \
    tests/gpu_ranks.sh 6 compute-sanitizer --tool "$tool" --error-exitcode 3 --report-api-errors no \
    build/hsdp2x3_bf16/hsdp2x3_bf16 --check --steps 1 >"$OUT/san-$tool.log" 2>&1
  say "sanitizer $tool: rc $? $(grep -o 'ERROR SUMMARY: [0-9]* error' "$OUT/san-$tool.log" | sort | uniq -c | tr -s ' \n' ' ')"
done
if ! want train; then :; elif [ "$(left)" -gt 150 ]; then
  PYTHONUNBUFFERED=1 PYTHONPATH=python timeout $(( $(left) - 90 )) python3 tests/python/train_compare.py --configs ${TRAIN_CONFIGS:-fp32,bf16} >"$OUT/train.log" 2>&1
  say "train: rc $? $(grep -iE 'bit|identical|ms|SKIP|FAIL' "$OUT/train.log" | tail -n 6 | tr '\n' '|')"
else say "train: SKIP (time)"; fi

# ---- ranks must finish before the bench has the GPU to itself ----
while [ -n "$ranks_pid" ] && kill -0 $ranks_pid 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 2; done
if ! want ranks; then :; elif [ -f "$OUT/ranks.done" ]; then say "$(cat "$OUT/ranks.done")"; else say "ranks: unfinished ($(grep -c '^ok' "$OUT/ranks.txt") ok, $(grep -c '^FAIL' "$OUT/ranks.txt") FAIL so far)"; fi
grep '^FAIL' "$OUT/ranks.txt" | head -n 10 >>"$summary"
# host time to issue one llama70b step, rank 0 alone (stand-in one-rank communicators), eager and graph
if want enqueue && [ "$(left)" -gt 120 ]; then
  { make -s PLAN=llama70b.lua && for m in eager --graph; do mm=$m; [ "$mm" = eager ] && mm=
      timeout 90 build/llama70b/llama70b --standin --warmup 3 --iters 20 $mm; done
    timeout 90 build/llama70b/llama70b --standin --warmup 3 --iters 5 --trace "$OUT/llama70b-trace.json" &&
    python3 bench/trace_compare.py plans/llama70b/trace.json "$OUT/llama70b-trace.json" >"$OUT/trace-compare.txt"
  } >"$OUT/enqueue.log" 2>&1
  say "enqueue: rc $? $(grep -iE 'step|host' "$OUT/enqueue.log" | head -n 6 | tr '\n' '|')"
fi
if want bench && [ "$(left)" -gt 70 ]; then
  PYTHONUNBUFFERED=1 timeout $(( $(left) - 10 )) python3 bench/bench_kernels.py >"$OUT/bench.log" 2>&1
  say "bench: rc $?"
else say "bench: SKIP (time)"; fi
cat "$summary"
