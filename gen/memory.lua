-- Whole-rank memory: what one GPU holds at the step's peak, and the
-- verdict against the plan's GPU memory.
--   params      the sharded parameters (padded chunks, orig dtype: FSDP2
--               keeps them as the optimizer's weights)
--   grads       the sharded gradients (orig dtype)
--   optimizer   AdamW: exp_avg and exp_avg_sq in the parameter's dtype
--               (torch.optim.AdamW) or bf16 (training.optimizer_implementation
--               = "fused_opt_states_bf16": gen/compute.lua optimizer_state_bytes),
--               plus an fp32 master copy when
--               training.fp32_master is set; SGD (no momentum) and none: 0
--   comm        the memory plan's arena (every all-gather, unsharded and
--               reduce-scatter buffer at its generated offset)
--   activations gen/compute.lua's peak of one micro-step
-- fully_shard's ignored_params count whole in params, grads and optimizer.
-- Frozen parameters (requires_grad=False) count in params alone: FSDP2
-- reduces no gradient of them and the optimizer keeps no state for a
-- parameter that never has a gradient (torch.optim initialises state
-- lazily, on a parameter's first step with a .grad).
-- CPU offload (a unit's u.offload, CPUOffloadPolicy): its sharded
-- parameters, gradients and optimizer state live in host memory (torch
-- 2.15 _fsdp_api.py:239-255: "the optimizer step runs on CPU with CPU
-- optimizer states"), so they leave the GPU's figures for host_bytes; the
-- parameters and gradients are pinned where pin_memory
-- (_fsdp_param.py:362-365; the D2H's non_blocking copy lands in pinned
-- memory), the optimizer's state is not (torch.optim allocates it with
-- zeros_like): host_pinned_bytes. The device copies the H2D and D2H use are
-- arena buffers (gen/memplan.lua h2d, d2h).
-- A tied qwen3 model's lm_head.weight shares tok_embeddings.weight's
-- sharded tensor once the trainer re-ties them (gen/models/qwen3.lua): its
-- shard is counted once in params, grads and optimizer; both are gathered
-- and reduced (the arena has both).
local util = require("gen.util")
local compute = require("gen.compute")

local memory = {}

local ES = util.DTYPE_BYTES

-- One unit's sharded state in bytes: parameters, and the optimizer's for
-- `trainable` of them (default: all), for `total` elements per rank.
function memory.unit_state(u, s, total, trainable)
  trainable = trainable or total
  local params = total * ES[u.orig_dtype]
  return params, compute.optimizer_state_bytes(s, trainable * ES[u.orig_dtype], trainable)
end

-- The host's share (CPU offload): bytes in all, and pinned.
local function host_state(p, s)
  local bytes, pinned = 0, 0
  for _, u in ipairs(p.layout.units) do
    if u.offload then
      -- (the sharded grads: the trainable parameters' shards, u.rs_total)
      local params, optimizer = memory.unit_state(u, s, u.total, u.rs_total)
      local grads = u.rs_total * ES[u.orig_dtype]
      bytes = bytes + params + grads + optimizer
      if u.pin_memory then pinned = pinned + params + grads end
    end
  end
  return bytes, pinned
end
memory.host_state = host_state

-- Everything but the arena: the device's sharded state and the activations.
local function state(p, s, per_unit)
  local params, grads = 0, 0
  local sharded_numel = 0 -- (the trainable ones: the optimizer's)
  local tied = p.model and p.model.family == "qwen3" and p.model_config and p.model_config.enable_weight_tying
  for _, u in ipairs(p.layout.units) do
    local total, trainable = u.total, u.rs_total
    if tied then
      for _, q in ipairs(u.params) do
        if q.name == "lm_head.weight" then
          total = total - q.padded
          if not q.frozen then trainable = trainable - q.padded end
        end
      end
    end
    if not u.offload then
      params = params + total * ES[u.orig_dtype]
      grads = grads + trainable * ES[u.orig_dtype]
      sharded_numel = sharded_numel + trainable
    end
    -- fully_shard's ignored_params: whole on every rank (FSDP2 does not manage them, so no
    -- offload either), their grads and optimizer state too
    for _, q in ipairs(u.ignored or {}) do
      params = params + q.numel * ES[q.dtype]
      grads = grads + q.numel * ES[q.dtype]
      sharded_numel = sharded_numel + q.numel
    end
  end
  -- (exp_avg, exp_avg_sq: a gradient's bytes each, trainable parameters only; bf16 moments under
  -- torchtitan's fused_opt_states_bf16)
  local optimizer = compute.optimizer_state_bytes(s, grads, sharded_numel)
  local act, saved, transient = compute.activation_peak(per_unit)
  return params, grads, optimizer, act, saved, transient
end

-- The bytes the GPU leaves for the arena once the sharded state and the
-- activations are counted (the memory plan's budget, gen/memplan.lua):
-- the verdict's free memory with an empty arena. Negative when even that
-- does not fit.
function memory.arena_room(p, s, per_unit)
  local params, grads, optimizer, act = state(p, s, per_unit)
  return s.gpu_memory_bytes - (params + grads + optimizer + act)
end

function memory.whole_rank(p, s, per_unit)
  local params, grads, optimizer, act, saved, transient = state(p, s, per_unit)
  local r = {
    params_bytes = params, grads_bytes = grads, optimizer_bytes = optimizer,
    comm_bytes = p.memory.arena_bytes, activation_bytes = act, activation_saved_bytes = saved,
    activation_transient_bytes = transient, gpu_bytes = s.gpu_memory_bytes,
  }
  r.total_bytes = params + grads + optimizer + r.comm_bytes + act
  r.host_bytes, r.host_pinned_bytes = host_state(p, s)
  r.fits = r.total_bytes <= r.gpu_bytes
  r.activations_modeled = compute.activations_modeled(p)
  return r
end

return memory
