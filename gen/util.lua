-- Shared helpers for the generator stages: plan errors, sorted iteration,
-- did-you-mean suggestions. No stage keeps state between calls.
local util = {}

-- A plan error carries one line for the user; the driver prints it and exits 2.
local PlanError = {}
PlanError.__index = PlanError
PlanError.__tostring = function(e) return e.msg end

function util.plan_error(msg)
  error(setmetatable({ msg = msg }, PlanError), 0)
end

function util.is_plan_error(e)
  return getmetatable(e) == PlanError
end

-- Error tied to a field of the plan file: "<file>:<line>: <field>: <msg>".
-- ctx = { file = ..., source = ... } from gen/load; the line is found by
-- looking for the field's key in the source text (first occurrence).
function util.field_error(ctx, field, msg)
  local file = ctx and ctx.file or "plan"
  local line = ctx and util.find_line(ctx.source, field)
  local where = line and (file .. ":" .. line) or file
  util.plan_error(string.format("%s: %s: %s", where, field, msg))
end

function util.find_line(source, field)
  if not source or not field then return nil end
  local key = field:match("([%w_]+)$") or field
  local n = 0
  for line in (source .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local code = line:gsub("%-%-.*$", "")
    if code:find("%f[%w_]" .. key .. "%s*=") or code:find("[\"']" .. key .. "[\"']") then
      return n
    end
  end
  return nil
end

function util.sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local function levenshtein(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = (a:sub(i, i) == b:sub(j, j)) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- Closest candidate within edit distance 3, or nil.
function util.did_you_mean(word, candidates)
  local best, best_d
  for _, c in ipairs(candidates) do
    local d = levenshtein(word, c)
    if d <= 3 and (not best_d or d < best_d or (d == best_d and c < best)) then
      best, best_d = c, d
    end
  end
  return best
end

function util.ceil_div(a, b)
  return (a + b - 1) // b
end

function util.product(list, first, last)
  local p = 1
  for i = first or 1, last or #list do p = p * list[i] end
  return p
end

-- C identifier from a dotted name: "layers.0.attention.wq.weight" -> "LAYERS_0_ATTENTION_WQ_WEIGHT".
function util.c_ident(name)
  local id = name:gsub("[^%w]", "_"):upper()
  if id:match("^%d") then id = "_" .. id end
  return id
end

return util
