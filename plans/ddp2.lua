-- Replicate only (dp_shard = 1): every "shard" is the whole parameter, the
-- all-gather and reduce-scatter are local copies and the gradient
-- reduction is one all-reduce per unit across the two replicas.
return {
  world_size = 2,
  parallel = { dp_replicate = 2 },
  model = {
    family = "generic", dtype = "bf16",
    units = {
      { name = "a", params = { { name = "a.w", shape = { 6, 2 } } } },
      { name = "root", params = { { name = "r.w", shape = { 3 } } } },
    },
  },
}
