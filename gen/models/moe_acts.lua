-- Activation bytes of the MoE families' transformer blocks (mixtral,
-- qwen3_moe, deepseek_v3): what one block's forward keeps for its backward
-- on one rank, per micro-step, under each activation-checkpointing mode,
-- derived from torchtitan 0.3's modules (the torch env's torchtitan, torch
-- 2.15) at the level of gen/compute.lua's Llama model. T tokens per rank,
-- e bytes per element of the compute dtype (the blocks' param_dtype: FSDP's
-- mixed precision casts the block inputs to it); fp32 4 bytes, int64 8.
--
-- "none": the tensors autograd saves, each storage once (a view keeps its
-- whole base):
--   norms (nn.RMSNorm, the fused kernel): input and the fp32 rstd per
--     token; a norm's output is counted where the op after it saves it
--   GQA attention (models/common/attention.py GQAttention.forward, l. 978-
--     1010; FlexAttention.forward, l. 331-383): attention_norm's output
--     (the q, k, v projections' input); v and the rotated q and k (the
--     rope makes new tensors; flex keeps them); the attention output (wo's
--     input: .contiguous() of flex's own, l. 1003, the same storage) and
--     its fp32 logsumexp per head. Fused wqkv (FusedQKVLinear._split,
--     l. 840-853) copies q, k and v out of the projection
--     (reshape(...).contiguous()), so the projection itself is not kept:
--     fused and unfused keep the same bytes. Qwen3's q/k norms keep their
--     inputs (the fused split's copies, else wq's and wk's outputs) and an
--     fp32 rstd per head:
--       e*T*(2d + 2Q + 2KV [+ Q + KV]) + 4*T*(1 + h [+ h + kvh])
--   MLA (models/deepseek_v3/model.py Attention.forward, l. 93-147): wq_a's
--     output and q_norm's (q_lora_rank > 0; with 0, wq's output is not
--     kept: the rope and the cat keep no input), q (the cat, l. 126: new),
--     wkv_a's whole output (kv_norm keeps the kv_lora_rank view of it),
--     kv_norm's output, k (the cat of k_nope and the shared rotated k_pe,
--     l. 135), wkv_b's whole output (flex keeps v, a view of it, l. 132),
--     the attention output, an rstd per norm, lse per head
--   dense FeedForward (common/feed_forward.py): ffn_norm's output, w1's,
--     silu's, w3's, their product (w2's input): 4 x hidden
--   MoE (common/moe.py, common/token_dispatcher.py), measured against
--   torch by tests/titan/test_moe_acts.py:
--     router: the gate runs under autocast(float32), so its matmul keeps an
--       fp32 copy of its input (4 x dim per token) and of the gate weight
--       (4 x E x dim per block); softmax/sigmoid keep their fp32 scores
--       (4 x E); topk keeps its int64 ids (8 x top_k); route_norm's divide
--       keeps the gathered scores and their sum (4 x (top_k + 1));
--       node-limited routing (DeepSeek-V3 236B, 671B) keeps the groups'
--       top-2 ids (16 x groups), the chosen groups' ids (8 x limited) and
--       the bool mask (groups)
--     dispatch: argsort's ids and the token ids (8 + 8 per routed row, N =
--       T x top_k), the sorted scores (4 per row, combine's multiply keeps
--       them); the experts' input rows (e x dim), the grouped matmuls'
--       h1, silu(h1), h3 and their product (4 x e x moe_hidden_dim), the
--       int32 offsets per local expert; with ep > 1 the permute's int64
--       indices (8 per received row)
--     combine: the expert outputs cast to fp32 (4 x dim per row), kept by
--       the multiply with the scores
--     shared experts: a FeedForward on every token (hidden moe_hidden_dim x
--       num_shared_experts), which also keeps ffn_norm's output
--   Not counted: the all-to-alls' send and receive buffers (gen/memplan.lua
--   plans them as the a2a token buffers: the dispatch's x[ids] and the
--   combine's return are their contents, autograd keeps neither), constant
--   buffers (rope tables), the tiny count tensors.
-- Rows with ep > 1: a rank's experts receive the tokens its ep group sends
-- them; under uniform routing T x top_k rows on average, bounded by the
-- capacity policy (gen/parallel/ep.lua): min(T x top_k, ep x capacity);
-- the rows it sends and gets back likewise.
--
-- "selective": torchtitan's SelectiveAC (distributed/activation_checkpoint.py)
-- keeps the block's input and the outputs of the ops its policy saves
-- (_get_default_save_ops, l. 31-94; the policy, l. 243-275): topk's (fp32
-- values and int64 ids: the router's, and node-limited routing's two),
-- every other aten.mm of the block (the 1st, 3rd, ...; the router gate's
-- shape (dim, E) is force-recomputed and not counted: force_recompute_mm_
-- shapes_by_fqns = ["moe.router.gate"], any mm of that shape), and flex
-- attention's compiled region (inductor_compiled_code, l. 55), whose
-- outputs are the AOT forward graph's: the attention output and its
-- logsumexp and the q, k, v it saves for backward (tests/titan/
-- test_llama_acts.py and test_moe_acts.py show the graph's outputs): GQA's
-- rotated q and k, and v (fused: the split's copy; unfused: wv's output,
-- already kept when wv's mm is a saved one); MLA's q and k (the cats) and
-- v's storage, wkv_b's whole output (kept once: with q_lora_rank 0 wkv_b
-- is the 3rd mm, saved anyway; with wq_a, wq_b it is the 4th).
-- torch._grouped_mm is not in its save list
-- (torch._functorch.partitioners' compute_intensive_ops), so the routed
-- experts are recomputed; under torchtitan's default spmd_types backend the
-- token all-to-alls are c10d.alltoall_ (not _c10d_functional.all_to_all_
-- single, which it would save), recomputed too. Its backward then holds
-- the block's other activations again (transient: "none" less saved).
-- gpt-oss (measured by tests/titan/test_moe_acts.py, torchtitan's own
-- block with flex and with varlen): its linears all have biases, so each
-- is an aten.addmm, which SelectiveAC always saves (torch's
-- compute_intensive_ops) and never counts among its mm / linear ops
-- (distributed/activation_checkpoint.py:241, 262-272): wqkv's, wo's and the
-- router gate's (fp32 under its autocast) outputs all kept, the gate's
-- forced recompute not applying; the experts' two bias expansions
-- (moe.py:168-185, repeat_interleave with output_size) keep an int64
-- index per routed row each. varlen (its registry's default backend,
-- torch.nn.attention.varlen's _varlen_attn) saves q, k, v, out, lse as
-- flex does and its rng_state (uint64 x 2, 16 bytes); SelectiveAC saves
-- the op's outputs alone (out, lse, rng_state: the op is in its save list,
-- activation_checkpoint.py:56), so q, k and v are recomputed.
-- "full": the block's input (e x dim per token); backward recomputes all
-- of "none" (transient).
local acts = {}

local F32, I64, I32 = 4, 8, 4
-- varlen attention's rng_state (torch.nn.attention.varlen: uint64 x 2, saved for its backward)
local RNG = 16

-- A part of a block: none (bytes autograd saves), mms (its matmuls in
-- forward order: { fan_in, fan_out }), sac (bytes of the other ops
-- SelectiveAC saves), routed (bytes on the routed experts' rows), v (the
-- attention's: the bytes of v's storage flex's compiled region keeps, and
-- mm, the index in mms of the matmul whose output that storage is, if any:
-- kept once when SelectiveAC saves that matmul's output).
local function part(none, mms, sac, routed, v)
  return { none = none, mms = mms, sac = sac or 0, routed = routed or 0, v = v }
end

-- Grouped-query attention with its attention_norm (mixtral, qwen3_moe).
function acts.gqa_attention(cfg, e, T)
  local d, h, kvh = cfg.dim, cfg.n_heads, cfg.n_kv_heads
  local Q, KV = h * cfg.head_dim, kvh * cfg.head_dim
  local mms, v_mm
  if cfg.fuse_qkv then
    mms = { { d, Q + 2 * KV }, { Q, d } }
  else
    mms, v_mm = { { d, Q }, { d, KV }, { d, KV }, { Q, d } }, 3
  end
  -- gpt-oss's projections have biases: aten.addmm, always saved by SelectiveAC (see above)
  for _, m in ipairs(mms) do m.addmm = cfg.gpt_oss or nil end
  -- attention_norm's input and output, q, k, v, the output (+ the q/k
  -- norms' inputs); rstd per token (+ per q, k head), lse per head
  local norms = cfg.qk_norm and Q + KV or 0
  local rstd = 1 + h + (cfg.qk_norm and h + kvh or 0)
  local none = e * T * (2 * d + 2 * Q + 2 * KV + norms) + F32 * T * rstd
  if cfg.gpt_oss then
    -- gpt-oss's sinks (model.py:34-40, run on flex's output and lse): sigmoid keeps its fp32 output per
    -- head, the multiply its cast (e per head) and flex's output, and wo's input is the product, a new
    -- storage (the reshape's .contiguous() of it): Q more per token. SelectiveAC recomputes these (they
    -- run outside flex's compiled region), so its terms below stay GQA's.
    none = none + e * T * (Q + h) + F32 * T * h
  end
  if cfg.attn_backend == "varlen" then
    -- varlen's rng_state; under SAC its outputs alone (out, lse, rng_state): q, k, v recomputed
    return part(none + RNG, mms, e * T * Q + F32 * T * h + RNG, 0, { bytes = 0 })
  end
  -- SAC: the compiled region's output, lse, q and k (v below)
  return part(none, mms, e * T * (2 * Q + KV) + F32 * T * h, 0, { bytes = e * T * KV, mm = v_mm })
end

-- Multi-head latent attention with its attention_norm (deepseek_v3).
function acts.mla_attention(cfg, e, T)
  local d, H, ql, kvl = cfg.dim, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank
  local rope, nope, v = cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
  local qk = nope + rope
  local mms = {}
  if ql > 0 then
    mms[1], mms[2] = { d, ql }, { ql, H * qk }
  else
    mms[1] = { d, H * qk }
  end
  table.insert(mms, { d, kvl + rope })
  table.insert(mms, { kvl, H * (nope + v) })
  local wkv_b = #mms
  table.insert(mms, { H * v, d })
  local width = 2 * d + (ql > 0 and 2 * ql or 0) + 2 * H * qk + (kvl + rope) + kvl + H * (nope + v) + H * v
  local rstd = 1 + (ql > 0 and 1 or 0) + 1 + H
  -- SAC: the compiled region's output, lse, q and k; v's storage is wkv_b's
  return part(e * T * width + F32 * T * rstd, mms, e * T * (H * v + 2 * H * qk) + F32 * T * H, 0,
    { bytes = e * T * H * (nope + v), mm = wkv_b })
end

-- A dense FeedForward of hidden f with its ffn_norm (DeepSeek-V3's first
-- n_dense_layers blocks).
-- model.fused "swiglu" (torchtitan's FusedSwiGLU, overrides/fused_swiglu.py:
-- 455-457): the gate and up come from one einsum over w13 (aten.bmm, one
-- [T, f, 2] output whose two halves silu_and_mul saves for backward,
-- :352-357, and which SelectiveAC's save list keeps whole: bmm is not one of
-- its alternating aten.mm), then w2 on silu_and_mul's output: the einsum's
-- 2f and the product's f are kept, not w1's, silu's, w3's and the product's
-- 4f; under SAC w2 is the only mm. Measured by tests/titan/test_llama_acts.py.
local function swiglu_of(cfg) return cfg.fused ~= nil and cfg.fused.swiglu == true end
function acts.dense_ffn(cfg, e, T, f)
  local d = cfg.dim
  if swiglu_of(cfg) then return part(e * T * (2 * d + 3 * f) + F32 * T, { { f, d } }, 2 * e * T * f) end
  return part(e * T * (2 * d + 4 * f) + F32 * T, { { d, f }, { d, f }, { f, d } })
end

-- The MoE with its ffn_norm. rows: the routed rows this rank's experts
-- receive (and it gets back); ep: the ep degree.
function acts.moe(cfg, e, T, rows, ep)
  local d, E, K, F = cfg.dim, cfg.num_experts, cfg.top_k, cfg.moe_hidden_dim
  local r = cfg.router or {}
  local N = T * K
  local G, lg = r.groups or 0, r.limited or 0
  local router = T * (F32 * d + F32 * E + I64 * K) + F32 * E * d
    + (r.route_norm and F32 * T * (K + 1) or 0) + T * (2 * I64 * G + I64 * lg + G)
  local dispatch = N * (I64 + I64 + F32)
  local combine = rows * F32 * d
  local Fs = (cfg.num_shared_experts or 0) * F
  local block = e * T * d + F32 * T + router + dispatch + combine
  -- (gpt-oss's gate has a bias: an fp32 aten.addmm, which SelectiveAC saves)
  local mms = { { d, E, addmm = cfg.gpt_oss or nil, bytes = cfg.gpt_oss and F32 or nil } }
  local shared_sac = 0
  if Fs > 0 and swiglu_of(cfg) then
    -- (the shared experts' FeedForward fused too: acts.dense_ffn's terms)
    block = block + e * T * (d + 3 * Fs)
    mms[2], shared_sac = { Fs, d }, 2 * e * T * Fs
  elseif Fs > 0 then
    block = block + e * T * (d + 4 * Fs)
    mms[2], mms[3], mms[4] = { d, Fs }, { d, Fs }, { Fs, d }
  end
  -- per routed row: the grouped matmuls' input and, of the SwiGLU, h1, silu(h1), h3, their product (4F);
  -- gpt-oss's clamped SwiGLU (moe.py:67-74, 161-188) keeps mlp1's biased 2F output (both clamps' input,
  -- one storage), sigmoid's output, the two clamped halves, the gated half and the product: 7F
  -- (and its two bias expansions' int64 indices per row, moe.py:168-185)
  local routed = rows * (e * d + (cfg.gpt_oss and 7 * e * F + 2 * I64 or 4 * e * F) + (ep > 1 and I64 or 0))
    + I32 * (E // ep)
  local sac = T * (F32 + I64) * (K + 2 * G + lg) + shared_sac
  return part(block, mms, sac, routed)
end

-- The bytes of the matmul outputs SelectiveAC saves: every other aten.mm
-- (odd counts), those of the forced shapes neither saved nor counted; an
-- addmm (a biased linear, m.addmm) always saved and never counted, m.bytes
-- per element (else e); and the set of the saved ones' indices in mms.
function acts.sac_matmuls(mms, e, T, forced)
  local n, bytes, kept = 0, 0, {}
  for i, m in ipairs(mms) do
    if m.addmm then
      bytes, kept[i] = bytes + (m.bytes or e) * T * m[2], true
    elseif not (forced and m[1] == forced[1] and m[2] == forced[2]) then
      n = n + 1
      if n % 2 == 1 then bytes, kept[i] = bytes + e * T * m[2], true end
    end
  end
  return bytes, kept
end

-- Block i (0-based) of cfg's family: { saved = bytes its dense unit keeps,
-- routed = bytes the routed experts' rows keep (its experts unit's with
-- ep > 1), transient = one block's recompute in backward }. ac: "none",
-- "selective" or "full"; rows, ep as acts.moe.
function acts.block(cfg, i, e, T, rows, ep, ac)
  local attn = cfg.kv_lora_rank and acts.mla_attention(cfg, e, T) or acts.gqa_attention(cfg, e, T)
  local dense = i < (cfg.n_dense_layers or 0)
  local ffn = dense and acts.dense_ffn(cfg, e, T, cfg.dense_hidden_dim) or acts.moe(cfg, e, T, rows, ep)
  local none = attn.none + ffn.none + ffn.routed
  if ac == "none" then return { saved = none - ffn.routed, routed = ffn.routed, transient = 0 } end
  local input = e * T * cfg.dim
  if ac == "full" then return { saved = input, routed = 0, transient = none } end
  local mms = {}
  for _, m in ipairs(attn.mms) do mms[#mms + 1] = m end
  for _, m in ipairs(ffn.mms) do mms[#mms + 1] = m end
  local forced = not dense and { cfg.dim, cfg.num_experts } or nil
  -- (the attention's matmuls come first: its v.mm indexes mms too)
  local mm_bytes, kept = acts.sac_matmuls(mms, e, T, forced)
  local v = (attn.v.mm and kept[attn.v.mm]) and 0 or attn.v.bytes
  local saved = input + mm_bytes + attn.sac + v + ffn.sac
  return { saved = saved, routed = 0, transient = none - saved }
end

return acts
