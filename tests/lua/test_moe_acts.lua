-- The MoE families' activations (gen/models/moe_acts.lua, gen/compute.lua):
-- a small model's bytes per block against hand-computed numbers, the
-- checkpointing modes' order, the routed rows' share with ep > 1 and its
-- capacity bound, and the shipped MoE plans' verdicts.
-- tests/titan/test_moe_acts.py checks the MoE module's and whole blocks' bytes
-- (GQA and MLA attention included) against torch.
local H = require("helpers")
local plan = require("gen.plan")
local audit = require("gen.audit")
local compute = require("gen.compute")
local acts = require("gen.models.moe_acts")

local T = {}

-- A mixtral-like block: dim 12, 3 heads of 4 (1 kv head), fused wqkv, 4
-- experts of hidden 10, top 2; bf16 (e = 2), 8 tokens, ep 1 (16 rows).
local MIX = { dim = 12, n_heads = 3, n_kv_heads = 1, head_dim = 4, fuse_qkv = true, moe_hidden_dim = 10,
              num_experts = 4, top_k = 2, router = { route_norm = true } }

function T.gqa_block_by_hand()
  -- attention: e*T*(2d norm in/out + (Q+KV) rotated q, k + KV v + Q
  -- output) + 4*T*(1 rstd + h lse) = 16*(24 + 16 + 4 + 12) + 32*4; the
  -- fused wqkv's split copies q, k, v out (its projection is not kept)
  H.eq(acts.gqa_attention(MIX, 2, 8).none, 1024, "GQA attention, none")
  local m = acts.moe(MIX, 2, 8, 16, 1)
  -- the block's side: ffn_norm input 2*8*12 = 192 + rstd 32; router 8*(4*12
  -- fp32 gate input + 4*4 scores + 8*2 topk ids) = 640 + fp32 gate weight
  -- 4*4*12 = 192 + route_norm 4*8*(2+1) = 96; dispatch 16 rows * (8 + 8 + 4)
  -- = 320; combine 16 rows * 4*12 = 768
  H.eq(m.none, 192 + 32 + 640 + 192 + 96 + 320 + 768, "MoE block side, none")
  -- the experts' rows: 16 * (2*12 input + 4*2*10 h1, silu, h3, product) +
  -- 4 int32 offsets
  H.eq(m.routed, 16 * (24 + 80) + 16, "routed rows, none")
  local none = acts.block(MIX, 0, 2, 8, 16, 1, "none")
  H.eq(none.saved + none.routed, 1024 + 2240 + 1680, "block, none")
  H.eq(none.transient, 0, "no recompute without checkpointing")
  -- selective: input 192 + wqkv (1st matmul) 2*8*20 = 320 (wo, 2nd, and
  -- the gate's forced shape are recomputed) + flex's compiled region:
  -- output 2*8*12 and lse 4*8*3 = 288, q 2*8*12, k and v (the split's
  -- copies) 2*8*4 each = 320 + topk's values and ids 8*2*(4 + 8) = 192
  local sel = acts.block(MIX, 0, 2, 8, 16, 1, "selective")
  H.eq(sel.saved, 192 + 320 + 288 + 320 + 192, "block, selective")
  H.eq(sel.routed, 0, "selective recomputes the grouped matmuls")
  H.eq(sel.transient, 4944 - 1312, "selective: one block's recompute")
  local full = acts.block(MIX, 0, 2, 8, 16, 1, "full")
  H.eq(full.saved, 192, "full keeps the block's input")
  H.eq(full.transient, 4944, "full recomputes the whole block")
  -- unfused wq/wk/wv with Qwen3's q/k norms: v + rotated q, k (Q+2KV = 20)
  -- + the norms' inputs (Q+KV = 16) + output 12; rstd 1 + lse 3 + q/k 3+1
  local q = {}
  for k, v in pairs(MIX) do q[k] = v end
  q.fuse_qkv, q.qk_norm = false, true
  H.eq(acts.gqa_attention(q, 2, 8).none, 16 * (24 + 20 + 16 + 12) + 32 * 8, "unfused GQA with q/k norms")
  -- fused, the norms' inputs are the split's copies: the same bytes
  q.fuse_qkv = true
  H.eq(acts.gqa_attention(q, 2, 8).none, 16 * (24 + 20 + 16 + 12) + 32 * 8, "fused GQA with q/k norms")
  -- unfused, selective: wk's and wv's shape (12, 4) is the gate's (dim,
  -- E), force-recomputed too: wq is the 1st mm (2*8*12 saved), wo the
  -- 2nd; flex keeps v (wv's output, not saved by its mm) with out, lse,
  -- q and k: 192 + 192 + (288 + 192 + 64 + 64) + 192
  q.fuse_qkv = false
  H.eq(acts.block(q, 0, 2, 8, 16, 1, "selective").saved, 192 + 192 + 608 + 192, "unfused, wk and wv forced")
  -- 5 experts: wq (1st) and wv (3rd) saved, v is wv's output (kept once)
  q.num_experts = 5
  H.eq(acts.block(q, 0, 2, 8, 16, 1, "selective").saved, 192 + (192 + 64) + 544 + 192, "unfused, v kept once")
end

-- tests/plans/moe_dsv3_tiny.lua's DeepSeek-V3-like dims: MLA with a low-rank
-- q, one dense block, MoE blocks of 2 experts (top 1) and one shared expert;
-- bf16, 8 tokens.
local DS = { dim = 16, n_dense_layers = 1, n_heads = 2, q_lora_rank = 6, kv_lora_rank = 8, qk_nope_head_dim = 4,
             qk_rope_head_dim = 2, v_head_dim = 4, dense_hidden_dim = 24, moe_hidden_dim = 8, num_experts = 2,
             num_shared_experts = 1, top_k = 1, router = {} }

function T.mla_blocks_by_hand()
  -- MLA: e*T*(2d + 2*q_lora (wq_a's, q_norm's) + H*qk q + (kv_lora + rope)
  -- wkv_a + kv_lora kv_norm's + H*qk k + H*(nope+v) wkv_b + H*v output)
  -- = 16*(32 + 12 + 12 + 10 + 8 + 12 + 16 + 8) + 4*8*(3 norms + 2 heads)
  H.eq(acts.mla_attention(DS, 2, 8).none, 16 * 110 + 32 * 5, "MLA, none")
  -- dense block: + ffn_norm in/out 2*16 and 4 x hidden 24, rstd
  local dense = acts.block(DS, 0, 2, 8, 8, 1, "none")
  H.eq(dense.saved, 1920 + 16 * (32 + 96) + 32, "dense block, none")
  -- selective, the dense block: input 256; matmuls wq_a (1st: 2*8*6), wq_b,
  -- wkv_a (3rd: 2*8*10), wkv_b, wo (5th: 2*8*16), w1, w3 (7th: 2*8*24),
  -- w2; flex's compiled region: output 2*8*8 + lse 4*8*2 = 192, q and k
  -- 2*8*12 each = 384, v's storage, wkv_b's output (its mm is the 4th, not
  -- saved) 2*8*16 = 256
  local sel = acts.block(DS, 0, 2, 8, 8, 1, "selective")
  H.eq(sel.saved, 256 + (96 + 160 + 256 + 384) + 192 + 384 + 256, "dense block, selective")
  -- MoE block: ffn_norm input 256 + rstd 32; router 8*(64 + 8 + 8) + 4*2*16;
  -- dispatch 8 rows * 20; combine 8 * 64; shared: ffn_norm's output 256 +
  -- 4 * 2*8*8
  local m = acts.moe(DS, 2, 8, 8, 1)
  H.eq(m.none, 256 + 32 + (640 + 128) + 160 + 512 + (256 + 512), "MoE block side, none")
  H.eq(m.routed, 8 * (32 + 64) + 8, "routed rows, none")
  -- selective, the MoE block: the attention's 1st, 3rd, 5th matmuls, the
  -- gate forced, the shared w1 (6th), w3 (7th: 2*8*8), w2 (8th); flex's
  -- 192 + 384 + 256 as above; topk 8*1*12
  sel = acts.block(DS, 1, 2, 8, 8, 1, "selective")
  H.eq(sel.saved, 256 + (96 + 160 + 256 + 128) + 832 + 96, "MoE block, selective")
  H.eq(sel.transient, 1920 + 2496 + 776 - 1824, "MoE block, selective recompute")
  -- q_lora_rank 0: wq (1st: 2*8*12), wkv_a, wkv_b (3rd: 2*8*16, v's storage,
  -- kept once), wo; w1 (5th: 2*8*24), w3, w2 (7th: 2*8*16); flex's output,
  -- lse, q, k 192 + 384
  local d0 = {}
  for k, v in pairs(DS) do d0[k] = v end
  d0.q_lora_rank = 0
  H.eq(acts.block(d0, 0, 2, 8, 8, 1, "selective").saved, 256 + (192 + 256 + 384 + 256) + 576,
    "dense block, q_lora_rank 0, selective")
end

-- SelectiveAC's count: every other aten.mm, the forced shapes skipped.
function T.sac_matmul_parity()
  local mms = { { 4, 4 }, { 4, 2 }, { 4, 4 }, { 2, 4 } }
  H.eq(acts.sac_matmuls(mms, 2, 8, nil), 2 * 8 * (4 + 4), "1st and 3rd")
  -- { 4, 2 } forced: the 1st, (forced), 2nd, 3rd
  H.eq(acts.sac_matmuls(mms, 2, 8, { 4, 2 }), 2 * 8 * (4 + 4), "forced shape neither saved nor counted")
  H.eq(acts.sac_matmuls({ { 4, 2 }, { 4, 4 } }, 2, 8, { 4, 2 }), 2 * 8 * 4, "the next one is the 1st")
end

local function unit_acts(p)
  local s = compute.settings(p)
  return compute.units(p, s), s
end

-- The plan file's source with Lua run on its table p before it is returned.
local function variant(path, edit)
  return "local p = (function() " .. H.read(path) .. "\nend)()\n" .. edit .. "\nreturn p"
end

-- none > selective > full, per block and for a whole plan's peak.
function T.checkpointing_orders_them()
  for i = 0, 1 do
    local n = acts.block(DS, i, 2, 8, 8, 1, "none")
    local sel = acts.block(DS, i, 2, 8, 8, 1, "selective")
    local f = acts.block(DS, i, 2, 8, 8, 1, "full")
    assert(n.saved + n.routed > sel.saved and sel.saved > f.saved, "block " .. i .. ": none > selective > full")
  end
  for _, path in ipairs({ "tests/plans/moe_dsv3_tiny.lua", "tests/ep/plans/ep2_mixtral.lua",
                          "tests/ep/plans/ep2_dsv3_shard1.lua", "plans/mixtral8x7b.lua" }) do
    local last
    for _, ac in ipairs({ "none", "selective", "full" }) do
      local p = plan.from_source(variant(path, string.format("p.training = { activation_checkpointing = %q }", ac)),
        path)
      local peak = compute.activation_peak(unit_acts(p))
      if last then assert(peak < last, string.format("%s: %s keeps fewer activations", path, ac)) end
      last = peak
    end
  end
end

-- With ep > 1 the experts unit holds the routed rows' bytes (no
-- checkpointing): T x top_k rows dropless, ep x capacity under a factor.
function T.ep_rows_and_capacity()
  local path = "tests/ep/plans/ep2_mixtral.lua" -- fp32 (e = 4), 8 tokens, top 2, 4 experts, ep 2
  local function experts_bytes(edit)
    local p = plan.from_source(variant(path, edit), path)
    local per = unit_acts(p)
    for _, u in ipairs(p.layout.units) do
      if u.expert then return per[u.index].saved, p end
    end
  end
  -- 16 rows * (4*12 input + 4*4*10 + 8 permute ids) + 4 * 2 local experts
  local got, p = experts_bytes("p.training = { activation_checkpointing = 'none' }")
  H.eq(got, 16 * (48 + 160 + 8) + 8, "dropless: T x top_k rows")
  H.eq(p.layout.ep.capacity, 16, "dropless capacity (8 tokens x min(2, 2))")
  -- factor 0.5: ceil(0.5 x 16 / 2) = 4 rows per member, 8 in all
  got = experts_bytes("p.training = { activation_checkpointing = 'none' } "
    .. "p.expert_parallel = { capacity = 'factor', capacity_factor = 0.5 }")
  H.eq(got, 8 * (48 + 160 + 8) + 8, "factor 0.5: ep x capacity rows")
  -- the block's unit keeps its side (the combine's fp32 rows bounded too)
  local per = unit_acts(p)
  for _, u in ipairs(p.layout.units) do
    if u.name == "layers.0" then assert(per[u.index].saved > 0, "the block's unit keeps the rest") end
  end
  -- checkpointed: the blocks and their experts units, not the embedding or the head
  for _, u in ipairs(p.layout.units) do
    H.eq(compute.checkpointed(p, u), u.name:match("^layers%.") ~= nil, u.name .. " checkpointed")
  end
end

-- The shipped MoE plans: activations modeled; Mixtral 8x7B fits, DeepSeek-V3
-- 671B at torchtitan's local batch 4 x 4,096 does not (docs/expert-parallel.md).
function T.shipped_moe_plans_verdicts()
  for _, w in ipairs({ { "plans/mixtral8x7b.lua", true }, { "plans/deepseek_v3.lua", false } }) do
    local p = plan.from_file(w[1])
    local m = audit.analysis(p).memory
    H.eq(m.activations_modeled, true, w[1] .. " activations modeled")
    assert(m.activation_bytes > 0, w[1] .. " has activations")
    H.eq(m.fits, w[2], w[1] .. " fits")
  end
end

return T
