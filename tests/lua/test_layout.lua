local H = require("helpers")
local layout = require("gen.parallel.fsdp_layout")
local plan = require("gen.plan")
local llama = require("gen.models.llama")
local T = {}

local function P(shape, shard_dim) return { name = "p", shape = shape, dtype = "fp32", shard_dim = shard_dim or 0 } end

-- fsdp_semantics.md worked example A: (5,3) on W = 4.
function T.example_a_5x3_w4()
  local q = layout.param(nil, P({ 5, 3 }), 4, "x")
  H.eq(q.chunk, 2, "chunk"); H.eq(q.padded, 6, "padded"); H.eq(q.run, 6, "run")
  local lens = {}
  for r = 0, 3 do lens[#lens + 1] = layout.valid(q, r) end
  H.list_eq(lens, { 6, 6, 3, 0 }, "valid elements per rank")
  H.eq(layout.local_rows(q, 2), 1, "rank 2 holds one row")
end

-- Example B: (10,) on W = 4 -> 3,3,3,1 (not balanced).
function T.example_b_10_w4()
  local q = layout.param(nil, P({ 10 }), 4, "x")
  local lens = {}
  for r = 0, 3 do lens[#lens + 1] = layout.valid(q, r) end
  H.list_eq(lens, { 3, 3, 3, 1 }, "valid")
end

function T.six_on_four_leaves_last_rank_empty()
  local q = layout.param(nil, P({ 6 }), 4, "x")
  H.eq(layout.valid(q, 3), 0, "rank 3 empty although d >= W")
end

function T.shard_dim_1_even()
  local q = layout.param(nil, P({ 8, 6 }, 1), 3, "x")
  H.eq(q.outer, 8, "outer"); H.eq(q.run, 2, "run"); H.eq(q.padded, 16, "padded")
end

function T.shard_dim_1_uneven_rejected()
  H.plan_fails(H.generic(4, "{ dp_shard = 4 }", { { "root", { { "w", { 8, 6 }, 1 } } } }),
    "FSDP does not support uneven sharding on dim 1", "dp_shard=4")
end

-- Group example 2.6: A (5,3) then B (10,), W = 4 -> offsets 0, 6; total 9.
function T.group_offsets()
  local p = plan.from_source(H.generic(4, "{ dp_shard = 4 }", { { "root", { { "A", { 5, 3 } }, { "B", { 10 } } } } }), "t.lua")
  local u = p.layout.units[1]
  H.eq(u.params[1].offset, 0); H.eq(u.params[2].offset, 6); H.eq(u.total, 9, "slot numel")
end

function T.forward_order_root_first()
  local p = plan.from_source(H.generic(2, "{ dp_shard = 2 }",
    { { "l0", { { "a", { 4 } } } }, { "l1", { { "b", { 4 } } } }, { "root", { { "c", { 4 } } } } }), "t.lua")
  H.eq(p.layout.units[1].name, "root"); H.eq(p.layout.units[2].name, "l0"); H.eq(p.layout.units[3].name, "l1")
  H.eq(p.layout.units[1].reshard_after_forward, false, "root never reshards after forward")
end

function T.reduction_factors()
  local r = layout.reduction(nil, false, "fp32", 4, 2)
  H.eq(r.rs_op, "avg"); H.eq(r.ar_op, "avg")
  H.eq(layout.reduction(nil, false, "fp32", 1, 1).rs_op, "sum", "dp == 1 uses SUM")
  local pre_post = { [8] = { 4, 2 }, [16] = { 4, 4 }, [32] = { 8, 4 }, [64] = { 8, 8 }, [128] = { 16, 8 } }
  for dp, want in pairs(pre_post) do
    local f = layout.reduction(nil, false, "fp16", dp, 1)
    H.eq(f.rs_op, "sum", "fp16 uses SUM")
    H.eq(f.pre_divide, want[1], "pre for " .. dp); H.eq(f.post_divide, want[2], "post for " .. dp)
  end
  local six = layout.reduction(nil, false, "fp16", 6, 1)
  H.eq(six.pre_divide, 4, "pre for 6 overshoots"); H.eq(six.post_divide, 1.5, "post for 6")
end

-- set_gradient_divide_factor / set_force_sum_reduction_for_comms, each
-- branch of torch 2.15's _get_gradient_divide_factors (_fsdp_collectives.py:945-1002).
function T.reduction_factor_and_forced_sum()
  local function red(...)
    local r = assert(layout.reduction(...))
    return string.format("%s %s %g %g %s", r.rs_op, r.ar_op, r.pre_divide, r.post_divide,
      r.premul and string.format("%g", r.premul) or "nil")
  end
  -- fp32/bf16, a factor: AVG where it is the shard group's size, else PREMUL_SUM(1/f); the all-reduce SUM
  H.eq(red(4, false, "fp32", 4, 2), "avg sum 1 1 nil", "factor == W: AVG then SUM")
  H.eq(red(8, false, "bf16", 4, 2), "premul_sum sum 1 1 8", "factor != W: PREMUL_SUM(1/8)")
  H.eq(red(1.5, false, "fp32", 2, 1), "premul_sum sum 1 1 1.5", "non-integer factor")
  H.eq(red(1, false, "fp32", 4, 1), "sum sum 1 1 nil", "factor 1: PREMUL_SUM(1.0) is a SUM")
  H.eq(red(3, false, "fp32", 1, 2), "sum sum 3 1 nil", "one shard rank: the copy divides")
  -- forced sum: everything after the collectives (fp32/bf16), or fp16's split
  H.eq(red(nil, true, "fp32", 4, 2), "sum sum 1 8 nil", "force: post-divide by the dp size")
  H.eq(red(6, true, "bf16", 3, 1), "sum sum 1 6 nil", "force with a factor")
  H.eq(red(nil, true, "fp32", 1, 1), "sum sum 1 1 nil", "force at one rank divides by 1")
  H.eq(red(3, true, "fp32", 1, 2), "sum sum 3 3 nil", "force at one shard rank: copy and post-divide both")
  H.eq(red(12, false, "fp16", 4, 1), "sum sum 4 3 nil", "fp16 with a factor: its own split")
  H.eq(red(2.5, true, "fp16", 4, 1), "sum sum 1 2.5 nil", "a factor no power of two divides")
  local none, why = layout.reduction(4, false, "fp16", 1, 2)
  H.eq(none, nil, "fp16 at one shard rank with a factor divides twice")
  assert(why:find("_fsdp_collectives.py", 1, true), why)
end

-- The setters as plan fields: plan-wide, a unit's own overriding them, and
-- the reduce-scatter ops carrying PREMUL_SUM's factor; refusals in one line.
local function gdiv_plan(unit_extra, fsdp, parallel, reduce_dtype)
  return string.format([[return { world_size = 8, parallel = %s,
  model = { family = "generic", units = {
    { name = "a", params = { { name = "a.w", shape = { 8, 3 } } }%s },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } } } },
  fsdp = { %s reduce_dtype = %q } }]], parallel or "{ dp_replicate = 2, dp_shard = 4 }", unit_extra or "", fsdp or "",
    reduce_dtype or "fp32")
