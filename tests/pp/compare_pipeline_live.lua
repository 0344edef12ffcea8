-- Compares what torch.distributed.pipelining issued live on gloo
-- (tests/pp/torch_pipeline_record.py, one JSON per case) with what commplan
-- derives (gen/parallel/pp_sequence.lua over pp_schedule.derive, the stage
-- split of gen/parallel/pp_stages.lua and each stage's FSDP collectives from
-- the generator's plan of the stage's units).
--
-- Per case and global rank, the step's events in issue order must be equal:
-- every send / receive (peer global rank, numel, dtype, which coalesced batch)
-- and every collective (its kind, group ranks, input and output numel, dtype,
-- the action that issued it); nothing else may be issued in the step. Also
-- per case: torchtitan's split equals pp_stages', a multi-stage schedule's
-- own lowered list (pipeline_order_with_comms) equals derive's, and a case
-- torch refuses is refused by derive.
--   lua5.4 tests/pp/compare_pipeline_live.lua CASE.json...
-- Prints one line per schedule; exit 1 on the first difference.
local json = require("gen.json")
local pps = require("gen.parallel.pp_schedule")
local stages = require("gen.parallel.pp_stages")
local seq = require("gen.parallel.pp_sequence")
local util = require("gen.util")

local fmt = string.format
local DTYPE = { float32 = "fp32", bfloat16 = "bf16", float16 = "fp16", fp32 = "fp32", bf16 = "bf16", fp16 = "fp16" }

