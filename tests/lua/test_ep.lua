-- Expert parallel (issue 23, items 3 and 4; gen/parallel/ep.lua): the
-- experts' layout (experts per rank, shard dims, the two parameter groups,
-- their groups and order), the all-to-alls (order and fields per micro-step),
-- the capacity policy's arithmetic, and the refusals.
local H = require("helpers")
local plan = require("gen.plan")
local ep = require("gen.parallel.ep")

local T = {}

-- A tiny Mixtral-like plan: world ranks, parallel, extra top-level text.
local function mix(world, parallel, extra, model_extra)
  return string.format([[return { world_size = %d, parallel = %s, model = { family = "mixtral", dtype = "fp32",
    seq_len = 8, dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 8,
    num_experts = 4, top_k = 2%s }, fsdp = { reduce_op = "sum" }%s }]], world, parallel, model_extra or "",
    extra or "")
end

-- A tiny DeepSeek-V3 plan (MLA with a query LoRA, one dense block, two MoE
-- blocks with a shared expert).
local function ds(world, parallel)
  return string.format([[return { world_size = %d, parallel = %s, model = { family = "deepseek_v3", dtype = "fp32",
    seq_len = 8, dim = 16, n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 37, q_lora_rank = 6,
    kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 2, v_head_dim = 4, dense_hidden_dim = 24,
    moe_hidden_dim = 8, num_experts = 4, num_shared_experts = 1, top_k = 2 }, fsdp = { reduce_op = "sum" } }]],
    world, parallel)
end

local function unit(p, name)
  for _, u in ipairs(p.layout.units) do if u.name == name then return u end end
  error("no unit " .. name)
end

