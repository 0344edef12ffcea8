-- TP on the dense Qwen3 family (torchtitan 0.3's models/qwen3/sharding.py,
-- gen/parallel/tp.lua's qwen3 placements, gen/parallel/tp_acts.lua's
-- DENSE.qwen3): every parameter's placement and TP-local shape, and the TP
-- collectives of one micro-step in order, as tests/tp_record.py recorded
-- them from torchtitan on gloo (tiny Qwen3: dim 64, 4 heads, 2 kv heads,
-- head_dim 16, hidden 96, vocab 250; local batch 2 x seq_len 32, fp32);
-- HSDP x TP; the refusals, one line each.
local H = require("helpers")
local plan = require("gen.plan")
local tp = require("gen.parallel.tp")

local T = {}

local TINY = [[return { world_size = %d, parallel = %s, model = { family = "qwen3", dim = 64, n_layers = 2,
  n_heads = 4, n_kv_heads = 2, head_dim = 16, vocab_size = 250, hidden_dim = 96, enable_weight_tying = %s,
  seq_len = 32 }, training = { local_batch_size = 2 } }]]

local function build(world, parallel, tied)
  return plan.from_source(string.format(TINY, world, parallel, tied and "true" or "false"), "plans/t.lua")
end

-- micro-step 0's TP collectives as "kind phase count [op]"
local function tp_ops(p)
  local out = {}
  for _, o in ipairs(p.ops) do
    if o.group == "tp" and o.micro_step == 0 then
      out[#out + 1] = string.format("%s %s %d%s", o.kind:gsub("^tp_", ""), o.phase, o.count,
        o.kind == "tp_all_reduce" and (" " .. o.reduce_op) or "")
    end
  end
  return out
end

