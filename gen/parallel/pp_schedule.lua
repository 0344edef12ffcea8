-- Pipeline-parallel schedules as torch.distributed.pipelining 2.15 builds
-- them (issue 22, items 2 and 3's point-to-point part). Pure functions, no
-- globals; every "schedules.py:N" below is a line of torch 2.15.0's
-- torch/distributed/pipelining/schedules.py ("_utils.py:N" likewise).
--
-- An action is { type = "F", stage = s, mb = m } with torch's types (F, I, W,
-- B, SEND_F, RECV_F, SEND_B, RECV_B, WAIT_SEND_F, WAIT_SEND_B, UNSHARD,
-- RESHARD, REDUCE_GRAD, WAIT_REDUCE_GRAD) and torch's 0-based stage and
-- microbatch numbers; OVERLAP_F_B is { type = "OVERLAP_F_B", stage = -1,
-- sub = { a1, a2 } }; `false` is torch's None (an idle step). Ranks are list
-- positions: rank r's list is lists[r + 1]. P2P actions that torch issues in
-- one coalesced batch (dist.batch_isend_irecv) share a `batch` number.
--
--   M.derive{ schedule, pp, microbatches, stages_per_rank, defer_pp_recv,
--             max_active_stages }          -> the schedule (see M.derive)
--   M.prove_p2p(lowered, stage_to_rank, num_stages, { fifo = "rank"|"peer"|"none" })
--                                           -> true | nil, reason
--   M.format_action / M.parse_action        -> torch's action strings
--   M.to_csv / M.from_csv / M.import_csv    -> torch's CSV schedule format
local util = require("gen.util")

local M = {}

local floor, max, min = math.floor, math.max, math.min
local fmt = string.format

