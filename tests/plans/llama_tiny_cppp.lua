-- Context parallel inside a pipeline (CP x PP) on four ranks: the tiny Llama
-- of tests/titan/test_cppp_record.py (torchtitan 0.3's pipeline_llm with CP
-- inside each stage, recorded on gloo) at pp 2 x cp 2: each pipeline rank's
-- stage sharded by FSDP over its cp pair (dp_shard x cp), each block's K and
-- V all-gathered over cp in every microbatch's forward and their gradients
-- reduce-scattered in its backward, the activations sent between stages
-- seq_len / cp long (docs/pipeline.md, docs/context-parallel.md). Two
-- microbatches of one sequence of 512 tokens (flex's CP block mask: a
-- multiple of cp x 128), 1F1B.
return {
  world_size = 4,
  parallel = { pp = 2, cp = 2 },
  model = { family = "llama", dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250,
            multiple_of = 16, ffn_dim_multiplier = 1.3, seq_len = 512 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  training = { local_batch_size = 2, loss_chunks = 1 },
  pipeline = { schedule = "1F1B", microbatches = 2 },
}
