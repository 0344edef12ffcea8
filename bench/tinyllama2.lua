-- TinyLlama-shaped, 2 layers, 4 ranks: the simulator's speed case.
return {
  world_size = 4,
  parallel = { dp_shard = -1 },
  model = { family = "llama", dim = 2048, n_layers = 2, n_heads = 32, n_kv_heads = 4, vocab_size = 32000,
            multiple_of = 256, ffn_dim_multiplier = 1.0, seq_len = 2048 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
}
