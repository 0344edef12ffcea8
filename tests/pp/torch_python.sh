# Sourced by tests/pp/check_live.sh and check_pipeline_live.sh: the
# repository root as the working directory, LUA, and PY, the torch
# environment's python (PYTHON=, else make torch-env's, else python3).
# shellcheck shell=bash
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
LUA=${LUA:-lua5.4}
PY=${PYTHON:-/root/.cache/commplan/torch-env/bin/python}
[ -x "$PY" ] || PY=python3
