-- Stage 6: proofs over the plan; any failure means no output is written.
--  * coverage: every element of every parameter is rebuilt exactly once by
--    copy-out and owned by exactly one shard rank after reduce-scatter;
--  * bounds: every slot range lies inside its unit's fused buffer;
--  * schedule: a state machine per unit shows every compute sees unsharded
--    parameters, every collective's input is ready, every unit is reduced
--    exactly once per step and ends resharded;
--  * order: every communicator's members issue the same op sequence;
--  * bounds: every number the C tables hold fits its C field.
-- gen/plan.lua runs bounds and order for every class; coverage and schedule
-- are FSDP's proofs (gen/parallel/fsdp.lua's prove_class).
local layout = require("gen.parallel.fsdp_layout")
local rep_mod = require("gen.repeat")

local verify = {}

local ES = require("gen.util").DTYPE_BYTES
local TP_KIND = {} -- kind -> true for TP's activation collectives
local A2A_KIND = {} -- kind -> true for expert parallelism's all-to-alls
local P2P_KIND = {} -- kind -> true for pipeline parallelism's sends and receives
for _, d in ipairs(require("gen.opkinds").LIST) do
  TP_KIND[d.name], A2A_KIND[d.name], P2P_KIND[d.name] = d.tp or nil, d.a2a or nil, d.p2p or nil
end

local function check(cond, fmt, ...)
  if not cond then error("internal error (plan verification failed): " .. string.format(fmt, ...), 0) end
end

