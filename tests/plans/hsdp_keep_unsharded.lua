-- set_reshard_after_backward(False) (fsdp.reshard_after_backward = false,
-- docs/plan-files.md) on every micro-step but the last, HSDP 2 x 2 over
-- three micro-steps with HSDP's deferred all-reduce: the kept units gather
-- nothing in the next micro-step's forward; u1 overrides it (resharded
-- after every backward), u0 reshards after forward as well (gathered
-- again in backward), u2 keeps its parameters unsharded from its forward on.
-- tests/live/live.py plans runs it against fully_shard on gloo.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  fsdp = { micro_steps = 3, reshard_after_backward = false, grad_accumulation = "all_reduce_last",
           param_dtype = "bf16", reduce_dtype = "fp32" },
  model = { family = "generic", units = {
    { name = "u0", params = { { name = "u0.w", shape = { 5, 3 }, dtype = "fp32" },
                              { name = "u0.b", shape = { 3 }, dtype = "fp32" } } },
    { name = "u1", reshard_after_backward = true, params = { { name = "u1.w", shape = { 7 }, dtype = "fp32" } } },
    { name = "u2", reshard_after_forward = false, params = { { name = "u2.w", shape = { 4, 4 }, dtype = "fp32" } } },
    { name = "root", params = { { name = "root.w", shape = { 3 }, dtype = "fp32" } } },
  } },
}
