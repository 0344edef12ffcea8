-- Pipeline parallel on every decoder family (issue 35): torchtitan 0.3's
-- pipeline_llm splits llama3, qwen3 and deepseek_v3 alike by module names
-- (distributed/pipeline_parallel.py:88-92, _generate_llm_fqn_per_model_part
-- :366-476); gen/parallel/pp_report.lua's unit_names maps each stage's
-- modules to the family's FSDP units (gen/models/*.lua) by one rule. Each
-- family's stages, its tables against torch's sequence (the generator's
-- proofs), and the refusals torchtitan makes.
local H = require("helpers")
local plan = require("gen.plan")
local report = require("gen.parallel.pp_report")
local T = {}

local MODELS = {
  qwen3 = 'dim = 64, n_layers = 4, n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 256, hidden_dim = 96',
  mixtral = 'dim = 16, n_layers = 4, n_heads = 4, n_kv_heads = 2, vocab_size = 64, moe_hidden_dim = 8, '
    .. 'num_experts = 4, top_k = 2',
  qwen3_moe = 'dim = 16, n_layers = 4, n_heads = 4, n_kv_heads = 2, head_dim = 8, vocab_size = 64, '
    .. 'moe_hidden_dim = 8, num_experts = 4, top_k = 2',
  deepseek_v3 = 'dim = 16, n_layers = 4, n_dense_layers = 1, n_heads = 2, vocab_size = 64, kv_lora_rank = 8, '
    .. 'qk_nope_head_dim = 4, qk_rope_head_dim = 4, v_head_dim = 4, dense_hidden_dim = 24, moe_hidden_dim = 8, '
    .. 'num_experts = 4, num_shared_experts = 1, top_k = 2',
}

local function src(family, o)
  o = o or {}
  return string.format([[return { world_size = %d, parallel = { pp = %d, %s dp_shard = -1 },
  model = { family = %q, %s, seq_len = 16 %s },
  fsdp = { param_dtype = "bf16", reduce_dtype = "fp32" %s }, training = { local_batch_size = 4 %s },
  pipeline = { schedule = %q, microbatches = 4 } }]], o.world or 4, o.pp or 2, o.par or "", family, MODELS[family],
    o.model or "", o.fsdp or "", o.training or "", o.schedule or "1F1B")
end

local function build(family, o)
  return plan.from_source(src(family, o), "tests/pp/plans/pp_" .. family .. ".lua")
end

-- the units of each pipeline rank (class per rank, TP class 0)
local function rank_units(p)
  local out = {}
  for _, c in ipairs(p.tp_classes) do
    if c.tp_class == 0 or c.tp_class == nil then
      local names = {}
      for _, u in ipairs(c.layout.units) do names[#names + 1] = u.name end
      out[c.pp_rank + 1] = table.concat(names, " ")
    end
  end
  return out
end

-- torchtitan's split of 4 layers over 2 stages (effective 6: 3 each, the
-- embedding and the output weighing one layer each): [tok_embeddings,
-- layers.0, layers.1], [layers.2, layers.3, norm, lm_head]; over 4
-- (Interleaved1F1B's 2 per rank): [tok_embeddings, layers.0], [layers.1,
-- layers.2 ], ... each mapped to the family's units
function T.every_decoder_family_splits_as_torchtitan()
  for family, out in pairs({ qwen3 = "norm_lm_head", mixtral = "norm_lm_head", qwen3_moe = "norm_lm_head",
                             deepseek_v3 = "norm_lm_head" }) do
    local p = build(family)
    H.list_eq(rank_units(p), { "tok_embeddings layers.0 layers.1", "layers.2 layers.3 " .. out }, family .. " 1F1B")
    H.eq(p.pipeline.sched.num_stages, 2, family .. " stages")
    local i = build(family, { schedule = "Interleaved1F1B" })
    -- stages 0, 2 on rank 0; 1, 3 on rank 1 (effective 6 over 4: 2, 2, 1, 1)
    H.list_eq(rank_units(i), { "tok_embeddings layers.0 layers.3", "layers.1 layers.2 " .. out },
      family .. " Interleaved1F1B")
  end
