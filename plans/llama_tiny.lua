-- A tiny member of the Llama 3 family (torchtitan's names and order) on
-- four ranks: small enough to simulate every rank on every push. Its loss
-- is CrossEntropyLoss on the whole logits (loss_chunks = 1), the order
-- the Python package's CommplanFSDP drives and its plan writer writes
-- (tests/python/test_plan_writer.py); llama_tiny_tp and llama_tiny_tp_nosp
-- follow torchtitan's ChunkedLossWrapper (the default, 8 chunks).
return {
  world_size = 4,
  parallel = { dp_shard = -1 },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 128 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { loss_chunks = 1 },
}
