-- FSDP2 and HSDP, the module (gen/parallel/init.lua's contract):
-- fully_shard on every unit, over the dp_shard group (fsdp) and, with
-- dp_replicate > 1, HSDP's replicate group. It owns the parameters'
-- storage (each unit's fused buffers: fsdp_layout.lua), orders the step
-- (FSDP2's issue order: fsdp_schedule.lua, which inserts the other
-- modules' unit ops) and proves both (gen/verify.lua's coverage and
-- schedule proofs). Every commplan plan uses it: a shard group of one rank
-- is still fully_shard (FSDP2's world-size-1 path), as DDP-like plans
-- (dp_shard = 1, dp_replicate > 1) are HSDP with one-rank shard groups.
-- fully_shard(reshard_after_forward=k) with an int k adds a family of its
-- own, k consecutive members of each shard group (fsdp.families), over
-- which backward all-gathers the slice the forward kept (fsdp_layout.lua
-- post_forward, fsdp_schedule.lua gather / forward_reshard).
local layout = require("gen.parallel.fsdp_layout")
local schedule = require("gen.parallel.fsdp_schedule")
local verify = require("gen.verify")
local util = require("gen.util")
local groups = require("gen.groups")

local fsdp = {
  name = "fsdp", label = "FSDP/HSDP", dims = { "dp_shard", "dp_replicate" },
  groups = { "fsdp", "dp_replicate" },
}

function fsdp.used() return true end

-- The audit's mesh line (parallel.mesh_kind): FSDP shards over dp_shard x
-- cp, HSDP adds replicas over dp_replicate; replicas alone are
-- "replicate"; nothing sharded or replicated names nothing.
function fsdp.mesh_label(d)
  local shard, rep = d.dp_shard * (d.cp or 1), d.dp_replicate
  if shard > 1 then return rep > 1 and "HSDP" or "FSDP" end
  return rep > 1 and "replicate" or nil
end

-- The decoder families torchtitan 0.3 trains with ChunkedLossWrapper
-- (Trainer.__init__: training.loss_chunks, 8 by default, for llama3 and
-- deepseek_v3; the MoE families share its Decoder and [norm, lm_head]
-- wrapping, gen/models/moe.lua). A generic model's loss is the user's own
-- (a plan of whatever units): CrossEntropyLoss's order, unless one of its
-- units says loss_head (torchtitan's [norm, lm_head], as commplan.titan's
-- plan_from_titan writes it for a model trained with ChunkedLossWrapper,
-- which the python bridge drives: python/commplan/chunked_loss.py).
local CHUNKED_FAMILIES = { llama = true, mixtral = true, qwen3_moe = true, deepseek_v3 = true, gpt_oss = true }

local function has_loss_head(model)
  for _, u in ipairs(model.family == "generic" and model.units or {}) do
    if u.loss_head then return true end
  end
  return false
end

-- The loss's chunks when the step follows ChunkedLossWrapper's order
-- (gen/parallel/fsdp_schedule.lua), else nil: training.loss_chunks (8 by
-- default, gen/compute.lua) >= 2 on those families. Not with ep > 1: its
-- explicit prefetching (lm_head prefetches the last block in backward) in
-- the loss's chunks is not measured, so those plans keep CrossEntropyLoss's
-- order (a pipeline plan too: gen/parallel/pp_tables.lua builds its own,
-- and its stage mesh's plan, gen/parallel/pp_report.lua, says
-- stage_of_pipeline; and step_end, torch.distributed.pipelining's
-- accumulation, which a pipeline's stage runs).
function fsdp.chunked_loss(p, d)
  if not (CHUNKED_FAMILIES[p.model.family] or has_loss_head(p.model)) or (d and d.ep > 1) or p.stage_of_pipeline
    or p.fsdp.grad_accumulation == "step_end" then
    return nil
  end
  local n = p.training and p.training.loss_chunks or 8
  return n >= 2 and n or nil
end

-- ChunkedLossWrapper reduces the [norm, lm_head] unit in two parts per
-- micro-step; HSDP's set_requires_all_reduce(False) would keep partial sums
-- of parameter subsets (torch 2.15 repacks them per parameter), which the
-- tables do not model: refused rather than planned in the wrong order.
function fsdp.rules(ctx, d, p)
  -- reshard_after_forward as an int (fully_shard's, gen/parallel/fsdp_layout.lua post_forward) is the
  -- user's own fully_shard call: torchtitan 0.3 takes fsdp_reshard_after_forward as "default" / "always" /
  -- "never" (config/configs.py:136) and resolves it to a bool (distributed/fsdp.py:54-78)
  if p.model.family ~= "generic" and math.type(p.fsdp.reshard_after_forward) == "integer" then
    util.field_error(ctx, "fsdp.reshard_after_forward", string.format("%d: torchtitan 0.3 passes fully_shard a "
      .. "bool (its fsdp_reshard_after_forward policy, config/configs.py:136 and distributed/fsdp.py:54-78), and "
      .. "under its spmd_types mesh FSDP2 refuses an int (torch 2.15 _fully_shard.py:261-270): use true or false, "
      .. "or family = \"generic\" for your own fully_shard calls", p.fsdp.reshard_after_forward))
  end
  -- a generic unit's own grad_accumulation (gen/parallel/fsdp_layout.lua unit_accumulation)
  for i, u in ipairs(p.model.family == "generic" and p.model.units or {}) do
    local path = string.format("model.units[%d].grad_accumulation", i)
    if u.grad_accumulation and (p.fsdp.grad_accumulation == "step_end" or d.pp > 1) then
      util.field_error(ctx, path, "torch.distributed.pipelining's stage reduces every unit once after its last "
        .. "backward (fsdp.grad_accumulation = \"step_end\", stage.py perform_reduce_grad), whatever a unit set: "
        .. "remove it")
    end
    if u.grad_accumulation and u.loss_head and fsdp.chunked_loss(p, d) then
      util.field_error(ctx, path, "torchtitan's ChunkedLossWrapper sets this unit's gradient sync itself "
        .. "(components/loss.py:731-771: off for all chunks but the last, every micro-step): remove it")
    end
    if u.grad_accumulation == "all_reduce_last" and d.dp_replicate == 1 then
      util.field_error(ctx, path, "set_requires_all_reduce acts on HSDP's replicate all-reduce, and dp_replicate "
        .. "is 1 (FSDP2 ignores it): remove it or use \"sync_last\"")
    end
  end
  if p.fsdp.grad_accumulation == "all_reduce_last" and d.dp_replicate > 1 and p.fsdp.micro_steps > 1
    and d.pp == 1 and fsdp.chunked_loss(p, d) then
    util.field_error(ctx, "fsdp.grad_accumulation", string.format("all_reduce_last with torchtitan's "
      .. "ChunkedLossWrapper (training.loss_chunks = %d) reduces the [norm, lm_head] unit in two parts, whose "
      .. "partial sums commplan does not model; set training.loss_chunks = 1 (CrossEntropyLoss) or another "
      .. "grad_accumulation", fsdp.chunked_loss(p, d)))
  end
  -- torchtitan refuses enable_fsdp_symm_mem below compute capability 9.0 (config/configs.py:267-278)
  if p.fsdp.symm_mem and p.topology.preset == "a100" then
    util.field_error(ctx, "fsdp.symm_mem", "torchtitan allows parallelism.enable_fsdp_symm_mem on NVIDIA GPUs of "
      .. "compute capability 9.0 or newer only (config/configs.py:267-278), and topology.preset is \"a100\" (8.0): "
      .. "remove it or pick an H100, H200 or B200 preset")
  end
end

-- The post-forward groups its units' int reshard_after_forward k needs
-- (1 < k < S: gen/parallel/fsdp_layout.lua post_forward): a part family of
-- k consecutive members of each shard group (gen/groups.lua add_part),
-- named by layout.pf_family. The root never reshards after forward; an
-- invalid k is the layout's refusal.
function fsdp.families(fams, units, _, p)
  local shard = fams.by_name.fsdp
  for i = 1, #units - 1 do
    local u = units[i]
    local k = u.reshard_after_forward
    if k == nil then k = p.fsdp.reshard_after_forward end
    if shard and not u.expert and math.type(k) == "integer" and k > 1 and k < shard.size and shard.size % k == 0 then
      groups.add_part(fams, "fsdp", k, layout.pf_family(k))
    end
  end
end

-- TP-local units (or the model's, without a module that splits them) -> the class's layout.
-- The model's input carries no gradient (token ids; a generic model's
-- model.input_requires_grad = false): a leading run of all-frozen units
-- runs no pre-backward (layout.frozen_prefix).
function fsdp.buffers(ctx, units, d, p)
  local lay = layout.build(ctx, units, d, p.fsdp)
  local n = layout.frozen_prefix(lay.units, p.model.family == "generic" and p.model.input_requires_grad ~= false)
  if n > 0 and p.fsdp.grad_accumulation == "step_end" then
    -- (measured on gloo, tests/live/live.py seed 315: FSDP2 runs the manual finalization's
    -- final callback without finalize_backward, _fsdp_state.py:453-459, so the prefetch's pending
    -- all-gather carries into the next micro-step, which this schedule does not follow)
    util.field_error(ctx, "model.input_requires_grad", string.format("false leaves %d leading all-frozen unit(s) "
      .. "without a pre-backward, and under fsdp.grad_accumulation = \"step_end\" FSDP2 carries their prefetched "
      .. "all-gather into the next micro-step (no finalize_backward until the step's end, torch 2.15 "
      .. "_fsdp_state.py:453-459), an order not derived here; use another grad_accumulation, or leave the first "
      .. "unit a trainable parameter", n))
  end
  return lay
end

-- The step's op list; opts.unit_ops inserts the other modules' ops at
-- each unit's compute and post-backward (fsdp_schedule.lua).
function fsdp.step(lay, fams, p, opts)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.chunked_loss = fsdp.chunked_loss(p, o.dims)
  return schedule.build(lay, fams, p.fsdp, o)
end

function fsdp.prove_class(lay, ops, p, rep)
  verify.coverage(lay)
  verify.schedule(lay, ops, p.fsdp, rep)
end

return fsdp
