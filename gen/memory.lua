-- Whole-rank memory: what one GPU holds at the step's peak, and the
-- verdict against the plan's GPU memory.
--   params      the sharded parameters (padded chunks, orig dtype: FSDP2
--               keeps them as the optimizer's weights)
--   grads       the sharded gradients (orig dtype)
--   optimizer   AdamW: exp_avg and exp_avg_sq in the parameter's dtype
--               (torch.optim.AdamW), plus an fp32 master copy when
--               training.fp32_master is set; SGD (no momentum) and none: 0
--   comm        the memory plan's arena (every all-gather, unsharded and
--               reduce-scatter buffer at its generated offset)
--   activations gen/compute.lua's peak of one micro-step
-- fully_shard's ignored_params count whole in params, grads and optimizer.
-- A tied qwen3 model's lm_head.weight shares tok_embeddings.weight's
-- sharded tensor once the trainer re-ties them (gen/models/qwen3.lua): its
-- shard is counted once in params, grads and optimizer; both are gathered
-- and reduced (the arena has both).
local util = require("gen.util")
local compute = require("gen.compute")

local memory = {}

local ES = util.DTYPE_BYTES

-- Everything but the arena: the sharded state and the activations.
local function state(p, s, per_unit)
  local params = 0
  local sharded_numel = 0
  local tied = p.model and p.model.family == "qwen3" and p.model_config and p.model_config.enable_weight_tying
  for _, u in ipairs(p.layout.units) do
    local total = u.total
    if tied then
      for _, q in ipairs(u.params) do
        if q.name == "lm_head.weight" then total = total - q.padded end
      end
    end
    params = params + total * ES[u.orig_dtype]
    sharded_numel = sharded_numel + total
    -- fully_shard's ignored_params: whole on every rank, their grads and optimizer state too
    for _, q in ipairs(u.ignored or {}) do
      params = params + q.numel * ES[q.dtype]
      sharded_numel = sharded_numel + q.numel
    end
  end
  local optimizer = 0
  if s.optimizer == "adamw" then
    optimizer = 2 * params
    if s.fp32_master then optimizer = optimizer + 4 * sharded_numel end
  end
  local act, saved, transient = compute.activation_peak(per_unit)
  return params, optimizer, act, saved, transient
end

-- The bytes the GPU leaves for the arena once the sharded state and the
-- activations are counted (the memory plan's budget, gen/memplan.lua):
-- the verdict's free memory with an empty arena. Negative when even that
-- does not fit.
function memory.arena_room(p, s, per_unit)
  local params, optimizer, act = state(p, s, per_unit)
  return s.gpu_memory_bytes - (params + params + optimizer + act)
end

function memory.whole_rank(p, s, per_unit)
  local params, optimizer, act, saved, transient = state(p, s, per_unit)
  local r = {
    params_bytes = params, grads_bytes = params, optimizer_bytes = optimizer,
    comm_bytes = p.memory.arena_bytes, activation_bytes = act, activation_saved_bytes = saved,
    activation_transient_bytes = transient, gpu_bytes = s.gpu_memory_bytes,
  }
  r.total_bytes = params + params + optimizer + r.comm_bytes + act
  r.fits = r.total_bytes <= r.gpu_bytes
  r.activations_modeled = compute.activations_modeled(p)
  return r
end

return memory
