#!/usr/bin/env bash
# Generation time of the shipped Llama plans (target: llama405b, 16,384
# ranks, under 2 s on the 2-core development machine). Best of 5 runs each.
set -euo pipefail
cd "$(dirname "$0")/.."
LUA=${LUA:-lua5.4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for n in llama8b llama70b llama405b; do
  best=
  for _ in 1 2 3 4 5; do
    t0=$(date +%s.%N)
    $LUA gen/commplan.lua "plans/$n.lua" "$out/$n"
    t1=$(date +%s.%N)
    t=$(echo "$t1 - $t0" | bc)
    if [ -z "$best" ] || [ "$(echo "$t < $best" | bc)" = 1 ]; then best=$t; fi
  done
  printf '%-10s %8.3f s  (%s)\n' "$n" "$best" "$(grep -o '"world_size": [0-9]*' "$out/$n/plan.json" | head -1)"
done
