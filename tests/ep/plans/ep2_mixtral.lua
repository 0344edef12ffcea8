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
