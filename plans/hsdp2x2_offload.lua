-- CPU offload (fully_shard(offload_policy=CPUOffloadPolicy()), docs/plan-files.md
-- "CPU offload"): hsdp2x2's model with every unit's sharded parameters and
-- gradients in host memory, bf16 shards gathered as they are (an
-- offloading unit still copies in, from the H2D's device copy) and
-- reduced in fp32, two micro-steps of FSDP2's default accumulation (the
-- second reduction's D2H adds on the host). Per unit: layers.1 keeps its
-- shards on the device (cpu_offload = false: a zero copy-in), layers.2
-- offloads to pageable memory (pin_memory = false), layers.0 gathers in
-- fp32 (a cast in its copy-in).
local function layer(b, extra)
  local pre = "layers." .. b .. ".p."
  local function p(name, shape) return { name = pre .. name, shape = shape } end
  local u = { name = "layers." .. b, params = {
    p("wq", { 12, 12 }), p("wk", { 4, 12 }), p("wv", { 4, 12 }), p("wo", { 12, 12 }),
    p("w1", { 20, 12 }), p("w2", { 12, 20 }), p("w3", { 20, 12 }),
    p("attn_norm", { 12 }), p("ffn_norm", { 12 }), p("bias", { 5 }), p("tiny", { 2, 3 }),
  } }
  for k, v in pairs(extra or {}) do u[k] = v end
  return u
end

return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  fsdp = { cpu_offload = true, micro_steps = 2, reduce_dtype = "fp32" },
  model = {
    family = "generic", dtype = "bf16",
    units = {
      layer(0, { param_dtype = "fp32" }), layer(1, { cpu_offload = false }), layer(2, { pin_memory = false }),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 37, 12 } },
        { name = "root.norm", shape = { 12 } },
        { name = "root.output", shape = { 37, 12 } },
      } },
    },
  },
}
