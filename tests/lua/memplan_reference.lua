-- The memory plan's placement and reuse edges computed pairwise, as
-- gen/memplan.lua did before issue 19 (every buffer against every other:
-- quadratic in units x micro-steps), kept as the reference the linear
-- sweeps must match on small plans: the same offsets, arena size and
-- waits, bytes held for overlap included.
local memplan = require("gen.memplan")

local reference = {}

local function overlap_in_time(a, b, held)
  for _, x in ipairs(held and a.held or a.lives) do
    for _, y in ipairs(held and b.held or b.lives) do
      if x.first <= y.last and y.first <= x.last then return true end
    end
  end
  return false
end

local function overlap_in_space(a, b)
  return a.offset < b.offset + b.size and b.offset < a.offset + a.size
end

local function latest_end_before(q, seq)
  local found
  for _, iv in ipairs(q.lives) do
    if iv.last < seq then found = iv.last end
  end
  return found
end

-- arena: memplan.build's result (its buffers' sizes, lives, held lives
-- and the budget are reused; the offsets are recomputed here: where the
-- plan holds bytes for overlap, each buffer at the lowest offset clear of
-- the placed buffers whose held lives meet its own, unless that ends past
-- the budget, then clear of those whose lives meet its own). Returns
-- { offsets = buffer -> offset, arena_bytes, waits }.
function reference.build(ops, arena)
  local order = {}
  for i, b in ipairs(arena.buffers) do order[i] = b end
  table.sort(order, function(a, b)
    if a.size ~= b.size then return a.size > b.size end
    if a.unit ~= b.unit then return a.unit < b.unit end
    return a.kind_index < b.kind_index
  end)
  local holding = arena.policy ~= "reuse"
  local budget = arena.budget_bytes or math.huge
  local at, placed, total = {}, {}, 0
  local view = {}
  for _, b in ipairs(order) do
    view[b] = { size = b.size, lives = b.lives, held = b.held or b.lives, pool = b.pool }
  end
  local function fit(v, held)
    local busy = {}
    for _, q in ipairs(placed) do
      if q.pool ~= v.pool or overlap_in_time(v, q, held) then busy[#busy + 1] = q end
    end
    table.sort(busy, function(x, y) return x.offset < y.offset end)
    local off = 0
    for _, q in ipairs(busy) do
      if off + v.size <= q.offset then break end
      off = math.max(off, q.offset + q.size)
    end
    return off
  end
  for _, b in ipairs(order) do
    local v = view[b]
    if #b.lives == 0 or b.size == 0 then
      v.offset = 0
    else
      local off = holding and fit(v, true)
      if off and off + v.size > budget then off = nil end
      v.offset = off or fit(v, false)
      total = math.max(total, v.offset + v.size)
      placed[#placed + 1] = v
    end
    at[b] = v.offset
  end
  -- Needs: the generator's data and packing edges (every need that is not
  -- a reuse edge) plus every reuse edge, unreduced.
  local needs = {}
  local function add(i, j)
    needs[i] = needs[i] or {}
    needs[i][j] = true
  end
  for i, set in pairs(memplan.data_needs(ops)) do
    for j in pairs(set) do add(i, j) end
  end
  for _, b in ipairs(placed) do
    for _, iv in ipairs(b.lives) do
      for _, q in ipairs(placed) do
        if overlap_in_space(b, q) then
          local latest = latest_end_before(q, iv.first)
          if latest then add(iv.first, latest) end
        end
      end
    end
  end
  return { offsets = at, arena_bytes = total, waits = memplan.prune(ops, needs) }
end

return reference
