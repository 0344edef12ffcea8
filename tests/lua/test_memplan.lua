local H = require("helpers")
local plan = require("gen.plan")
local memplan = require("gen.memplan")
local T = {}

local function overlap(a, b) return a.offset < b.offset + b.size and b.offset < a.offset + a.size end

-- Lifetimes re-derived from the op list, independently of memplan: the op
-- seqs at which each (unit, kind) buffer is in use.
local function uses(p)
  local u = {}
  local function add(unit, kind, seq)
    u[unit] = u[unit] or {}
    u[unit][kind] = u[unit][kind] or {}
    u[unit][kind][seq] = true
  end
  for _, o in ipairs(p.ops) do
    local k = o.kind
    if k == "copy_in" or k == "all_gather" then add(o.unit, "ag", o.seq) end
    if k == "copy_out" then add(o.unit, "ag", o.seq); add(o.unit, "unsharded", o.seq) end
    if k == "forward" or k == "backward" then add(o.unit, "unsharded", o.seq) end
    if k == "backward" or k == "pack" then add(o.unit, "grads", o.seq) end
    if k == "pack" or k == "reduce_scatter" then add(o.unit, "rs_in", o.seq) end
    if k == "reduce_scatter" or k == "all_reduce" or k == "view_out" then add(o.unit, "rs_out", o.seq) end
  end
  return u
end

local function check_plan(path)
  local p = plan.from_file(path)
  local a = p.arena
  local used = uses(p)
  -- Every use of a buffer falls inside one of its planned lifetimes.
  for unit, kinds in pairs(used) do
    for kind, seqs in pairs(kinds) do
      local b = a.by_unit[unit][kind]
      for seq in pairs(seqs) do
        local inside = false
        for _, iv in ipairs(b.lives) do inside = inside or (iv.first <= seq and seq <= iv.last) end
        if not inside then error(string.format("%s: %s of unit %d used at op %d outside its lifetimes", path, kind, unit, seq)) end
      end
    end
  end
  -- No two buffers in use at the same op share a byte.
  local bufs = a.buffers
  for i = 1, #bufs do
    local x = bufs[i]
    H.eq(x.offset % memplan.ALIGN, 0, path .. " offset alignment")
    if x.offset + x.size > a.arena_bytes and #x.lives > 0 then error(path .. ": buffer outside the arena") end
    for j = i + 1, #bufs do
      local y = bufs[j]
      if overlap(x, y) then
        for _, iv in ipairs(x.lives) do
          for _, jv in ipairs(y.lives) do
            if iv.first <= jv.last and jv.first <= iv.last then
              error(string.format("%s: %s/%s and %s/%s share bytes while both live", path, x.unit_name, x.kind,
                y.unit_name, y.kind))
            end
          end
        end
      end
    end
  end
  -- Waits point backwards at ops that record an event.
  local is_event = {}
  for _, e in ipairs(a.events) do is_event[e] = true end
  for seq, list in pairs(a.waits) do
    for _, j in ipairs(list) do
      if not (j < seq and is_event[j]) then error(string.format("%s: op %d waits for op %d", path, seq, j)) end
    end
  end
  if a.arena_bytes < p.memory.peak_transient_bytes then error(path .. ": arena below the peak of live bytes") end
  return p
end

function T.arena_plans_are_safe()
  for _, f in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/fsdp8_uneven.lua", "plans/hsdp4x2_fp16.lua",
                       "plans/llama_tiny.lua", "plans/llama8b.lua", "plans/llama70b.lua" }) do
    check_plan(f)
  end
end

-- The point of the arena: one Llama-3-70B rank fits an 80 GB GPU.
function T.llama70b_rank_fits_one_gpu()
  local p = plan.from_file("plans/llama70b.lua")
  local gib = 1024 ^ 3
  if p.memory.allocated_bytes > 32 * gib then
    error(string.format("llama70b allocates %.1f GiB per rank", p.memory.allocated_bytes / gib))
  end
  if p.arena.unplanned_bytes < 20 * p.arena.arena_bytes then error("arena saves less than expected") end
  -- A step's worth of event waits stays small (host cost per wait): per
  -- unit its data dependencies across streams (copy-in -> all-gather ->
  -- copy-out, twice; pack -> reduce-scatter -> all-reduce) and a few reuses.
  local n = 0
  for _, list in pairs(p.arena.waits) do n = n + #list end
  if n > 12 * #p.layout.units then error("too many event waits: " .. n) end
end

-- Buffers that never coexist share offsets; ones that do, never.
function T.two_units_reuse_one_region()
  local p = plan.from_source(H.generic(2, "{ dp_shard = 2 }",
    { { "l0", { { "a", { 64 } } } }, { "l1", { { "b", { 64 } } } }, { "root", { { "c", { 8 } } } } }), "t.lua")
  local by = p.arena.by_unit
  local l0, l1 = p.layout.units[1].index, p.layout.units[2].index
  -- l0's unsharded params are resharded before l1's forward: same bytes.
  H.eq(by[l0].ag.offset == by[l1].ag.offset or by[l0].unsharded.offset == by[l1].unsharded.offset
       or overlap(by[l0].unsharded, by[l1].unsharded), true, "forward buffers reused")
