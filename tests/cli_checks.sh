#!/usr/bin/env bash
# The plan binary against a hostile or careless user (issue 20): special
# files where a file is expected, symlinks in its output directory, a full
# stdout, a launch that does not match the plan, flags the chosen run would
# ignore. Each case exits 0 when the binary held, else 1 with what it did.
#   tests/cli_checks.sh BINARY CASE     (BINARY: fsdp4's, a 4-rank plan)
#   tests/cli_checks.sh --list          (the cases)
set -u
CASES="fifo-id-file device-id-file dump-symlink dump-not-a-directory stdout-full world-size-named-first launcher-env-simulate
rank-mismatch ignored-flags valid-flags one-line-errors"
if [ "${1:-}" = --list ]; then echo $CASES; exit 0; fi
B=$1 case=$2
W=$(mktemp -d "${TMPDIR:-/tmp}/commplan-cli.XXXXXX") || exit 2
trap 'rm -rf "$W"' EXIT

# one_line RC WANT OUT...: exit status RC, stderr one line holding every WANT.
one_line() {
  local rc=$1 want_rc=$2 out=$3; shift 3
  printf 'exit %s: %s\n' "$rc" "$out"
  [ "$rc" = "$want_rc" ] || { echo "exit status $rc, expected $want_rc"; return 1; }
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [ -n "$out" ] || { echo "not one line"; return 1; }
  local w
  for w in "$@"; do printf '%s' "$out" | grep -qF -- "$w" || { echo "no '$w' in the message"; return 1; }; done
}
# timed SECONDS CMD...: runs CMD under timeout, sets rc, out (stderr) and secs.
timed() {
  local lim=$1; shift
  local t0; t0=$(date +%s.%N)
  out=$(timeout "$lim" "$@" 2>&1 >/dev/null); rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}
launch1="RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 COMMPLAN_ID_GENERATION=cli-test"

case $case in
fifo-id-file)
  # A FIFO where the NCCL id file should be: named at launch, at once (the
  # rendezvous' open() of it never returned).
  mkfifo "$W/id" || exit 2
  timed 20 env $launch1 COMMPLAN_ID_FILE="$W/id" "$B" --rendezvous-only --quiet
  echo "returned after $secs s"
  one_line "$rc" 2 "$out" "COMMPLAN_ID_FILE=$W/id is a FIFO, not a regular file" &&
    awk -v s="$secs" 'BEGIN { exit !(s < 5) }' && [ -p "$W/id" ] ;;
device-id-file)
  for dev in /dev/zero "$W"; do
    timed 20 env $launch1 COMMPLAN_ID_FILE="$dev" "$B" --rendezvous-only --quiet
    one_line "$rc" 2 "$out" "COMMPLAN_ID_FILE=$dev is a" "not a regular file" || exit 1
  done ;;
dump-symlink)
  # A symlink planted under an output's name: it is replaced, its target
  # untouched, nothing left beside the outputs.
  mkdir -p "$W/dump" && echo precious >"$W/victim" && ln -s ../victim "$W/dump/fsdp4.rank0.json" || exit 2
  "$B" --simulate --quiet --dump "$W/dump" || { echo "exit status $?"; exit 1; }
  [ "$(cat "$W/victim")" = precious ] || { echo "the symlink's target was written:"; head -c 200 "$W/victim"; exit 1; }
  [ -f "$W/dump/fsdp4.rank0.json" ] && [ ! -L "$W/dump/fsdp4.rank0.json" ] || { echo "rank 0's dump is not a file"; exit 1; }
  head -c 24 "$W/dump/fsdp4.rank0.json" | grep -qF '{"rank":0,"world":4' || { echo "rank 0's dump is not the dump"; exit 1; }
  left=$(ls -A "$W/dump" | grep -vxE 'fsdp4\.rank[0-3]\.json')
  [ -z "$left" ] || { echo "left behind: $left"; exit 1; } ;;
