-- A pipeline plan's facts, through one accessor: everything the renderers
-- (gen/figures.lua, gen/pipeline_audit.lua, gen/pipeline_timeline.lua)
-- read about a pipeline comes from pipeline_facts.of. Today they are
-- gathered from what gen/parallel/pp_build.lua leaves on the plan
-- (p.pipeline_build) and the plan's schedule's timed run
-- (gen/parallel/pp_report.lua's plan_row); once the plan carries them
-- itself, only this function changes.
local util = require("gen.util")
local report = require("gen.parallel.pp_report")

local pipeline_facts = {}

-- (one timed run per plan object: every renderer asks)
local CACHE = setmetatable({}, { __mode = "k" })

-- p -> nil for a plan without a pipeline, else
--   { sched (the schedule's lowered actions, pp, microbatches, num_stages),
--     act = { numel, dtype } (one microbatch's activation between stages),
--     counts (the whole-step proof's), stage_plan (the stage mesh's plan,
--     one microbatch), row (pp_report.plan_row: sim, mem, mem_rank, fits,
--     p2p_us, ...; or { refused = why } where the timed run refuses),
--     record (the timed run's actions: rank, stage, type, mb, start, finish) }
function pipeline_facts.of(p)
  local b = p.pipeline_build
  if not b then return nil end
  local hit = CACHE[p]
  if hit then return hit end
  local record = {}
  -- (the whole-step proof ran on the tables themselves: not again here)
  local ok, row = pcall(report.plan_row, b.loaded, { record = record, skip_step_proof = true })
  if not ok then
    if not util.is_plan_error(row) then error(row, 0) end
    row = { refused = tostring(row.msg or row) }
  end
  local facts = { sched = b.sched, act = b.act, counts = b.counts, stage_plan = b.stage_plan, row = row,
                  record = record }
  CACHE[p] = facts
  return facts
end

return pipeline_facts
