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

return T
