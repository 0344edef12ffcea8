#!/usr/bin/env bash
# Live check (issue 35): torchtitan 0.3's own pipeline (pipeline_llm, each
# stage parallelized by the family's parallelize_*) run on CPU (gloo) for
# qwen3 and for DeepSeek-V3, Qwen3 MoE and gpt-oss with expert parallel inside each stage, and
# gpt-oss with tensor parallel inside each stage (its TP collectives too)
# (tests/pp/torch_pp_titan_record.py, cases in tests/pp/pp_titan_cases.py),
# against commplan's pipeline tables for the same job
# (tests/pp/compare_titan_pp.lua): every rank's sends, receives, FSDP
# collectives and token all-to-alls, in order; and the reduced gradients,
# every rank's every parameter's local shard element for element: the
# recorder puts commplan's oracle pattern into each FSDP parameter's
# unsharded gradient where FSDP2 takes it to reduce (its ids from the case's
# plan, written first), the plan's binary simulates the same
# (--simulate --pattern oracle --dump). Exit 0 when every case
# matches, 1 on the first difference, 77 when torch or torchtitan cannot be
# imported (SKIP).
#   PYTHON=  the torch environment's python (tests/pp/torch_python.sh)
#   COMMPLAN_TEST_TIER=quick  (make test) the PP x EP case only, with one
#            "quick tier:" line; full (make test-full, and by hand) every case
set -u -o pipefail
# shellcheck source=tests/pp/torch_python.sh
. "$(dirname "$0")/torch_python.sh"
OUT=${PP_TITAN_OUT:-build/pp/titan}
rm -rf "$OUT"
mkdir -p "$OUT"
start=$(date +%s)
all=$("$PY" -c "import sys; sys.path.insert(0, 'tests/pp'); import pp_titan_cases as C; print(C.DEFAULT)")
quick=$("$PY" -c "import sys; sys.path.insert(0, 'tests/pp'); import pp_titan_cases as C; print(C.QUICK)")
# (PP_TITAN_CASES / PP_TITAN_QUICK: another script's cases, full and quick tier; check_titan_pp_always.sh
# gives its cases, full tier only)
all=${PP_TITAN_CASES:-$all} quick=${PP_TITAN_QUICK:-$quick}
cases=$all
[ "${COMMPLAN_TEST_TIER:-full}" = quick ] && cases=$quick
# commplan's side first: each case's plan, its parameter ids, its binary's oracle gradients
"$PY" tests/pp/pp_titan_cases.py --specs "$OUT/specs" --cases "$cases" || exit 1
"$LUA" tests/pp/compare_titan_pp.lua --write-plans "$OUT/specs" "$OUT"/specs/*.json || exit 1
mkdir -p "$OUT/dumps"
for plan in "$OUT"/specs/pp_titan_*.lua; do
  n=$(basename "$plan" .lua)
  if ! make -s PLAN="$plan" OUT="build/gen/$n" >"$OUT/make-$n.txt" 2>&1 ||
     ! "build/$n/$n" --simulate --steps 1 --pattern oracle --dump "$OUT/dumps" --quiet >>"$OUT/make-$n.txt" 2>&1; then
    echo "pp-titan: FAIL building or simulating $plan:"; tail -n 20 "$OUT/make-$n.txt"; exit 1
  fi
done
"$PY" -W ignore tests/pp/torch_pp_titan_record.py --cases "$cases" --ids "$OUT/specs" --out-dir "$OUT" \
  >"$OUT/stdout.txt" 2>"$OUT/stderr.txt"
rc=$?
if [ "$rc" = 77 ]; then grep "^SKIP" "$OUT/stdout.txt"; exit 77; fi
if [ "$rc" != 0 ]; then
  echo "pp-titan: FAIL the recorder failed for $cases:"
  grep "^pp-titan" "$OUT/stdout.txt"
  tail -n 20 "$OUT/stderr.txt"
  exit 1
fi
"$LUA" tests/pp/compare_titan_pp.lua --dumps "$OUT/dumps" "$OUT"/*.json || exit 1
# (issue 41) the mutant: a recording of torchtitan's "always" policy against the plan of its "default" one (no
# reshard after forward under PP) must differ
for rec in "$OUT"/*.json; do
  grep -q '"raf": "always"' "$rec" || continue
  if out=$("$LUA" tests/pp/compare_titan_pp.lua --policy default "$rec"); then
    echo "pp-titan: FAIL the \"default\" policy's plan equals the \"always\" recording $rec"; exit 1
  fi
  echo "pp-titan: mutant $(basename "$rec" .json) under the \"default\" policy's plan differs: ${out#pp-titan: FAIL }" |
    cut -c1-300
done
echo "pp-titan: all cases equal in $(( $(date +%s) - start )) s"
n_all=$(tr ',' '\n' <<<"$all" | grep -c .)
[ "$cases" = "$all" ] || echo "quick tier: 1 of $n_all cases (${PP_TITAN_QUICK_TEXT:-$quick: PP x EP}); make test-full runs PP on qwen3 and the others"
