-- The dense Qwen3 family (gen/models/qwen3.lua): the registry sizes'
-- parameter counts, names, order and shapes, the tied and untied wrapping,
-- a tied plan's collectives, its activations and the audit's counts, and
-- every bad input refused in one line. tests/titan/test_qwen3_plan.py
-- checks the same against torchtitan 0.3 itself (the numbers below are its
-- measurements).
local H = require("helpers")
local plan = require("gen.plan")
local qwen3 = require("gen.models.qwen3")
local compute = require("gen.compute")

local T = {}
local CTX = { file = "plans/t.lua", source = "" }

local function units_of(model, d)
  model.dtype = model.dtype or "bf16"
  model.family = "qwen3"
  return qwen3.units(CTX, model, d)
end

local function names(u)
  local out = {}
  for _, q in ipairs(u.params) do out[#out + 1] = q.name end
  return out
end

-- sum(p.numel() for p in model.parameters()) of torchtitan 0.3's registry
-- flavour built on the meta device (a tied table once).
function T.registry_parameter_counts()
  local want = { ["0.6b"] = 596049920, ["1.7b"] = 1720574976, ["4b"] = 4022468096, ["8b"] = 8190735360,
                 ["14b"] = 14768307200, ["32b"] = 32762123264 }
  for size, n in pairs(want) do
    local units, m = units_of({ size = size })
    H.eq(qwen3.count(units, m.config), n, size .. " parameters")
  end
  -- the size is case-insensitive; explicit numbers override it
  local units, m = units_of({ size = "0.6B", n_layers = 1 })
  H.eq(qwen3.count(units, m.config), 151936 * 1024 + 1024 + 1024 * (2048 + 2 * 1024) + 1024 * 2048 + 2 * 128
    + 3 * 3072 * 1024 + 2 * 1024, "one layer, tied")
end

function T.tied_units_and_wrapping()
  local units, numbers = units_of({ size = "0.6b" })
  H.eq(#units, 28 + 2, "units: [tok_embeddings, norm, lm_head], 28 blocks, root")
  H.eq(units[1].name, "tok_embeddings_norm_lm_head")
  H.eq(units[1].reshard_after_forward, false, "the tied unit stays unsharded after forward")
  H.list_eq(names(units[1]), { "tok_embeddings.weight", "norm.weight", "lm_head.weight" },
    "three FSDP parameters (spmd_types unties them before fully_shard)")
  H.list_eq(units[1].params[3].shape, { 151936, 1024 })
  H.eq(units[2].name, "layers.0")
  H.list_eq(names(units[2]), { "layers.0.attention.qkv_linear.wqkv.weight", "layers.0.attention.wo.weight",
    "layers.0.attention.q_norm.weight", "layers.0.attention.k_norm.weight", "layers.0.feed_forward.w1.weight",
    "layers.0.feed_forward.w2.weight", "layers.0.feed_forward.w3.weight", "layers.0.attention_norm.weight",
    "layers.0.ffn_norm.weight" }, "block 0")
  local p = units[2].params
  H.list_eq(p[1].shape, { 16 * 128 + 2 * 8 * 128, 1024 }, "wqkv: head_dim given, 2048 q rows > dim")
  H.list_eq(p[2].shape, { 1024, 2048 }, "wo")
  H.list_eq(p[3].shape, { 128 }, "q_norm over head_dim")
  H.list_eq(p[5].shape, { 3072, 1024 }, "w1: the registry's hidden_dim")
  H.eq(p[1].dtype, "bf16")
  H.eq(units[30].name, "root")
  H.eq(#units[30].params, 0)
  H.eq(numbers.n_kv_heads, 8)
  H.eq(numbers.config.enable_weight_tying, true)
end

function T.untied_units_and_unfused_qkv()
  local units, numbers = units_of({ size = "8b" })
  H.eq(numbers.config.enable_weight_tying, false, "8B is untied")
  H.eq(#units, 36 + 3)
  H.eq(units[1].name, "tok_embeddings")
  H.eq(units[38].name, "norm_lm_head")
  H.eq(units[38].reshard_after_forward, false)
  H.list_eq(names(units[38]), { "norm.weight", "lm_head.weight" })
  -- the untied numbers, tied on request; fuse_qkv = false: wq, wk, wv
  units = units_of({ size = "8b", n_layers = 1, fuse_qkv = false, enable_weight_tying = true })
  H.eq(units[1].name, "tok_embeddings_norm_lm_head")
  H.list_eq({ names(units[2])[1], names(units[2])[2], names(units[2])[3] }, { "layers.0.attention.qkv_linear.wq.weight",
    "layers.0.attention.qkv_linear.wk.weight", "layers.0.attention.qkv_linear.wv.weight" }, "unfused")
  H.list_eq(units[2].params[2].shape, { 1024, 4096 }, "wk")
  -- numbers without a size: untied and fused (torchtitan's defaults), head_dim dim / n_heads
  local u2, m2 = units_of({ dim = 64, n_layers = 1, n_heads = 4, n_kv_heads = 2, vocab_size = 10, hidden_dim = 96 })
  H.eq(m2.config.enable_weight_tying, false)
  H.eq(m2.config.head_dim, 16)
  H.list_eq(u2[2].params[1].shape, { 64 + 2 * 32, 64 }, "wqkv")
end

local TINY = [[return { world_size = 4, parallel = %s, model = { family = "qwen3", dim = 64, n_layers = 2,
  n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 250, hidden_dim = 96, enable_weight_tying = %s,
  seq_len = 16 }, fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum", micro_steps = %d },
  training = { loss_chunks = 1 } }]]

-- The collectives a tied plan issues per micro-step: the tied unit's one
-- all-gather first (8,080 = 2 x 4,000 + 80 elements per rank: the table twice
-- and the norm, as torchtitan's gloo run sends them) and its one
-- reduce-scatter last, after every block's.
function T.tied_plan_collectives()
  for _, micro in ipairs({ 1, 2 }) do
    local p = plan.from_source(string.format(TINY, "{ dp_shard = -1 }", "true", micro), "plans/t.lua")
    local seq = {}
    for _, o in ipairs(p.ops) do
      if o.group and o.micro_step == 0 then
        seq[#seq + 1] = string.format("%s %s %d", o.kind, p.layout.units[o.unit + 1].name, o.count)
      end
    end
    H.list_eq(seq, { "all_gather tok_embeddings_norm_lm_head 8080", "all_gather layers.0 7720",
      "all_gather layers.1 7720", "all_gather layers.1 7720", "all_gather layers.0 7720",
      "reduce_scatter layers.1 7720", "reduce_scatter layers.0 7720",
      "reduce_scatter tok_embeddings_norm_lm_head 8080" }, "micro-step 0's collectives")
  end
  -- HSDP: the replicas all-reduce each reduce-scatter's output
  local p = plan.from_source(string.format(TINY, "{ dp_replicate = 2, dp_shard = -1 }", "true", 1), "plans/t.lua")
  local n = 0
  for _, o in ipairs(p.ops) do
    if o.group then n = n + 1 end
  end
  H.eq(n, 11, "HSDP 2 x 2, tied: collectives per step (torchtitan's gloo run: 11)")
end

-- The audit counts the tied table once (params, sharded state, model FLOPs).
function T.tied_audit_counts()
  local tied = plan.from_source(string.format(TINY, "{ dp_shard = -1 }", "true", 1), "plans/t.lua")
  local untied = plan.from_source(string.format(TINY, "{ dp_shard = -1 }", "false", 1), "plans/t.lua")
  H.eq(compute.model_params(untied) - compute.model_params(tied), 250 * 64, "the tied table counted once")
  local s = compute.settings(tied)
  -- torchtitan: tied, 6 x every parameter (the table is lm_head's matmul); untied, 6 x all but the embedding
  H.eq(compute.model_flops_per_token(tied, s), compute.model_flops_per_token(untied, s),
    "the same matmuls either way")
  local memory = require("gen.memory")
  local function params_bytes(p)
    local ps = compute.settings(p)
    return memory.whole_rank(p, ps, compute.units(p, ps)).params_bytes
  end
  -- (the untied model has two tables, the tied one: 63 of the 250 rows per rank, fp32)
  H.eq(params_bytes(untied) - params_bytes(tied), 63 * 64 * 4, "one sharded copy of the tied table")
end

-- A block's bytes as torch measured them on torchtitan's dense Qwen3 block
-- (dim 64, 4 heads, 2 kv heads, head_dim 16, hidden 96, 2 x 128 bf16 tokens).
function T.block_activations()
  local cfg = { dim = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, hidden = 96, qk_norm = true }
  for _, fused in ipairs({ true, false }) do
    cfg.fuse_qkv = fused
    H.eq(qwen3.block_acts(cfg, 2, 256, "none").saved, 487424, "none")
    H.eq(qwen3.block_acts(cfg, 2, 256, "selective").saved, fused and 282624 or 249856, "selective")
    H.eq(qwen3.block_acts(cfg, 2, 256, "full").saved, 32768, "full")
    H.eq(qwen3.block_acts(cfg, 2, 256, "full").transient, 487424, "full's recompute")
  end
end

function T.bad_inputs_one_line_each()
  local function src(model, parallel)
    return string.format("return { world_size = 8, parallel = %s, model = { family = \"qwen3\", %s } }",
      parallel or "{ dp_shard = -1 }", model)
  end
  H.plan_fails(src('size = "7b"'), "model.size", "unknown Qwen3 size \"7b\"", "0.6b, 1.7b, 4b, 8b, 14b, 32b",
    "did you mean")
  H.plan_fails(src('dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 10'), "model.hidden_dim",
    "missing", 'give size = "0.6b"')
  H.plan_fails(src('size = "8b", n_kv_heads = 5'), "model.n_kv_heads", "n_heads=32 is not divisible by n_kv_heads=5")
  H.plan_fails(src('dim = 64, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 10, hidden_dim = 8'),
    "model.n_heads", "dim=64 is not divisible by n_heads=3", "set head_dim")
  H.plan_fails(src('size = "8b", num_experts = 8'), "model.num_experts", "dense Qwen3", 'family = "qwen3_moe"')
  H.plan_fails(src('size = "8b", moe_hidden_dim = 8'), "model.moe_hidden_dim",
    "the qwen3 family does not read moe_hidden_dim", "remove it")
  H.plan_fails(src('size = "8b", multiple_of = 256'), "model.multiple_of", "the qwen3 family does not read multiple_of")
  H.plan_fails(src('size = "8b", enable_weight_tying = 1'), "model.enable_weight_tying")
  H.plan_fails(src('size = "8b", hidden_dim = 0'), "model.hidden_dim")
  H.plan_fails(string.format("return { world_size = 8, model = { family = \"llama\", size = \"8b\", %s } }",
    "hidden_dim = 8"), "model.hidden_dim", "the llama family does not read hidden_dim", "family qwen3")
  -- (tp: tests/lua/test_qwen3_tp.lua)
end

return T
