-- gpt-oss family: torchtitan 0.3's models/gpt_oss with its names, order
-- and wrapping. Every block is grouped-query attention with biases on its
-- projections and a learned per-head attention sink (model.py:43-131), and
-- an MoE of routed experts without shared experts whose grouped weights
-- carry biases too (moe.py:77-97: mlp1_weight_EGD holds the gate and up
-- rows interleaved, 2 x moe_hidden_dim of them). Even-indexed blocks attend
-- through a causal sliding window of sliding_window tokens (torchtitan's
-- _build_gptoss_layers: sliding_window_size=128 if layer_id % 2 == 0,
-- __init__.py:209), odd ones over the whole causal sequence.
--
-- Parameter order, as the fully_shard state holds it after torchtitan's
-- parallelize_gptoss (read back by tests/titan/test_moe_plan.py; the
-- meta-built model's named_parameters lists sinks first, the parallelized
-- one's FSDP group after wo): qkv_linear (fused wqkv weight and bias: the
-- registry's fuse_qkv=True, __init__.py:101-112; unfused wq, wk, wv each
-- with a bias: QKVLinear builds wk and wv from one wkv config,
-- common/attention.py:756-758), wo weight and bias
-- (ScaledBiasRowwiseLinear, __init__.py:136-141), the attention's sinks
-- (model.py:82), then the block's
-- attention_norm, ffn_norm and moe (GptOssTransformerBlock, model.py:151-
-- 156): the experts' mlp1_weight_EGD, mlp1_bias_EG, mlp2_weight_EDF,
-- mlp2_bias_ED, the router's gate weight and bias (bias=True, __init__.py:
-- 230-235). lm_head has no bias (Linear.Config's default).
--
-- FSDP (parallelize_gptoss, parallelize.py:108-140: apply_fsdp_to_decoder,
-- distributed/fsdp.py): the embedding, each block, [norm, lm_head] and the
-- root, gen/models/moe.lua's wrap. The experts' FSDP placement takes every
-- parameter of inner_experts, the biases with the weights (fsdp.py:220-233:
-- expert_params = set(experts.parameters()), Shard(1) when the FSDP mesh is
-- wider than num_experts); with ep > 1 gen/parallel/ep.lua splits all four
-- on dim 0 over ep (they live under moe.routed_experts.inner_experts.).
-- TP: gen/parallel/tp.lua's gpt_oss plan (models/gpt_oss/sharding.py), its
-- Partial bias gradients gen/parallel/tp_acts.lua's DENSE.gpt_oss. CP: each
-- block's K/V exchange as the other GQA families' (gen/parallel/cp.lua; the
-- sinks and the sliding window add no collective), with attn_backend =
-- "flex" only: torchtitan refuses CP with the registry's default varlen.
local util = require("gen.util")
local moe = require("gen.models.moe")

local go = {}

go.FIELDS = { "size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "moe_hidden_dim",
              "num_experts", "top_k", "fuse_qkv", "sliding_window", "attn_backend" }

-- torchtitan's gpt_oss registry (models/gpt_oss/__init__.py:249-385:
-- _debugmodel, _20b, _120b); every flavour has 64 heads of 64, 8 KV heads
-- (_make_gptoss_attn_config's defaults, :69-79), top 4 of its experts.
go.CONFIGS = {
  debugmodel = { dim = 256, n_layers = 4, n_heads = 64, n_kv_heads = 8, head_dim = 64, vocab_size = 2048,
                 moe_hidden_dim = 2880, num_experts = 8, top_k = 4 },
  ["20b"] = { dim = 2880, n_layers = 24, n_heads = 64, n_kv_heads = 8, head_dim = 64, vocab_size = 201088,
              moe_hidden_dim = 2880, num_experts = 32, top_k = 4 },
  ["120b"] = { dim = 2880, n_layers = 36, n_heads = 64, n_kv_heads = 8, head_dim = 64, vocab_size = 201088,
               moe_hidden_dim = 2880, num_experts = 128, top_k = 4 },
}

local RESOLVE = {
  label = "gpt-oss", sizes = go.CONFIGS, fields = go.FIELDS,
  -- (_make_gptoss_attn_config's defaults; the window torchtitan fixes at 128, __init__.py:209)
  -- (attn_backend: its registry's default, model_registry(attn_backend="varlen"), __init__.py:388-396;
  -- the one place its default is decided: context parallel reads the resolved value, gen/parallel/cp.lua)
  defaults = { n_heads = 64, n_kv_heads = 8, head_dim = 64, fuse_qkv = true, sliding_window = 128,
               attn_backend = "varlen" },
  required = { "dim", "n_layers", "vocab_size", "moe_hidden_dim", "num_experts", "top_k" },
}

function go.config(ctx, model)
  local cfg = moe.resolve(ctx, model, RESOLVE)
  if cfg.n_heads % cfg.n_kv_heads ~= 0 then
    util.field_error(ctx, "model.n_kv_heads", string.format("n_heads=%d is not divisible by n_kv_heads=%d "
      .. "(GQA groups); pick n_kv_heads dividing n_heads", cfg.n_heads, cfg.n_kv_heads))
  end
  -- the router _build_gptoss_layers gives every block (softmax, route_norm; __init__.py:226-237)
  cfg.router = { route_norm = true }
  -- the experts' SwiGLU with clamps and the attention's sinks (gen/models/moe_acts.lua's gpt-oss terms)
  cfg.gpt_oss = true
  return cfg
end

-- The key positions one query of block i (0-based) attends to over a
-- sequence of seq tokens, counted as gen/compute.lua counts full attention
-- (the whole sequence): the window on even blocks, the sequence on odd ones.
function go.kv_len(cfg, i, seq)
  if i % 2 == 0 then return math.min(seq, cfg.sliding_window) end
  return seq
end

-- d: the plan's dims (the experts' FSDP placement).
function go.units(ctx, model, d)
  local cfg = go.config(ctx, model)
  local p = moe.param_fn(model.dtype)
  local D, hd = cfg.dim, cfg.head_dim
  local q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
  local E, F = cfg.num_experts, cfg.moe_hidden_dim
  local sd = moe.expert_shard_dim(d, E)
  local blocks = {}
  for i = 0, cfg.n_layers - 1 do
    local pre = "layers." .. i .. "."
    local a = pre .. "attention."
    local ps = {}
    if cfg.fuse_qkv then
      ps[#ps + 1] = p(a .. "qkv_linear.wqkv.weight", { q + 2 * kv, D })
      ps[#ps + 1] = p(a .. "qkv_linear.wqkv.bias", { q + 2 * kv })
    else
      for _, w in ipairs({ { "wq", q }, { "wk", kv }, { "wv", kv } }) do
        ps[#ps + 1] = p(a .. "qkv_linear." .. w[1] .. ".weight", { w[2], D })
        ps[#ps + 1] = p(a .. "qkv_linear." .. w[1] .. ".bias", { w[2] })
      end
    end
    ps[#ps + 1] = p(a .. "wo.weight", { D, q })
    ps[#ps + 1] = p(a .. "wo.bias", { D })
    ps[#ps + 1] = p(a .. "sinks", { cfg.n_heads })
    ps[#ps + 1] = p(pre .. "attention_norm.weight", { D })
    ps[#ps + 1] = p(pre .. "ffn_norm.weight", { D })
    local ex = pre .. "moe.routed_experts.inner_experts."
    ps[#ps + 1] = p(ex .. "mlp1_weight_EGD", { E, 2 * F, D }, sd)
    ps[#ps + 1] = p(ex .. "mlp1_bias_EG", { E, 2 * F }, sd)
    ps[#ps + 1] = p(ex .. "mlp2_weight_EDF", { E, D, F }, sd)
    ps[#ps + 1] = p(ex .. "mlp2_bias_ED", { E, D }, sd)
    ps[#ps + 1] = p(pre .. "moe.router.gate.weight", { E, D })
    ps[#ps + 1] = p(pre .. "moe.router.gate.bias", { E })
    blocks[#blocks + 1] = { name = "layers." .. i, params = ps }
  end
  local units = moe.wrap(ctx, cfg, p, blocks)
  return units, { n_heads = cfg.n_heads, n_kv_heads = cfg.n_kv_heads, num_experts = E, seq_len = model.seq_len,
                  config = cfg, attn_backend = cfg.attn_backend }
end

return go
