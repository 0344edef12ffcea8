-- fsdp.symm_mem on tests/ep/plans/ep2_mixtral.lua's job: the dense units'
-- buffers and the experts' in one symmetric window per rank, registered on
-- both the fsdp and the efsdp communicators (runtime/gpu.c); the emulator
-- checks every rank's offsets on each.
return {
  world_size = 4,
  parallel = { dp_shard = -1, ep = 2 },
  model = {
    family = "mixtral", dtype = "fp32", seq_len = 8,
    dim = 12, n_layers = 2, n_heads = 3, n_kv_heads = 1, vocab_size = 29, moe_hidden_dim = 10, num_experts = 4,
    top_k = 2,
  },
  fsdp = { reduce_op = "sum", symm_mem = true },
}