end

function T.divide_factor_plan_fields()
  local p = plan.from_source(gdiv_plan(", gradient_divide_factor = 3", "gradient_divide_factor = 4,"), "plans/t.lua")
  local by = {}
  for _, u in ipairs(p.layout.units) do by[u.name] = u end
  H.eq(by.root.rs_op, "avg", "the plan's factor 4 = dp_shard: AVG"); H.eq(by.root.ar_op, "sum", "then SUM")
  H.eq(by.a.rs_op, "premul_sum", "the unit's own factor 3"); H.eq(by.a.premul, 3, "its factor")
  local premul_ops = 0
  for _, o in ipairs(p.ops) do
    if o.kind == "reduce_scatter" and o.unit == by.a.index then
      H.eq(o.reduce_op, "premul_sum", "the unit's reduce-scatter"); H.eq(o.premul, 3, "carries the factor")
      premul_ops = premul_ops + 1
    end
  end
  H.eq(premul_ops, 1, "one reduce-scatter of unit a")
  -- forced sum plan-wide, a unit opting out
  local q = plan.from_source(gdiv_plan(", force_sum_reduction_for_comms = false",
    "force_sum_reduction_for_comms = true,"), "plans/t.lua")
  for _, u in ipairs(q.layout.units) do by[u.name] = u end
  H.eq(by.root.post_divide, 8, "forced: SUM, divide by W x R after"); H.eq(by.root.rs_op, "sum", "forced SUM")
  H.eq(by.a.rs_op, "avg", "the unit's own false keeps FSDP2's AVG")
