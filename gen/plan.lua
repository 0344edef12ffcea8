-- The pipeline: plan file -> the one plan table every renderer reads. The
-- parallelisms are modules (gen/parallel/init.lua: the contract and their
-- order); this file runs their hooks and knows none of their details.
local load_plan = require("gen.load")
local dims = require("gen.dims")
local groups = require("gen.groups")
local parallel = require("gen.parallel.init")
local verify = require("gen.verify")
local cost = require("gen.cost")
local memplan = require("gen.memplan")
local compute = require("gen.compute")
local timeline = require("gen.timeline")
local whole_rank = require("gen.memory")
local repeat_mod = require("gen.repeat")
local symm = require("gen.symm")

local plan = {}

-- Each family's units(ctx, model, d) (gen/models/families.lua).
plan.MODELS = require("gen.models.families")

-- tests/titan/dims_dump.lua: the dims stage as the generator runs it.
plan.check_supported = parallel.check_supported

-- The step as planned (p.arena.waits): one of the memory plan's
-- predictions replayed where the final waits delay none of its ops
-- (timeline.replay), else predicted anew.
local function planned_step(p, s, per_unit, predictions)
  for _, tl in ipairs(predictions) do
    local replayed = timeline.replay(p, tl)
    if replayed then return replayed end
  end
  return timeline.build(p, s, per_unit)
end

