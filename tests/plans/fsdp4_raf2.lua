-- fully_shard(reshard_after_forward=2) on four ranks (docs/plan-files.md, "reshard_after_forward as an int"):
-- after forward l0 keeps its post-forward slice (S / k = 2 shards of each parameter) and backward
-- all-gathers it over ranks {0, 1} and {2, 3}; tests/live/live.py runs it against fully_shard on gloo.
return {
  world_size = 4,
  parallel = { dp_shard = 4 },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.weight", shape = { 6, 5 }, dtype = "fp32" }, { name = "l0.bias", shape = { 6 }, dtype = "fp32" } } },
    { name = "root", params = { { name = "root.weight", shape = { 3, 6 }, dtype = "fp32" }, { name = "root.bias", shape = { 3 }, dtype = "fp32" } } },
  } },
  fsdp = { reshard_after_forward = 2 },
}
