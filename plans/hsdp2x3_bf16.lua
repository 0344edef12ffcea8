-- HSDP with an odd shard group and torchtitan's mixed precision: fp32
-- master shards, bf16 all-gather and compute, fp32 gradient reduction.
return {
  world_size = 6,
  parallel = { dp_replicate = 2, dp_shard = 3 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "layers.0", params = {
        { name = "layers.0.w", shape = { 10, 4 } }, { name = "layers.0.norm", shape = { 4 } },
      } },
      { name = "layers.1", params = {
        { name = "layers.1.w", shape = { 2, 9 } }, { name = "layers.1.norm", shape = { 5 } },
      } },
      { name = "root", params = { { name = "embed", shape = { 13, 4 } }, { name = "out", shape = { 13, 4 } } } },
    },
  },
  -- eight micro-steps in FSDP2's default accumulation: micro-steps 3-6 are
  -- one repeated row set in the tables (gen/repeat.lua)
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", micro_steps = 8 },
}
