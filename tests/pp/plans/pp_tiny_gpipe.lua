-- A tiny Llama on a pipeline of 4 ranks, no FSDP (world 4), GPipe: every
-- forward, then every backward, one stage per rank; for the pipeline
-- tables' tests: 4 layers, 8 microbatches of one sequence.
return {
  world_size = 4,
  parallel = { pp = 4, dp_shard = 1 },
  model = { family = "llama", dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab_size = 256,
            multiple_of = 16, seq_len = 16 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 8 },
  pipeline = { schedule = "GPipe", microbatches = 8 },
}
