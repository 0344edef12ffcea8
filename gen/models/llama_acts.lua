-- Activation bytes of a Llama 3 block and of every decoder's output unit
-- (the final norm, lm_head and the loss) as torchtitan 0.3 keeps them, per
-- rank and micro-step, before tensor parallelism divides them (the caller
-- does). T tokens, e bytes per element of the compute dtype, fp32 4 bytes.
-- Measured against torch by tests/titan/test_llama_acts.py, to the byte.
--
-- Block (models/llama3/model.py Llama3TransformerBlock, common/attention.py
-- GQAttention with FlexAttention, common/feed_forward.py), d = dim, Q =
-- n_heads x head_dim, kv = n_kv_heads x head_dim, f = FFN hidden, h heads:
--   "none": what autograd saves, each storage once: each RMSNorm's input
--     and fp32 rstd (CUDA's fused kernel: its FusedRmsNormBackward0 saves
--     input, weight, rstd) and output (the next matmuls' input); flex's q
--     and k after RoPE, v, its output (in q's layout, so wo's input is the
--     same storage) and fp32 logsumexp per head (compiled flex's backward
--     reads no max_scores); w1's, silu's, w3's outputs and their product:
--       e*T*(4d + 2Q + 2kv + 4f) + 4*T*(h + 2)
--     (model.fused "swiglu": the einsum's [T, f, 2] output and the
--     product, 3f for 4f; "selective": 2f for f, below at acts.block)
--   "selective": torchtitan's SelectiveAC (distributed/activation_
--     checkpoint.py, _wrap_block's policy: MUST_SAVE for the ops in
--     _get_default_save_ops, every second aten.mm recomputed) keeps the
--     block's input and the outputs of its saved ops: the 1st, 3rd, 5th ...
--     mm (unfused wq, wv, w1, w2; fused wqkv, w1, w2) and flex attention's
--     compiled region (inductor_compiled_code, in the save list), whose
--     outputs are the forward graph's: out and logsumexp, and the q, k, v it
--     saves for backward (the test shows the graph's outputs):
--       unfused  e*T*(2d + 3Q + 2kv + f) + 4*T*h
--       fused    e*T*(2d + 3Q + 4kv + f) + 4*T*h (the whole q+2kv
--                projection, then the rotated q, k and v's copy)
--     Backward recomputes the rest of the block: transient "none" - saved.
--   "full": the block's input e*T*d; transient: all of "none".
-- commplan's llama plans declare torchtitan's unfused layout (wq, wk, wv),
-- so they use the unfused bytes; torchtitan's registry flavors fuse qkv,
-- which keeps 2*e*T*kv more per block under "selective".
-- Context parallel (cp > 1, gen/parallel/cp.lua; derived from the terms
-- above, not measured): T is the rank's tokens (seq_len / cp of each
-- sequence) and flex attention's k and v are the all-gathered ones, cp x
-- T tokens each, so "none" keeps 2*e*T*kv*(cp - 1) more; "selective" keeps
-- them too and wv's own output, which is no longer flex's v (unfused: the
-- 3rd mm's output is saved): e*T*kv*(2cp - 1) more (fused: the projection
-- stays, the rotated k and v's copy become the gathered ones:
-- 2*e*T*kv*(cp - 1) more); "full" keeps the block's input only.
local acts = {}

local F32 = 4

-- One block: { saved, transient } for ac ("none" | "selective" | "full").
-- cfg: dim, n_heads, n_kv_heads, head_dim, hidden; cp: the context-parallel
-- degree (default 1).
function acts.block(cfg, e, T, ac, fused, cp)
  local d, h, f = cfg.dim, cfg.n_heads, cfg.hidden
  local Q, kv = h * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  cp = cp or 1
  -- model.fused "swiglu" (cfg.fused.swiglu; gen/models/moe_acts.lua's dense_ffn):
  -- the einsum's [T, f, 2] output and silu_and_mul's product, 3f, not 4f; under
  -- SAC the einsum (aten.bmm) is kept whole, 2f where w1's output was f, and w2
  -- stays the saved mm (it is still an odd one): one f more. Measured by
  -- tests/titan/test_llama_acts.py.
  local sw = cfg.fused ~= nil and cfg.fused.swiglu == true
  local gathered = 2 * e * T * kv * (cp - 1) -- flex's k and v: cp x T tokens each
  local none = e * T * (4 * d + 2 * Q + 2 * kv + (sw and 3 or 4) * f) + F32 * T * (h + 2) + gathered
  if ac == "full" then return { saved = e * T * d, transient = none } end
  if ac == "selective" then
    local saved = e * T * (2 * d + 3 * Q + (fused and 4 or 2) * kv + (sw and 2 or 1) * f) + F32 * T * h + gathered
      + ((cp > 1 and not fused) and e * T * kv or 0)
    return { saved = saved, transient = none - saved }
  end
  return { saved = none, transient = 0 }
end

-- The output unit: the final norm, lm_head and the loss (never
-- checkpointed), { saved, transient }: saved lives through the decoders'
-- backward; transient is the most the loss adds at its peak, while every
-- block's saved bytes are still held. B sequences of T / B tokens; V the
-- vocabulary (local under TP's loss parallel); chunks: 1 = torchtitan's
-- CrossEntropyLoss, N >= 2 = ChunkedLossWrapper(num_chunks = N)
-- (components/loss.py). Both keep the norm's input and fp32 rstd.
--   CrossEntropyLoss: lm_head keeps its input (the norm's output), the
--     loss (cross_entropy on the fp32 cast) log_softmax's fp32 output: saved
--     e*T*d*2 + 4*T + 4*T*V; at the peak, the fp32 gradients nll_loss and
--     log_softmax give in backward (8*T*V; the forward's bf16 logits and
--     fp32 cast, (e + 4)*T*V, are less for e <= 4).
--   ChunkedLossWrapper: the decoder stops at the norm (_skip_lm_head); the
--     loss runs lm_head, the loss and its backward chunk by chunk inside the
--     forward, and keeps only the gradient it assembled (in bf16,
--     _DecoderOutputGradientBackProp saves it): saved e*T*d*2 + 4*T. At its
--     peak, in a chunk's backward: the fp32 GradAccumulator (4*T*d), the
--     chunks' .contiguous() copies when B > 1 (a split along the sequence
--     of B > 1 rows is not contiguous: e*T*d and the labels' 8*T), and the
--     chunk's bf16 logits (the loop's variable), log_softmax's fp32 output
--     and the two fp32 gradients: (e + 12)*T/N*V; the norm's output (e*T*d)
--     is held too, where the assembled gradient is not yet (the same
--     bytes).
-- Under TP (loss parallel) the caller passes the local vocabulary and all
-- T tokens: torchtitan replicates the norm's output on the TP axis before
-- lm_head (and before the chunks); the norm's own input and rstd, which
-- sequence parallel would shard, are counted whole too.
function acts.head(T, e, d, V, chunks, B)
  local norm = e * T * d + F32 * T
  if chunks <= 1 then
    return { saved = norm + e * T * d + F32 * T * V, transient = math.max(8, e + 4) * T * V }
  end
  local copies = B > 1 and (e * T * d + 8 * T) or 0
  return { saved = norm + e * T * d, transient = F32 * T * d + copies + (e + 12) * (T // chunks) * V }
end

return acts
