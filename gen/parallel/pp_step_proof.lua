-- The whole-step proof (issue 22, item 3): every global rank's events of
-- one pipeline step -- its sends and receives and its FSDP collectives, in
-- issue order, gen/parallel/pp_sequence.lua's M.expected -- match across
-- ranks and cannot deadlock. Pure functions.
--
--   M.prove(events) -> counts | nil, reason
--     events[g + 1]: global rank g's list (pp_sequence's event format:
--       { op = "send" | "recv", peer, numel, dtype, batch } or
--       { op = "all_gather" | "reduce_scatter" | ..., ranks, in_numel,
--         out_numel, dtype, unit }; `action` and `group` are optional).
--     counts: { ranks, events, collectives (group-wide, each counted once),
--       p2p (messages: a send and its receive), batches (coalesced units),
--       groups (communicators that carry collectives) }.
--     reason: one line naming the ranks, their 0-based event indices and
--       the events.
--
-- The model, NCCL's, at its strictest: each rank issues its events in
-- order on ONE queue, and an event (or a coalesced batch) blocks the
-- rank's later events until it completes. Torch puts P2P and each
-- collective group on communicators of their own, each on its own stream,
-- so the real run orders less; every wait of a looser model is a wait here
-- too, so the first event a stuck looser run never completes would be
-- ready here as well: a pass here is a pass there (as pp_proof.lua's
-- "rank" model covers "peer" and "none").
--   - A collective belongs to its group (the `group` field, else its ranks
--     list) and is matched by issue order on that group: NCCL pairs a
--     communicator's k-th collective on every member, whatever each rank
--     meant by it. So the k-th collective on a group must agree on every
--     member (op, unit, in_numel, out_numel, dtype) -- a disagreement is a
--     hang or wrong data, reported naming both ranks -- and it completes
--     only when every member has reached it.
--   - Point-to-point operations are matched per (src, dst) in FIFO order
--     (NCCL orders a pair's sends and receives as issued): the k-th send
--     from a to b is the k-th receive on b from a, and the two agree on
--     numel and dtype. Rendezvous: a send completes only when its receive
--     is posted (no eager buffering; activations exceed NCCL's buffers).
--   - A batch (consecutive events with the same `batch`, one
--     batch_isend_irecv: ncclGroupStart/End) is posted as one unit: its
--     operations progress together, in any order, and the unit completes
--     when all of them have met their partners.
-- Compute is not an event: a compute action that needs a receive comes
-- after it in the list, and the receive completes before anything later
-- is issued, so the compute's wait is implied.
local M = {}

local fmt = string.format
local P2P = { send = true, recv = true }

local function is_int(v) return math.type(v) == "integer" end

-- One event as the reason prints it: "send to 2 numel 12 fp32 batch 1, 0SEND_F1".
function M.show(e)
  local s
  if e.op == "send" then s = fmt("send to %s numel %s %s", tostring(e.peer), tostring(e.numel), tostring(e.dtype))
  elseif e.op == "recv" then s = fmt("recv from %s numel %s %s", tostring(e.peer), tostring(e.numel), tostring(e.dtype))
  else
    local r = {}
    for i, x in ipairs(e.ranks or {}) do r[i] = tostring(x) end
    s = fmt("%s ranks %s%s in %s out %s %s", tostring(e.op), table.concat(r, ","),
      e.unit and (" unit " .. e.unit) or "", tostring(e.in_numel), tostring(e.out_numel), tostring(e.dtype))
  end
  if e.batch then s = s .. " batch " .. tostring(e.batch) end
  if e.action and e.action ~= "" then s = s .. ", " .. e.action end
  return s
end

local function ordinal(k)
  local tail = (k % 100 >= 11 and k % 100 <= 13) and "th" or ({ "st", "nd", "rd" })[k % 10] or "th"
  return k .. tail
end

function M.prove(events)
  local world = #events
  local function at(g, i) return fmt("rank %d event %d (%s)", g, i - 1, M.show(events[g + 1][i])) end

  -- 1. Structure, and each event's place in its matching order: a
  -- collective's ordinal on its group, a p2p operation's ordinal on its
  -- (src, dst) pair.
  local groups, group_order = {}, {}   -- key -> { members, by_rank = { [g] = { event indices } } }
  local pairs_ = {}                    -- "src>dst" -> { sends = {...}, recvs = {...} } (event indices)
  local slot = {}                      -- slot[g][i] = the matching key of event i on rank g
  local n_events, n_batches = 0, 0
  local checked = {}                   -- ranks list -> { set, key }
  for g = 0, world - 1 do
    slot[g] = {}
    local last_batch
    for i, e in ipairs(events[g + 1]) do
      n_events = n_events + 1
      if P2P[e.op] then
        if not is_int(e.peer) or e.peer < 0 or e.peer >= world then
          return nil, fmt("%s: its peer is not a rank in 0..%d", at(g, i), world - 1)
        end
        if e.peer == g then return nil, fmt("%s: sends or receives to itself", at(g, i)) end
        local src, dst = e.op == "send" and g or e.peer, e.op == "send" and e.peer or g
        local k = src .. ">" .. dst
        local p = pairs_[k]
        if not p then p = { src = src, dst = dst, sends = {}, recvs = {} }; pairs_[k] = p end
        local list = e.op == "send" and p.sends or p.recvs
        list[#list + 1] = i
        slot[g][i] = { pair = k, n = #list }
        if e.batch ~= nil and e.batch ~= last_batch then n_batches = n_batches + 1 end
        last_batch = e.batch
      else
        last_batch = nil
        if type(e.ranks) ~= "table" or #e.ranks == 0 then
          return nil, fmt("%s: a collective names no group", at(g, i))
        end
        local info = checked[e.ranks]  -- a ranks list is checked once, however many events share it
        if not info then
          info = { set = {} }
          local names = {}
          for n, r in ipairs(e.ranks) do
            if not is_int(r) or r < 0 or r >= world then
              return nil, fmt("%s: its group holds %s, not a rank in 0..%d", at(g, i), tostring(r), world - 1)
            end
            if info.set[r] then return nil, fmt("%s: its group holds rank %d twice", at(g, i), r) end
            info.set[r], names[n] = true, tostring(r)
          end
          info.key = table.concat(names, ",")
          checked[e.ranks] = info
        end
        if not info.set[g] then return nil, fmt("%s: its group does not hold rank %d", at(g, i), g) end
        local k = e.group ~= nil and tostring(e.group) or info.key
        local grp = groups[k]
        if not grp then
          grp = { key = k, members = e.ranks, by_rank = {}, first = { g, i } }
          groups[k] = grp
          group_order[#group_order + 1] = k
        elseif grp.members ~= e.ranks and checked[grp.members].key ~= info.key then
          return nil, fmt("%s and %s name group %s with different ranks", at(grp.first[1], grp.first[2]), at(g, i), k)
        end
        local list = grp.by_rank[g] or {}
        grp.by_rank[g] = list
        list[#list + 1] = i
        slot[g][i] = { group = k, n = #list }
      end
    end
  end

  -- 2. Matching. Collectives: the k-th on a group agrees on every member
  -- (NCCL matches by issue order, not by what the caller meant).
  local n_colls = 0
  for _, k in ipairs(group_order) do
    local grp = groups[k]
    local ref, most = nil, 0
    for _, r in ipairs(grp.members) do
      local n = #(grp.by_rank[r] or {})
      if n > most then ref, most = r, n end
    end
    for n = 1, most do
      local ei = grp.by_rank[ref][n]
      local e = events[ref + 1][ei]
      for _, r in ipairs(grp.members) do
        local list = grp.by_rank[r] or {}
        local j = list[n]
        if not j then
          return nil, fmt("%s is the %s collective on group %s; rank %d issues only %d there: it never completes",
            at(ref, ei), ordinal(n), k, r, #list)
        end
        local f = events[r + 1][j]
        for _, field in ipairs({ "op", "unit", "in_numel", "out_numel", "dtype" }) do
          if f[field] ~= e[field] then
            return nil, fmt("%s and %s are the %s collective on group %s but differ in %s (%s vs %s)",
              at(ref, ei), at(r, j), ordinal(n), k, field, tostring(e[field]), tostring(f[field]))
          end
        end
      end
    end
    n_colls = n_colls + most
  end
  -- Point-to-point: the k-th send from a to b is the k-th receive on b from a.
  local pair_keys, n_p2p = {}, 0
  for k in pairs(pairs_) do pair_keys[#pair_keys + 1] = k end
  table.sort(pair_keys, function(x, y)
    local a, b = pairs_[x], pairs_[y]
    return a.src < b.src or (a.src == b.src and a.dst < b.dst)
  end)
  for _, k in ipairs(pair_keys) do
    local p = pairs_[k]
    for n = 1, math.min(#p.sends, #p.recvs) do
      local s, r = events[p.src + 1][p.sends[n]], events[p.dst + 1][p.recvs[n]]
      for _, field in ipairs({ "numel", "dtype" }) do
        if s[field] ~= r[field] then
          return nil, fmt("%s and %s are the %s message from rank %d to rank %d but differ in %s (%s vs %s)",
            at(p.src, p.sends[n]), at(p.dst, p.recvs[n]), ordinal(n), p.src, p.dst, field, tostring(s[field]),
            tostring(r[field]))
        end
      end
    end
    if #p.sends > #p.recvs then
      return nil, fmt("%s is the %s message from rank %d to rank %d; rank %d receives only %d from rank %d: no receive "
        .. "matches it", at(p.src, p.sends[#p.recvs + 1]), ordinal(#p.recvs + 1), p.src, p.dst, p.dst, #p.recvs, p.src)
    elseif #p.recvs > #p.sends then
      return nil, fmt("%s is the %s message from rank %d to rank %d; rank %d sends only %d to rank %d: no send "
        .. "matches it", at(p.dst, p.recvs[#p.sends + 1]), ordinal(#p.sends + 1), p.src, p.dst, p.src, #p.sends, p.dst)
    end
    n_p2p = n_p2p + #p.sends
  end

  -- 3. Blocking run, driven by completions: each rank posts its current
  -- unit (pc[g] .. stop[g] - 1; a batch spans its consecutive events); an
  -- operation completes when its partner is in the partner's current unit,
  -- a collective when the last member of its group arrives; a rank whose
  -- unit completed moves on. Completions only ever enable more, so the
  -- state where nothing more completes is the same in whatever order the
  -- ranks are taken (the reason below does not depend on it).
  local pc, stop, done, remaining = {}, {}, {}, {}
  local arrived = {}  -- group key -> collective ordinal -> members arrived
  for _, k in ipairs(group_order) do arrived[k] = {} end
  local function unit_end(g, i)
    local list = events[g + 1]
    local e = list[i]
    local j = i + 1
    if P2P[e.op] and e.batch ~= nil then
      while list[j] and P2P[list[j].op] and list[j].batch == e.batch do j = j + 1 end
    end
    return j
  end
  local function in_unit(g, i) return i >= pc[g] and i < stop[g] end
  local function finished(g) return pc[g] > #events[g + 1] end
  -- The partner of p2p event i on rank g: its rank and event index.
  local function partner(g, i)
    local s = slot[g][i]
    local p = pairs_[s.pair]
    if events[g + 1][i].op == "send" then return p.dst, p.recvs[s.n] end
    return p.src, p.sends[s.n]
  end
  local ready, head = {}, 1  -- ranks whose current unit has completed
  local function complete(g, i)
    done[g][i] = true
    remaining[g] = remaining[g] - 1
    if remaining[g] == 0 then ready[#ready + 1] = g end
  end
  local function post(g)
    stop[g] = unit_end(g, pc[g])
    remaining[g] = stop[g] - pc[g]
    for i = pc[g], stop[g] - 1 do
      if P2P[events[g + 1][i].op] then
        local q, j = partner(g, i)
        if in_unit(q, j) then complete(g, i); complete(q, j) end
      else
        local s = slot[g][i]
        local grp, got = groups[s.group], arrived[s.group]
        got[s.n] = (got[s.n] or 0) + 1
        if got[s.n] == #grp.members then
          for _, r in ipairs(grp.members) do complete(r, grp.by_rank[r][s.n]) end
        end
      end
    end
  end
  for g = 0, world - 1 do done[g], pc[g], stop[g] = {}, 1, 1 end
  for g = 0, world - 1 do if not finished(g) then post(g) end end
  while ready[head] do
    local g = ready[head]
    head = head + 1
    pc[g] = stop[g]
    if not finished(g) then post(g) end
  end
  -- What rank g's current unit waits for: its first event not done and a
  -- rank that has not reached that event's partner (or collective).
  local function waits(g)
    for i = pc[g], stop[g] - 1 do
      if not done[g][i] then
        if P2P[events[g + 1][i].op] then return i, (partner(g, i)) end
        local s = slot[g][i]
        for _, r in ipairs(groups[s.group].members) do
          if not in_unit(r, groups[s.group].by_rank[r][s.n]) then return i, r end
        end
      end
    end
  end

  -- 4. A rank left unfinished waits for another unfinished rank (the
  -- matching above guarantees its partner's event exists), so following
  -- the waits from any stuck rank ends in a cycle: print it.
  local start
  for g = 0, world - 1 do if not finished(g) then start = g; break end end
  if start then
    local seen, path, g = {}, {}, start
    while not seen[g] do
      seen[g] = #path + 1
      local i, q = waits(g)
      if not q then return nil, fmt("deadlock (one queue per rank): rank %d is stuck at event %d", g, pc[g] - 1) end
      path[#path + 1] = { g = g, i = i, q = q }
      g = q
    end
    local cycle = {}
    for k = seen[g], #path do cycle[#cycle + 1] = path[k] end
    local low = 1  -- begin at the cycle's lowest rank
    for k = 2, #cycle do if cycle[k].g < cycle[low].g then low = k end end
    local parts = {}
    for k = 0, #cycle - 1 do
      local c = cycle[(low - 1 + k) % #cycle + 1]
      local e = fmt("event %d (%s)", c.i - 1, M.show(events[c.g + 1][c.i]))
      parts[#parts + 1] = k == 0 and fmt("rank %d %s waits for rank %d", c.g, e, c.q)
        or fmt("which waits at %s for rank %d", e, c.q)
    end
    return nil, "deadlock (one queue per rank): " .. table.concat(parts, ", ")
  end
  return { ranks = world, events = n_events, collectives = n_colls, p2p = n_p2p, batches = n_batches,
           groups = #group_order }
end

return M
