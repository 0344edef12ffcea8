-- Tensor parallelism, the module (gen/parallel/init.lua's contract): each
-- parameter's TP placement, its TP-local shape on every TP rank (DTensor's
-- torch.chunk split: ranks get ceil(n / tp) rows, trailing ranks fewer or
-- none), and the TP classes: TP ranks whose local shapes agree for every
-- parameter share one FSDP layout. FSDP2 then shards the TP-local tensor
-- (gen/parallel/fsdp_layout.lua), so when TP splits a dim unevenly the fused slot sizes
-- depend on the TP coordinate; the tables hold one layout per class, never
-- one per rank. The activation side (the collectives inside each unit's
-- compute) is gen/parallel/tp_acts.lua.
local util = require("gen.util")
local tp_acts = require("gen.parallel.tp_acts")
local generic = require("gen.models.generic")

local tp = { name = "tp", label = "TP", dims = { "tp" }, groups = { "tp" } }

-- Placement name -> the weight dim TP shards (nil: replicated over TP).
-- torchtitan's ColwiseParallel shards a Linear's weight on dim 0 (its
-- output features) and RowwiseParallel on dim 1 (its input features).
tp.PLACEMENTS = { colwise = 0, rowwise = 1, replicate = false }

function tp.dim_of(placement)
  placement = placement or "replicate"
  local explicit = placement:match("^shard%((%d)%)$")
  if explicit then return tonumber(explicit) end
  local d = tp.PLACEMENTS[placement]
  return d ~= false and d or nil
end

-- Rows of an n-row dim that TP rank t holds, and the chunk size.
function tp.local_rows(n, T, t)
  local c = util.ceil_div(n, T)
  return math.max(0, math.min(c, n - t * c)), c
end

-- The TP-local copy of a parameter on TP rank t: shape with the TP dim
-- replaced by t's rows; full_shape, tp_dim (0-based) and tp_chunk record
-- how local elements map back to the full parameter.
function tp.local_param(p, T, t)
  local q = {}
  for k, v in pairs(p) do q[k] = v end
  q.full_shape = p.shape
  local d = T > 1 and tp.dim_of(p.tp) or nil
  if d == nil then
    q.tp_dim, q.tp_chunk = nil, nil
    return q
  end
  local shape = {}
  for i, n in ipairs(p.shape) do shape[i] = n end
  local rows, chunk = tp.local_rows(p.shape[d + 1], T, t)
  shape[d + 1] = rows
  q.shape, q.tp_dim, q.tp_chunk = shape, d, chunk
  return q
end

