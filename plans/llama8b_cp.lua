-- Llama 3 8B at long context on 64 H100s (8 nodes of 8): context parallel
-- over each node's 8 GPUs (cp = 8, consecutive ranks) x FSDP over all 64
-- (torchtitan 0.3 shards over dp_shard x cp), 128K-token sequences: each
-- rank runs 16K tokens of every sequence and every block all-gathers K and
-- V over its node in forward, reduce-scattering their gradients in
-- backward (docs/context-parallel.md). torchtitan's mixed precision,
-- op-level SAC and chunked loss, as its llama3_8b config.
return {
  world_size = 64,
  parallel = { dp_shard = -1, cp = 8 },
  model = { family = "llama", size = "8b", seq_len = 131072 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
  training = { activation_checkpointing = "selective" },
}
