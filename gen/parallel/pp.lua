-- Pipeline parallel, the module (gen/parallel/init.lua's contract), as far
-- as it goes: ParallelDims takes pp (torchtitan's mesh puts it outermost:
-- gen/dims.lua) with its process groups, and `make pipeline` plans torch's
-- schedules for the plan (gen/parallel/pp_report.lua: torchtitan's stage
-- split, every rank's lowered actions, the send/receive proof, the timed
-- run). Generating the pipeline's tables is not done yet: a plan with
-- pp > 1 is refused here with the command that plans it.
local util = require("gen.util")

local pp = {
  name = "pp", label = "PP", dims = { "pp" }, groups = { "pp" },
  plans_only = true, -- (not named among what commplan generates)
}

function pp.used(d) return d.pp > 1 end

function pp.rules(ctx, d, p)
  if d.pp > 1 then
    util.field_error(ctx, "parallel.pp", string.format("pp=%d: `make pipeline PLAN=...` plans torch's pipeline "
      .. "schedules for this plan (docs/pipeline.md), but the generator does not build pipeline tables yet; set "
      .. "pp=1 to generate", d.pp))
  end
  if p.pipeline ~= nil then
    util.field_error(ctx, "pipeline", "pp=1: there is no pipeline to schedule; remove the pipeline section or set "
      .. "parallel.pp > 1")
  end
end

return pp
