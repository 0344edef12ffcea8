-- Kernel coverage under multi-rank NCCL: make test simulates it, make
-- test-gpu runs it with all 6 ranks on the GPU (--check, eager and graph).
-- Every (orig, param, reduce) dtype triple, each unit with its own
-- MixedPrecisionPolicy (fully_shard's mp_policy), on the 16-byte vector path
-- (units v_<orig>_<param>_<reduce>) and the scalar path (s_...): copy-in with
-- the param cast, packing with the reduce cast and FSDP2's divides, view-out
-- back to orig. HSDP 2 x 3 (an odd shard group: AVG is not exact), 2
-- micro-steps, Shard(1), empty shards, padding; units reducing in fp16 (the
-- pre/post-divide path) stay unsharded after forward.
local DTYPES = { "fp32", "bf16", "fp16" }

local function vec(o, p, r)  -- offsets and runs multiples of 8 elements: vec_ok
  local n = table.concat({ "v", o, p, r }, "_")
  return { name = n, param_dtype = p, reduce_dtype = r, reshard_after_forward = r ~= "fp16", params = {
    { name = n .. ".w", shape = { 24, 8 }, dtype = o },                 -- chunk 8: full shards
    { name = n .. ".pad", shape = { 7, 16 }, dtype = o },               -- chunk 3: rank 2 holds 1 row, 2 padding
    { name = n .. ".empty", shape = { 2, 8 }, dtype = o },              -- chunk 1: rank 2 empty
    { name = n .. ".cols", shape = { 2, 24 }, shard_dim = 1, dtype = o }, -- Shard(1): 2 rows of 8
  } }
end

local function scalar(o, p, r)  -- runs of 12, 2, 5 and 3: the scalar path
  local n = table.concat({ "s", o, p, r }, "_")
  return { name = n, param_dtype = p, reduce_dtype = r, reshard_after_forward = r ~= "fp16", params = {
    { name = n .. ".a", shape = { 10, 3 }, dtype = o },                 -- chunk 4: rank 2 holds 2 rows
    { name = n .. ".b", shape = { 5 }, dtype = o },
    { name = n .. ".e", shape = { 1, 5 }, dtype = o },                  -- ranks 1 and 2 empty
    { name = n .. ".c", shape = { 3, 9 }, shard_dim = 1, dtype = o },   -- Shard(1): 3 rows of 3
  } }
end

local units = {}
for _, o in ipairs(DTYPES) do
  for _, p in ipairs(DTYPES) do
    for _, r in ipairs(DTYPES) do
      units[#units + 1] = vec(o, p, r)
      units[#units + 1] = scalar(o, p, r)
    end
  end
end
units[#units + 1] = { name = "root", params = {                       -- never resharded after forward
  { name = "embed", shape = { 16, 8 }, dtype = "fp32" },
  { name = "norm", shape = { 8 }, dtype = "fp32" },
} }

return {
  world_size = 6,
  parallel = { dp_replicate = 2, dp_shard = 3 },
  model = { family = "generic", units = units },
  fsdp = { micro_steps = 2 },
}
