#!/bin/sh
# Everything that needs the GPU, in one call on the lent machine (or any
# NVIDIA node): make test-gpu (with every small and kernel-coverage plan run
# with all its ranks on the one GPU, and the fsdp3 NCCL recording), the copy
# kernels against PyTorch's FSDP2 ops, and host enqueue time of a
# Llama-3-70B-structured step (--standin).
# Logs go to $OUT (default build/gpu-session); the summary is printed last.
#   sh bench/gpu_session.sh
set -u
OUT=${OUT:-build/gpu-session}
mkdir -p "$OUT"
. bench/nccl_home.sh
echo "NCCL_HOME=${NCCL_HOME:-(beside CUDA)}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rc=0
echo "== make test-gpu"
make -s -j16 test-gpu >"$OUT/test-gpu.log" 2>&1 || rc=1
# Everything but the passing multi-rank lines (one per plan, mode and run)
# and failures' log excerpts, which stay in the log.
grep -vE '^  ok    |^        \| ' "$OUT/test-gpu.log" | tail -n 40
echo "== all ranks of every plan on the GPU (--check eager and graph), fsdp3 vs the NCCL recording, torchrun"
ranks_log=$OUT/test-gpu.log
if ! grep -q '^gpu ranks: ' "$ranks_log"; then
  # test-gpu stopped before its multi-rank part: run that part alone.
  ranks_log=$OUT/test-gpu-ranks.log
  make -s test-gpu-ranks >"$ranks_log" 2>&1 || rc=1
fi
grep -E '^  FAIL  |^SKIP ' "$ranks_log" | head -n 20
grep -E '^  ok    (fsdp3|tests/gpu_torchrun)' "$ranks_log"
grep -E '^gpu ranks: ' "$ranks_log" || { echo "test-gpu-ranks did not finish (see $ranks_log)"; rc=1; }
if [ -z "${SKIP_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== compute-sanitizer memcheck of the device kernels"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_kernels >"$OUT/memcheck.log" 2>&1 || rc=1
  tail -n 3 "$OUT/memcheck.log"
fi
echo "== TP + sequence parallelism: the collectives PyTorch issues vs the plan's (tests/tp_record.py)"
python3 tests/tp_record.py >"$OUT/tp_record.log" 2>&1 || rc=1  # SKIP where torchtitan is not installed
tail -n 8 "$OUT/tp_record.log"
[ -n "${ONLY_TESTS:-}" ] && exit $rc
echo "== copy kernels vs PyTorch"
PYTHONUNBUFFERED=1 python3 bench/bench_kernels.py >"$OUT/bench_kernels.log" 2>&1 || rc=1
echo "== host enqueue, Llama-3-70B (one rank, stand-in communicators)"
for plan in ${ENQUEUE_PLANS:-plans/llama70b.lua bench/llama70b_structure.lua}; do
  n=$(basename "$plan" .lua)
  out=plans/$n; case $plan in plans/*) ;; *) out=build/bench/$n ;; esac
  make -s PLAN="$plan" OUT="$out" >"$OUT/enqueue-$n.log" 2>&1 &&
    "build/$n/$n" --standin --warmup 3 --iters 20 --graph >>"$OUT/enqueue-$n.log" 2>&1 || rc=1
  grep -E "^#|step" "$OUT/enqueue-$n.log" | head -5
done
echo "== kernels vs PyTorch"
cat "$OUT/bench_kernels.log"
exit $rc