dump-not-a-directory)
  echo x >"$W/file"
  out=$("$B" --simulate --quiet --dump "$W/file" 2>&1); rc=$?
  one_line "$rc" 2 "$out" "--dump $W/file is a regular file, not a directory" || exit 1
  out=$("$B" --simulate --quiet --dump /dev/null 2>&1); rc=$?
  one_line "$rc" 2 "$out" "--dump /dev/null is a character device, not a directory" && [ "$(cat "$W/file")" = x ] ;;
stdout-full)
  # Output that never reached its reader is an error (close_stdout).
  for args in --dry-run --version --help "--simulate --steps 1"; do
    out=$("$B" $args 2>&1 >/dev/full); rc=$?
    one_line "$rc" 2 "$out" "cannot write standard output: No space left on device" || { echo "($args)"; exit 1; }
  done
  out=$("$B" --dry-run 2>&1 >/dev/null) && [ -z "$out" ] ;;
world-size-named-first)
  # A launch of 8 for a 4-rank plan is named as such, before any address is
  # needed, with both numbers and the fix; likewise Slurm and Open MPI.
  out=$(env RANK=0 WORLD_SIZE=8 LOCAL_RANK=0 "$B" --rendezvous-only --quiet 2>&1); rc=$?
  one_line "$rc" 2 "$out" "world size 8 does not match plan fsdp4 (generated for 4 ranks)" 'torchrun set $WORLD_SIZE=8' \
    "launch 4 ranks" "WORLD_SIZE=4" "world_size = 8" || exit 1
  case $out in *"rendezvous address"*) echo "names the rendezvous address first"; exit 1 ;; esac
  out=$(env SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 "$B" --rendezvous-only --quiet 2>&1); rc=$?
  one_line "$rc" 2 "$out" 'slurm set $SLURM_NTASKS=2' "srun --ntasks 4" || exit 1
  out=$(env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=16 OMPI_COMM_WORLD_LOCAL_RANK=0 "$B" --rendezvous-only 2>&1); rc=$?
  one_line "$rc" 2 "$out" 'openmpi set $OMPI_COMM_WORLD_SIZE=16' "mpirun -np 4" ;;
launcher-env-simulate)
  # --simulate and --dry-run need no launcher: inside torchrun, Slurm or
  # Open MPI variables (even ones that disagree with the plan, or are
  # incomplete) they run, saying so once on stderr; --quiet drops the note.
  for e in "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1" "SLURM_PROCID=3 SLURM_NTASKS=64 SLURM_JOB_ID=5" \
           "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=16 OMPI_COMM_WORLD_LOCAL_RANK=0"; do
    out=$(env $e "$B" --simulate 2>&1 >/dev/null); rc=$?
    one_line "$rc" 0 "$out" "note: --simulate runs all 4 ranks of plan fsdp4 in this process; the launcher's variables (" \
      ") are not used" || { echo "($e)"; exit 1; }
    out=$(env $e "$B" --dry-run 2>&1 >/dev/null); rc=$?
    one_line "$rc" 0 "$out" "note: --dry-run prints plan fsdp4's ops and needs no launcher" || { echo "($e)"; exit 1; }
    [ -z "$(env $e "$B" --simulate --quiet 2>&1)" ] || { echo "($e) --quiet printed"; exit 1; }
  done
  out=$(env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 "$B" --simulate 2>&1 >/dev/null)
  case $out in *"(torchrun, rank 1 of 2)"*) ;; *) echo "$out"; exit 1 ;; esac
  # every other run still checks the launch
  out=$(env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 "$B" --rendezvous-only 2>&1); rc=$?
  one_line "$rc" 2 "$out" "world size 2 does not match plan fsdp4" ;;
