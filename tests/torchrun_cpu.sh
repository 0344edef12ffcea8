#!/bin/bash
# torch's own torchrun launches plan binaries on CPU (issue 17, item 4): the
# launch path runs for real up to NCCL (--rendezvous-only): torchrun's
# variables, its agent store as the NCCL-id channel (TCPStore wire protocol,
# the launch counter, every rank's plan compared), COMMPLAN_ID_FILE.
#   tests/torchrun_cpu.sh TORCHRUN   (from the repository root, after
#                                     make PLAN=fsdp4.lua and PLAN=hsdp2x2.lua)
# One "ok"/"FAIL" line per check, then "torchrun: N passed, N failed".
set -u
torchrun=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/torchrun_cpu.XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok    $1"; }
bad() { fail=$((fail + 1)); echo "  FAIL  $1"; shift; for f in "$@"; do sed 's/^/        | /' "$f" | tail -n 8; done; }
# A port free now and below the ephemeral range (never 20000 + $$: that
# range can hold the ports NCCL's and the store's own sockets are handed).
free_port() { python3 tests/free_port.py; }

# launch NAME OUT TORCHRUN-ARGS... -- CMD...: each rank's output in OUT/rank<R>.log
launch() {
  local out=$1; shift
  mkdir -p "$out"
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  # shellcheck disable=SC2016
  COMMPLAN_INIT_TIMEOUT=${COMMPLAN_INIT_TIMEOUT:-30} OMP_NUM_THREADS=1 timeout 120 "$torchrun" "${args[@]}" \
    --no-python sh -c 'out=$0; exec "$@" >"$out/rank$RANK.log" 2>&1' "$out" "$@" >"$out/torchrun.log" 2>&1
}

# same_id OUT N [LAUNCH]: N ranks each printed one line with the same stand-in id (and launch number)
same_id() {
  local out=$1 n=$2 want=${3:-0} ids
  ids=$(cat "$out"/rank*.log 2>/dev/null | grep -c "launch $want: stand-in NCCL id")
  [ "$ids" = "$n" ] || return 1
  [ "$(grep -ho "launch $want: stand-in NCCL id [0-9a-f]*" "$out"/rank*.log | sort -u | wc -l)" = 1 ]
}

# gone PREFIX: no file is left whose name starts with PREFIX (rank 0 removed
# the id file and the acknowledgements once every rank had the id)
gone() {
  local f
  for f in "$1"*; do [ -e "$f" ] && return 1; done
  return 0
}

fsdp4=build/fsdp4/fsdp4 hsdp2x2=build/hsdp2x2/hsdp2x2

what="torchrun --standalone --nproc-per-node 4: every rank gets rank 0's id through torchrun's store, plans compared"
if launch "$dir/a" --standalone --nproc-per-node 4 -- "$fsdp4" --rendezvous-only && same_id "$dir/a" 4 &&
   grep -q "on every rank; stopping before NCCL" "$dir/a/rank3.log"; then ok "$what"
else bad "$what" "$dir/a/torchrun.log" "$dir"/a/rank*.log; fi

port=$(free_port)
what="torchrun --nnodes 1 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$port"
if launch "$dir/b" --nnodes 1 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
     --rdzv-id commplan-b -- "$fsdp4" --rendezvous-only && same_id "$dir/b" 4; then ok "$what"
else bad "$what" "$dir/b/torchrun.log" "$dir"/b/rank*.log; fi

what="two jobs at once (fsdp4 and hsdp2x2, each 4 ranks under its own torchrun): neither disturbs the other"
launch "$dir/c1" --standalone --nproc-per-node 4 -- "$fsdp4" --rendezvous-only & p1=$!
launch "$dir/c2" --standalone --nproc-per-node 4 -- "$hsdp2x2" --rendezvous-only & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
if [ $r1 = 0 ] && [ $r2 = 0 ] && same_id "$dir/c1" 4 && same_id "$dir/c2" 4 &&
   [ "$(cat "$dir"/c1/rank0.log "$dir"/c2/rank0.log | grep -o 'NCCL id [0-9a-f]*' | sort -u | wc -l)" = 2 ]; then
  ok "$what"
else bad "$what" "$dir/c1/torchrun.log" "$dir/c2/torchrun.log" "$dir"/c1/rank*.log "$dir"/c2/rank*.log; fi

