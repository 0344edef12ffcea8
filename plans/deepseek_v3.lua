-- DeepSeek-V3 671B as torchtitan 0.3 configures it (deepseek_v3_671b:
-- expert parallel 2, FSDP over the rest, local batch 4 of 4,096 tokens,
-- selective activation checkpointing; its pipeline schedule is named but
-- pipeline_parallel_degree stays 1) on 512 H100s (64 nodes of 8). 256
-- routed experts over ep 2 (128 per rank), FSDP-sharded over efsdp 256;
-- gradients summed (torchtitan's divide factor 1). Token buffers: dropless
-- (torchtitan's dispatcher drops no token). A rank does not fit 80 GB by
-- commplan's memory model (141 GiB, 79 of it activations, which no FSDP
-- width divides: docs/expert-parallel.md, "Activations"); the plan keeps
-- torchtitan's settings to show it.
return {
  world_size = 512,
  parallel = { dp_shard = -1, ep = 2 },
  model = { family = "deepseek_v3", size = "671b", seq_len = 4096 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  topology = { gpus_per_node = 8 },
  training = { local_batch_size = 4, activation_checkpointing = "selective" },
}
