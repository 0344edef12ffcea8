-- Llama 3 family with torchtitan's parameter names, order and wrapping:
-- the embedding, one unit per decoder layer, [norm, output], and a root
-- without parameters, as torchtitan's parallelize applies fully_shard.
-- model.fused = { "swiglu" }: torchtitan's fused_swiglu override's w2,
-- w13 for w1, w2, w3 (gen/models/fused.lua).
local util = require("gen.util")
local fused = require("gen.models.fused")

local llama = {}
local LIM = util.LIMITS

-- Published Llama 3 / 3.1 configs (torchtitan llama3 model registry).
llama.CONFIGS = {
  ["8b"] = { dim = 4096, n_layers = 32, n_heads = 32, n_kv_heads = 8, vocab_size = 128256,
             ffn_dim_multiplier = 1.3, multiple_of = 1024 },
  ["70b"] = { dim = 8192, n_layers = 80, n_heads = 64, n_kv_heads = 8, vocab_size = 128256,
              ffn_dim_multiplier = 1.3, multiple_of = 4096 },
  ["405b"] = { dim = 16384, n_layers = 126, n_heads = 128, n_kv_heads = 8, vocab_size = 128256,
               ffn_dim_multiplier = 1.2, multiple_of = 4096 },
}

-- torchtitan FeedForward: hidden = 4*dim, 2/3 of it, times the multiplier,
-- rounded up to multiple_of.
function llama.ffn_hidden(dim, multiplier, multiple_of)
  local hidden = (2 * 4 * dim) // 3
  if multiplier then hidden = math.floor(multiplier * hidden) end
  return multiple_of * util.ceil_div(hidden, multiple_of)
end

-- model (normalized plan.model) -> config with every number filled in.
function llama.config(ctx, model)
  local base = {}
  if model.size then
    base = llama.CONFIGS[model.size:lower()]
    if not base then
      local known = util.sorted_keys(llama.CONFIGS)
      local hint = util.did_you_mean(model.size:lower(), known)
      util.field_error(ctx, "model.size", string.format("unknown Llama 3 size %s; use one of %s%s", util.show(model.size),
        table.concat(known, ", "), hint and ("; did you mean '" .. hint .. "'?") or ""))
    end
  end
  local cfg = {}
  for _, k in ipairs({ "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim_multiplier", "multiple_of" }) do
    cfg[k] = model[k] or base[k]
  end
  cfg.multiple_of = cfg.multiple_of or 256
  for _, k in ipairs({ "dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size" }) do
    if not cfg[k] then
      util.field_error(ctx, "model." .. k, "missing; give size = \"8b\" | \"70b\" | \"405b\" or set " .. k)
    end
  end
  if cfg.dim % cfg.n_heads ~= 0 then
    util.field_error(ctx, "model.n_heads", string.format("dim=%d is not divisible by n_heads=%d; pick n_heads dividing dim",
      cfg.dim, cfg.n_heads))
  end
  if cfg.n_heads % cfg.n_kv_heads ~= 0 then
    util.field_error(ctx, "model.n_kv_heads", string.format(
      "n_heads=%d is not divisible by n_kv_heads=%d (GQA groups); pick n_kv_heads dividing n_heads", cfg.n_heads, cfg.n_kv_heads))
  end
  cfg.head_dim = cfg.dim // cfg.n_heads
  cfg.hidden = llama.ffn_hidden(cfg.dim, cfg.ffn_dim_multiplier, cfg.multiple_of)
  cfg.fused = fused.read(ctx, model)
  -- torchtitan's llama3 model_registry(attn_backend="flex"), models/llama3/__init__.py:371
  cfg.attn_backend = model.attn_backend or "flex"
  return cfg
end

function llama.units(ctx, model)
  local cfg = llama.config(ctx, model)
  local dt = model.dtype
  local function p(name, shape) return { name = name, shape = shape, dtype = dt, shard_dim = 0 } end
  local kv = cfg.n_kv_heads * cfg.head_dim
  -- torchtitan's apply_fsdp, in wrapping order: the embedding alone, one
  -- unit per block, [norm, output] together without reshard after forward
  -- (FSDP would all-gather them again at once for backward), and the root,
  -- which then owns no parameters and issues no collectives. loss_head:
  -- the unit torchtitan's ChunkedLossWrapper runs lm_head of
  -- (gen/parallel/fsdp_schedule.lua): its parameters [norm, lm_head].
  local units = { { name = "tok_embeddings", params = { p("tok_embeddings.weight", { cfg.vocab_size, cfg.dim }) } } }
  for i = 0, cfg.n_layers - 1 do
    local pre = "layers." .. i .. "."
    units[#units + 1] = { name = "layers." .. i, params = {
      p(pre .. "attention.wq.weight", { cfg.n_heads * cfg.head_dim, cfg.dim }),
      p(pre .. "attention.wk.weight", { kv, cfg.dim }),
      p(pre .. "attention.wv.weight", { kv, cfg.dim }),
      p(pre .. "attention.wo.weight", { cfg.dim, cfg.n_heads * cfg.head_dim }),
    } }
    -- (model.fused "swiglu": w2, w13 for w1, w2, w3; gen/models/fused.lua)
    local ps = units[#units].params
    fused.ffn(ps, p, pre .. "feed_forward.", cfg.hidden, cfg.dim, cfg.fused.swiglu)
    ps[#ps + 1] = p(pre .. "attention_norm.weight", { cfg.dim })
    ps[#ps + 1] = p(pre .. "ffn_norm.weight", { cfg.dim })
  end
  units[#units + 1] = { name = "norm_output", reshard_after_forward = false, loss_head = true, params = {
    p("norm.weight", { cfg.dim }),
    p("output.weight", { cfg.vocab_size, cfg.dim }),
  } }
  units[#units + 1] = { name = "root", params = {} }
  -- gen/load bounds every config number by 2^31 - 1 and n_layers by the
  -- unit limit; shapes multiply two of them, so their numels are checked.
  util.bound_model_numel(ctx, units, LIM.numel, "dim, vocab_size or the FFN size")
  return units, { n_heads = cfg.n_heads, n_kv_heads = cfg.n_kv_heads, seq_len = model.seq_len, config = cfg,
                  attn_backend = cfg.attn_backend }
end

return llama
