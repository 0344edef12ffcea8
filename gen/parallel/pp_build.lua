-- A pipeline plan (parallel.pp > 1 with pipeline.schedule) built into C
-- tables (issue 22, item 5): one class per pipeline rank
-- (gen/parallel/pp_tables.lua: its stages' units and one step's ops),
-- each with its own memory plan and proofs, over the whole world's mesh
-- (pp outermost, gen/dims.lua) and its group families; the whole step's
-- communication proved deadlock-free over every rank
-- (gen/parallel/pp_step_proof.lua) and equal to what torch issues
-- (gen/parallel/pp_sequence.lua); gen/audit.lua renders them as every
-- plan (gen/pipeline_audit.lua: the pipeline's own parts). TP inside the
-- stages: a class per (pipeline rank, TP class).
local util = require("gen.util")
local dims = require("gen.dims")
local groups = require("gen.groups")
local memplan = require("gen.memplan")
local verify = require("gen.verify")
local report = require("gen.parallel.pp_report")
local tables = require("gen.parallel.pp_tables")
local seq = require("gen.parallel.pp_sequence")
local step_proof = require("gen.parallel.pp_step_proof")

local M = {}

local fmt = string.format

-- What the tables cannot run yet, as the plan's own one-line refusal.

-- The communication of every global rank from the tables, against the
-- events torch issues (pp_sequence, held to torch live) and through the
-- whole-step proof. Raises a one-line error naming the first difference.
local function prove(loaded, t, classes, W, R)
  local mesh = seq.mesh(t.sched.pp, W, R)
  local got = tables.events(classes, mesh, W)
  local want = seq.expected(t.sched, { dp_shard = W, dp_replicate = R, act_numel = t.act.numel,
                                       act_dtype = t.act.dtype, stage_fsdp = t.stage_fsdp })
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
    util.field_error(loaded.ctx, "pipeline.schedule", "the whole-step proof fails on the tables: " .. tostring(why))
  end
  return counts
end

-- loaded: gen/load.lua's plan with pp > 1 -> the plan object gen/emit.lua
-- renders (p.tp_classes: one class per pipeline rank) and pp_build's
-- own report fields (p.pipeline_build).
function M.plan(loaded)
  local t = report.tables(loaded, nil, { skip_classes = true })
  local sp = t.p -- the stage mesh's plan: layouts (a TP class each), dtypes, FSDP settings
  local d = dims.infer(loaded.ctx, loaded.parallel, loaded.world_size)
  local mesh = dims.mesh(d)
  local fams = groups.build(mesh)
  local fsdp = { micro_steps = t.sched.microbatches }
  -- A class per (pipeline rank, TP class of the stage mesh): the TP
  -- class's TP-local layouts, TP's activation collectives in each unit's
  -- forward and backward (gen/parallel/tp.lua), as FSDP2 + TP run them.
  local ntp = #sp.tp_classes
  local unit_ops = sp.dims.tp > 1 and require("gen.parallel.tp").unit_ops or nil
  local classes, first_tp = {}, nil
  for c, tcls in ipairs(sp.tp_classes) do
    local by_name = {}
    for _, u in ipairs(tcls.layout.units) do by_name[u.name] = u end
    local su = {}
    for st, list in pairs(t.stage_units) do
      su[st] = {}
      for i, u in ipairs(list) do su[st][i] = by_name[u.name] end
    end
    local ranks = tables.rank_tables(sp, t.sched, su, t.act, { unit_ops = unit_ops })
    if c == 1 then first_tp = ranks end
    for r, cls in ipairs(ranks) do
      local lay = {}
      for k, v in pairs(tcls.layout) do lay[k] = v end
      lay.units = cls.units
      verify.bounds(lay, fams, cls.ops, fsdp, nil)
      verify.order(lay, fams, cls.ops)
      local arena = memplan.build(lay, cls.ops, { micro_steps = fsdp.micro_steps })
      classes[(r - 1) * ntp + c] = { layout = lay, ops = cls.ops, arena = arena, stages = cls.stages,
                                     pp_rank = r - 1, tp_class = c - 1,
                                     coords = ntp > 1 and { r - 1, table.concat(tcls.coords, "/") } or { r - 1 } }
    end
  end
  -- (TP's collectives run inside each TP rank's compute, the same on every
  -- TP rank: the proof covers the FSDP and pipeline traffic of TP class 0)
  local counts = prove(loaded, t, first_tp, sp.dims.dp_shard, sp.dims.dp_replicate)
  local p = {}
  for k, v in pairs(sp) do p[k] = v end
  p.name, p.world_size, p.source_file = loaded.name, loaded.world_size, loaded.source_file
  p.dims, p.mesh, p.groups = d, mesh, fams
  p.fsdp = { micro_steps = fsdp.micro_steps, reshard_after_forward = false, grad_accumulation = "step_end",
             reduce_op = sp.fsdp.reduce_op, param_dtype = sp.fsdp.param_dtype, reduce_dtype = sp.fsdp.reduce_dtype }
  p.tp_classes = classes
  p.class_of_tp = nil
  p.layout, p.ops, p.arena, p.rep = classes[1].layout, classes[1].ops, classes[1].arena, nil
  p.pp = { size = t.sched.pp, mesh_dim = mesh.index.pp - 1, family = fams.by_name.pp.id }
  -- [pp coordinate x tp + tp coordinate] -> class (1-based)
  p.class_of = {}
  local tp = d.tp
  for r = 0, t.sched.pp - 1 do
    for k = 0, tp - 1 do p.class_of[r * tp + k] = r * ntp + (sp.class_of_tp and sp.class_of_tp[k] or 1) end
  end
  p.pipeline_build = { sched = t.sched, act = t.act, counts = counts, loaded = loaded, stage_plan = sp }
  return p
end

return M
