-- gpt-oss 120B as torchtitan 0.3 configures it (models/gpt_oss/
-- config_registry.py:101-129, gpt_oss_120b: local batch 1 of 8,192
-- tokens, full activation checkpointing, ChunkedLossWrapper) with expert
-- parallelism 8 (--parallelism.expert_parallel_degree 8; the registry's
-- own is 1) on 32 H100s (4 nodes of 8). 128 routed experts per block over
-- ep 8 (16 per rank, the ep groups inside a node), FSDP-sharded with their
-- biases over efsdp 4 (efsdp x ep = 32 <= 128: Shard(0), distributed/
-- fsdp.py:220-233); the dense parameters over all 32 ranks. Token buffers
-- dropless (torchtitan's dispatcher drops no token). Gradients summed
-- (torchtitan's divide factor 1).
return {
  world_size = 32,
  parallel = { dp_shard = -1, ep = 8 },
  model = { family = "gpt_oss", size = "120b", seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  topology = { gpus_per_node = 8 },
  training = { local_batch_size = 1, activation_checkpointing = "full" },
}
