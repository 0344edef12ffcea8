-- Pipeline stages as torchtitan 0.3 splits a decoder
-- (torchtitan/distributed/pipeline_parallel.py): how many stages
-- (_get_pipeline_metadata), which modules each holds
-- (_generate_llm_fqn_per_model_part), and which stages each PP rank runs
-- (_get_pp_rank_to_stage_indices_mapping). Pure functions; errors are
-- plan errors naming the plan field and the fix, one per torchtitan check.
local util = require("gen.util")

local stages = {}

-- torch.distributed.pipelining's PipelineScheduleSingle subclasses: one
-- stage per rank. The others are multi-stage (2 or more per rank).
stages.SINGLE = { GPipe = true, ["1F1B"] = true }
-- V-shaped schedules: rank r holds stages r and S-1-r.
stages.V_STYLE = { ZBVZeroBubble = true, DualPipeV = true }

-- "1 stage", "2 stages"
local function count_of(n, word) return string.format("%d %s%s", n, word, n == 1 and "" or "s") end

local function err(ctx, field, fmt, ...)
  util.field_error(ctx, field, string.format(fmt, ...))
end

-- o: { pp, schedule, n_layers, layers_per_stage (nil: torchtitan's
-- default), first_stage_less_layers (input_weight, default 1),
-- last_stage_less_layers (output_weight, default 1) } -> number of stages,
-- stages per rank (_get_pipeline_metadata).
-- The stage count alone, unchecked (check_size bounds it before count's
-- refusals, which depend on the schedule).
function stages.stage_count(o)
  local inw, outw = o.first_stage_less_layers or 1, o.last_stage_less_layers or 1
  -- "For multi-stage schedules, default is 2 virtual stages per rank"
  if o.layers_per_stage == nil then return o.pp * (stages.SINGLE[o.schedule] and 1 or 2) end
  return (o.n_layers + inw + outw + o.layers_per_stage - 1) // o.layers_per_stage -- math.ceil((num_layers + in + out) / lps)
end

