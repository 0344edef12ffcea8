-- Stage 5: one training step in FSDP2's issue order, as a flat op list.
-- A model whose forward calls a unit more than once (lay.calls: the
-- model's forward-call order and backward hook order, DeepSeek-V3's
-- multi-token prediction) runs FSDP2's per-call state machine over it
-- (schedule.calls_micro); every other model has one forward and one
-- backward per unit, as follows.
-- Forward: unshard root then each layer (implicit prefetch = issue order),
-- reshard layers after forward. Backward: reverse post-forward order with
-- one unit of prefetch; post-backward reshards and reduces each unit (RS,
-- then the HSDP all-reduce), root last. Gradient accumulation over
-- micro-steps (fsdp.grad_accumulation): FSDP2's default reduces on every
-- backward and adds the result into the sharded grads (the first reduction
-- of a step assigns them: the optimizer zeroed them to None); "sync_last"
-- (set_requires_gradient_sync(False) before all but the last micro-step)
-- reduces on the last only, the unsharded grads accumulating until then;
-- "all_reduce_last" (HSDP's set_requires_all_reduce(False) before all but
-- the last) reduce-scatters on every backward, keeps the outputs summed in
-- the reduce dtype (partial_save, partial_add) and on the last micro-step
-- adds them into its own output (partial_fold) before the one all-reduce
-- and view-out. Without a replicate group it is FSDP2's default.
-- "step_end" is torch.distributed.pipelining's (stage.py
-- backward_maybe_with_nosync / perform_reduce_grad): every backward runs with
-- set_reshard_after_backward(False) and set_requires_gradient_sync(False),
-- so units stay unsharded from one micro-step to the next (a later forward
-- gathers nothing a backward left unsharded) and the unsharded grads
-- accumulate; after the last backward, FSDPModule.finalize_backward runs
-- each unit's pending post-backward (reshard, pack, RS, AR, view-out) in
-- reversed state order: layers last to first, the root last.
-- A unit with reshard_after_backward false (FSDPModule.set_reshard_after_backward(False)
-- on every micro-step but the last, fsdp.reshard_after_backward / the unit's own)
-- skips its post-backward reshard there, so the next micro-step's forward
-- gathers nothing for it; the last micro-step reshards it.
-- torchtitan's ChunkedLossWrapper (opts.chunked_loss; training.loss_chunks
-- >= 2 on the llama and MoE families, gen/parallel/fsdp.lua) runs the
-- decoder's [norm, lm_head] unit (u.loss_head) three times per micro-step,
-- measured by tests/titan/test_chunked_loss.py: the decoder's forward
-- gathers it for the norm alone and reshards it after (the wrapper's
-- set_reshard_after_forward(True) of the step before stays set); the loss
-- gathers it again (lm_head.unshard()), runs every chunk's lm_head forward
-- and backward, and the last chunk's post-backward reduces lm_head.weight's
-- gradient alone (FSDP2's foreach_reduce packs only the parameters that
-- have a gradient: a partial reduction, op.part_first / part_count), then
-- reshards (lm_head.reshard()); the decoder's backward gathers it a third
-- time at the norm's pre-backward (before prefetching the last block) and
-- its post-backward reduces norm.weight's gradient alone. The wrapper
-- turns gradient sync on for its last chunk and leaves it on, so the unit
-- reduces on every micro-step even under sync_last.
-- The frozen prefix (fsdp_layout.frozen_prefix: a model whose input needs
-- no gradient, leading units whose parameters are all frozen): those units
-- run no pre-backward (no backward all-gather of their own, no backward, no
-- prefetch), the next unit's prefetch of the last of them is waited on in
-- the root's final callback, and they and the first trainable unit
-- post-backward there, after the root, in forward order.
local schedule = {}

local opkinds = require("gen.opkinds")
local repeat_mod = require("gen.repeat")

-- A part of unit u's parameters (FSDP2's foreach_reduce over the ones
-- with a gradient): params first .. first + count - 1 (0-based, in the
-- unit's order, contiguous), their padded shards back to back: total
-- elements per rank, at offset in the unit's reduce-scatter row (frozen
-- parameters have no gradient and take no room there: fsdp_layout.lua).
function schedule.part(u, first, count)
  local total = 0
  for j = first + 1, first + count do
    if not u.params[j].frozen then total = total + u.params[j].padded end
  end
  return { first = first, count = count, total = total, offset = u.params[first + 1].rs_offset }
end

-- An op's fields for a part (nil: the whole unit).
local function part_fields(part)
  if not part then return nil end
  return { part_first = part.first, part_count = part.count }
end

