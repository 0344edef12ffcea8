-- DeepSeek-V3's multi-token prediction (model.num_mtp_layers,
-- gen/models/deepseek_v3.lua): the MTP units and their parameters in
-- torchtitan's order, the forward-call order's FSDP step
-- (gen/parallel/fsdp_schedule.lua calls_micro: the embedding gathered again
-- per depth, [norm, lm_head] once more in backward, one reduction per unit),
-- its difference from one forward per unit, torchtitan's TP and EP runs
-- with MTP replayed (tests/ep/recorded/*_mtp.json), and the refusals where
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

-- HSDP with 2 micro-steps (tests/titan/test_mtp.py's mtp1_hsdp_m2: 58 collectives per rank-step)
function T.micro_steps_and_hsdp_plan()
  local src_m2 = src(", num_mtp_layers = 1", "{ dp_replicate = 2, dp_shard = 2 }"):gsub("reduce_op = 'sum'",
    "reduce_op = 'sum', micro_steps = 2")
  local p = plan.from_source(src_m2, "plans/t.lua")
  local ag, rs = counts(p)
  H.eq(rs.tok_embeddings, 2, "HSDP: the embedding reduced once per micro-step")
  H.eq(ag.tok_embeddings, 6, "three gathers of the embedding per micro-step")
  local n = 0
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" or o.kind == "reduce_scatter" or o.kind == "all_reduce" then n = n + 1 end
  end
  H.eq(n, 58, "collectives per rank-step")
end

-- Memory and FLOPs: an MTP block priced as a block (its attention too, never checkpointed: torchtitan's AC
-- wraps model.layers before the MTP blocks join it), the head's saved bytes one more logits per depth, the
-- extra calls' compute in the predicted step.
function T.memory_and_flops()
  local compute = require("gen.compute")
  local function per(p)
    local s = compute.settings(p)
    local r = compute.units(p, s)
    local by = {}
    for _, u in ipairs(p.layout.units) do by[u.name] = r[u.index] end
    return by, s
  end
  local p0, p2 = gen(", num_mtp_layers = 0", nil, "{ loss_chunks = 1 }"), gen(", num_mtp_layers = 2")
  local a, b = per(p0), per(p2)
  local last, mtp = a["layers.3"], b["mtp_layers.0"]
  assert(mtp.fwd > last.fwd, "an MTP block's FLOPs are its last-block copy's plus eh_proj's")
  assert(mtp.saved > last.saved, "an MTP block saves its block's bytes and the fusion's inputs")
  local s = select(2, per(p2))
  local toks, V = s.tokens, 96
  H.eq(b.norm_lm_head.saved - a.norm_lm_head.saved, 2 * (2 * toks * 64 + 4 * toks * V), "the head: 2 depths' logits")
  -- the step: lm_head three times and the embedding once per call
  local function count(p, kind, unit)
    local n = 0
    for _, o in ipairs(p.ops) do
      if o.kind == kind and p.layout.units[o.unit + 1].name == unit then n = n + 1 end
    end
    return n
  end
  H.eq(count(p2, "forward", "norm_lm_head"), 4, "the norm and three lm_head calls")
  H.eq(count(p2, "backward_input", "norm_lm_head") + count(p2, "backward", "norm_lm_head"), 4, "their backward")
  H.eq(count(p2, "forward", "tok_embeddings"), 3, "the embedding's calls")
  assert(p2.planned_timeline.tl.step_us > p0.planned_timeline.tl.step_us, "the MTP step is predicted longer")
  -- selective AC leaves the MTP blocks unwrapped
  local pa = gen(", num_mtp_layers = 1", nil, "{ activation_checkpointing = 'selective' }")
  H.eq(compute.checkpointed(pa, pa.layout.units[8]), false, "mtp_layers.0 is not checkpointed")
end

-- The forward-call order generalises the one-forward-per-unit step: given one call per unit (pre, forward,
-- post; backward pre, compute, post with gradients, last unit first), calls_micro gives these shipped plans'
-- steps op for op (FSDP and HSDP, DDP, CPU offload, sync_last / all_reduce_last / step_end accumulation,
-- set_unshard_in_backward(False), reshard_after_forward to 2 ranks under FSDP and HSDP, frozen parameters,
-- per-unit accumulation, HSDP keeping parameters unsharded, symmetric memory): the 13 below; 36 of the 55
-- plans in plans/ and tests/plans/ so (not: the ChunkedLossWrapper ones, the llama and MoE families' default
-- loss, gen/parallel/fsdp.lua chunked_loss; explicit prefetch; EP: orders the default builder keeps;
-- llama405b, a pipeline stage's plan, the same but left out as large).
function T.one_call_per_unit_is_the_default_step()
  local L = require("gen.parallel.fsdp_layout")
  local function one_call_each(_, out)
    local f, b = {}, {}
    for _, u in ipairs(out) do
      if #u.params > 0 then
        for _, ev in ipairs({ "pre", "fwd", "post" }) do f[#f + 1] = { ev = ev, unit = u.index } end
      end
    end
    for i = #out, 1, -1 do
      local u = out[i]
      if #u.params > 0 then
        b[#b + 1] = { ev = "pre", unit = u.index }
        b[#b + 1] = { ev = "bwd", unit = u.index }
        b[#b + 1] = { ev = "post", unit = u.index, grads = true }
      end
    end
    return { forward = f, backward = b }
  end
  local function sig(p)
    local t = {}
    for _, o in ipairs(p.ops) do
      t[#t + 1] = table.concat({ o.kind, o.unit, o.micro_step, o.phase, tostring(o.count), tostring(o.group),
                                 tostring(o.stream), tostring(o.sharded) }, ",")
    end
    return t
  end
  for _, path in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/ddp2.lua", "plans/hsdp2x2_offload.lua",
                          "plans/hsdp3x2_arlast.lua", "plans/hsdp2x2_stepend.lua", "tests/plans/unshard_bwd.lua",
                          "tests/plans/fsdp4_raf2.lua", "tests/plans/hsdp_raf2.lua", "tests/plans/frozen_params.lua",
                          "tests/plans/gacc_units.lua", "tests/plans/hsdp_keep_unsharded.lua",
                          "tests/plans/symm_fsdp4.lua" }) do
    local text = H.read(path)
    local want = sig(plan.from_source(text, path))
    local saved = L.calls
    L.calls = one_call_each
    local ok, p = pcall(plan.from_source, text, path)
    L.calls = saved
    assert(ok, p)
    H.list_eq(sig(p), want, path)
  end
end

-- Under torchtitan's TP plan (tests/ep/recorded/dp2_tp2_mtp.json: dp_shard 2 x tp 2, one MTP depth, sequence
-- and loss parallel; dp2_tp2_nosp_mtp.json: two depths without sequence parallelism; torchtitan's MTPLoss; events
-- and shapes only, tests/ep/check_ep_live.sh records them): every FSDP and TP collective equals the tables (the
-- embedding's pair per call, the MTP block's as a block's with mtp_norm's gather, the output's gather with the
-- norm's call, the loss's three all-reduces per lm_head call). The plan with one forward per unit differs, and
-- so does the one whose TP collectives run with every call of [norm, lm_head] (the calls' parts dropped).
function T.tp_recordings_equal_the_tables()
  local json = require("gen.json")
  local live = require("tests.ep.compare_ep_live")
  local function load(name) return json.decode(H.read("tests/ep/recorded/" .. name .. ".json")) end
  for _, c in ipairs({ { "dp2_tp2_mtp", 76, 304 }, { "dp2_tp2_nosp_mtp", 92, 204 } }) do
    local diff, res = live.check_case(load(c[1]))
    H.eq(diff, nil, c[1])
    H.eq(res.colls, c[2], c[1] .. ": FSDP collectives")
    H.eq(res.tp, c[3], c[1] .. ": TP collectives")
  end
  local calls = ds.calls
  local function differs(mutant, want)
    ds.calls = mutant
    local ok, d = pcall(live.check_case, load("dp2_tp2_mtp"))
    ds.calls = calls
    assert(ok, d)
    assert(type(d) == "string" and d:find(want, 1, true), "want '" .. want .. "', got " .. tostring(d))
  end
  differs(function() return nil end, "rank 0 event")
  differs(function(cfg)
    local c = calls(cfg)
    for _, e in ipairs(c.forward) do e.part = nil end
    for _, e in ipairs(c.backward) do e.part = nil end
    return c
  end, "rank 0 event")
end

-- Model FLOPs per token (MFU's numerator) with MTP as torchtitan counts them: its registry's 16B with 0, 1 and 2
-- MTP depths at seq_len 4096, DeepSeekV3Model.Config.get_nparams_and_flops(model, 4096) on torchtitan 0.3 (model
-- built on the meta device; tests/titan/test_mtp.py's flops check computes them live): each depth adds 6 x its
-- block's active parameters (eh_proj and the norms too), no attention term.
-- Under expert parallelism (tests/ep/recorded/dp4_ep2_mtp.json: dp_shard 4 x ep 2, one MTP depth;
-- dp2_tp2_ep2_mtp.json: TP 2 with EP 2 over the TP ranks; events and shapes only): torchtitan's explicit prefetch
-- lists with the MTP blocks as model.layers keys (the last block prefetching mtp_layers.0, lm_head the MTP
-- block in backward, mtp_layers.0 the last block), the embedding's second call prefetching layers.0 again
-- (kept gathered into the backward: no backward all-gather of it), the MTP block's dispatch and combine, and
-- under TP mtp_norm's gather after the combine: equal to the tables. The plan with the MTP blocks in layout order
-- (after [norm, lm_head], as without MTP) differs.
function T.ep_recordings_equal_the_tables()
  local json = require("gen.json")
  local live = require("tests.ep.compare_ep_live")
  local S = require("gen.parallel.fsdp_schedule")
  local function load(name) return json.decode(H.read("tests/ep/recorded/" .. name .. ".json")) end
  for _, c in ipairs({ { "dp4_ep2_mtp", 112, 0, 60 }, { "dp2_tp2_ep2_mtp", 112, 280, 60 } }) do
    local diff, res = live.check_case(load(c[1]))
    H.eq(diff, nil, c[1])
    H.eq(res.colls, c[2], c[1] .. ": FSDP collectives")
    H.eq(res.tp, c[3], c[1] .. ": TP collectives")
    H.eq(res.a2a, c[4], c[1] .. ": all-to-alls")
  end
  local lists = S.prefetch_lists
  S.prefetch_lists = function(states, lay)
    for _, st in ipairs(states) do st.units[1].mtp_depth = nil end
    return lists(states, lay)
  end
  local ok, d = pcall(live.check_case, load("dp4_ep2_mtp"))
  S.prefetch_lists = lists
  assert(ok, d)
  assert(type(d) == "string" and d:find("rank 0 event", 1, true), tostring(d))
end

function T.model_flops_per_token_are_torchtitans()
  local compute = require("gen.compute")
  local want = { [0] = 18105996288, 18654990336, 19203984384 }
  for n = 0, 2 do
    local p = plan.from_source(string.format("return { world_size = 8, parallel = { dp_shard = 8 }, model = { "
      .. "family = 'deepseek_v3', size = '16b', seq_len = 4096, num_mtp_layers = %d } }", n), "plans/t.lua")
    H.eq(compute.model_flops_per_token(p, compute.settings(p)), want[n], n .. " MTP depths")
  end
end

-- grad_accumulation "step_end" (torch.distributed.pipelining's): finalize_backward reduces every pending
-- unit in reversed(all_states), all_states in named_modules() order (torch 2.15 _fsdp_state.py:470, :206-220):
-- mtp_layers.1, mtp_layers.0, norm_lm_head, layers.3 .. 0, tok_embeddings; not the order the hooks fired
-- (calls_micro's posted list: the mutant)
function T.step_end_finalizes_in_module_order()
  local s = src(", num_mtp_layers = 2"):gsub("reduce_op = 'sum'", "reduce_op = 'sum', micro_steps = 2, "
    .. "grad_accumulation = 'step_end'")
  local p = plan.from_source(s, "plans/t.lua")
  local names = {}
  for _, o in ipairs(p.ops) do
    if o.kind == "reduce_scatter" then names[#names + 1] = p.layout.units[o.unit + 1].name end
  end
  H.list_eq(names, { "mtp_layers.1", "mtp_layers.0", "norm_lm_head", "layers.3", "layers.2", "layers.1",
                     "layers.0", "tok_embeddings" }, "step_end's reductions")
end

function T.refusals()
  H.plan_fails(src(", num_mtp_layers = 1", "{ dp_shard = 2, pp = 2 }"), "model.num_mtp_layers", "mtp.py:199-204")
  H.plan_fails(src(", num_mtp_layers = 1", "{ dp_shard = 2, cp = 2 }"), "model.num_mtp_layers", "mtp.py:205-209")
  H.plan_fails(src(", num_mtp_layers = 1", nil, "{ loss_chunks = 8 }"), "training.loss_chunks", "mtp.py:271-275")
  H.plan_fails(src(", num_mtp_layers = -1"), "model.num_mtp_layers")
  H.plan_fails(src(", num_mtp_layers = 1.5"), "model.num_mtp_layers")
  H.plan_fails("return { world_size = 4, model = { family = 'llama', size = '8b', num_mtp_layers = 1 } }",
               "model.num_mtp_layers", "deepseek_v3")
end

-- plan.json's units' forward_calls (gen/audit.lua; the bridge runs such a unit's hooks per call,
-- python/commplan/runtime.py _pre_forward_call): the embedding and [norm, lm_head] 1 + depths,
-- every other unit and the one-forward mutant none
function T.plan_json_forward_calls()
  local audit, json = require("gen.audit"), require("gen.json")
  local function calls(p)
    local out = {}
    for _, u in ipairs(json.decode(audit.json(p, audit.fingerprint(p))).units) do out[u.name] = u.forward_calls end
    return out
  end
  for n = 1, 2 do
    local c = calls(gen(", num_mtp_layers = " .. n))
    H.eq(c.tok_embeddings, 1 + n, n .. ": the embedding's forward calls")
    H.eq(c.norm_lm_head, 1 + n, n .. ": [norm, lm_head]'s forward calls")
    H.eq(c["mtp_layers.0"], nil, n .. ": an MTP block called once")
    H.eq(c["layers.0"], nil, n .. ": a block called once")
  end
  local saved = ds.calls
  ds.calls = function() return nil end
  local ok, p = pcall(gen, ", num_mtp_layers = 1")
  ds.calls = saved
  assert(ok, p)
  H.eq(calls(p).tok_embeddings, nil, "the one-forward mutant carries none")
end

return T
