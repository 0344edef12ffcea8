-- Pipeline parallel, the module (gen/parallel/init.lua's contract): ParallelDims
-- takes pp (torchtitan's mesh puts it outermost: gen/dims.lua) with its
-- process groups; `make pipeline` plans torch's schedules for the plan
-- (gen/parallel/pp_report.lua: torchtitan's stage split, every rank's
-- lowered actions, the proofs, the timed run) and gen/plan.lua builds a
-- plan with pp > 1 and a schedule into a class of tables per pipeline rank
-- (gen/parallel/pp_build.lua).
local util = require("gen.util")

local pp = {
  name = "pp", label = "PP", dims = { "pp" }, groups = { "pp" },
  plans_only = true, -- (not named among what commplan generates)
}

function pp.used(d) return d.pp > 1 end

function pp.rules(ctx, d, p)
  if d.pp > 1 and not (p.pipeline and p.pipeline.schedule) then
    util.field_error(ctx, p.pipeline and "pipeline.schedule" or "pipeline", string.format("pp=%d: the tables run "
      .. "one of torch's schedules; add pipeline = { schedule = \"1F1B\", microbatches = N } (`make pipeline "
      .. "PLAN=...` compares them, docs/pipeline.md)", d.pp))
  end
  if d.pp == 1 and p.pipeline ~= nil then
    util.field_error(ctx, "pipeline", "pp=1: there is no pipeline to schedule; remove the pipeline section or set "
      .. "parallel.pp > 1")
  end
end

return pp
