-- torchtitan's fused layouts (model.fused, gen/models/fused.lua): the
-- fused SwiGLU's w13 and the fused grouped experts' w13 in place of w1 and
-- w3 (names, order, shapes, FSDP slots, TP placements), the same numel,
-- FLOPs and collectives' sizes per unit, fused MLA changing nothing, and
-- every bad list refused in one line. tests/titan/test_fused_plan.py holds
-- the same against torchtitan 0.3's own overrides on gloo.
local H = require("helpers")
local plan = require("gen.plan")
local compute = require("gen.compute")

local T = {}

local LLAMA = [[return { world_size = 4, parallel = %s, model = { family = "llama", dim = 64, n_layers = 2,
  n_heads = 4, n_kv_heads = 2, vocab_size = 256, multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 64%s } }]]
local QWEN3 = [[return { world_size = 4, parallel = %s, model = { family = "qwen3", dim = 64, n_layers = 2,
  n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 256, hidden_dim = 96, seq_len = 64%s } }]]
local DSV3 = [[return { world_size = 8, parallel = %s, model = { family = "deepseek_v3", dim = 64, n_layers = 3,
  n_dense_layers = 1, n_heads = 4, vocab_size = 256, q_lora_rank = 16, kv_lora_rank = 32, qk_nope_head_dim = 8,
  qk_rope_head_dim = 8, v_head_dim = 8, dense_hidden_dim = 96, moe_hidden_dim = 32, num_experts = 4,
  num_shared_experts = 2, top_k = 2, seq_len = 64%s } }]]
local MOE = [[return { world_size = 16, parallel = %s, model = { family = "qwen3_moe", dim = 64, n_layers = 2,
  n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 256, moe_hidden_dim = 48, num_experts = 8, top_k = 2,
  seq_len = 64%s } }]]

local function gen(tmpl, parallel, fused)
  return plan.from_source(string.format(tmpl, parallel, fused and (", fused = " .. fused) or ""), "plans/t.lua")
end

local function unit(p, name)
  for _, u in ipairs(p.layout.units) do
    if u.name == name then return u end
  end
  error("no unit " .. name)
end

local function params(u)
  local out = {}
  for _, q in ipairs(u.params) do
    out[#out + 1] = string.format("%s [%s]%s", q.name:gsub("^layers%.%d+%.", ""), table.concat(q.shape, ","),
      q.tp_dim and (" tp" .. q.tp_dim) or "")
  end
  return out
end

