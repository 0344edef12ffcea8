-- The pipeline: plan file -> the one plan table every renderer reads.
local load_plan = require("gen.load")
local dims = require("gen.dims")
local layout = require("gen.layout")
local groups = require("gen.groups")
local schedule = require("gen.schedule")
local verify = require("gen.verify")
local cost = require("gen.cost")
local memplan = require("gen.memplan")
local tp = require("gen.tp")
local tp_acts = require("gen.tp_acts")
local util = require("gen.util")
local compute = require("gen.compute")
local timeline = require("gen.timeline")
local whole_rank = require("gen.memory")

local plan = {}

plan.MODELS = { llama = require("gen.models.llama"), generic = require("gen.models.generic") }

-- FSDP, HSDP and TP: CP/EP placements are not generated yet.
local function check_supported(ctx, d)
  for _, name in ipairs({ "cp", "ep" }) do
    if d[name] > 1 then
      util.field_error(ctx, "parallel." .. name, string.format(
        "%s=%d: commplan generates FSDP/HSDP/TP plans (dp_shard, dp_replicate, tp) only so far; set %s=1",
        name, d[name], name))
    end
  end
end
plan.check_supported = check_supported -- tests/titan/dims_dump.lua: the dims stage as the generator runs it

-- The TP facts of each TP-local parameter, carried onto its layout entry.
local function attach_tp(lay, local_units)
  local by_name = {}
  for _, u in ipairs(local_units) do
    for _, q in ipairs(u.params) do by_name[q.name] = q end
  end
  for _, u in ipairs(lay.units) do
    for _, q in ipairs(u.params) do
      local src = by_name[q.name]
      q.tp = src.tp
      q.tp_dim, q.tp_chunk, q.full_shape = src.tp_dim, src.tp_chunk, src.full_shape
      q.full_numel = util.product(src.full_shape)
    end
  end
end

-- One TP class: layout, schedule, proofs, cost and memory plan of its
-- TP-local shapes (the whole plan without TP).
local function build_class(ctx, cls, d, fams, p, cfg)
  local lay = layout.build(ctx, cls.units, d, p.fsdp)
  attach_tp(lay, cls.units)
  if p.model.family == "llama" then
    tp_acts.llama(ctx, lay, cfg, d.tp, { batch = p.training and p.training.local_batch_size,
                                        seq_len = p.model.seq_len,
                                        sequence_parallel = p.parallel.sequence_parallel,
                                        loss_parallel = p.parallel.loss_parallel })
  end
  local ops = schedule.build(lay, fams, p.fsdp)
  verify.all(lay, fams, ops, p.fsdp)
  local predicted = cost.predict(ops, fams, p.topology)
  -- The memory plan places buffers for overlap where the rank's memory
  -- has room: it predicts the class's step (gen/timeline.lua, the audit's
  -- own model) with the waits it weighs, and takes the memory verdict's
  -- free bytes as its budget.
  local view = { ops = ops, layout = lay, dims = d, model = p.model, model_config = cfg, fsdp = p.fsdp,
                 topology = p.topology, training = p.training, arena = {} }
  local s = compute.settings(view)
  local per_unit = compute.units(view, s)
  local arena = memplan.build(lay, ops, {
    budget = whole_rank.arena_room(view, s, per_unit),
    predict = function(waits)
      view.arena.waits = waits
      return timeline.build(view, s, per_unit)
    end,
  })
  local memory = cost.memory(lay, ops, arena)
  return { coords = cls.coords, layout = lay, ops = ops, predicted = predicted, arena = arena, memory = memory }
end

function plan.from_loaded(p)
  local ctx = p.ctx
  local d = dims.infer(ctx, p.parallel, p.world_size)
  load_plan.check_nodes(ctx, p.world_size, p.topology.gpus_per_node, ctx and ctx.nodes_given)
  local units, model_numbers = plan.MODELS[p.model.family].units(ctx, p.model)
  dims.validate_model(ctx, d, model_numbers)
  check_supported(ctx, d)
  local mesh = dims.mesh(d)
  local fams = groups.build(mesh)
  if p.parallel.sequence_parallel ~= nil and (d.tp == 1 or p.model.family ~= "llama") then
    util.field_error(ctx, "parallel.sequence_parallel", d.tp == 1
      and "tp=1: there is no TP group to shard the sequence over; remove sequence_parallel or set tp"
      or "a generic model declares no activations (only the llama family's TP collectives are modelled); remove it")
  end
  if p.parallel.loss_parallel ~= nil and (d.tp == 1 or p.model.family ~= "llama") then
    util.field_error(ctx, "parallel.loss_parallel", d.tp == 1
      and "tp=1: there is no TP group to shard the logits over; remove loss_parallel or set tp"
      or "a generic model declares no loss (only the llama family's TP collectives are modelled); remove it")
  end
  if p.model.family == "llama" then tp.llama_placements(units) end
  if d.tp > 1 then
    local split = 0
    for _, u in ipairs(units) do
      for _, q in ipairs(u.params) do if tp.dim_of(q.tp) then split = split + 1 end end
    end
    if split == 0 then
      util.field_error(ctx, "parallel.tp", string.format("tp=%d but no parameter has a TP placement, so every "
        .. "parameter would be replicated over TP and the TP group would do nothing: give parameters "
        .. "tp = \"colwise\" | \"rowwise\" | \"shard(k)\", or set tp=1", d.tp))
    end
  end
  local split = tp.classes(units, d.tp)
  local classes = {}
  for c, cls in ipairs(split.classes) do classes[c] = build_class(ctx, cls, d, fams, p, model_numbers.config) end
  tp.check_same_tp_sequence(classes)
  -- Class 0 (TP rank 0's) is the plan's face for the audit; every class is in the tables.
  local first = classes[1]
  return {
    name = p.name, source_file = p.source_file, world_size = p.world_size, dims = d, mesh = mesh,
    model = p.model, model_config = model_numbers.config, fsdp = p.fsdp, topology = p.topology, training = p.training,
    layout = first.layout, groups = fams, ops = first.ops, predicted = first.predicted, memory = first.memory,
    arena = first.arena, tp_classes = classes, class_of_tp = split.class_of,
  }
end

function plan.from_file(path)
  return plan.from_loaded(load_plan.file(path))
end

function plan.from_source(source, path)
  return plan.from_loaded(load_plan.source(source, path))
end

-- FNV-1a 64-bit over a string, as 16 hex digits.
-- Sixteen bytes per string.byte call (the loop's cost is the calls, not
-- the arithmetic: a fingerprint covers every op of the step).
function plan.fnv1a64(s)
  local h, P = 0xcbf29ce484222325, 0x100000001b3
  local byte, n = string.byte, #s
  local i = 1
  while i + 15 <= n do
    local a, b, c, d, e, f, g, k, a2, b2, c2, d2, e2, f2, g2, k2 = byte(s, i, i + 15)
    h = (h ~ a) * P; h = (h ~ b) * P; h = (h ~ c) * P; h = (h ~ d) * P
    h = (h ~ e) * P; h = (h ~ f) * P; h = (h ~ g) * P; h = (h ~ k) * P
    h = (h ~ a2) * P; h = (h ~ b2) * P; h = (h ~ c2) * P; h = (h ~ d2) * P
    h = (h ~ e2) * P; h = (h ~ f2) * P; h = (h ~ g2) * P; h = (h ~ k2) * P
    i = i + 16
  end
  for j = i, n do h = (h ~ byte(s, j)) * P end
  return string.format("%016x", h)
end

return plan
