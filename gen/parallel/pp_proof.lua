-- The point-to-point proof over pipeline ranks' lowered action lists
-- (gen/parallel/pp_schedule.lua): every send meets its receive, and no
-- order of blocking sends and receives can deadlock (the queue models
-- below). "schedules.py:N" is a line of torch 2.15.0's
-- torch/distributed/pipelining/schedules.py.
local util = require("gen.util")
local pps = require("gen.parallel.pp_schedule")

local M = {}

local fmt = string.format
local key, act, err, has_comms = pps.key, pps.act, pps.err, pps.has_comms
local function is_int(v) return math.type(v) == "integer" end
local function parts(a) return a.sub or { a } end

-- The message a P2P action belongs to: a forward activation from stage s to
-- s + 1 or a gradient from s to s - 1, for one microbatch. Its send and its
-- receive name the same message.
-- Messages print as "F2>3:5" (forward, stage 2 to 3, microbatch 5).
local P2P = { SEND_F = true, RECV_F = true, SEND_B = true, RECV_B = true }
local function message_of(ty, stage, mb)
  if ty == "SEND_F" then return "F" .. stage .. ">" .. (stage + 1) .. ":" .. mb, stage + 1
  elseif ty == "RECV_F" then return "F" .. (stage - 1) .. ">" .. stage .. ":" .. mb, stage - 1
  elseif ty == "SEND_B" then return "B" .. stage .. ">" .. (stage - 1) .. ":" .. mb, stage - 1
  else return "B" .. (stage + 1) .. ">" .. stage .. ":" .. mb, stage + 1 end
end
local function message(a) return message_of(a.type, a.stage, a.mb) end
local PARTNER = { SEND_F = "RECV_F", RECV_F = "SEND_F", SEND_B = "RECV_B", RECV_B = "SEND_B" }

