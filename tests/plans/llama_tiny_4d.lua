-- The four dense parallelisms at once on sixteen ranks (torchtitan's 4D
-- mesh in small: FSDP 2 x CP 2 x TP 2 x PP 2, plans/llama405b_4d.lua's
-- shape): each pipeline rank's stage sharded by FSDP over dp_shard x cp, TP
-- inside, each block's K/V of its TP-local heads exchanged over cp in every
-- microbatch, the activations between stages seq_len / cp long (and split
-- over TP's sequence shards). Two microbatches of one 512-token sequence,
-- 1F1B.
return {
  world_size = 16,
  parallel = { pp = 2, dp_shard = 2, cp = 2, tp = 2 },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 512 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  training = { local_batch_size = 2, loss_chunks = 1 },
  pipeline = { schedule = "1F1B" },
}