function stages.count(ctx, o)
  local single = stages.SINGLE[o.schedule]
  if o.layers_per_stage == nil then
    local n = stages.stage_count(o)
    return n, n // o.pp
  end
  local lps = o.layers_per_stage
  local n = stages.stage_count(o)
  local info = string.format("%s at layers_per_stage=%d give %s over pp=%d", count_of(o.n_layers, "layer"), lps,
    count_of(n, "stage"), o.pp)
  if n % o.pp ~= 0 then
    err(ctx, "pipeline.layers_per_stage", "%s, not a multiple of pp (torchtitan refuses it); give layers_per_stage "
      .. "a value whose stage count is a multiple of %d", info, o.pp)
  end
  local per = n // o.pp
  if single and per ~= 1 then
    err(ctx, "pipeline.layers_per_stage", "%s: %s per rank, but %s runs exactly one per rank; give "
      .. "layers_per_stage %d or more", info, count_of(per, "stage"), o.schedule, o.n_layers // o.pp)
  end
  if stages.V_STYLE[o.schedule] and per ~= 2 then
    err(ctx, "pipeline.layers_per_stage", "%s: %s per rank, but %s's V runs exactly two per rank; give "
      .. "layers_per_stage %d", info, count_of(per, "stage"), o.schedule,
      (stages.stage_count({ n_layers = o.n_layers, layers_per_stage = 1, first_stage_less_layers = o.first_stage_less_layers,
        last_stage_less_layers = o.last_stage_less_layers }) + 2 * o.pp - 1) // (2 * o.pp))
  end
  if not single and per < 2 then
    err(ctx, "pipeline.layers_per_stage", "%s: 1 stage per rank, but %s runs at least two per rank; give a "
      .. "smaller layers_per_stage", info, o.schedule)
  end
  return n, per
end

-- The pipeline's size, bounded before any of its work starts
-- (util.LIMITS.pp_actions, pp_events; docs/plan-files.md, "Numbers"):
-- o = { microbatches, num_stages (the most any schedule class gives:
-- make pipeline's audit, in SCHEDULE.md, plans them all), dp (dp_replicate x dp_shard x cp: the
-- data-parallel copies of the pipeline the whole-step proof runs), units }.
-- Each rank's tables, its memory plan and the lowering grow with
-- microbatches x stages; the proof's events with that and the units, once
-- per copy.
function stages.check_size(ctx, o)
  local LIM = util.LIMITS
  local actions = util.mul_within(o.microbatches, o.num_stages, LIM.pp_actions)
  if not actions then
    err(ctx, "pipeline.microbatches", "%d microbatches x %s (the most a schedule class splits this model into: "
      .. "the generator plans every class for the audit) is more than %s microbatch-stages, the most it plans "
      .. "(each rank's tables and memory plan grow with them); use at most %d microbatches, or fewer stages "
      .. "(pipeline.layers_per_stage, parallel.pp)", o.microbatches, count_of(o.num_stages, "stage"),
      util.pow2_text(LIM.pp_actions), math.max(1, LIM.pp_actions // o.num_stages))
  end
  local per_copy = util.add_within(actions, o.units, LIM.pp_events)
  local events = per_copy and util.mul_within(o.dp, per_copy, LIM.pp_events)
  if not events then
    err(ctx, o.dp > 1 and "parallel.dp_shard" or "model.n_layers", "%d data-parallel copies of the pipeline x (%d "
      .. "microbatch-stages + %d units) is more than %s, the most the whole-step proof covers (it checks every "
      .. "rank of pp x dp_replicate x dp_shard); use fewer data-parallel ranks (a smaller world_size or a larger "
      .. "tp), fewer microbatches or fewer layers", o.dp, actions, o.units, util.pow2_text(LIM.pp_events))
  end
  return actions, events
end

-- Each stage's modules, torchtitan's names: "tok_embeddings",
-- "layers.<i>", "norm", "lm_head" (_generate_llm_fqn_per_model_part).
function stages.split(ctx, n, n_layers, inw, outw)
  inw, outw = inw or 1, outw or 1
  if n < 1 then err(ctx, "parallel.pp", "%d stages: give pp >= 1", n) end
  if n == 1 then
    local all = { "tok_embeddings" }
    for i = 0, n_layers - 1 do all[#all + 1] = "layers." .. i end
    all[#all + 1] = "norm"
    all[#all + 1] = "lm_head"
    return { all }
  end
  local effective = n_layers + inw + outw
  if n > effective then
    err(ctx, "parallel.pp", "%d stages for %d effective layers (%d layers + %d + %d for the embeddings and the "
      .. "output): torchtitan refuses more stages than that; lower pp or layers_per_stage", n, effective, n_layers,
      inw, outw)
  end
  local per, extra = effective // n, effective % n
  if inw > per then
    err(ctx, "pipeline.first_stage_less_layers", "%d exceeds the fewest layers a stage gets (%d); lower it", inw, per)
  end
  if outw > per then
    err(ctx, "pipeline.last_stage_less_layers", "%d exceeds the fewest layers a stage gets (%d); lower it", outw, per)
  end
  local out, layer = {}, 0
  for s = 0, n - 1 do
    local mods = {}
    local take = per + (s < extra and 1 or 0)
    if s == 0 then
      mods[1] = "tok_embeddings"
      take = take - inw
    elseif s == n - 1 then
      take = take - outw
    end
    for _ = 1, take do
      if layer < n_layers then
        mods[#mods + 1] = "layers." .. layer
        layer = layer + 1
      end
    end
    if s == n - 1 then
      mods[#mods + 1] = "norm"
      mods[#mods + 1] = "lm_head"
    end
    out[s + 1] = mods
  end
  return out
end

-- The stages PP rank r runs, in order (_get_pp_rank_to_stage_indices_mapping).
function stages.of_rank(r, pp, n, schedule)
  local per = n // pp
  if stages.V_STYLE[schedule] then return { r, n - 1 - r } end
  local out = {}
  for s = 0, per - 1 do out[#out + 1] = r + s * pp end
  return out
end

return stages
