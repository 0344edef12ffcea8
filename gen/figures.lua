-- The step's figures, in one place: every number SCHEDULE.md, plan.json's
-- audit section, trace.json, `make diff-plan` and `make advise` show about
-- a plan's predicted step is computed here, once, and rounded here (to the
-- nanosecond, as plan.json stores it); those outputs only format it.
--
--   step_us        the predicted step (gen/timeline.lua)
--                  = compute_us + exposed_us + waits_us
--   compute_us     the compute stream's busy time without TP collectives
--                  (and without full checkpointing's rerun of them)
--   exposed_us     the part of the step the compute stream waits for
--                  collectives (TP's on the compute stream included):
--                  the sum of the families' exposed_us
--   waits_us       the rest of its waiting: copies on other streams
--   comm_us        the collectives' time in the predicted step, links
--                  shared (trace.json's durations), the recompute's
--                  collectives included: the sum of the families' us
--   alone_us       the same collectives each alone at its link's full
--                  bandwidth (gen/cost.lua), summed
--   families[]     per group family with collectives (p.groups order):
--                  name, intra, ops (the tables'), recomputed_ops,
--                  size_bytes, wire_bytes (recompute included), alone_us,
--                  us, exposed_us; exposed_us <= us by construction: a
--                  collective is exposed only for the part of its own run
--                  the compute stream waits through
--   links          intra, inter: ops (recompute included), size_bytes,
--                  wire_bytes, alone_us, us
--   throughput     tokens_per_s_per_gpu, model_flops_per_token, mfu:
--                  torchtitan's tps and MFU for the predicted step
--   memory         gen/memory.lua's whole-rank verdict
--   memory_plan    the arena's trade (gen/memplan.lua): policy, arena_bytes,
--                  budget_bytes (the room the verdict leaves it),
--                  reuse_bytes and hold_bytes (the arena reusing bytes at
--                  once, holding them for overlap), held_lives; reuse_step_us
--                  and reuse_wait_us (reusing at once: the step and the
--                  compute stream's waits for it), free_step_us (the step
--                  with no arena waits), as the plan was built;
--                  waits[] (op, waits_for, stream, cost_us): the waits
--                  for reused bytes that delay an op in this step, and
--                  wait_us, their cost on the compute stream
-- Keys and inputs: compute.settings, compute.units, timeline.build.
local compute = require("gen.compute")
local timeline = require("gen.timeline")
local memory = require("gen.memory")
local memplan = require("gen.memplan")
local cost = require("gen.cost")
local util = require("gen.util")

local figures = {}

-- A figure as every output holds it: microseconds to the nanosecond (nil
-- stays nil: a figure a plan does not have). Every input is range-checked
-- where it enters (gen/hardware.lua's BOUNDS, the size limits), so a
-- figure that is not a finite number is this generator's bug: said so.
function figures.round(x)
  if x == nil then return nil end
  if type(x) ~= "number" or x ~= x or x == math.huge or x == -math.huge then
    error(string.format("internal error: gen/figures.lua: a figure is %s, not a finite number (an input escaped "
      .. "its range check)", tostring(x)), 0)
  end
  return tonumber(string.format("%.3f", x))
end
local r3 = figures.round

-- p: the plan (its training settings as they stand) -> the figures, with
-- the inputs they came from (settings, per_unit, timeline, recompute,
-- memory, step_flops) for the texts that need more than the numbers.
function figures.of(p, opts)
  local pf = p.pipeline
  if pf then return figures.pipeline(p, pf) end
  local s = compute.settings(p)
  local per_unit = compute.units(p, s)
  -- The timeline the plan was built with, where nothing it depends on has
  -- changed since (the advisor and the tests change settings).
  local planned = p.planned_timeline
  local tl
  if planned and not opts and planned.ops == p.ops and planned.waits == p.arena.waits
      and planned.key == compute.settings_key(s) then
    tl = planned.tl
  else
    tl = timeline.build(p, s, per_unit, opts)
  end
  local mem = memory.whole_rank(p, s, per_unit)
  local rec = timeline.recompute_per_family(p, s)
  local rows, by_name = {}, {}
  for _, f in ipairs(p.groups.list) do
    local a = p.predicted.per_family[f.name]
    if a then
      local r = rec[f.name] or { ops = 0, size_bytes = 0, wire_bytes = 0, us = 0 }
      local row = { name = f.name, intra = p.predicted.intra[f.name] and true or false, ops = a.ops,
                    recomputed_ops = r.ops, size_bytes = a.size_bytes + r.size_bytes,
                    wire_bytes = a.wire_bytes + r.wire_bytes, alone_us = a.us + r.us, us = r.us, exposed_us = 0 }
      rows[#rows + 1] = row
      by_name[f.name] = row
    end
  end
  for _, o in ipairs(p.ops) do
    local row = o.group and by_name[o.group]
    if row then
      row.us = row.us + tl.ops[o.seq].dur * (o.times or 1)
      row.exposed_us = row.exposed_us + (tl.exposed_by[o.seq] or 0) + (tl.recompute_by[o.seq] or 0)
    end
  end
  local links = { intra = { ops = 0, size_bytes = 0, wire_bytes = 0, alone_us = 0, us = 0 },
                  inter = { ops = 0, size_bytes = 0, wire_bytes = 0, alone_us = 0, us = 0 } }
  local comm, alone, exposed = 0, 0, 0
  for _, row in ipairs(rows) do
    local c = links[row.intra and "intra" or "inter"]
    c.ops = c.ops + row.ops + row.recomputed_ops
    c.size_bytes = c.size_bytes + row.size_bytes
    c.wire_bytes = c.wire_bytes + row.wire_bytes
    c.alone_us = c.alone_us + row.alone_us
    c.us = c.us + row.us
    comm, alone, exposed = comm + row.us, alone + row.alone_us, exposed + row.exposed_us
  end
  -- Round once: what every output prints.
  for _, row in ipairs(rows) do
    row.alone_us, row.us, row.exposed_us = r3(row.alone_us), r3(row.us), r3(row.exposed_us)
  end
  for _, c in pairs(links) do c.alone_us, c.us = r3(c.alone_us), r3(c.us) end
  local step, busy = r3(tl.step_us), r3(tl.compute_busy_us)
  exposed = r3(exposed)
  local ar = p.arena
  local waits, wait_us = memplan.costly_waits(p.ops, ar.waits, ar.data_needs, tl.ops)
  for _, x in ipairs(waits) do x.cost_us = r3(x.cost_us) end
  local mp = { policy = ar.policy, arena_bytes = ar.arena_bytes, budget_bytes = ar.budget_bytes,
               reuse_bytes = ar.reuse_bytes, hold_bytes = ar.hold_bytes, held_lives = ar.held_lives,
               fell_back = ar.fell_back, reuse_step_us = r3(ar.reuse_step_us), reuse_waits = ar.reuse_waits,
               reuse_wait_us = r3(ar.reuse_wait_us), free_step_us = r3(ar.free_step_us), waits = waits,
               wait_us = r3(wait_us) }
  -- Throughput as torchtitan's metrics report it (components/metrics.py):
  -- tokens per second per GPU = a data-parallel rank's tokens per step /
  -- (step x the ranks that share them: tp); MFU = model FLOPs per token x
  -- that / the GPU's peak (gen/compute.lua's model_flops_per_token).
  local tokens_step = s.tokens * (p.fsdp and p.fsdp.micro_steps or 1)
  local shared = p.dims and p.dims.tp or 1
  local tps = step > 0 and tokens_step / (step / 1e6 * shared) or nil
  local fpt = compute.model_flops_per_token(p, s)
  local throughput = { tokens_per_s_per_gpu = tps and tonumber(string.format("%.1f", tps)),
                       model_flops_per_token = fpt,
                       mfu = (tps and fpt) and tonumber(string.format("%.4f", fpt * tps / (s.gpu_TFLOPS * 1e12))) or nil }
  return {
    settings = s, per_unit = per_unit, timeline = tl, recompute = rec, memory = mem, memory_plan = mp,
    throughput = throughput,
    step_flops = compute.step_flops(p, per_unit),
    step_us = step, compute_us = busy, exposed_us = exposed,
    waits_us = r3(tl.exposed_by[-1] or 0),
    comm_us = r3(comm), alone_us = r3(alone), families = rows, by_family = by_name, links = links,
  }
end

-- ---- a pipeline plan's figures ----
--
-- A pipeline plan's step is its schedule's timed run (gen/parallel/pp_audit.lua
-- through p.pipeline (gen/parallel/pp.lua's describe): each pipeline rank's actions on one compute stream,
-- FSDP's all-gathers taken as prefetched). The same keys as a dense plan's
-- where they mean the same, for the rank whose clock ends last (the
-- critical rank: its run is the step):
--   step_us     = compute_us + exposed_us + waits_us
--   compute_us  its F, B, I and W (TP's collectives run inside them)
--   exposed_us  what communication leaves on its path: each wait for an
--               activation or gradient while it is on the wire (at most
--               the transfer's time of a gap before a compute that takes a
--               received input) plus the final gradient reduction's wait
--   waits_us    the rest of its idling: the pipeline's fill and drain,
--               waiting for another stage's compute
-- and pipeline = { facts (p.pipeline), bubble (1 - busy / (pp x
-- step), every rank), critical_rank, p2p_exposed_us, reduce_wait_us,
-- per_rank[] (busy_us, end_us, p2p_exposed_us, reduce_wait_us, arena_bytes)
-- }; memory is the rank with the most bytes at its peak (mem_rank), split
-- as gen/memory.lua splits a rank's; families are pipeline rank 0's
-- collectives each alone (gen/cost.lua: the timed run does not place them).

-- Per pipeline rank (1-based) from the timed run's actions: compute busy
-- time, the end of its clock, its waits for messages on the wire and for
-- its last gradient reduction.
local RECEIVES = { F = "forward", B = "backward", I = "backward" }
local function rank_times(pf)
  local sched, p2p = pf.sched, pf.row.p2p_us or 0
  local ranks = {}
  for r = 1, sched.pp do
    ranks[r] = { busy_us = 0, compute_end = 0, reduce_end = 0, p2p_exposed_us = 0 }
  end
  for _, e in ipairs(pf.record) do
    local t = ranks[e.rank + 1]
    if e.type == "REDUCE_GRAD" then
      t.reduce_end = math.max(t.reduce_end, e.finish)
    else
      -- (a rank runs its actions in order: the record's are in start order per rank)
      local gap = e.start - t.compute_end
      local received = (RECEIVES[e.type] == "forward" and e.stage > 0)
        or (RECEIVES[e.type] == "backward" and e.stage < sched.num_stages - 1)
      if gap > 0 and received then t.p2p_exposed_us = t.p2p_exposed_us + math.min(gap, p2p) end
      t.busy_us = t.busy_us + (e.finish - e.start)
      t.compute_end = e.finish
    end
  end
  for _, t in ipairs(ranks) do
    t.end_us = math.max(t.compute_end, t.reduce_end)
    t.reduce_wait_us = t.end_us - t.compute_end
  end
  return ranks
end

-- The worst rank's memory (pp_report's row: mem at mem_rank) in
-- gen/memory.lua's parts: its stages' sharded parameters, gradients and
-- optimizer state, the unsharded parameters and gradients its arena holds
-- all step (no reshard after forward under PP), the rest activations.
local function pipeline_memory(p, pf, s)
  local row, ES = pf.row, util.DTYPE_BYTES
  local cls = p.tp_classes[p.class_of[row.mem_rank * p.dims.tp]]
  local W = cls.layout.W
  local params, grads, optimizer, comm = 0, 0, 0, 0
  for _, u in ipairs(cls.layout.units) do
    -- (as gen/memory.lua counts them: gradients and optimizer state for the trainable shards,
    -- u.rs_total; CPU offload: an offloading unit's sharded state is in host memory)
    if not u.offload then
      local up, uo = memory.unit_state(u, s, u.total, u.rs_total)
      params, optimizer = params + up, optimizer + uo
      grads = grads + u.rs_total * ES[u.orig_dtype]
    end
    comm = comm + W * u.total * ES[u.ag_dtype] + u.grads_numel * ES[u.reduce_dtype]
  end
  local saved = row.sim.rank_peak_bytes[row.mem_rank + 1]
  local act = row.mem - params - grads - optimizer - comm
  return { params_bytes = params, grads_bytes = grads, optimizer_bytes = optimizer, comm_bytes = comm,
           activation_bytes = act, activation_saved_bytes = saved, activation_transient_bytes = act - saved,
           activations_modeled = true, total_bytes = row.mem, gpu_bytes = s.gpu_memory_bytes, fits = row.fits,
           rank = row.mem_rank }
end

-- Pipeline rank 0's collectives per family, each alone (the face the
-- tables' top-level ops show).
local function pipeline_families(p)
  local predicted = cost.predict(p.ops, p.groups, p.topology, p.training)
  local rows, by_name = {}, {}
  local links = { intra = { ops = 0, size_bytes = 0, wire_bytes = 0, alone_us = 0, us = 0 },
                  inter = { ops = 0, size_bytes = 0, wire_bytes = 0, alone_us = 0, us = 0 } }
  for _, f in ipairs(p.groups.list) do
    local a = predicted.per_family[f.name]
    if a then
      local row = { name = f.name, intra = predicted.intra[f.name] and true or false, ops = a.ops, recomputed_ops = 0,
                    size_bytes = a.size_bytes, wire_bytes = a.wire_bytes, alone_us = r3(a.us), us = r3(a.us),
                    exposed_us = 0 }
      rows[#rows + 1], by_name[f.name] = row, row
      local c = links[row.intra and "intra" or "inter"]
      c.ops, c.size_bytes, c.wire_bytes = c.ops + row.ops, c.size_bytes + row.size_bytes, c.wire_bytes + row.wire_bytes
      c.alone_us, c.us = c.alone_us + a.us, c.us + a.us
    end
  end
  for _, c in pairs(links) do c.alone_us, c.us = r3(c.alone_us), r3(c.us) end
  return rows, by_name, links, predicted
end

-- p: a pipeline plan; pf: p.pipeline -> the figures (keys as
-- figures.of's; step figures nil where the timed run refuses the plan).
function figures.pipeline(p, pf)
  local sp, row, sched = pf.stage_plan, pf.row, pf.sched
  local s = compute.settings(sp) -- (one microbatch's: the stage plan's local batch)
  local rows, by_name, links, predicted = pipeline_families(p)
  local arenas = {}
  for _, c in ipairs(p.tp_classes) do
    if not arenas[c.pp_rank + 1] or c.arena.arena_bytes > arenas[c.pp_rank + 1] then
      arenas[c.pp_rank + 1] = c.arena.arena_bytes
    end
  end
  local ar = p.arena
  local out = {
    settings = s, families = rows, by_family = by_name, links = links, recompute = {}, predicted = predicted,
    memory_plan = { policy = ar.policy, arena_bytes = ar.arena_bytes, reuse_bytes = ar.reuse_bytes,
                    held_lives = ar.held_lives, fell_back = ar.fell_back, budget_bytes = ar.budget_bytes,
                    waits = {}, wait_us = 0 },
    face_memory = cost.memory(p.layout, p.ops, p.arena),
    step_flops = compute.step_flops(sp, compute.units(sp, s)) * sched.microbatches // sched.pp,
    throughput = {},
    pipeline = { facts = pf, arena_bytes = arenas },
  }
  if row.refused or not (row.sim and row.sim.step_us > 0) then
    out.pipeline.refused = row.refused or "the timed run predicts no step"
    return out
  end
  local ranks = rank_times(pf)
  local crit = 1
  for r, t in ipairs(ranks) do
    if t.end_us > ranks[crit].end_us then crit = r end
  end
  local c = ranks[crit]
  local step = r3(row.sim.step_us)
  out.step_us, out.compute_us = step, r3(c.busy_us)
  out.exposed_us = r3(c.p2p_exposed_us + c.reduce_wait_us)
  out.waits_us = r3(math.max(0, step - out.compute_us - out.exposed_us))
  out.comm_us, out.alone_us = links.intra.us + links.inter.us, links.intra.alone_us + links.inter.alone_us
  for r, t in ipairs(ranks) do
    t.busy_us, t.end_us, t.p2p_exposed_us, t.reduce_wait_us =
      r3(t.busy_us), r3(t.end_us), r3(t.p2p_exposed_us), r3(t.reduce_wait_us)
    t.arena_bytes = arenas[r]
  end
  local pl = out.pipeline
  pl.bubble, pl.critical_rank, pl.per_rank = r3(row.sim.bubble), crit - 1, ranks
  pl.p2p_exposed_us, pl.reduce_wait_us = c.p2p_exposed_us, c.reduce_wait_us
  out.memory = pipeline_memory(p, pf, s)
  -- torchtitan's tps and MFU: a data-parallel replica's tokens per step
  -- (every microbatch) over the step x the tp x pp ranks that share them
  local tokens_step = s.tokens * sched.microbatches
  local tps = tokens_step / (step / 1e6 * p.dims.tp * sched.pp)
  local fpt = compute.model_flops_per_token(sp, s)
  out.throughput = { tokens_per_s_per_gpu = tonumber(string.format("%.1f", tps)), model_flops_per_token = fpt,
                     mfu = fpt and tonumber(string.format("%.4f", fpt * tps / (s.gpu_TFLOPS * 1e12))) or nil }
  return out
end

return figures
