-- Llama 3 8B on 64 H100s (8 nodes of 8): plain FSDP over all 64 ranks,
-- torchtitan's mixed precision (fp32 shards, bf16 all-gather, fp32 reduce).
return {
  world_size = 64,
  parallel = { dp_shard = -1 },
  model = { family = "llama", size = "8b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "selective" }, -- op-level SAC, as torchtitan's llama3_8b.toml
}
