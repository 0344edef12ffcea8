local H = require("helpers")
local dims = require("gen.dims")
local groups = require("gen.groups")
local T = {}

local function fails(parallel, world, ...)
  local src = string.format("return { world_size = %d, parallel = %s, model = { family = 'generic', "
    .. "n_heads = 12, n_kv_heads = 4, seq_len = 100, units = { { name = 'root', params = { { name = 'w', shape = { 8 } } } } } } }",
    world, parallel)
  return H.plan_fails(src, ...)
end

-- Rank r's group in family f (the group whose members include r).
local function group_of(f, r)
  for _, g in ipairs(f.instances) do
    for _, x in ipairs(g) do if x == r then return g end end
  end
end

function T.infer_dp_shard()
  local d = dims.infer(nil, { dp_replicate = 2, dp_shard = -1 }, 16)
  H.eq(d.dp_shard, 8)
end

function T.legacy_dp_maps_to_dp_shard()
  H.eq(dims.infer(nil, { dp = 4 }, 4).dp_shard, 4)
end

function T.product_mismatch_message()
  fails("{ dp_shard = 3, dp_replicate = 2 }", 8, "plans/t.lua", "dp_replicate(2) * dp_shard(3)", "= 6 != world_size(8)",
    "Set dp_shard=-1 to auto-infer")
end

function T.non_factoring_world()
  fails("{ dp_replicate = 3, dp_shard = -1 }", 8, "Cannot auto-infer dp_shard: world_size=8 is not divisible by dp_replicate*cp*tp*pp=3")
end

