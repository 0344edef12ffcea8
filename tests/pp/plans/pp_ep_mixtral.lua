-- PP x EP (issue 35): a tiny Mixtral-like MoE (4 routed experts, top 2) on
-- a pipeline of 2 ranks, each stage FSDP over 2 with expert parallel 2
-- (world 4: ep borrows the stage mesh's dp_shard, efsdp 1). Each stage's
-- token all-to-alls run inside every microbatch's forward and backward;
-- gradients reduced once, after the last microbatch (step_end, as
-- torchtitan's pipeline runs FSDP). tests/run.sh simulates it.
return {
  world_size = 4,
  parallel = { pp = 2, dp_shard = -1, ep = 2 },
  model = {
    family = "mixtral", dtype = "fp32", seq_len = 8,
    dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 10, num_experts = 4,
    top_k = 2,
  },
  fsdp = { reduce_op = "sum" },
  training = { local_batch_size = 4 },
  pipeline = { schedule = "1F1B", microbatches = 4 },
}
