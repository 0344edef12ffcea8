#!/usr/bin/env bash
# Live record (issue 23, item 6, the torch side): torchtitan 0.3's expert
# parallelism run on CPU/gloo (tests/ep/torch_ep_record.py: its DeepSeek-V3
# decoder, tiny, parallelized by parallelize_deepseekv3 at world 4 —
# dp_shard 4 x ep 2 (efsdp 2), dp_shard 4 x ep 4 (efsdp 1), and ep 2 with 2
# experts (Shard(1) over efsdp) — one forward + backward with torchtitan's
# round-robin routing), every collective per rank recorded in
# build/ep/live/<case>.json; one summary line per case (tests/ep/ep_summary.py).
# Then tests/ep/compare_ep_live.lua holds commplan's tables for the same
# model and mesh to them.
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
"$PY" tests/ep/torch_ep_record.py "$@" 2>"$OUT/stderr.log"
rc=$?
if [ $rc -eq 77 ]; then cat "$OUT/stderr.log"; exit 77; fi
if [ $rc -ne 0 ]; then
  echo "ep-live: the recorder exited $rc (stderr in $OUT/stderr.log):"
  grep -v initial_load "$OUT/stderr.log" | tail -20
fi
shopt -s nullglob
files=("$OUT"/*.json)
[ ${#files[@]} -gt 0 ] || { echo "ep-live: no case recorded"; exit 1; }
"$PY" tests/ep/ep_summary.py "${files[@]}" || rc=1
# commplan's tables for the same model and mesh: every collective in order,
# the token all-to-alls within capacity, every parameter's local shard
[ $rc -eq 0 ] && { "$LUA" tests/ep/compare_ep_live.lua "${files[@]}" || rc=1; }
[ $rc -eq 0 ] && echo "ep-live: all cases equal"
exit $rc
