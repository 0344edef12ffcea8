-- The FSDP2-on-NCCL recording's model (tests/oracle/nccl, fsdp3.rank*.json):
-- three layers and the root, as plans/fsdp4.lua, on dp_shard = 3: AVG over a
-- group that is not a power of two, where ncclAvg and gloo differ by an ulp.
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
  world_size = 3,
  parallel = { dp_shard = -1 },
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
  fsdp = { reshard_after_forward = true },
}
