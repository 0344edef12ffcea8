-- DeepSeek-V3-like family with torchtitan 0.3's names, order and wrapping
-- (models/deepseek_v3): multi-head latent attention, the first
-- n_dense_layers blocks with a dense FeedForward, every later block an MoE
-- of num_experts routed experts (top_k per token) beside
-- num_shared_experts shared ones (gen/models/moe.lua). Multi-token
-- prediction (model.num_mtp_layers, torchtitan's model_registry(...,
-- num_mtp_layers=n), models/deepseek_v3/__init__.py:291-316 and mtp.py): n
-- more blocks after [norm, lm_head] (ds.mtp_units), each a copy of the last
-- block with enorm, hnorm, eh_proj and mtp_norm, wrapped by fully_shard as
-- one more unit (mtp.py:281-320), and the forward-call order their forward
-- runs (ds.calls: the embedding and lm_head called once per depth more).
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

-- torchtitan's Attention.Config defaults (q_lora_rank 0: one wq); flex attention (model_registry(
-- attn_backend="flex"), models/deepseek_v3/__init__.py:616-618).
local RESOLVE = {
  label = "DeepSeek-V3", sizes = ds.CONFIGS, fields = ds.FIELDS,
  defaults = { q_lora_rank = 0, kv_lora_rank = 512, qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128,
               route_norm = false, n_expert_groups = 0, n_limited_groups = 0, num_mtp_layers = 0,
               attn_backend = "flex" },
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
  ds.check_mtp(ctx, cfg, d)
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
  ds.mtp_units(units, cfg, p, blocks[#blocks].params)
  return units, { n_heads = H, num_experts = cfg.num_experts, seq_len = model.seq_len, config = cfg,
                  attn_backend = cfg.attn_backend }
end

-- model.num_mtp_layers against the mesh: torchtitan refuses MTP under
-- pipeline and context parallelism (MTPDecoder.Config.update_from_config,
-- models/deepseek_v3/mtp.py:199-209); the units' bound (n_layers + the MTP
-- blocks + embedding, [norm, lm_head] and root).
function ds.check_mtp(ctx, cfg, d)
  local n = cfg.num_mtp_layers
  if n == 0 then return end
  for _, k in ipairs({ "pp", "cp" }) do
    if (d[k] or 1) > 1 then
      util.field_error(ctx, "model.num_mtp_layers", string.format("%d MTP layers with %s=%d: torchtitan refuses "
        .. "multi-token prediction under %s parallelism (\"MTP does not support %s parallelism yet\", "
        .. "models/deepseek_v3/mtp.py:%s); set num_mtp_layers = 0 or %s = 1", n, k, d[k],
        k == "pp" and "pipeline" or "context", k == "pp" and "pipeline" or "context",
        k == "pp" and "199-204" or "205-209", k))
    end
  end
  -- (TP plans: its MTP activations, models/deepseek_v3/sharding.py:153-192, gen/parallel/tp_acts.lua; EP: its
  -- explicit prefetch lists with the MTP blocks as model.layers keys, distributed/fsdp.py:326-365, mtp.py:295-302,
  -- gen/parallel/fsdp_schedule.lua prefetch_lists and calls_micro; held to torchtitan on gloo by
  -- tests/ep/check_ep_live.sh's dp2_tp2_mtp, dp2_tp2_nosp_mtp, dp4_ep2_mtp and dp2_tp2_ep2_mtp.)
  if cfg.n_layers + n + 3 > util.LIMITS.units then
    util.field_error(ctx, "model.num_mtp_layers", string.format("n_layers=%d + num_mtp_layers=%d + 3 units "
      .. "(embedding, [norm, lm_head], root) is more than the %d units a plan holds; use fewer layers",
      cfg.n_layers, n, util.LIMITS.units))
  end
end

-- The MTP blocks (torchtitan's _build_mtp_layers, models/deepseek_v3/
-- __init__.py:291-316: each a deep copy of the last block's attention,
-- norms and feed_forward or moe, with enorm, hnorm, eh_proj [dim, 2 dim]
-- and mtp_norm), one unit each after [norm, lm_head] (apply_fsdp_to_mtp_decoder
-- wraps them as model.layers keys, mtp.py:281-320; their names are
-- mtp_layers.<k>, the module's own), parameters in MTPTransformerBlock's
-- registration order (mtp.py:126-142): attention, attention_norm, ffn_norm,
-- enorm, hnorm, eh_proj, mtp_norm, then the moe or the feed_forward.
function ds.mtp_units(units, cfg, p, last)
  local n = cfg.num_mtp_layers
  if n == 0 then return end
  local root = table.remove(units)
  local from = "layers." .. (cfg.n_layers - 1) .. "."
  for k = 0, n - 1 do
    local pre = "mtp_layers." .. k .. "."
    local ps = {}
    for _, q in ipairs(last) do
      local c = {}
      for key, v in pairs(q) do c[key] = v end
      c.name = pre .. q.name:sub(#from + 1)
      ps[#ps + 1] = c
      if q.name == from .. "ffn_norm.weight" then
        ps[#ps + 1] = p(pre .. "enorm.weight", { cfg.dim })
        ps[#ps + 1] = p(pre .. "hnorm.weight", { cfg.dim })
        ps[#ps + 1] = p(pre .. "eh_proj.weight", { cfg.dim, 2 * cfg.dim })
        ps[#ps + 1] = p(pre .. "mtp_norm.weight", { cfg.dim })
      end
    end
    units[#units + 1] = { name = "mtp_layers." .. k, params = ps, mtp_depth = k + 1 }
  end
  root.calls = ds.calls(cfg)
  units[#units + 1] = root
end

-- MTPDecoder.forward's calls of the units (mtp.py:226-278) and the order
-- autograd then fires FSDP2's backward hooks on them (the root, without
-- parameters, has none), for gen/parallel/fsdp_schedule.lua calls_micro.
-- Forward: the embedding, the blocks, the norm (its unit's pre-forward),
-- then per depth the embedding again (the shifted tokens) and the MTP
-- block, then lm_head on the main hidden state and on each depth's.
-- torch 2.15's grouped fully_shard([norm, lm_head]) (_fsdp_state.py:705-764)
-- completes the group's post-forward at lm_head's first call, and the root's
-- _force_complete_incomplete_states (:390-405) once more after the second
-- call reopened it: two post-forward records. Its pre-forward registers the
-- post-backward hook at the norm's input and again at lm_head's second call
-- (:637-655, entering_forward_pass).
-- Backward: the loss's terms backward last depth first (autograd runs the
-- later-created nodes first): each depth's logits hook (the group's
-- pre-backward: the first proceeds, the rest find it in PRE_BACKWARD) and
-- lm_head call; after the second call the post-backward hook at its input
-- fires before lm_head.weight's gradient is accumulated (AccumulateGrad runs
-- once after every use), so it reshards alone and the main logits' hooks
-- gather the unit again; then the MTP chain last depth first (each block's
-- pre-backward, compute and post-backward, then its embedding call's
-- pre-backward and compute); the norm's backward and the group's
-- post-backward with its gradients; the blocks last to first; the
-- embedding's first call; and the final callback's post-backward of the
-- embedding (its inputs are token ids: no post-backward hook of its own).
-- Measured on gloo with 1 and 2 depths (tests/titan/test_mtp.py).
function ds.calls(cfg)
  local n, L = cfg.num_mtp_layers, cfg.n_layers
  local fwd, bwd = {}, {}
  -- (part: the call's parameters of the unit, {first, count}: the norm's and lm_head's of [norm, lm_head])
  local function f(ev, unit, part) fwd[#fwd + 1] = { ev = ev, unit = unit, part = part } end
  local function b(ev, unit, grads, part, writes)
    bwd[#bwd + 1] = { ev = ev, unit = unit, grads = grads, part = part, writes = writes }
  end
  local function block(name) f("pre", name); f("fwd", name); f("post", name) end
  local E, H, NORM, LM = "tok_embeddings", "norm_lm_head", { 0, 1 }, { 1, 1 }
  block(E)
  for i = 0, L - 1 do block("layers." .. i) end
  f("pre", H); f("fwd", H, NORM)
  for k = 0, n - 1 do block(E); block("mtp_layers." .. k) end
  f("fwd", H, LM); f("post", H)
  for _ = 1, n do f("pre", H); f("fwd", H, LM) end
  f("post", H)
  for k = n, 1, -1 do
    b("pre", H); b("bwd", H, nil, LM)
    if k == 1 then b("post", H, false) end
  end
  -- the main logits' lm_head call: lm_head.weight's last use in backward, where its gradient is written
  b("pre", H); b("pre", H); b("bwd", H, nil, LM, true)
  for k = n - 1, 0, -1 do
    local name = "mtp_layers." .. k
    b("pre", name); b("bwd", name); b("post", name, true)
    b("pre", E); b("bwd", E)
  end
  b("bwd", H, nil, NORM); b("post", H, true)
  for i = L - 1, 0, -1 do
    local name = "layers." .. i
    b("pre", name); b("bwd", name); b("post", name, true)
  end
  b("pre", E); b("bwd", E); b("final")
  return { forward = fwd, backward = bwd }
end

return ds
