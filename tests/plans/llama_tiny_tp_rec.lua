-- The model tests/tp_record.py records under PyTorch's TP + sequence
-- parallelism (torchtitan's plan, gloo on CPU): a tiny Llama on tp = 2
-- alone, fp32, local batch 2 x seq_len 32. Its TP activation collectives
-- must match the recording's, in order, phase and size.
return {
  world_size = 2,
  parallel = { tp = 2, sequence_parallel = true },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 32 },
  training = { local_batch_size = 2 },
}