M.SCHEDULES = { "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                "DualPipeV" }
local SINGLE = { GPipe = true, ["1F1B"] = true }           -- PipelineScheduleSingle subclasses
local V_STYLE = { ZBVZeroBubble = true, DualPipeV = true }  -- stage_to_rank style "v"

local function err(msg) util.plan_error("pp_schedule: " .. msg) end

local function act(stage, ty, mb) return { type = ty, stage = stage, mb = mb } end

-- ---------------------------------------------------------------- strings

local TYPES = { "WAIT_REDUCE_GRAD", "WAIT_SEND_F", "WAIT_SEND_B", "REDUCE_GRAD", "UNSHARD", "RESHARD", "SEND_F",
                "RECV_F", "SEND_B", "RECV_B", "OVERLAP_F_B", "F", "I", "B", "W" }  -- _action_regex's order
local IS_TYPE = {}
for _, t in ipairs(TYPES) do IS_TYPE[t] = true end
local COMPUTE = { F = true, I = true, W = true, B = true, OVERLAP_F_B = true }  -- _Action.is_compute_op
M.IS_COMPUTE = COMPUTE

-- Zero bubble's split backward on a stage: what its I and its W compute
-- (gen/compute.lua backward_us's parts). stage.py backward_one_chunk with
-- full_backward=False runs the input part only `if not self.is_first`
-- (stage.py:1318-1321); on the first stage I computes nothing and
-- backward_weight_one_chunk's W runs the "full" backward (stage.py:1390-1417).
-- -> I's part ("input" | nil: none), W's ("weight" | "full")
function M.split_backward(stage)
  if stage == 0 then return nil, "full" end
  return "input", "weight"
end

-- _Action.__repr__ (schedules.py:140): "2F0", "1UNSHARD", "(0F3;7B2)OVERLAP_F_B"; "" for None.
function M.format_action(a)
  if not a then return "" end
  if a.sub then
    local parts = {}
    for i, s in ipairs(a.sub) do parts[i] = M.format_action(s) end
    return "(" .. table.concat(parts, ";") .. ")" .. a.type
  end
  return a.stage .. a.type .. (a.mb and tostring(a.mb) or "")
end
-- The same string, memoized per action table (the passes look actions up
-- by it), and built directly from (stage, type, microbatch).
local KEYS = setmetatable({}, { __mode = "k" })
local function key(a)
  if not a then return "" end
  local k = KEYS[a]
  if not k then k = M.format_action(a); KEYS[a] = k end
  return k
end
local function k3(stage, ty, mb) return stage .. ty .. (mb or "") end

-- s without leading and trailing whitespace, in time linear in #s (a
-- pattern like "^%s*(.-)%s*$" retries the lazy match at every byte: a long
-- cell took time quadratic in its length).
local function trim(s)
  local i = s:find("%S")
  if not i then return "" end
  local j = #s
  while s:find("^%s", j) do j = j - 1 end
  return s:sub(i, j)
end
M.trim = trim

-- The longest action text taken (the longest torch writes, an OVERLAP_F_B
-- of two ten-digit actions, has 57 bytes) and the largest stage or
-- microbatch number (C int; the plan's own bounds are far lower).
M.MAX_ACTION = 64
M.MAX_NUMBER = (1 << 31) - 1

-- A stage or microbatch number: digits only, at most MAX_NUMBER, or nil
-- and why (the text is never quoted: it comes from a file).
local function number(digits, what)
  if #digits > 10 or tonumber(digits) > M.MAX_NUMBER then
    return nil, fmt("its %s number has %d digits, more than %d (2^31 - 1) allows", what, #digits, M.MAX_NUMBER)
  end
  return math.tointeger(tonumber(digits))
end

-- _Action.from_str (schedules.py:164), strict: the whole string must be one
-- action (torch's re.match ignores trailing text). "" -> false (None).
-- Returns the action, or nil and why; why names no part of s (s may come
-- from any file: a refusal must not print its contents).
function M.try_parse_action(s)
  if #s > M.MAX_ACTION then
    return nil, fmt("a cell of %d bytes; an action has at most %d (e.g. 2F0, 1UNSHARD, 3SEND_F1)", #s, M.MAX_ACTION)
  end
  s = trim(s)
  if s == "" then return false end
  local inner, ty = s:match("^%((.*)%)(%u[%u_]*)$")
  if inner then
    if not IS_TYPE[ty] then
      return nil, fmt("a combined action (...)TYPE of an unknown type; use one of %s", table.concat(TYPES, ", "))
    end
    local sub = {}
    for part in (inner .. ";"):gmatch("([^;]*);") do
      local a, why = M.try_parse_action(part)
      if a == nil then return nil, why end
      if a then sub[#sub + 1] = a end
    end
    return { type = ty, stage = -1, sub = #sub > 0 and sub or nil }
  end
  local stage, rest = s:match("^(%d+)(.*)$")
  if stage then
    for _, t in ipairs(TYPES) do
      if rest:sub(1, #t) == t then
        local mb = rest:sub(#t + 1)
        if mb == "" or mb:match("^%d+$") then
          local st, why = number(stage, "stage")
          if not st then return nil, why end
          if mb == "" then return act(st, t, nil) end
          local m, why_mb = number(mb, "microbatch")
          if not m then return nil, why_mb end
          return act(st, t, m)
        end
      end
    end
  end
  return nil, "not an action: [stage][type][microbatch] with whole numbers (e.g. 2F0, 1UNSHARD, 3SEND_F1)"
end

function M.parse_action(s)
  local a, why = M.try_parse_action(s)
  if a == nil then err("action: " .. why .. "; fix the CSV cell") end
  return a
end

-- ---------------------------------------------------------------- mapping

-- generate_stage_to_rank_mapping (_utils.py:515): loop puts stage s on rank
-- s % pp; v walks ranks 0..pp-1 then back pp-1..0 (ZBV, DualPipeV).
function M.stage_to_rank(pp, num_stages, style)
  local map = {}
  if style == "v" then
    local r = 0
    for s = 0, num_stages - 1 do
      map[s] = r
      if (s + 1) % pp ~= 0 then r = r + ((floor(s / pp) % 2 == 0) and 1 or -1) end
    end
  else
    for s = 0, num_stages - 1 do map[s] = s % pp end
  end
  return map
end

-- ---------------------------------------------------------------- compute orders

-- ScheduleGPipe._get_pipeline_order (schedules.py:1382) and what
-- _step_microbatches (schedules.py:1287) runs: every forward, then every backward.
local function gpipe_compute(rank, n)
  local out = {}
  for m = 0, n - 1 do out[#out + 1] = act(rank, "F", m) end
  for m = 0, n - 1 do out[#out + 1] = act(rank, "B", m) end
  return out
end

-- What Schedule1F1B._step_microbatches (schedules.py:1446) runs: min(n,
-- pp - rank) warmup forwards, then backward/forward pairs, then the rest of
-- the backwards.
local function onef1b_compute(rank, pp, n)
  local out, w = {}, min(n, pp - rank)
  for m = 0, w - 1 do out[#out + 1] = act(rank, "F", m) end
  local f, b = w, 0
  while b < n do
    out[#out + 1] = act(rank, "B", b)
    b = b + 1
    if f < n then out[#out + 1] = act(rank, "F", f); f = f + 1 end
  end
  return out
end

-- Schedule1F1B._get_pipeline_order (schedules.py:1618) verbatim, before
-- _add_reduce_grad. On the last rank it numbers the forwards 1..n, not
-- 0..n-1 (forward_mb starts at 0 and is incremented before each use): the
-- dict torch exposes differs from what the rank runs (onef1b_compute).
local function onef1b_torch_order(rank, pp, n)
  local out = {}
  for _ = 1, rank do out[#out + 1] = false end
  local num_forward, forward_mb = pp - 1 - rank, 0
  for i = 0, num_forward - 1 do out[#out + 1] = act(rank, "F", i); forward_mb = i end
  for _ = 1, max(0, 2 * (pp - 1 - rank)) do out[#out + 1] = false end
  local backward_mb, remaining = 0, n - num_forward
  while remaining > 0 do
    forward_mb = forward_mb + 1
    out[#out + 1] = act(rank, "F", forward_mb)
    remaining = remaining - 1
    out[#out + 1] = act(rank, "B", backward_mb)
    backward_mb = backward_mb + 1
  end
  for _ = 1, n - backward_mb do
    out[#out + 1] = false
    out[#out + 1] = act(rank, "B", backward_mb)
    backward_mb = backward_mb + 1
  end
  return out
end

-- ScheduleLoopedBFS._calculate_single_rank_operations (schedules.py:3863).
local function looped_bfs(rank, pp, v, n)
  local out = {}
  for _ = 1, rank do out[#out + 1] = false end
  for l = 0, v - 1 do
    for m = 0, n - 1 do out[#out + 1] = act(rank + l * pp, "F", m) end
  end
  for _ = 1, 2 * (pp - 1 - rank) do out[#out + 1] = false end
  for l = v - 1, 0, -1 do
    for m = n - 1, 0, -1 do out[#out + 1] = act(rank + l * pp, "B", m) end
  end
  return out
end

-- _get_warmup_ops (schedules.py:4029).
local function warmup_ops(rank, v, per_round, pp, n, factor)
  return min((v - 1) * per_round + factor * ((pp - 1) - rank), n * v)
end

-- _get_1f1b_rank_ops (schedules.py:3892), shared by Interleaved1F1B and
-- InterleavedZeroBubble.
local function one_f1b_rank_ops(v, pp, warmup, fwd_bwd, cooldown, rank, fwd_stage, bwd_stage, num_1f1b, zb)
  local fmb, bmb, wmb = {}, {}, {}
  local function next_mb(t, s) local m = t[s] or 0; t[s] = m + 1; return m end
  local out = {}
  for _ = 1, rank do out[#out + 1] = false end
  local post_warmup = zb and (pp - rank - 1) or ((v * pp + 2 * (pp - 1 - rank)) - (warmup + rank))
  local bw = zb and "I" or "B"
  local backward_ids, weight_count = {}, 0
  local function weight()
    local s = bwd_stage(backward_ids[weight_count + 1])
    out[#out + 1] = act(s, "W", next_mb(wmb, s))
    weight_count = weight_count + 1
  end
  for op = 0, warmup + fwd_bwd + cooldown - 1 do
    if op < warmup then
      local s = fwd_stage(op)
      out[#out + 1] = act(s, "F", next_mb(fmb, s))
      if op == warmup - 1 then for _ = 1, post_warmup do out[#out + 1] = false end end
    elseif op < warmup + fwd_bwd then
      local s = fwd_stage(op)
      out[#out + 1] = act(s, "F", next_mb(fmb, s))
      local b = bwd_stage(op)
      out[#out + 1] = act(b, bw, next_mb(bmb, b))
      backward_ids[#backward_ids + 1] = op
      if zb and op - warmup >= num_1f1b then weight() end
    else
      if not zb then out[#out + 1] = false end
      local b = bwd_stage(op)
      out[#out + 1] = act(b, bw, next_mb(bmb, b))
      backward_ids[#backward_ids + 1] = op
      if zb and op - warmup >= num_1f1b then weight() end
    end
  end
  while zb and weight_count < #backward_ids do weight() end
  return out
end

-- ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble
-- ._calculate_single_rank_operations (schedules.py:4139, 4281).
local function interleaved(rank, pp, v, n, zb)
  local rounds = max(1, n // pp)
  local per_round = n // rounds
  local warmup = warmup_ops(rank, v, per_round, pp, n, zb and 1 or 2)
  local mb_ops = v * n
  local fwd_bwd = mb_ops - warmup
  local cooldown = mb_ops - fwd_bwd
  local function fwd_stage(step) return ((step // per_round) % v) * pp + rank end
  local function bwd_stage(step) return (v - 1 - ((step - warmup) // per_round) % v) * pp + rank end
  return one_f1b_rank_ops(v, pp, warmup, fwd_bwd, cooldown, rank, fwd_stage, bwd_stage, rank, zb)
end

-- ScheduleInterleavedZeroBubble._add_bubbles_to_actions (schedules.py:4338).
-- need_bubble tests FULL_BACKWARD, which this schedule never emits (its
-- backwards are I), so only forwards ever wait for a bubble.
local function add_bubbles(order, pp, num_stages)
  local seen, result, ptr = {}, {}, {}
  for r = 1, pp do result[r], ptr[r] = {}, 1 end
  local function need_bubble(a)
    if a.type == "F" then return a.stage ~= 0 and not seen[k3(a.stage - 1, "F", a.mb)] end
    if a.type == "B" then
      if a.stage == num_stages - 1 then return not seen[k3(a.stage, "F", a.mb)] end
      return not seen[k3(a.stage + 1, "B", a.mb)]
    end
    return false
  end
  while true do
    local stop, new = true, {}
    for r = 1, pp do
      local a = order[r][ptr[r]]
      if ptr[r] <= #order[r] then
        stop = false
        if a then
          if not need_bubble(a) then
            result[r][#result[r] + 1] = a
            if a.mb then new[#new + 1] = key(a) end
            ptr[r] = ptr[r] + 1
          else
            result[r][#result[r] + 1] = false
          end
        else
          ptr[r] = ptr[r] + 1
          result[r][#result[r] + 1] = false
        end
      end
    end
    for _, k in ipairs(new) do seen[k] = true end
    if stop then break end
  end
  return result
end

-- ScheduleZBVZeroBubble._calculate_single_rank_operations (schedules.py:4501).
local function zbv(rank, pp, n)
  local num_stages = 2 * pp
  local n_micro = max(2 * pp - 1, n)
  local out = {}
  for _ = 1, rank do out[#out + 1] = false end
  local f0, f1, b0, b1 = 0, 0, 0, 0
  local c0, c1 = rank, num_stages - 1 - rank
  local function add(s, t, m) out[#out + 1] = act(s, t, m) end
  for _ = 1, 2 * (pp - rank) - 1 do add(c0, "F", f0); f0 = f0 + 1 end
  for _ = 1, rank do add(c1, "F", f1); f1 = f1 + 1; add(c0, "F", f0); f0 = f0 + 1 end
  for _ = 1, pp - rank do
    add(c1, "F", f1); f1 = f1 + 1
    add(c1, "I", b1); add(c1, "W", b1); b1 = b1 + 1
  end
  while f1 < f0 or f0 < n_micro do
    if f0 < n_micro then add(c0, "F", f0); f0 = f0 + 1 end
    add(c0, "I", b0); add(c0, "W", b0); b0 = b0 + 1
    add(c1, "F", f1); f1 = f1 + 1
    add(c1, "I", b1); add(c1, "W", b1); b1 = b1 + 1
  end
  local w0, w1 = b0, b1
  for _ = 1, rank do add(c0, "I", b0); b0 = b0 + 1; add(c1, "I", b1); b1 = b1 + 1 end
  for _ = 1, pp - rank do add(c0, "I", b0); b0 = b0 + 1; add(c0, "W", w0); w0 = w0 + 1 end
  while w1 < b1 do add(c1, "W", w1); w1 = w1 + 1 end
  while w0 < b0 do add(c0, "W", w0); w0 = w0 + 1 end
  -- n_micro may exceed n: torch turns those actions into None.
  for i, a in ipairs(out) do
    if a and not (a.mb and a.mb < n) then out[i] = false end
  end
  return out
end

-- ScheduleDualPipeV._calculate_single_rank_operations (schedules.py:4716).
local function dualpipev(rank, pp, n)
  local out, counters, weight_queue = {}, {}, {}
  local s0, s1 = rank, 2 * pp - 1 - rank  -- generate_rank_to_stage_mapping(..., "v")[rank]
  local function get(s, t) return counters[s .. t] or 0 end
  local function bump_bw(s) counters[s .. "I"] = get(s, "I") + 1; counters[s .. "W"] = get(s, "W") + 1 end
  local function add(s, t)
    local m = get(s, t == "B" and "I" or t)
    out[#out + 1] = act(s, t, m)
    if t == "B" then bump_bw(s)
    else
      if t == "I" then weight_queue[#weight_queue + 1] = { s, m } end
      counters[s .. t] = m + 1
    end
  end
  local function overlap(fs, bs)
    local fm, bm = get(fs, "F"), get(bs, "I")
    out[#out + 1] = { type = "OVERLAP_F_B", stage = -1, sub = { act(fs, "F", fm), act(bs, "B", bm) } }
    counters[fs .. "F"] = fm + 1
    bump_bw(bs)
  end
  local function weight()
    if #weight_queue == 0 then return end
    local w = table.remove(weight_queue, 1)
    out[#out + 1] = act(w[1], "W", w[2])
    counters[w[1] .. "W"] = get(w[1], "W") + 1
  end
  for _ = 1, (pp - rank - 1) * 2 do add(s0, "F") end
  for _ = 1, rank + 1 do add(s0, "F"); add(s1, "F") end
  for _ = 1, pp - rank - 1 do add(s1, "I"); weight(); add(s1, "F") end
  for i = 0, n - pp * 2 + rank do
    if i == 0 and rank == pp - 1 then add(s0, "F"); add(s1, "B")
    else overlap(s0, s1) end
    overlap(s1, s0)
  end
  for _ = 1, pp - rank - 1 do add(s1, "B"); overlap(s1, s0) end
  local step6, zb = rank + 1, false
  for i = 0, step6 - 1 do
    if i == step6 // 2 and rank % 2 == 1 then zb = true end
    add(s1, zb and "I" or "B")
    if i == step6 // 2 and rank % 2 == 0 then zb = true end
    add(s0, zb and "I" or "B")
  end
  for _ = 1, pp - rank - 1 do weight(); add(s0, zb and "I" or "B") end
  for _ = 1, rank + 1 do weight() end
  return out
end

-- ---------------------------------------------------------------- lowering passes

local function parts(a) return a.sub or { a } end

-- _add_reduce_grad (schedules.py:1691), defer_reduce_grad_wait=False: drops
-- None; after a stage's n-th W or B (sub-actions too) adds REDUCE_GRAD and
-- WAIT_REDUCE_GRAD for it.
local function add_reduce_grad(actions, n)
  local out, cnt = {}, {}
  for _, a in ipairs(actions) do
    if a then
      out[#out + 1] = a
      for _, p in ipairs(parts(a)) do
        if p.type == "W" or p.type == "B" then
          cnt[p.stage] = (cnt[p.stage] or 0) + 1
          if cnt[p.stage] == n then
            out[#out + 1] = act(p.stage, "REDUCE_GRAD", nil)
            out[#out + 1] = act(p.stage, "WAIT_REDUCE_GRAD", nil)
          end
        end
      end
    end
  end
  return out
end

-- _add_unshard_reshard (schedules.py:1744) with unshard_lookahead equal to
-- max_active_stages (torch's default "full", _resolve_unshard_lookahead
-- schedules.py:1841). next_stage_indices scans the remaining actions for
-- `count` distinct stages, stopping after the (atomic) action that reaches
-- the count; the scan is precomputed backwards as each position's distinct
-- stages in first-use order (a rank holds few stages).
local function add_unshard_reshard(actions, max_active)
  local L = #actions
  local suffix = {}  -- suffix[i] = { {stage, first_index}, ... } for actions i..L
  suffix[L + 1] = {}
  for i = L, 1, -1 do
    local a, cur, seen = actions[i], {}, {}
    if a then
      for _, p in ipairs(parts(a)) do
        if not seen[p.stage] then seen[p.stage] = true; cur[#cur + 1] = { p.stage, i } end
      end
    end
    for _, e in ipairs(suffix[i + 1]) do
      if not seen[e[1]] then seen[e[1]] = true; cur[#cur + 1] = e end
    end
    suffix[i] = cur
  end
  local function next_stages(count, i)
    local d, ret = suffix[i], {}
    local stop_at = d[count] and d[count][2]
    for _, e in ipairs(d) do
      if stop_at and e[2] > stop_at then break end
      ret[#ret + 1] = e[1]
    end
    return ret
  end
  local active, out = {}, {}  -- active: stages in insertion order
  local function is_active(s) for _, x in ipairs(active) do if x == s then return true end end return false end
  for i, a in ipairs(actions) do
    if a then
      local n_stages, seen = 0, {}
      for _, p in ipairs(parts(a)) do if not seen[p.stage] then seen[p.stage] = true; n_stages = n_stages + 1 end end
      if n_stages > max_active then
        err(fmt("action %s needs %d stages, more than max_active_stages = %d (schedules.py:1811); raise max_active_stages",
          key(a), n_stages, max_active))
      end
      local resident = next_stages(max_active, i)
      local in_resident = {}
      for _, s in ipairs(resident) do in_resident[s] = true end
      local keep = {}
      for _, s in ipairs(active) do
        if in_resident[s] then keep[#keep + 1] = s else out[#out + 1] = act(s, "RESHARD", nil) end
      end
      active = keep
      for _, s in ipairs(resident) do  -- prefetch == resident when lookahead == max_active_stages
        if not is_active(s) then active[#active + 1] = s; out[#out + 1] = act(s, "UNSHARD", nil) end
      end
      out[#out + 1] = a
    end
  end
  for _, s in ipairs(active) do out[#out + 1] = act(s, "RESHARD", nil) end
  return out
end

-- The receive that feeds a compute action and the send that ships its
-- result, when the neighbouring stage lives on another rank
-- (_has_comms / _get_comms, schedules.py:2307, 2318).
local function has_comms(a, s2r, num_stages)
  if a.type == "F" then
    return a.stage ~= num_stages - 1 and s2r[a.stage + 1] ~= s2r[a.stage]
  elseif a.type == "I" or a.type == "B" then
    return a.stage ~= 0 and s2r[a.stage - 1] ~= s2r[a.stage]
  end
  return false
end

local function comms_of(a)
  if a.type == "F" then return act(a.stage, "SEND_F", a.mb), act(a.stage + 1, "RECV_F", a.mb) end
  return act(a.stage, "SEND_B", a.mb), act(a.stage - 1, "RECV_B", a.mb)
end

-- _add_send_recv (schedules.py:2293): a lockstep sweep over the ranks in
-- order; a compute action is placed once its input is local or its receive
-- was already placed on its rank (_ready_to_schedule, schedules.py:2329); its
-- send follows it and the matching receive is appended to the peer's list at
-- the same moment.
local function add_send_recv(lists, s2r, num_stages)
  local pp = #lists
  local out, prev, pos = {}, {}, {}
  for r = 1, pp do out[r], prev[r], pos[r] = {}, {}, 1 end
  local function ready(a, p)
    if not a then return true end
    if a.type == "F" and a.stage ~= 0 then
      return p[k3(a.stage, "RECV_F", a.mb)] or p[k3(a.stage - 1, "F", a.mb)] or false
    elseif (a.type == "I" or a.type == "B") and a.stage ~= num_stages - 1 then
      return p[k3(a.stage, "RECV_B", a.mb)] or p[k3(a.stage + 1, "I", a.mb)] or p[k3(a.stage + 1, "B", a.mb)] or false
    end
    return true
  end
  local live = 0
  for r = 1, pp do if #lists[r] > 0 then live = live + 1 end end
  while live > 0 do
    local progress = false
    for r = 1, pp do
      local a = lists[r][pos[r]]
      if pos[r] <= #lists[r] then
        local all = a and parts(a) or { false }
        local ok = true
        for _, x in ipairs(all) do if not ready(x, prev[r]) then ok = false; break end end
        if ok then
          if a then
            out[r][#out[r] + 1] = a
            for _, x in ipairs(all) do
              prev[r][key(x)] = true
              if has_comms(x, s2r, num_stages) then
                local send, recv = comms_of(x)
                out[r][#out[r] + 1] = send
                prev[r][key(send)] = true
                local peer = s2r[recv.stage] + 1
                out[peer][#out[peer] + 1] = recv
                prev[peer][key(recv)] = true
              end
            end
          end
          pos[r] = pos[r] + 1
          if pos[r] > #lists[r] then live = live - 1 end
          progress = true
        end
      end
    end
    if not progress then
      local r = 1
      while pos[r] > #lists[r] do r = r + 1 end
      err(fmt("rank %d cannot place %s: its input is never received (_add_send_recv, schedules.py:2403); fix the compute order",
        r - 1, key(lists[r][pos[r]])))
    end
  end
  return out
end

-- _add_wait_send (schedules.py:1929): a forward send is waited right after
-- the local backward (B or I) of the same stage and microbatch; every other
-- send at the end of the list, in send order.
local function add_wait_send(lists)
  local out = {}
  for r, list in ipairs(lists) do
    local pending, order, o = {}, {}, {}
    for _, a in ipairs(list) do
      o[#o + 1] = a
      if a.type == "SEND_F" or a.type == "SEND_B" then
        local k = key(a)
        if pending[k] then err(fmt("rank %d sends %s twice; fix the schedule", r - 1, k)) end
        pending[k] = a
        order[#order + 1] = a
      end
      for _, p in ipairs(parts(a)) do
        if p.type == "B" or p.type == "I" then
          local k = k3(p.stage, "SEND_F", p.mb)
          if pending[k] then o[#o + 1] = act(p.stage, "WAIT_SEND_F", p.mb); pending[k] = nil end
        end
      end
    end
    for _, a in ipairs(order) do
      if pending[key(a)] then o[#o + 1] = act(a.stage, a.type == "SEND_F" and "WAIT_SEND_F" or "WAIT_SEND_B", a.mb) end
    end
    out[r] = o
  end
  return out
end

-- _defer_recv_ops (schedules.py:2412), torch's defer_pp_recv=True: each
-- receive moves down to its consumer, except that before a send to a higher
-- rank the receives from that rank are flushed first (rank parity).
local function defer_recv_ops(lists, s2r)
  local out = {}
  for r, list in ipairs(lists) do
    local rank, o, deferred = r - 1, {}, {}  -- deferred: ordered list of receives
    local function take(pred)
      local keep = {}
      for _, d in ipairs(deferred) do if pred(d) then o[#o + 1] = d else keep[#keep + 1] = d end end
      deferred = keep
    end
    for _, a in ipairs(list) do
      if a.type == "RECV_F" or a.type == "RECV_B" then
        deferred[#deferred + 1] = a
      else
        if a.type == "SEND_F" or a.type == "SEND_B" then
          local peer = s2r[a.type == "SEND_F" and a.stage + 1 or a.stage - 1]
          if rank < peer then
            take(function(d) return s2r[d.type == "RECV_F" and d.stage - 1 or d.stage + 1] == peer end)
          end
        end
        for _, p in ipairs(parts(a)) do
          local want = p.type == "F" and "RECV_F" or ((p.type == "B" or p.type == "I") and "RECV_B")
          if want then take(function(d) return d.type == want and d.stage == p.stage and d.mb == p.mb end) end
        end
        o[#o + 1] = a
      end
    end
    if #deferred > 0 then err(fmt("rank %d receives %s but never consumes it; fix the schedule", rank, key(deferred[1]))) end
    out[r] = o
  end
  return out
end

-- _PipelineScheduleRuntime._prepare_schedule_with_comms (schedules.py:3268),
-- format "compute_only", torch's defaults unless opts say otherwise
-- (max_active_stages 3, unshard_lookahead "full", defer_reduce_grad_wait
-- False, defer_pp_recv False, max_outstanding_sends None).
function M.lower_runtime(compute, s2r, num_stages, n, opts)
  opts = opts or {}
  local with_fsdp = {}
  for r, list in ipairs(compute) do
    with_fsdp[r] = add_reduce_grad(add_unshard_reshard(list, opts.max_active_stages or 3), n)
  end
  local lowered = add_wait_send(add_send_recv(with_fsdp, s2r, num_stages))
  if opts.defer_pp_recv then lowered = defer_recv_ops(lowered, s2r) end
  return lowered
end

-- What Schedule GPipe / 1F1B ._step_microbatches issue on rank `rank`
-- (schedules.py:1287, 1446). Every receive is waited just before the compute
-- that consumes it (implicit here, as in the runtime IR); sends are waited
-- where torch waits them. 1F1B fuses a forward send with the next backward
-- receive (and a backward send with the next forward receive) into one
-- _batch_p2p call; a mixed batch goes through dist.batch_isend_irecv
-- (schedules.py:844-890), so those pairs carry one `batch` number.
local function lower_single(name, rank, pp, n)
  local first, last = rank == 0, rank == pp - 1
  local out, batch = {}, 0
  local function add(t, m, b) out[#out + 1] = act(rank, t, m); out[#out].batch = b end
  local function pair(t1, m1, t2, m2)  -- one mixed _batch_p2p call
    batch = batch + 1
    add(t1, m1, batch); add(t2, m2, batch)
  end
  if name == "GPipe" then
    for m = 0, n - 1 do
      if not first then add("RECV_F", m) end
      add("F", m)
      if not last then add("SEND_F", m) end
    end
    if not last then for m = 0, n - 1 do add("WAIT_SEND_F", m) end end
    for m = 0, n - 1 do
      if not last then add("RECV_B", m) end
      add("B", m)
      if not first then add("SEND_B", m) end
    end
    if not first then for m = 0, n - 1 do add("WAIT_SEND_B", m) end end
  else
    local w = min(n, pp - rank)
    for f = 0, w - 1 do
      if not first then add("RECV_F", f) end
      add("F", f)
      if f > 0 and not last then add("WAIT_SEND_F", f - 1) end
      if f ~= w - 1 and not last then add("SEND_F", f) end
    end
    local f, b = w, 0
    while true do
      if not last then pair("SEND_F", f - 1, "RECV_B", b); add("WAIT_SEND_F", f - 1) end
      add("B", b)
      b = b + 1
      if f == n then break end
      if not first then pair("SEND_B", b - 1, "RECV_F", f); add("WAIT_SEND_B", b - 1) end
      add("F", f)
      f = f + 1
    end
    if not first then add("SEND_B", b - 1) end
    while b < n do
      if not last then add("RECV_B", b) end
      add("B", b)
      if not first then add("WAIT_SEND_B", b - 1); add("SEND_B", b) end
      b = b + 1
    end
    if not first then add("WAIT_SEND_B", n - 1) end
  end
  add("REDUCE_GRAD", nil)  -- perform_reduce_grad at the end of _step_microbatches
  return out
end

-- ---------------------------------------------------------------- validation

local function is_int(v) return math.type(v) == "integer" end

local function check_inputs(spec)
  if type(spec) ~= "table" then err("expected a table { schedule, pp, microbatches, stages_per_rank }") end
  local name = spec.schedule
  local known = false
  for _, s in ipairs(M.SCHEDULES) do if s == name then known = true end end
  if not known then
    local hint = util.did_you_mean(type(name) == "string" and name or "", M.SCHEDULES)
    err(fmt("schedule = %s is not a torch schedule; use one of %s%s", util.show(name), table.concat(M.SCHEDULES, ", "),
      hint and (" (did you mean " .. hint .. "?)") or ""))
  end
  for _, f in ipairs({ "pp", "microbatches" }) do
    if not is_int(spec[f]) or spec[f] < 1 then
      err(fmt("%s = %s must be a positive integer; set %s", f, util.show(spec[f]), f))
    end
  end
  local pp, n = spec.pp, spec.microbatches
  if pp > 4096 or n > 1 << 20 then
    err(fmt("pp = %d, microbatches = %d: beyond this module's limits (pp <= 4096, microbatches <= 1048576); lower them", pp, n))
  end
  local v = spec.stages_per_rank
  if v == nil then v = SINGLE[name] and 1 or 2 end
  if not is_int(v) or v < 1 or v > 64 then
    err(fmt("stages_per_rank = %s must be an integer in 1..64; set stages_per_rank", util.show(v)))
  end
  if SINGLE[name] and v ~= 1 then
    -- PipelineScheduleSingle.__init__ takes one stage (schedules.py:1047).
    err(fmt("stages_per_rank = %d: %s runs one stage per rank; set stages_per_rank = 1 or use Interleaved1F1B", v, name))
  end
  if V_STYLE[name] and v ~= 2 then
    -- schedules.py:4483 (ZBV) and 4693 (DualPipeV): "requires exactly 2 stages per rank".
    err(fmt("stages_per_rank = %d: %s requires exactly 2 stages per rank (schedules.py:%d); set stages_per_rank = 2",
      v, name, name == "DualPipeV" and 4693 or 4483))
  end
  if name == "1F1B" and n < pp then
    -- Schedule1F1B.__init__ (schedules.py:1439).
    err(fmt("microbatches = %d < pp = %d: 1F1B needs at least as many microbatches as stages (schedules.py:1439); " ..
      "set microbatches >= %d or use GPipe", n, pp, pp))
  end
  if name == "Interleaved1F1B" or name == "InterleavedZeroBubble" then
    -- number_of_rounds = max(1, n // pp); n % rounds == 0 (schedules.py:4120-4128, 4255-4263).
    local rounds = max(1, n // pp)
    if n % rounds ~= 0 then
      local lo, hi = n - n % rounds, n + (rounds - n % rounds)
      err(fmt("microbatches = %d: %s needs microbatches to be a multiple of its rounds max(1, microbatches // pp) = %d " ..
        "(schedules.py:%d); use %d or %d", n, name, rounds, name == "Interleaved1F1B" and 4123 or 4258, lo, hi))
    end
  end
  if name == "DualPipeV" and n < 2 * pp then
    -- ScheduleDualPipeV.__init__ (schedules.py:4697).
    err(fmt("microbatches = %d < %d stages: DualPipeV needs at least as many microbatches as stages (schedules.py:4697); " ..
      "set microbatches >= %d", n, 2 * pp, 2 * pp))
  end
  return name, pp, n, v
end

-- ---------------------------------------------------------------- derive

-- M.derive(spec) -> {
--   schedule, pp, microbatches, stages_per_rank, num_stages, style ("loop" | "v"),
--   runtime ("single": PipelineScheduleSingle._step_microbatches;
--            "multi": _PipelineScheduleRuntime over `lowered`),
--   stage_to_rank = { [stage] = rank },
--   compute  = per rank, the compute actions in the order the rank runs them
--              (multi-stage: torch's pipeline_order, None steps as false);
--   torch_order = per rank, torch's `pipeline_order` dict as torch builds it
--              (single-stage: _get_pipeline_order, after its _add_reduce_grad);
--   lowered  = per rank, every action the rank issues, P2P and FSDP included }
-- spec.unchecked = true skips the input rules (tests use it to show what the
-- proof says about schedules torch refuses).
function M.derive(spec)
  local name, pp, n, v
  if spec.unchecked then
    name, pp, n, v = spec.schedule, spec.pp, spec.microbatches, spec.stages_per_rank or (SINGLE[spec.schedule] and 1 or 2)
  else
    name, pp, n, v = check_inputs(spec)
  end
  local num_stages = pp * v
  local style = V_STYLE[name] and "v" or "loop"
  local s2r = M.stage_to_rank(pp, num_stages, style)
  local res = { schedule = name, pp = pp, microbatches = n, stages_per_rank = v, num_stages = num_stages, style = style,
                stage_to_rank = s2r, compute = {}, torch_order = {}, lowered = {} }
  if SINGLE[name] then
    res.runtime = "single"
    for r = 0, pp - 1 do
      local c = name == "GPipe" and gpipe_compute(r, n) or onef1b_compute(r, pp, n)
      res.compute[r + 1] = c
      res.torch_order[r + 1] = add_reduce_grad(name == "GPipe" and c or onef1b_torch_order(r, pp, n), n)
      res.lowered[r + 1] = lower_single(name, r, pp, n)
    end
    return res
  end
  res.runtime = "multi"
  for r = 0, pp - 1 do
    local c
    if name == "LoopedBFS" then c = looped_bfs(r, pp, v, n)
    elseif name == "Interleaved1F1B" then c = interleaved(r, pp, v, n, false)
    elseif name == "InterleavedZeroBubble" then c = interleaved(r, pp, v, n, true)
    elseif name == "ZBVZeroBubble" then c = zbv(r, pp, n)
    else c = dualpipev(r, pp, n) end
    res.compute[r + 1] = c
  end
  if name == "InterleavedZeroBubble" then res.compute = add_bubbles(res.compute, pp, num_stages) end
  res.torch_order = res.compute
  res.lowered = M.lower_runtime(res.compute, s2r, num_stages, n,
    { defer_pp_recv = spec.defer_pp_recv, max_active_stages = spec.max_active_stages })
  return res
end

-- ---------------------------------------------------------------- CSV and the proof

-- torch's CSV format (gen/parallel/pp_csv.lua) and the point-to-point
-- proof (gen/parallel/pp_proof.lua), each its own module; required when
-- called (they use this module's action strings and lowering).
function M.to_csv(lists) return require("gen.parallel.pp_csv").to_csv(lists) end
function M.from_csv(text, opts) return require("gen.parallel.pp_csv").from_csv(text, opts) end
function M.import_csv(text, opts) return require("gen.parallel.pp_csv").import_csv(text, opts) end
function M.prove_p2p(lowered, s2r, num_stages, opts)
  return require("gen.parallel.pp_proof").prove_p2p(lowered, s2r, num_stages, opts)
end

-- (for pp_csv.lua and pp_proof.lua: the memoized action string, the
-- action constructor and the error helper)
M.key, M.act, M.err, M.has_comms = key, act, err, has_comms

return M
