-- Explicit prefetching (docs/plan-files.md: a unit's forward_prefetch and
-- backward_prefetch, FSDPModule.set_modules_to_forward_prefetch /
-- set_modules_to_backward_prefetch): the root prefetches two units in
-- forward (u0, then u2 ahead of u1), u0 prefetches u1; in backward the
-- root prefetches u3 and u1 (u2 then gathers at its own pre-backward,
-- after u3's reduce-scatter), u3 keeps FSDP2's default (u2), u1 prefetches
-- u0 explicitly. Two micro-steps, FSDP2's default accumulation, one unit
-- never resharded after forward. tests/live/live.py plans runs it against
-- fully_shard on gloo.
return {
  world_size = 4,
  parallel = { dp_shard = 4 },
  fsdp = { micro_steps = 2 },
  model = { family = "generic", units = {
    { name = "u0", forward_prefetch = { "u1" }, params = { { name = "u0.w", shape = { 5, 3 }, dtype = "fp32" } } },
    { name = "u1", backward_prefetch = { "u0" }, params = { { name = "u1.w", shape = { 9 }, dtype = "fp32" } } },
    { name = "u2", reshard_after_forward = false, params = { { name = "u2.w", shape = { 4, 4 }, dtype = "fp32" } } },
    { name = "u3", params = { { name = "u3.w", shape = { 6, 2 }, dtype = "fp32" } } },
    { name = "root", forward_prefetch = { "u0", "u2" }, backward_prefetch = { "u3", "u1" },
      params = { { name = "root.w", shape = { 3 }, dtype = "fp32" } } },
  } },
}