function T.degree_rules()
  fails("{ tp = 0 }", 8, "Parallel degree tp=0 must be >= 1")
  fails("{ dp_shard = 0 }", 8, "dp_shard=0 must be -1 (auto) or a positive int")
  fails("{ dp_shard = -2 }", 8, "dp_shard=-2 must be -1")
  -- (pp > 1 without a pipeline section runs torchtitan's 1F1B; the stage split needs a decoder)
  fails("{ dp_shard = -1, pp = 2 }", 8, "model.family:", "a generic model has none: use a decoder family")
  fails("{ dp_shard = 2, ep = 2, tp = 2, etp = 3 }", 4, "parallel.etp", "etp=3: torchtitan 0.3 has no expert "
    .. "tensor-parallel degree", "config/configs.py:112-279")
  fails("{ dp_shard = 2, cp = 4, ulysses_degree = 8 }", 8, "ulysses_degree=8 must be <= cp=4")
  fails("{ dp_shard = 2, cp = 4, ulysses_degree = 3 }", 8, "cp=4 must be divisible by ulysses_degree=3")
end

function T.model_checks()
  fails("{ dp_shard = 1, tp = 8 }", 8, "num_attention_heads=12 not divisible by tp=8")
  fails("{ dp_shard = 2, tp = 3 }", 6, "num_key_value_heads=4 not divisible by tp=3")
  fails("{ dp_shard = 1, cp = 8 }", 8, "max_seq_len=100 not divisible by cp*tp=8")
end

-- cp > 1 is generated for the llama family (gen/parallel/cp.lua; tests/lua/test_cp.lua has the rest).
function T.cp_needs_llama()
  fails("{ dp_shard = 2, cp = 2 }", 4, "parallel.cp", "cp=2", "families whose attention exchanges K", "generic",
    "set cp=1")
end

function T.mesh_order_and_aliases()
  local d = dims.infer(nil, { dp_replicate = 2, dp_shard = 2, cp = 2, tp = 2 }, 16)
  local m = dims.mesh(d)
  H.list_eq(m.names, { "dp_replicate", "dp_shard", "cp", "tp" }, "mesh names")
  H.list_eq(m.strides, { 8, 4, 2, 1 }, "strides")
  -- FSDP shards over dp_shard x cp (torchtitan 0.3's fsdp mesh)
  H.list_eq(m.aliases.fsdp, { "dp_shard", "cp" }, "fsdp")
  H.list_eq(m.aliases.dp, { "dp_replicate", "dp_shard" }, "dp")
  H.list_eq(m.aliases.loss, { "dp_replicate", "dp_shard", "cp" }, "loss")
end

function T.mesh_all_ones_is_one_rank_dp_shard()
  local m = dims.mesh(dims.infer(nil, {}, 1))
  H.list_eq(m.names, { "dp_shard" }, "names")
  H.list_eq(m.sizes, { 1 }, "sizes")
end

function T.replicate_only_aliases()
  local m = dims.mesh(dims.infer(nil, { dp_replicate = 4 }, 4))
  H.eq(m.aliases.fsdp, nil, "no fsdp alias without dp_shard")
  H.list_eq(m.aliases.dp, { "dp_replicate" }, "dp")
  H.list_eq(m.aliases.loss, { "dp_replicate" }, "loss")
end

function T.group_rank_lists_hsdp()
  local m = dims.mesh(dims.infer(nil, { dp_replicate = 2, dp_shard = 3 }, 6))
  local f = groups.build(m)
  H.list_eq(f.by_name.fsdp.instances[1], { 0, 1, 2 }, "fsdp group 0")
  H.list_eq(f.by_name.fsdp.instances[2], { 3, 4, 5 }, "fsdp group 1")
  H.list_eq(f.by_name.dp_replicate.instances[1], { 0, 3 }, "replicate group 0")
  H.list_eq(f.by_name.dp_replicate.instances[3], { 2, 5 }, "replicate group 2")
  H.list_eq(f.by_name.world.instances[1], { 0, 1, 2, 3, 4, 5 }, "world")
  H.eq(groups.intra_node(f.by_name.fsdp, 3), true, "fsdp groups fit 3-GPU nodes")
  H.eq(groups.intra_node(f.by_name.dp_replicate, 3), false, "replicate crosses nodes")
end

-- Expert parallel, torchtitan 0.3's convention: ep borrows its ranks from
-- dp_shard*cp*tp (the world is their product with dp_replicate and pp),
-- and the expert mesh (pp, dp_replicate, efsdp, ep) is unflattened from the
-- same world, row-major, efsdp = dp_shard*cp*tp / ep.
function T.ep_borrows_from_dp_shard_cp_tp()
  local d = dims.infer(nil, { dp_replicate = 2, dp_shard = 4, tp = 2, ep = 4 }, 16)
  H.eq(d.efsdp, 2, "efsdp = 4*2/4")
  H.eq(d.etp, 1, "etp resolves to 1 with ep > 1 (the experts are not TP-sharded)")
  H.eq(dims.infer(nil, { dp_shard = -1, tp = 2, ep = 4 }, 16).dp_shard, 8, "dp_shard = -1 does not count ep")
  H.eq(dims.infer(nil, { dp_shard = 2, tp = 2 }, 4).etp, 2, "etp defaults to tp with ep = 1 (the seeds')")
  local m = dims.mesh(d)
  H.list_eq(m.names, { "dp_replicate", "dp_shard", "tp" }, "the dense mesh has no ep")
  H.list_eq(m.sparse.names, { "dp_replicate", "efsdp", "ep" }, "sparse names")
  H.list_eq(m.sparse.sizes, { 2, 2, 4 }, "sparse sizes")
  H.list_eq(m.sparse.strides, { 8, 4, 1 }, "sparse strides")
  local f = groups.build(m)
  local names = {}
  for i, x in ipairs(f.list) do names[i] = x.name end
  H.list_eq(names, { "world", "dp_replicate", "dp_shard", "tp", "fsdp", "dp", "loss", "ep", "efsdp" }, "families")
  H.eq(f.by_name.ep.sparse, true, "ep is on the sparse mesh")
  H.eq(f.by_name.fsdp.sparse, nil, "fsdp is not")
  H.eq(#f.by_name.ep.instances, 4, "4 ep groups")
  H.list_eq(f.by_name.ep.instances[1], { 0, 1, 2, 3 }, "ep group 0")
  H.list_eq(f.by_name.ep.instances[4], { 12, 13, 14, 15 }, "ep group 3")
  H.eq(#f.by_name.efsdp.instances, 8, "8 efsdp groups")
  H.list_eq(f.by_name.efsdp.instances[1], { 0, 4 }, "efsdp group 0")
  H.list_eq(f.by_name.efsdp.instances[2], { 1, 5 }, "efsdp group 1")
  H.list_eq(f.by_name.efsdp.instances[5], { 8, 12 }, "efsdp group 4 (the second replica)")
  H.list_eq(f.by_name.dp_replicate.instances[1], { 0, 8 }, "dp_replicate unchanged")
  H.eq(groups.intra_node(f.by_name.ep, 4), true, "ep groups fit 4-GPU nodes")
  H.eq(groups.intra_node(f.by_name.efsdp, 4), false, "efsdp crosses them")
  H.eq(groups.nodes_spanned(f.by_name.efsdp, 4), 2, "efsdp spans 2 nodes")
end

-- ep smaller than tp: the ep groups are runs inside the tp groups (torchtitan
-- 0.3 needs no ep % (cp*tp) == 0, unlike torchtitan 0.1/0.2's etp = 1).
function T.ep_inside_tp()
  local f = groups.build(dims.mesh(dims.infer(nil, { dp_shard = 2, tp = 4, ep = 2 }, 8)))
  H.list_eq(f.by_name.ep.instances[1], { 0, 1 }, "ep group 0")
  H.list_eq(f.by_name.ep.instances[2], { 2, 3 }, "ep group 1")
  H.list_eq(f.by_name.efsdp.instances[1], { 0, 2, 4, 6 }, "efsdp group 0")
  H.list_eq(f.by_name.tp.instances[1], { 0, 1, 2, 3 }, "tp group 0")
end

-- With pp (outermost in both meshes) and efsdp = 1: torchtitan keeps efsdp
-- whenever ep > 1, so its family is there, of one-rank groups.
function T.ep_with_pp_and_one_rank_efsdp()
  local m = dims.mesh(dims.infer(nil, { pp = 2, dp_shard = 4, tp = 2, ep = 8 }, 16))
  H.list_eq(m.sparse.names, { "pp", "efsdp", "ep" }, "sparse names")
  H.list_eq(m.sparse.sizes, { 2, 1, 8 }, "sparse sizes")
  local f = groups.build(m)
  H.list_eq(f.by_name.ep.instances[2], { 8, 9, 10, 11, 12, 13, 14, 15 }, "ep group of stage 1")
  H.eq(f.by_name.efsdp.size, 1, "efsdp size")
  H.eq(f.by_name.efsdp.count, 16, "efsdp groups")
  H.list_eq(f.by_name.efsdp.instances[10], { 9 }, "efsdp group 9")
end

-- Every expert-mesh family against an enumeration of the sparse mesh's
-- coordinates, and ep x efsdp = each rank's dp_shard x cp x tp group (the
-- same ranks, torchtitan's mesh constraint), over many meshes.
function T.ep_families_match_enumeration()
  local cases = {
    { { dp_shard = 4, tp = 2, ep = 4 }, 8 }, { { dp_replicate = 3, dp_shard = 2, tp = 3, ep = 2 }, 18 },
    { { dp_shard = 2, cp = 2, tp = 2, ep = 8 }, 8 }, { { pp = 2, dp_replicate = 2, dp_shard = 6, ep = 3 }, 24 },
    { { dp_shard = 3, cp = 2, tp = 2, ep = 6, pp = 2 }, 24 }, { { dp_shard = 8, ep = 2, etp = 1 }, 8 },
  }
  for _, c in ipairs(cases) do
    local d = dims.infer(nil, c[1], c[2])
    local m = dims.mesh(d)
    local sp = m.sparse
    local f = groups.build(m)
    for _, name in ipairs({ "ep", "efsdp" }) do
      local fam, axis = f.by_name[name], sp.index[name]
      local want, order = {}, {}
      for r = 0, c[2] - 1 do
        local coords = dims.coords(sp, r)
        local color = 0
        for i = 1, #sp.sizes do if i ~= axis then color = color * sp.sizes[i] + coords[i] end end
        if not want[color] then want[color] = {}; order[#order + 1] = color end
        local g = want[color]
        g[#g + 1] = r
      end
      H.eq(fam.count, #order, name .. " count")
      for c0 = 0, fam.count - 1 do
        H.list_eq(groups.members(fam, c0), want[c0], name .. " group " .. c0)
        H.list_eq(fam.instances[c0 + 1], want[c0], name .. " instance " .. c0)
      end
    end
    -- The ranks of ep x efsdp around r are r's dp_shard x cp x tp group.
    local pool = {}
    for _, n in ipairs({ "dp_shard", "cp", "tp" }) do if m.index[n] then pool[#pool + 1] = n end end
    local dense = groups.build({ names = m.names, sizes = m.sizes, strides = m.strides, index = m.index,
                                 aliases = { pool = pool }, alias_order = { "pool" }, world_size = m.world_size })
    for r = 0, c[2] - 1 do
      local set = {}
      for _, e in ipairs(group_of(f.by_name.ep, r)) do
        for _, x in ipairs(group_of(f.by_name.efsdp, e)) do set[#set + 1] = x end
      end
      table.sort(set)
      H.list_eq(set, group_of(dense.by_name.pool, r), "ep x efsdp of rank " .. r)
    end
  end
end

-- The refusals, each one line naming the field and the fix.
function T.ep_refusals()
  -- ep is not a dim of the world (the seeds' peer-dim reading is refused).
  fails("{ dp_shard = 4, tp = 2, ep = 2 }", 16, "parallel.dp_shard", "dp_replicate(1) * dp_shard(4) * cp(1) * tp(2) "
    .. "* pp(1) = 8 != world_size(16)", "Set dp_shard=-1 to auto-infer")
  fails("{ dp_replicate = 2, dp_shard = 2, tp = 2, ep = 8 }", 8, "parallel.ep", "ep=8 must divide dp_shard*cp*tp=4",
    "efsdp = dp_shard*cp*tp/ep", "pick ep from the divisors of 4")
  fails("{ dp_replicate = 4, ep = 2 }", 4, "parallel.ep", "ep=2 must divide dp_shard*cp*tp=1")
  fails("{ dp_shard = 6, ep = 4 }", 6, "parallel.ep", "ep=4 must divide dp_shard*cp*tp=6", "divisors of 6")
  fails("{ dp_shard = 2, tp = 2, ep = 2, etp = 2 }", 4, "parallel.etp", "etp=2:", "ep from dp_shard*cp*tp",
    "its experts are not tensor-parallel", "moe_sharding.py:29-47", "set etp=1 or remove it")
  fails("{ dp_shard = 4, ep = 2, etp = 2 }", 4, "parallel.etp", "etp=2: torchtitan 0.3 has no expert tensor-parallel")
  fails("{ dp_shard = 4, etp = 1 }", 4, "parallel.etp", "applies only with ep > 1", "remove it")
  fails("{ dp_shard = 4, ep = 0 }", 4, "parallel.ep", "Parallel degree ep=0 must be >= 1")
  -- the model's experts
  H.plan_fails("return { world_size = 8, parallel = { dp_shard = 8, ep = 4 }, model = { family = 'generic', "
    .. "num_experts = 6, units = { { name = 'root', params = { { name = 'w', shape = { 8 } } } } } } }",
    "parallel.ep", "num_experts=6 not divisible by ep=4", "Pick ep from the divisors of 6")
end

-- Dims accept ep; generating tables with it is refused by gen/parallel/ep.lua.
-- ep > 1 is generated for the MoE families only (gen/parallel/ep.lua;
-- tests/lua/test_ep.lua has the rest): a generic model has no experts.
function T.ep_needs_experts()
  local msg = fails("{ dp_shard = 4, ep = 4 }", 4, "parallel.ep", "ep=4:", "needs routed experts", "generic",
    "set ep=1")
  H.eq(msg:find("etp", 1, true), nil, "no etp in the message")
  -- cp's rules come before ep's (its module is applied first).
  fails("{ pp = 2, dp_shard = 2, ep = 2 }", 4, "parallel.ep", "needs routed experts")
  fails("{ dp_shard = 2, cp = 2, ep = 4 }", 4, "parallel.cp", "set cp=1")
end

return T
