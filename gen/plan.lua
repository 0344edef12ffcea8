-- The pipeline: plan file -> the one plan table every renderer reads.
local load_plan = require("gen.load")
local dims = require("gen.dims")
local layout = require("gen.layout")
local groups = require("gen.groups")
local schedule = require("gen.schedule")
local verify = require("gen.verify")
local cost = require("gen.cost")
local memplan = require("gen.memplan")
local tp = require("gen.parallel.tp")
local tp_acts = require("gen.parallel.tp_acts")
local util = require("gen.util")
local compute = require("gen.compute")
local timeline = require("gen.timeline")
local whole_rank = require("gen.memory")
local repeat_mod = require("gen.repeat")

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

local build_class
-- One TP class: layout, schedule, proofs, cost and memory plan of its
-- TP-local shapes (the whole plan without TP).
function build_class(ctx, cls, d, fams, p, cfg, expand)
  local lay = layout.build(ctx, cls.units, d, p.fsdp)
  attach_tp(lay, cls.units)
  if p.model.family == "llama" then
    tp_acts.llama(ctx, lay, cfg, d.tp, { batch = p.training and p.training.local_batch_size,
                                        seq_len = p.model.seq_len,
                                        sequence_parallel = p.parallel.sequence_parallel,
                                        loss_parallel = p.parallel.loss_parallel })
  end
  local ops, rep = schedule.build(lay, fams, p.fsdp, { expand = expand })
  verify.all(lay, fams, ops, p.fsdp, rep)
  local predicted = cost.predict(ops, fams, p.topology)
  -- The memory plan places buffers for overlap where the rank's memory
  -- has room: it predicts the class's step (gen/timeline.lua, the audit's
  -- own model) with the waits it weighs, and takes the memory verdict's
  -- free bytes as its budget.
  local view = { ops = ops, rep = rep, layout = lay, dims = d, model = p.model, model_config = cfg, fsdp = p.fsdp,
                 topology = p.topology, training = p.training, arena = {} }
  local s = compute.settings(view)
  local per_unit = compute.units(view, s)
  local arena = memplan.build(lay, ops, {
    budget = whole_rank.arena_room(view, s, per_unit),
    predict = function(waits)
      view.arena.waits = repeat_mod.strengthen(waits, rep)
      return timeline.build(view, s, per_unit)
    end,
  })
  if rep then
    -- A repeated micro-step's rows must mean the same on every
    -- repetition (gen/repeat.lua); where they would not, the step is
    -- planned in full.
    if repeat_mod.check(arena.needs, rep) then return build_class(ctx, cls, d, fams, p, cfg, true) end
    repeat_mod.share_events(ops, arena, rep)
    -- The predicted step counts the third copy once per repetition: exact
    -- when it runs as the copy before it did, shifted by one micro-step
    -- (compute-bound steps; a comm-bound one whose queues grow is not).
    view.arena = arena
    if not repeat_mod.periodic(timeline.build(view, s, per_unit), rep) then
      return build_class(ctx, cls, d, fams, p, cfg, true)
    end
  end
  local memory = cost.memory(lay, ops, arena)
  return { coords = cls.coords, layout = lay, ops = ops, rep = rep, predicted = predicted, arena = arena,
           memory = memory }
end

-- opts.expand: plan a repeated micro-step in full (gen/repeat.lua; the tests compare the two).
function plan.from_loaded(p, opts)
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
  for c, cls in ipairs(split.classes) do classes[c] = build_class(ctx, cls, d, fams, p, model_numbers.config, opts and opts.expand) end
  tp.check_same_tp_sequence(classes)
  -- Class 0 (TP rank 0's) is the plan's face for the audit; every class is in the tables.
  local first = classes[1]
  return {
    name = p.name, source_file = p.source_file, world_size = p.world_size, dims = d, mesh = mesh,
    model = p.model, model_config = model_numbers.config, fsdp = p.fsdp, topology = p.topology, training = p.training,
    layout = first.layout, groups = fams, ops = first.ops, rep = first.rep, predicted = first.predicted, memory = first.memory,
    arena = first.arena, tp_classes = classes, class_of_tp = split.class_of,
  }
end

function plan.from_file(path)
  return plan.from_loaded(load_plan.file(path))
end

function plan.from_source(source, path, opts)
  return plan.from_loaded(load_plan.source(source, path), opts)
end

-- A 64-bit hash of a string, as 16 hex digits: FNV-1a's offset basis and
-- prime over the string's 8-byte little-endian words (the tail padded with
-- zero bytes, the length mixed in last), each multiply followed by an
-- xor-shift so that every bit of a word reaches every bit of the hash.
-- Words, not bytes: a fingerprint covers every op of the step, and the
-- loop's cost is its iterations.
function plan.hash64(s)
  local h, P = 0xcbf29ce484222325, 0x100000001b3
  local unpack, n = string.unpack, #s
  if n % 8 ~= 0 then s = s .. string.rep("\0", 8 - n % 8) end
  local N, i = #s, 1
  while i + 31 <= N do
    local a, b, c, d = unpack("<i8i8i8i8", s, i)
    h = (h ~ a) * P; h = h ~ (h >> 29)
    h = (h ~ b) * P; h = h ~ (h >> 29)
    h = (h ~ c) * P; h = h ~ (h >> 29)
    h = (h ~ d) * P; h = h ~ (h >> 29)
    i = i + 32
  end
  while i <= N do
    h = (h ~ unpack("<i8", s, i)) * P; h = h ~ (h >> 29)
    i = i + 8
  end
  h = (h ~ n) * P
  return string.format("%016x", h ~ (h >> 32))
end

return plan