function schedule.build(lay, fams, fsdp, opts)
  -- ops: the micro-step being built (op() and unit_ops append to it);
  -- step: the micro-steps already finished, each appended once.
  local ops, step = {}, {}
  -- The other parallelisms' ops at a unit's points (gen/parallel/init.lua:
  -- TP's activation collectives inside its compute); nil: none.
  local unit_ops = opts and opts.unit_ops
  local shard = fams.by_name.fsdp and fams.by_name.fsdp.size > 1 and fams.by_name.fsdp or nil
  -- ChunkedLossWrapper's unit (the header): its parts, norm and lm_head
  local head, head_norm, head_lm
  if opts and opts.chunked_loss and not lay.explicit_prefetch then
    for _, u in ipairs(lay.units) do
      if u.loss_head then head = u end
    end
    if head then
      assert(#head.params == 2, "internal: the loss head unit holds [norm, lm_head]")
      -- (gen/verify.lua: it reduces on every micro-step)
      head.chunked_loss = true
      head_norm, head_lm = schedule.part(head, 0, 1), schedule.part(head, 1, 1)
    end
  end
  local replicate = fams.by_name.dp_replicate
  local micro_steps = fsdp.micro_steps
  local function op(kind, unit, micro, phase, extra)
    local o = { kind = kind, unit = unit.index, micro_step = micro, phase = phase }
    for k, v in pairs(extra or {}) do o[k] = v end
    -- set_unshard_in_backward(False) on a resharded unit: its backward reads
    -- no unsharded parameters (gen/opkinds.lua access, the proofs, memplan)
    if kind == "backward" and unit.sharded_backward then o.sharded = true end
    ops[#ops + 1] = o
    return o
  end
  -- units resharded after forward to their post-forward group (u.post_forward):
  -- their next all-gather is over that group, from the kept slice
  local post_fwd = {}
  local function all_gather(u, m, phase)
    schedule.gather(ops, u, m, phase, shard, post_fwd[u.index])
    post_fwd[u.index] = nil
  end
  local units = lay.units
  -- A unit without parameters (torchtitan's Llama root) has no FSDP param
  -- group: FSDP2 issues nothing for it, so neither does the schedule.
  local active = {}
  for _, u in ipairs(units) do
    if #u.params > 0 then active[#active + 1] = u end
  end
  units = active
  local root = units[1] and units[1].is_root and units[1] or nil
  local layers = {}
  for i = root and 2 or 1, #units do layers[#layers + 1] = units[i] end
  local step_end = fsdp.grad_accumulation == "step_end"
  local every = fsdp.grad_accumulation ~= "sync_last" and not step_end
  local partial_mode = fsdp.grad_accumulation == "all_reduce_last" and replicate ~= nil and micro_steps > 1
  -- A unit with its own grad_accumulation (set_requires_gradient_sync /
  -- set_requires_all_reduce on its FSDPModule alone): its flags for
  -- micro-step m (reducing, first, partial as below), else nil (the plan's).
  local function own_how(u, m)
    if not u.grad_accumulation then return nil end
    local mode = u.grad_accumulation
    local u_every = mode ~= "sync_last"
    local u_partial = mode == "all_reduce_last" and replicate ~= nil and micro_steps > 1
      and (m == micro_steps - 1 and "fold" or m == 0 and "save" or "add") or nil
    -- hold as the plan's flags have it: a unit's own accumulation leaves its
    -- set_reshard_after_backward as it is
    return { reducing = u_every or m == micro_steps - 1, partial = u_partial,
             first = not u_every or m == 0 or u_partial == "fold", hold = m < micro_steps - 1 }
  end
  local unsharded = {}
  -- What micro-step m finds unsharded from the one before: the units with
  -- set_reshard_after_backward(False) (u.reshard_after_backward false: every
  -- backward but the step's last keeps them, torch 2.15 _fsdp_param_group.py
  -- post_backward: "if self.reshard_after_backward: self.reshard()"), so
  -- FSDP2's pre-forward unshard finds them unsharded and gathers nothing.
  local function held_from(m)
    local kept = {}
    if m > 0 then
      for _, u in ipairs(units) do
        -- (a unit backwarding on sharded parameters has nothing unsharded to keep, nor has a
        -- leading all-frozen one resharded after forward: schedule.final_callback_how)
        if not u.reshard_after_backward and u ~= head and not u.sharded_backward
          and not (u.no_pre_backward and u.reshard_after_forward) then
          kept[u.index] = true
        end
      end
    end
    return kept
  end
  local micro
  -- A model whose forward calls units more than once (lay.calls: DeepSeek-V3's
  -- multi-token prediction, gen/models/deepseek_v3.lua calls): FSDP2's hooks
  -- run per call, in the order the model gives (schedule.calls_micro).
  if lay.calls then
    -- (with explicit prefetching, EP's: the FSDP states, their groups and lists, as explicit_micro's)
    local call_states = lay.explicit_prefetch and schedule.prefetch_lists(schedule.states(units, root), lay) or nil
    micro = function(m)
      ops = {}
      -- (the accumulation flags as the default order's below)
      local reducing = every or (m == micro_steps - 1)
      local partial = partial_mode and (m == micro_steps - 1 and "fold" or m == 0 and "save" or "add") or nil
      if not step_end then unsharded = held_from(m) end
      schedule.calls_micro(ops, lay, m, { op = op, all_gather = all_gather, unit_ops = unit_ops, post_fwd = post_fwd,
        unsharded = unsharded, shard = shard, replicate = replicate, states = call_states,
        finalize = step_end and m == micro_steps - 1,
        how = { reducing = reducing and not step_end, first = not every or m == 0 or partial == "fold",
                partial = partial, keep = step_end, hold = m < micro_steps - 1,
                own = function(u) return own_how(u, m) end } })
      return ops
    end
  end
  -- With explicit prefetching and FSDP states of several parameter groups
  -- (expert parallelism, gen/parallel/ep.lua): schedule.explicit_micro.
  if not micro and lay.explicit_prefetch then
    local states = schedule.prefetch_lists(schedule.states(units, root), lay)
    micro = function(m)
      ops = {}
      local reducing = every or (m == micro_steps - 1)
      local partial = partial_mode and (m == micro_steps - 1 and "fold" or m == 0 and "save" or "add") or nil
      local first = not every or m == 0 or partial == "fold"
      unsharded = held_from(m)
      schedule.explicit_micro(ops, states, m, { op = op, all_gather = all_gather, unit_ops = unit_ops,
        post_fwd = post_fwd,
        unsharded = unsharded, how = { reducing = reducing, first = first, partial = partial,
                                       own = function(u) return own_how(u, m) end,
                                       hold = m < micro_steps - 1 },
        shard = shard, replicate = replicate })
      return ops
    end
  end
  -- Micro-step m's ops (the unsharded state carries over from the
  -- micro-step built before it: build them in order).
  micro = micro or function(m)
    ops = {}
    -- reducing: this micro-step's post-backward reduces; first: its view-out
    -- assigns the sharded grads (later reductions add into them); partial:
    -- what all_reduce_last does with the reduce-scatter output
    local reducing = every or (m == micro_steps - 1)
    local partial = partial_mode and (m == micro_steps - 1 and "fold" or m == 0 and "save" or "add") or nil
    local first = not every or m == 0 or partial == "fold"
    -- step_end keeps what the last backward left unsharded; otherwise every
    -- post-backward resharded everything
    if not step_end then unsharded = held_from(m) end
    -- Forward: root's pre-forward first (it wraps the whole model).
    for _, u in ipairs(units) do
      if not unsharded[u.index] then
        all_gather(u, m, "forward")
        op("copy_out", u, m, "forward")
        unsharded[u.index] = true
      end
      if u == head then
        -- the decoder's norm, then the loss (the header): lm_head.unshard(),
        -- the chunks' lm_head forward and backward (the other parallelisms'
        -- ops of the unit's compute: lm_head's and the loss's), the last
        -- chunk's reduction of lm_head's gradient, lm_head.reshard()
        op("forward", u, m, "forward", part_fields(head_norm))
        op("reshard", u, m, "forward")
        all_gather(u, m, "forward")
        op("copy_out", u, m, "forward")
        op("forward", u, m, "forward", part_fields(head_lm))
        if unit_ops then unit_ops(ops, u, m, "forward") end
        op("backward", u, m, "backward", part_fields(head_lm))
        if unit_ops then unit_ops(ops, u, m, "backward") end
        schedule.reduction(ops, u, m, { first = m == 0, keep = true }, shard, replicate, true, head_lm)
        op("reshard", u, m, "backward")
        unsharded[u.index] = false
      else
        op("forward", u, m, "forward")
        if unit_ops then unit_ops(ops, u, m, "forward") end
        if u.reshard_after_forward then
          schedule.forward_reshard(op, u, m, post_fwd)
          unsharded[u.index] = false
        end
      end
    end
    -- Backward. post_forward_order = layers in order, then root.
    local pfo = {}
    for _, u in ipairs(layers) do pfo[#pfo + 1] = u end
    pfo[#pfo + 1] = root -- nil (no entry) without a root param group
    local gathering = {}
    local function unshard(u, phase)
      -- (set_unshard_in_backward(False): FSDPParamGroup.unshard returns in
      -- PRE_BACKWARD, its own pre-backward's and the prefetch alike)
      if not unsharded[u.index] and not gathering[u.index] and not u.sharded_backward then
        all_gather(u, m, phase)
        gathering[u.index] = true
      end
    end
    local function wait(u)
      if gathering[u.index] then
        op("copy_out", u, m, "backward")
        gathering[u.index] = false
        unsharded[u.index] = true
      end
    end
    for i = #pfo, 1, -1 do
      local u = pfo[i]
      -- pre-backward: unshard self, then prefetch the previous unit (none, and
      -- no backward, for a leading all-frozen unit: fsdp_layout.frozen_prefix;
      -- the prefetch of the last of them is issued and never waited on).
      if not u.no_pre_backward then
        unshard(u, "backward")
        wait(u)
        if i > 1 then unshard(pfo[i - 1], "backward") end
        if u ~= root then
          op("backward", u, m, "backward", u == head and part_fields(head_norm) or nil)
        end
      end
    end
    -- post-backward fires for layers in reverse order, root last (its
    -- backward finishes with the embeddings).
    local post = {}
    for i = #layers, 1, -1 do post[#post + 1] = layers[i] end
    post[#post + 1] = root -- nil (no entry) without a root param group
    -- Interleave: FSDP2 runs unit i's post-backward right after its own
    -- backward, before the next unit's pre-backward. Rebuild the op list in
    -- that order below.
    ops = schedule.interleave_post_backward(ops, post, root, m, { reducing = reducing and not step_end,
                                            first = first, partial = partial, keep = step_end,
                                            own = function(u) return own_how(u, m) end,
                                            hold = m < micro_steps - 1,
                                            -- the loss head's norm: reduced on every micro-step (the header)
                                            head = head and { index = head.index, part = head_norm,
                                                              how = { reducing = true, first = m == 0 } } },
                                            shard, replicate, unit_ops)
    if step_end and m == micro_steps - 1 then
      -- finalize_backward: every unit's pending post-backward, in post order
      for _, u in ipairs(post) do
        if unit_ops then unit_ops(ops, u, m, "reduce") end
        schedule.reduction(ops, u, m, schedule.final_callback_how(u, { first = true }, false), shard, replicate, true)
      end
    end
    return ops
  end
  -- A repeated micro-step is one table entry with a count. Micro-steps
  -- 1 .. M-2 have the same flags (reducing, first, partial; step_end's
  -- state too): every op of that run is the same but for its micro-step
  -- number. The tables keep three of the run (the memory plan and its
  -- proof see a copy after a copy after a copy) and the last micro-step
  -- after them (so the third copy is timed between two copies, as every
  -- repetition runs), the third copy's rows running `times` times:
  -- micro-steps 3 .. M-2 (gen/repeat.lua).
  local built = {}
  local rep
  if micro_steps >= 6 and not (opts and opts.expand) then
    for m = 0, 3 do built[m + 1] = schedule.number(schedule.mark_post_forward(micro(m))) end
    built[5] = schedule.mark_post_forward(micro(micro_steps - 1))
    if repeat_mod.same_micro(built[2], built[3]) and repeat_mod.same_micro(built[3], built[4]) then
      local times = micro_steps - 2 - 3 + 1
      for _, o in ipairs(built[4]) do o.times = times end
      rep = { micro_first = 3, micro_last = micro_steps - 2, times = times }
    else
      built = {}
      unsharded = {}
    end
  end
  if not rep then
    -- every micro-step planned: the whole count is the planned one
    require("gen.parallel.fsdp_layout").check_unit_steps(opts and opts.ctx, #lay.units, micro_steps, micro_steps)
    for m = 0, micro_steps - 1 do built[m + 1] = schedule.mark_post_forward(micro(m)) end
  end
  for i, list in ipairs(built) do
    if rep and i == 4 then rep.first, rep.n = #step, #list end
    table.move(list, 1, #list, #step + 1, step)
  end
  schedule.seal(step, replicate)
  return step, rep
end

-- A built step's ops numbered in issue order (seq), each on its stream,
-- and an all-to-all's counts op named by its row (gen/parallel/ep.lua's
-- a2a_counts_of): the last pass of every step builder (this one's, the
-- pipeline's gen/parallel/pp_tables.lua).
function schedule.seal(step, replicate)
  for i, o in ipairs(step) do
    o.seq = i - 1
    o.stream = opkinds.stream_of(o, replicate ~= nil)
  end
  for _, o in ipairs(step) do
    if o.a2a_counts_of then o.a2a_counts_op, o.a2a_counts_of = o.a2a_counts_of.seq, nil end
    o.a2a_pos = nil
  end
end

-- The group an FSDP collective of unit u runs on: the unit's own
-- (expert parallelism's experts: efsdp, none when it has one rank), else
-- the dense shard group (none when it has one rank: FSDP2's world-size-1
-- path, the executor copies the slot locally).
function schedule.shard_group(u, shard)
  if u.shard_group then return u.W > 1 and u.shard_group or nil end
  return shard and "fsdp" or nil
end

-- Unit u's all-gather at micro-step m, appended to out (the pipeline's
-- UNSHARD calls it too, gen/parallel/pp_tables.lua): its copy-in, then the
-- collective. Zero copy-in (gen/opkinds.lua): without a cast the
-- all-gather reads the sharded storage itself; the collective's bytes are
-- the same. A shard group of one rank issues no collective (FSDP2's
-- world-size-1 path); the executor copies the slot locally.
--
-- CPU offload (u.offload): the sharded parameters are in host memory, so
-- the all-gather inputs are first copied to the device
-- (`sharded_param_data.to(device, non_blocking=True)`, torch 2.15
-- _fsdp_param.py:1143-1146, inside foreach_all_gather's copy-in stream,
-- _fsdp_collectives.py:362-363): op h2d, then the copy-in from that device
-- copy (FSDP2 never takes the foreach fast path for an offloaded
-- parameter, _fsdp_collectives.py:414-419: there is always a copy-in).
--
-- post_fwd: the unit was resharded after forward to its post-forward group
-- (u.post_forward, fully_shard(reshard_after_forward=k)): the all-gather
-- runs over that group from the slice the forward kept (torch 2.15
-- _fsdp_param_group.py:1215-1226 _all_gather_process_group;
-- _fsdp_param.py:1148-1154: the input is that slice, already in
-- param_dtype, and on the device under CPU offload), u.post_forward.count
-- elements per rank; no H2D, and the copy-in FSDP2's foreach copy makes
-- moves bytes only (zero copy-in, as from_sharded).
function schedule.gather(out, u, m, phase, shard, post_fwd)
  if post_fwd then
    out[#out + 1] = { kind = "all_gather", unit = u.index, micro_step = m, phase = phase,
                      group = u.post_forward.group, dtype = u.ag_bytes and "u8" or u.ag_dtype,
                      count = u.post_forward.count, post_forward = true }
    return
  end
  local direct = u.orig_dtype == u.ag_dtype and not u.ag_bytes and not u.offload
  if u.offload then out[#out + 1] = { kind = "h2d", unit = u.index, micro_step = m, phase = phase } end
  if not direct then
    out[#out + 1] = { kind = "copy_in", unit = u.index, micro_step = m, phase = phase, offload = u.offload or nil }
  end
  -- Mixed all-gather dtypes: FSDP2 all-gathers the slot's bytes as uint8
  -- (torch 2.15 _fsdp_collectives.py:369-379).
  out[#out + 1] = { kind = "all_gather", unit = u.index, micro_step = m, phase = phase,
                    group = schedule.shard_group(u, shard), dtype = u.ag_bytes and "u8" or u.ag_dtype,
                    count = u.ag_bytes or u.total, from_sharded = direct or nil }
end

-- A unit's reshard after forward (reshard_after_forward true or k): with
-- a post-forward group (u.post_forward) first the copy of this rank's
-- slice of the unsharded parameters (FSDPParam.to_sharded_post_forward,
-- torch 2.15 _fsdp_param.py:970-1010, on the caller's stream inside
-- FSDPParamGroup.reshard, _fsdp_param_group.py:585-596), then the reshard
-- that frees them; post_fwd[unit] says its next all-gather is the
-- post-forward group's.
function schedule.forward_reshard(op, u, m, post_fwd)
  if u.post_forward then
    op("post_forward", u, m, "forward")
    post_fwd[u.index] = true
  end
  op("reshard", u, m, "forward")
end

-- A micro-step's copy-out after a post-forward all-gather marked as such
-- (op.post_forward: the output holds the post-forward group's slices,
-- runtime/executor.c), returned.
function schedule.mark_post_forward(list)
  local pending = {}
  for _, o in ipairs(list) do
    if o.kind == "all_gather" and o.post_forward then pending[o.unit] = true
    elseif o.kind == "copy_out" and pending[o.unit] then
      o.post_forward, pending[o.unit] = true, nil
    end
  end
  return list
end

-- Positions inside one micro-step's list, so that repeat.same_micro
-- compares an all-to-all's counts op by where it is, not by identity.
function schedule.number(list)
  for i, o in ipairs(list) do
    if o.a2a_experts then o.a2a_pos = i end
  end
  return list
end

-- Each state's prefetch lists (schedule.explicit_micro): expert
-- parallelism's torchtitan lists (lay.ep: every state the next forward and
-- the previous backward, gen/parallel/ep.lua), else the units' own
-- (fsdp_layout.prefetch: fwd_prefetch / bwd_prefetch, layout indices) and
-- where a unit gives no backward list FSDP2's default (_backward_prefetch,
-- _fsdp_param_group.py:1061-1096): the group before it in post-forward
-- order (layers in order, the root last), none for the first layer.
function schedule.prefetch_lists(states, lay)
  local of = {}
  for _, st in ipairs(states) do
    for _, u in ipairs(st.units) do of[u.index] = st end
  end
  local function resolve(list)
    local out = {}
    for _, i in ipairs(list) do out[#out + 1] = of[i] end
    return out
  end
  local root = states[1] and states[1].is_root and states[1] or nil
  -- torchtitan's lists with multi-token prediction's blocks (units with mtp_depth): apply_fsdp_to_mtp_decoder
  -- adds them to model.layers while the lists are set (models/deepseek_v3/mtp.py:295-320), so they follow
  -- the last block and precede [norm, lm_head] (distributed/fsdp.py:331-365); the embedding first, its own
  -- backward list none (FSDP2's default)
  local seq = {}
  if lay.ep then
    for _, st in ipairs(states) do
      if st ~= root and not st.units[1].mtp_depth then seq[#seq + 1] = st end
    end
    local head = table.remove(seq)
    for _, st in ipairs(states) do
      if st.units[1].mtp_depth then seq[#seq + 1] = st end
    end
    seq[#seq + 1] = head
  end
  local mtp = #seq > 0 and seq[#seq - 1] and seq[#seq - 1].units[1].mtp_depth
  if mtp then
    for i, st in ipairs(seq) do st.fwd, st.bwd = { seq[i + 1] }, { seq[i - 1] } end
    if root then root.fwd, root.bwd = {}, {} end
    return states
  end
  for i, st in ipairs(states) do
    if lay.ep then
      st.fwd, st.bwd = { states[i + 1] }, { states[i - 1] }
    else
      local u = st.units[1]
      st.fwd = resolve(u.fwd_prefetch or {})
      local default = st == root and states[#states] ~= root and states[#states]
        or (i > 1 and states[i - 1] ~= root and states[i - 1]) or nil
      st.bwd = u.bwd_prefetch and resolve(u.bwd_prefetch) or { default }
    end
  end
  return states
end

-- The FSDP states in forward order (the root without parameters is none):
-- each { units = its parameter groups in order }. A unit's state is
-- u.state (ep's MoE blocks: the dense group, then the experts), else itself.
function schedule.states(units, root)
  local out, by = {}, {}
  for _, u in ipairs(units) do
    local key = u.state or u.name
    if not by[key] then
      by[key] = { units = {}, is_root = (u == root) }
      out[#out + 1] = by[key]
    end
    table.insert(by[key].units, u)
  end
  return out
end

-- One micro-step with explicit prefetching (torchtitan's with ep > 1,
-- distributed/fsdp.py after the fully_shard calls: each block forward-
-- prefetches the next, tok_embeddings the first block, the last block the
-- norm and lm_head; in backward lm_head the last block, each block the one
-- before it, the first block tok_embeddings; tok_embeddings keeps FSDP2's
-- default backward prefetch, which finds nothing before it) and FSDP2's
-- multi-group states (torch 2.15 _fsdp_state.py: pre-forward unshards and
-- waits for each group in order, then issues the forward prefetch of the
-- next state's groups in order; post-forward reshards each group in
-- order; pre-backward unshards and waits for each group in order, then
-- prefetches the previous state's groups in reversed order; autograd fires
-- the groups' post-backward hooks last group first (each group's
-- RegisterPostBackwardFunction wraps the previous group's inputs), each
-- resharding and reducing its group). A state's compute is its groups'
-- forwards in order (the dense part, then the experts inside the MoE, the
-- all-to-alls around them: unit_ops "forward_before" / "forward") and in
-- backward the reverse ("backward_before" / "backward").
-- A state's lists (schedule.prefetch_lists): st.fwd, the states whose
-- groups its pre-forward prefetches in order; st.bwd, the states its
-- pre-backward prefetches (each's groups in reversed order). The root's
-- pre-backward runs right after the last unit's (the model returns that
-- unit's output: the root's hook on it fires after the unit's, as in
-- torchtitan's models), its backward compute and post-backward last.
function schedule.explicit_micro(ops, states, m, k)
  local op, all_gather, unit_ops, unsharded = k.op, k.all_gather, k.unit_ops, k.unsharded
  local gathering = {}
  local function issue(u, phase)
    -- (set_unshard_in_backward(False): nothing gathered in backward, gen/parallel/fsdp_layout.lua)
    if not unsharded[u.index] and not gathering[u.index] and not (phase == "backward" and u.sharded_backward) then
      all_gather(u, m, phase)
      gathering[u.index] = true
    end
  end
  local function wait(u, phase)
    issue(u, phase)
    if gathering[u.index] then
      op("copy_out", u, m, phase)
      gathering[u.index] = false
      unsharded[u.index] = true
    end
  end
  for _, st in ipairs(states) do
    for _, u in ipairs(st.units) do wait(u, "forward") end
    for _, t in ipairs(st.fwd) do
      for _, u in ipairs(t.units) do issue(u, "forward") end
    end
    for _, u in ipairs(st.units) do
      if unit_ops then unit_ops(ops, u, m, "forward_before") end
      op("forward", u, m, "forward")
      if unit_ops then unit_ops(ops, u, m, "forward") end
    end
    for _, u in ipairs(st.units) do
      if u.reshard_after_forward then
        schedule.forward_reshard(op, u, m, k.post_fwd)
        unsharded[u.index] = false
      end
    end
  end
  local function pre_backward(st)
    for _, u in ipairs(st.units) do wait(u, "backward") end
    for _, t in ipairs(st.bwd) do
      for j = #t.units, 1, -1 do issue(t.units[j], "backward") end
    end
  end
  local root_state = states[1] and states[1].is_root and states[1] or nil
  -- (a leading all-frozen unit: no pre-backward, no backward; the units
  -- whose inputs need no gradient post-backward in the root's final
  -- callback, after the root's, in forward order: fsdp_layout.frozen_prefix)
  local function post_backward(u)
    local gathered = u.no_pre_backward and gathering[u.index]
    if gathered then wait(u, "backward") end -- (the plan's wait: final_callback_how)
    local how = schedule.final_callback_how(u, k.how.own and k.how.own(u) or k.how, gathered)
    if unit_ops and how.reducing then unit_ops(ops, u, m, "reduce") end
    schedule.reduction(ops, u, m, how, k.shard, k.replicate, how.reducing)
  end
  for i = #states, 1, -1 do
    local st = states[i]
    if st ~= root_state and not st.units[1].no_pre_backward then pre_backward(st) end
    -- the root's pre-backward: its hook is on the model's output, the last
    -- unit's output tensor, hooked after that unit's (FSDP2 registers
    -- both in post-forward order; a tensor's hooks fire in that order)
    if root_state and (i == #states) then pre_backward(root_state) end
    for j = #st.units, 1, -1 do
      local u = st.units[j]
      if not u.no_pre_backward then
        if unit_ops then unit_ops(ops, u, m, "backward_before") end
        op("backward", u, m, "backward")
        if unit_ops then unit_ops(ops, u, m, "backward") end
      end
    end
    for j = #st.units, 1, -1 do
      if not st.units[j].final_callback then post_backward(st.units[j]) end
    end
  end
  for _, st in ipairs(states) do
    for j = #st.units, 1, -1 do
      if st.units[j].final_callback then post_backward(st.units[j]) end
    end
  end
end

-- One micro-step of a model that calls a unit more than once per forward
-- (lay.calls, gen/parallel/fsdp_layout.lua: the model's forward-call order
-- and the order autograd fires FSDP2's backward hooks, each event
-- { ev, unit[, grads] }), FSDP2's state machine run over it (torch 2.15):
-- forward "pre" (FSDPParamGroup.pre_forward, _fsdp_param_group.py:637-655):
-- the unit all-gathered where it is sharded (again after a reshard), its
-- copy-out; "fwd": a call's compute (the modules' unit_ops given the call:
-- TP's collectives of that call, gen/parallel/tp.lua); "post" (post_forward, :657-677): the
-- reshard where it reshards after forward, the call recorded in the
-- post-forward order with multiplicity (_record_post_forward: "one
-- pre-backward unshard for each forward call"). Backward "pre" (pre_backward,
-- :679-693): nothing while the unit is in PRE_BACKWARD (a second hook of one
-- pass), else its all-gather where sharded, the wait, and the default
-- prefetch (_backward_prefetch, :1061-1097): its last unpopped post-forward
-- record's predecessor gathered, where sharded and not gathering; "bwd": a
-- call's backward compute ("backward_input", activation gradients only,
-- but the one that writes the unit's gradients: the model's mark (writes),
-- else its last -- autograd accumulates a parameter used by several calls
-- once, after its last use in backward); a call may name its part of the
-- unit (part: the parameters it runs, the FLOPs it is priced at);
-- "post" (post_backward, :695-): the unit to POST_BACKWARD, resharded, and
-- with grads its reduction (a post-backward before any gradient reached
-- the unit reshards alone: "if not unsharded_grads: return"); "final"
-- (_root_post_backward_final_callback, _fsdp_state.py:422-460): every unit
-- not in POST_BACKWARD post-backwards, with its gradients.
-- With explicit prefetching (k.states: EP's, schedule.prefetch_lists) a
-- call runs on the unit's FSDP state, its groups (the dense part, then the
-- experts) as explicit_micro's: "pre" waits for each group, then issues the
-- forward list's gathers -- at every call (_fsdp_state.py:336-350: the
-- state is IDLE after each post-forward, so the embedding's second call
-- prefetches the first block again); a backward "pre" runs each group's
-- pre_backward (its default prefetch only where the state has no list) and
-- then the backward list's, each group reversed, at every hook
-- (:407-418); compute with EP's points before and after, post-backward last
-- group first.
function schedule.calls_micro(ops, lay, m, k)
  local op, unsharded = k.op, k.unsharded
  local by, state, gathering, pfo, records, last_bwd = {}, {}, {}, {}, {}, {}
  for _, u in ipairs(lay.units) do by[u.index] = u end
  local st_of = {}
  for _, st in ipairs(k.states or {}) do
    for _, u in ipairs(st.units) do st_of[u.index] = st end
  end
  local function groups(u) return st_of[u.index] or { units = { u } } end
  local function hook(u, at, e)
    if k.unit_ops and (k.states or not at:match("_before$")) then k.unit_ops(ops, u, m, at, e) end
  end
  -- the backward that writes a unit's gradients: the one the model marks (writes), else its last
  for i, e in ipairs(lay.calls.backward) do
    if e.ev == "bwd" and (e.writes or not (last_bwd[e.unit] and lay.calls.backward[last_bwd[e.unit]].writes)) then
      last_bwd[e.unit] = i
    end
  end
  -- a call's part of the unit (its parameters: the FLOPs it prices, gen/compute.lua op_us)
  local function part(e)
    return e.part and { part_first = e.part[1], part_count = e.part[2] } or nil
  end
  local function unshard(u, phase)
    -- (set_unshard_in_backward(False): FSDPParamGroup.unshard returns in PRE_BACKWARD)
    if not unsharded[u.index] and not gathering[u.index] and not (phase == "backward" and u.sharded_backward) then
      k.all_gather(u, m, phase)
      gathering[u.index] = true
    end
  end
  local function wait(u, phase)
    unshard(u, phase)
    if gathering[u.index] then
      op("copy_out", u, m, phase)
      gathering[u.index], unsharded[u.index] = false, true
    end
  end
  for _, e in ipairs(lay.calls.forward) do
    local st = groups(by[e.unit])
    if e.ev == "pre" then
      for _, u in ipairs(st.units) do wait(u, "forward") end
      for _, t in ipairs(st.fwd or {}) do
        for _, u in ipairs(t.units) do unshard(u, "forward") end
      end
    elseif e.ev == "fwd" then
      for _, u in ipairs(st.units) do
        hook(u, "forward_before", e)
        op("forward", u, m, "forward", part(e))
        hook(u, "forward", e)
      end
    else -- post
      for _, u in ipairs(st.units) do
        if u.reshard_after_forward then
          schedule.forward_reshard(op, u, m, k.post_fwd)
          unsharded[u.index] = false
        end
        pfo[#pfo + 1] = u
        records[u.index] = records[u.index] or {}
        table.insert(records[u.index], #pfo)
      end
    end
  end
  local reduced, posted = {}, {}
  -- a post-backward: the micro-step's flags (k.how: reducing, first, partial, keep, hold; a unit's own
  -- accumulation, k.how.own) where the hook has gradients to reduce, a reshard alone where it has none
  local function post_backward(u, grads)
    state[u.index] = "post"
    posted[u] = true
    local base = k.how.own and k.how.own(u) or k.how
    local how = { reducing = base.reducing and grads, first = base.first and not reduced[u.index],
                  partial = base.partial, keep = k.how.keep, hold = base.hold }
    if how.reducing and k.unit_ops then k.unit_ops(ops, u, m, "reduce") end
    schedule.reduction(ops, u, m, how, k.shard, k.replicate, how.reducing)
    unsharded[u.index] = how.keep or (how.hold and not u.reshard_after_backward) or false
    reduced[u.index] = reduced[u.index] or how.reducing
  end
  for i, e in ipairs(lay.calls.backward) do
    local st = e.unit and groups(by[e.unit])
    if e.ev == "pre" then
      local default = not (st.bwd and #st.bwd > 0)
      for _, u in ipairs(st.units) do
        if state[u.index] ~= "pre" then
          state[u.index] = "pre"
          wait(u, "backward")
          local at = default and table.remove(records[u.index] or {})
          if at and at > 1 then unshard(pfo[at - 1], "backward") end
        end
      end
      for _, t in ipairs(st.bwd or {}) do
        for j = #t.units, 1, -1 do unshard(t.units[j], "backward") end
      end
    elseif e.ev == "bwd" then
      for j = #st.units, 1, -1 do
        local u = st.units[j]
        hook(u, "backward_before", e)
        if last_bwd[e.unit] == i then
          op("backward", u, m, "backward")
        else
          -- (its part priced only: the runtime's backward_input takes the whole unit's unsharded parameters)
          local o = op("backward_input", u, m, "backward")
          o.call = e.part or true
        end
        hook(u, "backward", e)
      end
    elseif e.ev == "post" then
      for j = #st.units, 1, -1 do post_backward(st.units[j], e.grads) end
    elseif e.ev == "final" then
      for _, v in ipairs(lay.units) do
        if #v.params > 0 and state[v.index] ~= "post" then post_backward(v, true) end
      end
    end
  end
  -- torch.distributed.pipelining's step_end (the header): after the last backward, finalize_backward runs
  -- every unit's pending post-backward over reversed(all_states), all_states in named_modules() order
  -- (torch 2.15 _fsdp_state.py:470, :206-220): lay.units in reverse, as the default builder's post list
  if k.finalize then
    for j = #lay.units, 1, -1 do
      local u = lay.units[j]
      if posted[u] then
        if k.unit_ops then k.unit_ops(ops, u, m, "reduce") end
        schedule.reduction(ops, u, m, { first = true }, k.shard, k.replicate, true)
        unsharded[u.index] = false
      end
    end
  end
end

-- The backward part above emitted micro-step m's pre-backward work unit by
-- unit (ops holds that micro-step only, so this is linear in it); insert
-- each unit's post-backward (reshard, and on a reducing micro-step pack, RS,
-- AR, view-out: view_out_add where an earlier micro-step's reduction already
-- set the sharded grads) right after its backward compute. how: reducing,
-- first and partial of micro-step m (schedule.build).
-- One unit's reshard (unless how.keep: step_end leaves it unsharded) and,
-- when reducing, its reduction: pack, RS, all_reduce_last's partial sums,
-- AR, view-out (view_out_add where an earlier reduction of the step already
-- set the sharded grads), appended to out.
-- part (schedule.part; nil: the whole unit): a partial reduction, its
-- pack, collectives (count: the part's elements) and view-out over the
-- part's parameters only.
-- how.hold: not the step's last micro-step, where a unit with
-- reshard_after_backward false keeps its parameters unsharded.
function schedule.reduction(out, u, m, how, shard, replicate, reducing, part)
  local first, partial = how.first, how.partial
  -- (a unit backwarding on its sharded parameters, set_unshard_in_backward(False):
  -- FSDP2's reshard finds it sharded, _fsdp_param_group.py _to_sharded)
  if not (how.keep or how.hold and not u.reshard_after_backward or u.sharded_backward) then
    out[#out + 1] = { kind = "reshard", unit = u.index, micro_step = m, phase = "backward" }
  end
  local pf, pc = part and part.first, part and part.count
  -- the trainable parameters' elements (a unit or part whose parameters are
  -- all frozen has no gradient to reduce: FSDP2's post_backward returns at
  -- "if not unsharded_grads", torch 2.15 _fsdp_param_group.py:767-768)
  local count = part and part.total or u.rs_total
  if not reducing or count == 0 then return end
  out[#out + 1] = { kind = "pack", unit = u.index, micro_step = m, phase = "backward", part_first = pf,
                    part_count = pc }
  out[#out + 1] = { kind = "reduce_scatter", unit = u.index, micro_step = m, phase = "backward",
                    group = schedule.shard_group(u, shard), dtype = u.reduce_dtype, count = count,
                    reduce_op = u.rs_op, premul = u.premul, part_first = pf, part_count = pc }
  if partial then
    assert(not part, "internal: all_reduce_last's partial sums of a part")
    out[#out + 1] = { kind = "partial_" .. partial, unit = u.index, micro_step = m, phase = "backward" }
  end
  if partial == "save" or partial == "add" then return end -- no all-reduce until the last micro-step
  if replicate then
    out[#out + 1] = { kind = "all_reduce", unit = u.index, micro_step = m, phase = "backward",
                      group = "dp_replicate", dtype = u.reduce_dtype, count = count,
                      reduce_op = u.ar_op, part_first = pf, part_count = pc }
  end
  if u.offload then
    -- CPU offload: the reduced gradient is viewed out (cast) on the device,
    -- copied D2H and assigned to, or added into, the host's sharded grad
    -- (torch 2.15 _fsdp_collectives.py:779-824; the copy is non_blocking
    -- only into pinned memory and when it assigns, else the host waits for
    -- it before its add: d2h_add)
    out[#out + 1] = { kind = "view_out", unit = u.index, micro_step = m, phase = "backward", part_first = pf,
                      part_count = pc, offload = true }
    out[#out + 1] = { kind = first and "d2h" or "d2h_add", unit = u.index, micro_step = m, phase = "backward",
                      part_first = pf, part_count = pc }
    return
  end
  out[#out + 1] = { kind = first and "view_out" or "view_out_add", unit = u.index, micro_step = m,
                    phase = "backward", part_first = pf, part_count = pc }
end

-- A leading all-frozen unit resharded after forward (fsdp_layout.frozen_prefix)
-- is sharded again at the step's end whatever its reshard_after_backward: no
-- pre-backward gathers it, and finalize_backward drops a prefetch's
-- all-gather uncopied (torch 2.15 _fsdp_param_group.py:890-906). The plan
-- waits for that all-gather where FSDP2 does, at the final callback, with
-- a copy-out (gathered: the op the caller emits) and reshards; an
-- ungathered one FSDP2's reshard finds sharded (keep: no op; a post-forward
-- slice is freed: _to_sharded). Returns the post-backward's how.
function schedule.final_callback_how(u, how, gathered)
  if not (u.no_pre_backward and u.reshard_after_forward) then return how end
  local h = {}
  for k, v in pairs(how) do h[k] = v end
  h.hold, h.keep = false, not gathered and not u.post_forward
  return h
end

function schedule.interleave_post_backward(ops, post, root, m, how, shard, replicate, unit_ops)
  local reducing = how.reducing
  local by_index = {}
  for _, u in ipairs(post) do by_index[u.index] = u end
  local out = {}
  local head = how.head -- ChunkedLossWrapper's unit: its norm's part (the header)
  local function post_backward(u, gathered)
    local h = head and head.index == u.index and head or nil
    local own = not h and how.own and how.own(u) -- the unit's own accumulation (schedule.build own_how)
    local red = h and h.how.reducing or own and own.reducing or (not own and reducing)
    -- The other parallelisms' ops inside the backward finish before its
    -- post-backward hook (their "reduce" ones where it reduces); the loss
    -- head's backward ones ran with lm_head's in the loss.
    if unit_ops then
      -- (a leading all-frozen unit ran no backward: fsdp_layout.frozen_prefix)
      if not h and not u.no_pre_backward then unit_ops(out, u, m, "backward") end
      if red then unit_ops(out, u, m, "reduce") end
    end
    schedule.reduction(out, u, m, schedule.final_callback_how(u, h and h.how or own or how, gathered), shard,
                       replicate, red, h and h.part)
  end
  -- (a leading all-frozen unit's backward all-gather: the next unit's prefetch, never waited on)
  local gathered = {}
  for _, o in ipairs(ops) do
    if o.kind == "all_gather" and o.phase == "backward" and o.micro_step == m and by_index[o.unit]
      and by_index[o.unit].no_pre_backward then
      gathered[o.unit] = true
    end
  end
  for _, o in ipairs(ops) do
    out[#out + 1] = o
    -- (the loss head's lm_head backward in the loss reduced its own part there)
    if o.kind == "backward" and o.micro_step == m and not by_index[o.unit].final_callback
      and (not o.part_first or head and head.index == o.unit and o.part_first == head.part.first) then
      post_backward(by_index[o.unit])
    end
  end
  -- Root: its backward compute closes the step, then its post-backward.
  if root then
    out[#out + 1] = { kind = "backward", unit = root.index, micro_step = m, phase = "backward" }
    post_backward(root)
  end
  -- The root's final callback: the post-backward of the units whose inputs
  -- needed no gradient (fsdp_layout.frozen_prefix), in forward order.
  for i = #post, 1, -1 do
    local u = post[i]
    if u.final_callback then
      if gathered[u.index] then out[#out + 1] = { kind = "copy_out", unit = u.index, micro_step = m, phase = "backward" } end
      post_backward(u, gathered[u.index])
    end
  end
  return out
end

return schedule
