-- Kernel coverage under multi-rank NCCL: make test simulates it, make
-- test-gpu runs it with all 6 ranks on the GPU (--check, eager and graph).
-- param_dtype and reduce_dtype are per plan and the dtype per unit, so the
-- nine tests/plans/kernels_<param>_<reduce>.lua together give every
-- (orig, param, reduce) dtype triple, each on the 16-byte vector path (unit
-- v_<orig>) and the scalar path (s_<orig>). Here: copy-in orig -> bf16,
-- packing bf16 -> fp32 with FSDP2's divides, view-out fp32 -> orig; HSDP 2 x 3 (an
-- odd shard group: AVG is not exact), 2 micro-steps, Shard(1), empty shards,
-- padding.
local P, R = "bf16", "fp32"

local function vec(o)  -- offsets and runs multiples of 8 elements: vec_ok
  local n = "v_" .. o
  return { name = n, params = {
    { name = n .. ".w", shape = { 24, 8 }, dtype = o },                 -- chunk 8: full shards
    { name = n .. ".pad", shape = { 7, 16 }, dtype = o },               -- chunk 3: rank 2 holds 1 row, 2 padding
    { name = n .. ".empty", shape = { 2, 8 }, dtype = o },              -- chunk 1: rank 2 empty
    { name = n .. ".cols", shape = { 2, 24 }, shard_dim = 1, dtype = o }, -- Shard(1): 2 rows of 8
  } }
end

local function scalar(o)  -- runs of 12, 2, 5 and 3: the scalar path
  local n = "s_" .. o
  return { name = n, params = {
    { name = n .. ".a", shape = { 10, 3 }, dtype = o },                 -- chunk 4: rank 2 holds 2 rows
    { name = n .. ".b", shape = { 5 }, dtype = o },
    { name = n .. ".e", shape = { 1, 5 }, dtype = o },                  -- ranks 1 and 2 empty
    { name = n .. ".c", shape = { 3, 9 }, shard_dim = 1, dtype = o },   -- Shard(1): 3 rows of 3
  } }
end

return {
  world_size = 6,
  parallel = { dp_replicate = 2, dp_shard = 3 },
  model = {
    family = "generic",
    units = {
      vec("fp32"), scalar("fp32"), vec("bf16"), scalar("bf16"), vec("fp16"), scalar("fp16"),
      { name = "root", params = {                                         -- never resharded after forward
        { name = "embed", shape = { 16, 8 }, dtype = "fp32" },
        { name = "norm", shape = { 8 }, dtype = "fp32" },
      } },
    },
  },
  fsdp = { param_dtype = P, reduce_dtype = R, micro_steps = 2, reshard_after_forward = true },
}
