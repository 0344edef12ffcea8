-- DeepSeek-V3's multi-token prediction under FSDP 4 (issue 41): a tiny
-- DeepSeek-V3 with two MTP depths (model.num_mtp_layers; torchtitan's
-- mtp.py): tok_embeddings and [norm, lm_head] called three times a forward,
-- resharded and gathered again between calls (gen/parallel/fsdp_schedule.lua
-- calls_micro). On the emulated GPU eager and as a CUDA graph.
return {
  world_size = 4,
  parallel = { dp_shard = 4 },
  model = {
    family = "deepseek_v3", dtype = "fp32", seq_len = 4,
    dim = 16, n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 37,
    q_lora_rank = 6, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 2, v_head_dim = 4,
    dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 4, num_shared_experts = 1, top_k = 2,
    num_mtp_layers = 2,
  },
  fsdp = { reduce_op = "sum", param_dtype = "bf16", reduce_dtype = "fp32" },
}
