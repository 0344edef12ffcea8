-- Llama-3-70B's communication structure at a size one GPU can hold: the
-- llama70b plan's mesh (1,024 ranks, HSDP 16 x 64), 80 decoder layers plus
-- the root unit, the same nine parameters per layer and the same op list
-- (copy-in, all-gather, copy-out, reshard, pack, reduce-scatter, all-reduce,
-- view-out per unit), with dim 1024 instead of 8192. Host enqueue cost
-- depends on that structure, not on the byte counts: bench/gpu_session.sh
-- times one rank of it with --standin.
return {
  world_size = 1024,
  parallel = { dp_replicate = 16, dp_shard = -1 },
  model = { family = "llama", dim = 1024, n_layers = 80, n_heads = 64, n_kv_heads = 8, vocab_size = 128256,
            ffn_dim_multiplier = 1.3, multiple_of = 4096, seq_len = 8192 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" },
  topology = { gpus_per_node = 8 },
}
