-- Llama 3.1 405B as torchtitan ran it on 512 H100s for its published 4D
-- benchmark (docs/performance.md, Table 6: FSDP + TP + PP + CP, TP 8, PP 8,
-- 1F1B, local batch 8, full activation checkpointing, async TP; with
-- torch.compile and Float8, which this plan does not model: bf16 matmuls),
-- at one of its sequence lengths: 65,536 tokens with FSDP 4 x CP 2 (47
-- tokens/s per GPU published). Eight microbatches of one sequence
-- (torchtitan's default pipeline_parallel_microbatch_size = 1), each
-- sequence split over the cp pair (head-tail load balancing), every
-- block's K and V all-gathered over cp inside each stage; one stage per
-- pipeline rank (1F1B). plans/llama405b.lua is Table 5's 3D run.
return {
  world_size = 512,
  parallel = { dp_shard = 4, cp = 2, tp = 8, pp = 8, async_tp = true },
  pipeline = { schedule = "1F1B" },
  model = { family = "llama", size = "405b", seq_len = 65536 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full", local_batch_size = 8 },
}
