-- A tiny Qwen3 (dense, untied: torchtitan refuses weight tying under PP)
-- on a pipeline of 2 ranks x FSDP over 2 (world 4): 4 layers, 4
-- microbatches of one sequence, torchtitan's stage split
-- (pipeline_parallel.py's _generate_llm_fqn_per_model_part).
return {
  world_size = 4,
  parallel = { pp = 2, dp_shard = -1 },
  model = { family = "qwen3", dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 256,
            hidden_dim = 96, seq_len = 16 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  training = { local_batch_size = 4 },
  pipeline = { schedule = "1F1B", microbatches = 4 },
}