local function collectives(p)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.group then out[#out + 1] = string.format("%s %s %d", o.kind, p.layout.units[o.unit + 1].name, o.count) end
  end
  return out
end

-- A dense block under fused SwiGLU: w2.weight then w13 [hidden, 2, dim]
-- (FSDP2's post-order walk: the child Linear w2 before the module's own
-- w13), the FSDP slot as large (the same numel and, hidden rows split
-- ceil(n / 4), the same padding), the same collectives, the same FLOPs.
function T.swiglu_dense_blocks()
  for _, tmpl in ipairs({ LLAMA, QWEN3 }) do
    local stock, fused = gen(tmpl, "{ dp_shard = -1 }"), gen(tmpl, "{ dp_shard = -1 }", '{ "swiglu" }')
    local f = params(unit(fused, "layers.1"))
    local hidden = tmpl == LLAMA and 224 or 96
    H.eq(f[#f - 3], string.format("feed_forward.w2.weight [64,%d]", hidden), "w2 first")
    H.eq(f[#f - 2], string.format("feed_forward.w13 [%d,2,64]", hidden), "then the fused w13")
    H.eq(#f, #params(unit(stock, "layers.1")) - 1, "one parameter fewer")
    H.eq(unit(fused, "layers.1").slot_numel, unit(stock, "layers.1").slot_numel, "the slot's numel")
    H.list_eq(collectives(fused), collectives(stock), "the collectives")
    local s = compute.settings(fused)
    H.eq(compute.model_flops_per_token(fused, s), compute.model_flops_per_token(stock, compute.settings(stock)),
      "model FLOPs per token")
    local a, b = compute.units(fused, s), compute.units(stock, compute.settings(stock))
    for i = 1, #a do H.eq(a[i].fwd, b[i].fwd, "unit " .. i .. "'s forward FLOPs") end
  end
end

-- TP: w13 Shard(0) on hidden (overrides/fused_swiglu.py:500-503): each TP
-- rank holds [hidden / tp, 2, dim], matching gate and up rows; w2 Shard(1).
function T.swiglu_tp_placements()
  local p = gen(QWEN3, "{ dp_shard = -1, tp = 2 }", '{ "swiglu" }')
  local f = params(unit(p, "layers.0"))
  H.eq(f[#f - 3], "feed_forward.w2.weight [64,48] tp1", "w2 row-wise")
  H.eq(f[#f - 2], "feed_forward.w13 [48,2,64] tp0", "w13 Shard(0): half the hidden rows, both halves")
  local stock = gen(QWEN3, "{ dp_shard = -1, tp = 2 }")
  H.list_eq(collectives(p), collectives(stock), "the collectives under TP")
end

-- Fused grouped experts: w2_EDF then w13 [E, F, 2, D] on w1_EFD's
-- placements (FSDP Shard(1) on 16 ranks > 8 experts; TP Shard(1)).
function T.grouped_experts()
  local p = gen(MOE, "{ dp_shard = -1, tp = 2 }", '{ "grouped_experts" }')
  local f = params(unit(p, "layers.0"))
  local at
  for i, s in ipairs(f) do if s:find("w13", 1, true) then at = i end end
  H.eq(f[at - 1], "moe.routed_experts.inner_experts.w2_EDF [8,64,24] tp2", "w2_EDF first")
  H.eq(f[at], "moe.routed_experts.inner_experts.w13 [8,24,2,64] tp1", "w13 on the experts' hidden dim")
  for _, q in ipairs(unit(p, "layers.0").params) do
    if q.name:find("inner_experts", 1, true) then H.eq(q.shard_dim, 1, q.name .. "'s FSDP dim") end
  end
  local stock = gen(MOE, "{ dp_shard = -1, tp = 2 }")
  H.list_eq(collectives(p), collectives(stock), "the collectives")
  local s = compute.settings(p)
  H.eq(compute.model_flops_per_token(p, s), compute.model_flops_per_token(stock, compute.settings(stock)),
    "model FLOPs per token (the active experts' share)")
  -- ep = 2: w13 split over ep on dim 0 with the other experts' weights (gen/parallel/ep.lua), the
  -- experts' unit the same collectives and all-to-alls
  local e, e0 = gen(MOE, "{ dp_shard = -1, ep = 2 }", '{ "grouped_experts" }'), gen(MOE, "{ dp_shard = -1, ep = 2 }")
  H.list_eq(params(unit(e, "layers.0.experts")), { "moe.routed_experts.inner_experts.w2_EDF [4,64,48]",
    "moe.routed_experts.inner_experts.w13 [4,48,2,64]" }, "ep = 2: the local experts' weights")
  H.list_eq(collectives(e), collectives(e0), "ep = 2: the collectives")
end

-- DeepSeek-V3 with all three: the dense block's and the shared experts'
-- FeedForward fused, the routed experts fused; fused MLA alone gives the
-- unfused plan's bytes (overrides/fused_mla.py:52-58: stock parameters).
function T.deepseek_all_three_and_mla()
  local p = gen(DSV3, "{ dp_shard = -1, tp = 2 }", '{ "swiglu", "grouped_experts", "mla" }')
  local f = table.concat(params(unit(p, "layers.0")), "; ") .. "; " .. table.concat(params(unit(p, "layers.1")), "; ")
  for _, want in ipairs({ "feed_forward.w13 [48,2,64] tp0", "moe.shared_experts.w13 [32,2,64] tp0",
                          "moe.routed_experts.inner_experts.w13 [4,16,2,64] tp1" }) do
    H.eq(f:find(want, 1, true) ~= nil, true, want .. " in " .. f)
  end
  H.eq(f:find("w1.weight", 1, true) or f:find("w1_EFD", 1, true), nil, "no w1 left")
  local mla, stock = gen(DSV3, "{ dp_shard = -1 }", '{ "mla" }'), gen(DSV3, "{ dp_shard = -1 }")
  H.list_eq(collectives(mla), collectives(stock), "fused MLA: the same collectives")
  for i, u in ipairs(mla.layout.units) do
    H.list_eq(params(u), params(stock.layout.units[i]), "fused MLA: unit " .. u.name .. "'s parameters")
  end
end

-- A generic plan of torchtitan's fused model (plan_from_titan(..., fused=["swiglu"]): w2, w13 as
-- torchtitan holds them) is still a decoder under its names (gen/models/generic.lua): at tp = 2 it
-- takes the TP activations' collectives the unfused one does (without, it would plan none).
local function generic_decoder(fused)
  local L = { "return { world_size = 4, parallel = { dp_shard = -1, tp = 2 }, model = { family = \"generic\",",
              "  seq_len = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, n_layers = 2, units = {",
              "  { name = \"tok_embeddings\", params = { { name = \"tok_embeddings.weight\", shape = { 256, 64 }, "
                .. "tp = \"shard(0)\" } } }," }
  for i = 0, 1 do
    local p = "layers." .. i .. "."
    local ffn = fused and string.format('{ name = "%sfeed_forward.w2.weight", shape = { 64, 96 }, tp = "rowwise" }, '
      .. '{ name = "%sfeed_forward.w13", shape = { 96, 2, 64 }, tp = "shard(0)" }', p, p)
      or string.format('{ name = "%sfeed_forward.w1.weight", shape = { 96, 64 }, tp = "colwise" }, '
      .. '{ name = "%sfeed_forward.w2.weight", shape = { 64, 96 }, tp = "rowwise" }, '
      .. '{ name = "%sfeed_forward.w3.weight", shape = { 96, 64 }, tp = "colwise" }', p, p, p)
    L[#L + 1] = string.format('  { name = "layers.%d", params = { { name = "%sattention.qkv_linear.wqkv.weight", '
      .. 'shape = { 128, 64 }, tp = "colwise" }, { name = "%sattention.wo.weight", shape = { 64, 64 }, '
      .. 'tp = "rowwise" }, %s, { name = "%sattention_norm.weight", shape = { 64 }, tp = "replicate" }, '
      .. '{ name = "%sffn_norm.weight", shape = { 64 }, tp = "replicate" } } },', i, p, p, ffn, p, p)
  end
  L[#L + 1] = '  { name = "norm_lm_head", reshard_after_forward = false, params = { { name = "norm.weight", '
    .. 'shape = { 64 }, tp = "replicate" }, { name = "lm_head.weight", shape = { 256, 64 }, tp = "colwise" } } },'
  L[#L + 1] = '  { name = "root", params = {} } } } }'
  return plan.from_source(table.concat(L, "\n"), "plans/t.lua")
end

function T.generic_fused_decoder_under_tp()
  local f, u = generic_decoder(true), generic_decoder(false)
  local n = 0
  for _, c in ipairs(collectives(f)) do n = n + (c:find("^tp_") and 1 or 0) end
  H.eq(n > 0, true, "TP activation collectives planned")
  H.list_eq(collectives(f), collectives(u), "the fused generic decoder's collectives")
end

function T.bad_lists_one_line_each()
  local function src(model, fused)
    return string.format(model, "{ dp_shard = -1 }", ", fused = " .. fused)
  end
  H.plan_fails(src(QWEN3, '{ "swigl" }'), "model.fused[1]", "not a torchtitan fused layout", "did you mean \"swiglu\"")
  H.plan_fails(src(QWEN3, '{ "swiglu", "swiglu" }'), "model.fused[2]", "given twice", "override.py:361-364")
  H.plan_fails(src(QWEN3, '{ "grouped_experts" }'), "model.fused[1]", "the qwen3 family has nothing",
    "fused_grouped_experts", "override.py:503-512")
  H.plan_fails(src(MOE, '{ "swiglu" }'), "model.fused[1]", "the qwen3_moe family has nothing")
  H.plan_fails(src(LLAMA, '{ "mla" }'), "model.fused[1]", "the llama family has nothing", "fused_mla")
  H.plan_fails(src(QWEN3, '{ 1 }'), "model.fused[1]", "not a torchtitan fused layout")
  H.plan_fails(src(QWEN3, '"swiglu"'), "model.fused", "expected a table")
  H.plan_fails([[return { world_size = 2, model = { family = "generic", fused = { "swiglu" }, units = {
    { name = "a", params = { { name = "w", shape = { 4, 4 } } } }, { name = "root", params = {} } } } }]],
    "model.fused", "the generic family does not read fused")
end

return T
