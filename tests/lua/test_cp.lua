-- Context parallel (gen/parallel/cp.lua, docs/context-parallel.md): the
-- groups (FSDP over dp_shard x cp, the cp groups), each block's K/V
-- all-gathers and reduce-scatters (order, counts, dtype, per micro-step),
-- the activation model's tokens, and the refusals, one line each.
local H = require("helpers")
local plan = require("gen.plan")
local groups = require("gen.groups")

local T = {}

-- A tiny Llama: world ranks, parallel, extra top-level text, seq_len; CrossEntropyLoss
-- (loss_chunks 1), as tests/titan/test_cp_record.py records it.
local function llama(world, parallel, extra, seq)
  return string.format([[return { world_size = %d, parallel = %s, model = { family = "llama", dim = 64,
    n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250, multiple_of = 16, ffn_dim_multiplier = 1.3,
    seq_len = %d }, fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
    training = { local_batch_size = 2, loss_chunks = 1 }%s }]], world, parallel, seq or 512, extra or "")
end

local function gen(world, parallel, extra, seq)
  return plan.from_source(llama(world, parallel, extra, seq), "plans/t.lua")
end

local function cp_ops(p)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.group == "cp" then out[#out + 1] = o end
  end
  return out
end

local function ranks_of(p, name, r)
  local f = p.groups.by_name[name]
  for c = 0, f.count - 1 do
    local m = groups.members(f, c)
    for _, x in ipairs(m) do if x == r then return m end end
  end
end

function T.fsdp_shards_over_dp_shard_x_cp()
  local p = gen(4, "{ dp_shard = 2, cp = 2 }")
  H.list_eq(p.mesh.names, { "dp_shard", "cp" }, "mesh")
  H.eq(p.layout.W, 4, "FSDP's shard group: dp_shard x cp")
  H.list_eq(ranks_of(p, "fsdp", 3), { 0, 1, 2, 3 }, "fsdp group")
  H.list_eq(ranks_of(p, "cp", 2), { 2, 3 }, "cp group of rank 2: consecutive ranks")
  H.list_eq(ranks_of(p, "dp_shard", 1), { 1, 3 }, "dp_shard group")
  -- cp alone: the fsdp group is the cp group's ranks
  local q = gen(4, "{ dp_shard = 1, cp = 4 }")
  H.eq(q.layout.W, 4, "cp 4: FSDP over the four")
  H.list_eq(q.groups.by_name.fsdp.axis_names, { "cp" }, "fsdp over cp")
  -- HSDP: shards over cp, replicates over dp_replicate
  local h = gen(4, "{ dp_replicate = 2, dp_shard = 1, cp = 2 }")
  H.eq(h.layout.W, 2, "HSDP x cp: shard group of cp ranks")
  H.eq(h.layout.R, 2, "replicas")
  H.list_eq(ranks_of(h, "fsdp", 2), { 2, 3 }, "shard group")
  H.list_eq(ranks_of(h, "dp_replicate", 1), { 1, 3 }, "replicate group")
  local ar = 0
  for _, o in ipairs(h.ops) do ar = ar + (o.kind == "all_reduce" and 1 or 0) end
  H.eq(ar, 4, "one HSDP all-reduce per unit with parameters")
end

-- The recorded order (tests/titan/test_cp_record.py): in each block's
-- forward, after its FSDP all-gather, K then V all-gathered over cp; in its
-- backward, after FSDP's prefetch of the block before it and before its
-- reduce-scatter, the two gradients reduce-scattered.
function T.kv_exchange_inside_each_block()
  local p = gen(4, "{ dp_shard = 2, cp = 2 }")
  local seq = {}
  for _, o in ipairs(p.ops) do
    if o.group then seq[#seq + 1] = string.format("%s %s %s %d", o.phase, o.kind, o.group, o.count) end
  end
  local kv = 2 * (512 // 2) * 2 * 16 -- batch x seq/cp x n_kv_heads x head_dim
  H.list_eq(seq, {
    "forward all_gather fsdp 4032",
    "forward all_gather fsdp 13856", "forward tp_all_gather cp " .. kv, "forward tp_all_gather cp " .. kv,
    "forward all_gather fsdp 13856", "forward tp_all_gather cp " .. kv, "forward tp_all_gather cp " .. kv,
    "forward all_gather fsdp 4048",
    "backward all_gather fsdp 13856", "backward reduce_scatter fsdp 4048",
    "backward all_gather fsdp 13856", "backward tp_reduce_scatter cp " .. kv, "backward tp_reduce_scatter cp " .. kv,
    "backward reduce_scatter fsdp 13856",
    "backward all_gather fsdp 4032", "backward tp_reduce_scatter cp " .. kv, "backward tp_reduce_scatter cp " .. kv,
    "backward reduce_scatter fsdp 13856", "backward reduce_scatter fsdp 4032",
  }, "step")
  for _, o in ipairs(cp_ops(p)) do
    H.eq(o.dtype, "bf16", "in the compute (all-gather) dtype")
    H.eq(o.stream, "compute", "on the compute stream")
    H.eq(o.reduce_op, o.kind == "tp_reduce_scatter" and "sum" or nil, "reduce op")
  end
  -- the unit's activation buffer holds the gathered K (or V)
  for _, u in ipairs(p.layout.units) do
    H.eq(u.act_numel or 0, u.name:match("^layers") and 2 * kv or 0, u.name .. " act_numel")
  end
end

-- 2 L M all-gathers and 2 L M reduce-scatters; with M >= 6 the repeated
-- micro-step's rows count `times` each.
function T.op_counts_per_step()
  for _, m in ipairs({ 1, 2, 8 }) do
    local p = gen(8, "{ dp_shard = 2, cp = 4 }", string.format(", fsdp = { micro_steps = %d }", m))
    local ag, rs = 0, 0
    for _, o in ipairs(cp_ops(p)) do
      if o.kind == "tp_all_gather" then ag = ag + (o.times or 1) else rs = rs + (o.times or 1) end
      H.eq(o.count, 2 * (512 // 4) * 2 * 16, "count per rank at cp 4")
    end
    H.eq(ag, 2 * 2 * m, m .. " micro-steps: all-gathers")
    H.eq(rs, 2 * 2 * m, m .. " micro-steps: reduce-scatters")
  end
end

-- Activation checkpointing (full and selective: torchtitan wraps every
-- block; recorded live) re-runs each block's two all-gathers in its
-- backward, before the gradients' reduce-scatters; the timeline does not
-- count them a second time.
function T.checkpointing_recomputes_the_all_gathers()
  local timeline = require("gen.timeline")
  local compute = require("gen.compute")
  for _, ac in ipairs({ "none", "selective", "full" }) do
    local p = gen(4, "{ dp_shard = 2, cp = 2 }", "", nil)
    if ac ~= "none" then
      p = plan.from_source(llama(4, "{ dp_shard = 2, cp = 2 }", nil):gsub("training = { local_batch_size = 2, loss_chunks = 1 }",
        "training = { local_batch_size = 2, loss_chunks = 1, activation_checkpointing = '" .. ac .. "' }"), "plans/t.lua")
    end
    local bwd = {}
    for _, o in ipairs(cp_ops(p)) do
      if o.phase == "backward" and o.unit == 2 then bwd[#bwd + 1] = o.kind .. (o.recompute and "*" or "") end
    end
    local want = ac == "none" and { "tp_reduce_scatter", "tp_reduce_scatter" }
      or { "tp_all_gather*", "tp_all_gather*", "tp_reduce_scatter", "tp_reduce_scatter" }
    H.list_eq(bwd, want, ac .. ": layers.0's backward on cp")
    local s = compute.settings(p)
    for _, o in ipairs(timeline.recomputed(p, s)) do
      H.eq(o.group ~= "cp", true, ac .. ": op " .. o.seq .. " counted again by the timeline")
    end
  end
end

-- Each rank runs seq_len / cp tokens: the activation model divides, and
-- the blocks keep flex's gathered K and V.
function T.activations_per_rank()
  local compute = require("gen.compute")
  local acts = require("gen.models.llama_acts")
  local p = gen(4, "{ dp_shard = 2, cp = 2 }")
  local s = compute.settings(p)
  H.eq(s.tokens, 2 * 512 // 2, "tokens per rank")
  local cfg = p.model_config
  local one = acts.block(cfg, 2, s.tokens, "none", false)
  local two = acts.block(cfg, 2, s.tokens, "none", false, 2)
  H.eq(two.saved - one.saved, 2 * 2 * s.tokens * cfg.n_kv_heads * cfg.head_dim, "gathered K and V kept")
  local sel1 = acts.block(cfg, 2, s.tokens, "selective", false)
  local sel2 = acts.block(cfg, 2, s.tokens, "selective", false, 2)
  H.eq(sel2.saved - sel1.saved, 2 * s.tokens * cfg.n_kv_heads * cfg.head_dim * 3, "selective: K, V gathered + wv's")
  H.eq(acts.block(cfg, 2, s.tokens, "full", false, 2).saved, 2 * s.tokens * cfg.dim, "full: the block's input")
end

function T.refusals()
  H.plan_fails(llama(8, "{ dp_shard = 2, cp = 4, ulysses_degree = 2 }"), "parallel.ulysses_degree",
    "no Ulysses", "remove ulysses_degree")
  H.plan_fails([[return { world_size = 4, parallel = { dp_shard = 2, cp = 2 }, model = { family = "generic",
    seq_len = 512, units = { { name = "root", params = { { name = "w", shape = { 8 } } } } } } }]],
    "parallel.cp", "families whose attention exchanges K", "set cp=1")
  H.plan_fails([[return { world_size = 4, parallel = { dp_shard = 2, cp = 2 }, model = { family = "llama",
    dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 250 } }]], "model.seq_len",
    "seq_len is needed", "set model.seq_len")
  -- torchtitan's Trainer: 2 x cp chunks (seq_len 260 is a multiple of cp = 2 but not of 4)
  H.plan_fails(llama(4, "{ dp_shard = 2, cp = 2 }", nil, 258), "model.seq_len", "not divisible by 2 x cp=4",
    "multiple of 4")
  -- torch's CP block mask: cp x 128
  H.plan_fails(llama(4, "{ dp_shard = 2, cp = 2 }", nil, 384), "model.seq_len", "not divisible by cp x 128 = 256",
    "multiple of 256")
  -- ulysses_degree without cp: gen/dims.lua
  H.plan_fails(llama(4, "{ dp_shard = 4, ulysses_degree = 2 }"), "parallel.ulysses_degree", "with cp=1")
end

-- The advisor on a plan with cp (gen/advisor.lua): cp is explored (the
-- plan's cp > 1 makes it a long-context plan), the global batch counts
-- world / (tp x cp) data-parallel ranks, cp beside tp is ranked (planned),
-- the tp that GQA refuses is refused with the generator's line, and the
-- pipeline meshes keep the plan's cp.
function T.advisor_explores_cp()
  local advisor = require("gen.advisor")
  local load = require("gen.load")
  local res = advisor.rank(load.source(llama(8, "{ dp_shard = -1, cp = 2 }"), "plans/t.lua"))
  H.eq(res.plan_global, 2 * 8 // 2, "global batch: local batch x world / cp")
  local own, cps, cp_tp = 0, {}, 0
  for _, x in ipairs(res.results) do
    cps[x.cp] = true
    if x.cp == 2 and x.t == 2 then cp_tp = cp_tp + 1 end
    own = own + (x.plan_mesh and 1 or 0)
  end
  H.eq(own, 1, "the plan's own mesh ranked once")
  assert(cps[1] and cps[2], "meshes with and without cp ranked")
  assert(cp_tp >= 1, "cp 2 x tp 2 ranked")
  local tp4
  for _, x in ipairs(res.rejected) do
    assert(not x.why:find("internal", 1, true), x.why)
    if x.mesh:find("tp=4", 1, true) then tp4 = x end
  end
  assert(tp4, "tp 4 refused (n_kv_heads 2: GQA)")
  for _, x in ipairs(res.pipeline.results) do H.eq(x.cp, 2, "a pipeline mesh keeps the plan's cp") end
end

-- CP beside TP (sequence parallelism on), as recorded live
-- (tests/titan/test_cp_record.py's cp2_tp2): TP's activation collectives
-- over the rank's seq_len / cp tokens, cut in tp sequence shards; the K/V
-- all-gathers of the TP-local kv heads (n_kv_heads / tp) between TP's
-- attention-input gather and wo's reduce-scatter; their gradients'
-- reduce-scatters between wo's output-gradient gather and the attention
-- input gradient's reduce-scatter.
local function block_seq(p, unit)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.unit == unit and (o.group == "tp" or o.group == "cp") then
      out[#out + 1] = string.format("%s %s %s %d", o.phase:sub(1, 1), o.kind:gsub("^tp_", ""), o.group, o.count)
    end
  end
  return out
end

function T.cp_beside_tp_sp()
  local p = gen(4, "{ dp_shard = 1, cp = 2, tp = 2 }")
  H.list_eq(p.mesh.names, { "cp", "tp" }, "mesh: cp outside tp")
  H.list_eq(ranks_of(p, "cp", 1), { 1, 3 }, "cp group of rank 1")
  H.list_eq(ranks_of(p, "tp", 2), { 2, 3 }, "tp group of rank 2")
  H.list_eq(ranks_of(p, "fsdp", 1), { 1, 3 }, "FSDP over dp_shard x cp, TP inner")
  local kv = 2 * (512 // 2) * (2 // 2) * 16 -- batch x seq/cp x n_kv_heads/tp x head_dim
  local sh = 2 * (512 // 2) * 64 // 2       -- batch x seq/cp x dim / tp
  H.list_eq(block_seq(p, 2), {
    "f all_gather tp " .. sh, "f all_gather cp " .. kv, "f all_gather cp " .. kv, "f reduce_scatter tp " .. sh,
    "f all_gather tp " .. sh, "f reduce_scatter tp " .. sh,
    "b all_gather tp " .. sh, "b reduce_scatter tp " .. sh, "b all_gather tp " .. sh,
    "b reduce_scatter cp " .. kv, "b reduce_scatter cp " .. kv, "b reduce_scatter tp " .. sh,
    "b all_reduce tp 64", "b all_reduce tp 64",
  }, "layers.0 on tp and cp")
  -- loss_parallel's per-token all-reduces: the rank's batch x seq_len / cp tokens
  local loss = 0
  for _, o in ipairs(p.ops) do
    if o.loss then loss = loss + 1; H.eq(o.count, 2 * 512 // 2, "loss all-reduce per token of the rank") end
  end
  H.eq(loss, 3, "three loss_parallel all-reduces")
  for _, u in ipairs(p.layout.units) do
    if u.cp_acts then H.eq(u.act_numel >= 2 * kv and u.act_numel >= 2 * sh, true, u.name .. " act_numel") end
  end
end

-- Without sequence parallelism: wo and w2 all-reduce the rank's seq_len / cp
-- tokens, the K/V exchange between wo's attention and its all-reduce.
function T.cp_beside_tp_no_sp()
  local p = gen(4, "{ dp_shard = 1, cp = 2, tp = 2, sequence_parallel = false }")
  local kv, full = 2 * 256 * 1 * 16, 2 * 256 * 64
  H.list_eq(block_seq(p, 2), {
    "f all_gather cp " .. kv, "f all_gather cp " .. kv, "f all_reduce tp " .. full, "f all_reduce tp " .. full,
    "b all_reduce tp " .. full, "b reduce_scatter cp " .. kv, "b reduce_scatter cp " .. kv,
    "b all_reduce tp " .. full,
  }, "layers.0 without SP")
end

-- The 3D and 4D meshes: FSDP over dp_shard x cp with TP inner, HSDP
-- replicating over dp_replicate; the K/V counts as at dp 1.
function T.cp_beside_tp_with_fsdp_and_hsdp()
  local kv = 2 * 256 * 1 * 16
  local p = gen(8, "{ dp_shard = 2, cp = 2, tp = 2 }")
  H.list_eq(p.mesh.names, { "dp_shard", "cp", "tp" }, "3D mesh")
  H.eq(p.layout.W, 4, "FSDP's shard group: dp_shard x cp")
  H.list_eq(ranks_of(p, "fsdp", 3), { 1, 3, 5, 7 }, "fsdp group of rank 3: dp_shard x cp, tp fixed")
  H.list_eq(ranks_of(p, "cp", 5), { 5, 7 }, "cp group")
  local h = gen(8, "{ dp_replicate = 2, dp_shard = 1, cp = 2, tp = 2 }")
  H.list_eq(h.mesh.names, { "dp_replicate", "cp", "tp" }, "HSDP x CP x TP mesh")
  H.eq(h.layout.W, 2, "shard group: the cp ranks")
  H.eq(h.layout.R, 2, "replicas")
  H.list_eq(ranks_of(h, "dp_replicate", 1), { 1, 5 }, "replicate group")
  for _, q in ipairs({ p, h }) do
    local n = 0
    for _, o in ipairs(cp_ops(q)) do n = n + 1; H.eq(o.count, kv, "K/V count") end
    H.eq(n, 8, "2 blocks x (2 all-gathers + 2 reduce-scatters)")
  end
end

-- Qwen3 (torchtitan's qwen3 registry builds flex attention, which
-- validate_config accepts under CP): the fused wqkv, the q/k norms before
-- the exchange (no collective of their own); recorded live
-- (test_cp_record.py's qwen3_dp2_cp2, qwen3_cp2_tp2).
local function qwen3(world, parallel)
  return plan.from_source(string.format([[return { world_size = %d, parallel = %s, model = { family = "qwen3",
    dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 250, hidden_dim = 96,
    enable_weight_tying = false, seq_len = 512 }, fsdp = { param_dtype = "bf16", reduce_dtype = "fp32",
    reduce_op = "sum" }, training = { local_batch_size = 2, loss_chunks = 1 } }]], world, parallel), "plans/t.lua")
end

function T.qwen3_cp()
  local kv = 2 * 256 * 2 * 16
  local p = qwen3(4, "{ dp_shard = 2, cp = 2 }")
  H.eq(p.layout.W, 4, "FSDP over dp_shard x cp")
  H.list_eq(block_seq(p, 2), { "f all_gather cp " .. kv, "f all_gather cp " .. kv, "b reduce_scatter cp " .. kv,
    "b reduce_scatter cp " .. kv }, "layers.0's K/V exchange")
  local n = 0
  for _, o in ipairs(cp_ops(p)) do n = n + 1; H.eq(p.layout.units[o.unit + 1].name:match("^layers") ~= nil, true) end
  H.eq(n, 8, "2 blocks x 4")
  -- beside TP: as llama's, then the q/k norms' Partial gradients (whatever SP) and the norms'
  local q = qwen3(4, "{ dp_shard = 1, cp = 2, tp = 2 }")
  local sh, kv1 = 2 * 256 * 64 // 2, 2 * 256 * 1 * 16
  H.list_eq(block_seq(q, 2), {
    "f all_gather tp " .. sh, "f all_gather cp " .. kv1, "f all_gather cp " .. kv1, "f reduce_scatter tp " .. sh,
    "f all_gather tp " .. sh, "f reduce_scatter tp " .. sh,
    "b all_gather tp " .. sh, "b reduce_scatter tp " .. sh, "b all_gather tp " .. sh,
    "b reduce_scatter cp " .. kv1, "b reduce_scatter cp " .. kv1, "b reduce_scatter tp " .. sh,
    "b all_reduce tp 16", "b all_reduce tp 16", "b all_reduce tp 64", "b all_reduce tp 64",
  }, "qwen3 layers.0 on tp and cp")
  -- the activation model keeps flex's gathered K and V
  local compute = require("gen.compute")
  local m = require("gen.models.qwen3")
  local cfg, s = p.model_config, compute.settings(p)
  H.eq(m.block_acts(cfg, 2, s.tokens, "none", 2).saved - m.block_acts(cfg, 2, s.tokens, "none").saved,
    2 * 2 * s.tokens * cfg.n_kv_heads * cfg.head_dim, "gathered K and V kept")
end

-- The MoE families on torchtitan's Qwen3 MoE decoder (flex attention):
-- the K/V exchange in each block's attention, the experts' compute local;
-- with ep the dispatch and combine after the block's K/V all-gathers, each
-- rank routing its own seq_len / cp tokens (recorded live:
-- test_cp_record.py's mixtral_dp2_cp2, mixtral_dp2_cp2_ep2).
local function moe(world, parallel, family, extra)
  return plan.from_source(string.format([[return { world_size = %d, parallel = %s, model = { family = %q,
    dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 2, vocab_size = 250, moe_hidden_dim = 48, num_experts = 8,
    top_k = 2, seq_len = 512%s }, fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
    training = { local_batch_size = 2, loss_chunks = 1 } }]], world, parallel, family, extra or ""), "plans/t.lua")
end

function T.moe_families_cp()
  for _, fam in ipairs({ "mixtral", "qwen3_moe" }) do
    local p = moe(4, "{ dp_shard = 2, cp = 2 }", fam, fam == "qwen3_moe" and ", head_dim = 8" or nil)
    local hd = fam == "qwen3_moe" and 8 or 16
    local n = 0
    for _, o in ipairs(cp_ops(p)) do
      n = n + 1
      H.eq(o.count, 2 * 256 * 2 * hd, fam .. ": batch x seq/cp x n_kv_heads x head_dim")
    end
    H.eq(n, 3 * 4, fam .. ": 3 blocks x 4")
    H.eq(p.layout.W, 4, fam .. ": FSDP over dp_shard x cp")
  end
end

local function ep_block(p, unit)
  local out = {}
  for _, o in ipairs(p.ops) do
    local name = p.layout.units[o.unit + 1].name
    if (name == unit or name == unit .. ".experts") and (o.group == "cp" or o.group == "ep") then
      out[#out + 1] = string.format("%s %s %s %d", o.phase:sub(1, 1), o.kind:gsub("^tp_", ""), o.group, o.count)
    end
  end
  return out
end

function T.ep_beside_cp()
  local p = moe(4, "{ dp_shard = 2, cp = 2, ep = 2 }", "mixtral")
  H.list_eq(ranks_of(p, "ep", 1), { 0, 1 }, "ep borrows the innermost ranks: the cp group's")
  H.list_eq(ranks_of(p, "efsdp", 1), { 1, 3 }, "efsdp")
  H.list_eq(ranks_of(p, "fsdp", 1), { 0, 1, 2, 3 }, "dense FSDP over dp_shard x cp")
  local kv, rows = 2 * 256 * 2 * 16, 2 * 256 * 2 -- the rank's tokens x top_k
  H.list_eq(ep_block(p, "layers.0"), {
    "f all_gather cp " .. kv, "f all_gather cp " .. kv, "f a2a_counts ep 4", "f a2a ep " .. rows * 64,
    "f a2a ep " .. rows * 64, "b a2a ep " .. rows * 64, "b a2a ep " .. rows * 64,
    "b reduce_scatter cp " .. kv, "b reduce_scatter cp " .. kv,
  }, "layers.0: K/V exchange, then the dispatch and combine; backward mirrored")
  -- without cp the rank routes the whole sequence: twice the rows
  local q = moe(4, "{ dp_shard = 4, ep = 2 }", "mixtral")
  H.eq(q.layout.ep.tokens, 2 * p.layout.ep.tokens, "tokens per rank: seq_len / cp")
  -- the meshes nest (commplan's runtime mesh refines both): ep 3 across cp 2 refused
  H.plan_fails(string.format([[return { world_size = 6, parallel = { dp_shard = 3, cp = 2, ep = 3 }, model = {
    family = "mixtral", dim = 64, n_layers = 3, n_heads = 4, n_kv_heads = 2, vocab_size = 250, moe_hidden_dim = 48,
    num_experts = 6, top_k = 2, seq_len = 512 } }]]), "parallel.cp", "cp=2 x tp=1 with ep=3",
    "multiple or a divisor of 2")
end

-- DeepSeek-V3 (MLA, flex attention): K is n_heads x (qk_nope + qk_rope)
-- wide, V n_heads x v_head_dim, each of the TP-local heads; the gradients'
-- reduce-scatters V's first (recorded live: dsv3_dp2_cp2, dsv3_cp2_tp2).
local function dsv3(world, parallel)
  return plan.from_source(string.format([[return { world_size = %d, parallel = %s, model = {
    family = "deepseek_v3", dim = 64, n_layers = 4, n_dense_layers = 2, n_heads = 4, vocab_size = 250,
    q_lora_rank = 16, kv_lora_rank = 32, qk_nope_head_dim = 8, qk_rope_head_dim = 8, v_head_dim = 8,
    dense_hidden_dim = 96, moe_hidden_dim = 32, num_experts = 4, num_shared_experts = 2, top_k = 2, seq_len = 512 },
    fsdp = { param_dtype = "bf16", reduce_dtype = "fp32", reduce_op = "sum" },
    training = { local_batch_size = 2, loss_chunks = 1 } }]], world, parallel), "plans/t.lua")
end

function T.deepseek_v3_cp()
  local p = dsv3(4, "{ dp_shard = 2, cp = 2 }")
  local k, v = 2 * 256 * 4 * 16, 2 * 256 * 4 * 8
  H.list_eq(block_seq(p, 2), { "f all_gather cp " .. k, "f all_gather cp " .. v, "b reduce_scatter cp " .. v,
    "b reduce_scatter cp " .. k }, "layers.0: K then V gathered, V's gradient first")
  -- beside TP: the TP-local heads, inside the MLA block's TP collectives (an MoE block: layers.2)
  local q = dsv3(4, "{ dp_shard = 1, cp = 2, tp = 2 }")
  local sh = 2 * 256 * 64 // 2
  H.list_eq(block_seq(q, 4), {
    "f all_gather tp " .. sh, "f all_gather cp " .. k // 2, "f all_gather cp " .. v // 2, "f reduce_scatter tp " .. sh,
    "f all_gather tp " .. sh, "f reduce_scatter tp " .. sh, "f reduce_scatter tp " .. sh,
    "b all_gather tp " .. sh, "b all_gather tp " .. sh, "b reduce_scatter tp " .. sh, "b all_gather tp " .. sh,
    "b reduce_scatter cp " .. v // 2, "b reduce_scatter cp " .. k // 2, "b reduce_scatter tp " .. sh,
    "b all_reduce tp 1024", "b all_reduce tp 16", "b all_reduce tp 2560", "b all_reduce tp 32", "b all_reduce tp 64",
    "b all_reduce tp 64", "b all_reduce tp 256",
  }, "layers.2 (MoE) on tp and cp")
end

-- The attention backend as each family resolves it (model.attn_backend, else torchtitan's model_registry
-- default: flex for llama3, qwen3, deepseek_v3): torchtitan refuses CP with varlen (distributed/full_dtensor.py:
-- 44-52), so cp=2 with varlen is refused for every family, flex planned, varlen at cp=1 planned
function T.attn_backend_under_cp()
  local qwen = [[return { world_size = 4, parallel = %s, model = { family = "qwen3", dim = 64, n_layers = 2,
    n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 250, hidden_dim = 96, seq_len = 512%s } }]]
  local ds3 = [[return { world_size = 4, parallel = %s, model = { family = "deepseek_v3", dim = 64, n_layers = 4,
    n_dense_layers = 2, n_heads = 4, vocab_size = 250, q_lora_rank = 16, kv_lora_rank = 32, qk_nope_head_dim = 8,
    qk_rope_head_dim = 8, v_head_dim = 8, dense_hidden_dim = 96, moe_hidden_dim = 32, num_experts = 4,
    num_shared_experts = 2, top_k = 2, seq_len = 512%s } }]]
  local gen_ = [[return { world_size = 4, parallel = %s, model = { family = "generic", n_heads = 4, n_kv_heads = 2,
    head_dim = 16, n_layers = 1, seq_len = 512%s, units = {
    { name = "tok_embeddings", params = { { name = "tok_embeddings.weight", shape = { 250, 64 } } } },
    { name = "layers.0", params = { { name = "layers.0.attention.wq.weight", shape = { 64, 64 } },
      { name = "layers.0.attention.wk.weight", shape = { 32, 64 } },
      { name = "layers.0.attention.wv.weight", shape = { 32, 64 } },
      { name = "layers.0.attention.wo.weight", shape = { 64, 64 } } } },
    { name = "root", params = { { name = "output.weight", shape = { 250, 64 } } } } } } }]]
  local function llama_src(parallel, be)
    return llama(4, parallel):gsub("seq_len = 512", "seq_len = 512" .. be)
  end
  local function fmt(t) return function(parallel, be) return string.format(t, parallel, be) end end
  for name, s in pairs({ llama = llama_src, qwen3 = fmt(qwen), deepseek_v3 = fmt(ds3), generic = fmt(gen_) }) do
    H.plan_fails(s("{ dp_shard = 2, cp = 2 }", ", attn_backend = 'varlen'"), "model.attn_backend",
      "full_dtensor.py:44-52", "set attn_backend = \"flex\"")
    plan.from_source(s("{ dp_shard = 4 }", ", attn_backend = 'varlen'"), "plans/t.lua")
    -- (this generic model is no decoder cp.on_layout plans: its refusal only)
    if name ~= "generic" then
      plan.from_source(s("{ dp_shard = 2, cp = 2 }", ""), "plans/t.lua")
      plan.from_source(s("{ dp_shard = 2, cp = 2 }", ", attn_backend = 'flex'"), "plans/t.lua")
    end
  end
  H.plan_fails([[return { world_size = 2, model = { family = 'mixtral', size = '8x7b',
    attn_backend = 'flex' } }]], "model.attn_backend", "does not read")
end

-- The audit names the K/V exchange and FSDP's group as dp_shard x cp.
function T.audit_names_cp()
  local audit = require("gen.audit")
  local p = gen(4, "{ dp_shard = 2, cp = 2 }")
  local md = audit.schedule_md(p, audit.fingerprint(p))
  for _, want in ipairs({ "(FSDP + CP)", "fsdp (dp_shard x cp)", "4 K/V all-gather, 4 K/V-gradient reduce-scatter",
                          "local batch 2 x seq_len 512 / cp 2" }) do
    H.eq(md:find(want, 1, true) ~= nil, true, "SCHEDULE.md says " .. want)
  end
  -- with TP too, the mesh line names all three (it said "(FSDP + CP)", leaving TP out)
  local q = gen(16, "{ dp_shard = 4, cp = 2, tp = 2 }")
  local mq = audit.schedule_md(q, audit.fingerprint(q))
  H.eq(mq:match("mesh [^;|]*"), "mesh dp_shard=4 x cp=2 x tp=2 (FSDP + CP + TP)", "the mesh line")
end

return T
