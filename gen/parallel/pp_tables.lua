-- A pipeline plan's tables (issue 22, item 5): for each pipeline rank, its
-- stages' units and one step's ops in the order the rank's lowered action
-- list (gen/parallel/pp_schedule.lua) runs them, with each stage's FSDP
-- where torch.distributed.pipelining + fully_shard issue it (the rules
-- gen/parallel/pp_sequence.lua states and the live checks hold to torch)
-- and the sends and receives as ops. Pure functions over tables.
--
--   M.rank_tables(p, sched, stage_units, act) -> list of classes, one per
--   pipeline rank (index pp coordinate + 1):
--     { pp_rank, stages = { s... }, units = { unit copies, renumbered 0.. },
--       ops = { op... } }
--   p: the stage mesh's plan (gen/parallel/pp_report.lua stage_mesh_plan:
--     the whole model's units with their FSDP layout on world / pp ranks);
--   sched: pp_schedule.derive's result;
--   stage_units[s]: the layout units of stage s (0-based), forward order;
--   act: { numel, dtype }: one microbatch's activation (and its gradient)
--     between two stages, per rank.
--
-- A unit copy carries `pp_numel` (act.numel where it sends or receives,
-- else 0) and `global` (its index in p.layout). Ops are the generator's
-- usual fields (kind, unit (local index), micro_step, phase, group, dtype,
-- count, reduce_op, from_sharded) plus, for "send" and "recv": peer (the
-- peer stage's pipeline rank), batch (> 0 inside a coalesced group:
-- torch's batch_isend_irecv), tag (2 x the sending stage, + 1 for a
-- gradient). Where FSDP communicates (pp_sequence.lua, with the torch
-- lines it cites): a multi-stage schedule's UNSHARD gathers every unit of
-- the stage; GPipe and 1F1B gather each unit in the stage's first forward, just before the unit runs it;
-- nothing reshards after forward (but under torchtitan's "always" policy:
-- every F reshards each unit after it, every backward gathers again,
-- pp_sequence.lua's rules) or backward, and no backward reduces;
-- REDUCE_GRAD reduces every unit once (layers last to first, the root
-- last); RESHARD frees. The step ends sharded: units still unsharded after
-- the last action are resharded there (the next step gathers again, as
-- the first step does).
local fsdp_schedule = require("gen.parallel.fsdp_schedule")
local pps = require("gen.parallel.pp_schedule")
local seq = require("gen.parallel.pp_sequence")

local M = {}

local fmt = string.format

-- Every action torch's lowered lists hold: zero bubble's split backward is
-- I (the input gradient: "backward_input" per unit, no weight grads) and W
-- (the weight gradient: "backward", which writes them); OVERLAP_F_B runs
-- its F and B parts in turn. WAIT_SEND_* and WAIT_REDUCE_GRAD wait for
-- work the tables have already ordered (a send, a reduction on its
-- stream): no op.
local SUPPORTED = { F = true, B = true, I = true, W = true, SEND_F = true, RECV_F = true, SEND_B = true,
                    RECV_B = true, UNSHARD = true, RESHARD = true, REDUCE_GRAD = true, WAIT_SEND_F = true,
                    WAIT_SEND_B = true, WAIT_REDUCE_GRAD = true }
local NO_OP = { WAIT_SEND_F = true, WAIT_SEND_B = true, WAIT_REDUCE_GRAD = true }

function M.unsupported_action(sched)
  for _, list in ipairs(sched.lowered) do
    for _, a in ipairs(list) do
      for _, q in ipairs(a.sub or { a }) do
        if not SUPPORTED[q.type] then return q.type end
      end
    end
  end
  return nil
end

local function copy_unit(u, index, microbatches)
  local c = {}
  for k, v in pairs(u) do c[k] = v end
  c.index, c.global, c.pp_numel = index, u.index, 0
  -- Every backward of a stage runs without gradient sync (step_end), so
  -- FSDP2 keeps its unsharded grads in reduce_dtype to accumulate them
  -- (gen/parallel/fsdp_layout.lua's rule for accumulating micro-steps);
  -- the stage mesh's one-microbatch layout has them in ag_dtype.
  c.grad_dtype = u.reduce_dtype
  -- EP's token counts live from a microbatch's dispatch to its backward,
  -- and a schedule keeps several microbatches in flight: a counts slot per
  -- microbatch (the stage mesh's one-microbatch layout has one)
  if u.a2a_slots then c.a2a_slots = microbatches end
  return c
end

-- The pipeline rank's stages in increasing order and its unit copies,
-- stage by stage; unit_of[stage][global index] = the copy.
function M.rank_units(sched, stage_units, r)
  local stages, units, unit_of = {}, {}, {}
  for s = 0, sched.num_stages - 1 do
    if sched.stage_to_rank[s] == r then
      stages[#stages + 1] = s
      unit_of[s] = {}
      for _, u in ipairs(stage_units[s]) do
        local c = copy_unit(u, #units, sched.microbatches)
        units[#units + 1] = c
        unit_of[s][u.index] = c
      end
    end
  end
  return stages, units, unit_of
end

-- opts.unit_ops(out, u, m, at): the other parallelisms' ops at a unit's
-- points (TP's activation collectives inside its forward and backward, its
-- "reduce" ones before the unit's reduction), as gen/parallel/fsdp_schedule.lua
-- calls them.
function M.rank_tables(p, sched, stage_units, act, opts)
  local bad = M.unsupported_action(sched)
  if bad then
    error(fmt("pp_tables: %s's lowered actions include %s, which the tables do not run yet", sched.schedule, bad), 0)
  end
  local out = {}
  for r = 0, sched.pp - 1 do
    local stages, units, unit_of = M.rank_units(sched, stage_units, r)
    local rank = { pp_rank = r, stages = stages, units = units, unit_of = unit_of }
    rank.ops = M.rank_ops(p, sched, stage_units, act, rank, opts)
    out[r + 1] = rank
  end
  return out
end

-- One pipeline rank's ops in issue order. rank: { pp_rank, stages,
-- unit_of } (M.rank_units'); its unit copies take their pp_numel here.
function M.rank_ops(p, sched, stage_units, act, rank, opts)
  local r, stages, unit_of = rank.pp_rank, rank.stages, rank.unit_of
  local unit_ops = opts and opts.unit_ops
  local bad = M.unsupported_action(sched)
  if bad then
    error(fmt("pp_tables: %s's lowered actions include %s, which the tables do not run yet", sched.schedule, bad), 0)
  end
  local shard = p.groups.by_name.fsdp and p.groups.by_name.fsdp.size > 1 and p.groups.by_name.fsdp or nil
  local replicate = p.groups.by_name.dp_replicate
  local last_mb = sched.microbatches - 1
  local ops = {}
  local function op(kind, u, m, phase, extra)
    local o = { kind = kind, unit = u.index, micro_step = m, phase = phase }
    for k, v in pairs(extra or {}) do o[k] = v end
    ops[#ops + 1] = o
    return o
  end
  -- the stage's units that FSDP manages (a unit without parameters, the
  -- Llama root, has no FSDP param group), forward order
  local function managed(s)
    local list = {}
    for _, u in ipairs(stage_units[s]) do
      if #u.params > 0 then list[#list + 1] = unit_of[s][u.index] end
    end
    return list
  end
  local unsharded = {}
  local function gather(u, m, phase)
    if not unsharded[u.index] then
      fsdp_schedule.gather(ops, u, m, phase, shard)
      op("copy_out", u, m, phase)
      unsharded[u.index] = true
    end
  end
  local function unshard(s, m, phase)
    for _, u in ipairs(managed(s)) do gather(u, m, phase) end
  end
  local function reshard(s, m)
    for _, u in ipairs(managed(s)) do
      if unsharded[u.index] then
        op("reshard", u, m, "backward")
        unsharded[u.index] = false
      end
    end
  end
  -- a message's unit: the stage's first unit receives activations and
  -- sends gradients, its last sends activations and receives gradients
  local function boundary(s, last)
    local list = stage_units[s]
    local u = unit_of[s][list[last and #list or 1].index]
    u.pp_numel = act.numel
    return u
  end
  local single = sched.runtime == "single"
  local explicit = p.layout.explicit_prefetch
  local function state_of(u) return u.state or u.name end
  -- the units of list's state at i (consecutive), each gathered once
  local function gather_state(list, i, m)
    local st = state_of(list[i])
    while list[i] and state_of(list[i]) == st do
      gather(list[i], m, "forward")
      i = i + 1
    end
  end
  -- torchtitan's "always" policy (pp_sequence.reshards_after_forward):
  -- each unit reshards after every forward (its post-forward), and a
  -- backward's pre-backward hooks gather what is sharded, last to first:
  -- a unit's own all-gather and its wait, then FSDP2's prefetch of the
  -- unit before it (_backward_prefetch; fsdp_schedule.lua's order), waited
  -- at that unit's pre-backward. Nothing reshards after backward
  -- (set_reshard_after_backward(False), stage.py:1131).
  local raf = seq.reshards_after_forward(p)
  local post_fwd, gathering = {}, {}
  local function bw_unshard(u, m)
    if not unsharded[u.index] and not gathering[u.index] then
      fsdp_schedule.gather(ops, u, m, "backward", shard)
      gathering[u.index] = true
    end
  end
  local function bw_wait(u, m)
    if gathering[u.index] then
      op("copy_out", u, m, "backward")
      gathering[u.index], unsharded[u.index] = nil, true
    end
  end
  -- (under "always") the pre-backward of the state (a unit and its experts
  -- group) that list[i] ends, walking list backwards: its units' gathers
  -- and waits in forward order, then the state before it, its groups last
  -- to first (FSDP2's prefetch; torchtitan's explicit lists with ep > 1
  -- name the same state, _fsdp_state.py's explicit path prefetching
  -- reversed(target._fsdp_param_groups); recorded live with efsdp 2)
  local function pre_backward(list, i, m)
    if list[i + 1] and state_of(list[i + 1]) == state_of(list[i]) then return end
    local j = i
    while list[j - 1] and state_of(list[j - 1]) == state_of(list[i]) do j = j - 1 end
    for k = j, i do bw_unshard(list[k], m) end
    for k = j, i do bw_wait(list[k], m) end
    local pk = j - 1
    while list[pk] and state_of(list[pk]) == state_of(list[j - 1]) do
      bw_unshard(list[pk], m)
      pk = pk - 1
    end
  end
  local batch_of, nbatch = {}, 0
  for _, a in ipairs(sched.lowered[r + 1]) do
    for _, q in ipairs(a.sub or { a }) do
      local t, s, m = q.type, q.stage, q.mb
      if NO_OP[t] then -- luacheck: ignore 542 (nothing to issue)
      elseif t == "UNSHARD" then unshard(s, 0, "forward")
      elseif t == "F" then
        local list = managed(s)
        for i, u in ipairs(list) do
          if (single or raf) and explicit and (i == 1 or state_of(list[i - 1]) ~= state_of(u)) then
            -- torchtitan's explicit forward prefetch (ep > 1: distributed/
            -- fsdp.py:331-348): a state's pre-forward unshards it, then the
            -- stage's next state (its block, or [norm, lm_head] after the
            -- last); a state is a unit and its experts group
            gather_state(list, i, m)
            local j = i
            while list[j] and state_of(list[j]) == state_of(u) do j = j + 1 end
            if list[j] then gather_state(list, j, m) end
          elseif single and not explicit or raf then
            -- GPipe / 1F1B: each unit's pre-forward hook gathers it, after
            -- the unit before it ran its forward (and its collectives: CP's
            -- K/V all-gathers come before the next unit's gather, recorded
            -- live by tests/titan/test_cppp_record.py); under "always" every
            -- schedule's forward finds the unit sharded but after a backward
            gather(u, m, "forward")
          end
          if unit_ops then unit_ops(ops, u, m, "forward_before") end
          op("forward", u, m, "forward")
          if unit_ops then unit_ops(ops, u, m, "forward") end
          if raf and u.reshard_after_forward then
            fsdp_schedule.forward_reshard(op, u, m, post_fwd)
            unsharded[u.index] = false
          end
        end
      elseif t == "B" or t == "I" or t == "W" then
        -- Zero bubble's split backward (pps.split_backward): I the input
        -- gradient's part of each unit's backward ("backward_input"), W the
        -- weight gradient's ("backward", which writes them), priced apart by
        -- gen/compute.lua backward_us; on the first stage I runs nothing and
        -- W the whole backward (stage.py:1318-1321, 1393-1415). TP's and EP's
        -- backward collectives carry the input gradient: with B, I, or the
        -- first stage's W (EP's recompute under activation checkpointing too,
        -- as the backward re-runs the checkpointed forward), its pre-backward
        -- gathers under "always" likewise.
        local ip, wp = pps.split_backward(s)
        local part = wp
        if t == "B" then part = "full" elseif t == "I" then part = ip end
        local list = part and managed(s) or {}
        for i = #list, 1, -1 do
          if part ~= "weight" then
            if raf then pre_backward(list, i, m) end
            if unit_ops then unit_ops(ops, list[i], m, "backward_before") end
          end
          op(part == "input" and "backward_input" or "backward", list[i], m, "backward",
            part ~= "full" and { grads = part } or nil)
          if unit_ops and part ~= "weight" then unit_ops(ops, list[i], m, "backward") end
        end
      elseif t == "REDUCE_GRAD" then
        -- finalize_backward: layers last to first, the root last
        local list, post = managed(s), {}
        local root = list[1] and list[1].is_root and list[1] or nil
        for i = #list, root and 2 or 1, -1 do post[#post + 1] = list[i] end
        post[#post + 1] = root
        for _, u in ipairs(post) do
          if unit_ops then unit_ops(ops, u, last_mb, "reduce") end
          fsdp_schedule.reduction(ops, u, last_mb, { first = true, keep = true }, shard, replicate, true)
        end
      elseif t == "RESHARD" then reshard(s, last_mb)
      else -- SEND_F, RECV_F, SEND_B, RECV_B
        local grad = t == "SEND_B" or t == "RECV_B"
        local send = t == "SEND_F" or t == "SEND_B"
        local peer_stage = (t == "SEND_F" or t == "RECV_B") and s + 1 or s - 1
        local from_stage = send and s or peer_stage
        local u = boundary(s, t == "SEND_F" or t == "RECV_B")
        local batch = 0
        if q.batch ~= nil then
          local key = a.batch or q.batch
          if not batch_of[key] then nbatch = nbatch + 1; batch_of[key] = nbatch end
          batch = batch_of[key]
        end
        op(send and "send" or "recv", u, m, grad and "backward" or "forward",
          { dtype = act.dtype, count = act.numel, peer = sched.stage_to_rank[peer_stage], batch = batch,
            tag = 2 * from_stage + (grad and 1 or 0) })
      end
    end
  end
  for _, s in ipairs(stages) do reshard(s, last_mb) end
  fsdp_schedule.seal(ops, replicate)
  return ops
end

-- What each global rank of pp x dp_replicate x dp_shard issues, from the tables: the
-- same event records as gen/parallel/pp_sequence.lua's expected (which the
-- live checks hold to torch), so the two compare field by field.
-- classes: M.rank_tables's result; mesh: pp_sequence.mesh(pp, dp_shard,
-- dp_replicate, ep); W: dp_shard. An experts unit's FSDP collectives run on
-- its efsdp group, EP's all-to-alls on the ep group. opts.tp: TP's
-- collectives too (op = all_gather / reduce_scatter / all_reduce, tp =
-- true, their count and reduce op; no ranks: the mesh leaves tp out, the
-- caller names each TP rank's group), for tests/pp/compare_titan_pp.lua.
local A2A = { a2a = true, a2a_counts = true }
local TP_KIND = { tp_all_gather = "all_gather", tp_reduce_scatter = "reduce_scatter", tp_all_reduce = "all_reduce" }
function M.events(classes, mesh, W, opts)
  local with_tp = opts and opts.tp
  local groups = require("gen.groups")
  local dims = require("gen.dims")
  local ep_of, efsdp_of = seq.groups_of(mesh.ep), seq.groups_of(mesh.efsdp)
  local WE = mesh.efsdp and mesh.efsdp.size or 1
  local pp_of, fsdp_of, replicas_of = {}, {}, {}
  if mesh.replicate then
    for c = 0, mesh.replicate.count - 1 do
      for _, g in ipairs(groups.members(mesh.replicate, c)) do replicas_of[g] = groups.members(mesh.replicate, c) end
    end
  end
  if mesh.pp then
    for c = 0, mesh.pp.count - 1 do
      for _, g in ipairs(groups.members(mesh.pp, c)) do pp_of[g] = groups.members(mesh.pp, c) end
    end
  end
  if mesh.fsdp then
    for c = 0, mesh.fsdp.count - 1 do
      for _, g in ipairs(groups.members(mesh.fsdp, c)) do fsdp_of[g] = groups.members(mesh.fsdp, c) end
    end
  end
  local out = {}
  for g = 0, mesh.world - 1 do
    local coords = dims.coords(mesh.mesh, g)
    local r = mesh.mesh.index.pp and coords[mesh.mesh.index.pp] or 0
    local cls = classes[r + 1]
    local members = pp_of[g] or { g }
    local ev = {}
    for _, o in ipairs(cls.ops) do
      local u = cls.units[o.unit + 1]
      if o.kind == "send" or o.kind == "recv" then
        ev[#ev + 1] = { op = o.kind, peer = members[o.peer + 1], numel = o.count, dtype = o.dtype,
                        batch = o.batch > 0 and o.batch or nil }
      elseif (o.kind == "all_gather" or o.kind == "reduce_scatter") and o.group then
        local n, ranks = W, fsdp_of[g]
        if o.group == "efsdp" then n, ranks = WE, efsdp_of(g) end
        ev[#ev + 1] = { op = o.kind, ranks = ranks, unit = u.name, dtype = o.dtype,
                        in_numel = o.kind == "all_gather" and o.count or n * o.count,
                        out_numel = o.kind == "all_gather" and n * o.count or o.count }
      elseif A2A[o.kind] then
        -- exchange: which of the token dispatcher's steps (torchtitan's
        -- AllToAllTokenDispatcher: counts, dispatch, combine; " bwd" their
        -- autograd backward; a recompute re-runs the forward's), for the
        -- live comparison (tests/pp/compare_titan_pp.lua)
        local step = o.kind == "a2a_counts" and "counts" or (o.a2a_combine == 1) == (o.phase == "forward" or
          o.recompute == true) and "combine" or "dispatch"
        ev[#ev + 1] = { op = o.kind, ranks = ep_of(g), unit = u.name, dtype = o.dtype, in_numel = o.count,
                        out_numel = o.count,
                        exchange = step .. ((o.phase == "forward" or o.recompute) and "" or " bwd") }
      elseif with_tp and o.group == "tp" and (TP_KIND[o.kind] or o.kind == "all_reduce") then
        ev[#ev + 1] = { op = TP_KIND[o.kind] or o.kind, tp = true, unit = u.name, dtype = o.dtype, count = o.count,
                        reduce_op = o.reduce_op }
      elseif o.kind == "all_reduce" and o.group and o.group ~= "tp" then
        -- HSDP: the reduced shard across the replicas
        ev[#ev + 1] = { op = o.kind, ranks = replicas_of[g], unit = u.name, dtype = o.dtype, in_numel = o.count,
                        out_numel = o.count }
      end
    end
    out[g + 1] = ev
  end
  return out
end

M.format_action = pps.format_action

return M
