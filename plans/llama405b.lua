-- Llama 3 405B on 16,384 H100s (2,048 nodes of 8): HSDP, 64 replicas of a
-- 256-way shard group (32 nodes), fp32 shards and bf16 all-gathers.
return {
  world_size = 16384,
  parallel = { dp_replicate = 64, dp_shard = -1 },
  model = { family = "llama", size = "405b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full" }, -- as torchtitan's llama3_405b.toml
}
