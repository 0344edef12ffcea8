local H = require("helpers")
local plan = require("gen.plan")
local T = {}

local function collectives(p)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.group then out[#out + 1] = o.kind .. ":" .. p.layout.units[o.unit + 1].name .. ":" .. o.group end
  end
  return out
end

-- The recording's order (shared/oracle hsdp2x2): backward prefetches one
-- unit ahead, HSDP all-reduce right after each reduce-scatter, root last.
function T.hsdp_order_matches_fsdp2()
  local p = plan.from_file("plans/hsdp2x2.lua")
  H.list_eq(collectives(p), {
    "all_gather:root:fsdp", "all_gather:layers.0:fsdp", "all_gather:layers.1:fsdp", "all_gather:layers.2:fsdp",
    "all_gather:layers.2:fsdp", "all_gather:layers.1:fsdp",
    "reduce_scatter:layers.2:fsdp", "all_reduce:layers.2:dp_replicate",
    "all_gather:layers.0:fsdp",
    "reduce_scatter:layers.1:fsdp", "all_reduce:layers.1:dp_replicate",
    "reduce_scatter:layers.0:fsdp", "all_reduce:layers.0:dp_replicate",
    "reduce_scatter:root:fsdp", "all_reduce:root:dp_replicate",
  }, "collective order")
end

function T.no_reshard_after_forward_means_no_backward_gathers()
  local p = plan.from_source(H.generic(2, "{ dp_shard = 2 }",
    { { "l0", { { "a", { 4 } } } }, { "root", { { "c", { 4 } } } } }, "{ reshard_after_forward = false }"), "t.lua")
  H.list_eq(collectives(p), { "all_gather:root:fsdp", "all_gather:l0:fsdp", "reduce_scatter:l0:fsdp",
    "reduce_scatter:root:fsdp" }, "order")
end

function T.micro_steps_reduce_once_with_sync_last()
  local p = plan.from_source(H.generic(2, "{ dp_shard = 2 }",
    { { "l0", { { "a", { 4 } } } }, { "root", { { "c", { 4 } } } } },
    "{ micro_steps = 3, grad_accumulation = 'sync_last' }"), "t.lua")
  local ag, rs = 0, 0
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" then ag = ag + 1 end
    if o.kind == "reduce_scatter" then rs = rs + 1; H.eq(o.micro_step, 2, "reduce on the last micro-step") end
  end
  H.eq(ag, 3 * 3, "3 gathers per micro-step (root, l0 forward, l0 backward)")
  H.eq(rs, 2, "one reduce-scatter per unit per step")
end

-- FSDP2's default (and torchtitan's): every backward reduce-scatters (and
-- under HSDP all-reduces), the first view-out of the step assigns the
-- sharded grads and later ones add into them.
function T.micro_steps_reduce_every_backward_by_default()
  local p = plan.from_source(H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }",
    { { "l0", { { "a", { 4 } } } }, { "root", { { "c", { 4 } } } } }, "{ micro_steps = 3 }"), "t.lua")
  H.eq(p.fsdp.grad_accumulation, "fsdp2_default")
  local per_micro = {}
  for _, o in ipairs(p.ops) do
    local k = per_micro[o.micro_step] or {}
    per_micro[o.micro_step] = k
    k[o.kind] = (k[o.kind] or 0) + 1
  end
  for m = 0, 2 do
    local k = per_micro[m]
    H.eq(k.pack, 2, "packing per micro-step"); H.eq(k.reduce_scatter, 2, "reduce-scatters per micro-step")
    H.eq(k.all_reduce, 2, "HSDP all-reduces per micro-step")
    H.eq(k.view_out, m == 0 and 2 or nil, "view_out (assign) in micro-step " .. m)
    H.eq(k.view_out_add, m > 0 and 2 or nil, "view_out_add in micro-step " .. m)
  end
  -- The view-outs run where the all-reduce ran.
  for _, o in ipairs(p.ops) do
    if o.kind == "view_out_add" then H.eq(o.stream, "all_reduce", "view_out_add stream") end
  end
end

-- HSDP's set_requires_all_reduce(False) before all but the last micro-step:
-- every backward reduce-scatters into the partial sums (save, then add, on
-- the reduce-scatter stream), the last folds them in before its one
-- all-reduce and view-out; the partial sums get an arena buffer live from
-- the first save to the fold.
local function all_reduce_last_plan(R, micro)
  return plan.from_source(H.generic(2 * R, "{ dp_replicate = " .. R .. ", dp_shard = 2 }",
    { { "l0", { { "a", { 4 } } } }, { "root", { { "c", { 4 } } } } },
    "{ micro_steps = " .. micro .. ", grad_accumulation = 'all_reduce_last' }"), "t.lua")
end

