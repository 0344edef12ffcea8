-- TP on the GQA MoE families (mixtral, qwen3_moe): torchtitan 0.3's Qwen3
-- MoE plan (models/qwen3/sharding.py with models/common/moe_sharding.py;
-- gen/parallel/tp.lua's PLANS, gen/parallel/tp_acts.lua's DENSE): every
-- parameter's placement and TP-local shape, the TP collectives of one
-- micro-step in order at ep = 1 (experts split over TP) and at ep > 1 (EP
-- borrows the TP ranks, experts not TP-split), the FSDP shards of the
-- TP-local tensors, and the refusals, one line each. The live check
-- against torchtitan on gloo: tests/ep/check_ep_live.sh's mix_* / q3m_*
-- cases.
local H = require("helpers")
local plan = require("gen.plan")

local T = {}

-- A tiny model: dim 16, 4 heads of 4 (2 kv heads), 4 experts of hidden 16,
-- top 2, vocab 64; one sequence of 8 tokens per rank, fp32.
local SRC = [[return { world_size = %d, parallel = %s,
  model = { family = %q, dtype = "fp32", seq_len = 8, dim = 16, n_layers = 2, n_heads = 4, n_kv_heads = 2,
            vocab_size = 64, moe_hidden_dim = 16, num_experts = 4, top_k = 2 },
  fsdp = { reduce_op = "sum" }, training = { local_batch_size = 1, loss_chunks = 1 } }]]

local function src(family, world, parallel) return string.format(SRC, world, parallel, family) end
local function build(family, world, parallel) return plan.from_source(src(family, world, parallel), "plans/t.lua") end

local function unit(p, name, cls)
  local lay = cls and p.tp_classes[cls].layout or p.layout
  for _, u in ipairs(lay.units) do if u.name == name then return u end end
end

local function by_suffix(u)
  local by = {}
  for _, q in ipairs(u.params) do by[q.name:gsub("^layers%.%d+%.", "")] = q end
  return by
end

