-- The provoked-fault matrix's pipeline plan (tests/diagnose/faults.py, pp_schedule, pp_none):
-- tests/pp/pp_titan_cases.py's qwen3_pp2 as tests/pp/compare_titan_pp.lua --write-plans writes it, the
-- job tests/diagnose/titan_fault_job.py runs with torchtitan 0.3's pipeline_llm (pp 2 x dp_shard 2, 1F1B
-- over 2 microbatches).
return {
  world_size = 4,
  parallel = { pp = 2, dp_shard = 2 },
  model = { family = "qwen3", dtype = "fp32", seq_len = 8, dim = 32, n_layers = 4, n_heads = 4, n_kv_heads = 2,
            head_dim = 8, vocab_size = 64, hidden_dim = 48, enable_weight_tying = false },
  fsdp = { reduce_op = "sum" },
  training = { local_batch_size = 2, activation_checkpointing = "none" },
  pipeline = { schedule = "1F1B", microbatches = 2 },
}