function T.experts_split_over_ep_and_sharded_over_efsdp()
  local p = plan.from_source(mix(4, "{ dp_shard = -1, ep = 2 }"), "plans/t.lua")
  local names = {}
  for i, u in ipairs(p.layout.units) do names[i] = u.name end
  H.list_eq(names, { "root", "tok_embeddings", "layers.0", "layers.0.experts", "layers.1", "layers.1.experts",
                     "norm_lm_head" }, "units: each MoE block's dense group, then its experts group")
  local d, e = unit(p, "layers.0"), unit(p, "layers.0.experts")
  for _, q in ipairs(d.params) do assert(not q.name:find("inner_experts", 1, true), q.name) end
  H.eq(#e.params, 3, "w1, w2, w3")
  H.eq(e.params[1].name, "layers.0.moe.routed_experts.inner_experts.w1_EFD")
  H.list_eq(e.params[1].shape, { 2, 8, 12 }, "4 experts / ep 2 per rank")
  H.eq(e.params[1].ep_full, 4); H.eq(e.params[1].ep_chunk, 2)
  -- efsdp 2 x ep 2 = 4 does not outnumber 4 experts: Shard(0) over efsdp (2 ranks)
  H.eq(e.params[1].shard_dim, 0); H.eq(e.W, 2); H.eq(e.shard_group, "efsdp")
  H.eq(d.W, nil, "the dense group keeps the plan's dp_shard")
  H.eq(e.state, "layers.0"); H.eq(d.state, "layers.0")
  H.eq(p.groups.by_name.efsdp.size, 2); H.eq(p.groups.by_name.ep.size, 2)
end

function T.shard1_when_efsdp_times_ep_outnumbers_the_experts()
  -- world 8, ep 2: efsdp 4, 4 x 2 = 8 > 4 experts -> Shard(1) (replicas never count at ep > 1)
  local p = plan.from_source(mix(8, "{ dp_shard = -1, ep = 2 }"), "plans/t.lua")
  local e = unit(p, "layers.1.experts")
  H.eq(e.params[1].shard_dim, 1); H.eq(e.W, 4)
  H.eq(e.params[1].chunk, 2, "F = 8 over efsdp 4")
  -- HSDP 2 x 2 with ep 2: efsdp 1, 1 x 2 = 2 <= 4 -> Shard(0) although 4 dense ranks would count at ep = 1
  p = plan.from_source(mix(4, "{ dp_replicate = 2, dp_shard = -1, ep = 2 }"), "plans/t.lua")
  e = unit(p, "layers.1.experts")
  H.eq(e.params[1].shard_dim, 0); H.eq(e.W, 1)
  -- Shard(1) needs F divisible by efsdp: refused as FSDP2 does, naming efsdp
  H.plan_fails(mix(8, "{ dp_shard = -1, ep = 2 }", nil, ""):gsub("moe_hidden_dim = 8", "moe_hidden_dim = 6"),
    "shard_dim", "not divisible by efsdp=4")
end

-- The op sequence of one unit index: kinds with groups.
local function seq_of(p, pred)
  local out = {}
  for _, o in ipairs(p.ops) do
    if pred(o) then out[#out + 1] = o.kind .. (o.group and ("@" .. o.group) or "") .. ":" .. o.unit end
  end
  return table.concat(out, " ")
end

function T.fsdp2_group_order_and_explicit_prefetch()
  local p = plan.from_source(mix(4, "{ dp_shard = -1, ep = 2 }"), "plans/t.lua")
  -- units: 1 tok, 2 L0, 3 L0.experts, 4 L1, 5 L1.experts, 6 norm_lm_head
  local comm = seq_of(p, function(o) return o.group ~= nil end)
  local want = table.concat({
    -- forward: tok, then its explicit prefetch of layers.0's groups in order; layers.0 waits for both and
    -- prefetches layers.1's before its compute (the all-to-alls), layers.1 the norm and lm_head
    "all_gather@fsdp:1", "all_gather@fsdp:2", "all_gather@efsdp:3",
    "all_gather@fsdp:4", "all_gather@efsdp:5", "a2a_counts@ep:3", "a2a@ep:3", "a2a@ep:3",
    "all_gather@fsdp:6", "a2a_counts@ep:5", "a2a@ep:5", "a2a@ep:5",
    -- backward: lm_head prefetches layers.1's groups reversed; RS of norm_lm_head
    "all_gather@efsdp:5", "all_gather@fsdp:4", "reduce_scatter@fsdp:6",
    -- layers.1 prefetches layers.0 reversed; combine's grad, dispatch's grad; experts' RS first
    "all_gather@efsdp:3", "all_gather@fsdp:2", "a2a@ep:5", "a2a@ep:5", "reduce_scatter@efsdp:5",
    "reduce_scatter@fsdp:4",
    "all_gather@fsdp:1", "a2a@ep:3", "a2a@ep:3", "reduce_scatter@efsdp:3", "reduce_scatter@fsdp:2",
    "reduce_scatter@fsdp:1" }, " ")
  H.eq(comm, want, "collectives")
  -- forward: the prefetch goes out before the current block's compute
  local all = seq_of(p, function(o) return o.unit == 1 or o.unit == 2 end)
  assert(all:find("copy_out:1 all_gather@fsdp:2 forward:1", 1, true), all)
end

function T.a2a_ops_order_and_fields()
  local p = plan.from_source(mix(4, "{ dp_shard = -1, ep = 2 }", ", expert_parallel = { capacity_factor = 1.25 }",
    ""):gsub("fsdp = { reduce_op = \"sum\" }", "fsdp = { reduce_op = \"sum\", micro_steps = 2 }"), "plans/t.lua")
  local e = unit(p, "layers.0.experts")
  -- tokens 8 x top_k 2 = 16 rows; ceil(1.25 x 16 / 2) = 10; dropless would be 8 x min(2, 2) = 16
  H.eq(e.a2a.capacity, 10); H.eq(e.a2a_numel, 2 * 10 * 12); H.eq(e.a2a_slots, 2); H.eq(e.a2a_experts, 4)
  local seen = {}
  for _, o in ipairs(p.ops) do
    if o.unit == e.index and (o.kind == "a2a" or o.kind == "a2a_counts" or o.kind == "forward" or o.kind == "backward") then
      seen[#seen + 1] = o
    end
  end
  local kinds = {}
  for i, o in ipairs(seen) do
    kinds[i] = o.kind .. (o.kind == "a2a" and (o.a2a_combine == 1 and "+" or "-") or "") .. o.micro_step
  end
  H.eq(table.concat(kinds, " "), "a2a_counts0 a2a-0 forward0 a2a+0 a2a-0 backward0 a2a+0 "
    .. "a2a_counts1 a2a-1 forward1 a2a+1 a2a-1 backward1 a2a+1", "per micro-step order")
  for _, o in ipairs(seen) do
    if o.kind == "a2a_counts" then
      H.eq(o.group, "ep"); H.eq(o.count, 2); H.eq(o.a2a_experts, 2); H.eq(o.a2a_rows, 16)
      H.eq(o.a2a_slot, o.micro_step); H.eq(o.stream, "compute"); H.eq(o.dtype, "fp32")
    elseif o.kind == "a2a" then
      H.eq(o.count, 10 * 12); H.eq(o.a2a_capacity, 10); H.eq(o.a2a_dim, 12); H.eq(o.stream, "compute")
      local c = p.ops[o.a2a_counts_op + 1]
      H.eq(c.kind, "a2a_counts"); H.eq(c.micro_step, o.micro_step, "split by its own micro-step's counts")
    end
  end
end

-- Activation checkpointing (torchtitan 0.3, recorded live: tests/ep/check_ep_live.sh's dp4_ep2_full and
-- dp4_ep2_sel): the backward re-runs each MoE block's counts exchange, dispatch and combine before the
-- block's two backward all-to-alls; nothing else is re-issued (no all-gather: the block is unsharded).
local function with_ac(ac, micro)
  return mix(4, "{ dp_shard = -1, ep = 2 }", string.format(", training = { activation_checkpointing = %q }", ac))
    :gsub("fsdp = { reduce_op = \"sum\" }", string.format("fsdp = { reduce_op = \"sum\", micro_steps = %d }", micro))
end

function T.recompute_reissues_the_forward_all_to_alls()
  local plain = plan.from_source(with_ac("none", 2), "plans/t.lua")
  for _, ac in ipairs({ "full", "selective" }) do
    local p = plan.from_source(with_ac(ac, 2), "plans/t.lua")
    local e = unit(p, "layers.0.experts")
    H.eq(e.a2a.recompute, true, ac)
    local kinds, seen = {}, {}
    for _, o in ipairs(p.ops) do
      if o.unit == e.index and (o.kind == "a2a" or o.kind == "a2a_counts" or o.kind == "forward"
                                or o.kind == "backward") then
        seen[#seen + 1] = o
        kinds[#kinds + 1] = (o.recompute and "r" or "") .. o.kind .. (o.kind == "a2a" and (o.a2a_combine == 1 and "+"
          or "-") or "") .. o.micro_step
      end
    end
    H.eq(table.concat(kinds, " "), "a2a_counts0 a2a-0 forward0 a2a+0 ra2a_counts0 ra2a-0 ra2a+0 a2a-0 backward0 a2a+0 "
      .. "a2a_counts1 a2a-1 forward1 a2a+1 ra2a_counts1 ra2a-1 ra2a+1 a2a-1 backward1 a2a+1", ac .. ": per micro-step")
    for _, o in ipairs(seen) do
      if o.recompute then H.eq(o.phase, "backward") end
      if o.kind == "a2a_counts" and o.recompute then
        -- the recompute names its forward's counts op: same unit, micro-step and slot
        local f = p.ops[o.a2a_counts_op + 1]
        H.eq(f.kind, "a2a_counts"); H.eq(f.phase, "forward"); H.eq(f.recompute, nil)
        H.eq(f.a2a_slot, o.a2a_slot); H.eq(f.micro_step, o.micro_step); H.eq(o.count, f.count)
      elseif o.kind == "a2a" and o.phase == "backward" then
        -- the recompute's and the backward's all-to-alls split by the recompute's counts
        local c = p.ops[o.a2a_counts_op + 1]
        H.eq(c.recompute, true); H.eq(c.micro_step, o.micro_step)
      end
    end
    -- the collectives are the plain plan's with three all-to-alls more per MoE layer and micro-step, nothing else
    local function others(q)
      local out = {}
      for _, o in ipairs(q.ops) do
        if o.group and o.kind ~= "a2a" and o.kind ~= "a2a_counts" then out[#out + 1] = o.kind .. "@" .. o.group end
      end
      return table.concat(out, " ")
    end
    H.eq(others(p), others(plain), ac .. ": no all-gather or other collective is re-issued")
    local function count(q, pred)
      local n = 0
      for _, o in ipairs(q.ops) do if pred(o) then n = n + 1 end end
      return n
    end
    local a2a = function(o) return o.kind == "a2a" or o.kind == "a2a_counts" end
    H.eq(count(p, a2a), count(plain, a2a) + 2 * 2 * 3, "2 layers x 2 micro-steps x 3")
    -- the audit prices them: 6 token and 2 counts exchanges per layer and micro-step
    local audit = require("gen.audit")
    local s, s0 = audit.ep_summary(p), audit.ep_summary(plain)
    H.eq(s.exchanges, 6); H.eq(s.counts_exchanges, 2); H.eq(s0.exchanges, 4); H.eq(s0.counts_exchanges, 1)
    H.eq(s.step_bytes_uniform - s0.step_bytes_uniform, 2 * 2 * (s.layer_bytes_uniform - s0.layer_bytes_uniform),
      "the step's bytes: the recompute's three per layer and micro-step")
    assert(s.layer_bytes_uniform > s0.layer_bytes_uniform)
  end
  H.eq(unit(plain, "layers.0.experts").a2a.recompute, false, "no checkpointing: no recompute")
  H.eq(ep.recomputes("none"), false); H.eq(ep.recomputes("full"), true); H.eq(ep.recomputes("selective"), true)
end

-- Repeated micro-steps: each recompute names its own micro-step's forward counts op, inside the repeated run too.
function T.recompute_in_repeated_micro_steps()
  local p = plan.from_source(with_ac("selective", 6), "plans/t.lua")
  assert(p.rep, "micro-steps 3 .. 4 repeat")
  local n = 0
  for _, o in ipairs(p.ops) do
    if o.kind == "a2a_counts" and o.recompute then
      local f = p.ops[o.a2a_counts_op + 1]
      H.eq(f.micro_step, o.micro_step); H.eq(f.unit, o.unit); H.eq(f.a2a_slot, o.a2a_slot)
      n = n + 1
    end
  end
  H.eq(n, 2 * 5, "2 layers x the 5 micro-steps the tables list (3 .. 4 folded)")
end

-- The verifier refuses a recompute counts op that does not name its forward's.
function T.recompute_naming_another_op_is_refused()
  local verify = require("gen.verify")
  local p = plan.from_source(with_ac("full", 2), "plans/t.lua")
  local r
  for _, o in ipairs(p.ops) do if o.kind == "a2a_counts" and o.recompute then r = o; break end end
  local fwd = r.a2a_counts_op
  verify.order(p.layout, p.groups, p.ops)
  for _, bad in ipairs({ fwd + 1, r.seq, r.seq + 1 }) do
    r.a2a_counts_op = bad
    local ok, err = pcall(verify.order, p.layout, p.groups, p.ops)
    assert(not ok and tostring(err):find("a2a_counts names op " .. bad .. " as the forward it recomputes", 1, true),
      tostring(err))
  end
  r.a2a_counts_op, r.recompute = fwd, nil
  local ok, err = pcall(verify.order, p.layout, p.groups, p.ops)
  assert(not ok and tostring(err):find("as the forward it recomputes", 1, true), "unmarked: " .. tostring(err))
end

function T.capacity_math()
  H.eq(ep.capacity(8, 2, 4, 2, { name = "dropless" }), 16)
  H.eq(ep.capacity(8, 2, 8, 8, { name = "dropless" }), 8, "one expert per member: a token reaches it once")
  H.eq(ep.capacity(8, 2, 4, 2, { name = "factor", factor = 1.25 }), 10)
  H.eq(ep.capacity(8, 2, 4, 2, { name = "factor", factor = 4 }), 16, "never above dropless")
  H.eq(ep.capacity(1, 1, 4, 4, { name = "factor", factor = 0.01 }), 1, "at least one row")
  H.eq(ep.policy({}).name, "dropless", "the default")
  H.eq(ep.policy({ expert_parallel = { capacity_factor = 2 } }).name, "factor")
end

function T.repeated_micro_steps_keep_their_counts_slots()
  local p = plan.from_source(mix(4, "{ dp_shard = -1, ep = 2 }"):gsub("fsdp = { reduce_op = \"sum\" }",
    "fsdp = { micro_steps = 6 }"), "plans/t.lua")
  assert(p.rep, "micro-steps 3 .. 4 repeat")
  local expanded = plan.from_source(mix(4, "{ dp_shard = -1, ep = 2 }"):gsub("fsdp = { reduce_op = \"sum\" }",
    "fsdp = { micro_steps = 6 }"), "plans/t.lua", { expand = true })
  H.eq(expanded.rep, nil)
  for _, o in ipairs(p.ops) do
    if o.a2a_slot then H.eq(o.a2a_slot, o.micro_step) end
  end
end

function T.refusals_one_line_each()
  H.plan_fails(mix(4, "{ dp_shard = -1 }", ", expert_parallel = { capacity_factor = 2 }"), "expert_parallel",
    "only with ep > 1")
  H.plan_fails(mix(4, "{ dp_shard = -1, ep = 2 }", ", expert_parallel = { capacity = \"factor\" }"),
    "expert_parallel.capacity", "needs capacity_factor")
  H.plan_fails(mix(4, "{ dp_shard = -1, ep = 2 }", ", expert_parallel = { capacity = \"dropless\", capacity_factor = 2 }"),
    "expert_parallel.capacity_factor", "remove one")
  H.plan_fails(mix(4, "{ dp_shard = -1, ep = 2 }", ", expert_parallel = { capacity_factor = 0 }"),
    "expert_parallel.capacity_factor")
  -- DeepSeek-V3 with TP: still refused with ep groups cutting TP groups unevenly, etp > 1,
  -- loss_parallel = false and async TP (PP x EP x TP plans: tests/lua/test_pp_families.lua)
  H.plan_fails((ds(6, "{ dp_shard = 3, tp = 2, ep = 3 }"):gsub("num_experts = 4", "num_experts = 6")), "parallel.ep",
    "ep=3 with tp=2", "cut TP groups unevenly", "torchtitan 0.3 accepts it", "pick ep a multiple or a divisor of tp")
  H.plan_fails(ds(4, "{ dp_shard = 2, tp = 2, ep = 2, etp = 2 }"), "parallel.etp", "experts are not tensor-parallel")
  -- (cp beside ep and tp is planned: gen/parallel/cp.lua; here its seq_len rule)
  H.plan_fails(ds(8, "{ cp = 2, dp_shard = 2, tp = 2, ep = 2 }"), "model.seq_len", "cp x 128")
  H.plan_fails(ds(4, "{ dp_shard = 2, tp = 2, loss_parallel = false }"), "parallel.loss_parallel",
    "torchtitan 0.3 has no such switch", "components/loss.py:51-58")
  H.plan_fails(ds(4, "{ dp_shard = 2, tp = 2, async_tp = true }"), "parallel.async_tp", "not modelled")
  H.plan_fails(mix(8, "{ dp_shard = -1, ep = 8 }"), "parallel.ep", "num_experts=4 not divisible by ep=8")
  H.plan_fails("return { world_size = 4, parallel = { dp_shard = -1, ep = 2 }, model = { family = 'llama', "
    .. "dim = 16, n_layers = 1, n_heads = 2, n_kv_heads = 2, vocab_size = 8 } }", "parallel.ep", "needs routed experts")
  H.plan_fails(mix(4, "{ dp_shard = -1, ep = 2 }"):gsub("reduce_op = \"sum\"", "micro_steps = 2, grad_accumulation = \"step_end\""),
    "fsdp.grad_accumulation", "step_end")
end

function T.c_mesh_is_the_expert_mesh()
  local p = plan.from_source(mix(8, "{ dp_replicate = 2, dp_shard = -1, ep = 2 }"), "plans/t.lua")
  local emit = require("gen.emit")
  local v = emit.vars(p, "0")
  H.eq(v.mesh_names, '"dp_replicate", "efsdp", "ep"')
  H.eq(v.mesh_sizes, "2, 2, 2")
  -- fsdp (dp_shard) is efsdp x ep there; ep and efsdp their own axes
  assert(v.families:find('.name = "fsdp", .axis_mask = 0x6u', 1, true), v.families)
  assert(v.families:find('.name = "ep", .axis_mask = 0x4u', 1, true), v.families)
  assert(v.families:find('.name = "efsdp", .axis_mask = 0x2u', 1, true), v.families)
  assert(v.families:find('.name = "dp_replicate", .axis_mask = 0x1u', 1, true), v.families)
  assert(v.units:find(".expert = 1", 1, true), "experts units carry their group")
end

-- DeepSeek-V3 under TP (torchtitan 0.3's plan, recorded live: tests/ep/check_ep_live.sh's dp2_tp2* cases):
-- the placements, the TP collectives around the MoE at ep = 1 and ep > 1, the all-to-alls sized from the
-- rank's seq / tp tokens, and the C mesh refining the dense and expert meshes.
local function ops_of(p, unit_name, pred)
  local out = {}
  for _, o in ipairs(p.ops) do
    if p.layout.units[o.unit + 1].name == unit_name and pred(o) then out[#out + 1] = o end
  end
  return out
end

local function kinds(list)
  local t = {}
  for _, o in ipairs(list) do t[#t + 1] = o.kind .. (o.phase == "backward" and "'" or "") end
  return table.concat(t, " ")
end

function T.deepseek_tp_at_ep1_splits_the_experts_hidden_dim()
  local p = plan.from_source(ds(4, "{ dp_shard = 2, tp = 2 }"), "plans/t.lua")
  local u = unit(p, "layers.1")
  local by = {}
  for _, q in ipairs(u.params) do by[q.name:gsub("^layers%.1%.", "")] = q end
  H.eq(by["moe.routed_experts.inner_experts.w1_EFD"].tp_dim, 1)
  H.eq(by["moe.routed_experts.inner_experts.w2_EDF"].tp_dim, 2)
  H.eq(by["moe.router.gate.weight"].tp_dim, nil)
  H.eq(by["attention.wq_a.weight"].tp_dim, nil)
  H.eq(by["attention.wq_b.weight"].tp_dim, 0)
  H.eq(by["moe.shared_experts.w2.weight"].tp_dim, 1)
  local tp = ops_of(p, "layers.1", function(o) return o.group == "tp" end)
  -- attention, the MoE input gathered, routed and shared outputs reduce-scattered; backward mirrored;
  -- then the Partial gradients of wq_a, q_norm, wkv_a, kv_norm, the two norms and the gate
  H.eq(kinds(tp), "tp_all_gather tp_reduce_scatter tp_all_gather tp_reduce_scatter tp_reduce_scatter "
    .. "tp_all_gather' tp_all_gather' tp_reduce_scatter' tp_all_gather' tp_reduce_scatter' "
    .. "tp_all_reduce' tp_all_reduce' tp_all_reduce' tp_all_reduce' tp_all_reduce' tp_all_reduce' tp_all_reduce'")
  H.eq(tp[1].count, 8 * 16 // 2, "a sequence shard")
  H.eq(tp[#tp].count, 4 * 16, "the gate's whole gradient")
end

-- Without sequence parallelism (recorded live: tests/ep/ep_cases.py's dp2_tp2_nosp, dp2_tp2_ep2_nosp): the
-- Partial outputs all-reduced in forward, the inputs' gradients in backward; at ep > 1 the MoE's output
-- after the combine, the shared experts' input gradient before the combine's, the two input slices'
-- gradients gathered after the dispatch's; the block norms' gradients whole (no all-reduce).
function T.deepseek_tp_without_sequence_parallel()
  local p = plan.from_source(ds(4, "{ dp_shard = 2, tp = 2, sequence_parallel = false }"), "plans/t.lua")
  local tp = ops_of(p, "layers.1", function(o) return o.group == "tp" end)
  -- wo, MoE; MoE input, attention input; wq_a, q_norm, wkv_a, kv_norm, the gate (not the two block norms)
  H.eq(kinds(tp), "tp_all_reduce tp_all_reduce tp_all_reduce' tp_all_reduce' tp_all_reduce' tp_all_reduce' "
    .. "tp_all_reduce' tp_all_reduce' tp_all_reduce'")
  H.eq(tp[1].count, 8 * 16, "the whole activation")
  p = plan.from_source(ds(4, "{ dp_shard = 2, tp = 2, ep = 2, sequence_parallel = false }"), "plans/t.lua")
  local seq = ops_of(p, "layers.1.experts", function(o) return o.group == "tp" or o.group == "ep" end)
  H.eq(kinds(seq), "a2a_counts a2a a2a tp_all_reduce tp_all_reduce' a2a' a2a' tp_all_gather' tp_all_gather'")
  H.eq(seq[#seq].count, 8 * 16 // 2, "a sequence shard's gradient gathered")
end

function T.deepseek_tp_with_ep_routes_the_sequence_shard()
  local p = plan.from_source(ds(8, "{ dp_shard = 4, tp = 2, ep = 4 }"), "plans/t.lua")
  H.eq(p.layout.ep.tokens, 8 // 2, "seq_len / tp tokens per rank")
  local e = unit(p, "layers.1.experts")
  H.eq(e.params[1].tp_dim, nil, "experts not TP-split (etp = 1)")
  H.eq(e.a2a.capacity, 4 * 1, "tokens x min(top_k, experts per member)")
  -- the shared experts' pair after the combine, and in backward before the combine's gradient
  local seq = ops_of(p, "layers.1.experts", function(o) return o.group == "tp" or o.group == "ep" end)
  H.eq(kinds(seq), "a2a_counts a2a a2a tp_all_gather tp_reduce_scatter tp_all_gather' tp_reduce_scatter' a2a' a2a'")
  -- the dense part: attention only, its gate's Partial gradient still all-reduced
  local tp = ops_of(p, "layers.1", function(o) return o.kind == "tp_all_reduce" end)
  H.eq(#tp, 7)
  local emit = require("gen.emit")
  local v = emit.vars(p, "0")
  H.eq(v.mesh_names, '"dp_shard.efsdp", "dp_shard.ep", "tp.ep"')
  assert(v.families:find('.name = "tp", .axis_mask = 0x4u', 1, true), v.families)
  assert(v.families:find('.name = "ep", .axis_mask = 0x6u', 1, true), v.families)
  assert(v.families:find('.name = "dp_shard", .axis_mask = 0x3u', 1, true), v.families)
  assert(v.families:find('.name = "efsdp", .axis_mask = 0x1u', 1, true), v.families)
  H.eq(v.tp_mesh_dim, 2)
end

-- The model's parameter count counts every expert, whatever slice of them a
-- rank holds (SCHEDULE.md's model line): Mixtral 8x7B at ep 8 is 46.7 B.
function T.model_params_count_every_expert()
  local compute = require("gen.compute")
  local p = require("gen.plan").from_file("plans/mixtral8x7b.lua")
  H.eq(p.dims.ep, 8, "ep 8")
  H.eq(compute.model_params(p), 46702792704, "Mixtral 8x7B's parameters")
end

return T
