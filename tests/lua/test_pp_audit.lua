-- gen/parallel/pp_audit.lua: a schedule's timed run. With unit costs and
-- free transfers GPipe and 1F1B take (m + p - 1) x (F + B), the textbook
-- bubble (p - 1) / (m + p - 1); interleaving shrinks it; a transfer's time
-- delays the receiver; GPipe holds every microbatch's activations, 1F1B
-- at most p - rank.
local H = require("helpers")
local sched_mod = require("gen.parallel.pp_schedule")
local pp_audit = require("gen.parallel.pp_audit")
local T = {}

local COST = { F = 1, B = 2, I = 1, W = 1 }
local function run(name, pp, m, v, p2p)
  local s = sched_mod.derive({ schedule = name, pp = pp, microbatches = m, stages_per_rank = v })
  return pp_audit.simulate(s, function(_, ty) return COST[ty] end, function() return p2p or 0 end,
    function() return 0 end, function() return 1 end), s
end

local function near(got, want, what) assert(math.abs(got - want) < 1e-9, string.format("%s: %g, want %g", what, got, want)) end

function T.textbook_bubbles()
  for _, name in ipairs({ "GPipe", "1F1B" }) do
    local r = run(name, 4, 8, 1)
    near(r.step_us, (8 + 4 - 1) * 3, name .. " step")
    near(r.bubble, 3 / 11, name .. " bubble")
    for k = 1, 4 do near(r.busy_us[k], 8 * 3, name .. " busy") end
  end
  local g = run("GPipe", 4, 8, 1)
  H.eq(g.inflight_peak[0], 8, "GPipe holds every microbatch")
  local f = run("1F1B", 4, 8, 1)
  for st = 0, 3 do H.eq(f.inflight_peak[st], 4 - st, "1F1B stage " .. st .. " holds pp - rank") end
  local i = run("Interleaved1F1B", 4, 8, 2)
  assert(i.bubble < 3 / 11, "interleaving shrinks the bubble: " .. i.bubble)
end

function T.transfers_delay_the_receiver()
  local a = run("1F1B", 4, 8, 1, 0)
  local b = run("1F1B", 4, 8, 1, 0.5)
  assert(b.step_us > a.step_us, string.format("transfers cost time: %g vs %g", b.step_us, a.step_us))
  -- the fill and the drain each cross p - 1 links once per direction
  assert(b.step_us >= a.step_us + 2 * 3 * 0.5 - 1e-9, "at least the fill and drain latency: " .. b.step_us)
end

-- Every schedule does the same work, only in another order: a rank's busy
-- time, (1 - bubble) x step, is one figure for all seven on the 405B
-- pipeline (zero bubble's split backward is its input half plus its weight
-- half, I + W = B; costing W as a whole backward made the zero-bubble
-- schedules busier and moved their bubble and step).
function T.every_schedule_does_the_same_work()
  local load = require("gen.load")
  local report = require("gen.pipeline")
  local l = load.source(H.read("bench/llama405b_pp.lua"), "bench/llama405b_pp.lua")
  local want
  for _, r in ipairs(report.rows(l).rows) do
    assert(r.sim, r.name .. ": timed")
    local busy = (1 - r.sim.bubble) * r.sim.step_us
    want = want or busy
    assert(math.abs(busy - want) <= 1e-6 * want, string.format("%s: busy %.6g us a rank, the others %.6g", r.name,
      busy, want))
  end
end

-- torchtitan's "always" reshard policy (regather): GPipe over 2 ranks and 4
-- microbatches, 4 units per stage (1 byte of activations, 10 of parameters,
-- 0.5 us of all-gather each). Each forward finds its stage sharded (the
-- forward before resharded it) and the first backward too: the first
-- unit's all-gather waits, the rest hide behind the compute; the backwards
-- after it find the units kept. The busy time is the same; the memory peak
-- is the first backward's second unit: 3 microbatches' activations (12),
-- 2 of its own, and every unit gathered (40): 54, where held all step it
-- would be 16 + 40.
function T.regather_under_always()
  local s = sched_mod.derive({ schedule = "GPipe", pp = 2, microbatches = 4 })
  local units = {}
  for i = 1, 4 do units[i] = { act = 1, param = 10, ag_us = 0.5 } end
  local regather = { [0] = { units = units }, [1] = { units = units } }
  local function sim(g)
    return pp_audit.simulate(s, function(_, ty) return COST[ty] end, function() return 0 end, function() return 0 end,
      function() return 4 end, nil, g)
  end
  local a, b = sim(nil), sim(regather)
  near(b.busy_us[1], a.busy_us[1], "the same work")
  -- rank 0 waits 0.5 in each of its 4 forwards and its first backward (the other 1.5 us hidden)
  near(b.step_us - a.step_us >= 2.5 - 1e-9 and 1 or 0, 1, "the exposed all-gathers lengthen the step")
  H.eq(a.rank_peak_mem, nil, "no regather, no parameter peak")
  H.eq(b.rank_peak_mem[1], 54, "rank 0's peak of activations and parameters")
end

return T
