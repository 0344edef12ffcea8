-- Lua unit tests for the generator stages. Run from the repo root:
--   lua5.4 tests/lua/run.lua
package.path = "./?.lua;./tests/lua/?.lua;" .. package.path

local suites = { "test_load", "test_dims", "test_layout", "test_schedule", "test_memplan", "test_generate", "test_tp",
                 "test_audit", "test_agree", "test_svg" }
-- Issue 8: hostile input (the sandbox, limits, C escaping).
for _, s in ipairs({ "test_sandbox", "test_cstring", "test_fsio" }) do suites[#suites + 1] = s end
-- Issue 19: linear generation.
suites[#suites + 1] = "test_scale"
suites[#suites + 1] = "test_repeat"
-- Issue 22: pipeline schedules as torch.distributed.pipelining builds them.
suites[#suites + 1] = "test_pp_schedule"
suites[#suites + 1] = "test_pp_stages"
suites[#suites + 1] = "test_pp_audit"
suites[#suites + 1] = "test_pp_sequence"
suites[#suites + 1] = "test_pp_step_proof"
suites[#suites + 1] = "test_pp_tables"
suites[#suites + 1] = "test_pp_families"
-- Issue 22, step 0: the parallelisms as modules.
suites[#suites + 1] = "test_parallel"
-- Issue 21: NCCL's tuning model and the published calibration rows.
suites[#suites + 1] = "test_nccl_model"
-- Issue 23, item 1: the MoE model families.
suites[#suites + 1] = "test_moe_models"
-- Issue 23, items 3 and 4: expert parallel (ep > 1).
suites[#suites + 1] = "test_ep"
-- Issue 23, item 6: commplan's EP tables against torchtitan's run on gloo.
suites[#suites + 1] = "test_ep_live"
-- Issue 23: the MoE families' activations in the memory model.
suites[#suites + 1] = "test_moe_acts"
-- The Llama block's and the output unit's activations (torchtitan 0.3's SAC, ChunkedLossWrapper).
suites[#suites + 1] = "test_llama_acts"
-- torchtitan's ChunkedLossWrapper in the step: the partial reductions of the [norm, lm_head] unit.
suites[#suites + 1] = "test_chunked_loss"
-- Context parallel (gen/parallel/cp.lua).
suites[#suites + 1] = "test_cp"
-- The dense Qwen3 family (torchtitan 0.3's qwen3 0.6B .. 32B, tied embeddings).
suites[#suites + 1] = "test_qwen3"
-- Issue 35: TP on the dense Qwen3 family (torchtitan 0.3's models/qwen3/sharding.py).
suites[#suites + 1] = "test_qwen3_tp"
-- Issue 35: TP and EP x TP on the GQA MoE families (torchtitan 0.3's Qwen3 MoE plan).
suites[#suites + 1] = "test_moe_tp"
-- Issue 33: outputs never through a link, huge buffers and network figures refused in one line.
suites[#suites + 1] = "test_hostile_outputs"
-- Issue 33: sizes bounded before the work they drive; pipeline CSVs read beside the plan, bounded, never echoed.
suites[#suites + 1] = "test_bounds"
-- Issue 42: memory figures, collective prices and capacity rounding against hand-computed values.
suites[#suites + 1] = "test_memory_figures"
suites[#suites + 1] = "test_prices"
suites[#suites + 1] = "test_capacity"
-- Issue 34, item 3: one-knob diffs of pipeline and MoE plans read in under 60 lines.
suites[#suites + 1] = "test_plan_diff_lines"
-- Issue 37, item 4: a plan that does not fit said at once; the presets' memory as the devices report it.
suites[#suites + 1] = "test_fit"
-- Issue 37, item 5: the compute stream's collectives named as what they are (expert all-to-alls, CP K/V, TP).
suites[#suites + 1] = "test_labels"
-- Issue 37, item 1: every model's audit complete (MoE tokens/s and MFU from torchtitan's active parameters).
suites[#suites + 1] = "test_complete"
-- Issue 37, items 2 and 3: compute priced from shapes, held to torchtitan's published rows.
suites[#suites + 1] = "test_compute_model"
-- Issue 39: mixed all-gather dtypes in one unit (per-parameter param_dtype, FSDP2's uint8 all-gather).
suites[#suites + 1] = "test_mixed_dtype"
-- Issue 40: the expected trace in Flight Recorder's terms (gen/expect.lua).
suites[#suites + 1] = "test_expect"
-- Issue 39: CPUOffloadPolicy (the H2D / D2H copies, host memory, host_GBps).
suites[#suites + 1] = "test_offload"
-- Issue 39 (h39a): FSDPModule's schedule knobs (set_reshard_after_backward, ...).
suites[#suites + 1] = "test_fsdp_knobs"
-- Issue 41 (h41d): symmetric-memory FSDP (fsdp.symm_mem): the window, its proof and mutants.
suites[#suites + 1] = "test_symm"
-- Issue 39 (h39r): reshard_after_forward as an int (post-forward groups).
suites[#suites + 1] = "test_raf_int"
-- Issue 41 (h41a): torchtitan job-config options as plan fields (the reshard policy, ...).
suites[#suites + 1] = "test_titan_options"
-- Issue 41 (h41b): torchtitan's fused layouts (model.fused: fused SwiGLU, grouped experts, MLA).
suites[#suites + 1] = "test_fused"
-- Issue 41 (h41c): torchtitan 0.3's gpt-oss family (sinks, biases, sliding-window attention, EP).
suites[#suites + 1] = "test_gpt_oss"
-- Issue 41 (hmtp): DeepSeek-V3's multi-token prediction (model.num_mtp_layers, the forward-call order).
suites[#suites + 1] = "test_mtp"
-- The advisor's rankings computed once per run, not once per suite that asks (tests/lua/advice_memo.lua).
require("advice_memo").install()
local passed, failed = 0, 0
for _, s in ipairs(suites) do
  local cases = require(s)
  local names = {}
  for name in pairs(cases) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local ok, err = pcall(cases[name])
    if ok then passed = passed + 1
    else
      failed = failed + 1
      io.stderr:write(string.format("FAIL %s.%s: %s\n", s, name, tostring(err)))
    end
  end
end
print(string.format("lua: %d passed, %d failed", passed, failed))
os.exit(failed == 0 and 0 or 1)
