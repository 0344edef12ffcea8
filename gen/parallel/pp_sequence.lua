-- What each rank of a pipeline-parallel job issues in one training step,
-- in order (issue 22, item 6): the point-to-point operations of
-- gen/parallel/pp_schedule.lua's lowered lists, placed on the global mesh
-- (gen/dims.lua: pp outermost), and each stage's FSDP collectives where
-- torch.distributed.pipelining issues them. Pure functions. Line numbers are
-- torch 2.15.0's torch/distributed/pipelining/schedules.py and stage.py.
--
--   M.expected(sched, o) -> events per global rank (events[g + 1])
--     sched: pp_schedule.derive's result;
--     o.dp_shard: the FSDP degree; o.dp_replicate: HSDP's replicas (default
--       1; world = pp * dp_replicate * dp_shard; both 1: no FSDP);
--     o.act_numel, o.act_dtype: one microbatch's activation (and gradient)
--       between two stages;
--     o.stage_fsdp(stage) -> { gathers = { op... }, reduces = { op... } }:
--       the stage's FSDP collectives in issue order (each { unit, count },
--       count = elements per rank; a reduce's kind: "reduce_scatter" over
--       the shard group, or HSDP's "all_reduce" over the replicas), e.g.
--       gen/pipeline.lua's stage_fsdp_from_plan; nil or a data-parallel degree of 1: no FSDP.
--       A gather or reduce with group = "efsdp" is an experts unit's (ep >
--       1): it runs on the expert FSDP group (efsdp ranks) instead;
--     o.explicit_prefetch: torchtitan's explicit forward prefetching (ep >
--       1, distributed/fsdp.py:331-348): GPipe's and 1F1B's first forward
--       of a stage gathers state by state (a unit and its experts group:
--       stage_fsdp's f.states, each gather's and compute's `state`), each
--       state's pre-forward unsharding it, then the stage's next state,
--       before its compute; without it every unit at the forward's start
--       (the events are the same where no collective runs inside compute);
--     o.ep, o.tp: expert parallel's degree (default 1; it borrows from
--       dp_shard and tp, gen/dims.lua) and, with ep > 1, TP's (M.mesh);
--     o.reshard_after_forward: torchtitan's "always" policy under PP
--       (distributed/fsdp.py:54-77): every unit reshards after each
--       forward, so each F and each B that finds a unit sharded gathers it
--       again (the rules below, at the loop);
--     o.stage_compute(stage) -> { forward = { c... }, backward = { c... } }:
--       the collectives a stage's forward and backward of one microbatch
--       issue inside its compute (EP's token all-to-alls: each c = { op =
--       "a2a_counts" | "a2a", unit, count, dtype } on the ep group), in
--       issue order; torch's stage runs its module once per microbatch, so
--       every F issues the forward's, every B (or zero bubble's I, the
--       input gradient: the all-to-alls' backward carries it) the
--       backward's, W none (stage.py backward_weight_one_chunk: the saved
--       graph's weight gradients only) -- but on the first stage, whose I
--       runs nothing and whose W the whole backward (stage.py:1318-1321,
--       1393-1415), its W the backward's.
--   An event: { op = "send" | "recv", peer (global rank), numel, dtype,
--     batch (the lowered action's batch number, nil when issued alone),
--     action } or { op = "all_gather" | "reduce_scatter", ranks (the FSDP
--     group's global ranks), in_numel, out_numel, dtype, unit, action };
--     HSDP's { op = "all_reduce", ranks (the replicate group), in_numel =
--     out_numel, ... } after each unit's reduce-scatter (FSDP2's
--     foreach_reduce: reduce-scatter, then all-reduce of its output).
--     action names what runs when it is issued: a multi-stage schedule's own
--     lowered action (_PipelineScheduleRuntime runs them one by one,
--     schedules.py:3733); for GPipe and 1F1B the compute (or REDUCE_GRAD)
--     last begun, "" before the first.
--
-- Where FSDP2 (fully_shard per stage, reshard_after_forward=False as
-- torchtitan sets it under PP) communicates during the step:
--   - the step's first use of a stage finds it sharded: the schedule's
--     _initialize_stage(s) runs shape inference and reshards every FSDP
--     module after it (stage.py:2342);
--   - multi-stage: UNSHARD calls unshard(async_op=True) on every FSDPModule
--     of the stage in modules() order (schedules.py:3566): one all-gather per
--     unit with parameters, forward order; the forward then gathers nothing;
--   - GPipe / 1F1B (no UNSHARD action): the first forward's pre-forward
--     hooks gather each unit, forward order; the units stay unsharded
--     (reshard_after_forward False, backwards with
--     set_reshard_after_backward(False), stage.py:1131);
--   - no backward reduces (set_requires_gradient_sync(False), stage.py:1132);
--     REDUCE_GRAD (multi: start_gradient_reduction, stage.py:1427; single:
--     perform_reduce_grad at the end of _step_microbatches) runs
--     finalize_backward: one reduce-scatter per unit, reversed state order
--     (layers last to first, the root last);
--   - RESHARD frees, WAIT_REDUCE_GRAD waits: no collective.
-- The gathers and reduces per unit are the generator's own (a plan of the
-- stage's units with grad_accumulation = "step_end": gen/pipeline.lua's stage_fsdp_from_plan).
local dims = require("gen.dims")
local groups = require("gen.groups")
local pps = require("gen.parallel.pp_schedule")

