-- DeepSeek-V3-like family with torchtitan 0.3's names, order and wrapping
-- (models/deepseek_v3): multi-head latent attention, the first
-- n_dense_layers blocks with a dense FeedForward, every later block an MoE
-- of num_experts routed experts (top_k per token) beside
-- num_shared_experts shared ones (gen/models/moe.lua). No multi-token
-- prediction layers (torchtitan's default, num_mtp_layers = 0).
local util = require("gen.util")
local moe = require("gen.models.moe")
local fused = require("gen.models.fused")

local ds = {}

local MLA = { kv_lora_rank = 512, qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128 }
local function flavor(t)
  for k, v in pairs(MLA) do t[k] = v end
  return t
end

-- torchtitan's deepseek_v3 registry ("16B", "236B", "671B";
-- models/deepseek_v3/__init__.py); 671b is DeepSeek-V3's published config.
ds.CONFIGS = {
  ["16b"] = flavor({ dim = 2048, n_layers = 27, n_dense_layers = 1, n_heads = 16, vocab_size = 102400, q_lora_rank = 0,
                     dense_hidden_dim = 10944, moe_hidden_dim = 1408, num_experts = 64, num_shared_experts = 2,
                     top_k = 6 }),
  ["236b"] = flavor({ dim = 5120, n_layers = 60, n_dense_layers = 1, n_heads = 128, vocab_size = 102400,
                      q_lora_rank = 1536, dense_hidden_dim = 12288, moe_hidden_dim = 1536, num_experts = 160,
                      num_shared_experts = 2, top_k = 6 }),
  ["671b"] = flavor({ dim = 7168, n_layers = 61, n_dense_layers = 3, n_heads = 128, vocab_size = 129280,
                      q_lora_rank = 1536, dense_hidden_dim = 18432, moe_hidden_dim = 2048, num_experts = 256,
                      num_shared_experts = 1, top_k = 8 }),
}
ds.FIELDS = moe.FIELDS.deepseek_v3

-- Each registry size's router (models/deepseek_v3/__init__.py: route_norm,
-- num_expert_groups, num_limited_groups), which decides what it keeps for
-- backward (gen/models/moe_acts.lua): plan fields route_norm,
-- n_expert_groups and n_limited_groups (0: no node-limited routing, as
-- _build_dsv3_layers' defaults), a size's own unless the plan sets them.
local ROUTERS = {
  ["16b"] = {},
  ["236b"] = { n_expert_groups = 8, n_limited_groups = 3 },
  ["671b"] = { route_norm = true, n_expert_groups = 8, n_limited_groups = 4 },
}
for size, r in pairs(ROUTERS) do
  for k, v in pairs(r) do ds.CONFIGS[size][k] = v end
end

-- torchtitan's Attention.Config defaults (q_lora_rank 0: one wq).
local RESOLVE = {
  label = "DeepSeek-V3", sizes = ds.CONFIGS, fields = ds.FIELDS,
  defaults = { q_lora_rank = 0, kv_lora_rank = 512, qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128,
               route_norm = false, n_expert_groups = 0, n_limited_groups = 0 },
  required = { "dim", "n_layers", "n_dense_layers", "n_heads", "vocab_size", "moe_hidden_dim", "num_experts",
               "num_shared_experts", "top_k" },
}

function ds.config(ctx, model)
  local cfg = moe.resolve(ctx, model, RESOLVE)
  if cfg.n_dense_layers > cfg.n_layers then
    util.field_error(ctx, "model.n_dense_layers", string.format("n_dense_layers=%d is more than the n_layers=%d "
      .. "there are; pick n_dense_layers <= n_layers", cfg.n_dense_layers, cfg.n_layers))
  end
  if cfg.n_dense_layers > 0 and not cfg.dense_hidden_dim then
    util.field_error(ctx, "model.dense_hidden_dim", string.format("missing: the first n_dense_layers=%d blocks have a "
      .. "dense FeedForward of this hidden size; set it (or n_dense_layers = 0)", cfg.n_dense_layers))
  end
  if cfg.n_dense_layers == 0 and model.dense_hidden_dim then
    util.field_error(ctx, "model.dense_hidden_dim", "n_dense_layers = 0: no block is dense, so dense_hidden_dim "
      .. "would be ignored; remove it")
  end
  local G, L = cfg.n_expert_groups, cfg.n_limited_groups
  if G > 0 and cfg.num_experts % G ~= 0 then
    util.field_error(ctx, "model.n_expert_groups", string.format("n_expert_groups=%d does not divide num_experts=%d "
      .. "(node-limited routing groups the experts evenly); pick a divisor or 0", G, cfg.num_experts))
  end
  if (G == 0) ~= (L == 0) or L > G then
    util.field_error(ctx, "model.n_limited_groups", string.format("n_limited_groups=%d with n_expert_groups=%d: "
      .. "node-limited routing picks 1..n_expert_groups of the groups; set both (limited <= groups) or both 0", L, G))
  end
  cfg.router = { route_norm = cfg.route_norm or nil, groups = G > 0 and G or nil, limited = L > 0 and L or nil }
  return cfg
end

-- d: the plan's dims (the experts' FSDP placement; TP: gen/parallel/tp.lua's deepseek plan).
function ds.units(ctx, model, d)
  local cfg = ds.config(ctx, model)
  local p = moe.param_fn(model.dtype)
  local D, H = cfg.dim, cfg.n_heads
  local qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
  local sd = moe.expert_shard_dim(d, cfg.num_experts)
  local blocks = {}
  for i = 0, cfg.n_layers - 1 do
    local pre = "layers." .. i .. "."
    local a = pre .. "attention."
    -- DeepSeekV3TransformerBlock registers attention, attention_norm,
    -- ffn_norm, then the feed_forward or the moe.
    local ps = {}
    if cfg.q_lora_rank == 0 then
      ps[#ps + 1] = p(a .. "wq.weight", { H * qk, D })
    else
      ps[#ps + 1] = p(a .. "wq_a.weight", { cfg.q_lora_rank, D })
      ps[#ps + 1] = p(a .. "q_norm.weight", { cfg.q_lora_rank })
      ps[#ps + 1] = p(a .. "wq_b.weight", { H * qk, cfg.q_lora_rank })
    end
    ps[#ps + 1] = p(a .. "wkv_a.weight", { cfg.kv_lora_rank + cfg.qk_rope_head_dim, D })
    ps[#ps + 1] = p(a .. "kv_norm.weight", { cfg.kv_lora_rank })
    ps[#ps + 1] = p(a .. "wkv_b.weight", { H * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank })
    ps[#ps + 1] = p(a .. "wo.weight", { D, H * cfg.v_head_dim })
    ps[#ps + 1] = p(pre .. "attention_norm.weight", { D })
    ps[#ps + 1] = p(pre .. "ffn_norm.weight", { D })
    if i < cfg.n_dense_layers then
      fused.ffn(ps, p, pre .. "feed_forward.", cfg.dense_hidden_dim, D, cfg.fused.swiglu)
    else
      moe.moe_params(ps, pre, cfg, p, sd)
    end
    blocks[#blocks + 1] = { name = "layers." .. i, params = ps }
  end
  local units = moe.wrap(ctx, cfg, p, blocks)
  return units, { n_heads = H, num_experts = cfg.num_experts, seq_len = model.seq_len, config = cfg }
end

return ds
