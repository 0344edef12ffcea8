-- Expert parallel, the module (gen/parallel/init.lua's contract).
-- ParallelDims takes ep with torchtitan 0.3's meshes (gen/dims.lua: ep
-- borrows its ranks from dp_shard*cp*tp; the expert mesh is (pp,
-- dp_replicate, efsdp, ep) over the same ranks) and gen/groups.lua builds
-- its ep and efsdp process groups (docs/expert-parallel.md).
--
-- With ep > 1 (torchtitan 0.3's apply_fsdp_to_decoder and ExpertParallel,
-- torch 2.15's fully_shard with a per-parameter mesh):
--  * apply_units: each MoE block's routed experts (the grouped 3-D
--    moe.routed_experts.inner_experts.w1_EFD / w2_EDF / w3_EFD) are split on
--    dim 0 over ep (ExpertParallel's Shard(0): num_experts / ep experts per
--    rank, ep member m holding experts m*E/ep ..), and become the block's
--    second FSDP parameter group, sharded over efsdp: Shard(1) where
--    efsdp*ep > num_experts, else Shard(0) (torchtitan's rule; the dense
--    replicas are not counted at ep > 1). Every other parameter stays in the
--    first group, Shard(0) over the dense FSDP mesh (dp_shard, HSDP's
--    dp_replicate x dp_shard). The layout holds the two groups as two units
--    of one FSDP state (u.state): "layers.i" and "layers.i.experts".
--  * on_layout: the token all-to-alls' geometry on each experts unit (the
--    capacity policy below), and torchtitan's explicit prefetching (with
--    ep > 1 it sets forward and backward prefetch between consecutive
--    blocks), which gen/parallel/fsdp_schedule.lua then follows.
--  * unit_ops: per micro-step, torchtitan's _token_dispatch / _token_combine
--    around the experts' compute: forward a2a_counts, a2a dispatch,
--    (experts), a2a combine; backward the combine's gradient (a dispatch,
--    a2a_combine = 0), (the experts' backward), the dispatch's gradient
--    (a2a_combine = 1), both split by that micro-step's counts. Under
--    activation checkpointing (full or selective) the backward first
--    re-runs the forward's three (recompute = true: a2a_counts naming the
--    forward's as its a2a_counts_op, a2a dispatch, a2a combine), and the
--    backward's two split by the recompute's counts.
-- With tp > 1 too (etp = 1, gen/dims.lua; every MoE family's TP plan,
-- gen/parallel/tp.lua, models/common/moe_sharding.py): the experts are not TP-split, ep
-- borrows TP's ranks, and the MoE input stays sequence-sharded, so each
-- rank routes its own batch x seq / tp tokens: the all-to-alls are sized
-- from those (torchtitan 0.3's moe_sharding.py with EP; recorded live:
-- tests/ep/check_ep_live.sh's dp2_tp2_ep* and *_tp2_ep2 cases).
-- With cp > 1 too (ep borrows from dp_shard x cp x tp): each rank routes
-- its own batch x seq / cp tokens (/ tp under SP), the all-to-alls sized
-- from those (recorded live: tests/titan/test_cp_record.py's
-- mixtral_dp2_cp2_ep2; gen/parallel/cp.lua has the rest).
-- With pp > 1 (torchtitan's pipeline_llm runs parallelize on each stage's
-- module, distributed/pipeline_parallel.py:109-123, so every stage's MoE
-- blocks get ExpertParallel on the stage mesh's ep group): the pipeline's
-- tables (gen/parallel/pp_tables.lua) call these unit_ops inside each
-- microbatch's F and B (zero bubble's I: the all-to-alls' backward carries
-- the input gradient; W none), a counts slot per microbatch; FSDP reduces
-- once, after the last microbatch (step_end: torch's pipelining runs each
-- backward without gradient sync and REDUCE_GRAD at the end; torchtitan's
-- fsdp.py:74 keeps the stages unsharded). gen/parallel/pp_sequence.lua
-- states the all-to-alls torch issues per F and B, from the stage mesh's
-- plan, and the pipeline's proofs hold the tables to it.
-- Refused with ep > 1, one line each: a model without routed experts,
-- step_end without a pipeline, an ep neither a multiple nor a divisor of
-- tp (the runtime's mesh), and expert_parallel settings on a plan without
-- ep.
local util = require("gen.util")
local compute = require("gen.compute")

local ep = {
  name = "ep", label = "EP", dims = { "ep" }, groups = { "ep", "efsdp" },
}

-- The routed experts' grouped weights (gen/models/moe.lua's names).
ep.EXPERTS = ".moe.routed_experts.inner_experts."
ep.MOE_FAMILIES = { mixtral = true, qwen3_moe = true, deepseek_v3 = true, gpt_oss = true }

function ep.used(d) return d.ep > 1 end

local function is_expert(q)
  return q.name:find(ep.EXPERTS, 1, true) ~= nil
end

-- The capacity policy: p.expert_parallel -> { name, factor }.
function ep.policy(p)
  local e = p.expert_parallel or {}
  if e.capacity_factor then return { name = "factor", factor = e.capacity_factor } end
  return { name = e.capacity or "dropless" }
end

-- Rows of token activations one rank sends one ep member at most, and what
-- each buffer holds per member (capacity). tokens: this rank's per
-- micro-step; a token goes to top_k distinct experts, at most
-- min(top_k, experts per member) of them on one member, so "dropless" (every
-- routing fits: torchtitan's default dispatcher drops nothing) is
-- tokens x min(top_k, E/ep); "factor" is ceil(factor x tokens x top_k / ep)
-- (the uniform share times the factor), never above dropless.
-- The ceiling is taken on the factor as the plan wrote it (the fewest
-- decimals that give its double, up to 6): 1.1 x 50 / 5 is 11 rows, where
-- the double 1.1's excess would round 11.000000000000002 up to 12.
local function ceil_factor(f, rows, n)
  for digits = 0, 6 do
    local den = math.tointeger(10 ^ digits)
    local m = math.tointeger(math.floor(f * den + 0.5))
    if m and m > 0 and m / den == f and rows <= math.maxinteger // m // den then
      return (m * rows + den * n - 1) // (den * n)
    end
  end
  return math.ceil(f * rows / n)
end

function ep.capacity(tokens, top_k, experts, ep_size, policy)
  local per = experts // ep_size
  local rows = tokens * top_k
  local worst = tokens * math.min(top_k, per)
  if policy.name == "factor" then
    local c = ceil_factor(policy.factor, rows, ep_size)
    return math.max(1, math.min(worst, math.tointeger(c) or worst)), rows, worst
  end
  return worst, rows, worst
end

function ep.rules(ctx, d, p)
  local e = p.expert_parallel
  if d.ep == 1 then
    if e ~= nil then
      util.field_error(ctx, "expert_parallel", "the all-to-alls' capacity applies only with ep > 1 "
        .. "(parallel.ep is 1): remove expert_parallel or set parallel.ep")
    end
    return
  end
  if not ep.MOE_FAMILIES[p.model.family] then
    util.field_error(ctx, "parallel.ep", string.format("ep=%d: expert parallelism needs routed experts; the %s "
      .. "family has none (mixtral, qwen3_moe, deepseek_v3 and gpt_oss do); set ep=1", d.ep, p.model.family))
  end
  if d.tp > 1 and d.ep % d.tp ~= 0 and d.tp % d.ep ~= 0 then
    -- (the runtime's mesh refines the dense and expert meshes into whole axes, gen/emit.lua: an ep group
    -- must hold whole TP groups or lie inside one)
    util.field_error(ctx, "parallel.ep", string.format("ep=%d with tp=%d: the ep groups (ep consecutive ranks of "
      .. "dp_shard*tp) would cut TP groups unevenly, which the runtime's mesh of whole axes cannot hold, though "
      .. "torchtitan 0.3 accepts it; pick ep a multiple or a divisor of tp", d.ep, d.tp))
  end
  -- (under PP step_end is what runs: each stage's backwards accumulate
  -- without gradient sync and REDUCE_GRAD reduces once, after the last
  -- microbatch, gen/parallel/pp.lua's settings; the all-to-alls run inside
  -- every microbatch's forward and backward all the same)
  if p.fsdp.grad_accumulation == "step_end" and d.pp == 1 and not p.stage_of_pipeline then
    util.field_error(ctx, "fsdp.grad_accumulation", "step_end is the pipeline schedules' accumulation; with ep > 1 "
      .. "and no pipeline use fsdp2_default, sync_last or all_reduce_last (or set parallel.pp > 1)")
  end
  if e then
    if e.capacity == "factor" and not e.capacity_factor then
      util.field_error(ctx, "expert_parallel.capacity", "capacity = \"factor\" needs capacity_factor "
        .. "(e.g. 1.25: ceil(1.25 x tokens x top_k / ep) rows per member)")
    end
    if e.capacity == "dropless" and e.capacity_factor then
      util.field_error(ctx, "expert_parallel.capacity_factor", "capacity = \"dropless\" sizes every buffer for the "
        .. "worst routing, so capacity_factor changes nothing: remove one of them")
    end
  end
end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- Each MoE block -> its dense group and its experts group (wrap order: the
-- experts right after their block, as FSDP2 orders a state's groups by
-- where each group's first parameter appears: the attention first).
function ep.apply_units(ctx, units, d, _)
  local out = {}
  for _, u in ipairs(units) do
    local dense, experts = {}, {}
    for _, q in ipairs(u.params) do
      if is_expert(q) then experts[#experts + 1] = q else dense[#dense + 1] = q end
    end
    if #experts == 0 then
      out[#out + 1] = u
    else
      local E = experts[1].shape[1]
      local per = E // d.ep
      -- torchtitan: efsdp * ep > num_experts -> Shard(1) "to avoid padding"
      local sd = d.efsdp * d.ep > E and 1 or 0
      local local_params = {}
      for j, q in ipairs(experts) do
        local shape = {}
        for i, n in ipairs(q.shape) do shape[i] = n end
        shape[1] = per
        local l = copy(q)
        l.shape, l.shard_dim, l.full_shape, l.ep_chunk = shape, sd, q.shape, per
        local_params[j] = l
      end
      local du = copy(u)
      du.params, du.state = dense, u.name
      local eu = { name = u.name .. ".experts", params = local_params, expert = true, state = u.name,
                   reshard_after_forward = u.reshard_after_forward,
                   reshard_after_backward = u.reshard_after_backward,
                   unshard_in_backward = u.unshard_in_backward, param_dtype = u.param_dtype,
                   reduce_dtype = u.reduce_dtype, num_experts = E,
                   -- the module's setters reach every parameter group of its state (_fully_shard.py:856-878)
                   gradient_divide_factor = u.gradient_divide_factor,
                   force_sum_reduction_for_comms = u.force_sum_reduction_for_comms,
                   grad_accumulation = u.grad_accumulation,
                   cpu_offload = u.cpu_offload, pin_memory = u.pin_memory }
      out[#out + 1] = du
      out[#out + 1] = eu
    end
  end
  if #out == #units then
    util.field_error(ctx, "parallel.ep", string.format("ep=%d: the model has no MoE block (no %s weights); set ep=1",
      d.ep, ep.EXPERTS))
  end
  return out
end

-- Whether the backward re-issues the token dispatcher's all-to-alls under
-- activation checkpointing ac ("none" | "full" | "selective"): torchtitan
-- 0.3 wraps every block (FullAC, and SelectiveAC's op-level policy) and its
-- default spmd_types dispatcher issues them as c10d.alltoall_ (spmd_types'
-- dist.all_to_all), which SelectiveAC's save list (it names
-- _c10d_functional.all_to_all_single) does not hold: both re-run the
-- counts exchange, dispatch and combine in backward, before the block's
-- two backward all-to-alls (recorded live: tests/ep/check_ep_live.sh's
-- *_full / *_sel cases; docs/expert-parallel.md).
function ep.recomputes(ac)
  return ac == "full" or ac == "selective"
end

-- The all-to-alls' geometry on each experts unit, and the explicit prefetch.
function ep.on_layout(_, lay, _, d, p, cfg)
  local s = compute.settings({ training = p.training, model = p.model, topology = p.topology, dims = d })
  local policy = ep.policy(p)
  -- a rank routes its own tokens: seq_len / cp of each sequence (context
  -- parallel), of them its sequence shard under TP (sequence parallel)
  local tokens = s.tokens // d.tp
  lay.explicit_prefetch = true
  lay.ep = { size = d.ep, efsdp = d.efsdp, policy = policy, tokens = tokens, top_k = cfg.top_k, dim = cfg.dim,
             ac = s.activation_checkpointing }
  for _, u in ipairs(lay.units) do
    if u.expert then
      local cap, rows, worst = ep.capacity(tokens, cfg.top_k, u.num_experts, d.ep, policy)
      u.a2a = { per = u.num_experts // d.ep, rows = rows, capacity = cap, worst = worst, dim = cfg.dim,
                uniform = util.ceil_div(rows, d.ep), recompute = ep.recomputes(s.activation_checkpointing) }
      u.a2a_numel = d.ep * cap * cfg.dim
      u.a2a_slots = p.fsdp.micro_steps
      u.a2a_experts = u.num_experts
      lay.ep.capacity, lay.ep.rows, lay.ep.worst, lay.ep.experts = cap, rows, worst, u.num_experts
    end
  end
  return lay
end

-- The counts op of (unit, micro-step) the token exchanges split by (weak:
-- a rebuilt schedule starts afresh).
local COUNTS = setmetatable({}, { __mode = "k" })

local function a2a_op(u, m, phase, kind, extra)
  local a = u.a2a
  local o = { kind = kind, unit = u.index, micro_step = m, phase = phase, group = "ep", dtype = u.ag_dtype,
              a2a_experts = a.per, a2a_slot = m, a2a_dim = a.dim, a2a_capacity = a.capacity,
              -- (priced at the uniform routing's rows per member: gen/cost.lua)
              a2a_uniform = kind == "a2a" and a.uniform * a.dim or nil }
  for k, v in pairs(extra) do o[k] = v end
  return o
end

-- at: "forward_before" / "forward" (around the experts' forward) and
-- "backward_before" / "backward" (around their backward).
function ep.unit_ops(out, u, m, at)
  if not u.a2a then return end
  local a = u.a2a
  if at == "forward_before" then
    local c = a2a_op(u, m, "forward", "a2a_counts", { count = a.per, a2a_rows = a.rows })
    COUNTS[u] = COUNTS[u] or {}
    COUNTS[u][m] = c
    out[#out + 1] = c
    out[#out + 1] = a2a_op(u, m, "forward", "a2a", { count = a.capacity * a.dim, a2a_counts_of = c, a2a_combine = 0 })
  elseif at == "forward" then
    out[#out + 1] = a2a_op(u, m, "forward", "a2a", { count = a.capacity * a.dim, a2a_counts_of = COUNTS[u][m],
                                                    a2a_combine = 1 })
  elseif at == "backward_before" then
    if a.recompute then
      -- activation checkpointing re-runs the block's forward first: its
      -- counts exchange (the same routing: the same counts, checked at run
      -- time against the forward's, op a2a_counts_op), dispatch and combine,
      -- refilling the micro-step's slot; the backward splits by it
      local f = COUNTS[u][m]
      local c = a2a_op(u, m, "backward", "a2a_counts", { count = a.per, a2a_rows = a.rows, a2a_counts_of = f,
                                                         recompute = true })
      out[#out + 1] = c
      out[#out + 1] = a2a_op(u, m, "backward", "a2a", { count = a.capacity * a.dim, a2a_counts_of = c,
                                                       a2a_combine = 0, recompute = true })
      out[#out + 1] = a2a_op(u, m, "backward", "a2a", { count = a.capacity * a.dim, a2a_counts_of = c,
                                                       a2a_combine = 1, recompute = true })
      COUNTS[u][m] = c
    end
    out[#out + 1] = a2a_op(u, m, "backward", "a2a", { count = a.capacity * a.dim, a2a_counts_of = COUNTS[u][m],
                                                     a2a_combine = 0 })
  elseif at == "backward" then
    out[#out + 1] = a2a_op(u, m, "backward", "a2a", { count = a.capacity * a.dim, a2a_counts_of = COUNTS[u][m],
                                                     a2a_combine = 1 })
  end
end

return ep
