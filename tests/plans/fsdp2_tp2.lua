-- The FSDP2 recording fsdp2_tp2 (shared/oracle): the fsdp4 model on
-- dp_shard = 2 x tp = 2, TP as torchtitan's Llama plan places it
-- (column-wise wq wk wv w1 w3 and the output, row-wise wo w2, the
-- embedding's rows, the rest replicated), FSDP on each TP-local tensor.
-- TP splits 37 rows 19 / 18, so the root's slot is 246 elements on TP
-- rank 0 and 222 on TP rank 1: two TP classes.
local function layer(b)
  local pre = "layers." .. b .. ".p."
  local function p(name, shape, tp) return { name = pre .. name, shape = shape, tp = tp } end
  return { name = "layers." .. b, params = {
    p("wq", { 12, 12 }, "colwise"), p("wk", { 4, 12 }, "colwise"), p("wv", { 4, 12 }, "colwise"),
    p("wo", { 12, 12 }, "rowwise"), p("w1", { 20, 12 }, "colwise"), p("w2", { 12, 20 }, "rowwise"),
    p("w3", { 20, 12 }, "colwise"), p("attn_norm", { 12 }), p("ffn_norm", { 12 }), p("bias", { 5 }),
    p("tiny", { 2, 3 }),
  } }
end

return {
  world_size = 4,
  parallel = { dp_shard = -1, tp = 2 },
  model = {
    family = "generic", dtype = "fp32",
    units = {
      layer(0), layer(1), layer(2),
      { name = "root", params = {
        { name = "root.tok_embeddings", shape = { 37, 12 }, tp = "shard(0)" },
        { name = "root.norm", shape = { 12 } },
        { name = "root.output", shape = { 37, 12 }, tp = "colwise" },
      } },
    },
  },
  fsdp = { reshard_after_forward = true },
}
