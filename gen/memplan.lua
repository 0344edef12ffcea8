-- Memory plan: every transient buffer of one rank (per unit: all-gather
-- buffer, unsharded params, unsharded grads, reduce-scatter input and
-- output) gets a fixed offset in one arena, so buffers whose lifetimes in
-- the step do not overlap share memory, as PyTorch's caching allocator
-- reuses FSDP2's freed blocks at run time. A rank of Llama-3-70B then needs
-- a few units' worth of buffers, not all 81 at once.
--
-- Lifetimes are op-index intervals of the schedule (inclusive):
--   ag         copy_in .. copy_out            (every unshard)
--   unsharded  copy_out .. reshard            (every unshard)
--   grads      the unit's first backward since its last pack .. pack
--              (once per reduction); from the copy_out before it where
--              that unshard serves the backward (no other unit computes
--              between: the library's cp_gpu_unshard then orders the
--              grads' memory as well), not from a forward's unshard kept
--              through the forward (reshard_after_forward = false)
--   rs_in      pack .. reduce_scatter
--   rs_out     reduce_scatter .. view_out (or view_out_add, partial_save,
--              partial_add)
--   partial    partial_save .. partial_fold (all_reduce_last: the reduce-
--              scatter outputs awaiting the last micro-step's all-reduce)
--   h2d        h2d .. copy_in (CPU offload: the device copy of the host's
--              sharded parameters, their stored dtype)
--   d2h        view_out .. d2h (or d2h_add; CPU offload: the device's
--              viewed-out gradient awaiting its copy to the host)
--   post_forward  post_forward .. the all-gather over the post-forward
--              group (reshard_after_forward = k: the rank's kept slice)
--   act        each TP activation collective alone (the compute around it
--              owns its activations; this buffer is the collective's)
-- Offsets come from greedy placement by size (largest first, lowest free
-- offset), the usual arena planner. Where a buffer reuses bytes another
-- buffer held earlier in the step, the op that opens the later lifetime
-- must wait on the GPU for the op that closed the earlier one, whatever
-- streams they run on: those edges are emitted as event waits.
--
-- Such a wait costs time where the closing op runs on another stream and
-- has not finished when the opening op could start: the compute stream's
-- copy-out waiting for the reduce-scatter that read the bytes last. So,
-- as FSDP2's caching allocator does, the placement trades free memory for
-- overlap (memplan.holds): given the predicted step (gen/timeline.lua)
-- and the bytes the rank's memory verdict leaves the arena (gen/
-- memory.lua), it keeps those bytes from the lives that would reuse them
-- before the other stream is done, reusing them at once only where
-- memory is short, and reports what that costs (policy, reuse_* and
-- gen/figures.lua's memory_plan: SCHEDULE.md's summary and warnings).
local util = require("gen.util")
local opkinds = require("gen.opkinds")
local spantree = require("gen.spantree")

local memplan = {}

memplan.ALIGN = 256 -- bytes: cudaMalloc's alignment, and 16-byte vector access
memplan.KINDS = { "ag", "unsharded", "grads", "rs_in", "rs_out", "act", "partial", "pp", "a2a_counts", "a2a_send",
                  "a2a_recv", "h2d", "d2h", "post_forward" }

-- The stream whose allocations a buffer belongs to: the one running the op
-- that opens its lifetimes. As in PyTorch's caching allocator (a pool per
-- stream), bytes are reused only within a pool: were the all-reduce
-- stream's rs_out handed to the next unit's copy-out on the compute stream,
-- that copy-out would wait for the all-reduce, and compute behind it.
memplan.POOL = { ag = "copy_in", unsharded = "compute", grads = "compute", rs_in = "compute",
                 rs_out = "reduce_scatter", act = "compute", partial = "reduce_scatter", pp = "compute",
                 a2a_counts = "compute", a2a_send = "compute", a2a_recv = "compute", h2d = "copy_in",
                 d2h = "reduce_scatter", post_forward = "compute" }

-- fsdp.symm_mem (torchtitan's enable_fsdp_symm_mem): the buffers FSDP2
-- allocates from its symmetric-memory pool and rendezvouses on the
-- collective's group (torch 2.15 _fsdp_collectives.py:89-104 and 141-231):
-- the all-gather output (SymmMemAllGather, every unit: u.symm.ag) and the
-- reduce-scatter input and output (SymmMemReduceScatter, where the unit
-- forces sum reductions: u.symm.rs; _fsdp_param_group.py:402-422). They
-- take the window [0, symm.window_bytes) at the arena's start, which the
-- runtime allocates with ncclMemAlloc and registers as one symmetric
-- window on each communicator that runs them (runtime/gpu.c); gen/symm.lua
-- proves every rank of a communicator places each at the same offset.
memplan.SYMM_KINDS = { ag = "ag", rs_in = "rs", rs_out = "rs" }

-- Is the unit's buffer of this kind symmetric?
function memplan.is_symm(u, kind)
  local which = memplan.SYMM_KINDS[kind]
  return (which and u.symm and u.symm[which]) and true or false
end

local ES = util.DTYPE_BYTES
local STREAMS = opkinds.STREAMS
-- The op kinds each library call issues together (runtime/executor.c
-- cp_call_unshard / cp_call_reduce; the Python bridge's CALL_KINDS).
-- kind -> { call, position in the call's kinds }.
local CALL_OF = {
  h2d = { "unshard", 1 }, copy_in = { "unshard", 2 }, all_gather = { "unshard", 3 }, copy_out = { "unshard", 4 },
  pack = { "reduce", 1 }, reduce_scatter = { "reduce", 2 }, partial_save = { "reduce", 3 },
  partial_add = { "reduce", 4 }, partial_fold = { "reduce", 5 }, all_reduce = { "reduce", 6 },
  view_out = { "reduce", 7 }, view_out_add = { "reduce", 8 }, d2h = { "reduce", 9 }, d2h_add = { "reduce", 10 },
}

-- op seq -> the library call instance that issues it (nil: no call does),
-- grouped as runtime/executor.c cp_run_call groups them: a unit's next
-- instance starts at its call's first kind or at an earlier kind.
local function call_instances(ops)
  local inst, open, n = {}, {}, 0
  for _, o in ipairs(ops) do
    local c = CALL_OF[o.kind]
    if c then
      local key = o.unit .. "\0" .. c[1]
      local cur = open[key]
      if not cur or c[2] == 1 or c[2] < cur.k then
        n = n + 1
        cur = { id = n }
        open[key] = cur
      end
      cur.k = c[2]
      inst[o.seq] = cur.id
    end
  end
  return inst
end

-- micro_steps: the step's (the pp buffer holds a message per direction
-- and micro-step, runtime/arena.c); 1 where the caller does not say.
local function sizes_of(lay, u, micro_steps)
  local W = u.W or lay.W -- (expert parallelism's experts: their efsdp group)
  return {
    -- (a unit of mixed all-gather dtypes: its slot's bytes, u.ag_bytes)
    ag = W * (u.ag_bytes or u.total * ES[u.ag_dtype]), unsharded = u.unsharded_bytes or W * u.total * ES[u.ag_dtype],
    -- (the reduce-scatter row: the trainable parameters' shards, u.rs_total; fsdp_layout.lua)
    grads = u.grads_numel * ES[u.grad_dtype], rs_in = W * u.rs_total * ES[u.reduce_dtype],
    rs_out = u.rs_total * ES[u.reduce_dtype], act = (u.act_numel or 0) * ES[u.ag_dtype],
    partial = u.partial and u.rs_total * ES[u.reduce_dtype] or 0,
    pp = 2 * (micro_steps or 1) * (u.pp_numel or 0) * ES[u.ag_dtype],
    -- expert parallelism (runtime/arena.c): [slot][sent, received][expert] int64, and two token buffers
    a2a_counts = 2 * (u.a2a_slots or 0) * (u.a2a_experts or 0) * 8,
    a2a_send = (u.a2a_numel or 0) * ES[u.ag_dtype], a2a_recv = (u.a2a_numel or 0) * ES[u.ag_dtype],
    -- CPU offload's device copies (runtime/arena.c): the shard in its stored dtype
    h2d = u.offload and u.total * ES[u.orig_dtype] or 0, d2h = u.offload and u.rs_total * ES[u.orig_dtype] or 0,
    -- reshard_after_forward = k: the rank's post-forward slice (runtime/arena.c)
    post_forward = u.post_forward and u.post_forward.count * (u.ag_bytes and 1 or ES[u.ag_dtype]) or 0,
  }
end

-- Whether op o's parameters (its part's, else the unit's) include one
-- with a gradient (requires_grad: not frozen, gen/parallel/fsdp_layout.lua).
local function any_trainable(u, o)
  local lo, hi = 1, #u.params
  if o.part_first then lo, hi = o.part_first + 1, o.part_first + o.part_count end
  for j = lo, hi do
    if not u.params[j].frozen then return true end
  end
  return false
end

-- unit index -> kind -> list of { first = op seq, last = op seq }.
local function lifetimes(lay, ops)
  local life, open = {}, {}
  for _, u in ipairs(lay.units) do
    life[u.index] = { ag = {}, unsharded = {}, grads = {}, rs_in = {}, rs_out = {}, act = {}, partial = {}, pp = {},
                      a2a_counts = {}, a2a_send = {}, a2a_recv = {}, h2d = {}, d2h = {}, post_forward = {} }
    open[u.index] = {}
  end
  local function start(u, kind, seq)
    if open[u][kind] then return end
    local iv = { first = seq }
    open[u][kind] = iv
    table.insert(life[u][kind], iv)
  end
  local function stop(u, kind, seq)
    local iv = open[u][kind]
    if iv then iv.last = seq; open[u][kind] = false end
  end
  -- computes: forward and backward ops so far, in all and per unit; at
  -- each copy-out, both counts then (for "no other unit computed since").
  local last_copy_out, computes, own, at_out, own_at_out = {}, 0, {}, {}, {}
  local pp_last = {} -- unit -> the last send or receive of its messages
  local a2a_last = {} -- unit -> its last all-to-all (its counts live from the first to the last)
  for _, o in ipairs(ops) do
    local u, k, s = o.unit, o.kind, o.seq
    if k == "h2d" then start(u, "h2d", s)
    elseif k == "copy_in" or (k == "all_gather" and o.from_sharded) then
      stop(u, "h2d", s); start(u, "ag", s)
    elseif k == "all_gather" and o.post_forward then stop(u, "post_forward", s); start(u, "ag", s)
    elseif k == "post_forward" then start(u, "post_forward", s)
    elseif k == "copy_out" then
      stop(u, "ag", s); start(u, "unsharded", s); last_copy_out[u] = s
      at_out[u], own_at_out[u] = computes, own[u] or 0
    elseif k == "reshard" then stop(u, "unsharded", s)
    elseif k == "backward" then
      -- From the unit's latest copy-out where that unshard serves this
      -- backward (no other unit computes between: the library's
      -- cp_gpu_unshard opens the grads, runtime/arena.c), after the
      -- packing that ended the previous life; else (a forward's unshard
      -- kept through the forward, as without reshard_after_forward) from
      -- the backward itself.
      -- (a backward whose parameters are all frozen makes no unsharded grads)
      if not open[u].grads and any_trainable(lay.units[u + 1], o) then
        local lives, from = life[u].grads, last_copy_out[u] or s
        if #lives > 0 and from <= lives[#lives].last then from = s end
        if from ~= s and computes - at_out[u] ~= (own[u] or 0) - own_at_out[u] then from = s end
        if o.sharded then from = s end -- (no unshard serves it: set_unshard_in_backward(False))
        start(u, "grads", from)
      end
    elseif k == "pack" then stop(u, "grads", s); start(u, "rs_in", s)
    elseif k == "reduce_scatter" then stop(u, "rs_in", s); start(u, "rs_out", s)
    elseif k == "view_out" or k == "view_out_add" or k == "partial_add" then
      stop(u, "rs_out", s)
      if o.offload then start(u, "d2h", s) end
    elseif k == "d2h" or k == "d2h_add" then stop(u, "d2h", s)
    elseif k == "partial_save" then stop(u, "rs_out", s); start(u, "partial", s)
    elseif k == "partial_fold" then stop(u, "partial", s)
    elseif opkinds.BY_NAME[k].tp then start(u, "act", s); stop(u, "act", s) -- one collective's worth
    elseif opkinds.BY_NAME[k].p2p then start(u, "pp", s); pp_last[u] = s -- one life: first to last message
    elseif opkinds.BY_NAME[k].a2a then
      -- the counts live from the forward's exchange to the unit's last
      -- all-to-all (the backward's splits are the forward's); the token
      -- buffers only across one pair: the forward's dispatch..combine, the
      -- backward's combine gradient..dispatch gradient (a2a_combine 0 opens,
      -- 1 closes), so the layers' token buffers share bytes
      start(u, "a2a_counts", s); a2a_last[u] = s
      if k == "a2a" then
        start(u, "a2a_send", s); start(u, "a2a_recv", s)
        if o.a2a_combine == 1 or o.a2a_combine == true then stop(u, "a2a_send", s); stop(u, "a2a_recv", s) end
      end
    end
    if k == "forward" or k == "backward" or k == "backward_input" then
      computes = computes + 1
      own[u] = (own[u] or 0) + 1
    end
  end
  for u, s in pairs(pp_last) do stop(u, "pp", s) end
  for u, s in pairs(a2a_last) do stop(u, "a2a_counts", s) end
  for _, u in ipairs(lay.units) do
    for _, kind in ipairs(memplan.KINDS) do
      if open[u.index][kind] then
        error(string.format("internal: %s of unit %s is still live at the end of the step", kind, u.name), 0)
      end
    end
  end
  return life
end

-- Every stage below is linear in the lives of the buffers or n log n: the
-- step holds units x micro-steps lifetimes, and a buffer is compared only
-- with the buffers live beside it (in time) or sharing its bytes (in space)
-- through sweeps in op order, never with every other buffer.

-- For each buffer, the buffers of its pool whose lives overlap one of its
-- own (inclusive op intervals): one sweep over all lives in op order,
-- keeping the lives still open. Lists in the order the sweep meets them.
-- held: compare the held lives (b.held, see memplan.holds) instead.
local function time_neighbours(bufs, held)
  -- lives in order of their first op (buckets by op: no sort; the order
  -- among lives that open at the same op changes no pair found)
  local at, top = {}, 0
  for _, b in ipairs(bufs) do
    for _, iv in ipairs(held and b.held or b.lives) do
      local f = iv.first + 1
      local x = { first = iv.first, last = iv.last, buf = b }
      if at[f] then table.insert(at[f], x) else at[f] = { x } end
      if f > top then top = f end
    end
  end
  local lives = {}
  for f = 1, top do
    local list = at[f]
    if list then table.move(list, 1, #list, #lives + 1, lives) end
  end
  local near, seen = {}, {}
  for _, b in ipairs(bufs) do near[b], seen[b] = {}, {} end
  local open, n = {}, 0 -- the lives still open, compacted in place
  for _, x in ipairs(lives) do
    local kept = 0
    local a = x.buf
    for i = 1, n do
      local y = open[i]
      if y.last >= x.first then
        kept = kept + 1
        open[kept] = y
        local c = y.buf
        if a.pool == c.pool and a ~= c and not seen[a][c] then
          seen[a][c], seen[c][a] = true, true
          near[a][#near[a] + 1] = c
          near[c][#near[c] + 1] = a
        end
      end
    end
    for i = kept + 1, n do open[i] = nil end
    n = kept + 1
    open[n] = x
  end
  return near
end

-- Disjoint, sorted byte ranges { start, stop } (stop exclusive).
-- The first range whose stop is past off, by binary search.
local function first_past(list, off)
  local lo, hi, found = 1, #list, nil
  while lo <= hi do
    local mid = (lo + hi) // 2
    if list[mid][2] > off then found = mid; hi = mid - 1 else lo = mid + 1 end
  end
  return found
end

-- Adds [start, stop) to a disjoint sorted list, merging what it touches.
local function union_add(list, start, stop)
  local i = first_past(list, start - 1) or #list + 1 -- first range with stop >= start
  local j = i
  while j <= #list and list[j][1] <= stop do
    if list[j][1] < start then start = list[j][1] end
    if list[j][2] > stop then stop = list[j][2] end
    j = j + 1
  end
  local n, merged = #list, j - i
  if merged == 0 then
    table.insert(list, i, { start, stop })
    return
  end
  list[i] = { start, stop }
  table.move(list, j, n, i + 1)
  for k = n - merged + 2, n do list[k] = nil end
end

-- The lowest offset where size bytes overlap no range of mine or of the
-- lists in others (the lowest fit: every offset below it overlaps some
-- range, since it only ever moves past a range that overlaps the
-- candidate).
local function lowest_fit(mine, others, size, floor)
  local off, moved = floor or 0, true
  while moved do
    moved = false
    local i = first_past(mine, off)
    if i and mine[i][1] < off + size then off, moved = mine[i][2], true end
    for _, list in ipairs(others) do
      i = first_past(list, off)
      if i and list[i][1] < off + size then off, moved = list[i][2], true end
    end
  end
  return off
end

-- The byte cells between consecutive buffer boundaries: each placed
-- buffer covers cells lo..hi, and two buffers share a byte exactly when
-- they share a cell.
-- Also the structures to sweep them with: per-cell arrays when no buffer
-- covers more than FLAT_SPAN cells (every shipped plan: a few units' worth
-- of offsets), else segment trees (O(log cells) whatever the spans).
memplan.FLAT_SPAN = 16
local function cells(placed)
  local set, bounds = {}, {}
  for _, b in ipairs(placed) do
    local x, y = b.offset, b.offset + b.size
    if not set[x] then set[x] = true; bounds[#bounds + 1] = x end
    if not set[y] then set[y] = true; bounds[#bounds + 1] = y end
  end
  table.sort(bounds)
  local index = {}
  for i, x in ipairs(bounds) do index[x] = i end
  local lo, hi, span = {}, {}, 0
  for _, b in ipairs(placed) do
    lo[b], hi[b] = index[b.offset], index[b.offset + b.size] - 1
    span = math.max(span, hi[b] - lo[b] + 1)
  end
  local flat = span <= memplan.FLAT_SPAN
  return lo, hi, math.max(1, #bounds - 1), flat and spantree.flat or spantree.new,
    flat and spantree.flat_counter or spantree.counter
end

-- Lives of the placed buffers bucketed by the op that opens them and the
-- op that closes them (op seq + 1 -> list of buffers). Offsets play no
-- part: memplan.build sweeps its buffers' lives under two placements and
-- in the proof, bucketed once.
local function by_op(placed)
  local opens, closes = {}, {}
  for _, b in ipairs(placed) do
    for _, iv in ipairs(b.lives) do
      local f, l = iv.first + 1, iv.last + 1
      local o, c = opens[f], closes[l]
      if o then o[#o + 1] = b else opens[f] = { b } end
      if c then c[#c + 1] = b else closes[l] = { b } end
    end
  end
  return opens, closes
end

-- The proof that no two buffers live at the same op share a byte: a sweep
-- in op order holding the open lives in a tree over the byte cells; a life
-- that opens on a cell an open life covers is an overlap.
local function check_disjoint(placed, n_ops, opens, closes)
  local lo, hi, n, _, counter = cells(placed)
  local count = counter(n)
  local open = {} -- buffer -> true while one of its lives is open (for the message)
  for i = 1, n_ops do
    local list = opens[i]
    if list then
      for _, b in ipairs(list) do
        local l, h = lo[b], hi[b]
        if count.top(l, h) > 0 then
          for _, c in ipairs(placed) do
            if open[c] and lo[c] <= h and l <= hi[c] then
              error(string.format("internal: arena plan overlaps %s of %s and %s of %s", c.kind, c.unit_name,
                b.kind, b.unit_name), 0)
            end
          end
        end
        count.add(l, h, 1)
        open[b] = true
      end
    end
    list = closes[i]
    if list then
      for _, b in ipairs(list) do
        count.add(lo[b], hi[b], -1)
        open[b] = false
      end
    end
  end
end

-- Reuse edges: a life that opens at op seq on bytes other lives held
-- follows, for every buffer q sharing a byte with it (itself included),
-- the op that closed q's latest life before seq. Only the latest such op
-- on each stream is kept: an op ordered after it on its stream is ordered
-- after every earlier op of that stream, so the waits chosen from the
-- edges (memplan.prune takes the latest unordered edge per stream) are the
-- same. One sweep in op order keeps each buffer's latest closing op in a
-- tree per stream of that op.
local function reuse_edges(placed, ops, needs, opens, closes)
  local lo, hi, n, latest = cells(placed)
  local trees = {}
  for k = 1, #STREAMS do trees[k] = latest(n) end
  local stream_index = {}
  for k, name in ipairs(STREAMS) do stream_index[name] = k end
  -- The trees that can hold a buffer of each pool (the streams of the ops
  -- that close its pool's lives); the others have no entry on its cells.
  local pool_trees, has = {}, {}
  for i, list in pairs(closes) do
    for _, q in ipairs(list) do
      local k = stream_index[ops[i].stream]
      has[q.pool] = has[q.pool] or {}
      if not has[q.pool][k] then
        has[q.pool][k] = true
        pool_trees[q.pool] = pool_trees[q.pool] or {}
        table.insert(pool_trees[q.pool], trees[k])
      end
    end
  end
  local NONE = {}
  local latest_tree, latest_id = {}, {}
  for i, o in ipairs(ops) do
    local seq = i - 1
    local list = opens[i]
    if list then
      local set = needs[seq]
      for _, b in ipairs(list) do
        local l, h = lo[b], hi[b]
        for _, tree in ipairs(pool_trees[b.pool] or NONE) do
          local j = tree.largest(l, h)
          if j then
            if not set then set = {}; needs[seq] = set end
            set[j] = true
          end
        end
      end
    end
    list = closes[i]
    if list then
      local tree = trees[stream_index[o.stream]]
      for _, q in ipairs(list) do
        local was = latest_tree[q]
        if was then was.remove(latest_id[q]) end
        latest_tree[q], latest_id[q] = tree, tree.insert(lo[q], hi[q], seq)
      end
    end
  end
end

-- Data dependencies inside each unit, from the op kinds' buffer accesses
-- (gen/opkinds.lua): a reader waits for the buffer's last writer, and a
-- writer for the readers since that write. The persistent shards are
-- written by the caller before the step (the step's fork orders them).
local function data_edges(ops, add)
  local last_writer, readers = {}, {} -- unit -> buffer -> op seq; unit -> buffer -> op seqs (false: none)
  for _, o in ipairs(ops) do
    local d = opkinds.access(o)
    local lw, rd = last_writer[o.unit], readers[o.unit]
    if not lw then
      lw, rd = {}, {}
      last_writer[o.unit], readers[o.unit] = lw, rd
    end
    local seq = o.seq
    for _, b in ipairs(d.reads) do
      local w = lw[b]
      if w then add(seq, w) end
    end
    for _, b in ipairs(d.writes) do
      local w = lw[b]
      if w then add(seq, w) end
      local r = rd[b]
      if r then
        for _, x in ipairs(r) do if x ~= seq then add(seq, x) end end
      end
    end
    for _, b in ipairs(d.reads) do
      local r = rd[b]
      if r then r[#r + 1] = seq else rd[b] = { seq } end
    end
    for _, b in ipairs(d.writes) do
      lw[b] = seq
      rd[b] = false
    end
  end
end

-- The GPU's ordering, followed op by op with a vector clock per stream:
-- each stream runs its ops in issue order, every side stream starts the
-- step after the compute stream's fork, and an op that waits for op j
-- sees everything j's stream had done by then. Nothing else orders work:
-- the executor issues exactly the emitted waits (op.stream, waits).
--
-- With fixed = nil it chooses the waits: for every needed edge (an op must
-- follow op j) not already implied, the latest j per stream, dropping one
-- that another chosen wait covers. With fixed = { seq -> list } it applies
-- exactly those and reports the first needed edge they leave unordered.
function memplan.simulate(ops, needs, fixed)
  local S = #STREAMS
  local index = {}
  for k, name in ipairs(STREAMS) do index[name] = k end
  -- (s - 1) * S + t: what stream s knows of stream t, from the waits of
  -- the ops the library's calls issue too (clock) and from every op's
  -- (full). An activation collective (TP's, CP's) is run by the caller
  -- outside those calls (torch's TP under the Python bridge), so its
  -- waits order later ops only in the binary's step: it needs and waits
  -- in the full view, every other op in the library's, so the waits
  -- chosen hold under both executors.
  local lib, full = {}, {}
  for k = 1, S * S do lib[k], full[k] = 0, 0 end
  local clock
  local on = {}    -- op seq -> its stream's index, once issued
  local after = {} -- seq * S + t: its stream's clock after it
  local function wait_for(base, j)
    if not on[j] then return end
    local at = j * S
    for t = 1, S do
      local v = after[at + t]
      if v > clock[base + t] then clock[base + t] = v end
    end
  end
  local waits, need, own = {}, {}, {}
  local inst = call_instances(ops)
  for _, o in ipairs(ops) do
    local seq = o.seq
    local s = index[o.stream]
    local base = (s - 1) * S
    local set = needs[seq]
    local foreign = opkinds.BY_NAME[o.kind].tp
    clock = foreign and full or lib
    if foreign then -- the full view knows all the library's view knows
      for t = 1, S do
        if lib[base + t] > full[base + t] then full[base + t] = lib[base + t] end
      end
    end
    if fixed then
      for _, j in ipairs(fixed[seq] or {}) do wait_for(base, j) end
      if set then
        for j in pairs(set) do
          local d = on[j]
          if clock[base + d] < after[j * S + d] then return waits, j, seq end
        end
      end
    elseif set then
      for t = 1, S do need[t], own[t] = false, false end
      for j in pairs(set) do
        local d = on[j]
        -- A need across streams inside one library call of the op's unit
        -- (a copy-out on its all-gather, an all-reduce on its
        -- reduce-scatter) is waited for directly: the library issues a
        -- unit's call alone, in another order than the step's, so another
        -- unit's wait cannot stand for it there (ep2_mixtral: the experts'
        -- copy-out counted on the dense unit's, issued before its gather).
        local mine = d ~= s and inst[j] ~= nil and inst[j] == inst[seq]
        if mine or clock[base + d] < after[j * S + d] then
          local had = need[d]
          if not had or j > had then need[d], own[d] = j, mine end
        end
      end
      local list
      for d = 1, S do
        local j = need[d]
        if j then
          local mine, covered = after[j * S + d], false
          for e = 1, S do
            local k = need[e]
            if k and e ~= d and after[k * S + d] >= mine then covered = true end
          end
          if own[d] or not covered then
            list = list or {}
            list[#list + 1] = j
          end
        end
      end
      if list then
        table.sort(list)
        for _, j in ipairs(list) do wait_for(base, j) end
        waits[seq] = list
      end
    end
    clock[base + s] = clock[base + s] + 1
    if foreign then
      lib[base + s] = clock[base + s]
    end
    on[seq] = s
    local at = seq * S
    for t = 1, S do after[at + t] = clock[base + t] end
  end
  return waits
end

-- The fewest waits that order every needed edge.
function memplan.prune(ops, needs)
  return (memplan.simulate(ops, needs, nil))
end

-- The proof: with only the emitted waits (and stream order), every needed
-- edge is ordered on the GPU. Returns nil or the first unordered edge as
-- (earlier seq, later seq).
function memplan.unordered(ops, needs, waits)
  local _, bad_j, bad_i = memplan.simulate(ops, needs, waits)
  return bad_j, bad_i
end

-- The edges that do not depend on the arena (op seq -> set of earlier op
-- seqs): the data dependencies; FSDP2's post_backward, which makes the
-- current stream wait for the previous reduce-scatter (comm_ctx.
-- reduce_scatter_state.event) before it packs the next unit's gradients,
-- so the packing never runs ahead of it; and its all-gather streams
-- waiting for the previous unshard's copy-out before the next all-gather
-- reuses its buffers (all_gather_state.event), which bounds prefetching
-- to one unit. (Both orders were always among the emitted waits; as
-- needs they hold whatever the placement.)
function memplan.data_needs(ops)
  local needs = {}
  local function add(i, j)
    needs[i] = needs[i] or {}
    needs[i][j] = true
  end
  data_edges(ops, add)
  local prev_rs, prev_out, gathering = nil, nil, {}
  for _, o in ipairs(ops) do
    local k = o.kind
    if k == "pack" and prev_rs then add(o.seq, prev_rs) end
    if k == "reduce_scatter" then prev_rs = o.seq end
    -- The unshard's first op (its copy-in, or the all-gather where none
    -- copies in) follows the latest copy-out.
    if (k == "h2d" or k == "copy_in" or k == "all_gather") and not gathering[o.unit] then
      gathering[o.unit] = true
      if prev_out then add(o.seq, prev_out) end
    elseif k == "copy_out" then
      gathering[o.unit] = nil
      prev_out = o.seq
    end
  end
  return needs
end

-- Holding bytes for overlap (issue 19). A buffer's life ends at the op
-- that last touches it, but where that op runs on another stream than
-- the ops that open lives in its pool (the reduce-scatter reading its
-- input, the HSDP view-out reading the reduce-scatter output), a later
-- life on the same bytes must wait for it on the GPU: were the compute
-- stream's next copy-out to take the bytes of the reduce-scatter input,
-- it would wait for the reduce-scatter, and compute behind it. FSDP2's
-- caching allocator never makes that trade: the reduce-scatter input
-- stays allocated until the next post-backward, which waits for the
-- reduce-scatter anyway. So the placement holds each such life's bytes
-- (b.held: its lives, extended) until the first op of each opening
-- stream that the predicted step (with no arena waits) starts after the
-- closing op finishes; a reuse after that point waits for an op that has
-- already finished, and costs nothing.
--
-- times: op seq -> { start, finish } of the step predicted with the data
-- dependencies alone. Sets b.held on the buffers it extends; returns how
-- many lives it extends.
function memplan.holds(live, ops, times)
  -- Per pool and stream, the ops that open lives, in op order, with their
  -- predicted starts (non-decreasing: a stream runs its ops in order).
  local opens_at = {}
  for _, b in ipairs(live) do
    for _, iv in ipairs(b.lives) do
      local set = opens_at[iv.first + 1]
      if not set then set = {}; opens_at[iv.first + 1] = set end
      set[b.pool] = true
    end
  end
  local openers, any = {}, {} -- pool -> stream -> { seqs, starts }; pool -> seqs on any stream
  for i, o in ipairs(ops) do
    local set = opens_at[i]
    if set then
      for pool in pairs(set) do
        local per = openers[pool]
        if not per then per = {}; openers[pool] = per; any[pool] = {} end
        any[pool][#any[pool] + 1] = o.seq
        local l = per[o.stream]
        if not l then l = { seqs = {}, starts = {} }; per[o.stream] = l end
        l.seqs[#l.seqs + 1] = o.seq
        l.starts[#l.starts + 1] = times[o.seq].start
      end
    end
  end
  -- The first index of a non-decreasing list whose value is >= x, or nil.
  local function first_at_least(list, x)
    local lo, hi, found = 1, #list, nil
    while lo <= hi do
      local mid = (lo + hi) // 2
      if list[mid] >= x then found = mid; hi = mid - 1 else lo = mid + 1 end
    end
    return found
  end
  local n = 0
  for _, b in ipairs(live) do
    b.held = nil
    local per = openers[b.pool] or {}
    for k, iv in ipairs(b.lives) do
      local j = iv.last
      local closer, done = ops[j + 1].stream, times[j].finish
      local last = iv.last
      for stream, l in pairs(per) do -- (the largest over streams: the order does not matter)
        if stream ~= closer then
          local a, c = first_at_least(l.seqs, j + 1), first_at_least(l.starts, done)
          local at = a and c and math.max(a, c)
          local upto = at and l.seqs[at] - 1 or #ops - 1
          if upto > last then last = upto end
        end
      end
      -- Never into the buffer's own next life (its data orders them anyway),
      -- and only as far as the last op opening a life in the pool before
      -- then: the hold keeps bytes from those lives alone.
      local nxt = b.lives[k + 1]
      if nxt and last >= nxt.first then last = nxt.first - 1 end
      if last > iv.last then
        local seqs = any[b.pool]
        local x = first_at_least(seqs, last + 1)
        x = (x or #seqs + 1) - 1
        last = x >= 1 and math.max(seqs[x], iv.last) or iv.last
      end
      if last > iv.last then
        if not b.held then
          b.held = {}
          for x, y in ipairs(b.lives) do b.held[x] = y end
        end
        b.held[k] = { first = iv.first, last = last }
        n = n + 1
      end
    end
  end
  return n
end

-- Greedy placement of `order` (largest first; buffers never live take no
-- room): each buffer at the lowest offset that overlaps no placed buffer
-- of its pool live beside it (near: buffer -> list) nor any placed buffer
-- of the other pools (bytes are shared only within a stream's pool, see
-- POOL); only the union of those bytes decides the offset. With
-- near_held and a budget: each buffer first against its held neighbours,
-- and where that would end past the budget, against its plain ones.
-- Symmetric buffers (b.symm, fsdp.symm_mem) first, in the window
-- [0, window) at the arena's start; every other buffer from the window's
-- end (see memplan.SYMM_KINDS).
-- Returns buffer -> offset, the arena's bytes, how many buffers took
-- their plain place, and the window's bytes.
local function place(order, near, near_held, budget)
  local offset, arena, pools, fell, floor = {}, 0, {}, 0, 0
  for _, name in pairs(memplan.POOL) do pools[name] = {} end
  local others = {} -- pool -> the other pools' byte unions
  for name in pairs(pools) do
    others[name] = {}
    for _, other in ipairs(util.sorted_keys(pools)) do
      if other ~= name then table.insert(others[name], pools[other]) end
    end
  end
  local function fit(b, list)
    local busy = {}
    for _, q in ipairs(list[b]) do
      local at = offset[q]
      if at and q.size > 0 and #q.lives > 0 then busy[#busy + 1] = { at, at + q.size } end
    end
    table.sort(busy, function(x, y) return x[1] < y[1] end)
    local mine = {}
    for _, r in ipairs(busy) do union_add(mine, r[1], r[2]) end
    return lowest_fit(mine, others[b.pool], b.size, floor)
  end
  local window = 0
  for pass = 1, 2 do
    for _, b in ipairs(order) do
      if (pass == 1) ~= not b.symm then
        if #b.lives == 0 or b.size == 0 then
          offset[b] = 0 -- never live (e.g. no backward): takes no room
        else
          local off
          if near_held then
            off = fit(b, near_held)
            if off + b.size > budget then off = nil; fell = fell + 1 end
          end
          off = off or fit(b, near)
          offset[b] = off
          arena = math.max(arena, off + b.size)
          union_add(pools[b.pool], off, off + b.size)
        end
      end
    end
    if pass == 1 then window = arena; floor = window end
  end
  return offset, arena, fell, window
end

-- The reuse waits of a placement: needs (the data dependencies, copied)
-- plus the reuse edges, and the waits chosen from them. opens, closes:
-- by_op(placed).
local function waits_of(placed, ops, data, opens, closes)
  local needs = {}
  for i, set in pairs(data) do
    local c = {}
    for j in pairs(set) do c[j] = true end
    needs[i] = c
  end
  reuse_edges(placed, ops, needs, opens, closes)
  return needs, memplan.prune(ops, needs)
end

-- The waits a placement adds that cost time: for every op that waits for
-- an op its data do not need (a reuse of arena bytes), how much later the
-- predicted step starts it than its stream and its data alone would:
-- list of { op, waits_for (the latest-finishing such wait), stream,
-- cost_us } in op order, and the sum of their costs on the compute stream.
-- times: op seq -> { start, finish } (gen/timeline.lua).
function memplan.costly_waits(ops, waits, data, times)
  local list, compute_us, prev = {}, 0, {}
  local NONE = {}
  for _, o in ipairs(ops) do
    local seq = o.seq
    local need = data[seq] or NONE
    local mine, mine_end
    for _, j in ipairs(waits[seq] or NONE) do
      if not need[j] and (not mine or times[j].finish > mine_end) then mine, mine_end = j, times[j].finish end
    end
    if mine then
      local before = prev[o.stream]
      local ready = before and times[before].finish or 0
      for j in pairs(need) do
        if times[j].finish > ready then ready = times[j].finish end
      end
      local cost = times[seq].start - ready
      if cost > 1e-6 then
        -- times: a repeated micro-step's row waits once per repetition (gen/repeat.lua)
        list[#list + 1] = { op = seq, waits_for = mine, stream = o.stream, cost_us = cost, times = o.times or 1 }
        if o.stream == "compute" then compute_us = compute_us + cost * (o.times or 1) end
      end
    end
    prev[o.stream] = seq
  end
  return list, compute_us
end

-- The needs (data dependencies and arena-reuse edges) of ops under a
-- placement given as offsets (unit index -> kind -> byte offset): what
-- tests/lua/test_repeat.lua proves a repeated micro-step's rows against,
-- over the ops as the executor issues them.
function memplan.needs_for(lay, ops, offset_of, micro_steps)
  local life = lifetimes(lay, ops)
  local placed = {}
  for _, u in ipairs(lay.units) do
    local sz = sizes_of(lay, u, micro_steps)
    for ki, kind in ipairs(memplan.KINDS) do
      local b = { unit = u.index, unit_name = u.name, kind = kind, kind_index = ki, pool = memplan.POOL[kind],
                  size = util.ceil_div(sz[kind], memplan.ALIGN) * memplan.ALIGN, bytes = sz[kind],
                  lives = life[u.index][kind], offset = offset_of[u.index][kind] }
      if #b.lives > 0 and b.size > 0 then placed[#placed + 1] = b end
    end
  end
  return (waits_of(placed, ops, memplan.data_needs(ops), by_op(placed)))
end

-- lay, ops, opts -> { arena_bytes, buffers = list, by_unit = unit index -> kind -> buffer,
--               symm = { window_bytes, buffers } (fsdp.symm_mem: the window at the arena's start; nil without),
--               waits = op seq -> sorted list of op seqs it must wait for,
--               events = sorted list of op seqs whose completion others wait on,
--               needs = op seq -> set of op seqs it must follow (data and reuse),
--               data_needs = the same, data dependencies only,
--               policy = "hold" (bytes held for overlap, see memplan.holds),
--                        "short" (held where the budget allowed; the rest reused
--                        at once) or "reuse" (reused at once: no prediction, nothing
--                        to hold, or memory too short for any),
--               budget_bytes, reuse_bytes (the arena reusing at once), hold_bytes
--               (the arena holding, where tried), held_lives, fell_back (buffers placed to reuse at once for the budget),
--               free_step_us (the predicted step with no arena waits),
--               reuse_step_us, reuse_waits, reuse_wait_us (reusing at once: the
--               step, the waits that cost time, their cost on the compute
--               stream; where bytes are held) }
-- opts.predict(waits) -> the predicted step (gen/timeline.lua) with those
-- waits; opts.budget: the bytes the arena may take (the memory verdict's
-- room, gen/memory.lua). Without predict, bytes are reused at once.
function memplan.build(lay, ops, opts)
  opts = opts or {}
  local life = lifetimes(lay, ops)
  local buffers, by_unit = {}, {}
  for _, u in ipairs(lay.units) do
    local sz = sizes_of(lay, u, opts.micro_steps)
    by_unit[u.index] = {}
    for ki, kind in ipairs(memplan.KINDS) do
      local b = { unit = u.index, unit_name = u.name, kind = kind, kind_index = ki, pool = memplan.POOL[kind],
                  size = util.ceil_div(sz[kind], memplan.ALIGN) * memplan.ALIGN, bytes = sz[kind],
                  lives = life[u.index][kind], symm = memplan.is_symm(u, kind) or nil }
      buffers[#buffers + 1] = b
      by_unit[u.index][kind] = b
    end
  end
  -- Largest first; ties in unit then kind order, so the plan is deterministic.
  local order = {}
  for i, b in ipairs(buffers) do order[i] = b end
  table.sort(order, function(a, b)
    if a.size ~= b.size then return a.size > b.size end
    if a.unit ~= b.unit then return a.unit < b.unit end
    return a.kind_index < b.kind_index
  end)
  local live = {}
  for _, b in ipairs(order) do
    if #b.lives > 0 and b.size > 0 then live[#live + 1] = b end
  end
  local near = time_neighbours(live)
  local data = memplan.data_needs(ops)
  -- Reusing bytes at once; then, where a prediction says which reuses
  -- would wait, holding them: wholly if the budget allows, else each
  -- buffer held where it still ends within the budget.
  local r_offset, r_arena, _, r_window = place(order, near)
  local offset, arena, window = r_offset, r_arena, r_window
  local budget = opts.budget or math.huge
  local result = { policy = "reuse", reuse_bytes = r_arena, budget_bytes = opts.budget, held_lives = 0,
                   fell_back = 0 }
  if opts.predict then
    local free = opts.predict(memplan.prune(ops, data))
    result.free_step_us = free.step_us
    result.held_lives = memplan.holds(live, ops, free.ops)
    if result.held_lives > 0 then
      local near_held = time_neighbours(live, true)
      local h_offset, h_arena, _, h_window = place(order, near, near_held, math.huge)
      result.hold_bytes = h_arena
      local fell = 0
      if h_arena > budget and r_arena <= budget then
        h_offset, h_arena, fell, h_window = place(order, near, near_held, budget)
      end
      if h_arena <= budget then
        offset, arena, window = h_offset, h_arena, h_window
        result.policy, result.fell_back = fell > 0 and "short" or "hold", fell
      end
    end
  end
  local placed = {}
  for _, b in ipairs(order) do
    if #b.lives > 0 and b.size > 0 then placed[#placed + 1] = b end
  end
  local opens, closes = by_op(placed)
  -- The step reusing at once, for the trade SCHEDULE.md states.
  if result.policy ~= "reuse" then
    for _, b in ipairs(buffers) do b.offset = r_offset[b] end
    local _, r_waits = waits_of(placed, ops, data, opens, closes)
    local r = opts.predict(r_waits)
    result.reuse_step_us = r.step_us
    local list
    list, result.reuse_wait_us = memplan.costly_waits(ops, r_waits, data, r.ops)
    result.reuse_waits = 0
    for _, x in ipairs(list) do result.reuse_waits = result.reuse_waits + x.times end
  end
  for _, b in ipairs(buffers) do b.offset = offset[b] end
  check_disjoint(placed, #ops, opens, closes)
  -- Needed edges (op seq -> set of earlier op seqs it must follow on the
  -- GPU): the data dependencies, and reuse: a lifetime that opens on bytes
  -- an earlier lifetime held (of another buffer, or of the same buffer in
  -- an earlier unshard) follows the op that closed the latest such one.
  local needs, waits = waits_of(placed, ops, data, opens, closes)
  local bad_j, bad_i = memplan.unordered(ops, needs, waits)
  if bad_j then
    error(string.format("internal: op %d must follow op %d but no emitted wait orders them", bad_i, bad_j), 0)
  end
  local event_set = {}
  for _, list in pairs(waits) do
    for _, j in ipairs(list) do event_set[j] = true end
  end
  local events = {}
  for seq in pairs(event_set) do events[#events + 1] = seq end
  table.sort(events)
  local sum = 0
  for _, b in ipairs(buffers) do sum = sum + b.size end
  result.arena_bytes, result.unplanned_bytes, result.buffers, result.by_unit = arena, sum, buffers, by_unit
  -- The symmetric window (fsdp.symm_mem): its bytes and its buffers, in placement order.
  if window > 0 then
    local list = {}
    for _, b in ipairs(placed) do
      if b.symm then list[#list + 1] = b end
    end
    result.symm = { window_bytes = window, buffers = list }
  end
  result.waits, result.events, result.needs, result.data_needs = waits, events, needs, data
  return result
end

return memplan