end

function T.divide_factor_refusals()
  H.plan_fails(gdiv_plan(nil, "gradient_divide_factor = 2, reduce_op = \"sum\","), "fsdp.gradient_divide_factor",
    "reduce_op")
  H.plan_fails(gdiv_plan(", gradient_divide_factor = 0"), "model.units[1].gradient_divide_factor", "> 0")
  H.plan_fails(gdiv_plan(", gradient_divide_factor = 4", nil, "{ dp_replicate = 8 }", "fp16"),
    "model.units[1].gradient_divide_factor", "_fsdp_collectives.py")
  H.plan_fails([[return { world_size = 2, parallel = { dp_shard = 2 }, model = { family = "generic", units = {
    { name = "a", params = { { name = "a.w", shape = { 4 } } } },
    { name = "root", params = {}, force_sum_reduction_for_comms = true } } } }]],
    "model.units[2].force_sum_reduction_for_comms", "no parameters")
end

-- A unit's own grad_accumulation (set_requires_gradient_sync /
-- set_requires_all_reduce with recurse=False): its reductions follow it,
-- the others the plan's; refusals where FSDP2 or the pipeline overrides it.
local function acc_plan(units_extra, fsdp, parallel)
  return string.format([[return { world_size = 4, parallel = %s,
  model = { family = "generic", units = {
    { name = "a", params = { { name = "a.w", shape = { 8, 3 } } }%s },
    { name = "b", params = { { name = "b.w", shape = { 4 } } }%s },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } } } },
  fsdp = { micro_steps = 3, %s } }]], parallel or "{ dp_replicate = 2, dp_shard = 2 }", units_extra[1] or "",
    units_extra[2] or "", fsdp or "")
end

function T.unit_grad_accumulation()
  local p = plan.from_source(acc_plan({ ', grad_accumulation = "sync_last"', ', grad_accumulation = "all_reduce_last"' },
    'grad_accumulation = "fsdp2_default"'), "plans/t.lua")
  local idx = {}
  for _, u in ipairs(p.layout.units) do idx[u.index] = u.name end
  local seen = {}
  for _, o in ipairs(p.ops) do
    local k = idx[o.unit] .. ":" .. o.kind
    if o.kind == "reduce_scatter" or o.kind == "all_reduce" or o.kind:find("^partial_") then
      seen[k] = (seen[k] or "") .. o.micro_step
    end
  end
  H.eq(seen["a:reduce_scatter"], "2", "sync_last unit: the last micro-step only")
  H.eq(seen["b:reduce_scatter"], "012", "all_reduce_last: every micro-step reduce-scatters")
  H.eq(seen["b:all_reduce"], "2", "... and all-reduces on the last")
  H.eq((seen["b:partial_save"] or "") .. (seen["b:partial_add"] or "") .. seen["b:partial_fold"], "012",
    "its partial sums")
  H.eq(seen["root:all_reduce"], "012", "the plan's fsdp2_default for the rest")
  H.plan_fails(acc_plan({ ', grad_accumulation = "all_reduce_last"' }, nil, "{ dp_shard = 4 }"),
    "model.units[1].grad_accumulation", "dp_replicate")
  H.plan_fails(acc_plan({ ', grad_accumulation = "step_end"' }), "model.units[1].grad_accumulation")
  H.plan_fails(acc_plan({ ', grad_accumulation = "sync_last"' }, 'grad_accumulation = "step_end"'),
    "model.units[1].grad_accumulation", "step_end")
end

