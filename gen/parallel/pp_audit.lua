-- A pipeline schedule's predicted step (issue 22, item 4): every PP rank
-- runs its lowered action list (gen/parallel/pp_schedule.lua) in order on
-- one compute stream; a receive waits for its send plus the transfer; a
-- rank idles only where its list says wait. From that: the step, each
-- rank's busy time, the bubble fraction (1 - busy / (pp x step)), and each
-- stage's activations in flight (forwards whose backward has not run: what
-- the schedule makes the stage keep). Pure functions.
--
-- Modelled: compute per action (F, B = I + W, I, W, OVERLAP_F_B as its two
-- halves one after the other), sends issued without blocking (torch's isend; the transfer
-- time after the issue), receives posted without blocking (irecv) and
-- waited for by the compute action that takes their data,
-- REDUCE_GRAD running beside compute until its WAIT_REDUCE_GRAD, and the
-- single-stage runtimes' coalesced send+receive pairs (a batch's sends go
-- out before any of its receives blocks). Not modelled: FSDP's all-gathers
-- (UNSHARD: taken as prefetched, no reshard after forward under PP), link
-- contention between p2p and FSDP traffic, and the transfer's completion
-- holding back a WAIT_SEND (sends are buffered). The bubble counts the
-- wait for the last gradient reduction too.
local audit = {}

-- The message a send or receive carries: direction, from stage, to stage,
-- microbatch.
local function msg_key(a)
  local t = a.type
  if t == "SEND_F" then return "F" .. a.stage .. ">" .. (a.stage + 1) .. ":" .. a.mb end
  if t == "RECV_F" then return "F" .. (a.stage - 1) .. ">" .. a.stage .. ":" .. a.mb end
  if t == "SEND_B" then return "B" .. a.stage .. ">" .. (a.stage - 1) .. ":" .. a.mb end
  if t == "RECV_B" then return "B" .. (a.stage + 1) .. ">" .. a.stage .. ":" .. a.mb end
  return nil
end

local COMPUTE = { F = true, B = true, I = true, W = true }

