-- The predicted step timeline: every op of the schedule on its stream, in
-- stream order, starting when its stream is free and every op it waits for
-- (plan.json ops[].waits_for: data dependencies and arena reuse) has
-- finished: the executor's own ordering, nothing else. Durations: compute
-- and copies from gen/compute.lua, collectives from gen/cost.lua's
-- alpha-beta prediction. Collectives that run at the same time on the same
-- link class (intra-node or inter-node) share its bandwidth equally (each
-- progresses at 1/n of its rate while n run): FSDP's all-gathers and
-- reduce-scatters and HSDP's all-reduce contend for the same NICs.
--
-- Results: each op's start and finish, the step time, the compute stream's
-- busy time, exposed communication (step time minus the compute stream's
-- busy time: the compute stream idles waiting for communication, or the
-- step ends with communication after the last compute), which collective
-- each idle interval waited for, and the critical path.
local opkinds = require("gen.opkinds")
local compute = require("gen.compute")

local timeline = {}

local EPS = 1e-9
local NO_WAITS = {}

-- The collectives that run on the compute stream (the compute waits for
-- them: exposed by nature), by their group's family, each named as what it
-- is: TP's activation collectives, context parallel's K/V exchange (the
-- same op kinds on the cp group, gen/parallel/cp.lua), expert parallel's
-- token all-to-alls (gen/parallel/ep.lua). SCHEDULE.md, timeline.svg and
-- trace.json take their names from here.
timeline.INLINE_ORDER = { "tp", "cp", "ep" }
timeline.INLINE_LABELS = { tp = "TP collectives", cp = "CP K/V collectives", ep = "expert all-to-alls" }

-- A family's compute-stream collectives as a phrase.
function timeline.inline_label(family)
  return timeline.INLINE_LABELS[family] or (tostring(family) .. " collectives")
end

