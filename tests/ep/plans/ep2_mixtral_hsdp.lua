-- Expert parallel 2 under HSDP 2 x 4 (issue 23): the dense group reduces over
-- dp_shard 4 then all-reduces over dp_replicate 2; the experts (2 of 4 per
-- rank) reduce over efsdp 2 then all-reduce over dp_replicate. Six
-- micro-steps (the tables repeat the middle ones), each with its own counts
-- slot; FSDP2's average (no torchtitan division override) divides the
-- experts' grads by efsdp x dp_replicate = 4 and the dense ones by 8.
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = -1, ep = 2 },
  model = {
    family = "qwen3_moe", dtype = "fp32", seq_len = 4,
    dim = 8, n_layers = 2, n_heads = 2, n_kv_heads = 1, vocab_size = 23, moe_hidden_dim = 4, num_experts = 4,
    top_k = 1,
  },
  fsdp = { micro_steps = 6 },
  expert_parallel = { capacity = "dropless" },
}
