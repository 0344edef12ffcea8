-- Issue 39: FSDPModule's schedule knobs as plan options (docs/plan-files.md).
local H = require("helpers")
local plan = require("gen.plan")
local T = {}

local UNITS = { { "l0", { { "a", { 4 } } } }, { "l1", { { "b", { 6 } } } }, { "root", { { "c", { 4 } } } } }

-- ops per micro-step and phase:kind, and per unit
local function tally(p)
  local per = {}
  for _, o in ipairs(p.ops) do
    local k = per[o.micro_step] or {}
    per[o.micro_step] = k
    local key = o.phase .. ":" .. o.kind .. ":" .. p.layout.units[o.unit + 1].name
    k[key] = (k[key] or 0) + 1
  end
  return per
end

-- set_reshard_after_backward(False) on all but the last micro-step (torch
-- 2.15 _fsdp_param_group.py post_backward): the kept units stay unsharded
-- into the next forward, which gathers nothing for them; a unit resharded
-- after forward is gathered again in backward; the last micro-step
-- reshards every unit; the reductions are FSDP2's default's (every backward).
function T.reshard_after_backward_false_keeps_units_unsharded_between_micro_steps()
  local p = plan.from_source(H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }", UNITS,
    "{ micro_steps = 3, reshard_after_backward = false }"), "t.lua")
  local per = tally(p)
  for _, u in ipairs({ "root", "l0", "l1" }) do
    H.eq(per[0]["forward:all_gather:" .. u], 1, "micro-step 0 gathers " .. u)
    H.eq(per[0]["backward:reshard:" .. u], nil, "micro-step 0 keeps " .. u)
    H.eq(per[2]["backward:reshard:" .. u], 1, "the last micro-step reshards " .. u)
    for m = 1, 2 do
      H.eq(per[m]["forward:all_gather:" .. u], nil, "micro-step " .. m .. " gathers nothing for " .. u)
      H.eq(per[m]["backward:reduce_scatter:" .. u], 1, "micro-step " .. m .. " reduces " .. u)
    end
  end
  H.eq(per[1]["backward:all_gather:l1"], 1, "resharded after forward: gathered again in backward")
  H.eq(p.layout.units[1].reshard_after_backward, false)
  -- the mutant: without the knob every micro-step's forward gathers every unit
  local q = tally(plan.from_source(H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }", UNITS,
    "{ micro_steps = 3 }"), "t.lua"))
  H.eq(q[1]["forward:all_gather:l0"], 1, "the default gathers again")
end

-- A unit's own setting overrides the plan's, either way (set_reshard_after_backward(x, recurse=False)).
function T.reshard_after_backward_per_unit()
  local src = H.generic(2, "{ dp_shard = 2 }", UNITS, "{ micro_steps = 2, grad_accumulation = 'sync_last' }")
  src = src:gsub('{ name = "l1",', '{ name = "l1", reshard_after_backward = false,')
  local p = plan.from_source(src, "t.lua")
  local per = tally(p)
  H.eq(per[1]["forward:all_gather:l1"], nil, "l1 kept")
  H.eq(per[1]["forward:all_gather:l0"], 1, "l0 resharded as the plan's default")
  H.eq(per[0]["backward:reshard:l1"], nil)
  H.eq(per[0]["backward:reshard:l0"], 1)
end

function T.reshard_after_backward_refusals()
  H.plan_fails(H.generic(2, "{ dp_shard = 2 }", UNITS, "{ reshard_after_backward = false }"),
    "fsdp.reshard_after_backward", "micro_steps = 1", "_fully_shard.py:697")
  H.plan_fails(H.generic(2, "{ dp_shard = 2 }", UNITS,
    "{ micro_steps = 2, grad_accumulation = 'step_end', reshard_after_backward = false }"),
    "fsdp.reshard_after_backward", "step_end", "stage.py")
  local src = H.generic(2, "{ dp_shard = 2 }", UNITS, "{}")
  src = src:gsub('{ name = "l1",', '{ name = "l1", reshard_after_backward = true,')
  H.plan_fails(src, "model.units[2].reshard_after_backward", "micro_steps = 1")
  local pp = H.read("tests/pp/plans/pp_tiny.lua"):gsub("fsdp = {", "fsdp = { reshard_after_backward = false,", 1)
  H.plan_fails(pp, "fsdp.reshard_after_backward", "pipeline stage", "stage.py")
end

