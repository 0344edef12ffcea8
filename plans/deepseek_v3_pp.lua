-- DeepSeek-V3 671B with pipeline parallel, as torchtitan 0.3's config
-- splits it: deepseek_v3_671b (models/deepseek_v3/config_registry.py:206-243)
-- names pipeline_parallel_schedule = "Interleaved1F1B" beside expert
-- parallel 2, local batch 4 of 4,096 tokens and selective activation
-- checkpointing; its pipeline_parallel_degree is left at the default 1
-- (config/configs.py:174), as in every torchtitan config of the family (the
-- 671B toml of earlier torchtitan too), so the degree is the plan's: pp 4,
-- the most the 4 microbatches of torchtitan's default microbatch size 1
-- (configs.py:226, local_batch_size / 1) keep busy. Interleaved1F1B runs 2
-- stages per rank (pipeline_parallel.py _get_pipeline_metadata: 2 virtual
-- stages per rank by default), 8 stages over 61 layers + the embedding and
-- the output, split by _generate_llm_fqn_per_model_part (the first 3
-- dense blocks on stage 0). 512 H100s (64 nodes of 8), as plans/deepseek_v3
-- runs the same config without PP: each stage mesh of 128 ranks runs FSDP
-- over dp_shard 128 with the 256 routed experts over ep 2, FSDP-sharded over
-- efsdp 64; gradients summed (torchtitan's divide factor 1), reduced once
-- after the last microbatch (PP's step_end). Token buffers dropless.
return {
  world_size = 512,
  parallel = { pp = 4, dp_shard = -1, ep = 2 },
  model = { family = "deepseek_v3", size = "671b", seq_len = 4096 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
  topology = { gpus_per_node = 8 },
  training = { local_batch_size = 4, activation_checkpointing = "selective" },
  pipeline = { schedule = "Interleaved1F1B" },
}
