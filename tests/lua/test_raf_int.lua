-- Issue 39 (h39r): fully_shard(reshard_after_forward=k) with an int k
-- (docs/plan-files.md; gen/parallel/fsdp_layout.lua post_forward).
local H = require("helpers")
local plan = require("gen.plan")
local T = {}

local UNITS = { { "l0", { { "a", { 8 } } } }, { "l1", { { "b", { 6, 2 } } } }, { "root", { { "c", { 4 } } } } }

local function kinds(p, unit, phase, kind)
  local n = 0
  for _, o in ipairs(p.ops) do
    if p.layout.units[o.unit + 1].name == unit and o.phase == phase and o.kind == kind then n = n + 1 end
  end
  return n
end

-- k = 1 is reshard_after_forward=False and k = S True (torch 2.15
-- _fsdp_init.py:174-182): planned as those, op for op.
function T.k_one_and_k_shard_size_plan_as_the_bools()
  local par = "{ dp_shard = 4 }"
  local as_false = plan.from_source(H.generic(4, par, UNITS, "{ reshard_after_forward = false }"), "t.lua")
  local one = plan.from_source(H.generic(4, par, UNITS, "{ reshard_after_forward = 1 }"), "t.lua")
  local as_true = plan.from_source(H.generic(4, par, UNITS, "{ reshard_after_forward = true }"), "t.lua")
  local four = plan.from_source(H.generic(4, par, UNITS, "{ reshard_after_forward = 4 }"), "t.lua")
  H.eq(#one.ops, #as_false.ops)
  H.eq(#four.ops, #as_true.ops)
  H.eq(kinds(one, "l0", "backward", "all_gather"), 0, "k = 1 keeps l0 unsharded into backward")
  H.eq(kinds(four, "l0", "backward", "all_gather"), 1, "k = S gathers l0 again in backward")
  for i, o in ipairs(four.ops) do H.eq(o.kind, as_true.ops[i].kind) end
  H.eq(one.layout.units[2].reshard_after_forward, false)
  H.eq(four.layout.units[2].reshard_after_forward, true)
end

-- A unit's own int overrides the plan's bool; HSDP's shard group is dp_shard.
function T.per_unit_int()
  local src = H.generic(4, "{ dp_replicate = 2, dp_shard = 2 }", UNITS, "{}")
  src = src:gsub('{ name = "l1",', '{ name = "l1", reshard_after_forward = 1,')
  local p = plan.from_source(src, "t.lua")
  H.eq(kinds(p, "l1", "backward", "all_gather"), 0, "l1 with k = 1 is not resharded after forward")
  H.eq(kinds(p, "l0", "backward", "all_gather"), 1, "l0 keeps the plan's default")
end

-- FSDP2's own refusals, each one line naming the field.
function T.refusals()
  local par = "{ dp_shard = 4 }"
  H.plan_fails(H.generic(4, par, UNITS, "{ reshard_after_forward = 3 }"), "fsdp.reshard_after_forward",
    "not a factor", "_fsdp_init.py:165-173")
  H.plan_fails(H.generic(4, par, UNITS, "{ reshard_after_forward = 8 }"), "fsdp.reshard_after_forward",
    "not a factor")
  H.plan_fails(H.generic(4, par, UNITS, "{ reshard_after_forward = 0 }"), "fsdp.reshard_after_forward",
    "not a factor")
  H.plan_fails(H.generic(4, par, UNITS, "{ reshard_after_forward = 1.5 }"), "fsdp.reshard_after_forward",
    "integer")
  H.plan_fails(H.generic(4, par, UNITS, "{ reshard_after_forward = 'two' }"), "fsdp.reshard_after_forward",
    "true, false or an integer")
  local src = H.generic(4, par, UNITS, "{}"):gsub('{ name = "l1",', '{ name = "l1", reshard_after_forward = 3,')
  H.plan_fails(src, "model.units[2].reshard_after_forward", "not a factor of the unit's shard group size 4")
  -- Shard(1): FSDP2's backward copy-out fails (measured: IndexError)
  local s1 = { { "l0", { { "a", { 4, 8 }, 1 } } }, { "root", { { "c", { 4 } } } } }
  H.plan_fails(H.generic(4, par, s1, "{ reshard_after_forward = 2 }"), "fsdp.reshard_after_forward",
    "shard_dim 1", "_fsdp_collectives.py:573")
  -- torchtitan's families: a bool policy only
  local llama = [[return { world_size = 4, parallel = { dp_shard = 4 },
    model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
              multiple_of = 16, seq_len = 64 }, fsdp = { reshard_after_forward = 2 } }]]
  H.plan_fails(llama, "fsdp.reshard_after_forward", "distributed/fsdp.py:54-78")
  -- under a pipeline too (the family refusal comes first)
  H.plan_fails(llama:gsub("dp_shard = 4", "dp_shard = 2, pp = 2"):gsub("seq_len = 64 }", "seq_len = 64 }, "
    .. "pipeline = { schedule = '1F1B' }"), "fsdp.reshard_after_forward")
end

-- 1 < k < S: the post-forward family (k consecutive members of each shard
-- group, torch 2.15 _fsdp_init.py:186-194: the mesh viewed as (-1, k)),
-- the forward's post_forward copy before its reshard, backward's all-gather
-- over the family from the kept slice (S / k slots per rank), its copy-out
-- marked, and the kept slice's buffer from the copy to that all-gather.
function T.post_forward_group_schedule_and_memory()
  local groups = require("gen.groups")
  local src = H.generic(8, "{ dp_replicate = 2, dp_shard = 4 }", UNITS, "{ reshard_after_forward = 2 }")
  local p = plan.from_source(src, "t.lua")
  local f = p.groups.by_name.fsdp_pf2
  H.eq(f.size, 2)
  H.eq(f.count, 4)
  -- HSDP 2 x 4: {0, 1}, {2, 3}, {4, 5}, {6, 7}
  local got = {}
  for c = 0, f.count - 1 do got[#got + 1] = table.concat(groups.members(f, c), ",") end
  H.eq(table.concat(got, " "), "0,1 2,3 4,5 6,7")
  local l0
  for _, u in ipairs(p.layout.units) do if u.name == "l0" then l0 = u end end
  H.eq(l0.post_forward.k, 2)
  H.eq(l0.post_forward.count, l0.total * 2)
  H.eq(kinds(p, "l0", "forward", "post_forward"), 1)
  local seen_pf, gathers = false, 0
  for _, o in ipairs(p.ops) do
    if o.unit == l0.index then
      if o.kind == "post_forward" then seen_pf = true end
      if o.kind == "reshard" and o.phase == "forward" then H.eq(seen_pf, true, "the copy precedes the reshard") end
      if o.kind == "all_gather" and o.phase == "backward" then
        gathers = gathers + 1
        H.eq(o.group, "fsdp_pf2")
        H.eq(o.count, l0.total * 2)
        H.eq(o.post_forward, true)
      end
      if o.kind == "copy_out" and o.phase == "backward" then H.eq(o.post_forward, true) end
      if o.kind == "all_gather" and o.phase == "forward" then H.eq(o.group, "fsdp") end
    end
  end
  H.eq(gathers, 1)
  local b = p.arena.by_unit[l0.index].post_forward
  H.eq(b.bytes, l0.total * 2 * 4)
  H.eq(#b.lives, 1)
  -- the root never reshards after forward: it keeps none
  for _, u in ipairs(p.layout.units) do
    H.eq(u.post_forward == nil, u.is_root, u.name)
  end
end

-- The proofs refuse a schedule whose backward all-gather ignores the kept
-- slice (a mutant: the full shard group's, as with reshard_after_forward=True).
function T.post_forward_proof_catches_a_mutant()
  local verify = require("gen.verify")
  local p = plan.from_source(H.generic(4, "{ dp_shard = 4 }", UNITS, "{ reshard_after_forward = 2 }"), "t.lua")
  local ops = {}
  for i, o in ipairs(p.ops) do
    local c = {}
    for k, v in pairs(o) do c[k] = v end
    ops[i] = c
  end
  for _, o in ipairs(ops) do
    if o.kind == "all_gather" and o.post_forward then o.post_forward, o.group, o.count = nil, "fsdp", o.count // 2 end
  end
  local ok, err = pcall(verify.schedule, p.layout, ops, p.fsdp, p.rep)
  H.eq(ok, false)
  H.eq(tostring(err):find("all_gather of l%d while post_forward") ~= nil, true, tostring(err))
  -- and an all-gather on the post-forward group with the full slot's count
  for _, o in ipairs(ops) do
    if o.kind == "all_gather" and o.phase == "backward" and o.unit == 1 then
      o.post_forward, o.group, o.count = true, "fsdp_pf2", o.count
    end
  end
  ok, err = pcall(verify.order, p.layout, p.groups, ops)
  H.eq(ok, false)
  H.eq(tostring(err):find("count", 1, true) ~= nil, true, tostring(err))
end

-- A part family's closed forms against its members, on a mesh with TP
-- inside (strided shard groups) and on nodes of 4 GPUs.
function T.part_family_closed_forms()
  local groups = require("gen.groups")
  local dims = { names = { "dp_shard", "tp" }, sizes = { 4, 2 }, strides = { 2, 1 }, index = { dp_shard = 1, tp = 2 },
                 aliases = { fsdp = { "dp_shard" } }, alias_order = { "fsdp" }, world_size = 8 }
  local fams = groups.build(dims)
  local f = groups.add_part(fams, "fsdp", 2, "fsdp_pf2")
  H.eq(fams.by_name.fsdp_pf2, f)
  local got = {}
  for c = 0, f.count - 1 do got[#got + 1] = table.concat(groups.members(f, c), ",") end
  H.eq(table.concat(got, " "), "0,2 4,6 1,3 5,7")
  H.eq(groups.span(f), 2)
  H.eq(groups.intra_node(f, 4), true)
  H.eq(groups.intra_node(f, 2), false)
  H.eq(groups.nodes_spanned(f, 2), 2)
end

-- The advisor: where the top mesh's shard group spans nodes, the same mesh
-- again with fsdp.reshard_after_forward = gpus_per_node (its memory, fit
-- and step beside the top's); a plan setting its own int gets no such line.
function T.advisor_tries_post_forward_groups()
  local advisor = require("gen.advisor")
  local load = require("gen.load")
  -- two 1 GiB parameters in 6 GB: only dp_shard = 16 (two nodes of 8) fits
  local units = { { "l0", { { "a", { 65536, 4096 } } } }, { "l1", { { "b", { 65536, 4096 } } } },
                  { "root", { { "c", { 64 } } } } }
  local topo = "\n  topology = { gpus_per_node = 8, gpu_memory_GB = 6 },\n}"
  local text = H.generic(16, "{ dp_shard = 16 }", units, "{}"):gsub("\n}$", topo)
  local res = advisor.rank(load.source(text, "plans/t.lua"), { no_pipeline = true })
  local top = res.results[1]
  H.eq(top.fits and top.shard_nodes, 2, "the top mesh's shard group spans two nodes")
  local pf = res.post_forward
  assert(pf and pf.k == 8 and pf.mesh == top.mesh and pf.step_us > 0, "the top mesh tried with reshard_after_forward = 8")
  local out = {}
  advisor.explain(top, res, out)
  local all = table.concat(out, "\n")
  assert(all:find("With fsdp.reshard_after_forward = 8", 1, true), all)
  -- a plan with its own int, or a mesh inside one node, gets none
  local own = H.generic(16, "{ dp_shard = 16 }", units, "{ reshard_after_forward = 4 }"):gsub("\n}$", topo)
  H.eq(advisor.rank(load.source(own, "plans/t.lua"), { no_pipeline = true }).post_forward, nil, "the plan's own k")
  local one = H.generic(16, "{ dp_shard = 16 }", units, "{}"):gsub("\n}$", "\n  topology = { gpus_per_node = 16, "
    .. "gpu_memory_GB = 6 },\n}")
  H.eq(advisor.rank(load.source(one, "plans/t.lua"), { no_pipeline = true }).post_forward, nil, "inside one node")
  -- nor a plan under the policy "always" (it decides every unit's reshard_after_forward); "default": the copy
  -- drops it (an int beside a policy is refused)
  local always = H.generic(16, "{ dp_shard = 16 }", units, '{ reshard_after_forward_policy = "always" }')
    :gsub("\n}$", topo)
  H.eq(advisor.rank(load.source(always, "plans/t.lua"), { no_pipeline = true }).post_forward, nil, "policy always")
  local default = H.generic(16, "{ dp_shard = 16 }", units, '{ reshard_after_forward_policy = "default" }')
    :gsub("\n}$", topo)
  local pd = advisor.rank(load.source(default, "plans/t.lua"), { no_pipeline = true }).post_forward
  assert(pd and pd.k == 8, "policy default: tried with reshard_after_forward = 8")
end

return T
