-- The compute side of the audit: the settings the plan gives for it (with
-- stated defaults), FLOPs and times per unit and per op, and activation
-- bytes per unit. Everything is per rank and per micro-step unless named
-- otherwise.
--
-- Times (issue 37, docs/compute-model.md): each unit's fwd_us, bwd_us and
-- recompute_us priced from its shapes (gen/unit_time.lua: its linears'
-- GEMMs at TP-local shapes, attention, memory-bound work; torch.compile and
-- float8 from training), so MFU and tokens/s are outputs; topology.mfu, where
-- a plan gives it, overrides them: every FLOP at gpu_TFLOPS x mfu.
--
-- FLOPs (torchtitan's get_num_flop_per_token): a matmul over T tokens with
-- P weights is 2*P*T forward and 4*P*T backward (2*P*T for frozen weights,
-- requires_grad=False: the input gradient alone, no dW); Llama's attention adds
-- 4*s*hd per head and token forward (QK^T and AV), twice that backward.
-- The root's embedding is a lookup (no FLOPs); its output projection is a
-- matmul. Generic units: 6*params*tokens, a third forward (a generic
-- model of decoder blocks: Llama's count, below).
-- With tensor parallelism the layout is TP-local, so params are already
-- divided by tp; attention heads are divided here.
--
-- Activations (bytes a unit's forward keeps for its backward): a Llama
-- block's from gen/models/llama_acts.lua (none, selective, full as
-- torchtitan 0.3 keeps them, measured by tests/titan/test_llama_acts.py);
-- the checkpointed policies also hold one layer's recomputed activations
-- during its backward (the transient). The unit holding the output
-- projection: the final norm, lm_head and the loss, llama_acts.head, with
-- training.loss_chunks (torchtitan's ChunkedLossWrapper, 8 chunks in its
-- configs, or 1: CrossEntropyLoss on the whole logits); its transient is
-- the loss's peak. Checkpointing wraps the layers only.
-- With tp > 1 (sequence parallel) a block's terms are divided by tp; the
-- head's logits are the local vocabulary's (loss parallel). With cp > 1
-- every term is the rank's seq_len / cp tokens' and a block keeps flex
-- attention's gathered K and V (llama_acts.block's cp).
-- The MoE families (mixtral, qwen3_moe, deepseek_v3): each block's bytes
-- from gen/models/moe_acts.lua (attention, dense FFN or MoE, each mode as
-- torchtitan 0.3 keeps them), the routed experts' rows on the block's
-- experts unit where ep > 1 splits them off (the block's recompute on the
-- block's unit), the [norm, lm_head] unit's as Llama's output unit's;
-- checkpointing wraps the blocks only (under TP: moe_unit_acts below).
-- The qwen3 family (dense, gen/models/qwen3.lua): Llama's FLOPs (each
-- block's matmuls and attention, lm_head's matmul, the embedding a lookup)
-- and its blocks' bytes from qwen3.block_acts (moe_acts' GQA attention with
-- q/k norms and dense FeedForward); the output unit's as Llama's.
-- A generic model whose attention shape the plan gives (model.n_heads,
-- head_dim, n_layers: compute.generic_attention) and whose units are
-- decoder blocks of that shape (compute.generic_blocks, gen/models/
-- generic.lua's decoder: the seven 2-D weights of a Llama block, found by
-- shape) is priced as the llama family:
-- each block's FLOPs, attention and bytes from llama_acts.block (a bias
-- adds no saved tensor: addmm's output is the linear's), the unit holding
-- the output projection (tied: the embedding's table) as Llama's output
-- unit, the embedding a lookup; with tp > 1 where its names are a
-- family's (gen/models/generic.lua's NAMES: its TP plan and collectives are
-- then that family's, gen/parallel/tp.lua), TP-local as Llama's. Any other
-- generic model: activations not modeled (no dims to derive them, or under
-- tp > 1 no names that say where TP shards them).
local util = require("gen.util")
local hardware = require("gen.hardware")
local moe_acts = require("gen.models.moe_acts")
local llama_acts = require("gen.models.llama_acts")
local qwen3 = require("gen.models.qwen3")
local gemm_model = require("gen.gemm_model")
local generic = require("gen.models.generic")
local unit_time = require("gen.unit_time")
local opkinds = require("gen.opkinds")

local compute = {}

local ES = util.DTYPE_BYTES

-- Defaults, each stated in SCHEDULE.md when used.
compute.DEFAULTS = {
  local_batch_size = 1, seq_len = 2048, activation_checkpointing = "none", optimizer = "adamw",
  fp32_master = false, loss_chunks = 8, float8 = "none", optimizer_implementation = "fused",
}

-- The audit's inputs: plan.training and plan.topology with defaults.
-- s.defaulted[key] is true where the plan did not set it.
function compute.settings(p)
  local tr, topo = p.training or {}, p.topology or {}
  local s, defaulted = {}, {}
  local function pick(key, v)
    if v == nil then v = compute.DEFAULTS[key]; defaulted[key] = true end
    s[key] = v
  end
  pick("local_batch_size", tr.local_batch_size)
  pick("seq_len", p.model and p.model.seq_len)
  pick("activation_checkpointing", tr.activation_checkpointing)
  pick("optimizer", tr.optimizer)
  pick("fp32_master", tr.fp32_master)
  -- (torchtitan's "fused" unless set: not listed among the defaults, which only this one's bf16 value changes)
  s.optimizer_implementation = tr.optimizer_implementation or compute.DEFAULTS.optimizer_implementation
  pick("loss_chunks", tr.loss_chunks)
  -- the GPU's figures default to its preset's (gen/hardware.lua)
  for _, key in ipairs({ "gpu_TFLOPS", "hbm_GBps", "host_GBps" }) do
    pick(key, topo[key] == nil and hardware.gpu_default(topo, key) or topo[key])
    defaulted[key] = topo[key] == nil or nil
  end
  -- the host link prices CPU offload's copies only: named where a unit offloads
  if not compute.offloads(p) then defaulted.host_GBps = nil end
  -- torch.compile (training.compile): defaults to async TP's setting, which
  -- torchtitan only runs compiled (config/configs.py:304-310)
  s.compile = tr.compile
  if s.compile == nil then s.compile, defaulted.compile = compute.async_tp(p), true end
  pick("float8", tr.float8)
  -- topology.mfu: an override (every FLOP at TFLOPS x mfu, nothing else
  -- priced); without it compute is priced from shapes (gen/gemm_model.lua)
  s.mfu = topo.mfu
  s.defaulted = defaulted
  s.preset = topo.preset or hardware.DEFAULT_PRESET
  s.kernels = gemm_model.table(s.preset)
  -- a rank's tokens: context parallel gives each rank of a cp group
  -- seq_len / cp of every sequence (gen/parallel/cp.lua)
  s.cp = p.dims and p.dims.cp or 1
  s.tokens = s.local_batch_size * s.seq_len // s.cp
  -- the rate a matmul known only by its FLOPs runs at (async TP's fused
  -- matmuls, gen/timeline.lua): the override's, else a large GEMM's in the
  -- block's GEMM dtype
  s.flops_per_us = s.mfu and s.gpu_TFLOPS * 1e6 * s.mfu
    or gemm_model.large_rate(s.kernels, s.gpu_TFLOPS, s.float8 ~= "none" and "fp8" or "bf16")
  -- (the preset's memory as the device reports it, in MiB; the plan's in decimal GB)
  s.gpu_memory_bytes, s.gpu_memory_MiB = hardware.gpu_memory(topo)
  s.gpu_memory_GB = s.gpu_memory_bytes / 1e9
  defaulted.gpu_memory_MiB = s.gpu_memory_MiB and true or nil
  return s
end

-- Whether the plan runs async TP: its TP collectives carry the matmuls
-- they are fused with (gen/parallel/tp_acts.lua's mm_flops).
function compute.async_tp(p)
  if p.parallel then return p.parallel.async_tp == true end
  for _, u in ipairs(p.layout and p.layout.units or {}) do
    for _, a in ipairs(u.tp_acts or {}) do
      if a.mm_flops then return true end
    end
  end
  return false
end

-- Whether TP shards the sequence between blocks (sequence parallel: the
-- block's norms and residual adds run on seq / tp tokens).
function compute.sequence_parallel(p)
  for _, u in ipairs(p.layout.units) do
    for _, a in ipairs(u.tp_acts or {}) do
      if a.kind == "tp_reduce_scatter" then return true end
    end
  end
  return false
end

-- How the plan's compute is priced, as SCHEDULE.md and make advise say it.
function compute.pricing_text(s)
  if s.mfu then
    return string.format("every FLOP executed at %.0f%% of it (topology.mfu, an override)", 100 * s.mfu)
  end
  return string.format("compute priced from shapes (gen/gemm_model.lua: GEMMs at a tensor-core efficiency by "
    .. "shape%s, FlashAttention by sequence length, memory-bound work and the optimizer step at HBM speed; %s%s)",
    s.kernels.clock and string.format(" at the %.0f%% clock its power limit sustains", 100 * s.kernels.clock) or "",
    s.compile and "torch.compile" or "eager", s.float8 ~= "none" and (", float8 " .. s.float8) or "")
end

-- Whether any unit offloads to the CPU (fsdp.cpu_offload, a unit's cpu_offload).
function compute.offloads(p)
  local f = p.fsdp or {}
  if f.cpu_offload then return true end
  for _, u in ipairs(p.model and p.model.units or {}) do
    if u.cpu_offload then return true end
  end
  return false
end

-- The settings as one string: a timeline predicted with them still holds
-- while the key is the same (gen/figures.lua).
function compute.settings_key(s)
  return table.concat({ s.local_batch_size, s.seq_len, s.activation_checkpointing, tostring(s.optimizer),
                        tostring(s.fp32_master), s.gpu_memory_GB, s.gpu_TFLOPS, tostring(s.mfu), s.hbm_GBps, s.loss_chunks,
                        tostring(s.compile), s.float8, s.preset, s.host_GBps, s.optimizer_implementation }, "|")
end

-- AdamW's two moments (exp_avg, exp_avg_sq) per element: in the parameter's dtype (torch.optim.AdamW's
-- zeros_like), or bf16 under torchtitan's optimizer.implementation = "fused_opt_states_bf16"
-- (components/optimizer/optimizer.py:120-123, 241-242, 332-371: a step pre-hook allocates both in
-- bfloat16 before the fused kernel's lazy init, for Adam/AdamW). e: the parameter's element bytes.
function compute.bf16_moments(s)
  return s.optimizer == "adamw" and s.optimizer_implementation == "fused_opt_states_bf16"
end

function compute.moment_bytes(s, e)
  return compute.bf16_moments(s) and ES.bf16 or e
end

-- The optimizer's state in bytes for sharded parameters of params_bytes over numel elements: AdamW's
-- two moments (compute.moment_bytes) plus an fp32 master copy with training.fp32_master; SGD (no
-- momentum) and none hold nothing.
function compute.optimizer_state_bytes(s, params_bytes, numel)
  if s.optimizer ~= "adamw" then return 0 end
  local moments = compute.bf16_moments(s) and 2 * ES.bf16 * numel or 2 * params_bytes
  return moments + (s.fp32_master and 4 * numel or 0)
end

local function numel_of(u, pred)
  local n = 0
  for _, q in ipairs(u.params) do
    if not pred or pred(q) then n = n + q.numel end
  end
  return n
end

local function suffix(name) return (name:gsub("^layers%.%d+%.", "")) end

local MOE = { mixtral = true, qwen3_moe = true, deepseek_v3 = true, gpt_oss = true }

-- The weights torchtitan's op-level SAC recomputes in backward: the unfused
-- block's 2nd, 4th and 6th matmuls (SelectiveAC's every second aten.mm):
-- wk, wo, w3 (qwen3's unfused qkv_linear.wk too; fused: wo, w3).
local function recomputed_by_sac(q)
  local n = suffix(q.name)
  return n == "attention.wk.weight" or n == "attention.qkv_linear.wk.weight" or n == "attention.wo.weight"
    or n == "feed_forward.w3.weight"
end

-- An MoE family's attention per rank in block unit `name` over seq
-- tokens: local heads, the head width the FLOPs count (the mean of the
-- query-key and value widths: MLA's differ) and the keys each query
-- attends to (the sequence; gpt-oss's even blocks their sliding window:
-- gen/models/gpt_oss.lua's kv_len).
local function moe_attention(cfg, tp, name, seq)
  if not cfg or not cfg.n_heads then return nil end
  local heads = math.max(1, cfg.n_heads // tp)
  if cfg.qk_nope_head_dim then
    return { heads = heads, hd = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) / 2, kv = seq }
  end
  local kv = seq
  if cfg.sliding_window then
    kv = require("gen.models.gpt_oss").kv_len(cfg, tonumber(name:match("^layers%.(%d+)")), seq)
  end
  return cfg.head_dim and { heads = heads, hd = cfg.head_dim, kv = kv } or nil
end

-- A unit's 2-D weights as linears (gen/unit_time.lua's spec), TP-local
-- [out, in]; block: float8 converts them (torchtitan's module_filter_fn:
-- both dims multiples of 16, components/quantization/utils.py:22-25), and
-- SAC's recompute marks them; pred: which weights (default all 2-D ones).
-- A weight's GEMM as [out, in]: a 2-D weight's, or a fused gate+up w13
-- [F, 2, D] (model.fused "swiglu") one GEMM of 2F outputs
-- (overrides/fused_swiglu.py:456: einsum over D); nil for anything else.
local function as_linear(q)
  if #q.shape == 2 then return q.shape[1], q.shape[2] end
  if #q.shape == 3 and q.name:sub(-4) == ".w13" then return 2 * q.shape[1], q.shape[3] end
end

-- A routed experts' grouped weight as E local experts' GEMMs [out, in]:
-- E x out x in, or a fused w13 [E, F, 2, D] (model.fused
-- "grouped_experts": one grouped GEMM of 2F outputs, fused_swiglu.py:557-560);
-- nil for any other parameter.
local function expert_gemm(q)
  if not q.name:find("routed_experts.inner_experts.", 1, true) or q.shape[1] == 0 then return nil end
  if #q.shape == 3 then return q.shape[1], q.shape[2], q.shape[3] end
  if #q.shape == 4 then return q.shape[1], q.shape[2] * q.shape[3], q.shape[4] end
end

-- gpt-oss's routed experts' biases [E, out] (moe.py:167-188): E local
-- experts' rows, each token adding top_k of them; nil for anything else.
local function expert_bias(q)
  return q.name:find("routed_experts.inner_experts.", 1, true) and #q.shape == 2 and q.shape[1] > 0 or nil
end

-- The backward FLOPs a unit's frozen weights (requires_grad=False) skip: their
-- weight-gradient GEMM (dW, 2 x numel x T); the input-gradient GEMM (dX) stays, so
-- a frozen linear's backward costs about its forward. pred: the weights counted.
local function frozen_dw(u, T, pred)
  return 2 * T * numel_of(u, function(q) return q.frozen and pred(q) end)
end

local function linears(u, block, pred, again)
  again = again or recomputed_by_sac
  local out = {}
  for _, q in ipairs(u.params) do
    local o, i = as_linear(q)
    if o and (not pred or pred(q)) then
      out[#out + 1] = { out = o, ["in"] = i, again = block and again(q),
                        fp8 = block and o % 16 == 0 and i % 16 == 0, frozen = q.frozen }
    end
  end
  return out
end

-- Whether the plan's model has an activation model (the llama and MoE
-- families; a generic model whose units are decoder blocks of its given
-- attention shape, compute.generic_blocks).
function compute.activations_modeled(p)
  local fam = p.model and p.model.family
  return fam == "llama" or fam == "qwen3" or MOE[fam] == true or compute.generic_blocks(p) ~= nil
end

-- A generic model's decoder structure where its attention shape is given
-- and its units have it (gen/models/generic.lua's decoder, by parameter
-- name, cached per layout), as the layout's units and parameters: { cfg,
-- block = { [unit] = true }, sac = { [param] = true }, fused, head,
-- head_weight }; nil without one.
local generic_cache = setmetatable({}, { __mode = "k" })
function compute.generic_blocks(p)
  local g = compute.generic_attention(p)
  if not g or not p.layout then return nil end
  local hit = generic_cache[p.layout]
  if hit ~= nil then return hit or nil end
  local dec = generic.decoder(p.model, p.layout.units, (p.dims and p.dims.tp) or 1)
  local r = false
  if dec then
    r = { cfg = dec.cfg, fused = dec.fused, block = {}, sac = {}, head_weight = dec.head_weight }
    for _, u in ipairs(p.layout.units) do
      if dec.block[u.name] then r.block[u] = true end
      if dec.head == u.name then r.head = u end
      for _, q in ipairs(u.params) do
        if dec.sac[q.name] then r.sac[q] = true end
      end
    end
  end
  generic_cache[p.layout] = r
  return r or nil
end

-- The output unit's activations (Llama's and the MoE families' decoders
-- alike): saved, transient (gen/models/llama_acts.lua); under TP the
-- local vocabulary (loss parallel; DTensor's uneven split: the first
-- ranks' ceil(V / tp)).
local function head_acts(s, e, d, V, tp)
  local r = llama_acts.head(s.tokens, e, d, -(-V // tp), s.loss_chunks, s.local_batch_size)
  return r.saved, r.transient
end

-- The routed rows a rank's experts receive per micro-step (gen/models/
-- moe_acts.lua): T x top_k under uniform routing, bounded by ep x the
-- capacity the plan's policy gives each member (gen/parallel/ep.lua).
local function routed_rows(p, cfg, T)
  local e = p.layout.ep
  if not e or e.size <= 1 then return T * cfg.top_k, 1 end
  local cap = require("gen.parallel.ep").capacity(T, cfg.top_k, cfg.num_experts, e.size, e.policy)
  return math.min(T * cfg.top_k, e.size * cap), e.size
end

-- An MoE family's unit: its activations { saved, transient }. Under TP
-- (every MoE family's plan) approximately: the block's bytes divided by tp as
-- the Llama model's are (sequence-sharded between blocks, head- or
-- hidden-sharded inside), the routed rows of a rank's seq / tp tokens with
-- ep > 1, the head's over the local vocabulary (loss parallel).
local function moe_unit_acts(p, s, u, e)
  local cfg, T, ac = p.model_config, s.tokens, s.activation_checkpointing
  local tp = (p.dims and p.dims.tp) or 1
  local i = u.name:match("^layers%.(%d+)")
  -- DeepSeek-V3's MTP blocks (gen/models/deepseek_v3.lua): each a copy of the last block, outside
  -- model.layers when torchtitan's activation checkpointing wraps it (distributed/activation_checkpoint.py:
  -- 152-160, before apply_fsdp_to_mtp_decoder adds them), so never checkpointed; and the fusion's inputs
  -- (mtp.py:152-158): enorm's and hnorm's inputs with their fp32 rstd, the concatenation eh_proj reads
  -- (2 dim wide), mtp_norm's input and rstd
  local mtp = u.name:match("^mtp_layers%.%d+$") and not u.expert
  if mtp then i, ac = cfg.n_layers - 1, "none" end
  local mtp_extra = mtp and (e * T * cfg.dim * 5 + 3 * 4 * T) or 0
  if not i then
    local holds_head = numel_of(u, function(q) return q.name == "lm_head.weight" end) > 0
    if not holds_head then return 0, 0 end
    local saved, transient = head_acts(s, e, cfg.dim, cfg.vocab_size, tp)
    -- MTPLoss (mtp.py:363-393): lm_head runs on every depth's hidden state too, each depth's input and
    -- fp32 logits saved as the main one's (llama_acts.head's terms at one chunk), the losses one after another
    local n = cfg.num_mtp_layers or 0
    if n > 0 then
      local T_ = s.tokens
      saved = saved + n * (e * T_ * cfg.dim + 4 * T_ * -(-cfg.vocab_size // tp))
    end
    return saved, transient
  end
  local rows, ep = routed_rows(p, cfg, T // tp)
  local b = moe_acts.block(cfg, tonumber(i), e, T, rows * (ep > 1 and 1 or tp), ep, ac)
  if mtp then return (b.saved + b.routed + mtp_extra) / tp, b.transient / tp end
  if u.expert then return b.routed, 0 end
  -- Context parallel: flex attention keeps the all-gathered K and V, cp x T
  -- tokens each (qwen3.block_acts' term; the widths per token are CP's own,
  -- gen/parallel/cp.lua's FAMILIES: GQA's kv heads, MLA's K and V)
  local gathered = 0
  if (s.cp or 1) > 1 and ac ~= "full" then
    local kw, vw = require("gen.parallel.cp").FAMILIES[p.model.family].widths(cfg, 1)
    gathered = e * T * (kw + vw) * (s.cp - 1)
  end
  -- (ep = 1: one unit holds the block and its experts)
  return (b.saved + gathered + (ep > 1 and 0 or b.routed)) / tp, b.transient / tp
end

-- The units activation checkpointing wraps, one rule for the recompute's
-- FLOPs here and its TP collectives (gen/timeline.lua): a Llama plan's
-- transformer blocks (torchtitan's apply_ac wraps model.layers, not the
-- embedding, the final norm and output, or the loss); a generic plan's
-- units but the root; an MoE family's blocks (and their experts units).
local holds_wq = setmetatable({}, { __mode = "k" }) -- unit -> whether it holds an attention.wq
function compute.checkpointed(p, u)
  if p.model and p.model.family == "llama" and p.model_config then
    -- (its parameters' names decide: looked at once per unit, though each
    -- prediction of the step asks again)
    local wq = holds_wq[u]
    if wq == nil then
      wq = numel_of(u, function(q) return suffix(q.name) == "attention.wq.weight" end) > 0
      holds_wq[u] = wq
    end
    return wq
  end
  if p.model and (MOE[p.model.family] or p.model.family == "qwen3") and p.model_config then
    return u.name:match("^layers%.%d+") ~= nil
  end
  local g = compute.generic_blocks(p)
  if g then return g.block[u] == true end
  return not u.is_root
end

-- unit index -> { fwd, bwd, recompute } FLOPs per micro-step, and the
-- activation bytes { saved, transient } the unit holds.
function compute.units(p, s)
  local tp = (p.dims and p.dims.tp) or 1
  local sp = tp > 1 and compute.sequence_parallel(p)
  -- r's times from a spec (gen/unit_time.lua)
  local function times(r, spec)
    r.fwd_us, r.bwd_us, r.recompute_us, r.bwd_w_us = unit_time.of(s, spec)
  end
  local T, seq = s.tokens, s.seq_len
  local ac = s.activation_checkpointing
  local fam = p.model and p.model.family
  local cfg = (fam == "llama" or fam == "qwen3") and p.model_config or nil
  -- (a generic model of decoder blocks: the llama family's pricing)
  local gen = not cfg and compute.generic_blocks(p)
  if gen then cfg = gen.cfg end
  local function is_head(q)
    if gen then return q.name == gen.head_weight end
    return q.name == "output.weight" or q.name == "lm_head.weight"
  end
  -- the weights SAC recomputes: by torchtitan's names, or a generic
  -- block's by shape (compute.generic_blocks' sac)
  local sac = gen and function(q) return gen.sac[q] == true end or recomputed_by_sac
  local out = {}
  for _, u in ipairs(p.layout.units) do
    local e = ES[u.ag_dtype]
    -- (bwd_w: the backward's weight-gradient FLOPs, its dW GEMMs: zero bubble's W, compute.backward_us)
    local r = { fwd = 0, bwd = 0, bwd_w = 0, recompute = 0, saved = 0, transient = 0 }
    local is_layer = cfg and compute.checkpointed(p, u)
    if is_layer then
      local heads = cfg.n_heads // tp
      local P = numel_of(u, function(q) return as_linear(q) ~= nil end)
      local attn = 4 * T * seq * heads * cfg.head_dim
      r.fwd = 2 * P * T + attn
      r.bwd = 2 * r.fwd - frozen_dw(u, T, function(q) return as_linear(q) ~= nil end)
      r.bwd_w = 2 * P * T - frozen_dw(u, T, function(q) return as_linear(q) ~= nil end)
      local b = fam == "qwen3" and qwen3.block_acts(cfg, e, T, ac, s.cp)
        or llama_acts.block(cfg, e, T, ac, gen and gen.fused, s.cp)
      r.saved, r.transient = b.saved / tp, b.transient / tp
      if ac == "full" then
        r.recompute = r.fwd
      elseif ac == "selective" then
        r.recompute = 2 * numel_of(u, sac) * T
      end
      if not s.mfu then
        -- (sequence parallel: the norms and residual adds on seq / tp tokens)
        local res = T * cfg.dim // (sp and tp or 1)
        local q_w, kv_w = heads * cfg.head_dim, math.max(1, cfg.n_kv_heads // tp) * cfg.head_dim
        local hidden = gen and cfg.hidden // tp or 0
        for _, q in ipairs(gen and {} or u.params) do
          if suffix(q.name) == "feed_forward.w1.weight" or suffix(q.name) == "feed_forward.w13" then
            hidden = hidden + q.shape[1]
          end
        end
        times(r, { T = T, linears = linears(u, true, nil, sac),
                   attention = { q_tokens = T, kv_len = seq, heads = heads, hd = cfg.head_dim },
                   elems = { norm = 2 * res, rope = T * (q_w + kv_w), swiglu = T * hidden, attn_out = T * q_w },
                   recompute = ac })
      end
    elseif cfg then
      -- The embedding (a lookup) and the empty root: no FLOPs; the unit
      -- holding the output projection: its matmul, the final norm and logits.
      local P = numel_of(u, is_head)
      r.fwd = 2 * P * T
      r.bwd = 2 * r.fwd - frozen_dw(u, T, is_head)
      r.bwd_w = r.fwd - frozen_dw(u, T, is_head)
      if P > 0 then r.saved, r.transient = head_acts(s, e, cfg.dim, cfg.vocab_size, tp) end
      if not s.mfu then
        -- the output projection (bf16: torchtitan's float8 filter keeps it,
        -- models/llama3/config_registry.py:304), the final norm, the loss's
        -- passes over the local logits
        local ls = linears(u, false, is_head)
        local V = 0
        for _, l in ipairs(ls) do V = V + l.out end
        times(r, { T = T, linears = ls, elems = { norm = P > 0 and T * cfg.dim // (sp and tp or 1) or 0,
                                                   logits = T * V } })
      end
    else
      -- A MoE's routed experts (grouped weights, local experts on dim 0)
      -- each see their share of the tokens: a rank's experts process T x
      -- top_k rows in all (uniform routing; with ep the rows come from every
      -- member), so a weight counts numel x top_k / its local experts.
      local top_k = p.model_config and p.model_config.top_k
      local P, Pf = 0, 0 -- (Pf: the frozen weights' GEMMs, no dW in backward)
      -- (with ep > 1 under TP an experts unit's rows come from each rank's seq / tp tokens)
      local Tu = u.expert and T // tp or T
      for _, q in ipairs(u.params) do
        -- (a routed expert's grouped weight, or gpt-oss's 2-D bias, E rows; each token uses top_k of the E)
        local n = q.numel
        if top_k and (expert_gemm(q) or expert_bias(q)) then n = q.numel * top_k / q.shape[1] end
        P = P + n
        if q.frozen and ((top_k and expert_gemm(q)) or as_linear(q)) then Pf = Pf + n end
      end
      -- An MoE family's block: its attention too (Llama's count: QK^T and
      -- AV over the whole sequence -- gpt-oss's even blocks over their
      -- sliding window --, 4 x keys x head width per head and token
      -- forward; MLA's query-key width is qk_nope + qk_rope, its value
      -- width v_head_dim), on the block's unit, not its experts'
      -- (DeepSeek-V3's MTP blocks, mtp_layers.<k>: a block's attention too, gen/models/deepseek_v3.lua)
      local attn = MOE[fam] and not u.expert and (u.name:match("^layers%.%d+$") or u.name:match("^mtp_layers%.%d+$"))
        and moe_attention(p.model_config, tp, u.name, seq)
      r.fwd = 2 * P * Tu + (attn and 4 * T * attn.kv * attn.heads * attn.hd or 0)
      r.bwd = 2 * r.fwd - 2 * Pf * Tu
      r.bwd_w = 2 * (P - Pf) * Tu
      local rec = compute.checkpointed(p, u) and ac or "none"
      if rec == "full" then r.recompute = r.fwd
      elseif rec == "selective" then r.recompute = r.fwd / 2 end
      if not s.mfu then
        -- each 2-D weight a linear over the unit's tokens; a routed expert
        -- weight (E local experts) E GEMMs over its share of the rows;
        -- anything else at a large GEMM's rate
        local spec = { T = Tu, linears = {}, flops = 0, recompute = rec == "full" and "full" or "none",
                       attention = attn and { q_tokens = T, kv_len = attn.kv, heads = attn.heads, hd = attn.hd } }
        for _, q in ipairs(u.params) do
          local E, eo, ei = expert_gemm(q)
          if top_k and E then
            local rows = Tu * top_k // E
            local t = { T = rows, linears = { { out = eo, ["in"] = ei, frozen = q.frozen } } }
            local f, b, _, bw = unit_time.of(s, t)
            r.fwd_us, r.bwd_us = (r.fwd_us or 0) + f * E, (r.bwd_us or 0) + b * E
            r.bwd_w_us = (r.bwd_w_us or 0) + bw * E
          elseif top_k and expert_bias(q) then
            -- gpt-oss's expert biases (moe.py:167-188): added to each routed row, top_k rows a token
            spec.flops = spec.flops + 6 * (q.numel // q.shape[1]) * Tu * top_k
          elseif as_linear(q) then
            local o, i = as_linear(q)
            spec.linears[#spec.linears + 1] = { out = o, ["in"] = i, frozen = q.frozen }
          else
            spec.flops = spec.flops + 6 * q.numel * Tu
          end
        end
        -- the MoE's memory-bound work, at HBM speed (gen/unit_time.lua's bytes): the
        -- router's fp32 scores over the experts (softmax written, read by top-k and the
        -- gather: 3 passes), the routed rows permuted into expert order and back (each read
        -- and written: torchtitan's token dispatcher, models/common/token_dispatcher.py),
        -- and the combine's weighted sum (top_k rows read per token, one row written)
        local e_act = ES[u.ag_dtype]
        for _, q in ipairs(u.params) do
          if q.name:find("moe.router.gate.weight", 1, true) and #q.shape == 2 then
            spec.bytes = (spec.bytes or 0) + 3 * 4 * Tu * q.shape[1]
          elseif top_k and q.name:find("routed_experts.inner_experts.w2_EDF", 1, true) and #q.shape == 3 then
            local rows, D = Tu * top_k, q.shape[2]
            spec.bytes = (spec.bytes or 0) + (5 * rows + Tu) * D * e_act
          end
        end
        local ef, eb, ew = r.fwd_us or 0, r.bwd_us or 0, r.bwd_w_us or 0
        times(r, spec)
        r.fwd_us, r.bwd_us, r.bwd_w_us = r.fwd_us + ef, r.bwd_us + eb, r.bwd_w_us + ew
        -- selective: half the forward again, as its FLOPs count it
        if rec == "selective" then r.recompute_us = r.fwd_us / 2 elseif rec == "full" then r.recompute_us = r.fwd_us end
      end
      if p.model and MOE[p.model.family] and p.model_config then
        r.saved, r.transient = moe_unit_acts(p, s, u, e)
      end
    end
    if s.mfu then
      -- topology.mfu: every FLOP at TFLOPS x mfu
      r.fwd_us, r.bwd_us, r.recompute_us = r.fwd / s.flops_per_us, r.bwd / s.flops_per_us, r.recompute / s.flops_per_us
      r.bwd_w_us = r.bwd_w / s.flops_per_us
    end
    out[u.index] = r
  end
  return out
end

-- Peak activation bytes of a micro-step: everything saved by the forward
-- (the backward frees it unit by unit) plus the largest transient.
function compute.activation_peak(per_unit)
  local saved, transient = 0, 0
  for _, r in pairs(per_unit) do
    saved = saved + r.saved
    transient = math.max(transient, r.transient)
  end
  return saved + transient, saved, transient
end

-- A unit's backward microseconds (r: compute.units' entry), whole or one
-- part of zero bubble's split backward (torch's stage.py
-- backward_maybe_with_nosync, stage.py:1067-1110: "input" runs
-- _backward.py's stage_backward_input, autograd.grad over the stage's
-- inputs only -- the dX GEMMs, attention's backward, the elementwise
-- backward, and the recompute, which the first pass over the saved
-- activations triggers --; "weight" stage_backward_weight, the parameters'
-- gradients from the kept graph -- the dW GEMMs, backward_weight_one_chunk,
-- stage.py:1372). input + weight = the whole backward.
function compute.backward_us(r, part)
  if part == "weight" then return r.bwd_w_us or 0 end
  if part == "input" then return r.bwd_us - (r.bwd_w_us or 0) + r.recompute_us end
  return r.bwd_us + r.recompute_us
end

-- Modeled microseconds of each op of the step (collectives excluded: the
-- timeline takes theirs from gen/cost.lua). Copies move bytes read plus
-- written at hbm_GBps; compute runs at gpu_TFLOPS * mfu. extra_us (optional,
-- op seq -> us) adds time to an op: the advisor's TP collectives.
function compute.op_us(p, s, per_unit, o, extra_us)
  local u = p.layout.units[o.unit + 1]
  local W = u.W or p.layout.W
  local k = o.kind
  local bytes_per_us = s.hbm_GBps * 1e3
  local us = 0
  -- A part of the unit (ChunkedLossWrapper's [norm, lm_head] unit: the
  -- loss runs lm_head, the decoder the norm): its share of the unit's
  -- FLOPs by parameter elements (the head's FLOPs are its projection's),
  -- and its own slot and grads for the copies.
  -- total: the reduce side's elements (the trainable parameters' shards: a
  -- frozen parameter is gathered, never reduced), the gather side's u.total
  -- gathered: the gather side's shard elements (frozen ones included), what an H2D copy moves
  local share, total, grads, gathered = 1, u.rs_total, u.grads_numel, u.total
  if o.part_first then
    local numel, pn = 0, 0
    total, grads, gathered = 0, 0, 0
    for j, q in ipairs(u.params) do
      numel = numel + q.numel
      if j > o.part_first and j <= o.part_first + o.part_count then
        pn, gathered = pn + q.numel, gathered + q.padded
        if not q.frozen then total, grads = total + q.padded, grads + q.numel end
      end
    end
    share = numel > 0 and pn / numel or 0
  end
  if k == "forward" then us = share * per_unit[u.index].fwd_us
  elseif k == "backward" or (k == "backward_input" and o.grads) then
    -- (o.grads: zero bubble's W, "weight", or I, "input": gen/parallel/pp_tables.lua)
    us = share * compute.backward_us(per_unit[u.index], o.grads)
  elseif k == "backward_input" and o.call then
    -- a unit's backward for one of several forward calls (fsdp_schedule.calls_micro: DeepSeek-V3's MTP):
    -- each call's backward, its part's share (o.call = { first, count }) as a part's backward is priced
    local numel, pn = 0, 0
    for j, q in ipairs(u.params) do
      numel = numel + q.numel
      if type(o.call) ~= "table" or (j > o.call[1] and j <= o.call[1] + o.call[2]) then pn = pn + q.numel end
    end
    us = (numel > 0 and pn / numel or 0) * per_unit[u.index].bwd_us
  elseif k == "copy_in" then us = u.total * (ES[u.orig_dtype] + ES[u.ag_dtype]) / bytes_per_us
  elseif k == "copy_out" then us = 2 * W * u.total * ES[u.ag_dtype] / bytes_per_us
  elseif k == "pack" then
    us = (grads * ES[u.grad_dtype] + W * total * ES[u.reduce_dtype]) / bytes_per_us
  elseif k == "view_out" then us = total * (ES[u.reduce_dtype] + ES[u.orig_dtype]) / bytes_per_us
  elseif k == "view_out_add" then us = total * (ES[u.reduce_dtype] + 2 * ES[u.orig_dtype]) / bytes_per_us
  elseif k == "partial_save" then us = 2 * u.rs_total * ES[u.reduce_dtype] / bytes_per_us
  elseif k == "partial_add" or k == "partial_fold" then us = 3 * u.rs_total * ES[u.reduce_dtype] / bytes_per_us
  elseif opkinds.BY_NAME[k].host then
    -- CPU offload's H2D / D2H copies: the shard (its part's) over the host
    -- link at host_GBps (gen/hardware.lua), in the stored dtype
    us = (k == "h2d" and gathered or total) * ES[u.orig_dtype] / (s.host_GBps * 1e3)
  elseif (k == "all_gather" or k == "reduce_scatter") and not o.group then
    us = 2 * (k == "all_gather" and u.total or total) * ES[o.dtype] / bytes_per_us -- a one-rank group: a local copy
  end
  return us + (extra_us and extra_us[o.seq] or 0)
end

-- Model FLOPs per token as torchtitan 0.3 counts them for MFU
-- (models/utils.py get_dense_model_nparams_and_flops, called by
-- models/llama3/model.py with head_dims = 2 * head_dim; and
-- get_moe_model_nparams_and_flops, called by models/qwen3/model.py for
-- qwen3 and qwen3_moe -- the mixtral family is its decoder -- and by
-- models/deepseek_v3/model.py with head_dims = qk_nope_head_dim +
-- qk_rope_head_dim + v_head_dim): 6 x the active parameters outside the
-- embedding (the routed experts' as top_k / num_experts of them, integer
-- division as torchtitan's; the router and shared experts whole) plus 6 x
-- layers x heads x head_dims x seq_len for attention; no recompute
-- (hardware FLOPs count it, model FLOPs do not). With tied embeddings
-- torchtitan counts the shared table once and keeps it, as lm_head's
-- matmul. nil for a model without attention dims (a generic one).
-- DeepSeek-V3's multi-token prediction (model.num_mtp_layers): torchtitan
-- counts model.named_parameters() (models/utils.py:488-501), the MTP
-- blocks' among them (mtp_layers.<k>: their MoE's by the same name tests),
-- once each whatever the calls (the embedding and lm_head once though run
-- once per depth more), and the attention term over model_config.layers
-- (utils.py:533-538), which holds the main blocks only (MTPDecoder.Config
-- keeps them in mtp_layers, models/deepseek_v3/mtp.py:176-197): so the
-- layout's MTP units' parameters and cfg.n_layers (equal to torchtitan's
-- get_nparams_and_flops for 16B with 0, 1, 2 depths: tests/lua/test_mtp.lua).
function compute.model_flops_per_token(p, s)
  local cfg = p.model_config or compute.generic_attention(p)
  if not (cfg and cfg.n_layers and cfg.n_heads) then return nil end
  local head_dims = cfg.qk_nope_head_dim and (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    or 2 * (cfg.head_dim or cfg.dim // cfg.n_heads)
  -- (torchtitan's name tests, models/utils.py: "embedding", "moe.shared_experts", "moe.router", "moe.routed_experts")
  local dense, embedding, sparse_whole, experts = 0, 0, 0, 0
  for _, q in ipairs(compute.param_counts(p)) do
    local name, n = q[1], q[2]
    if name:find("embedding", 1, true) or name:find("embed_tokens", 1, true) then
      embedding, dense = embedding + n, dense + n
    elseif name:find("moe.shared_experts", 1, true) or name:find("moe.router", 1, true) then
      sparse_whole = sparse_whole + n
    elseif name:find("moe.routed_experts", 1, true) then experts = experts + n
    else dense = dense + n end
  end
  local active = sparse_whole + (cfg.num_experts and experts * cfg.top_k // cfg.num_experts or experts)
  local tied = cfg.enable_weight_tying
  return 6 * (dense - (tied and 0 or embedding) + active) + 6 * cfg.n_layers * cfg.n_heads * head_dims * s.seq_len
end

-- A generic model's attention shape where the plan gives it (model.n_heads,
-- head_dim, n_layers; enable_weight_tying), as the families' configs hold
-- it; nil otherwise.
function compute.generic_attention(p)
  local m = p.model
  if m and m.family == "generic" and m.n_heads and m.head_dim and m.n_layers then
    return { n_heads = m.n_heads, head_dim = m.head_dim, n_layers = m.n_layers,
             enable_weight_tying = m.enable_weight_tying }
  end
  return nil
end

-- Why a generic model's activations are not computed (SCHEDULE.md says it
-- first): what compute.generic_blocks needs that the plan lacks.
function compute.generic_unmodeled(p)
  if not compute.generic_attention(p) then
    return "a generic model's units give no activation shapes without model.n_heads, head_dim and n_layers"
  end
  local what = string.format("its units are not %d decoder blocks of model.n_heads x head_dim (a Llama block's seven "
    .. "weights, any names), an embedding (a weight named *embed*), the output projection and norms",
    p.model.n_layers)
  if ((p.dims and p.dims.tp) or 1) > 1 and generic.decoder(p.model, p.layout.units, 1) then
    what = "tp > 1 and its blocks' weights are not named as torchtitan's Llama's (attention.wq .. wo, "
      .. "feed_forward.w1 .. w3, output.weight or a tied tok_embeddings.weight), so where TP shards its "
      .. "activations is not known"
  end
  return what
end

-- The optimizer step's microseconds on one rank (issue 37, item 2): memory-
-- bound, at HBM speed, once per step after the last reduction, over the
-- rank's sharded parameters. torchtitan's default implementation is
-- "fused" (components/optimizer/optimizer.py:109-111): torch's fused AdamW
-- reads the parameter, its gradient and both moments and writes the
-- parameter and the moments in one kernel (moments in the parameters'
-- dtype, torch.optim.AdamW, or bf16 under "fused_opt_states_bf16": compute.moment_bytes;
-- an fp32 master copy read and written too);
-- SGD without momentum reads the parameter and gradient, writes the
-- parameter. Only the trainable shards (u.rs_total): torch.optim skips a
-- parameter whose .grad is None, as a frozen one's always is. An
-- offloading unit's step runs on the host (CPUOffloadPolicy: "the optimizer
-- step runs on CPU", torch 2.15 _fsdp_api.py:239-255), off the GPU's
-- timeline. 0 under the topology.mfu override (it prices FLOPs only) and
-- without an optimizer.
function compute.optimizer_us(p, s)
  if s.mfu or s.optimizer == "none" or not p.layout then return 0 end
  local bytes = 0
  for _, u in ipairs(p.layout.units) do
    local e = ES[u.orig_dtype]
    local per = 3 * e -- parameter read and written, gradient read (in the parameter's dtype)
    if s.optimizer == "adamw" then
      per = per + 4 * compute.moment_bytes(s, e) + (s.fp32_master and 8 or 0)
    end
    if not u.offload then bytes = bytes + per * (u.rs_total or 0) end
  end
  return bytes / (s.hbm_GBps * 1e3)
end

-- FLOPs of one whole step on one rank.
function compute.step_flops(p, per_unit)
  local f = 0
  for _, r in pairs(per_unit) do f = f + r.fwd + r.bwd + r.recompute end
  return f * p.fsdp.micro_steps
end

-- Parameters of the model (TP-local numel x tp for a TP plan's face; an
-- expert weight's ep slice x ep: every expert counts; a tied qwen3's
-- lm_head.weight is tok_embeddings.weight: counted once, as torchtitan does).
function compute.model_params(p)
  local n = 0
  for _, q in ipairs(compute.param_counts(p)) do n = n + q[2] end
  return n
end

-- Each parameter of the model once, whole: { {name, numel}, ... } (as
-- model_params counts them).
function compute.param_counts(p)
  local out = {}
  -- (a generic plan from torchtitan 0.3's tied model, commplan.plan_from_titan: its lm_head.weight
  -- is the embedding's table, untied only while fully_shard wraps them, gen/models/qwen3.lua)
  local tied = p.model.family == "qwen3" and p.model_config and p.model_config.enable_weight_tying
    or p.model.family == "generic" and p.model.enable_weight_tying
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do
      local k = q.full_numel or q.numel
      if q.ep_full and q.shape[1] and q.shape[1] > 0 then k = k * q.ep_full // q.shape[1] end
      if not (tied and q.name == "lm_head.weight") then out[#out + 1] = { q.name, k } end
    end
  end
  return out
end

return compute
