-- Llama 3 70B on 1,024 H100s (128 nodes of 8), as torchtitan runs it: TP 8
-- inside each node (sequence parallel, on NVLink), and HSDP across nodes:
-- 16 replicas of an 8-node shard group, so each reduce-scatter stays within
-- 8 nodes and only the 1/8-sized all-reduce crosses replicas.
return {
  world_size = 1024,
  parallel = { dp_replicate = 16, dp_shard = -1, tp = 8 },
  model = { family = "llama", size = "70b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "full" }, -- as torchtitan's llama3_70b.toml
}
