-- The dense Qwen3 tests/tp_record.py records under torchtitan's Qwen3 TP
-- plan (models/qwen3/sharding.py, sequence and loss parallelism on; gloo on
-- CPU): a tiny tied Qwen3 on tp = 2 alone, fp32, local batch 2 x seq_len
-- 32 (its config qwen3_tied_tp2_sp). Its TP collectives and every
-- parameter's placements and TP-local shape must match the recording's.
return {
  world_size = 2,
  parallel = { tp = 2, sequence_parallel = true },
  model = { family = "qwen3", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 250,
            hidden_dim = 96, enable_weight_tying = true, seq_len = 32 },
  training = { local_batch_size = 2 },
}
