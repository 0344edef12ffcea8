-- Compares gen/parallel/pp_schedule.lua with a dump of torch's schedules
-- (tests/pp/torch_schedule_dump.py). As a module: compare(dump) -> counts
-- per schedule, or nil and the first difference. As a script:
--   lua5.4 tests/pp/compare.lua DUMP.json   (exit 1 on the first difference)
local pps = require("gen.parallel.pp_schedule")
local json = require("gen.json")
local util = require("gen.util")

local fmt = string.format

local function strings(list)
  local out = {}
  for i, a in ipairs(list) do out[i] = pps.format_action(a) end
  return out
end

local function computes(list)  -- the compute actions of a lowered list, None dropped
  local out = {}
  for _, a in ipairs(list) do if a and pps.IS_COMPUTE[a.type] then out[#out + 1] = pps.format_action(a) end end
  return out
end

local function list_diff(got, want)  -- first index where two string lists differ, or nil
  for i = 1, math.max(#got, #want) do
    if got[i] ~= want[i] then
      return fmt("index %d: lua %s, torch %s (lengths %d, %d)", i - 1, tostring(got[i]), tostring(want[i]), #got, #want)
    end
  end
end

local function groups_of(list)  -- 0-based indices of each batch group
  local out, at = {}, {}
  for i, a in ipairs(list) do
    if a.batch then
      if not at[a.batch] then at[a.batch] = #out + 1; out[#out + 1] = {} end
      local g = out[at[a.batch]]
      g[#g + 1] = i - 1
    end
  end
  return out
end

local function case_name(c)
  return fmt("%s pp=%d microbatches=%d stages_per_rank=%d%s", c.schedule, c.pp, c.microbatches, c.stages_per_rank,
    c.defer_pp_recv and " defer_pp_recv" or "")
end

local function check_case(c)
  local ok, res = pcall(pps.derive, { schedule = c.schedule, pp = c.pp, microbatches = c.microbatches,
                                      stages_per_rank = c.stages_per_rank, defer_pp_recv = c.defer_pp_recv })
  if c.error then
    if ok then return fmt("torch refuses (%s), lua accepts", c.error) end
    if not util.is_plan_error(res) then return "lua raised a non-plan error: " .. tostring(res) end
    return nil, "refused"
  end
  if not ok then return "lua refuses (" .. tostring(res) .. "), torch accepts" end
  for s = 0, res.num_stages - 1 do
    if res.stage_to_rank[s] ~= c.stage_to_rank[s + 1] then
      return fmt("stage_to_rank[%d]: lua %s, torch %s", s, tostring(res.stage_to_rank[s]), tostring(c.stage_to_rank[s + 1]))
    end
  end
  for r = 1, c.pp do
    local d = list_diff(strings(res.torch_order[r]), c.compute[r])
    if d then return fmt("rank %d pipeline_order %s", r - 1, d) end
    d = list_diff(strings(res.lowered[r]), c.lowered[r])
    if d then return fmt("rank %d lowered %s", r - 1, d) end
    d = list_diff(computes(res.compute[r]), computes(res.lowered[r]))
    if d then return fmt("rank %d compute vs the lowered list's compute %s", r - 1, d) end
    local g, want = groups_of(res.lowered[r]), c.groups[r]
    if #g ~= #want then return fmt("rank %d: lua %d batch groups, torch %d", r - 1, #g, #want) end
    for k = 1, #g do
      d = list_diff(g[k], want[k])
      if d then return fmt("rank %d batch group %d %s", r - 1, k - 1, d) end
    end
  end
  if c.csv_compute and pps.to_csv(res.torch_order) ~= c.csv_compute then return "to_csv(pipeline_order) differs from _dump_csv" end
  -- Larger cases: the same code, only more time.
  if c.csv_compute and c.pp * c.stages_per_rank * c.microbatches <= 256 then
    local back = pps.from_csv(c.csv_compute)
    for r = 1, c.pp do
      local d = list_diff(strings(back[r]), c.compute[r])
      if d then return fmt("from_csv rank %d %s", r - 1, d) end
    end
    local imported = pps.import_csv(c.csv_compute, { microbatches = c.microbatches })
    for r = 1, c.pp * c.stages_per_rank * c.microbatches <= 256 and c.pp or 0 do
      local d = list_diff(strings(imported.lowered[r]), c.lowered[r])
      if d then return fmt("import_csv rank %d lowered %s", r - 1, d) end
    end
  end
  -- defer_pp_recv's lists deadlock under the "rank" and "peer" models
  -- (docs/pipeline.md); they are proved under "none", as torch simulates them.
  local model = c.defer_pp_recv and "none" or "rank"
  local proved, why = pps.prove_p2p(res.lowered, res.stage_to_rank, res.num_stages, { fifo = model })
  if not proved then return "the P2P proof fails on torch's own schedule: " .. why end
  if c.torch_simulate ~= "ok" and c.torch_simulate ~= "skipped" then
    return "torch's _simulate_comms_compute fails: " .. tostring(c.torch_simulate)
  end
  return nil, "matched"
end

local function compare(dump)
  local counts, order = {}, {}
  for _, c in ipairs(dump.cases) do
    local diff, how = check_case(c)
    if diff then return nil, case_name(c) .. ": " .. diff end
    if not counts[c.schedule] then counts[c.schedule] = { matched = 0, refused = 0 }; order[#order + 1] = c.schedule end
    counts[c.schedule][how] = counts[c.schedule][how] + 1
  end
  return counts, order
end

if arg and arg[0] and arg[0]:match("compare%.lua$") and arg[1] then
  local fh = assert(io.open(arg[1], "rb"))
  local dump = json.decode(fh:read("a"))
  fh:close()
  local counts, order = compare(dump)
  if not counts then
    print("pp-live: DIFFERENCE " .. order)
    os.exit(1)
  end
  local total_m, total_r = 0, 0
  for _, name in ipairs(order) do
    local c = counts[name]
    print(fmt("pp-live: %-22s %3d cases match torch %s, %2d refused by both", name, c.matched, dump.torch, c.refused))
    total_m, total_r = total_m + c.matched, total_r + c.refused
  end
  print(fmt("pp-live: %d cases match, %d refused by both, 0 differences (torch %s)", total_m, total_r, dump.torch))
  os.exit(0)
end

return { compare = compare, check_case = check_case }
