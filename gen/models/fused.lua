-- torchtitan 0.3's fused layouts (its opt-in model overrides,
-- torchtitan/overrides/, activated by the job config's override.imports):
-- model.fused = { "swiglu", "grouped_experts", "mla" }, each named after its
-- @override factory. What each changes in a plan:
--
-- "swiglu" (overrides/fused_swiglu.py fused_swiglu, :486-505): every
--   FeedForward (a dense block's feed_forward, DeepSeek-V3's dense blocks'
--   and its shared experts) holds one parameter w13 of shape
--   [hidden, 2, dim] instead of w1.weight and w3.weight ([hidden, dim]
--   each; FusedSwiGLU.__init__, :445-451: w13[:, 0] the gate, w13[:, 1] the
--   up). The module's own w13 follows its child's w2.weight in FSDP2's
--   post-order walk, so the unit's order is ..., w2.weight, w13, ... . TP
--   shards w13 Shard(0) (:500-503, dense_param_placement(tp=S(0))): the
--   explicit 2 axis gives each TP rank matching gate and up rows (:33-42),
--   so no per-rank interleaving is needed; FSDP shards dim 0 (hidden) as it
--   did w1 and w3. Same numel, same FLOPs, same padding per rank
--   (ceil(hidden / n) rows of 2 x dim).
-- "grouped_experts" (fused_swiglu.py fused_grouped_experts, :613-631):
--   the routed experts (GroupedExperts.Config exactly, :623) hold w2_EDF
--   then w13 [E, F, 2, D] (FusedGroupedExperts.__init__, :528-536) instead
--   of w1_EFD, w2_EDF, w3_EFD; w13 takes w1_EFD's placements (EP dim 0, TP
--   dim 1: _fuse_w13_grouped_experts_sharding, :599-610) and its FSDP dim.
-- "mla" (overrides/fused_mla.py fused_mla, :900-905): FusedMLAAttention
--   keeps the stock Attention parameters and state-dict layout (:52-58;
--   it changes the Q/K RoPE kernels only): no parameter, placement or
--   collective changes, which the live check shows.
--
-- A fused layout the family has nothing to fuse in is refused: torchtitan
-- applies no replacement and warns (config/override.py:503-512).
local util = require("gen.util")

local fused = {}

fused.NAMES = { "swiglu", "grouped_experts", "mla" }
-- torchtitan's override.imports target of each
fused.TARGETS = {
  swiglu = "torchtitan.overrides.fused_swiglu.fused_swiglu",
  grouped_experts = "torchtitan.overrides.fused_swiglu.fused_grouped_experts",
  mla = "torchtitan.overrides.fused_mla.fused_mla",
}
-- Which layouts each family has something to fuse in (llama, qwen3: a
-- dense FeedForward per block; mixtral, qwen3_moe: routed experts only;
-- deepseek_v3: dense blocks' and shared experts' FeedForward, routed
-- experts, MLA attention).
local HAS = {
  llama = { swiglu = true }, qwen3 = { swiglu = true },
  mixtral = { grouped_experts = true }, qwen3_moe = { grouped_experts = true },
  deepseek_v3 = { swiglu = true, grouped_experts = true, mla = true },
}

-- model.fused -> the set { swiglu = true, ... }; refuses an unknown name,
-- a repeated one (torchtitan: "named by two entries", override.py:361-364)
-- and one the family has nothing to fuse in.
function fused.read(ctx, model)
  local set = {}
  if model.fused == nil then return set end
  for i, v in ipairs(model.fused) do
    local path = string.format("model.fused[%d]", i)
    if type(v) ~= "string" or not fused.TARGETS[v] then
      local hint = type(v) == "string" and util.did_you_mean(v, fused.NAMES)
      util.field_error(ctx, path, string.format("%s is not a torchtitan fused layout; use %s%s", util.show(v),
        table.concat(fused.NAMES, " | "), hint and ("; did you mean \"" .. hint .. "\"?") or ""))
    end
    if set[v] then
      util.field_error(ctx, path, string.format("\"%s\" given twice (torchtitan refuses an override named by two "
        .. "entries, config/override.py:361-364); list it once", v))
    end
    if not (HAS[model.family] or {})[v] then
      util.field_error(ctx, path, string.format("the %s family has nothing %s fuses (torchtitan applies no "
        .. "replacement and warns, config/override.py:503-512); remove \"%s\"", model.family, fused.TARGETS[v], v))
    end
    set[v] = true
  end
  return set
end

-- A FeedForward's parameters (prefix ff, e.g. "layers.3.feed_forward."),
-- hidden F, dim D, appended to ps: stock w1, w2, w3 or fused w2, w13.
function fused.ffn(ps, p, ff, F, D, on)
  if on then
    ps[#ps + 1] = p(ff .. "w2.weight", { D, F })
    ps[#ps + 1] = p(ff .. "w13", { F, 2, D })
  else
    ps[#ps + 1] = p(ff .. "w1.weight", { F, D })
    ps[#ps + 1] = p(ff .. "w2.weight", { D, F })
    ps[#ps + 1] = p(ff .. "w3.weight", { F, D })
  end
end

-- The routed experts' grouped weights (prefix ex), E experts of hidden F,
-- dim D, FSDP dim sd: stock w1_EFD, w2_EDF, w3_EFD or fused w2_EDF, w13.
function fused.experts(ps, p, ex, E, F, D, sd, on)
  if on then
    ps[#ps + 1] = p(ex .. "w2_EDF", { E, D, F }, sd)
    ps[#ps + 1] = p(ex .. "w13", { E, F, 2, D }, sd)
  else
    ps[#ps + 1] = p(ex .. "w1_EFD", { E, F, D }, sd)
    ps[#ps + 1] = p(ex .. "w2_EDF", { E, D, F }, sd)
    ps[#ps + 1] = p(ex .. "w3_EFD", { E, F, D }, sd)
  end
end

return fused
