#!/bin/sh
# COMMPLAN_TEST_FAULT's values (runtime/executor.c fault_parse, fault_check):
# a malformed value, or a rank / op / micro-step the plan does not have, is
# refused in one line naming the variable when the executor is made (a fault
# that could never fire is not silently ignored); a well-formed one runs.
#   tests/fault_values.sh BINARY   (fsdp4's: 4 ranks; closing line "fault values: ...")
bin=$1 n=0 bad=0
for v in skip:0:0:7x skip:0:0:abc skip:x:0:3 skip:0:-1:3 skip:0:0 nope:0:0:1 skip:9:0:3 skip:1:0:99999 skip:1:0:m7; do
  out=$(COMMPLAN_TEST_FAULT=$v timeout 60 "$bin" --simulate --steps 1 2>&1); rc=$?
  lines=$(printf '%s\n' "$out" | grep -c "COMMPLAN_TEST_FAULT")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && printf '%s\n' "$out" | grep -q "^commplan: COMMPLAN_TEST_FAULT[=:].*\(fix it\|use \)"; then
    n=$((n + 1))
  else
    echo "FAIL: COMMPLAN_TEST_FAULT=$v not refused (exit $rc, $lines lines): $out" | tail -c 400; bad=1
  fi
done
# a fault the plan has still fires (the run fails on rank 1's skipped op)
out=$(COMMPLAN_TEST_FAULT=skip:1:0:3 timeout 60 "$bin" --simulate --steps 1 2>&1); rc=$?
if [ "$rc" -eq 0 ] || printf '%s\n' "$out" | grep -q "COMMPLAN_TEST_FAULT.*fix it\|is outside"; then
  echo "FAIL: skip:1:0:3 did not fire (exit $rc)"; bad=1
fi
[ "$bad" = 0 ] && echo "fault values: $n malformed or out-of-range values refused, a valid one fires"
exit $bad
