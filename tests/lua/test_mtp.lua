-- DeepSeek-V3's multi-token prediction (model.num_mtp_layers,
-- gen/models/deepseek_v3.lua): the MTP units and their parameters in
-- torchtitan's order, the forward-call order's FSDP step
-- (gen/parallel/fsdp_schedule.lua calls_micro: the embedding gathered again
-- per depth, [norm, lm_head] once more in backward, one reduction per unit),
-- its difference from one forward per unit, and the refusals where
-- torchtitan refuses. tests/titan/test_mtp.py holds it to torchtitan on gloo.
local H = require("helpers")
local plan = require("gen.plan")
local ds = require("gen.models.deepseek_v3")

local T = {}

local TINY = "dim = 64, n_layers = 4, n_dense_layers = 2, n_heads = 4, vocab_size = 96, q_lora_rank = 16, "
  .. "kv_lora_rank = 32, qk_nope_head_dim = 8, qk_rope_head_dim = 8, v_head_dim = 8, dense_hidden_dim = 96, "
  .. "moe_hidden_dim = 32, num_experts = 4, num_shared_experts = 2, top_k = 2, seq_len = 16"

local function src(extra, parallel, training)
  return string.format("return { world_size = 4, parallel = %s, model = { family = 'deepseek_v3', %s%s }, "
    .. "fsdp = { param_dtype = 'bf16', reduce_dtype = 'fp32', reduce_op = 'sum' }%s }", parallel or "{ dp_shard = 4 }",
    TINY, extra or "", training and (", training = " .. training) or "")
end

local function gen(extra, parallel, training)
  return plan.from_source(src(extra, parallel, training), "plans/t.lua")
end

-- per unit name: all-gathers and reduce-scatters of the step
local function counts(p)
  local by = {}
  for _, u in ipairs(p.layout.units) do by[u.index] = u.name end
  local ag, rs, bwd = {}, {}, {}
  for _, o in ipairs(p.ops) do
    local n = by[o.unit]
    if o.kind == "all_gather" then ag[n] = (ag[n] or 0) + 1 end
    if o.kind == "reduce_scatter" then rs[n] = (rs[n] or 0) + 1 end
    if o.kind == "backward" then bwd[n] = (bwd[n] or 0) + 1 end
  end
  return ag, rs, bwd
end

function T.units_and_parameters()
  local p = gen(", num_mtp_layers = 2")
  local names = {}
  for _, u in ipairs(p.layout.units) do names[#names + 1] = u.name end
  H.list_eq(names, { "root", "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm_lm_head",
                     "mtp_layers.0", "mtp_layers.1" }, "units")
  local m = p.layout.units[8]
  local want = { "attention.wq_a.weight", "attention.q_norm.weight", "attention.wq_b.weight", "attention.wkv_a.weight",
                 "attention.kv_norm.weight", "attention.wkv_b.weight", "attention.wo.weight",
                 "attention_norm.weight", "ffn_norm.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight",
                 "mtp_norm.weight", "moe.routed_experts.inner_experts.w1_EFD",
                 "moe.routed_experts.inner_experts.w2_EDF", "moe.routed_experts.inner_experts.w3_EFD",
                 "moe.router.gate.weight", "moe.shared_experts.w1.weight", "moe.shared_experts.w2.weight",
                 "moe.shared_experts.w3.weight" }
  H.eq(#m.params, #want, "MTP block parameters")
  for i, w in ipairs(want) do H.eq(m.params[i].name, "mtp_layers.0." .. w, "parameter " .. i) end
  H.list_eq(m.params[12].shape, { 64, 128 }, "eh_proj [dim, 2 dim]")
  -- num_mtp_layers = 0 is the model without MTP: the same units as without the field
  local a, b = gen(", num_mtp_layers = 0"), gen("")
  H.eq(#a.ops, #b.ops, "num_mtp_layers = 0 ops")
  H.eq(a.layout.calls, nil, "no call order without MTP")
end

-- The measured FSDP order (tests/titan/test_mtp.py: 22 and 26 collectives per rank-step at 1 and 2 depths)
function T.forward_call_order_step()
  for n, total in pairs({ [1] = 22, [2] = 26 }) do
    local p = gen(", num_mtp_layers = " .. n)
    local ag, rs, bwd = counts(p)
    H.eq(ag.tok_embeddings, 1 + n + 1, n .. ": the embedding gathered per forward call and once in backward")
    H.eq(ag.norm_lm_head, 2, n .. ": [norm, lm_head] gathered again after its first post-backward resharded it")
    H.eq(ag["mtp_layers.0"], 2, n .. ": an MTP block as a block")
    local sum = 0
    for _, c in pairs(ag) do sum = sum + c end
    for name, c in pairs(rs) do
      H.eq(c, 1, n .. ": one reduce-scatter of " .. name)
      sum = sum + c
      H.eq(bwd[name], 1, n .. ": one gradient-writing backward of " .. name)
    end
    H.eq(sum, total, n .. ": collectives per step")
  end
  -- the mutant: one forward per unit (the call order dropped) is another step
  local saved = ds.calls
  ds.calls = function() return nil end
  local ok, p = pcall(gen, ", num_mtp_layers = 1")
  ds.calls = saved
  assert(ok, p)
  local ag = counts(p)
  H.eq(ag.tok_embeddings, 2, "the one-forward mutant gathers the embedding twice")
end

function T.micro_steps_and_hsdp_plan()
  local p = gen(", num_mtp_layers = 1", "{ dp_replicate = 2, dp_shard = 2 }")
  local _, rs = counts(p)
  H.eq(rs.tok_embeddings, 1, "HSDP: one reduce-scatter of the embedding")
  p = gen(", num_mtp_layers = 1", nil, nil)
  assert(#p.ops > 0)
end

function T.refusals()
  H.plan_fails(src(", num_mtp_layers = 1", "{ dp_shard = 2, pp = 2 }"), "model.num_mtp_layers", "mtp.py:199-204")
  H.plan_fails(src(", num_mtp_layers = 1", "{ dp_shard = 2, cp = 2 }"), "model.num_mtp_layers", "mtp.py:205-209")
  H.plan_fails(src(", num_mtp_layers = 1", nil, "{ loss_chunks = 8 }"), "training.loss_chunks", "mtp.py:271-275")
  H.plan_fails(src(", num_mtp_layers = 1", "{ dp_shard = 4, ep = 2 }"), "model.num_mtp_layers", "ep = 1")
  H.plan_fails(src(", num_mtp_layers = -1"), "model.num_mtp_layers")
  H.plan_fails(src(", num_mtp_layers = 1.5"), "model.num_mtp_layers")
  H.plan_fails("return { world_size = 4, model = { family = 'llama', size = '8b', num_mtp_layers = 1 } }",
               "model.num_mtp_layers", "deepseek_v3")
end

return T
