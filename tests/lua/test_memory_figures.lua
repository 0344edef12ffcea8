-- Issue 42, item 1: every per-rank memory figure SCHEDULE.md and plan.json
-- print, held to a closed form written out here, independently of the
-- generator's helpers: the sharded parameters, gradients and optimizer
-- state (each parameter's dim-0 torch.chunk, padded, in its original
-- dtype), the buffers (all-gather, unsharded, reduce-scatter in/out, the
-- unsharded gradients), the activations (the Llama block and loss as
-- gen/models/llama_acts.lua documents them, the formulas that
-- tests/titan/test_llama_acts.py holds to torch, written out again here),
-- the peak and the fit/OOM verdict; for dense FSDP, HSDP, TP, CP, PP (the
-- worst pipeline rank), EP (mixtral, deepseek_v3), bf16 compute with an
-- fp32 reduce, and sync_last accumulation. The figures are read from
-- plan.json (gen/audit.lua's text, decoded), as a tool reads them.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local json = require("gen.json")
local load = require("gen.load")

local T = {}

local BYTES = { fp32 = 4, bf16 = 2, fp16 = 2 }

local function cdiv(a, b) return (a + b - 1) // b end

local function prod(shape, skip)
  local n = 1
  for i, x in ipairs(shape) do if i ~= skip then n = n * x end end
  return n
end

-- FSDP2's shard of one parameter over W ranks: torch.chunk on dim `dim`
-- (1-based; FSDP2's Shard(0), or torchtitan's Shard(1) for experts),
-- padded to the first chunk's size on every rank (FSDP2's padded_sharded_param).
local function shard_numel(shape, W, dim)
  dim = dim or 1
  return cdiv(shape[dim], W) * prod(shape, dim)
end

