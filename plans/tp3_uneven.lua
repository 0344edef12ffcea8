-- Uneven TP splits, DTensor's way (torch.chunk): dp_shard 2 x tp 3 on a
-- generic model. 10 rows split 4 / 4 / 2 and 7 columns 3 / 3 / 1, so TP
-- rank 2's TP-local tensors, and the fused slots FSDP builds on them,
-- differ from ranks 0 and 1: two TP classes. A replicated norm is not
-- split; row-wise on dim 1 and an explicit shard(0) for a 1-D bias.
return {
  world_size = 6,
  parallel = { dp_shard = -1, tp = 3 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "block", params = {
        { name = "block.up", shape = { 10, 8 }, tp = "colwise" },
        { name = "block.up_bias", shape = { 10 }, tp = "shard(0)" },
        { name = "block.down", shape = { 8, 7 }, tp = "rowwise" },
        { name = "block.norm", shape = { 8 } },
      } },
      { name = "root", params = {
        { name = "embed", shape = { 11, 8 }, tp = "shard(0)" },
        { name = "head", shape = { 11, 8 }, tp = "colwise" },
      } },
    },
  },
}
