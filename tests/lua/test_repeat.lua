-- A repeated micro-step stored once with a count (gen/repeat.lua): the
-- tables as the executor runs them issue the ops of the same plan planned
-- in full, in the same order, with the same figures; and their waits, read
-- with shared events (a wait means its op's latest issued instance), order
-- every data dependency and arena reuse of the ops as issued.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local memplan = require("gen.memplan")
local rep_mod = require("gen.repeat")
local T = {}

local read = H.read

-- A shipped plan's source with micro_steps = m.
local function with_micro(path, m)
  local src = read(path)
  if src:find("micro_steps = %d+") then return (src:gsub("micro_steps = %d+", "micro_steps = " .. m, 1)) end
  local out, n = src:gsub("fsdp = {", "fsdp = { micro_steps = " .. m .. ",", 1)
  if n == 0 then out = src:gsub("\n}%s*$", ",\n  fsdp = { micro_steps = " .. m .. " },\n}\n") end
  return out
end

-- The ops as issued: fresh tables, seq the issue index, micro-step each
-- repetition's; and each row's issued indices.
local function issued(p)
  local out = {}
  rep_mod.each(p.ops, p.rep, function(o, m)
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    c.seq, c.micro_step, c.row, c.times = #out, m, o.seq, nil
    out[#out + 1] = c
  end)
  return out
end

-- The waits of the issued ops as shared events make them: a wait for
-- row y's event means the latest issued op that records y's slot.
local function resolved_waits(p, ops)
  local slot = rep_mod.slots(p.arena.events, p.rep)
  local last, waits = {}, {}
  for _, o in ipairs(ops) do
    local list = {}
    for _, y in ipairs(p.arena.waits[o.row] or {}) do
      local at = last[slot[y]]
      assert(at, string.format("op %d waits for row %d (slot %s), which nothing recorded yet", o.seq, y, tostring(slot[y])))
      list[#list + 1] = at
    end
    if #list > 0 then table.sort(list); waits[o.seq] = list end
    if slot[o.row] then last[slot[o.row]] = o.seq end
  end
  return waits
end

local function check(path, m, edit)
  local src = with_micro(path, m)
  if edit then src = edit(src) end
  local p = plan.from_source(src, path)
  local full = plan.from_source(src, path, { expand = true })
  assert(p.rep, path .. " at " .. m .. " micro-steps: no repeated micro-step")
  H.eq(full.rep, nil, path .. " planned in full")
  local ops = issued(p)
  H.eq(#ops, #full.ops, path .. " ops issued")
  for i, o in ipairs(ops) do
    local f = full.ops[i]
    for _, k in ipairs({ "kind", "unit", "micro_step", "phase", "group", "dtype", "count", "reduce_op", "stream",
                         "from_sharded" }) do
      if o[k] ~= f[k] then
        error(string.format("%s: issued op %d %s = %s, in full %s", path, i - 1, k, tostring(o[k]), tostring(f[k])))
      end
    end
  end
  -- Every dependency of the issued ops under the plan's own placement is
  -- ordered by stream order and the resolved waits (gen/memplan.lua's proof).
  local offsets = {}
  for u, kinds in pairs(p.arena.by_unit) do
    offsets[u] = {}
    for kind, b in pairs(kinds) do offsets[u][kind] = b.offset end
  end
  local needs = memplan.needs_for(p.layout, ops, offsets)
  local bad_j, bad_i = memplan.unordered(ops, needs, resolved_waits(p, ops))
  if bad_j then
    error(string.format("%s: issued op %d (row %d) must follow op %d (row %d): no wait orders them", path, bad_i,
      ops[bad_i + 1].row, bad_j, ops[bad_j + 1].row))
  end
  local a, b = audit.analysis(p), audit.analysis(full)
  for _, k in ipairs({ "step_us", "compute_us", "exposed_us", "waits_us", "comm_us", "alone_us" }) do
    H.eq(a[k], b[k], path .. " " .. k .. " repeated vs in full")
  end
  for i, r in ipairs(a.families) do
    local q = b.families[i]
    for _, k in ipairs({ "name", "ops", "size_bytes", "wire_bytes", "us", "exposed_us", "alone_us" }) do
      H.eq(r[k], q[k], path .. " " .. r.name .. " " .. k)
    end
  end
  H.eq(p.memory.peak_bytes, full.memory.peak_bytes, path .. " peak bytes")
  H.eq(p.memory.arena_bytes, full.memory.arena_bytes, path .. " arena bytes")
end

-- Every accumulation mode, FSDP, HSDP and TP, the tiny Llama with
-- full checkpointing.
function T.repeated_rows_issue_the_full_plan()
  for _, case in ipairs({ { "plans/fsdp4.lua", 6 }, { "plans/fsdp4.lua", 9 }, { "plans/hsdp2x3_bf16.lua", 8 },
                          { "plans/hsdp3x2_arlast.lua", 7 }, { "plans/hsdp2x2_stepend.lua", 9 },
                          { "plans/fsdp8_uneven.lua", 7 }, { "plans/llama_tiny_tp.lua", 6 },
                          { "plans/llama_tiny.lua", 8 } }) do
    check(case[1], case[2])
  end
  check("plans/fsdp4.lua", 8, function(src)
    return (src:gsub("fsdp = {", 'fsdp = { grad_accumulation = "sync_last",', 1))
  end)
end

-- Under 6 micro-steps nothing repeats; a step whose predicted run does
-- not repeat (a comm-bound one whose queues grow) is planned in full.
function T.short_or_aperiodic_steps_are_planned_in_full()
  H.eq(plan.from_source(with_micro("plans/fsdp4.lua", 5), "plans/fsdp4.lua").rep, nil, "5 micro-steps")
  local p = plan.from_source(with_micro("plans/hsdp4x2_fp16.lua", 9), "plans/hsdp4x2_fp16.lua")
  H.eq(p.rep, nil, "hsdp4x2_fp16 at 9 micro-steps (comm-bound, queues grow)")
  H.eq(#p.ops, rep_mod.executed_count(p.ops, nil), "every op a row")
end

-- A wait is rewritten to the instance shared events give it, never to a
-- later op than the one waiting; events of the run's copies share slots.
function T.waits_and_slots_of_the_run()
  local rep = { first = 20, n = 10, times = 4 } -- run: rows 0..29 of copies at 0, 10, 20
  local w = rep_mod.strengthen({ [25] = { 13, 17, 3 }, [31] = { 5, 15, 22 }, [12] = { 4 } }, rep)
  -- row 25 (copy 2, offset 5): 13 and 3 (offset 3 < 5) -> this copy's 23; 17 (offset 7) -> copy 1's 17
  H.list_eq(w[25], { 17, 23 }, "row 25")
  -- after the run every wait means the last copy's op
  H.list_eq(w[31], { 22, 25 }, "row 31")
  H.list_eq(w[12], { 4 }, "row 12 (offset 2 waits for offset 4 of copy 0)")
  local slot, n = rep_mod.slots({ 3, 13, 40 }, rep)
  H.eq(slot[3], slot[13], "copies share a slot")
  H.eq(slot[23], slot[3], "the third copy records it too")
  H.eq(n, 2, "slots")
end

return T
