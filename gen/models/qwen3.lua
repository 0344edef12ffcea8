-- Qwen3 dense family: torchtitan 0.3's Qwen3 dense flavours
-- (models/qwen3/__init__.py: "0.6B" .. "32B", _build_qwen3_layers) with
-- their parameter names, order, shapes and FSDP wrapping
-- (distributed/fsdp.py apply_fsdp_to_decoder), checked live by
-- tests/titan/test_qwen3_plan.py.
--
-- Block (Qwen3TransformerBlock registers attention, feed_forward,
-- attention_norm, ffn_norm): attention.qkv_linear.wqkv (fused q, k, v rows,
-- the registry's default; fuse_qkv = false gives qkv_linear.wq, wk, wv),
-- attention.wo, attention.q_norm and k_norm (RMSNorms over head_dim),
-- feed_forward.w1, w2, w3 (hidden_dim given, not derived from dim), then
-- attention_norm, ffn_norm (model.fused "swiglu": w2, then w13 [hidden, 2,
-- dim] for w1, w2, w3; gen/models/fused.lua). head_dim is given (128 in every flavour), so
-- n_heads x head_dim need not be dim (0.6B: 16 x 128 = 2048 > 1024).
--
-- Weight tying (enable_weight_tying, the 0.6B, 1.7B and 4B flavours): the
-- decoder's __init__ ties tok_embeddings.weight to lm_head.weight
-- (models/common/decoder.py:206-208), and apply_fsdp_to_decoder then wraps
-- the embedding, the final norm and lm_head as ONE unit without reshard
-- after forward (distributed/fsdp.py:180-192; the blocks follow, the root
-- last). Under torchtitan 0.3's default spmd_types backend the model's
-- parallelize has already registered a distributed parameter per module
-- (protocols/module.py:313-315, _spmd_distribute_state), which unties them
-- before fully_shard: the unit holds three FSDP parameters,
-- tok_embeddings.weight, norm.weight and lm_head.weight, and its one
-- all-gather and one reduce-scatter per micro-step carry the vocabulary
-- table twice (measured: tests/titan/test_qwen3_plan.py). The trainer's
-- init_states re-ties the module attributes (decoder.py:215-221), so the
-- two FSDP parameters then share one sharded tensor (FSDP2's lazy init
-- re-reads it): one sharded copy, one gradient (both reductions add into
-- it), one optimizer state. The unit is all-gathered once, before the
-- embedding, and stays unsharded until its reduce-scatter, which FSDP2's
-- final backward callback issues after every block's (the embedding's
-- input, the token ids, carries no gradient hook).
-- Untied flavours (8B, 14B, 32B) are wrapped as every other decoder:
-- tok_embeddings, the blocks, [norm, lm_head] (no reshard after forward),
-- the root.
local util = require("gen.util")
local moe = require("gen.models.moe")
local moe_acts = require("gen.models.moe_acts")
local fused = require("gen.models.fused")

local qwen3 = {}

local function flavour(dim, n_layers, n_heads, hidden_dim, tied)
  return { dim = dim, n_layers = n_layers, n_heads = n_heads, n_kv_heads = 8, head_dim = 128, vocab_size = 151936,
           hidden_dim = hidden_dim, enable_weight_tying = tied }
end

-- torchtitan 0.3's qwen3 registry (models/qwen3/__init__.py _0_6b .. _32b).
qwen3.CONFIGS = {
  ["0.6b"] = flavour(1024, 28, 16, 3072, true),
  ["1.7b"] = flavour(2048, 28, 16, 6144, true),
  ["4b"] = flavour(2560, 36, 32, 9728, true),
  ["8b"] = flavour(4096, 36, 32, 12288, false),
  ["14b"] = flavour(5120, 40, 40, 17408, false),
  ["32b"] = flavour(5120, 64, 64, 25600, false),
}

-- The model keys the family reads besides family, dtype and seq_len
-- (gen/load.lua refuses any other).
qwen3.FIELDS = { "size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "hidden_dim",
                 "fuse_qkv", "enable_weight_tying", "fused", "attn_backend" }

-- torchtitan's defaults where a plan gives numbers without a size:
-- fused qkv (_build_qwen3_layers' default), untied (Decoder.Config's), flex attention
-- (model_registry(attn_backend="flex"), models/qwen3/__init__.py:613-615).
local DEFAULTS = { fuse_qkv = true, enable_weight_tying = false, attn_backend = "flex" }
local REQUIRED = { "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim" }

-- model (normalized plan.model) -> config with every number filled in: the
-- size's, overridden by the plan's own, then the defaults.
local SIZES = { "0.6b", "1.7b", "4b", "8b", "14b", "32b" }