-- Frozen parameters (requires_grad=False, torchtitan's LoRA): still in the
-- slot and every all-gather, out of the reduce-scatter row (the trainable
-- ones' padded shards back to back), no grads or optimizer state; a unit
-- left without a trainable one reduces nothing. The same plan without
-- frozen reduces more (the mutant the live peer would catch).
function T.frozen_params()
  local src = [[return { world_size = 4, parallel = { dp_replicate = 2, dp_shard = 2 }, model = { family = "generic",
    units = {
    { name = "a", params = { { name = "a.w", shape = { 8, 3 }%s }, { name = "a.l", shape = { 2, 3 } },
                             { name = "a.n", shape = { 5 }%s } } },
    { name = "b", params = { { name = "b.w", shape = { 10 }%s } } },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } } } },
    fsdp = { micro_steps = 2, grad_accumulation = "all_reduce_last" } }]]
  local F = ", frozen = true"
  local with = plan.from_source(string.format(src, F, F, F), "plans/t.lua")
  local without = plan.from_source(string.format(src, "", "", ""), "plans/t.lua")
  local function unit(p, n) for _, u in ipairs(p.layout.units) do if u.name == n then return u end end end
  local a, a0 = unit(with, "a"), unit(without, "a")
  H.eq(a.total, a0.total, "the slot keeps the frozen parameters"); H.eq(a.total, 12 + 3 + 3, "a.w 12, a.l 3, a.n 3")
  H.eq(a.rs_total, 3, "a reduces a.l alone"); H.eq(a0.rs_total, a0.total, "without frozen: the slot")
  H.eq(a.params[2].rs_offset, 0, "a.l first in the row"); H.eq(a.grads_numel, 8, "a.l's grads only (aligned)")
  local function counts(p, u)
    local c = {}
    for _, o in ipairs(p.ops) do
      if o.unit == u.index then c[o.kind] = c[o.kind] or o.count or true end
    end
    return c
  end
  local ca, cb = counts(with, a), counts(with, unit(with, "b"))
  H.eq(ca.all_gather, a.total, "a gathers its whole slot, frozen parameters included")
  H.eq(ca.reduce_scatter, 3, "a reduce-scatters a.l only"); H.eq(ca.all_reduce, 3, "and all-reduces it")
  H.eq(counts(without, a0).reduce_scatter, a0.total, "the mutant (nothing frozen) reduces the whole slot")
  H.eq(cb.all_gather ~= nil and cb.backward ~= nil, true, "b is still gathered and computes its backward")
  for _, k in ipairs({ "pack", "reduce_scatter", "all_reduce", "partial_save", "partial_fold", "view_out" }) do
    H.eq(cb[k], nil, "b, all frozen, issues no " .. k)
  end
  local memory = require("gen.memory")
  local s = { optimizer = "adamw", gpu_memory_bytes = 1e12 }
  local mw, mwo = memory.whole_rank(with, s, {}), memory.whole_rank(without, s, {})
  H.eq(mw.params_bytes, mwo.params_bytes, "frozen parameters keep their shards")
  H.eq(mwo.grads_bytes - mw.grads_bytes, 4 * (12 + 3 + 5), "no sharded grads for a.w, a.n, b.w (b.w: 5 of 10)")
  H.eq(mwo.optimizer_bytes - mw.optimizer_bytes, 2 * 4 * (12 + 3 + 5), "nor AdamW state")
  H.eq(with.memory.arena_bytes < without.memory.arena_bytes, true, "smaller reduce-scatter buffers")
  -- the optimizer step (gen/compute.lua optimizer_us) reads and writes the trainable shards alone: torch.optim
  -- skips a parameter whose .grad is None
  local compute = require("gen.compute")
  local so = { optimizer = "adamw", hbm_GBps = 1 }
  H.eq(math.floor((compute.optimizer_us(without, so) - compute.optimizer_us(with, so)) * 1e3 + 0.5),
    7 * 4 * (12 + 3 + 5), "no optimizer step over a.w, a.n, b.w")
  -- a frozen weight's backward: the input-gradient GEMM alone (no dW): a.w (8 x 3) costs 2 x 24 x T FLOPs and
  -- its GEMM's time less there, its forward the same
  local sw, swo = compute.settings(with), compute.settings(without)
  local uw, uwo = compute.units(with, sw), compute.units(without, swo)
  H.eq(uw[a.index].fwd, uwo[a0.index].fwd, "the forward unchanged")
  H.eq(uwo[a0.index].bwd - uw[a.index].bwd, 2 * 24 * sw.tokens, "a.w's dW FLOPs skipped")
  assert(uw[a.index].bwd_us < uwo[a0.index].bwd_us, "and its time")
  H.plan_fails(string.format(src, ", frozen = true, ignored = true", "", ""), "model.units[1].params[1].frozen",
    "ignored")
end

