-- The tiny Llama on FSDP + TP without sequence parallelism: dp_shard 2 x
-- tp 2. wo and w2 all-reduce their outputs in forward, the block inputs'
-- gradients are all-reduced in backward, the embedding all-reduces its
-- partial sums.
return {
  world_size = 4,
  parallel = { dp_shard = -1, tp = 2, sequence_parallel = false },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 32 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
}
