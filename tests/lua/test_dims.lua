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
  fails("{ dp_replicate = 3, dp_shard = -1 }", 8, "Cannot auto-infer dp_shard: world_size=8 is not divisible by dp_replicate*cp*tp*pp*ep=3")
end

function T.degree_rules()
  fails("{ tp = 0 }", 8, "Parallel degree tp=0 must be >= 1")
  fails("{ dp_shard = 0 }", 8, "dp_shard=0 must be -1 (auto) or a positive int")
  fails("{ dp_shard = -2 }", 8, "dp_shard=-2 must be -1")
  fails("{ dp_shard = -1, pp = 2 }", 8, "pipeline:", "pp=2: the tables run one of torch's schedules", "add pipeline = {")
  fails("{ dp_shard = 2, ep = 2, tp = 2, etp = 3 }", 8, "etp=3 must equal tp=2 or 1")
  fails("{ dp_shard = 2, cp = 4, ulysses_degree = 8 }", 8, "ulysses_degree=8 must be <= cp=4")
  fails("{ dp_shard = 2, cp = 4, ulysses_degree = 3 }", 8, "cp=4 must be divisible by ulysses_degree=3")
end

function T.model_checks()
  fails("{ dp_shard = 1, tp = 8 }", 8, "num_attention_heads=12 not divisible by tp=8")
  fails("{ dp_shard = 2, tp = 3 }", 6, "num_key_value_heads=4 not divisible by tp=3")
  fails("{ dp_shard = 1, cp = 8 }", 8, "max_seq_len=100 not divisible by cp*tp=8")
end

function T.cp_not_generated_yet()
  fails("{ dp_shard = 2, cp = 2 }", 4, "cp=2", "FSDP/HSDP/TP", "set cp=1")
end

function T.mesh_order_and_aliases()
  local d = dims.infer(nil, { dp_replicate = 2, dp_shard = 2, cp = 2, tp = 2 }, 16)
  local m = dims.mesh(d)
  H.list_eq(m.names, { "dp_replicate", "dp_shard", "cp", "tp" }, "mesh names")
  H.list_eq(m.strides, { 8, 4, 2, 1 }, "strides")
  H.list_eq(m.aliases.fsdp, { "dp_shard" }, "fsdp")
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

return T
