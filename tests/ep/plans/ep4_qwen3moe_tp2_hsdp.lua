-- Expert parallel 4 with tensor parallel 2 on a tiny Qwen3-MoE, HSDP 2 x 2
-- on 8 ranks, two micro-steps: torchtitan 0.3's Qwen3 MoE TP plan with EP
-- (gen/parallel/tp.lua, gen/parallel/ep.lua). ep borrows from dp_shard x
-- tp: each ep group spans two TP groups, efsdp = 2 x 2 / 4 = 1; the 4
-- experts, one per rank, are not TP-split (etp = 1); each rank routes its
-- own seq_len / tp = 4 tokens, and the MoE issues no TP collective (its
-- input stays on the sequence shards). q/k norms and the router's gate
-- have Partial gradients over TP; vocab 37 gives two TP classes.
-- Simulated on every rank by tests/run.sh.
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = 2, tp = 2, ep = 4 },
  model = { family = "qwen3_moe", dtype = "fp32", seq_len = 8, dim = 16, n_layers = 2, n_heads = 4, n_kv_heads = 2,
            vocab_size = 37, moe_hidden_dim = 16, num_experts = 4, top_k = 2 },
  fsdp = { reduce_op = "sum", micro_steps = 2 },
}