-- sched: pp_schedule.derive's result; cost(stage, type) -> microseconds
-- of a compute action for one microbatch (F, B, I, W); p2p_us(stage,
-- direction) -> a transfer's time; reduce_us(stage) -> the stage's
-- gradient reduction (REDUCE_GRAD .. WAIT_REDUCE_GRAD); act_bytes(stage)
-- -> one microbatch's saved activations of the stage.
-- -> { step_us, busy_us[rank], bubble, inflight_peak[stage], inflight_bytes[stage], rank_peak_bytes[rank] }
-- record (optional): a list the run appends its timed actions to, in the
-- order it runs them: { rank (0-based), stage, type (F, B, I, W or
-- REDUCE_GRAD), mb, start, finish } (trace.json and timeline.svg of a
-- pipeline plan: gen/pipeline_timeline.lua).
-- regather (optional): torchtitan's "always" reshard policy under PP
-- (gen/parallel/pp_sequence.lua's rules): regather[stage] = { units = {
-- { act, param, ag_us }... } forward order: a unit's saved activations
-- per microbatch, its unsharded parameters' bytes, its all-gather's time }.
-- A stage's units are held unsharded from a backward (B, I, the first
-- stage's W: stage.py:1319-1321) or UNSHARD until the next F reshards
-- them one by one; an F or a backward that finds them sharded gathers them
-- again: the first unit's all-gather exposed, the others hidden behind the
-- compute as far as it lasts (FSDP2 issues the next unit's all-gather on
-- its own stream). The result then has rank_peak_mem[rank]: the most bytes
-- of saved activations plus unsharded parameters a rank holds at once, at
-- unit granularity inside each action (a forward: the units' activations
-- so far, its unit and the next in flight, or all the units from its own
-- on after a backward kept them; a backward: the activations of the units
-- not yet run back, all the units from the one before its own on).
function audit.simulate(sched, cost, p2p_us, reduce_us, act_bytes, record, regather)
  local pp = sched.pp
  local t, busy, pos = {}, {}, {}
  for r = 1, pp do t[r], busy[r], pos[r] = 0, 0, 1 end
  local arrives, reduce_done, sub_at = {}, {}, {}
  local inflight, peak = {}, {}
  for s = 0, sched.num_stages - 1 do inflight[s], peak[s] = 0, 0 end
  -- A rank's saved activations now and at most (its stages' together).
  local rank_bytes, rank_peak = {}, {}
  for r = 1, pp do rank_bytes[r], rank_peak[r] = 0, 0 end
  -- (regather: each stage's units held unsharded, each rank's peak of activations and parameters)
  local held, rank_mem = {}, {}
  for r = 1, pp do rank_mem[r] = 0 end
  local function held_bytes(r, except)
    local b = 0
    for st, on in pairs(held) do
      if on and st ~= except and sched.stage_to_rank[st] == r - 1 then
        for _, u in ipairs(regather[st].units) do b = b + u.param end
      end
    end
    return b
  end
  -- an action's extra time (its all-gathers not hidden) and its peak bytes
  -- over base (the rank's activations without this microbatch's of the
  -- stage) and the other stages' held parameters
  local function regather_action(r, a, us)
    local g = regather[a.stage]
    local units, n = g.units, #g.units
    local was = held[a.stage]
    local backward = a.type == "B" or a.type == "I" and a.stage > 0 or a.type == "W" and a.stage == 0
    local extra = 0
    if (a.type == "F" or backward) and not was and n > 0 then
      -- (the first unit with parameters a forward runs, the last a backward runs: exposed)
      local first, all = nil, 0
      for i = 1, n do
        local u = units[a.type == "F" and i or n + 1 - i]
        if not first and u.ag_us > 0 then first = u.ag_us end
        all = all + u.ag_us
      end
      first = first or 0
      extra = first + math.max(0, all - first - us)
    end
    local acts, top = 0, 0
    for _, u in ipairs(units) do acts = acts + u.act end
    local base = rank_bytes[r] - ((a.type == "F") and 0 or acts) + held_bytes(r, a.stage)
    if a.type == "F" then
      local so_far = 0
      for i = 1, n do
        so_far = so_far + units[i].act
        local params = units[i].param + (units[i + 1] and units[i + 1].param or 0)
        if was then
          params = 0
          for j = i, n do params = params + units[j].param end
        end
        top = math.max(top, base + so_far + params)
      end
      held[a.stage] = false
    elseif backward then
      local left = acts
      for i = n, 1, -1 do
        local params = 0
        for j = was and 1 or math.max(i - 1, 1), n do params = params + units[j].param end
        top = math.max(top, base + (a.type == "I" and acts or left) + params)
        left = left - units[i].act
      end
      held[a.stage] = true
    else -- the first stage's I (no backward) or another stage's W: activations and what is held
      local params = 0
      if was then for _, u in ipairs(units) do params = params + u.param end end
      top = base + acts + params
    end
    if top > rank_mem[r] then rank_mem[r] = top end
    return extra
  end
  local function run_compute(r, a)
    local us = cost(a.stage, a.type)
    -- (regather: the all-gathers an action waits for lengthen it, not its busy time)
    local waited = regather and regather_action(r, a, us) or 0
    if record then
      record[#record + 1] = { rank = r - 1, stage = a.stage, type = a.type, mb = a.mb, start = t[r],
                              finish = t[r] + us + waited }
    end
    t[r] = t[r] + us + waited
    busy[r] = busy[r] + us
    -- A forward saves its activations; they go with the backward that ends
    -- with them: B, or W after zero bubble's I (torch's stage keeps the
    -- backward state from I until W: stage.py backward_weight_one_chunk).
    local d = a.type == "F" and 1 or (a.type == "B" or a.type == "W") and -1 or 0
    if d ~= 0 then
      inflight[a.stage] = inflight[a.stage] + d
      if inflight[a.stage] > peak[a.stage] then peak[a.stage] = inflight[a.stage] end
      rank_bytes[r] = rank_bytes[r] + d * act_bytes(a.stage)
      if rank_bytes[r] > rank_peak[r] then rank_peak[r] = rank_bytes[r] end
    end
  end
  -- A compute action's received input (posted by an earlier RECV): false
  -- while it has not arrived, else the rank's clock moved to its arrival.
  local posted = {}
  local function inputs_here(r, a)
    local k
    if a.type == "F" then k = "F" .. (a.stage - 1) .. ">" .. a.stage .. ":" .. a.mb
    elseif a.type == "B" or a.type == "I" then k = "B" .. (a.stage + 1) .. ">" .. a.stage .. ":" .. a.mb end
    if not (k and posted[k]) then return true end
    local at = arrives[k]
    if not at then return false end
    if at > t[r] then t[r] = at end
    return true
  end
  local function send(r, a)
    local k = msg_key(a)
    arrives[k] = t[r] + p2p_us(a.stage, a.type == "SEND_F" and "F" or "B")
  end
  -- One step of rank r: true when it advanced.
  local function advance(r)
    local list = sched.lowered[r]
    local a = list[pos[r]]
    if not a then return false end
    local ty = a.type
    if ty == "RECV_F" or ty == "RECV_B" then
      -- posted (torch's irecv); the compute that needs it waits for it
      posted[msg_key(a)] = true
      -- a coalesced batch: its sends go out before its receives are waited for
      if a.batch then
        for i = pos[r] + 1, #list do
          local b = list[i]
          if b.batch ~= a.batch then break end
          if (b.type == "SEND_F" or b.type == "SEND_B") and not b._sent then send(r, b); b._sent = true end
        end
      end
    elseif ty == "SEND_F" or ty == "SEND_B" then
      if not a._sent then send(r, a) end
    elseif COMPUTE[ty] then
      if not inputs_here(r, a) then return false end
      run_compute(r, a)
    elseif ty == "OVERLAP_F_B" then
      -- its halves in turn, each waiting for its own input (torch's
      -- default runtime runs them one after the other)
      local k = sub_at[r] or 1
      while k <= #a.sub do
        if not inputs_here(r, a.sub[k]) then
          sub_at[r] = k
          return false
        end
        run_compute(r, a.sub[k])
        k = k + 1
      end
      sub_at[r] = nil
    elseif ty == "REDUCE_GRAD" then
      reduce_done[a.stage] = t[r] + reduce_us(a.stage)
      if record then
        record[#record + 1] = { rank = r - 1, stage = a.stage, type = ty, start = t[r], finish = reduce_done[a.stage] }
      end
    elseif ty == "WAIT_REDUCE_GRAD" then
      local at = reduce_done[a.stage] or t[r]
      if at > t[r] then t[r] = at end
    end -- UNSHARD, RESHARD, WAIT_SEND_*: no time of their own here
    -- (regather: UNSHARD holds the stage's units, RESHARD and REDUCE_GRAD's finalize free them)
    if regather and (ty == "UNSHARD" or ty == "RESHARD" or ty == "REDUCE_GRAD") then held[a.stage] = ty == "UNSHARD" end
    pos[r] = pos[r] + 1
    return true
  end
  local left = 0
  for r = 1, pp do left = left + #sched.lowered[r] end
  while left > 0 do
    local progress = false
    for r = 1, pp do
      while advance(r) do
        progress = true
        left = left - 1
      end
    end
    if not progress then
      local r = 1
      while not sched.lowered[r][pos[r]] do r = r + 1 end
      error(string.format("internal: the pipeline's timed run stalls at rank %d action %d", r - 1, pos[r] - 1), 0)
    end
  end
  -- clear the marks left on the shared action tables
  for r = 1, pp do
    for _, a in ipairs(sched.lowered[r]) do a._sent = nil end
  end
  local step, total = 0, 0
  for r = 1, pp do
    if t[r] > step then step = t[r] end
    total = total + busy[r]
  end
  local bytes = {}
  for s = 0, sched.num_stages - 1 do bytes[s] = peak[s] * act_bytes(s) end
  return { step_us = step, busy_us = busy, bubble = step > 0 and 1 - total / (pp * step) or 0,
           inflight_peak = peak, inflight_bytes = bytes, rank_peak_bytes = rank_peak,
           rank_peak_mem = regather and rank_mem or nil }
end

return audit
