-- Per-unit set_requires_gradient_sync / set_requires_all_reduce (recurse=False) over the plan-wide
-- grad_accumulation (docs/plan-files.md "fsdp"): sync_last, all_reduce_last and FSDP2's default units in one
-- HSDP step; tests/live/live.py holds it to fully_shard on gloo.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.w", shape = { 6, 5 } } }, grad_accumulation = "sync_last" },
    { name = "l1", params = { { name = "l1.w", shape = { 7 } } }, grad_accumulation = "all_reduce_last" },
    { name = "l2", params = { { name = "l2.w", shape = { 9, 2 } } }, grad_accumulation = "fsdp2_default" },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } },
  } },
  fsdp = { micro_steps = 3, grad_accumulation = "sync_last", param_dtype = "bf16", reduce_dtype = "fp32" },
}