end

-- The generator's ordering proof catches a missing wait: drop each emitted
-- wait in turn and the proof must name an unordered edge (a data
-- dependency across streams or a reuse of arena bytes).
function T.dropping_a_wait_breaks_the_proof()
  for _, f in ipairs({ "plans/hsdp2x2.lua", "plans/fsdp8_uneven.lua", "plans/llama_tiny.lua" }) do
    local p = plan.from_file(f)
    local a = p.arena
    H.eq(memplan.unordered(p.ops, a.needs, a.waits), nil, f .. " as generated")
    local dropped = 0
    for seq, list in pairs(a.waits) do
      for k = 1, #list do
        local copy = {}
        for s2, l2 in pairs(a.waits) do copy[s2] = l2 end
        local fewer = {}
        for i, j in ipairs(list) do if i ~= k then fewer[#fewer + 1] = j end end
        copy[seq] = fewer
        if memplan.unordered(p.ops, a.needs, copy) == nil then
          error(string.format("%s: dropping op %d's wait for op %d went unnoticed", f, seq, list[k]))
        end
        dropped = dropped + 1
      end
    end
    if dropped == 0 then error(f .. ": no reuse waits to drop") end
  end
end

-- The generator decides every op's stream, and the proof covers the data
-- dependencies across streams as well as arena reuse: each collective
-- follows the op that produced its input, each copy-out its all-gather.
function T.streams_and_data_dependencies_are_emitted()
  local opkinds = require("gen.opkinds")
  for _, f in ipairs({ "plans/hsdp2x2.lua", "plans/llama_tiny.lua", "plans/single.lua" }) do
    local p = plan.from_file(f)
    local hsdp = p.groups.by_name.dp_replicate ~= nil
    local last = {}
    for _, o in ipairs(p.ops) do
      H.eq(o.stream, opkinds.stream_of(o, hsdp), f .. " stream of op " .. o.seq)
      last[o.unit] = last[o.unit] or {}
      local need = p.arena.needs[o.seq] or {}
      local producer = ({ all_gather = "copy_in", copy_out = "all_gather", reduce_scatter = "pack",
                          all_reduce = "reduce_scatter" })[o.kind]
      if o.from_sharded then producer = nil end -- zero copy-in: it reads the shards themselves
      if producer then
        local j = last[o.unit][producer]
        if not need[j] then error(string.format("%s: op %d (%s) does not need op %s (%s)", f, o.seq, o.kind,
          tostring(j), producer)) end
      end
      last[o.unit][o.kind] = o.seq
    end
  end
end

-- A shipped plan's source with fsdp settings replaced (micro-steps,
-- accumulation, resharding): the plan file's table, edited after it runs.
local function variant(path, fsdp_lua)
  local fh = assert(io.open(path, "rb"))
  local src = fh:read("a")
  fh:close()
  return "local p = (function() " .. src .. "\nend)()\np.fsdp = p.fsdp or {}\n" .. fsdp_lua .. "\nreturn p"
end

-- The linear sweeps (time neighbours, byte unions, reuse edges per stream)
-- place every buffer where the pairwise planner did and emit the same
-- waits, for every accumulation mode, with and without resharding, over
-- per-cell arrays and over segment trees alike.
function T.sweeps_match_the_pairwise_planner()
  local reference = require("memplan_reference")
  local edits = { "", "p.fsdp.micro_steps = 3", "p.fsdp.micro_steps = 3 p.fsdp.grad_accumulation = 'sync_last'",
                  "p.fsdp.micro_steps = 3 p.fsdp.grad_accumulation = 'all_reduce_last'",
                  "p.fsdp.micro_steps = 3 p.fsdp.grad_accumulation = 'step_end'",
                  "p.fsdp.micro_steps = 2 p.fsdp.reshard_after_forward = false" }
  for _, f in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/hsdp3x2_arlast.lua", "plans/llama_tiny_tp.lua",
                       "plans/tp3_uneven.lua", "plans/fsdp8_uneven.lua" }) do
    for _, e in ipairs(edits) do
      -- per-cell arrays (the default here) and segment trees (FLAT_SPAN 0)
      for _, flat in ipairs({ memplan.FLAT_SPAN, 0 }) do
        local saved = memplan.FLAT_SPAN
        memplan.FLAT_SPAN = flat
        local ok, p = pcall(plan.from_source, variant(f, e), f)
        memplan.FLAT_SPAN = saved
        if not ok then error(p, 0) end
        local what = f .. " [" .. e .. "] flat span " .. flat
        local want = reference.build(p.ops, p.arena)
        H.eq(p.arena.arena_bytes, want.arena_bytes, what .. " arena bytes")
        for _, b in ipairs(p.arena.buffers) do
          H.eq(b.offset, want.offsets[b], what .. " offset of " .. b.unit_name .. "/" .. b.kind)
        end
        for i = 0, #p.ops - 1 do
          H.list_eq(p.arena.waits[i] or {}, want.waits[i] or {}, what .. " waits of op " .. i)
        end
      end
    end
  end
end

return T
