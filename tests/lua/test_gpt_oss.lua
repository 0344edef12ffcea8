-- The gpt-oss family (gen/models/gpt_oss.lua): torchtitan 0.3's registry
-- sizes' parameter counts and names, its FSDP wrapping and the experts'
-- placement with their biases, EP's split of the biases, the sliding
-- window's FLOPs, the activation terms, the shipped plans, and the
-- refusals. tests/ep/check_ep_live.sh's gpt_* cases hold the plan to
-- torchtitan's own run on gloo.
local H = require("helpers")
local plan = require("gen.plan")
local moe = require("gen.models.moe")
local go = require("gen.models.gpt_oss")
local compute = require("gen.compute")
local acts = require("gen.models.moe_acts")

local T = {}
local CTX = { file = "plans/t.lua", source = "" }

local function units_of(model, d)
  model.dtype = model.dtype or "bf16"
  return go.units(CTX, model, d)
end

local function names(u)
  local out = {}
  for _, q in ipairs(u.params) do out[#out + 1] = q.name end
  return out
end

local function src(model, parallel, world, training)
  return string.format("return { world_size = %d, parallel = %s, model = { family = 'gpt_oss', %s }, "
    .. "fsdp = { param_dtype = 'bf16', reduce_dtype = 'fp32', reduce_op = 'sum' }%s }", world or 4,
    parallel or "{ dp_shard = -1 }", model, training and (", training = " .. training) or "")
end

-- torchtitan 0.3's own counts: sum of numel over named_parameters of
-- model_registry(flavor).model.build() on the meta device.
function T.registry_parameter_counts()
  H.eq(moe.count(units_of({ size = "debugmodel" })), 81489440, "debugmodel parameters")
  H.eq(moe.count(units_of({ size = "20b" })), 20914757184, "20b parameters")
  H.eq(moe.count(units_of({ size = "120B" })), 116829156672, "120b parameters")
end

-- torchtitan's debugmodel, block 0, in the order of its fully_shard state
-- after parallelize_gptoss (tests/titan/test_moe_plan.py reads it back).
function T.block_parameter_names_and_shapes()
  local units = units_of({ size = "debugmodel" })
  H.eq(#units, 4 + 3, "embedding, 4 blocks, [norm, lm_head], root")
  H.eq(units[2].name, "layers.0")
  local a, ex = "layers.0.attention.", "layers.0.moe.routed_experts.inner_experts."
  local want = {
    { a .. "qkv_linear.wqkv.weight", { 5120, 256 } }, { a .. "qkv_linear.wqkv.bias", { 5120 } },
    { a .. "wo.weight", { 256, 4096 } }, { a .. "wo.bias", { 256 } }, { a .. "sinks", { 64 } },
    { "layers.0.attention_norm.weight", { 256 } },
    { "layers.0.ffn_norm.weight", { 256 } }, { ex .. "mlp1_weight_EGD", { 8, 5760, 256 } },
    { ex .. "mlp1_bias_EG", { 8, 5760 } }, { ex .. "mlp2_weight_EDF", { 8, 256, 2880 } },
    { ex .. "mlp2_bias_ED", { 8, 256 } }, { "layers.0.moe.router.gate.weight", { 8, 256 } },
    { "layers.0.moe.router.gate.bias", { 8 } },
  }
  H.eq(#units[2].params, #want, "block 0's parameters")
  for i, w in ipairs(want) do
    local q = units[2].params[i]
    H.eq(q.name, w[1], "parameter " .. i)
    H.list_eq(q.shape, w[2], w[1])
  end
  H.list_eq(names(units[6]), { "norm.weight", "lm_head.weight" }, "[norm, lm_head] (lm_head without bias)")
  H.eq(units[6].reshard_after_forward, false, "[norm, lm_head] kept unsharded after forward")
  -- unfused: wq, wk, wv each with its bias
  local un = units_of({ size = "debugmodel", fuse_qkv = false, n_layers = 1 })
  H.eq(un[2].params[1].name, a .. "qkv_linear.wq.weight")
  H.eq(un[2].params[4].name, a .. "qkv_linear.wk.bias")
  H.list_eq(un[2].params[6].shape, { 512 }, "wv.bias")
end

-- Every parameter of inner_experts (the biases too) takes the experts'
-- placement: Shard(1) over an FSDP mesh wider than num_experts.
function T.experts_placement_holds_the_biases()
  local function sd(world)
    local units = units_of({ size = "debugmodel", n_layers = 1 },
      { dp_replicate = 1, dp_shard = world, cp = 1, tp = 1 })
    local out = {}
    for _, q in ipairs(units[2].params) do out[q.name:match("[^.]+$")] = q.shard_dim end
    return out
  end
  local narrow, wide = sd(8), sd(16)
  for _, n in ipairs({ "mlp1_weight_EGD", "mlp1_bias_EG", "mlp2_weight_EDF", "mlp2_bias_ED" }) do
    H.eq(narrow[n], 0, n .. " at 8 ranks")
    H.eq(wide[n], 1, n .. " at 16 ranks > 8 experts")
  end
  H.eq(wide.sinks, 0, "sinks stay Shard(0)")
end

-- With ep > 1 the biases go to the experts unit, split on dim 0 over ep.
function T.ep_splits_the_biases()
  local p = plan.from_source(src("size = 'debugmodel', seq_len = 64", "{ dp_shard = -1, ep = 2 }"), "plans/t.lua")
  local eu
  for _, u in ipairs(p.layout.units) do if u.name == "layers.1.experts" then eu = u end end
  assert(eu, "layers.1.experts unit")
  local got = {}
  for _, q in ipairs(eu.params) do got[#got + 1] = q.name:match("[^.]+$") .. "=" .. table.concat(q.shape, "x") end
  H.list_eq(got, { "mlp1_weight_EGD=4x5760x256", "mlp1_bias_EG=4x5760", "mlp2_weight_EDF=4x256x2880",
                   "mlp2_bias_ED=4x256" }, "the experts unit: 8 experts / ep 2")
end

-- Even blocks attend through the window: their attention FLOPs are the
-- window's, the odd blocks' the sequence's; a wider window costs more.
function T.sliding_window_flops_per_layer()
  local function fwd(window)
    local p = plan.from_source(src("size = 'debugmodel', n_layers = 2, seq_len = 4096"
      .. (window and (", sliding_window = " .. window) or "")), "plans/t.lua")
    local s = compute.settings(p)
    local per = compute.units(p, s)
    local out = {}
    for _, u in ipairs(p.layout.units) do out[u.name] = per[u.index].fwd end
    return out, s.tokens
  end
  local f, Tk = fwd()
  local attn = function(kv) return 4 * Tk * kv * 64 * 64 end
  -- the blocks' parameters are the same; only the attention term differs
  H.eq(f["layers.1"] - f["layers.0"], attn(4096) - attn(128), "odd block over 4096 keys, even over 128")
  local g = fwd(1024)
  H.eq(g["layers.0"] - f["layers.0"], attn(1024) - attn(128), "sliding_window = 1024")
  H.eq(g["layers.1"], f["layers.1"], "the odd block has no window")
  H.eq(go.kv_len({ sliding_window = 128 }, 2, 64), 64, "a window longer than the sequence is the sequence")
end

-- torchtitan's MFU FLOPs (get_moe_model_nparams_and_flops with head_dims
-- = 2 x head_dim, gpt_oss/model.py:217-227): its own number for 20b at
-- seq 8192, printed by model.config.get_nparams_and_flops.
function T.model_flops_are_torchtitans()
  local p = plan.from_source(H.read("plans/gptoss_20b.lua"), "plans/gptoss_20b.lua")
  H.eq(compute.model_flops_per_token(p, compute.settings(p)), 31313520000, "20b model FLOPs per token")
end

-- The sinks' and the clamped SwiGLU's saved bytes on top of GQA's.
function T.activation_terms()
  local cfg = { dim = 16, n_heads = 4, n_kv_heads = 2, head_dim = 4, fuse_qkv = true, num_experts = 8, top_k = 2,
                moe_hidden_dim = 8, router = { route_norm = true } }
  local base_attn, base_moe = acts.gqa_attention(cfg, 2, 10), acts.moe(cfg, 2, 10, 20, 1)
  cfg.gpt_oss = true
  local a, m = acts.gqa_attention(cfg, 2, 10), acts.moe(cfg, 2, 10, 20, 1)
  H.eq(a.none - base_attn.none, 2 * 10 * (16 + 4) + 4 * 10 * 4, "sinks: product Q + cast h (e), sigmoid h (fp32)")
  H.eq(a.sac, base_attn.sac, "SelectiveAC recomputes the sinks")
  H.eq(m.routed - base_moe.routed, 20 * (3 * 2 * 8 + 2 * 8), "7F instead of 4F and two int64 indices per routed row")
  -- biased linears: aten.addmm, all saved by SelectiveAC (the gate's fp32, its forced recompute not applying);
  -- varlen: rng_state more, and under SelectiveAC its out and lse alone (tests/titan/test_moe_acts.py measures)
  cfg.router, cfg.n_layers = { route_norm = true }, 2
  local function block(be, ac)
    cfg.attn_backend = be
    return acts.block(cfg, 0, 2, 10, 20, 1, ac).saved
  end
  H.eq(acts.sac_matmuls(acts.moe(cfg, 2, 10, 20, 1).mms, 2, 10, { 16, 8 }), 4 * 10 * 8, "the gate's fp32 output")
  H.eq(block("varlen", "none") - block("flex", "none"), 16, "varlen's rng_state")
  H.eq(block("flex", "selective") - block("varlen", "selective"), 2 * 10 * (4 * 4 + 2 * 2 * 4) - 16,
    "SAC: flex's q, k, v kept, varlen's recomputed")
end

function T.shipped_plans_generate_and_fit()
  for _, name in ipairs({ "gptoss_20b", "gptoss_120b_ep" }) do
    local p = plan.from_source(H.read("plans/" .. name .. ".lua"), "plans/" .. name .. ".lua")
    H.eq(p.model.family, "gpt_oss", name)
  end
end

-- TP (torchtitan's gpt-oss plan, models/gpt_oss/sharding.py; gen/parallel/
-- tp.lua's GPT_OSS, tp_acts.lua's DENSE.gpt_oss): placements, TP-local
-- shapes, and each block's TP collectives in order, the Partial gradients'
-- all-reduces last in parameter order. Held live: tests/ep/ep_cases.py's
-- gpt_dp2_tp2* cases.
local TINY = "dtype = 'fp32', seq_len = 8, dim = 16, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 4, "
  .. "vocab_size = 64, moe_hidden_dim = 16, num_experts = 8, top_k = 2"
local function tiny(parallel)
  return plan.from_source(src(TINY, parallel, 4, "{ local_batch_size = 1, loss_chunks = 1 }"), "plans/t.lua")
end
local function unit(p, name)
  for _, u in ipairs(p.layout.units) do if u.name == name then return u end end
end
-- micro-step 0's TP collectives of unit `name`, "kind[']" (' = backward), and the Partial gradients' names
local function tp_seq(p, name)
  local out, partial = {}, {}
  for _, o in ipairs(p.ops) do
    if o.micro_step == 0 and o.group == "tp" and p.layout.units[o.unit + 1].name == name then
      out[#out + 1] = o.kind .. (o.phase == "backward" and "'" or "")
      local n = o.what and o.what:match("^layers%.%d+%.(.-) gradient %(Partial over TP%)$")
      if n then partial[#partial + 1] = n end
    end
  end
  return table.concat(out, " "), table.concat(partial, " ")
end

function T.tp_placements()
  local p = tiny("{ dp_shard = 2, tp = 2 }")
  local by = {}
  for _, q in ipairs(unit(p, "layers.0").params) do by[q.name:gsub("^layers%.0%.", "")] = q end
  local ex = "moe.routed_experts.inner_experts."
  for n, want in pairs({ ["attention.qkv_linear.wqkv.weight"] = { 0, { 16, 16 } },
                         ["attention.qkv_linear.wqkv.bias"] = { 0, { 16 } },
                         ["attention.wo.weight"] = { 1, { 16, 8 } }, ["attention.wo.bias"] = { nil, { 16 } },
                         ["attention.sinks"] = { 0, { 2 } },
                         [ex .. "mlp1_weight_EGD"] = { 1, { 8, 16, 16 } }, [ex .. "mlp1_bias_EG"] = { 1, { 8, 16 } },
                         [ex .. "mlp2_weight_EDF"] = { 2, { 8, 16, 8 } }, [ex .. "mlp2_bias_ED"] = { nil, { 8, 16 } },
                         ["moe.router.gate.weight"] = { nil, { 8, 16 } }, ["moe.router.gate.bias"] = { nil, { 8 } } }) do
    H.eq(by[n].tp_dim, want[1], n .. " TP dim")
    H.list_eq(by[n].shape, want[2], n .. " TP-local shape")
  end
end

local BLOCK = "tp_all_gather tp_reduce_scatter tp_all_gather tp_reduce_scatter tp_all_gather' tp_reduce_scatter' "
  .. "tp_all_gather' tp_reduce_scatter'"
function T.tp_collectives_and_partial_biases()
  local ex = "moe.routed_experts.inner_experts."
  local s, partial = tp_seq(tiny("{ dp_shard = 2, tp = 2 }"), "layers.1")
  H.eq(s, BLOCK .. string.rep(" tp_all_reduce'", 6), "ep 1, SP: the block, then 6 Partial gradients")
  H.eq(partial, "attention.wo.bias attention_norm.weight ffn_norm.weight " .. ex .. "mlp2_bias_ED "
    .. "moe.router.gate.weight moe.router.gate.bias", "in parameter order")
  s, partial = tp_seq(tiny("{ dp_shard = 2, tp = 2, sequence_parallel = false }"), "layers.1")
  H.eq(s, "tp_all_reduce tp_all_reduce tp_all_reduce' tp_all_reduce'" .. string.rep(" tp_all_reduce'", 4), "no SP")
  H.eq(partial, "attention.wo.bias " .. ex .. "mlp2_bias_ED moe.router.gate.weight moe.router.gate.bias",
    "no SP: the norms' gradients whole")
  -- ep 2 borrows the TP ranks: the experts (mlp2's bias with them) are on ep, not TP
  partial = select(2, tp_seq(tiny("{ dp_shard = 2, tp = 2, ep = 2 }"), "layers.1"))
  H.eq(partial, "attention.wo.bias attention_norm.weight ffn_norm.weight moe.router.gate.weight moe.router.gate.bias",
    "ep 2: no mlp2 bias over TP")
  H.eq(select(2, tp_seq(tiny("{ dp_shard = 2, tp = 2, ep = 2 }"), "layers.1.experts")), "", "experts unit")
end

-- PP x TP: each pipeline rank's tables carry its stage's TP collectives
-- (gen/parallel/pp_tables.lua's events with opts.tp, which
-- tests/pp/compare_titan_pp.lua holds to torchtitan's pipeline_llm on gloo:
-- tests/pp/pp_titan_cases.py's gpt_pp2_tp2), the Partial bias gradients'
-- all-reduces among them; without opts.tp none (the PP proof's events).
function T.pp_tables_carry_tp()
  local tables, seq = require("gen.parallel.pp_tables"), require("gen.parallel.pp_sequence")
  local p = plan.from_source(src(TINY, "{ pp = 2, tp = 2 }", 4, "{ local_batch_size = 2, loss_chunks = 1 }")
    :gsub(" }$", ", pipeline = { schedule = '1F1B', microbatches = 2 } }"), "plans/t.lua")
  local first = {}
  for _, c in ipairs(p.tp_classes) do
    if (c.tp_class or 0) == 0 then first[c.pp_rank + 1] = { pp_rank = c.pp_rank, units = c.layout.units, ops = c.ops } end
  end
  local mesh = seq.mesh(2, 1, 1, 1, 1)
  for r = 1, 2 do
    local n_tp, reduced = 0, 0
    for _, o in ipairs(first[r].ops) do
      if o.group == "tp" then n_tp = n_tp + 1 end
    end
    local with, without = tables.events(first, mesh, 1, { tp = true })[r], tables.events(first, mesh, 1)[r]
    local tp_ev = 0
    for _, e in ipairs(with) do
      if e.tp then
        tp_ev = tp_ev + 1
        if e.op == "all_reduce" and e.reduce_op ~= "max" then reduced = reduced + 1 end
      end
    end
    H.eq(tp_ev, n_tp, "pipeline rank " .. (r - 1) .. ": every TP op an event")
    H.eq(#with - #without, n_tp, "pipeline rank " .. (r - 1) .. ": none without opts.tp")
    -- one block per stage, 6 Partial gradients each (SP), reduced once after the last microbatch
    H.eq(reduced >= 6, true, "pipeline rank " .. (r - 1) .. ": the Partial gradients' all-reduces")
  end
end

-- CP (gen/parallel/cp.lua): each block's K and V all-gathered over cp in
-- forward, their gradients reduce-scattered (V's first) in backward, the
-- rank's seq_len / cp tokens of its TP-local kv heads; the sinks and the
-- window add none. torchtitan runs it with flex attention only: the
-- registry's default varlen is refused. Held live: tests/titan/
-- test_cp_record.py's gpt_* configs.
function T.cp_kv_exchange()
  local function cp_plan(parallel, backend)
    return plan.from_source(src(TINY:gsub("seq_len = 8", "seq_len = 512") .. (backend or ", attn_backend = 'flex'"),
      parallel, 4, "{ local_batch_size = 1, loss_chunks = 1 }"), "plans/t.lua")
  end
  for _, c in ipairs({ { "{ dp_shard = 2, cp = 2 }", 2 }, { "{ cp = 2, tp = 2 }", 1 },
                       { "{ dp_shard = 2, cp = 2, ep = 2 }", 2 } }) do
    local p = cp_plan(c[1])
    local per = {}
    for _, o in ipairs(p.ops) do
      if o.group == "cp" and o.micro_step == 0 then
        local n = p.layout.units[o.unit + 1].name
        per[n] = (per[n] or "") .. o.kind .. (o.phase == "backward" and "' " or " ")
        H.eq(o.count, 256 * c[2] * 4, c[1] .. ": seq 512 / cp 2 tokens x the TP-local kv heads x head_dim 4")
      end
    end
    for _, n in ipairs({ "layers.0", "layers.1" }) do
      H.eq(per[n], "tp_all_gather tp_all_gather tp_reduce_scatter' tp_reduce_scatter' ", c[1] .. " " .. n)
    end
  end
  H.plan_fails(src(TINY:gsub("seq_len = 8", "seq_len = 512"), "{ dp_shard = 2, cp = 2 }", 4),
    "model.attn_backend", "registry's default", "full_dtensor.py:44-52", "set attn_backend = \"flex\"")
  H.plan_fails(src(TINY:gsub("seq_len = 8", "seq_len = 512") .. ", attn_backend = 'varlen'",
    "{ dp_shard = 2, cp = 2 }", 4), "model.attn_backend", "context_parallel/api.py:103-104")
  H.plan_fails("return { world_size = 2, model = { family = 'mixtral', size = '8x7b', attn_backend = 'flex' } }",
    "model.attn_backend", "gpt_oss")
end

function T.refusals()
  H.plan_fails(src("size = 'debugmodel', seq_len = 256", "{ dp_shard = 2, tp = 2, loss_parallel = false }"),
    "parallel.loss_parallel", "gpt_oss family", "components/loss.py:51-58")
  H.plan_fails(src("size = '30b'"), "model.size", "unknown gpt-oss size", "20b")
  H.plan_fails(src("size = 'debugmodel', sliding_window = 0"), "model.sliding_window")
  H.plan_fails(src("size = 'debugmodel', n_kv_heads = 5"), "model.n_kv_heads")
  H.plan_fails(src("size = 'debugmodel', n_dense_layers = 1"), "model.n_dense_layers")
  H.plan_fails("return { world_size = 2, model = { family = 'mixtral', size = '8x7b', sliding_window = 64 } }",
    "model.sliding_window")
end

return T
