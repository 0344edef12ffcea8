-- Mixed all-gather dtypes in one fully_shard unit (issue 39): bf16
-- compute with per-parameter overrides keeping norms and biases in fp32
-- (torch 2.15 MixedPrecisionPolicy(param_dtype_override_fn=...) returning the
-- parameter's own dtype), so FSDP2 all-gathers each unit's slot as raw
-- bytes (uint8). Odd padded shards put fp32 shards at byte offsets that
-- are not multiples of 4 (a 3x3 bf16 weight: 3 elements, 6 bytes per rank).
local function layer(b, reduce)
  local pre = "layers." .. b .. "."
  local function p(name, shape, keep) return { name = pre .. name, shape = shape, param_dtype = keep } end
  return { name = "layers." .. b, reduce_dtype = reduce, params = {
    p("attn_norm", { 6 }, "fp32"), p("wq", { 3, 3 }), p("bias", { 5 }, "fp32"), p("w1", { 7, 6 }),
    p("tiny", { 3 }), p("ffn_norm", { 6 }, "fp32"),
  } }
end

return {
  world_size = 4,
  parallel = { dp_shard = 4 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      layer(0), layer(1, "bf16"),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 11, 6 } },
        { name = "root.norm", shape = { 6 }, param_dtype = "fp32" },
      } },
    },
  },
  fsdp = { param_dtype = "bf16", reshard_after_forward = true },
}
