-- tests/pp/compare_csv.lua PLAN.lua TORCH.json: the schedule CSV that
-- `gen/verbs.lua pipeline PLAN --csv` writes, loaded and lowered by torch
-- itself (tests/pp/torch_load_csv.py's JSON), equals the lowered lists
-- commplan derived and proved for the plan. Exits 1 on the first difference.
package.path = "./?.lua;" .. package.path
local json = require("gen.json")
local load = require("gen.load")
local stages = require("gen.parallel.pp_stages")
local pps = require("gen.parallel.pp_schedule")
local models = require("gen.models.llama")

local plan_path, torch_path = arg[1], arg[2]
local loaded = load.source(assert(io.open(plan_path)):read("a"), plan_path)
local pl = loaded.pipeline
local cfg = models.config(nil, loaded.model)
local _, per = stages.count(nil, { pp = loaded.parallel.pp, schedule = pl.schedule, n_layers = cfg.n_layers,
  layers_per_stage = pl.layers_per_stage, first_stage_less_layers = pl.first_stage_less_layers,
  last_stage_less_layers = pl.last_stage_less_layers })
local mine = pps.derive({ schedule = pl.schedule, pp = loaded.parallel.pp, microbatches = pl.microbatches,
                          stages_per_rank = per })
local theirs = json.decode(assert(io.open(torch_path)):read("a")).lowered
local n = 0
for r = 0, loaded.parallel.pp - 1 do
  local a, b = mine.lowered[r + 1], theirs[tostring(r)]
  for i = 1, math.max(#a, #b) do
    local x, y = a[i] and pps.format_action(a[i]) or "(end)", b[i] or "(end)"
    if x ~= y then
      print(string.format("csv: DIFF %s rank %d action %d: commplan %s, torch's lowering of the CSV %s", plan_path, r,
        i - 1, x, y))
      os.exit(1)
    end
    n = n + 1
  end
end
print(string.format("csv: %s %s pp=%d microbatches=%d: torch loads the CSV and lowers it to commplan's %d actions",
  plan_path:match("[^/]+$"), pl.schedule, loaded.parallel.pp, pl.microbatches, n))
