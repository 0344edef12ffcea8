-- torchtitan's ChunkedLossWrapper in the step (gen/parallel/fsdp_schedule.lua,
-- gen/parallel/fsdp.lua's chunked_loss): which plans follow it, the order of
-- the [norm, lm_head] unit's ops, the partial reductions' sizes, the proofs
-- that catch a broken one, and what the tables and plan.json say of them.
-- tests/titan/test_chunked_loss.py holds the same order to torchtitan's run.
local H = require("helpers")
local plan = require("gen.plan")
local verify = require("gen.verify")
local emit = require("gen.emit")
local audit = require("gen.audit")
local json = require("gen.json")

local T = {}

-- A plan file's source with an edit applied to its table p.
local function variant(path, edit)
  return "local p = (function() " .. H.read(path) .. "\nend)()\n" .. (edit or "") .. "\nreturn p"
end

local function ops_of(p, unit_name)
  local out = {}
  for _, o in ipairs(p.ops) do
    if p.layout.units[o.unit + 1].name == unit_name then out[#out + 1] = o end
  end
  return out
end

-- One micro-step's ops of a unit as "kind[part]" words.
local function words(ops, m)
  local t = {}
  for _, o in ipairs(ops) do
    if o.micro_step == m then
      t[#t + 1] = o.kind .. (o.part_first and ("[" .. o.part_first .. "]") or "")
    end
  end
  return table.concat(t, " ")
end

local function has_parts(p)
  for _, o in ipairs(p.ops) do
    if o.part_first then return true end
  end
  return false
end

-- llama_tiny_tp (HSDP 2 x 2 x TP 2, the default 8 chunks): the head unit
-- gathered three times, lm_head (part 1) reduced in the loss, the norm
-- (part 0) in the backward, each collective of its part's padded shards.
function T.llama_order_follows_the_wrapper()
  local p = plan.from_file("plans/llama_tiny_tp.lua")
  local head = ops_of(p, "norm_output")
  H.eq(words(head, 0), "copy_in all_gather copy_out forward[0] reshard copy_in all_gather copy_out forward[1] "
    .. "tp_all_gather tp_all_reduce tp_all_reduce tp_all_reduce backward[1] tp_reduce_scatter pack[1] "
    .. "reduce_scatter[1] all_reduce[1] view_out[1] reshard copy_in all_gather copy_out backward[0] "
    .. "tp_all_reduce reshard pack[0] reduce_scatter[0] all_reduce[0] view_out[0]", "the head unit's micro-step")
  local u = p.layout.units[head[1].unit + 1]
  H.eq(u.params[1].name, "norm.weight", "part 0")
  H.eq(u.params[2].name, "output.weight", "part 1")
  for _, o in ipairs(head) do
    if o.kind == "reduce_scatter" or o.kind == "all_reduce" then
      H.eq(o.count, u.params[o.part_first + 1].padded, o.kind .. " of part " .. o.part_first)
      assert(o.count < u.total, "a part is less than the unit")
    end
  end
  -- lm_head's reduction in the loss, before the backward's all-gather of the
  -- head (its third) and the last block's prefetch; the norm's after both
  local ags, rs, prefetch = {}, {}, nil
  for _, o in ipairs(head) do
    if o.micro_step == 0 and o.kind == "all_gather" then ags[#ags + 1] = o.seq end
    if o.micro_step == 0 and o.kind == "reduce_scatter" then rs[o.part_first] = o.seq end
  end
  for _, o in ipairs(p.ops) do
    if o.kind == "all_gather" and o.phase == "backward" and p.layout.units[o.unit + 1].name == "layers.1" then
      prefetch = o.seq
      break
    end
  end
  H.eq(#ags, 3, "the head's all-gathers")
  assert(ags[2] < rs[1] and rs[1] < ags[3] and ags[3] < prefetch and prefetch < rs[0],
    "AG, AG, RS(lm_head), AG, prefetch of the last block, RS(norm)")
  -- every other unit as before: one reduction of the whole unit
  for _, o in ipairs(p.ops) do
    if o.part_first then H.eq(p.layout.units[o.unit + 1].name, "norm_output", "only the head has parts") end
  end
end

-- loss_chunks = 1: CrossEntropyLoss's order, the head gathered once and
-- reduced whole; and the same units' tables, so only the head's ops differ.
function T.loss_chunks_one_keeps_crossentropy_order()
  local p = plan.from_source(variant("plans/llama_tiny_tp.lua", "p.training.loss_chunks = 1"),
    "plans/llama_tiny_tp.lua")
  H.eq(has_parts(p), false, "no part")
  H.eq(words(ops_of(p, "norm_output"), 0), "copy_in all_gather copy_out forward tp_all_gather tp_all_reduce "
    .. "tp_all_reduce tp_all_reduce backward tp_reduce_scatter tp_all_reduce reshard pack reduce_scatter all_reduce "
    .. "view_out", "the head unit's micro-step")
  -- the TP collectives' sequence is CrossEntropyLoss's in both (the chunks' own are not modelled)
  local c = plan.from_file("plans/llama_tiny_tp.lua")
  local function tp_seq(q)
    local t = {}
    for _, o in ipairs(q.ops) do
      if o.group == "tp" then t[#t + 1] = o.kind .. "/" .. o.count .. "/" .. o.unit end
    end
    return table.concat(t, " ")
  end
  H.eq(tp_seq(c), tp_seq(p), "TP collectives")
end

-- Which plans follow the wrapper: the llama and MoE families at ep = 1
-- (loss_chunks >= 2); a generic model (the user's loss), ep > 1 (explicit
-- prefetching, not measured), a pipeline and step_end keep CrossEntropyLoss's.
function T.which_plans_follow_it()
  H.eq(has_parts(plan.from_file("plans/llama8b.lua")), true, "llama8b")
  H.eq(has_parts(plan.from_file("plans/llama70b.lua")), true, "llama70b")
  H.eq(has_parts(plan.from_file("tests/plans/moe_dsv3_tiny.lua")), true, "deepseek_v3 at ep 1")
  H.eq(has_parts(plan.from_file("tests/plans/moe_mixtral_hsdp.lua")), true, "mixtral at ep 1")
  H.eq(has_parts(plan.from_file("plans/llama_tiny.lua")), false, "llama_tiny says loss_chunks = 1")
  H.eq(has_parts(plan.from_file("plans/mixtral8x7b.lua")), false, "ep 8")
  H.eq(has_parts(plan.from_file("plans/deepseek_v3.lua")), false, "ep 2")
  H.eq(has_parts(plan.from_file("plans/llama405b.lua")), false, "a pipeline")
  H.eq(has_parts(plan.from_source(variant("plans/fsdp4.lua", "p.training = { loss_chunks = 8 }"),
    "plans/fsdp4.lua")), false, "a generic model")
  H.eq(has_parts(plan.from_source(variant("plans/llama_tiny_tp.lua",
    "p.fsdp.micro_steps = 2 p.fsdp.grad_accumulation = 'step_end'"), "plans/llama_tiny_tp.lua")), false, "step_end")
end

-- A generic plan's [norm, lm_head] unit that says loss_head (commplan.titan's
-- plan_from_titan for a model trained with ChunkedLossWrapper, which the
-- python bridge drives) follows the wrapper as the llama family does: the
-- same words for the head unit; without loss_head, or with loss_chunks = 1,
-- CrossEntropyLoss's; a loss head of other than two parameters is refused.
local GENERIC_HEAD = [[
return {
  world_size = 4,
  parallel = { dp_shard = 4 },
  model = { family = "generic", seq_len = 16, units = {
    { name = "tok_embeddings", params = { { name = "tok_embeddings.weight", shape = { 37, 32 } } } },
    { name = "layers.0", params = { { name = "layers.0.w", shape = { 32, 32 } } } },
    { name = "norm_lm_head", reshard_after_forward = false, loss_head = true, params = {
      { name = "norm.weight", shape = { 32 } }, { name = "lm_head.weight", shape = { 37, 32 } } } },
    { name = "root", params = {} },
  } },
  training = { loss_chunks = 4 },
}
]]

function T.generic_loss_head_follows_the_wrapper()
  local p = plan.from_source(GENERIC_HEAD, "generic_head.lua")
  -- (fp32 all-gathers in place: no copy-in)
  H.eq(words(ops_of(p, "norm_lm_head"), 0), "all_gather copy_out forward[0] reshard all_gather copy_out forward[1] "
    .. "backward[1] pack[1] reduce_scatter[1] view_out[1] reshard all_gather copy_out backward[0] reshard pack[0] "
    .. "reduce_scatter[0] view_out[0]", "the generic head unit's micro-step")
  local function src(edit)
    return "local p = (function() " .. GENERIC_HEAD .. "\nend)()\n" .. edit .. "\nreturn p"
  end
  H.eq(has_parts(plan.from_source(src("p.training.loss_chunks = 1"), "g.lua")), false, "loss_chunks = 1")
  H.eq(has_parts(plan.from_source(src("p.model.units[3].loss_head = nil"), "g.lua")), false, "no loss_head")
  H.plan_fails(src("p.model.units[3].params[2] = nil"), "model.units[3].loss_head", "1 parameters",
    "[norm, lm_head]")
end

-- HSDP's all_reduce_last would keep partial sums of parameter subsets:
-- refused with the wrapper, planned with loss_chunks = 1.
function T.all_reduce_last_with_the_wrapper_is_refused()
  local edit = "p.fsdp.micro_steps = 2 p.fsdp.grad_accumulation = 'all_reduce_last'"
  H.plan_fails(variant("plans/llama_tiny_tp.lua", edit), "fsdp.grad_accumulation", "ChunkedLossWrapper",
    "training.loss_chunks = 8", "set training.loss_chunks = 1")
  local p = plan.from_source(variant("plans/llama_tiny_tp.lua", edit .. " p.training.loss_chunks = 1"),
    "plans/llama_tiny_tp.lua")
  H.eq(has_parts(p), false, "loss_chunks = 1")
end

-- sync_last: the wrapper syncs its last chunk and leaves sync on, so the
-- head unit reduces (in two parts) on every micro-step, the layers on the
-- last only; the head's first reduction of each part assigns, later ones add.
function T.sync_last_still_reduces_the_head_every_micro_step()
  local p = plan.from_file("tests/plans/llama_chunked_synclast.lua")
  local M = p.fsdp.micro_steps
  local head, packs, layer_packs = ops_of(p, "norm_output"), {}, 0
  for _, o in ipairs(head) do
    if o.kind == "pack" then packs[#packs + 1] = o.micro_step .. ":" .. o.part_first end
    if o.kind == "view_out" or o.kind == "view_out_add" then
      H.eq(o.kind == "view_out", o.micro_step == 0, "view_out of part " .. o.part_first .. " at " .. o.micro_step)
    end
  end
  H.eq(table.concat(packs, " "), "0:1 0:0 1:1 1:0 2:1 2:0", "the head's packs")
  for _, o in ipairs(ops_of(p, "layers.0")) do
    if o.kind == "pack" then layer_packs = layer_packs + 1; H.eq(o.micro_step, M - 1, "a layer packs last") end
  end
  H.eq(layer_packs, 1, "a layer's packs")
end

-- The proofs: a part reduced twice, not at all, or with another count
-- stops generation.
function T.proofs_catch_a_broken_partial_reduction()
  local p = plan.from_file("plans/llama_tiny_tp.lua")
  local function copy(ops)
    local out = {}
    for i, o in ipairs(ops) do
      local c = {}
      for k, v in pairs(o) do c[k] = v end
      out[i] = c
    end
    return out
  end
  local function fails(ops, proof, want)
    local ok, err = pcall(proof, ops)
    assert(not ok, "the proof should fail: " .. want)
    assert(tostring(err):find(want, 1, true), "got: " .. tostring(err))
  end
  local schedule = function(ops) verify.schedule(p.layout, ops, p.fsdp, p.rep) end
  local order = function(ops) verify.order(p.layout, p.groups, ops) end
  schedule(p.ops)
  order(p.ops)
  -- the norm's pack widened to the whole unit: lm_head packed twice
  local ops = copy(p.ops)
  for _, o in ipairs(ops) do
    if o.kind == "pack" and o.part_first == 0 then o.part_first, o.part_count = nil, nil end
  end
  fails(ops, schedule, "packed after 0 backward passes")
  -- the lm_head backward made the norm's grads: the norm packed after two
  ops = copy(p.ops)
  for _, o in ipairs(ops) do
    if o.kind == "backward" and o.part_first == 1 then o.part_first, o.part_count = 0, 2 end
  end
  fails(ops, schedule, "packed after 2 backward passes")
  -- a part's reduce-scatter sized as the whole unit
  ops = copy(p.ops)
  for _, o in ipairs(ops) do
    if o.kind == "reduce_scatter" and o.part_first == 1 then o.count = p.layout.units[o.unit + 1].total end
  end
  fails(ops, order, "count")
  -- a part past the unit's parameters
  ops = copy(p.ops)
  for _, o in ipairs(ops) do
    if o.kind == "view_out" and o.part_first == 1 then o.part_count = 2 end
  end
  fails(ops, schedule, "part 1+2")
end

-- plan.c names each part (C's default, part_count 0, is the whole unit)
-- and plan.json's ops name its parameters, as the schema says.
function T.tables_and_plan_json_name_the_parts()
  local p = plan.from_file("plans/llama_tiny_tp.lua")
  local fp = audit.fingerprint(p)
  local c = emit.render(p, fp, { ["plan.h.in"] = H.read("templates/plan.h.in"),
                                 ["plan.c.in"] = H.read("templates/plan.c.in"),
                                 ["plan_kernels.cu.in"] = H.read("templates/plan_kernels.cu.in") })["plan.c"]
  local n1, n0 = 0, 0
  for _ in c:gmatch("%.part_first = 1, %.part_count = 1") do n1 = n1 + 1 end
  for _ in c:gmatch("%.part_first = 0, %.part_count = 1") do n0 = n0 + 1 end
  -- per class (two TP classes): forward, backward, pack, RS, AR, view-out of
  -- lm_head; backward, pack, RS, AR, view-out and the decoder's forward of the norm
  H.eq(n1, 2 * 6, "lm_head's part rows")
  H.eq(n0, 2 * 6, "the norm's part rows")
  local doc = json.decode(audit.json(p, fp))
  local seen = {}
  for _, o in ipairs(doc.ops) do
    if o.params then seen[#seen + 1] = o.kind .. ":" .. table.concat(o.params, ",") end
  end
  H.eq(table.concat(seen, " "), "forward:norm.weight forward:output.weight backward:output.weight "
    .. "pack:output.weight reduce_scatter:output.weight all_reduce:output.weight view_out:output.weight "
    .. "backward:norm.weight pack:norm.weight reduce_scatter:norm.weight all_reduce:norm.weight view_out:norm.weight",
    "plan.json's parts")
  local md = audit.schedule_md(p, fp)
  assert(md:find("| reduce_scatter (output.weight) | norm_output |", 1, true), "SCHEDULE.md names the part")
  assert(md:find("The loss is torchtitan's ChunkedLossWrapper", 1, true), "SCHEDULE.md's assumption")
end

return T
