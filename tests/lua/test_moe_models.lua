-- The MoE model families (gen/models/moe.lua, mixtral.lua, qwen3_moe.lua,
-- deepseek_v3.lua): the published sizes' parameter counts, units and
-- wrapping, the experts' FSDP placement, generation at ep = 1, and every
-- bad input refused in one line. tests/titan/test_moe_plan.py checks the
-- same against torchtitan 0.3 itself.
local H = require("helpers")
local plan = require("gen.plan")
local moe = require("gen.models.moe")
local mixtral = require("gen.models.mixtral")
local qwen3_moe = require("gen.models.qwen3_moe")
local ds = require("gen.models.deepseek_v3")

local T = {}
local CTX = { file = "plans/t.lua", source = "" }

local function units_of(fam, model, d)
  model.dtype = model.dtype or "bf16"
  return fam.units(CTX, model, d)
end

local function names(u)
  local out = {}
  for _, q in ipairs(u.params) do out[#out + 1] = q.name end
  return out
end

-- Exact counts: torchtitan 0.3's own (sum of numel over named_parameters of
-- its registry flavour built on the meta device: qwen3 30B-A3B, 235B-A22B,
-- deepseek_v3 16B, 671B); Mixtral's as published (46.7B, 141B).
function T.published_sizes_parameter_counts()
  local want = {
    { mixtral, "8x7b", 46702792704 }, { mixtral, "8x22b", 140620634112 },
    { qwen3_moe, "30b-a3b", 30532122624 }, { qwen3_moe, "235b-a22b", 235093634560 },
    { ds, "16b", 15706484224 }, { ds, "671b", 671026404352 },
  }
  for _, w in ipairs(want) do
    H.eq(moe.count(units_of(w[1], { size = w[2] })), w[3], w[2] .. " parameters")
  end
  local function approx(fam, size, billions)
    local n = moe.count(units_of(fam, { size = size })) / 1e9
    assert(math.abs(n - billions) < 0.5, string.format("%s: %.2fB parameters, published %.1fB", size, n, billions))
  end
  approx(mixtral, "8x7b", 46.7)
  approx(mixtral, "8x22b", 141)
  approx(ds, "671b", 671)
  -- the size is case-insensitive; explicit numbers override it
  H.eq(moe.count(units_of(mixtral, { size = "8X7B", n_layers = 1 })), 2 * 32000 * 4096 + 4096
    + 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 8 * 14336 * 4096 + 8 * 4096 + 2 * 4096, "one layer")
end

