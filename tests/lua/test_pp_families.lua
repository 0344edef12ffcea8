-- Pipeline parallel on every decoder family (issue 35): torchtitan 0.3's
-- pipeline_llm splits llama3, qwen3 and deepseek_v3 alike by module names
-- (distributed/pipeline_parallel.py:88-92, _generate_llm_fqn_per_model_part
-- :366-476); gen/parallel/pp_report.lua's unit_names maps each stage's
-- modules to the family's FSDP units (gen/models/*.lua) by one rule. Each
-- family's stages, its tables against torch's sequence (the generator's
-- proofs), and the refusals torchtitan makes.
local H = require("helpers")
local plan = require("gen.plan")
local report = require("gen.parallel.pp_report")
local T = {}

local MODELS = {
  qwen3 = 'dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 256, hidden_dim = 96',
  mixtral = 'dim = 16, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab_size = 64, moe_hidden_dim = 8, '
    .. 'num_experts = 4, top_k = 2',
  qwen3_moe = 'dim = 16, n_layers = 4, n_heads = 4, n_kv_heads = 2, head_dim = 8, vocab_size = 64, '
    .. 'moe_hidden_dim = 8, num_experts = 4, top_k = 2',
  deepseek_v3 = 'dim = 16, n_layers = 4, n_dense_layers = 1, n_heads = 2, vocab_size = 64, kv_lora_rank = 8, '
    .. 'qk_nope_head_dim = 4, qk_rope_head_dim = 4, v_head_dim = 4, dense_hidden_dim = 24, moe_hidden_dim = 8, '
    .. 'num_experts = 4, num_shared_experts = 1, top_k = 2',
}

local function src(family, o)
  o = o or {}
  return string.format([[return { world_size = %d, parallel = { pp = %d, %s dp_shard = -1 },
  model = { family = %q, %s, seq_len = 16 %s },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" %s }, training = { local_batch_size = 4 %s },
  pipeline = { schedule = %q, microbatches = 4 } }]], o.world or 4, o.pp or 2, o.par or "", family, MODELS[family],
    o.model or "", o.fsdp or "", o.training or "", o.schedule or "1F1B")
end

local function build(family, o)
  return plan.from_source(src(family, o), "tests/pp/plans/pp_" .. family .. ".lua")
end

-- the units of each pipeline rank (class per rank, TP class 0)
local function rank_units(p)
  local out = {}
  for _, c in ipairs(p.tp_classes) do
    if c.tp_class == 0 or c.tp_class == nil then
      local names = {}
      for _, u in ipairs(c.layout.units) do names[#names + 1] = u.name end
      out[c.pp_rank + 1] = table.concat(names, " ")
    end
  end
  return out
end

-- torchtitan's split of 4 layers over 2 stages (effective 6: 3 each, the
-- embedding and the output weighing one layer each): [tok_embeddings,
-- layers.0, layers.1], [layers.2, layers.3, norm, lm_head]; over 4
-- (Interleaved1F1B's 2 per rank): [tok_embeddings, layers.0], [layers.1,
-- layers.2 ], ... each mapped to the family's units
function T.every_decoder_family_splits_as_torchtitan()
  for family, out in pairs({ qwen3 = "norm_lm_head", mixtral = "norm_lm_head", qwen3_moe = "norm_lm_head",
                             deepseek_v3 = "norm_lm_head" }) do
    local p = build(family)
    H.list_eq(rank_units(p), { "tok_embeddings layers.0 layers.1", "layers.2 layers.3 " .. out }, family .. " 1F1B")
    H.eq(p.pipeline.sched.num_stages, 2, family .. " stages")
    local i = build(family, { schedule = "Interleaved1F1B" })
    -- stages 0, 2 on rank 0; 1, 3 on rank 1 (effective 6 over 4: 2, 2, 1, 1)
    H.list_eq(rank_units(i), { "tok_embeddings layers.0 layers.3", "layers.1 layers.2 " .. out },
      family .. " Interleaved1F1B")
  end
end

