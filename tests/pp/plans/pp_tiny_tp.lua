-- A tiny Llama on a pipeline of 2 ranks x FSDP 2 x TP 2 (world 8, the shape
-- of torchtitan's Llama 3 405B configuration: FSDP x TP x PP), for the
-- pipeline tables' tests: 4 layers, 4 microbatches, Interleaved1F1B (two
-- stages per rank), sequence parallel; the vocabulary (251 rows) splits
-- 126 / 125 over TP, so the two TP ranks have their own tables (a class
-- per pipeline rank and TP class).
return {
  world_size = 8,
  parallel = { pp = 2, dp_shard = -1, tp = 2 },
  model = { family = "llama", dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab_size = 251,
            multiple_of = 16, seq_len = 16 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 4 },
  pipeline = { schedule = "Interleaved1F1B", microbatches = 4 },
}
