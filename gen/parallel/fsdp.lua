-- FSDP2 and HSDP, the module (gen/parallel/init.lua's contract):
-- fully_shard on every unit, over the dp_shard group (fsdp) and, with
-- dp_replicate > 1, HSDP's replicate group. It owns the parameters'
-- storage (each unit's fused buffers: fsdp_layout.lua), orders the step
-- (FSDP2's issue order: fsdp_schedule.lua, which inserts the other
-- modules' unit ops) and proves both (gen/verify.lua's coverage and
-- schedule proofs). Every commplan plan uses it: a shard group of one rank
-- is still fully_shard (FSDP2's world-size-1 path), as DDP-like plans
-- (dp_shard = 1, dp_replicate > 1) are HSDP with one-rank shard groups.
local layout = require("gen.parallel.fsdp_layout")
local schedule = require("gen.parallel.fsdp_schedule")
local verify = require("gen.verify")

local fsdp = {
  name = "fsdp", label = "FSDP/HSDP", dims = { "dp_shard", "dp_replicate" },
  groups = { "fsdp", "dp_replicate" },
}

function fsdp.used() return true end

-- TP-local units (or the model's, without a module that splits them) -> the class's layout.
function fsdp.buffers(ctx, units, d, p)
  return layout.build(ctx, units, d, p.fsdp)
end

-- The step's op list; opts.unit_ops inserts the other modules' ops at
-- each unit's compute and post-backward (fsdp_schedule.lua).
function fsdp.step(lay, fams, p, opts)
  return schedule.build(lay, fams, p.fsdp, opts)
end

function fsdp.prove_class(lay, ops, p, rep)
  verify.coverage(lay)
  verify.schedule(lay, ops, p.fsdp, rep)
end

return fsdp
