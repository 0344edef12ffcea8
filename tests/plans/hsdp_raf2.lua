-- fully_shard(reshard_after_forward=2) under HSDP (2 replicas x 4 shards, docs/plan-files.md
-- "reshard_after_forward as an int"): the post-forward groups are 2 consecutive members of each
-- shard group ({0, 1}, {2, 3}, {4, 5}, {6, 7}: the rows of the 2 x 4 mesh viewed as (-1, 2),
-- torch 2.15 _fsdp_init.py:186-194). bf16 all-gathers (the kept slice in bf16), fp32 reductions,
-- two micro-steps (FSDP2's default accumulation: every forward keeps a slice anew); l1 overrides
-- the plan's k with true (resharded to its full shard group). tests/live/live.py runs it against
-- fully_shard on gloo.
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = 4 },
  fsdp = { reshard_after_forward = 2, micro_steps = 2, param_dtype = "bf16", reduce_dtype = "fp32" },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.weight", shape = { 6, 5 }, dtype = "fp32" },
                              { name = "l0.bias", shape = { 6 }, dtype = "fp32" } } },
    { name = "l1", reshard_after_forward = true, params = { { name = "l1.weight", shape = { 9 }, dtype = "fp32" } } },
    { name = "l2", params = { { name = "l2.weight", shape = { 7, 3 }, dtype = "fp32" } } },
    { name = "root", params = { { name = "root.weight", shape = { 3, 6 }, dtype = "fp32" },
                                { name = "root.bias", shape = { 3 }, dtype = "fp32" } } },
  } },
}
