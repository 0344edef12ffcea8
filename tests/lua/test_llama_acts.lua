-- The Llama block's and the output unit's activations (gen/models/
-- llama_acts.lua, gen/compute.lua): hand-computed bytes per mode, the
-- loss's chunks, a plan's units and the loss_chunks setting's refusal.
-- tests/titan/test_llama_acts.py checks the same formulas against torch.
local H = require("helpers")
local plan = require("gen.plan")
local compute = require("gen.compute")
local acts = require("gen.models.llama_acts")

local T = {}

-- dim 8, 2 heads of 4 (1 kv head: kv = 4), FFN hidden 12; bf16, 3 tokens.
local CFG = { dim = 8, n_heads = 2, n_kv_heads = 1, head_dim = 4, hidden = 12 }

function T.block_by_hand()
  -- none: 2*3*(4*8 norms in/out, h, ffn_norm out + 2*8 q, output + 2*4 k, v
  -- + 4*12 w1, silu, w3, product) + 4*3*(2 heads' lse + 2 rstd)
  local none = acts.block(CFG, 2, 3, "none")
  H.eq(none.saved, 6 * (32 + 16 + 8 + 48) + 12 * 4, "none")
  H.eq(none.transient, 0, "none recomputes nothing")
  -- selective, unfused: input 8 + wq 8 + wv 4 + rotated q 8, k 4 + output 8
  -- + w1 12 + w2 8 = 60 per token, + 4*2 lse
  local sel = acts.block(CFG, 2, 3, "selective", false)
  H.eq(sel.saved, 6 * 60 + 12 * 2, "selective, unfused")
  H.eq(sel.transient, none.saved - sel.saved, "selective recomputes the rest")
  -- fused: wqkv's whole projection 8 + 2*4 instead of wq and wv, and v's copy
  H.eq(acts.block(CFG, 2, 3, "selective", true).saved, 6 * 68 + 12 * 2, "selective, fused")
  local full = acts.block(CFG, 2, 3, "full")
  H.eq(full.saved, 2 * 3 * 8, "full keeps the block's input")
  H.eq(full.transient, none.saved, "full recomputes the whole block")
end

-- model.fused "swiglu" (torchtitan's FusedSwiGLU): the einsum's [T, f, 2]
-- output and the product, 3f where the stock keeps 4f; under SAC the
-- einsum (aten.bmm) whole, 2f where w1's output was f (w2 stays saved).
-- The figures tests/titan/test_llama_acts.py measured on torchtitan's own
-- block (dim 64, 4 heads of 16, 2 kv heads, hidden 96, 256 bf16 tokens).
function T.fused_swiglu_block()
  local sw = { dim = 8, n_heads = 2, n_kv_heads = 1, head_dim = 4, hidden = 12, fused = { swiglu = true } }
  H.eq(acts.block(sw, 2, 3, "none").saved, acts.block(CFG, 2, 3, "none").saved - 2 * 3 * 12, "none: 3f")
  H.eq(acts.block(sw, 2, 3, "selective", false).saved, acts.block(CFG, 2, 3, "selective", false).saved + 2 * 3 * 12,
    "selective: w13's 2f")
  H.eq(acts.block(sw, 2, 3, "full").saved, 2 * 3 * 8, "full: the block's input")
  local big = { dim = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, hidden = 96 }
  local bigsw = { dim = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, hidden = 96, fused = { swiglu = true } }
  H.eq(acts.block(big, 2, 256, "none").saved, 432128, "stock, none (torch)")
  H.eq(acts.block(bigsw, 2, 256, "none").saved, 382976, "fused SwiGLU, none (torch)")
  H.eq(acts.block(bigsw, 2, 256, "selective", false).saved, 299008, "fused SwiGLU, selective (torch)")
  H.eq(acts.block(bigsw, 2, 256, "selective", true).saved, 331776, "fused SwiGLU and qkv, selective (torch)")
end

function T.head_by_hand()
  -- 4 tokens, bf16, dim 8, vocabulary 10
  -- CrossEntropyLoss: norm input 64 + rstd 16 + lm_head's input 64 + fp32
  -- log_softmax 160; at the peak nll_loss's and log_softmax's fp32 gradients
  local ce = acts.head(4, 2, 8, 10, 1, 2)
  H.eq(ce.saved, 64 + 16 + 64 + 160, "whole logits: saved")
  H.eq(ce.transient, 8 * 4 * 10, "whole logits: the loss's backward")
  -- 2 chunks of 2 tokens, 2 sequences: saved norm input, rstd and the bf16
  -- assembled gradient; peak: fp32 accumulator 4*4*8 = 128, the chunks'
  -- copies 64 and the labels' 8*4 = 32, one chunk's (2 + 12)*2*10 = 280
  local ch = acts.head(4, 2, 8, 10, 2, 2)
  H.eq(ch.saved, 64 + 16 + 64, "chunked: saved")
  H.eq(ch.transient, 128 + 64 + 32 + 280, "chunked: peak, B = 2")
  -- one sequence: the chunks are views (contiguous already), no copies
  H.eq(acts.head(4, 2, 8, 10, 2, 1).transient, 128 + 280, "chunked: peak, B = 1")
end

local function variant(edit)
  return "local p = (function() " .. H.read("plans/llama_tiny.lua") .. "\nend)()\n" .. edit .. "\nreturn p"
end

local function head_of(p)
  local s = compute.settings(p)
  local per = compute.units(p, s)
  for _, u in ipairs(p.layout.units) do
    if u.name == "norm_output" then return per[u.index], s end
  end
end

-- llama_tiny (bf16 compute, dim 64, vocab 250, seq 128, local batch 1): the head unit
-- follows training.loss_chunks, 8 by default as torchtitan's configs.
function T.plan_head_follows_loss_chunks()
  -- (plans/llama_tiny.lua itself says loss_chunks = 1: the default is what it leaves out)
  local r, s = head_of(plan.from_source(variant("p.training = nil"), "plans/llama_tiny.lua"))
  H.eq(s.loss_chunks, 8, "default: torchtitan's ChunkedLossWrapper num_chunks")
  local want = acts.head(128, 2, 64, 250, 8, 1)
  H.eq(r.saved, want.saved, "chunked saved")
  H.eq(r.transient, 4 * 128 * 64 + 14 * 16 * 250, "chunked peak: fp32 accumulator, one chunk of 16 tokens")
  r = head_of(plan.from_source(variant("p.training = { loss_chunks = 1 }"), "plans/llama_tiny.lua"))
  H.eq(r.saved, 2 * 128 * (64 + 64) + 4 * 128 + 4 * 128 * 250, "whole logits saved")
  H.plan_fails(variant("p.training = { loss_chunks = 3 }"), "training.loss_chunks", "loss_chunks=3 does not divide "
    .. "seq_len=128")
end

return T
