-- The MoE model families' shared pieces (docs/expert-parallel.md, "MoE
-- model families"): torchtitan 0.3's MoE module (models/common/moe.py)
-- with its parameter names, shapes and order, its FSDP placement of the
-- experts at ep = 1 (distributed/fsdp.py apply_fsdp_to_decoder), the
-- wrapping every torchtitan decoder gets, and the GQA-attention families
-- built on them: mixtral (gen/models/mixtral.lua) and qwen3_moe
-- (gen/models/qwen3_moe.lua). DeepSeek-V3 is gen/models/deepseek_v3.lua.
--
-- At ep = 1 the experts are ordinary parameters of their block's unit
-- (the three grouped 3-D weights, sharded over the FSDP group like every
-- other parameter; under TP split on their hidden dim: gen/parallel/
-- tp.lua). With ep > 1 gen/parallel/ep.lua splits them over ep and shards
-- them over efsdp, a second parameter group per unit.
local util = require("gen.util")
local fused = require("gen.models.fused")

local moe = {}
local LIM = util.LIMITS

-- The model keys each MoE family reads besides family, dtype and seq_len
-- (gen/load.lua refuses any other).
local GQA_FIELDS = { "size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "moe_hidden_dim",
                     "num_experts", "top_k", "fuse_qkv", "fused" }
moe.FIELDS = {
  mixtral = GQA_FIELDS,
  qwen3_moe = GQA_FIELDS,
  deepseek_v3 = { "size", "dim", "n_layers", "n_dense_layers", "n_heads", "vocab_size", "q_lora_rank", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "dense_hidden_dim", "moe_hidden_dim",
                  "num_experts", "num_shared_experts", "top_k", "route_norm", "n_expert_groups", "n_limited_groups",
                  "fused", "num_mtp_layers", "attn_backend" },
}

-- model (normalized plan.model) -> every number of fam's config: the
-- published size's, overridden by the plan's own, then fam.defaults; a
-- number still missing is refused. fam = { label, sizes, fields, defaults,
-- required }.
function moe.resolve(ctx, model, fam)
  local base = {}
  local known = util.sorted_keys(fam.sizes)
  local sizes_text = '"' .. table.concat(known, '" | "') .. '"'
  if model.size then
    base = fam.sizes[model.size:lower()]
    if not base then
      local hint = util.did_you_mean(model.size:lower(), known)
      util.field_error(ctx, "model.size", string.format("unknown %s size %s; use one of %s%s", fam.label,
        util.show(model.size), table.concat(known, ", "), hint and ("; did you mean '" .. hint .. "'?") or ""))
    end
  end
  local cfg = {}
  for _, k in ipairs(fam.fields) do
    if k ~= "size" then
      local v = model[k]
      if v == nil then v = base[k] end
      if v == nil then v = fam.defaults[k] end
      cfg[k] = v
    end
  end
  for _, k in ipairs(fam.required) do
    if cfg[k] == nil then
      util.field_error(ctx, "model." .. k, string.format("missing; give size = %s or set %s", sizes_text, k))
    end
  end
  cfg.fused = fused.read(ctx, model)
  if cfg.top_k > cfg.num_experts then
    util.field_error(ctx, "model.top_k", string.format("top_k=%d routes each token to more experts than the "
      .. "num_experts=%d there are; pick top_k <= num_experts", cfg.top_k, cfg.num_experts))
  end
  return cfg
end

-- torchtitan's FSDP placement of a block's routed experts at ep = 1
-- (apply_fsdp_to_decoder): Shard(1) when the FSDP mesh holds more ranks
-- than there are experts ("to avoid padding"), else Shard(0). The mesh it
-- counts is the one fully_shard gets: under torchtitan 0.3's default
-- spmd_types backend the dense storage mesh, every active axis of
-- dp_replicate, dp_shard, cp and tp (full_dtensor.resolve_fsdp_mesh) --
-- with HSDP the replicas count too, though the experts are sharded over
-- dp_shard only. d: the plan's dims (nil: a single rank).
function moe.expert_shard_dim(d, num_experts)
  if not d then return 0 end
  return d.dp_replicate * d.dp_shard * d.cp * d.tp > num_experts and 1 or 0
end

