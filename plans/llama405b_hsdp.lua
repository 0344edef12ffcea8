-- Llama 3 405B on 16,384 H100s (2,048 nodes of 8), the 3D layout Meta
-- trained it with minus pipelining: TP 8 inside each node, HSDP across
-- nodes with 8 replicas of a 256-node shard group; fp32 shards, bf16
-- all-gathers and activations.
return {
  world_size = 16384,
  parallel = { dp_replicate = 8, dp_shard = -1, tp = 8 },
  model = { family = "llama", size = "405b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full" }, -- as torchtitan's llama3_405b.toml
}
