#!/usr/bin/env bash
# make test: every suite this machine can run, one line per check, and a
# closing "N passed, N failed" line. Exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
LUA=${LUA:-lua5.4}
MAKE="make --no-print-directory -s"
pass=0 fail=0 skip=0
log=build/test-logs
mkdir -p "$log"

logname() { printf '%s/%s.log' "$log" "$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.-' '_')"; }
ok()   { pass=$((pass + 1)); printf '  ok    %s\n' "$1"; }
bad()  { fail=$((fail + 1)); printf '  FAIL  %s (log: %s)\n' "$1" "$2"; sed 's/^/        | /' "$2" | tail -n 15; }
skipped() { skip=$((skip + 1)); printf '  SKIP  %s: %s\n' "$1" "$2"; }
# run NAME CMD...: passes when CMD exits 0.
run() {
  local name=$1; shift
  local f; f=$(logname "$name")
  if "$@" >"$f" 2>&1; then ok "$name"; else bad "$name" "$f"; fi
}
# expect_rc NAME RC CMD...: passes when CMD exits with RC.
expect_rc() {
  local name=$1 want=$2; shift 2
  local f; f=$(logname "$name")
  "$@" >"$f" 2>&1
  local rc=$?
  if [ "$rc" = "$want" ]; then ok "$name"; else echo "exit status $rc, expected $want" >>"$f"; bad "$name" "$f"; fi
}

echo "== lint and generator unit tests"
if command -v luacheck >/dev/null 2>&1; then run "luacheck gen tests plans bench" luacheck -q gen tests/lua tests/plans tests/oracle_check.lua plans bench
else skipped "luacheck" "not installed (apt-get install lua-check)"; fi
run "lua unit tests" $LUA tests/lua/run.lua

