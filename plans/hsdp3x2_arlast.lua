-- HSDP's gradient accumulation without the all-reduce: FSDP2's
-- set_requires_all_reduce(False) before every micro-step but the last
-- (grad_accumulation = "all_reduce_last"). Every backward reduce-scatters
-- over the 2-rank shard group into the unit's partial sums (summed in the
-- bf16 reduce dtype, so the order and dtype of the sums show in the last
-- bits); the last micro-step folds them in and all-reduces once over the 3
-- replicas. Uneven shards, a Shard(1) parameter, a unit that keeps its
-- parameters unsharded after forward.
return {
  world_size = 6,
  parallel = { dp_replicate = 3, dp_shard = 2 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "layers.0", params = {
        { name = "layers.0.w", shape = { 9, 6 } }, { name = "layers.0.norm", shape = { 6 } },
        { name = "layers.0.proj", shape = { 3, 8 }, shard_dim = 1 },
      } },
      { name = "layers.1", reshard_after_forward = false, params = {
        { name = "layers.1.w", shape = { 5, 7 } }, { name = "layers.1.bias", shape = { 3 } },
      } },
      { name = "root", params = { { name = "embed", shape = { 11, 6 } }, { name = "out", shape = { 11, 6 } } } },
    },
  },
  -- seven micro-steps: 3-5 are one repeated row set in the tables (gen/repeat.lua)
  fsdp = { micro_steps = 7, grad_accumulation = "all_reduce_last", param_dtype = "bf16", reduce_dtype = "bf16" },
}
