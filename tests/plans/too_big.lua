-- One rank holding a 120 GB parameter: more than any single GPU has, for
-- the out-of-memory fault check of make test-gpu.
return {
  world_size = 1,
  model = { family = "generic", dtype = "fp32", units = { { name = "root", params = {
    { name = "huge", shape = { 30000000000 } } } } } },
}
