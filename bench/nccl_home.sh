# Sourced by bench/gpu_session.sh and bench/gpu_checks.sh: a lua5.4 carried
# in .tools/ where the machine has none (generation only), and NCCL: CUDA's
# own, else the one PyTorch's wheels bring (NCCL_HOME for the Makefile).
# shellcheck shell=sh
[ -x .tools/lua5.4 ] && PATH=$PWD/.tools:$PATH && export PATH
if [ -z "${NCCL_HOME:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  d=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  if [ -n "$d" ] && [ -f "$d/include/nccl.h" ]; then
    mkdir -p /tmp/nccl/lib && ln -sfn "$d/include" /tmp/nccl/include
    ln -sf "$d/lib/libnccl.so.2" /tmp/nccl/lib/libnccl.so.2 && ln -sf "$d/lib/libnccl.so.2" /tmp/nccl/lib/libnccl.so
    NCCL_HOME=/tmp/nccl && export NCCL_HOME
  fi
fi