function T.all_reduce_last_reduce_scatters_every_backward_and_all_reduces_once()
  local p = all_reduce_last_plan(2, 3)
  local per_micro, l0 = {}, {}
  for _, o in ipairs(p.ops) do
    local k = per_micro[o.micro_step] or {}
    per_micro[o.micro_step] = k
    k[o.kind] = (k[o.kind] or 0) + 1
    if o.kind:sub(1, 8) == "partial_" then H.eq(o.stream, "reduce_scatter", o.kind .. " stream") end
    if o.unit == 1 and o.phase == "backward" and o.kind ~= "backward" and o.kind ~= "copy_in"
       and o.kind ~= "all_gather" and o.kind ~= "copy_out" and o.kind ~= "reshard" then
      l0[#l0 + 1] = o.micro_step .. ":" .. o.kind
    end
  end
  H.list_eq(l0, { "0:pack", "0:reduce_scatter", "0:partial_save", "1:pack", "1:reduce_scatter", "1:partial_add",
    "2:pack", "2:reduce_scatter", "2:partial_fold", "2:all_reduce", "2:view_out" }, "l0's reductions")
  for m = 0, 2 do
    H.eq(per_micro[m].reduce_scatter, 2, "reduce-scatters in micro-step " .. m)
    H.eq(per_micro[m].all_reduce, m == 2 and 2 or nil, "all-reduces in micro-step " .. m)
    H.eq(per_micro[m].view_out_add, nil, "no view_out_add")
  end
  local b = p.arena.by_unit[1].partial
  H.eq(b.bytes, 4 // 2 * 4, "partial sums: the fp32 slot")
  H.eq(#b.lives, 1, "one life")
  H.eq(p.ops[b.lives[1].first + 1].kind, "partial_save", "opened by the save")
  H.eq(p.ops[b.lives[1].last + 1].kind, "partial_fold", "closed by the fold")
end

function T.all_reduce_last_without_replicas_is_fsdp2_default()
  local a = plan.from_source(H.generic(2, "{ dp_shard = 2 }", { { "root", { { "c", { 4 } } } } },
    "{ micro_steps = 2, grad_accumulation = 'all_reduce_last' }"), "t.lua")
  local b = plan.from_source(H.generic(2, "{ dp_shard = 2 }", { { "root", { { "c", { 4 } } } } },
    "{ micro_steps = 2 }"), "t.lua")
  local ka, kb = {}, {}
  for _, o in ipairs(a.ops) do ka[#ka + 1] = o.kind end
  for _, o in ipairs(b.ops) do kb[#kb + 1] = o.kind end
  H.list_eq(ka, kb, "same ops")
  H.eq(a.arena.by_unit[0].partial.bytes, 0, "no partial sums")
end

function T.verify_rejects_lost_or_unfolded_partial_sums()
  local verify = require("gen.verify")
  local p = all_reduce_last_plan(2, 2)
  local function without(kind)
    local ops = {}
    for _, o in ipairs(p.ops) do if o.kind ~= kind then ops[#ops + 1] = o end end
    return ops
  end
  local ok, err = pcall(verify.schedule, p.layout, without("partial_fold"), p.fsdp)
  H.eq(ok, false, "a missing fold must fail")
  assert(tostring(err):find("not folded in", 1, true), tostring(err))
  ok, err = pcall(verify.schedule, p.layout, without("partial_save"), p.fsdp)
  H.eq(ok, false, "a missing save must fail")
  assert(tostring(err):find("l0", 1, true) or tostring(err):find("root", 1, true), tostring(err))
  -- the fold moved after the all-reduce: the all-reduce would miss the partial sums
  local ops = {}
  for _, o in ipairs(p.ops) do ops[#ops + 1] = o end
  for i, o in ipairs(ops) do
    if o.kind == "partial_fold" then ops[i], ops[i + 1] = ops[i + 1], ops[i]; break end
  end
  ok, err = pcall(verify.schedule, p.layout, ops, p.fsdp)
  H.eq(ok, false, "an all-reduce before the fold must fail")
  assert(tostring(err):find("all_reduce of", 1, true), tostring(err))
end

-- torch.distributed.pipelining's accumulation on one stage: no reshard and no
-- reduction per backward, so a later micro-step's forward gathers nothing
-- left unsharded (a unit resharded after forward is gathered again in
-- backward), and finalize_backward reduces each unit once at the end, in
-- post-backward order (layers last to first, the root last).
function T.step_end_keeps_units_unsharded_and_reduces_once_at_the_end()
  local p = plan.from_source(H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }",
    { { "l0", { { "a", { 4 } } } }, { "l1", { { "b", { 4 } } } }, { "root", { { "c", { 4 } } } } },
    "{ micro_steps = 3, grad_accumulation = 'step_end' }"), "t.lua")
  local per, red = {}, {}
  for _, o in ipairs(p.ops) do
    local k = (per[o.micro_step] or {})
    per[o.micro_step] = k
    k[o.phase .. ":" .. o.kind] = (k[o.phase .. ":" .. o.kind] or 0) + 1
    if o.kind == "reduce_scatter" then red[#red + 1] = p.layout.units[o.unit + 1].name .. "@" .. o.micro_step end
  end
  H.eq(per[0]["forward:all_gather"], 3, "micro-step 0 gathers every unit in forward")
  for m = 1, 2 do
    H.eq(per[m]["forward:all_gather"], nil, "micro-step " .. m .. " gathers nothing in forward")
  end
  H.eq(per[1]["backward:reshard"], nil, "no reshard after backward in micro-step 1")
  H.eq(per[2]["backward:reshard"], 3, "the finalization reshards every unit once")
  H.eq(per[1]["backward:all_gather"], 2, "the two layers, resharded after forward, gathered again in backward")
  H.list_eq(red, { "l1@2", "l0@2", "root@2" }, "one reduction per unit after the last backward, root last")
  local last_backward = 0
  for _, o in ipairs(p.ops) do if o.kind == "backward" then last_backward = o.seq end end
  for _, o in ipairs(p.ops) do
    if o.kind == "pack" then assert(o.seq > last_backward, "pack before the last backward") end
  end
end

function T.grad_accumulation_typo_suggests()
  H.plan_fails(H.generic(2, "{ dp_shard = 2 }", { { "root", { { "c", { 4 } } } } },
    "{ micro_steps = 2, grad_accumulation = 'sync_lst' }"), "fsdp.grad_accumulation", 'did you mean "sync_last"')
end

function T.single_rank_issues_no_collective_group()
  local p = plan.from_file("plans/single.lua")
  for _, o in ipairs(p.ops) do H.eq(o.group, nil, "op " .. o.seq .. " group") end
end

function T.verify_rejects_broken_schedule()
  local verify = require("gen.verify")
  local p = plan.from_file("plans/llama_tiny.lua") -- a cast on the all-gather: copy-in, all-gather, copy-out
  -- Drop the first backward re-gather (copy_in + all_gather + copy_out of
  -- layers.2): its backward would then run on resharded parameters.
  local ops, unit, dropping = {}, nil, { copy_in = true, all_gather = true, copy_out = true }
  for _, o in ipairs(p.ops) do
    if not unit and o.phase == "backward" and o.kind == "copy_in" then unit = o.unit end
    if unit and o.unit == unit and dropping[o.kind] then dropping[o.kind] = nil else ops[#ops + 1] = o end
  end
  H.eq(#ops, #p.ops - 3, "three ops dropped")
  local ok, err = pcall(verify.schedule, p.layout, ops, p.fsdp)
  H.eq(ok, false, "verification must fail")
  assert(tostring(err):find("on sharded params", 1, true), tostring(err))
end

function T.verify_rejects_bad_offsets()
  local verify = require("gen.verify")
  local p = plan.from_file("plans/fsdp4.lua")
  p.layout.units[2].params[3].offset = p.layout.units[2].params[3].offset + 1
  local ok = pcall(verify.coverage, p.layout)
  H.eq(ok, false, "overlapping offsets must fail")
end

-- Zero copy-in: where the stored dtype is the all-gather dtype the
-- all-gather reads the sharded storage itself (no copy-in op), the
-- all-gather buffer lives from the all-gather, plan.c and plan.json say
-- so, SCHEDULE.md counts what it saves; with a cast nothing changes, and
-- the collectives (kind, group, count, dtype) are the same either way.
function T.zero_copy_in_where_the_dtype_does_not_change()
  local audit = require("gen.audit")
  local p = plan.from_file("plans/fsdp4.lua") -- fp32 stored and gathered
  local ag = 0
  for _, o in ipairs(p.ops) do
    assert(o.kind ~= "copy_in", "fsdp4 op " .. o.seq .. " is a copy-in")
    if o.kind == "all_gather" then
      ag = ag + 1
      H.eq(o.from_sharded, true, "all_gather " .. o.seq .. " reads the shards")
    end
  end
  assert(ag > 0)
  local opened = 0
  for _, u in ipairs(p.layout.units) do
    local b = p.arena.by_unit[u.index] and p.arena.by_unit[u.index].ag
    for _, life in ipairs(b and b.lives or {}) do
      H.eq(p.ops[life.first + 1].kind, "all_gather", u.name .. "'s all-gather buffer opens at its all-gather")
      opened = opened + 1
    end
  end
  H.eq(opened, ag, "one all-gather buffer life per all-gather")
  local zc = audit.zero_copy_in(p)
  H.eq(zc.ops, ag, "every all-gather saved its copy-in")
  local files = audit.files(p, audit.fingerprint(p))
  assert(files["SCHEDULE.md"]:find("zero copy-in: " .. ag .. " of " .. ag .. " all-gathers", 1, true), "SCHEDULE.md")
  assert(files["plan.json"]:find('"input": "sharded"', 1, true) or files["plan.json"]:find('"input":"sharded"', 1, true),
    "plan.json marks them")
  local cast = plan.from_file("plans/llama_tiny.lua") -- fp32 stored, bf16 gathered
  local copies = 0
  for _, o in ipairs(cast.ops) do
    if o.kind == "copy_in" then copies = copies + 1 end
    H.eq(o.from_sharded, nil, "llama_tiny op " .. o.seq)
  end
  assert(copies > 0, "a cast keeps its copy-in")
  H.eq(audit.zero_copy_in(cast).ops, 0, "nothing saved with a cast")
end

return T
