-- plans/llama405b_hsdp.lua (Llama 3 405B on 16,384 H100s: TP 8, HSDP 8 x 256,
-- full activation checkpointing) with 16 gradient-accumulation micro-steps
-- (FSDP2's default accumulation: every backward reduces): the real-job
-- micro-batch count bench/gen_time.sh times generation at.
return {
  world_size = 16384,
  parallel = { dp_replicate = 8, dp_shard = -1, tp = 8 },
  model = { family = "llama", size = "405b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", micro_steps = 16 },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full" },
}
