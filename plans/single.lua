-- One rank: FSDP2's world-size-1 path (no collectives; local copies).
return {
  world_size = 1,
  model = {
    family = "generic", dtype = "fp32",
    units = {
      { name = "block", params = { { name = "block.w", shape = { 3, 5 } }, { name = "block.b", shape = { 7 } } } },
      { name = "root", params = { { name = "embed", shape = { 11, 3 } } } },
    },
  },
}
