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
end

return T