-- units (each param with .tp), dims -> { classes = { { coords = {t...}, units = TP-local units } ... },
--                                        class_of = { [t] = class index (1-based) } }
-- Classes are numbered in order of their first TP coordinate.
function tp.classes(units, d)
  local T = d.tp
  -- A TP rank's class key is the local row count of every TP-split
  -- parameter (the only shape entries that depend on t); the TP-local
  -- units are built once per class, not once per TP rank.
  local split = {}
  for _, u in ipairs(units) do
    for _, p in ipairs(u.params) do
      local k = T > 1 and tp.dim_of(p.tp) or nil
      if k then split[#split + 1] = p.shape[k + 1] end
    end
  end
  local classes, class_of, by_key = {}, {}, {}
  for t = 0, T - 1 do
    local key = {}
    for i, n in ipairs(split) do key[i] = tp.local_rows(n, T, t) end
    local k = table.concat(key, ",")
    local c = by_key[k]
    if not c then
      local local_units = {}
      for i, u in ipairs(units) do
        local params = {}
        for j, p in ipairs(u.params) do params[j] = tp.local_param(p, T, t) end
        local lu = {}
        for f, v in pairs(u) do lu[f] = v end
        lu.params = params
        local_units[i] = lu
      end
      classes[#classes + 1] = { coords = {}, units = local_units }
      c = #classes
      by_key[k] = c
    end
    table.insert(classes[c].coords, t)
    class_of[t] = c
  end
  return { classes = classes, class_of = class_of }
end

-- torchtitan's Llama plan: attention wq/wk/wv and feed-forward w1/w3
-- column-wise, wo and w2 row-wise, the embedding row-wise (nn.Embedding:
-- its vocab rows, dim 0), the output column-wise, norms replicated.
-- A generic model under Llama's names (gen/models/generic.lua's decoder:
-- Qwen2's q/k/v biases, Llama's attention_bias / mlp_bias, tied embeddings,
-- as commplan.hf_config writes them) takes this plan too, its biases as
-- torch's styles place them (torch/distributed/tensor/parallel/style.py:
-- ColwiseParallel._partition_linear_fn shards weight and bias Shard(0),
-- :121-132; RowwiseParallel._partition_linear_fn weight Shard(1), bias
-- Replicate, :250-279). A tied table is one parameter with one placement,
-- Shard(0): RowwiseParallel's on the embedding (_partition_embedding_fn,
-- its vocab rows) and ColwiseParallel's on the output are both Shard(0) of
-- the [vocab, dim] table, so the output re-tied to the embedding's DTensor
-- after parallelize_module (as Hugging Face's tie_weights does) is valid
-- for both styles.
local LLAMA = {
  ["attention.wq.weight"] = "colwise", ["attention.wk.weight"] = "colwise", ["attention.wv.weight"] = "colwise",
  ["attention.wo.weight"] = "rowwise", ["feed_forward.w1.weight"] = "colwise",
  ["feed_forward.w2.weight"] = "rowwise", ["feed_forward.w3.weight"] = "colwise",
  ["tok_embeddings.weight"] = "shard(0)", ["output.weight"] = "colwise",
  ["attention.wq.bias"] = "colwise", ["attention.wk.bias"] = "colwise", ["attention.wv.bias"] = "colwise",
  ["attention.wo.bias"] = "replicate", ["feed_forward.w1.bias"] = "colwise",
  ["feed_forward.w2.bias"] = "replicate", ["feed_forward.w3.bias"] = "colwise",
  -- model.fused "swiglu" (gen/models/fused.lua): w13 [hidden, 2, dim] Shard(0) on hidden
  -- (overrides/fused_swiglu.py:500-503), each TP rank matching gate and up rows (:33-42)
  ["feed_forward.w13"] = "colwise",
}

-- torchtitan 0.3's DeepSeek-V3 plan (models/deepseek_v3/sharding.py,
-- models/common/moe_sharding.py; recorded live: tests/ep/check_ep_live.sh's
-- dp2_tp2* cases): MLA's wq / wq_b and wkv_b column-wise, wo row-wise, its
-- low-rank wq_a, wkv_a and their norms replicated; the dense blocks'
-- feed-forward and the shared experts as Llama's feed-forward; the
-- router's gate replicated; at ep = 1 the routed experts split on their
-- hidden dim (w1_EFD and w3_EFD Shard(1), w2_EDF Shard(2)), at ep > 1 not
-- over TP at all (etp = 1: ExpertParallel puts them on the ep mesh, which
-- borrows TP's ranks); the embedding row-wise on its vocab rows, lm_head
-- column-wise, the norms replicated.
local DEEPSEEK = {
  ["attention.wq.weight"] = "colwise", ["attention.wq_b.weight"] = "colwise",
  ["attention.wkv_b.weight"] = "colwise", ["attention.wo.weight"] = "rowwise",
  ["feed_forward.w1.weight"] = "colwise", ["feed_forward.w2.weight"] = "rowwise",
  ["feed_forward.w3.weight"] = "colwise",
  ["moe.shared_experts.w1.weight"] = "colwise", ["moe.shared_experts.w2.weight"] = "rowwise",
  ["moe.shared_experts.w3.weight"] = "colwise",
  ["feed_forward.w13"] = "colwise", ["moe.shared_experts.w13"] = "colwise",
  ["tok_embeddings.weight"] = "shard(0)", ["lm_head.weight"] = "colwise",
}
-- The routed experts at ep = 1 (every MoE family's GroupedExperts:
-- _GROUPED_EXPERTS_PARAM_LAYOUT, models/qwen3/sharding.py:30-34 and
-- models/deepseek_v3/sharding.py; moe_sharding.py:50-68 puts it on TP).
local GROUPED_EXPERTS = {
  ["moe.routed_experts.inner_experts.w1_EFD"] = "shard(1)", ["moe.routed_experts.inner_experts.w2_EDF"] = "shard(2)",
  ["moe.routed_experts.inner_experts.w3_EFD"] = "shard(1)",
  -- model.fused "grouped_experts": w13 [E, F, 2, D] takes w1_EFD's layout (overrides/fused_swiglu.py:599-610)
  ["moe.routed_experts.inner_experts.w13"] = "shard(1)",
}

-- torchtitan 0.3's dense Qwen3 plan (models/qwen3/sharding.py:54-102, the
-- decoder plan it shares with llama3: models/common/decoder_sharding.py):
-- the fused wqkv -- or wq, wk, wv unfused (wk and wv built from one wkv
-- config, both colwise: decoder_sharding.py:148-152) -- and w1, w3
-- column-wise (colwise_config, S(0): decoder_sharding.py:70-78), wo and w2
-- row-wise (S(1): :81-98), the embedding on its vocab rows and lm_head
-- column-wise (S(0): :320-336), every norm replicated -- attention_norm,
-- ffn_norm and norm R under SP, I without (:101-139), q_norm and k_norm R
-- whatever SP, on head-sharded S(2) activations (qwen3/sharding.py:81-89).
-- The fused wqkv's rows are grouped per KV head (FusedQKVLinear,
-- models/common/attention.py:787-832: [n_kv_heads, R, head_dim]), so its
-- S(0) split hands each TP rank whole KV groups; n_kv_heads % tp == 0 is
-- gen/dims.lua's GQA check.
local QWEN3 = {
  ["attention.qkv_linear.wqkv.weight"] = "colwise", ["attention.qkv_linear.wq.weight"] = "colwise",
  ["attention.qkv_linear.wk.weight"] = "colwise", ["attention.qkv_linear.wv.weight"] = "colwise",
  ["attention.wo.weight"] = "rowwise", ["feed_forward.w1.weight"] = "colwise",
  ["feed_forward.w2.weight"] = "rowwise", ["feed_forward.w3.weight"] = "colwise",
  ["feed_forward.w13"] = "colwise",
  ["tok_embeddings.weight"] = "shard(0)", ["lm_head.weight"] = "colwise",
}
-- torchtitan 0.3's Qwen3 MoE plan is its dense Qwen3 plan above for the
-- attention, norms, embedding and lm_head (set_qwen3_sharding_config:
-- models/qwen3/sharding.py:54-89, every block) and the MoE plan for the
-- MoE block (:104-111, set_moe_sharding_config: models/common/
-- moe_sharding.py:299-371): the router's gate replicated (:89-120), no
-- shared experts, the routed experts GROUPED_EXPERTS at ep = 1 and not on
-- TP at ep > 1 (:201-209: the sparse placement, EP S(0), no TP axis).
-- commplan's mixtral is that decoder without q/k norms (gen/models/
-- mixtral.lua; torchtitan has no Mixtral), so it takes the same plan.
-- torchtitan 0.3's gpt-oss plan (models/gpt_oss/sharding.py:28-127): the
-- decoder plan (set_decoder_sharding_config: the embedding on its vocab
-- rows, lm_head column-wise, the norms R under SP and I without) and per
-- block: the fused wqkv -- or wq, wk, wv -- column-wise with their biases
-- (colwise_config: weight and bias S(0), decoder_sharding.py:70-78,
-- :142-157), wo row-wise with its bias replicated (scaled_bias_rowwise_config,
-- sharding.py:42-63: weight S(1), bias R; ScaledBiasRowwiseLinear adds
-- bias / tp to every rank's partial sum, common/linear.py:43-71), the
-- attention's sinks split over heads (S(0), sharding.py:99-101), the router
-- replicated, and the MoE as Qwen3 MoE's (set_moe_sharding_config, sharding.py:
-- 119-125) with gpt-oss's expert layout at ep = 1 (sharding.py:28-35: mlp1's
-- weight and bias S(1) on their gate/up rows, mlp2's weight S(2), mlp2's
-- bias R, ScaleBiasForward adding it / tp, moe.py:23-64); at ep > 1 the
-- experts are on ep, not TP (moe_sharding.py:201-209).
local GPT_OSS = {
  ["attention.qkv_linear.wqkv.weight"] = "colwise", ["attention.qkv_linear.wqkv.bias"] = "colwise",
  ["attention.qkv_linear.wq.weight"] = "colwise", ["attention.qkv_linear.wq.bias"] = "colwise",
  ["attention.qkv_linear.wk.weight"] = "colwise", ["attention.qkv_linear.wk.bias"] = "colwise",
  ["attention.qkv_linear.wv.weight"] = "colwise", ["attention.qkv_linear.wv.bias"] = "colwise",
  ["attention.wo.weight"] = "rowwise", ["attention.wo.bias"] = "replicate", ["attention.sinks"] = "shard(0)",
  ["tok_embeddings.weight"] = "shard(0)", ["lm_head.weight"] = "colwise",
}
local GPT_OSS_EXPERTS = {
  ["moe.routed_experts.inner_experts.mlp1_weight_EGD"] = "shard(1)",
  ["moe.routed_experts.inner_experts.mlp1_bias_EG"] = "shard(1)",
  ["moe.routed_experts.inner_experts.mlp2_weight_EDF"] = "shard(2)",
  ["moe.routed_experts.inner_experts.mlp2_bias_ED"] = "replicate",
}
-- Each family's TP plan, by parameter name within its block; `experts`:
-- the routed experts' placements, which apply at ep = 1 only (at ep > 1
-- ExpertParallel takes those ranks).
local PLANS = { llama = { names = LLAMA }, qwen3 = { names = QWEN3 },
                mixtral = { names = QWEN3, experts = GROUPED_EXPERTS },
                qwen3_moe = { names = QWEN3, experts = GROUPED_EXPERTS },
                deepseek_v3 = { names = DEEPSEEK, experts = GROUPED_EXPERTS },
                gpt_oss = { names = GPT_OSS, experts = GPT_OSS_EXPERTS } }

