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
--   dims          the ParallelDims degrees it implements ({ "tp" }); a
--                 degree > 1 that no module implements is refused
--                 (check_supported below)
--   groups        the process-group families its ops name (gen/groups.lua
--                 builds every family of the mesh; tests/lua/test_parallel
--                 checks each op's group is declared by a used module)
--   used(d)       whether a plan with degrees d uses it (omitted: never)
--   check_dims(ctx, d)
--                 its refusals from the degrees alone (a combination it
--                 does not plan: cp beside tp, pp or ep), run by
--                 check_supported below for every plan, before the mesh
--   rules(ctx, d, p)
--                 its checks of the plan's settings against the degrees
--                 and the model, after gen/dims.lua's ParallelDims ones;
--                 run for every plan: a setting that would be ignored is
--                 refused
--   apply_units(ctx, units, d, p) -> units
--                 what it does to the model's units and parameters before
--                 ranks are told apart (TP: placements)
--   classes(units, d) -> { classes = { { coords, units } ... }, class_of }
--                 the ranks whose tables differ and each class's units
--                 (TP: TP-local shapes; keyed by the TP coordinate, as the
--                 runtime's class_of_tp is); at most one module splits
--   buffers(ctx, units, d, p) -> layout
--                 one class's storage: exactly one used module owns it (FSDP)
--   on_layout(ctx, lay, units, d, p, cfg) -> layout
--                 facts it adds to a class's layout (TP: TP dims and
--                 chunks per parameter, activation collectives per unit)
--   step(lay, fams, p, opts) -> ops, rep
--                 one class's step in issue order: exactly one used module
--                 orders it (FSDP2's order); opts.unit_ops is every other
--                 module's unit_ops, which it calls at each unit's
--                 points
--   unit_ops(out, u, m, at)
--                 appends the ops it runs at unit u's point `at` of
--                 micro-step m: "forward" and "backward" (inside the
--                 unit's compute), "reduce" (its post-backward on a
--                 micro-step that reduces, before the gradient reduction);
--                 with explicit prefetching (ep > 1, fsdp_schedule.lua's
--                 explicit_micro) also "forward_before" / "backward_before"
--                 (before the unit's compute: EP's dispatch, the combine's
--                 gradient);
--                 every kind is an opkinds descriptor (reads, writes,
--                 stream, ring passes) with its C side in runtime/
--   prove_class(lay, ops, p, rep)   its proofs over one class's step
--   prove(classes)                  its proofs across classes
--
-- Costs need no hook yet: gen/cost.lua and gen/timeline.lua price every op
-- from its kind's descriptor and its group's links. How the next ones plug
-- in (docs/parallelisms.md): PP's apply_units splits the units into stages
-- and its classes are stages (crossed with TP's), it orders the step (its
-- per-rank action lists, gen/parallel/pp_schedule.lua) and calls FSDP's
-- unshard / reshard / reduce pieces at its UNSHARD, RESHARD and
-- REDUCE_GRAD actions, and inserts send/recv ops; EP and CP add placements
-- and unit_ops (all-to-alls, ring or all-gather attention) the same way.
local dims = require("gen.dims")
local util = require("gen.util")

local parallel = {}

parallel.MODULES = { require("gen.parallel.pp"), require("gen.parallel.tp"), require("gen.parallel.cp"),
                     require("gen.parallel.ep"), (require("gen.parallel.fsdp")) }

-- The degrees no module implements, in the order refusals have always
-- named them (each has a module now: gen/parallel/cp.lua, ep.lua, pp.lua;
-- the combinations a module does not plan are refused by its rules).
local UNIMPLEMENTED_ORDER = { "cp", "ep", "pp" }

-- What commplan generates, in mesh order: "FSDP/HSDP/TP plans (dp_shard,
-- dp_replicate, tp)".
local function generated_text()
  local pos = {}
  for i, n in ipairs(dims.ORDER) do pos[n] = i end
  pos.ep = #dims.ORDER + 1 -- (ep is no dim of the dense mesh: it borrows dp_shard's ranks)
  local mods = {}
  -- (a module that plans but does not generate yet is not named: PP)
  for _, m in ipairs(parallel.MODULES) do
    if not m.plans_only then mods[#mods + 1] = m end
  end
  table.sort(mods, function(a, b) return pos[a.dims[1]] < pos[b.dims[1]] end)
  local labels, names = {}, {}
  for _, m in ipairs(mods) do
    labels[#labels + 1] = m.label
    for _, n in ipairs(m.dims) do names[#names + 1] = n end
  end
  return string.format("%s plans (%s)", table.concat(labels, "/"), table.concat(names, ", "))
end

-- Refuses a degree > 1 that no module implements, then each module's
-- check_dims (the combinations it does not plan). tests/titan/dims_dump.lua
-- runs it (as gen/plan.lua.check_supported) after gen/dims.lua's infer.
function parallel.check_supported(ctx, d)
  local implemented = {}
  for _, m in ipairs(parallel.MODULES) do
    for _, n in ipairs(m.dims) do implemented[n] = true end
  end
  for _, name in ipairs(UNIMPLEMENTED_ORDER) do
    if not implemented[name] and d[name] > 1 then
      util.field_error(ctx, "parallel." .. name, string.format(
        "%s=%d: commplan generates %s only so far; set %s=1", name, d[name], generated_text(), name))
    end
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

-- The one used module that provides `hook` (buffers, step), or nil for classes.
function parallel.one(mods, hook, optional)
  local found
  for _, m in ipairs(mods) do
    if m[hook] then
      if found then error(string.format("internal: %s and %s both provide %s", found.name, m.name, hook), 0) end
      found = m
    end
  end
  if not found and not optional then error("internal: no parallelism provides " .. hook, 0) end
  return found
end

-- Every used module's unit_ops as one function; nil when none has any (the
-- schedule then inserts nothing). The modules nest around a unit's
-- compute: ahead of it ("forward_before", "backward_before") they run in
-- application order, after it ("forward", "backward", "reduce") in the
-- reverse (TP's shared-experts collectives of an experts unit after EP's
-- combine, as torchtitan's MoE runs them: gen/parallel/tp_acts.lua).
local BEFORE = { forward_before = true, backward_before = true }
function parallel.unit_ops(mods)
  local hooks = {}
  for _, m in ipairs(mods) do hooks[#hooks + 1] = m.unit_ops end
  if #hooks <= 1 then return hooks[1] end
  return function(out, u, m, at)
    if BEFORE[at] then
      for i = 1, #hooks do hooks[i](out, u, m, at) end
    else
      for i = #hooks, 1, -1 do hooks[i](out, u, m, at) end
    end
  end
end

return parallel
