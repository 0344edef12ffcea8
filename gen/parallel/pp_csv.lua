-- torch's CSV schedule format (torch.distributed.pipelining 2.15's
-- _dump_csv / _load_csv), for gen/parallel/pp_schedule.lua's action lists:
-- write one row per rank, read torch's (or our) CSV back, and import a
-- compute-only schedule, lowered and checked. "schedules.py:N" is a line of
-- torch 2.15.0's torch/distributed/pipelining/schedules.py.
local util = require("gen.util")
local pps = require("gen.parallel.pp_schedule")

local M = {}

local fmt, max = string.format, math.max
local key, err = pps.key, pps.err
local COMPUTE = pps.IS_COMPUTE
local function parts(a) return a.sub or { a } end

-- _dump_csv (schedules.py:2793, 3416): one row per rank, csv.writer's
-- defaults (comma, "\r\n", None as an empty cell; no cell needs quoting).
function M.to_csv(lists)
  local rows = {}
  for r, list in ipairs(lists) do
    local cells = {}
    for i = 1, #list do cells[i] = key(list[i]) end
    rows[r] = table.concat(cells, ",") .. "\r\n"
  end
  return table.concat(rows)
end

-- The rows of a CSV written by torch (or by M.to_csv) as action lists;
-- quoted cells are accepted.
function M.from_csv(text)
  local lists = {}
  for line in (text:gsub("\r\n", "\n") .. (text:sub(-1) == "\n" and "" or "\n")):gmatch("([^\n]*)\n") do
    local list, i = {}, 1
    while i <= #line + 1 do
      local cell
      if line:sub(i, i) == '"' then
        local j, buf = i + 1, {}
        while true do
          local c = line:sub(j, j)
          if c == "" then err(fmt("CSV row %d: unterminated quote; fix the file", #lists)) end
          if c == '"' then
            if line:sub(j + 1, j + 1) == '"' then buf[#buf + 1] = '"'; j = j + 2 else j = j + 1; break end
          else buf[#buf + 1] = c; j = j + 1 end
        end
        cell, i = table.concat(buf), j + 1
      else
        local j = line:find(",", i, true) or (#line + 1)
        cell, i = line:sub(i, j - 1), j + 1
      end
      list[#list + 1] = pps.parse_action(cell)
    end
    lists[#lists + 1] = list
  end
  return lists
end

-- _validate_schedule (schedules.py:2506): every stage runs on one rank,
-- B/I after F, W after I, n forwards and n backwards per stage. Returns
-- stage_to_rank and num_stages.
local function validate_schedule(lists, n)
  local s2r, num_stages = {}, 0
  local seen = {}
  for r, list in ipairs(lists) do
    for i, a in ipairs(list) do
      if a then
        for _, p in ipairs(parts(a)) do
          if not COMPUTE[p.type] or p.type == "OVERLAP_F_B" then
            err(fmt("rank %d step %d: %s is not a compute action; a compute_only schedule holds F, I, W, B and OVERLAP_F_B only",
              r - 1, i - 1, key(p)))
          end
          local s = p.stage
          -- a microbatch past the step's names itself (not as a B before its F)
          if n and (p.mb < 0 or p.mb >= n) then
            err(fmt("rank %d step %d: %s names microbatch %d, and the step has microbatches 0..%d; fix the cell or "
              .. "pipeline.microbatches", r - 1, i - 1, key(p), p.mb, n - 1))
          end
          if s2r[s] and s2r[s] ~= r - 1 then
            err(fmt("rank %d step %d: stage %d is also on rank %d; put each stage on one rank", r - 1, i - 1, s, s2r[s]))
          end
          s2r[s] = r - 1
          num_stages = max(num_stages, s + 1)
          local st = seen[s] or { F = {}, B = {}, I = {}, W = {} }
          seen[s] = st
          local need = (p.type == "B" or p.type == "I") and "F" or (p.type == "W" and "I")
          if need and not st[need][p.mb] then
            err(fmt("rank %d step %d: %s runs before %s%s%d; reorder the schedule", r - 1, i - 1, key(p), s, need, p.mb))
          end
          st[p.type][p.mb] = true
        end
      end
    end
  end
  for s = 0, num_stages - 1 do
    local st = seen[s]
    if not st then err(fmt("stage %d appears on no rank; give every stage 0..%d its actions", s, num_stages - 1)) end
    local function count(t) local c = 0; for _ in pairs(t) do c = c + 1 end; return c end
    local f, b, i, w = count(st.F), count(st.B), count(st.I), count(st.W)
    if f ~= n then err(fmt("stage %d runs %d forwards, expected microbatches = %d", s, f, n)) end
    if i ~= w or b + (i + w) // 2 ~= n then
      err(fmt("stage %d runs B=%d I=%d W=%d backwards, expected %d in all with I == W", s, b, i, w, n))
    end
  end
  return s2r, num_stages
end

-- A schedule from torch's CSV format, as _PipelineScheduleRuntime._load_csv
-- (schedules.py:3387) takes it: format "compute_only" rows are validated and
-- lowered; "compute_comms" rows are taken as lowered. The rank count is the
-- row count. opts.microbatches defaults to stage 0's forward count.
function M.import_csv(text, opts)
  opts = opts or {}
  local lists = M.from_csv(text)
  if #lists == 0 then err("CSV has no rows; one row per pipeline rank") end
  local format = opts.format or "compute_only"
  local n = opts.microbatches
  if not n then
    n = 0
    for _, list in ipairs(lists) do
      for _, a in ipairs(list) do
        if a then for _, p in ipairs(parts(a)) do if p.stage == 0 and p.type == "F" then n = n + 1 end end end
      end
    end
  end
  if format == "compute_comms" then
    local s2r, num_stages = {}, 0
    for r, list in ipairs(lists) do
      for i, a in ipairs(list) do
        if not a then err(fmt("rank %d step %d: empty cell in a compute_comms schedule; remove it", r - 1, i - 1)) end
        for _, p in ipairs(parts(a)) do
          if COMPUTE[p.type] then s2r[p.stage] = r - 1; num_stages = max(num_stages, p.stage + 1) end
        end
      end
    end
    return { pp = #lists, microbatches = n, num_stages = num_stages, stage_to_rank = s2r, lowered = lists }
  elseif format ~= "compute_only" then
    err(fmt("format = %s; use \"compute_only\" or \"compute_comms\"", util.show(format)))
  end
  local s2r, num_stages = validate_schedule(lists, n)
  return { pp = #lists, microbatches = n, num_stages = num_stages, stage_to_rank = s2r, compute = lists,
           lowered = pps.lower_runtime(lists, s2r, num_stages, n, opts) }
end

return M