-- The family whose TP plan and activation collectives a plan's model
-- takes: its own, or for a generic model that is a decoder under a
-- family's names (gen/models/generic.lua's decoder and NAMES: torchtitan
-- <= 0.2's Llama names, "llama", or 0.3's decoder's, "qwen3") that family;
-- nil for any other generic model (its placements are the plan file's own).
function tp.family(model, units, T)
  if model.family ~= "generic" then return model.family end
  local dec = generic.decoder(model, units, T)
  return dec and dec.names, dec
end

-- Every parameter's placement from its family's plan (the plan file's own,
-- q.tp, first; a name the plan does not list is replicated).
function tp.place(units, family, d)
  local plan = PLANS[family or false]
  if not plan then return end
  local experts = d.ep == 1 and plan.experts or {}
  for _, u in ipairs(units) do
    for _, q in ipairs(u.params) do
      -- (a multi-token prediction block, mtp_layers.<k>: a decoder block's placements, sharding.py:166-171)
      local suffix = q.name:gsub("^mtp_layers%.%d+%.", ""):gsub("^layers%.%d+%.", "")
      q.tp = q.tp or plan.names[suffix] or experts[suffix] or "replicate"
    end
  end
end

-- DENSE: the decoders whose activations are gen/parallel/tp_acts.lua's
-- tp_acts.dense (sequence_parallel, loss_parallel and async_tp apply to
-- them): llama, qwen3, and the GQA MoE families (gpt-oss's too), whose blocks
-- are qwen3's with the MoE's pair of redistributions where the feed-forward's are.
tp.DENSE = { llama = true, qwen3 = true, mixtral = true, qwen3_moe = true, gpt_oss = true }

-- The families only torchtitan 0.3 parallelizes (no legacy path to compare
-- with): loss parallelism always, as torchtitan 0.3 has no switch for it
-- (components/loss.py:51-58: under spmd_types with tp > 1 its
-- cross_entropy_loss is the vocab-parallel one).
tp.LOSS_ALWAYS_PARALLEL = { deepseek_v3 = true, gpt_oss = true }

-- The proof that TP classes cannot hang each other: the members of a TP
-- group sit in different classes, so every class must issue the identical
-- sequence of TP collectives (kind, dtype, count, reduce op). FSDP and
-- replicate groups never span classes (their members share a TP
-- coordinate). A TP group's members share every other coordinate: under
-- an outer module (PP) the classes are compared within each outer place
-- (cls.outer, the pipeline rank).
function tp.check_same_tp_sequence(classes)
  local function seq(cls)
    local t = {}
    for _, o in ipairs(cls.ops) do
      if o.group == "tp" then
        t[#t + 1] = string.format("%s/%s/%d/%s", o.kind, o.dtype, o.count, o.reduce_op or "-")
      end
    end
    return t
  end
  local first = {}
  for c, cls in ipairs(classes) do
    local at = cls.outer or 0
    if not first[at] then
      first[at] = { c = c, seq = seq(cls) }
    else
      local want, got = first[at].seq, seq(cls)
      for i = 1, math.max(#want, #got) do
        if want[i] ~= got[i] then
          error(string.format("internal: TP class %d issues %s as its TP collective %d, class %d %s", c,
            tostring(got[i]), i, first[at].c, tostring(want[i])), 0)
        end
      end
    end
  end
end

-- The placement string PyTorch records for a parameter under FSDP on
-- (dp_shard) and TP on (tp): _StridedShard(dim=0, sf=tp) where both shard
-- dim 0, Shard(d) for each otherwise, Replicate() where TP does not shard.
function tp.placements(q, T)
  local fsdp = string.format("Shard(dim=%d)", q.shard_dim)
  if T <= 1 then return { fsdp } end
  if q.tp_dim == nil then return { fsdp, "Replicate()" } end
  if q.tp_dim == q.shard_dim then fsdp = string.format("_StridedShard(dim=%d, sf=%d)", q.shard_dim, T) end
  return { fsdp, string.format("Shard(dim=%d)", q.tp_dim) }
end


-- ---------------------------------------------------------------- the contract

function tp.used(d) return d.tp > 1 end

-- The audit's mesh line (parallel.mesh_kind): "async TP" where the plan runs it.
function tp.mesh_label(_, p) return p.async_tp and "async TP" or "TP" end

-- The TP settings, checked for every plan (a setting that would be ignored
-- is refused): sequence and loss parallelism need a TP group and a model
-- whose activations are modelled (the dense decoders': llama, qwen3).
function tp.rules(ctx, d, p)
  -- (a generic model giving its attention shape may be a decoder under
  -- Llama's names: tp.on_layout refuses these settings where it is not)
  local dense = tp.DENSE[p.model.family] or (p.model.family == "generic" and p.model.n_heads ~= nil
    and p.model.head_dim ~= nil and p.model.n_layers ~= nil) or false
  if d.tp > 1 and tp.LOSS_ALWAYS_PARALLEL[p.model.family] and p.parallel.loss_parallel == false then
    util.field_error(ctx, "parallel.loss_parallel", string.format("loss_parallel = false with the %s family: "
      .. "torchtitan 0.3 has no such switch (components/loss.py:51-58: with tp > 1 its cross-entropy is always "
      .. "vocab-parallel); remove it", p.model.family))
  end
  if d.tp > 1 and p.model.family == "deepseek_v3" then
    -- torchtitan's plan with or without sequence parallelism, recorded live; loss parallelism always
    -- (tp.LOSS_ALWAYS_PARALLEL)
    if p.parallel.async_tp then
      util.field_error(ctx, "parallel.async_tp", "async TP of the deepseek_v3 family's TP plan is not modelled; "
        .. "remove it")
    end
    return
  end
  if p.parallel.sequence_parallel ~= nil and (d.tp == 1 or not dense) then
    util.field_error(ctx, "parallel.sequence_parallel", d.tp == 1
      and "tp=1: there is no TP group to shard the sequence over; remove sequence_parallel or set tp"
      or "a generic model declares no activations (only the llama, qwen3, mixtral and qwen3_moe families' TP "
        .. "collectives are modelled); remove it")
  end
  if p.parallel.async_tp and (d.tp == 1 or not dense or p.parallel.sequence_parallel == false) then
    util.field_error(ctx, "parallel.async_tp", d.tp == 1
      and "tp=1: there is no TP collective to overlap; remove async_tp or set tp"
      or not dense and "a generic model declares no matmuls (only the llama, qwen3, mixtral and qwen3_moe families' "
        .. "TP collectives are modelled); remove it"
      or "async TP fuses sequence parallelism's all-gathers and reduce-scatters with their matmuls, and "
        .. "sequence_parallel = false leaves only all-reduces; remove async_tp or sequence_parallel = false")
  end
  if p.parallel.loss_parallel ~= nil and (d.tp == 1 or not dense) then
    util.field_error(ctx, "parallel.loss_parallel", d.tp == 1
      and "tp=1: there is no TP group to shard the logits over; remove loss_parallel or set tp"
      or "a generic model declares no loss (only the llama, qwen3, mixtral and qwen3_moe families' TP collectives "
        .. "are modelled); remove it")
  end
end

-- Async TP (torchtitan's enable_async_tensor_parallel) on the plan: the
-- audit prices TP's collectives under the matmuls it fuses them with.
function tp.describe(out, p)
  out.async_tp = p.parallel.async_tp or nil
  return out
end

-- The placements (torchtitan's plan for llama; the plan file's own for a
-- generic model, checked by gen/load.lua), on the plan's fresh units. A TP
-- group with nothing to split would only cost time: refused.
function tp.apply_units(ctx, units, d, p)
  -- TP's classes take every parameter's TP-local rows on every TP rank:
  -- work of tp x the parameters, bounded before any placement or class
  local params = 0
  for _, u in ipairs(units) do params = params + #u.params end
  if not util.mul_within(params, d.tp, util.LIMITS.tp_splits) then
    util.field_error(ctx, "parallel.tp", string.format("tp=%d x %d parameters is more than %s, the most the "
      .. "generator places over TP (it takes every parameter's rows on every TP rank); use a smaller tp or fewer "
      .. "parameters", d.tp, params, util.pow2_text(util.LIMITS.tp_splits)))
  end
  tp.place(units, tp.family(p.model, units, d.tp), d)
  for _, u in ipairs(units) do
    for _, q in ipairs(u.params) do if tp.dim_of(q.tp) then return units end end
  end
  util.field_error(ctx, "parallel.tp", string.format("tp=%d but no parameter has a TP placement, so every "
    .. "parameter would be replicated over TP and the TP group would do nothing: give parameters "
    .. "tp = \"colwise\" | \"rowwise\" | \"shard(k)\", or set tp=1", d.tp))
end

-- A class's layout gets each TP-local parameter's TP facts (emit, audit
-- and the cost read them there) and each unit its activation collectives.
function tp.on_layout(ctx, lay, units, d, p, cfg)
  local by_name = {}
  for _, u in ipairs(units) do
    for _, q in ipairs(u.params) do by_name[q.name] = q end
  end
  for _, u in ipairs(lay.units) do
    for _, q in ipairs(u.params) do
      local src = by_name[q.name]
      q.tp = src.tp
      q.tp_dim, q.tp_chunk, q.full_shape = src.tp_dim, src.tp_chunk, src.full_shape
      q.full_numel = util.product(src.full_shape)
    end
  end
  local fam, dec = tp.family(p.model, units, d.tp)
  if p.model.family == "generic" and not fam then
    -- (sequence, loss parallelism and async TP name the block's and the loss's
    -- collectives, which only a decoder under Llama's names has)
    for _, k in ipairs({ "sequence_parallel", "loss_parallel", "async_tp" }) do
      if p.parallel[k] ~= nil then
        util.field_error(ctx, "parallel." .. k, string.format("%s: this generic model is not a decoder under "
          .. "torchtitan's Llama names (%s), so its activations' TP collectives are not known; remove it", k,
          require("gen.compute").generic_unmodeled({ model = p.model, layout = { units = units }, dims = d })))
      end
    end
  end
  if tp.DENSE[fam] then
    -- a rank's tokens: seq_len / cp of each sequence under context parallel
    -- (gen/parallel/cp.lua: torchtitan shards the batch on the sequence over
    -- cp before TP's sequence shards, distributed/full_dtensor.py:148-149)
    tp_acts.dense(ctx, lay, dec and dec.cfg or cfg, d.tp, { batch = p.training and p.training.local_batch_size,
                                        seq_len = p.model.seq_len and p.model.seq_len // d.cp, family = fam,
                                        tied = dec and dec.head_weight == "tok_embeddings.weight",
                                        sequence_parallel = p.parallel.sequence_parallel,
                                        loss_parallel = p.parallel.loss_parallel,
                                        async_tp = p.parallel.async_tp, ep = d.ep })
  elseif p.model.family == "deepseek_v3" then
    tp_acts.deepseek(ctx, lay, cfg, d.tp, { batch = p.training and p.training.local_batch_size,
                                           seq_len = p.model.seq_len and p.model.seq_len // d.cp, ep = d.ep,
                                           sequence_parallel = p.parallel.sequence_parallel })
  end
  return lay
end

-- A unit's TP activation collectives run inside its forward and backward
-- compute, on the compute stream, over the TP group; at = "reduce" (the
-- post-backward of a micro-step that reduces, before FSDP's reduction):
-- the Partial norm gradients' all-reduces (tp_acts' reducing_only ones,
-- listed after the unit's other backward collectives). An act with a
-- point runs there instead (ep's experts units: "backward_before", ahead
-- of the combine's gradient).
-- A unit the model calls more than once (call: its event of lay.calls,
-- DeepSeek-V3's [norm, lm_head] under multi-token prediction,
-- gen/models/deepseek_v3.lua calls): the output's gather (region "output",
-- the norm's out_dst Replicate, decoder_sharding.py:119-139) runs with the
-- call of the norm (its part starting at the unit's first parameter), the
-- loss-parallel all-reduces (region "loss") once per lm_head call (MTPLoss
-- takes one cross-entropy per prediction, models/deepseek_v3/mtp.py:363-
-- 395); every other act with every call.
local function in_call(a, call)
  if not (call and call.part) then return true end
  if a.region == "output" then return call.part[1] == 0 end
  if a.region == "loss" then return call.part[1] > 0 end
  return true
end

function tp.unit_ops(out, u, m, at, call)
  local acts = u.tp_acts
  if not acts then return end
  local reduce = at == "reduce"
  local point = reduce and "backward" or at
  for _, a in ipairs(acts) do
    if (a.point or a.phase) == point and (a.reducing_only or false) == reduce and in_call(a, call) then
      out[#out + 1] = { kind = a.kind, unit = u.index, micro_step = m, phase = a.phase, group = "tp", dtype = a.dtype,
                        count = a.count, reduce_op = a.kind ~= "tp_all_gather" and (a.reduce_op or "sum") or nil,
                        what = a.what, loss = a.loss, mm_flops = a.mm_flops, region = a.region,
                        f8_gather = a.f8_gather }
    end
  end
end

tp.prove = tp.check_same_tp_sequence

return tp