-- The recorder's tiny decoder, as commplan units (wrap order, the root last):
-- torchtitan's FSDP units per stage (tok_embeddings; every layer; norm and
-- lm_head together; the stage's root, which owns no parameter).
local function stage_units(mods, model)
  local units, tail = {}, nil
  local V, D = model.vocab, model.dim
  for _, name in ipairs(mods) do
    if name == "tok_embeddings" then
      units[#units + 1] = { name = name, params = { { name = name .. ".weight", shape = { V, D } } } }
    elseif name:match("^layers%.%d+$") then
      units[#units + 1] = { name = name, params = { { name = name .. ".weight", shape = { D, D } },
                                                    { name = name .. ".bias", shape = { D } } } }
    elseif name == "norm" then
      tail = tail or { name = "norm+lm_head", params = {} }
      table.insert(tail.params, 1, { name = "norm.weight", shape = { D } })
    elseif name == "lm_head" then
      tail = tail or { name = "norm+lm_head", params = {} }
      tail.params[#tail.params + 1] = { name = "lm_head.weight", shape = { V, D } }
    else
      error("unknown module " .. name)
    end
  end
  if tail then units[#units + 1] = tail end
  units[#units + 1] = { name = "root", params = {} }
  return units
end

local function batch_names()  -- batch ids -> ordinals of first appearance
  local map, n = {}, 0
  return function(b)
    if b == nil or b == json.null then return "-" end
    if not map[b] then n = n + 1; map[b] = n end
    return tostring(map[b])
  end
end

local function show(e, batch_of)
  if e.op == "send" or e.op == "recv" then
    return fmt("%s peer=%s numel=%s %s batch=%s @%s", e.op, tostring(e.peer), tostring(e.numel),
      DTYPE[e.dtype] or tostring(e.dtype), batch_of(e.batch), tostring(e.action))
  end
  local ranks = {}
  for i, r in ipairs(e.ranks or {}) do ranks[i] = tostring(r) end
  return fmt("%s ranks=%s in=%s out=%s %s @%s", e.op, table.concat(ranks, ","), tostring(e.in_numel),
    tostring(e.out_numel), DTYPE[e.dtype] or tostring(e.dtype), tostring(e.action))
end

local function has_mas(c) return c.max_active_stages ~= nil and c.max_active_stages ~= json.null end

local function replicas(c) return (c.dp_replicate ~= nil and c.dp_replicate ~= json.null) and c.dp_replicate or 1 end

local function case_name(c)
  return fmt("%s pp=%d %sdp_shard=%d microbatches=%d%s%s", c.schedule, c.pp,
    replicas(c) > 1 and fmt("dp_replicate=%d ", replicas(c)) or "", c.dp_shard, c.microbatches,
    has_mas(c) and fmt(" max_active_stages=%d", c.max_active_stages) or "",
    c.reshard_after_forward == true and " reshard_after_forward_policy=always" or "")
end

local function check_case(c)
  local ok, sched = pcall(pps.derive, { schedule = c.schedule, pp = c.pp, microbatches = c.microbatches,
                                        stages_per_rank = c.stages_per_rank,
                                        max_active_stages = has_mas(c) and c.max_active_stages or nil })
  if c.refused then
    if ok then return fmt("torch refuses (%s), commplan derives a schedule", c.refused) end
    if not util.is_plan_error(sched) then return "derive raised a non-plan error: " .. tostring(sched) end
    return nil, { refused = true }
  end
  if c.failed then return "the live run failed: " .. c.failed end
  if not ok then return "commplan refuses (" .. tostring(sched) .. "), torch ran it" end
  if c.reshard_after_forward == true then
    -- torchtitan's "always": commplan refuses a schedule whose last stage
    -- ends on a split backward (gen/parallel/pp_report.lua), as torch then
    -- reduces none of its gradients: the recording must show that
    local dropped = false
    for _, r in ipairs(c.ranks) do
      if type(r.no_grad) == "table" and #r.no_grad > 0 then dropped = true end
    end
    if seq.last_stage_ends_split(sched) ~= dropped then
      return dropped and "torch left parameters without a gradient, which commplan plans as reduced"
        or "commplan refuses (the last stage ends on a split backward), torch reduced every gradient"
    end
    if dropped then return nil, { refused = true, dropped = true } end
  end
  local model = c.model
  local num = stages.count(nil, { pp = c.pp, schedule = c.schedule, n_layers = model.n_layers })
  local split = stages.split(nil, num, model.n_layers)
  for s = 1, num do
    local a, b = table.concat(split[s], " "), table.concat(c.split[s] or {}, " ")
    if a ~= b then return fmt("stage %d modules: commplan %s, torchtitan %s", s - 1, a, b) end
  end
  local mb = model.batch // c.microbatches
  local per_stage = {}
  local expected = seq.expected(sched, {
    dp_shard = c.dp_shard, dp_replicate = replicas(c), act_numel = mb * model.seq * model.dim, act_dtype = "fp32",
    reshard_after_forward = c.reshard_after_forward == true,
    stage_fsdp = function(s)
      per_stage[s] = per_stage[s] or require("gen.pipeline").stage_fsdp_from_plan(stage_units(split[s + 1], model), c.dp_shard,
        c.microbatches, "fp32", replicas(c))
      return per_stage[s]
    end,
  })
  local p2p, colls = 0, 0
  for _, r in ipairs(c.ranks) do
    local g = r.rank
    local mine = {}
    for _, s in ipairs(sched.lowered[r.pp_rank + 1]) do
      if pps.IS_COMPUTE[s.type] then mine[s.stage] = true end
    end
    for _, s in ipairs(r.stages) do
      if not mine[s] then return fmt("rank %d runs stage %d, which commplan puts on pp rank %d", g, s, sched.stage_to_rank[s]) end
    end
    if r.lowered then
      for i, a in ipairs(sched.lowered[r.pp_rank + 1]) do
        if pps.format_action(a) ~= r.lowered[i] then
          return fmt("rank %d: the schedule's lowered action %d is %s, commplan's %s", g, i - 1,
            tostring(r.lowered[i]), pps.format_action(a))
        end
      end
      if #r.lowered ~= #sched.lowered[r.pp_rank + 1] then
        return fmt("rank %d: the schedule lowers %d actions, commplan %d", g, #r.lowered, #sched.lowered[r.pp_rank + 1])
      end
    end
    local got = {}
    for _, e in ipairs(r.events) do if e.phase == "step" then got[#got + 1] = e end end
    local want = expected[g + 1]
    local bg, bw = batch_names(), batch_names()
    for i = 1, math.max(#got, #want) do
      local x = got[i] and show(got[i], bg) or "(nothing)"
      local y = want[i] and show(want[i], bw) or "(nothing)"
      if x ~= y then
        local where = fmt("rank %d (pp rank %d, stages %s) step event %d", g, r.pp_rank,
          table.concat(r.stages, ","), i - 1)
        return fmt("%s: expected %s%s, got %s (torch issued it during %q; %d events recorded, %d expected)",
          where, y, want[i] and want[i].unit and (" [" .. want[i].unit .. "]") or "",
          x, got[i] and got[i].action or "", #got, #want)
      end
      if want[i].op == "send" or want[i].op == "recv" then p2p = p2p + 1 else colls = colls + 1 end
    end
  end
  return nil, { p2p = p2p, colls = colls }
end

local function main(files)
  local order, by = {}, {}
  for _, path in ipairs(files) do
    local fh = assert(io.open(path, "rb"))
    local c = json.decode(fh:read("a"))
    fh:close()
    local diff, res = check_case(c)
    if diff then
      print(fmt("pp-run: DIFFERENCE %s (%s): %s", case_name(c), path, diff))
      return 1
    end
    local t = by[c.schedule]
    if not t then
      t = { cases = 0, p2p = 0, colls = 0, refused = {}, dropped = {}, torch = c.torch }
      by[c.schedule] = t; order[#order + 1] = c.schedule
    end
    if res.dropped then
      t.dropped[#t.dropped + 1] = case_name(c):gsub("^%S+ ", "")
    elseif res.refused then
      t.refused[#t.refused + 1] = case_name(c):gsub("^%S+ ", "")
    else
      t.cases, t.p2p, t.colls = t.cases + 1, t.p2p + res.p2p, t.colls + res.colls
    end
  end
  local idx = {}
  for i, s in ipairs(pps.SCHEDULES) do idx[s] = i end
  table.sort(order, function(a, b) return (idx[a] or 99) < (idx[b] or 99) end)
  for _, s in ipairs(order) do
    local t = by[s]
    print(fmt("pp-run: %s %d cases: p2p sequences equal (%d ops), FSDP collectives equal (%d)%s%s", s, t.cases, t.p2p,
      t.colls, #t.refused > 0 and fmt("; refused by torch and commplan: %s", table.concat(t.refused, ", ")) or "",
      #t.dropped > 0 and fmt("; torch reduced no gradient of the last stage and commplan refuses: %s",
        table.concat(t.dropped, ", ")) or ""))
  end
  return 0
end

if arg and arg[0] and arg[0]:match("compare_pipeline_live%.lua$") then
  os.exit(main(arg))
end

return { check_case = check_case, stage_units = stage_units }
