-- fsdp.symm_mem under HSDP (2 replicas x 2 shards), bf16 all-gathers and fp32
-- reductions, two micro-steps: the all-gather outputs (bf16) and the
-- reduce-scatter inputs and outputs (fp32) in the symmetric window, the
-- replicate all-reduce outside it. tests/live/symm_sizes.py holds the
-- window's buffers to what FSDP2 allocates at those call sites on gloo.
local function layer(b)
  local pre = "layers." .. b .. ".p."
  local function p(name, shape) return { name = pre .. name, shape = shape } end
  return { name = "layers." .. b, params = {
    p("wq", { 12, 12 }), p("wk", { 4, 12 }), p("w1", { 20, 12 }), p("w2", { 12, 20 }),
    p("norm", { 12 }), p("bias", { 5 }), p("tiny", { 2, 3 }),
  } }
end

return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      layer(0), layer(1),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 37, 12 } },
        { name = "root.output", shape = { 37, 12 } },
      } },
    },
  },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", micro_steps = 2, symm_mem = true },
}
