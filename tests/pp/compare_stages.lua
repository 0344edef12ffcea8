-- tests/pp/compare_stages.lua DUMP: gen/parallel/pp_stages.lua against
-- torchtitan's split (tests/pp/titan_stages.py's JSON lines): the same
-- stage count, modules per stage and stages per rank, and a plan error
-- exactly where torchtitan raises. Exits 1 on the first difference.
package.path = "./?.lua;" .. package.path
local json = require("gen.json")
local util = require("gen.util")
local stages = require("gen.parallel.pp_stages")

local function derive(c)
  local lps = c.layers_per_stage ~= json.null and c.layers_per_stage or nil
  local n = stages.count(nil, { pp = c.pp, schedule = c.schedule, n_layers = c.n_layers, layers_per_stage = lps,
                                first_stage_less_layers = c.first_stage_less_layers,
                                last_stage_less_layers = c.last_stage_less_layers })
  local split = stages.split(nil, n, c.n_layers, c.first_stage_less_layers, c.last_stage_less_layers)
  local ranks = {}
  for r = 0, c.pp - 1 do ranks[r + 1] = stages.of_rank(r, c.pp, n, c.schedule) end
  return { stages = n, split = split, ranks = ranks }
end

local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  if #a ~= #b then return false end
  for i = 1, #a do if not same(a[i], b[i]) then return false end end
  return true
end

local fh = assert(io.open(arg[1]))
local n, refused = 0, 0
for line in fh:lines() do
  local c = json.decode(line)
  local ok, got = pcall(derive, c)
  local label = string.format("%s pp=%d n_layers=%d layers_per_stage=%s weights=%d/%d", c.schedule, c.pp, c.n_layers,
    tostring(c.layers_per_stage ~= json.null and c.layers_per_stage or "default"), c.first_stage_less_layers,
    c.last_stage_less_layers)
  if c.error then
    if ok then
      print("stages: DIFF " .. label .. ": torchtitan raises " .. c.error .. ", commplan splits it into "
        .. got.stages .. " stages")
      os.exit(1)
    end
    if not util.is_plan_error(got) then print("stages: DIFF " .. label .. ": internal error " .. tostring(got)); os.exit(1) end
    refused = refused + 1
  else
    if not ok then print("stages: DIFF " .. label .. ": commplan refuses (" .. tostring(got) .. "), torchtitan splits it"); os.exit(1) end
    for _, k in ipairs({ "stages", "split", "ranks" }) do
      if not same(got[k], c[k]) then
        print("stages: DIFF " .. label .. ": " .. k .. " " .. json.encode(got[k]) .. ", torchtitan " .. json.encode(c[k]))
        os.exit(1)
      end
    end
  end
  n = n + 1
end
print(string.format("stages: %d cases match torchtitan's split (%d refused by both)", n, refused))
