-- The advisor's rankings, computed once per run of tests/lua/run.lua.
--
-- Several suites rank the same shipped plan with the same options
-- (test_audit ranks mixtral8x7b, llama8b and llama8b_cp, test_agree then
-- asks make advise's report of each, which ranks them again): ~20 s of the
-- suite's ~100 s spent repeating a pure function. install() wraps
-- advisor.rank so that a ranking of the same plan (the loaded table, field
-- for field, and its source) under the same options (world_size,
-- gpus_per_node, global_batch: the only ones rank reads) is computed once
-- and handed out as a deep copy (a caller may change its copy). A ranking
-- without the pipeline section (no_pipeline) is the one with it less that
-- section; asked with it after one without, only advisor.pipeline runs,
-- as advisor.rank itself would run it last. Every suite still runs alone
-- without it (lua5.4 -e '... require("test_agree") ...').
local M = {}

-- A deterministic text of a plain value: tables with sorted keys,
-- functions and other non-plain values by identity (never equal across
-- loads, so such a table is simply never shared), cycles cut.
local function ser(v, out, seen)
  local t = type(v)
  if t == "table" then
    if seen[v] then out[#out + 1] = "<cycle>"; return end
    seen[v] = true
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b)
      local ta, tb = type(a), type(b)
      if ta ~= tb then return ta < tb end
      if ta == "number" or ta == "string" then return a < b end
      return tostring(a) < tostring(b)
    end)
    out[#out + 1] = "{"
    for _, k in ipairs(keys) do
      ser(k, out, seen); out[#out + 1] = "="; ser(v[k], out, seen); out[#out + 1] = ","
    end
    out[#out + 1] = "}"
    seen[v] = nil
  elseif t == "string" then
    out[#out + 1] = string.format("%q", v)
  elseif t == "number" then
    out[#out + 1] = math.type(v) == "integer" and string.format("%d", v) or string.format("%.17g", v)
  elseif t == "boolean" or t == "nil" then
    out[#out + 1] = tostring(v)
  else
    out[#out + 1] = "<" .. tostring(v) .. ">"
  end
end

local function key_of(loaded, opts)
  local out = {}
  ser(loaded, out, {})
  out[#out + 1] = "|"
  ser({ opts.world_size, opts.gpus_per_node, opts.global_batch }, out, {})
  return table.concat(out)
end

-- A deep copy that keeps shared references shared (results[i].cand is
-- the loaded plan's copy each mesh keeps, and so on).
local function copy(v, seen)
  if type(v) ~= "table" then return v end
  if seen[v] then return seen[v] end
  local c = {}
  seen[v] = c
  for k, x in pairs(v) do c[copy(k, seen)] = copy(x, seen) end
  return setmetatable(c, getmetatable(v))
end

M.hits, M.misses = 0, 0

function M.install()
  local advisor = require("gen.advisor")
  if advisor.__memo_rank then return end
  local rank = advisor.rank
  local cache = {}
  advisor.__memo_rank = rank
  advisor.rank = function(loaded, opts)
    opts = opts or {}
    local key = key_of(loaded, opts)
    local e = cache[key]
    if not e then
      M.misses = M.misses + 1
      local o = copy(opts, {})
      o.no_pipeline = true
      e = { res = copy(rank(loaded, o), {}) }
      cache[key] = e
    else
      M.hits = M.hits + 1
    end
    local res = copy(e.res, {})
    if not opts.no_pipeline then
      if e.pipeline == nil then
        -- (advisor.rank's last step, on the ranking it has just made)
        e.pipeline = { advisor.pipeline(loaded, copy(e.res, {})) }
      end
      res.pipeline = copy(e.pipeline[1], {})
    end
    return res
  end
end

return M
