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
function stages.count(ctx, o)
  local single = stages.SINGLE[o.schedule]
  local inw, outw = o.first_stage_less_layers or 1, o.last_stage_less_layers or 1
  if o.layers_per_stage == nil then
    -- "For multi-stage schedules, default is 2 virtual stages per rank"
    local per = single and 1 or 2
    return o.pp * per, per
  end
  local lps = o.layers_per_stage
  local n = (o.n_layers + inw + outw + lps - 1) // lps -- math.ceil((num_layers + in + out) / lps)
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
      (o.n_layers + inw + outw + 2 * o.pp - 1) // (2 * o.pp))
  end
  if not single and per < 2 then
    err(ctx, "pipeline.layers_per_stage", "%s: 1 stage per rank, but %s runs at least two per rank; give a "
      .. "smaller layers_per_stage", info, o.schedule)
  end
  return n, per
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
