-- A repeated micro-step, stored once with a count (gen/parallel/fsdp_schedule.lua).
--
-- Real jobs run 16-64 micro-batches; every micro-step of the run 3 ..
-- micro_last issues the same ops, so the tables hold three copies of it
-- (micro-steps 1, 2 and 3: "the run", each n ops, the third starting at
-- rep.first) and the third stands for micro-steps 3 .. micro_last
-- (rep.times of them). Every stage (proofs, memory plan, predicted step)
-- works on those rows; the executor runs the third copy's rows times
-- times (plan.c expands them with a macro, so the runtime's walker sees
-- every op).
--
-- Events: the k-th op of each copy of the run records one shared event
-- slot, so a wait for it always means its latest issued instance. The
-- waits into the run are rewritten to exactly that (a wait for an earlier
-- instance becomes a wait for a later one on the same stream: stronger,
-- and never for an op not yet issued), which makes the third copy's waits
-- mean the same thing on every repetition. The rows are sound for every
-- repetition when the third copy's needs (data and arena reuse) are the
-- second copy's shifted by one copy: checked here (repeat.check), or the
-- plan is built fully expanded instead.
local rep_mod = {}

-- Two micro-steps' ops are the same but for their micro-step numbers.
function rep_mod.same_micro(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do
    local x, y = a[i], b[i]
    for k, v in pairs(x) do
      -- an all-to-all's counts slot moves with its micro-step, and its
      -- counts op is compared by position (gen/parallel/fsdp_schedule.lua)
      if k == "a2a_slot" then
        if y[k] == nil or v - x.micro_step ~= y[k] - y.micro_step then return false end
      elseif k == "a2a_counts_of" then
        if y[k] == nil or v.a2a_pos ~= y[k].a2a_pos then return false end
      elseif k ~= "micro_step" and y[k] ~= v then return false end
    end
    for k in pairs(y) do
      if x[k] == nil then return false end
    end
  end
  return true
end

-- How many times op o runs in a step.
function rep_mod.times(o) return o.times or 1 end

-- Ops the executor issues in a step (table rows, repetitions counted).
function rep_mod.executed_count(ops, rep)
  return #ops + (rep and (rep.times - 1) * rep.n or 0)
end

-- Calls fn(o, micro_step) for every op in issue order, repetitions
-- expanded (linear in the executed ops: the proofs that walk state).
function rep_mod.each(ops, rep, fn)
  if not rep then
    for _, o in ipairs(ops) do fn(o, o.micro_step) end
    return
  end
  local first, last = rep.first + 1, rep.first + rep.n
  for i = 1, last do fn(ops[i], ops[i].micro_step) end
  for k = 1, rep.times - 1 do
    for i = first, last do fn(ops[i], ops[i].micro_step + k) end
  end
  for i = last + 1, #ops do fn(ops[i], ops[i].micro_step) end
end

-- The run's geometry: seq of its first row and its copy length.
local function run_of(rep) return rep.first - 2 * rep.n, rep.n end

-- The seq a wait by op x for op y means once events are shared: y's
-- latest instance issued before x.
local function latest(rep, x, y)
  local start, n = run_of(rep)
  local stop = start + 3 * n
  if y < start or y >= stop then return y end
  local j = (y - start) % n
  if x >= stop then return start + 2 * n + j end
  local qx, i = (x - start) // n, (x - start) % n
  return start + (j < i and qx or qx - 1) * n + j
end

-- waits (op seq -> sorted seqs) rewritten to what shared events mean.
function rep_mod.strengthen(waits, rep)
  if not rep then return waits end
  local out = {}
  for x, list in pairs(waits) do
    local seen, l = {}, {}
    for _, y in ipairs(list) do
      local z = latest(rep, x, y)
      if z >= x then error(string.format("internal: op %d's wait for %d means op %d", x, y, z), 0) end
      if not seen[z] then seen[z] = true; l[#l + 1] = z end
    end
    table.sort(l)
    out[x] = l
  end
  return out
end

-- Event slots: op seq -> slot, the run's k-th ops sharing one; and the
-- number of slots. events: the sorted seqs others wait for.
function rep_mod.slots(events, rep)
  local slot, nslots = {}, 0
  if not rep then
    for i, seq in ipairs(events) do slot[seq] = i - 1 end
    return slot, #events
  end
  local start, n = run_of(rep)
  local shared = {}
  for _, seq in ipairs(events) do
    if seq >= start and seq < start + 3 * n then
      local j = (seq - start) % n
      if not shared[j] then
        shared[j] = nslots
        nslots = nslots + 1
      end
    else
      slot[seq] = nslots
      nslots = nslots + 1
    end
  end
  -- every copy's k-th op records the shared slot, waited for or not
  for j, s in pairs(shared) do
    for q = 0, 2 do slot[start + q * n + j] = s end
  end
  return slot, nslots
end

-- The rows stand for every repetition when the third copy's needs are the
-- second's one copy later (targets in the run shifted, others the same).
-- needs: op seq -> set of the seqs it must come after. nil, or a reason.
function rep_mod.check(needs, rep)
  local start, n = run_of(rep)
  local function shifted(y)
    if y >= start and y < start + 3 * n then return y + n end
    return y
  end
  for i = 0, n - 1 do
    local b, c = start + n + i, start + 2 * n + i
    local want = {}
    for y in pairs(needs[b] or {}) do want[shifted(y)] = true end
    local have = {}
    for y in pairs(needs[c] or {}) do
      have[y] = true
      if not want[y] then
        return string.format("op %d needs op %d, which op %d one micro-step earlier does not mirror", c, y, b)
      end
    end
    for y in pairs(want) do
      if not have[y] then
        return string.format("op %d needs op %d one micro-step earlier, which op %d does not mirror", b, y, c)
      end
    end
  end
  return nil
end

-- The arena's waits as shared events make them mean (strengthen), proved
-- again (gen/memplan.lua's proof over the rewritten waits), and the events
-- they wait for.
function rep_mod.share_events(ops, arena, rep)
  local memplan = require("gen.memplan")
  local waits = rep_mod.strengthen(arena.waits, rep)
  local bad_j, bad_i = memplan.unordered(ops, arena.needs, waits)
  if bad_j then
    error(string.format("internal: op %d must follow op %d but no shared-event wait orders them", bad_i, bad_j), 0)
  end
  local set, events = {}, {}
  for _, list in pairs(waits) do
    for _, j in ipairs(list) do set[j] = true end
  end
  for seq in pairs(set) do events[#events + 1] = seq end
  table.sort(events)
  arena.waits, arena.events = waits, events
end

-- The predicted timeline (gen/timeline.lua) runs the third copy as the
-- second, one period later: every op's duration the same and its start
-- moved by the same amount (to 1e-9 of the step).
function rep_mod.periodic(tl, rep)
  local start, n = run_of(rep)
  local eps = 1e-9 * math.max(1, tl.step_us)
  local period = tl.ops[start + 2 * n].start - tl.ops[start + n].start
  for i = 0, n - 1 do
    local b, c = tl.ops[start + n + i], tl.ops[start + 2 * n + i]
    if math.abs(b.dur - c.dur) > eps or math.abs(c.start - b.start - period) > eps then return false end
  end
  return true
end

return rep_mod
