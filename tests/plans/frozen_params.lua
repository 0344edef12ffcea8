-- Frozen parameters (requires_grad=False: torchtitan 0.3's LoRA converter freezes its base weights;
-- docs/plan-files.md "model"): all-gathered with their units, never reduced. l0 holds frozen ones between
-- trainable ones (its reduce-scatter packs l0.a, l0.b alone), l1 only a frozen one (no reduction at all).
-- tests/live/live.py holds it to fully_shard on gloo; the emulator and the host-built kernels run it too.
return { world_size = 4, parallel = { dp_replicate = 2, dp_shard = 2 },
  model = { family = "generic", units = {
    { name = "l0", params = { { name = "l0.w", shape = { 6, 5 }, frozen = true }, { name = "l0.a", shape = { 2, 5 } },
                              { name = "l0.b", shape = { 6, 2 } }, { name = "l0.n", shape = { 5 }, frozen = true } } },
    { name = "l1", params = { { name = "l1.w", shape = { 7, 3 }, frozen = true } } },
    { name = "root", params = { { name = "r.w", shape = { 9 } } } } } },
  fsdp = { micro_steps = 2 } }