local function rep(t, n, list)
  for _ = 1, n do
    for _, x in ipairs(list) do t[#t + 1] = x end
  end
  return t
end

-- The recordings (build/tp_record/qwen3_*.rank0.json): each block gathers
-- 2 x 32 x 64 / 2 = 2,048 elements per rank before attention and the
-- feed-forward and reduce-scatters after wo and w2; the loss's three fp32
-- all-reduces of 64 tokens; the q/k norms' Partial gradients (16 each) and,
-- under SP, attention_norm's and ffn_norm's (64), all-reduced in parameter
-- order before the unit's FSDP reduction.
local FWD = { "all_gather forward 2048", "reduce_scatter forward 2048" }
local BLOCK_BWD = { "all_gather backward 2048", "reduce_scatter backward 2048", "all_gather backward 2048",
                    "reduce_scatter backward 2048" }
local PARTIAL = { "all_reduce backward 16 sum", "all_reduce backward 16 sum", "all_reduce backward 64 sum",
                  "all_reduce backward 64 sum" }
local LOSS = { "all_reduce forward 64 max", "all_reduce forward 64 sum", "all_reduce forward 64 sum" }

local function sp_sequence(tied)
  local s = { "reduce_scatter forward 2048" }
  rep(s, 4, FWD)
  s[#s + 1] = "all_gather forward 2048"
  rep(s, 1, LOSS)
  s[#s + 1] = "reduce_scatter backward 2048"
  -- untied: the [norm, lm_head] unit's post-backward reduces norm.weight's
  -- gradient first; tied: the one unit of both ends, last
  if not tied then s[#s + 1] = "all_reduce backward 64 sum" end
  rep(s, 2, rep(rep({}, 1, BLOCK_BWD), 1, PARTIAL))
  s[#s + 1] = "all_gather backward 2048"
  if tied then s[#s + 1] = "all_reduce backward 64 sum" end
  return s
end

function T.qwen3_tp_placements_and_local_shapes()
  local p = build(2, "{ tp = 2 }", false)
  local want = {
    ["tok_embeddings.weight"] = { "shard(0)", { 125, 64 } },
    ["layers.0.attention.qkv_linear.wqkv.weight"] = { "colwise", { 64, 64 } }, -- (64 + 2 x 32) / 2 rows
    ["layers.0.attention.wo.weight"] = { "rowwise", { 64, 32 } },
    ["layers.0.attention.q_norm.weight"] = { "replicate", { 16 } },
    ["layers.0.attention.k_norm.weight"] = { "replicate", { 16 } },
    ["layers.0.feed_forward.w1.weight"] = { "colwise", { 48, 64 } },
    ["layers.0.feed_forward.w2.weight"] = { "rowwise", { 64, 48 } },
    ["layers.0.feed_forward.w3.weight"] = { "colwise", { 48, 64 } },
    ["layers.0.attention_norm.weight"] = { "replicate", { 64 } },
    ["norm.weight"] = { "replicate", { 64 } },
    ["lm_head.weight"] = { "colwise", { 125, 64 } },
  }
  local seen = 0
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do
      local w = want[q.name]
      if w then
        H.eq(q.tp, w[1], q.name .. " placement")
        H.list_eq(q.shape, w[2], q.name .. " TP-local shape")
        seen = seen + 1
      end
    end
  end
  H.eq(seen, 11, "parameters checked")
  -- the DTensor placements torchtitan's run shows (dp_shard of 1 kept: resolve_fsdp_mesh)
  local by = {}
  for _, u in ipairs(p.layout.units) do
    for _, q in ipairs(u.params) do by[q.name] = q end
  end
  H.list_eq(tp.placements(by["layers.0.attention.qkv_linear.wqkv.weight"], 2),
    { "_StridedShard(dim=0, sf=2)", "Shard(dim=0)" })
  H.list_eq(tp.placements(by["layers.0.attention.wo.weight"], 2), { "Shard(dim=0)", "Shard(dim=1)" })
  H.list_eq(tp.placements(by["layers.0.attention.q_norm.weight"], 2), { "Shard(dim=0)", "Replicate()" })
  -- unfused: wq, wk, wv column-wise (qwen3/sharding.py via set_qkv_linear_sharding)
  local unfused = string.format(TINY, 2, "{ tp = 2 }", "false"):gsub("hidden_dim = 96",
    "hidden_dim = 96, fuse_qkv = false")
  local u = plan.from_source(unfused, "plans/t.lua")
  for _, lu in ipairs(u.layout.units) do
    for _, q in ipairs(lu.params) do
      if q.name:match("qkv_linear%.w[qkv]%.weight$") then H.eq(q.tp_dim, 0, q.name) end
    end
  end
end

function T.qwen3_tp_collectives_as_recorded()
  H.list_eq(tp_ops(build(2, "{ tp = 2 }", false)), sp_sequence(false), "tp 2, SP, untied")
  H.list_eq(tp_ops(build(2, "{ tp = 2 }", true)), sp_sequence(true), "tp 2, SP, tied: lm_head's after the blocks")
  H.list_eq(tp_ops(build(4, "{ dp_shard = 2, tp = 2 }", false)), sp_sequence(false), "dp_shard 2 x tp 2")
  -- without SP: all-reduces of whole activations; the q/k norms' gradients
  -- still Partial (their weight R whatever SP), the other norms' not (I)
  local full, qk = "all_reduce %s 4096 sum", { "all_reduce backward 16 sum", "all_reduce backward 16 sum" }
  local want = rep({}, 5, { full:format("forward") })
  rep(want, 1, LOSS)
  want[#want + 1] = full:format("backward")
  rep(want, 2, rep({ full:format("backward"), full:format("backward") }, 1, qk))
  H.list_eq(tp_ops(build(2, "{ tp = 2, sequence_parallel = false }", false)), want, "tp 2, no SP")
end

-- HSDP x TP: the replicas' all-reduces join FSDP's; the TP sequence is the
-- same, and the TP split is even (one TP class).
function T.qwen3_hsdp_tp()
  local p = build(8, "{ dp_replicate = 2, dp_shard = 2, tp = 2 }", true)
  H.list_eq(tp_ops(p), sp_sequence(true), "2 x 2 x 2, tied")
  local replicate = 0
  for _, o in ipairs(p.ops) do
    if o.group == "dp_replicate" and o.micro_step == 0 then replicate = replicate + 1 end
  end
  H.eq(replicate, 3, "one replica all-reduce per unit with parameters")
end

function T.qwen3_tp_refusals_one_line_each()
  H.plan_fails(string.format(TINY, 4, "{ tp = 4 }", "false"), "parallel.tp",
    "num_key_value_heads=2 not divisible by tp=4")
  local no_seq = string.format(TINY, 2, "{ tp = 2 }", "false"):gsub("seq_len = 32 ", "")
  H.plan_fails(no_seq, "model.seq_len",
    "seq_len is needed to size the TP activation collectives")
  H.plan_fails(string.format(TINY, 2, "{ dp_shard = 2, sequence_parallel = true }", "false"),
    "parallel.sequence_parallel", "tp=1")
  H.plan_fails(string.format(TINY, 2, "{ dp_shard = 2, loss_parallel = false }", "false"),
    "parallel.loss_parallel", "tp=1")
  H.plan_fails(string.format(TINY, 2, "{ tp = 2, sequence_parallel = false, async_tp = true }", "false"),
    "parallel.async_tp", "sequence_parallel = false")
end

return T
