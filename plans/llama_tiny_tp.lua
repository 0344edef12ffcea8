-- The tiny Llama on HSDP + TP (3D, as torchtitan runs Llama 3 405B):
-- dp_replicate 2 x dp_shard 2 x tp 2 = 8 ranks. torchtitan's TP plan with
-- sequence parallelism: every block gathers its sequence before attention
-- and the feed-forward and reduce-scatters after wo and w2. The vocabulary
-- (251 rows) splits 126 / 125 over TP, so TP ranks 0 and 1 have different
-- fused slots (two TP classes).
return {
  world_size = 8,
  parallel = { dp_replicate = 2, dp_shard = -1, tp = 2, sequence_parallel = true },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 251,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 32 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 2 },
}
