-- The provoked-fault matrix's expert-parallel plan (tests/diagnose/faults.py, withhold_counts, ep_none):
-- tests/ep/ep_cases.py's dp4_ep2 as tests/ep/compare_ep_live.lua --write-plans writes it, the model
-- tests/diagnose/titan_fault_job.py runs with torchtitan 0.3 (DeepSeek-V3, tiny; dp_shard 4 x ep 2).
return {
  world_size = 4,
  parallel = { dp_shard = 4, ep = 2 },
  model = { family = "deepseek_v3", dtype = "fp32", seq_len = 6, dim = 16, n_layers = 3, n_dense_layers = 1,
            n_heads = 2, vocab_size = 64, q_lora_rank = 0, kv_lora_rank = 8, qk_nope_head_dim = 4,
            qk_rope_head_dim = 4, v_head_dim = 4, dense_hidden_dim = 32, moe_hidden_dim = 8, num_experts = 8,
            num_shared_experts = 1, top_k = 2 },
  fsdp = { reduce_op = "sum" },
  training = { local_batch_size = 1, loss_chunks = 1 },
}