echo "== golden: committed plans/*/ equal a fresh generation"
for f in plans/*.lua; do
  n=$(basename "$f" .lua)
  run "golden $n" $LUA gen/commplan.lua --check "$f" "plans/$n"
done
run "generation is deterministic (llama405b twice)" bash -c "
  rm -rf build/det && $LUA gen/commplan.lua plans/llama405b.lua build/det/a &&
  $LUA gen/commplan.lua plans/llama405b.lua build/det/b && diff -r build/det/a build/det/b"

echo "== runtime unit tests (cmocka, plain and ASan+UBSan)"
run "build cmocka tests" $MAKE build/tests/test_runtime build/tests-asan/test_runtime
run "cmocka runtime tests" build/tests/test_runtime
run "cmocka runtime tests under ASan+UBSan" build/tests-asan/test_runtime

echo "== end to end: every small plan generated, built and simulated on all ranks"
for f in plans/*.lua; do
  n=$(basename "$f" .lua)
  case $n in llama8b|llama70b|llama405b) continue ;; esac
  run "build $n" $MAKE PLAN="$n.lua"
  run "simulate $n (2 steps, every rank)" "build/$n/$n" --simulate --steps 2
done
for n in llama8b llama70b llama405b; do
  run "build $n and print its schedule" bash -c "$MAKE PLAN=$n.lua >/dev/null && build/$n/$n --dry-run >/dev/null"
done
echo "== CUDA: generated copy kernels (built with every plan above), checked against the host reference"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ -x "$NVCC" ]; then
  run "build kernel tests" $MAKE build/tests/test_kernels
  run "kernels (CPU run of the device code) equal the host executor" build/tests/test_kernels
  klog=$(logname "kernels (CPU run of the device code) equal the host executor")
  if grep -q '^SKIP' "$klog"; then
    skipped "device kernel launches (make test-gpu)" "$(sed -n 's/^SKIP device kernel launches: //p' "$klog")"
  fi
  run "docs/example.c builds against build/single/libsingle.a" $MAKE build/example/example
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    run "GPU binary without a device: one-line error, exit 2" bash -c '
      out=$(build/single/single --check 2>&1); rc=$?; echo "$out"
      [ "$rc" = 2 ] && printf "%s" "$out" | grep -qF "no CUDA device" && [ "$(printf "%s\n" "$out" | wc -l)" = 1 ]'
    skipped "make test-gpu (NCCL --check run, graph replay, device kernels)" "no NVIDIA GPU on this machine"
  fi
else
  skipped "CUDA kernels and the GPU backend" "nvcc not found at $NVCC"
fi

if command -v valgrind >/dev/null 2>&1; then
  run "valgrind: hsdp2x2 simulation has no leaks or errors" \
    valgrind -q --leak-check=full --errors-for-leak-kinds=all --error-exitcode=1 build/hsdp2x2/hsdp2x2 --simulate --quiet
else skipped "valgrind" "not installed"; fi

echo "== FSDP2 recordings (tests/oracle): layouts, collectives, shards and grads byte for byte"
for c in fsdp4 hsdp2x2; do
  run "oracle $c" bash -c "rm -rf build/oracle/$c && build/$c/$c --simulate --pattern oracle --dump build/oracle/$c --quiet &&
    $LUA tests/oracle_check.lua tests/oracle build/oracle/$c $c"
done
# The comparison must be able to fail: one altered element in one buffer.
run "oracle check catches one altered element" bash -c '
  rm -rf build/oracle/bad && cp -r build/oracle/fsdp4 build/oracle/bad &&
  sed -i "0,/100108/s//100109/" build/oracle/bad/fsdp4.rank3.json || exit 2
  out=$("$1" tests/oracle_check.lua tests/oracle build/oracle/bad fsdp4 2>&1); rc=$?; echo "$out"
  [ "$rc" = 1 ] && printf "%s" "$out" | grep -qF "fsdp4 rank 3 params_local layers.0.p.wq: element 0 is 100109"' _ "$LUA"

echo "== bad input: one line, exit 2, nothing written"
bad_plan() {  # name, plan text, expected substring
  local name=$1 text=$2 want=$3 dir=build/bad/$1
  rm -rf "$dir" && mkdir -p "$dir/out" && cp plans/fsdp4/* "$dir/out/"
  printf '%s\n' "$text" >"$dir/$name.lua"
  expect_rc "bad plan $name exits 2" 2 $LUA gen/commplan.lua "$dir/$name.lua" "$dir/out"
  run "bad plan $name: one-line message naming $want" bash -c '
    msg=$("$1" gen/commplan.lua "$2" "$3" 2>&1 >/dev/null); echo "$msg"
    [ "$(printf "%s\n" "$msg" | wc -l)" = 1 ] && printf "%s" "$msg" | grep -qF -- "$4"' _ "$LUA" "$dir/$name.lua" "$dir/out" "$want"
  run "bad plan $name: generated files untouched" diff -r plans/fsdp4 "$dir/out"
}
bad_plan syntax 'return { world_size = 4, model = {' 'syntax error'
bad_plan factor 'return { world_size = 8, parallel = { dp_shard = 3, dp_replicate = 2 }, model = { family = "llama", size = "8b" } }' \
  'dp_replicate(2) * dp_shard(3) * cp(1) * tp(1) * pp(1) * ep(1) = 6 != world_size(8). Set dp_shard=-1'
bad_plan typo 'return { world_size = 8, parallel = { dp_shard = -1 }, model = { family = "llama", size = "8b" }, fsdp = { reshard_after_froward = true } }' \
  "did you mean 'reshard_after_forward'"
bad_plan zero 'return { world_size = 2, parallel = { dp_shard = 2 }, model = { units = { { name = "root", params = { { name = "w", shape = { 0, 4 } } } } } } }' \
  'must be positive'
bad_plan nofactor 'return { world_size = 10, parallel = { dp_replicate = 4, dp_shard = -1 }, model = { family = "llama", size = "8b" } }' \
  'Cannot auto-infer dp_shard: world_size=10 is not divisible by dp_replicate*cp*tp*pp*ep=4'
expect_rc "binary: --world-size mismatch exits 2" 2 build/fsdp4/fsdp4 --simulate --world-size 8
# launcher_rc NAME RC MESSAGE ENV...: the binary under a launcher's environment.
launcher_rc() {
  local name=$1 want=$2 msg=$3; shift 3
  run "$name" bash -c 'out=$(env "${@:3}" build/fsdp4/fsdp4 --simulate --quiet 2>&1); rc=$?; echo "$out"
    [ "$rc" = "$1" ] && { [ -z "$2" ] || printf "%s" "$out" | grep -qF -- "$2"; }' _ "$want" "$msg" "$@"
}
M="MASTER_ADDR=10.0.0.1 MASTER_PORT=29500"
launcher_rc "binary: torchrun WORLD_SIZE mismatch exits 2" 2 "world size 8 does not match plan fsdp4" \
  RANK=0 WORLD_SIZE=8 LOCAL_RANK=0 $M
launcher_rc "binary: RANK outside WORLD_SIZE exits 2" 2 'RANK=4 is outside $WORLD_SIZE=4' RANK=4 WORLD_SIZE=4 LOCAL_RANK=0 $M
launcher_rc "binary: torchrun without LOCAL_RANK exits 2" 2 'LOCAL_RANK is unset' RANK=0 WORLD_SIZE=4 $M
launcher_rc "binary: no rendezvous address exits 2" 2 "set MASTER_ADDR and MASTER_PORT" RANK=0 WORLD_SIZE=4 LOCAL_RANK=0
launcher_rc "binary: Slurm world mismatch exits 2" 2 "world size 2 does not match" \
  SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 NCCL_COMM_ID=h:1
launcher_rc "binary: Open MPI rank of the plan's world runs" 0 "" \
  OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=3 $M
expect_rc "binary: unknown option exits 2" 2 build/fsdp4/fsdp4 --simulat
expect_rc "binary: bad --steps exits 2" 2 build/fsdp4/fsdp4 --simulate --steps 0
run "binary: --standin refuses --check (one-rank communicators hold no peers' data)" bash -c '
  out=$(build/fsdp4/fsdp4 --standin --check 2>&1); rc=$?; echo "$out"
  [ "$rc" = 2 ] && printf "%s" "$out" | grep -qF "cannot be checked"'
if nvidia-smi -L >/dev/null 2>&1; then skipped "binary: --standin without a GPU" "this machine has one"
else
  run "binary: --standin without a GPU exits 2 and says why" bash -c '
    out=$(build/fsdp4/fsdp4 --standin --rank 3 2>&1); rc=$?; echo "$out"
    [ "$rc" = 2 ] && printf "%s" "$out" | grep -qE "no CUDA device|no GPU backend"'
fi

echo
printf 'tests: %d passed, %d failed, %d skipped\n' "$pass" "$fail" "$skip"
[ "$fail" = 0 ]
