-- A segment tree over n cells (1..n) holding entries that each cover a
-- range of cells, for the memory plan's sweeps over the op list (gen/
-- memplan.lua): insert an entry, remove it, and ask for the entry of
-- largest value covering any cell of a range, each in O(log n) (amortized).
-- Values must be inserted in non-decreasing order, as a sweep in op order
-- gives them: each node keeps the entries stored on it as a stack whose
-- top is its largest, and a removal marks an entry dead, dropping dead
-- entries from the top.
local spantree = {}

local Tree = {}
Tree.__index = Tree

local NONE = -1

function spantree.new(n)
  -- sub[node]: the largest live value stored on the node or below it.
  return setmetatable({ n = n, sub = {}, stack = {}, value = {}, alive = {}, last = NONE }, Tree)
end

-- The largest live value stored on the node itself (NONE if none), after
-- dropping dead entries from its top.
function Tree:own(node)
  local st = self.stack[node]
  if not st then return NONE, nil end
  local alive = self.alive
  while #st > 0 and not alive[st[#st]] do st[#st] = nil end
  local top = st[#st]
  if top == nil then return NONE, nil end
  return self.value[top], top
end

function Tree:fix(node, leaf)
  local v = self:own(node)
  if not leaf then
    local sub = self.sub
    local a, b = sub[2 * node] or NONE, sub[2 * node + 1] or NONE
    if a > v then v = a end
    if b > v then v = b end
  end
  self.sub[node] = v
end

local function place(self, node, lo, hi, l, r, id)
  if l <= lo and hi <= r then
    local st = self.stack[node]
    if not st then st = {}; self.stack[node] = st end
    st[#st + 1] = id
  else
    local mid = (lo + hi) // 2
    if l <= mid then place(self, 2 * node, lo, mid, l, r, id) end
    if r > mid then place(self, 2 * node + 1, mid + 1, hi, l, r, id) end
  end
  self:fix(node, lo == hi)
end

-- Entry id (any key not used before) with value covers cells l..r.
function Tree:insert(id, l, r, value)
  if value < self.last then error("internal: spantree values must not decrease", 0) end
  self.last = value
  self.value[id], self.alive[id] = value, { l, r }
  place(self, 1, 1, self.n, l, r, id)
end

local function unplace(self, node, lo, hi, l, r)
  if not (l <= lo and hi <= r) then
    local mid = (lo + hi) // 2
    if l <= mid then unplace(self, 2 * node, lo, mid, l, r) end
    if r > mid then unplace(self, 2 * node + 1, mid + 1, hi, l, r) end
  end
  self:fix(node, lo == hi)
end

function Tree:remove(id)
  local range = self.alive[id]
  if not range then return end
  self.alive[id] = nil
  unplace(self, 1, 1, self.n, range[1], range[2])
  self.value[id] = nil
end

-- The entry whose value is sub[node]: down the children that hold it.
local function argmax(self, node, lo, hi)
  local want, sub = self.sub[node], self.sub
  while true do
    local v, id = self:own(node)
    if v == want then return v, id end
    local mid = (lo + hi) // 2
    if (sub[2 * node] or NONE) == want then node, hi = 2 * node, mid
    else node, lo = 2 * node + 1, mid + 1 end
  end
end

local function ask(self, node, lo, hi, l, r)
  if l <= lo and hi <= r then
    if (self.sub[node] or NONE) == NONE then return NONE, nil end
    return argmax(self, node, lo, hi)
  end
  -- entries on this node cover all of it, so some cell of l..r
  local best, best_id = self:own(node)
  local mid = (lo + hi) // 2
  if l <= mid then
    local v, id = ask(self, 2 * node, lo, mid, l, r)
    if v > best then best, best_id = v, id end
  end
  if r > mid then
    local v, id = ask(self, 2 * node + 1, mid + 1, hi, l, r)
    if v > best then best, best_id = v, id end
  end
  return best, best_id
end

-- The live entry of largest value covering any cell of l..r: value, id;
-- or nil when none does.
function Tree:largest(l, r)
  local v, id = ask(self, 1, 1, self.n, l, r)
  if v == NONE then return nil end
  return v, id
end

return spantree