what="the binary run twice in one launch: the second run counts launch 1 and gets its own id, not the first's"
mkdir -p "$dir/d"
# shellcheck disable=SC2016
if launch "$dir/d" --standalone --nproc-per-node 4 -- sh -c '"$0" --rendezvous-only && "$0" --rendezvous-only' "$fsdp4" &&
   same_id "$dir/d" 4 0 && same_id "$dir/d" 4 1 &&
   [ "$(grep -ho 'NCCL id [0-9a-f]*' "$dir/d/rank0.log" | sort -u | wc -l)" = 2 ]; then ok "$what"
else bad "$what" "$dir/d/torchrun.log" "$dir"/d/rank*.log; fi

what="rank 2 built from another plan: every rank refused with one line naming it, torchrun fails"
# shellcheck disable=SC2016
if ! launch "$dir/e" --standalone --nproc-per-node 4 -- \
     sh -c 'if [ "$RANK" = 2 ]; then exec "$1" --rendezvous-only; else exec "$0" --rendezvous-only; fi' "$fsdp4" "$hsdp2x2" &&
   [ "$(grep -l 'rank 2 runs plan hsdp2x2 (fingerprint [0-9a-f]*), rank 0 plan fsdp4' "$dir"/e/rank*.log | wc -l)" = 4 ] &&
   [ "$(cat "$dir"/e/rank*.log | wc -l)" = 4 ]; then ok "$what"
else bad "$what" "$dir/e/torchrun.log" "$dir"/e/rank*.log; fi

what="COMMPLAN_ID_FILE under torchrun: rank 0 writes the id file, every rank reads it"
if COMMPLAN_ID_FILE=$dir/f-id launch "$dir/f" --standalone --nproc-per-node 4 -- "$fsdp4" --rendezvous-only &&
   same_id "$dir/f" 4 && grep -q "through COMMPLAN_ID_FILE" "$dir/f/rank1.log"; then ok "$what"
else bad "$what" "$dir/f/torchrun.log" "$dir"/f/rank*.log; fi

what="COMMPLAN_ID_FILE, the binary run twice in one launch: the second run waits for its own id, not the first's file"
# shellcheck disable=SC2016
if COMMPLAN_ID_FILE=$dir/twice-id launch "$dir/i" --standalone --nproc-per-node 4 -- \
     sh -c '"$0" --rendezvous-only && "$0" --rendezvous-only' "$fsdp4" &&
   [ "$(cat "$dir"/i/rank*.log | grep -c 'through COMMPLAN_ID_FILE, launch 0: stand-in NCCL id')" = 8 ] &&
   [ "$(for f in "$dir"/i/rank*.log; do sed -n 1p "$f"; done | grep -o 'NCCL id [0-9a-f]*' | sort -u | wc -l)" = 1 ] &&
   [ "$(for f in "$dir"/i/rank*.log; do sed -n 2p "$f"; done | grep -o 'NCCL id [0-9a-f]*' | sort -u | wc -l)" = 1 ] &&
   [ "$(grep -ho 'NCCL id [0-9a-f]*' "$dir/i/rank0.log" | sort -u | wc -l)" = 2 ] &&
   gone "$dir/twice-id"; then ok "$what"
else bad "$what" "$dir/i/torchrun.log" "$dir"/i/rank*.log; fi

what="two jobs at once sharing one COMMPLAN_ID_FILE: each writes and reads a file of its own beside it, removed once read"
COMMPLAN_ID_FILE=$dir/shared-id launch "$dir/h1" --standalone --nproc-per-node 4 -- "$fsdp4" --rendezvous-only & p1=$!
COMMPLAN_ID_FILE=$dir/shared-id launch "$dir/h2" --standalone --nproc-per-node 4 -- "$hsdp2x2" --rendezvous-only & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
if [ $r1 = 0 ] && [ $r2 = 0 ] && same_id "$dir/h1" 4 && same_id "$dir/h2" 4 &&
   gone "$dir/shared-id"; then ok "$what"
else bad "$what" "$dir/h1/torchrun.log" "$dir/h2/torchrun.log" "$dir"/h1/rank*.log "$dir"/h2/rank*.log; fi

what="a launch of the wrong size (torchrun --nproc-per-node 2 for the 4-rank fsdp4): refused on every rank before any rendezvous"
if ! launch "$dir/g" --standalone --nproc-per-node 2 -- "$fsdp4" --rendezvous-only &&
   [ "$(grep -l 'WORLD_SIZE' "$dir"/g/rank*.log | wc -l)" = 2 ]; then ok "$what"
else bad "$what" "$dir/g/torchrun.log" "$dir"/g/rank*.log; fi

echo "torchrun: $pass passed, $fail failed"
[ "$fail" = 0 ]
