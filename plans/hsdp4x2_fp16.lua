-- fp16 everywhere: FSDP2 reduces fp16 with SUM plus a power-of-two
-- pre-divide and a post-divide (here 8 ranks: 4 then 2), over three
-- gradient-accumulation micro-steps.
return {
  world_size = 8,
  parallel = { dp_replicate = 4, dp_shard = -1 },
  model = {
    family = "generic", dtype = "fp16",
    units = {
      { name = "enc", params = { { name = "enc.w", shape = { 7, 3 } }, { name = "enc.b", shape = { 3 } } } },
      { name = "root", params = { { name = "proj", shape = { 5, 5 } } } },
    },
  },
  fsdp = { micro_steps = 3 },
}
