#!/bin/bash
# Issue 42: a capacity-factor plan's binary routes what the capacity
# admits and refuses one row past it, the capacity computed here: the exact
# ceiling of factor x tokens x top_k / ep on the factor's decimal digits
# (docs/expert-parallel.md "The capacity policy"), at least one row, at most
# dropless (tokens x min(top_k, experts / ep)), not taken from the plan.
#   tests/ep/capacity_sim.sh BINARY PLAN_JSON
# --simulate draws every rank's counts within the tables' capacity, one
# draw in four filling a member exactly to it (runtime/check.c
# cp_checker_a2a_counts); COMMPLAN_A2A_OVERFLOW=1 has rank 1 route the
# tables' capacity + 1 rows to member 1, which must be refused naming the
# capacity computed here; COMMPLAN_A2A_FULL=R has rank R fill its members
# to exactly the capacity in turn, which must route. Prints one "capacity-sim:" line; exit 0 or 1.
set -u
bin=$1 pj=$2
LUA=${LUA:-lua5.4}
fail() { echo "capacity-sim: FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "no binary $bin (build it: make PLAN=<plan file>)"
[ -r "$pj" ] || fail "no plan.json $pj"
read -r got want world <<<"$(PLAN_JSON="$pj" $LUA -e '
  package.path = "./?.lua;" .. package.path
  local fh = assert(io.open(os.getenv("PLAN_JSON"), "rb"))
  local doc = require("gen.json").decode(fh:read("a"))
  local e = doc.expert_parallel
  fh:close()
  assert(e and e.capacity_policy == "factor", "not a capacity-factor plan")
  -- the factor as the decimal it was written: digits / 10^6
  local s = string.format("%.6f", e.capacity_factor)
  assert(tonumber(s) == e.capacity_factor, "a factor of more than 6 decimals")
  local num, den = math.tointeger(tonumber((s:gsub("%.", "")))), 1000000
  local rows, n = e.tokens_per_micro_step * e.top_k, e.ep
  local dropless = e.tokens_per_micro_step * math.min(e.top_k, e.num_experts // n)
  local want = math.max(1, math.min(dropless, (num * rows + den * n - 1) // (den * n)))
  print(e.capacity_rows, want, doc.world_size)' 2>&1)" || fail "cannot read $pj"
[ -n "${want:-}" ] || fail "cannot read $pj"
[ "$got" = "$want" ] || fail "$pj: capacity_rows $got, the exact ceiling gives $want"
out=$("$bin" --simulate --steps 4 --quiet 2>&1) || fail "--simulate within capacity $want refused: $(echo "$out" | head -1)"
# every rank fills its members to exactly the capacity, in turn: the
# largest counts it admits, routed and every row checked
for ((r = 0; r < world; r++)); do
  out=$(COMMPLAN_A2A_FULL=$r "$bin" --simulate --steps 1 --quiet 2>&1) ||
    fail "rank $r routing exactly capacity $want to its members was refused: $(echo "$out" | head -1)"
done
out=$(COMMPLAN_A2A_OVERFLOW=1 "$bin" --simulate --steps 1 2>&1) && fail "one row past capacity $want was not refused"
case "$out" in
  *"$((want + 1)) tokens for ep member 1"*"exceed its capacity of $want rows"*) ;;
  *) fail "the refusal does not name $((want + 1)) tokens past capacity $want: $(echo "$out" | grep -m1 capacity)" ;;
esac
echo "capacity-sim: $(basename "$bin"): capacity $want rows (the exact ceiling): routed within it over 4 steps and exactly at it from each rank, $((want + 1)) refused"
