-- fully_shard(module, ignored_params={...}) (docs/plan-files.md "model"): ignored parameters are neither
-- sharded nor communicated, kept whole on every rank; a unit whose parameters are all ignored issues
-- nothing. tests/live/live.py holds it to fully_shard on gloo.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.w", shape = { 6, 5 } }, { name = "l0.frozen", shape = { 7, 3 }, ignored = true },
                              { name = "l0.b", shape = { 5 } } } },
    { name = "l1", params = { { name = "l1.table", shape = { 11 }, ignored = true } } },
    { name = "l2", params = { { name = "l2.w", shape = { 9, 2 } } } },
    { name = "root", params = { { name = "r.w", shape = { 6 } }, { name = "r.pos", shape = { 4, 4 }, ignored = true } } },
  } },
  fsdp = { micro_steps = 2 },
}
