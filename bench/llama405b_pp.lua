-- plans/llama405b.lua (torchtitan's 3D 405B run: FSDP 8 x TP 8 x PP 8 on
-- 512 H100s) at 16 microbatches and without async TP: the pipeline tests'
-- fixture (tests/run.sh, tests/lua/test_pp_step_proof.lua), whose counts
-- and line numbers they hold (keep this comment six lines).
-- `make pipeline PLAN=bench/llama405b_pp.lua` compares torch's schedules
-- for it.
return {
  world_size = 512,
  parallel = { dp_shard = 8, tp = 8, pp = 8 },
  pipeline = { schedule = "Interleaved1F1B", microbatches = 16 },
  model = { family = "llama", size = "405b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full", local_batch_size = 16 },
}
