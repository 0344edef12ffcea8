#!/usr/bin/env bash
# make test: every suite this machine can run, one line per check, and a
# closing "N passed, N failed" line. Exits non-zero if anything failed.
#
# Two tiers, one knob: COMMPLAN_TEST_TIER=quick (make test, and the default
# here; CI runs it) or full (make test-full). Both run every check; the
# quick tier runs each kind of check at least once but fewer repetitions
# of it (seeds, cases, steps, sizes, seconds), and says so under the check
# in one "quick tier: ...; make test-full ..." line. The knob is exported:
# the scripts that hold a matrix of cases (tests/pp/, tests/ep/,
# tests/titan/, tests/python/) read it too and print that line themselves
# (run by hand, without it, they run the full matrix).
set -u
cd "$(dirname "$0")/.."
LUA=${LUA:-lua5.4}
MAKE="make --no-print-directory -s"
pass=0 fail=0 skip=0
log=build/test-logs
mkdir -p "$log"
tier=${COMMPLAN_TEST_TIER:-quick}
case $tier in
  quick|full) ;;
  *) echo "COMMPLAN_TEST_TIER=$tier: quick (make test) or full (make test-full)" >&2; exit 2 ;;
esac
export COMMPLAN_TEST_TIER=$tier
# tiered QUICK FULL: the value for this tier.
tiered() { if [ "$tier" = full ]; then printf '%s' "$2"; else printf '%s' "$1"; fi; }
# full_adds TEXT: under a check trimmed in the quick tier, the one line
# saying what it ran and what make test-full adds (nothing in the full tier).
full_adds() { [ "$tier" = full ] || printf '        quick tier: %s\n' "$1"; }
# tier_line LOG: a script's own "quick tier: ..." line (one per check), shown
# under its check.
tier_line() { [ "$tier" = full ] || grep -ah -m1 "^quick tier: " "$1" | sed "s/^/        /"; }

