-- A tiny Llama on a pipeline of 2 ranks x FSDP over 2 (world 4), DualPipeV:
-- V-shaped stages (two per rank), microbatches fed from both ends, its
-- OVERLAP_F_B actions run as their forward and backward in turn; for the
-- pipeline tables' tests: 4 layers, 4 microbatches of one sequence.
return {
  world_size = 4,
  parallel = { pp = 2, dp_shard = -1 },
  model = { family = "llama", dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab_size = 256,
            multiple_of = 16, seq_len = 16 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 4 },
  pipeline = { schedule = "DualPipeV", microbatches = 4 },
}