function T.mixtral_units_and_wrapping()
  local units, numbers = units_of(mixtral, { size = "8x7b" })
  H.eq(#units, 32 + 3, "units: embedding, 32 blocks, [norm, lm_head], root")
  H.eq(units[1].name, "tok_embeddings")
  H.list_eq(names(units[1]), { "tok_embeddings.weight" }, "embedding unit")
  H.eq(units[33].name, "layers.31")
  H.eq(units[34].name, "norm_lm_head")
  H.eq(units[34].reshard_after_forward, false, "[norm, lm_head] stays unsharded after forward")
  H.list_eq(names(units[34]), { "norm.weight", "lm_head.weight" }, "last unit")
  H.eq(units[35].name, "root")
  H.eq(#units[35].params, 0, "the root owns nothing")
  H.list_eq(names(units[2]), { "layers.0.attention.qkv_linear.wqkv.weight", "layers.0.attention.wo.weight",
    "layers.0.moe.routed_experts.inner_experts.w1_EFD", "layers.0.moe.routed_experts.inner_experts.w2_EDF",
    "layers.0.moe.routed_experts.inner_experts.w3_EFD", "layers.0.moe.router.gate.weight",
    "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight" }, "block 0")
  local p = units[2].params
  H.list_eq(p[1].shape, { 4096 + 2 * 1024, 4096 }, "wqkv")
  H.list_eq(p[3].shape, { 8, 14336, 4096 }, "w1_EFD")
  H.list_eq(p[4].shape, { 8, 4096, 14336 }, "w2_EDF")
  H.list_eq(p[6].shape, { 8, 4096 }, "gate")
  H.eq(p[3].dtype, "bf16")
  H.eq(numbers.num_experts, 8)
  H.eq(numbers.n_kv_heads, 8)
  H.eq(numbers.config.top_k, 2)
  -- unfused q, k, v
  local u = units_of(mixtral, { size = "8x7b", n_layers = 1, fuse_qkv = false })
  H.list_eq({ names(u[2])[1], names(u[2])[2], names(u[2])[3] }, { "layers.0.attention.qkv_linear.wq.weight",
    "layers.0.attention.qkv_linear.wk.weight", "layers.0.attention.qkv_linear.wv.weight" }, "unfused")
  H.list_eq(u[2].params[2].shape, { 1024, 4096 }, "wk")
end

function T.qwen3_moe_has_qk_norms_and_head_dim()
  local units = units_of(qwen3_moe, { size = "30b-a3b" })
  local n = names(units[2])
  H.eq(n[3], "layers.0.attention.q_norm.weight")
  H.eq(n[4], "layers.0.attention.k_norm.weight")
  H.list_eq(units[2].params[1].shape, { (32 + 2 * 4) * 128, 2048 }, "wqkv with head_dim 128")
  H.list_eq(units[2].params[2].shape, { 2048, 32 * 128 }, "wo")
  H.list_eq(units[2].params[3].shape, { 128 }, "q_norm")
  H.eq(#units, 48 + 3)
end

function T.deepseek_v3_dense_first_layers_and_shared_experts()
  local units, numbers = units_of(ds, { size = "671b" })
  H.eq(#units, 61 + 3)
  H.eq(numbers.n_kv_heads, nil, "MLA has no kv heads of its own")
  local dense = names(units[4]) -- layers.2
  H.list_eq(dense, { "layers.2.attention.wq_a.weight", "layers.2.attention.q_norm.weight",
    "layers.2.attention.wq_b.weight", "layers.2.attention.wkv_a.weight", "layers.2.attention.kv_norm.weight",
    "layers.2.attention.wkv_b.weight", "layers.2.attention.wo.weight", "layers.2.attention_norm.weight",
    "layers.2.ffn_norm.weight", "layers.2.feed_forward.w1.weight", "layers.2.feed_forward.w2.weight",
    "layers.2.feed_forward.w3.weight" }, "dense block")
  local m = units[5] -- layers.3, the first MoE block
  H.list_eq({ table.unpack(names(m), 10) }, { "layers.3.moe.routed_experts.inner_experts.w1_EFD",
    "layers.3.moe.routed_experts.inner_experts.w2_EDF", "layers.3.moe.routed_experts.inner_experts.w3_EFD",
    "layers.3.moe.router.gate.weight", "layers.3.moe.shared_experts.w1.weight",
    "layers.3.moe.shared_experts.w2.weight", "layers.3.moe.shared_experts.w3.weight" }, "MoE block")
  local shape = {}
  for _, q in ipairs(m.params) do shape[q.name:sub(#"layers.3." + 1)] = q.shape end
  H.list_eq(shape["attention.wq_b.weight"], { 128 * 192, 1536 }, "wq_b")
  H.list_eq(shape["attention.wkv_a.weight"], { 512 + 64, 7168 }, "wkv_a")
  H.list_eq(shape["attention.wkv_b.weight"], { 128 * 256, 512 }, "wkv_b")
  H.list_eq(shape["attention.wo.weight"], { 7168, 128 * 128 }, "wo")
  H.list_eq(shape["moe.routed_experts.inner_experts.w1_EFD"], { 256, 2048, 7168 }, "w1_EFD")
  H.list_eq(shape["moe.routed_experts.inner_experts.w2_EDF"], { 256, 7168, 2048 }, "w2_EDF")
  H.list_eq(shape["moe.router.gate.weight"], { 256, 7168 }, "gate")
  H.list_eq(shape["moe.shared_experts.w1.weight"], { 2048, 7168 }, "shared w1")
  H.list_eq(shape["moe.shared_experts.w2.weight"], { 7168, 2048 }, "shared w2")
  H.eq(shape["feed_forward.w1.weight"], nil, "no dense FFN in an MoE block")
  for _, u in ipairs(units) do
    for _, q in ipairs(u.params) do
      assert(not q.name:find("expert_bias") and not q.name:find("tokens_per_expert"), q.name .. " is a buffer")
    end
  end
  -- q_lora_rank 0 (torchtitan's 16B): one wq; no shared experts: none
  local u16 = units_of(ds, { size = "16b", n_layers = 2, num_shared_experts = 0 })
  H.eq(names(u16[2])[1], "layers.0.attention.wq.weight")
  H.list_eq(u16[2].params[1].shape, { 16 * 192, 2048 }, "wq")
  for _, n in ipairs(names(u16[3])) do assert(not n:find("shared_experts"), n) end
  H.eq(#u16[3].params, 5 + 2 + 4, "wq, wkv_a, kv_norm, wkv_b, wo, the norms, the experts and the gate")
end

-- torchtitan's apply_fsdp_to_decoder at ep = 1: Shard(1) for the routed
-- experts when the FSDP mesh (replicas included) has more ranks than
-- experts, else Shard(0); everything else Shard(0).
local function shard_dims(src)
  local p = plan.from_source(src, "plans/t.lua")
  local out = {}
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do out[q.name] = q.shard_dim end
  end
  return out, p
end

local function mix_plan(world, parallel, extra)
  return string.format([[return { world_size = %d, parallel = %s, topology = { gpus_per_node = %d },
    model = { family = "mixtral", dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 40,
              moe_hidden_dim = 16, num_experts = 4, top_k = 2 %s } }]], world, parallel, math.min(world, 8),
    extra or "")
end

function T.experts_shard_dim_follows_torchtitan()
  local w1 = "layers.1.moe.routed_experts.inner_experts.w1_EFD"
  local sd = shard_dims(mix_plan(4, "{ dp_shard = -1 }"))
  H.eq(sd[w1], 0, "4 ranks, 4 experts: Shard(0)")
  sd = shard_dims(mix_plan(8, "{ dp_shard = -1 }"))
  H.eq(sd[w1], 1, "8 ranks > 4 experts: Shard(1)")
  H.eq(sd["layers.1.moe.routed_experts.inner_experts.w2_EDF"], 1)
  H.eq(sd["layers.1.moe.router.gate.weight"], 0, "the router: Shard(0)")
  H.eq(sd["layers.1.attention.wo.weight"], 0)
  -- HSDP: replicas x shards = 8 > 4 although the experts shard over 2 ranks only
  local p
  sd, p = shard_dims(mix_plan(8, "{ dp_replicate = 4, dp_shard = -1 }"))
  H.eq(sd[w1], 1, "HSDP 4 x 2: Shard(1)")
  H.eq(p.dims.dp_shard, 2)
  sd = shard_dims(mix_plan(4, "{ dp_replicate = 2, dp_shard = -1 }"))
  H.eq(sd[w1], 0, "HSDP 2 x 2: Shard(0)")
  -- the placement needs d; without dims (one rank) Shard(0)
  H.eq(moe.expert_shard_dim(nil, 1), 0)
  H.eq(moe.expert_shard_dim({ dp_replicate = 1, dp_shard = 16, cp = 1, tp = 1 }, 8), 1)
  H.eq(moe.expert_shard_dim({ dp_replicate = 1, dp_shard = 8, cp = 1, tp = 1 }, 8), 0)
  -- Shard(1) needs even sharding (FSDP2 raises otherwise): refused as for a generic plan
  H.plan_fails(mix_plan(8, "{ dp_shard = -1 }"):gsub("moe_hidden_dim = 16", "moe_hidden_dim = 12"),
    "shard_dim", "FSDP does not support uneven sharding on dim 1", "w1_EFD", "dp_shard=8")
end

function T.moe_plans_generate()
  local _, p = shard_dims(mix_plan(4, "{ dp_shard = -1 }"))
  H.eq(#p.layout.units, 2 + 3)
  H.eq(p.model_config.num_experts, 4)
  for _, src in ipairs({
    mix_plan(8, "{ dp_replicate = 2, dp_shard = -1 }", ', dtype = "fp32"'),
    [[return { world_size = 4, model = { family = "qwen3_moe", dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2,
      head_dim = 16, vocab_size = 40, moe_hidden_dim = 16, num_experts = 8, top_k = 2, fuse_qkv = false },
      fsdp = { micro_steps = 2, param_dtype = "bf16", reduce_dtype = "fp32" } }]],
    [[return { world_size = 4, parallel = { dp_shard = -1 }, model = { family = "deepseek_v3", dim = 32,
      n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 40, q_lora_rank = 8, kv_lora_rank = 8,
      qk_nope_head_dim = 4, qk_rope_head_dim = 4, v_head_dim = 4, dense_hidden_dim = 24, moe_hidden_dim = 8,
      num_experts = 2, num_shared_experts = 1, top_k = 1, seq_len = 64 } }]],
  }) do
    local q = plan.from_source(src, "plans/t.lua")
    assert(#q.ops > 0, "no collectives planned")
  end
end

function T.bad_inputs_one_line_each()
  local function src(model, parallel)
    return string.format("return { world_size = 8, parallel = %s, model = { %s } }", parallel or "{ dp_shard = -1 }",
      model)
  end
  H.plan_fails(src('family = "mixtral", size = "8x7"'), "model.size", "unknown Mixtral size \"8x7\"",
    "use one of 8x22b, 8x7b", "did you mean '8x7b'")
  H.plan_fails(src('family = "deepseek_v3", size = "v3"'), "model.size", "unknown DeepSeek-V3 size",
    "16b, 236b, 671b")
  H.plan_fails(src('family = "mixtral", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 10, '
    .. 'num_experts = 4, top_k = 2'), "model.moe_hidden_dim", "missing", 'give size = "8x22b" | "8x7b"')
  H.plan_fails(src('family = "mixtral", size = "8x7b", n_kv_heads = 5'), "model.n_kv_heads",
    "n_heads=32 is not divisible by n_kv_heads=5")
  H.plan_fails(src('family = "mixtral", size = "8x7b", n_heads = 3, n_kv_heads = 1'), "model.n_heads",
    "dim=4096 is not divisible by n_heads=3", "set head_dim")
  H.plan_fails(src('family = "qwen3_moe", size = "30b-a3b", top_k = 129'), "model.top_k",
    "num_experts=128", "pick top_k <= num_experts")
  H.plan_fails(src('family = "deepseek_v3", size = "671b", n_dense_layers = 62'), "model.n_dense_layers",
    "n_dense_layers=62 is more than the n_layers=61")
  H.plan_fails(src('family = "deepseek_v3", dim = 64, n_layers = 2, n_dense_layers = 1, n_heads = 2, vocab_size = 10, '
    .. 'moe_hidden_dim = 8, num_experts = 4, num_shared_experts = 1, top_k = 2'), "model.dense_hidden_dim",
    "missing", "set it (or n_dense_layers = 0)")
  H.plan_fails(src('family = "deepseek_v3", size = "671b", n_dense_layers = 0, dense_hidden_dim = 10'),
    "model.dense_hidden_dim", "would be ignored; remove it")
  H.plan_fails(src('family = "deepseek_v3", dim = 64, n_layers = 2, n_dense_layers = 0, n_heads = 2, vocab_size = 10, '
    .. 'moe_hidden_dim = 8, num_experts = 4, top_k = 2'), "model.num_shared_experts", "missing")
  -- DeepSeek-V3's router: node-limited groups that divide the experts, both or neither set
  H.plan_fails(src('family = "deepseek_v3", size = "671b", n_expert_groups = 7'), "model.n_expert_groups",
    "n_expert_groups=7 does not divide num_experts=256", "pick a divisor or 0")
  H.plan_fails(src('family = "deepseek_v3", size = "671b", n_limited_groups = 9'), "model.n_limited_groups",
    "n_limited_groups=9 with n_expert_groups=8", "limited <= groups")
  H.plan_fails(src('family = "deepseek_v3", size = "16b", n_limited_groups = 2'), "model.n_limited_groups",
    "n_limited_groups=2 with n_expert_groups=0", "set both")
  H.plan_fails(src('family = "deepseek_v3", size = "671b", route_norm = 1'), "model.route_norm")
  H.plan_fails(src('family = "mixtral", size = "8x7b", n_expert_groups = 2'), "model.n_expert_groups",
    "the mixtral family does not read n_expert_groups")
  -- keys the family does not read
  H.plan_fails(src('family = "mixtral", size = "8x7b", multiple_of = 256'), "model.multiple_of",
    "the mixtral family does not read multiple_of", "a setting of family llama", "remove it")
  H.plan_fails(src('family = "deepseek_v3", size = "671b", n_kv_heads = 8'), "model.n_kv_heads",
    "the deepseek_v3 family does not read n_kv_heads")
  H.plan_fails(src('family = "llama", size = "8b", top_k = 2'), "model.top_k", "the llama family does not read top_k",
    "deepseek_v3 | gpt_oss | mixtral | qwen3_moe")
  H.plan_fails(src('family = "llama", size = "8b", num_experts = 8'), "model.num_experts", "dense model",
    'family = "mixtral" | "qwen3_moe" | "deepseek_v3"')
  H.plan_fails(src('family = "mixtral", size = "8x7b", units = { { name = "a", params = {} } }'), "model.units",
    "units are only for family")
  H.plan_fails(src('family = "mixtral", size = "8x7b", fuse_qkv = 1'), "model.fuse_qkv")
  H.plan_fails(src('family = "moe"'), "model.family")
  -- (TP on mixtral and qwen3_moe, and EP x TP: tests/lua/test_moe_tp.lua)
  -- (ep with tp: tests/lua/test_moe_tp.lua and test_ep.lua)
  H.plan_fails(src('family = "qwen3_moe", size = "30b-a3b", num_experts = 6, top_k = 2', "{ dp_shard = -1, ep = 4 }"),
    "parallel.ep", "num_experts=6 not divisible by ep=4")
end

return T