# A check's log is named after its description, cut to 120 characters plus
# the whole description's checksum (file names stop at 255 bytes).
logname() {
  local n; n=$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '_')
  [ ${#n} -le 140 ] || n="${n:0:120}_$(printf '%s' "$1" | cksum | cut -d' ' -f1)"
  printf '%s/%s.log' "$log" "$n"
}
# ok NAME [SECONDS]: a passed check, with what it took when over 5 s
# (make test's time budget: the lines say where the seconds go).
ok()   { pass=$((pass + 1)); if [ "${2:-0}" -gt 5 ]; then printf '  ok    %s  (%d s)\n' "$1" "$2"; else printf '  ok    %s\n' "$1"; fi; }
bad()  { fail=$((fail + 1)); printf '  FAIL  %s (log: %s)\n' "$1" "$2"; sed 's/^/        | /' "$2" | tail -n 15; }
skipped() { skip=$((skip + 1)); printf '  SKIP  %s: %s\n' "$1" "$2"; }
# section TITLE: a section's heading, with the seconds make test has run so
# far (the suite must stay well under 10 minutes: this says where they go).
section() { printf '== %s  [%ds]\n' "$1" "$SECONDS"; }
# run NAME CMD...: passes when CMD exits 0.
run() {
  local name=$1; shift
  local f t0=$SECONDS; f=$(logname "$name")
  if "$@" >"$f" 2>&1; then ok "$name" $((SECONDS - t0)); else bad "$name" "$f"; fi
}
# expect_rc NAME RC CMD...: passes when CMD exits with RC.
expect_rc() {
  local name=$1 want=$2; shift 2
  local f; f=$(logname "$name")
  "$@" >"$f" 2>&1
  local rc=$?
  if [ "$rc" = "$want" ]; then ok "$name"; else echo "exit status $rc, expected $want" >>"$f"; bad "$name" "$f"; fi
}

# Plan names as every loop here takes them: the shell's own glob, each name
# quoted, and only [A-Za-z0-9_]+ (the name becomes a C identifier): a file
# name holding $(...), backticks, quotes or spaces never reaches a command.
# The big shipped plans (the Makefile's BIG_PLANS, one list): skipped by every loop that runs plans.
BIG_PLANS=$(make -s --no-print-directory print-big-plans) || exit 2
is_big_plan() { case " $BIG_PLANS " in *" $1 "*) return 0 ;; esac; return 1; }
plan_names() {
  local f n
  for f in plans/*.lua; do
    [ -e "$f" ] || continue
    n=${f#plans/}; n=${n%.lua}
    case $n in ''|*[!A-Za-z0-9_]*) continue ;; esac
    printf '%s\n' "$n"
  done
}
# Fails naming every plans/*.lua whose name plan_names leaves out.
check_plan_names() {
  local f n rc=0
  for f in plans/*.lua; do
    [ -e "$f" ] || continue
    n=${f#plans/}; n=${n%.lua}
    case $n in ''|*[!A-Za-z0-9_]*) printf '%s: not [A-Za-z0-9_]+.lua; rename the file\n' "$f" | tr -c '[:print:]\n' '?'; rc=1 ;; esac
  done
  return $rc
}

if [ "$tier" = full ]; then
  echo "== the full tier (make test-full): every check with all its seeds, cases, steps and sizes"
else
  echo "== the quick tier (make test): every check, fewer repetitions; a \"quick tier:\" line under a check says what make test-full adds"
fi

# The torch environment (make torch-env), once: the torch lane below and
# the emulator's torchrun launches use it.
live_out=$(tests/live/torch_env.sh --python 2>&1); live_rc=$?
live_py=$(printf '%s\n' "$live_out" | tail -n 1)

# ---- the torch lane: every check that runs PyTorch, beside the rest ----
# live FSDP2, torchtitan, torchrun, training on CPU, tp_record and the
# runtime hooks need the torch environment and little of what the rest
# builds, so they run as one background lane (torch_lane) while the
# foreground goes on; its output is kept in build/test-logs/lanes/ and
# printed in full, in order, where it is joined (lane_join: its checks are
# counted there; a lane that ends without its counts is a failure).
# Everything it shares with the foreground is built before it starts
# (the prebuild below): the runtime objects and fsdp4 / hsdp2x2, which torchrun
# launches; its own builds go to build/live/, build/titan/, build/tp_record/
# and build/train_cpu*, build/bridge_dtypes/ and build/bd_*, build/bridge_ckpt/
# and build/ck_*, build/bridge_train/ and build/bt_*, build/titan_matrix/
# and build/ttm_*.
# lane_prebuild_wait: waits (at most 10 minutes) for the foreground's
# fsdp4 / hsdp2x2 builds; 0 when they and the runtime objects were built.
lane_prebuild_wait() {
  local i=0
  while [ ! -f "$log/lanes/prebuild.rc" ] && [ "$i" -lt 1200 ]; do sleep 0.5; i=$((i + 1)); done
  [ "$lane_prebuilt" = 0 ] && [ "$(cat "$log/lanes/prebuild.rc" 2>/dev/null)" = 0 ]
}
torch_lane() {
  # ---- live FSDP2 peer (issue 16, items 1 and 2) ----
  # PyTorch's fully_shard on gloo, one process per rank, against the binary's
  # --simulate --pattern oracle --dump, element for element (tests/live/):
  # the pinned environment first (what make torch-env runs:
  # tests/live/torch_env.sh, built once per machine outside the clone), the
  # torch 2.11 recordings' three models live (torch 2.15 against them), every
  # small plan, then the property test (random generic plans from seed
  # LIVE_SEED_FROM, default 1, for LIVE_SECONDS, default 10 and at least
  # LIVE_MIN_SEEDS, default 4; make test-full 50 s and 15). Where the
  # package registry cannot be reached each prints SKIP, never ok.
  section "live FSDP2 peer: PyTorch's fully_shard on gloo vs the binary's --dump (tests/live/)"
  # shellcheck disable=SC2317  # (live_check: a live.py command run alone; make test's go through live_add below)
  live_check() {  # NAME CMD...: ok or FAIL, then the run's closing line
    local name=$1 f; shift; f=$(logname "$name")
    if "$@" >"$f" 2>&1; then ok "$name"; else bad "$name" "$f"; fi
    grep -ah "^live \(plans\|seeds\|recordings\): " "$f" | sed "s/^/        /"
  }
  # The live.py commands below run over one pool of rank processes (live.py batch: torch imported and the
  # 8 ranks started once, not once a command); live_add queues one (NAME, its ARGS), live_done reports it
  # as live_check would, from its log and the batch's "live batch: rc N LOG" line.
  live_batch=()
  live_add() { live_batch+=("$(logname "$1")" "$2"); }
  live_done() {
    local f; f=$(logname "$1")
    if grep -qF "live batch: rc 0 $f (" "$live_bf"; then ok "$1"
    else { echo "== live.py batch's output:"; tail -n 20 "$live_bf"; } >>"$f"; bad "$1" "$f"; fi
    grep -ah "^live \(plans\|seeds\|recordings\): " "$f" | sed "s/^/        /"
  }
  live_recs="live FSDP2 (torch 2.15) vs the torch 2.11 recordings fsdp4, hsdp2x2, fsdp2_tp2 (tests/oracle_check.lua)"
  live_plans="live FSDP2 vs every small plan in plans/ and tests/plans/ (tests/live/live.py plans)"
  live_s=${LIVE_SECONDS:-$(tiered 10 50)} live_n=${LIVE_MIN_SEEDS:-$(tiered 4 15)}
  live_seeds="live FSDP2 property test: random generic plans from seed ${LIVE_SEED_FROM:-1} for $live_s s, at least $live_n seeds (tests/live/live.py seeds)"
  if [ "$live_rc" = 0 ]; then
    ok "torch-env: $(printf '%s\n' "$live_out" | sed -n 's/^torch-env: torch /torch /p' | head -n 1)"
    live_add "$live_recs" "recordings"
    live_add "$live_plans" "plans"
    live_add "$live_seeds" "seeds ${LIVE_SEED_FROM:-1}-$(( ${LIVE_SEED_FROM:-1} + 99999 )) --budget $live_s --min-seeds $live_n"
    # Issue 39's reduction knobs (set_gradient_divide_factor, set_force_sum_reduction_for_comms, a
    # unit's own set_requires_gradient_sync / set_requires_all_reduce, ignored_params): seeds 27-29
    # draw all of them with the other options, whatever seed the run above starts from.
    live_knobs="live FSDP2: issue 39's reduction knobs drawn by the property test (seeds 27-29)"
    live_add "$live_knobs" "seeds 27-29"
    # Issue 39 (h39r): fully_shard(reshard_after_forward=k) with an int k, drawn by the property test
    # (seed 12: fsdp 4, k plan-wide and per unit, with sync_last, ignored_params, CPU offload and frozen
    # parameters; --require fails the line if the seed stops drawing it; the fixed plans
    # tests/plans/fsdp4_raf2.lua and hsdp_raf2.lua run in "live.py plans" above).
    live_raf="live FSDP2: issue 39's reshard_after_forward as an int drawn by the property test (seed 12)"
    live_add "$live_raf" "seeds 12-12 --require raf_int --require frozen"
    # Issue 41's frozen parameters (requires_grad=False, torchtitan's LoRA; tests/plans/frozen_params.lua
    # runs with the plans above): seed 7 draws them under HSDP x TP, step_end, a divide factor and CPU
    # offload (seed 12 above beside raf_int), whatever seed the property run starts from.
    live_frozen="live FSDP2: frozen parameters drawn by the property test (seed 7)"
    live_add "$live_frozen" "seeds 7-7 --require frozen"
    # Issue 41 (hlora): the frozen prefix (model.input_requires_grad = false; tests/plans/frozen_prefix.lua
    # runs with the plans above): seed 33 draws it (FSDP 8, explicit prefetch lists, CPU offload, mixed
    # all-gather dtypes), whatever seed the property run starts from.
    live_prefix="live FSDP2: the frozen prefix drawn by the property test (seed 33)"
    live_add "$live_prefix" "seeds 33-33 --require input_requires_grad=False"
    # Issue 39 (h39v): set_unshard_in_backward(False) (tests/plans/unshard_bwd.lua runs with the plans
    # above): seeds 25-26 draw it beside units' own divide factors (DDP 4) and HSDP's deferred
    # all-reduce with reshard_after_backward, whatever seed the property run starts from.
    live_unshard="live FSDP2: unshard_in_backward drawn by the property test (seeds 25-26)"
    live_add "$live_unshard" "seeds 25-26 --require unshard_in_backward=False"
    live_bf=$log/live_batch.out
    timeout $(( live_s + 2400 )) "$live_py" tests/live/live.py batch "${live_batch[@]}" >"$live_bf" 2>&1
    live_done "$live_recs"
    live_done "$live_plans"
    live_done "$live_seeds"
    [ -n "${LIVE_SECONDS:-}${LIVE_MIN_SEEDS:-}" ] ||
      full_adds "property seeds for $live_s s, at least $live_n; make test-full runs them for 50 s, at least 15"
    live_done "$live_knobs"
    live_done "$live_raf"
    live_done "$live_frozen"
    live_done "$live_prefix"
    live_done "$live_unshard"
  elif [ "$live_rc" = 3 ]; then
    live_why=$(printf '%s\n' "$live_out" | sed -n 's/^torch-env: //p' | head -n 1)
    skipped "torch-env (make torch-env)" "$live_why"
    skipped "$live_recs" "$live_why"
    skipped "$live_plans" "$live_why"
    skipped "$live_seeds" "$live_why"
  else
    f=$(logname "torch-env (make torch-env)"); printf '%s\n' "$live_out" >"$f"; bad "torch-env (make torch-env)" "$f"
    skipped "$live_recs" "no torch environment (torch-env failed above)"
    skipped "$live_plans" "no torch environment (torch-env failed above)"
    skipped "$live_seeds" "no torch environment (torch-env failed above)"
  fi
  # ---- end of live FSDP2 peer ----

  # ---- torchtitan as the peer (issue 17, items 1 and 2) ----
  # commplan against torchtitan 0.3's own code, in the live environment above
  # (tests/titan/): its ParallelDims over every mesh of world <= 64 and
  # 1,024 / 16,384 / 131,072-rank ones (accept / refuse, meshes, aliases,
  # every group's rank lists; a fake process group), and its llama3
  # parallelized by its own parallelize_llama at the llama plans' meshes (FSDP
  # units, parameters, placements; the plan writer from a torchtitan model).
  # The two run side by side. SKIP, never ok, without a torch environment or
  # where torch / torchtitan do not import (exit 77).
  lane_prebuild_wait; lane_prebuilt=$? # (torchtitan's checks build binaries that link the GPU objects)
  section "torchtitan as the peer: ParallelDims, Llama wrapping and TP plan (tests/titan/)"
  titan_dims="torchtitan ParallelDims vs gen/dims.lua + gen/groups.lua: accept/refuse, meshes, aliases, rank lists (tests/titan/test_parallel_dims.py)"
  titan_llama="torchtitan llama3 + parallelize_llama vs the llama plans: FSDP units, parameters, placements; plan writer from torchtitan (tests/titan/test_llama_plan.py)"
  titan_moe="torchtitan qwen3 MoE, deepseek_v3 (+ Qwen3's MoE decoder without q/k norms for mixtral) + their parallelize vs the MoE families' plans, ep=1: FSDP/HSDP units, parameters, Shard(0)/Shard(1) placements (tests/titan/test_moe_plan.py)"
  titan_acts="torchtitan's MoE module and MoE-family blocks (GQA fused/unfused qkv, with/without q/k norms; MLA with q_lora_rank 0 and > 0; DeepSeek-V3's dense FFN and shared experts as the fused SwiGLU w13, model.fused; gpt-oss with flex and varlen): bytes autograd saves, SelectiveAC keeps, FullAC's outer view vs gen/models/moe_acts.lua (tests/titan/test_moe_acts.py)"
  titan_lacts="torchtitan's llama3 block (none, SelectiveAC, FullAC; stock and fused SwiGLU w13, model.fused) and loss (CrossEntropyLoss, ChunkedLossWrapper): saved and peak bytes vs gen/models/llama_acts.lua (tests/titan/test_llama_acts.py)"
  titan_closs="torchtitan's training step on gloo (parallelize_llama, CrossEntropyLoss and ChunkedLossWrapper with 8 chunks, FSDP and HSDP, 1 and 2 micro-batches): every rank's collectives in order vs the loss_chunks = 1 and 8 tables, and the reduced gradient shards vs --simulate (tests/titan/test_chunked_loss.py)"
  titan_result() {  # NAME LOG RC: ok, FAIL or SKIP (77), then the run's count lines
    case $3 in
      0) ok "$1" ;;
      77) skipped "$1" "$(sed -n 's/^SKIP [^:]*: //p' "$2" | head -n 1)"; return ;;
      *) echo "exit status $3" >>"$2"; bad "$1" "$2" ;;
    esac
    grep -h "^\(parallel_dims\|llama_plan\|moe_plan\|moe_acts\|llama_acts\|chunked_loss\): " "$2" | sed "s/^/        /"
    tier_line "$2"
  }
  if [ "$live_rc" = 0 ]; then
    titan_f1=$(logname "$titan_dims") titan_f2=$(logname "$titan_llama")
    timeout 900 "$live_py" tests/titan/test_parallel_dims.py >"$titan_f1" 2>&1 & titan_p1=$!
    timeout 900 "$live_py" tests/titan/test_llama_plan.py >"$titan_f2" 2>&1; titan_r2=$?
    titan_f3=$(logname "$titan_moe")
    timeout 600 "$live_py" tests/titan/test_moe_plan.py >"$titan_f3" 2>&1; titan_r3=$?
    titan_f4=$(logname "$titan_acts")
    timeout 300 "$live_py" tests/titan/test_moe_acts.py >"$titan_f4" 2>&1; titan_r4=$?
    titan_f5=$(logname "$titan_lacts")
    timeout 300 "$live_py" tests/titan/test_llama_acts.py >"$titan_f5" 2>&1; titan_r5=$?
    titan_f6=$(logname "$titan_closs")
    timeout 600 "$live_py" tests/titan/test_chunked_loss.py >"$titan_f6" 2>&1; titan_r6=$?
    wait "$titan_p1"; titan_r1=$?
    titan_result "$titan_dims" "$titan_f1" "$titan_r1"
    titan_result "$titan_llama" "$titan_f2" "$titan_r2"
    titan_result "$titan_moe" "$titan_f3" "$titan_r3"
    titan_result "$titan_acts" "$titan_f4" "$titan_r4"
    titan_result "$titan_lacts" "$titan_f5" "$titan_r5"
    titan_result "$titan_closs" "$titan_f6" "$titan_r6"
  else
    titan_why=$(printf '%s\n' "$live_out" | sed -n 's/^torch-env: //p' | head -n 1)
    titan_why="no torch environment (make torch-env exit $live_rc${titan_why:+: $titan_why})"
    skipped "$titan_dims" "$titan_why"
    skipped "$titan_llama" "$titan_why"
    skipped "$titan_moe" "$titan_why"
    skipped "$titan_acts" "$titan_why"
    skipped "$titan_lacts" "$titan_why"
    skipped "$titan_closs" "$titan_why"
  fi
  # issue 41 (h39u): LoRA's frozen parameters against torchtitan's LoRAConverter (its own block)
  titan_lora="torchtitan LoRAConverter + parallelize_llama vs plan_from_titan: each unit's FSDP parameters, frozen where FSDP2's sharded parameter takes no gradient, the reduce-scatter row (tests/titan/test_lora_plan.py)"
  if [ "$live_rc" = 0 ]; then
    titan_fl=$(logname "$titan_lora")
    timeout 600 "$live_py" tests/titan/test_lora_plan.py >"$titan_fl" 2>&1; titan_rl=$?
    titan_result "$titan_lora" "$titan_fl" "$titan_rl"
    [ "$titan_rl" = 77 ] || grep -h "^test_lora_plan: " "$titan_fl" | sed "s/^/        /"
  else
    skipped "$titan_lora" "no torch environment (make torch-env exit $live_rc)"
  fi
  # the dense Qwen3 family against torchtitan's qwen3 (its own block, as test_moe_plan.py's)
  titan_qwen3="torchtitan qwen3 dense (tied and untied) + parallelize_qwen3 vs the qwen3 family: FSDP/HSDP units, parameters, registry counts, one step's collectives on gloo, block bytes (tests/titan/test_qwen3_plan.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f7=$(logname "$titan_qwen3")
    timeout 600 "$live_py" tests/titan/test_qwen3_plan.py >"$titan_f7" 2>&1; titan_r7=$?
    titan_result "$titan_qwen3" "$titan_f7" "$titan_r7"
    [ "$titan_r7" = 77 ] || grep -h "^qwen3_plan: [0-9]" "$titan_f7" | sed "s/^/        /"
  else
    skipped "$titan_qwen3" "$titan_why"
  fi
  # Issue 42: a rank's parameter, gradient and optimizer bytes and sync_last's unsharded gradients vs torch's tensors.
  titan_mem="a rank's parameter, gradient, AdamW and unsharded-gradient bytes of torchtitan's llama3 after a step (FSDP, HSDP sync_last) vs plan.json's memory figures (tests/titan/test_memory_terms.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f8=$(logname "$titan_mem"); timeout 300 "$live_py" tests/titan/test_memory_terms.py >"$titan_f8" 2>&1
    titan_result "$titan_mem" "$titan_f8" $?; grep -h "^memory_terms: " "$titan_f8" | sed "s/^/        /"
  else skipped "$titan_mem" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 41 (h41d): fsdp.symm_mem. gloo has no symmetric memory (set_symm_mem_for_comm is accepted, the first
  # step fails on CPU): FSDP2 with torchtitan's forced sums, every allocation at the call sites the
  # symmetric comms serve vs the plan's window buffers, every rank alike, and a mutant plan that differs.
  symm_live="fsdp.symm_mem: what FSDP2 allocates at its symmetric call sites (all-gather outputs, reduce-scatter inputs and outputs) on gloo, FSDP 4 and HSDP 2x2 bf16, vs the plan's window buffers per rank and step (tests/live/symm_sizes.py)"
  if [ "$live_rc" = 0 ]; then
    symm_f=$(logname "$symm_live"); mkdir -p build/symm_live
    if $LUA gen/commplan.lua tests/plans/symm_fsdp4.lua build/symm_live/fsdp4 >/dev/null &&
       $LUA gen/commplan.lua tests/plans/symm_hsdp2x2.lua build/symm_live/hsdp2x2 >/dev/null; then
      timeout 600 "$live_py" tests/live/symm_sizes.py build/symm_live/fsdp4 build/symm_live/hsdp2x2 >"$symm_f" 2>&1
      titan_result "$symm_live" "$symm_f" $?; grep -h "^ok\|^FAIL\|^  every" "$symm_f" | sed "s/^/        /"
    else echo "generating tests/plans/symm_*.lua failed" >"$symm_f"; bad "$symm_live" "$symm_f"; fi
  else skipped "$symm_live" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 41 (h41a): torchtitan's fsdp_reshard_after_forward policies on gloo vs fsdp.reshard_after_forward_policy.
  titan_rpol="torchtitan's fsdp_reshard_after_forward \"default\" / \"always\" / \"never\" on gloo (parallelize_llama, CrossEntropyLoss): every rank's collectives in order, the units' reshard_after_forward and the reduced gradients vs fsdp.reshard_after_forward_policy's tables (tests/titan/test_reshard_policy.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f9=$(logname "$titan_rpol"); timeout 600 "$live_py" tests/titan/test_reshard_policy.py >"$titan_f9" 2>&1
    titan_result "$titan_rpol" "$titan_f9" $?; grep -h "^reshard_policy: " "$titan_f9" | sed "s/^/        /"
  else skipped "$titan_rpol" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 41 (h41b): torchtitan's fused layouts (its override.imports) vs model.fused.
  titan_fused="torchtitan's fused_swiglu / fused_grouped_experts / fused_mla overrides (llama3, qwen3, qwen3 MoE, deepseek_v3; FSDP, HSDP, FSDP x TP) vs model.fused: every parameter's slot, shape, placement; steps on gloo (qwen3 fused SwiGLU, DeepSeek-V3 all three): collectives in order, reduced gradients vs --simulate (tests/titan/test_fused_plan.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f10=$(logname "$titan_fused"); timeout 600 "$live_py" tests/titan/test_fused_plan.py >"$titan_f10" 2>&1
    titan_result "$titan_fused" "$titan_f10" $?; grep -h "^fused_plan: [0-9]" "$titan_f10" | sed "s/^/        /"
  else skipped "$titan_fused" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 41 (hmtp): DeepSeek-V3's multi-token prediction (torchtitan's mtp.py) vs model.num_mtp_layers; the live
  # step on gloo.
  titan_mtp="torchtitan's deepseek_v3 with num_mtp_layers (MTPDecoder, apply_fsdp_to_mtp_decoder, MTPLoss) vs model.num_mtp_layers: every unit's parameters and placements; steps on gloo (FSDP 4): collectives in order, reduced gradients vs --simulate, the one-forward mutant told apart (tests/titan/test_mtp.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f11=$(logname "$titan_mtp")
    timeout 600 "$live_py" tests/titan/test_mtp.py \
      >"$titan_f11" 2>&1
    titan_result "$titan_mtp" "$titan_f11" $?; grep -h "^mtp: [0-9]" "$titan_f11" | sed "s/^/        /"
  else skipped "$titan_mtp" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 41 (hfix2): the writer's model.attn_backend from torchtitan's built attention, and CP's one check on it.
  titan_attn="torchtitan's llama3_debugmodel_varlen_attn written with attn_backend \"varlen\" and refused at cp 2 (full_dtensor.py:44-52), planned at cp 1; llama3_debugmodel (flex) planned at cp 2 (tests/titan/test_attn_backend_plan.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f12=$(logname "$titan_attn"); timeout 300 "$live_py" tests/titan/test_attn_backend_plan.py >"$titan_f12" 2>&1
    titan_result "$titan_attn" "$titan_f12" $?; grep -h "^attn_backend plan checks: " "$titan_f12" | sed "s/^/        /"
  else skipped "$titan_attn" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 41 (hlora): a torchtitan LoRA training step on gloo vs the plan `commplan write --lora-rank` writes.
  titan_lstep="torchtitan's LoRA step on gloo (llama3 debugmodel, LoRAConverter, parallelize_llama, spmd_backend partial_dtensor, FSDP 4; the full tier HSDP 2x2 and spmd_types, which trains every weight): every rank's collectives in order (frozen weights gathered, never reduced), the adapters' reduced gradients vs --simulate, AdamW's state vs the plan's optimizer memory, a mutant plan that differs (tests/titan/test_lora_step.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f13=$(logname "$titan_lstep"); timeout 900 "$live_py" tests/titan/test_lora_step.py >"$titan_f13" 2>&1
    titan_result "$titan_lstep" "$titan_f13" $?; grep -h "^lora_step: " "$titan_f13" | sed "s/^/        /"
    tier_line "$titan_f13"
  else skipped "$titan_lstep" "no torch environment (make torch-env exit $live_rc)"; fi
  # ---- end of torchtitan as the peer ----
  # Context parallel (docs/context-parallel.md): torchtitan 0.3's CP step on gloo vs commplan's tables.
  titan_cp="torchtitan's context parallel on gloo (parallelize_llama, flex attention; dp_shard 2 x cp 2, cp 2 x tp 2, mixtral dp_shard 2 x cp 2 x ep 2; spmd_types and partial_dtensor; FullAC; the full tier cp 4, dp_replicate 2 x cp 2, SelectiveAC, qwen3, dsv3 too): every rank's collectives in order vs commplan's tables (tests/titan/test_cp_record.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f7=$(logname "$titan_cp"); timeout 600 "$live_py" tests/titan/test_cp_record.py >"$titan_f7" 2>&1
    titan_result "$titan_cp" "$titan_f7" $?; grep -h "^cp_record: " "$titan_f7" | sed "s/^/        /"
  else skipped "$titan_cp" "no torch environment (make torch-env exit $live_rc)"; fi
  # Issue 35: every mesh of degrees 1 and 2 over (dp_replicate, dp_shard, cp, tp, pp, ep) per family,
  # commplan's generator against torchtitan's own Trainer path (fake process group), and a sample simulated.
  titan_matrix="the composition matrix: 5 families x every mesh of degrees 1 and 2 over dp_replicate, dp_shard, cp, tp, pp, ep, planned (proofs, simulated in both arithmetics) or refused exactly where torchtitan 0.3's own Trainer path refuses it (tests/matrix/test_matrix.py)"
  if [ "$live_rc" = 0 ]; then
    titan_f9=$(logname "$titan_matrix"); timeout 900 "$live_py" tests/matrix/test_matrix.py >"$titan_f9" 2>&1
    titan_result "$titan_matrix" "$titan_f9" $?
    grep -h "^matrix: \|^DISAGREEMENT \|^SIMULATION FAILED " "$titan_f9" | head -n 12 | sed "s/^/        /"
  else skipped "$titan_matrix" "no torch environment (make torch-env exit $live_rc)"; fi
  # CP x PP (docs/pipeline.md): torchtitan 0.3's pipeline_llm with CP inside each stage on gloo vs plan.json.
  titan_cppp="torchtitan's pipeline with context parallel on gloo (pipeline_llm + parallelize_llama, pp 2 x cp 2, Interleaved1F1B; the full tier 1F1B, GPipe, ZBVZeroBubble and pp 2 x dp_shard 2 x cp 2 and gpt-oss pp 2 x cp 2 too): every rank's collectives and sends/receives in order vs plan.json (tests/titan/test_cppp_record.py)"
  if [ "$live_rc" = 0 ]; then
    titan_fcppp=$(logname "$titan_cppp"); timeout 600 "$live_py" tests/titan/test_cppp_record.py >"$titan_fcppp" 2>&1
    titan_result "$titan_cppp" "$titan_fcppp" $?; grep -h "^cppp_record: " "$titan_fcppp" | sed "s/^/        /"
  else skipped "$titan_cppp" "no torch environment (make torch-env exit $live_rc)"; fi
  # CP x PP under torchtitan's fsdp_reshard_after_forward "always" (issue 41, hpp2): every microbatch's forward
  # and backward gather the stage's units again, beside CP's K/V collectives (full tier only: ~90 s)
  titan_cppp_always="torchtitan's pipeline with context parallel under the \"always\" reshard policy on gloo (pp 2 x cp 2 1F1B and Interleaved1F1B, pp 2 x dp_shard 2 x cp 2 1F1B): every rank's collectives and sends/receives in order vs plan.json (tests/titan/test_cppp_record.py --policy always)"
  if [ "$tier" != full ]; then
    full_adds "CP x PP under the \"always\" reshard policy live (tests/titan/test_cppp_record.py --policy always, 3 cases, ~90 s) runs in make test-full"
  elif [ "$live_rc" = 0 ]; then
    titan_fcpppa=$(logname "$titan_cppp_always")
    timeout 600 "$live_py" tests/titan/test_cppp_record.py --policy always \
      --cases pp2_cp2:1F1B,pp2_cp2:Interleaved1F1B,pp2_dp2_cp2:1F1B >"$titan_fcpppa" 2>&1
    titan_result "$titan_cppp_always" "$titan_fcpppa" $?; grep -h "^cppp_record: " "$titan_fcpppa" | sed "s/^/        /"
  else skipped "$titan_cppp_always" "no torch environment (make torch-env exit $live_rc)"; fi

  # torch 2.15's own torchrun launching plan binaries on CPU: the launch path
  # up to NCCL (--rendezvous-only): torchrun's store as the id channel with
  # the launch counter and the plan handshake, COMMPLAN_ID_FILE, two jobs at
  # once, a second run in one launch, a rank of another plan refused on every
  # rank, a launch of the wrong size (tests/torchrun_cpu.sh).
  section "torchrun for real on CPU: the launch path up to NCCL (tests/torchrun_cpu.sh)"
  torchrun_what="torch's torchrun --standalone and --rdzv-endpoint launch fsdp4/hsdp2x2 binaries with --rendezvous-only"
  if [ "$live_rc" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ]; then
    # Built before this lane started (lane_prebuild): a make of the same plan
    # here could race the foreground's (both rewrite build/<plan>/.backend).
    if [ "$lane_prebuilt" = 0 ] && [ -x build/fsdp4/fsdp4 ] && [ -x build/hsdp2x2/hsdp2x2 ]; then
      run "$torchrun_what" tests/torchrun_cpu.sh "$(dirname "$live_py")/torchrun"
      grep -h "^torchrun: [0-9]" "$(logname "$torchrun_what")" | sed "s/^/        /"
    else
      cp "$log/lanes/prebuild.log" "$(logname "$torchrun_what")"
      bad "$torchrun_what" "$(logname "$torchrun_what")"
    fi
  else
    skipped "$torchrun_what" "no torch environment with torchrun (make torch-env)"
  fi
  # Training driven by the plan on CPU: AdamW steps x 2 micro-batches under
  # torchrun (5 steps; make test-full 20), 4 ranks on gloo, FSDP and HSDP
  # 2x2, every collective and copy from the plan's host library, bit for
  # bit against fully_shard.
  train_steps=$(tiered 5 20)
  train_what="training driven by the plan on CPU: torchtitan's llama3, $train_steps AdamW steps, FSDP and HSDP 2x2 under torchrun, bit-identical to its own parallelize_llama (tests/python/train_cpu.py)"
  if [ "$live_rc" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ]; then
    run "$train_what" timeout 900 "$live_py" tests/python/train_cpu.py "$(dirname "$live_py")/torchrun" --steps "$train_steps"
    grep -ah "^ok \|^FAIL\|host time per step\|^train_cpu: " "$(logname "$train_what")" | sed "s/^/        /"
    full_adds "$train_steps AdamW steps per mesh; make test-full trains 20"
  else
    skipped "$train_what" "no torch environment with torchrun (make torch-env)"
  fi
  # Expert parallelism through the host library (HostLibrary's exchange_tokens,
  # its all-to-alls dist.all_to_all_single on gloo): the 4-rank EP test plans'
  # library calls in the plan's order under torchrun, every row and count
  # checked on every rank (tests/python/ep_library.py; 77: SKIP).
  eplib_what="expert parallelism through the host library under torchrun: ep2_mixtral and ep4_mixtral_efsdp1's calls and token exchanges in the plan's order on gloo, every row and count checked on 4 ranks (tests/python/ep_library.py)"
  if [ "$live_rc" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ]; then
    eplib_f=$(logname "$eplib_what")
    timeout 600 "$live_py" tests/python/ep_library.py "$(dirname "$live_py")/torchrun" >"$eplib_f" 2>&1
    case $? in
      0) ok "$eplib_what"; grep -ah "^ok \|^FAIL\|^ep_library_py: " "$eplib_f" | sed "s/^/        /" ;;
      77) skipped "$eplib_what" "$(sed -n 's/^SKIP ep_library_py: //p' "$eplib_f" | head -n 1)" ;;
      *) bad "$eplib_what" "$eplib_f" ;;
    esac
  else
    skipped "$eplib_what" "no torch environment with torchrun (make torch-env)"
  fi
  # ---- hang diagnosis against the plan (issue 40) ----
  # Provoked faults, FSDP2 on gloo under torchrun (4 ranks) with Flight
  # Recorder on: each job's dumps diagnosed against the plan (python -m
  # commplan.diagnose) and torch's fr_trace.py run on the same dumps, its
  # verdict printed beside (tests/diagnose/faults.py; quick tier: a rank
  # skipping a unit's all-gather and a rank killed mid-step).
  run "hang diagnosis without torch: dumps made from the expected trace (agreement, a wrong plan, a skipped op, a rank behind, a missing rank) and hostile dumps refused in one line (tests/python/test_diagnose.py)" \
    python3 tests/python/test_diagnose.py
  diag_what="hang diagnosis: provoked faults (FSDP2 on gloo, 4 ranks, Flight Recorder dumps) diagnosed against the plan, fr_trace.py's verdict beside (tests/diagnose/faults.py)"
  if [ "$live_rc" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ]; then
    run "$diag_what" timeout 900 "$live_py" tests/diagnose/faults.py --tier "$tier"
    grep -ah "^fault \|^diagnose faults: \|fr_trace.py with" "$(logname "$diag_what")" | sed "s/^/        /"
    full_adds "skip_unit and kill; make test-full adds none, shape, micro, slow, withhold_counts and pp_schedule"
  else
    skipped "$diag_what" "no torch environment with torchrun (make torch-env)"
  fi
  cursor_what="the runtime's cursor: fsdp4's --simulate signalled (SIGUSR1), every rank's step and op written and diagnosed against the plan (tests/diagnose/cursor_check.sh)"
  if [ -x build/fsdp4/fsdp4 ]; then
    run "$cursor_what" tests/diagnose/cursor_check.sh build/fsdp4/fsdp4 plans/fsdp4.lua
  else
    skipped "$cursor_what" "build/fsdp4/fsdp4 not built (make PLAN=plans/fsdp4.lua)"
  fi
  # COMMPLAN_TEST_FAULT's values: malformed or out-of-range ones refused at the executor's init (hfix)
  fv_what="COMMPLAN_TEST_FAULT's malformed and out-of-range values refused in one line, a valid one fires (tests/fault_values.sh)"
  if [ -x build/fsdp4/fsdp4 ]; then
    run "$fv_what" tests/fault_values.sh build/fsdp4/fsdp4
  else
    skipped "$fv_what" "build/fsdp4/fsdp4 not built (make PLAN=plans/fsdp4.lua)"
  fi
  # The same faults under commplan's own runtime (host backend: every rank a
  # thread of --simulate; COMMPLAN_TEST_FAULT provokes each, the job's first
  # failure or timeout writes every rank's cursor, diagnose names rank, op
  # and cause; tests/diagnose/runtime_faults.py, no torch, ~10 s).
  rtf_what="hang diagnosis under commplan's runtime: faults provoked in the host backend (a skipped all-gather, a wrong size, a micro-step count, a dead rank, a pipeline send left out, a withheld expert-count exchange), the cursors of the first failure diagnosed (tests/diagnose/runtime_faults.py)"
  run "$rtf_what" timeout 600 python3 tests/diagnose/runtime_faults.py --tier "$tier"
  grep -ah "^fault \|^runtime faults: " "$(logname "$rtf_what")" | sed "s/^/        /"
  # ... and under the bridge: HostLibrary's executor in each of 4 torchrun
  # processes, gloo's collectives; each process's cursor written on its
  # failure, on SIGABRT (gloo) or as torchrun stops it (SIGTERM)
  # (tests/diagnose/bridge_faults.py; quick tier: a rank killed mid-step).
  bf_what="hang diagnosis under the bridge: faults provoked in HostLibrary's executor under torchrun (4 ranks, gloo), each process's cursor diagnosed (tests/diagnose/bridge_faults.py)"
  if [ "$live_rc" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ]; then
    run "$bf_what" timeout 600 "$live_py" tests/diagnose/bridge_faults.py --tier "$tier" --torchrun "$(dirname "$live_py")/torchrun"
    grep -ah "^fault \|^bridge faults: " "$(logname "$bf_what")" | sed "s/^/        /"
    full_adds "kill; make test-full adds skip_unit and shape"
  else
    skipped "$bf_what" "no torch environment with torchrun (make torch-env)"
  fi
  # ---- end of hang diagnosis ----
  # Expert counts fuzzed where they enter the libraries (the C call and
  # HostLibrary.set_expert_counts), 4 ranks on gloo, after ep_library.py
  # built the library (tests/fuzz_ep_counts.py, fixed seed; 77: SKIP).
  fze_s=$(tiered 3 20) fze_n=$(tiered 200 1500)
  fze_what="fuzz: EP expert counts through the C library and Python, $fze_s s and at least $fze_n cases on 4 ranks: exact or refused with the rank still in the exchange (tests/fuzz_ep_counts.py, fixed seed)"
  if [ "$live_rc" = 0 ]; then
    fze_f=$(logname "$fze_what")
    timeout 900 "$live_py" tests/fuzz_ep_counts.py --seconds "$fze_s" --min-cases "$fze_n" >"$fze_f" 2>&1
    case $? in
      0) ok "$fze_what"; grep -ah "^fuzz_ep_counts: " "$fze_f" | sed "s/^/        /" ;;
      77) skipped "$fze_what" "$(sed -n 's/^SKIP fuzz_ep_counts: //p' "$fze_f" | head -n 1)" ;;
      *) bad "$fze_what" "$fze_f" ;;
    esac
    full_adds "$fze_s s and at least $fze_n cases; make test-full fuzzes 20 s and at least 1500"
  else
    skipped "$fze_what" "no torch environment (make torch-env)"
  fi
  # The bridge's torchrun checks below share one launch (tests/python/bridge_harness.py suite):
  # each script prepares its plans as it does alone, then one torchrun of 4 ranks runs their
  # workers in turn (torch and torchtitan imported once, not seven times); bridge_check reads
  # each script's log and exit status from it. BRIDGE_SUITE=0 runs each script alone.
  bridge_dir=$log/bridge_suite
  rm -rf "$bridge_dir"
  if [ "${BRIDGE_SUITE:-1}" = 1 ] && [ "$live_rc" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ]; then
    bridge_t0=$SECONDS
    timeout 3600 "$live_py" tests/python/bridge_harness.py suite "$(dirname "$live_py")/torchrun" "$bridge_dir" \
      test_bridge_dtypes.py test_bridge_checkpoint.py test_bridge_train.py test_bridge_overlap.py \
      test_bridge_tp.py train_titan_matrix.py test_bridge_ac.py >"$log/bridge_suite.log" 2>&1
    bridge_secs=$((SECONDS - bridge_t0))
  fi
  # bridge_check NAME TAG SECONDS SCRIPT: one of the bridge's torchrun checks
  # (tests/python/<SCRIPT>, 4 ranks on gloo against fully_shard): ok with
  # its "TAG: " lines and its quick-tier line, SKIP (77) or FAIL.
  bridge_check() {
    local what=$1 tag=$2 secs=$3 script=$4 f t0 rc n=${4%.py}
    if [ "$live_rc" != 0 ] || [ ! -x "$(dirname "$live_py")/torchrun" ]; then
      skipped "$what" "no torch environment with torchrun (make torch-env)"; return
    fi
    f=$(logname "$what"); t0=$SECONDS
    if [ -f "$bridge_dir/$n.exit" ]; then  # run by the suite above: its seconds, its worker's included
      cp "$bridge_dir/$n.log" "$f"; rc=$(cat "$bridge_dir/$n.exit"); t0=$((SECONDS - $(cat "$bridge_dir/$n.secs")))
    else
      timeout "$secs" "$live_py" "tests/python/$script" "$(dirname "$live_py")/torchrun" >"$f" 2>&1; rc=$?
    fi
    case $rc in
      0) ok "$what" $((SECONDS - t0)); grep -ah "^$tag: " "$f" | sed "s/^/        /"; tier_line "$f" ;;
      77) skipped "$what" "$(sed -n "s/^SKIP $tag: //p" "$f" | head -n 1)" ;;
      *) bad "$what" "$f" ;;
    esac
  }
  # The bridge over every dtype x accumulation combination (issue 42): fp32 /
  # bf16 / fp16 parameters, param_dtype and reduce_dtype, every mode of
  # grad_accumulation, each against fully_shard on gloo bit for bit
  # (tests/python/test_bridge_dtypes.py; quick tier: one case).
  bridge_check "the bridge (CommplanFSDP over the host library) over dtype x reduce dtype x accumulation mode vs fully_shard on gloo, 4 ranks under torchrun (tests/python/test_bridge_dtypes.py)" \
    bridge_dtypes 1800 test_bridge_dtypes.py
  # Checkpoints (issue 36, item 3): the bridge's state_dict / load_state_dict
  # in fully_shard's DTensor form, DCP saves from fully_shard loaded into the
  # bridge and the reverse (FSDP 4; FSDP 4 -> HSDP 2x2 and -> Shard(1)),
  # training continued bit for bit (~20 s).
  bridge_check "checkpoints: the bridge's state dicts in fully_shard's DTensor form, DCP round trips both ways and resharded, training continued bit-identically, on gloo, 4 ranks under torchrun (tests/python/test_bridge_checkpoint.py)" \
    bridge_checkpoint 900 test_bridge_checkpoint.py
  # The bridge's clipping by the global norm, eval forwards under no_grad /
  # inference_mode and the plan's root= error (issue 36): FSDP and HSDP
  # against fully_shard + torch.nn.utils.clip_grad_norm_ bit for bit (~20 s).
  bridge_check "the bridge's clipping by the global norm and eval forwards vs fully_shard, and its root= error, on gloo, 4 ranks under torchrun (tests/python/test_bridge_train.py)" \
    bridge_train 900 test_bridge_train.py
  # FSDP x TP through the bridge (issue 36, item 2): torchtitan's llama3 under
  # its own TP (SP, loss_parallel, spmd_types) with CommplanFSDP in place of
  # fully_shard, against torchtitan + fully_shard bit for bit: losses, clipped
  # global norms, sharded grads and params, eval forwards between steps
  # (no_grad / inference_mode: logits, loss, the temporaries' SPMD types), DCP
  # round trips both ways, refusals and a mutant (quick tier: FSDP 2 x TP 2, vocab 250, 3 steps;
  # full: + vocab 251 (uneven TP), HSDP 2 x 2 x TP 2 on 8 ranks, 20 steps).
  bridge_check "FSDP x TP through the bridge: torchtitan's TP + CommplanFSDP vs torchtitan's TP + fully_shard, clipping and DCP round trips, on gloo under torchrun (tests/python/test_bridge_tp.py)" \
    bridge_tp 1800 test_bridge_tp.py
  # Overlap (issue 36, item 1): the bridge's split calls (unshard issue/wait,
  # reductions left in flight) with gloo's asynchronous collectives, FSDP and
  # HSDP against fully_shard bit for bit, the prefetch seen in flight across
  # a neighbour's backward, an early issue refused by the library (~20 s).
  bridge_check "overlap: the bridge's prefetched unshards and in-flight reductions (split library calls, async gloo) vs fully_shard bit for bit, an early issue refused, 4 ranks under torchrun (tests/python/test_bridge_overlap.py)" \
    bridge_overlap 900 test_bridge_overlap.py
  # torchtitan's own training step with the bridge in place of fully_shard
  # (issue 36, item 4): Trainer.train_step on its llama3 debug model, FSDP /
  # HSDP / FSDP x TP / HSDP x TP x selective / full AC x ChunkedLossWrapper,
  # clipping on, 2 micro-batches a step, DCP round trips both ways, every
  # loss, norm, shard and gradient bit for bit; a config whose bridge
  # support is missing prints SKIP naming it (quick tier: HSDP x selective AC
  # x ChunkedLossWrapper with its DCP round trips, at 4 steps; make test-full:
  # the whole matrix at 20 steps, ~10 min).
  bridge_check "torchtitan's training step (Trainer.train_step: its loss, accumulation, clip_grad_norm_, optimizer container) with the bridge vs its own parallelize, the configuration matrix and DCP round trips, on gloo under torchrun (tests/python/train_titan_matrix.py)" \
    train_titan_matrix 2400 train_titan_matrix.py
  # Activation checkpointing (torchtitan's FullAC, per-op SelectiveAC,
  # every-k-th-block) and ChunkedLossWrapper through the bridge (issue 36,
  # item 2): torchtitan's llama3 under its own parallelize + fully_shard vs
  # CommplanFSDP, every loss, sharded parameter, gradient and FSDP collective
  # identical, and an eval forward between steps (no_grad; ChunkedLossWrapper's
  # chunked forward only) identical (tests/python/test_bridge_ac.py; quick
  # tier: 1 of its 8 cases).
  bridge_check "activation checkpointing (full, selective, every k-th block) and ChunkedLossWrapper through the bridge vs torchtitan's parallelize + fully_shard, on gloo, 4 ranks under torchrun (tests/python/test_bridge_ac.py)" \
    bridge_ac 1800 test_bridge_ac.py
  [ -z "${bridge_secs:-}" ] || printf '        the seven bridge checks above: their workers in one torchrun (tests/python/bridge_harness.py suite), %d s in all; the seconds above are each its preparation and worker\n' "$bridge_secs"
  # The suite's own check (tests/python/test_bridge_harness.py): toy scripts through one torchrun,
  # each worker's output and exit status handed back, a worker failing on one rank failing its
  # script alone (the next one run in a fresh torchrun), a SKIP kept. make test-full only: make test
  # runs the suite itself above.
  if [ "$tier" = full ]; then
    bridge_check "the bridge suite: toy scripts through one torchrun, output and exit status handed back, a failing worker failing alone, a SKIP kept (tests/python/test_bridge_harness.py)" \
      bridge_harness 600 test_bridge_harness.py
  fi
  # Issue 41 (hmtp3, hmtp4): a plan whose forward calls a unit more than once per micro-batch
  # (model.num_mtp_layers > 0): plan.json's forward_calls, and the bridge driving it with per-call
  # hooks vs torchtitan's fully_shard on gloo (tiny DeepSeek-V3, num_mtp_layers 1, FSDP 4, 2 steps,
  # blocking and overlapped; the one-forward plan refused) (tests/python/test_bridge_mtp.py; ~1 min).
  bridge_check "the bridge drives a DeepSeek-V3 multi-token-prediction plan (a unit called twice per micro-batch) with per-call hooks: collectives and gradients vs torchtitan's fully_shard on gloo, 4 ranks under torchrun, the one-forward plan refused (tests/python/test_bridge_mtp.py)" \
    bridge_mtp 600 test_bridge_mtp.py

  section "Python package with PyTorch: runtime hooks, torchtitan's TP live (tests/python/test_runtime_host.py, tests/tp_record.py)"
  if command -v python3 >/dev/null 2>&1; then
    py_torch=""
    # The live peer's pinned environment first (built above), then the system's.
    py_cands=(python3 /usr/bin/python3); [ "${live_rc:-1}" = 0 ] && py_cands=("$live_py" "${py_cands[@]}")
    for py in "${py_cands[@]}"; do
      if "$py" -c 'import torch' >/dev/null 2>&1; then py_torch=$py; break; fi
    done
    if [ -n "$py_torch" ]; then
      run "python: runtime hooks on one-rank plans vs plain AdamW training, bit for bit (host stand-in library, $py_torch)" "$py_torch" tests/python/test_runtime_host.py
    else skipped "python: runtime hooks vs plain training (tests/python/test_runtime_host.py)" "torch is not installed (apt-get install python3-torch)"; fi
    # torchtitan's TP recorded live (tests/tp_record.py): its llama3 and dense
    # qwen3 (tied and untied) under its own parallelize_llama / parallelize_qwen3
    # (TP with and without sequence parallelism, FSDP2 over dp_shard 1 and 2)
    # and its loss_parallel cross-entropy on gloo, 2 and 4 ranks; every TP
    # collective in order and every parameter's placements and TP-local shape
    # against the plan's.
    # record_check WHAT TAG SCRIPT: a TP recording script run with the torch environment's python:
    # exit 0 ok (its "TAG: N..." lines and quick-tier line shown), "SKIP TAG: why" SKIP, else FAIL.
    record_check() {
      local what=$1 tag=$2 out rc f
      if [ "${live_rc:-1}" = 0 ]; then out=$(timeout 900 "$live_py" "$3" 2>&1); rc=$?
      else out="SKIP $tag: no torch environment with torchtitan (make torch-env)"; rc=0; fi
      case $out in
        SKIP*) skipped "$what" "${out#SKIP "$tag": }" ;;
        *) f=$(logname "$what"); printf '%s\n' "$out" >"$f"
           if [ "$rc" = 0 ]; then ok "$what"; else bad "$what" "$f"; fi
           grep -h "^$tag: [0-9]" "$f" | sed "s/^/        /"; tier_line "$f" ;;
      esac
    }
    record_check "torchtitan's TP collectives and placements live (llama3, qwen3; SP on/off, 2 and 4 ranks, loss_parallel) vs the plan's, in order (tests/tp_record.py)" \
      tp_record tests/tp_record.py
    # Generic decoders from a config.json under TP (issue 37, tests/tp_generic_record.py):
    # Qwen2's q/k/v biases, Llama's attention_bias / mlp_bias and tied embeddings, written by
    # commplan.hf_config, parallelized by torch's own TP styles as torchtitan's Llama plan applies
    # them and fully_shard on gloo; every TP collective in order and every parameter's placements
    # and TP-local shape against the plan's (quick tier: 2 of its 6 configs).
    record_check "generic decoders (biases, tied embeddings) under torch's TP styles + FSDP2 live vs the plan's TP collectives and placements (tests/tp_generic_record.py)" \
      tp_generic_record tests/tp_generic_record.py
  else skipped "python package tests with PyTorch" "python3 not found"; fi

}
# The pipeline and expert-parallel checks against live torch and torchtitan
# (below): a lane of their own (pp_lane), started when the foreground
# reaches the emulator (lane_start pp there), so that the torch lane, this
# lane and the foreground end near the same time on 2 cores instead of the
# torch lane running on alone; its output is printed after the torch lane's.
# Its builds go to build/pp/, build/ep/ and build/gen/pp_titan_* only.
pp_lane() {
  # ---- pipeline schedules vs live torch (issue 22) ----
  section "pipeline parallel vs live torch and torchtitan (tests/pp/check_live.sh)"
  # script_check WHAT PREFIX SCRIPT [FILTER]: a tests/pp script run with the torch
  # environment's python: exit 0 ok (its "PREFIX: " lines but FILTER shown),
  # 77 SKIP with its "SKIP PREFIX: " reason, anything else FAIL
  script_check() {
    # (its log file: not "log", make test's log directory)
    local what=$1 prefix=$2 script=$3 filter=${4:-^$} file rc t0=$SECONDS
    file=$(logname "$what")
    PYTHON="${live_py:-}" timeout 300 "$script" >"$file" 2>&1; rc=$?
    case $rc in
      0) ok "$what" $((SECONDS - t0)); grep -h "^$prefix: " "$file" | grep -v "$filter" | sed "s/^/        /"; tier_line "$file" ;;
      77) skipped "$what" "$(sed -n "s/^SKIP $prefix: //p" "$file" | head -n 1)" ;;
      *) bad "$what" "$file" ;;
    esac
  }
  script_check "pp schedules and stages: gen/parallel/pp_schedule.lua vs torch 2.15's pipelining, pp_stages.lua vs torchtitan's split, whole matrix (tests/pp/check_live.sh)" \
    pp-live tests/pp/check_live.sh "cases match torch 2"
  # torch.distributed.pipelining run for real on gloo (one step per case,
  # fully_shard per stage): every rank's point-to-point ops and per-stage
  # FSDP collectives, in order, against gen/parallel/pp_sequence.lua
  script_check "pp run: torch.distributed.pipelining + fully_shard on gloo, every schedule, each rank's p2p and FSDP collectives vs gen/parallel/pp_sequence.lua (tests/pp/check_pipeline_live.sh)" \
    pp-run tests/pp/check_pipeline_live.sh "recorded"
  # torchtitan's own pipeline_llm on gloo beyond llama (issue 35): PP x EP on
  # its DeepSeek-V3 (quick tier), PP on qwen3 (full tier): every rank's p2p,
  # FSDP collectives and token all-to-alls in order vs commplan's tables, and
  # every reduced gradient shard vs the plan's --simulate --pattern oracle
  script_check "pp on torchtitan's models: pipeline_llm on gloo, PP x EP (DeepSeek-V3; gpt-oss in the full tier) and gpt-oss PP x TP (full tier), two wrong plans each differ, and PP on qwen3, each rank's p2p, FSDP collectives and all-to-alls vs the pipeline tables, reduced gradients element for element (tests/pp/check_titan_pp.sh)" \
    pp-titan tests/pp/check_titan_pp.sh "^pp-titan: [a-z0-9_]* equal"
  # issue 41: torchtitan's fsdp_reshard_after_forward = "always" under PP
  # (pipeline_llm on qwen3, pp 2 x dp_shard 2; 1F1B, the full tier
  # Interleaved1F1B too): every microbatch's forward and backward gather
  # again, in order vs the pipeline tables, reduced gradients element for
  # element, and the "default" policy's plan as a mutant differs
  # (full tier only: ~90 s; the quick tier holds "always" under PP live through
  # check_pipeline_live.sh's always mesh, torch's pipelining + fully_shard)
  if [ "$tier" = full ]; then
    script_check "pp under torchtitan's \"always\" reshard policy: pipeline_llm on gloo (qwen3, pp 2 x dp_shard 2), each rank's p2p and per-microbatch FSDP collectives vs the pipeline tables, reduced gradients element for element, the \"default\" policy's plan differs (tests/pp/check_titan_pp_always.sh)" \
      pp-titan tests/pp/check_titan_pp_always.sh "^pp-titan: [a-z0-9_]* equal"
  else
    full_adds "torchtitan's pipeline_llm under the \"always\" reshard policy (tests/pp/check_titan_pp_always.sh: qwen3 1F1B and Interleaved1F1B, DeepSeek-V3 PP x EP) runs in make test-full; here \"always\" under PP is held by check_pipeline_live.sh's always mesh"
  fi
  # torchtitan 0.3's expert parallelism run for real on gloo (its DeepSeek-V3
  # decoder, tiny; ep 2 and 4, FSDP over efsdp, Shard(1); ep 2 with tp 2 under
  # torchtitan's MoE TP plan, on DeepSeek-V3 and on its Qwen3 MoE decoder
  # (qwen3_moe; mixtral's and the other TP meshes under the full tier)): every rank's
  # collectives and token all-to-alls in order, and every local shard, vs
  # commplan's tables; every reduced gradient shard (unsharded gradients made
  # commplan's oracle pattern) vs the plan's --simulate --dump, element for
  # element (tests/ep/check_ep_live.sh)
  script_check "ep run: torchtitan's expert parallel + fully_shard on gloo, ep 2 and 4, with and without activation checkpointing (its recompute's all-to-alls), ep 2 with tp 2 (its MoE TP plans, deepseek_v3 and qwen3_moe), gpt-oss dp 2 x tp 2 (its bias gradients Partial over TP, two wrong plans refused), each rank's FSDP and TP collectives, token all-to-alls, shards and reduced gradients vs commplan's tables and simulation (tests/ep/check_ep_live.sh)" \
    ep-live tests/ep/check_ep_live.sh "events per rank"
}
# ---- end of the torch lane and the pp lane ----

# lane_start NAME FUNC: FUNC in the background, its output and counts kept;
# lane_join NAME: wait for it, print its output, add its counts.
declare -A lane_pid=()
mkdir -p "$log/lanes"
lane_start() {
  local name=$1; shift
  rm -f "$log/lanes/$name.out" "$log/lanes/$name.counts"
  # shellcheck disable=SC2030  # the lane's own counts, handed back through the file
  ( pass=0 fail=0 skip=0; "$@"; printf '%d %d %d\n' "$pass" "$fail" "$skip" >"$log/lanes/$name.counts" ) \
    >"$log/lanes/$name.out" 2>&1 &
  lane_pid[$name]=$!
}
lane_join() {
  local name=$1 rc p f s
  wait "${lane_pid[$name]}"; rc=$?
  unset "lane_pid[$name]"
  cat "$log/lanes/$name.out"
  if read -r p f s 2>/dev/null <"$log/lanes/$name.counts"; then
    # shellcheck disable=SC2031
    pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
  else
    echo "exit status $rc; the lane ended without its counts" >>"$log/lanes/$name.out"
    bad "the $name lane did not finish (its checks above are not counted)" "$log/lanes/$name.out"
  fi
}
# A lane's processes go when make test does (interrupted or not).
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null; }
lane_cleanup() { local p; for p in "${lane_pid[@]}"; do kill_tree "$p"; done; }
trap lane_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# What the torch lane shares with the foreground, built first: the runtime's
# C objects (every plan's build links them; the lane's first builds, live.py's,
# link only these) before the lane starts, then fsdp4 / hsdp2x2 (torchrun's)
# and the GPU objects nvcc compiles, here in the foreground while the lane
# starts; the lane waits for their status file (lane_prebuild_wait) before
# its first build that links the GPU objects (torchtitan's checks).
lane_prebuilt=0
rm -f "$log/lanes/prebuild.rc"
$MAKE runtime-objs >"$log/lanes/prebuild.log" 2>&1 || lane_prebuilt=1
lane_t0=$SECONDS
lane_start torch torch_lane
{ $MAKE PLAN=fsdp4.lua && $MAKE PLAN=hsdp2x2.lua; } >>"$log/lanes/prebuild.log" 2>&1
echo $? >"$log/lanes/prebuild.rc.new" && mv -f "$log/lanes/prebuild.rc.new" "$log/lanes/prebuild.rc"
printf '== the torch lane runs in the background from here (live FSDP2, torchtitan, torchrun, train_cpu, tp_record, runtime hooks); its output comes at the end  [%ds]\n' "$SECONDS"

section "lint and generator unit tests"
if command -v luacheck >/dev/null 2>&1; then run "luacheck gen tests plans bench" luacheck -q gen tests/lua tests/plans tests/oracle_check.lua tests/pp tests/ep plans bench
else skipped "luacheck" "not installed (apt-get install lua-check)"; fi
run "lua unit tests" $LUA tests/lua/run.lua
full_adds "llama405b_hsdp's, deepseek_v3's and mixtral8x7b's outputs agree without their advice, ep explored on gpt-oss 20B (tests/lua/test_agree.lua, test_audit.lua); make test-full checks their advice and mixtral's ep exploration too"
# Issue 37, item 3: torchtitan's published rows (benchmarks/llama3_h100_202412
# Tables 1 and 3, the asyncTP study), each plan's predicted tokens/s per GPU
# within 15% of its published one; every row printed, predicted / published.
cr="published torchtitan rows: predicted tokens/s per GPU within 15% of each (tests/compute_rows.lua)"
run "$cr" $LUA tests/compute_rows.lua; grep -h "^[0-9]*B \|^compute_rows:" "$(logname "$cr")" | sed "s/^/        /"
fzp_s=$(tiered 5 20) fzp_n=$(tiered 150 1000)
fzp="fuzz: random and mutated plan files for $fzp_s s and at least $fzp_n (tests/fuzz_plans.lua, fixed seed)"
run "$fzp" timeout 600 $LUA tests/fuzz_plans.lua --seconds "$fzp_s" --min-inputs "$fzp_n"; grep -h "^fuzz: [0-9]" "$(logname "$fzp")" | sed "s/^/        /"
full_adds "$fzp_s s and at least $fzp_n inputs; make test-full fuzzes 20 s and at least 1000"
# The surfaces added since (pipeline fields and CSVs, network figures and
# presets, expert parallelism's fields, diff-plan's operands and --svg
# outputs), each input through the CLI under a time and memory limit
# (tests/fuzz_surfaces.lua, fixed seed).
fzs_s=$(tiered 5 30) fzs_n=$(tiered 120 800)
fzs="fuzz: pipeline fields and CSVs, network figures, EP fields, diff-plan operands and outputs for $fzs_s s and at least $fzs_n inputs through the CLI (tests/fuzz_surfaces.lua, fixed seed)"
run "$fzs" timeout 900 $LUA tests/fuzz_surfaces.lua --seconds "$fzs_s" --min-inputs "$fzs_n"; grep -h "^fuzz-surfaces: [0-9]" "$(logname "$fzs")" | sed "s/^/        /"
full_adds "$fzs_s s and at least $fzs_n inputs; make test-full fuzzes 30 s and at least 800"

section "golden: committed plans/*/ equal a fresh generation"
run "plan file names in plans/ are [A-Za-z0-9_]+.lua" check_plan_names
# A plan whose golden check passed is generated: plans/<n>/ is what this
# generator writes from plans/<n>.lua now. golden_stamp records that as
# make's own stamps (build/<n>/.source as make writes it, .generated, an
# empty .fit: only for a plan whose plan.json says it fits, the generator
# prints nothing for it), so the end-to-end builds below compile these
# tables without generating each plan a second time. A plan already built
# (the torch lane's fsdp4 / hsdp2x2, an earlier run's) is left to make.
golden_stamp() {
  local n=$1 b=build/$1
  [ ! -e "$b/.generated" ] && [ ! -e "$b/.source" ] || return 0
  [ "$(grep -c '"fits": true' "plans/$n/plan.json")" = 1 ] && ! grep -q '"fits": false' "plans/$n/plan.json" || return 0
  mkdir -p "$b" && { printf '%s\n' "$(pwd -P)/plans/$n.lua" "plans/$n"; cksum <"plans/$n.lua"; } >"$b/.source" &&
    : >"$b/.fit" && touch "$b/.generated"
}
golden_one() { $LUA gen/commplan.lua --check "plans/$1.lua" "plans/$1" && golden_stamp "$1"; }
for n in $(plan_names); do
  run "golden $n" golden_one "$n"
done
# (the golden checks above are each plan's first generation, held equal to
# plans/<n>/: a second one must equal plans/<n>/ too, byte for byte)
run "generation is deterministic (llama405b_hsdp and the pipeline plan llama405b: generated again, equal to their golden-checked plans/<n>/)" bash -c "
  rm -rf build/det && for n in llama405b_hsdp llama405b; do $LUA gen/commplan.lua plans/\$n.lua build/det/\$n &&
  diff -r plans/\$n build/det/\$n || exit 1; done"
# Issue 34, item 4: the golden checks above prove plans/<name>/ equal a
# fresh generation, so the committed tables stand for this generator here
# (nothing generated twice): every one against the reference generation
# (tests/byte_identity.lua's base), byte for byte, plan.json but its audit
# section by section, a pipeline plan's plan.json op tables field by field.
bi_base=$(sed -n 's/^local DEFAULT_BASE = "\(.*\)"$/\1/p' tests/byte_identity.lua)
bid="byte identity: every plan's plan.c, plan.h, plan.json (but its audit) as $bi_base generated them (pipeline plans: their per-rank op tables field by field) (tests/byte_identity.lua)"
run "$bid" $LUA tests/byte_identity.lua; grep -h "^byte_identity: against" "$(logname "$bid")" | sed "s/^/        /"
# The test of that test: a temporary copy of fsdp4's and llama405b's tables
# with one byte of plan.c and one op's peer in plan.json changed is refused,
# naming the file, the pipeline rank, the op and the field; a base revision
# the clone lacks is one line saying how to fetch it (exit 2).
byte_identity_refuses() (
  d=$(mktemp -d /tmp/commplan-bi.XXXXXX) || exit 2
  trap 'rm -rf "$d"' EXIT
  for n in fsdp4 llama405b; do mkdir -p "$d/$n" && cp "plans/$n/plan.c" "plans/$n/plan.h" "plans/$n/plan.json" "$d/$n/" || exit 2; done
  sed -i 's/\.numel = 144, \.chunk = 3/.numel = 145, .chunk = 3/' "$d/fsdp4/plan.c" &&
    sed -i '0,/"peer": 1,/s//"peer": 2,/' "$d/llama405b/plan.json" || exit 2
  out=$($LUA tests/byte_identity.lua --dir "$d" fsdp4 llama405b); rc=$?; echo "$out"
  [ "$rc" = 1 ] && printf '%s\n' "$out" | grep -q "^$d/fsdp4/plan.c: not byte-identical to $bi_base's .*line [0-9]*, column [0-9]*: base .*numel = 144.*, now .*numel = 145" &&
    printf '%s\n' "$out" | grep -q "^$d/llama405b/plan.json: pipeline rank 0: ops: first difference at op [0-9]* (seq [0-9]*, [a-z_]* of [a-z_.0-9]*): field peer: base 1, now 2$" &&
    [ "$(printf '%s\n' "$out" | grep -c "^$d/")" = 2 ] || exit 1
  out=$($LUA tests/byte_identity.lua --base 0123456789abcdef0123456789abcdef01234567 fsdp4 2>&1); rc=$?; echo "$out"
  [ "$rc" = 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] &&
    printf '%s' "$out" | grep -qF "byte_identity: base revision 0123456789abcdef0123456789abcdef01234567 " &&
    printf '%s' "$out" | grep -qF "git fetch --unshallow"
)
run "byte identity's test: a changed plan.c byte and a changed pipeline op field fail, naming file, rank, op and field; a missing base says how to fetch it" byte_identity_refuses
# Issue 34, item 3: every shipped report reads in one sitting.
schedule_lines() {
  local n f c rc=0
  for n in $(plan_names); do
    f=plans/$n/SCHEDULE.md; c=$(wc -l <"$f") || { rc=1; continue; }
    [ "$c" -le 400 ] || { echo "$f: $c lines, over 400; fold its repeated units, experts, stages and micro-steps (the full lists belong in plan.json)"; rc=1; }
  done
  return $rc
}
run "every plans/*/SCHEDULE.md is at most 400 lines" schedule_lines

section "audit verbs: plan diff and mesh advisor (the Lua suite covers trace.json, the schema and 1M ranks)"
run "make diff-plan: llama70b against itself with dp_replicate halved" bash -c '
  mkdir -p build/audit && sed "s/dp_replicate = 16/dp_replicate = 8/" plans/llama70b.lua >build/audit/llama70b.lua &&
  out=$($1 diff-plan A=plans/llama70b.lua B=build/audit/llama70b.lua) && echo "$out" &&
  printf "%s" "$out" | grep -qF "dp_replicate: size 16 -> 8"' _ "$MAKE"
run "make diff-plan REV=HEAD B=plans/fsdp4.lua: the plan against its committed plan.json" $MAKE diff-plan REV=HEAD B=plans/fsdp4.lua
run "make diff-plan SVG=DIR refuses links planted in DIR (issue 33): one line from commplan, make fails, the linked SCHEDULE.md untouched" bash -c '
  d=build/audit/svg_links && rm -rf "$d" && mkdir -p "$d" && cp plans/fsdp4/SCHEDULE.md build/audit/victim.md &&
  ln -s ../victim.md "$d/before.svg" && ln -s ../victim.md "$d/after.svg" &&
  out=$($1 -s --no-print-directory diff-plan A=plans/fsdp4.lua B=plans/llama_tiny.lua SVG=$d 2>&1 >/dev/null); rc=$?; echo "$out"
  [ "$rc" != 0 ] && [ "$(printf "%s\n" "$out" | grep -c "symbolic link")" = 1 ] && cmp -s plans/fsdp4/SCHEDULE.md build/audit/victim.md' _ "$MAKE"
expect_rc "diff-plan: a revision name with shell syntax exits 2" 2 $LUA gen/verbs.lua diff 'HEAD$(id):plans/x/plan.json' plans/fsdp4.lua
run "make advise PLAN=llama8b.lua: a ranked table whose top choice is explained" bash -c '
  out=$($1 advise PLAN=llama8b.lua) && echo "$out" && printf "%s" "$out" | grep -qF "Top choice:"' _ "$MAKE"
run "make pipeline PLAN=bench/llama405b_pp.lua: torch's seven schedules proved (send/receive and the whole step) and timed side by side" bash -c '
  out=$($1 pipeline PLAN=bench/llama405b_pp.lua) && echo "$out" && [ "$(printf "%s\n" "$out" | grep -cE "^(GPipe|1F1B|Interleaved1F1B|LoopedBFS|InterleavedZeroBubble|ZBVZeroBubble|DualPipeV) +[0-9]+ ")" = 7 ] &&
  printf "%s" "$out" | grep -qE "^Interleaved1F1B .* <- the plan.s$" &&
  printf "%s" "$out" | grep -qE "^whole-step proof .*: Interleaved1F1B.s [0-9]+ events, .* cannot deadlock;"' _ "$MAKE"
expect_rc "pipeline: a plan without pp exits 2" 2 $LUA gen/verbs.lua pipeline plans/llama8b.lua
run "make diff-plan of two pipeline plans: a schedule change in a few lines" bash -c '
  mkdir -p build/pp && sed "s/Interleaved1F1B/ZBVZeroBubble/" bench/llama405b_pp.lua >build/pp/zbv_pp.lua &&
  out=$($1 -s diff-plan A=bench/llama405b_pp.lua B=build/pp/zbv_pp.lua) && echo "$out" &&
  printf "%s" "$out" | grep -qF "schedule: Interleaved1F1B -> ZBVZeroBubble" && printf "%s" "$out" | grep -q "^  bubble: .* -> " &&
  [ "$(printf "%s\n" "$out" | wc -l)" -le 12 ]' _ "$MAKE"
expect_rc "diff-plan: a pipeline plan against a plan without pp exits 2" 2 $LUA gen/verbs.lua diff bench/llama405b_pp.lua plans/llama8b.lua
run "make pipeline refuses, in one line naming file and field: the plan's own schedule refused by torch, micro_steps under pp, --csv over the plan file or a device" bash -c '
  mkdir -p build/pp && one() { out=$("$@" 2>&1 >/dev/null); rc=$?; echo "$out"; [ "$rc" = 2 ] && [ "$(printf "%s\n" "$out" | wc -l)" = 1 ]; }
  sed "s/Interleaved1F1B/DualPipeV/; s/microbatches = 16/microbatches = 8/; s/local_batch_size = 16/local_batch_size = 8/" bench/llama405b_pp.lua >build/pp/dpv8.lua &&
  one "$1" gen/verbs.lua pipeline build/pp/dpv8.lua | grep -q "dpv8.lua:[0-9]*: pipeline.schedule: DualPipeV refuses" &&
  sed "s/fsdp = {/fsdp = { micro_steps = 4,/" bench/llama405b_pp.lua >build/pp/ms4.lua &&
  one "$1" gen/verbs.lua pipeline build/pp/ms4.lua | grep -q "fsdp.micro_steps" &&
  cp bench/llama405b_pp.lua build/pp/self.lua && one "$1" gen/verbs.lua pipeline build/pp/self.lua --csv build/pp/self.lua | grep -q "the plan file itself" &&
  cmp -s bench/llama405b_pp.lua build/pp/self.lua &&
  one "$1" gen/verbs.lua pipeline build/pp/self.lua --csv /dev/null | grep -q "not a regular file"' _ "$LUA"
run "make pipeline CSV=...: the plan's schedule as torch's CSV, one row per rank, written whole" bash -c '
  mkdir -p build/pp && rm -f build/pp/llama405b_pp.csv && $1 -s pipeline PLAN=bench/llama405b_pp.lua CSV=build/pp/llama405b_pp.csv >/dev/null &&
  [ "$(wc -l <build/pp/llama405b_pp.csv)" = 8 ] && head -c 8 build/pp/llama405b_pp.csv | grep -q "^0F0,0F1," &&
  [ -z "$(ls build/pp/ | grep "llama405b_pp.csv.tmp")" ]' _ "$MAKE"
run "make pipeline CSV=... refuses GPipe (torch loads no CSV for one stage per rank), one line, nothing written" bash -c '
  sed "s/Interleaved1F1B/GPipe/" bench/llama405b_pp.lua >build/pp/gpipe_pp.lua && rm -f build/pp/gpipe.csv &&
  out=$("$1" gen/verbs.lua pipeline build/pp/gpipe_pp.lua --csv build/pp/gpipe.csv 2>&1); rc=$?; echo "$out"
  [ "$rc" = 2 ] && [ "$(printf "%s\n" "$out" | wc -l)" = 1 ] && printf "%s" "$out" | grep -q "pipeline.schedule: GPipe" &&
  [ ! -e build/pp/gpipe.csv ]' _ "$LUA"

section "runtime unit tests (cmocka, plain and ASan+UBSan)"
run "build cmocka tests" $MAKE build/tests/test_runtime build/tests-asan/test_runtime
run "cmocka runtime tests" build/tests/test_runtime
run "cmocka runtime tests under ASan+UBSan" build/tests-asan/test_runtime
run "build pipeline point-to-point tests" $MAKE build/tests/test_pp build/tests-asan/test_pp
run "pipeline sends/receives on the host backend: 2 and 4 stages, every message checked, tag mismatch, timeout, batches" \
  build/tests/test_pp
run "pipeline point-to-point tests under ASan+UBSan" build/tests-asan/test_pp
run "build expert-parallel all-to-all tests" $MAKE build/tests/test_a2a build/tests-asan/test_a2a
run "expert all-to-alls on the host backend: ep 2 and 4, drawn and given counts (zero, full, one past capacity refused), round trip, backward splits" \
  build/tests/test_a2a
run "expert all-to-all tests under ASan+UBSan" build/tests-asan/test_a2a
# Issue 39: a unit of mixed all-gather dtypes (FSDP2's uint8 all-gather): copies by byte offsets.
run "build mixed all-gather dtype tests" $MAKE build/tests/test_mixed build/tests-asan/test_mixed
run "mixed all-gather dtypes on the host backend: copy-in casts per parameter at byte offsets, copy-out by bytes (Shard(1) rows), arena bytes" \
  build/tests/test_mixed
run "mixed all-gather dtype tests under ASan+UBSan" build/tests-asan/test_mixed
run "mixed all-gather dtypes: tests/plans/mixed_ag.lua simulated under ASan+UBSan (all ranks, NCCL arithmetic, one rank with stand-in peers)" \
  bash -c "$MAKE build/tests-asan/mixed_ag && build/tests-asan/mixed_ag --simulate --steps 2 --quiet &&
    build/tests-asan/mixed_ag --simulate --steps 2 --arith nccl --pattern unique --quiet &&
    build/tests-asan/mixed_ag --simulate --steps 2 --ranks 1 --quiet"
run "host fast paths (copies, reductions, patterns) equal the per-element reference, every dtype triple, plain and ASan+UBSan (make test-fastpath)" \
  $MAKE test-fastpath
run "build rendezvous tests" $MAKE build/tests/test_rendezvous build/tests-asan/test_rendezvous
# The NCCL id channel tests mostly wait (hostile stores that hang, stall or
# never answer, timeouts run out: ~20 s each for ~1 s of CPU): a lane of
# their own beside the tests below, joined after the argv fuzz.
rendezvous_lane() {
  run "NCCL id channels: launcher env, shared id file (4 ranks), TCPStore client vs tests/fake_tcpstore.py" build/tests/test_rendezvous
  run "NCCL id channels under ASan+UBSan" build/tests-asan/test_rendezvous
}
lane_start rendezvous rendezvous_lane
run "build NCCL arithmetic tests" $MAKE build/tests/test_arith build/tests-asan/test_arith
run "NCCL arithmetic (ncclAvg premultiply, ring order) against worked values" build/tests/test_arith
run "NCCL arithmetic tests under ASan+UBSan" build/tests-asan/test_arith

# ---- issue 20: every input bounded, every output safe (runtime side) ----
# The one rule for the runtime's files (runtime/safeio.c), then fsdp4's
# binary against special files, symlinked outputs, a full stdout, launches
# that do not match the plan and flags the run would ignore
# (tests/cli_checks.sh), then its argv and environment fuzzed under
# ASan+UBSan (tests/fuzz_cli.py, fixed seed, bounded time). The hostile
# TCPStore modes run in the rendezvous tests above.
run "build safe-io tests" $MAKE build/tests/test_safeio build/tests-asan/test_safeio
run "safe io: FIFO, device, directory, socket and oversized reads refused; writes via an exclusive temporary, never through a symlink, every write checked" build/tests/test_safeio
run "safe io tests under ASan+UBSan" build/tests-asan/test_safeio
run "build fsdp4 and its ASan+UBSan binary (build/tests-asan/fsdp4_cli)" bash -c "$MAKE PLAN=fsdp4.lua && $MAKE build/tests-asan/fsdp4_cli"
for c in $(tests/cli_checks.sh --list); do
  run "binary hardening: $c (tests/cli_checks.sh)" timeout 120 tests/cli_checks.sh build/fsdp4/fsdp4 "$c"
done
if command -v python3 >/dev/null 2>&1; then
  fzc_s=$(tiered 4 15) fzc_n=$(tiered 300 2000)
  fzc="fuzz: the binary's argv and environment for $fzc_s s and at least $fzc_n cases under ASan+UBSan (tests/fuzz_cli.py, fixed seed)"
  run "$fzc" timeout 300 python3 tests/fuzz_cli.py build/tests-asan/fsdp4_cli --seconds "$fzc_s" --min-cases "$fzc_n" --seed 20
  grep -h "^fuzz-cli: " "$(logname "$fzc")" | sed "s/^/        /"
  full_adds "$fzc_s s and at least $fzc_n cases; make test-full fuzzes 15 s and at least 2000"
else skipped "fuzz: the binary's argv and environment (tests/fuzz_cli.py)" "python3 not found"; fi
# ---- end of issue 20's runtime block ----
printf '  (the NCCL id channel tests, run beside the checks above since the rendezvous build)\n'
lane_join rendezvous

section "end to end: every small plan generated, built and simulated on all ranks"
for n in $(plan_names); do
  ! is_big_plan "$n" || continue
  run "build $n" $MAKE PLAN="$n.lua"
  run "simulate $n (2 steps, every rank)" "build/$n/$n" --simulate --steps 2
done
# The same plans with NCCL's arithmetic (ncclAvg premultiplies; ring order):
# the host backend and the checks' independent emulation must agree on it too.
for n in $(plan_names); do
  ! is_big_plan "$n" || continue
  run "simulate $n with NCCL's arithmetic (--arith nccl)" "build/$n/$n" --simulate --steps 2 --arith nccl --quiet
done
# tests/plans/kernels_all_dtypes.lua: every (orig, param, reduce) dtype
# triple (per-unit MixedPrecisionPolicy) on the vector and scalar copy paths,
# HSDP 2 x 3, micro-steps (make test-gpu runs it with all ranks). Generated
# under build/gen/, never plans/.
for f in tests/plans/kernels_*_*.lua; do
  n=$(basename "$f" .lua)
  run "build $n (tests/plans, into build/gen/$n)" $MAKE PLAN="$f" OUT="build/gen/$n"
  run "simulate $n (2 steps, every rank)" "build/$n/$n" --simulate --steps 2 --quiet
  run "simulate $n with NCCL's arithmetic" "build/$n/$n" --simulate --steps 2 --arith nccl --quiet
done
# tests/plans/moe_*.lua: the MoE families at ep = 1 (issue 23, item 1) -- a
# DeepSeek-V3-like model whose experts FSDP-shard on dim 1, a Mixtral-like one
# on HSDP with micro-steps. Generated under build/gen/, never plans/; the live
# FSDP2 comparison (live.py plans) runs them too.
for f in tests/plans/moe_*.lua; do
  n=$(basename "$f" .lua)
  run "build $n (tests/plans, into build/gen/$n)" $MAKE PLAN="$f" OUT="build/gen/$n"
  run "simulate $n (2 steps, every rank)" "build/$n/$n" --simulate --steps 2 --quiet
  run "simulate $n with NCCL's arithmetic" "build/$n/$n" --simulate --steps 2 --arith nccl --quiet
done
# Issue 39 (h39r): fully_shard(reshard_after_forward=k) -- tests/plans/*_raf2.lua, FSDP 4 and HSDP 2 x 4
# with k = 2: every rank's unsharded parameters in backward rebuilt from the post-forward groups' slices.
# Generated under build/gen/; the live FSDP2 comparison (live.py plans) and the emulator run them too.
for f in tests/plans/*_raf2.lua; do
  n=$(basename "$f" .lua)
  run "build $n (tests/plans, into build/gen/$n)" $MAKE PLAN="$f" OUT="build/gen/$n"
  run "simulate $n (2 steps, every rank)" "build/$n/$n" --simulate --steps 2 --quiet
  run "simulate $n with NCCL's arithmetic" "build/$n/$n" --simulate --steps 2 --arith nccl --quiet
done
# tests/ep/plans/*.lua: expert parallel (issue 23, items 3 and 4): ep 2 and 4,
# experts over efsdp of 2, 4 (Shard(1)) and 1 (no collective), HSDP with
# repeated micro-steps, a capacity factor. Not in tests/plans: live.py's FSDP2
# comparison does not model ep > 1. Simulated on every rank: every unsharded
# param, all-to-all row and reduced grad exact.
for f in tests/ep/plans/*.lua; do
  n=$(basename "$f" .lua)
  run "build $n (tests/ep/plans, into build/gen/$n)" $MAKE PLAN="$f" OUT="build/gen/$n"
  run "simulate $n (2 steps, every rank)" "build/$n/$n" --simulate --steps 2 --quiet
  run "simulate $n with NCCL's arithmetic" "build/$n/$n" --simulate --steps 2 --arith nccl --quiet
done
# One refusal stops the whole job (issue 33): ep2_mixtral's ep groups are {0,1}
# and {2,3}; rank 1's counts refused, ranks 2 and 3 must not wait for it in
# their next collective: exit 2 within seconds, rank 1's line printed once.
run "simulate ep2_mixtral with rank 1's expert counts refused: every rank of both ep groups stops at once, its line once" bash -c '
  out=$(COMMPLAN_A2A_OVERFLOW=1 timeout 20 build/ep2_mixtral/ep2_mixtral --simulate --steps 2 --quiet 2>&1); rc=$?
  printf "%s\n" "$out"
  [ "$rc" = 2 ] && [ "$(printf "%s\n" "$out" | wc -l)" = 1 ] &&
    printf "%s" "$out" | grep -q "^commplan: rank 1: op [0-9]* (a2a_counts of unit .*): .* exceed its capacity of"'
# Issue 42: a capacity factor's binary routes what its capacity admits and
# refuses one row past it, the capacity the exact ceiling the check computes.
run "ep4_mixtral_efsdp1: capacity ceil(1.5 x 12 / 4) = 5 rows: counts within it routed, 6 refused (tests/ep/capacity_sim.sh)" \
  env LUA="$LUA" tests/ep/capacity_sim.sh build/ep4_mixtral_efsdp1/ep4_mixtral_efsdp1 build/gen/ep4_mixtral_efsdp1/plan.json
run "kernel plan: all 27 (orig, param, reduce) triples, each on a vector and a scalar unit" $LUA -e '
  package.path = "./?.lua;" .. package.path
  local json, seen, triples = require("gen.json"), 0, {}
  local fh = assert(io.open("build/gen/kernels_all_dtypes/plan.json"))
  local plan = json.decode(fh:read("a")); fh:close()
  for _, u in ipairs(plan.units) do
    local path, o, P, R = u.name:match("^([vs])_(%w+)_(%w+)_(%w+)$")
    if path then
      assert(u.orig_dtype == o and u.ag_dtype == P and u.reduce_dtype == R, u.name .. ": dtypes")
      assert(u.vec_ok == (path == "v"), u.name .. ": wrong copy path")
      triples[o .. P .. R] = true
      seen = seen + 1
    end
  end
  local n = 0
  for _ in pairs(triples) do n = n + 1 end
  assert(n == 27, n .. " triples, want 27")
  assert(seen == 54, seen .. " units, want 27 triples x vector and scalar")'
# tests/gpu_ranks.sh (make test-gpu's launcher): per-rank environment, each
# rank's last line, and a failing rank fails the run. A stand-in command here.
run "gpu_ranks.sh gives each rank its own NCCL_HOSTID and torchrun variables" bash -c '
  out=$(tests/gpu_ranks.sh 3 sh -c "echo x; echo \$RANK/\$WORLD_SIZE/\$LOCAL_RANK \$NCCL_HOSTID \$MASTER_ADDR \$NCCL_SOCKET_IFNAME \$NCCL_IB_DISABLE") || exit 1
  echo "$out"
  [ "$out" = "rank 0: 0/3/0 commplan-rank0 127.0.0.1 lo 1
rank 1: 1/3/0 commplan-rank1 127.0.0.1 lo 1
rank 2: 2/3/0 commplan-rank2 127.0.0.1 lo 1" ]'
run "gpu_ranks.sh fails when one rank fails and names it" bash -c '
  out=$(TMPDIR=build tests/gpu_ranks.sh 3 sh -c "echo done \$RANK; [ \$RANK != 2 ] || exit 7"); rc=$?; echo "$out"
  [ "$rc" = 1 ] && printf "%s" "$out" | grep -qF "failed ranks: 2(exit 7)" && printf "%s" "$out" | grep -qxF "rank 2: done 2"'
for n in $BIG_PLANS; do
  run "build $n and print its schedule" bash -c "$MAKE PLAN=$n.lua >/dev/null && build/$n/$n --dry-run >/dev/null"
done
# ---- host-built copy kernels (issue 18, item 1) ----
# runtime/cp_kernels.cu and every small plan's plan_kernels.cu built with g++
# (tests/c/kernel_standin: a stand-in for the CUDA names they use), every
# copy op x rank on the real arena layout against the host reference
# (tests/c/test_kernels_host.cc): plain, and under ASan+UBSan taking the
# kernels' device load/store branch. Needs no nvcc and no GPU.
section "copy kernels built with g++: every copy op of every small plan, every rank, byte for byte vs the host reference"
run "build host-built kernel tests (plain and ASan+UBSan)" $MAKE -j2 build/tests/test_kernels_host build/tests-asan/test_kernels_host
khost_run() {  # NAME BINARY: the ok line carries the test's count
  local f; f=$(logname "$1")
  if "$2" >"$f" 2>&1; then ok "$1: $(sed -n 's/^kernels host summary: //p' "$f")"; else bad "$1" "$f"; fi
}
khost_run "host-built copy kernels (host loads/stores)" build/tests/test_kernels_host
khost_run "host-built copy kernels under ASan+UBSan (device loads/stores)" build/tests-asan/test_kernels_host
# ---- end of host-built copy kernels ----

section "CUDA: generated copy kernels (built with every plan above), checked against the host reference"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ -x "$NVCC" ]; then
  run "build kernel tests" $MAKE build/tests/test_kernels
  run "kernels (CPU run of the device code) equal the host executor" build/tests/test_kernels
  klog=$(logname "kernels (CPU run of the device code) equal the host executor")
  if grep -q '^SKIP' "$klog"; then
    skipped "device kernel launches (make test-gpu)" "$(sed -n 's/^SKIP device kernel launches: //p' "$klog")"
  fi
  run "docs/example.c builds against build/single/libsingle.a" $MAKE build/example/example
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    run "GPU binary without a device: one-line error, exit 2" bash -c '
      out=$(build/single/single --check 2>&1); rc=$?; echo "$out"
      [ "$rc" = 2 ] && printf "%s" "$out" | grep -qF "no CUDA device" && [ "$(printf "%s\n" "$out" | wc -l)" = 1 ]'
    skipped "make test-gpu (NCCL --check run, graph replay, device kernels)" "no NVIDIA GPU on this machine"
    skipped "make test-gpu: every small and kernel plan with all ranks on one GPU, --check eager and graph, 3 runs" \
      "no NVIDIA GPU on this machine"
    skipped "make test-gpu: GPU fsdp3 (all 3 ranks, --dump) vs the FSDP2-on-NCCL recording" "no NVIDIA GPU on this machine"
  fi
else
  skipped "CUDA kernels and the GPU backend" "nvcc not found at $NVCC"
fi

if command -v valgrind >/dev/null 2>&1; then
  run "valgrind: hsdp2x2 simulation has no leaks or errors" \
    valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=1 build/hsdp2x2/hsdp2x2 --simulate --quiet
  # (quick tier: llama_tiny_tp_nosp, 4 ranks, ~12 s of CPU under valgrind; make test-full: llama_tiny_tp's 8
  # ranks with sequence parallel's activation collectives too, ~30 s)
  for n in $(tiered llama_tiny_tp_nosp "llama_tiny_tp_nosp llama_tiny_tp"); do
    run "valgrind: $n (TP classes, activation collectives, --dump) has no leaks or errors" \
      valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=1 "build/$n/$n" \
      --simulate --quiet --dump "build/valgrind-dump/$n"
  done
  full_adds "valgrind on llama_tiny_tp_nosp's 4 TP ranks; make test-full runs llama_tiny_tp's 8 (sequence parallel) too"
  run "valgrind: pipeline point-to-point tests (queued messages freed, failed runs included) have no leaks or errors" \
    valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=1 build/tests/test_pp
  run "valgrind: expert all-to-all tests (refused layers included) have no leaks or errors" \
    valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=1 build/tests/test_a2a
  run "valgrind: mixed all-gather dtype tests (byte-offset copies) have no leaks or errors" \
    valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=1 build/tests/test_mixed
else skipped "valgrind" "not installed"; fi

section "FSDP2 recordings (tests/oracle): layouts, collectives, shards and grads byte for byte"
for c in fsdp4 hsdp2x2; do
  run "oracle $c" bash -c "rm -rf build/oracle/$c && build/$c/$c --simulate --pattern oracle --dump build/oracle/$c --quiet &&
    $LUA tests/oracle_check.lua tests/oracle build/oracle/$c $c"
done
# FSDP + TP (2D): two TP classes (the root's slot is 246 elements on TP
# rank 0, 222 on TP rank 1), _StridedShard layouts, TP-chunked grads.
run "build tests/plans/fsdp2_tp2 (dp_shard 2 x tp 2)" $MAKE PLAN=tests/plans/fsdp2_tp2.lua
run "simulate fsdp2_tp2 (2 steps, every rank)" build/fsdp2_tp2/fsdp2_tp2 --simulate --steps 2
run "oracle fsdp2_tp2" bash -c "rm -rf build/oracle/fsdp2_tp2 &&
  build/fsdp2_tp2/fsdp2_tp2 --simulate --pattern oracle --dump build/oracle/fsdp2_tp2 --quiet &&
  $LUA tests/oracle_check.lua tests/oracle build/oracle/fsdp2_tp2 fsdp2_tp2"
# The comparison must be able to fail: one altered element in one buffer.
run "oracle check catches one altered element" bash -c '
  rm -rf build/oracle/bad && cp -r build/oracle/fsdp4 build/oracle/bad &&
  sed -i "0,/100108/s//100109/" build/oracle/bad/fsdp4.rank3.json || exit 2
  out=$("$1" tests/oracle_check.lua tests/oracle build/oracle/bad fsdp4 2>&1); rc=$?; echo "$out"
  [ "$rc" = 1 ] && printf "%s" "$out" | grep -qF "fsdp4 rank 3 params_local layers.0.p.wq: element 0 is 100109"' _ "$LUA"

# FSDP2 on NCCL (tests/oracle/nccl, recorded on an H100): ncclAvg over 3
# ranks differs from gloo by an ulp in 309 grads; --arith nccl must give the
# recording's bits for every collective and grad, and gloo's must not.
run "build fsdp3 (tests/plans, into build/gen/fsdp3)" $MAKE PLAN=tests/plans/fsdp3.lua OUT=build/gen/fsdp3
run "oracle fsdp3 on NCCL: --arith nccl matches the FSDP2-on-NCCL recording bit for bit" bash -c "
  rm -rf build/oracle/fsdp3-nccl && build/fsdp3/fsdp3 --simulate --pattern oracle --arith nccl --dump build/oracle/fsdp3-nccl --quiet &&
  $LUA tests/oracle_check.lua tests/oracle/nccl build/oracle/fsdp3-nccl fsdp3"
run "oracle fsdp3 on NCCL: gloo's arithmetic does not (10 where NCCL gives 10.000000953674316)" bash -c '
  rm -rf build/oracle/fsdp3-gloo && build/fsdp3/fsdp3 --simulate --pattern oracle --dump build/oracle/fsdp3-gloo --quiet || exit 2
  out=$("$1" tests/oracle_check.lua tests/oracle/nccl build/oracle/fsdp3-gloo fsdp3 2>&1); rc=$?; echo "$out"
  [ "$rc" = 1 ] && printf "%s" "$out" | grep -q "grads_local .*: element [0-9]* is 10, recording has 10.000000953674316" &&
    printf "%s" "$out" | grep -q "^oracle fsdp3: 3 ranks, [0-9]* checks, [1-9][0-9]* mismatches"' _ "$LUA"

# A pipeline (issue 22): pp 2 x FSDP 2, 1F1B, a class of tables per
# pipeline rank; every rank's sends, receives and FSDP collectives proved
# equal to torch's at generation; all ranks simulated exactly (every
# message checked element by element, every reduced grad exact).
run "build tests/pp/plans/pp_tiny (pipeline: pp 2 x dp_shard 2, 1F1B)" $MAKE PLAN=tests/pp/plans/pp_tiny.lua OUT=build/gen/pp_tiny
run "simulate pp_tiny: 4 ranks, 3 steps, every message and reduced grad exact (gloo's and NCCL's arithmetic)" bash -c "
  build/pp_tiny/pp_tiny --simulate --steps 3 && build/pp_tiny/pp_tiny --simulate --steps 2 --arith nccl"
run "simulate --ranks on a pipeline plan: refused at once in one line (no stand-ins for a pipeline peer's messages; it waited 30 s for them)" bash -c '
  out=$(timeout 10 build/pp_tiny/pp_tiny --simulate --ranks 0,3 2>&1); rc=$?; echo "$out"
  [ "$rc" = 2 ] && [ "$(printf "%s\n" "$out" | wc -l)" = 1 ] && printf "%s" "$out" | grep -qF "is a pipeline plan (pp 2)"'
# Zero bubble's V schedule: the split backward (I, then W) in the tables.
run "build tests/pp/plans/pp_tiny_zbv (pipeline: pp 2 x dp_shard 2, ZBVZeroBubble)" $MAKE PLAN=tests/pp/plans/pp_tiny_zbv.lua OUT=build/gen/pp_tiny_zbv
run "simulate pp_tiny_zbv: 4 ranks, 2 steps, every message and reduced grad exact (both arithmetics)" bash -c "
  build/pp_tiny_zbv/pp_tiny_zbv --simulate --steps 2 && build/pp_tiny_zbv/pp_tiny_zbv --simulate --steps 2 --arith nccl"
for spec in "gpipe:pp 4, no FSDP, GPipe, 8 microbatches" "izb:pp 2 x dp_shard 2, InterleavedZeroBubble" \
            "dpv:pp 2 x dp_shard 2, DualPipeV"; do
  n=pp_tiny_${spec%%:*}
  run "build tests/pp/plans/$n (pipeline: ${spec#*:})" $MAKE PLAN=tests/pp/plans/$n.lua OUT=build/gen/$n
  run "simulate $n: 4 ranks, 2 steps, every message and reduced grad exact (both arithmetics)" bash -c "
    build/$n/$n --simulate --steps 2 && build/$n/$n --simulate --steps 2 --arith nccl"
done
# LoopedBFS under HSDP: backwards in the schedule's own micro-batch order.
run "build tests/pp/plans/pp_tiny_lbfs (pipeline: pp 2 x dp_replicate 2 x dp_shard 2, LoopedBFS)" $MAKE PLAN=tests/pp/plans/pp_tiny_lbfs.lua OUT=build/gen/pp_tiny_lbfs
run "simulate pp_tiny_lbfs: 8 ranks, 2 steps, every message and reduced grad exact (both arithmetics)" bash -c "
  build/pp_tiny_lbfs/pp_tiny_lbfs --simulate --steps 2 && build/pp_tiny_lbfs/pp_tiny_lbfs --simulate --steps 2 --arith nccl"
# torchtitan's 405B job at 16 microbatches (plans/llama405b.lua, 32, is a golden plan above): its tables generated and proved.
run "generate bench/llama405b_pp (512 ranks, FSDP 8 x TP 8 x PP 8, 16 microbatches): tables equal torch's sequence, whole step proved" bash -c '
  d=$(mktemp -d) && trap "rm -rf \"\$d\"" EXIT && "$1" gen/commplan.lua bench/llama405b_pp.lua "$d/out" &&
  grep -q "cannot deadlock" "$d/out/SCHEDULE.md" && grep -q "static const int class_of\[64\]" "$d/out/plan.c"' _ "$LUA"
# torchtitan's 405B shape in small: pp 2 x FSDP 2 x TP 2, Interleaved1F1B,
# a class per (pipeline rank, TP class).
run "build tests/pp/plans/pp_tiny_tp (pipeline: pp 2 x dp_shard 2 x tp 2, Interleaved1F1B)" $MAKE PLAN=tests/pp/plans/pp_tiny_tp.lua OUT=build/gen/pp_tiny_tp
run "simulate pp_tiny_tp: 8 ranks, 2 steps, every message, TP activation and reduced grad exact (both arithmetics)" bash -c "
  build/pp_tiny_tp/pp_tiny_tp --simulate --steps 2 && build/pp_tiny_tp/pp_tiny_tp --simulate --steps 2 --arith nccl"
# CP x PP (docs/pipeline.md): pp 2 x cp 2, 1F1B, the K/V exchange inside each stage
# (tests/titan/test_cppp_record.py holds its tables to torchtitan's pipeline live).
run "build tests/plans/llama_tiny_cppp (pipeline: pp 2 x cp 2, 1F1B)" $MAKE PLAN=tests/plans/llama_tiny_cppp.lua OUT=build/gen/llama_tiny_cppp
run "simulate llama_tiny_cppp: 4 ranks, 2 steps, every message, K/V exchange and reduced grad exact (both arithmetics)" bash -c "
  build/llama_tiny_cppp/llama_tiny_cppp --simulate --steps 2 && build/llama_tiny_cppp/llama_tiny_cppp --simulate --steps 2 --arith nccl"
# CP x TP and the 4D mesh (issue 35): cp 2 x tp 2 (the live check's plan) and FSDP 2 x CP 2 x TP 2 x PP 2.
for spec in "llama_tiny_cptp:cp 2 x tp 2, 4 ranks" "llama_tiny_4d:pp 2 x dp_shard 2 x cp 2 x tp 2, 16 ranks"; do
  n=${spec%%:*}
  run "build tests/plans/$n (${spec#*:})" $MAKE PLAN=tests/plans/$n.lua OUT=build/gen/$n
  run "simulate $n: every rank, 2 steps, every collective and reduced grad exact (both arithmetics)" bash -c "
    build/$n/$n --simulate --steps 2 --quiet && build/$n/$n --simulate --steps 2 --arith nccl --quiet"
done
# PP beyond llama (issue 35): qwen3 split as torchtitan splits it, and PP x
# EP, each stage's token all-to-alls inside every microbatch's F and B.
for spec in "qwen3_tiny:qwen3, pp 2 x dp_shard 2, 1F1B" "ep_mixtral:mixtral, pp 2 x dp_shard 2 x ep 2, 1F1B"; do
  n=pp_${spec%%:*}
  run "build tests/pp/plans/$n (pipeline: ${spec#*:})" $MAKE PLAN=tests/pp/plans/$n.lua OUT=build/gen/$n
  run "simulate $n: 4 ranks, 2 steps, every message, all-to-all and reduced grad exact (both arithmetics)" bash -c "
    build/$n/$n --simulate --steps 2 && build/$n/$n --simulate --steps 2 --arith nccl"
done

pp_t0=$SECONDS
lane_start pp pp_lane
printf "== the pp lane runs in the background from here (pipeline parallel and expert parallel vs live torch and torchtitan); its output comes after the torch lane's  [%ds]\n" "$SECONDS"
section "the GPU path on an emulated CUDA runtime and NCCL (tests/emu, docs/emulator.md): no GPU needed"
# runtime/gpu.c, gpu_run.c, the launch and rendezvous code and the copy
# kernels, unchanged, on tests/emu's stand-in CUDA and NCCL: every small
# plan and the kernel plans, all ranks as processes, --check eager and
# --graph, one seed (make test-full and make test-emu: three), 0 races;
# seeded faults caught; torchrun launches.
if run "build every plan's binary on the emulator (make emu-build)" $MAKE -j2 emu-build; then
  emu_log=$(logname "emu_check")
  emu_torchrun=none
  [ "${live_rc:-1}" = 0 ] && [ -x "$(dirname "$live_py")/torchrun" ] && emu_torchrun="$(dirname "$live_py")/torchrun"
  # one seed in the quick tier; make test-full and make test-emu run three
  emu_seeds=${EMU_SEEDS:-$(tiered 1 "1 2 3")}
  EMU_SEEDS=$emu_seeds TORCHRUN=$emu_torchrun LUA=$LUA tests/emu_check.sh $($MAKE -s print-emu-plans) >"$emu_log" 2>&1
  while IFS= read -r line; do
    case $line in
      "  ok    "*) ok "emulated GPU: ${line#  ok    }" ;;
      "  FAIL  "*) bad "emulated GPU: ${line#  FAIL  }" "$emu_log" ;;
      "  SKIP  "*) what=${line#  SKIP  }; skipped "emulated GPU: ${what%%: *}" "${what#*: }" ;;
    esac
  done <"$emu_log"
  grep -h "^emu: " "$emu_log" | sed "s/^/        /"
  # (one quick-tier line: the seeds here, then what tests/emu_check.sh's own line says it trims)
  emu_q=$(sed -n 's/^quick tier: //p' "$emu_log" | head -n 1)
  [ -n "${EMU_SEEDS:-}" ] || full_adds "seed $emu_seeds for every plan's --check runs and the all-to-all binaries${emu_q:+, ${emu_q%%; make test-full *}}; make test-full runs seeds 1, 2 and 3${emu_q:+, ${emu_q#*; make test-full }}"
  grep -q "^emu: " "$emu_log" || bad "emulated GPU: tests/emu_check.sh did not finish" "$emu_log"
fi
section "bad input: one line, exit 2, nothing written"
bad_plan() {  # name, plan text, expected substring
  local name=$1 text=$2 want=$3 dir=build/bad/$1
  rm -rf "$dir" && mkdir -p "$dir/out" && cp plans/fsdp4/* "$dir/out/"
  printf '%s\n' "$text" >"$dir/$name.lua"
  expect_rc "bad plan $name exits 2" 2 $LUA gen/commplan.lua "$dir/$name.lua" "$dir/out"
  run "bad plan $name: one-line message naming $want" bash -c '
    msg=$("$1" gen/commplan.lua "$2" "$3" 2>&1 >/dev/null); echo "$msg"
    [ "$(printf "%s\n" "$msg" | wc -l)" = 1 ] && printf "%s" "$msg" | grep -qF -- "$4"' _ "$LUA" "$dir/$name.lua" "$dir/out" "$want"
  run "bad plan $name: generated files untouched" diff -r plans/fsdp4 "$dir/out"
}
bad_plan syntax 'return { world_size = 4, model = {' 'syntax error'
bad_plan factor 'return { world_size = 8, parallel = { dp_shard = 3, dp_replicate = 2 }, model = { family = "llama", size = "8b" } }' \
  'dp_replicate(2) * dp_shard(3) * cp(1) * tp(1) * pp(1) = 6 != world_size(8). Set dp_shard=-1'
bad_plan typo 'return { world_size = 8, parallel = { dp_shard = -1 }, model = { family = "llama", size = "8b" }, fsdp = { reshard_after_froward = true } }' \
  "did you mean 'reshard_after_forward'"
bad_plan zero 'return { world_size = 2, parallel = { dp_shard = 2 }, model = { units = { { name = "root", params = { { name = "w", shape = { 0, 4 } } } } } } }' \
  'must be positive'
bad_plan nofactor 'return { world_size = 10, parallel = { dp_replicate = 4, dp_shard = -1 }, model = { family = "llama", size = "8b" } }' \
  'Cannot auto-infer dp_shard: world_size=10 is not divisible by dp_replicate*cp*tp*pp=4'
expect_rc "binary: --world-size mismatch exits 2" 2 build/fsdp4/fsdp4 --simulate --world-size 8
# launcher_rc NAME RC MESSAGE ENV...: the binary under a launcher's environment.
launcher_rc() {
  local name=$1 want=$2 msg=$3; shift 3
  run "$name" bash -c 'out=$(env "${@:3}" build/fsdp4/fsdp4 --rendezvous-only --quiet 2>&1); rc=$?; echo "$out"
    [ "$rc" = "$1" ] && { [ -z "$2" ] || printf "%s" "$out" | grep -qF -- "$2"; }' _ "$want" "$msg" "$@"
}
M="MASTER_ADDR=10.0.0.1 MASTER_PORT=29500"
launcher_rc "binary: torchrun WORLD_SIZE mismatch exits 2" 2 "world size 8 does not match plan fsdp4" \
  RANK=0 WORLD_SIZE=8 LOCAL_RANK=0 $M
launcher_rc "binary: RANK outside WORLD_SIZE exits 2" 2 'RANK=4 is outside $WORLD_SIZE=4' RANK=4 WORLD_SIZE=4 LOCAL_RANK=0 $M
launcher_rc "binary: torchrun without LOCAL_RANK exits 2" 2 'LOCAL_RANK is unset' RANK=0 WORLD_SIZE=4 $M
launcher_rc "binary: no rendezvous address exits 2" 2 "set MASTER_ADDR and MASTER_PORT" RANK=0 WORLD_SIZE=4 LOCAL_RANK=0
launcher_rc "binary: Slurm world mismatch exits 2" 2 "world size 2 does not match" \
  SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 NCCL_COMM_ID=h:1
launcher_rc "binary: Open MPI rank of the plan's world runs" 0 "" \
  OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=3 $M
expect_rc "binary: unknown option exits 2" 2 build/fsdp4/fsdp4 --simulat
expect_rc "binary: bad --steps exits 2" 2 build/fsdp4/fsdp4 --simulate --steps 0
run "binary: --standin refuses --check (one-rank communicators hold no peers' data)" bash -c '
  out=$(build/fsdp4/fsdp4 --standin --check 2>&1); rc=$?; echo "$out"
  [ "$rc" = 2 ] && printf "%s" "$out" | grep -qF "cannot be checked"'
if nvidia-smi -L >/dev/null 2>&1; then skipped "binary: --standin without a GPU" "this machine has one"
else
  run "binary: --standin without a GPU exits 2 and says why" bash -c '
    out=$(build/fsdp4/fsdp4 --standin --rank 3 2>&1); rc=$?; echo "$out"
    [ "$rc" = 2 ] && printf "%s" "$out" | grep -qE "no CUDA device|no GPU backend"'
fi

section "generator CLI and make: whole-directory publication, plans outside plans/, hostile file names, versions"
G=build/cli
gen() { $LUA gen/commplan.lua "$@"; }
fp_of() { grep -o -m1 'fingerprint [0-9a-f]\{16\}' "$1/plan.h" | cut -d' ' -f2; }
# one_line RC WANT OUT: OUT (a command's stderr) is one line holding WANT, and RC is 2.
one_line() { echo "$3"; [ "$1" = 2 ] && [ "$(printf '%s\n' "$3" | wc -l)" = 1 ] && printf '%s' "$3" | grep -qF -- "$2"; }
# Two generations of fsdp4 that differ (reshard_after_forward): "old", "new".
pub_refs() {
  rm -rf "$G" && mkdir -p "$G/ref" &&
    sed 's/reshard_after_forward = true/reshard_after_forward = false/' plans/fsdp4.lua >"$G/ref/fsdp4.lua" &&
    gen plans/fsdp4.lua "$G/ref/old" && gen "$G/ref/fsdp4.lua" "$G/ref/new" && ! diff -rq "$G/ref/old" "$G/ref/new"
}
run "publication: two different generations of fsdp4" pub_refs
# A generator killed (SIGKILL) at each stage of publication leaves the
# complete old or the complete new directory, never a mix; the next run
# finishes the new one and removes every temporary.
crash_at() (
  stage=$1 w=$G/crash-$1
  rm -rf "$w" && mkdir -p "$w" && cp -r "$G/ref/old" "$w/fsdp4" || exit 2
  COMMPLAN_TEST_CRASH=$stage $LUA gen/commplan.lua "$G/ref/fsdp4.lua" "$w/fsdp4"
  rc=$?; [ "$rc" = 137 ] || { echo "exit status $rc: not killed at $stage"; exit 1; }
  ls -A "$w"
  if [ "$stage" = old-aside ]; then
    # Between its two renames: the complete old and new lie beside OUTDIR.
    # A run killed right after its recovery shows what recovery put back.
    COMMPLAN_TEST_CRASH=recovered $LUA gen/commplan.lua plans/fsdp4.lua "$w/fsdp4"
    diff -r "$G/ref/new" "$w/fsdp4" || { echo "recovery did not put the complete new directory in place"; exit 1; }
  elif ! diff -rq "$G/ref/old" "$w/fsdp4" && ! diff -rq "$G/ref/new" "$w/fsdp4"; then
    echo "killed at $stage: $w/fsdp4 is neither the old nor the new directory"; exit 1
  fi
  gen "$G/ref/fsdp4.lua" "$w/fsdp4" && diff -r "$G/ref/new" "$w/fsdp4" || exit 1
  [ "$(ls -A "$w")" = fsdp4 ] || { echo "left behind:"; ls -A "$w"; exit 1; }
)
for stage in locked new-written old-aside new-in; do
  run "publication: generator killed at $stage leaves a complete directory" crash_at "$stage"
done
# A live generator's lock: the second gets one line and exit 2, nothing
# written; once the owner is gone the lock is stale and taken over.
lock_held() (
  w=$G/lock; rm -rf "$w" && mkdir -p "$w" && cp -r "$G/ref/old" "$w/fsdp4" || exit 2
  bash -c 'exec -a commplan.lua sleep 60' & holder=$!
  mkdir "$w/.fsdp4.lock.tmp" && echo "$holder" >"$w/.fsdp4.lock.tmp/pid"
  msg=$(gen "$G/ref/fsdp4.lua" "$w/fsdp4" 2>&1 >/dev/null); rc=$?
  kill "$holder"; wait "$holder" 2>/dev/null
  one_line "$rc" "another commplan (pid $holder) is writing this plan directory" "$msg" &&
    diff -r "$G/ref/old" "$w/fsdp4" && gen "$G/ref/fsdp4.lua" "$w/fsdp4" && diff -r "$G/ref/new" "$w/fsdp4" &&
    [ "$(ls -A "$w")" = fsdp4 ]
)
run "publication: a second generator on a locked OUTDIR exits 2 with one line; a dead owner's lock is taken over" lock_held
# Two generators of different plans racing on one OUTDIR, 8 times: each
# exits 0 silently or 2 with one line, and one complete generation remains.
racing() (
  w=$G/race
  for i in 1 2 3 4 5 6 7 8; do
    rm -rf "$w" && mkdir -p "$w" || exit 2
    gen plans/fsdp4.lua "$w/x" 2>"$G/race.1" & a=$!
    gen "$G/ref/fsdp4.lua" "$w/x" 2>"$G/race.2" & b=$!
    wait "$a"; ra=$?; wait "$b"; rb=$?
    echo "round $i: exit $ra, $rb"; cat "$G/race.1" "$G/race.2"
    for r in "$ra:$G/race.1" "$rb:$G/race.2"; do
      if [ "${r%%:*}" = 0 ]; then [ ! -s "${r#*:}" ] || exit 1
      else one_line "${r%%:*}" "another commplan" "$(cat "${r#*:}")" >/dev/null || exit 1; fi
    done
    diff -rq "$G/ref/old" "$w/x" >/dev/null || diff -rq "$G/ref/new" "$w/x" || exit 1
    [ "$(ls -A "$w")" = x ] || { ls -A "$w"; exit 1; }
  done
)
run "publication: two generators racing on one OUTDIR: no traceback, one complete plan" racing
# OUTDIR must hold nothing commplan did not write: a careless OUTDIR (a
# directory with other files) is refused, not replaced.
foreign() (
  w=$G/foreign; rm -rf "$w" && mkdir -p "$w" && cp -r "$G/ref/old" "$w/fsdp4" && echo keep >"$w/fsdp4/notes.txt" || exit 2
  msg=$(gen "$G/ref/fsdp4.lua" "$w/fsdp4" 2>&1 >/dev/null)
  one_line $? "holds notes.txt, which commplan did not generate" "$msg" && [ "$(cat "$w/fsdp4/notes.txt")" = keep ] &&
    cmp "$G/ref/old/plan.c" "$w/fsdp4/plan.c" && [ "$(ls -A "$w")" = fsdp4 ]
)
run "publication: an OUTDIR holding other files is refused (one line, exit 2) and left alone" foreign
check_ro() (
  w=$G/check; rm -rf "$w" && mkdir -p "$w" && cp -r "$G/ref/old" "$w/fsdp4" || exit 2
  gen --check "$G/ref/fsdp4.lua" "$w/fsdp4"; rc=$?
  [ "$rc" = 1 ] && diff -r "$G/ref/old" "$w/fsdp4" && [ "$(ls -A "$w")" = fsdp4 ] && gen --check plans/fsdp4.lua "$w/fsdp4"
)
run "--check compares without writing (exit 1 when stale, 0 when equal)" check_ro
# Headers name the source relative to the repository, from any directory.
rel_source() (
  rm -rf "$G/rel" && mkdir -p "$G/rel" && root=$(pwd) || exit 2
  (cd "$G/rel" && $LUA "$root/gen/commplan.lua" "$root/tests/plans/kernels_big.lua" out) || exit 1
  head -n 1 "$G/rel/out/plan.h"
  head -n 1 "$G/rel/out/plan.h" | grep -qF "generated by commplan from tests/plans/kernels_big.lua;" &&
    ! grep -rqF "$root" "$G/rel/out"
)
run "generated headers name the plan relative to the repository, no absolute path" rel_source
versions() {
  local v a b; v=$(cat VERSION); a=$(gen --version); b=$(build/fsdp4/fsdp4 --version); echo "$a"; echo "$b"
  [ "$a" = "commplan $v" ] && [ "$b" = "commplan $v, plan fsdp4 (fingerprint $(fp_of plans/fsdp4))" ]
}
run "--version: the generator and the binary print VERSION (the binary: and its plan's fingerprint)" versions

# make in a scratch copy of the tree (committed plans stay untouched),
# without nvcc (the GPU backend plays no part here).
S=$G/tree
scratch_tree() {
  rm -rf "$S" && mkdir -p "$S/build" &&
    tar -cf - --exclude=./build --exclude=./.git --exclude=./.whl --exclude=./.gl . | tar -xf - -C "$S" &&
    { [ ! -d build/runtime ] || cp -rp build/runtime "$S/build/"; }
}
run "scratch copy of the tree for the make tests" scratch_tree
# make PLAN=/elsewhere/fsdp4.lua: generated into build/fsdp4/gen/, the
# committed plans/fsdp4/ untouched, no absolute path in the output, errors
# naming that file, and a changed file rebuilt even when it is older than
# the build; back to PLAN=fsdp4.lua, the binary is the committed plan's.
external_plan() (
  cd "$S" || exit 2
  ext=$(mktemp -d /tmp/commplan-ext.XXXXXX) || exit 2
  trap 'rm -rf "$ext"' EXIT
  cp plans/fsdp4.lua "$ext/fsdp4.lua" && cp -rp plans/fsdp4 "$ext/committed" || exit 2
  $MAKE NVCC=/nonexistent PLAN="$ext/fsdp4.lua" || exit 1
  diff -r "$ext/committed" plans/fsdp4 && [ -z "$(find plans/fsdp4 -newer "$ext/committed/plan.c")" ] ||
    { echo "plans/fsdp4 was written"; exit 1; }
  head -n 1 build/fsdp4/gen/plan.h
  head -n 1 build/fsdp4/gen/plan.h | grep -qF "from fsdp4.lua (outside the commplan repository)" || exit 1
  ! grep -rqF "$ext" build/fsdp4/gen || { echo "absolute path in the generated files"; exit 1; }
  sed -i 's/reshard_after_forward = true/reshard_after_forward = false/' "$ext/fsdp4.lua" && touch -d 2000-01-01 "$ext/fsdp4.lua"
  $MAKE NVCC=/nonexistent PLAN="$ext/fsdp4.lua" || exit 1
  fp=$(fp_of build/fsdp4/gen); build/fsdp4/fsdp4 --version
  build/fsdp4/fsdp4 --version | grep -qF "(fingerprint $fp)" && [ "$fp" != "$(fp_of "$ext/committed")" ] ||
    { echo "stale binary after the external plan changed"; exit 1; }
  echo 'return {' >"$ext/fsdp4.lua"
  msg=$($MAKE NVCC=/nonexistent PLAN="$ext/fsdp4.lua" 2>&1 >/dev/null); echo "$msg"
  case $msg in "$ext/fsdp4.lua:"*) ;; *) echo "the error does not name $ext/fsdp4.lua"; exit 1 ;; esac
  $MAKE NVCC=/nonexistent PLAN=fsdp4.lua >/dev/null && build/fsdp4/fsdp4 --version | grep -qF "(fingerprint $(fp_of plans/fsdp4))" &&
    diff -r "$ext/committed" plans/fsdp4
)
run "make PLAN=/elsewhere/fsdp4.lua builds from build/fsdp4/gen/, never plans/fsdp4/, and never a stale binary" external_plan
# Plan files named to attack the shell: neither make's loops nor this
# script's run them or break; each is refused with one line.
hostile_names() (
  cd "$S" || exit 2
  # names are what is tested: the big shipped plans wait aside (each
  # regeneration below would take them all four times)
  mkdir -p ../aside || exit 2
  trap 'mv ../aside/*.lua plans/ 2>/dev/null' EXIT
  for n in $BIG_PLANS; do  # (llama70b stays: the Makefile's default PLAN)
    [ "$n" != llama70b ] || continue
    [ ! -f "plans/$n.lua" ] || mv "plans/$n.lua" ../aside/ || exit 2
  done
  good=$(plan_names | wc -l)
  for n in '$(touch PWNED)' '`touch PWNED`' "a b'c" 'x"y;touch PWNED' '--check'; do cp plans/single.lua "plans/$n.lua" || exit 2; done
  out=$($MAKE check-generated 2>&1); rc=$?; echo "$out"
  [ "$rc" != 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'plan file names are \[A-Za-z0-9_\]+.lua')" = 5 ] &&
    printf '%s\n' "$out" | grep -qx "check-generated: $good plans up to date, 5 failed" || exit 1
  out=$($MAKE regen-all 2>&1); rc=$?; echo "$out"
  [ "$rc" != 0 ] && printf '%s\n' "$out" | grep -qx "regen-all: $good plans regenerated, 5 failed" || exit 1
  [ "$(plan_names | wc -l)" = "$good" ] && ! check_plan_names >/dev/null || exit 1
  for p in '$(shell touch PWNED).lua' '`touch PWNED`.lua' 'a b.lua' "x'y.lua"; do
    msg=$(make --no-print-directory PLAN="$p" 2>&1 >/dev/null)
    one_line $? "a plan file is <name>.lua with <name> made of A-Z a-z 0-9 _" "$msg" || exit 1
  done
  rm -f plans/*[!A-Za-z0-9_.]*.lua
  [ -z "$(find . -name '*PWNED*' ! -name '*.lua')" ] || { echo "a file name ran as a command"; exit 1; }
  out=$($MAKE check-generated 2>&1) && [ "$out" = "check-generated: $good plans up to date" ] &&
    out=$($MAKE regen-all 2>&1) && [ "$out" = "regen-all: $good plans regenerated" ] || { echo "$out"; exit 1; }
)
run "hostile plan file names: make check-generated, regen-all, PLAN= and the test loops refuse, never run them" hostile_names
# ---- issue 37, item 4: a plan that does not fit, said at once ----
# make PLAN= prints gen/commplan.lua's one line after the build (a cached
# build's too), still building; STRICT=1 makes it an error; a plan that
# fits prints nothing on stderr (tests/lua/test_fit.lua: the line's terms).
fit_said_at_once() (
  cd "$S" || exit 2
  big="NVCC=/nonexistent PLAN=tests/plans/too_big.lua OUT=build/gen/too_big"
  out=$($MAKE $big 2>&1 >/dev/null) || { echo "$out"; exit 1; }
  echo "$out"
  [ "$(printf '%s\n' "$out" | grep -c '^tests/plans/too_big.lua: does not fit: each rank needs ')" = 1 ] &&
    [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [ -x build/too_big/too_big ] || exit 1
  again=$($MAKE $big 2>&1 >/dev/null) && [ "$again" = "$out" ] || { echo "cached build: $again"; exit 1; }
  ! $MAKE $big STRICT=1 >/dev/null 2>&1 || { echo "STRICT=1 passed a plan that does not fit"; exit 1; }
  msg=$($MAKE NVCC=/nonexistent PLAN=fsdp4.lua 2>&1 >/dev/null) && [ -z "$msg" ] || { echo "fsdp4: $msg"; exit 1; }
)
run "make PLAN=: a plan that does not fit says so in one line (a cached build too), STRICT=1 fails it" fit_said_at_once
# ---- end of issue 37, item 4 ----

section "--simulate: refused up front when it will not fit, progress on long runs"
# sim_refuses NAME RANKS: one line with the figure and this machine's
# memory, exit 2, before any allocation (under a 4 GiB address-space limit).
sim_refuses() {
  local out rc
  out=$(ulimit -v 4194304; "build/$1/$1" --simulate 2>&1); rc=$?
  one_line "$rc" "commplan: simulating plan $1 needs " "$out" &&
    printf '%s' "$out" | grep -qE "needs [0-9.]+ GiB of host memory \($2 ranks x [0-9.]+ GiB.*\); this machine has [0-9.]+ GiB available: simulate a smaller plan \(the same model with fewer layers or a smaller world\), or run it on GPUs with --check$"
}
run "simulate llama70b: refused with the figure and this machine's memory, exit 2" sim_refuses llama70b 1024
if [ "$(awk '/^MemAvailable:/ { print ($2 < 900 * 1024 * 1024) }' /proc/meminfo 2>/dev/null)" = 1 ]; then
  run "simulate llama8b: refused with the figure and this machine's memory, exit 2" sim_refuses llama8b 64
else skipped "simulate llama8b refused" "this machine has 900 GiB or more available"; fi
run "simulate: a long run shows a progress line per step on stderr (none with --quiet)" bash -c '
  err=$(build/llama_tiny/llama_tiny --simulate --steps 1000 2>&1 >/dev/null) || exit 1; echo "$err"
  printf "%s\n" "$err" | grep -qE "^llama_tiny: step 1000/1000 simulated on [0-9]+ ranks" &&
    [ -z "$(build/llama_tiny/llama_tiny --simulate --steps 2 --quiet 2>&1)" ]'

# The mutation pass (issue 42; make mutate): full tier only, it takes tens of
# minutes. It passes when it ran; the kill rate is shown under it.
if [ "$tier" = full ]; then
  section "mutation pass: listed bugs in gen/ and runtime/, each in a scratch copy (tests/mutate.sh)"
  mut_what="mutation pass over gen/ and runtime/, golden check excluded (tests/mutate.sh)"
  run "$mut_what" tests/mutate.sh
  grep -ah "^mutate: [0-9]* of [0-9]* killed\|^mutate: survived" "$(logname "$mut_what")" | sed "s/^/        /"
fi

echo
section "Python package (python/commplan): plans from models, hf_config, names, model/plan check"
if command -v python3 >/dev/null 2>&1; then
  run "python: plans written from named parameters and config.json reproduce the committed tables; names; model/plan check (tests/python/test_plan_writer.py)" python3 tests/python/test_plan_writer.py
  run "python: bad config.json/options, FIFO/dir/device inputs, symlinked outputs, write errors, CLI (tests/python/test_input_validation.py)" timeout 300 python3 tests/python/test_input_validation.py
  # issue 38: the `commplan` command: every write flag's bad value, the TOML job config, reproducible
  # headers, the pipeline section, check / generate beside the plan; then the new user's path through
  # the pip-installed command in a scratch git repository outside this tree
  run "python: the commplan command's verbs: a bad value for every flag, torchtitan TOML job configs, reproducible plan headers, the pipeline section, check and generate beside the plan (tests/python/test_cli_verbs.py)" timeout 300 python3 tests/python/test_cli_verbs.py
  nun="python: the new user's path: pip install ./python offline, then config.json -> write -> generate -> audit -> check in a scratch git repository, check failing after the config's edit and passing after rewrite + generate (tests/python/test_new_user.py)"
  run "$nun" timeout 300 python3 tests/python/test_new_user.py; grep -h "^new user: ok" "$(logname "$nun")" | sed "s/^/        /"
  # issue 37, item 1: every model's audit from its config.json (prints tokens/s per GPU and MFU per model)
  acn="python: every config.json's plan audited: FLOPs per token, tokens/s, MFU, labels; a generic model of decoder blocks priced as Llama's (activations, memory verdict), other generic models' gaps said; DeepSeek-V2-Lite (tests/python/test_audit_complete.py)"
  run "$acn" timeout 300 python3 tests/python/test_audit_complete.py; grep -h "^  [a-z0-9_]*_config.json" "$(logname "$acn")" | sed "s/^/      /"
  fzn_s=$(tiered 4 20)
  fzn="python: fuzz the writer's JSON input, fixed seed, at most $fzn_s s (tests/python/fuzz_writer.py)"
  run "$fzn" timeout 120 python3 tests/python/fuzz_writer.py --cases 4000 --seconds "$fzn_s" --cli-every 200; grep -h "^fuzz_writer: [0-9]" "$(logname "$fzn")" | sed "s/^/        /"
  full_adds "at most $fzn_s s of the 4000 cases; make test-full gives them 20 s"
  tc=$(python3 tests/python/train_compare.py --preflight 2>&1 | head -n 1)
  case $tc in
    SKIP*) skipped "python: 20 AdamW steps vs FSDP2 on 4 ranks (make test-train)" "${tc#*: }" ;;
    *) skipped "python: 20 AdamW steps vs FSDP2 on 4 ranks" "torch 2.x and a GPU are here: run make test-train" ;;
  esac
else skipped "python package tests" "python3 not found"; fi

# ---- the README's commands (issue 38, item 5) ----
# Every command README.md shows, run (or run in a cheap form, or listed with
# the reason it is not); the quick start in a scratch home outside this
# tree; the README under 150 lines; its links and docs/testing.md's resolve.
echo
section "README: every command it shows, run; its links (tests/readme_commands.py)"
if command -v python3 >/dev/null 2>&1; then
  rcn="README: every fenced command run as written, in a cheap form or listed with its reason; the quick start outside this tree; under 150 lines; links resolve (tests/readme_commands.py)"
  run "$rcn" timeout 600 python3 tests/readme_commands.py
  grep -ah "^SKIP: " "$(logname "$rcn")" | while IFS= read -r l; do printf '  SKIP  %s\n' "${l#SKIP: }"; done
  skip=$((skip + $(grep -ac "^SKIP: " "$(logname "$rcn")")))
else skipped "README commands" "python3 not found"; fi


echo
printf '== the torch lane (started at [%ds], its output kept until now)  [%ds]\n' "$lane_t0" "$SECONDS"
lane_join torch
printf '== the pp lane (started at [%ds], its output kept until now)  [%ds]\n' "$pp_t0" "$SECONDS"
lane_join pp

printf 'tests: %d passed, %d failed, %d skipped\n' "$pass" "$fail" "$skip"
[ "$fail" = 0 ]