local function collectives(p)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.group then out[#out + 1] = o.micro_step .. ":" .. o.kind .. ":" .. p.layout.units[o.unit + 1].name end
  end
  return table.concat(out, " ")
end

local function with_lists(src, lists)
  for name, l in pairs(lists) do
    src = src:gsub('{ name = "' .. name .. '",', '{ name = "' .. name .. '", ' .. l .. ',')
  end
  return src
end

local U4 = { { "l0", { { "a", { 4 } } } }, { "l1", { { "b", { 6 } } } }, { "l2", { { "d", { 5 } } } },
             { "root", { { "c", { 4 } } } } }

-- set_modules_to_forward_prefetch / _backward_prefetch naming what FSDP2
-- does by default (each layer the next in forward; the root the last layer
-- and each layer the one before in backward) plan the default's collectives;
-- other lists move the all-gathers (the root prefetching l2 and l0 in
-- backward: l0's all-gather before l2's reduce-scatter).
function T.explicit_prefetch_lists()
  local base = H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }", U4, "{ micro_steps = 2 }")
  local default = collectives(plan.from_source(base, "t.lua"))
  local same = plan.from_source(with_lists(base, {
    root = 'forward_prefetch = { "l0" }, backward_prefetch = { "l2" }',
    l0 = 'forward_prefetch = { "l1" }', l1 = 'forward_prefetch = { "l2" }, backward_prefetch = { "l0" }',
    l2 = 'backward_prefetch = { "l1" }' }), "t.lua")
  H.eq(same.layout.explicit_prefetch, true)
  H.eq(collectives(same), default, "the default's lists plan the default's collectives")
  local moved = collectives(plan.from_source(with_lists(base, { root = 'backward_prefetch = { "l2", "l0" }' }),
    "t.lua"))
  assert(moved ~= default, "other lists move the all-gathers")
  -- (l2, the last unit, keeps the default: its pre-backward prefetches l1; the root's runs after it,
  -- on the same output tensor)
  assert(moved:find("0:all_gather:l2 0:all_gather:l1 0:all_gather:l0 0:reduce_scatter:l2", 1, true), moved)
end

function T.explicit_prefetch_refusals()
  local base = H.generic(2, "{ dp_shard = 2 }", U4, "{}")
  H.plan_fails(with_lists(base, { l0 = 'forward_prefetch = { "l9" }' }), "model.units[1].forward_prefetch[1]",
    "not a unit")
  H.plan_fails(with_lists(base, { l0 = 'forward_prefetch = { "l0" }' }), "forward_prefetch[1]", "the unit itself")
  H.plan_fails(with_lists(base, { l1 = 'backward_prefetch = { "l0", "l0" }' }), "backward_prefetch[2]", "twice")
  H.plan_fails(with_lists(base, { l1 = "backward_prefetch = {}" }), "backward_prefetch", "empty list")
  H.plan_fails(with_lists(H.generic(2, "{ dp_shard = 2 }", U4, "{ micro_steps = 2, grad_accumulation = 'step_end' }"),
    { l1 = 'backward_prefetch = { "l0" }' }), "model.units[2].backward_prefetch", "step_end")
end

