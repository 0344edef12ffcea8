-- `make pipeline` and the other verbs over a pipeline plan (advisor,
-- diff-plan): gen/parallel/pp_report.lua's comparison of torch's schedules,
-- over the plan of the stage mesh, which this file has gen/plan.lua plan
-- (the generator plans it as PP's inner plan: gen/parallel/pp.lua). The
-- pipeline module and its reports never require gen/plan.lua themselves:
-- the verbs stand above the generator, the modules below it.
local plan = require("gen.plan")
local report = require("gen.parallel.pp_report")

local M = {}

local fmt = string.format

M.SCHEDULES, M.human_us, M.human_bytes = report.SCHEDULES, report.human_us, report.human_bytes

-- The loaded pipeline plan's stage mesh planned and adopted (once: the
-- report caches it per loaded plan), after the plan's refusals.
local function prepared(loaded)
  if not report.adopted(loaded) then report.adopt(loaded, plan.from_loaded(report.stage_loaded(loaded))) end
  return loaded
end

function M.text(loaded) return report.text(prepared(loaded)) end
function M.rows(loaded, opts) return report.rows(prepared(loaded), opts) end
function M.csv(loaded) return report.csv(prepared(loaded)) end
function M.plan_row(loaded, opts) return report.plan_row(prepared(loaded), opts) end
function M.tables(loaded, schedule, opts) return report.tables(prepared(loaded), schedule, opts) end

-- A stage's FSDP collectives as the generator plans them: the plan of the
-- stage's units (units in wrap order, the root last) on dp_replicate x
-- dp_shard ranks with torch.distributed.pipelining's accumulation
-- ("step_end") over the microbatches; its all-gathers of micro-step 0 and
-- its reduce-scatters (and HSDP's all-reduces), in the plan's order, each
-- { unit = name, count = elements per rank, dtype, kind }.
-- units: { { name, params = { { name, shape, dtype? } ... } } ... }.
function M.stage_fsdp_from_plan(units, dp_shard, microbatches, dtype, dp_replicate)
  local parts = {}
  for _, u in ipairs(units) do
    local ps = {}
    for _, p in ipairs(u.params) do
      ps[#ps + 1] = fmt("{ name = %q, shape = { %s } }", p.name, table.concat(p.shape, ", "))
    end
    parts[#parts + 1] = fmt("{ name = %q, params = { %s } }", u.name, table.concat(ps, ", "))
  end
  local R = dp_replicate or 1
  local src = fmt([[return { world_size = %d, parallel = { dp_shard = -1, dp_replicate = %d },
  model = { family = "generic", dtype = %q, units = { %s } },
  fsdp = { reshard_after_forward = false, grad_accumulation = "step_end", micro_steps = %d } }]],
    dp_shard * R, R, dtype or "fp32", table.concat(parts, ",\n"), microbatches)
  local p = plan.from_source(src, "pp_stage.lua")
  local res = { gathers = {}, reduces = {} }
  for _, op in ipairs(p.ops) do
    local u = p.layout.units[op.unit + 1]
    if op.kind == "all_gather" and op.micro_step == 0 then
      res.gathers[#res.gathers + 1] = { unit = u.name, count = op.count, dtype = op.dtype }
    elseif op.kind == "reduce_scatter" then
      res.reduces[#res.reduces + 1] = { unit = u.name, count = op.count or u.total, dtype = u.reduce_dtype,
                                        kind = "reduce_scatter" }
    elseif op.kind == "all_reduce" and R > 1 then
      res.reduces[#res.reduces + 1] = { unit = u.name, count = op.count, dtype = u.reduce_dtype, kind = "all_reduce" }
    elseif op.kind == "all_gather" or op.kind == "all_reduce" then
      error(fmt("pipeline: the stage plan has a %s in micro-step %d, which this module does not place",
        op.kind, op.micro_step))
    end
  end
  return res
end

return M
