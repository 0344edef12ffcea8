#!/usr/bin/env bash
# Live check (issue 22, item 6): torch.distributed.pipelining run on CPU
# (gloo) against commplan's derivation. tests/pp/torch_pipeline_record.py
# runs one training step of a tiny decoder per case — every schedule x
# microbatches 4 and 8 on pp 2, pp 4, pp 2 x dp_shard 2 (fully_shard per
# stage over 2 ranks), pp 2 x HSDP 2 x 2 (8 ranks) and pp 2 x HSDP 2 x 1,
# and the multi-stage ones again on pp 2 x dp_shard 2
# with max_active_stages 1 (stages resharded and gathered again mid-step),
# and pp 2 x dp_shard 2 under torchtitan's "always" reshard policy (the
# full tier: with max_active_stages 1 and HSDP too) —
# and records every send / receive and collective per
# rank; tests/pp/compare_pipeline_live.lua requires them equal, in order, to
# gen/parallel/pp_sequence.lua's. Exits 0 when every case matches, 1 on the
# first difference (printed), 77 when torch cannot be imported (SKIP).
#   PYTHON=  the torch environment's python (default: make torch-env's,
#            /root/.cache/commplan/torch-env/bin/python, else python3)
#   COMMPLAN_TEST_TIER=quick  (make test) microbatches 4 and 8 at pp 2
#            without FSDP, 4 on the other meshes, and one "quick tier:"
#            line; full (make test-full, and by hand) 4 and 8 on every mesh
set -u -o pipefail
# shellcheck source=tests/pp/torch_python.sh
. "$(dirname "$0")/torch_python.sh"
# (one python for both: exit 3 when pipelining does not import, 4 without gloo)
"$PY" -c "
import sys
try:
    import torch.distributed.pipelining, torch.distributed.fsdp  # noqa: F401
except Exception:
    sys.exit(3)
import torch.distributed as d
sys.exit(0 if d.is_gloo_available() else 4)" >/dev/null 2>&1
case $? in
  0) ;;
  4) echo "SKIP pp-run: torch has no gloo backend ($PY)"; exit 77 ;;
  *) echo "SKIP pp-run: torch.distributed.pipelining does not import with $PY"; exit 77 ;;
esac
OUT=build/pp/live
rm -rf "$OUT"
mkdir -p "$OUT"
start=$(date +%s)
MULTI=Interleaved1F1B,LoopedBFS,InterleavedZeroBubble,ZBVZeroBubble,DualPipeV
quick=0; [ "${COMMPLAN_TEST_TIER:-full}" = quick ] && quick=1
cases=0 full_cases=0 all=()
# pp dp_shard [max_active_stages|- [dp_replicate|- [always]]]: "2 2 1" evicts (RESHARD, then UNSHARD
# again mid-step); "2 2 - 2" is HSDP (fully_shard on a 2-D mesh: each reduce-scatter's
# all-reduce across the replicas), 8 ranks; "2 1 - 2" replicas over
# one-rank shard groups (only the all-reduces), 4 ranks
# "... always": torchtitan's fsdp_reshard_after_forward = "always" (issue 41: every
# unit resharded after each microbatch's forward, gathered again by its backward;
# zero bubble's last stage then reduces no gradient, which commplan refuses)
runs=("2 1" "4 1" "2 2" "2 2 1" "2 2 - 2" "2 1 - 2" "2 2 - - always")
[ "$quick" = 1 ] || runs+=("2 2 1 - always" "2 2 - 2 always")
for run in "${runs[@]}"; do
  read -r pp dp mas dr raf <<<"$run"
  [ "$mas" = - ] && mas=
  [ "$dr" = - ] && dr=
  # 4 and 8 microbatches (8: a longer steady state) on every mesh; the
  # quick tier 8 only at pp 2 without FSDP (the rest: more of the same)
  mb=4,8
  [ "$quick" = 1 ] && ! { [ "$pp" = 2 ] && [ "$dp" = 1 ] && [ -z "$dr" ]; } && mb=4
  args=(--pp "$pp" --dp-shard "$dp" --microbatches "$mb" --out-dir "$OUT")
  [ -n "$dr" ] && args+=(--dp-replicate "$dr")
  [ -n "$mas" ] && args+=(--max-active-stages "$mas" --schedules "$MULTI")
  [ -n "$raf" ] && args+=(--reshard-after-forward)
  n=7; [ -n "$mas" ] && n=5  # schedules
  nmb=2; [ "$mb" = 4 ] && nmb=1
  cases=$((cases + n * nmb)) full_cases=$((full_cases + 2 * n))
  [ ${#all[@]} = 0 ] || all+=(--then)
  all+=("${args[@]}")
done
# (the full tier's "always" runs: max_active_stages 1, 5 schedules, and HSDP, 7, both at 4 and 8)
[ "$quick" = 1 ] && full_cases=$((full_cases + 2 * 5 + 2 * 7))
# every mesh in one recorder process (torch imported once; its ranks forked)
if ! "$PY" -W ignore tests/pp/torch_pipeline_record.py "${all[@]}" 2>"$OUT/stderr.txt"; then
  echo "pp-run: FAIL the recorder failed for ${all[*]}:"
  tail -n 20 "$OUT/stderr.txt"
  exit 1
fi
"$LUA" tests/pp/compare_pipeline_live.lua "$OUT"/*.json || exit 1
echo "pp-run: all cases equal in $(( $(date +%s) - start )) s"
[ "$quick" = 0 ] || echo "quick tier: $cases of $full_cases cases (8 microbatches only at pp 2 without FSDP); make test-full runs 4 and 8 on every mesh"
