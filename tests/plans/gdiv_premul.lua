-- FSDPModule.set_gradient_divide_factor and set_force_sum_reduction_for_comms, plan-wide and per unit
-- (docs/plan-files.md "fsdp"): PREMUL_SUM, AVG-then-SUM, forced SUM with a post-divide
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = 4 },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.w", shape = { 12, 5 } } }, gradient_divide_factor = 3 },
    { name = "l1", params = { { name = "l1.w", shape = { 7 } } }, force_sum_reduction_for_comms = true, reduce_dtype = "bf16" },
    { name = "l2", params = { { name = "l2.w", shape = { 9, 2 } } }, gradient_divide_factor = 4 },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } },
  } },
  fsdp = { micro_steps = 2, gradient_divide_factor = 6 },
}
