-- Tensor parallel 2 on a tiny Mixtral-like MoE at ep = 1, HSDP 2 x 2 on 8
-- ranks, two micro-steps: torchtitan 0.3's Qwen3 MoE TP plan (gen/parallel/
-- tp.lua; docs/expert-parallel.md, "Tensor parallel (mixtral, qwen3_moe)"):
-- the 4 routed experts split over TP on their hidden dim (w1/w3 Shard(1),
-- w2 Shard(2)), FSDP-sharded on dim 0 over dp_shard 2 (4 ranks of the dense
-- storage mesh, dp_replicate x dp_shard x tp = 8 > 4 experts: Shard(1), on
-- the TP-split dim: _StridedShard); vocab 37 splits unevenly over TP, so two
-- TP classes. Each block gathers the sequence before attention and the MoE
-- and reduce-scatters after wo and the routed experts. Simulated on every
-- rank by tests/run.sh.
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = 2, tp = 2 },
  model = { family = "mixtral", dtype = "fp32", seq_len = 8, dim = 16, n_layers = 2, n_heads = 4, n_kv_heads = 2,
            vocab_size = 37, moe_hidden_dim = 16, num_experts = 4, top_k = 2 },
  fsdp = { reduce_op = "sum", micro_steps = 2 },
}
