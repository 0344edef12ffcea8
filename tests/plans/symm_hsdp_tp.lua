-- fsdp.symm_mem under HSDP x TP (plans/llama_tiny_tp.lua's job): the window
-- registered on the fsdp communicator of every (replica, TP rank); the
-- replicate all-reduce stays outside it (FSDP2 runs it with dist.all_reduce,
-- torch 2.15 _fsdp_collectives.py:720-730).
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = -1, tp = 2, sequence_parallel = true },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 251,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 32 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", symm_mem = true },
  training = { local_batch_size = 2 },
}