-- A backward op's rerun of its block's forward collectives (full
-- checkpointing: r.extra_comm over r.extra_ops) split by family, each
-- family's share by its ops' own times: { {family, us}, ... } in
-- INLINE_ORDER, then by name; {} for an op without a rerun.
function timeline.rerun_by_family(r)
  local out = {}
  if not r.extra_comm then return out end
  local sum, by = 0, {}
  for _, fo in ipairs(r.extra_ops) do sum = sum + (fo.predicted_us or 0) end
  for _, fo in ipairs(r.extra_ops) do
    local share = sum > 0 and r.extra_comm * (fo.predicted_us or 0) / sum or r.extra_comm / #r.extra_ops
    by[fo.group] = (by[fo.group] or 0) + share
  end
  local rank = {}
  for i, f in ipairs(timeline.INLINE_ORDER) do rank[f] = i end
  for f, us in pairs(by) do out[#out + 1] = { f, us } end
  table.sort(out, function(x, y)
    local rx, ry = rank[x[1]] or math.huge, rank[y[1]] or math.huge
    if rx ~= ry then return rx < ry end
    return x[1] < y[1]
  end)
  return out
end

-- A set of families (family -> true) as one phrase, in INLINE_ORDER then
-- by name: "TP collectives and expert all-to-alls".
function timeline.inline_labels(set)
  local names, known = {}, {}
  for _, f in ipairs(timeline.INLINE_ORDER) do
    known[f] = true
    if set[f] then names[#names + 1] = timeline.inline_label(f) end
  end
  local rest = {}
  for f in pairs(set) do if not known[f] then rest[#rest + 1] = f end end
  table.sort(rest)
  for _, f in ipairs(rest) do names[#names + 1] = timeline.inline_label(f) end
  if #names == 0 then return "collectives" end
  if #names == 1 then return names[1] end
  return table.concat(names, ", ", 1, #names - 1) .. " and " .. names[#names]
end

-- An op's dependencies, in order: before (the op before it on its
-- stream), then its waits (list), by their info. ok: all finished; bind:
-- the one that finished last (the later op on a tie); else false and the
-- first unfinished one.
local function ready(info, before, list)
  local bind, bind_end = nil, -1
  if before then
    local dr = info[before]
    if not dr.finish then return false, before end
    if dr.finish > bind_end + EPS or (math.abs(dr.finish - bind_end) <= EPS and before > bind) then
      bind, bind_end = before, dr.finish
    end
  end
  for _, dseq in ipairs(list) do
    local dr = info[dseq]
    if not dr.finish then return false, dseq end
    if dr.finish > bind_end + EPS or (math.abs(dr.finish - bind_end) <= EPS and dseq > bind) then
      bind, bind_end = dseq, dr.finish
    end
  end
  return true, bind
end

-- p: the plan; s: compute.settings; per_unit: compute.units;
-- opts.extra_us: op seq -> added microseconds (optional).
function timeline.build(p, s, per_unit, opts)
  opts = opts or {}
  local ops, waits = p.ops, p.arena.waits
  local by_seq, lists = {}, {}
  for _, name in ipairs(opkinds.STREAMS) do lists[name] = {} end
  for _, o in ipairs(ops) do
    by_seq[o.seq] = o
    local l = lists[o.stream]
    l[#l + 1] = o.seq
  end
  -- Full checkpointing re-runs each layer's forward in its backward, TP's
  -- activation collectives (on the compute stream) included: each runs
  -- again inside its unit's backward op, at its forward op's cost.
  local tp = p.dims and p.dims.tp or 1
  local recompute_tp = {} -- unit -> micro-step -> { us, list }
  for _, o in ipairs(timeline.recomputed(p, s)) do
    local by_micro = recompute_tp[o.unit] or {}
    recompute_tp[o.unit] = by_micro
    local acc = by_micro[o.micro_step] or { us = 0, list = {} }
    -- (selective: the gather alone; only the recomputed matmuls (wk, w3)
    -- consume it again, so async TP's fused pair is not rerun)
    acc.us = acc.us + (s.activation_checkpointing == "selective" and (o.predicted_us or 0)
      or timeline.exposed_tp_us(o, s, tp))
    acc.list[#acc.list + 1] = o
    by_micro[o.micro_step] = acc
  end
  local info = {}
  for _, o in ipairs(ops) do
    -- Every field the sweep sets is named here (nil until then), so the
    -- table is sized once instead of growing field by field (an info per
    -- op, and a plan predicts its step more than once).
    local r = { seq = o.seq, stream = o.stream, work = nil, link = nil, fixed = nil, extra_comm = nil,
                extra_ops = nil, nominal = nil, start = nil, bind = nil, finish_at = nil, remaining = nil,
                finish = nil, dur = nil, next_f = nil }
    if o.group then
      r.work = timeline.exposed_tp_us(o, s, tp)
      r.link = o.intra_node and "intra" or "inter"
    else
      r.fixed = compute.op_us(p, s, per_unit, o, opts.extra_us)
      local again = o.kind == "backward" and recompute_tp[o.unit] and recompute_tp[o.unit][o.micro_step]
      if again then
        r.fixed = r.fixed + again.us
        r.extra_comm, r.extra_ops = again.us, again.list
      end
    end
    r.nominal = r.work or r.fixed
    info[o.seq] = r
  end
  local S = #opkinds.STREAMS
  local pos, busy, len, list_of, blocked = {}, {}, {}, {}, {}
  for k, name in ipairs(opkinds.STREAMS) do
    pos[k], busy[k], list_of[k], len[k], blocked[k] = 1, false, lists[name], #lists[name], false
  end
  local sidx = {}
  for k, name in ipairs(opkinds.STREAMS) do sidx[name] = k end
  local active, t, finished = {}, 0, 0
  local function finish(r)
    r.finish = t
    r.dur = t - r.start
    busy[sidx[r.stream]] = false
    finished = finished + 1
  end
  -- A stream's next op is checked again only once the op it waited on
  -- has finished (blocked[k]: that op's info).
  local function start_ready()
    local progress = true
    while progress do
      progress = false
      for k = 1, S do
        local at = pos[k]
        if not busy[k] and at <= len[k] and not (blocked[k] and not blocked[k].finish) then
          local l = list_of[k]
          local seq = l[at]
          local ok, bind = ready(info, at > 1 and l[at - 1] or nil, waits[seq] or NO_WAITS)
          if ok then
            blocked[k] = false
            local r = info[seq]
            r.start, r.bind = t, bind
            pos[k] = at + 1
            busy[k] = r
            if r.fixed then
              r.finish_at = t + r.fixed
              if r.fixed <= EPS then finish(r) end
            else
              r.remaining = r.work
              if r.work <= EPS then finish(r) end
            end
            if not r.finish then active[#active + 1] = r end
            progress = true
          else
            blocked[k] = info[bind]
          end
        end
      end
    end
  end
  local sharing = { intra = 0, inter = 0 }
  while true do
    start_ready()
    if #active == 0 then break end
    -- (numeric loops: an event per op, and ipairs costs a call per item)
    local na = #active
    sharing.intra, sharing.inter = 0, 0
    for i = 1, na do
      local r = active[i]
      if r.link then sharing[r.link] = sharing[r.link] + 1 end
    end
    local tf = math.huge
    for i = 1, na do
      local r = active[i]
      local f = r.fixed and r.finish_at or (t + r.remaining * sharing[r.link])
      r.next_f = f
      if f < tf then tf = f end
    end
    local dt = tf - t
    for i = 1, na do
      local r = active[i]
      if r.link then r.remaining = r.remaining - dt / sharing[r.link] end
    end
    t = tf
    local kept, n = 0, #active
    for i = 1, n do
      local r = active[i]
      -- (the op that set tf finishes now whatever rounding left of it: at
      -- a large t, t + remaining can equal t, and the step would stall)
      if r.next_f <= tf or (r.fixed and r.finish_at <= t + EPS) or (r.link and r.remaining <= EPS * math.max(1, r.work))
      then
        finish(r)
      else
        kept = kept + 1
        active[kept] = r
      end
    end
    for i = kept + 1, n do active[i] = nil end
  end
  if finished ~= #ops then
    error(string.format("internal: the predicted timeline stalls after %d of %d ops", finished, #ops), 0)
  end
  return timeline.summarize(p, info, by_seq, compute.optimizer_us(p, s))
end

-- The step with p's waits (p.arena.waits), from a step tl predicted with
-- other waits, where p's delay none of its ops: each op of tl starts when
-- the last of its dependencies under p's waits (the op before it on its
-- stream, its waits) finishes in tl. Then the prediction with p's waits
-- meets the same ops ready at every event, so it is tl, but for each
-- op's binding dependency (re-chosen among its own): tl itself where none
-- changes (the rest of a prediction follows from its ops' times and
-- binding dependencies). nil where some op would start otherwise
-- (memplan's holds usually delay nothing: the plan need not predict its
-- step a third time).
function timeline.replay(p, tl)
  local waits, from = p.arena.waits, tl.ops
  local info, by_seq, prev, rebound = {}, {}, {}, false
  for _, o in ipairs(p.ops) do
    local seq = o.seq
    local r, before, list = from[seq], prev[o.stream], waits[seq] or NO_WAITS
    if not r then return nil end
    local latest = before and from[before].finish or 0
    for _, j in ipairs(list) do
      local f = from[j] and from[j].finish
      if not f then return nil end
      if f > latest then latest = f end
    end
    if latest ~= r.start then return nil end
    local _, bind = ready(from, before, list)
    if bind ~= r.bind then
      local c = {}
      for k, v in pairs(r) do c[k] = v end
      c.bind = bind
      r, rebound = c, true
    end
    info[seq], by_seq[seq], prev[o.stream] = r, o, seq
  end
  return rebound and timeline.summarize(p, info, by_seq, tl.optimizer_us) or tl
end

-- opt_us: the optimizer step after the last op (compute.optimizer_us), on
-- the compute stream: the step's end and its compute both grow by it.
function timeline.summarize(p, info, by_seq, opt_us)
  local ops = p.ops
  local step, last = 0, nil
  for _, o in ipairs(ops) do
    local r = info[o.seq]
    if r.finish > step + EPS or (last and math.abs(r.finish - step) <= EPS and o.seq > last) then
      step, last = r.finish, o.seq
    end
  end
  -- Compute stream: busy time, idle intervals and who they waited for.
  -- Each idle interval [lo, hi] is split along the chain of binding
  -- dependencies that ended it (an op starts when its latest dependency
  -- finishes, so the chain covers the interval without gaps): each op of
  -- the chain takes the part of the interval it ran in, a collective as its
  -- exposed time (never more than its own duration), anything else (a copy
  -- on another stream) as key -1.
  -- Each part is also kept as a span (idle[]: lo, hi, by = the op's seq
  -- or -1, waiting = the compute op that waited, nil for the tail), in
  -- time order, for the pictures (gen/svg.lua).
  local busy, comm_serial = 0, 0
  -- exposed_by: per op, its exposed time in the step (every repetition);
  -- drawn: the same for the rows as drawn once (the pictures' marks)
  local exposed_by, recompute_by, waiter, idle, drawn = {}, {}, {}, {}, {}
  -- weight: how many times the waiting op runs (a repeated micro-step's
  -- rows stand for all its repetitions: gen/repeat.lua); the spans stay
  -- one copy's.
  -- A repeated micro-step: each repetition of a waiting row waits for
  -- that repetition's instance of the op it names, one copy later per
  -- repetition, up to the repeated rows themselves (gen/repeat.lua).
  local rep = p.rep
  local run_start, run_n = rep and rep.first - 2 * rep.n, rep and rep.n
  local function blame(key, amount, weight)
    if weight == 1 or key < run_start or key >= run_start + 3 * run_n then
      exposed_by[key] = (exposed_by[key] or 0) + amount * weight
      return
    end
    local copy = (key - run_start) // run_n
    local k = 0
    while copy < 2 and k < weight - 1 do
      exposed_by[key] = (exposed_by[key] or 0) + amount
      key, copy, k = key + run_n, copy + 1, k + 1
    end
    exposed_by[key] = (exposed_by[key] or 0) + amount * (weight - k)
  end
  local function attribute(from, lo, hi, waiting, weight)
    weight = weight or 1
    local cur = from
    local parts = {}
    while cur and hi > lo + EPS do
      local o, r = by_seq[cur], info[cur]
      local part = math.min(hi, r.finish) - math.max(lo, r.start)
      if part > EPS then
        local key = o.group and cur or -1
        blame(key, part, weight)
        drawn[key] = (drawn[key] or 0) + part
        if key >= 0 and waiting and not waiter[key] then waiter[key] = { op = waiting, via = from } end
        parts[#parts + 1] = { lo = math.max(lo, r.start), hi = math.min(hi, r.finish), by = key, waiting = waiting }
      end
      hi = math.min(hi, r.start)
      cur = r.bind
    end
    if hi > lo + EPS then
      exposed_by[-1] = (exposed_by[-1] or 0) + (hi - lo) * weight
      drawn[-1] = (drawn[-1] or 0) + (hi - lo)
      parts[#parts + 1] = { lo = lo, hi = hi, by = -1, waiting = waiting }
    end
    for i = #parts, 1, -1 do idle[#idle + 1] = parts[i] end
  end
  -- cend: where the compute stream's work so far ends; repeated: what the
  -- repetitions beyond the first add to the step (each repeated compute
  -- op's idle time before it and its own run, once more per repetition).
  local cend, repeated = 0, 0
  for _, o in ipairs(ops) do
    local r = info[o.seq]
    local times = o.times or 1
    if o.group then comm_serial = comm_serial + r.nominal * times end
    if o.stream == "compute" then
      -- A collective on the compute stream (TP's) is exposed by nature.
      if o.group then
        exposed_by[o.seq] = (exposed_by[o.seq] or 0) + r.dur * times
        drawn[o.seq] = (drawn[o.seq] or 0) + r.dur
      else
        busy = busy + r.dur * times
      end
      if r.extra_comm then
        -- The backward's recompute of forward TP collectives: exposed,
        -- each by its forward op (recompute_by, apart from exposed_by).
        busy = busy - r.extra_comm * times
        comm_serial = comm_serial + r.extra_comm * times
        for _, fo in ipairs(r.extra_ops) do
          recompute_by[fo.seq] = (recompute_by[fo.seq] or 0) + (fo.predicted_us or 0) * times
        end
      end
      if r.start > cend + EPS then attribute(r.bind, cend, r.start, o.seq, times) end
      local new_end = math.max(cend, r.finish)
      repeated = repeated + (new_end - cend) * (times - 1)
      cend = new_end
    end
  end
  -- Critical path: from the last op back along binding dependencies.
  local back = {}
  local cur = last
  while cur do
    back[#back + 1] = cur
    cur = info[cur].bind
  end
  local path = {}
  for i = #back, 1, -1 do path[#path + 1] = back[i] end
  -- The tail after the compute stream's last op: split along the
  -- critical path the same way.
  if step > cend + EPS then attribute(last, cend, step, nil) end
  -- The step with every repetition (the tail after the compute stream's
  -- last op is the step's end, run once).
  opt_us = opt_us or 0
  local drawn_step = step + opt_us
  step = step + repeated + opt_us
  busy = busy + opt_us
  return { ops = info, step_us = step, drawn_step_us = drawn_step, compute_busy_us = busy, exposed_us = step - busy,
           optimizer_us = opt_us,
           comm_serial_us = comm_serial, exposed_by = exposed_by, exposed_drawn = drawn, recompute_by = recompute_by,
           waiter = waiter,
           idle = idle, critical = path, compute_end_us = cend }
end

-- The forward ops whose collectives full activation checkpointing runs
-- again in backward: TP's, on the compute stream (FSDP's all-gathers are
-- not repeated: the backward's own unshard serves the recompute), of the
-- units it wraps (compute.checkpointed: torchtitan's transformer blocks;
-- the embedding's, the output's and loss_parallel's collectives run once).
-- A collective's time on its stream. Under async TP (parallel.async_tp) a
-- TP collective fused with its matmul (o.mm_flops, gen/parallel/tp_acts.lua)
-- runs as torch's micro-pipeline splits it: tp chunks, each chunk's
-- transfer overlapping another chunk's matmul, so the pair takes
-- max(comm, matmul) + min(comm, matmul) / tp (one chunk of the shorter
-- not hidden); the matmul is already in the unit's compute, so the
-- collective adds the rest.
function timeline.exposed_tp_us(o, s, tp)
  local c = o.predicted_us or 0
  if not o.mm_flops or tp <= 1 then return c end
  local m = o.mm_flops / s.flops_per_us
  return math.max(c - m, 0) + math.min(c, m) / tp
end

-- A unit's collectives of a group the tables already re-issue in backward
-- (ops marked recompute: context parallel's K/V all-gathers) are not
-- counted again.
-- Selective (op-level SAC) saves the reduce-scatters' outputs but not the
-- all-gathers' (torchtitan's save list, distributed/activation_checkpoint.py:
-- 60-63), so the backward's recompute gathers TP's inputs again.
function timeline.recomputed(p, s)
  local out = {}
  local ac = s.activation_checkpointing
  if ac ~= "full" and ac ~= "selective" then return out end
  local block, listed = {}, {}
  for _, u in ipairs(p.layout.units) do
    if compute.checkpointed(p, u) then block[u.index] = true end
  end
  for _, o in ipairs(p.ops) do
    if o.recompute and o.group then listed[o.unit .. " " .. o.group] = true end
  end
  for _, o in ipairs(p.ops) do
    if o.group and o.stream == "compute" and o.phase == "forward" and block[o.unit]
      and not listed[o.unit .. " " .. o.group] and (ac == "full" or o.kind == "tp_all_gather") then
      out[#out + 1] = o
    end
  end
  return out
end

-- Per family: the recompute's collectives (ops, size_bytes, wire_bytes, us).
function timeline.recompute_per_family(p, s)
  local t = {}
  for _, o in ipairs(timeline.recomputed(p, s)) do
    local a = t[o.group] or { ops = 0, size_bytes = 0, wire_bytes = 0, us = 0, kinds = {}, kind_order = {} }
    local times = o.times or 1
    a.ops = a.ops + times
    a.size_bytes = a.size_bytes + o.size_bytes * times
    a.wire_bytes = a.wire_bytes + o.wire_bytes * times
    a.us = a.us + (o.predicted_us or 0) * times
    if not a.kinds[o.kind] then a.kinds[o.kind] = 0; a.kind_order[#a.kind_order + 1] = o.kind end
    a.kinds[o.kind] = a.kinds[o.kind] + times
    t[o.group] = a
  end
  return t
end

return timeline