function qwen3.config(ctx, model)
  local base = {}
  local known = SIZES
  if model.size then
    base = qwen3.CONFIGS[model.size:lower()]
    if not base then
      local hint = util.did_you_mean(model.size:lower(), known)
      util.field_error(ctx, "model.size", string.format("unknown Qwen3 size %s; use one of %s%s", util.show(model.size),
        table.concat(known, ", "), hint and ("; did you mean '" .. hint .. "'?") or ""))
    end
  end
  local cfg = {}
  for _, k in ipairs(qwen3.FIELDS) do
    if k ~= "size" then
      local v = model[k]
      if v == nil then v = base[k] end
      if v == nil then v = DEFAULTS[k] end
      cfg[k] = v
    end
  end
  for _, k in ipairs(REQUIRED) do
    if cfg[k] == nil then
      util.field_error(ctx, "model." .. k, string.format("missing; give size = \"%s\" or set %s",
        table.concat(known, "\" | \""), k))
    end
  end
  if cfg.n_heads % cfg.n_kv_heads ~= 0 then
    util.field_error(ctx, "model.n_kv_heads", string.format("n_heads=%d is not divisible by n_kv_heads=%d "
      .. "(GQA groups); pick n_kv_heads dividing n_heads", cfg.n_heads, cfg.n_kv_heads))
  end
  if not cfg.head_dim then
    if cfg.dim % cfg.n_heads ~= 0 then
      util.field_error(ctx, "model.n_heads", string.format("dim=%d is not divisible by n_heads=%d; pick n_heads "
        .. "dividing dim or set head_dim", cfg.dim, cfg.n_heads))
    end
    cfg.head_dim = cfg.dim // cfg.n_heads
  end
  cfg.hidden = cfg.hidden_dim
  cfg.qk_norm = true
  cfg.fused = fused.read(ctx, model)
  return cfg
end

-- The units before TP: gen/parallel/tp.lua places them over tp (torchtitan
-- 0.3's models/qwen3/sharding.py) and gen/parallel/tp_acts.lua gives them
-- their activation collectives.
function qwen3.units(ctx, model)
  local cfg = qwen3.config(ctx, model)
  local p = moe.param_fn(model.dtype)
  local q, kv, D = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.dim
  local blocks = {}
  for i = 0, cfg.n_layers - 1 do
    local pre = "layers." .. i .. "."
    local a = pre .. "attention."
    local ps = {}
    if cfg.fuse_qkv then
      ps[#ps + 1] = p(a .. "qkv_linear.wqkv.weight", { q + 2 * kv, D })
    else
      ps[#ps + 1] = p(a .. "qkv_linear.wq.weight", { q, D })
      ps[#ps + 1] = p(a .. "qkv_linear.wk.weight", { kv, D })
      ps[#ps + 1] = p(a .. "qkv_linear.wv.weight", { kv, D })
    end
    ps[#ps + 1] = p(a .. "wo.weight", { D, q })
    ps[#ps + 1] = p(a .. "q_norm.weight", { cfg.head_dim })
    ps[#ps + 1] = p(a .. "k_norm.weight", { cfg.head_dim })
    fused.ffn(ps, p, pre .. "feed_forward.", cfg.hidden, D, cfg.fused.swiglu)
    ps[#ps + 1] = p(pre .. "attention_norm.weight", { D })
    ps[#ps + 1] = p(pre .. "ffn_norm.weight", { D })
    blocks[#blocks + 1] = { name = "layers." .. i, params = ps }
  end
  local units
  if cfg.enable_weight_tying then
    -- one unit for both ends, wrapped first, never resharded after forward
    units = { { name = "tok_embeddings_norm_lm_head", reshard_after_forward = false, params = {
      p("tok_embeddings.weight", { cfg.vocab_size, D }),
      p("norm.weight", { D }),
      p("lm_head.weight", { cfg.vocab_size, D }),
    } } }
    for _, b in ipairs(blocks) do units[#units + 1] = b end
    units[#units + 1] = { name = "root", params = {} }
    util.bound_model_numel(ctx, units, util.LIMITS.numel, "dim, vocab_size or hidden_dim")
  else
    units = moe.wrap(ctx, cfg, p, blocks)
  end
  return units, { n_heads = cfg.n_heads, n_kv_heads = cfg.n_kv_heads, seq_len = model.seq_len, config = cfg,
                  attn_backend = cfg.attn_backend }
end

-- One block's activations { saved, transient } (ac "none" | "selective" |
-- "full"), T tokens, e bytes per element: gen/models/moe_acts.lua's GQA
-- attention with the q/k norms and its dense FeedForward, as that module
-- combines them for DeepSeek-V3's dense blocks (the block's input, every
-- other matmul's output -- fused: wqkv, w1, w2; unfused: wq, wv, w1, w2 --
-- and flex's compiled region's outputs under "selective"). Measured on
-- torchtitan's own dense Qwen3 block by tests/titan/test_qwen3_plan.py,
-- with its FeedForward and as FusedSwiGLU (model.fused "swiglu": dense_ffn's
-- fused terms, cfg.fused carried through).
-- cp: context parallel's degree (default 1): flex attention keeps the
-- gathered K and V, cp x T tokens each (gen/models/llama_acts.lua's term,
-- derived, not measured), except under full checkpointing.
function qwen3.block_acts(cfg, e, T, ac, cp)
  local dense = setmetatable({ n_dense_layers = 1, dense_hidden_dim = cfg.hidden }, { __index = cfg })
  local b = moe_acts.block(dense, 0, e, T, 0, 1, ac)
  local gathered = ac == "full" and 0 or 2 * e * T * cfg.n_kv_heads * cfg.head_dim * ((cp or 1) - 1)
  return { saved = b.saved + b.routed + gathered, transient = b.transient }
end

-- The model's parameters as torchtitan counts them (model.parameters() of
-- the built, tied model: the shared table once).
function qwen3.count(units, cfg)
  local n = moe.count(units)
  if cfg.enable_weight_tying then n = n - cfg.vocab_size * cfg.dim end
  return n
end

return qwen3
