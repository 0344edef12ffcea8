-- Expert parallel 2 inside tensor parallel groups of 4 on 8 ranks (torchtitan
-- 0.3 accepts ep < tp; recorded live: tests/ep/ep_cases.py's mix_dp2_tp4_ep2):
-- a tiny Mixtral-like MoE, dp_shard 2 x tp 4. ep borrows from dp_shard x tp:
-- the ep groups are pairs of consecutive TP ranks, efsdp = 2 x 4 / 2 = 4
-- spans dp_shard and the two halves of each TP group, so the runtime's mesh
-- cuts tp into two axes (dp_shard.efsdp, tp.efsdp, tp.ep) and reads a rank's
-- TP coordinate over both (plan.c's tp_mesh_dim -3). The 4 experts, 2 per
-- rank, not TP-split, FSDP-sharded on dim 0 over efsdp 4 (efsdp x ep = 8 > 4
-- experts: Shard(1)); vocab 37 over tp 4 gives TP classes. Simulated on every
-- rank by tests/run.sh.
return {
  world_size = 8,
  parallel = { dp_shard = 2, tp = 4, ep = 2 },
  model = { family = "mixtral", dtype = "fp32", seq_len = 8, dim = 16, n_layers = 2, n_heads = 4, n_kv_heads = 4,
            vocab_size = 37, moe_hidden_dim = 16, num_experts = 4, top_k = 2 },
  fsdp = { reduce_op = "sum" },
}
