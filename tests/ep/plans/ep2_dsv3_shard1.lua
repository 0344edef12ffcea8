-- Expert parallel 2 on 8 ranks (issue 23): a tiny DeepSeek-V3-like MoE (one
-- dense block, two MoE blocks of 4 routed experts, top 2, a shared expert).
-- efsdp = 8 / 2 = 4, and efsdp x ep = 8 > 4 experts, so the experts'
-- weights (2 per rank) are FSDP-sharded on dim 1 (torchtitan's Shard(1)).
return {
  world_size = 8,
  parallel = { dp_shard = -1, ep = 2 },
  model = {
    family = "deepseek_v3", dtype = "fp32", seq_len = 4,
    dim = 16, n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 37,
    q_lora_rank = 6, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 2, v_head_dim = 4,
    dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 4, num_shared_experts = 1, top_k = 2,
  },
  fsdp = { reduce_op = "sum" },
}
