#!/usr/bin/env bash
# The live FSDP2 peer's Python environment (make torch-env): a virtual
# environment outside the clone, shared by every clone and CI run on this
# machine, built from python/requirements-live.txt alone.
#
#   tests/live/torch_env.sh           build it if needed; print torch's version
#   tests/live/torch_env.sh --python  the same, then the venv's python on the last line
#
# Where: ${COMMPLAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/commplan}/torch-env.
# Idempotent: a stamp inside it holds the requirements file's SHA-256, and
# a second run with the same file only imports torch (well under a second
# of pip). A changed requirements file rebuilds it from scratch. Builds run
# under flock on torch-env.lock, so concurrent make test runs (CI jobs on
# one machine) wait for one install instead of racing; an install killed
# half way leaves no stamp and is redone.
#
# Exit status: 0 ready; 3 the package registry cannot be reached (callers
# print SKIP, never pass); 1 anything else (the pip log's tail is shown).
# Remove it: rm -rf "${COMMPLAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/commplan}/torch-env"
set -u
cd "$(dirname "$0")/../.."
REQ=python/requirements-live.txt
want_python=0
[ "${1:-}" = --python ] && want_python=1
CACHE=${COMMPLAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/commplan}
ENV=$CACHE/torch-env
PY=${PYTHON:-python3}

[ -f "$REQ" ] || { echo "torch-env: $REQ is missing" >&2; exit 1; }
hash=$(sha256sum "$REQ" | cut -d' ' -f1)
mkdir -p "$CACHE" || { echo "torch-env: cannot create $CACHE" >&2; exit 1; }

ready() {
  [ "$(cat "$ENV/.commplan-stamp" 2>/dev/null)" = "$hash" ] &&
    ver=$("$ENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) && [ -n "$ver" ]
}
report() {
  echo "torch-env: torch $ver in $ENV"
  [ "$want_python" = 1 ] && echo "$ENV/bin/python"
  exit 0
}

ver=""
ready && report
exec 9>"$CACHE/torch-env.lock" || { echo "torch-env: cannot open $CACHE/torch-env.lock" >&2; exit 1; }
if ! flock -n 9; then
  echo "torch-env: another install holds $CACHE/torch-env.lock; waiting" >&2
  flock 9
fi
ready && report # built by the holder of the lock meanwhile

command -v "$PY" >/dev/null 2>&1 || { echo "torch-env: no $PY (set PYTHON=/path/to/python3.10+)" >&2; exit 1; }
"$PY" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null ||
  { echo "torch-env: $PY is not Python >= 3.10 with venv and ensurepip (apt-get install python3-venv, or set PYTHON=)" >&2; exit 1; }

# Is the registry there at all? One small pinned wheel, short timeouts, so
# a machine without network gives its SKIP in seconds, not after pip's
# retries over 100 packages.
probe=$(mktemp -d "${TMPDIR:-/tmp}/torch-env-probe.XXXXXX") || exit 1
pin=$(grep -m1 '^typing-extensions==' "$REQ" | cut -d' ' -f1)
if ! "$PY" -m pip download --no-deps --no-cache-dir --disable-pip-version-check --timeout 20 --retries 1 \
     -d "$probe" "${pin:-typing-extensions}" >"$probe/log" 2>&1; then
  echo "torch-env: the package registry is not reachable ($(grep -m1 -oE 'NewConnectionError|Name or service not known|Temporary failure in name resolution|timed out|No matching distribution[^.]*' "$probe/log" || echo 'pip download failed'))"
  rm -rf "$probe"; exit 3
fi
rm -rf "$probe"

echo "torch-env: installing $REQ into $ENV (first time: ~3.1 GB download, ~6 GB on disk)" >&2
start=$(date +%s)
rm -rf "$ENV"
log=$CACHE/torch-env.install.log
if ! { "$PY" -m venv "$ENV" && "$ENV/bin/python" -m pip install --disable-pip-version-check --no-input \
         -r "$REQ"; } >"$log" 2>&1; then
  if grep -qE 'NewConnectionError|Name or service not known|Temporary failure in name resolution|ReadTimeoutError|ConnectTimeoutError' "$log"; then
    echo "torch-env: the package registry went away during the install (log: $log)"; rm -rf "$ENV"; exit 3
  fi
  echo "torch-env: pip install -r $REQ failed (log: $log):" >&2; tail -n 15 "$log" >&2; exit 1
fi
ver=$("$ENV/bin/python" -c 'import torch; print(torch.__version__)') || { echo "torch-env: torch does not import (log: $log)" >&2; exit 1; }
echo "$hash" >"$ENV/.commplan-stamp"
echo "torch-env: installed in $(( $(date +%s) - start )) s, $(du -sh "$ENV" | cut -f1) on disk" >&2
report
