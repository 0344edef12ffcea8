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

-- The bounds a CSV is held to before any of it is lowered (opts of
-- from_csv / import_csv): its rows (opts.pp, the plan's pipeline ranks),
-- the cells of a row (a rank's steps: every compute action of the step is
-- at most 3 x microbatches x stages, idle steps among them; 8 x leaves room
-- for a compute_comms row's transfers and FSDP actions), each cell's bytes
-- (pp_schedule.MAX_ACTION), and stage and microbatch numbers
-- (opts.num_stages, opts.microbatches). Without the plan's counts, the
-- generator's own bound on them (util.LIMITS.pp_actions).
local function bounds(opts)
  local LIM = util.LIMITS
  local n, s = opts.microbatches, opts.num_stages
  local steps = (n and s) and util.mul_within(n, s, LIM.pp_actions) or LIM.pp_actions
  return { rows = opts.pp or LIM.pp_actions, cells = 8 * steps, stages = s or LIM.pp_actions,
           microbatches = n or LIM.pp_actions }
end

-- The rows of a CSV written by torch (or by M.to_csv) as action lists;
-- quoted cells are accepted. opts.file names the CSV in refusals
-- ("FILE:ROW:COLUMN: ..."; default "CSV"); no refusal quotes the file's
-- text (a plan may name any file: its contents must not reach a log).
function M.from_csv(text, opts)
  opts = opts or {}
  local file = opts.file or "CSV"
  local lim = bounds(opts)
  local body = text:gsub("\r\n", "\n") .. (text:sub(-1) == "\n" and "" or "\n")
  local rows = select(2, body:gsub("\n", "\n"))
  if rows > lim.rows or (opts.pp and rows ~= opts.pp) then
    err(fmt("%s has %d rows; %s", file, rows, opts.pp and fmt("the plan's pipeline has %d ranks (parallel.pp), "
      .. "one row each: write the CSV for this plan", opts.pp) or fmt("at most %d (one per pipeline rank)", lim.rows)))
  end
  local lists = {}
  for line in body:gmatch("([^\n]*)\n") do
    local row = #lists + 1
    local function bad(col, why) err(fmt("%s:%d:%d: %s", file, row, col, why)) end
    local list, i = {}, 1
    while i <= #line + 1 do
      local col = #list + 1
      if col > lim.cells then
        bad(col, fmt("more than %d cells in a row, more steps than a rank runs %s", lim.cells,
          (opts.microbatches and opts.num_stages) and "at the plan's microbatches x stages" or "in the largest "
          .. "pipeline the generator plans"))
      end
      local cell
      if line:sub(i, i) == '"' then
        local j, buf = i + 1, {}
        while true do
          local c = line:sub(j, j)
          if c == "" then bad(col, "unterminated quote") end
          if c == '"' then
            if line:sub(j + 1, j + 1) == '"' then buf[#buf + 1] = '"'; j = j + 2 else j = j + 1; break end
          else buf[#buf + 1] = c; j = j + 1 end
          if #buf > pps.MAX_ACTION then
            bad(col, fmt("a quoted cell of more than %d bytes; an action has at most %d", pps.MAX_ACTION, pps.MAX_ACTION))
          end
        end
        cell, i = table.concat(buf), j + 1
      else
        local j = line:find(",", i, true) or (#line + 1)
        cell, i = line:sub(i, j - 1), j + 1
      end
      local a, why = pps.try_parse_action(cell)
      if a == nil then bad(col, why) end
      -- numbers past the plan's, before any work that counts up to them
      for _, p in ipairs(a and parts(a) or {}) do
        if p.stage >= lim.stages then
          bad(col, fmt("%s names stage %d, and %s 0..%d", key(p), p.stage, opts.num_stages and "the plan has stages"
            or "the generator plans stages", lim.stages - 1))
        end
        if p.mb and p.mb >= lim.microbatches then
          bad(col, fmt("%s names microbatch %d, and %s 0..%d", key(p), p.mb, opts.microbatches
            and "the step has microbatches" or "the generator plans microbatches", lim.microbatches - 1))
        end
      end
      list[col] = a
    end
    lists[row] = list
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
          -- (torch's validation counts distinct actions, so a repeated one
          -- would run twice; the step has each once)
          if st[p.type][p.mb] then
            err(fmt("rank %d step %d: %s runs a second time; give each action of each stage and microbatch once",
              r - 1, i - 1, key(p)))
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
  local lists = M.from_csv(text, opts)
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
