-- Expert parallel 2 on 4 ranks under activation checkpointing (selective,
-- as torchtitan's MoE configs run): the backward re-runs each MoE block's
-- forward, and with it the token dispatcher's counts exchange, dispatch and
-- combine (torchtitan 0.3's spmd_types dispatcher issues them as
-- c10d.alltoall_, which SelectiveAC recomputes: docs/expert-parallel.md),
-- before the block's two backward all-to-alls. The recompute's counts go to
-- the micro-step's own slot and must equal its forward's (the executor
-- checks). Six micro-steps (the tables repeat the middle ones: a recompute
-- counts op names its forward's inside the repeated run).
return {
  world_size = 4,
  parallel = { dp_shard = -1, ep = 2 },
  model = {
    family = "mixtral", dtype = "fp32", seq_len = 8,
    dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 10, num_experts = 4,
    top_k = 2,
  },
  fsdp = { reduce_op = "sum", micro_steps = 6 },
  training = { activation_checkpointing = "selective" },
}
