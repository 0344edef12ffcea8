-- A segment tree over n cells (1..n) holding entries that each cover a
-- range of cells, for the memory plan's sweeps over the op list (gen/
-- memplan.lua): insert an entry, remove it, and ask for the largest value
-- of the entries covering any cell of a range, each in O(log n)
-- (amortized). Values must be inserted in non-decreasing order, as a sweep
-- in op order gives them: each node keeps the entries stored on it as a
-- stack whose top is its largest, and a removal marks an entry dead,
-- dropping dead entries from the top.
local spantree = {}

local NONE = -1

-- Returns { insert = f(l, r, value) -> id, remove = f(id),
--           largest = f(l, r) -> value or nil, owner = f(l, r) -> id or nil,
--           size = f() -> live entries }.
function spantree.new(n)
  local sub = {}      -- node -> largest live value stored on the node or below it
  for node = 1, 8 * n + 2 do sub[node] = NONE end -- nodes below 4n, their children
  local stack = {}    -- node -> ids stored on the node, values non-decreasing
  local top = {}      -- node -> entries in its stack (dead ones above the top live one dropped)
  for node = 1, 8 * n + 2 do top[node] = 0 end
  local value = {}    -- id -> value
  local lo_of, hi_of = {}, {} -- id -> its cells
  local dead = {}     -- id -> true once removed
  local last, live = NONE, 0

  -- sub[node] from the node's own largest live value (dropping dead tops)
  -- and its children's.
  local function fix(node)
    local v = NONE
    local k = top[node]
    if k > 0 then
      local st = stack[node]
      while k > 0 and dead[st[k]] do st[k] = nil; k = k - 1 end
      top[node] = k
      if k > 0 then v = value[st[k]] end
    end
    local a, b = sub[2 * node], sub[2 * node + 1]
    if a > v then v = a end
    if b > v then v = b end
    sub[node] = v
  end

  local function place(node, lo, hi, l, r, id)
    if l <= lo and hi <= r then
      local st = stack[node]
      if not st then st = {}; stack[node] = st end
      local k = top[node] + 1
      st[k], top[node] = id, k
    else
      local mid = (lo + hi) // 2
      if l <= mid then place(2 * node, lo, mid, l, r, id) end
      if r > mid then place(2 * node + 1, mid + 1, hi, l, r, id) end
    end
    fix(node)
  end

  local function unplace(node, lo, hi, l, r)
    if not (l <= lo and hi <= r) then
      local mid = (lo + hi) // 2
      if l <= mid then unplace(2 * node, lo, mid, l, r) end
      if r > mid then unplace(2 * node + 1, mid + 1, hi, l, r) end
    end
    fix(node)
  end

  local function ask(node, lo, hi, l, r)
    if l <= lo and hi <= r then return sub[node] end
    -- entries on this node cover all of it, so some cell of l..r; its own
    -- largest is the top of its stack once fix has dropped the dead
    local best = NONE
    local k = top[node]
    if k > 0 then
      local st = stack[node]
      while k > 0 and dead[st[k]] do st[k] = nil; k = k - 1 end
      top[node] = k
      if k > 0 then best = value[st[k]] end
    end
    local mid = (lo + hi) // 2
    if l <= mid then
      local v = ask(2 * node, lo, mid, l, r)
      if v > best then best = v end
    end
    if r > mid then
      local v = ask(2 * node + 1, mid + 1, hi, l, r)
      if v > best then best = v end
    end
    return best
  end

  local t = {}

  -- Entries are numbered in insertion order (dense arrays, never holes).
  local count = 0
  function t.insert(l, r, v)
    if v < last then error("internal: spantree values must not decrease", 0) end
    count = count + 1
    last, live = v, live + 1
    value[count], lo_of[count], hi_of[count], dead[count] = v, l, r, false
    place(1, 1, n, l, r, count)
    return count
  end

  function t.remove(id)
    if dead[id] ~= false then return end
    dead[id], live = true, live - 1
    unplace(1, 1, n, lo_of[id], hi_of[id])
  end

  function t.largest(l, r)
    if live == 0 then return nil end
    local v = ask(1, 1, n, l, r)
    if v == NONE then return nil end
    return v
  end

  -- The first inserted live entry covering some cell of l..r (for
  -- messages), or nil: a linear scan of the live entries.
  function t.owner(l, r)
    for id = 1, count do
      if not dead[id] and lo_of[id] <= r and l <= hi_of[id] then return id end
    end
    return nil
  end

  function t.size() return live end

  return t