-- Where issue 39's knobs meet (the merged lanes' review): a unit's own
-- grad_accumulation keeps its reshard_after_backward hold; a uniform
-- param_dtype override gathers in that dtype (uint8 only where the inputs
-- differ, torch 2.15 _fsdp_collectives.py:927-933); knobs on a unit FSDP2
-- manages no parameter of are refused; explicit prefetching beside a
-- loss_head unit is refused (ChunkedLossWrapper's order is planned without it).
function T.knobs_combined()
  local src = H.generic(2, "{ dp_shard = 2 }", UNITS, "{ micro_steps = 2 }")
  src = src:gsub('{ name = "l0",', '{ name = "l0", reshard_after_backward = false, grad_accumulation = "sync_last",')
  local per = tally(plan.from_source(src, "t.lua"))
  H.eq(per[1]["forward:all_gather:l0"], nil, "l0 kept from micro-step 0 under its own sync_last")
  H.eq(per[0]["backward:reshard:l0"], nil)
  H.eq(per[1]["backward:reduce_scatter:l0"], 1, "l0 reduces on the last micro-step only")
  H.eq(per[0]["backward:reduce_scatter:l0"], nil)

  local uni = H.generic(2, "{ dp_shard = 2 }", { { "l0", { { "a", { 6, 4 } }, { "b", { 6 } } } }, { "root", { { "c", { 4 } } } } },
    "{ param_dtype = 'bf16' }")
  uni = uni:gsub('{ name = "a", shape = { 6, 4 } }', '{ name = "a", shape = { 6, 4 }, param_dtype = "fp32" }')
  local alike = uni:gsub('{ name = "b", shape = { 6 } }', '{ name = "b", shape = { 6 }, param_dtype = "fp32" }')
  local function gathers(p, name)
    for _, o in ipairs(p.ops) do
      if o.kind == "all_gather" and p.layout.units[o.unit + 1].name == name then return o.dtype, o.count end
    end
  end
  local dt, n = gathers(plan.from_source(alike, "t.lua"), "l0")
  H.eq(dt .. " x " .. n, "fp32 x 15", "both overridden alike: fp32, 15 elements")
  H.eq((gathers(plan.from_source(uni, "t.lua"), "l0")), "u8", "one overridden: the raw-byte all-gather")

  local ign = H.generic(2, "{ dp_shard = 2 }", UNITS, "{ micro_steps = 2 }")
  ign = ign:gsub('{ name = "l0", params = { { name = "a", shape = { 4 } } } }',
    '{ name = "l0", grad_accumulation = "sync_last", params = { { name = "a", shape = { 4 }, ignored = true } } }')
  H.plan_fails(ign, "model.units[1].grad_accumulation", "only ignored")
  H.plan_fails((ign:gsub('grad_accumulation = "sync_last"', "reshard_after_backward = false")),
    "model.units[1].reshard_after_backward", "only ignored")
  H.plan_fails((ign:gsub('grad_accumulation = "sync_last"', "cpu_offload = true")), "model.units[1].cpu_offload")
end

-- FSDPModule.set_unshard_in_backward(False) (torch 2.15 _fully_shard.py:1000-1009;
-- _fsdp_param_group.py:463-467): a unit resharded after forward gathers nothing
-- in backward (nor does a prefetch of it), backwards on its sharded parameters,
-- is not resharded again, and still reduces; the root (never resharded after
-- forward) is unchanged.
function T.unshard_in_backward_false()
  local src = H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }", UNITS, "{ micro_steps = 2 }")
  local uib = src:gsub('{ name = "l0",', '{ name = "l0", unshard_in_backward = false,')
    :gsub('{ name = "root",', '{ name = "root", unshard_in_backward = false,')
  local p = plan.from_source(uib, "t.lua")
  local per = tally(p)
  for m = 0, 1 do
    H.eq(per[m]["backward:all_gather:l0"], nil, "l0 gathers nothing in backward")
    H.eq(per[m]["backward:copy_out:l0"], nil)
    H.eq(per[m]["backward:reshard:l0"], nil, "FSDP2's reshard finds it sharded")
    H.eq(per[m]["forward:all_gather:l0"], 1)
    H.eq(per[m]["backward:reduce_scatter:l0"], 1, "its grads still reduce")
    H.eq(per[m]["backward:all_gather:l1"], 1, "l1 keeps FSDP2's default")
  end
  local sharded = {}
  for _, o in ipairs(p.ops) do
    if o.kind == "backward" then sharded[p.layout.units[o.unit + 1].name] = o.sharded or false end
  end
  H.eq(sharded.l0, true)
  H.eq(sharded.l1, false)
  H.eq(sharded.root, false, "the root is never resharded after forward: unchanged")
  H.eq(p.layout.units[1].unshard_in_backward, false)
  -- the unit's unsharded parameters live from its forward's copy-out to its forward's reshard only
  -- (a backward that read them would be caught by the proof: the mutant below)
  local ops = {}
  for i, o in ipairs(p.ops) do
    ops[i] = {}
    for k, v in pairs(o) do ops[i][k] = v end
    ops[i].sharded = nil
  end
  local ok, err = pcall(require("gen.verify").schedule, p.layout, ops, p.fsdp, p.rep)
  H.eq(ok, false, "the proof rejects a backward reading l0's resharded parameters")
  H.eq(tostring(err):find("backward of l0 on sharded params", 1, true) ~= nil, true, tostring(err))
  -- the default plan gathers l0 in backward
  H.eq(tally(plan.from_source(src, "t.lua"))[0]["backward:all_gather:l0"], 1)
end

function T.unshard_in_backward_refusals()
  local src = H.generic(4, "{ dp_shard = 4 }", UNITS, "{}")
  H.plan_fails((src:gsub('{ name = "l0",', '{ name = "l0", reshard_after_forward = 2, unshard_in_backward = false,')),
    "model.units[1].unshard_in_backward", "reshard_after_forward = 2", "_fsdp_param.py")
  -- torchtitan's [norm, lm_head] under its ChunkedLossWrapper: lm_head is gathered inside the loss
  H.plan_fails([[
return { world_size = 4, parallel = { dp_shard = 4 },
  model = { family = "generic", seq_len = 16, units = {
    { name = "layers.0", params = { { name = "layers.0.w", shape = { 32, 32 } } } },
    { name = "head", loss_head = true, unshard_in_backward = false, params = {
      { name = "norm.weight", shape = { 32 } }, { name = "lm_head.weight", shape = { 37, 32 } } } },
    { name = "root", params = {} } } },
  training = { loss_chunks = 4 } }]], "model.units[2].unshard_in_backward", "ChunkedLossWrapper", "fsdp.py")
end

return T
