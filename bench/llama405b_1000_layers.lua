-- plans/llama405b_hsdp.lua's model and mesh with 1,000 decoder layers instead of
-- 126 (1,003 units: a unit per layer, the embedding, norm and output, and
-- the parameterless root): the deep-model case bench/gen_time.sh times
-- generation at.
return {
  world_size = 16384,
  parallel = { dp_replicate = 8, dp_shard = -1, tp = 8 },
  model = { family = "llama", size = "405b", n_layers = 1000, seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full" },
}
