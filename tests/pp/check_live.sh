#!/usr/bin/env bash
# Live check (issue 22): torch 2.15's pipeline schedules against
# gen/parallel/pp_schedule.lua, and torchtitan 0.3's stage split against
# gen/parallel/pp_stages.lua (tests/pp/titan_stages.py), over the whole matrix of
# tests/pp/torch_schedule_dump.py (schedules x pp 1, 2, 4, 8 x microbatches,
# refusals included). Exits 0 when every case matches, 1 on the first
# difference (printed), 77 when torch cannot be imported (SKIP).
#   PYTHON=  the torch environment's python (default: make torch-env's,
#            /root/.cache/commplan/torch-env/bin/python, else python3)
set -u -o pipefail
# shellcheck source=tests/pp/torch_python.sh
. "$(dirname "$0")/torch_python.sh"
if ! "$PY" -c "import torch.distributed.pipelining.schedules" >/dev/null 2>&1; then
  echo "SKIP pp-live: torch.distributed.pipelining does not import with $PY"
  exit 77
fi
mkdir -p build/pp
"$PY" tests/pp/torch_schedule_dump.py --out build/pp/torch_schedules.json || exit 1
"$LUA" tests/pp/compare.lua build/pp/torch_schedules.json || exit 1
# The schedule CSVs `make pipeline PLAN=... CSV=FILE` writes (torch's
# compute_only format), loaded and lowered by torch's own schedule classes
# (_load_csv; every CSV in one process): the same lists commplan derived and proved.
csv_cases=("Interleaved1F1B 8 16" "ZBVZeroBubble 4 8" "InterleavedZeroBubble 2 4" "LoopedBFS 4 8" "DualPipeV 4 8")
loads=()
for v in "${csv_cases[@]}"; do
  read -r sched pp mb <<<"$v"
  f=build/pp/csv_${sched}_${pp}_${mb}
  sed -e "s/world_size = 512/world_size = $((64 * pp))/" -e "s/pp = 8/pp = $pp/" \
    -e "s/schedule = \"Interleaved1F1B\"/schedule = \"$sched\"/" -e "s/microbatches = 16/microbatches = $mb/" \
    bench/llama405b_pp.lua >"$f.lua"
  rm -f "$f.csv" "$f.json"
  "$LUA" gen/verbs.lua pipeline "$f.lua" --csv "$f.csv" >/dev/null || exit 1
  loads+=("$f.csv" "$sched" "$pp" "$mb" 2 "$f.json")
done
"$PY" tests/pp/torch_load_csv.py "${loads[@]}" || exit 1
for v in "${csv_cases[@]}"; do
  read -r sched pp mb <<<"$v"
  f=build/pp/csv_${sched}_${pp}_${mb}
  "$LUA" tests/pp/compare_csv.lua "$f.lua" "$f.json" | sed 's/^csv: /pp-live: csv: /' || exit 1
done
# torchtitan's stage split (gen/parallel/pp_stages.lua), where torchtitan imports
if "$PY" -c "import torchtitan.distributed.pipeline_parallel" >/dev/null 2>&1; then
  "$PY" tests/pp/titan_stages.py >build/pp/titan_stages.jsonl || exit 1
  "$LUA" tests/pp/compare_stages.lua build/pp/titan_stages.jsonl | sed 's/^stages: \([0-9]\)/pp-live: stages: \1/' || exit 1
else
  echo "pp-live: stages: SKIP (torchtitan.distributed.pipeline_parallel does not import with $PY)"
fi
