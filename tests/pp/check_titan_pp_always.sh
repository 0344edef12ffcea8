#!/usr/bin/env bash
# Live check (issue 41): torchtitan 0.3's pipeline_llm on gloo with
# fsdp_reshard_after_forward = "always" (distributed/fsdp.py:54-77: True
# under PP too), qwen3, pp 2 x dp_shard 2: every unit resharded after each
# microbatch's forward and gathered again by its backward. tests/pp/
# check_titan_pp.sh's comparison for its "always" cases (1F1B, Interleaved1F1B,
# and PP x EP on DeepSeek-V3 with ep 2, efsdp 1 and 2: torchtitan's explicit
# prefetch lists per microbatch): every rank's sends,
# receives, FSDP collectives and token all-to-alls in
# order vs the pipeline tables, the reduced gradients element for element;
# then the mutant, each recording against the plan of the "default" policy
# (no reshard after forward under PP), must differ.
# tests/run.sh runs it in the full tier only (make test-full, ~90 s); make test's
# quick tier holds "always" under PP through check_pipeline_live.sh's always mesh.
# Every case runs whatever COMMPLAN_TEST_TIER says.
set -u
cd "$(dirname "$0")/../.." || exit 2
PP_TITAN_OUT=build/pp/titan_always \
  PP_TITAN_CASES=qwen3_pp2_always,qwen3_pp2_always_i1f1b,dsv3_pp2_ep2_always,dsv3_pp2_dp4_ep2_always \
  COMMPLAN_TEST_TIER=full exec tests/pp/check_titan_pp.sh