-- the unit rule itself: a module's parameters' unit, lm_head the loss
-- head (the llama family's output.weight), a MoE block's experts group
-- (ep > 1: "layers.<i>.experts", state "layers.<i>") with its block
function T.unit_rule_over_each_family()
  local units = {
    { name = "tok_embeddings", params = { { name = "tok_embeddings.weight" } } },
    { name = "layers.1", params = { { name = "layers.1.attention.wo.weight" } } },
    { name = "layers.1.experts", state = "layers.1",
      params = { { name = "layers.1.moe.routed_experts.inner_experts.w1_EFD" } } },
    { name = "layers.10", params = { { name = "layers.10.attention.wo.weight" } } },
    { name = "norm_output", loss_head = true, params = { { name = "norm.weight" }, { name = "output.weight" } } },
    { name = "root", params = {} },
  }
  H.list_eq(report.unit_names(units, "layers.1"), { "layers.1", "layers.1.experts" }, "block and its experts")
  H.list_eq(report.unit_names(units, "layers.10"), { "layers.10" }, "layers.10 is not layers.1")
  H.list_eq(report.unit_names(units, "norm"), { "norm_output" }, "norm")
  H.list_eq(report.unit_names(units, "lm_head"), { "norm_output" }, "lm_head: the loss head")
  H.list_eq(report.unit_names(units, "tok_embeddings"), { "tok_embeddings" }, "embedding")
end

-- DeepSeek-V3's dense first blocks are ordinary layers.<i> modules: the
-- split counts them as layers (pipeline_parallel.py:366), the stage holds
-- their FeedForward parameters
function T.deepseek_dense_first_layers_in_the_first_stage()
  local p = build("deepseek_v3", { model = ", n_dense_layers = 2" })
  local c0 = p.tp_classes[1]
  local dense, moe = 0, 0
  for _, u in ipairs(c0.layout.units) do
    for _, q in ipairs(u.params) do
      if q.name:find("feed_forward.w1", 1, true) then dense = dense + 1 end
      if q.name:find("routed_experts", 1, true) then moe = moe + 1 end
    end
  end
  H.eq(dense, 2, "layers.0 and layers.1 dense, on stage 0")
  H.eq(moe, 0, "no MoE block on stage 0")
end

-- qwen3 with TP under PP (FSDP x TP x PP, torchtitan's qwen3 TP plan inside
-- each stage): a class per (pipeline rank, TP class), the proofs pass
function T.qwen3_pp_with_tp()
  local p = build("qwen3", { world = 8, par = "tp = 2," })
  H.eq(#p.tp_classes, 2, "a class per pipeline rank (every TP rank's shapes alike)")
  H.eq(p.dims.tp, 2, "tp")
  local tp_ops = 0
  for _, o in ipairs(p.tp_classes[2].ops) do if o.group == "tp" then tp_ops = tp_ops + 1 end end
  assert(tp_ops > 0, "TP collectives in pipeline rank 1's tables")
  assert(p.pipeline.counts and p.pipeline.counts.events > 0, "the whole-step proof ran")
end

-- Where torchtitan refuses: weight tying with PP (models/common/decoder.py:
-- 139-142); a generic model (no decoder module names to split by)
function T.pp_refusals_by_family()
  H.plan_fails(src("qwen3", { model = ", enable_weight_tying = true" }), "model.enable_weight_tying:",
    "Weight tying is not supported with Pipeline Parallel", "decoder.py:139")
  H.plan_fails([[return { world_size = 4, parallel = { pp = 2, dp_shard = -1 },
    model = { family = "generic", units = { { name = "a", params = { { name = "w", shape = { 8, 8 } } } } } },
    training = { local_batch_size = 4 } }]], "model.family:", "generic", "pipeline_parallel.py:88")
  -- the tied flavours by size, untied by the plan: accepted
  local p = plan.from_source(src("qwen3", { model = ", enable_weight_tying = false" }), "x.lua")
  H.eq(p.pp.size, 2, "untied qwen3 plans")
end

return T
