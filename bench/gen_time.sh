#!/usr/bin/env bash
# Generation time and peak memory (issue 19's targets: each under 2 s on
# the 2-core development machine, memory linear in the ops): the shipped
# Llama plans, llama405b at 16 and 64 micro-steps (bench/llama405b_m16.lua,
# _m64.lua) and a 1,000-layer llama405b (bench/llama405b_1000_layers.lua).
# Best of RUNS runs each (default 3): wall seconds, CPU seconds (user +
# sys: steadier than wall on a shared machine) and peak RSS (/usr/bin/time
# -f %M), with the op count and KB of peak RSS per op. Usage:
#   bench/gen_time.sh [PLAN.lua ...]
set -euo pipefail
cd "$(dirname "$0")/.."
LUA=${LUA:-lua5.4}
RUNS=${RUNS:-3}
TIME=/usr/bin/time
[ -x "$TIME" ] || { echo "gen_time.sh: needs GNU time at $TIME (apt-get install time)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
plans=("$@")
if [ ${#plans[@]} -eq 0 ]; then
  plans=(plans/llama8b.lua plans/llama70b.lua plans/llama405b_hsdp.lua plans/llama405b.lua bench/llama405b_m16.lua bench/llama405b_m64.lua
         bench/llama405b_1000_layers.lua)
fi
printf '%-22s %6s %6s %8s %8s %8s %9s %8s\n' plan units micro ops wall_s cpu_s rss_MB KB/op
for f in "${plans[@]}"; do
  n=$(basename "$f" .lua)
  best_wall= best_cpu= best_rss=
  for _ in $(seq "$RUNS"); do
    rm -rf "${out:?}/$n"
    $TIME -f '%e %U %S %M' -o "$out/time" $LUA gen/commplan.lua "$f" "$out/$n"
    read -r wall user sys rss < "$out/time"
    cpu=$(echo "$user + $sys" | bc)
    if [ -z "$best_wall" ] || [ "$(echo "$wall < $best_wall" | bc)" = 1 ]; then best_wall=$wall; fi
    if [ -z "$best_cpu" ] || [ "$(echo "$cpu < $best_cpu" | bc)" = 1 ]; then best_cpu=$cpu; fi
    if [ -z "$best_rss" ] || [ "$rss" -lt "$best_rss" ]; then best_rss=$rss; fi
  done
  ops=$(sed -n 's/^static const cp_op ops\[\([0-9]*\)\].*/\1/p' "$out/$n/plan.c" | head -1)
  units=$(sed -n 's/.*_UNIT_COUNT = \([0-9]*\).*/\1/p' "$out/$n/plan.h" | head -1)
  micro=$(sed -n 's/^  "micro_steps": \([0-9]*\),*$/\1/p' "$out/$n/plan.json" | head -1)
  printf '%-22s %6s %6s %8s %8.2f %8.2f %9.1f %8.2f\n' "$n" "$units" "$micro" "$ops" "$best_wall" "$best_cpu" \
    "$(echo "$best_rss / 1024" | bc -l)" "$(echo "$best_rss / $ops" | bc -l)"
done
