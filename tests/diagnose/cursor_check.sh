#!/bin/sh
# The runtime's cursor (issue 40 item 3): a plan binary's --simulate run,
# SIGUSR1 while it runs, every rank's cursor written (cp_cursor_write) and
# read by python -m commplan diagnose against the plan.
#   tests/diagnose/cursor_check.sh BINARY PLAN.lua   (closing line "cursor: ...")
bin=$1 plan=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/commplan-cursor.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
COMMPLAN_CURSOR_DUMP="$dir/cursor_" "$bin" --simulate --steps 1000000 >/dev/null 2>&1 &
pid=$!
sleep 1
kill -USR1 "$pid" 2>/dev/null
sleep 0.3
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
n=$(cat "$dir"/cursor_* 2>/dev/null | grep '^{"commplan_cursor": 1, "plan": ' | grep -c '"in_op": ')
out=$(PYTHONPATH=python python3 -m commplan diagnose "$dir" "$plan"); rc=$?
printf '%s\n' "$out"
if [ "$n" -gt 0 ] && [ "$rc" -le 1 ] && printf '%s\n' "$out" | grep -q "the runtime's cursors of ranks"; then
  echo "cursor: $n ranks' cursors written on SIGUSR1 and diagnosed"
else
  echo "cursor: FAIL ($n cursor lines, diagnose exit $rc)"; exit 1
fi