local M = {}

local fmt = string.format

-- Per global rank, the group of family f that holds it (its members, in
-- key order; one table per group, shared by its members).
local function groups_by_rank(f)
  local of = {}
  for c = 0, f.count - 1 do
    local m = groups.members(f, c)
    for _, r in ipairs(m) do of[r] = m end
  end
  return function(g) return of[g] or error(fmt("rank %d is in no %s group", g, f.name)) end
end

-- The mesh of pp x dp_replicate x dp_shard (pp outermost, gen/dims.lua)
-- and its pp, fsdp (shard) and dp_replicate families.
-- With ep > 1 also its ep and efsdp families (ep borrows dp_shard's ranks,
-- and TP's where tp > 1: then the mesh holds TP's ranks too, each running
-- TP class 0's events, as the all-to-alls cross them; elsewhere TP's
-- collectives stay inside each TP rank's copy of the events and the mesh
-- leaves tp out).
function M.mesh(pp, dp_shard, dp_replicate, ep, tp)
  dp_replicate = dp_replicate or 1
  tp = (ep or 1) > 1 and tp or 1
  local world = pp * dp_replicate * dp_shard * tp
  local d = dims.infer(nil, { pp = pp, dp_shard = dp_shard, dp_replicate = dp_replicate, ep = ep or 1, tp = tp },
    world)
  local mesh = dims.mesh(d)
  local fams = groups.build(mesh)
  return { d = d, mesh = mesh, pp = fams.by_name.pp, fsdp = fams.by_name.fsdp,
           replicate = fams.by_name.dp_replicate, ep = fams.by_name.ep, efsdp = fams.by_name.efsdp, world = world }
end

-- Per global rank, its group of family f (nil: f absent, the rank alone).
function M.groups_of(f)
  if not f then return function(g) return { g } end end
  return groups_by_rank(f)
end

local P2P_OP = { SEND_F = "send", SEND_B = "send", RECV_F = "recv", RECV_B = "recv" }
local function peer_stage(a)
  if a.type == "SEND_F" then return a.stage + 1 end
  if a.type == "RECV_F" then return a.stage - 1 end
  if a.type == "SEND_B" then return a.stage - 1 end
  return a.stage + 1
end

