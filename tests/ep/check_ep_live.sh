#!/usr/bin/env bash
# Live record (issue 23, item 6, the torch side): torchtitan 0.3's expert
# parallelism run on CPU/gloo (tests/ep/torch_ep_record.py: its DeepSeek-V3
# decoder, tiny, parallelized by parallelize_deepseekv3 at world 4 —
# dp_shard 4 x ep 2 (efsdp 2), dp_shard 4 x ep 4 (efsdp 1), and ep 2 with 2
# experts (Shard(1) over efsdp), and dp_shard 4 x ep 2 under torchtitan's
# full and selective activation checkpointing (the backward re-runs each MoE
# block's counts exchange, dispatch and combine), and dp_shard 2 x tp 2 x
# ep 2 under torchtitan's MoE TP plan (sequence and loss parallel; with
# --cases also dp2_tp2 at ep 1 and dp2_tp2_ep4), and torchtitan's Qwen3 MoE
# decoder (qwen3_moe, and without q/k norms commplan's mixtral) under its TP
# plan: tp 2, dp_shard 2 x tp 2 at ep 1 and 2, without sequence parallelism,
# ep 2 inside tp 4 (tests/ep/ep_cases.py) — one forward + backward
# with torchtitan's round-robin routing), every collective per rank recorded in
# build/ep/live/<case>.json; one summary line per case (tests/ep/ep_summary.py).
# Then tests/ep/compare_ep_live.lua holds commplan's tables for the same
# model and mesh to them, and the reduced gradients to commplan's simulation:
# each case's plan (tests/ep/ep_cases.py's spec -> compare_ep_live.lua
# --write-plans -> <out>/plans/ep_live_<case>.lua) is generated first, its
# parameter ids go into the torch run (every FSDP unsharded gradient is the
# oracle pattern of runtime/check.c), and its binary, built and run with
# --simulate --pattern oracle --dump <out>/dump/<case> beside the torch run,
# gives every rank's reduced gradient shards to compare element for element.
# Exit 0 every case recorded and its ranks agree; 1 otherwise; 77 (SKIP)
# when torch/torchtitan cannot be imported.
#   tests/ep/check_ep_live.sh [--cases dp4_ep2,...] [--out-dir DIR]
#   PYTHON=  the torch environment's python (default: make torch-env's)
set -u -o pipefail
# shellcheck source=tests/pp/torch_python.sh
. "$(dirname "$0")/../pp/torch_python.sh"
OUT=build/ep/live
prev=
for a in "$@"; do [ "$prev" = --out-dir ] && OUT=$a; prev=$a; done
case " $* " in *" --out-dir "*) set -- "$@" ;; *) set -- "$@" --out-dir "$OUT" ;; esac
mkdir -p "$OUT"
rm -f "$OUT"/*.json
rm -rf "$OUT/specs" "$OUT/plans" "$OUT/dump"
mkdir -p "$OUT/plans"
MAKE="make --no-print-directory -s"

# commplan's side first: each case's plan, generated (its plan.json numbers
# the parameters the torch run's gradients are made from)
"$PY" tests/ep/ep_cases.py --specs "$OUT/specs" "$@" || exit 1
"$LUA" tests/ep/compare_ep_live.lua --write-plans "$OUT/plans" "$OUT"/specs/*.json || exit 1
cases=()
for f in "$OUT"/plans/ep_live_*.lua; do
  n=$(basename "$f" .lua); c=${n#ep_live_}
  $MAKE PLAN="$f" OUT="$OUT/gen/$c" BUILD="$OUT/bin/$c" "$OUT/bin/$c/.generated" >"$OUT/commplan.log" 2>&1 ||
    { echo "ep-live: commplan refuses $f:"; tail -20 "$OUT/commplan.log"; exit 1; }
  cases+=("$c")
done
# its binaries built and simulated beside the torch run (without the GPU
# backend: --simulate is the same host code, and nvcc's build of each plan's
# kernels cost seconds a case)
(
  for c in "${cases[@]}"; do
    $MAKE NVCC=/nonexistent PLAN="$OUT/plans/ep_live_$c.lua" OUT="$OUT/gen/$c" BUILD="$OUT/bin/$c" "$OUT/bin/$c/ep_live_$c" &&
      "$OUT/bin/$c/ep_live_$c" --simulate --pattern oracle --dump "$OUT/dump/$c" --quiet || exit 1
  done
) >>"$OUT/commplan.log" 2>&1 &
sim=$!

"$PY" tests/ep/torch_ep_record.py --plans "$OUT/gen" "$@" 2>"$OUT/stderr.log"
rc=$?
wait $sim; src=$?
if [ $rc -eq 77 ]; then cat "$OUT/stderr.log"; exit 77; fi
if [ $rc -ne 0 ]; then
  echo "ep-live: the recorder exited $rc (stderr in $OUT/stderr.log):"
  grep -v initial_load "$OUT/stderr.log" | tail -20
fi
if [ $src -ne 0 ]; then
  echo "ep-live: commplan's build or --simulate failed (exit $src):"
  tail -20 "$OUT/commplan.log"
  rc=1
fi
shopt -s nullglob
files=("$OUT"/*.json)
[ ${#files[@]} -gt 0 ] || { echo "ep-live: no case recorded"; exit 1; }
"$PY" tests/ep/ep_summary.py "${files[@]}" || rc=1
# commplan's tables for the same model and mesh: every collective in order,
# the token all-to-alls within capacity, every parameter's local shard; and
# every rank's reduced gradient shards against the plan's --dump
[ $rc -eq 0 ] && { "$LUA" tests/ep/compare_ep_live.lua --dumps "$OUT/dump" "${files[@]}" || rc=1; }
exit $rc
