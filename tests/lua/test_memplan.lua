local H = require("helpers")
local plan = require("gen.plan")
local memplan = require("gen.memplan")
local T = {}

local function overlap(a, b) return a.offset < b.offset + b.size and b.offset < a.offset + a.size end

-- Lifetimes re-derived from the op list, independently of memplan: the op
-- seqs at which each (unit, kind) buffer is in use.
local function uses(p)
  local u = {}
  local function add(unit, kind, seq)
    u[unit] = u[unit] or {}
    u[unit][kind] = u[unit][kind] or {}
    u[unit][kind][seq] = true
  end
  for _, o in ipairs(p.ops) do
    local k = o.kind
    if k == "copy_in" or k == "all_gather" then add(o.unit, "ag", o.seq) end
    if k == "copy_out" then add(o.unit, "ag", o.seq); add(o.unit, "unsharded", o.seq) end
    if k == "forward" or k == "backward" then add(o.unit, "unsharded", o.seq) end
    if k == "backward" or k == "pack" then add(o.unit, "grads", o.seq) end
    if k == "pack" or k == "reduce_scatter" then add(o.unit, "rs_in", o.seq) end
    if k == "reduce_scatter" or k == "all_reduce" or k == "view_out" then add(o.unit, "rs_out", o.seq) end
    -- expert parallel: the counts at every exchange, the token buffers at
    -- each token exchange (forward's dispatch and combine, backward's two)
    if k == "a2a_counts" or k == "a2a" then add(o.unit, "a2a_counts", o.seq) end
    if k == "a2a" then add(o.unit, "a2a_send", o.seq); add(o.unit, "a2a_recv", o.seq) end
  end
  return u
end

local function check_plan(path)
  local p = plan.from_file(path)
  local a = p.arena
  local used = uses(p)
  -- Every use of a buffer falls inside one of its planned lifetimes.
  for unit, kinds in pairs(used) do
    for kind, seqs in pairs(kinds) do
      local b = a.by_unit[unit][kind]
      for seq in pairs(seqs) do
        local inside = false
        for _, iv in ipairs(b.lives) do inside = inside or (iv.first <= seq and seq <= iv.last) end
        if not inside then error(string.format("%s: %s of unit %d used at op %d outside its lifetimes", path, kind, unit, seq)) end
      end
    end
  end
  -- No two buffers in use at the same op share a byte.
  local bufs = a.buffers
  for i = 1, #bufs do
    local x = bufs[i]
    H.eq(x.offset % memplan.ALIGN, 0, path .. " offset alignment")
    if x.offset + x.size > a.arena_bytes and #x.lives > 0 then error(path .. ": buffer outside the arena") end
    for j = i + 1, #bufs do
      local y = bufs[j]
      if overlap(x, y) then
        for _, iv in ipairs(x.lives) do
          for _, jv in ipairs(y.lives) do
            if iv.first <= jv.last and jv.first <= iv.last then
              error(string.format("%s: %s/%s and %s/%s share bytes while both live", path, x.unit_name, x.kind,
                y.unit_name, y.kind))
            end
          end
        end
      end
    end
  end
  -- Waits point backwards at ops that record an event.
  local is_event = {}
  for _, e in ipairs(a.events) do is_event[e] = true end
  for seq, list in pairs(a.waits) do
    for _, j in ipairs(list) do
      if not (j < seq and is_event[j]) then error(string.format("%s: op %d waits for op %d", path, seq, j)) end
    end
  end
  if a.arena_bytes < p.memory.peak_transient_bytes then error(path .. ": arena below the peak of live bytes") end
  return p
end

function T.arena_plans_are_safe()
  for _, f in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/fsdp8_uneven.lua", "plans/hsdp4x2_fp16.lua",
                       "plans/llama_tiny.lua", "plans/llama8b.lua", "plans/llama70b.lua",
                       "tests/ep/plans/ep2_mixtral.lua", "tests/ep/plans/ep2_mixtral_hsdp.lua" }) do
    check_plan(f)
  end
