-- The parallelisms, one module each, in the order gen/plan.lua applies
-- them (torchtitan's parallelize_llama: TP on the model's modules first,
-- then fully_shard wraps the TP-local tensors). gen/plan.lua runs the
-- hooks below and knows nothing else of any parallelism; the schedule's
-- consumers (memory plan, proofs, cost, audit, emit, the C executor) stay
-- generic over op kinds (gen/opkinds.lua).
--
-- The contract. A module is a table; every field but name, label and dims
-- is optional, and a plan that does not use a module (used(d) false) runs
-- none of its hooks but rules, so it costs nothing and leaves no trace in
-- the output.
--
--   name, label   "tp", "TP": its name, and how refusals name it
--   mesh_label(d, p) -> string | nil
--                 how the audit's mesh line names it (parallel.mesh_kind;
--                 omitted: label): FSDP "FSDP" / "HSDP" / "replicate" by
--                 the degrees, TP "async TP" where the plan runs it
--   dims          the ParallelDims degrees it implements ({ "tp" }); a
--                 degree without a module is an internal error
--                 (check_supported below: every one has a module)
--   groups        the process-group families its ops name (gen/groups.lua
--                 builds every family of the mesh; tests/lua/test_parallel
--                 checks each op's group is declared by a used module)
--   used(d)       whether a plan with degrees d uses it (omitted: never)
--   check_dims(ctx, d)
--                 its refusals from the degrees alone (a combination the
--                 runtime's mesh cannot hold: an ep cutting cp groups
--                 without nesting), run by
--                 check_supported below for every plan, before the mesh
--   rules(ctx, d, p)
--                 its checks of the plan's settings against the degrees
--                 and the model, after gen/dims.lua's ParallelDims ones;
--                 run for every plan: a setting that would be ignored is
--                 refused
--   inner_plan(ctx, d, p) -> plan file
--                 a module that runs each rank's share of the model on a
--                 smaller mesh names that mesh's plan (PP: the stage mesh,
--                 world / pp ranks, one microbatch); gen/plan.lua plans it
--                 as it plans any and hands it to prepare
--   prepare(ctx, d, p, inner) -> mine
--                 what its hooks share, worked out once (PP: the stage
--                 split, the schedule, the activation); its other hooks
--                 get it as `mine`
--   settings(p, mine) -> p
--                 the plan's settings as they run under it (PP: FSDP's
--                 micro-steps are the microbatches, no reshard after
--                 forward, gradients reduced after the last one)
--   apply_units(ctx, units, d, p) -> units
--                 what it does to the model's units and parameters before
--                 ranks are told apart (TP: placements)
--   families(fams, units, d, p)
--                 process-group families its units add to the mesh's
--                 (gen/groups.lua add_part) before any layout names them
--                 (FSDP: reshard_after_forward = k's post-forward groups)
--   classes(units, d, mine) -> { classes = { { coords, units | layout,
--                 facts } ... }, class_of }
--                 the ranks whose tables differ: each class's units (TP:
--                 TP-local shapes), or its layout where it was laid out on
--                 an inner mesh (PP: a pipeline rank's stages as the stage
--                 mesh's class lays them out), and facts copied onto the
--                 built class (PP: pp_rank, stages); class_of[pp x tp + tp
--                 coordinate] -> class, as the runtime's class_of is
--   buffers(ctx, units, d, p) -> layout
--                 one class's storage (FSDP)
--   on_layout(ctx, lay, units, d, p, cfg) -> layout
--                 facts it adds to a class's layout (TP: TP dims and
--                 chunks per parameter, activation collectives per unit)
--   step(lay, fams, p, opts) -> ops, rep
--                 one class's step in issue order (FSDP2's order; PP's
--                 lowered actions, which call FSDP's pieces); opts.unit_ops
--                 is every used module's unit_ops, which it calls at each
--                 unit's points; opts.class the class, opts.mine its own
--   predicts      false where the audit's timeline (gen/timeline.lua,
--                 FSDP's overlap on one rank) does not model the step it
--                 orders (PP): the memory plan then reuses bytes at once
--   unit_ops(out, u, m, at[, call])
--                 appends the ops it runs at unit u's point `at` of
--                 micro-step m (call: the forward or backward call of a
--                 unit the model calls more than once, its event of
--                 lay.calls with its part, fsdp_schedule.calls_micro): "forward" and "backward" (inside the
--                 unit's compute), "reduce" (its post-backward on a
--                 micro-step that reduces, before the gradient reduction);
--                 with explicit prefetching (ep > 1, fsdp_schedule.lua's
--                 explicit_micro) also "forward_before" / "backward_before"
--                 (before the unit's compute: EP's dispatch, the combine's
--                 gradient);
--                 every kind is an opkinds descriptor (reads, writes,
--                 stream, ring passes) with its C side in runtime/; an
--                 op inside a block's compute may name its `region`
--                 (parallel.REGIONS below), by which two modules' ops at
--                 one point are merged (CP's K/V exchange inside TP's
--                 attention)
--   prove_class(lay, ops, p, rep)   its proofs over one class's step
--   prove(classes, mine)            its proofs across classes
--   describe(plan, p, mine) -> plan its facts on the built plan (TP:
--                 async_tp; PP: p.pp for the tables, p.pipeline for the
--                 audit)
--
-- inner_plan, classes, buffers and step are each taken from the outermost
-- used module that provides them (application order): an outer module
-- takes them over and calls the inner ones' pieces, as torchtitan's
-- pipeline schedule runs fully_shard'ed stages. Nothing else knows a
-- module by name: gen/plan.lua runs these hooks in the order above.
--
-- Costs need no hook yet: gen/cost.lua prices every collective from its
-- kind's descriptor and its group's links.
local dims = require("gen.dims")

