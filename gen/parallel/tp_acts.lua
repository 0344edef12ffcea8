-- Tensor parallelism, activation side: the collectives torchtitan's Llama
-- TP plan issues inside each unit's forward and backward, sized from the
-- plan's local batch, seq_len and the model dims (elements per rank).
--
-- With sequence parallelism (torchtitan's default with TP) activations
-- between blocks are sharded on the sequence: a block gathers them before
-- attention and before the feed-forward (PrepareModuleInput: Shard(1) ->
-- Replicate) and reduce-scatters after wo and w2 (RowwiseParallel with
-- output Shard(1)); backward mirrors each (a gather's gradient is a
-- reduce-scatter and the reverse), in reverse order. The embedding
-- (RowwiseParallel, output Shard(1)) reduce-scatters its partial sums; the
-- output (ColwiseParallel, input Shard(1)) gathers the normed sequence.
-- Without sequence parallelism, wo and w2 all-reduce their outputs in
-- forward and the block inputs' gradients are all-reduced in backward;
-- the embedding all-reduces its output.
--
-- loss_parallel (torchtitan's default with TP; parallel.loss_parallel):
-- the cross-entropy over vocab-sharded logits (torch/distributed/tensor/
-- parallel/loss.py, _log_softmax and _nll_loss_forward) all-reduces, per
-- token, the max logit (a MAX), the sum of exponentials and the target's
-- logit (SUMs), batch x seq fp32 elements each (torchtitan casts the logits
-- to fp32 for the loss); its backward is local. They run after the output's
-- forward, outside every fully_shard unit: the schedule puts them at the
-- end of the forward of the unit holding output.weight (tests/tp_record.py
-- records them from PyTorch and compares).
local util = require("gen.util")

local tp_acts = {}

local function has(u, suffix)
  for _, q in ipairs(u.params) do
    if q.name:sub(-#suffix) == suffix then return true end
  end
  return false
end

-- A unit's acts, and act_numel: its largest TP buffer in ag_dtype
-- elements (an op in a wider dtype takes more).
local function finish(u, acts, T)
  if #acts == 0 then return end
  local ES, es_ag = util.DTYPE_BYTES, util.DTYPE_BYTES[u.ag_dtype]
  local most = 0
  for _, a in ipairs(acts) do
    local elems = (a.kind == "tp_all_gather" or a.kind == "tp_reduce_scatter") and a.count * T or a.count
    most = math.max(most, util.ceil_div(elems * ES[a.dtype], es_ag))
  end
  u.tp_acts, u.act_numel = acts, most
end

-- The sequence length the TP collectives are sized by, or the one-line refusal.
local function seq_len_of(ctx, opts)
  if not opts.seq_len then
    util.field_error(ctx, "model.seq_len", "tp > 1: seq_len is needed to size the TP activation collectives; "
      .. "set model.seq_len (and training.local_batch_size, sequences per rank, default 1)")
  end
  return opts.seq_len
end

-- The dense decoders' TP plans as data: torchtitan 0.3 shares one
-- decoder plan between llama3 and qwen3 (models/common/decoder_sharding.py:
-- set_decoder_sharding_config, set_gqa_attention_sharding,
-- set_dense_ffn_sharding; models/llama3/sharding.py:39-74,
-- models/qwen3/sharding.py:54-102). Per family: the parameter marking the
-- unit that holds the embedding, a block (its attention's wo), the output
-- projection; and which TP-replicated parameters' gradients come out
-- Partial over TP -- the norms under sequence parallelism (their weight R:
-- decoder_sharding.py:106, I without it), and Qwen3's q/k norms always
-- (weight R on a head-sharded S(2) input whatever SP: qwen3/sharding.py:81-89).
--
-- The GQA MoE families (mixtral, qwen3_moe: torchtitan's Qwen3 MoE
-- decoder, models/qwen3/sharding.py:59-111) are qwen3's plan with an MoE
-- (`moe`: its router's gate) where the feed-forward is
-- (models/common/moe_sharding.py): at ep = 1 the MoE wrapper takes its
-- input from the sequence shards to Replicate and its Partial output back
-- (_moe_sharding_config, :267-296) -- the feed-forward's all-gather and
-- reduce-scatter, in the same places, or without sequence parallelism its
-- forward and backward all-reduces; at ep > 1 its input stays on the
-- sequence shards and its output comes back on them from the experts
-- (desired_input_layout = sp_layout, experts_output_layout S(1)), so the
-- block issues no TP collective for it; without sequence parallelism its
-- input is sliced to them and its output all-reduced (below, on the
-- experts unit). The router's gate weight is R on
-- an R input at ep = 1 whose gradient comes back Partial from the routed
-- experts' local_map (experts_input_grad_layout P, :219), and on the
-- sequence shard at ep > 1: its gradient is Partial over TP either way.
local QWEN3_PARTIAL = { "attention%.[qk]_norm%.weight$" }
local MOE_PARTIAL = { "attention%.[qk]_norm%.weight$", "moe%.router%.gate%.weight$" }
-- gpt-oss (models/gpt_oss/sharding.py): no q/k norms; the R parameters
-- whose gradients come out Partial over TP: wo's bias (R, added / tp to each
-- rank's partial sum in the rowwise local_map: common/linear.py:43-71), the
-- router's gate weight and bias; at ep = 1 the routed experts' mlp2 bias
-- (R, ScaleBiasForward's R -> V, moe.py:41-57; at ep > 1 the experts are
-- on ep and the bias is no TP parameter). Held live: tests/ep/ep_cases.py's
-- gpt_dp2_tp2* cases.
local GPT_OSS_PARTIAL = { "attention%.wo%.bias$", "moe%.router%.gate%.weight$", "moe%.router%.gate%.bias$" }
local GPT_OSS_PARTIAL_EP1 = { "mlp2_bias_ED$" }
tp_acts.DENSE = {
  llama = { embedding = "tok_embeddings.weight", block = "attention.wo.weight", output = "output.weight",
            partial_sp = "norm%.weight$" },
  qwen3 = { embedding = "tok_embeddings.weight", block = "attention.wo.weight", output = "lm_head.weight",
            partial_sp = "norm%.weight$", partial_always = QWEN3_PARTIAL },
  mixtral = { embedding = "tok_embeddings.weight", block = "attention.wo.weight", output = "lm_head.weight",
              moe = "moe.router.gate.weight", partial_sp = "norm%.weight$", partial_always = MOE_PARTIAL },
  qwen3_moe = { embedding = "tok_embeddings.weight", block = "attention.wo.weight", output = "lm_head.weight",
                moe = "moe.router.gate.weight", partial_sp = "norm%.weight$", partial_always = MOE_PARTIAL },
  gpt_oss = { embedding = "tok_embeddings.weight", block = "attention.wo.weight", output = "lm_head.weight",
              moe = "moe.router.gate.weight", partial_sp = "norm%.weight$", partial_always = GPT_OSS_PARTIAL,
              partial_ep1 = GPT_OSS_PARTIAL_EP1 },
}

-- Whether TP-replicated parameter q's gradient is Partial over TP (FSDP2's
-- post-backward all-reduces it).
local function partial_grad(q, fam, sp, ep)
  if q.tp_dim ~= nil then return false end
  for _, pat in ipairs(fam.partial_always or {}) do
    if q.name:match(pat) then return true end
  end
  for _, pat in ipairs(ep == 1 and fam.partial_ep1 or {}) do
    if q.name:match(pat) then return true end
  end
  return sp and q.name:match(fam.partial_sp) ~= nil
end

-- The unit whose acts hold the output projection's and the loss's: the one
-- holding it, or -- a tied model's one unit for both ends (gen/models/
-- qwen3.lua), whose lm_head runs after every block -- the last block's unit
-- (recorded live: tests/tp_record.py's qwen3_tied_tp2_sp).
local function output_unit(units, fam)
  local last_block
  for _, u in ipairs(units) do
    if has(u, fam.block) then last_block = u end
  end
  for _, u in ipairs(units) do
    if has(u, fam.output) then return has(u, fam.embedding) and last_block or u end
  end
end

-- The embedding's TP collectives, the same in every family's plan (its
-- output Partial over the vocab shards: reduce-scattered to the sequence
-- shards under SP, else all-reduced). add(kind, phase, count, what, _, region).
local function embedding_acts(add, sp, shard, full)
  if sp then
    add("tp_reduce_scatter", "forward", shard, "embedding output to sequence shards", nil, "embedding")
    add("tp_all_gather", "backward", shard, "embedding output gradient", nil, "embedding")
  else
    add("tp_all_reduce", "forward", full, "embedding output partial sums", nil, "embedding")
  end
end

-- Moves acts[from..#acts] to sit at position at (before acts[at]).
local function move(acts, from, at)
  local tail = {}
  for i = #acts, from, -1 do table.insert(tail, 1, table.remove(acts, i)) end
  for i, a in ipairs(tail) do table.insert(acts, at + i - 1, a) end
end

-- layout units (a tp_acts.DENSE family), model config, tp, opts = { batch,
-- seq_len, sequence_parallel, loss_parallel, async_tp, family, ep, tied } -> sets
-- u.tp_acts = list of { kind, phase, count, dtype, what } and u.act_numel
-- on every unit that has any.
function tp_acts.dense(ctx, lay, cfg, T, opts)
  if T <= 1 then return end
  local fam = tp_acts.DENSE[opts.family or "llama"]
  -- a generic Llama-named decoder with tied embeddings (gen/models/generic.lua's
  -- decoder): the output projection is the embedding's table, its unit the first
  if opts.tied then fam = setmetatable({ output = fam.embedding }, { __index = fam }) end
  local seq = seq_len_of(ctx, opts)
  local b, sp = opts.batch or 1, opts.sequence_parallel ~= false
  local ep = opts.ep or 1
  local loss_parallel = opts.loss_parallel ~= false
  local full = b * seq * cfg.dim          -- one activation, every token
  local shard = full // T                 -- one sequence shard (seq % tp == 0: gen/dims checks)
  -- Async TP (parallel.async_tp): the forward FLOPs per rank of the matmuls
  -- each sequence-parallel collective is fused with (torch's
  -- fused_all_gather_matmul / fused_matmul_reduce_scatter), in forward and
  -- in its backward mirror (dX = dY W^T: the same FLOPs). q: the query
  -- width, n_heads x head_dim (Qwen3's head_dim is given: not always dim).
  local mm
  if opts.async_tp and sp then
    local tokens, d, kv = b * seq, cfg.dim, cfg.n_kv_heads * cfg.head_dim
    local q = cfg.n_heads * cfg.head_dim
    local function flops(out_dim, in_dim) return 2 * tokens * in_dim * out_dim // T end
    -- (an MoE family's blocks have no feed-forward: its MoE's collectives fuse no matmul, w13 and w2 unused)
    local hidden = cfg.hidden or 0
    mm = { qkv = flops(q + 2 * kv, d), wo = flops(d, q), w13 = flops(2 * hidden, d), w2 = flops(d, hidden),
           output = flops(cfg.vocab_size, d) }
  end
  local head = output_unit(lay.units, fam)
  for _, u in ipairs(lay.units) do
    local acts = {}
    local function add(kind, phase, count, what, fused, region)
      -- f8_gather: an all-gather feeding a block's linear, which torchao's
      -- Float8ColwiseParallel / Float8RowwiseParallel gather in float8 under
      -- the tensorwise recipe (priced so by gen/cost.lua)
      acts[#acts + 1] = { kind = kind, phase = phase, count = count, dtype = u.ag_dtype, what = what,
                          mm_flops = mm and fused and mm[fused], region = region,
                          f8_gather = kind == "tp_all_gather" and fused ~= nil and fused ~= "output" or nil }
    end
    local carried = u == head and not has(u, fam.output)
    local cut -- a carried output's acts go between the last block's forward and backward ones
    if has(u, fam.embedding) then
      embedding_acts(add, sp, shard, full)
    end
    if has(u, fam.block) then
      -- the block's feed-forward, or its MoE: redistributed at ep = 1 only
      -- (the MoE's gathered input feeds the router and the grouped experts,
      -- no fused matmul: priced unfused under async TP)
      local moe = fam.moe and has(u, fam.moe)
      local ffn = not moe or ep == 1
      local ffn_in, ffn_out = "feed-forward input", "w2 output"
      local w13, w2 = "w13", "w2"
      if moe then ffn_in, ffn_out, w13, w2 = "MoE input", "routed experts' output", nil, nil end
      if sp then
        add("tp_all_gather", "forward", shard, "attention input sequence", "qkv", "attention_input")
        add("tp_reduce_scatter", "forward", shard, "wo output to sequence shards", "wo", "attention_output")
        if ffn then
          add("tp_all_gather", "forward", shard, ffn_in .. " sequence", w13, "ffn_input")
          add("tp_reduce_scatter", "forward", shard, ffn_out .. " to sequence shards", w2, "ffn_output")
        end
        cut = #acts + 1
        if ffn then
          add("tp_all_gather", "backward", shard, ffn_out .. " gradient", w2, "ffn_output")
          add("tp_reduce_scatter", "backward", shard, ffn_in .. " gradient", w13, "ffn_input")
        end
        add("tp_all_gather", "backward", shard, "wo output gradient", "wo", "attention_output")
        add("tp_reduce_scatter", "backward", shard, "attention input gradient", "qkv", "attention_input")
      else
        add("tp_all_reduce", "forward", full, "wo output partial sums", nil, "attention_output")
        if ffn then add("tp_all_reduce", "forward", full, ffn_out .. " partial sums", nil, "ffn_output") end
        cut = #acts + 1
        if ffn then add("tp_all_reduce", "backward", full, ffn_in .. " gradient", nil, "ffn_input") end
        add("tp_all_reduce", "backward", full, "attention input gradient", nil, "attention_input")
      end
    end
    if u.expert and not sp then
      -- ep > 1 without SP (recorded live: tests/ep/ep_cases.py's q3m_dp2_tp2_ep2_nosp): the MoE's
      -- replicated input sliced to the sequence shards for the router and the routed experts (I -> S(1),
      -- moe_sharding.py:89-112, :201-209), its Partial output all-reduced after the combine (P -> I,
      -- :282-295); in backward, after the dispatch's gradient, each slice's gradient gathered
      -- (the routed experts' input first, then the router's): on the experts unit, around EP's
      add("tp_all_reduce", "forward", full, "MoE output partial sums")
      add("tp_all_gather", "backward", shard, "routed experts' input gradient")
      add("tp_all_gather", "backward", shard, "router input gradient")
    end
    local before = #acts
    if u == head then
      if sp then
        add("tp_all_gather", "forward", shard, "output input sequence", "output", "output")
        add("tp_reduce_scatter", "backward", shard, "output input gradient", "output", "output")
      else
        add("tp_all_reduce", "backward", full, "output input gradient", nil, "output")
      end
      if not loss_parallel then
        -- ColwiseParallel(output_layouts=Replicate()): the whole logits gathered
        -- over the vocab dim (uneven vocab shards padded to ceil(vocab / tp))
        add("tp_all_gather", "forward", b * seq * util.ceil_div(cfg.vocab_size, T), "output logits (no loss_parallel)", nil, "output")
      else
        for _, l in ipairs({ { "max", "loss_parallel: per-token max logit" },
                             { "sum", "loss_parallel: per-token sum of exponentials" },
                             { "sum", "loss_parallel: per-token target logit" } }) do
          add("tp_all_reduce", "forward", b * seq, l[2], nil, "loss")
          acts[#acts].reduce_op, acts[#acts].dtype, acts[#acts].loss = l[1], "fp32", true
        end
      end
    end
    if carried then move(acts, before + 1, cut) end
    -- The replicated weights whose gradients come out Partial over TP
    -- (partial_grad); FSDP2's post-backward redistributes them to
    -- Replicate (FSDPParam._get_grad_inner_tensor): an all-reduce of each,
    -- in parameter order, after the unit's backward collectives and before
    -- its packing, on a reducing micro-step only (accumulation keeps them
    -- Partial). It runs in the unit's reduce dtype: torch 2.15 keeps these
    -- parameters' gradients in their grad_dtype (reduce_dtype) from autograd
    -- on (FSDPParam.may_reduce_grad_outside_dp), so the reduction over TP
    -- runs in the wider dtype too.
    -- (a frozen parameter has no gradient to redistribute)
    for _, q in ipairs(u.params) do
      if partial_grad(q, fam, sp, ep) and not q.frozen then
        add("tp_all_reduce", "backward", q.numel, q.name .. " gradient (Partial over TP)")
        acts[#acts].reducing_only = true
        acts[#acts].dtype = u.reduce_dtype
      end
    end
    finish(u, acts, T)
  end
end

-- DeepSeek-V3 (gen/models/deepseek_v3.lua) under torchtitan 0.3's TP plan
-- (models/deepseek_v3/sharding.py, models/common/moe_sharding.py), recorded
-- live on gloo (tests/ep/check_ep_live.sh's dp2_tp2* cases). sets u.tp_acts
-- as tp_acts.dense does; opts = { batch, seq_len, ep, sequence_parallel }.
-- With sequence parallelism (torchtitan's default):
--  * the embedding, the output and the loss, the dense blocks' attention
--    and feed-forward: as the Llama plan's (MLA's input gathered once,
--    Shard(1) -> Replicate, its wo row-wise with Shard(1) output);
--  * an MoE block at ep = 1 (the experts split over TP on their hidden
--    dim): the MoE input gathered (its router and experts see every
--    token), the routed experts' Partial output reduce-scattered, then the
--    shared experts' w2 output; backward the shared experts' and the
--    routed experts' output gradients gathered, the MoE input's gradient
--    reduce-scattered;
--  * an MoE block at ep > 1 (etp = 1: the experts on ep, not TP): the MoE
--    input stays sequence-sharded, so each TP rank routes its own seq / tp
--    tokens (gen/parallel/ep.lua sizes the all-to-alls from them); only
--    the shared experts gather their input and reduce-scatter their
--    output, after the combine (in backward their gradients' pair before
--    the combine's gradient): those ops sit on the experts unit, at
--    point "forward" after EP's combine and "backward_before" ahead of
--    EP's (gen/parallel/init.lua's nested order);
--  * every TP-replicated parameter's gradient (MLA's wkv_a, kv_norm,
--    wq_a, q_norm, the norms, the router's gate) comes out Partial over TP
--    and FSDP2's post-backward all-reduces it, in parameter order, on a
--    reducing micro-step (as the Llama plan's norms).
-- Without it (parallel.sequence_parallel = false; recorded live:
-- dp2_tp2_nosp, dp2_tp2_ep2_nosp): activations between blocks are whole
-- (I); the embedding, wo, the dense w2 and the MoE all-reduce their Partial
-- outputs in forward, and the attention's, the feed-forward's and (ep = 1)
-- the MoE's input gradients are all-reduced in backward (I -> R); at ep > 1
-- the MoE's output is all-reduced after the combine, the shared experts'
-- input gradient all-reduced before the combine's gradient, and after the
-- dispatch's gradient the routed experts' and the router's input slices'
-- gradients gathered (I -> S(1): moe_sharding.py:89-112, :201-209); the
-- output's input gradient all-reduced; the block norms and the final norm
-- keep whole gradients (norm_config without SP), the other replicated
-- weights' are Partial as with it.
-- Multi-token prediction's blocks (model.num_mtp_layers; models/deepseek_v3/
-- sharding.py:153-192): each planned as a decoder block, enorm and hnorm
-- norms (norm_config), eh_proj's weight replicated on the blocks'
-- activation (no collective of its own; its gradient Partial as MLA's
-- replicated projections'), and mtp_norm as the final norm
-- (pre_lm_head_norm_config): its output gathered (all-reduced gradient
-- without SP) for the depth's lm_head call; the [norm, lm_head] unit's
-- output gather runs with the norm's call, the loss's all-reduces once per
-- lm_head call (gen/parallel/tp.lua in_call).
local NORMS = { "attention_norm%.weight$", "ffn_norm%.weight$", "^norm%.weight$", "enorm%.weight$", "hnorm%.weight$",
                "mtp_norm%.weight$" }

local function is_norm(q)
  for _, pat in ipairs(NORMS) do if q.name:match(pat) then return true end end
  return false
end

function tp_acts.deepseek(ctx, lay, cfg, T, opts)
  if T <= 1 then return end
  local seq = seq_len_of(ctx, opts)
  local b = opts.batch or 1
  local full = b * seq * cfg.dim
  local shard = full // T
  local ep = opts.ep or 1
  local sp = opts.sequence_parallel ~= false
  local shared = (cfg.num_shared_experts or 0) > 0
  for _, u in ipairs(lay.units) do
    local acts = {}
    local function add(kind, phase, count, what, point, region)
      acts[#acts + 1] = { kind = kind, phase = phase, count = count, dtype = u.ag_dtype, what = what, point = point,
                          region = region }
    end
    if has(u, "tok_embeddings.weight") then
      embedding_acts(add, sp, shard, full)
    end
    -- (an MTP block's mtp_norm ends the block: at ep > 1, after the MoE's combine, so on its experts unit,
    -- ahead of EP's combine gradient in backward)
    local mtp = ep > 1 and u.expert and u.name:match("^mtp_layers%.%d+%.experts$")
      or ep == 1 and has(u, "mtp_norm.weight")
    if mtp then -- (its output's gradient, first in the block's backward)
      add(sp and "tp_reduce_scatter" or "tp_all_reduce", "backward", sp and shard or full,
        "mtp_norm output gradient", ep > 1 and "backward_before" or nil)
    end
    if u.expert then
      if sp and shared then
        add("tp_all_gather", "forward", shard, "shared experts' input sequence")
        add("tp_reduce_scatter", "forward", shard, "shared experts' w2 output to sequence shards")
        add("tp_all_gather", "backward", shard, "shared experts' w2 output gradient", "backward_before")
        add("tp_reduce_scatter", "backward", shard, "shared experts' input gradient", "backward_before")
      elseif not sp then
        add("tp_all_reduce", "forward", full, "MoE output partial sums")
        if shared then
          add("tp_all_reduce", "backward", full, "shared experts' input gradient", "backward_before")
        end
        add("tp_all_gather", "backward", shard, "routed experts' input gradient")
        add("tp_all_gather", "backward", shard, "router input gradient")
      end
    elseif has(u, "attention.wo.weight") then
      local dense = has(u, "feed_forward.w1.weight") or has(u, "feed_forward.w13")  -- (w13: model.fused "swiglu")
      local moe = has(u, "moe.router.gate.weight")
      local ffn = dense or (moe and ep == 1)
      if sp then
        add("tp_all_gather", "forward", shard, "attention input sequence", nil, "attention_input")
        add("tp_reduce_scatter", "forward", shard, "wo output to sequence shards", nil, "attention_output")
        if dense then
          add("tp_all_gather", "forward", shard, "feed-forward input sequence", nil, "ffn_input")
          add("tp_reduce_scatter", "forward", shard, "w2 output to sequence shards", nil, "ffn_output")
          add("tp_all_gather", "backward", shard, "w2 output gradient", nil, "ffn_output")
          add("tp_reduce_scatter", "backward", shard, "feed-forward input gradient", nil, "ffn_input")
        elseif moe and ep == 1 then
          add("tp_all_gather", "forward", shard, "MoE input sequence", nil, "ffn_input")
          add("tp_reduce_scatter", "forward", shard, "routed experts' output to sequence shards", nil, "ffn_output")
          if shared then
            add("tp_reduce_scatter", "forward", shard, "shared experts' w2 output to sequence shards", nil,
              "ffn_output")
            add("tp_all_gather", "backward", shard, "shared experts' w2 output gradient", nil, "ffn_output")
          end
          add("tp_all_gather", "backward", shard, "routed experts' output gradient", nil, "ffn_output")
          add("tp_reduce_scatter", "backward", shard, "MoE input gradient", nil, "ffn_input")
        end
        add("tp_all_gather", "backward", shard, "wo output gradient", nil, "attention_output")
        add("tp_reduce_scatter", "backward", shard, "attention input gradient", nil, "attention_input")
      else
        local what = dense and "w2 output" or "MoE output"
        add("tp_all_reduce", "forward", full, "wo output partial sums", nil, "attention_output")
        if ffn then
          add("tp_all_reduce", "forward", full, what .. " partial sums", nil, "ffn_output")
          add("tp_all_reduce", "backward", full, (dense and "feed-forward" or "MoE") .. " input gradient", nil,
            "ffn_input")
        end
        add("tp_all_reduce", "backward", full, "attention input gradient", nil, "attention_input")
      end
    end
    if mtp and sp then
      add("tp_all_gather", "forward", shard, "mtp_norm output sequence")
    end
    if has(u, "lm_head.weight") then
      if sp then
        add("tp_all_gather", "forward", shard, "output input sequence", nil, "output")
        add("tp_reduce_scatter", "backward", shard, "output input gradient", nil, "output")
      else
        add("tp_all_reduce", "backward", full, "output input gradient", nil, "output")
      end
      for _, l in ipairs({ { "max", "loss_parallel: per-token max logit" },
                           { "sum", "loss_parallel: per-token sum of exponentials" },
                           { "sum", "loss_parallel: per-token target logit" } }) do
        add("tp_all_reduce", "forward", b * seq, l[2], nil, "loss")
        acts[#acts].reduce_op, acts[#acts].dtype, acts[#acts].loss = l[1], "fp32", true
      end
    end
    if not u.expert then
      for _, q in ipairs(u.params) do
        if q.tp_dim == nil and (sp or not is_norm(q)) and not q.frozen then
          add("tp_all_reduce", "backward", q.numel, q.name .. " gradient (Partial over TP)")
          acts[#acts].reducing_only = true
          acts[#acts].dtype = u.reduce_dtype
        end
      end
    end
    finish(u, acts, T)
  end
end

return tp_acts