end

-- Expert parallel: a MoE layer's token buffers live across one exchange
-- pair only (forward dispatch..combine, backward combine gradient..dispatch
-- gradient), so the layers share their bytes; the counts live from the
-- forward's exchange to the backward's last all-to-all.
function T.expert_token_buffers_live_per_exchange_pair()
  local p = plan.from_file("tests/ep/plans/ep2_mixtral.lua")
  local a = p.arena
  local pairs_seen = 0
  for _, u in ipairs(p.layout.units) do
    if u.expert then
      local send, counts = a.by_unit[u.index].a2a_send, a.by_unit[u.index].a2a_counts
      H.eq(#send.lives, 2, u.name .. ": a forward and a backward pair")
      H.eq(#counts.lives, 1, u.name .. ": the counts, one life")
      assert(counts.lives[1].first < send.lives[1].first and counts.lives[1].last == send.lives[2].last,
        u.name .. ": the counts from the forward's exchange to the last all-to-all")
      assert(send.lives[1].last < send.lives[2].first, u.name .. ": apart between forward and backward")
      pairs_seen = pairs_seen + 1
    end
  end
  H.eq(pairs_seen, 2, "two MoE layers")
end

-- The point of the arena: one Llama-3-70B rank fits an 80 GB GPU.
function T.llama70b_rank_fits_one_gpu()
  local p = plan.from_file("plans/llama70b.lua")
  local gib = 1024 ^ 3
  if p.memory.allocated_bytes > 32 * gib then
    error(string.format("llama70b allocates %.1f GiB per rank", p.memory.allocated_bytes / gib))
  end
  if p.arena.unplanned_bytes < 20 * p.arena.arena_bytes then error("arena saves less than expected") end
  -- A step's worth of event waits stays small (host cost per wait): per
  -- unit its data dependencies across streams (copy-in -> all-gather ->
  -- copy-out, twice; pack -> reduce-scatter -> all-reduce) and a few reuses.
  local n = 0
  for _, list in pairs(p.arena.waits) do n = n + #list end
  if n > 12 * #p.layout.units then error("too many event waits: " .. n) end
end

-- Issue 19: the arena never makes the compute stream wait on a collective
-- while the rank's memory has room. llama70b once waited ~8.35 ms per
-- layer (copy_out of layers.78 on the bytes reduce_scatter of layers.79
-- still read): 2.75 s predicted, 1.05 s exposed. Now every wait of a
-- compute op on a collective is its data's or finds the collective done.
function T.llama70b_compute_never_waits_for_reused_bytes()
  local figures = require("gen.figures")
  local audit = require("gen.audit")
  local p = plan.from_file("plans/llama70b.lua")
  local a, fig = p.arena, figures.of(p)
  local tl = fig.timeline
  H.eq(a.policy, "hold", "policy with 54 GiB free")
  for _, o in ipairs(p.ops) do
    if o.stream == "compute" then
      local data = a.data_needs[o.seq] or {}
      for _, j in ipairs(a.waits[o.seq] or {}) do
        local q = p.ops[j + 1]
        if q.group and q.stream ~= "compute" and not data[j] and tl.ops[j].finish > tl.ops[o.seq].start then
          error(string.format("op %d %s %s waits for op %d %s %s for reused bytes", o.seq, o.kind,
            p.layout.units[o.unit + 1].name, j, q.kind, p.layout.units[q.unit + 1].name))
        end
      end
    end
  end
  H.eq(#fig.memory_plan.waits, 0, "costly waits")
  H.eq(fig.step_us, figures.round(a.free_step_us), "the step is the one with no arena waits")
  -- (compute priced from shapes, gen/gemm_model.lua: 1.61 s, 462 ms exposed)
  if fig.step_us > 1.8e6 or fig.exposed_us > 0.5e6 then
    error(string.format("llama70b: step %.0f us, exposed %.0f us", fig.step_us, fig.exposed_us))
  end
  -- The trade, stated: the bytes it holds against the waits it avoids.
  if not (a.reuse_step_us > 2.0e6 and a.reuse_wait_us > 0.6e6 and a.arena_bytes > a.reuse_bytes) then
    error(string.format("llama70b: reusing at once: step %.0f us, compute waits %.0f us, %d vs %d bytes",
      a.reuse_step_us, a.reuse_wait_us, a.reuse_bytes, a.arena_bytes))
  end
  local md = audit.schedule_md(p, audit.fingerprint(p))
  local row = md:match("\n| memory plan | ([^\n]*) |\n")
  assert(row, "SCHEDULE.md has a memory plan row")
  for _, want in ipairs({ "reduce-scatter inputs", "more than reusing them at once (1.28 GiB)",
                          "which would make the compute stream wait 649.15 ms (step 2.19 s instead of 1.63 s)",
                          "no reuse of arena bytes delays an op" }) do
    if not row:find(want, 1, true) then error(string.format("memory plan row %q lacks %q", row, want)) end
  end
end

-- llama70b's source with the GPU's memory replaced (decimal GB).
local function with_gpu_memory(gb)
  local fh = assert(io.open("plans/llama70b.lua", "rb"))
  local src = fh:read("a")
  fh:close()
  return "local p = (function() " .. src .. "\nend)()\np.topology.gpu_memory_GB = " .. string.format("%.17g", gb)
    .. "\np.training = p.training or {} p.training.loss_chunks = 1\nreturn p"
end

-- Where the memory verdict leaves too little room to hold the bytes, the
-- arena reuses them at once, within the room, and says which waits that
-- adds and what they cost (SCHEDULE.md's summary and warnings, plan.json).
function T.short_memory_reuses_and_reports_its_waits()
  local figures = require("gen.figures")
  local audit = require("gen.audit")
  local json = require("gen.json")
  -- CrossEntropyLoss's order (loss_chunks = 1): with ChunkedLossWrapper's the
  -- rank's peak is the loss's (the [norm, lm_head] unit's buffers), under which
  -- the layers' reduce-scatter bytes are held for nothing, so memory is never short
  local roomy = plan.from_source(with_gpu_memory(80), "plans/llama70b.lua").arena
  -- Room for the arena reusing at once and a tenth of what holding adds.
  local state = 80e9 - roomy.budget_bytes
  local room = roomy.reuse_bytes + (roomy.hold_bytes - roomy.reuse_bytes) / 10
  local p = plan.from_source(with_gpu_memory((state + room) / 1e9), "plans/llama70b.lua")
  local a, fig = p.arena, figures.of(p)
  H.eq(a.policy, "reuse", "policy when memory is short")
  H.eq(a.arena_bytes, roomy.reuse_bytes, "arena bytes")
  assert(a.arena_bytes <= a.budget_bytes, "the arena stays within the room")
  H.eq(fig.memory.fits, true, "the rank fits")
  local mp = fig.memory_plan
  -- Each layer's copy-out waits for the reduce-scatter whose input its bytes held.
  local copy_outs, cost = 0, 0
  for _, x in ipairs(mp.waits) do
    local o, q = p.ops[x.op + 1], p.ops[x.waits_for + 1]
    assert(x.cost_us > 0, "a listed wait costs time")
    if o.kind == "copy_out" and q.kind == "reduce_scatter" then
      copy_outs, cost = copy_outs + 1, cost + x.cost_us
      H.eq(o.stream, "compute", "copy_out's stream")
    end
  end
  H.eq(copy_outs, 81, "copy-outs waiting for a reduce-scatter")
  if math.abs(cost - mp.wait_us) > 1 or cost < 0.6e6 then
    error(string.format("compute waits: %.3f us listed, %.3f us in all", cost, mp.wait_us))
  end
  H.eq(fig.step_us, figures.round(roomy.reuse_step_us), "the step reusing at once")
  local md = audit.schedule_md(p, audit.fingerprint(p))
  local row = md:match("\n| memory plan | ([^\n]*) |\n")
  for _, want in ipairs({ "reuses bytes at once", "(memory short)", "82 waits for reused arena bytes delay ops, "
                          .. "the compute stream by 642.19 ms", "1.61 s with room to keep them" }) do
    if not row:find(want, 1, true) then error(string.format("memory plan row %q lacks %q", row, want)) end
  end
  local warned
  for _, w in ipairs(fig.warnings or audit.analysis(p).warnings) do
    if w:find("memory short", 1, true) then warned = w end
  end
  assert(warned, "a warning lists the waits")
  assert(warned:find("copy_out of layers.79-0, tok_embeddings (compute stream) waits for reduce_scatter of "
    .. "norm_output, layers.79-0: 81 ops, 642.19 ms", 1, true), warned)
  local doc = json.decode(audit.json(p, audit.fingerprint(p)))
  local jm = doc.audit.memory_plan
  H.eq(jm.policy, "reuse", "plan.json policy")
  H.eq(#jm.costly_waits, #mp.waits, "plan.json costly waits")
  H.eq(jm.compute_wait_us, mp.wait_us, "plan.json compute wait")
  H.eq(jm.hold_arena_bytes, roomy.hold_bytes, "plan.json: what holding needs")
end

-- Unsharded grads live from their first backward: without resharding
-- after forward, the unshard that serves the backward is the forward's,
-- and the grads were counted live from its copy-out (llama70b: every
-- layer's grads through the whole forward, a 35.9 GB arena). Where the
-- backward has its own unshard, from that copy-out (the library's
-- cp_gpu_unshard orders them), as before.
function T.grads_live_from_their_first_backward()
  local fh = assert(io.open("plans/llama70b.lua", "rb"))
  local src = fh:read("a")
  fh:close()
  local p = plan.from_source("local p = (function() " .. src .. "\nend)()\np.fsdp.reshard_after_forward = false"
    .. "\nreturn p", "plans/llama70b.lua")
  local q = plan.from_file("plans/llama70b.lua")
  for _, x in ipairs({ { p, "without resharding" }, { q, "resharding" } }) do
    local pl, what = x[1], x[2]
    -- Each unit's first backward, and its latest copy-out before it if no
    -- other unit computed since (the unshard serving that backward).
    local first_bwd, out_before, others = {}, {}, {}
    for _, o in ipairs(pl.ops) do
      if o.kind == "copy_out" then out_before[o.unit], others[o.unit] = o.seq, false end
      if o.kind == "backward" and not first_bwd[o.unit] then
        first_bwd[o.unit] = others[o.unit] and o.seq or out_before[o.unit]
      end
      if o.kind == "forward" or o.kind == "backward" then
        for unit in pairs(others) do if unit ~= o.unit then others[unit] = true end end
      end
    end
    local from_backward = 0
    for _, u in ipairs(pl.layout.units) do
      local b = pl.arena.by_unit[u.index].grads
      if first_bwd[u.index] and #b.lives > 0 then
        H.eq(b.lives[1].first, first_bwd[u.index], what .. ": " .. u.name .. " grads live from")
        if pl.ops[first_bwd[u.index] + 1].kind == "backward" then from_backward = from_backward + 1 end
      end
    end
    -- without resharding every unit but the last to run forward; with it,
    -- only the units the backward does not gather again (the root's)
    H.eq(from_backward, pl == p and 81 or 0, what .. ": units whose grads open at their backward")
  end
  local l0 = p.arena.by_unit[p.layout.units[3].index].grads
  H.eq(p.layout.units[3].name, "layers.0", "unit")
  H.eq(l0.lives[1].first > 1500, true, "layers.0's grads open in the backward")
  if p.arena.arena_bytes > 20e9 then error(string.format("arena %d bytes without resharding", p.arena.arena_bytes)) end
end

-- Buffers that never coexist share offsets; ones that do, never.
function T.two_units_reuse_one_region()
  local p = plan.from_source(H.generic(2, "{ dp_shard = 2 }",
    { { "l0", { { "a", { 64 } } } }, { "l1", { { "b", { 64 } } } }, { "root", { { "c", { 8 } } } } }), "t.lua")
  local by = p.arena.by_unit
  local l0, l1 = p.layout.units[1].index, p.layout.units[2].index
  -- l0's unsharded params are resharded before l1's forward: same bytes.
  H.eq(by[l0].ag.offset == by[l1].ag.offset or by[l0].unsharded.offset == by[l1].unsharded.offset
       or overlap(by[l0].unsharded, by[l1].unsharded), true, "forward buffers reused")
end

-- The generator's ordering proof catches a missing wait: drop each emitted
-- wait in turn and the proof must name an unordered edge (a data
-- dependency across streams or a reuse of arena bytes).
function T.dropping_a_wait_breaks_the_proof()
  for _, f in ipairs({ "plans/hsdp2x2.lua", "plans/fsdp8_uneven.lua", "plans/llama_tiny.lua" }) do
    local p = plan.from_file(f)
    local a = p.arena
    H.eq(memplan.unordered(p.ops, a.needs, a.waits), nil, f .. " as generated")
    local dropped = 0
    for seq, list in pairs(a.waits) do
      for k = 1, #list do
        local copy = {}
        for s2, l2 in pairs(a.waits) do copy[s2] = l2 end
        local fewer = {}
        for i, j in ipairs(list) do if i ~= k then fewer[#fewer + 1] = j end end
        copy[seq] = fewer
        if memplan.unordered(p.ops, a.needs, copy) == nil then
          error(string.format("%s: dropping op %d's wait for op %d went unnoticed", f, seq, list[k]))
        end
        dropped = dropped + 1
      end
    end
    if dropped == 0 then error(f .. ": no reuse waits to drop") end
  end
end

-- The generator decides every op's stream, and the proof covers the data
-- dependencies across streams as well as arena reuse: each collective
-- follows the op that produced its input, each copy-out its all-gather.
function T.streams_and_data_dependencies_are_emitted()
  local opkinds = require("gen.opkinds")
  for _, f in ipairs({ "plans/hsdp2x2.lua", "plans/llama_tiny.lua", "plans/single.lua" }) do
    local p = plan.from_file(f)
    local hsdp = p.groups.by_name.dp_replicate ~= nil
    local last = {}
    for _, o in ipairs(p.ops) do
      H.eq(o.stream, opkinds.stream_of(o, hsdp), f .. " stream of op " .. o.seq)
      last[o.unit] = last[o.unit] or {}
      local need = p.arena.needs[o.seq] or {}
      local producer = ({ all_gather = "copy_in", copy_out = "all_gather", reduce_scatter = "pack",
                          all_reduce = "reduce_scatter" })[o.kind]
      if o.from_sharded then producer = nil end -- zero copy-in: it reads the shards themselves
      if producer then
        local j = last[o.unit][producer]
        if not need[j] then error(string.format("%s: op %d (%s) does not need op %s (%s)", f, o.seq, o.kind,
          tostring(j), producer)) end
      end
      last[o.unit][o.kind] = o.seq
    end
  end
end

-- A shipped plan's source with fsdp settings replaced (micro-steps,
-- accumulation, resharding): the plan file's table, edited after it runs.
local function variant(path, fsdp_lua)
  local fh = assert(io.open(path, "rb"))
  local src = fh:read("a")
  fh:close()
  return "local p = (function() " .. src .. "\nend)()\np.fsdp = p.fsdp or {}\n" .. fsdp_lua .. "\nreturn p"
end

-- The linear sweeps (time neighbours, byte unions, reuse edges per stream)
-- place every buffer where the pairwise planner did and emit the same
-- waits, for every accumulation mode, with and without resharding, over
-- per-cell arrays and over segment trees alike.
function T.sweeps_match_the_pairwise_planner()
  local reference = require("memplan_reference")
  local function same_as_reference(p, what)
    local want = reference.build(p.ops, p.arena)
    H.eq(p.arena.arena_bytes, want.arena_bytes, what .. " arena bytes")
    for _, b in ipairs(p.arena.buffers) do
      H.eq(b.offset, want.offsets[b], what .. " offset of " .. b.unit_name .. "/" .. b.kind)
    end
    for i = 0, #p.ops - 1 do
      H.list_eq(p.arena.waits[i] or {}, want.waits[i] or {}, what .. " waits of op " .. i)
    end
  end
  local policies = {}
  local edits = { "", "p.fsdp.micro_steps = 3", "p.fsdp.micro_steps = 3 p.fsdp.grad_accumulation = 'sync_last'",
                  -- (ChunkedLossWrapper's two-part reduction refuses all_reduce_last: the loss on whole logits)
                  "p.fsdp.micro_steps = 3 p.fsdp.grad_accumulation = 'all_reduce_last' "
                    .. "p.training = p.training or {} p.training.loss_chunks = 1",
                  "p.fsdp.micro_steps = 3 p.fsdp.grad_accumulation = 'step_end'",
                  "p.fsdp.micro_steps = 2 p.fsdp.reshard_after_forward = false" }
  for _, f in ipairs({ "plans/fsdp4.lua", "plans/hsdp2x2.lua", "plans/hsdp3x2_arlast.lua", "plans/llama_tiny_tp.lua",
                       "plans/tp3_uneven.lua", "plans/fsdp8_uneven.lua" }) do
    for _, e in ipairs(edits) do
      -- per-cell arrays (the default here) and segment trees (FLAT_SPAN 0)
      for _, flat in ipairs({ memplan.FLAT_SPAN, 0 }) do
        local saved = memplan.FLAT_SPAN
        memplan.FLAT_SPAN = flat
        local ok, p = pcall(plan.from_source, variant(f, e), f)
        memplan.FLAT_SPAN = saved
        if not ok then error(p, 0) end
        local what = f .. " [" .. e .. "] flat span " .. flat
        same_as_reference(p, what)
        -- Memory short: room for the arena reusing at once and half of
        -- what holding adds (buffers held while they fit, the rest reused).
        local a = p.arena
        if a.hold_bytes and a.hold_bytes > a.reuse_bytes then
          local gpu = require("gen.compute").settings(p).gpu_memory_bytes
          local gb = (gpu - a.budget_bytes + a.reuse_bytes + (a.hold_bytes - a.reuse_bytes) // 2) / 1e9
          memplan.FLAT_SPAN = flat
          ok, p = pcall(plan.from_source, variant(f, e .. string.format(" p.topology = p.topology or {} "
            .. "p.topology.gpu_memory_GB = %.17g", gb)), f)
          memplan.FLAT_SPAN = saved
          if not ok then error(p, 0) end
          policies[p.arena.policy] = (policies[p.arena.policy] or 0) + 1
          same_as_reference(p, what .. " memory short")
        end
      end
    end
  end
  -- Both ways of falling short are covered.
  assert(policies.short and policies.reuse, "memory-short variants: short and reuse")
end


-- The planned step p holds is the one a fresh prediction with its waits
-- gives, op by op and in every figure.
local function planned_step_is_fresh(p, what)
  local timeline = require("gen.timeline")
  local compute = require("gen.compute")
  local got = p.planned_timeline.tl
  local s = compute.settings(p)
  local want = timeline.build(p, s, compute.units(p, s))
  for _, o in ipairs(p.ops) do
    local g, w = got.ops[o.seq], want.ops[o.seq]
    for _, k in ipairs({ "start", "finish", "dur", "bind", "nominal", "extra_comm" }) do
      H.eq(g[k], w[k], string.format("%s op %d %s", what, o.seq, k))
    end
  end
  for _, k in ipairs({ "step_us", "drawn_step_us", "compute_busy_us", "exposed_us", "comm_serial_us",
                       "compute_end_us" }) do
    H.eq(got[k], want[k], what .. " " .. k)
  end
  for _, k in ipairs({ "exposed_by", "exposed_drawn", "recompute_by" }) do
    for seq, v in pairs(want[k]) do H.eq(got[k][seq], v, string.format("%s %s[%d]", what, k, seq)) end
    for seq, v in pairs(got[k]) do H.eq(v, want[k][seq], string.format("%s %s[%d]", what, k, seq)) end
  end
  H.list_eq(got.critical, want.critical, what .. " critical path")
  H.eq(#got.idle, #want.idle, what .. " idle spans")
  for i, sp in ipairs(want.idle) do
    for _, k in ipairs({ "lo", "hi", "by", "waiting" }) do
      H.eq(got.idle[i][k], sp[k], string.format("%s idle[%d].%s", what, i, k))
    end
  end
  for seq, x in pairs(want.waiter) do
    H.eq(got.waiter[seq] and got.waiter[seq].op, x.op, what .. " waiter " .. seq)
    H.eq(got.waiter[seq] and got.waiter[seq].via, x.via, what .. " waiter via " .. seq)
  end
end

-- The planned step replays a prediction of the memory plan where the
-- final waits delay none of its ops (gen/timeline.lua timeline.replay),
-- and is predicted anew where they do (memory short: bytes reused at
-- once); either way it is the fresh prediction. The holds delay nothing
-- in the shipped plans: every one replays but those whose memory leaves
-- the arena no room (plans/deepseek_v3.lua once its activations count).
function T.planned_step_is_predicted_step()
  local timeline = require("gen.timeline")
  local replay, replayed, fresh = timeline.replay, 0, 0
  timeline.replay = function(...)
    local tl = replay(...)
    if tl then replayed = replayed + 1 else fresh = fresh + 1 end
    return tl
  end
  local ok, err = pcall(function()
    local paths, shipped_short = H.dense_plan_files(), 0
    for _, path in ipairs(paths) do
      local p = plan.from_file(path)
      if p.arena.budget_bytes and p.arena.budget_bytes < p.arena.reuse_bytes then shipped_short = shipped_short + 1 end
      planned_step_is_fresh(p, path)
    end
    H.eq(shipped_short, 1, "shipped plans whose memory is short (deepseek_v3)")
    H.eq(replayed, #paths - shipped_short, "shipped plans whose planned step replays")
    -- CrossEntropyLoss's order (loss_chunks = 1): with ChunkedLossWrapper's the
  -- rank's peak is the loss's (the [norm, lm_head] unit's buffers), under which
  -- the layers' reduce-scatter bytes are held for nothing, so memory is never short
  local roomy = plan.from_source(with_gpu_memory(80), "plans/llama70b.lua").arena
    local room = roomy.reuse_bytes + (roomy.hold_bytes - roomy.reuse_bytes) / 10
    local short = plan.from_source(with_gpu_memory((80e9 - roomy.budget_bytes + room) / 1e9), "plans/llama70b.lua")
    planned_step_is_fresh(short, "llama70b, memory short")
  end)
  timeline.replay = replay
  if not ok then error(err, 0) end
  assert(fresh > 0, "memory short: the planned step is predicted anew")
end


-- A step long enough that t + an op's remaining time rounds to t (llama70b
-- at a 262,144-token sequence: fuzz input 83 of seed 20240808) still ends:
-- the op that sets the next finish time finishes then, whatever rounding
-- left of it. Bounded by a hook, so a stall fails here instead of hanging.
function T.predicted_step_ends_at_huge_times()
  local src = H.read("plans/llama70b.lua"):gsub("seq_len = %d+", "seq_len = 262144")
  local deadline = os.clock() + 60
  debug.sethook(function() if os.clock() > deadline then error("the predicted step stalls", 0) end end, "", 100000)
  local ok, p = pcall(plan.from_source, src, "plans/llama70b.lua")
  debug.sethook()
  assert(ok, tostring(p))
  assert(p.planned_timeline.tl.step_us > 1e8, "a step of minutes at that length")
end

return T