rank-mismatch)
  out=$("$B" --simulate --rank 4 2>&1); rc=$?
  one_line "$rc" 2 "$out" "rank 4 is outside plan fsdp4's 4 ranks (valid: 0..3)" || exit 1
  out=$(env RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 MASTER_ADDR=h MASTER_PORT=1 "$B" --rendezvous-only --rank 2 2>&1); rc=$?
  one_line "$rc" 2 "$out" "--rank 2 but torchrun started this process as rank 1" || exit 1
  out=$(env RANK=5 WORLD_SIZE=4 LOCAL_RANK=1 "$B" --rendezvous-only 2>&1); rc=$?
  one_line "$rc" 2 "$out" 'RANK=5 is outside $WORLD_SIZE=4' ;;
ignored-flags)
  # Each flag with a run that would ignore it: one line naming the flag.
  B=$(cd "$(dirname "$B")" && pwd)/$(basename "$B"); cd "$W" || exit 2
  while IFS='|' read -r flag args; do
    [ -n "$flag" ] || continue
    out=$("$B" $args 2>&1 >/dev/null); rc=$?
    one_line "$rc" 2 "$out" "$flag " "would ignore it: drop $flag" || { echo "($args)"; exit 1; }
  done <<'EOF'
--dump|--dry-run --dump DIR
--steps|--dry-run --steps 3
--pattern|--dry-run --pattern oracle
--arith|--dry-run --arith nccl
--quiet|--dry-run --quiet
--graph|--dry-run --graph
--standin|--dry-run --standin
--graph|--simulate --graph
--warmup|--simulate --warmup 2
--iters|--simulate --iters 2
--trace|--simulate --trace t.json
--arith|--check --arith gloo
--warmup|--check --warmup 1
--iters|--check --iters 1
--trace|--check --trace t.json
--pattern|--pattern oracle
--steps|--steps 2
--dump|--dump DIR
--arith|--standin --arith nccl
--steps|--standin --steps 2
EOF
  out=$("$B" --check --graph --dump DIR 2>&1 >/dev/null); rc=$?
  one_line "$rc" 2 "$out" "--dump reads every collective's buffers as it runs" "drop --graph or --dump" || exit 1
  [ ! -e DIR ] && [ ! -e t.json ] || { echo "a refused run wrote DIR or t.json"; exit 1; } ;;
valid-flags)
  # Every combination the README documents still runs.
  "$B" --simulate --steps 2 --pattern oracle --arith nccl --quiet --dump "$W/d" --world-size 4 --rank 3 &&
    "$B" --dry-run --world-size 4 >/dev/null && "$B" --simulate --quiet &&
    [ "$(ls "$W/d" | wc -l)" = 4 ] || exit 1
  # The GPU timing flags together: run (a GPU), or refused only for want of one.
  out=$(timeout 120 "$B" --standin --rank 3 --warmup 1 --iters 1 --graph --timeout 5 --quiet 2>&1); rc=$?
  [ "$rc" = 0 ] || one_line "$rc" 2 "$out" || exit 1
  case $out in *"would ignore"*) exit 1 ;; esac ;;
one-line-errors)
  # Whatever bytes a value holds, an error is one line.
  out=$("$B" --simulate --steps $'1\n2' 2>&1); rc=$?
  one_line "$rc" 2 "$out" "--steps needs an integer" || exit 1
  out=$("$B" $'--bogus\nsecond line' 2>&1); rc=$?
  one_line "$rc" 2 "$out" "unknown option" || exit 1
  out=$(env RANK=$'0\n1' WORLD_SIZE=4 LOCAL_RANK=0 "$B" --rendezvous-only 2>&1); rc=$?
  one_line "$rc" 2 "$out" "RANK=0?1 is not an integer" || exit 1
  out=$("$B" --simulate --quiet --dump "$W/file"$'\n'"x/"$'\xff' 2>&1) ||
    { rc=$?; echo "$out"; exit 1; }  # a strange but creatable directory name is fine
  out=$(env $launch1 COMMPLAN_ID_FILE=$'/dev/\nnull' "$B" --simulate --quiet 2>&1); rc=$?
  [ "$rc" = 0 ] || [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] ;;
*) echo "unknown case $case; cases: $CASES"; exit 2 ;;
esac
