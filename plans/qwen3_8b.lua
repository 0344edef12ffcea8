-- Qwen3 8B (torchtitan 0.3's qwen3 "8B" flavour: fused qkv, q/k norms,
-- untied embeddings) on 64 H100s (8 nodes of 8), trained as torchtitan's
-- only 8B recipe (models/qwen3/config_registry.py sft_qwen3_8b_math) sets
-- it: local batch 1 of 2,048 tokens, selective activation checkpointing,
-- ChunkedLossWrapper (8 chunks), torchtitan's mixed precision (fp32
-- shards, bf16 all-gather, fp32 reduce) and its gradient sum (divide
-- factor 1). The recipe gives no mesh (dp_shard = -1: FSDP over every
-- rank), so the mesh is plain FSDP over all 64.
return {
  world_size = 64,
  parallel = { dp_shard = -1 },
  model = { family = "qwen3", size = "8b", seq_len = 2048 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  topology = { gpus_per_node = 8 },
  training = { local_batch_size = 1, activation_checkpointing = "selective" },
}