-- The frozen prefix (issue 41): with an input needing no gradient, the
-- leading all-frozen units run no pre-backward (fsdp_layout.frozen_prefix,
-- a pure function over the units): no backward all-gather of their own, no
-- backward, no prefetch from them; the next unit's prefetch of the last
-- of them is waited on at the final callback, where they and the first
-- trainable unit post-backward in forward order. The same plan with the
-- input needing a gradient (the mutant) gathers emb in backward too.
function T.frozen_prefix()
  local function U(name, np, nf, root) return { name = name, params = np, nfrozen = nf, is_root = root } end
  local us = { U("root", {}, nil, true), U("e", { 1 }, 1), U("a", { 1, 2 }, 2), U("b", { 1, 2 }, 1), U("c", { 1 }) }
  H.eq(layout.frozen_prefix(us, false), 2, "e and a"); H.eq(us[2].no_pre_backward and us[3].no_pre_backward, true, "")
  H.eq(us[4].no_pre_backward, nil, "b has a trainable parameter")
  H.eq(us[4].final_callback and not us[5].final_callback, true, "b's input needs no gradient, c's does")
  H.eq(layout.frozen_prefix({ U("root", {}, nil, true), U("e", { 1 }, 1), U("c", { 1 }) }, true), 0, "input grad")
  H.eq(layout.frozen_prefix({ U("root", { 1 }, nil, true), U("e", { 1 }, 1), U("c", { 1 }) }, false), 0,
    "a trainable root acts on the input first")
  local fresh = { U("root", {}, nil, true), U("e", { 1 }), U("c", { 1 }) }
  H.eq(layout.frozen_prefix(fresh, false), 0, "no frozen unit first"); H.eq(fresh[2].final_callback, nil, "none marked")
  local src = [[return { world_size = 4, parallel = { dp_shard = 4 }, model = { family = "generic"%s, units = {
    { name = "emb", params = { { name = "emb.w", shape = { 8, 4 }, frozen = true } } },
    { name = "l0", params = { { name = "l0.w", shape = { 6, 5 }, frozen = true } } },
    { name = "l1", params = { { name = "l1.w", shape = { 7, 3 }, frozen = true }, { name = "l1.a", shape = { 2, 3 } } } },
    { name = "root", params = {} } } } }]]
  local function seq(p)
    local names, out = {}, {}
    for _, u in ipairs(p.layout.units) do names[u.index] = u.name end
    for _, o in ipairs(p.ops) do
      if o.phase ~= "forward" and o.kind ~= "pack" and o.kind ~= "view_out" then
        out[#out + 1] = o.kind .. " " .. names[o.unit]
      end
    end
    return table.concat(out, ", ")
  end
  local with = plan.from_source(string.format(src, ", input_requires_grad = false"), "plans/t.lua")
  H.eq(seq(with), "all_gather l1, copy_out l1, all_gather l0, backward l1, copy_out l0, reshard l0, reshard l1, "
    .. "reduce_scatter l1", "emb and l0 run no pre-backward; l0's prefetch waited at the final callback")
  local without = plan.from_source(string.format(src, ""), "plans/t.lua")
  H.eq(seq(without), "all_gather l1, copy_out l1, all_gather l0, backward l1, reshard l1, reduce_scatter l1, "
    .. "copy_out l0, all_gather emb, backward l0, reshard l0, copy_out emb, backward emb, reshard emb",
    "the mutant: every unit pre-backwards, emb gathered in backward")
  H.plan_fails(string.format(src, ", input_requires_grad = false"):gsub('{ name = "l1.a", shape = { 2, 3 } }',
    '{ name = "l1.a", shape = { 2, 3 }, frozen = true }'), "model.input_requires_grad", "unfreeze")
  -- (step_end: FSDP2 carries the prefetch's pending all-gather into the next micro-step; refused)
  H.plan_fails(string.format(src, ", input_requires_grad = false"):gsub("} }$",
    '}, fsdp = { micro_steps = 2, grad_accumulation = "step_end" } }'), "model.input_requires_grad", "step_end")
end

-- fully_shard's ignored_params: out of the slot and every collective, whole
-- in the whole-rank memory; a unit left with none issues nothing.
function T.ignored_params()
  local src = [[return { world_size = 4, parallel = { dp_shard = 4 }, model = { family = "generic", units = {
    { name = "a", params = { { name = "a.w", shape = { 8, 3 } }, { name = "a.f", shape = { 5, 2 }%s } } },
    { name = "b", params = { { name = "b.t", shape = { 10 }, ignored = true } } },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } } } } }]]
  local with = plan.from_source(string.format(src, ", ignored = true"), "plans/t.lua")
  local without = plan.from_source(string.format(src, ""), "plans/t.lua")
  local function unit(p, n) for _, u in ipairs(p.layout.units) do if u.name == n then return u end end end
  H.eq(#unit(with, "a").params, 1, "a's slot holds a.w alone"); H.eq(unit(with, "a").total, 6, "a.w's 24 / 4")
  H.eq(unit(without, "a").total, 6 + 4, "a.f sharded too without ignored (2 of its 5 rows)")
  H.eq(unit(with, "a").ignored[1].numel, 10, "a.f whole"); H.eq(#unit(with, "b").params, 0, "b: nothing sharded")
  for _, o in ipairs(with.ops) do H.eq(o.unit ~= unit(with, "b").index, true, "b issues nothing") end
  local memory = require("gen.memory")
  local s = { optimizer = "none", gpu_memory_bytes = 1e12 }
  local pw = memory.whole_rank(with, s, {}).params_bytes
  local pwo = memory.whole_rank(without, s, {}).params_bytes
  H.eq(pw - pwo, 4 * (10 - 4), "a.f ignored: whole (10) instead of its shard (4)")
  H.plan_fails(string.format(src, ", ignored = true, shard_dim = 1"), "model.units[1].params[2].shard_dim",
    "ignored")
  H.plan_fails([[return { world_size = 2, model = { family = "generic", units = {
    { name = "root", params = { { name = "r.w", shape = { 6 }, ignored = true } } } } } }]], "model.units",
    "every parameter is ignored")
end

-- torch 2.15's FSDP2 keeps unsharded grads in reduce_dtype (the unsharded
-- parameter's grad_dtype), a wider one only while micro-steps accumulate:
-- the grads buffer takes that dtype and its bytes.
function T.micro_steps_accumulate_grads_in_reduce_dtype()
  local units = { { "root", { { "w", { 10, 3 } }, { "b", { 5 } } } } }
  local function unit_of(fsdp)
    local p = plan.from_source(H.generic(2, "{ dp_shard = 2 }", units, fsdp), "t.lua")
    return p.layout.units[1], p.arena.by_unit[0].grads.bytes
  end
  local u, bytes = unit_of("{ param_dtype = 'bf16', reduce_dtype = 'fp32', micro_steps = 2, grad_accumulation = 'sync_last' }")
  H.eq(u.ag_dtype, "bf16"); H.eq(u.grad_dtype, "fp32", "accumulated in reduce_dtype")
  H.eq(u.grads_numel, 40, "w at 0, b at 32 (8-aligned)")
  H.eq(bytes, 40 * 4, "grads buffer bytes in fp32")
  u, bytes = unit_of("{ param_dtype = 'bf16', reduce_dtype = 'fp32' }")
  H.eq(u.grad_dtype, "bf16", "one micro-step: autograd's dtype")
  H.eq(bytes, 40 * 2, "grads buffer bytes in bf16")
  u = unit_of("{ reduce_dtype = 'bf16', micro_steps = 3, grad_accumulation = 'sync_last' }")
  H.eq(u.ag_dtype, "fp32"); H.eq(u.grad_dtype, "bf16", "a narrower reduce_dtype too (to_accumulated_grad casts down)")
  -- FSDP2's default reduces every micro-step: nothing accumulates unsharded.
  u, bytes = unit_of("{ param_dtype = 'bf16', reduce_dtype = 'fp32', micro_steps = 2 }")
  H.eq(u.grad_dtype, "bf16", "reducing every micro-step"); H.eq(bytes, 40 * 2, "grads in bf16")
  -- A reduce_dtype not wider than the compute dtype: autograd's grads are cast to it
  -- (the unsharded parameter's grad_dtype), accumulating or not.
  u, bytes = unit_of("{ reduce_dtype = 'fp16' }")
  H.eq(u.grad_dtype, "fp16", "narrower reduce_dtype, one micro-step"); H.eq(bytes, 40 * 2, "grads in fp16")
  -- torch 2.15: without reduce_dtype the gradients reduce in the parameters' own dtype.
  u, bytes = unit_of("{ param_dtype = 'bf16', micro_steps = 2, grad_accumulation = 'sync_last' }")
  H.eq(u.reduce_dtype, "fp32", "reduce_dtype defaults to the original dtype"); H.eq(u.grad_dtype, "fp32")
  H.eq(bytes, 40 * 4, "grads accumulating in fp32")
end

function T.mixed_dtype_unit_rejected()
  local src = [[return { world_size = 2, parallel = { dp_shard = 2 }, model = { family = "generic", units = {
    { name = "root", params = { { name = "a", shape = { 4 } }, { name = "b", shape = { 4 }, dtype = "bf16" } } } } } }]]
  H.plan_fails(src, "mixes parameter dtypes", "FSDP expects uniform original parameter dtype")
end

function T.llama_shapes()
  H.eq(llama.ffn_hidden(4096, 1.3, 1024), 14336, "8B hidden")
  H.eq(llama.ffn_hidden(8192, 1.3, 4096), 28672, "70B hidden")
  H.eq(llama.ffn_hidden(16384, 1.2, 4096), 53248, "405B hidden")
  local p = plan.from_file("plans/llama70b.lua")
  local n = 0
  for _, u in ipairs(p.layout.units) do for _, q in ipairs(u.params) do n = n + q.full_numel end end
  H.eq(n, 70553706496, "Llama 3 70B parameter count")
  -- torchtitan's wrapping, in forward order: the root (no parameters), the
  -- embedding, 80 blocks, [norm, output] kept unsharded after forward.
  H.eq(#p.layout.units, 83, "root + embedding + 80 layers + [norm, output]")
  H.eq(#p.layout.units[1].params, 0, "the root owns no parameters")
  H.eq(p.layout.units[2].params[1].name, "tok_embeddings.weight")
  local l0 = p.layout.units[3]
  H.eq(l0.params[1].name, "layers.0.attention.wq.weight")
  H.eq(l0.params[9].name, "layers.0.ffn_norm.weight")
  H.list_eq(l0.params[2].full_shape, { 1024, 8192 }, "wk shape (8 kv heads x 128)")
  H.list_eq(l0.params[2].shape, { 128, 8192 }, "wk TP-local shape (column-wise over tp = 8)")
  local last = p.layout.units[83]
  H.eq(last.name, "norm_output", "last unit")
  H.eq(last.params[2].name, "output.weight")
  H.eq(last.reshard_after_forward, false, "[norm, output] not resharded after forward")
  -- The root issues nothing: no op names it.
  for _, o in ipairs(p.ops) do H.eq(o.unit ~= 0, true, "op " .. o.seq .. " of the empty root") end
end

-- torch 2.15's FSDP2 cannot reduce an empty TP-local gradient (_chunk_cat:
-- "expects non-empty tensor"; on Shard(1) lazy init raises first), as the
-- live peer showed: a TP split leaving a TP rank no rows is refused.
function T.empty_tp_local_tensor_refused()
  local function src(shard_dim)
    return "return { world_size = 8, parallel = { dp_shard = 2, tp = 4 }, model = { family = 'generic', units = {\n"
      .. "{ name = 'u0', params = { { name = 'w', shape = { 3, 8 }, shard_dim = " .. shard_dim .. ", tp = 'colwise' } } },\n"
      .. "{ name = 'root', params = {} } } } }"
  end
  H.plan_fails(src(0), "plans/t.lua:2: model.units[1].params[1].tp: the TP split leaves w an empty TP-local tensor "
    .. "(shape 0x8)", "expects non-empty tensor")
  H.plan_fails(src(1), "plans/t.lua:2: model.units[1].params[1].tp:", "Shard(1) requires even sharding")
  H.plan_fails((src(0):gsub("3, 8", "6, 8")), "empty TP-local tensor (shape 0x8)") -- 2, 2, 2 and none
  H.eq(require("gen.plan").from_source((src(0):gsub("3, 8", "7, 8")), "plans/t.lua").world_size, 8,
    "7 rows over tp = 4: 2, 2, 2, 1")
end

function T.llama_unknown_size()
  H.plan_fails("return { world_size = 8, parallel = { dp_shard = -1 }, model = { family = 'llama', size = '7b' } }",
    "unknown Llama 3 size", "8b")
end

return T
