-- Context parallel beside tensor parallel (CP x TP) on four ranks: the tiny
-- Llama of tests/titan/test_cp_record.py's cp2_tp2 (torchtitan 0.3's llama3
-- recorded on gloo) at cp 2 x tp 2 with sequence parallelism: FSDP over the
-- cp pair (dp_shard x cp, TP the inner dim), TP's activation collectives
-- over the rank's seq_len / cp tokens, each block's K and V of its TP-local
-- kv heads (n_kv_heads / tp) all-gathered over cp between TP's attention
-- input gather and wo's reduce-scatter (docs/context-parallel.md). Local
-- batch 2 x seq_len 512 (tp x 2 x cp and cp x 128 divide it).
return {
  world_size = 4,
  parallel = { cp = 2, tp = 2 },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 512 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 2, loss_chunks = 1 },
}
