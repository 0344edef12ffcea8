-- Expert parallel 4 with tensor parallel 2 on 8 ranks: a tiny DeepSeek-V3
-- (one dense block, two MoE blocks of 4 routed experts, top 2, a shared
-- expert, MLA with a query LoRA) under torchtitan 0.3's TP plan with
-- sequence and loss parallelism (gen/parallel/tp.lua). ep borrows from
-- dp_shard x tp: each ep group spans two TP groups, efsdp = 4 x 2 / 4 = 2,
-- and efsdp x ep = 8 > 4 experts, so the experts' weights (one per rank,
-- not TP-split: etp = 1) are FSDP-sharded on dim 1 (Shard(1)). Each rank
-- routes its own seq_len / tp = 4 tokens (docs/expert-parallel.md).
return {
  world_size = 8,
  parallel = { dp_shard = 4, tp = 2, ep = 4 },
  model = {
    family = "deepseek_v3", dtype = "fp32", seq_len = 8,
    dim = 16, n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 37,
    q_lora_rank = 6, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 2, v_head_dim = 4,
    dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 4, num_shared_experts = 1, top_k = 2,
  },
  fsdp = { reduce_op = "sum" },
}