local build_class
-- One class of ranks (one table set): its layout, schedule, proofs, cost
-- and memory plan. mods: the plan's parallelisms (parallel.used); mine:
-- each module's prepared facts (its prepare hook's), by module.
function build_class(ctx, cls, d, fams, p, cfg, mods, expand, face, mine)
  -- A class laid out on an inner mesh brings its layout (PP: the stage
  -- mesh's, gen/parallel/pp.lua); the others are laid out here.
  local lay = cls.layout
  if not lay then
    lay = parallel.first(mods, "buffers").buffers(ctx, cls.units, d, p)
    for _, m in ipairs(mods) do
      if m.on_layout then lay = m.on_layout(ctx, lay, cls.units, d, p, cfg) end
    end
  end
  local orderer = parallel.first(mods, "step")
  local ops, rep = orderer.step(lay, fams, p, { expand = expand, dims = d, ctx = ctx, class = cls,
                                                mine = mine[orderer], unit_ops = parallel.unit_ops(mods) })
  verify.bounds(lay, fams, ops, p.fsdp, rep)
  for _, m in ipairs(mods) do
    if m.prove_class then m.prove_class(lay, ops, p, rep) end
  end
  verify.order(lay, fams, ops)
  local predicted = cost.predict(ops, fams, p.topology, p.training)
  local out = { coords = cls.coords, layout = lay, ops = ops, rep = rep, predicted = predicted }
  for k, v in pairs(cls.facts or {}) do out[k] = v end
  -- A step the audit's timeline does not model (its orderer says so:
  -- PP's, priced by its own timed run) reuses bytes at once.
  if orderer.predicts == false then
    out.arena = memplan.build(lay, ops, { micro_steps = p.fsdp.micro_steps })
    out.memory = cost.memory(lay, ops, out.arena)
    return out
  end
  -- The memory plan places buffers for overlap where the rank's memory
  -- has room: it predicts the class's step (gen/timeline.lua, the audit's
  -- own model) with the waits it weighs, and takes the memory verdict's
  -- free bytes as its budget.
  local view = { ops = ops, rep = rep, layout = lay, dims = d, model = p.model, model_config = cfg, fsdp = p.fsdp,
                 topology = p.topology, training = p.training, arena = {} }
  local s = compute.settings(view)
  local per_unit = compute.units(view, s)
  local predictions = {}
  local arena = memplan.build(lay, ops, {
    micro_steps = p.fsdp.micro_steps,
    budget = whole_rank.arena_room(view, s, per_unit),
    predict = function(waits)
      view.arena.waits = repeat_mod.strengthen(waits, rep)
      predictions[#predictions + 1] = timeline.build(view, s, per_unit)
      return predictions[#predictions]
    end,
  })
  if rep then
    -- A repeated micro-step's rows must mean the same on every
    -- repetition (gen/repeat.lua); where they would not, the step is
    -- planned in full.
    if repeat_mod.check(arena.needs, rep) then return build_class(ctx, cls, d, fams, p, cfg, mods, true, face, mine) end
    repeat_mod.share_events(ops, arena, rep)
    -- The predicted step counts the third copy once per repetition: exact
    -- when it runs as the copy before it did, shifted by one micro-step
    -- (compute-bound steps; a comm-bound one whose queues grow is not):
    -- checked below on the planned step.
  end
  -- The step as planned (the audit's timeline: gen/figures.lua takes it
  -- while the settings it was predicted with stand).
  view.arena = arena
  local tl = (face or rep) and planned_step(view, s, per_unit, predictions)
  if rep and not repeat_mod.periodic(tl, rep) then
    return build_class(ctx, cls, d, fams, p, cfg, mods, true, face, mine)
  end
  out.arena, out.memory = arena, cost.memory(lay, ops, arena)
  out.timeline = face and { tl = tl, key = compute.settings_key(s), ops = ops, waits = arena.waits }
  return out
end

-- opts.expand: plan a repeated micro-step in full (gen/repeat.lua; the tests compare the two).
function plan.from_loaded(p, opts)
  local ctx = p.ctx
  local d = dims.infer(ctx, p.parallel, p.world_size)
  load_plan.check_nodes(ctx, p.world_size, p.topology.gpus_per_node, ctx and ctx.nodes_given)
  local units, model_numbers = plan.MODELS[p.model.family].units(ctx, p.model, d)
  dims.validate_model(ctx, d, model_numbers, p, units)
  parallel.check_supported(ctx, d)
  local mesh = dims.mesh(d)
  local fams = groups.build(mesh)
  for _, m in ipairs(parallel.MODULES) do
    if m.rules then m.rules(ctx, d, p, model_numbers) end
  end
  local mods = parallel.used(d)
  -- A module that runs each rank's share of the model on a smaller mesh
  -- names that mesh's plan (PP: the stage mesh, world / pp ranks), which
  -- this same pipeline plans; then each module prepares what its hooks
  -- share (PP: the stage split and the schedule) and says how the plan's
  -- settings run under it (PP: FSDP's micro-steps are the microbatches).
  local nester = parallel.first(mods, "inner_plan", true)
  local inner = nester and plan.from_loaded(nester.inner_plan(ctx, d, p))
  local mine = {}
  for _, m in ipairs(mods) do
    if m.prepare then mine[m] = m.prepare(ctx, d, p, inner) end
  end
  for _, m in ipairs(mods) do
    if m.settings then p = m.settings(p, mine[m]) end
  end
  -- (under an inner plan the units are placed there: its classes carry them)
  for _, m in ipairs(nester and {} or mods) do
    if m.apply_units then units = m.apply_units(ctx, units, d, p) end
  end
  -- Families a module's units add to the mesh's (FSDP's post-forward groups:
  -- gen/parallel/fsdp.lua families), before any layout names them.
  for _, m in ipairs(mods) do
    if m.families then m.families(fams, units, d, p) end
  end
  -- Without a module that tells ranks apart, every rank holds one table set.
  local splitter = parallel.first(mods, "classes", true)
  local split = splitter and splitter.classes(units, d, mine[splitter])
    or { classes = { { coords = { 0 }, units = units } }, class_of = { [0] = 1 } }
  local classes = {}
  local expand = opts and opts.expand
  for c, cls in ipairs(split.classes) do
    classes[c] = build_class(ctx, cls, d, fams, p, model_numbers.config, mods, expand, c == 1, mine)
  end
  -- Every class repeats a micro-step or none does (the tables' op
  -- sequences must agree across classes: a class planned in full beside
  -- a repeating one plans them all in full).
  local repeating = 0
  for _, cls in ipairs(classes) do repeating = repeating + (cls.rep and 1 or 0) end
  if repeating > 0 and repeating < #classes then
    for c, cls in ipairs(split.classes) do
      classes[c] = build_class(ctx, cls, d, fams, p, model_numbers.config, mods, true, c == 1, mine)
    end
  end
  for _, m in ipairs(mods) do
    if m.prove then m.prove(classes, mine[m]) end
  end
  -- Class 0 (rank 0's) is the plan's face for the audit; every class is in
  -- the tables, and class_of gives each rank's by its (pp, TP)
  -- coordinates, [pp x tp + tp] (gen/emit.lua).
  local first = classes[1]
  local out = {
    name = p.name, source_file = p.source_file, world_size = p.world_size, dims = d, mesh = mesh,
    model = p.model, model_config = model_numbers.config, fsdp = p.fsdp, topology = p.topology, training = p.training,
    layout = first.layout, groups = fams, ops = first.ops, rep = first.rep, planned_timeline = first.timeline,
    predicted = first.predicted, memory = first.memory,
    arena = first.arena, tp_classes = classes, class_of = split.class_of,
  }
  for _, m in ipairs(mods) do
    if m.describe then out = m.describe(out, p, mine[m]) end
  end
  -- fsdp.symm_mem: every communicator's ranks place the window alike (nil without one)
  out.symm = symm.prove(out)
  return out
end

function plan.from_file(path)
  return plan.from_loaded(load_plan.file(path))
end

function plan.from_source(source, path, opts)
  return plan.from_loaded(load_plan.source(source, path, opts and opts.read_beside), opts)
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
  -- The whole words, then the tail padded on its own (not a padded copy
  -- of a text of megabytes).
  local N, i = n - n % 8, 1
  local tail = n % 8 ~= 0 and s:sub(N + 1) .. string.rep("\0", 8 - n % 8)
  while i + 63 <= N do
    local a, b, c, d, e, f, g, k = unpack("<i8i8i8i8i8i8i8i8", s, i)
    h = (h ~ a) * P; h = h ~ (h >> 29)
    h = (h ~ b) * P; h = h ~ (h >> 29)
    h = (h ~ c) * P; h = h ~ (h >> 29)
    h = (h ~ d) * P; h = h ~ (h >> 29)
    h = (h ~ e) * P; h = h ~ (h >> 29)
    h = (h ~ f) * P; h = h ~ (h >> 29)
    h = (h ~ g) * P; h = h ~ (h >> 29)
    h = (h ~ k) * P; h = h ~ (h >> 29)
    i = i + 64
  end
  while i <= N do
    h = (h ~ unpack("<i8", s, i)) * P; h = h ~ (h >> 29)
    i = i + 8
  end
  if tail then h = (h ~ unpack("<i8", tail)) * P; h = h ~ (h >> 29) end
  h = (h ~ n) * P
  return string.format("%016x", h ~ (h >> 32))
end

return plan
