-- The FSDP2 recording's model on HSDP: dp_replicate = 2 outer, dp_shard = 2
-- inner. Reduce-scatter over the shard pair, then all-reduce across replicas.
local function layer(b)
  local pre = "layers." .. b .. ".p."
  local function p(name, shape) return { name = pre .. name, shape = shape } end
  return { name = "layers." .. b, params = {
    p("wq", { 12, 12 }), p("wk", { 4, 12 }), p("wv", { 4, 12 }), p("wo", { 12, 12 }),
    p("w1", { 20, 12 }), p("w2", { 12, 20 }), p("w3", { 20, 12 }),
    p("attn_norm", { 12 }), p("ffn_norm", { 12 }), p("bias", { 5 }), p("tiny", { 2, 3 }),
  } }
end

return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = 2 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      layer(0), layer(1), layer(2),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 37, 12 } },
        { name = "root.norm", shape = { 12 } },
        { name = "root.output", shape = { 37, 12 } },
      } },
    },
  },
}
