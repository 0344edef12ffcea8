-- Llama 3 405B as torchtitan's 405B configuration runs it with pipelining:
-- FSDP 8 x TP 8 x PP 8 on 512 H100s (64 nodes of 8), 16 microbatches of
-- one 8,192-token sequence per step, full activation checkpointing.
-- `make pipeline PLAN=bench/llama405b_pp.lua` compares torch's schedules
-- for it (gen/parallel/pp_report.lua); `make PLAN=bench/llama405b_pp.lua`
-- builds its tables (a class per pipeline rank, gen/parallel/pp_build.lua).
return {
  world_size = 512,
  parallel = { dp_shard = 8, tp = 8, pp = 8 },
  pipeline = { schedule = "Interleaved1F1B", microbatches = 16 },
  model = { family = "llama", size = "405b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full", local_batch_size = 16 },
}