-- micro-step 0's collectives of unit `name` on group families `groups` as "kind[']" (' = backward)
local function seq(p, name, groups)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.micro_step == 0 and groups[o.group] and p.layout.units[o.unit + 1].name == name then
      out[#out + 1] = o.kind .. (o.phase == "backward" and "'" or "")
    end
  end
  return table.concat(out, " ")
end

local TP = { tp = true }

-- ep = 1: the attention as qwen3's (wqkv colwise, wo rowwise, q/k norms
-- replicated), the routed experts on their hidden dim (w1/w3 Shard(1), w2
-- Shard(2)), the router's gate replicated; the TP-local shapes halve those
-- dims, and FSDP then shards the TP-local tensor (the experts Shard(0):
-- dp_shard x tp = 4 ranks do not outnumber the 4 experts; with 8 ranks
-- Shard(1), on the TP-split dim: _StridedShard).
function T.qwen3_moe_tp_placements_and_shapes()
  local p = build("qwen3_moe", 4, "{ dp_shard = 2, tp = 2 }")
  local by = by_suffix(unit(p, "layers.0"))
  local function placed(n, dim, shape)
    H.eq(by[n].tp_dim, dim, n .. " TP dim")
    H.list_eq(by[n].shape, shape, n .. " TP-local shape")
  end
  placed("attention.qkv_linear.wqkv.weight", 0, { (16 + 2 * 8) // 2, 16 })
  placed("attention.wo.weight", 1, { 16, 8 })
  placed("attention.q_norm.weight", nil, { 4 })
  placed("attention.k_norm.weight", nil, { 4 })
  placed("moe.routed_experts.inner_experts.w1_EFD", 1, { 4, 8, 16 })
  placed("moe.routed_experts.inner_experts.w2_EDF", 2, { 4, 16, 8 })
  placed("moe.routed_experts.inner_experts.w3_EFD", 1, { 4, 8, 16 })
  placed("moe.router.gate.weight", nil, { 4, 16 })
  placed("attention_norm.weight", nil, { 16 })
  H.eq(by["moe.routed_experts.inner_experts.w1_EFD"].shard_dim, 0, "FSDP Shard(0): 4 ranks do not outnumber 4 experts")
  H.eq(unit(p, "tok_embeddings").params[1].tp_dim, 0, "the embedding on its vocab rows")
  H.eq(unit(p, "norm_lm_head").params[2].tp_dim, 0, "lm_head colwise")
  -- 8 ranks (dp_shard 4 x tp 2) outnumber the 4 experts: FSDP's Shard(1) over the TP-local hidden rows
  local p8 = build("qwen3_moe", 8, "{ dp_shard = 4, tp = 2 }")
  local w1 = by_suffix(unit(p8, "layers.0"))["moe.routed_experts.inner_experts.w1_EFD"]
  H.eq(w1.shard_dim, 1, "Shard(1)")
  H.eq(w1.tp_dim, 1)
  local tp = require("gen.parallel.tp")
  H.list_eq(tp.placements(w1, 2), { "_StridedShard(dim=1, sf=2)", "Shard(dim=1)" }, "FSDP and TP both on dim 1")
end

-- The TP collectives in order: each block gathers the sequence before the
-- attention and the MoE and reduce-scatters after wo and the routed
-- experts; backward mirrored; then the Partial gradients of the replicated
-- weights in parameter order (qwen3_moe: q_norm, k_norm, the gate,
-- attention_norm, ffn_norm; mixtral without q/k norms).
local BLOCK = "tp_all_gather tp_reduce_scatter tp_all_gather tp_reduce_scatter tp_all_gather' tp_reduce_scatter' "
  .. "tp_all_gather' tp_reduce_scatter'"

function T.tp_collectives_at_ep1()
  for _, c in ipairs({ { "qwen3_moe", 5 }, { "mixtral", 3 } }) do
    local p = build(c[1], 4, "{ dp_shard = 2, tp = 2 }")
    H.eq(seq(p, "layers.1", TP), BLOCK .. string.rep(" tp_all_reduce'", c[2]), c[1] .. " block")
    H.eq(seq(p, "tok_embeddings", TP), "tp_reduce_scatter tp_all_gather'", c[1] .. " embedding")
    H.eq(seq(p, "norm_lm_head", TP), "tp_all_gather tp_all_reduce tp_all_reduce tp_all_reduce tp_reduce_scatter' "
      .. "tp_all_reduce'", c[1] .. " lm_head, the loss, norm's Partial gradient")
    for _, o in ipairs(p.ops) do
      if o.group == "tp" and o.kind ~= "tp_all_reduce" then H.eq(o.count, 8 * 16 // 2, "a sequence shard") end
    end
  end
  -- without sequence parallelism: the MoE's output all-reduced, its input's gradient all-reduced (no norm Partial)
  local p = build("mixtral", 4, "{ dp_shard = 2, tp = 2, sequence_parallel = false }")
  H.eq(seq(p, "layers.1", TP), "tp_all_reduce tp_all_reduce tp_all_reduce' tp_all_reduce' tp_all_reduce'",
    "wo, MoE output; MoE input and attention input gradients; the gate's Partial gradient")
end

-- A wrong plan differs: with the router's gate taken for TP-replicated
-- with a whole gradient (no Partial), the block loses an all-reduce.
function T.mutant_plan_differs()
  local tp_acts = require("gen.parallel.tp_acts")
  local saved = tp_acts.DENSE.mixtral.partial_always
  tp_acts.DENSE.mixtral.partial_always = {}
  local ok, p = pcall(build, "mixtral", 4, "{ dp_shard = 2, tp = 2 }")
  tp_acts.DENSE.mixtral.partial_always = saved
  assert(ok, p)
  H.eq(seq(p, "layers.1", TP), BLOCK .. string.rep(" tp_all_reduce'", 2), "the mutant loses the gate's all-reduce")
end

-- ep > 1 borrows the TP ranks (ep 2 = the TP group at dp_shard 2 x tp 2):
-- the experts are not TP-split, each rank routes its seq / tp tokens, the
-- MoE issues no TP collective (its input stays on the sequence shards), the
-- gate's gradient still Partial over TP.
function T.ep_x_tp()
  for _, c in ipairs({ { "qwen3_moe", 5 }, { "mixtral", 3 } }) do
    local p = build(c[1], 4, "{ dp_shard = 2, tp = 2, ep = 2 }")
    H.eq(p.layout.ep.tokens, 8 // 2, "seq_len / tp tokens per rank")
    local e = unit(p, "layers.1.experts")
    for _, q in ipairs(e.params) do
      H.eq(q.tp_dim, nil, q.name .. " not TP-split")
      H.eq(q.shape[1], 2, "4 experts over ep 2")
    end
    H.eq(seq(p, "layers.1.experts", { tp = true, ep = true }), "a2a_counts a2a a2a a2a' a2a'", c[1] .. " experts")
    H.eq(seq(p, "layers.1", TP), "tp_all_gather tp_reduce_scatter tp_all_gather' tp_reduce_scatter'"
      .. string.rep(" tp_all_reduce'", c[2]), c[1] .. " attention only")
    H.eq(#p.tp_classes, 1, "one TP class")
  end
  -- ep 4 over the whole world: efsdp 1
  local p = build("mixtral", 4, "{ dp_shard = 2, tp = 2, ep = 4 }")
  H.eq(unit(p, "layers.0.experts").params[1].shape[1], 1, "one expert a rank")
end

-- ep 2 inside TP groups of 4 (torchtitan 0.3 accepts ep < tp; recorded live: mix_dp2_tp4_ep2): the ep
-- groups are pairs of consecutive TP ranks, efsdp (4) spans dp_shard and the TP groups' halves; the
-- runtime's mesh cuts tp into two axes, its TP coordinate read over both (tp_mesh_dim -2 - first axis).
function T.ep_inside_tp_groups()
  local src4 = (src("mixtral", 8, "{ dp_shard = 2, tp = 4, ep = 2 }"):gsub("n_kv_heads = 2", "n_kv_heads = 4"))
  local p = plan.from_source(src4, "plans/t.lua")
  local groups = require("gen.groups")
  H.list_eq(groups.members(p.groups.by_name.ep, 0), { 0, 1 }, "an ep group inside tp's {0..3}")
  H.list_eq(groups.members(p.groups.by_name.efsdp, 0), { 0, 2, 4, 6 }, "efsdp across dp_shard and the TP halves")
  H.eq(p.dims.efsdp, 4)
  local v = require("gen.emit").vars(p, "0")
  H.eq(v.mesh_names, '"dp_shard.efsdp", "tp.efsdp", "tp.ep"')
  H.eq(v.tp_mesh_dim, -3, "tp over the axes from 1")
  -- and ep groups that would cut TP groups unevenly stay refused
  H.plan_fails((string.format(SRC, 6, "{ dp_shard = 3, tp = 2, ep = 3 }", "mixtral"):gsub("num_experts = 4",
    "num_experts = 6")), "parallel.ep", "ep=3 with tp=2", "cut TP groups unevenly")
end

-- ep > 1 without sequence parallelism (recorded live: q3m_dp2_tp2_ep2_nosp): the attention's all-reduces
-- on the block; on the experts unit the MoE's output all-reduced after the combine and, after the
-- dispatch's gradient, the routed experts' and the router's input gradients gathered.
function T.ep_x_tp_without_sp()
  local p = build("qwen3_moe", 4, "{ dp_shard = 2, tp = 2, ep = 2, sequence_parallel = false }")
  H.eq(seq(p, "layers.1", TP), "tp_all_reduce tp_all_reduce' tp_all_reduce' tp_all_reduce' tp_all_reduce'",
    "wo; the attention input's gradient; q_norm, k_norm, the gate (the block norms whole without SP)")
  H.eq(seq(p, "layers.1.experts", { tp = true, ep = true }), "a2a_counts a2a a2a tp_all_reduce a2a' a2a' "
    .. "tp_all_gather' tp_all_gather'")
  local full
  for _, o in ipairs(p.ops) do
    if o.kind == "tp_all_reduce" and o.phase == "forward" and not o.loss then full = o.count end
  end
  H.eq(full, 8 * 16, "the whole sequence's activation")
end

function T.refusals()
  -- tp must divide the kv heads (gen/dims.lua's GQA check)
  H.plan_fails(src("qwen3_moe", 8, "{ dp_shard = 2, tp = 4 }"), "parallel.tp", "num_key_value_heads=2")
  H.plan_fails(src("mixtral", 4, "{ dp_shard = 2, tp = 2, ep = 2, etp = 2 }"), "parallel.etp")
end

-- Generated, proved and simulated end to end by the generator (every class's
-- schedule and memory proofs pass) for each family and mesh above.
function T.plans_generate()
  for _, f in ipairs({ "mixtral", "qwen3_moe" }) do
    for _, par in ipairs({ "{ dp_shard = 2, tp = 2 }", "{ dp_shard = 2, tp = 2, ep = 2 }", "{ dp_replicate = 2, tp = 2 }",
                           "{ dp_shard = 2, tp = 2, ep = 4 }" }) do
      local p = build(f, 4, par)
      assert(#p.ops > 0, f .. " " .. par)
    end
  end
end

return T