function verify.coverage(lay)
  for _, u in ipairs(lay.units) do
    local W = u.W or lay.W -- (expert parallelism's experts: their efsdp group)
    local expect = 0
    for _, p in ipairs(u.params) do
      check(p.offset == expect, "%s: offset %d, expected %d", p.name, p.offset, expect)
      check(p.offset + p.padded <= u.total, "%s: slot range out of bounds", p.name)
      -- Ranks own disjoint runs [r*run, (r+1)*run) of each outer row; the
      -- union over ranks is [0, W*run) >= the row length, so every element
      -- has exactly one owner, and padding only trails (Shard(0)).
      check(W * p.run * p.outer >= p.numel, "%s: W*padded < numel", p.name)
      -- (An empty TP-local tensor has run 0: no rank owns anything.)
      local full = p.shard_dim > 0 and W or (p.run > 0 and p.numel // p.run or 0)
      local partial = (p.shard_dim > 0 or p.run == 0) and 0 or p.numel % p.run
      local sum = full * p.run + partial
      check(p.shard_dim > 0 or sum == p.numel, "%s: shards cover %d of %d elements", p.name, sum, p.numel)
      check(p.shard_dim == 0 or p.outer * W * p.run == p.numel, "%s: Shard(%d) not exact", p.name, p.shard_dim)
      check(layout.valid(p, 0) <= p.padded and layout.valid(p, W - 1) >= 0, "%s: valid range", p.name)
      expect = expect + p.padded
    end
    check(expect == u.total, "%s: total %d != %d", u.name, u.total, expect)
    -- the reduce-scatter row: the trainable parameters' padded shards back to back
    local rs = 0
    for _, p in ipairs(u.params) do
      check(p.rs_offset == rs, "%s: rs_offset %d, expected %d", p.name, p.rs_offset, rs)
      if not p.frozen then rs = rs + p.padded end
    end
    check(rs == u.rs_total, "%s: rs_total %d != %d", u.name, u.rs_total, rs)
  end
end

-- Every unit's grads are reduced as the accumulation mode says: FSDP2's
-- default packs after each backward, sync_last after all micro-steps'
-- backwards; each reduction's collectives come after its packing, and its
-- view-out closes it, assigning the sharded grads on the step's first
-- reduction (view_out) and adding into them on later ones (view_out_add).
-- all_reduce_last's reductions before the last micro-step end in the
-- partial sums instead (partial_save, then partial_add, each after its
-- reduce-scatter), which the last one folds in before its all-reduce: no
-- reduce-scatter output is lost or counted twice.
-- Per parameter: a backward, pack, collective or view-out of a part
-- (op.part_first, part_count: ChunkedLossWrapper's [norm, lm_head] unit,
-- gen/parallel/fsdp_schedule.lua) makes and reduces only its parameters'
-- gradients, so every parameter is reduced as above on its own, whatever
-- parts its unit's reductions cut it into; such a unit (u.chunked_loss)
-- reduces on every micro-step (the wrapper syncs its last chunk).
-- CPU offload (u.offload): each unshard starts with the shards' H2D copy
-- (h2d, then the copy-in from it; never a zero copy-in from host memory),
-- and each reduction's view-out fills the device copy that its D2H then
-- assigns (d2h, the step's first) or adds (d2h_add) into the host's sharded
-- grads; a unit that does not offload issues neither.
-- reshard_after_forward = k (u.post_forward): every forward reshard of the
-- unit is preceded by its post_forward copy, and the unit's next unshard is
-- the all-gather over its post-forward group from that slice (then its
-- copy-out by the post-forward geometry); nothing else gathers it meanwhile.
-- rep: a repeated micro-step (gen/repeat.lua), walked as the executor runs it.
function verify.schedule(lay, ops, fsdp, rep)
  local micro_steps = fsdp.micro_steps
  local deferred = fsdp.grad_accumulation == "sync_last" or fsdp.grad_accumulation == "step_end"
  local state, par = {}, {}
  for _, u in ipairs(lay.units) do
    state[u.index] = "sharded"
    par[u.index] = {}
    for j = 1, #u.params do
      -- grads: backwards since the last pack; open: a reduction packed, not closed; scattered: its RS done;
      -- held: partial sums held; parked: reductions parked in them; outs: view-outs this step
      par[u.index][j] = { grads = 0, reduced = 0, open = false, scattered = false, held = 0, parked = 0, outs = 0 }
    end
  end
  local name = function(i) return lay.units[i + 1].name end
  -- the op's parameters (1-based, in the unit's order)
  local function range(o)
    local u = lay.units[o.unit + 1]
    if not o.part_first then return 1, #u.params end
    local lo, hi = o.part_first + 1, o.part_first + o.part_count
    check(o.part_count >= 1 and lo >= 1 and hi <= #u.params, "op %d: part %d+%d of %s's %d parameters", o.seq,
      o.part_first, o.part_count, u.name, #u.params)
    return lo, hi
  end
  -- the op's parameters with a gradient: a frozen one (requires_grad=False)
  -- gets none, so no backward, pack or reduction touches it
  local function trainable(u, lo, hi)
    local ps, j = lay.units[u + 1].params, lo - 1
    return function()
      repeat j = j + 1 until j > hi or not ps[j].frozen
      if j <= hi then return j end
    end
  end
  local function per_pack(u)
    local own = lay.units[u + 1].grad_accumulation -- a unit's own (gen/parallel/fsdp_layout.lua)
    local d = deferred
    if own then d = own == "sync_last" end
    return (d and not lay.units[u + 1].chunked_loss) and micro_steps or 1
  end
  rep_mod.each(ops, rep, function(o)
    local u, s = o.unit, state[o.unit]
    local k = o.kind
    local ps = par[u]
    local off = lay.units[u + 1].offload
    if k == "h2d" then
      check(off, "h2d of %s, which does not offload", name(u))
      check(s == "sharded", "h2d of %s while %s", name(u), s); state[u] = "staged"
    elseif k == "copy_in" then
      local want = off and "staged" or "sharded"
      check(s == want, "copy_in of %s while %s", name(u), s); state[u] = "copied_in"
    elseif k == "all_gather" then
      check(not (off and o.from_sharded), "all_gather of %s reads its host shards", name(u))
      -- zero copy-in reads the shards themselves; the post-forward group's, the kept slice
      local want = o.post_forward and "post_forward" or o.from_sharded and "sharded" or "copied_in"
      check(s == want, "all_gather of %s while %s", name(u), s)
      state[u] = o.post_forward and "pf_gathered" or "gathered"
    elseif k == "copy_out" then
      -- (a post-forward all-gather's output is copied out by its geometry: op.post_forward on both)
      check(s == (o.post_forward and "pf_gathered" or "gathered"), "copy_out of %s while %s", name(u), s)
      state[u] = "unsharded"
    elseif k == "post_forward" then
      -- reshard_after_forward = k: the slice kept, then the forward's reshard
      check(lay.units[u + 1].post_forward and s == "unsharded" and o.phase == "forward",
        "post_forward of %s while %s", name(u), s)
      state[u] = "pf_copied"
    elseif k == "forward" then check(s == "unsharded", "forward of %s on %s params", name(u), s); range(o)
    elseif k == "backward" then
      -- (set_unshard_in_backward(False): on the sharded parameters, none gathered)
      check(s == (o.sharded and "sharded" or "unsharded"), "backward of %s on %s params", name(u), s)
      local lo, hi = range(o)
      for j in trainable(u, lo, hi) do ps[j].grads = ps[j].grads + 1 end
    elseif k == "backward_input" then
      -- (zero bubble's input gradient: the weight gradient is its W, a backward)
      check(s == "unsharded", "backward_input of %s on %s params", name(u), s)
    elseif P2P_KIND[k] then -- luacheck: ignore 542 (a stage's activation: no parameter state)
    elseif k == "reshard" then
      -- a unit with a post-forward group keeps its slice through every forward reshard
      local pf = lay.units[u + 1].post_forward and o.phase == "forward"
      check(s == (pf and "pf_copied" or "unsharded"), "reshard of %s while %s", name(u), s)
      state[u] = pf and "post_forward" or "sharded"
    elseif k == "pack" then
      local lo, hi = range(o)
      for j in trainable(u, lo, hi) do
        local q = ps[j]
        check(q.grads == per_pack(u), "%s (parameter %d) packed after %d backward passes, not %d", name(u), j,
          q.grads, per_pack(u))
        check(not q.open, "%s (parameter %d) packed again before its view-out", name(u), j)
        q.reduced = q.reduced + 1; q.grads = 0; q.open = true; q.scattered = false
      end
    elseif k == "reduce_scatter" or k == "all_reduce" then
      local lo, hi = range(o)
      for j in trainable(u, lo, hi) do
        local q = ps[j]
        check(q.open, "%s of %s (parameter %d) before its pack", k, name(u), j)
        check(k == "reduce_scatter" or q.held == 0, "all_reduce of %s with %d partial sums not folded in", name(u),
          q.held)
        if k == "reduce_scatter" then q.scattered = true end
      end
    elseif k == "partial_save" or k == "partial_add" or k == "partial_fold" then
      local lo, hi = range(o)
      for j in trainable(u, lo, hi) do
        local q = ps[j]
        check(q.open and q.scattered, "%s of %s before its reduce-scatter", k, name(u))
        check((k == "partial_save") == (q.held == 0), "%s of %s holding %d partial sums", k, name(u), q.held)
        if k == "partial_fold" then q.held = 0
        else q.held = q.held + 1; q.parked = q.parked + 1; q.open = false end
      end
    elseif k == "view_out" or k == "view_out_add" then
      local lo, hi = range(o)
      for j in trainable(u, lo, hi) do
        local q = ps[j]
        check(q.open, "%s of %s (parameter %d) before its pack", k, name(u), j)
        check(q.held == 0, "%s of %s with %d partial sums not folded in", k, name(u), q.held)
        check(not (off and k == "view_out_add"), "view_out_add of %s, which offloads", name(u))
        if off then
          q.open = false; q.staged = true
        else
          check((k == "view_out") == (q.outs == 0), "%s of %s (parameter %d) after %d view-outs this step", k,
            name(u), j, q.outs)
          q.open = false; q.outs = q.outs + 1
        end
      end
    elseif k == "d2h" or k == "d2h_add" then
      check(off, "%s of %s, which does not offload", k, name(u))
      local lo, hi = range(o)
      for j in trainable(u, lo, hi) do
        local q = ps[j]
        check(q.staged, "%s of %s (parameter %d) before its view-out", k, name(u), j)
        check((k == "d2h") == (q.outs == 0), "%s of %s (parameter %d) after %d copies this step", k, name(u), j,
          q.outs)
        q.staged = false; q.outs = q.outs + 1
      end
    elseif TP_KIND[k] or A2A_KIND[k] then check(s == "unsharded", "%s of %s on %s params", k, name(u), s)
    else check(false, "unknown op kind %s", tostring(k)) end
    -- a collective's count is its part's (verify.order checks the sizes)
    if o.part_first and not (k == "forward" or k == "backward" or k == "pack" or k == "reduce_scatter"
      or k == "all_reduce" or k == "view_out" or k == "view_out_add" or k == "d2h" or k == "d2h_add") then
      check(false, "op %d: %s of a part of %s", o.seq, k, name(u))
    end
  end)
  for _, uu in ipairs(lay.units) do
    check(state[uu.index] == "sharded", "%s ends the step %s", uu.name, state[uu.index])
    local want = micro_steps // per_pack(uu.index)
    for j, q in ipairs(par[uu.index]) do
      local w = uu.params[j].frozen and 0 or want -- (a frozen parameter: never reduced)
      check(q.reduced == w, "%s (parameter %d) reduced %d times, not %d", uu.name, j, q.reduced, w)
      check(q.grads == 0 and not q.open and not q.staged and q.held == 0 and q.outs + q.parked == q.reduced,
        "%s ends the step with unreduced grads", uu.name)
    end
  end
end

-- Ops are rank-generic (the same list on every rank, counts from the unit
-- table), so members of a group issue identical sequences by construction;
-- this checks what that relies on: every collective names a known family,
-- its count is the unit's slot size, and the dtype matches the unit's.
function verify.order(lay, fams, ops)
  for _, o in ipairs(ops) do
    if o.group then
      local f = fams.by_name[o.group]
      check(f ~= nil, "op %d names unknown group %s", o.seq, o.group)
      local u = lay.units[o.unit + 1]
      if A2A_KIND[o.kind] then
        -- expert parallelism's all-to-alls: on the ep group, inside the unit's token buffers
        check(o.group == "ep" and o.dtype == u.ag_dtype and u.a2a_numel, "op %d: %s on %s in %s", o.seq, o.kind,
          o.group, o.dtype)
        check(o.a2a_experts * f.size == u.a2a_experts, "op %d: %d experts per member x %d != %d", o.seq,
          o.a2a_experts, f.size, u.a2a_experts)
        check(o.kind == "a2a_counts" and o.count == o.a2a_experts
          or o.kind == "a2a" and o.count == o.a2a_capacity * o.a2a_dim and o.count * f.size <= u.a2a_numel
          and o.a2a_counts_op and o.a2a_counts_op < o.seq, "op %d: %s count %d", o.seq, o.kind, o.count)
        if o.kind == "a2a_counts" and o.a2a_counts_op then
          -- activation checkpointing's recompute: an earlier forward counts op of its unit and slot
          local k = ops[o.a2a_counts_op + 1]
          check(o.recompute and k and k.seq < o.seq and k.kind == "a2a_counts" and k.unit == o.unit
            and k.a2a_slot == o.a2a_slot and k.phase == "forward" and not k.a2a_counts_op,
            "op %d: a2a_counts names op %s as the forward it recomputes", o.seq, tostring(o.a2a_counts_op))
        end
      elseif TP_KIND[o.kind] then
        -- Activation collectives: TP's on the TP group, CP's K/V exchange on
        -- the cp group (gen/parallel/cp.lua), inside the unit's activation buffer.
        check(o.group == "tp" or o.group == "cp", "op %d: %s on group %s", o.seq, o.kind, o.group)
        -- In ag_dtype, or (the norm gradients' all-reduce) the unit's reduce dtype;
        -- act_numel counts ag_dtype elements.
        local elems = o.kind == "tp_all_reduce" and o.count or o.count * f.size
        -- loss_parallel's statistics are fp32 whatever the unit's dtypes.
        check(o.dtype == u.ag_dtype or (o.kind == "tp_all_reduce" and (o.dtype == u.reduce_dtype or o.loss)),
          "op %d dtype %s != %s", o.seq, o.dtype, u.ag_dtype)
        check(elems * ES[o.dtype] <= (u.act_numel or 0) * ES[u.ag_dtype],
          "op %d: %d elements beyond the activation buffer", o.seq, elems)
      else
        -- (a part's collectives: its parameters' padded shards, gen/parallel/fsdp_schedule.lua)
        -- (a reduction's: the trainable parameters', frozen ones take no room: fsdp_layout.lua)
        local total = o.kind == "all_gather" and (u.ag_bytes or u.total) or u.rs_total
        if o.part_first then
          total = 0
          for j = o.part_first + 1, o.part_first + o.part_count do
            if not u.params[j].frozen then total = total + u.params[j].padded end
          end
          check(o.kind ~= "all_gather", "op %d: an all-gather of a part", o.seq)
        end
        -- the post-forward group's all-gather: S / k slots per rank, over that group
        local pf = o.post_forward and u.post_forward
        check(not o.post_forward or pf and o.kind == "all_gather" and o.group == pf.group and f.size == pf.k
          and f.size * pf.scale == lay.W, "op %d: a post-forward %s of %s on %s", o.seq, o.kind, u.name, o.group)
        if pf then total = total * pf.scale end
        check(o.count == total, "op %d count %d != slot %d", o.seq, o.count, total)
        check(o.group ~= "fsdp" and o.group ~= "efsdp" or (u.shard_group or "fsdp") == o.group,
          "op %d: %s of %s on %s", o.seq, o.kind, u.name, o.group)
        local want = o.kind == "all_gather" and (u.ag_bytes and "u8" or u.ag_dtype) or u.reduce_dtype
        check(o.dtype == want, "op %d dtype %s != %s", o.seq, o.dtype, want)
      end
    end
  end
end

-- Every number the C tables hold fits its field: int fields (counts,
-- indices, sizes) in [0, INT_MAX], int64 ones (numels, offsets) in
-- [0, 2^53] so they are exact in a double too, and dims within
-- CP_MAX_DIMS. gen/load and gen/layout refuse plans beyond these; this
-- proves nothing slipped through.
local INT_MAX = (1 << 31) - 1
local EXACT = 1 << 53
local MAX_DIMS = 8

-- (The field's name is formatted only when the check fails: these run
-- for every op and parameter.)
local function int_field(v, what, ...)
  if not (math.type(v) == "integer" and v >= 0 and v <= INT_MAX) then
    check(false, "%s = %s does not fit a C int", string.format(what, ...), tostring(v))
  end
end

local function int64_field(v, what, ...)
  if not (math.type(v) == "integer" and v >= 0 and v <= EXACT) then
    check(false, "%s = %s is outside [0, 2^53]", string.format(what, ...), tostring(v))
  end
end

function verify.bounds(lay, fams, ops, fsdp, rep)
  int_field(#lay.units, "units")
  int_field(lay.W, "shard size")
  int_field(lay.R, "replicate size")
  int_field(fsdp.micro_steps, "micro_steps")
  int_field(rep_mod.executed_count(ops, rep), "ops")
  local nparams = 0
  for _, u in ipairs(lay.units) do
    int64_field(u.total, "%s total", u.name)
    int64_field(u.grads_numel, "%s grads_numel", u.name)
    for _, p in ipairs(u.params) do
      nparams = nparams + 1
      check(#p.shape >= 1 and #p.shape <= MAX_DIMS, "%s has %d dims", p.name, #p.shape)
      int_field(p.shard_dim, "%s shard_dim", p.name)
      for i, d in ipairs(p.shape) do int64_field(d, "%s shape[%d]", p.name, i) end
      for _, k in ipairs({ "numel", "chunk", "outer", "run", "padded", "offset", "grad_offset" }) do
        int64_field(p[k], "%s %s", p.name, k)
      end
    end
  end
  int_field(nparams, "params")
  for _, f in ipairs(fams.list) do int_field(f.size, "group %s size", f.name) end
  for _, o in ipairs(ops) do
    int_field(o.micro_step + rep_mod.times(o) - 1, "op %d micro_step", o.seq)
    if o.count then int64_field(o.count, "op %d count", o.seq) end
  end
end

return verify
