-- Mixtral 8x7B trained the way torchtitan trains its MoE models (torchtitan
-- 0.3 has no Mixtral recipe: its DeepSeek-V3 and Qwen3-MoE ones, with
-- Mixtral's dims) on 64 H100s (8 nodes of 8): expert parallel 8 (one of
-- the 8 experts per rank of each ep group) inside a node, FSDP over the
-- rest (efsdp 8 across nodes), local batch 4 of 4,096 tokens, selective
-- activation checkpointing, gradients summed (torchtitan's divide factor
-- 1). Token buffers: dropless.
return {
  world_size = 64,
  parallel = { dp_shard = -1, ep = 8 },
  model = { family = "mixtral", size = "8x7b", seq_len = 4096 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  topology = { gpus_per_node = 8 },
  training = { local_batch_size = 4, activation_checkpointing = "selective" },
}
