-- DeepSeek-V3's multi-token prediction with expert parallel 2 on 4 ranks
-- (issue 41): ep2_dsv3_shard1's tiny MoE plus two MTP depths
-- (model.num_mtp_layers; torchtitan's mtp.py): tok_embeddings and
-- [norm, lm_head] called three times a forward, the MTP blocks (copies of
-- the last, MoE, block) in torchtitan's explicit prefetch order. Built,
-- simulated with both arithmetics and run on the emulated GPU with every
-- expert-parallel plan (tests/run.sh, tests/emu_check.sh).
return {
  world_size = 4,
  parallel = { dp_shard = -1, ep = 2 },
  model = {
    family = "deepseek_v3", dtype = "fp32", seq_len = 4,
    dim = 16, n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 37,
    q_lora_rank = 6, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 2, v_head_dim = 4,
    dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 4, num_shared_experts = 1, top_k = 2,
    num_mtp_layers = 2,
  },
  fsdp = { reduce_op = "sum" },
}
