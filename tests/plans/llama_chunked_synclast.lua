-- torchtitan's ChunkedLossWrapper (loss_chunks = 4) under sync_last: the
-- wrapper turns gradient sync on for lm_head's last chunk and leaves it on,
-- so the [norm, lm_head] unit is reduced (in two parts) on every
-- micro-step while the other units reduce on the last only
-- (gen/parallel/fsdp_schedule.lua); the live peer runs the wrapper's
-- protocol (tests/live/record.py) against it.
return {
  world_size = 4,
  parallel = { dp_replicate = 2, dp_shard = -1 },
  model = { family = "llama", dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 37,
            multiple_of = 16, seq_len = 16 },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", micro_steps = 3, grad_accumulation = "sync_last" },
  training = { loss_chunks = 4 },
}
