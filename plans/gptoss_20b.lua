-- gpt-oss 20B as torchtitan 0.3 configures it (models/gpt_oss/
-- config_registry.py:70-98, gpt_oss_20b: expert_parallel_degree 1, FSDP
-- over every rank, local batch 1 of 8,192 tokens, full activation
-- checkpointing, ChunkedLossWrapper) on one node of 8 H100s. 24 blocks,
-- even ones with a 128-token sliding window; 32 routed experts (top 4) per
-- block, with their biases FSDP-sharded on dim 0 with the weights
-- (8 ranks <= 32 experts: distributed/fsdp.py:220-233). Gradients summed
-- (torchtitan's divide factor 1).
return {
  world_size = 8,
  parallel = { dp_shard = -1 },
  model = { family = "gpt_oss", size = "20b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  topology = { gpus_per_node = 8 },
  training = { local_batch_size = 1, activation_checkpointing = "full" },
}
