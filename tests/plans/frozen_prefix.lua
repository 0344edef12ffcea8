-- The frozen prefix (issue 41; docs/plan-files.md "model"): a frozen embedding and two blocks whose
-- parameters are all frozen, fed an input that needs no gradient (model.input_requires_grad = false,
-- token ids' case). FSDP2 hooks no pre-backward on them (their outputs need no gradient), so none
-- all-gathers for itself in backward nor prefetches the one before (emb is not gathered in backward);
-- l2's pre-backward still prefetches l1, an all-gather never waited on; emb, l0, l1 and l2 (whose
-- input needs no gradient) post-backward from the root's final callback, in forward order
-- (gen/parallel/fsdp_layout.lua frozen_prefix). l0 keeps its parameters unsharded after forward, so
-- its final-callback post-backward reshards them. HSDP, two micro-steps. tests/live/live.py holds it
-- to fully_shard on gloo (planned as if every unit ran a pre-backward, emb's backward all-gather
-- would be one collective too many).
return { world_size = 4, parallel = { dp_replicate = 2, dp_shard = 2 },
  model = { family = "generic", input_requires_grad = false, units = {
    { name = "emb", params = { { name = "emb.w", shape = { 8, 4 }, frozen = true } } },
    { name = "l0", reshard_after_forward = false, params = { { name = "l0.w", shape = { 6, 5 }, frozen = true } } },
    { name = "l1", params = { { name = "l1.w", shape = { 6, 5 }, frozen = true }, { name = "l1.n", shape = { 5 }, frozen = true } } },
    { name = "l2", params = { { name = "l2.w", shape = { 7, 3 }, frozen = true }, { name = "l2.a", shape = { 2, 3 } },
                              { name = "l2.b", shape = { 7, 2 } } } },
    { name = "l3", params = { { name = "l3.w", shape = { 5, 3 } } } },
    { name = "root", params = { { name = "r.w", shape = { 9 }, frozen = true } } } } },
  fsdp = { micro_steps = 2 } }
