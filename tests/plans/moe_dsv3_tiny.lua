-- A tiny DeepSeek-V3-like MoE (gen/models/deepseek_v3.lua) on 4 ranks, ep = 1:
-- MLA attention with a low-rank q, one dense block, then two MoE blocks of 2
-- routed experts (top 1) and one shared expert. 4 ranks > 2 experts, so the
-- experts' grouped 3-D weights are FSDP-sharded on dim 1 (torchtitan's
-- Shard(1)), everything else on dim 0 with uneven rows (lm_head 37 over 4).
-- The live FSDP2 comparison (tests/live/live.py) and the host simulation
-- (tests/run.sh) run it.
return {
  world_size = 4,
  parallel = { dp_shard = -1 },
  model = {
    family = "deepseek_v3", dtype = "fp32",
    dim = 16, n_layers = 3, n_dense_layers = 1, n_heads = 2, vocab_size = 37,
    q_lora_rank = 6, kv_lora_rank = 8, qk_nope_head_dim = 4, qk_rope_head_dim = 2, v_head_dim = 4,
    dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 2, num_shared_experts = 1, top_k = 1,
  },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
}