-- M.prove_p2p(lowered, stage_to_rank, num_stages, opts) -> true | nil, reason
--
-- 1. Matching: every SEND_F(s, m) on rank(s) has exactly one RECV_F(s+1, m)
--    on rank(s+1) and the reverse, SEND_B(s, m) / RECV_B(s-1, m) likewise;
--    no P2P action names a stage its rank does not hold, a neighbour on its
--    own rank, or a stage off the pipeline; each compute action whose input
--    lives on another rank has its receive earlier on its rank, each send
--    comes after the compute that produces it and each WAIT_SEND after its
--    send.
-- 2. No deadlock, by running every rank's list under blocking semantics:
--    a P2P action posts one operation and does not block (torch's irecv /
--    isend; a `batch` group posts one coalesced unit, batch_isend_irecv).
--    Posted units go into FIFO queues and a unit completes only when each
--    of its operations meets its partner at the head of the partner's
--    queue (rendezvous: no eager buffering is assumed). The queues:
--      fifo = "rank" (default): one per rank, as ProcessGroupNCCL runs P2P
--        when the group was created with a device_id (eager init: every
--        send/recv and batch on the group's one communicator and stream);
--      fifo = "peer": one per (rank, peer) for single operations plus one
--        per rank for coalesced batches, as lazy init does (a 2-rank
--        communicator per pair, "low:high"; batches on the group's own);
--      fifo = "none": none, an operation completes once both sides are
--        posted (gloo-like; what torch's _simulate_comms_compute assumes).
--    Compute (F, I, B and OVERLAP_F_B's parts) blocks until its receive has
--    completed; WAIT_SEND blocks until its send has completed; W and the
--    FSDP actions never block on P2P. The lists pass when every rank
--    reaches its end with nothing pending. Each model only adds orderings
--    to the next, so a pass under "rank" is a pass under all three.
-- The reason names the rank, the 0-based action index and the action.
function M.prove_p2p(lowered, s2r, num_stages, opts)
  opts = opts or {}
  local model = opts.fifo or "rank"
  if model ~= "rank" and model ~= "peer" and model ~= "none" then
    err(fmt("fifo = %s; use \"rank\", \"peer\" or \"none\"", util.show(model)))
  end
  local pp = #lowered
  local function where(r, i) return fmt("rank %d action %d (%s)", r - 1, i - 1, key(lowered[r][i])) end
  -- 1. structure
  local sends, recvs = {}, {}   -- message -> { rank, index }
  local posted_at = {}          -- rank -> message -> index of its P2P action
  for r = 1, pp do
    posted_at[r] = {}
    local done = {}
    for i, a in ipairs(lowered[r]) do
      for _, p in ipairs(parts(a)) do
        local t = p.type
        if p.stage ~= -1 and (not is_int(p.stage) or p.stage < 0 or p.stage >= num_stages) then
          return nil, fmt("%s: stage %s is not in 0..%d", where(r, i), tostring(p.stage), num_stages - 1)
        end
        if s2r[p.stage] ~= r - 1 then
          return nil, fmt("%s: stage %d lives on rank %s", where(r, i), p.stage, tostring(s2r[p.stage]))
        end
        if P2P[t] then
          local msg, peer_stage = message(p)
          if peer_stage < 0 or peer_stage >= num_stages then
            return nil, fmt("%s: stage %d has no neighbour stage %d", where(r, i), p.stage, peer_stage)
          end
          if s2r[peer_stage] == r - 1 then
            return nil, fmt("%s: stage %d is on this rank, torch passes it locally", where(r, i), peer_stage)
          end
          local book = t:sub(1, 4) == "SEND" and sends or recvs
          if book[msg] then
            return nil, fmt("%s: repeats %s at action %d", where(r, i), key(p), book[msg][2] - 1)
          end
          book[msg] = { r, i }
          posted_at[r][msg] = i
          if t == "SEND_F" and not done[key(act(p.stage, "F", p.mb))] then
            return nil, fmt("%s: sends before %dF%d computes it", where(r, i), p.stage, p.mb)
          elseif t == "SEND_B" and not (done[key(act(p.stage, "B", p.mb))] or done[key(act(p.stage, "I", p.mb))]) then
            return nil, fmt("%s: sends before %dB%d / %dI%d computes it", where(r, i), p.stage, p.mb, p.stage, p.mb)
          end
        elseif t == "WAIT_SEND_F" or t == "WAIT_SEND_B" then
          local send = act(p.stage, t:sub(6), p.mb)
          if not posted_at[r][message(send)] then
            return nil, fmt("%s: waits for %s, which this rank has not sent", where(r, i), key(send))
          end
        elseif t == "F" or t == "B" or t == "I" then
          if has_comms(p.type == "F" and act(p.stage, "B", p.mb) or act(p.stage, "F", p.mb), s2r, num_stages) then
            local recv = act(p.stage, t == "F" and "RECV_F" or "RECV_B", p.mb)
            if not posted_at[r][message(recv)] then
              return nil, fmt("%s: its input needs %s first on this rank", where(r, i), key(recv))
            end
          end
        end
        done[key(p)] = true
      end
    end
  end
  for _, pair in ipairs({ { sends, recvs }, { recvs, sends } }) do
    local list = {}
    for msg, at in pairs(pair[1]) do if not pair[2][msg] then list[#list + 1] = at end end
    table.sort(list, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
    if list[1] then
      local r, i = list[1][1], list[1][2]
      local a = lowered[r][i]
      local want = act(a.type:sub(-1) == "F" and (a.type:sub(1, 4) == "SEND" and a.stage + 1 or a.stage - 1)
        or (a.type:sub(1, 4) == "SEND" and a.stage - 1 or a.stage + 1), PARTNER[a.type], a.mb)
      return nil, fmt("%s: no %s on rank %d matches it", where(r, i), key(want), s2r[want.stage])
    end
  end
  -- 2. blocking semantics. Queues: "r" (one per rank), "r>q" (rank r's
  -- single operations with peer q), "r*" (rank r's coalesced batches).
  local pc, queues, complete = {}, {}, {}
  local unit_of = {}  -- rank -> message -> { queue, position }
  for r = 1, pp do pc[r], unit_of[r] = 1, {} end
  local function queue_of(r, unit)
    if model == "rank" then return tostring(r) end
    if #unit > 1 then return r .. "*" end
    local _, peer_stage = message(unit[1])
    return r .. ">" .. (s2r[peer_stage] + 1)
  end
  local function partner_rank(msg, r)
    local s, q = sends[msg], recvs[msg]
    return s[1] == r and q[1] or s[1]
  end
  local function at_head(r, msg)  -- rank r's side of msg is posted and may complete now
    local u = unit_of[r][msg]
    if not u then return false end
    return model == "none" or u[2] == queues[u[1]].head
  end
  local needs = {}  -- action -> the messages it waits for
  local function needs_of(a)
    local n = needs[a]
    if n then return n end
    n = {}
    for _, p in ipairs(parts(a)) do
      local s = p.stage
      if p.type == "WAIT_SEND_F" or p.type == "WAIT_SEND_B" then n[#n + 1] = message_of(p.type:sub(6), s, p.mb)
      elseif p.type == "F" and s ~= 0 and s2r[s - 1] ~= s2r[s] then n[#n + 1] = message_of("RECV_F", s, p.mb)
      elseif (p.type == "B" or p.type == "I") and s ~= num_stages - 1 and s2r[s + 1] ~= s2r[s] then
        n[#n + 1] = message_of("RECV_B", s, p.mb)
      end
    end
    needs[a] = n
    return n
  end
  local function blocked_on(a)  -- the message a compute / wait action needs, if not yet complete
    for _, need in ipairs(needs_of(a)) do if not complete[need] then return need end end
    return nil
  end
  local order = {}  -- queue names in creation order (deterministic sweeps)
  while true do
    local progress = false
    for r = 1, pp do  -- run each rank until it blocks
      local list = lowered[r]
      while pc[r] <= #list do
        local a = list[pc[r]]
        if P2P[a.type] then
          local unit = { a }
          local j = pc[r] + 1
          while a.batch and list[j] and list[j].batch == a.batch and P2P[list[j].type] do unit[#unit + 1] = list[j]; j = j + 1 end
          local qn = queue_of(r, unit)
          local q = queues[qn]
          if not q then q = { head = 1, rank = r }; queues[qn] = q; order[#order + 1] = qn end
          local u = { ops = {}, at = pc[r] }
          q[#q + 1] = u
          for _, op in ipairs(unit) do local msg = message(op); u.ops[#u.ops + 1] = msg; unit_of[r][msg] = { qn, #q } end
          pc[r] = j
        elseif blocked_on(a) then break
        else pc[r] = pc[r] + 1 end
        progress = true
      end
    end
    for _, qn in ipairs(order) do  -- complete what can meet, pop finished head units
      local q = queues[qn]
      while q[q.head] do
        local u, all = q[q.head], true
        for _, msg in ipairs(u.ops) do
          if not complete[msg] then
            if at_head(partner_rank(msg, q.rank), msg) then complete[msg] = true; progress = true else all = false end
          end
        end
        if not all and model ~= "none" then break end
        q.head = q.head + 1
        progress = true
      end
    end
    if model == "none" then  -- everything posted on both sides completes
      for _, qn in ipairs(order) do
        local q = queues[qn]
        for k = 1, #q do
          for _, msg in ipairs(q[k].ops) do
            if not complete[msg] and at_head(partner_rank(msg, q.rank), msg) then complete[msg] = true; progress = true end
          end
        end
      end
    end
    local finished = true
    for r = 1, pp do if pc[r] <= #lowered[r] then finished = false end end
    for _, qn in ipairs(order) do if queues[qn].head <= #queues[qn] then finished = false end end
    if finished then return true end
    if not progress then break end
  end
  -- deadlock: explain the first rank that is stuck
  local function stuck_unit(r)
    for _, qn in ipairs(order) do
      local q = queues[qn]
      if q.rank == r and q[q.head] then return q, q[q.head] end
    end
  end
  for r = 1, pp do
    local _, su = stuck_unit(r)
    if pc[r] <= #lowered[r] or su then
      local msg, what
      if pc[r] <= #lowered[r] then
        msg = blocked_on(lowered[r][pc[r]])
        what = where(r, pc[r]) .. " waits for " .. msg
      else
        for _, m in ipairs(su.ops) do if not complete[m] then msg = m; break end end
        what = where(r, su.at) .. " never completes " .. msg
      end
      local q = partner_rank(msg, r)
      local mine, theirs = unit_of[r][msg], unit_of[q][msg]
      local because
      if model ~= "none" and mine and mine[2] ~= queues[mine[1]].head then
        because = fmt("it is queued behind %s", where(r, queues[mine[1]][queues[mine[1]].head].at))
      elseif not theirs then
        because = fmt("rank %d has not posted its side: it is stuck at %s", q - 1,
          pc[q] <= #lowered[q] and where(q, pc[q]) or "its end")
      else
        local tq = queues[theirs[1]]
        because = fmt("rank %d's side is queued behind %s", q - 1, where(q, tq[tq.head].at))
      end
      return nil, fmt("deadlock (%s model): %s; %s", model, what, because)
    end
  end
  return nil, "deadlock"
end

return M
