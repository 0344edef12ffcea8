-- Expert parallel 4 on 4 ranks (issue 23): one expert per rank and efsdp of
-- one rank, so the experts' FSDP group issues no collective (FSDP2's
-- world-size-1 path: a local copy) while the dense parameters all-gather and
-- reduce-scatter over dp_shard 4. bf16 all-gathers, fp32 reductions; a
-- capacity factor of 1.5 (ceil(1.5 x 6 tokens x 2 / 4) = 5 rows per member).
return {
  world_size = 4,
  parallel = { dp_shard = -1, ep = 4 },
  model = {
    family = "mixtral", dtype = "fp32", seq_len = 6,
    dim = 8, n_layers = 2, n_heads = 2, n_kv_heads = 1, vocab_size = 19, moe_hidden_dim = 6, num_experts = 4,
    top_k = 2,
  },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  expert_parallel = { capacity_factor = 1.5 },
}
