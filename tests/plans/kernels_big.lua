-- Copy-kernel test plan: parameters of several CP_KTILE (8192-element)
-- tiles per rank piece, so every kernel path runs (full tiles, partial
-- last tiles, padding inside a full tile, all-padding pieces of empty
-- shards, Shard(1) rows, the scalar path) on three ranks with a bf16 cast
-- and an fp32 reduction.
return {
  world_size = 3,
  parallel = { dp_shard = -1 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "vec", params = {                                    -- 16-byte path
        { name = "vec.tail", shape = { 6142, 8 } },                 -- chunk 2048, run 16384: rank 2 pads inside its full last tile
        { name = "vec.wide", shape = { 2, 8192 } },                 -- chunk 1: rank 2 empty, a full tile of padding
        { name = "vec.rows", shape = { 3, 49152 }, shard_dim = 1 }, -- Shard(1): outer 3, run 16384
        { name = "vec.odd", shape = { 50000, 8 } },                 -- partial last tile
      } },
      { name = "scalar", params = {                                 -- runs not a multiple of 8: scalar path
        { name = "scalar.a", shape = { 10001, 3 } },
        { name = "scalar.b", shape = { 7, 5001 }, shard_dim = 1 },
      } },
      { name = "root", params = { { name = "head", shape = { 24577 } } } },
    },
  },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
}
