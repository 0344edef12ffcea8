-- Expert parallel 2 on 4 ranks (issue 23): a tiny Mixtral-like MoE, 4 routed
-- experts (top 2), FSDP over dp_shard 4. ep 2 leaves efsdp 2: each rank holds
-- 2 experts, FSDP-sharded on dim 0 over its efsdp pair (efsdp x ep = 4 does not
-- outnumber the 4 experts). Dropless capacity (the default). tests/run.sh
-- simulates it on every rank; the emulator runs it too.
return {
  world_size = 4,
  parallel = { dp_shard = -1, ep = 2 },
  model = {
    family = "mixtral", dtype = "fp32", seq_len = 8,
    dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 10, num_experts = 4,
    top_k = 2,
  },
  fsdp = { reduce_op = "sum" },
}