end

-- the unit rule itself: a module's parameters' unit, lm_head the loss
-- head (the llama family's output.weight), a MoE block's experts group
-- (ep > 1: "layers.<i>.experts", state "layers.<i>") with its block
function T.unit_rule_over_each_family()
  local units = {
    { name = "tok_embeddings", params = { { name = "tok_embeddings.weight" } } },
    { name = "layers.1", params = { { name = "layers.1.attention.wo.weight" } } },
    { name = "layers.1.experts", state = "layers.1",
      params = { { name = "layers.1.moe.routed_experts.inner_experts.w1_EFD" } } },
    { name = "layers.10", params = { { name = "layers.10.attention.wo.weight" } } },
    { name = "norm_output", loss_head = true, params = { { name = "norm.weight" }, { name = "output.weight" } } },
    { name = "root", params = {} },
  }
  H.list_eq(report.unit_names(units, "layers.1"), { "layers.1", "layers.1.experts" }, "block and its experts")
  H.list_eq(report.unit_names(units, "layers.10"), { "layers.10" }, "layers.10 is not layers.1")
  H.list_eq(report.unit_names(units, "norm"), { "norm_output" }, "norm")
  H.list_eq(report.unit_names(units, "lm_head"), { "norm_output" }, "lm_head: the loss head")
  H.list_eq(report.unit_names(units, "tok_embeddings"), { "tok_embeddings" }, "embedding")
end

-- DeepSeek-V3's dense first blocks are ordinary layers.<i> modules: the
-- split counts them as layers (pipeline_parallel.py:366), the stage holds
-- their FeedForward parameters
function T.deepseek_dense_first_layers_in_the_first_stage()
  local p = build("deepseek_v3", { model = ", n_dense_layers = 2" })
  local c0 = p.tp_classes[1]
  local dense, moe = 0, 0
  for _, u in ipairs(c0.layout.units) do
    for _, q in ipairs(u.params) do
      if q.name:find("feed_forward.w1", 1, true) then dense = dense + 1 end
      if q.name:find("routed_experts", 1, true) then moe = moe + 1 end
    end
  end
  H.eq(dense, 2, "layers.0 and layers.1 dense, on stage 0")
  H.eq(moe, 0, "no MoE block on stage 0")
end

-- qwen3 with TP under PP (FSDP x TP x PP, torchtitan's qwen3 TP plan inside
-- each stage): a class per (pipeline rank, TP class), the proofs pass
function T.qwen3_pp_with_tp()
  local p = build("qwen3", { world = 8, par = "tp = 2," })
  H.eq(#p.tp_classes, 2, "a class per pipeline rank (every TP rank's shapes alike)")
  H.eq(p.dims.tp, 2, "tp")
  local tp_ops = 0
  for _, o in ipairs(p.tp_classes[2].ops) do if o.group == "tp" then tp_ops = tp_ops + 1 end end
  assert(tp_ops > 0, "TP collectives in pipeline rank 1's tables")
  assert(p.pipeline.counts and p.pipeline.counts.events > 0, "the whole-step proof ran")
end

-- Where torchtitan refuses: weight tying with PP (models/common/decoder.py:
-- 139-142); a generic model (no decoder module names to split by)
function T.pp_refusals_by_family()
  H.plan_fails(src("qwen3", { model = ", enable_weight_tying = true" }), "model.enable_weight_tying:",
    "Weight tying is not supported with Pipeline Parallel", "decoder.py:139")
  H.plan_fails([[return { world_size = 4, parallel = { pp = 2, dp_shard = -1 },
    model = { family = "generic", units = { { name = "a", params = { { name = "w", shape = { 8, 8 } } } } } },
    training = { local_batch_size = 4 } }]], "model.family:", "generic", "pipeline_parallel.py:88")
  -- the tied flavours by size, untied by the plan: accepted
  local p = plan.from_source(src("qwen3", { model = ", enable_weight_tying = false" }), "x.lua")
  H.eq(p.pp.size, 2, "untied qwen3 plans")
end

-- ------------------------------------------------------------- PP x EP
local tables = require("gen.parallel.pp_tables")
local seq = require("gen.parallel.pp_sequence")
local step_proof = require("gen.parallel.pp_step_proof")

local PPEP = H.read("tests/pp/plans/pp_ep_mixtral.lua")

local function ppep(edit) return plan.from_source(edit and edit(PPEP) or PPEP, "tests/pp/plans/pp_ep_mixtral.lua") end

-- The tables' events (TP class 0 of each pipeline rank) and torch's
-- expected sequence for plan p, as gen/parallel/pp.lua's proof builds them.
local function events(p)
  local pl, inner = p.pipeline, p.pipeline.stage_plan
  local W, R, E, TP = inner.dims.dp_shard, inner.dims.dp_replicate, inner.dims.ep, inner.dims.tp
  local ntp = #inner.tp_classes
  local first = {}
  for _, c in ipairs(p.tp_classes) do
    if (c.tp_class or 0) == 0 then first[c.pp_rank + 1] = { pp_rank = c.pp_rank, units = c.layout.units, ops = c.ops } end
  end
  H.eq(#first, pl.sched.pp, "a class per pipeline rank (" .. ntp .. " TP classes)")
  local t = report.tables(pl.loaded, nil, { skip_classes = true })
  local got = tables.events(first, seq.mesh(pl.sched.pp, W, R, E, TP), W)
  local want = seq.expected(pl.sched, seq.options(inner, t.act, t.stage_fsdp, t.stage_compute))
  return got, want, first
end

local function differ(got, want)
  for g = 1, math.max(#got, #want) do
    for i = 1, math.max(#got[g], #want[g]) do
      local x, y = got[g][i], want[g][i]
      if not x or not y then return string.format("rank %d event %d", g - 1, i - 1) end
      for _, k in ipairs({ "op", "peer", "numel", "dtype", "batch", "unit", "in_numel", "out_numel" }) do
        if x[k] ~= y[k] then return string.format("rank %d event %d %s", g - 1, i - 1, k) end
      end
    end
  end
  return nil
end

local function count_kind(ops, kind, phase)
  local n = 0
  for _, o in ipairs(ops) do if o.kind == kind and (not phase or o.phase == phase) then n = n + 1 end end
  return n
end

-- Each stage's token all-to-alls inside every microbatch's forward and
-- backward (EP's unit_ops at forward_before / forward / backward_before /
-- backward in pp_tables), a counts slot per microbatch, gradients reduced
-- once (step_end); the tables' events (all-to-alls on the ep group,
-- experts' FSDP on efsdp) equal torch's sequence and the whole step is
-- deadlock-free; a table without one all-to-all differs and fails the proof.
function T.pp_x_ep_all_to_alls_inside_each_microbatch()
  local p = ppep()
  H.eq(p.pp.size, 2, "pp"); H.eq(p.dims.ep, 2, "ep")
  H.eq(p.fsdp.grad_accumulation, "step_end", "FSDP as PP runs it")
  for _, c in ipairs(p.tp_classes) do
    -- one MoE block per stage (2 layers over 2 stages), 4 microbatches
    H.eq(count_kind(c.ops, "a2a_counts"), 4, "counts exchanges: one per microbatch")
    H.eq(count_kind(c.ops, "a2a", "forward"), 8, "dispatch and combine per microbatch")
    H.eq(count_kind(c.ops, "a2a", "backward"), 8, "their gradients per microbatch")
    for _, u in ipairs(c.layout.units) do
      if u.a2a then H.eq(u.a2a_slots, 4, "a counts slot per microbatch") end
    end
    H.eq(count_kind(c.ops, "reduce_scatter") + count_kind(c.ops, "all_gather") > 0, true, "FSDP")
  end
  local got, want, first = events(p)
  H.eq(differ(got, want), nil, "tables = torch's sequence")
  local a2a = 0
  for _, e in ipairs(want[1]) do if e.op == "a2a" or e.op == "a2a_counts" then a2a = a2a + 1 end end
  H.eq(a2a, 20, "rank 0's all-to-alls in torch's sequence: 4 microbatches x (counts, dispatch, combine, 2 gradients)")
  assert(step_proof.prove(got), "deadlock-free")
  -- mutant: pipeline rank 0 drops its first dispatch
  for i, o in ipairs(first[1].ops) do
    if o.kind == "a2a" then table.remove(first[1].ops, i); break end
  end
  local W, inner = p.pipeline.stage_plan.dims.dp_shard, p.pipeline.stage_plan
  local bad = tables.events(first, seq.mesh(2, W, 1, inner.dims.ep, 1), W)
  assert(differ(bad, want), "a dropped all-to-all differs from torch's sequence")
  -- (only rank 0's copy dropped it: its ep peer waits on it)
  bad[2] = got[2]
  local ok = step_proof.prove(bad)
  H.eq(ok, nil, "the proof fails on a one-sided all-to-all")
end

-- Under activation checkpointing every microbatch's backward first re-runs
-- the block's three exchanges (ep.recomputes); zero bubble's I carries the
-- all-to-alls' gradients, W none; HSDP, efsdp 2 and the V schedules alike
function T.pp_x_ep_recompute_and_schedules()
  for _, case in ipairs({ { "1F1B", "full", 4, "" }, { "ZBVZeroBubble", "selective", 8, "" },
                          { "DualPipeV", "full", 8, "dp_replicate = 2," }, { "InterleavedZeroBubble", "none", 8, "" },
                          { "LoopedBFS", "full", 8, "" } }) do
    local sch, ac, world, extra = table.unpack(case)
    local p = ppep(function(s)
      return (s:gsub('schedule = "1F1B"', string.format("schedule = %q", sch))
        :gsub("local_batch_size = 4 }", string.format("local_batch_size = 4, activation_checkpointing = %q }", ac))
        :gsub("world_size = 4", "world_size = " .. world):gsub("dp_shard = %-1", extra .. " dp_shard = -1")
        :gsub("n_layers = 2", "n_layers = 6"))
    end)
    local got, want = events(p)
    H.eq(differ(got, want), nil, sch .. " " .. ac .. " tables = torch's sequence")
    local rec = count_kind(p.tp_classes[1].ops, "a2a_counts", "backward")
    H.eq(rec > 0, ac ~= "none", sch .. " " .. ac .. ": recomputed counts exchanges")
  end
end

-- Zero bubble under EP: the backward's all-to-alls go with the part that
-- runs the backward: a stage's I (backward_input, its "input" part), but on
-- the first stage, whose I runs nothing, its W (the whole backward,
-- stage.py:1318-1321, 1393-1415; recorded live on qwen3_moe by
-- tests/pp/check_titan_pp.sh's _izb and _zbv cases); never a W's dW part.
function T.pp_x_ep_zero_bubble_all_to_alls_with_the_backward()
  for _, sch in ipairs({ "InterleavedZeroBubble", "ZBVZeroBubble" }) do
    local p = ppep(function(s)
      return (s:gsub('schedule = "1F1B"', string.format("schedule = %q", sch)):gsub("world_size = 4", "world_size = 8")
        :gsub("n_layers = 2", "n_layers = 6"))
    end)
    local got, want = events(p)
    H.eq(differ(got, want), nil, sch .. ": tables = torch's sequence")
    -- each backward all-to-all with its experts unit's compute beside it (EP's unit_ops at backward_before
    -- and backward): which part it runs with
    local after = {}
    for _, cls in ipairs(p.tp_classes) do
      local ops = cls.ops
      for i, o in ipairs(ops) do
        if (o.kind == "a2a" or o.kind == "a2a_counts") and o.phase == "backward" then
          local by
          for _, x in ipairs({ ops[i + 1], ops[i - 1] }) do
            if not by and x.unit == o.unit and x.micro_step == o.micro_step
               and (x.kind == "backward" or x.kind == "backward_input") then by = x end
          end
          local k = by and by.kind .. ":" .. tostring(by.grads) or "none"
          after[k] = (after[k] or 0) + 1
        end
      end
    end
    H.eq(after.none, nil, sch .. ": every backward all-to-all beside its unit's backward")
    assert((after["backward_input:input"] or 0) > 0 and (after["backward:nil"] or 0) > 0,
      sch .. ": all-to-alls after I and after the first stage's whole W")
    H.eq(after["backward:weight"], nil, sch .. ": none after a W's dW part")
    H.eq(after["backward_input:nil"], nil, sch .. ": none after an I that runs nothing")
  end
end

-- GPipe's and 1F1B's first forward of a stage under torchtitan's explicit
-- prefetch (ep > 1, distributed/fsdp.py:331-348): each block's pre-forward
-- gathers it, then the next block, before its all-to-alls (recorded live:
-- tests/pp/check_titan_pp.sh's mixtral and qwen3_moe cases); without the
-- rule torch's sequence differs from the tables
function T.pp_x_ep_explicit_prefetch_interleaves_gathers()
  local p = ppep(function(s) return (s:gsub("n_layers = 2", "n_layers = 6")) end)
  local got, want = events(p)
  H.eq(differ(got, want), nil, "tables = torch's sequence")
  local head = {}
  for i = 1, 8 do head[i] = want[1][i].op .. " " .. want[1][i].unit end
  H.list_eq(head, { "all_gather tok_embeddings", "all_gather layers.0", "all_gather layers.1",
                    "a2a_counts layers.0.experts", "a2a layers.0.experts", "a2a layers.0.experts",
                    "all_gather layers.2", "a2a_counts layers.1.experts" }, "rank 0's first forward")
  local t = report.tables(p.pipeline.loaded, nil, { skip_classes = true })
  local inner = p.pipeline.stage_plan
  local implicit = seq.expected(p.pipeline.sched, { dp_shard = inner.dims.dp_shard, ep = inner.dims.ep,
    act_numel = t.act.numel, act_dtype = t.act.dtype, stage_fsdp = t.stage_fsdp, stage_compute = t.stage_compute })
  assert(differ(got, implicit), "every gather first: not what torch issues under EP")
end

-- DeepSeek-V3 with TP x EP x PP (ep borrows TP's ranks: the proof's mesh
-- holds them, gen/parallel/pp_sequence.lua's mesh)
function T.pp_x_ep_x_tp_deepseek()
  local p = plan.from_source(src("deepseek_v3", { world = 8, par = "tp = 2, ep = 2,", schedule = "Interleaved1F1B",
    training = ', activation_checkpointing = "selective"' }), "x.lua")
  H.eq(p.dims.ep * 10 + p.dims.tp, 22, "ep 2 x tp 2")
  local got, want = events(p)
  H.eq(differ(got, want), nil, "tables = torch's sequence")
  H.eq(#got, 8, "every rank of pp x dp_shard x tp")
end

-- EP's refusals as PP changes them: step_end is PP's own accumulation (no
-- refusal under a pipeline), still refused without one; cp with ep stays
-- refused (gen/parallel/ep.lua)
function T.pp_x_ep_refusals()
  local p = ppep(function(s) return (s:gsub('reduce_op = "sum"', 'reduce_op = "sum", grad_accumulation = "step_end"')) end)
  H.eq(p.dims.ep, 2, "step_end accepted under PP")
  local no_pp = PPEP:gsub("pp = 2, ", ""):gsub("pipeline = %b{},?", "")
    :gsub('reduce_op = "sum"', 'reduce_op = "sum", grad_accumulation = "step_end"')
  H.plan_fails(no_pp, "fsdp.grad_accumulation:", "step_end", "parallel.pp > 1")
end

return T
