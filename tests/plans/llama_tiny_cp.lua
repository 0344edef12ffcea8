-- Context parallel on four ranks: the tiny Llama of tests/titan/test_cp_record.py
-- (torchtitan 0.3's llama3 recorded on gloo) at dp_shard 2 x cp 2: FSDP over
-- all four ranks (dp_shard x cp), each block's K and V all-gathered over its
-- cp pair in forward and their gradients reduce-scattered in backward
-- (docs/context-parallel.md). Local batch 2 x seq_len 512 (flex's CP block
-- mask: a multiple of cp x 128), bf16 all-gathers, fp32 reductions.
return {
  world_size = 4,
  parallel = { dp_shard = 2, cp = 2 },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 512 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 2, loss_chunks = 1 },
}
