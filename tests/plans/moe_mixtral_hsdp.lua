-- A tiny Mixtral-like MoE (gen/models/mixtral.lua) on HSDP 2 x 2, ep = 1:
-- fused qkv, 4 routed experts (top 2) per block, no shared experts. The FSDP
-- mesh (replicas x shards = 4) does not outnumber the experts, so their
-- weights shard on dim 0 like everything else; two micro-steps. The live
-- FSDP2 comparison (tests/live/live.py) and the host simulation
-- (tests/run.sh) run it.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = -1 },
  model = {
    family = "mixtral", dtype = "fp32",
    dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 10, num_experts = 4,
    top_k = 2,
  },
  fsdp = { micro_steps = 2 },
}
