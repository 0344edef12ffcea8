-- Eight shards of shapes that do not divide: dims smaller than the group
-- (ranks with empty shards), a Shard(1) parameter, no reshard after
-- forward (ZeRO-2 style) and two gradient-accumulation micro-steps.
return {
  world_size = 8,
  parallel = { dp_shard = -1 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "blocks.0", params = {
        { name = "blocks.0.small", shape = { 3, 5 } },     -- 3 rows on 8 ranks: ranks 3..7 empty
        { name = "blocks.0.one", shape = { 1 } },
        { name = "blocks.0.odd", shape = { 17, 3 } },      -- chunk 3: 3,3,3,3,3,2,0,0
        { name = "blocks.0.cols", shape = { 4, 16 }, shard_dim = 1 },
      } },
      { name = "blocks.1", params = {
        { name = "blocks.1.vec", shape = { 9 } },
        { name = "blocks.1.cube", shape = { 5, 2, 3 } },
      } },
      { name = "root", params = { { name = "head", shape = { 10, 7 } } } },
    },
  },
  fsdp = { reshard_after_forward = false, micro_steps = 2 },
}