end

-- A tree of counts over n cells: add(l, r, delta) adds delta to cells
-- l..r, top(l, r) is the largest count among them; both O(log n). (The
-- memory plan's proof counts the open lives on each byte cell.)
function spantree.counter(n)
  local mx, add = {}, {} -- node -> largest count below it; count added to all of its cells
  for node = 1, 8 * n + 2 do mx[node], add[node] = 0, 0 end
  local function update(node, lo, hi, l, r, delta)
    if l <= lo and hi <= r then
      add[node] = add[node] + delta
      mx[node] = mx[node] + delta
      return
    end
    local mid = (lo + hi) // 2
    if l <= mid then update(2 * node, lo, mid, l, r, delta) end
    if r > mid then update(2 * node + 1, mid + 1, hi, l, r, delta) end
    local a, b = mx[2 * node], mx[2 * node + 1]
    mx[node] = add[node] + (a > b and a or b)
  end
  local function ask(node, lo, hi, l, r)
    if l <= lo and hi <= r then return mx[node] end
    local mid = (lo + hi) // 2
    local best = nil
    if l <= mid then best = ask(2 * node, lo, mid, l, r) end
    if r > mid then
      local v = ask(2 * node + 1, mid + 1, hi, l, r)
      if best == nil or v > best then best = v end
    end
    return add[node] + best
  end
  return {
    add = function(l, r, delta) update(1, 1, n, l, r, delta) end,
    top = function(l, r) return ask(1, 1, n, l, r) end,
  }
end

-- The same two structures over plain per-cell arrays: each operation is
-- O(r - l + 1) instead of O(log n), far cheaper when entries cover a few
-- cells (the memory plan picks these when every buffer covers at most
-- memplan.FLAT_SPAN cells).
function spantree.flat(n)
  local stack, top = {}, {} -- cell -> ids covering it, values non-decreasing; its length
  for c = 1, n do stack[c], top[c] = {}, 0 end
  local value, dead = {}, {}
  local count, last, live = 0, NONE, 0
  local t = {}
  function t.insert(l, r, v)
    if v < last then error("internal: spantree values must not decrease", 0) end
    count = count + 1
    last, live = v, live + 1
    value[count], dead[count] = v, false
    for c = l, r do
      local k = top[c] + 1
      stack[c][k], top[c] = count, k
    end
    return count
  end
  function t.remove(id)
    if dead[id] ~= false then return end
    dead[id], live = true, live - 1
  end
  function t.largest(l, r)
    if live == 0 then return nil end
    local best = NONE
    for c = l, r do
      local st, k = stack[c], top[c]
      while k > 0 and dead[st[k]] do st[k] = nil; k = k - 1 end
      top[c] = k
      if k > 0 and value[st[k]] > best then best = value[st[k]] end
    end
    if best == NONE then return nil end
    return best
  end
  function t.size() return live end
  return t
end

function spantree.flat_counter(n)
  local cnt = {}
  for c = 1, n do cnt[c] = 0 end
  return {
    add = function(l, r, delta)
      for c = l, r do cnt[c] = cnt[c] + delta end
    end,
    top = function(l, r)
      local best = cnt[l]
      for c = l + 1, r do if cnt[c] > best then best = cnt[c] end end
      return best
    end,
  }
end

return spantree
