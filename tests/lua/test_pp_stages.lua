-- gen/parallel/pp_stages.lua: torchtitan 0.3's stage split, cases taken
-- from tests/pp/titan_stages.py's dump (tests/pp/check_live.sh compares
-- the whole matrix live).
local H = require("helpers")
local stages = require("gen.parallel.pp_stages")
local util = require("gen.util")
local T = {}

local function split(schedule, pp, n_layers, lps, inw, outw)
  local n, per = stages.count(nil, { pp = pp, schedule = schedule, n_layers = n_layers, layers_per_stage = lps,
                                     first_stage_less_layers = inw, last_stage_less_layers = outw })
  local s = stages.split(nil, n, n_layers, inw, outw)
  local sizes = {}
  for i, m in ipairs(s) do sizes[i] = #m end
  return n, per, s, sizes
end

function T.stage_counts_and_modules_as_torchtitan()
  local n, per, s, sizes = split("1F1B", 4, 16, nil, 1, 1)
  H.eq(n, 4, "1F1B pp 4 stages"); H.eq(per, 1, "per rank")
  H.list_eq(sizes, { 5, 5, 4, 5 }, "1F1B modules per stage")
  H.list_eq(s[1], { "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3" }, "first stage")
  H.list_eq(s[4], { "layers.13", "layers.14", "layers.15", "norm", "lm_head" }, "last stage")
  local _
  n, per, _, sizes = split("Interleaved1F1B", 8, 126, nil, 1, 1)
  H.eq(n, 16, "405B layers interleaved over 8 ranks"); H.eq(per, 2, "per rank")
  H.list_eq(sizes, { 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9 }, "modules per stage")
  H.list_eq(stages.of_rank(3, 8, 16, "Interleaved1F1B"), { 3, 11 }, "looped stages of rank 3")
  n, _, _, sizes = split("LoopedBFS", 2, 16, 4, 2, 3)
  H.eq(n, 6, "LoopedBFS at 4 layers per stage, weights 2 and 3")
  H.list_eq(sizes, { 3, 4, 4, 3, 3, 2 }, "weighted split")
  _, _, _, sizes = split("GPipe", 8, 7, nil, 1, 1)
  H.list_eq(sizes, { 2, 1, 1, 1, 1, 1, 1, 2 }, "GPipe 7 layers on 8 stages")
  H.list_eq(stages.of_rank(1, 2, 4, "ZBVZeroBubble"), { 1, 2 }, "V stages of rank 1")
end

function T.torchtitans_refusals_are_plan_errors()
  for _, c in ipairs({ { "Interleaved1F1B", 4, 7, 3 }, { "ZBVZeroBubble", 2, 7, 2 }, { "1F1B", 4, 16, 2 } }) do
    local ok, e = pcall(split, c[1], c[2], c[3], c[4], 1, 1)
    H.eq(ok, false, c[1] .. " refused")
    assert(util.is_plan_error(e), "a plan error: " .. tostring(e))
    assert(tostring(e):find("layers_per_stage", 1, true), tostring(e))
  end
  local ok, e = pcall(stages.split, nil, 12, 7, 1, 1)
  H.eq(ok, false, "more stages than effective layers")
  assert(tostring(e):find("parallel.pp", 1, true), tostring(e))
end

return T
