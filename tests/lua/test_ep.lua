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
  H.plan_fails(mix(8, "{ dp_shard = -1, tp = 2, ep = 2 }"), "parallel.tp", "set tp=1")
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

-- The model's parameter count counts every expert, whatever slice of them a
-- rank holds (SCHEDULE.md's model line): Mixtral 8x7B at ep 8 is 46.7 B.
function T.model_params_count_every_expert()
  local compute = require("gen.compute")
  local p = require("gen.plan").from_file("plans/mixtral8x7b.lua")
  H.eq(p.dims.ep, 8, "ep 8")
  H.eq(compute.model_params(p), 46702792704, "Mixtral 8x7B's parameters")
end

return T