-- The unsharded grads buffer: each parameter's gradient compact, its start
-- rounded up to 8 elements (the packing kernel's 16-byte loads).
local function grad_numel(shape) return cdiv(prod(shape), 8) * 8 end

local function gen(src, path)
  local p = plan.from_source(src, path)
  local doc = json.decode(audit.json(p, audit.fingerprint(p)))
  return p, doc
end

local function variant(path, edit)
  return "local p = (function() " .. H.read(path) .. "\nend)()\n" .. (edit or "") .. "\nreturn p"
end

-- ---- the Llama 3 model, as torchtitan builds it ----

-- torchtitan's FeedForward: int(2 * 4d / 3), times the multiplier (int),
-- rounded up to multiple_of.
local function ffn_hidden(d, mult, multiple_of)
  local h = (8 * d) // 3
  if mult then h = math.floor(mult * h) end
  return multiple_of * cdiv(h, multiple_of)
end

local function llama_cfg(m)
  local hd = m.dim // m.n_heads
  return { d = m.dim, L = m.n_layers, h = m.n_heads, kvh = m.n_kv_heads or m.n_heads, hd = hd,
           Q = m.n_heads * hd, kv = (m.n_kv_heads or m.n_heads) * hd, V = m.vocab_size,
           f = ffn_hidden(m.dim, m.ffn_dim_multiplier, m.multiple_of or 256) }
end

-- Every parameter per unit, TP-local as TP class 0 (the plan's face) holds
-- it under torchtitan's TP plan: wq, wk, wv, w1, w3 Colwise (dim 0 / tp),
-- wo, w2 Rowwise (dim 1 / tp), tok_embeddings Rowwise on the embedding
-- (dim 0), output Colwise (dim 0); norms replicated. DTensor's uneven
-- split gives rank 0 ceil(n / tp).
local function llama_units(c, tp)
  local function cw(n) return cdiv(n, tp) end
  local units = { { name = "tok_embeddings", params = { { cw(c.V), c.d } } } }
  for i = 0, c.L - 1 do
    units[#units + 1] = { name = "layers." .. i, block = true, params = {
      { cw(c.Q), c.d }, { cw(c.kv), c.d }, { cw(c.kv), c.d }, { c.d, cw(c.Q) },
      { cw(c.f), c.d }, { c.d, cw(c.f) }, { cw(c.f), c.d }, { c.d }, { c.d } } }
  end
  units[#units + 1] = { name = "norm_output", params = { { c.d }, { cw(c.V), c.d } } }
  return units
end

-- One block's bytes { saved, transient } (llama_acts' documented formula:
-- "none" e*T*(4d + 2Q + 2kv + 4f) + 4*T*(h + 2), plus flex's gathered K and V
-- under cp; "selective" unfused e*T*(2d + 3Q + 2kv + f) + 4*T*h, plus
-- e*T*kv*(2cp - 1) more under cp; "full" the block's input).
local function block_acts(c, e, Tk, ac, cp)
  local none = e * Tk * (4 * c.d + 2 * c.Q + 2 * c.kv + 4 * c.f) + 4 * Tk * (c.h + 2) + 2 * e * Tk * c.kv * (cp - 1)
  if ac == "full" then return e * Tk * c.d, none end
  if ac == "selective" then
    local saved = e * Tk * (2 * c.d + 3 * c.Q + 2 * c.kv + c.f) + 4 * Tk * c.h
      + (cp > 1 and e * Tk * c.kv * (2 * cp - 1) or 0)
    return saved, none - saved
  end
  return none, 0
end

-- The output unit (final norm, lm_head, loss) over the local vocabulary V:
-- CrossEntropyLoss (chunks 1) or ChunkedLossWrapper (chunks N).
local function head_acts(Tk, e, d, V, chunks, B)
  local norm = e * Tk * d + 4 * Tk
  if chunks <= 1 then return norm + e * Tk * d + 4 * Tk * V, math.max(8, e + 4) * Tk * V end
  local copies = B > 1 and (e * Tk * d + 8 * Tk) or 0
  return norm + e * Tk * d, 4 * Tk * d + copies + (e + 12) * (Tk // chunks) * V
end

-- The expected figures of a Llama plan's rank 0. o: { W (FSDP's shard
-- size), tp, cp, orig, ag, reduce, grad (the unsharded grads' dtype),
-- tokens (per rank and micro-step), B, chunks, ac, optimizer, fp32_master }.
local function llama_expect(m, o)
  local c = llama_cfg(m)
  local units = llama_units(c, o.tp)
  local by_unit, sharded, numel_all = {}, 0, 0
  for _, u in ipairs(units) do
    local slot, numel = 0, 0
    for _, shape in ipairs(u.params) do
      slot = slot + shard_numel(shape, o.W)
      numel = numel + grad_numel(shape)
    end
    sharded = sharded + slot
    numel_all = numel_all + numel
    by_unit[u.name] = { ag = o.W * slot * BYTES[o.ag], unsharded = o.W * slot * BYTES[o.ag],
                        rs_in = o.W * slot * BYTES[o.reduce], rs_out = slot * BYTES[o.reduce],
                        grads = numel * BYTES[o.grad] }
  end
  local params = sharded * BYTES[o.orig]
  local opt = 0
  if o.optimizer == "adamw" then opt = 2 * params + (o.fp32_master and 4 * sharded or 0) end
  -- activations: every block's saved bytes (sequence parallel: / tp) and
  -- the head's; the peak adds the largest transient (the loss's, or one
  -- checkpointed block's recompute)
  local e = BYTES[o.ag]
  local bs, bt = block_acts(c, e, o.tokens, o.ac, o.cp)
  local hs, ht = head_acts(o.tokens, e, c.d, cdiv(c.V, o.tp), o.chunks, o.B)
  local saved = c.L * bs / o.tp + hs
  local act = saved + math.max(bt / o.tp, ht)
  return { params = params, grads = params, optimizer = opt, activation = act, buffers = by_unit,
           sharded_numel = sharded }
end

-- plan.json's memory figures against the expectation; comm is the arena
-- the memory plan reserves (its own tests place it), bounded here by what
-- it must hold at once and what all its buffers take without reuse.
local function check_figures(name, doc, want)
  local m = doc.audit.memory
  H.eq(m.params_bytes, want.params, name .. ": params_bytes")
  H.eq(m.grads_bytes, want.grads, name .. ": grads_bytes (the sharded gradients, orig dtype)")
  H.eq(m.optimizer_bytes, want.optimizer, name .. ": optimizer_bytes")
  if want.activation then
    H.eq(m.activation_bytes, math.floor(want.activation + 0.5), name .. ": activation_bytes")
  end
  H.eq(m.comm_bytes, doc.memory.arena_bytes, name .. ": comm_bytes is the arena")
  assert(doc.memory.arena_bytes >= doc.memory.peak_transient_bytes,
    name .. ": the arena holds the buffers live at once")
  assert(doc.memory.arena_bytes <= doc.memory.unplanned_bytes, name .. ": the arena is no more than no reuse")
  local act = want.activation or m.activation_bytes
  local total = want.params + want.grads + want.optimizer + m.comm_bytes + act
  H.eq(m.total_bytes, math.floor(total + 0.5), name .. ": total_bytes")
  H.eq(m.fits, total <= m.gpu_bytes, name .. ": the verdict")
  -- the tables' side (plan.json "memory"): the persistent sharded params
  -- and grads, and the peak above them
  H.eq(doc.memory.persistent_bytes, want.params + want.grads, name .. ": persistent_bytes")
  H.eq(doc.memory.peak_bytes, want.params + want.grads + doc.memory.peak_transient_bytes, name .. ": peak_bytes")
  H.eq(doc.memory.allocated_bytes, want.params + want.grads + doc.memory.arena_bytes, name .. ": allocated_bytes")
  -- the buffers, unit by unit
  for _, u in ipairs(doc.units) do
    local b = want.buffers and want.buffers[u.name]
    if b then
      for kind, bytes in pairs(b) do
        local got = u.arena[kind]
        H.eq(got and got.bytes or 0, bytes, string.format("%s: unit %s's %s buffer", name, u.name, kind))
      end
    end
  end
  return total
end

-- The verdict flips at the total: the same plan on a GPU of just the
-- total's size fits, one a little smaller does not.
local function check_verdict_boundary(name, src, path, total)
  local function on(gb)
    local p = plan.from_source(src .. "\n", path)
    p.topology.gpu_memory_GB = gb
    p._audit = nil
    return audit.analysis(p).memory
  end
  local big = on(total / 1e9 * 1.001)
  H.eq(big.fits, true, name .. ": fits with 0.1% to spare")
  -- the arena shrinks at most to its reuse layout; a GPU half the total never fits
  local small = on(total / 1e9 * 0.5)
  H.eq(small.fits, false, name .. ": a GPU of half the total does not fit")
  H.eq(small.total_bytes, small.params_bytes + small.grads_bytes + small.optimizer_bytes + small.comm_bytes
    + small.activation_bytes, name .. ": total on a small GPU")
end

local function llama_case(name, path, edit, o)
  local src = variant(path, edit)
  local loaded = load.source(src, path)
  local _, doc = gen(src, path)
  local want = llama_expect(loaded.model, o)
  local total = check_figures(name, doc, want)
  return total, src
end

-- Dense FSDP over 4, bf16 compute with an fp32 reduce (fp32 parameters),
-- CrossEntropyLoss, no checkpointing.
function T.dense_fsdp_mixed_precision()
  local total, src = llama_case("llama_tiny", "plans/llama_tiny.lua", nil,
    { W = 4, tp = 1, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 128, B = 1,
      chunks = 1, ac = "none", optimizer = "adamw" })
  check_verdict_boundary("llama_tiny", src, "plans/llama_tiny.lua", total)
end

-- The same plan with checkpointing and an fp32 master copy; and SGD.
function T.dense_fsdp_checkpointing_and_optimizers()
  for _, ac in ipairs({ "selective", "full" }) do
    llama_case("llama_tiny " .. ac, "plans/llama_tiny.lua",
      "p.training.activation_checkpointing = '" .. ac .. "'; p.training.fp32_master = true",
      { W = 4, tp = 1, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 128, B = 1,
        chunks = 1, ac = ac, optimizer = "adamw", fp32_master = true })
  end
  llama_case("llama_tiny sgd", "plans/llama_tiny.lua", "p.training.optimizer = 'sgd'; p.training.local_batch_size = 2",
    { W = 4, tp = 1, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 256, B = 2,
      chunks = 1, ac = "none", optimizer = "sgd" })
end

-- HSDP 2 x 2 with sync_last over 3 micro-steps: the unsharded grads
-- accumulate in the fp32 reduce dtype (bf16 compute), 4 loss chunks.
function T.hsdp_sync_last()
  llama_case("llama_chunked_synclast", "tests/plans/llama_chunked_synclast.lua", nil,
    { W = 2, tp = 1, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "fp32", tokens = 16, B = 1,
      chunks = 4, ac = "none", optimizer = "adamw" })
  -- fsdp2_default on the same mesh: a gradient reduced by its own
  -- backward stays in the bf16 compute dtype
  llama_case("llama_chunked fsdp2_default", "tests/plans/llama_chunked_synclast.lua",
    "p.fsdp.grad_accumulation = nil",
    { W = 2, tp = 1, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 16, B = 1,
      chunks = 4, ac = "none", optimizer = "adamw" })
end

-- TP 2 x FSDP 2 x replicate 2, sequence parallel, an uneven vocabulary
-- (251 over tp 2: rank 0 holds 126 rows), 8 loss chunks over 2 sequences.
function T.tensor_parallel()
  local total, src = llama_case("llama_tiny_tp", "plans/llama_tiny_tp.lua", nil,
    { W = 2, tp = 2, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 64, B = 2,
      chunks = 8, ac = "none", optimizer = "adamw" })
  check_verdict_boundary("llama_tiny_tp", src, "plans/llama_tiny_tp.lua", total)
  llama_case("llama_tiny_tp selective", "plans/llama_tiny_tp.lua", "p.training.activation_checkpointing = 'selective'",
    { W = 2, tp = 2, cp = 1, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 64, B = 2,
      chunks = 8, ac = "selective", optimizer = "adamw" })
end

-- Context parallel 2 x FSDP 2: FSDP shards over dp_shard x cp (4), each
-- rank has seq / cp tokens of each of its 2 sequences, flex keeps the
-- gathered K and V.
function T.context_parallel()
  for _, ac in ipairs({ "none", "selective" }) do
    llama_case("llama_tiny_cp " .. ac, "tests/plans/llama_tiny_cp.lua",
      "p.training.activation_checkpointing = '" .. ac .. "'",
      { W = 4, tp = 1, cp = 2, orig = "fp32", ag = "bf16", reduce = "fp32", grad = "bf16", tokens = 2 * 512 // 2,
        B = 2, chunks = 1, ac = ac, optimizer = "adamw" })
  end
end

-- Generic models (no activation model): uneven FSDP over 8 (empty ranks,
-- a column-sharded parameter: FSDP2's Shard(1)) in fp32, and HSDP 4 x 2
-- in fp16 (AdamW's moments in the parameters' dtype).
local function generic_case(name, path, W, es, units)
  local _, doc = gen(H.read(path), path)
  local sharded, buffers = 0, {}
  for uname, params in pairs(units) do
    local slot, numel = 0, 0
    for _, q in ipairs(params) do
      slot = slot + shard_numel(q[1], W, q[2])
      numel = numel + grad_numel(q[1])
    end
    sharded = sharded + slot
    buffers[uname] = { ag = W * slot * es, unsharded = W * slot * es, rs_in = W * slot * es, rs_out = slot * es,
                       grads = numel * es }
  end
  H.eq(doc.audit.memory.activations_modeled, false, name .. ": generic units have no activation model")
  check_figures(name, doc, { params = sharded * es, grads = sharded * es, optimizer = 2 * sharded * es,
                             activation = 0, buffers = buffers })
end

function T.generic_uneven_and_fp16()
  generic_case("fsdp8_uneven", "plans/fsdp8_uneven.lua", 8, 4, {
    ["blocks.0"] = { { { 3, 5 } }, { { 1 } }, { { 17, 3 } }, { { 4, 16 }, 2 } },
    ["blocks.1"] = { { { 9 } }, { { 5, 2, 3 } } },
    root = { { { 10, 7 } } } })
  generic_case("hsdp4x2_fp16", "plans/hsdp4x2_fp16.lua", 2, 2, {
    enc = { { { 7, 3 } }, { { 3 } } }, root = { { { 5, 5 } } } })
end

-- ---- expert parallel ----

-- Mixtral 8x7B on 64 ranks, ep 8: the dense units over dp_shard 64, the
-- experts (one per member: [1, F, d] grouped weights) over efsdp 8 on
-- dim 1 (torchtitan's parallelize: Shard(1) when efsdp x ep exceeds the
-- experts).
function T.expert_parallel_mixtral()
  local _, doc = gen(H.read("plans/mixtral8x7b.lua"), "plans/mixtral8x7b.lua")
  local d, L, V, F, E, ep, kv = 4096, 32, 32000, 14336, 8, 8, 8 * 128
  local sharded = shard_numel({ V, d }, 64) + shard_numel({ d }, 64) + shard_numel({ V, d }, 64)
  local per_block = shard_numel({ d + 2 * kv, d }, 64) + shard_numel({ d, d }, 64) + shard_numel({ E, d }, 64)
    + 2 * shard_numel({ d }, 64)
  local per_experts = 2 * shard_numel({ E // ep, F, d }, 8, 2) + shard_numel({ E // ep, d, F }, 8, 2)
  sharded = sharded + L * (per_block + per_experts)
  local params = 4 * sharded
  local want = { params = params, grads = params, optimizer = 2 * params,
                 buffers = { ["layers.0.experts"] = { ag = 8 * per_experts * 2, rs_in = 8 * per_experts * 4,
                                                      rs_out = per_experts * 4,
                                                      grads = 3 * (E // ep) * F * d * 2 } } }
  check_figures("mixtral8x7b", doc, want)
end

-- DeepSeek-V3 (tiny) with ep 2 over 4 ranks: 2 experts, one per member,
-- efsdp 2 (4 / ep): dim 0 (1 expert) is smaller than efsdp, so dim 1.
function T.expert_parallel_deepseek()
  local path = "tests/plans/moe_dsv3_tiny.lua"
  local _, doc = gen(variant(path, "p.parallel.ep = 2"), path)
  local F, d = 8, 16
  local experts = 2 * shard_numel({ 1, F, d }, 2, 2) + shard_numel({ 1, d, F }, 2, 2)
  local found = 0
  for _, u in ipairs(doc.units) do
    if u.name:find("%.experts$") then
      found = found + 1
      H.eq(u.slot_numel, experts, u.name .. ": the experts' shard")
      H.eq(u.arena.ag.bytes, 2 * experts * 2, u.name .. ": all-gather buffer (bf16, efsdp 2)")
      H.eq(u.arena.rs_in.bytes, 2 * experts * 4, u.name .. ": reduce-scatter input (fp32)")
      H.eq(u.arena.grads.bytes, 3 * F * d * 2, u.name .. ": unsharded grads (one expert, bf16)")
    end
  end
  H.eq(found, 2, "two MoE blocks (n_dense_layers 1 of 3)")
  -- the whole rank: every unit's shard (fp32), grads alike, AdamW's two moments
  local sharded = 0
  for _, u in ipairs(doc.units) do sharded = sharded + u.slot_numel end
  local m = doc.audit.memory
  H.eq(m.params_bytes, 4 * sharded, "dsv3: params")
  H.eq(m.grads_bytes, 4 * sharded, "dsv3: grads")
  H.eq(m.optimizer_bytes, 8 * sharded, "dsv3: AdamW")
  H.eq(m.total_bytes, math.floor(16 * sharded + m.comm_bytes + m.activation_bytes + 0.5), "dsv3: total")
  H.eq(doc.memory.persistent_bytes, 8 * sharded, "dsv3: persistent (sharded params and grads)")
  -- the unit shards are those of the parameter shapes plan.json states
  for _, u in ipairs(doc.units) do
    local W = u.name:find("%.experts$") and 2 or 4
    local slot = 0
    for _, q in ipairs(u.params) do
      local dim = (W == 2 and #q.shape == 3) and 2 or 1
      slot = slot + shard_numel(q.shape, W, dim)
    end
    H.eq(u.slot_numel, slot, "dsv3: " .. u.name .. "'s slot from its shapes")
  end
end

-- ---- pipeline parallel: the worst rank ----

-- pp 2 x FSDP 2, 1F1B over 4 microbatches of one 16-token sequence: rank
-- r keeps min(microbatches, pp - r) microbatches' saved activations of its
-- stage at once (1F1B's warm-up); each rank holds its stage's sharded
-- state (params, grads, AdamW), the stage's parameters unsharded (bf16, no
-- reshard after forward) and its unsharded gradients accumulating over
-- the microbatches in the fp32 reduce dtype (step_end), and one
-- transient (the loss's on the last stage).
function T.pipeline_worst_rank()
  local path = "tests/pp/plans/pp_tiny.lua"
  local loaded = load.source(H.read(path), path)
  local row = require("gen.pipeline").plan_row(loaded)
  local c = llama_cfg(loaded.model)
  local units = llama_units(c, 1)
  local W, e, Tk = 2, 2, 16
  -- torchtitan's split of 4 layers over 2 stages: [embeddings, layers 0-1], [layers 2-3, norm, output]
  local stages = { { units[1], units[2], units[3] }, { units[4], units[5], units[6] } }
  local bs = block_acts(c, e, Tk, "none", 1)
  local hs, ht = head_acts(Tk, e, c.d, c.V, 8, 1)
  local saved = { 2 * bs, 2 * bs + hs }
  local transient = { 0, ht }
  local worst, worst_rank = -1, nil
  for r = 1, 2 do
    local bytes = math.min(4, 2 - (r - 1)) * saved[r] + transient[r]
    for _, u in ipairs(stages[r]) do
      local slot, numel = 0, 0
      for _, shape in ipairs(u.params) do
        slot = slot + shard_numel(shape, W)
        numel = numel + grad_numel(shape)
      end
      bytes = bytes + 4 * slot * 4 + W * slot * 2 + numel * 4
    end
    if bytes > worst then worst, worst_rank = bytes, r - 1 end
  end
  -- the tables: each pipeline rank's units accumulate their unsharded
  -- gradients in fp32 over the microbatches (step_end), as torch does
  local p = plan.from_source(H.read(path), path)
  for _, cls in ipairs(p.tp_classes) do
    for _, u in ipairs(cls.layout.units) do
      H.eq(u.grad_dtype, "fp32", "pp_tiny: " .. u.name .. "'s unsharded grads accumulate in reduce_dtype")
      local b = cls.arena.by_unit[u.index].grads
      local numel = 0
      for _, q in ipairs(u.params) do numel = numel + cdiv(q.numel, 8) * 8 end
      H.eq(b.bytes, numel * 4, "pp_tiny: " .. u.name .. "'s grads buffer")
    end
  end
  H.eq(row.mem_rank, worst_rank, "pp_tiny: the worst rank")
  H.eq(row.mem, worst, "pp_tiny: the worst rank's memory")
  H.eq(row.fits, true, "pp_tiny fits an 80 GB GPU")
end

return T