-- M.expected's options for the stage mesh's plan p: FSDP's shard group
-- (dp_shard x cp, p.layout.W: CP's ranks shard the parameters too),
-- the replicas, ep and tp, explicit prefetching, one microbatch's
-- activation act { numel, dtype }, the stages' FSDP and in-compute
-- collectives (stage_fsdp, stage_compute). One builder for both callers,
-- the pipeline module's comparison and the report's whole-step proof.
function M.options(p, act, stage_fsdp, stage_compute)
  return { dp_shard = p.layout.W, dp_replicate = p.dims.dp_replicate, ep = p.dims.ep, tp = p.dims.tp,
           act_numel = act.numel, act_dtype = act.dtype, explicit_prefetch = p.layout.explicit_prefetch,
           reshard_after_forward = M.reshards_after_forward(p),
           stage_fsdp = stage_fsdp, stage_compute = stage_compute }
end

-- Whether a stage's units reshard after each forward under PP, from the
-- stage mesh's plan p: torchtitan's get_fsdp_reshard_after_forward_policy
-- (distributed/fsdp.py:54-77) with pp_enabled: "always" True, "default"
-- (not pp_enabled) and "never" False. The one place the pipeline's
-- tables, sequence, memory and step read it.
function M.reshards_after_forward(p)
  return p.fsdp ~= nil and p.fsdp.reshard_after_forward_policy == "always"
end

-- Whether the schedule's last stage ends on a split backward (its last
-- backward action an I, zero bubble's input gradient, its W after): under
-- reshard_after_forward torch 2.15 then reduces no gradient of that stage
-- (pp_report refuses it; tests/pp/compare_pipeline_live.lua holds it live).
function M.last_stage_ends_split(sched)
  local last = sched.num_stages - 1
  local final
  for _, a in ipairs(sched.lowered[sched.stage_to_rank[last] + 1]) do
    for _, q in ipairs(a.sub or { a }) do
      if q.stage == last and (q.type == "B" or q.type == "I") then final = q.type end
    end
  end
  return final == "I"
end

function M.expected(sched, o)
  local W, R = o.dp_shard or 1, o.dp_replicate or 1
  local m = M.mesh(sched.pp, W, R, o.ep, o.tp)
  local ep_of, efsdp_of = M.groups_of(m.ep), M.groups_of(m.efsdp)
  local WE = m.efsdp and m.efsdp.size or 1
  local compute_of = {}
  local function stage_compute(s)
    if not o.stage_compute then return nil end
    if compute_of[s] == nil then compute_of[s] = o.stage_compute(s) or false end
    return compute_of[s] or nil
  end
  local fsdp_of = {}
  local function stage_fsdp(s)
    if W * R == 1 or not o.stage_fsdp then return nil end
    if fsdp_of[s] == nil then fsdp_of[s] = o.stage_fsdp(s) or false end
    return fsdp_of[s] or nil
  end
  local single = sched.runtime == "single"
  local out = {}
  local pp_of, fsdp_of_rank = m.pp and groups_by_rank(m.pp), m.fsdp and groups_by_rank(m.fsdp)
  local replicate_of = m.replicate and groups_by_rank(m.replicate)
  for g = 0, m.world - 1 do
    local pp_members = pp_of and pp_of(g) or { g }
    local fsdp_ranks = fsdp_of_rank and fsdp_of_rank(g) or { g }
    local replicas = replicate_of and replicate_of(g) or { g }
    local coords = dims.coords(m.mesh, g)
    local pp_rank = m.mesh.index.pp and coords[m.mesh.index.pp] or 0
    local ev, label, gathered = {}, "", {}
    -- (torchtitan's "always" policy: each stage's units sharded or not, by unit name)
    local held = {}
    local ep_ranks, efsdp_ranks = ep_of(g), efsdp_of(g)
    local function colls(list, kind, s, action)
      for _, c in ipairs(list) do
        local k = c.kind or kind
        local n, ranks = W, fsdp_ranks
        if c.group == "efsdp" then n, ranks = WE, efsdp_ranks end
        if k == "all_reduce" then
          ev[#ev + 1] = { op = k, ranks = replicas, unit = c.unit, dtype = c.dtype, action = action,
                          in_numel = c.count, out_numel = c.count, stage = s }
        elseif n > 1 then
          -- (a shard group of one rank, dp_replicate alone: FSDP2 issues no
          -- all-gather or reduce-scatter, only the all-reduce;
          -- _fsdp_param_group.py and foreach_reduce's world_size > 1)
          local full = n * c.count
          ev[#ev + 1] = { op = k, ranks = ranks, unit = c.unit, dtype = c.dtype, action = action,
                          in_numel = k == "all_gather" and c.count or full,
                          out_numel = k == "all_gather" and full or c.count, stage = s }
        end
      end
    end
    -- Whether a compute action runs its stage's backward (its in-compute
    -- collectives, its pre-backward hooks): B; zero bubble's I, but on the
    -- first stage, whose I runs nothing and whose W the whole backward
    -- (pps.split_backward: stage.py:1318-1321, 1393-1415); no other W.
    local function runs_backward(q)
      local ip, wp = pps.split_backward(q.stage)
      return q.type == "B" or (q.type == "I" and ip ~= nil) or (q.type == "W" and wp == "full")
    end
    -- the collectives inside one compute action (EP's all-to-alls)
    local function inside(q, action)
      local c = stage_compute(q.stage)
      local list = c and (q.type == "F" and c.forward or runs_backward(q) and c.backward)
      for _, x in ipairs(list or {}) do
        ev[#ev + 1] = { op = x.op, ranks = ep_ranks, unit = x.unit, dtype = x.dtype, in_numel = x.count,
                        out_numel = x.count, action = action, stage = q.stage }
      end
    end
    -- reshard_after_forward (torchtitan's "always"): the units of stage s
    -- in `order` (forward, or reversed for a backward) that are sharded,
    -- gathered and marked unsharded
    local function gather_sharded(s, order, action, state)
      local f = stage_fsdp(s)
      if not f then return end
      held[s] = held[s] or {}
      local n = #f.gathers
      for i = 1, n do
        local x = f.gathers[order == "backward" and n + 1 - i or i]
        if not held[s][x.unit] and (state == nil or (x.state or x.unit) == state) then
          colls({ x }, "all_gather", s, action)
          held[s][x.unit] = true
        end
      end
    end
    -- (under "always") one compute action's all-gathers and in-compute
    -- collectives, state by state (a unit and its experts group): a
    -- forward's pre-forward gathers the state, then (explicit prefetching,
    -- ep > 1) the next one, then the state runs (EP's all-to-alls); a
    -- backward's pre-backward gathers the state, then the one before it
    -- (FSDP2's default prefetch and torchtitan's explicit lists alike),
    -- then the state's backward runs
    local function raf_compute(q, action)
      local f, c = stage_fsdp(q.stage), stage_compute(q.stage)
      local fwd = q.type == "F"
      local list = c and (fwd or runs_backward(q)) and (fwd and c.forward or c.backward) or {}
      local states, seen = {}, {}
      -- (a stage_fsdp without states, gen/pipeline.lua's: each gather's unit is its state)
      for _, x in ipairs(f and (f.states or f.gathers) or {}) do
        local st = type(x) == "table" and (x.state or x.unit) or x
        if not seen[st] then states[#states + 1], seen[st] = st, true end
      end
      for _, x in ipairs(list) do
        if x.state and not seen[x.state] then states[#states + 1], seen[x.state] = x.state, true end
      end
      local n = #states
      for j = 1, n do
        local i = fwd and j or n + 1 - j
        -- (a backward's own state: its groups in forward order; the prefetched one's last to first)
        gather_sharded(q.stage, "forward", action, states[i])
        local other = fwd and (o.explicit_prefetch and states[i + 1]) or (not fwd and states[i - 1])
        if other then gather_sharded(q.stage, fwd and "forward" or "backward", action, other) end
        for _, x in ipairs(list) do
          if x.state == states[i] then
            ev[#ev + 1] = { op = x.op, ranks = ep_ranks, unit = x.unit, dtype = x.dtype, in_numel = x.count,
                            out_numel = x.count, action = action, stage = q.stage }
          end
        end
      end
      -- (a collective whose state is unknown: after the action's own)
      for _, x in ipairs(list) do
        if not x.state then
          ev[#ev + 1] = { op = x.op, ranks = ep_ranks, unit = x.unit, dtype = x.dtype, in_numel = x.count,
                          out_numel = x.count, action = action, stage = q.stage }
        end
      end
    end
    for _, a in ipairs(sched.lowered[pp_rank + 1]) do
      local k = pps.format_action(a)
      if pps.IS_COMPUTE[a.type] or a.type == "REDUCE_GRAD" then label = k end
      local op = P2P_OP[a.type]
      local issued = false
      if o.reshard_after_forward and not op then
        -- torchtitan's "always" (distributed/fsdp.py:54-77: True with PP too):
        -- every F's pre-forward hooks gather each sharded unit, forward
        -- order, and its post-forward reshards it (_fsdp_param_group.py
        -- pre_forward / post_forward); a B's or I's pre-backward hooks gather
        -- them again, last to first (each unit's own, then FSDP2's prefetch
        -- of the one before it: _backward_prefetch, one communicator's order
        -- alike), and keep them (set_reshard_after_backward(False),
        -- stage.py:1131), so an F right after a B gathers nothing; UNSHARD
        -- gathers what is sharded; RESHARD and REDUCE_GRAD's finalize
        -- (reshard_after_backward True, stage.py:1434) leave them sharded; W
        -- (the weight gradient from the saved graph) gathers nothing, but
        -- on the first stage, whose I runs no backward and whose W runs the
        -- whole backward (stage.py:1319-1321).
        for _, q in ipairs(a.sub or { a }) do
          if q.type == "UNSHARD" then gather_sharded(q.stage, "forward", k)
          elseif q.type == "F" then
            raf_compute(q, single and label or k)
            held[q.stage] = {}
          elseif runs_backward(q) then
            raf_compute(q, single and label or k)
          elseif q.type == "RESHARD" then held[q.stage] = {}
          elseif q.type == "REDUCE_GRAD" then
            local f = stage_fsdp(q.stage)
            if f then colls(f.reduces, "reduce_scatter", q.stage, k) end
            held[q.stage] = {}
          end
        end
        issued = true
      elseif op then
        ev[#ev + 1] = { op = op, peer = pp_members[sched.stage_to_rank[peer_stage(a)] + 1], numel = o.act_numel,
                        dtype = o.act_dtype, batch = a.batch, action = single and label or k }
      elseif a.type == "UNSHARD" then
        local f = stage_fsdp(a.stage)
        if f then colls(f.gathers, "all_gather", a.stage, k) end
      elseif a.type == "REDUCE_GRAD" then
        local f = stage_fsdp(a.stage)
        if f then colls(f.reduces, "reduce_scatter", a.stage, k) end
        gathered[a.stage] = nil
      elseif single and a.type == "F" and not gathered[a.stage] and o.explicit_prefetch then
        gathered[a.stage] = true
        local f = stage_fsdp(a.stage) or { gathers = {}, states = {} }
        local c = stage_compute(a.stage) or { forward = {} }
        local done = {}
        local function gather(st)
          if not st or done[st] then return end
          done[st] = true
          local list = {}
          for _, x in ipairs(f.gathers) do if x.state == st then list[#list + 1] = x end end
          colls(list, "all_gather", a.stage, label)
        end
        local states = f.states
        if #states == 0 then -- (no FSDP: the compute's units in order)
          for _, x in ipairs(c.forward) do if states[#states] ~= x.state then states[#states + 1] = x.state end end
        end
        for i, st in ipairs(states) do
          gather(st)
          gather(states[i + 1])
          for _, x in ipairs(c.forward) do
            if x.state == st then
              ev[#ev + 1] = { op = x.op, ranks = ep_ranks, unit = x.unit, dtype = x.dtype, in_numel = x.count,
                              out_numel = x.count, action = label, stage = a.stage }
            end
          end
        end
        issued = true -- (its compute's collectives, above)
      elseif single and a.type == "F" and not gathered[a.stage] then
        local f = stage_fsdp(a.stage)
        if f then colls(f.gathers, "all_gather", a.stage, k) end
        gathered[a.stage] = true
      end
      -- (OVERLAP_F_B runs its parts in turn)
      if not issued then
        for _, q in ipairs(a.sub or { a }) do inside(q, single and label or k) end
      end
    end
    out[g + 1] = ev
  end
  return out
end

return M