-- The MoE module of layer pre ("layers.<i>."), torchtitan 0.3's order:
-- the routed experts' grouped weights (E x F x D, E x D x F, E x F x D), the
-- router's gate, then the shared experts (a FeedForward of hidden F x
-- num_shared) when there are any; cfg.fused's "grouped_experts" and
-- "swiglu" fuse them (gen/models/fused.lua). The expert_bias_E and
-- tokens_per_expert_E buffers are not parameters: no unit holds them.
function moe.moe_params(out, pre, cfg, p, shard_dim)
  local E, F, D = cfg.num_experts, cfg.moe_hidden_dim, cfg.dim
  local ex = pre .. "moe.routed_experts.inner_experts."
  local on = cfg.fused or {}
  fused.experts(out, p, ex, E, F, D, shard_dim, on.grouped_experts)
  out[#out + 1] = p(pre .. "moe.router.gate.weight", { E, D })
  local shared = (cfg.num_shared_experts or 0) * F
  if shared > 0 then
    fused.ffn(out, p, pre .. "moe.shared_experts.", shared, D, on.swiglu)
  end
end

-- A parameter constructor for dtype dt: p(name, shape[, shard_dim]).
function moe.param_fn(dt)
  return function(name, shape, shard_dim) return { name = name, shape = shape, dtype = dt, shard_dim = shard_dim or 0 } end
end

-- torchtitan's apply_fsdp_to_decoder around the blocks (untied
-- embeddings): the embedding alone, the blocks (given), [norm, lm_head]
-- together without reshard after forward (loss_head: torchtitan's
-- ChunkedLossWrapper runs its lm_head, gen/parallel/fsdp_schedule.lua), and
-- the root, which then owns no parameters. Units in forward order; each parameter's numel (and the
-- model's) checked against gen/load's limit, as the llama family does.
function moe.wrap(ctx, cfg, p, blocks)
  local units = { { name = "tok_embeddings", params = { p("tok_embeddings.weight", { cfg.vocab_size, cfg.dim }) } } }
  for _, b in ipairs(blocks) do units[#units + 1] = b end
  units[#units + 1] = { name = "norm_lm_head", reshard_after_forward = false, loss_head = true, params = {
    p("norm.weight", { cfg.dim }),
    p("lm_head.weight", { cfg.vocab_size, cfg.dim }),
  } }
  units[#units + 1] = { name = "root", params = {} }
  util.bound_model_numel(ctx, units, LIM.numel, "dim, vocab_size, num_experts or the hidden sizes")
  return units
end

-- The parameters of a model's units, counted (the tests' published sizes).
function moe.count(units)
  local n = 0
  for _, u in ipairs(units) do
    for _, q in ipairs(u.params) do n = n + util.product(q.shape) end
  end
  return n
end

-- ---------------------------------------------------------------- GQA + MoE
-- A family of torchtitan 0.3 decoders with grouped-query attention and an
-- MoE in every block (its Qwen3 MoE flavours; without q/k norms, Mixtral's
-- architecture): spec = { name, label, sizes, qk_norm }.
--
-- Block order (Qwen3TransformerBlock registers attention, moe,
-- attention_norm, ffn_norm): attention.qkv_linear.wqkv (fused q, k, v
-- rows: torchtitan's registry default; fuse_qkv = false gives
-- qkv_linear.wq, wk, wv), attention.wo, [attention.q_norm, k_norm over
-- head_dim], the MoE, attention_norm, ffn_norm.
function moe.gqa_family(spec)
  local fam = {
    CONFIGS = spec.sizes,
    FIELDS = moe.FIELDS[spec.name],
  }
  local resolve_spec = {
    label = spec.label, sizes = spec.sizes, fields = fam.FIELDS, defaults = { fuse_qkv = true },
    required = { "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "moe_hidden_dim", "num_experts", "top_k" },
  }

  function fam.config(ctx, model)
    local cfg = moe.resolve(ctx, model, resolve_spec)
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
    cfg.qk_norm = spec.qk_norm
    -- the router _build_qwen3_moe_layers gives every block (softmax,
    -- route_norm; no node-limited routing): its saved bytes (gen/models/moe_acts.lua)
    cfg.router = { route_norm = true }
    return cfg
  end

  -- d: the plan's dims (the experts' FSDP placement; TP: gen/parallel/tp.lua's Qwen3 MoE plan).
  function fam.units(ctx, model, d)
    local cfg = fam.config(ctx, model)
    local p = moe.param_fn(model.dtype)
    local q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    local sd = moe.expert_shard_dim(d, cfg.num_experts)
    local blocks = {}
    for i = 0, cfg.n_layers - 1 do
      local pre = "layers." .. i .. "."
      local a = pre .. "attention."
      local ps = {}
      if cfg.fuse_qkv then
        ps[#ps + 1] = p(a .. "qkv_linear.wqkv.weight", { q + 2 * kv, cfg.dim })
      else
        ps[#ps + 1] = p(a .. "qkv_linear.wq.weight", { q, cfg.dim })
        ps[#ps + 1] = p(a .. "qkv_linear.wk.weight", { kv, cfg.dim })
        ps[#ps + 1] = p(a .. "qkv_linear.wv.weight", { kv, cfg.dim })
      end
      ps[#ps + 1] = p(a .. "wo.weight", { cfg.dim, q })
      if cfg.qk_norm then
        ps[#ps + 1] = p(a .. "q_norm.weight", { cfg.head_dim })
        ps[#ps + 1] = p(a .. "k_norm.weight", { cfg.head_dim })
      end
      moe.moe_params(ps, pre, cfg, p, sd)
      ps[#ps + 1] = p(pre .. "attention_norm.weight", { cfg.dim })
      ps[#ps + 1] = p(pre .. "ffn_norm.weight", { cfg.dim })
      blocks[#blocks + 1] = { name = "layers." .. i, params = ps }
    end
    local units = moe.wrap(ctx, cfg, p, blocks)
    return units, { n_heads = cfg.n_heads, n_kv_heads = cfg.n_kv_heads, num_experts = cfg.num_experts,
                    seq_len = model.seq_len, config = cfg }
  end

  return fam
end

return moe
