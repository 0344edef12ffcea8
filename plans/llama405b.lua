-- Llama 3.1 405B as torchtitan ran it on 512 H100s (64 nodes of 8) for
-- its published 3D benchmark (docs/performance.md, Table 5: FSDP 8, TP 8,
-- PP 8, local batch 32, global batch 256, full activation checkpointing,
-- async TP; Interleaved 1F1B 128 tokens/s per GPU, 1F1B 100, with
-- torch.compile and Float8, which this plan does not model: bf16 matmuls).
-- 32 microbatches of one 8,192-token sequence (torchtitan's default
-- pipeline_parallel_microbatch_size = 1), two stages per pipeline rank.
-- `make pipeline PLAN=llama405b.lua` compares torch's schedules for it;
-- plans/llama405b_hsdp.lua is the same model on 16,384 GPUs without PP.
return {
  world_size = 512,
  parallel = { dp_shard = 8, tp = 8, pp = 8, async_tp = true },
  pipeline = { schedule = "Interleaved1F1B", microbatches = 32 },
  model = { family = "llama", size = "405b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full", local_batch_size = 32 },
}
