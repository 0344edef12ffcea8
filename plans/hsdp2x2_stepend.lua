-- torch.distributed.pipelining's gradient accumulation on one stage
-- (grad_accumulation = "step_end"): every backward runs without reshard and
-- without gradient sync, so units stay unsharded across micro-steps (a later
-- forward gathers nothing; a unit resharded after forward is gathered again
-- in backward) and the unsharded grads accumulate in the fp32 reduce dtype;
-- after the last backward, finalize_backward reshards and reduces every
-- unit once (reduce-scatter over 2, all-reduce over 2 replicas), layers
-- last to first, the root last. bf16 compute, fp32 reduction.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "layers.0", params = {
        { name = "layers.0.w", shape = { 7, 6 } }, { name = "layers.0.norm", shape = { 6 } },
      } },
      { name = "layers.1", params = {
        { name = "layers.1.w", shape = { 5, 6 } }, { name = "layers.1.proj", shape = { 4, 6 }, shard_dim = 1 },
      } },
      { name = "head", reshard_after_forward = false, params = { { name = "head.w", shape = { 9, 6 } } } },
      { name = "root", params = { { name = "embed", shape = { 11, 6 } } } },
    },
  },
  -- seven micro-steps: 3-5 are one repeated row set in the tables (gen/repeat.lua)
  fsdp = { micro_steps = 7, grad_accumulation = "step_end", param_dtype = "bf16", reduce_dtype = "fp32" },
}
