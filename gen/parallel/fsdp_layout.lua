-- Stage 4: FSDP2 buffer layouts per unit. Dim-k torch.chunk sharding with
-- padding, the fused all-gather slot (every parameter's padded shard in
-- order), the copy-out and reduce-scatter (chunk_cat) geometry, and the
-- reduction ops. Everything is rank-generic: per-rank valid lengths follow
-- from (numel, run, rank) in closed form.
local util = require("gen.util")

local layout = {}

layout.DTYPE_BYTES = util.DTYPE_BYTES
-- Copy kernels move 16 bytes per thread step (8 elements of 2 bytes, 4 of
-- 4): a unit whose offsets, runs and slot are multiples of VEC takes that path.
layout.VEC = 8
layout.GRAD_ALIGN = 8

-- One parameter's geometry on a shard group of size W.
-- Shard(k): the tensor is viewed as (outer, size_k * rest); rank r owns the
-- column block [r*c*rest, (r+1)*c*rest) of every row, c = ceil(size_k / W).
-- run = c*rest is that block's width; padded = outer*run is what every rank
-- stores and sends (FSDP's padded local numel).
function layout.param(ctx, p, W, path, group)
  local k = p.shard_dim + 1
  local size_k = p.shape[k]
  -- gen/load bounded the numel by 2^53 (so every factor below is smaller).
  if k > 1 and size_k % W ~= 0 then
    util.field_error(ctx, path .. ".shard_dim", string.format(
      "FSDP does not support uneven sharding on dim %d: %s has size %d there, not divisible by %s=%d; "
      .. "use shard_dim=0 or a size divisible by %d", p.shard_dim, p.name, size_k, group or "dp_shard", W, W))
  end
  -- An empty TP-local tensor (torch.chunk of 3 rows over tp = 4 leaves
  -- the last TP rank none): torch 2.15's FSDP2 cannot reduce its gradient
  -- (foreach_reduce_scatter_copy_in's _chunk_cat: "expects non-empty
  -- tensor"; on Shard(k>0) lazy init already raises "Shard(k) requires even
  -- sharding"), so no FSDP2 job runs it.
  if util.product(p.shape) == 0 then
    util.field_error(ctx, path .. ".tp", string.format(
      "the TP split leaves %s an empty TP-local tensor (shape %s) on some TP rank, and FSDP2 cannot reduce an "
      .. "empty gradient (torch's _chunk_cat: 'expects non-empty tensor'%s); give that dim at least tp "
      .. "rows per torch.chunk (e.g. a multiple of tp), or tp = \"replicate\"",
      p.name, table.concat(p.shape, "x"),
      k > 1 and string.format("; on shard_dim %d fully_shard already raises 'Shard(%d) requires even sharding'",
        p.shard_dim, p.shard_dim) or ""))
  end
  local outer = util.product(p.shape, 1, k - 1)
  local rest = util.product(p.shape, k + 1, #p.shape)
  local chunk = util.ceil_div(size_k, W)
  local numel = util.product(p.shape)
  return {
    name = p.name, shape = p.shape, dtype = p.dtype, shard_dim = p.shard_dim, numel = numel,
    chunk = chunk, outer = outer, run = chunk * rest, padded = outer * chunk * rest,
    row_numel = rest,
  }
end

-- Elements of a parameter's shard that hold real data on shard rank r.
-- Shard(0): clamp(numel - r*run, 0, run); Shard(k>0) shards are always full.
function layout.valid(param, r)
  if param.shard_dim > 0 then return param.padded end
  return math.max(0, math.min(param.run, param.numel - r * param.run))
end

-- Rows of dim shard_dim held by rank r (the local DTensor's dim size).
function layout.local_rows(param, r)
  if param.shard_dim > 0 then return param.chunk end
  return layout.valid(param, r) // param.row_numel
end

-- FSDP2's _get_gradient_divide_factors (torch 2.15 _fsdp_collectives.py:945-1002)
-- for one unit: factor is its set_gradient_divide_factor (nil: FSDP2's
-- default, the data-parallel size W x R), force its
-- set_force_sum_reduction_for_comms; W the reduce-scatter group's ranks, R
-- the all-reduce's. fp32/bf16 without force: AVG in the collectives (SUM at
-- one rank), and with a factor the reduce-scatter AVG where the factor is
-- W, else PREMUL_SUM(1 / factor) (premul: the factor), the all-reduce SUM.
-- fp16 or force: SUM on the wire with the division around it, for fp16 a
-- power-of-two pre-divide and the rest after, else all of it after.
-- PREMUL_SUM(1.0) sums exactly, so a factor of 1 is SUM. A one-rank shard
-- group issues no reduce-scatter and divides its copy by the factor
-- (:688-691, after the pre-divide): pre_divide here. Returns the
-- reduction, or nil and a message where FSDP2 divides twice before the
-- all-reduce (fp16 at one shard rank), which one pre_divide cannot hold.
function layout.reduction(factor, force, reduce_dtype, W, R)
  local dp = W * R
  local risk = reduce_dtype ~= "fp32" and reduce_dtype ~= "bf16" -- :967-968 overflow_risk
  if not risk and not force then
    if factor == nil then
      if dp == 1 then return { rs_op = "sum", ar_op = "sum", pre_divide = 1, post_divide = 1 } end
      return { rs_op = "avg", ar_op = "avg", pre_divide = 1, post_divide = 1 }
    end
    local red = { rs_op = "sum", ar_op = "sum", pre_divide = 1, post_divide = 1 }
    if W == 1 then red.pre_divide = factor
    elseif factor == W then red.rs_op = "avg"
    elseif factor ~= 1 then red.rs_op, red.premul = "premul_sum", factor end
    return red
  end
  local f = factor or dp
  local pre, post = 1, f
  if risk then -- :990-996: divide by ~sqrt(f) before and after
    while f % pre == 0 and f / pre > pre do pre = pre * 2 end
    post = f / pre
  end
  if W == 1 and factor and factor ~= 1 then
    if pre ~= 1 then
      return nil, string.format("an fp16 reduction over a one-rank shard group with a divide factor divides "
        .. "twice before the all-reduce (pre-divide %g, then the copy's / %g: _fsdp_collectives.py:679-691); "
        .. "give dp_shard > 1, reduce_dtype fp32 or bf16, or no gradient_divide_factor", pre, factor)
    end
    pre = factor
  end
  return { rs_op = "sum", ar_op = "sum", pre_divide = pre, post_divide = post }
end

-- A unit's gradient accumulation: its own (set_requires_gradient_sync /
-- set_requires_all_reduce(False, recurse=False) on its FSDPModule, torch
-- 2.15 _fully_shard.py:597-648: each sets its param groups' reduce_grads /
-- all_reduce_grads, so the unit's setting is what results whatever a
-- recursive call on an outer module set before), else the plan's.
function layout.unit_accumulation(u, fsdp)
  return u.grad_accumulation or fsdp.grad_accumulation
end

-- fully_shard's ignored_params of a unit (gen/models/generic.lua): each
-- {name, shape, dtype, numel}, numel the elements one rank holds, whole
-- (a TP placement's largest TP-local share: ceil(rows / tp) rows).
local function ignored_of(u, T)
  if not u.ignored then return nil end
  local out = {}
  for _, q in ipairs(u.ignored) do
    local tp_dim = q.tp == "colwise" and 0 or q.tp == "rowwise" and 1
      or q.tp and tonumber(q.tp:match("^shard%((%d)%)$")) or nil
    local numel = 1
    for k, x in ipairs(q.shape) do
      numel = numel * ((tp_dim == k - 1 and T > 1) and util.ceil_div(x, T) or x)
    end
    out[#out + 1] = { name = q.name, shape = q.shape, dtype = q.dtype, numel = numel }
  end
  return out
end

-- Each parameter's all-gather dtype: the unit's param_dtype, or the
-- parameter's own param_dtype (torch 2.15 MixedPrecisionPolicy's
-- param_dtype_override_fn, _fsdp_api.py:68-110: it may return the unit's
-- param_dtype or the parameter's own dtype, nothing else). Returns the list
-- and whether they differ: then FSDP2's foreach_all_gather sees inputs of
-- several dtypes and all-gathers their bytes as uint8
-- (_fsdp_collectives.py:369-372, 922-942).
-- FSDPModule.set_unshard_in_backward(False) (a unit's unshard_in_backward =
-- false; torch 2.15 _fully_shard.py:1000-1009): FSDPParamGroup.unshard
-- returns in PRE_BACKWARD (_fsdp_param_group.py:463-467), its own
-- pre-backward's and a later unit's backward prefetch alike, so a unit
-- resharded after forward runs its backward on the sharded parameters
-- (o.sharded_backward: no all-gather, copy-out or reshard in backward, the
-- backward op reads no unsharded buffer); its gradients (autograd made them
-- without the parameters' values) still reduce-scatter (post_backward,
-- _fsdp_param_group.py:695-). A unit kept unsharded (the root, or
-- reshard_after_forward false) backwards on its unsharded parameters as
-- before. The loss head's lm_head gathers again inside the loss
-- (ChunkedLossWrapper) and a post-forward group keeps a slice for backward:
-- both refused, naming the field. (Only a generic unit sets it, and the
-- generic family has no pipeline stages: gen/models/generic.lua.)
function layout.unshard_in_backward(ctx, o, u, upath)
  if u.unshard_in_backward ~= false then return end
  o.unshard_in_backward = false
  local field = upath .. ".unshard_in_backward"
  if u.loss_head then
    util.field_error(ctx, field, "the loss head's lm_head is unsharded by torchtitan's ChunkedLossWrapper inside "
      .. "the loss (lm_head.unshard(), distributed/fsdp.py:202-207), not by its pre-backward: remove it or "
      .. "loss_head")
  end
  if o.post_forward then
    util.field_error(ctx, field, "with reshard_after_forward = " .. o.post_forward.k .. " the unit keeps a "
      .. "post-forward slice only for its backward all-gather (torch 2.15 _fsdp_param.py:970-1010), which "
      .. "this skips: set the unit's reshard_after_forward = true or remove unshard_in_backward")
  end
  if o.reshard_after_forward and #o.params > 0 then o.sharded_backward = true end
end

function layout.param_ag_dtypes(ctx, u, upath, ag_dtype)
  local out, mixed = {}, false
  for j, p in ipairs(u.params) do
    local d = p.param_dtype or ag_dtype
    if d ~= ag_dtype and d ~= p.dtype then
      util.field_error(ctx, string.format("%s.params[%d].param_dtype", upath, j), string.format(
        "%s's param_dtype %s is neither the unit's param_dtype (%s) nor its own dtype (%s), and FSDP2 refuses any "
        .. "other (torch 2.15 _fsdp_api.py:98-104, MixedPrecisionPolicy.param_dtype_override_fn): use %s or %s",
        p.name, d, ag_dtype, p.dtype, ag_dtype, p.dtype))
    end
    out[j] = d
    -- uint8 only where the all-gather inputs differ from each other
    -- (_fsdp_collectives.py:927-933): every parameter overridden alike
    -- gathers in that one dtype
    mixed = mixed or d ~= out[1]
  end
  return out, mixed
end

-- fully_shard(reshard_after_forward=k) with an int k (the unit's, else the
-- plan's), as FSDP2's _get_post_forward_mesh_info reads it (torch 2.15
-- _fsdp_init.py:152-195) over the unit's shard group of S ranks
-- (mesh_info.shard_mesh_size: dp_shard x cp, efsdp for experts): k must be
-- a factor of S (:165-173); k = 1 is reshard_after_forward=False (FSDP2
-- warns, :174-180) and k = S is True (:181-182), planned as those. Any
-- other k reshards after forward to the unit's post-forward group (the
-- flattened mesh's rows of k ranks, :186-194: k consecutive ranks of each
-- shard group): each rank keeps numel/k of every parameter's padded
-- all-gather output (_fsdp_param.py:970-1010) and backward all-gathers that
-- over the k ranks (_fsdp_param_group.py:1215-1226, _fsdp_param.py:1148-1154).
-- Returns the bool to plan and, for 1 < k < S, k; refuses the rest in one line.
function layout.post_forward(ctx, raf, S, path, u, tp)
  if type(raf) ~= "number" then return raf end
  if raf < 1 or raf > S or S % raf ~= 0 then
    util.field_error(ctx, path, string.format("%d is not a factor of the unit's shard group size %d, which FSDP2 "
      .. "refuses (torch 2.15 _fsdp_init.py:165-173, 'it should be a factor of %d'): use a divisor of %d, or true / "
      .. "false", raf, S, S, S))
  end
  if raf == 1 then return false end
  if raf == S then return true end
  if tp > 1 then
    util.field_error(ctx, path, string.format("%d with tp = %d: the unit's parameters are TP DTensors, and FSDP2 "
      .. "raises 'Resharding to smaller mesh is not supported for DTensor parameters yet' (torch 2.15 "
      .. "_fsdp_param.py:970-974): use true or false", raf, tp))
  end
  for _, p in ipairs(u.params) do
    if p.shard_dim > 0 then
      util.field_error(ctx, path, string.format("%d with %s on shard_dim %d: FSDP2's backward copy-out indexes the "
        .. "1-D post-forward shard's size at that dim (torch 2.15 _fsdp_collectives.py:573, IndexError, measured on "
        .. "gloo): use "
        .. "shard_dim = 0 or reshard_after_forward true / false", raf, p.name, p.shard_dim))
    end
  end
  return true, raf
end

-- The family of a post-forward group of k ranks (gen/parallel/fsdp.lua families).
function layout.pf_family(k) return "fsdp_pf" .. k end

-- The plan-wide fsdp.reshard_after_forward as planned (plan.json): an int
-- survives layout.post_forward only as 1 (False) or a shard group's size (True).
function layout.raf_bool(raf)
  if math.type(raf) == "integer" then return raf ~= 1 end
  return raf
end

local LIM = util.LIMITS

-- Bounds before the arithmetic that depends on them: units x micro-steps
-- (the generator's memory, linear in it), and per unit the slot (the copy
-- kernels number its tiles in int) and every buffer's bytes (exact in a
-- double and in int64, with room for the arena's sum over all units).
-- The micro-steps a step's tables plan: every one below 6, else 5 when
-- the repeated ones fold (gen/parallel/fsdp_schedule.lua; if they do not,
-- it checks the whole count before planning them all).
function layout.planned_micro_steps(micro_steps) return micro_steps >= 6 and 5 or micro_steps end

function layout.check_unit_steps(ctx, n_units, micro_steps, planned)
  local field = micro_steps > 1 and "fsdp.micro_steps" or "model.units"
  if not util.mul_within(n_units, micro_steps, LIM.unit_steps) then
    util.field_error(ctx, field, string.format("%d units x %d micro-steps is more than %s unit-steps, the most "
      .. "the generator takes; use fewer micro-steps or wrap more layers per unit", n_units, micro_steps,
      util.pow2_text(LIM.unit_steps)))
  end
  if not util.mul_within(n_units, planned, LIM.planned_unit_steps) then
    util.field_error(ctx, field, string.format("%d units x %d micro-steps planned is more than %s unit-steps, the "
      .. "most the generator plans (~%d KB each, ~%.1f GiB in all); use fewer micro-steps or wrap more layers per "
      .. "unit", n_units, planned, util.pow2_text(LIM.planned_unit_steps), LIM.unit_step_kib,
      LIM.planned_unit_steps * LIM.unit_step_kib / (1024 * 1024)))
  end
end

local function check_counts(ctx, units, fsdp)
  layout.check_unit_steps(ctx, #units, fsdp.micro_steps, layout.planned_micro_steps(fsdp.micro_steps))
end

-- Upper bound of one rank's arena (every buffer at once, aligned); nil
-- when any term passes LIM.bytes.
local function arena_bound(u, W, running)
  local es_ag, es_red = layout.DTYPE_BYTES[u.ag_dtype], layout.DTYPE_BYTES[u.reduce_dtype]
  local full = util.mul_within(W, u.total, LIM.bytes)
  local ag_full = u.ag_bytes and util.mul_within(W, u.ag_bytes, LIM.bytes)
  local terms = {
    u.ag_bytes and ag_full and util.add_within(ag_full, u.unsharded_bytes, LIM.bytes)
      or not u.ag_bytes and full and util.mul_within(full, 2 * es_ag, LIM.bytes),
    full and util.mul_within(full, es_red, LIM.bytes),
    util.mul_within(u.grads_numel, layout.DTYPE_BYTES[u.grad_dtype], LIM.bytes),
    util.mul_within(u.rs_total, es_red, LIM.bytes),
    util.mul_within(u.partial and u.rs_total or 0, es_red, LIM.bytes), -- all_reduce_last's partial sums
    7 * 256,
  }
  for i = 1, 6 do
    running = terms[i] and running and util.add_within(running, terms[i], LIM.bytes)
  end
  return running
end

-- units (wrap order, root last) -> layout units in forward order (root first).
function layout.build(ctx, units, d, fsdp)
  check_counts(ctx, units, fsdp)
  local W, R = d.dp_shard * d.cp, d.dp_replicate -- (FSDP shards over dp_shard x cp: gen/parallel/cp.lua)
  local arena = 0
  local out = {}
  local order = { #units }
  for i = 1, #units - 1 do order[#order + 1] = i end
  for fwd, ui in ipairs(order) do
    local u = units[ui]
    local upath = string.format("model.units[%d]", ui)
    -- A unit without parameters (torchtitan's root) has no FSDP param group:
    -- an empty slot, and the schedule issues nothing for it.
    local orig = u.params[1] and u.params[1].dtype
    if not orig then -- the model's dtype: another unit's (they agree per unit, not across, but any is honest)
      for _, v in ipairs(units) do orig = orig or (v.params[1] and v.params[1].dtype) end
    end
    orig = orig or "fp32"
    for j, p in ipairs(u.params) do
      if p.dtype ~= orig then
        util.field_error(ctx, string.format("%s.params[%d].dtype", upath, j), string.format(
          "unit %q mixes parameter dtypes (%s is %s, %s is %s), which FSDP2 refuses for trainable parameters "
          .. "(torch 2.15 _fsdp_param_group.py:344-348, 'FSDP expects uniform original parameter dtype'): set the "
          .. "same dtype, and keep a parameter in its dtype for the all-gather with its param_dtype instead",
          u.name, u.params[1].name, orig, p.name, p.dtype))
      end
    end
    -- MixedPrecisionPolicy: the unit's own (fully_shard(mp_policy=...)) or the plan's.
    -- torch 2.15: without reduce_dtype gradients reduce in the parameters'
    -- grad dtype, their original dtype (before 2.15: in param_dtype).
    local ag_dtype = u.param_dtype or fsdp.param_dtype or orig
    local reduce_dtype = u.reduce_dtype or fsdp.reduce_dtype or orig
    local ag, mixed = layout.param_ag_dtypes(ctx, u, upath, ag_dtype)
    -- every parameter kept in its own (the unit's original) dtype: the unit
    -- gathers and computes in it, as without a param_dtype
    if not mixed and ag[1] then ag_dtype = ag[1] end
    -- The unsharded grads' dtype (torch 2.15: the unsharded parameter's
    -- grad_dtype is reduce_dtype, so autograd casts each backward's gradient,
    -- computed in ag_dtype, to it and accumulates in it). A reduce_dtype
    -- wider than ag_dtype is exact on the cast, and FSDP2 leaves a gradient
    -- that is reduced by the backward that made it in ag_dtype
    -- (FSDPParamGroup._set_unsharded_grad_dtypes): ag_dtype unless
    -- micro-steps accumulate (sync_last).
    local mode = layout.unit_accumulation(u, fsdp)
    local accumulating = fsdp.micro_steps > 1 and (mode == "sync_last" or mode == "step_end")
    local wider = layout.DTYPE_BYTES[reduce_dtype] > layout.DTYPE_BYTES[ag_dtype]
    local grad_dtype = (wider and not accumulating) and ag_dtype or reduce_dtype
    -- A mixed unit's gradients are computed in each parameter's own dtype;
    -- reduce_dtype holds every one of them exactly as its packing reads it
    -- (FSDP2 casts each to reduce_dtype there: foreach_reduce_scatter_copy_in).
    if mixed then grad_dtype = reduce_dtype end
    -- Expert parallelism's experts group (gen/parallel/ep.lua): sharded
    -- over efsdp, its own FSDP mesh; every other unit over dp_shard.
    local Wu = u.expert and d.efsdp or W
    local params, offset, grad_offset, vec_ok, ag_bytes, unsharded_bytes = {}, 0, 0, true, 0, 0
    -- requires_grad=False parameters (p.frozen): FSDP2 all-gathers them with
    -- the rest (their slots stay), but takes no gradient of them
    -- (_get_unsharded_grad_to_reduce, torch 2.15 _fsdp_param_group.py:989-1001),
    -- so the reduce-scatter packs the trainable ones' padded shards alone, back
    -- to back (foreach_reduce_scatter_copy_in's chunk_cat over the gradients,
    -- _fsdp_collectives.py:905-918): rs_offset in that row, rs_total its
    -- length; the sharded grads take the same layout (a frozen parameter has
    -- none), and no unsharded grad is kept for a frozen one.
    local rs_total, nfrozen = 0, 0
    for j, p in ipairs(u.params) do
      local q = layout.param(ctx, p, Wu, string.format("%s.params[%d]", upath, j), u.expert and "efsdp" or nil)
      if p.ep_chunk then q.ep_chunk, q.ep_full = p.ep_chunk, p.full_shape[1] end
      q.offset = offset
      q.index_in_unit = j - 1
      -- Unsharded grads are compact per parameter, each start rounded up to
      -- 8 elements so the packing kernel's 16-byte loads stay aligned.
      q.grad_offset = grad_offset
      q.rs_offset = rs_total
      if p.frozen then
        q.frozen, nfrozen = true, nfrozen + 1
      else
        grad_offset = grad_offset + util.ceil_div(q.numel, layout.GRAD_ALIGN) * layout.GRAD_ALIGN
        rs_total = rs_total + q.padded
      end
      vec_ok = vec_ok and q.offset % layout.VEC == 0 and q.run % layout.VEC == 0
      -- The all-gather slot in bytes: each parameter's padded shard in its
      -- own all-gather dtype, back to back (FSDP2's uint8 all-gather input).
      q.ag_dtype, q.ag_offset = ag[j], ag_bytes
      ag_bytes = ag_bytes + q.padded * layout.DTYPE_BYTES[ag[j]]
      -- The unsharded parameters (commplan's one buffer; FSDP2 allocates
      -- each apart): a mixed unit's start at 16-byte multiples, so an fp32
      -- one after an odd number of bf16 elements is still aligned.
      q.unsharded_offset = unsharded_bytes
      unsharded_bytes = unsharded_bytes + util.ceil_div(Wu * q.padded * layout.DTYPE_BYTES[ag[j]], 16) * 16
      offset = util.add_within(offset, q.padded, LIM.unit_slot)
      if not offset then
        util.field_error(ctx, string.format("%s.params[%d]", upath, j), string.format(
          "unit %q holds more than %s elements per rank (its slot; the copy kernels number its tiles in int): "
          .. "split the unit or raise dp_shard", u.name, util.pow2_text(LIM.unit_slot)))
      end
      params[j] = q
    end
    -- the unit's divide factor and forced sum (its own, else the plan's; reduce_op "sum" is factor 1)
    local factor = u.gradient_divide_factor or fsdp.gradient_divide_factor
      or (fsdp.reduce_op == "sum" and 1 or nil)
    local force = u.force_sum_reduction_for_comms
    if force == nil then force = fsdp.force_sum_reduction_for_comms end
    -- torchtitan's enable_fsdp_symm_mem forces sum reductions on every unit (distributed/fsdp.py:50)
    if force == nil then force = fsdp.symm_mem or false end
    local red, why = layout.reduction(factor, force, reduce_dtype, Wu, R)
    if not red then
      util.field_error(ctx, u.gradient_divide_factor and (upath .. ".gradient_divide_factor")
        or "fsdp.gradient_divide_factor", why)
    end
    -- fully_shard(reshard_after_forward=k): the root never reshards after forward
    local raf, pf_k = false, nil
    if ui ~= #units then
      local given = u.reshard_after_forward
      if given == nil then given = fsdp.reshard_after_forward end
      -- torchtitan's "always" policy reshards [norm, lm_head] too (distributed/fsdp.py:183-204)
      if fsdp.reshard_after_forward_policy == "always" then given = true end
      raf, pf_k = layout.post_forward(ctx, given, Wu, u.reshard_after_forward == nil and "fsdp.reshard_after_forward"
        or (upath .. ".reshard_after_forward"), u, d.tp or 1)
    end
    out[fwd] = {
      name = u.name, index = fwd - 1, is_root = (ui == #units), params = params, total = offset,
      grads_numel = grad_offset, vec_ok = vec_ok and offset % layout.VEC == 0 and not mixed,
      -- mixed all-gather dtypes (per-parameter param_dtype): FSDP2 all-gathers
      -- the slot as raw bytes (uint8), ag_bytes per rank; nil otherwise
      ag_bytes = mixed and ag_bytes or nil, unsharded_bytes = mixed and unsharded_bytes or nil,
      -- frozen parameters (requires_grad=False): how many, and the reduce-scatter row's
      -- elements per rank (the trainable parameters' padded shards; total without frozen ones)
      nfrozen = nfrozen > 0 and nfrozen or nil, rs_total = rs_total,
      orig_dtype = orig, ag_dtype = ag_dtype, reduce_dtype = reduce_dtype, grad_dtype = grad_dtype,
      -- The root never reshards after forward (FSDP2); a unit may override the plan's default
      -- (a family's [norm, lm_head] does: torchtitan's "default" policy keeps it), except under
      -- torchtitan's "always" policy, which reshards every unit (distributed/fsdp.py:183-204; gen/load.lua
      -- refuses a unit's own setting beside "always" or "never"). An int: layout.post_forward, above.
      reshard_after_forward = raf,
      -- set_reshard_after_backward(False) on every micro-step but the last (gen/load.lua): kept
      -- unsharded from a backward into the next micro-step's forward (fsdp_schedule.lua)
      reshard_after_backward = u.reshard_after_backward == nil and fsdp.reshard_after_backward ~= false
                                 or u.reshard_after_backward == true,
      rs_op = red.rs_op, ar_op = red.ar_op, pre_divide = red.pre_divide, post_divide = red.post_divide,
      premul = red.premul,
      -- as set (plan.json, the live peer): nil where the plan left FSDP2's default
      gradient_divide_factor = u.gradient_divide_factor or fsdp.gradient_divide_factor,
      force_sum_reduction_for_comms = force or nil,
      -- fsdp.symm_mem (torchtitan's enable_fsdp_symm_mem, distributed/fsdp.py:44-51 and 312-313):
      -- set_symm_mem_for_comm puts the all-gather output in symmetric memory, and the reduce-scatter's
      -- input and output where the unit forces sum reductions (torch 2.15 _fsdp_param_group.py:402-422);
      -- only over a group of two ranks or more (a communicator to register the window with)
      symm = fsdp.symm_mem and #params > 0 and Wu > 1 and { ag = true, rs = force or nil } or nil,
      -- all_reduce_last under HSDP: the reduce-scatter outputs wait in a
      -- buffer of their own (partial_reduce_output) for the last micro-step.
      partial = rs_total > 0 and R > 1 and fsdp.micro_steps > 1 and mode == "all_reduce_last" or nil,
      -- the unit's own accumulation where it sets one (the schedule's and proofs' per-unit flags)
      grad_accumulation = u.grad_accumulation,
      -- fully_shard's ignored_params: outside the slot, whole on every rank (audit, memory)
      ignored = ignored_of(u, d.tp or 1),
    }
    -- 1 < k < S: after forward each rank keeps S / k of every parameter's
    -- padded shards (its slice of the all-gather output at its place in its
    -- post-forward group), `count` elements of the all-gather dtype (bytes of
    -- a mixed unit's), which backward all-gathers over that group (the
    -- schedule's post_forward op and all-gather: fsdp_schedule.gather)
    if pf_k and #params > 0 then
      local scale = Wu // pf_k
      out[fwd].post_forward = { k = pf_k, group = layout.pf_family(pf_k), scale = scale,
                                count = (out[fwd].ag_bytes or offset) * scale }
    end
    layout.unshard_in_backward(ctx, out[fwd], u, upath)
    if u.expert then
      local o = out[fwd]
      o.expert, o.W, o.shard_group, o.num_experts = true, Wu, "efsdp", u.num_experts
    end
    -- an FSDP state with several parameter groups (ep's MoE blocks): its name
    if u.state then out[fwd].state = u.state end
    -- a multi-token prediction block (gen/models/deepseek_v3.lua): its depth (EP's prefetch lists place it)
    if u.mtp_depth then out[fwd].mtp_depth = u.mtp_depth end
    -- the decoder's [norm, lm_head] unit (gen/models: llama, moe), whose
    -- lm_head torchtitan's ChunkedLossWrapper runs (fsdp_schedule.lua)
    if u.loss_head then out[fwd].loss_head = true end
    -- CPUOffloadPolicy (the unit's fully_shard offload_policy, else the
    -- plan's): its sharded parameters and gradients live in host memory
    -- (pinned unless pin_memory = false, torch 2.15 _fsdp_param.py:362-365),
    -- so every all-gather starts with their H2D copy and every reduction
    -- ends with the gradient's D2H copy (fsdp_schedule.gather / reduction)
    local offload = u.cpu_offload
    if offload == nil then offload = fsdp.cpu_offload end
    if offload and #params > 0 then
      local pin = u.pin_memory
      if pin == nil then pin = fsdp.pin_memory end
      out[fwd].offload, out[fwd].pin_memory = true, pin ~= false
    end
    arena = arena_bound(out[fwd], Wu, arena)
    if not arena then
      util.field_error(ctx, upath, string.format("one rank's buffers reach more than %s bytes by unit %q "
        .. "(all-gather buffer: %d ranks x %d elements); shrink the model or the shard group",
        util.pow2_text(LIM.bytes), u.name, W, offset))
    end
  end
  return { units = out, W = W, R = R, explicit_prefetch = layout.prefetch(ctx, units, out, fsdp, d) or nil,
           calls = layout.calls(units, out) }
end

-- The model's forward-call order (a model whose forward calls a unit more
-- than once: gen/models/deepseek_v3.lua calls, on its root, the module
-- whose forward runs them) with unit names resolved to layout indices:
-- { forward = { { ev, unit } }, backward = { { ev, unit, grads } } }
-- (gen/parallel/fsdp_schedule.lua calls_micro); nil for every other model.
function layout.calls(units, out)
  local given
  for _, u in ipairs(units) do given = given or u.calls end
  if not given then return nil end
  local at = {}
  for _, u in ipairs(out) do at[u.name] = u.index end
  local res = {}
  for _, phase in ipairs({ "forward", "backward" }) do
    res[phase] = {}
    for i, e in ipairs(given[phase]) do
      assert(e.unit == nil or at[e.unit], "internal: a call of an unknown unit")
      res[phase][i] = { ev = e.ev, unit = e.unit and at[e.unit], grads = e.grads, part = e.part, writes = e.writes }
    end
  end
  return res
end

-- The frozen prefix (issue 41): which units run no pre-backward and which
-- run their post-backward from the root's final callback, from the units
-- alone (layout units: the root first, then forward order) and whether the
-- model's input carries a gradient (input_grad: token ids never do; the
-- generic family's model.input_requires_grad, true unless set false).
-- Assumed: the units run in list order, each consuming the one before's
-- output (a sequential decoder; the loss head last), and the root's own
-- parameters act on the input before the first unit (as a root's taps in
-- tests/live/record.py: a trainable one makes every unit's input need a
-- gradient). FSDP2 hooks a unit's pre-backward on its forward outputs that
-- require grad (torch 2.15 _fsdp_state.py:581-599) and its post-backward on
-- its inputs that do (_fsdp_param_group.py:1157-1173), so while no
-- parameter so far is trainable nothing flowing requires grad: each of the
-- leading all-frozen units (u.no_pre_backward) gets neither (no backward
-- all-gather of its own, no backward compute, no prefetch from it), and
-- they and the first unit with a trainable parameter (whose input needs no
-- gradient either) run post_backward from _root_post_backward_final_callback
-- (_fsdp_state.py:422-452: states in the root's pre-order, i.e. the root,
-- then the units in forward order; u.final_callback). The next unit's
-- pre-backward still prefetches the last of them (_fsdp_param_group.py:
-- 1061-1096: post_forward_order[i - 1]); that all-gather is never waited
-- on, and finalize_backward drops it (:890-906). Pure: returns the count.
function layout.frozen_prefix(units, input_grad)
  local root = units[1] and units[1].is_root and units[1] or nil
  local function trainable(u) return #u.params > (u.nfrozen or 0) end
  if input_grad or (root and trainable(root)) then return 0 end
  local run = {} -- the leading units up to the first with a trainable parameter
  for _, u in ipairs(units) do
    if u ~= root and #u.params > 0 then
      run[#run + 1] = u
      if trainable(u) then break end
    end
  end
  local n = run[1] and trainable(run[#run]) and #run - 1 or #run
  -- (none all-frozen: the first unit's post-backward, from the final
  -- callback too, is the step's last either way, as planned)
  if n == 0 then return 0 end
  for _, u in ipairs(run) do
    u.final_callback, u.no_pre_backward = true, not trainable(u) or nil
  end
  return n
end

-- FSDPModule.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch
-- (torch 2.15 _fully_shard.py; _fsdp_state.py:346-350 issues the forward
-- list's all-gathers after the unit's own copy-out, in list order;
-- :411-418 the backward list's, replacing the default one-unit prefetch of
-- _fsdp_param_group.py:1061-1096): each layout unit's lists as layout
-- indices (fwd_prefetch, bwd_prefetch; nil: none given). true when any unit
-- gives one (the schedule then follows fsdp_schedule.explicit_micro).
function layout.prefetch(ctx, units, out, fsdp, d)
  local by_name, any = {}, false
  for _, o in ipairs(out) do by_name[o.name] = o end
  -- ChunkedLossWrapper's head anywhere in the model: its order (the header of
  -- fsdp_schedule.lua) is planned with the default prefetching only
  local head_unit
  for _, u in ipairs(units) do head_unit = head_unit or (u.loss_head and u.name) end
  for ui, u in ipairs(units) do
    for _, key in ipairs({ "forward_prefetch", "backward_prefetch" }) do
      local list = u[key]
      if list then
        local path = string.format("model.units[%d].%s", ui, key)
        local why = (fsdp.grad_accumulation == "step_end" and "grad_accumulation = \"step_end\" (a pipeline "
          .. "stage's accumulation, which commplan plans with FSDP2's default prefetching)")
          or ((d.pp or 1) > 1 and "parallel.pp > 1 (the pipeline's tables order each stage's all-gathers)")
          or (head_unit and string.format("the loss_head unit %q (ChunkedLossWrapper's order is planned with "
            .. "the default prefetching; drop loss_head for CrossEntropyLoss's order)", head_unit))
        if why then util.field_error(ctx, path, "explicit prefetching with " .. why .. ": remove " .. key) end
        if #u.params == 0 then
          util.field_error(ctx, path, string.format("unit %q owns no parameters, so FSDP2 has no parameter "
            .. "group to hook the prefetch on here: give the list to the unit that runs first instead", u.name))
        end
        if #list == 0 then
          util.field_error(ctx, path, "an empty list changes nothing (FSDP2 keeps its default prefetching): remove it")
        end
        local idx, seen = {}, {}
        for j, name in ipairs(list) do
          local t = type(name) == "string" and by_name[name]
          local at = string.format("%s[%d]", path, j)
          if not t then
            util.field_error(ctx, at, string.format("%s is not a unit of this model: name the units whose "
              .. "all-gathers %q issues (set_modules_to_%s takes FSDP modules)", util.show(name), u.name, key))
          end
          if name == u.name or seen[name] or #t.params == 0 then
            util.field_error(ctx, at, string.format("%q %s, so its prefetch issues nothing: remove it", name,
              name == u.name and "is the unit itself (its own all-gather comes first)"
              or seen[name] and "is named twice" or "owns no parameters"))
          end
          seen[name] = true
          idx[#idx + 1] = t.index
        end
        by_name[u.name][key == "forward_prefetch" and "fwd_prefetch" or "bwd_prefetch"] = idx
        any = true
      end
    end
  end
  return any
end

return layout
