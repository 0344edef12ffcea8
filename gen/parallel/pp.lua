-- Pipeline parallel, the module (gen/parallel/init.lua's contract), as
-- torchtitan's pipeline_llm applies it to every decoder family (llama,
-- qwen3, the MoE families: distributed/pipeline_parallel.py:65-141): the
-- model split into stages (gen/parallel/pp_stages.lua, torchtitan's split;
-- pp_report.unit_names, its modules as the family's units), each stage a
-- fully_shard'ed module on the stage mesh (world / pp ranks: pp is the
-- mesh's outermost dim, gen/dims.lua), run by one of
-- torch.distributed.pipelining's schedules (gen/parallel/pp_schedule.lua,
-- or the plan's CSV: pp_csv.lua) over pipeline.microbatches.
--
-- What it implements of the contract:
--   rules        no pipeline section without a pipeline
--   inner_plan   the stage mesh's plan file: pp = 1 on world / pp ranks,
--                one microbatch's batch (gen/parallel/pp_report.lua);
--                gen/plan.lua plans it like any plan (FSDP, HSDP, TP)
--   prepare      the plan's refusals, the stage split, the schedule and
--                the activation between stages, once
--   settings     FSDP as torchtitan sets it under PP: no reshard after
--                forward (its "default" and "never" policies; "always"
--                reshards after every microbatch's forward, and each
--                backward gathers again: pp_sequence.lua), gradients
--                reduced once after the last microbatch, the step's
--                micro-steps the microbatches
--   classes      a class per (pipeline rank, the stage mesh's class): the
--                rank's stages' units, laid out as the stage mesh's class
--                lays them out (TP-local shapes)
--   step         the rank's lowered actions as ops (pp_tables.lua):
--                FSDP's unshard / reduce pieces at UNSHARD and REDUCE_GRAD,
--                the other modules' unit_ops inside each stage's compute
--                (TP's collectives; EP's token all-to-alls, before and
--                after a unit's F and B), sends and receives between stages
--   prove        every rank's communication equal to what torch issues
--                (pp_sequence.lua, held to torch live) and the whole step
--                deadlock-free (pp_step_proof.lua); the plan's schedule's
--                timed run (pp_audit.lua), the audit's figures
--   describe     the pipeline's facts on the plan (p.pp for the tables,
--                p.pipeline for the audit)
-- Its step is not the audit's timeline's (gen/timeline.lua models FSDP's
-- overlap on one rank): `predicts = false`, so the memory plan reuses
-- bytes at once, and the step's figures come from the timed run.
local util = require("gen.util")
local report = require("gen.parallel.pp_report")
local tables = require("gen.parallel.pp_tables")
local seq = require("gen.parallel.pp_sequence")
local step_proof = require("gen.parallel.pp_step_proof")

local fmt = string.format

local pp = {
  name = "pp", label = "PP", dims = { "pp" }, groups = { "pp" },
  predicts = false,
}

function pp.used(d) return d.pp > 1 end

-- (a plan with pp > 1 and no schedule runs torchtitan's default, 1F1B:
-- gen/load.lua's pipeline_defaults)
function pp.rules(ctx, d, p)
  if d.pp == 1 and p.pipeline ~= nil then
    util.field_error(ctx, "pipeline", "pp=1: there is no pipeline to schedule; remove the pipeline section or set "
      .. "parallel.pp > 1")
  end
end

function pp.inner_plan(_, _, p) return report.stage_loaded(p) end

-- -> mine: { loaded, inner (the stage mesh's plan), t (pp_report.tables:
-- sched, act, stage_units, stage_fsdp) }, handed to the hooks below.
function pp.prepare(_, _, p, inner)
  report.adopt(p, inner)
  return { loaded = p, inner = inner, t = report.tables(p, nil, { skip_classes = true }) }
end

function pp.settings(p, mine)
  local f = mine.inner.fsdp
  local out = {}
  for k, v in pairs(p) do out[k] = v end
  -- (torchtitan's "always" policy reshards after every forward under PP too:
  -- pp_sequence.reshards_after_forward)
  local always = seq.reshards_after_forward(mine.inner)
  out.fsdp = { micro_steps = mine.t.sched.microbatches, reshard_after_forward = always,
               reshard_after_forward_policy = always and "always" or nil, grad_accumulation = "step_end",
               reduce_op = f.reduce_op, param_dtype = f.param_dtype, reduce_dtype = f.reduce_dtype,
               gradient_divide_factor = f.gradient_divide_factor,
               force_sum_reduction_for_comms = f.force_sum_reduction_for_comms,
               cpu_offload = f.cpu_offload, pin_memory = f.pin_memory, symm_mem = f.symm_mem }
  return out
end

-- A class per (pipeline rank, stage-mesh class), numbered rank-major;
-- class_of: [pp coordinate x tp + tp coordinate] -> class (1-based).
function pp.classes(_, d, mine)
  local t, inner = mine.t, mine.inner
  local ntp = #inner.tp_classes
  local classes = {}
  for c, tcls in ipairs(inner.tp_classes) do
    -- the stages' units as this class lays them out
    local by_name = {}
    for _, u in ipairs(tcls.layout.units) do by_name[u.name] = u end
    local su = {}
    for st, list in pairs(t.stage_units) do
      su[st] = {}
      for i, u in ipairs(list) do su[st][i] = by_name[u.name] end
    end
    for r = 0, t.sched.pp - 1 do
      local stages, units, unit_of = tables.rank_units(t.sched, su, r)
      local lay = {}
      for k, v in pairs(tcls.layout) do lay[k] = v end
      lay.units = units
      classes[r * ntp + c] = { layout = lay, facts = { pp_rank = r, tp_class = c - 1, stages = stages, outer = r },
                               rank = { pp_rank = r, stages = stages, unit_of = unit_of, stage_units = su },
                               coords = ntp > 1 and { r, table.concat(tcls.coords, "/") } or { r } }
    end
  end
  local class_of = {}
  for r = 0, t.sched.pp - 1 do
    for k = 0, d.tp - 1 do class_of[r * d.tp + k] = r * ntp + (inner.class_of and inner.class_of[k] or 1) end
  end
  return { classes = classes, class_of = class_of }
end

function pp.step(_, _, _, opts)
  local t, cls = opts.mine.t, opts.class
  return tables.rank_ops(opts.mine.inner, t.sched, cls.rank.stage_units, t.act, cls.rank, { unit_ops = opts.unit_ops })
end

-- The communication of every global rank from the tables, against the
-- events torch issues (pp_sequence, held to torch live) and through the
-- whole-step proof, over TP class 0's ranks (TP's collectives run inside
-- each TP rank's compute, the same on every TP rank). Raises a one-line
-- error naming the first difference.
local function prove_sequence(mine, classes)
  local t, inner = mine.t, mine.inner
  -- FSDP's shard group: dp_shard x cp (gen/dims.lua's fsdp alias; CP's
  -- ranks shard the parameters too), the comparison mesh's "dp_shard"
  local W, R = inner.layout.W, inner.dims.dp_replicate
  local ntp = #inner.tp_classes
  local first_tp = {}
  for r = 0, t.sched.pp - 1 do
    local cls = classes[r * ntp + 1]
    first_tp[r + 1] = { pp_rank = r, stages = cls.stages, units = cls.layout.units, ops = cls.ops }
  end
  local E, T = inner.dims.ep, inner.dims.tp
  local got = tables.events(first_tp, seq.mesh(t.sched.pp, W, R, E, T), W)
  local want = seq.expected(t.sched, seq.options(inner, t.act, t.stage_fsdp, t.stage_compute))
  for g = 1, #want do
    for i = 1, math.max(#got[g], #want[g]) do
      local x, y = got[g][i], want[g][i]
      local same = x and y
      for _, k in ipairs({ "op", "peer", "numel", "dtype", "batch", "unit", "in_numel", "out_numel" }) do
        same = same and x[k] == y[k]
      end
      if not same then
        error(fmt("internal: pipeline rank tables differ from torch's sequence at global rank %d event %d (%s vs %s)",
          g - 1, i - 1, x and x.op or "none", y and y.op or "none"), 0)
      end
    end
  end
  local counts, why = step_proof.prove(got)
  if not counts then
    util.field_error(mine.loaded.ctx, "pipeline.schedule", "the whole-step proof fails on the tables: " .. tostring(why))
  end
  return counts
end

-- The proofs, then the plan's schedule's timed run (the audit's step,
-- bubble and memory per pipeline rank: pp_report.plan_row, its actions
-- recorded for the timeline; the whole-step proof ran on the tables
-- above, not again there).
function pp.prove(classes, mine)
  mine.counts = prove_sequence(mine, classes)
  mine.record = {}
  local ok, row = pcall(report.plan_row, mine.loaded, { record = mine.record, skip_step_proof = true })
  if not ok then
    if not util.is_plan_error(row) then error(row, 0) end
    row = { refused = tostring(row.msg or row) }
  end
  mine.row = row
end

-- p.pp = { size, mesh_dim, family } (gen/emit.lua's pipeline fields);
-- p.pipeline, what the audit reads of the pipeline (gen/figures.lua,
-- gen/pipeline_audit.lua, gen/pipeline_timeline.lua):
--   { sched (the schedule's lowered actions, pp, microbatches, num_stages),
--     act = { numel, dtype } (one microbatch's activation between stages),
--     counts (the whole-step proof's), stage_plan (the stage mesh's plan,
--     one microbatch), loaded (the plan as loaded), row (pp_report's
--     plan_row: sim, mem, mem_rank, fits, p2p_us, ...; or { refused = why }
--     where the timed run refuses), record (the timed run's actions: rank,
--     stage, type, mb, start, finish) }
function pp.describe(out, _, mine)
  out.pp = { size = mine.t.sched.pp, mesh_dim = out.mesh.index.pp - 1, family = out.groups.by_name.pp.id }
  out.pipeline = { sched = mine.t.sched, act = mine.t.act, counts = mine.counts, stage_plan = mine.inner, loaded = mine.loaded,
                   row = mine.row, record = mine.record }
  return out
end

return pp
