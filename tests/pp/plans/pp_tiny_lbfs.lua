-- A tiny Llama on a pipeline of 2 ranks x HSDP (2 replicas x FSDP 2, world
-- 8), LoopedBFS: every forward of a rank's first stage before its second,
-- backwards in the schedule's own micro-batch order (the grads accumulate
-- in it), for the pipeline tables' tests: 4 layers, 4 microbatches.
return {
  world_size = 8,
  parallel = { pp = 2, dp_replicate = 2, dp_shard = -1 },
  model = { family = "llama", dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab_size = 256,
            multiple_of = 16, seq_len = 16 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 4 },
  pipeline = { schedule = "LoopedBFS", microbatches = 4 },
}
