-- FSDPModule.set_gradient_divide_factor and set_force_sum_reduction_for_comms, plan-wide and per unit
-- (docs/plan-files.md "fsdp"), every path gloo runs: forced SUM with the divide after (fp32), fp16's
-- split pre/post-divide of a factor, and a factor equal to the shard group's size (AVG, then SUM over
-- the replicas). tests/live/live.py holds it to fully_shard on gloo; tests/plans/gdiv_premul.lua has
-- the PREMUL_SUM that gloo lacks.
return {
  world_size = 6,
  parallel = { dp_replicate = 2, dp_shard = 3 },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.w", shape = { 12, 5 } } }, gradient_divide_factor = 2.5 },
    { name = "l1", params = { { name = "l1.w", shape = { 7 } } }, reduce_dtype = "fp16", gradient_divide_factor = 12 },
    { name = "l2", params = { { name = "l2.w", shape = { 9, 2 } } }, gradient_divide_factor = 3,
      force_sum_reduction_for_comms = false },
    { name = "root", params = { { name = "r.w", shape = { 6 } } } },
  } },
  fsdp = { micro_steps = 2, gradient_divide_factor = 6, force_sum_reduction_for_comms = true },
}
