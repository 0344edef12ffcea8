-- FSDPModule.set_unshard_in_backward(False) (a unit's unshard_in_backward = false,
-- docs/plan-files.md): l0 and l2 run their backward without their parameters
-- (the live peer's taps, as an embedding's), so their pre-backward gathers
-- nothing; their gradients still reduce-scatter. l1 gathers in backward as
-- FSDP2's default; l2 also keeps its parameters unsharded from one backward
-- into the next forward (reshard_after_backward = false), which leaves it
-- sharded (nothing unsharded to keep): its forward gathers every micro-step.
-- HSDP 2 x 2 over two micro-steps. tests/live/live.py holds it to fully_shard
-- on gloo; the emulator runs it too.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  fsdp = { micro_steps = 2 },
  model = { family = "generic", units = {
    { name = "l0", unshard_in_backward = false, params = { { name = "l0.w", shape = { 6, 5 } },
                                                           { name = "l0.b", shape = { 5 } } } },
    { name = "l1", params = { { name = "l1.w", shape = { 7, 3 } } } },
    { name = "l2", unshard_in_backward = false, reshard_after_backward = false,
      params = { { name = "l2.w", shape = { 4, 4 } } } },
    { name = "root", params = { { name = "r.w", shape = { 9 } } } } } },
}