local parallel = {}

parallel.MODULES = { require("gen.parallel.pp"), require("gen.parallel.tp"), require("gen.parallel.cp"),
                     require("gen.parallel.ep"), (require("gen.parallel.fsdp")) }

-- Each module's check_dims (the combinations it does not plan), after
-- the invariant that every ParallelDims degree has a module (every one
-- does: a degree without one would be this generator's bug, not the
-- plan's). tests/titan/dims_dump.lua runs it (as gen/plan.lua's
-- check_supported) after gen/dims.lua's infer.
function parallel.check_supported(ctx, d)
  local implemented = {}
  for _, m in ipairs(parallel.MODULES) do
    for _, n in ipairs(m.dims) do implemented[n] = true end
  end
  for _, name in ipairs(dims.ORDER) do
    if d[name] > 1 and not implemented[name] then error("internal: no parallelism module implements " .. name, 0) end
  end
  for _, m in ipairs(parallel.MODULES) do
    if m.check_dims then m.check_dims(ctx, d) end
  end
end

-- The modules a plan with degrees d uses, in application order.
function parallel.used(d)
  local out = {}
  for _, m in ipairs(parallel.MODULES) do
    if m.used and m.used(d) then out[#out + 1] = m end
  end
  return out
end

-- The parallelisms a built plan p runs, as the audit's mesh line names
-- them: every used module's mesh_label (or label), innermost first
-- (FSDP over the data ranks, then EP, CP, TP, PP), joined by " + "; "one
-- rank" where none has anything to name.
function parallel.mesh_kind(p)
  local used, names = parallel.used(p.dims), {}
  for i = #used, 1, -1 do
    local m, name = used[i], used[i].label
    if m.mesh_label then name = m.mesh_label(p.dims, p) end
    if name then names[#names + 1] = name end
  end
  return #names > 0 and table.concat(names, " + ") or "one rank"
end

-- The outermost used module that provides `hook` (inner_plan, classes,
-- buffers, step): it takes the hook over from the modules inside it. nil
-- where none does and optional, else an internal error.
function parallel.first(mods, hook, optional)
  for _, m in ipairs(mods) do
    if m[hook] then return m end
  end
  if not optional then error("internal: no parallelism provides " .. hook, 0) end
  return nil
end

-- Where a collective sits inside a block's compute: modules tag the ops
-- they issue inside a unit's compute with one of these regions (in
-- forward order; backward runs them in reverse, a recomputed forward
-- first), so that two modules' ops at one point interleave as the block
-- issues them (CP's K/V all-gathers between TP's attention-input gather
-- and its wo reduce-scatter: torchtitan's attention, models/common/
-- decoder_sharding.py:225-260, redistributes k and v at the inner
-- attention's local_map boundary).
parallel.REGIONS = { "embedding", "attention_input", "attention", "attention_output", "ffn_input", "ffn_output",
                     "output", "loss" }
local RANK = {}
for i, r in ipairs(parallel.REGIONS) do RANK[r] = i end

local function region_key(o)
  if o.region == "recompute" then return -math.huge end -- the backward's re-run forward comes first
  local r = RANK[o.region] or error("internal: op region " .. tostring(o.region), 0)
  return o.phase == "backward" and -r or r
end

-- Several hooks' ops at one point: where every op names its region, the
-- hooks' lists (each in its own issue order) merged by region, ties in
-- hook order; else one after the other. The region is the merge's only:
-- cleared on the way out.
local function merge(lists)
  local all, tagged, nonempty = {}, true, 0
  for _, l in ipairs(lists) do
    if #l > 0 then nonempty = nonempty + 1 end
    for _, o in ipairs(l) do tagged = tagged and o.region ~= nil end
  end
  if nonempty > 1 and tagged then
    local at = {}
    for i = 1, #lists do at[i] = 1 end
    while true do
      local best, key
      for i, l in ipairs(lists) do
        local o = l[at[i]]
        if o and (not best or region_key(o) < key) then best, key = i, region_key(o) end
      end
      if not best then break end
      all[#all + 1] = lists[best][at[best]]
      at[best] = at[best] + 1
    end
  else
    for _, l in ipairs(lists) do
      for _, o in ipairs(l) do all[#all + 1] = o end
    end
  end
  for _, o in ipairs(all) do o.region = nil end
  return all
end

-- Every used module's unit_ops as one function; nil when none has any (the
-- schedule then inserts nothing). The modules nest around a unit's
-- compute: ahead of it ("forward_before", "backward_before") they run in
-- application order, after it ("forward", "backward", "reduce") in the
-- reverse (TP's shared-experts collectives of an experts unit after EP's
-- combine, as torchtitan's MoE runs them: gen/parallel/tp_acts.lua);
-- ops that name their region inside the block interleave by it (merge).
local BEFORE = { forward_before = true, backward_before = true }
function parallel.unit_ops(mods)
  local hooks = {}
  for _, m in ipairs(mods) do hooks[#hooks + 1] = m.unit_ops end
  if #hooks == 0 then return nil end
  return function(out, u, m, at, call)
    local lists = {}
    local first, last, step = #hooks, 1, -1
    if BEFORE[at] then first, last, step = 1, #hooks, 1 end
    for i = first, last, step do
      local l = {}
      hooks[i](l, u, m, at, call)
      lists[#lists + 1] = l
    end
    for _, o in ipairs(merge(lists)) do out[#out + 1] = o end
  end
end

return parallel
